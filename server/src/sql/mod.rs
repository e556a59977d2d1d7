//! The SQL front end: statement parsing and classification, literals and
//! parameters, types, settings, the COPY codec and the rewrites that turn
//! what Postgres clients send into SQL DataFusion plans.
//!
//! Nothing here knows the database: every function takes text or a syntax
//! tree and gives one back. The layers above (planning, the catalog, the
//! engine, the wire) call in; this module calls none of them.

pub mod between_symmetric;
pub mod copy;
pub mod corresponding;
pub mod depth;
pub mod distinct_from;
pub mod fetch_first;
pub mod literals;
pub mod params;
pub mod pg_tables;
pub mod rewrite;
pub mod settings;
pub mod stmt;
pub mod types;
pub mod values;
pub mod window_tvf;

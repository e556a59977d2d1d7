//! Weir's server: the pgwire front end, sessions, the catalog, and the
//! dispatch of statements to the planner and the cluster. The `weir` binary
//! (`main.rs`) starts it.

pub mod bench;
pub mod catalog;
pub mod context;
pub mod ddl;
pub mod dml;
pub mod engine;
pub mod error;
pub mod params;
pub mod pg;
pub mod query;
pub mod session;
pub mod stmt;
pub mod types;

/// What `server_version` says.
pub const SERVER_VERSION: &str = "16.0 (Weir 0.1.0)";

pub use engine::Database;

//! Weir's server: the pgwire front end, sessions, the catalog, and the
//! dispatch of statements to the planner and the cluster. The `weir` binary
//! (`main.rs`) starts it.

pub mod activity;
pub mod auth;
pub mod bench;
pub mod between_symmetric;
pub mod catalog;
pub mod context;
pub mod control;
pub mod copy;
pub mod corresponding;
pub mod cursor;
pub mod dcl;
pub mod ddl;
pub mod dead_letters;
pub mod decimal_division;
pub mod depth;
pub mod distinct_from;
pub mod dml;
pub mod engine;
pub mod error;
pub mod fetch_first;
pub mod ingest;
pub mod literals;
pub mod params;
pub mod pg;
pub mod pg_catalog;
pub mod proctime;
pub mod query;
pub mod roles;
pub mod savepoint;
pub mod search_path;
pub mod session;
pub mod settings;
pub mod sinks;
pub mod stmt;
pub mod subscribe;
pub mod system;
pub mod types;
pub mod windows;
pub mod wire;

/// What `server_version` says.
pub const SERVER_VERSION: &str = "16.0 (Weir 0.1.0)";

pub use engine::Database;

/// Runs a query in a fresh session and renders every value as text: for
/// tests and tools that drive a `Database` in process.
pub async fn query_rows(db: &std::sync::Arc<Database>, sql: &str) -> Vec<Vec<String>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let mut session = session::Session::new(db.default_parallelism);
    let mut out = Vec::new();
    for s in stmt::parse(sql).unwrap_or_default() {
        if let Ok(engine::QueryResult::Rows { batches, .. }) = db.execute(&mut session, s).await {
            let opts = FormatOptions::default().with_null("NULL");
            for b in batches {
                let cols: Vec<_> = b
                    .columns()
                    .iter()
                    .filter_map(|c| ArrayFormatter::try_new(c.as_ref(), &opts).ok())
                    .collect();
                for r in 0..b.num_rows() {
                    out.push(cols.iter().map(|c| c.value(r).to_string()).collect());
                }
            }
        }
    }
    out
}

//! Weir's server: the pgwire front end, sessions, the catalog, and the
//! dispatch of statements to the planner and the cluster. The `weir` binary
//! (`main.rs`) starts it.

pub mod catalog;
pub mod engine;
pub mod error;
pub mod layers;
pub mod sql;
pub mod wire;

/// What `server_version` says.
pub const SERVER_VERSION: &str = "16.0 (Weir 0.1.0)";
/// The one database clients connect to.
pub const DATABASE: &str = "weir";
/// The superuser, whom a new data directory has.
pub const SUPERUSER: &str = "weir";

pub use engine::Database;

/// Runs a query in a fresh session and renders every value as text: for
/// tests and tools that drive a `Database` in process.
pub async fn query_rows(db: &std::sync::Arc<Database>, sql: &str) -> Vec<Vec<String>> {
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    let mut session = engine::session::Session::new(db.default_parallelism);
    let mut out = Vec::new();
    for s in sql::stmt::parse(sql).unwrap_or_default() {
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

//! `CREATE SINK`, `SHOW SINKS`: a sink is a job like a materialized
//! view's, planned the same way, whose last step writes to a system
//! outside Weir (see `executor::sinks`) instead of keeping rows for
//! `SELECT`.

use std::sync::Arc;

use datafusion::sql::sqlparser::ast::Query;
use planner::spec::{ConnectorSpec, OperatorSpec};

use crate::catalog::Entry;
use crate::engine::jobs::{
    JobOptions, check_query, dependencies, job_graph, start, write_out_corresponding,
};
use crate::engine::session::Session;
use crate::engine::{Database, QueryResult};
use crate::error::Result;
use crate::sql::stmt::{QualifiedName, apply_pg_names};

/// `CREATE SINK name FROM v | AS query WITH (…) [FORMAT … ENCODE …]`.
pub async fn create(
    db: &Arc<Database>,
    session: &Session,
    name: QualifiedName,
    if_not_exists: bool,
    mut query: Query,
    mut connector: ConnectorSpec,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let tag = QueryResult::command("CREATE SINK");
    if !db.catalog.check_new_name(&name, if_not_exists)? {
        return Ok(tag);
    }
    write_out_corresponding(db, &mut query).await?;
    apply_pg_names(&mut query);
    let sql = query.to_string();
    check_query(db, &sql).await?;
    let depends_on = dependencies(db, &sql)?;
    let key: Vec<String> = connector
        .options
        .remove("primary_key")
        .map(|k| k.split(',').map(|c| c.trim().to_string()).collect())
        .unwrap_or_default();
    let id = db.catalog.allocate_id()?;
    let mut options = JobOptions::of_session(session, false);
    options.sink = Some(planner::SinkTarget {
        name: name.to_string(),
        connector: connector.clone(),
        key: key.clone(),
    });
    let graph = job_graph(db, &sql, id, &options).await?;
    // The connector checks its options against the query, and that its
    // target is there.
    if let Some(node) = graph
        .stream
        .nodes
        .iter()
        .find(|n| matches!(n.spec, OperatorSpec::Sink { .. }))
    {
        executor::sinks::check(&node.spec, Arc::new(node.schema.as_arrow().clone())).await?;
    }
    let entry = Entry::Sink {
        id,
        name: name.name,
        schema: name.schema,
        sql,
        connector,
        key,
        parallelism: options.parallelism,
        chaining: options.chaining,
        checkpoint_mode: options.checkpoint_mode,
        state_ttl_us: options.state_ttl_us,
        state_backend: options.state_backend,
        reads_changelogs: options.reads_changelogs,
        depends_on,
    };
    // As CREATE MATERIALIZED VIEW: what the tables held is then in a
    // checkpoint, so committed to the sink.
    start(db, entry, graph).await?;
    Ok(tag)
}

/// `SHOW SINKS`: each sink's connector, format, options and query.
pub fn show(db: &Arc<Database>) -> Result<QueryResult> {
    let rows = db
        .catalog
        .all()
        .into_iter()
        .filter_map(|e| match e.clone() {
            Entry::Sink {
                connector,
                key,
                sql,
                ..
            } => {
                let (format, mut options) = crate::catalog::connector_text(&connector);
                if !key.is_empty() {
                    let key = format!("primary_key = '{}'", key.join(","));
                    options = if options.is_empty() {
                        key
                    } else {
                        format!("{options}, {key}")
                    };
                }
                Some(vec![
                    e.qualified().to_string(),
                    connector.connector.clone(),
                    format,
                    options,
                    sql,
                ])
            }
            _ => None,
        })
        .collect();
    QueryResult::texts(&["name", "connector", "format", "options", "query"], rows)
}

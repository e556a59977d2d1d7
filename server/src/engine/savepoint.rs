//! Savepoints from SQL: `CREATE SAVEPOINT name [FOR MATERIALIZED VIEW v]`,
//! `SHOW SAVEPOINTS`, `DROP SAVEPOINT [IF EXISTS] name`, `RESTORE
//! MATERIALIZED VIEW v FROM SAVEPOINT name` and `RESTORE DATABASE FROM
//! SAVEPOINT name`.
//!
//! Not to be confused with Postgres's transaction `SAVEPOINT name`: these
//! are Flink's savepoints — snapshots of views' jobs kept in checkpoint
//! storage until dropped (see `storage::savepoint`). Restoring one takes a
//! view's state back to the savepoint and replays the tables' changes made
//! since, so the view ends up equal to its query again; tables themselves
//! are never rewound.

use std::sync::Arc;

use crate::catalog::Entry;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::QualifiedName;

/// Savepoint names are directory names in checkpoint storage.
fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(ServerError::InvalidName(format!(
            "invalid savepoint name \"{name}\": use letters, digits, _ and -"
        )));
    }
    Ok(())
}

/// The job of materialized view `view`.
fn view_job(db: &Database, view: &QualifiedName) -> Result<u64> {
    match db.catalog.by_name(view) {
        Some(Entry::MaterializedView { id, .. }) => Ok(id),
        Some(_) => Err(ServerError::WrongObjectType(format!(
            "\"{view}\" is not a materialized view"
        ))),
        None => Err(ServerError::UndefinedTable(format!(
            "materialized view \"{view}\" does not exist"
        ))),
    }
}

/// `CREATE SAVEPOINT`: of one view's job, or of every view's.
pub async fn create(
    db: &Arc<Database>,
    name: &str,
    view: Option<&QualifiedName>,
) -> Result<QueryResult> {
    check_name(name)?;
    let _ddl = db.ddl_lock.lock().await;
    let jobs: Vec<u64> = match view {
        Some(v) => vec![view_job(db, v)?],
        None => db
            .catalog
            .all()
            .into_iter()
            .filter_map(|e| match e {
                // A sink's job too: its sources' positions and what it has
                // prepared.
                Entry::MaterializedView { id, .. } | Entry::Sink { id, .. } => Some(id),
                _ => None,
            })
            .collect(),
    };
    db.cluster
        .job_manager
        .create_savepoint(name, &jobs)
        .await
        .map_err(|e| db.job_error(e))?;
    Ok(QueryResult::command("CREATE SAVEPOINT"))
}

/// `DROP SAVEPOINT`.
pub async fn drop(db: &Arc<Database>, name: &str, if_exists: bool) -> Result<QueryResult> {
    match db.cluster.job_manager.drop_savepoint(name).await {
        Err(cluster::ClusterError::UnknownSavepoint(_)) if if_exists => {}
        other => other?,
    }
    Ok(QueryResult::command("DROP SAVEPOINT"))
}

/// `SHOW SAVEPOINTS`: name, the views it holds, when, and its size.
pub fn show(db: &Arc<Database>) -> Result<QueryResult> {
    let rows = db
        .cluster
        .job_manager
        .savepoints()
        .into_iter()
        .map(|s| {
            let views: Vec<String> = s
                .jobs
                .iter()
                .map(|j| {
                    db.catalog
                        .get(j.job)
                        .map(|e| e.qualified().to_string())
                        .unwrap_or_else(|| format!("(dropped view {})", j.job))
                })
                .collect();
            let created = chrono::DateTime::from_timestamp_millis(s.created_at_ms as i64)
                .map(|t| t.format("%Y-%m-%d %H:%M:%S%.3f+00").to_string())
                .unwrap_or_default();
            vec![
                s.name.clone(),
                views.join(", "),
                created,
                s.size().to_string(),
            ]
        })
        .collect();
    QueryResult::texts(&["name", "views", "created_at", "bytes"], rows)
}

/// `RESTORE MATERIALIZED VIEW v FROM SAVEPOINT s` / `RESTORE DATABASE FROM
/// SAVEPOINT s` (every view the savepoint holds that still exists).
pub async fn restore(
    db: &Arc<Database>,
    name: &str,
    view: Option<&QualifiedName>,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let jobs = match view {
        Some(v) => Some(vec![view_job(db, v)?]),
        None => None,
    };
    db.cluster
        .job_manager
        .restore_savepoint(name, jobs.as_deref())
        .await
        .map_err(|e| db.job_error(e))?;
    Ok(QueryResult::command("RESTORE"))
}

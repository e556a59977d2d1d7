//! Tables that read a connector: `CREATE TABLE t (…) [INCLUDE …] WITH
//! (connector = '…', …) [FORMAT … ENCODE …]` (RisingWave's form).
//!
//! Unlike a source, whose rows each view reads afresh through the
//! connector, such a table *stores* what the connector reads: it is a
//! Weir table like any other (`SELECT`, views, DML), with a job of its own
//! that reads the connector and writes into the table. The job is a
//! source and a sink (`executor::sinks::TABLE_SINK`): what it read during
//! an epoch is applied when the epoch's checkpoint completes, and the
//! checkpoint holds the connector's positions, so the table holds each
//! record exactly once. The rows are upserts by the table's primary key
//! (a new row replaces its key's row, `FORMAT DEBEZIUM`'s deletes remove
//! it); a table without a primary key takes inserts only.

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::datatypes::Schema;
use datafusion::common::TableReference;
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::LogicalPlanBuilder;
use planner::source::StreamSourceTable;
use planner::spec::ConnectorSpec;
use planner::{SinkTarget, job_graph::JobGraph};
use storage::table::WriterId;

use crate::catalog::{Column, Entry, Ingest, table_desc, user_schema};
use crate::engine::Database;
use crate::engine::jobs::{JobOptions, plan_job};
use crate::error::{Result, ServerError};

/// Adds `INCLUDE`'s columns to a source's or a connector table's columns,
/// and checks what the connector needs of them.
pub(crate) fn include_columns(connector: &ConnectorSpec, columns: &mut Vec<Column>) -> Result<()> {
    if let Some(c) = columns.iter().find(|c| c.default.is_some()) {
        return Err(ServerError::unsupported(format!(
            "DEFAULT on a column filled by connector {} (\"{}\")",
            connector.connector, c.name
        )));
    }
    for inc in &connector.include {
        let sql_type = executor::connectors::include_type(&connector.connector, &inc.what)?;
        if columns.iter().any(|c| c.name == inc.column) {
            return Err(ServerError::DuplicateColumn(format!(
                "column \"{}\" specified more than once",
                inc.column
            )));
        }
        columns.push(Column {
            name: inc.column.clone(),
            sql_type: sql_type.into(),
            not_null: false,
            default: None,
        });
    }
    Ok(())
}

/// Checks what a connector table's definition asks of its connector:
/// a changelog format needs a key to apply its deletes by.
pub(crate) fn check(
    name: &str,
    connector: &ConnectorSpec,
    primary_key: &[String],
    append_only: bool,
) -> Result<()> {
    let format = connector.format.as_deref().unwrap_or("PLAIN");
    if connector.connector == "postgres-cdc" {
        if primary_key.is_empty() || append_only {
            return Err(ServerError::InvalidTableDefinition(format!(
                "table \"{name}\" reading connector postgres-cdc needs a PRIMARY KEY (that of the \
                 PostgreSQL table) and cannot be append-only: it applies updates and deletes by key"
            )));
        }
    } else if format == "UPSERT" {
        let keyed_by_message = connector
            .include
            .iter()
            .any(|i| i.what == "key" && primary_key == std::slice::from_ref(&i.column));
        if !keyed_by_message {
            return Err(ServerError::InvalidTableDefinition(format!(
                "table \"{name}\" with FORMAT UPSERT needs the message key as its primary key: \
                 INCLUDE KEY AS <column> and PRIMARY KEY (<column>)"
            )));
        }
        if append_only {
            return Err(ServerError::InvalidTableDefinition(format!(
                "append-only table \"{name}\" cannot read FORMAT UPSERT, whose records \
                 replace and delete rows"
            )));
        }
    } else if format != "PLAIN" {
        if primary_key.is_empty() {
            return Err(ServerError::InvalidTableDefinition(format!(
                "table \"{name}\" with FORMAT {format} needs a PRIMARY KEY: its changes \
                 update and delete rows by key"
            )));
        }
        if append_only {
            return Err(ServerError::InvalidTableDefinition(format!(
                "append-only table \"{name}\" cannot read FORMAT {format}, whose records \
                 update and delete rows"
            )));
        }
    }
    Ok(())
}

/// The job that reads the connector of table `entry` into it.
async fn job_graph(entry: &Entry) -> Result<JobGraph> {
    let Entry::Table {
        id,
        name,
        primary_key,
        ingest: Some(Ingest {
            connector,
            parallelism,
        }),
        ..
    } = entry
    else {
        return Err(ServerError::Internal(format!(
            "\"{}\" is not a table that reads a connector",
            entry.name()
        )));
    };
    // Nullable throughout: a deletion names its key and may leave the
    // rest NULL; the table checks NOT NULL on the rows it keeps.
    let schema = Arc::new(Schema::new(
        user_schema(&table_desc(entry)?)
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect::<Vec<_>>(),
    ));
    let scan = StreamSourceTable {
        table_id: *id,
        name: name.clone(),
        schema,
        append_only: connector.format.as_deref().is_none_or(|f| f == "PLAIN"),
        watermark: None,
        versioned: false,
        connector: Some(connector.clone()),
        view: false,
    };
    let plan = LogicalPlanBuilder::scan(
        TableReference::bare(name.as_str()),
        provider_as_source(Arc::new(scan)),
        None,
    )?
    .build()?;
    let options = JobOptions {
        parallelism: *parallelism,
        sink: Some(SinkTarget {
            name: name.clone(),
            connector: ConnectorSpec {
                connector: executor::sinks::TABLE_SINK.into(),
                ..Default::default()
            },
            key: primary_key.clone(),
        }),
        retain_history_ms: 0,
        ..JobOptions::defaults()
    };
    plan_job(plan, *id, &options)
}

/// Starts the job of a new connector table (whose entry is in the
/// catalog and whose table is open); returns once its first checkpoint
/// completed, so the connector reads.
pub(crate) async fn start(db: &Arc<Database>, entry: &Entry) -> Result<()> {
    let graph = job_graph(entry).await?;
    let id = entry.id();
    db.cluster
        .job_manager
        .submit_job(id, graph)
        .await
        .map_err(|e| db.job_error(e))?;
    if let Err(e) = db.cluster.job_manager.checkpoint_now(id).await {
        let _ = db.cluster.job_manager.cancel_job(id, true).await;
        return Err(db.job_error(e));
    }
    Ok(())
}

/// Restarts a connector table's job from its latest completed checkpoint,
/// in the background (as a materialized view's at startup).
pub(crate) async fn recover(db: &Arc<Database>, entry: &Entry) -> Result<()> {
    let graph = job_graph(entry).await?;
    db.cluster
        .job_manager
        .recover_job(entry.id(), graph)
        .await?;
    Ok(())
}

/// `FLUSH` of connector table `id`, whose job has `writers` subtasks:
/// waits until a checkpoint holds what the connector held when called,
/// and every writer has applied it to the table.
pub(crate) async fn flush(db: &Database, id: u64, writers: usize) -> Result<()> {
    let jobs = &db.cluster.job_manager;
    let Some(checkpoint) = jobs.flush_job(id).await.map_err(|e| db.job_error(e))? else {
        return Ok(());
    };
    wait_applied(db, id, id, writers, checkpoint).await
}

/// Waits until subtasks `0..writers` of job `job` have applied checkpoint
/// `checkpoint` (or a later one) to table `table`.
pub(crate) async fn wait_applied(
    db: &Database,
    table: u64,
    job: u64,
    writers: usize,
    checkpoint: u64,
) -> Result<()> {
    let mut ingested = db.cluster.tables.ingested(table)?;
    loop {
        let applied = {
            let m = ingested.borrow_and_update();
            (0..writers as u32).all(|subtask| {
                m.get(&WriterId { job, subtask })
                    .is_some_and(|c| *c >= checkpoint)
            })
        };
        if applied {
            return Ok(());
        }
        // A commit follows the notice that the checkpoint completed; if
        // that notice was lost, the next checkpoint's commits it.
        match tokio::time::timeout(Duration::from_millis(500), ingested.changed()).await {
            Ok(Ok(())) => {}
            // The table was dropped meanwhile.
            Ok(Err(_)) => return Ok(()),
            Err(_) => match db.cluster.job_manager.checkpoint_now(job).await {
                Ok(()) | Err(cluster::ClusterError::UnknownJob(_)) => {}
                Err(e) => return Err(db.job_error(e)),
            },
        }
    }
}

/// Stops the job of connector table `entry` and lets its connector release
/// what it holds outside Weir (a replication slot).
pub(crate) async fn stop(db: &Database, entry: &Entry) -> Result<()> {
    let Entry::Table {
        id,
        columns,
        ingest: Some(ingest),
        ..
    } = entry
    else {
        return Ok(());
    };
    match db.cluster.job_manager.cancel_job(*id, true).await {
        Ok(()) | Err(cluster::ClusterError::UnknownJob(_)) => {}
        Err(e) => return Err(e.into()),
    }
    let schema = crate::catalog::source_schema(columns)?;
    if let Err(e) = executor::connectors::source(&ingest.connector, &schema)?
        .dropped()
        .await
    {
        tracing::warn!(table = entry.name(), error = %e, "the connector could not release what it holds");
    }
    Ok(())
}

//! The database: catalog, cluster and the dispatch of every statement.
//!
//! `execute` is the top of the path a statement takes through Weir (see
//! `docs/architecture.md`): DDL changes the catalog and submits or cancels
//! jobs, DML writes table changelogs, queries run on DataFusion over
//! consistent snapshots.

use std::path::Path;
use std::sync::Arc;

use cluster::{Cluster, ClusterConfig};
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Set, Statement, Value};

use crate::catalog::{Catalog, Entry, table_desc};
use crate::error::{Result, ServerError};
use crate::session::Session;
use crate::stmt::Stmt;
use crate::subscribe::Subscription;
use crate::{ddl, dml, query, savepoint};

/// How often table change logs are trimmed.
const LOG_TRUNCATION_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// What a statement returns.
#[derive(Debug)]
pub enum QueryResult {
    Rows {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
    },
    Command {
        tag: String,
        rows: Option<usize>,
    },
    /// `SUBSCRIBE`: rows sent as they come, for as long as the client
    /// stays (with `copy`, as `COPY … TO STDOUT` data).
    Subscribe {
        sub: Box<Subscription>,
        copy: bool,
    },
}

impl QueryResult {
    pub fn command(tag: &str) -> Self {
        QueryResult::Command {
            tag: tag.to_string(),
            rows: None,
        }
    }

    /// A one-text-column result.
    pub fn text(column: &str, lines: Vec<String>) -> Result<Self> {
        Self::texts(&[column], lines.into_iter().map(|l| vec![l]).collect())
    }

    /// Rows of text columns.
    pub fn texts(columns: &[&str], rows: Vec<Vec<String>>) -> Result<Self> {
        let schema = Arc::new(Schema::new(
            columns
                .iter()
                .map(|c| Field::new(*c, DataType::Utf8, true))
                .collect::<Vec<_>>(),
        ));
        let arrays = (0..columns.len())
            .map(|i| {
                Arc::new(StringArray::from_iter_values(
                    rows.iter().map(|r| r[i].as_str()),
                )) as _
            })
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), arrays)
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        Ok(QueryResult::Rows {
            schema,
            batches: vec![batch],
        })
    }
}

/// A running Weir database.
#[derive(Debug)]
pub struct Database {
    pub catalog: Catalog,
    pub cluster: Cluster,
    /// DDL statements run one at a time.
    pub(crate) ddl_lock: tokio::sync::Mutex<()>,
    /// The watermark (µs) of each stream that sends its late rows elsewhere,
    /// as of its last write; inserts into such a stream hold this lock.
    pub(crate) stream_watermarks: tokio::sync::Mutex<std::collections::HashMap<u64, i64>>,
    pub default_parallelism: usize,
    /// When this server started (`pg_postmaster_start_time()`).
    pub started_at: std::time::SystemTime,
}

impl Database {
    /// Opens the data directory of a playground: catalog, tables, one
    /// TaskManager in-process, and a job for every materialized view,
    /// restored from its last completed checkpoint.
    pub async fn open(data_dir: &Path, config: ClusterConfig) -> Result<Arc<Self>> {
        let default_parallelism = config.slots_per_task_manager;
        let cluster = Cluster::playground(data_dir, config).await?;
        Self::start(cluster, default_parallelism).await
    }

    /// Opens the data directory of a standalone JobManager, serving the
    /// cluster RPC on `rpc_listen`; views run once TaskManagers register.
    /// New views get `default_parallelism` subtasks unless a session says
    /// otherwise.
    pub async fn open_job_manager(
        data_dir: &Path,
        config: ClusterConfig,
        rpc_listen: std::net::SocketAddr,
        default_parallelism: usize,
    ) -> Result<Arc<Self>> {
        let cluster = Cluster::job_manager(data_dir, config, rpc_listen).await?;
        Self::start(cluster, default_parallelism.max(1)).await
    }

    async fn start(cluster: Cluster, default_parallelism: usize) -> Result<Arc<Self>> {
        let catalog = Catalog::load(cluster.meta.clone())?;
        let db = Arc::new(Self {
            catalog,
            cluster,
            ddl_lock: tokio::sync::Mutex::new(()),
            stream_watermarks: Default::default(),
            default_parallelism,
            started_at: std::time::SystemTime::now(),
        });
        for entry in db.catalog.all() {
            match &entry {
                Entry::Table { ingest, .. } => {
                    db.cluster.tables.open_table(table_desc(&entry)?)?;
                    if ingest.is_some()
                        && let Err(e) = crate::ingest::recover(&db, &entry).await
                    {
                        tracing::error!(name = entry.name(), error = %e, "the job of a connector table could not be restarted");
                    }
                }
                Entry::MaterializedView { .. } | Entry::Sink { .. } => {
                    if let Err(e) = ddl::recover_view_job(&db, &entry).await {
                        tracing::error!(name = entry.name(), kind = entry.kind(), error = %e, "job could not be restarted");
                    }
                }
                Entry::View { .. } | Entry::Source { .. } => {}
            }
        }
        tracing::info!(objects = db.catalog.all().len(), "catalog restored");
        let weak = Arc::downgrade(&db);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOG_TRUNCATION_INTERVAL).await;
                let Some(db) = weak.upgrade() else { break };
                if let Err(e) = db.truncate_logs().await {
                    tracing::warn!(error = %e, "table log truncation failed");
                }
            }
        });
        Ok(db)
    }

    /// Stops every job (keeping its state).
    pub async fn shutdown(&self) {
        self.cluster.job_manager.shutdown().await;
    }

    /// Runs one statement.
    pub async fn execute(
        self: &Arc<Self>,
        session: &mut Session,
        stmt: Stmt,
    ) -> Result<QueryResult> {
        match stmt {
            Stmt::Flush => {
                self.flush().await?;
                Ok(QueryResult::command("FLUSH"))
            }
            Stmt::Checkpoint => {
                self.cluster
                    .job_manager
                    .checkpoint_all()
                    .await
                    .map_err(|e| self.job_error(e))?;
                Ok(QueryResult::command("CHECKPOINT"))
            }
            Stmt::ShowMaterializedViews => query::show_objects(self, "materialized view"),
            Stmt::ShowViews => query::show_objects(self, "view"),
            Stmt::ShowJobs => query::show_jobs(self),
            Stmt::ShowSources => query::show_sources(self),
            Stmt::ShowSinks => crate::sinks::show(self),
            Stmt::CreateSink {
                name,
                if_not_exists,
                query,
                connector,
            } => crate::sinks::create(self, session, name, if_not_exists, *query, connector).await,
            Stmt::DropSink {
                name,
                if_exists,
                cascade,
            } => ddl::drop_objects(self, "sink", if_exists, &[name], cascade).await,
            Stmt::DropSource {
                name,
                if_exists,
                cascade,
            } => ddl::drop_objects(self, "source", if_exists, &[name], cascade).await,
            Stmt::SetParallelism { view, parallelism } => {
                ddl::set_parallelism(self, &view, parallelism).await
            }
            Stmt::CreateSavepoint { name, view } => {
                savepoint::create(self, &name, view.as_deref()).await
            }
            Stmt::DropSavepoint { name, if_exists } => {
                savepoint::drop(self, &name, if_exists).await
            }
            Stmt::ShowSavepoints => savepoint::show(self),
            Stmt::RestoreSavepoint { name, view } => {
                savepoint::restore(self, &name, view.as_deref()).await
            }
            Stmt::EmitOnWindowClose(s) => match *s {
                Statement::CreateView(cv) if cv.materialized => {
                    ddl::create_view(self, session, cv, true).await
                }
                Statement::Explain { statement, .. } => match *statement {
                    Statement::CreateView(cv) if cv.materialized => {
                        ddl::explain_view(self, session, cv, true).await
                    }
                    _ => Err(emit_misplaced()),
                },
                _ => Err(emit_misplaced()),
            },
            Stmt::CreateTable { table, options } => match *table {
                Statement::CreateTable(ct) => ddl::create_table(self, session, ct, options).await,
                other => Err(ServerError::Internal(format!("not CREATE TABLE: {other}"))),
            },
            Stmt::Subscribe { subscribe, copy } => Ok(QueryResult::Subscribe {
                sub: Box::new(Subscription::open(self, &subscribe).await?),
                copy,
            }),
            Stmt::DeclareSubscribe { name, subscribe } => {
                if session.cursors.contains_key(&name) {
                    return Err(ServerError::DuplicateCursor(format!(
                        "cursor \"{name}\" already exists"
                    )));
                }
                let sub = Subscription::open(self, &subscribe).await?;
                session.cursors.insert(name, sub);
                Ok(QueryResult::command("DECLARE CURSOR"))
            }
            Stmt::Fetch {
                cursor,
                count,
                timeout,
            } => {
                let sub = session.cursors.get_mut(&cursor).ok_or_else(|| {
                    ServerError::InvalidCursorName(format!("cursor \"{cursor}\" does not exist"))
                })?;
                let max = count.map_or(usize::MAX, |n| n as usize);
                let batches = if max == 0 {
                    Vec::new()
                } else {
                    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
                    sub.fetch(max, deadline).await?
                };
                Ok(QueryResult::Rows {
                    schema: sub.schema(),
                    batches,
                })
            }
            Stmt::Close { cursor: None } => {
                session.cursors.clear();
                Ok(QueryResult::command("CLOSE CURSOR ALL"))
            }
            Stmt::Close {
                cursor: Some(cursor),
            } => match session.cursors.remove(&cursor) {
                Some(_) => Ok(QueryResult::command("CLOSE CURSOR")),
                None => Err(ServerError::InvalidCursorName(format!(
                    "cursor \"{cursor}\" does not exist"
                ))),
            },
            Stmt::Sql(s) => self.execute_sql(session, *s).await,
        }
    }

    async fn execute_sql(
        self: &Arc<Self>,
        session: &mut Session,
        s: Statement,
    ) -> Result<QueryResult> {
        match s {
            Statement::Query(q) => query::select(self, session, *q).await,
            Statement::Insert(insert) => dml::insert(self, insert).await,
            Statement::Update(update) => dml::update(self, update).await,
            Statement::Delete(delete) => dml::delete(self, delete).await,
            Statement::CreateTable(ct) => {
                ddl::create_table(self, session, ct, Default::default()).await
            }
            Statement::CreateView(cv) => ddl::create_view(self, session, cv, false).await,
            Statement::Drop {
                object_type,
                if_exists,
                names,
                cascade,
                ..
            } => ddl::drop(self, object_type, if_exists, names, cascade).await,
            Statement::Explain {
                statement, analyze, ..
            } => match *statement {
                Statement::CreateView(cv) if cv.materialized => {
                    ddl::explain_view(self, session, cv, false).await
                }
                Statement::Query(q) if !analyze => query::explain(self, session, *q).await,
                other => Err(ServerError::unsupported(format!(
                    "EXPLAIN of {}",
                    leading_words(&other.to_string())
                ))),
            },
            Statement::ShowTables { .. } => query::show_objects(self, "table"),
            Statement::ShowVariable { variable } => {
                let name = variable
                    .iter()
                    .map(|i| i.value.clone())
                    .collect::<Vec<_>>()
                    .join(" ");
                let name = if name.eq_ignore_ascii_case("transaction isolation level") {
                    "transaction_isolation".to_string()
                } else {
                    name
                };
                QueryResult::text(&name.to_lowercase(), vec![session.get(&name)?])
            }
            Statement::Set(set) => set_variable(session, set),
            Statement::StartTransaction { .. } => Ok(QueryResult::command("BEGIN")),
            Statement::Commit { .. } => Ok(QueryResult::command("COMMIT")),
            Statement::Rollback { .. } => Ok(QueryResult::command("ROLLBACK")),
            other => Err(ServerError::unsupported(format!(
                "the statement {}",
                leading_words(&other.to_string())
            ))),
        }
    }

    /// Deletes the part of every table's change log that no job needs any
    /// more: entries at or before the position every reading job has
    /// checkpointed. A job that has not completed a checkpoint yet holds its
    /// tables' logs whole; a table no job reads keeps none (a new view
    /// starts from the table's snapshot). Runs under the DDL lock, so no view
    /// is half-created meanwhile.
    pub async fn truncate_logs(&self) -> Result<()> {
        let _ddl = self.ddl_lock.lock().await;
        let jobs = self.cluster.job_manager.source_positions();
        for entry in self.catalog.all() {
            let Entry::Table { id, .. } = entry else {
                continue;
            };
            let mut upto = Some(self.cluster.tables.last_seq(id)?);
            for job in &jobs {
                if job.tables.contains(&id) {
                    let p = job.positions.as_ref().and_then(|p| p.get(&id).copied());
                    upto = match (upto, p) {
                        (Some(u), Some(p)) => Some(u.min(p)),
                        _ => None,
                    };
                }
            }
            if let Some(upto) = upto.filter(|u| *u > 0) {
                self.cluster.tables.truncate_log(id, upto)?;
            }
        }
        Ok(())
    }

    /// `FLUSH`: every write acknowledged so far is visible in every view.
    pub async fn flush(&self) -> Result<()> {
        // Tables that read a connector first: then what their connectors
        // held is in the tables, and the views below wait for it.
        let ingesting = self.catalog.all().into_iter().filter_map(|e| match e {
            Entry::Table {
                id,
                ingest: Some(ingest),
                ..
            } => Some((id, ingest.parallelism)),
            _ => None,
        });
        for r in futures::future::join_all(
            ingesting.map(|(id, writers)| crate::ingest::flush(self, id, writers)),
        )
        .await
        {
            r?;
        }
        let targets = self.table_positions()?;
        self.cluster
            .job_manager
            .flush(&targets)
            .await
            .map_err(|e| self.job_error(e))?;
        // The records the jobs skipped are in their dead-letter tables
        // once their checkpoints commit; views over those tables follow.
        crate::dead_letters::flush(self).await?;
        let after = self.table_positions()?;
        if after != targets {
            self.cluster
                .job_manager
                .flush(&after)
                .await
                .map_err(|e| self.job_error(e))?;
        }
        Ok(())
    }

    /// Every table's last log sequence number.
    fn table_positions(&self) -> Result<std::collections::HashMap<u64, u64>> {
        let mut targets = std::collections::HashMap::new();
        for entry in self.catalog.all() {
            if let Entry::Table { id, .. } = entry {
                targets.insert(id, self.cluster.tables.last_seq(id)?);
            }
        }
        Ok(targets)
    }

    /// Names the view of a failed job.
    pub(crate) fn job_error(&self, e: cluster::ClusterError) -> ServerError {
        match e {
            cluster::ClusterError::JobFailed { job, error } => {
                let (kind, name) = self
                    .catalog
                    .get(job)
                    .map(|e| (e.kind(), e.name().to_string()))
                    .unwrap_or_else(|| ("job", job.to_string()));
                ServerError::job_failed(kind, &name, &error)
            }
            other => other.into(),
        }
    }
}

/// The first words of a statement, to name it in errors.
fn leading_words(sql: &str) -> String {
    sql.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

fn set_variable(session: &mut Session, set: Set) -> Result<QueryResult> {
    match set {
        Set::SingleAssignment {
            variable, values, ..
        } => {
            let name = variable.to_string();
            let value = values
                .iter()
                .map(|v| match v {
                    SqlExpr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                        other => other.to_string(),
                    },
                    SqlExpr::Identifier(i) => i.value.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            session.set(&name, &value)?;
            Ok(QueryResult::command("SET"))
        }
        Set::SetTimeZone { value, .. } => {
            let v = match value {
                SqlExpr::Value(v) => match v.value {
                    Value::SingleQuotedString(s) => s,
                    other => other.to_string(),
                },
                other => other.to_string(),
            };
            session.set("timezone", &v)?;
            Ok(QueryResult::command("SET"))
        }
        Set::SetNames { charset_name, .. } => {
            session.set("client_encoding", &charset_name.to_string())?;
            Ok(QueryResult::command("SET"))
        }
        // SET SESSION CHARACTERISTICS, SET TRANSACTION: every statement is
        // its own serializable transaction already.
        Set::SetTransaction { .. } => Ok(QueryResult::command("SET")),
        other => Err(ServerError::unsupported(format!("{other}"))),
    }
}

fn emit_misplaced() -> ServerError {
    ServerError::Syntax("EMIT ON WINDOW CLOSE ends a CREATE MATERIALIZED VIEW only".into())
}

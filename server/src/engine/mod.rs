//! The engine: the database's shared state ([`Database`]: catalog, roles,
//! connections, cluster, start-up and shutdown, flushing and log
//! truncation) and, in `dispatch.rs`, the dispatch of every statement.
//!
//! `execute` is the top of the path a statement takes through Weir (see
//! `docs/architecture.md`): DDL changes the catalog and submits or cancels
//! jobs, DML writes table changelogs, queries run on DataFusion over
//! consistent snapshots.
//!
//! Each family of statements is a module with a small interface, listed
//! in `crate::layers::ENGINE_INTERFACES` (a test keeps each module to its
//! list): `ddl`, `dml`, `ingest`, `jobs`, `sinks`, `savepoint`,
//! `subscribe`, `cursor`, `query`, `dcl`, `dead_letters`, `transaction`. What they share
//! is here and in `context` (the catalog as DataFusion sees it),
//! `session` and `control` (a running statement's stop).

pub mod api;
pub mod context;
pub mod control;
pub mod cursor;
pub mod dcl;
pub mod ddl;
pub mod dead_letters;
mod dispatch;
pub mod dml;
pub mod ingest;
pub mod jobs;
pub mod query;
pub mod savepoint;
pub mod session;
pub mod sinks;
pub mod subscribe;
pub mod transaction;

use std::path::Path;
use std::sync::Arc;

use cluster::{Cluster, ClusterConfig};
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use crate::catalog::{Catalog, Entry, table_desc};
use crate::engine::subscribe::Subscription;
use crate::error::{Result, ServerError};

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
    /// `COPY … TO STDOUT`: the rows, written as COPY data.
    CopyOut {
        schema: SchemaRef,
        batches: Vec<RecordBatch>,
        options: crate::sql::copy::CopyOptions,
    },
    /// `COPY t FROM STDIN`: the front end is to gather the client's data
    /// and hand it to [`crate::engine::dml::copy_in`].
    CopyIn {
        table: crate::sql::stmt::QualifiedName,
        columns: Vec<String>,
        options: crate::sql::copy::CopyOptions,
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
    /// Who may connect, and what each role may read.
    pub roles: crate::catalog::roles::Roles,
    /// The connections logged in now (`pg_stat_activity`).
    pub activity: crate::catalog::activity::Activity,
    pub cluster: Cluster,
    /// DDL statements run one at a time.
    pub(crate) ddl_lock: tokio::sync::Mutex<()>,
    /// The watermark (µs) of each stream that sends its late rows elsewhere,
    /// as of its last write; inserts into such a stream hold this lock.
    pub(crate) stream_watermarks: tokio::sync::Mutex<std::collections::HashMap<u64, i64>>,
    pub default_parallelism: usize,
    /// When this server started (`pg_postmaster_start_time()`).
    pub started_at: std::time::SystemTime,
    /// Objects that could not be restored when the server started, set
    /// aside so that the rest could be (`weir_catalog.restore_errors`);
    /// they can still be dropped.
    pub restore_errors: crate::catalog::restore_errors::RestoreErrors,
}

#[async_trait::async_trait]
impl crate::catalog::view::CatalogView for Database {
    fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn roles(&self) -> &crate::catalog::roles::Roles {
        &self.roles
    }

    fn activity(&self) -> &crate::catalog::activity::Activity {
        &self.activity
    }

    fn cluster(&self) -> &Cluster {
        &self.cluster
    }

    fn restore_errors(&self) -> &crate::catalog::restore_errors::RestoreErrors {
        &self.restore_errors
    }

    fn started_at(&self) -> std::time::SystemTime {
        self.started_at
    }

    async fn view_schema(self: Arc<Self>, id: u64, sql: &str) -> Result<SchemaRef> {
        crate::engine::context::view_schema(&self, id, sql).await
    }
}

/// Runs one object's restore, turning a panic into its error.
async fn restore_one<F: std::future::Future<Output = Result<()>>>(f: F) -> Result<()> {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(f).catch_unwind().await {
        Ok(r) => r,
        Err(panic) => Err(ServerError::Internal(format!(
            "restoring panicked: {}",
            crate::error::panic_message(&panic)
        ))),
    }
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
        let (catalog, unreadable) = Catalog::load(cluster.meta.clone())?;
        let roles = crate::catalog::roles::Roles::load(cluster.meta.clone())?;
        let db = Arc::new(Self {
            catalog,
            roles,
            activity: Default::default(),
            cluster,
            ddl_lock: tokio::sync::Mutex::new(()),
            stream_watermarks: Default::default(),
            default_parallelism,
            started_at: std::time::SystemTime::now(),
            restore_errors: Default::default(),
        });
        for (id, error) in unreadable {
            db.restore_errors.record(id, None, "object", error);
        }
        // Before any job runs: the views that jobs read through their
        // changelogs keep every epoch until the readers' checkpoints say
        // which they still need (`cluster::JobManager::update_changelog_holds`).
        for entry in db.catalog.all() {
            for view in crate::engine::jobs::changelogs_read(&db, &entry) {
                db.cluster.job_manager.hold_changelog(view, entry.id(), 0);
            }
        }
        // An object that cannot be restored is set aside — logged, listed in
        // weir_catalog.restore_errors — and the server starts without it,
        // so that it can be dropped.
        for entry in db.catalog.all() {
            let restored = match &entry {
                Entry::Table { ingest, .. } => {
                    restore_one(async {
                        db.cluster.tables.open_table(table_desc(&entry)?)?;
                        if ingest.is_some() {
                            crate::engine::ingest::recover(&db, &entry).await?;
                        }
                        Ok(())
                    })
                    .await
                }
                Entry::MaterializedView { .. } | Entry::Sink { .. } => {
                    restore_one(jobs::recover(&db, &entry)).await
                }
                // A view is planned whenever it is read; a view that no
                // longer plans says so then.
                Entry::View { .. } | Entry::Source { .. } => Ok(()),
            };
            if let Err(e) = restored {
                db.restore_errors.record(
                    entry.id(),
                    Some(&entry.qualified().to_string()),
                    entry.kind(),
                    e.to_string(),
                );
            }
        }
        tracing::info!(objects = db.catalog.all().len(), "catalog restored");
        let weak = Arc::downgrade(&db);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOG_TRUNCATION_INTERVAL).await;
                let Some(db) = weak.upgrade() else { break };
                db.cluster.job_manager.update_changelog_holds();
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
            ingesting.map(|(id, writers)| crate::engine::ingest::flush(self, id, writers)),
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
        crate::engine::dead_letters::flush(self).await?;
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

    /// Adds a plain table's entry to the catalog and opens its storage;
    /// returns its id.
    pub(crate) fn add_table(&self, entry: Entry) -> Result<u64> {
        let desc = table_desc(&entry)?;
        let id = entry.id();
        self.catalog.add(entry)?;
        self.cluster.tables.open_table(desc)?;
        Ok(id)
    }

    /// Names the view of a failed job.
    pub(crate) fn job_error(&self, e: cluster::ClusterError) -> ServerError {
        match e {
            cluster::ClusterError::JobFailed { job, error } => {
                let (kind, name) = self
                    .catalog
                    .get(job)
                    .map(|e| (e.kind(), e.qualified().to_string()))
                    .unwrap_or_else(|| ("job", job.to_string()));
                ServerError::job_failed(kind, &name, &error)
            }
            other => other.into(),
        }
    }
}

/// The first words of a statement, to name it in errors.
pub(crate) fn leading_words(sql: &str) -> String {
    sql.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
}

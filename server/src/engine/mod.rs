//! The database: catalog, cluster and the dispatch of every statement.
//!
//! `execute` is the top of the path a statement takes through Weir (see
//! `docs/architecture.md`): DDL changes the catalog and submits or cancels
//! jobs, DML writes table changelogs, queries run on DataFusion over
//! consistent snapshots.

pub mod context;
pub mod control;
pub mod cursor;
pub mod dcl;
pub mod ddl;
pub mod dead_letters;
pub mod dml;
pub mod ingest;
pub mod query;
pub mod savepoint;
pub mod session;
pub mod sinks;
pub mod subscribe;

use std::path::Path;
use std::sync::Arc;

use cluster::{Cluster, ClusterConfig};
use datafusion::arrow::array::{RecordBatch, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Reset, Set, Statement, TransactionAccessMode, TransactionIsolationLevel,
    TransactionMode, Value,
};

use crate::catalog::{Catalog, Entry, table_desc};
use crate::engine::cursor::Cursor;
use crate::engine::session::Session;
use crate::engine::subscribe::Subscription;
use crate::error::{Result, ServerError};
use crate::sql::stmt::{Stmt, object_name};

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
                    restore_one(ddl::recover_view_job(&db, &entry)).await
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
    /// A write's result, once `implicit_flush` is satisfied.
    async fn written(&self, session: &Session, done: Result<QueryResult>) -> Result<QueryResult> {
        let done = done?;
        self.flush_if_implicit(session).await?;
        Ok(done)
    }

    /// With `implicit_flush` on, a write returns once every view has its
    /// rows (see `FLUSH`).
    pub async fn flush_if_implicit(&self, session: &Session) -> Result<()> {
        if session.get("implicit_flush").is_ok_and(|v| v == "on") {
            self.flush().await?;
        }
        Ok(())
    }

    /// Qualifies `stmt`'s unqualified names by the session's
    /// `search_path` (see [`crate::catalog::search_path`]).
    pub fn qualify(&self, session: &Session, stmt: &mut Stmt) -> Result<()> {
        let path = session.search_path(&self.catalog);
        if path.is_default() {
            return Ok(());
        }
        path.qualify(&self.catalog, stmt)
    }

    pub async fn execute(
        self: &Arc<Self>,
        session: &mut Session,
        mut stmt: Stmt,
    ) -> Result<QueryResult> {
        self.qualify(session, &mut stmt)?;
        crate::engine::dcl::check(self, session, &stmt)?;
        if !stoppable(&stmt) {
            // Not written to be dropped half way: it runs to its end once
            // it has begun (crate::engine::control).
            crate::engine::control::commit_point()?;
        }
        if session
            .get("transaction_read_only")
            .is_ok_and(|v| v == "on")
            && let Some(what) = writes(&stmt)
        {
            return Err(ServerError::ReadOnlyTransaction(format!(
                "cannot execute {what} in a read-only transaction"
            )));
        }
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
            Stmt::ShowCreateView { name, materialized } => {
                query::show_create_view(self, &object_name(&name)?, materialized)
            }
            Stmt::ShowJobs => query::show_jobs(self),
            Stmt::ShowSources => query::show_sources(self),
            Stmt::ShowSinks => crate::engine::sinks::show(self),
            Stmt::CreateSink {
                name,
                if_not_exists,
                query,
                connector,
            } => {
                let name = object_name(&name)?;
                crate::engine::sinks::create(self, session, name, if_not_exists, *query, connector)
                    .await
            }
            Stmt::DropSink {
                name,
                if_exists,
                cascade,
            } => {
                let names = [object_name(&name)?];
                ddl::drop_objects(self, "sink", if_exists, &names, cascade).await
            }
            Stmt::DropSource {
                name,
                if_exists,
                cascade,
            } => {
                let names = [object_name(&name)?];
                ddl::drop_objects(self, "source", if_exists, &names, cascade).await
            }
            Stmt::SetParallelism { view, parallelism } => {
                ddl::set_parallelism(self, &object_name(&view)?, parallelism).await
            }
            Stmt::CreateSavepoint { name, view } => {
                let view = view.as_ref().map(object_name).transpose()?;
                savepoint::create(self, &name, view.as_ref()).await
            }
            Stmt::DropSavepoint { name, if_exists } => {
                savepoint::drop(self, &name, if_exists).await
            }
            Stmt::ShowSavepoints => savepoint::show(self),
            Stmt::RestoreSavepoint { name, view } => {
                let view = view.as_ref().map(object_name).transpose()?;
                savepoint::restore(self, &name, view.as_ref()).await
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
                session
                    .cursors
                    .insert(name, Cursor::Subscribe(Box::new(sub)));
                Ok(QueryResult::command("DECLARE CURSOR"))
            }
            Stmt::Fetch {
                cursor,
                count,
                timeout,
                skip,
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
                if skip {
                    return Ok(QueryResult::Command {
                        tag: "MOVE".into(),
                        rows: Some(batches.iter().map(RecordBatch::num_rows).sum()),
                    });
                }
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
            Statement::Declare { stmts } => {
                for d in stmts {
                    declare_cursor(self, session, d).await?;
                }
                Ok(QueryResult::command("DECLARE CURSOR"))
            }
            Statement::Copy {
                source,
                to,
                target,
                options,
                legacy_options,
                ..
            } => match crate::sql::copy::plan(source, to, target, &options, &legacy_options)? {
                crate::sql::copy::Copy::Out { query, options } => {
                    match query::select(self, session, *query).await? {
                        QueryResult::Rows { schema, batches } => Ok(QueryResult::CopyOut {
                            schema,
                            batches,
                            options,
                        }),
                        _ => Err(ServerError::Internal("COPY's query gave no rows".into())),
                    }
                }
                crate::sql::copy::Copy::In {
                    table,
                    columns,
                    options,
                } => {
                    let table = crate::sql::stmt::object_name(&table)?;
                    // Refused now, before the client sends its data.
                    dml::copy_target(self, &table)?;
                    Ok(QueryResult::CopyIn {
                        table,
                        columns: columns.iter().map(crate::sql::stmt::ident).collect(),
                        options,
                    })
                }
            },
            Statement::Insert(insert) => {
                self.written(session, dml::insert(self, insert).await).await
            }
            Statement::Update(update) => {
                self.written(session, dml::update(self, update).await).await
            }
            Statement::Delete(delete) => {
                self.written(session, dml::delete(self, delete).await).await
            }
            Statement::Truncate(truncate) => {
                self.written(session, dml::truncate(self, truncate).await)
                    .await
            }
            Statement::CreateTable(ct) => {
                ddl::create_table(self, session, ct, Default::default()).await
            }
            Statement::CreateView(cv) => ddl::create_view(self, session, cv, false).await,
            Statement::CreateSchema {
                schema_name,
                if_not_exists,
                ..
            } => ddl::create_schema(self, &schema_name, if_not_exists).await,
            Statement::Drop {
                object_type: datafusion::sql::sqlparser::ast::ObjectType::Schema,
                if_exists,
                names,
                cascade,
                ..
            } => ddl::drop_schema(self, if_exists, &names, cascade).await,
            Statement::Drop {
                object_type,
                if_exists,
                names,
                ..
            } if crate::engine::dcl::is_role_type(&object_type) => {
                crate::engine::dcl::drop_roles(self, session, if_exists, &names)
            }
            Statement::Drop {
                object_type,
                if_exists,
                names,
                cascade,
                ..
            } => ddl::drop(self, object_type, if_exists, names, cascade).await,
            Statement::CreateRole(cr) => crate::engine::dcl::create_role(self, cr, false),
            Statement::AlterRole { name, operation } => {
                crate::engine::dcl::alter_role(self, session, &name, operation)
            }
            Statement::Grant(g) => crate::engine::dcl::grant(
                self,
                true,
                &g.privileges,
                g.objects.as_ref(),
                &g.grantees,
                g.with_grant_option,
            ),
            Statement::Revoke(r) => crate::engine::dcl::grant(
                self,
                false,
                &r.privileges,
                r.objects.as_ref(),
                &r.grantees,
                false,
            ),
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
            Statement::ShowTables { show_options, .. } => query::show_tables(self, &show_options),
            Statement::ShowSchemas { show_options, .. }
                if show_options.show_in.is_none() && show_options.filter_position.is_none() =>
            {
                query::show_schemas(self)
            }
            Statement::ShowVariable { variable } => {
                let words = variable.iter().map(|i| i.value.clone()).collect::<Vec<_>>();
                // `SHOW TRANSACTION ISOLATION LEVEL` and `SHOW TIME ZONE`
                // are spelled in words; `SHOW ext.name` is one setting.
                let name = match words.join(" ").to_lowercase().as_str() {
                    "transaction isolation level" => "transaction_isolation".to_string(),
                    "time zone" => "timezone".to_string(),
                    "session authorization" => "session_authorization".to_string(),
                    _ => words.join("."),
                };
                if name.eq_ignore_ascii_case("all") {
                    let rows = session
                        .settings()
                        .into_iter()
                        .map(|(k, v)| vec![k, v])
                        .collect();
                    return QueryResult::texts(&["name", "setting"], rows);
                }
                QueryResult::text(&name.to_lowercase(), vec![session.get(&name)?])
            }
            Statement::Set(set) => set_variable(session, set),
            Statement::Reset(r) => {
                match r.reset {
                    Reset::ALL => session.reset_all(),
                    Reset::ConfigurationParameter(name) => session.reset(&name.to_string())?,
                }
                Ok(QueryResult::command("RESET"))
            }
            Statement::StartTransaction { modes, .. } => {
                set_transaction_modes(session, &modes, false)?;
                Ok(QueryResult::command("BEGIN"))
            }
            // Every statement is its own transaction already; what `SET
            // TRANSACTION` chose ends with the block, as in Postgres.
            Statement::Commit { .. } => {
                end_transaction(session)?;
                Ok(QueryResult::command("COMMIT"))
            }
            // Savepoints inside a block (psycopg's nested transactions,
            // SQLAlchemy's) are accepted as the block is: a statement's
            // writes are its own, and rolling back to one undoes nothing.
            Statement::Savepoint { .. } => Ok(QueryResult::command("SAVEPOINT")),
            Statement::ReleaseSavepoint { .. } => Ok(QueryResult::command("RELEASE")),
            Statement::Rollback {
                savepoint: Some(_), ..
            } => Ok(QueryResult::command("ROLLBACK")),
            Statement::Rollback { .. } => {
                end_transaction(session)?;
                Ok(QueryResult::command("ROLLBACK"))
            }
            // Nothing is ever listened to (LISTEN is refused below).
            Statement::UNLISTEN { .. } => Ok(QueryResult::command("UNLISTEN")),
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
        // Weir's reads see one committed checkpoint and its writes are
        // serializable, which satisfies every level; the level asked for
        // is kept, so that SHOW answers it.
        Set::SetTransaction {
            modes,
            snapshot: None,
            session: is_session,
        } => {
            set_transaction_modes(session, &modes, is_session)?;
            Ok(QueryResult::command("SET"))
        }
        other => Err(ServerError::unsupported(format!("{other}"))),
    }
}

/// Whether `stmt` may be stopped (cancelled, timed out) until it reaches
/// its commit point: statements that change nothing, and those that mark
/// the point where they start to (`crate::engine::control::commit_point`): DML,
/// and the creation of views and sinks, which plan and check everything
/// first.
fn stoppable(stmt: &Stmt) -> bool {
    match stmt {
        Stmt::Sql(s) => matches!(
            s.as_ref(),
            Statement::Query(_)
                | Statement::Insert(_)
                | Statement::Update(_)
                | Statement::Delete(_)
                | Statement::Explain { .. }
                | Statement::ShowVariable { .. }
                | Statement::ShowTables { .. }
                | Statement::ShowSchemas { .. }
                | Statement::Declare { .. }
                | Statement::Copy { .. }
                | Statement::CreateView(_)
        ),
        Stmt::EmitOnWindowClose(_)
        | Stmt::CreateSink { .. }
        | Stmt::Flush
        | Stmt::Checkpoint
        | Stmt::ShowMaterializedViews
        | Stmt::ShowViews
        | Stmt::ShowCreateView { .. }
        | Stmt::ShowJobs
        | Stmt::ShowSources
        | Stmt::ShowSinks
        | Stmt::ShowSavepoints
        | Stmt::Subscribe { .. }
        | Stmt::DeclareSubscribe { .. }
        | Stmt::Fetch { .. } => true,
        _ => false,
    }
}

/// The command `stmt` is, if it changes data or the catalog (which a
/// read-only transaction may not).
fn writes(stmt: &Stmt) -> Option<&'static str> {
    Some(match stmt {
        Stmt::CreateSink { .. } => "CREATE SINK",
        Stmt::DropSink { .. } => "DROP SINK",
        Stmt::DropSource { .. } => "DROP SOURCE",
        Stmt::SetParallelism { .. } => "ALTER MATERIALIZED VIEW",
        Stmt::CreateSavepoint { .. } => "CREATE SAVEPOINT",
        Stmt::DropSavepoint { .. } => "DROP SAVEPOINT",
        Stmt::RestoreSavepoint { .. } => "RESTORE SAVEPOINT",
        Stmt::EmitOnWindowClose(_) => "CREATE MATERIALIZED VIEW",
        Stmt::CreateTable { .. } => "CREATE TABLE",
        Stmt::Sql(s) => match s.as_ref() {
            Statement::Insert(_) => "INSERT",
            Statement::Copy { to: false, .. } => "COPY FROM",
            Statement::Update(_) => "UPDATE",
            Statement::Delete(_) => "DELETE",
            Statement::Truncate(_) => "TRUNCATE",
            Statement::CreateTable(_) => "CREATE TABLE",
            Statement::CreateView(_) => "CREATE VIEW",
            Statement::Drop { .. } => "DROP",
            _ => return None,
        },
        _ => return None,
    })
}

/// `BEGIN ISOLATION LEVEL …`, `SET [SESSION CHARACTERISTICS AS]
/// TRANSACTION …`.
fn set_transaction_modes(
    session: &mut Session,
    modes: &[TransactionMode],
    is_session: bool,
) -> Result<()> {
    for mode in modes {
        let (name, value) = match mode {
            TransactionMode::IsolationLevel(level) => (
                "transaction_isolation",
                match level {
                    TransactionIsolationLevel::Serializable => "serializable",
                    TransactionIsolationLevel::RepeatableRead => "repeatable read",
                    TransactionIsolationLevel::ReadCommitted => "read committed",
                    TransactionIsolationLevel::ReadUncommitted => "read uncommitted",
                    other => {
                        return Err(ServerError::unsupported(format!(
                            "the isolation level {other}"
                        )));
                    }
                },
            ),
            TransactionMode::AccessMode(TransactionAccessMode::ReadOnly) => {
                ("transaction_read_only", "on")
            }
            TransactionMode::AccessMode(TransactionAccessMode::ReadWrite) => {
                ("transaction_read_only", "off")
            }
        };
        session.set(name, value)?;
        if is_session {
            session.set(&format!("default_{name}"), value)?;
        }
    }
    Ok(())
}

/// The end of a transaction block: its own modes give way to the
/// session's defaults.
/// `DECLARE name [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR query`: the
/// query runs now and its rows wait for `FETCH`.
async fn declare_cursor(
    db: &Arc<Database>,
    session: &mut Session,
    d: datafusion::sql::sqlparser::ast::Declare,
) -> Result<()> {
    let (Some(query), [name]) = (d.for_query, d.names.as_slice()) else {
        return Err(ServerError::unsupported(
            "DECLARE of anything but a cursor FOR a query",
        ));
    };
    if d.binary == Some(true) {
        return Err(ServerError::unsupported("BINARY cursors"));
    }
    if d.scroll == Some(true) {
        return Err(ServerError::unsupported(
            "SCROLL cursors (cursors here only move forward)",
        ));
    }
    let name = crate::sql::stmt::ident(name);
    if session.cursors.contains_key(&name) {
        return Err(ServerError::DuplicateCursor(format!(
            "cursor \"{name}\" already exists"
        )));
    }
    let QueryResult::Rows { schema, batches } = query::select(db, session, *query).await? else {
        return Err(ServerError::Internal(
            "a cursor's query gave no rows".into(),
        ));
    };
    let hold = d.hold == Some(true);
    session
        .cursors
        .insert(name, Cursor::rows(schema, batches, hold));
    Ok(())
}

fn end_transaction(session: &mut Session) -> Result<()> {
    session.cursors.retain(|_, c| !c.closes_with_transaction());
    for name in ["transaction_isolation", "transaction_read_only"] {
        let default = session.get(&format!("default_{name}"))?;
        session.set(name, &default)?;
    }
    Ok(())
}

fn emit_misplaced() -> ServerError {
    ServerError::Syntax("EMIT ON WINDOW CLOSE ends a CREATE MATERIALIZED VIEW only".into())
}

//! The queries and jobs of views and sinks. A query is written out as it
//! is stored ([`write_out_corresponding`]), checked ([`check_query`]) and
//! its dependencies found ([`dependencies`]). A job is planned from its
//! catalog entry (the query and the options the creating session had,
//! [`JobOptions`]), started with its entry ([`start`]), recovered at
//! start-up ([`recover`]) and rescaled ([`set_parallelism`]). DDL and
//! sinks create jobs through here, table ingest plans its own with
//! [`plan_job`]; no one else asks the JobManager to run a view's job.

use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, FunctionArg, FunctionArgExpr, ObjectName, TableFactor, Visit, Visitor,
};
use planner::StreamPlanOptions;
use planner::job_graph::JobGraph;
use planner::spec::CheckpointMode;

use crate::catalog::Entry;
use crate::engine::context::{Mode, context, context_of_view, plan_query};
use crate::engine::session::Session;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::{self, QualifiedName, ident, object_name};

/// How a job (a materialized view's or a sink's) is planned: the
/// session's settings when it was created, kept in its catalog entry.
#[derive(Debug, Clone)]
pub(crate) struct JobOptions {
    pub(crate) parallelism: usize,
    pub(crate) chaining: bool,
    pub(crate) checkpoint_mode: CheckpointMode,
    pub(crate) emit_on_window_close: bool,
    pub(crate) state_ttl_us: Option<i64>,
    pub(crate) state_backend: Option<planner::spec::StateBackend>,
    /// A sink's job ends in the sink.
    pub(crate) sink: Option<planner::SinkTarget>,
    /// A view's changelog retention (ms; 0: none).
    pub(crate) retain_history_ms: u64,
    /// Materialized views the query names are read through their
    /// changelogs (see `Mode::Stream`).
    pub(crate) reads_changelogs: bool,
}

impl JobOptions {
    /// A job's options when nothing else is said.
    pub(crate) fn defaults() -> Self {
        Self {
            parallelism: 1,
            chaining: true,
            checkpoint_mode: CheckpointMode::default(),
            emit_on_window_close: false,
            state_ttl_us: None,
            state_backend: None,
            sink: None,
            retain_history_ms: 0,
            reads_changelogs: false,
        }
    }

    pub(crate) fn of_session(session: &Session, emit_on_window_close: bool) -> Self {
        Self {
            parallelism: session.streaming_parallelism,
            chaining: session.streaming_chaining,
            checkpoint_mode: session.checkpoint_mode,
            emit_on_window_close,
            state_ttl_us: session.state_ttl_us,
            state_backend: session.state_backend,
            sink: None,
            retain_history_ms: crate::catalog::DEFAULT_RETAIN_HISTORY_MS,
            // A view over a view's changelog has no watermark to close
            // windows by: EMIT ON WINDOW CLOSE inlines the views it reads.
            reads_changelogs: !emit_on_window_close,
        }
    }

    /// A materialized view's or a sink's: its id, query and options.
    fn of_job(entry: &Entry) -> Result<(u64, String, Self)> {
        match entry {
            Entry::MaterializedView {
                id,
                sql,
                parallelism,
                chaining,
                checkpoint_mode,
                emit_on_window_close,
                state_ttl_us,
                state_backend,
                retain_history_ms,
                reads_changelogs,
                ..
            } => Ok((
                *id,
                sql.clone(),
                Self {
                    parallelism: *parallelism,
                    chaining: *chaining,
                    checkpoint_mode: *checkpoint_mode,
                    emit_on_window_close: *emit_on_window_close,
                    state_ttl_us: *state_ttl_us,
                    state_backend: *state_backend,
                    sink: None,
                    retain_history_ms: *retain_history_ms,
                    reads_changelogs: *reads_changelogs,
                },
            )),
            Entry::Sink {
                id,
                name,
                sql,
                connector,
                key,
                parallelism,
                chaining,
                checkpoint_mode,
                state_ttl_us,
                state_backend,
                reads_changelogs,
                ..
            } => Ok((
                *id,
                sql.clone(),
                Self {
                    parallelism: *parallelism,
                    chaining: *chaining,
                    checkpoint_mode: *checkpoint_mode,
                    emit_on_window_close: false,
                    state_ttl_us: *state_ttl_us,
                    state_backend: *state_backend,
                    sink: Some(planner::SinkTarget {
                        name: name.clone(),
                        connector: connector.clone(),
                        key: key.clone(),
                    }),
                    retain_history_ms: 0,
                    reads_changelogs: *reads_changelogs,
                },
            )),
            _ => Err(ServerError::WrongObjectType(format!(
                "\"{}\" is not a materialized view",
                entry.name()
            ))),
        }
    }
}

/// Lowers a view's query into the JobGraph of its job, and checks that
/// every operator can be built.
pub(crate) async fn job_graph(
    db: &Arc<Database>,
    sql: &str,
    id: u64,
    o: &JobOptions,
) -> Result<JobGraph> {
    let changelogs = o.reads_changelogs;
    let ctx = context_of_view(db, Mode::Stream { changelogs }, id);
    let plan = planner::temporal::mark_now(plan_query(&ctx, sql).await?)?;
    plan_job(plan, id, o)
}

/// Optimizes a job's logical plan, lowers it into the JobGraph of job `id`
/// and checks that every operator can be built.
pub(crate) fn plan_job(
    plan: datafusion::logical_expr::LogicalPlan,
    id: u64,
    o: &JobOptions,
) -> Result<JobGraph> {
    let stream = planner::context::plan_stream(
        &plan,
        &StreamPlanOptions {
            parallelism: o.parallelism,
            chaining: o.chaining,
            checkpoint_mode: o.checkpoint_mode,
            state_backend: o.state_backend,
            emit_on_window_close: o.emit_on_window_close,
            view_id: id,
            state_ttl_us: o.state_ttl_us,
            sink: o.sink.clone(),
            retain_history_ms: (o.retain_history_ms > 0).then_some(o.retain_history_ms),
        },
    )?;
    for node in &stream.nodes {
        if !node.spec.is_source() && !matches!(node.spec, planner::spec::OperatorSpec::Sink { .. })
        {
            executor::operators::build(node)?;
        }
    }
    Ok(JobGraph::from_stream_graph(stream))
}

/// The materialized views `entry`'s job reads through their changelogs:
/// those its query names, directly or through plain views, that keep one.
pub(crate) fn changelogs_read(db: &Database, entry: &Entry) -> Vec<u64> {
    let reads = match entry {
        Entry::MaterializedView {
            reads_changelogs, ..
        }
        | Entry::Sink {
            reads_changelogs, ..
        } => *reads_changelogs,
        _ => false,
    };
    let mut out = BTreeSet::new();
    let mut todo: Vec<u64> = if reads {
        entry.depends_on().to_vec()
    } else {
        Vec::new()
    };
    let mut seen = BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id) {
            continue;
        }
        match db.catalog.get(id) {
            Some(Entry::MaterializedView {
                retain_history_ms, ..
            }) if retain_history_ms > 0 => {
                out.insert(id);
            }
            Some(e @ Entry::View { .. }) => todo.extend(e.depends_on()),
            _ => {}
        }
    }
    out.into_iter().collect()
}

/// Restarts the job of a materialized view or a sink from its latest completed
/// checkpoint, in the background: it waits for slots as long as its restart
/// strategy allows (TaskManagers may still be registering).
pub async fn recover(db: &Arc<Database>, entry: &Entry) -> Result<()> {
    let (id, sql, options) = JobOptions::of_job(entry)?;
    let graph = job_graph(db, &sql, id, &options).await?;
    db.cluster.job_manager.recover_job(id, graph).await?;
    Ok(())
}

/// Adds the entry of a new materialized view or sink and starts its job;
/// returns once the job holds the tables' current contents (a checkpoint
/// triggered now includes everything written before). On failure nothing
/// is left behind.
pub(crate) async fn start(db: &Arc<Database>, entry: Entry, graph: JobGraph) -> Result<()> {
    let id = entry.id();
    // Planned and checked: from here the object is created, whoever
    // cancels the statement.
    crate::engine::control::commit_point()?;
    db.catalog.add(entry)?;
    if let Err(e) = db.cluster.job_manager.submit_job(id, graph).await {
        // Named while the entry is still there.
        let error = db.job_error(e);
        db.catalog.remove(&[id])?;
        return Err(error);
    }
    if let Err(e) = db.cluster.job_manager.checkpoint_now(id).await {
        // Named while the entry is still there.
        let error = db.job_error(e);
        db.catalog.remove(&[id])?;
        let _ = db.cluster.job_manager.cancel_job(id, true).await;
        return Err(error);
    }
    Ok(())
}

/// `ALTER MATERIALIZED VIEW | SINK name SET PARALLELISM = n`: rescales the
/// view's (or sink's) job. It stops at a checkpoint taken for the purpose, is planned again at
/// the new parallelism (the same operators, so the same state tables) and
/// resumes, each new subtask restoring the key groups it now owns.
pub async fn set_parallelism(
    db: &Arc<Database>,
    view: &QualifiedName,
    parallelism: u64,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let max = storage::keys::MAX_PARALLELISM as u64;
    if parallelism == 0 || parallelism > max {
        return Err(ServerError::InvalidParameter(format!(
            "parallelism must be between 1 and {max} (the number of key groups), not {parallelism}"
        )));
    }
    let entry = db.catalog.by_name(view).ok_or_else(|| {
        ServerError::UndefinedTable(format!("materialized view \"{view}\" does not exist"))
    })?;
    let (id, sql, mut options) = JobOptions::of_job(&entry)?;
    let tag = QueryResult::command(match entry {
        Entry::Sink { .. } => "ALTER SINK",
        _ => "ALTER MATERIALIZED VIEW",
    });
    let parallelism = parallelism as usize;
    // The same parallelism again restarts a job that failed for good.
    if parallelism == options.parallelism && !db.cluster.job_manager.has_failed(id) {
        return Ok(tag);
    }
    options.parallelism = parallelism;
    let graph = job_graph(db, &sql, id, &options).await?;
    db.cluster
        .job_manager
        .rescale(id, graph)
        .await
        .map_err(|e| db.job_error(e))?;
    let mut updated = entry;
    if let Entry::MaterializedView {
        parallelism: current,
        ..
    }
    | Entry::Sink {
        parallelism: current,
        ..
    } = &mut updated
    {
        *current = parallelism;
    }
    db.catalog.add(updated)?;
    Ok(tag)
}

/// Writes out `q`'s plain `CORRESPONDING`s (see `crate::sql::corresponding`),
/// as views and sinks store their queries; the context their sides are
/// planned in is made only for a query that has one.
pub(crate) async fn write_out_corresponding(
    db: &Arc<Database>,
    q: &mut datafusion::sql::sqlparser::ast::Query,
) -> Result<()> {
    if crate::sql::corresponding::has_by_name(q) {
        crate::sql::corresponding::resolve(&context(db, Mode::Batch), q).await?;
    }
    Ok(())
}

/// Plans `sql` once as a query: names, types and columns are checked, and
/// no two columns may have one name.
pub(crate) async fn check_query(db: &Arc<Database>, sql: &str) -> Result<()> {
    let plan = plan_query(&context(db, Mode::Batch), sql).await?;
    let mut names = BTreeSet::new();
    for f in plan.schema().fields() {
        if !names.insert(f.name().clone()) {
            return Err(ServerError::DuplicateColumn(format!(
                "column \"{}\" specified more than once",
                f.name()
            )));
        }
    }
    Ok(())
}

/// Catalog entries the query names directly.
pub(crate) fn dependencies(db: &Database, sql: &str) -> Result<Vec<u64>> {
    let Some(stmt::Stmt::Sql(s)) = stmt::parse(sql)?.pop() else {
        return Ok(vec![]);
    };
    // `TUMBLE(t, …)` names its table as an argument, and is not itself a
    // relation (though DataFusion lists it as one).
    let mut windows = WindowTables::default();
    let _ = s.visit(&mut windows);
    let (refs, _) =
        datafusion::sql::resolve::resolve_table_references(&DfStatement::Statement(s), true)?;
    let mut names: Vec<QualifiedName> = refs
        .iter()
        .map(|r| QualifiedName {
            schema: r.schema().unwrap_or(stmt::DEFAULT_SCHEMA).to_string(),
            // A temporal join reads the table itself.
            name: r
                .table()
                .strip_suffix(stmt::CURRENT_VERSION)
                .unwrap_or(r.table())
                .to_string(),
        })
        .filter(|n| !windows.functions.contains(n) || windows.relations.contains(n))
        .collect();
    names.extend(windows.tables);
    let mut ids = BTreeSet::new();
    for name in names {
        if let Some(e) = db.catalog.by_name(&name) {
            ids.insert(e.id());
        }
    }
    Ok(ids.into_iter().collect())
}

/// The tables window table functions read, the names of the functions
/// called, and the names used as plain relations.
#[derive(Default)]
struct WindowTables {
    tables: Vec<QualifiedName>,
    functions: BTreeSet<QualifiedName>,
    relations: BTreeSet<QualifiedName>,
}

impl Visitor for WindowTables {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<()> {
        match factor {
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } => {
                if let Ok(n) = object_name(name)
                    && crate::sql::window_tvf::FUNCTIONS.contains(&n.name.as_str())
                {
                    let table = match args.args.first() {
                        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Identifier(
                            table,
                        )))) => Some(QualifiedName::public(ident(table))),
                        Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(
                            SqlExpr::CompoundIdentifier(parts),
                        ))) => object_name(&ObjectName::from(parts.clone())).ok(),
                        _ => None,
                    };
                    self.tables.extend(table);
                    self.functions.insert(n);
                }
            }
            TableFactor::Table {
                name, args: None, ..
            } => {
                if let Ok(n) = object_name(name) {
                    self.relations.insert(n);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

//! DataFusion contexts over Weir's catalog.
//!
//! Each statement gets a fresh `SessionContext` whose tables stand for the
//! catalog in one of three ways:
//! * **batch** (`SELECT`): tables read their current rows; materialized
//!   views read their state at the latest committed checkpoint;
//! * **stream** (`CREATE MATERIALIZED VIEW`): tables are stream sources,
//!   views are inlined as their queries, and a materialized view is read
//!   through its changelog (its committed output), unless it keeps none
//!   or the job predates that: then it is inlined too;
//! * **dml**: like batch, but the target table shows its hidden row id.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::catalog::{MemTable, SchemaProvider, Session, TableProvider};
use datafusion::common::DFSchema;
use datafusion::datasource::{TableType, ViewTable};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{Expr, ExprSchemable, LogicalPlan};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::sql::parser::Statement as DfStatement;
use datafusion::sql::sqlparser::ast::Statement;
use planner::context::new_context;
use planner::source::StreamSourceTable;
use storage::pending::PendingWrites;

use crate::catalog::{Entry, table_desc, user_schema};
use crate::engine::Database;
use crate::error::{Result, ServerError};
use crate::sql::stmt::{self, QualifiedName, Stmt};

/// How the catalog appears to a statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Batch,
    /// A job's sources. `changelogs`: a materialized view that keeps a
    /// changelog is read through it (its committed output); otherwise,
    /// and always for jobs created before that was possible, it is
    /// inlined as its query.
    Stream {
        changelogs: bool,
    },
    /// Batch, with the hidden row id of this table visible.
    Dml(u64),
}

/// A table's current rows.
#[derive(Debug)]
struct TableRows {
    db: Arc<Database>,
    table: u64,
    schema: SchemaRef,
    /// Column defaults, for `INSERT`s that leave columns out.
    defaults: HashMap<String, Expr>,
}

#[async_trait]
impl TableProvider for TableRows {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.defaults.get(column)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        use executor::task::TableLog;
        use futures::StreamExt;
        let external = |e: storage::StorageError| DataFusionError::External(Box::new(e));
        // One snapshot, read a page at a time as the plan runs.
        let tables = self.db.cluster.tables.clone();
        let (_, pages) = tables
            .clone()
            .snapshot_stream(self.table)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        // Inside a transaction block, what the block changed is laid over
        // the stored rows (see `crate::engine::transaction`).
        let block = state
            .config()
            .get_extension::<PendingWrites>()
            .filter(|w| w.touches(self.table));
        let (pages, block_rows) = match block {
            Some(writes) => {
                let added = tables.pending_rows(&writes, self.table).map_err(external)?;
                let (table, tables) = (self.table, tables.clone());
                let pages = pages.map(move |page| {
                    tables
                        .overlay_page(&writes, table, page?)
                        .map_err(executor::ExecError::from)
                });
                (pages.boxed(), added)
            }
            None => (pages, None),
        };
        let pages = pages.chain(futures::stream::iter(block_rows.map(Ok)));
        let schema = self.schema.clone();
        // Without the hidden row id.
        let n = schema.fields().len();
        let rows = pages.map(move |page| {
            let page = page.map_err(|e| DataFusionError::External(Box::new(e)))?;
            Ok(RecordBatch::try_new(
                schema.clone(),
                page.columns()[..n].to_vec(),
            )?)
        });
        streamed(self.schema.clone(), rows.boxed(), projection, limit)
    }
}

/// A materialized view's rows at its latest committed checkpoint.
#[derive(Debug)]
struct ViewRows {
    db: Arc<Database>,
    job: u64,
    state_table: u64,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for ViewRows {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(e) = self.db.restore_errors.get(self.job) {
            return Err(DataFusionError::External(Box::new(
                ServerError::NotInPrerequisiteState(format!(
                    "materialized view \"{}\" could not be restored when the server started: {}; drop it and create it again",
                    e.name.unwrap_or_default(),
                    e.error
                )),
            )));
        }
        let jobs = &self.db.cluster.job_manager;
        // A row whose expression fails is an error the view holds until
        // the row goes (executor::errors).
        let errors = jobs
            .read_errors(self.job)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        if let Some(first) = errors.first() {
            let name = self
                .db
                .catalog
                .get(self.job)
                .map(|e| e.name().to_string())
                .unwrap_or_default();
            return Err(DataFusionError::External(Box::new(
                ServerError::view_error(&name, first, errors.len()),
            )));
        }
        // Read a page at a time as the plan runs: a view many times the
        // memory streams through an aggregate over it.
        let rows = jobs
            .read_view_stream(self.job, self.state_table, self.schema.clone())
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)))?;
        use futures::StreamExt;
        let rows = rows.map(|r| r.map_err(|e| DataFusionError::External(Box::new(e))));
        streamed(self.schema.clone(), rows.boxed(), projection, limit)
    }
}

/// Rows of one snapshot as they are read, pinned when the statement was
/// planned.
type Rows = executor::read_once::Batches;

/// A plan that reads `rows` once as it runs.
fn streamed(
    schema: SchemaRef,
    rows: Rows,
    projection: Option<&Vec<usize>>,
    limit: Option<usize>,
) -> DfResult<Arc<dyn ExecutionPlan>> {
    Ok(Arc::new(executor::read_once::plan(
        "a table's or view's rows",
        schema,
        rows,
        projection,
        None,
        limit,
    )?))
}

/// The columns a materialized view's rows were written with: those of its
/// query after type coercion (a UNION widens its inputs), which the
/// analyzer applies. `id` is the view's: its query sees only older objects.
pub(crate) async fn view_schema(db: &Arc<Database>, id: u64, sql: &str) -> Result<SchemaRef> {
    let ctx = context_of_view(db, Mode::Batch, id);
    let plan = plan_query(&ctx, sql).await?;
    let plan = ctx.state().optimize(&plan)?;
    Ok(executor::expr::output_schema(plan.schema()))
}

/// Plans a query's SQL text in `ctx`, with Postgres column names and
/// Postgres's spellings that DataFusion plans otherwise rewritten (as for a
/// `SELECT`: `generate_series(…)` in a select list is its rows, and so on).
pub async fn plan_query(ctx: &SessionContext, sql: &str) -> Result<LogicalPlan> {
    let mut stmts = stmt::parse(sql)?;
    let (Some(Stmt::Sql(s)), true) = (stmts.pop(), stmts.is_empty()) else {
        return Err(ServerError::Syntax(format!("not a single query: {sql}")));
    };
    let Statement::Query(mut q) = *s else {
        return Err(ServerError::Syntax(format!("not a query: {sql}")));
    };
    stmt::apply_pg_names(&mut q);
    crate::sql::rewrite::rewrite_view(&mut q)?;
    plan_statement(ctx, Statement::Query(q)).await
}

/// Plans any statement DataFusion knows.
pub async fn plan_statement(ctx: &SessionContext, mut s: Statement) -> Result<LogicalPlan> {
    crate::sql::corresponding::resolve(ctx, &mut s).await?;
    Ok(ctx
        .state()
        .statement_to_plan(DfStatement::Statement(Box::new(s)))
        .await?)
}

/// One schema of the catalog as a DataFusion schema: providers are made
/// on demand, for the names a statement actually uses.
#[derive(Debug)]
struct CatalogSchema {
    db: Arc<Database>,
    mode: Mode,
    scope: Scope,
    schema: String,
}

/// Which catalog objects a query's names may resolve to.
///
/// A view's query was checked when the view was created, against the
/// objects that existed then, so it names only objects older than itself
/// (ids are allocated in order, and an object a view depends on cannot be
/// dropped without the view). Planning it again sees only those: a name
/// that is also the view's own (`CREATE VIEW hop AS … FROM HOP(…)`, whose
/// function name DataFusion also looks up as a table) never resolves back
/// to the view, so inlining views always ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scope {
    /// Only objects with smaller ids are visible; every object when `None`.
    pub before: Option<u64>,
}

impl Scope {
    /// The scope of a statement: the whole catalog.
    pub const ALL: Scope = Scope { before: None };

    /// The scope of the query of the object `id`.
    pub fn of_object(id: u64) -> Self {
        Scope { before: Some(id) }
    }

    /// The entry `name` names in this scope.
    pub fn lookup(self, db: &Database, name: &QualifiedName) -> Option<Entry> {
        db.catalog
            .by_name(name)
            .filter(|e| self.before.is_none_or(|b| e.id() < b))
    }
}

/// A table as a query in `mode` reads it.
pub fn table_provider(
    db: &Arc<Database>,
    entry: &Entry,
    mode: Mode,
) -> Result<Arc<dyn TableProvider>> {
    let Entry::Table {
        id,
        append_only,
        watermark,
        columns,
        ..
    } = entry
    else {
        return Err(ServerError::Internal(format!(
            "{} is not a table",
            entry.name()
        )));
    };
    let desc = table_desc(entry)?;
    Ok(match mode {
        Mode::Stream { .. } => {
            let schema = user_schema(&desc);
            Arc::new(StreamSourceTable {
                table_id: *id,
                name: entry.name().to_string(),
                watermark: source_watermark(watermark.as_ref(), &schema)?,
                schema,
                append_only: *append_only,
                versioned: false,
                connector: None,
                view: false,
            })
        }
        Mode::Dml(t) if t == *id => Arc::new(TableRows {
            db: db.clone(),
            table: *id,
            defaults: column_defaults(columns, &desc.schema)?,
            schema: desc.schema,
        }),
        _ => Arc::new(TableRows {
            db: db.clone(),
            table: *id,
            defaults: column_defaults(columns, &desc.schema)?,
            schema: user_schema(&desc),
        }),
    })
}

/// `WATERMARK FOR` over a table's or source's columns, planned.
fn source_watermark(
    w: Option<&crate::catalog::WatermarkDef>,
    schema: &SchemaRef,
) -> Result<Option<planner::spec::SourceWatermark>> {
    let Some(w) = w else {
        return Ok(None);
    };
    let df = DFSchema::try_from(schema.as_ref().clone())?;
    Ok(Some(planner::spec::SourceWatermark {
        expr: new_context().parse_sql_expr(&w.expr, &df)?,
        table_schema: Arc::new(df),
        sql: w.expr.clone(),
    }))
}

/// A source as a query in `mode` reads it: in a view, through its
/// connector; in a `SELECT`, every row of a bounded source.
pub fn source_provider(entry: &Entry, mode: Mode) -> Result<Arc<dyn TableProvider>> {
    let Entry::Source {
        id,
        name,
        columns,
        watermark,
        connector,
        ..
    } = entry
    else {
        return Err(ServerError::Internal(format!(
            "{} is not a source",
            entry.name()
        )));
    };
    let schema = crate::catalog::source_schema(columns)?;
    Ok(match mode {
        Mode::Stream { .. } => Arc::new(StreamSourceTable {
            table_id: *id,
            name: name.clone(),
            watermark: source_watermark(watermark.as_ref(), &schema)?,
            schema,
            append_only: connector.format.as_deref().is_none_or(|f| f == "PLAIN"),
            versioned: false,
            connector: Some(connector.clone()),
            view: false,
        }),
        Mode::Batch | Mode::Dml(_) => {
            let source = executor::connectors::source(connector, &schema)?;
            // Refused when read, not when planned: a view's query is
            // planned as a batch query first, to check it.
            let refused = if source.changelog() {
                Some(format!(
                    "SELECT from source \"{name}\", whose records are changes (FORMAT {}): create a materialized view over it",
                    connector.format.as_deref().unwrap_or_default()
                ))
            } else if !source.batch_readable() {
                Some(format!(
                    "SELECT from source \"{name}\", which has no end: create a materialized view over it"
                ))
            } else {
                None
            };
            Arc::new(SourceRows {
                source,
                schema,
                refused,
            })
        }
    })
}

/// Every row a batch can read of a source (all of a bounded one, a Kafka
/// topic up to its end when the query starts), read at once.
struct SourceRows {
    source: Arc<dyn executor::connectors::SourceConnector>,
    schema: SchemaRef,
    /// Why a batch cannot read it (an endless source, a changelog).
    refused: Option<String>,
}

impl std::fmt::Debug for SourceRows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceRows").finish()
    }
}

#[async_trait]
impl TableProvider for SourceRows {
    fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> DfResult<Arc<dyn ExecutionPlan>> {
        if let Some(what) = &self.refused {
            return Err(DataFusionError::External(Box::new(
                ServerError::unsupported(what.clone()),
            )));
        }
        let external = |e: executor::ExecError| DataFusionError::External(Box::new(e));
        let mut batches = Vec::new();
        for split in 0..self.source.splits().await.map_err(external)? {
            let mut reader = self
                .source
                .reader(split, None, executor::connectors::Pace::Unlimited)
                .map_err(external)?;
            while let Some(b) = reader.next().await.map_err(external)? {
                batches.push(b.data);
            }
        }
        MemTable::try_new(self.schema.clone(), vec![batches])?
            .scan(state, projection, filters, limit)
            .await
    }
}

/// A column's `DEFAULT` as an expression of the column's type: a constant
/// or a function of no column (`now()`, `proctime()`).
pub fn column_default(sql: &str, data_type: &DataType) -> Result<Expr> {
    let empty = datafusion::common::DFSchema::empty();
    let e = new_context().parse_sql_expr(sql, &empty)?;
    let e = e.cast_to(data_type, &empty)?;
    // Evaluating it once finds defaults the column cannot take ('x' for an
    // integer), as Postgres does at CREATE.
    let physical = datafusion::physical_expr::create_physical_expr(
        &e,
        &empty,
        &datafusion::execution::context::ExecutionProps::new(),
        &Default::default(),
    )?;
    let one_row = datafusion::arrow::array::RecordBatch::try_new_with_options(
        Arc::new(datafusion::arrow::datatypes::Schema::empty()),
        vec![],
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(1)),
    )
    .map_err(|e| ServerError::Internal(e.to_string()))?;
    physical.evaluate(&one_row)?;
    Ok(e)
}

/// The `DEFAULT`s of a table's columns, by name.
fn column_defaults(
    columns: &[crate::catalog::Column],
    schema: &SchemaRef,
) -> Result<HashMap<String, Expr>> {
    columns
        .iter()
        .zip(schema.fields())
        .filter_map(|(c, f)| {
            let sql = c.default.as_ref()?;
            Some(column_default(sql, f.data_type()).map(|e| (c.name.clone(), e)))
        })
        .collect()
}

impl CatalogSchema {
    fn qualify(&self, name: &str) -> QualifiedName {
        QualifiedName {
            schema: self.schema.clone(),
            name: name.to_string(),
        }
    }

    async fn provider(&self, entry: Entry) -> Result<Arc<dyn TableProvider>> {
        let db = &self.db;
        Ok(match &entry {
            Entry::Table { .. } => table_provider(db, &entry, self.mode)?,
            Entry::Source { .. } => source_provider(&entry, self.mode)?,
            Entry::View { id, sql, .. } => {
                let plan = Box::pin(plan_query(&context_of_view(db, self.mode, *id), sql)).await?;
                Arc::new(ViewTable::new(plan, Some(sql.clone())))
            }
            Entry::Sink { name, .. } => {
                return Err(ServerError::WrongObjectType(format!(
                    "\"{name}\" is a sink: it writes rows elsewhere and cannot be read"
                )));
            }
            Entry::MaterializedView {
                id,
                sql,
                retain_history_ms,
                name,
                ..
            } => {
                if self.mode == (Mode::Stream { changelogs: true }) && *retain_history_ms > 0 {
                    Arc::new(StreamSourceTable {
                        table_id: *id,
                        name: name.clone(),
                        schema: Box::pin(view_schema(db, *id, sql)).await?,
                        append_only: false,
                        watermark: None,
                        versioned: false,
                        connector: None,
                        view: true,
                    })
                } else if matches!(self.mode, Mode::Stream { .. }) {
                    let plan =
                        Box::pin(plan_query(&context_of_view(db, self.mode, *id), sql)).await?;
                    Arc::new(ViewTable::new(plan, Some(sql.clone())))
                } else {
                    Arc::new(ViewRows {
                        db: db.clone(),
                        job: *id,
                        state_table: planner::view_state_table(*id),
                        schema: Box::pin(view_schema(db, *id, sql)).await?,
                    })
                }
            }
        })
    }
}

#[async_trait]
impl SchemaProvider for CatalogSchema {
    fn table_names(&self) -> Vec<String> {
        self.db
            .catalog
            .all()
            .iter()
            .filter(|e| !matches!(e, Entry::Sink { .. }) && e.schema() == self.schema)
            .map(|e| e.name().to_string())
            .collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        // `t FOR SYSTEM_TIME AS OF PROCTIME()`: the table, read at its
        // current version by a temporal join.
        if let Some(table) = name.strip_suffix(stmt::CURRENT_VERSION) {
            let Some(entry @ Entry::Table { .. }) =
                self.scope.lookup(&self.db, &self.qualify(table))
            else {
                return Ok(None);
            };
            let provider = table_provider(&self.db, &entry, self.mode)
                .map_err(|e| DataFusionError::External(Box::new(e)))?;
            let any: &dyn std::any::Any = provider.as_ref();
            return Ok(Some(match any.downcast_ref::<StreamSourceTable>() {
                Some(source) => Arc::new(StreamSourceTable {
                    versioned: true,
                    ..source.clone()
                }),
                None => provider,
            }));
        }
        let Some(entry) = self.scope.lookup(&self.db, &self.qualify(name)) else {
            return Ok(None);
        };
        self.provider(entry)
            .await
            .map(Some)
            .map_err(|e| DataFusionError::External(Box::new(e)))
    }

    fn table_exist(&self, name: &str) -> bool {
        self.scope.lookup(&self.db, &self.qualify(name)).is_some()
    }
}

/// Lets a statement inside a transaction block read the block's own
/// changes to tables (the scan finds them in the context's configuration).
pub fn reading_block(ctx: &SessionContext, tx: Option<&crate::engine::transaction::Transaction>) {
    if let Some(tx) = tx {
        ctx.state_ref()
            .write()
            .config_mut()
            .set_extension(tx.writes());
    }
}

/// A context in which the catalog appears as `mode` says.
pub fn context(db: &Arc<Database>, mode: Mode) -> SessionContext {
    context_in(db, mode, Scope::ALL)
}

/// The context the query of the view (or job) `id` is planned in: it
/// sees the objects older than the view only (see [`Scope`]).
pub fn context_of_view(db: &Arc<Database>, mode: Mode, id: u64) -> SessionContext {
    context_in(db, mode, Scope::of_object(id))
}

fn context_in(db: &Arc<Database>, mode: Mode, scope: Scope) -> SessionContext {
    let ctx = new_context();
    if !matches!(mode, Mode::Stream { .. }) {
        for rule in planner::functions::batch_analyzer_rules() {
            ctx.add_analyzer_rule(rule);
        }
    }
    if let Some(catalog) = ctx.catalog("weir") {
        // `public` replaces the empty default schema.
        for (schema, _) in db.catalog.schemas() {
            let _ = catalog.register_schema(
                &schema.clone(),
                Arc::new(CatalogSchema {
                    db: db.clone(),
                    mode,
                    scope,
                    schema,
                }),
            );
        }
        let _ = catalog.register_schema(
            crate::catalog::system::SCHEMA,
            Arc::new(crate::catalog::system::SystemSchema { db: db.clone() }),
        );
    }
    planner::windows::register(
        &ctx,
        Arc::new(WindowInputs {
            db: db.clone(),
            mode,
            scope,
        }),
    );
    ctx
}

/// The tables, streams and sources a statement's window functions read,
/// as its other names see them (`mode`, `scope`).
#[derive(Debug)]
struct WindowInputs {
    db: Arc<Database>,
    mode: Mode,
    scope: Scope,
}

impl planner::windows::WindowTables for WindowInputs {
    fn window_input(
        &self,
        function: &str,
        table: &planner::windows::TableName,
    ) -> Result<Option<Arc<dyn TableProvider>>, planner::PlanError> {
        let name = QualifiedName {
            schema: table.schema.clone(),
            name: table.name.clone(),
        };
        let entry = match self.scope.lookup(&self.db, &name) {
            Some(e @ (Entry::Table { .. } | Entry::Source { .. })) => e,
            Some(other) => {
                return Err(planner::PlanError::Unsupported(format!(
                    "{function} over the {} \"{name}\" (name a table, stream or source)",
                    other.kind()
                )));
            }
            None => return Ok(None),
        };
        let provider = match entry {
            Entry::Source { .. } => source_provider(&entry, self.mode),
            _ => table_provider(&self.db, &entry, self.mode),
        };
        // The server's own error, carried through DataFusion whole: the
        // server finds it again by its type (`crate::error`).
        provider
            .map(Some)
            .map_err(|e| planner::PlanError::DataFusion(DataFusionError::External(Box::new(e))))
    }
}

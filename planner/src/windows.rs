//! Window table functions, with Flink's and RisingWave's syntax:
//!
//! ```sql
//! TUMBLE(t, ts, size [, offset])
//! HOP(t, ts, slide, size [, offset])
//! CUMULATE(t, ts, step, size [, offset])
//! ```
//!
//! each returning `t`'s columns plus `window_start` and `window_end`
//! (`window_start <= ts < window_end`). They are not operators of their
//! own: each expands into a plain query over the table — `date_bin` for the
//! window a row falls in, a `UNION ALL` of one branch per overlapping window
//! for HOP and CUMULATE — so batch `SELECT`, views and every operator
//! downstream treat windows as ordinary columns. Windows are aligned to the
//! Unix epoch plus `offset`, as Flink aligns them.
//!
//! SESSION windows depend on the gaps between rows, not on each row alone:
//! `SESSION(t, ts, gap [, key …])` expands into window functions instead
//! (see [`SessionWindow`]).
//!
//! The table a window function reads comes through [`WindowTables`], which
//! the server implements over its catalog; nothing here knows the catalog.

use std::sync::Arc;

use datafusion::arrow::compute::kernels::cast_utils::parse_interval_month_day_nano;
use datafusion::catalog::TableFunctionImpl;
use datafusion::catalog::{TableFunctionArgs, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::{ViewTable, provider_as_source};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionContext;
use datafusion::functions::datetime::expr_fn::date_bin;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, cast, col, lit};

use crate::PlanError;
use crate::context::DEFAULT_SCHEMA;

/// The table, stream or source a window function names: `schema.name`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableName {
    pub schema: String,
    pub name: String,
}

impl std::fmt::Display for TableName {
    /// As Postgres names a relation in errors: `t` in `public`, `s.t`
    /// elsewhere.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.schema == DEFAULT_SCHEMA {
            f.write_str(&self.name)
        } else {
            write!(f, "{}.{}", self.schema, self.name)
        }
    }
}

/// How a statement's window functions find the table they read. The
/// server implements it over its catalog, in the mode of the statement
/// (a batch read of the table's rows, or a view's stream source).
pub trait WindowTables: Send + Sync + std::fmt::Debug {
    /// The table, stream or source `table`, read by window function
    /// `function`; `None` if there is no such relation, an error if it is
    /// one a window function cannot read (a view).
    fn window_input(
        &self,
        function: &str,
        table: &TableName,
    ) -> Result<Option<Arc<dyn TableProvider>>, PlanError>;
}

/// Windows longer than this many branches (HOP's size / slide, CUMULATE's
/// size / step) are refused: each branch reads the table once.
const MAX_WINDOWS_PER_ROW: i64 = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Tumble,
    Hop,
    Cumulate,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Tumble => "TUMBLE",
            Kind::Hop => "HOP",
            Kind::Cumulate => "CUMULATE",
        }
    }

    fn usage(self) -> &'static str {
        match self {
            Kind::Tumble => "TUMBLE(table, time_column, size [, offset])",
            Kind::Hop => "HOP(table, time_column, slide, size [, offset])",
            Kind::Cumulate => "CUMULATE(table, time_column, step, size [, offset])",
        }
    }
}

#[derive(Debug)]
struct WindowFunction {
    kind: Kind,
    tables: Arc<dyn WindowTables>,
}

/// Registers the window functions in a statement's context.
pub fn register(ctx: &SessionContext, tables: Arc<dyn WindowTables>) {
    // DataFusion looks table functions up by their name as written.
    for kind in [Kind::Tumble, Kind::Hop, Kind::Cumulate] {
        let f = Arc::new(WindowFunction {
            kind,
            tables: tables.clone(),
        });
        ctx.register_udtf(&kind.name().to_lowercase(), f.clone());
        ctx.register_udtf(kind.name(), f);
    }
    let session = Arc::new(SessionWindow { tables });
    ctx.register_udtf("session", session.clone());
    ctx.register_udtf("SESSION", session);
}

fn error(e: PlanError) -> DataFusionError {
    e.into_datafusion()
}

/// An interval argument as microseconds; windows are fixed lengths of time.
fn micros(kind: Kind, what: &str, e: &Expr) -> DfResult<i64> {
    let bad = || {
        error(PlanError::InvalidParameter(format!(
            "{} {what} must be a positive interval such as INTERVAL '5' MINUTE, not {e}",
            kind.name()
        )))
    };
    let Expr::Literal(v, _) = e else {
        return Err(bad());
    };
    // A string is read as an interval: `'10 seconds'`, as RisingWave and
    // Postgres take an untyped literal where an interval is expected.
    let parsed;
    let v = match v {
        ScalarValue::Utf8(Some(text))
        | ScalarValue::Utf8View(Some(text))
        | ScalarValue::LargeUtf8(Some(text)) => {
            let normal = crate::functions::intervals::interval_text(text).map_err(error)?;
            let i = parse_interval_month_day_nano(normal.as_deref().unwrap_or(text))
                .map_err(|_| bad())?;
            parsed = ScalarValue::IntervalMonthDayNano(Some(i));
            &parsed
        }
        v => v,
    };
    let us = match v {
        ScalarValue::IntervalMonthDayNano(Some(i)) => {
            if i.months != 0 {
                return Err(error(PlanError::Unsupported(format!(
                    "{} windows measured in months",
                    kind.name()
                ))));
            }
            i64::from(i.days) * 86_400_000_000 + i.nanoseconds / 1_000
        }
        ScalarValue::IntervalDayTime(Some(i)) => {
            i64::from(i.days) * 86_400_000_000 + i64::from(i.milliseconds) * 1_000
        }
        ScalarValue::IntervalYearMonth(Some(_)) => {
            return Err(error(PlanError::Unsupported(format!(
                "{} windows measured in months",
                kind.name()
            ))));
        }
        _ => return Err(bad()),
    };
    if us <= 0 && what != "offset" {
        return Err(bad());
    }
    Ok(us)
}

fn interval(us: i64) -> Expr {
    lit(ScalarValue::new_interval_mdn(0, 0, us * 1_000))
}

/// The table argument of `function`, `t` or `schema.t`.
fn table_name(function: &str, usage: &str, e: &Expr) -> DfResult<TableName> {
    match e {
        Expr::Column(c) => Ok(TableName {
            schema: c
                .relation
                .as_ref()
                .map_or(DEFAULT_SCHEMA, |r| r.table())
                .to_string(),
            name: c.name.clone(),
        }),
        _ => Err(error(PlanError::Syntax(format!(
            "{function}: expected a name, not {e}; usage: {usage}"
        )))),
    }
}

fn name(kind: Kind, e: &Expr) -> DfResult<String> {
    match e {
        Expr::Column(c) => Ok(c.name.clone()),
        _ => Err(error(PlanError::Syntax(format!(
            "{}: expected a name, not {e}; usage: {}",
            kind.name(),
            kind.usage()
        )))),
    }
}

/// The table a window function reads, and the type of its time column
/// (which must be a timestamp).
fn window_source(
    tables: &dyn WindowTables,
    function: &str,
    table: &TableName,
    time: &str,
) -> DfResult<(
    Arc<dyn TableProvider>,
    datafusion::arrow::datatypes::DataType,
)> {
    let Some(provider) = tables.window_input(function, table).map_err(error)? else {
        return Err(error(PlanError::UndefinedTable(format!(
            "relation \"{table}\" does not exist"
        ))));
    };
    let schema = provider.schema();
    let Some(field) = schema.fields().iter().find(|f| f.name() == time) else {
        return Err(error(PlanError::UndefinedColumn(format!(
            "column \"{time}\" does not exist in \"{table}\""
        ))));
    };
    if !matches!(
        field.data_type(),
        datafusion::arrow::datatypes::DataType::Timestamp(..)
    ) {
        return Err(error(PlanError::DatatypeMismatch(format!(
            "{} time column \"{time}\" must be a timestamp, not {}",
            function,
            field.data_type()
        ))));
    }
    let ts_type = field.data_type().clone();

    Ok((provider, ts_type))
}

impl WindowFunction {
    fn plan(&self, args: &[Expr]) -> DfResult<LogicalPlan> {
        let kind = self.kind;
        let n_intervals = if kind == Kind::Tumble { 1 } else { 2 };
        if args.len() != 2 + n_intervals && args.len() != 3 + n_intervals {
            return Err(error(PlanError::Syntax(format!(
                "{} takes {} or {} arguments: {}",
                kind.name(),
                2 + n_intervals,
                3 + n_intervals,
                kind.usage()
            ))));
        }
        let table = table_name(kind.name(), kind.usage(), &args[0])?;
        let time = name(kind, &args[1])?;
        let (step, size) = match kind {
            Kind::Tumble => {
                let size = micros(kind, "size", &args[2])?;
                (size, size)
            }
            Kind::Hop => (
                micros(kind, "slide", &args[2])?,
                micros(kind, "size", &args[3])?,
            ),
            Kind::Cumulate => (
                micros(kind, "step", &args[2])?,
                micros(kind, "size", &args[3])?,
            ),
        };
        let offset = match args.get(2 + n_intervals) {
            Some(e) => micros(kind, "offset", e)?,
            None => 0,
        };
        if size % step != 0 {
            return Err(error(PlanError::InvalidParameter(format!(
                "{} size must be a whole multiple of its {}",
                kind.name(),
                if kind == Kind::Hop { "slide" } else { "step" }
            ))));
        }
        let windows = size / step;
        if windows > MAX_WINDOWS_PER_ROW {
            return Err(error(PlanError::Unsupported(format!(
                "{} with more than {MAX_WINDOWS_PER_ROW} windows per row",
                kind.name()
            ))));
        }
        let (provider, ts_type) = window_source(self.tables.as_ref(), kind.name(), &table, &time)?;
        let schema = provider.schema();
        let origin = lit(ScalarValue::TimestampMicrosecond(Some(offset), None));
        let ts = col(&time);
        let columns: Vec<Expr> = schema.fields().iter().map(|f| col(f.name())).collect();
        let scan =
            || LogicalPlanBuilder::scan(&table.name, provider_as_source(provider.clone()), None);
        // One branch per window a row falls in.
        let mut branches = Vec::new();
        for i in 0..windows {
            // In the time column's own type (date_bin works in nanoseconds).
            let bin = |stride: i64| {
                cast(
                    date_bin(interval(stride), ts.clone(), origin.clone()),
                    ts_type.clone(),
                )
            };
            let (start, end) = match kind {
                Kind::Tumble | Kind::Hop => {
                    let start = match i {
                        0 => bin(step),
                        _ => bin(step) - interval(i * step),
                    };
                    let end = start.clone() + interval(size);
                    (start, end)
                }
                Kind::Cumulate => {
                    let start = bin(size);
                    let end = start.clone() + interval((i + 1) * step);
                    (start, end)
                }
            };
            let mut b = scan()?;
            if kind == Kind::Cumulate {
                // The row is in the windows of its period that end after it.
                b = b.filter(ts.clone().lt(end.clone()))?;
            }
            let mut exprs = columns.clone();
            exprs.push(start.alias("window_start"));
            exprs.push(end.alias("window_end"));
            branches.push(b.project(exprs)?.build()?);
        }
        let mut branches = branches.into_iter();
        let mut plan = LogicalPlanBuilder::from(branches.next().ok_or_else(|| {
            DataFusionError::Internal("a window function without windows".into())
        })?);
        for b in branches {
            plan = plan.union(b)?;
        }
        plan.build()
    }
}

impl TableFunctionImpl for WindowFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let plan = self.plan(args.exprs())?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}

/// `SESSION(t, ts, gap [, key …])`: rows of the same keys whose times lie
/// less than `gap` apart form one session, from its first row's time to
/// its last row's time plus `gap` (Flink's session windows). The
/// assignment is the gaps-and-islands query over window functions — a row
/// starts a session when the previous row of its keys is `gap` or more
/// before it; a running count of starts numbers the sessions; each
/// session's bounds are the min and max over its rows — so in a view it
/// runs on OverWindow operators, and a late row that bridges two sessions
/// merges them (their rows move to the merged window).
#[derive(Debug)]
struct SessionWindow {
    tables: Arc<dyn WindowTables>,
}

const SESSION_USAGE: &str = "SESSION(table, time_column, gap [, key_column ...])";

impl SessionWindow {
    fn plan(&self, args: &[Expr]) -> DfResult<LogicalPlan> {
        use datafusion::functions_aggregate::min_max::{max_udaf, min_udaf};
        use datafusion::functions_aggregate::sum::sum_udaf;
        use datafusion::functions_window::expr_fn::lag;
        use datafusion::logical_expr::expr::WindowFunction as WindowExpr;
        use datafusion::logical_expr::{
            ExprFunctionExt, WindowFrame, WindowFrameBound, WindowFrameUnits, when,
        };
        if args.len() < 3 {
            return Err(error(PlanError::Syntax(format!(
                "SESSION takes at least 3 arguments: {SESSION_USAGE}"
            ))));
        }
        let session_name = |e: &Expr| -> DfResult<String> {
            match e {
                Expr::Column(c) => Ok(c.name.clone()),
                _ => Err(error(PlanError::Syntax(format!(
                    "SESSION: expected a name, not {e}; usage: {SESSION_USAGE}"
                )))),
            }
        };
        let table = table_name("SESSION", SESSION_USAGE, &args[0])?;
        let time = session_name(&args[1])?;
        let gap = match &args[2] {
            Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(i)), _) if i.months != 0 => {
                return Err(error(PlanError::Unsupported(
                    "SESSION gaps measured in months".into(),
                )));
            }
            e => micros(Kind::Tumble, "size", e).map_err(|_| {
                error(PlanError::InvalidParameter(format!(
                    "SESSION gap must be a positive interval such as INTERVAL '5' MINUTE, not {e}"
                )))
            })?,
        };
        let keys: Vec<Expr> = args[3..]
            .iter()
            .map(|e| session_name(e).map(|n| col(&n)))
            .collect::<DfResult<_>>()?;
        let (provider, ts_type) = window_source(self.tables.as_ref(), "SESSION", &table, &time)?;
        let schema = provider.schema();
        let columns: Vec<Expr> = schema.fields().iter().map(|f| col(f.name())).collect();
        for k in &keys {
            if let Expr::Column(c) = k
                && schema.field_with_name(&c.name).is_err()
            {
                return Err(error(PlanError::UndefinedColumn(format!(
                    "column \"{}\" does not exist in \"{table}\"",
                    c.name
                ))));
            }
        }
        let ts = col(&time);
        let by_time = vec![ts.clone().sort(true, false)];
        // 1. The previous row's time, per keys.
        let prev = lag(ts.clone(), Some(1), None)
            .partition_by(keys.clone())
            .order_by(by_time.clone())
            .build()?
            .alias("__session_prev");
        let plan =
            LogicalPlanBuilder::scan(&table.name, provider_as_source(provider.clone()), None)?
                .window(vec![prev])?;
        // 2. Whether the row starts a session.
        let starts = when(
            col("__session_prev")
                .is_null()
                .or((col("__session_prev") + interval(gap)).lt_eq(ts.clone())),
            lit(1i64),
        )
        .otherwise(lit(0i64))?
        .alias("__session_starts");
        let mut exprs = columns.clone();
        exprs.push(starts);
        let plan = plan.project(exprs)?;
        // 3. Sessions numbered by a running count of starts.
        let number = Expr::from(WindowExpr::new(sum_udaf(), vec![col("__session_starts")]))
            .partition_by(keys.clone())
            .order_by(by_time)
            .window_frame(WindowFrame::new_bounds(
                WindowFrameUnits::Rows,
                WindowFrameBound::Preceding(ScalarValue::UInt64(None)),
                WindowFrameBound::CurrentRow,
            ))
            .build()?
            .alias("__session");
        let plan = plan.window(vec![number])?;
        // 4. Each session's first and last time.
        let mut session_keys = keys.clone();
        session_keys.push(col("__session"));
        let bound = |f: Arc<datafusion::logical_expr::AggregateUDF>, alias: &str| {
            Expr::from(WindowExpr::new(f, vec![ts.clone()]))
                .partition_by(session_keys.clone())
                .build()
                .map(|e| e.alias(alias))
        };
        let plan = plan.window(vec![
            bound(min_udaf(), "__session_first")?,
            bound(max_udaf(), "__session_last")?,
        ])?;
        let mut exprs = columns;
        exprs.push(cast(col("__session_first"), ts_type.clone()).alias("window_start"));
        exprs.push(cast(col("__session_last") + interval(gap), ts_type).alias("window_end"));
        plan.project(exprs)?.build()
    }
}

impl TableFunctionImpl for SessionWindow {
    fn call_with_args(&self, args: TableFunctionArgs) -> DfResult<Arc<dyn TableProvider>> {
        let plan = self.plan(args.exprs())?;
        Ok(Arc::new(ViewTable::new(plan, None)))
    }
}

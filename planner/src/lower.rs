//! Lowering: an optimised DataFusion [`LogicalPlan`] becomes a [`StreamGraph`].
//!
//! Every relational node maps to one streaming operator that keeps its result
//! correct under inserts, updates and deletes. Parallelism follows Flink's
//! habits: a table source reads its log as one subtask; stateless operators
//! take their input's parallelism (so they chain with it); stateful operators
//! (aggregation, join) run at the session's `streaming_parallelism` behind a
//! hash exchange on their keys; the final Materialize follows its input's
//! parallelism, behind a hash exchange on the whole row when that is more
//! than one, so that a view row's key group (where its count is kept,
//! restored and scanned) is the one its subtask owns — Flink keys its sink
//! materializer the same way.
//!
//! Anything without a streaming operator yet is refused with
//! [`PlanError::Unsupported`] naming the feature, never planned wrongly.

use std::sync::Arc;

use datafusion::arrow::datatypes::Field;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, DFSchema, DFSchemaRef, NullEquality};
use datafusion::logical_expr::Volatility;
use datafusion::logical_expr::utils::{conjunction, split_conjunction};
use datafusion::logical_expr::{Expr, JoinType, LogicalPlan, lit};

use crate::source::as_stream_source;
use crate::spec::{
    AggCall, AggKind, OperatorSpec, Partitioner, RankKind, StreamJoinType, UnnestNulls,
};
use crate::stream_graph::StreamGraph;
use crate::temporal::{NOW_MARKER, is_now_marker, temporal_bound};
use crate::{PlanError, Result};

/// What the session decides about a new job.
#[derive(Debug, Clone)]
pub struct StreamPlanOptions {
    /// `streaming_parallelism`: parallelism of stateful operators.
    pub parallelism: usize,
    /// `streaming_chaining`: whether operators may be chained.
    pub chaining: bool,
    /// `checkpoint_mode`: exactly-once (aligned) or at-least-once.
    pub checkpoint_mode: crate::spec::CheckpointMode,
    /// `state_backend`; by default, `heap` for a job whose state is
    /// provably small ([`StreamGraph::state_is_small`]), else `rocksdb`.
    pub state_backend: Option<crate::spec::StateBackend>,
    /// `EMIT ON WINDOW CLOSE`: the view's windowed aggregate emits each
    /// window once, final, when the watermark passes its end.
    pub emit_on_window_close: bool,
    /// The catalog id of the view; state table ids derive from it.
    pub view_id: u64,
    /// `streaming_state_ttl`: aggregates and joins forget keyed state no
    /// row has written for this long (microseconds).
    pub state_ttl_us: Option<i64>,
    /// A sink's job ends in a Sink node rather than a Materialize node.
    pub sink: Option<SinkTarget>,
    /// `retain_history`: how long (ms) a view keeps its changelog for
    /// `SUBSCRIBE`; `None` keeps none.
    pub retain_history_ms: Option<u64>,
}

/// Where a sink's job writes (`CREATE SINK`).
#[derive(Debug, Clone)]
pub struct SinkTarget {
    pub name: String,
    pub connector: crate::spec::ConnectorSpec,
    /// `primary_key`: the names of the columns that identify a row.
    pub key: Vec<String>,
}

/// The state table in which the Materialize operator of view `view_id` keeps
/// its rows: what `SELECT` reads.
pub fn view_state_table(view_id: u64) -> u64 {
    view_id << 16
}

/// Where the Materialize operator of view `view_id` keeps the view's
/// changes per epoch (`SUBSCRIBE`).
pub fn view_changelog_table(view_id: u64) -> u64 {
    view_state_table(view_id) + 0xFFFE
}

/// Where operator `node` of view `view_id`'s job counts the rows whose
/// expressions fail (`executor::errors`): the upper half of the view's
/// range of table ids.
pub(crate) fn view_error_table(view_id: u64, node: usize) -> u64 {
    view_state_table(view_id) + 0x8000 + node as u64
}

/// Where the `EMIT ON WINDOW CLOSE` aggregate of view `view_id` counts the
/// rows it dropped as late: the last table id of the view's range.
pub fn late_rows_state_table(view_id: u64) -> u64 {
    view_state_table(view_id) + 0xFFFF
}

/// Refuses functions whose value changes over time or between calls
/// (`now()`, `random()`): a view must equal its query recomputed at any
/// moment. Checked before optimisation, which would fold them into constants.
pub fn check_deterministic(plan: &LogicalPlan) -> Result<()> {
    let mut bad: Option<String> = None;
    plan.apply_with_subqueries(|node| {
        node.apply_expressions(|e| {
            e.apply(|e| {
                if let Expr::ScalarFunction(f) = e
                    && f.func.signature().volatility != Volatility::Immutable
                    && f.func.name() != NOW_MARKER
                {
                    bad = Some(f.func.name().to_string());
                    return Ok(TreeNodeRecursion::Stop);
                }
                Ok(TreeNodeRecursion::Continue)
            })
        })
    })?;
    match bad {
        Some(name) => unsupported(format!(
            "the non-deterministic function {name}() in materialized views"
        )),
        None => Ok(()),
    }
}

/// Lowers `plan` (the view's query) into a StreamGraph ending in a
/// Materialize node for the view.
pub fn lower(plan: &LogicalPlan, opts: &StreamPlanOptions) -> Result<StreamGraph> {
    if opts.parallelism == 0 {
        return Err(PlanError::Internal("parallelism must be at least 1".into()));
    }
    let mut l = Lowering {
        graph: StreamGraph {
            chaining: opts.chaining,
            checkpoint_mode: opts.checkpoint_mode,
            ..Default::default()
        },
        opts,
        eowc_pending: opts.emit_on_window_close,
        under_limit: false,
    };
    let root = l.node(plan)?;
    if l.eowc_pending {
        return unsupported(
            "EMIT ON WINDOW CLOSE without a GROUP BY on a window function's window_end",
        );
    }
    let p = l.graph.nodes[root].parallelism;
    let (spec, partitioner) = match &opts.sink {
        None => (
            OperatorSpec::Materialize {
                view_id: opts.view_id,
                state_table: view_state_table(opts.view_id),
                changelog: opts
                    .retain_history_ms
                    .map(|retain_ms| crate::spec::ChangelogSpec {
                        table: view_changelog_table(opts.view_id),
                        retain_ms,
                    }),
            },
            if p > 1 {
                whole_row(plan)
            } else {
                Partitioner::Forward
            },
        ),
        Some(target) => {
            let schema = plan.schema();
            let key = target
                .key
                .iter()
                .map(|name| {
                    schema
                        .fields()
                        .iter()
                        .position(|f| f.name() == name)
                        .ok_or_else(|| {
                            PlanError::InvalidDefinition(format!(
                                "primary_key names \"{name}\", which is not a column of sink \"{}\"",
                                target.name
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            // Every change of one key goes through one subtask, in order.
            let partitioner = if p > 1 && !key.is_empty() {
                Partitioner::Hash {
                    exprs: key
                        .iter()
                        .map(|i| Expr::Column(Column::from(schema.qualified_field(*i))))
                        .collect(),
                    schema: schema.clone(),
                }
            } else {
                Partitioner::Forward
            };
            (
                OperatorSpec::Sink {
                    sink_id: opts.view_id,
                    sink_name: target.name.clone(),
                    connector: target.connector.clone(),
                    key,
                    append_only_input: l.append_only(root),
                    state_table: view_state_table(opts.view_id),
                },
                partitioner,
            )
        }
    };
    let mat = l.graph.add_node(spec, p, plan.schema().clone());
    l.graph.connect(root, mat, 0, partitioner);
    l.graph.state_backend = opts.state_backend.unwrap_or(if l.graph.state_is_small() {
        crate::spec::StateBackend::Heap
    } else {
        crate::spec::StateBackend::RocksDb
    });
    Ok(l.graph)
}

/// `WHERE rn <= n` (or `< n`, `= k`) over a window computing only
/// `ROW_NUMBER()`, `RANK()` or `DENSE_RANK()` as `rn`: the window, and the
/// range of numbers it keeps per partition (as offset and limit).
fn row_number_limit(
    filter: &datafusion::logical_expr::Filter,
) -> Option<(&datafusion::logical_expr::Window, usize, usize)> {
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let LogicalPlan::Window(window) = filter.input.as_ref() else {
        return None;
    };
    let [e] = window.window_expr.as_slice() else {
        return None;
    };
    let Expr::WindowFunction(f) = e.clone().unalias() else {
        return None;
    };
    if RankKind::from_name(f.fun.name()).is_none() || f.params.filter.is_some() {
        return None;
    }
    let rn = window
        .schema
        .field(window.input.schema().fields().len())
        .name()
        .clone();
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = &filter.predicate else {
        return None;
    };
    let (Expr::Column(c), Expr::Literal(v, _)) = (left.as_ref(), right.as_ref()) else {
        return None;
    };
    if c.name != rn {
        return None;
    }
    let n = v
        .cast_to(&datafusion::arrow::datatypes::DataType::Int64)
        .ok()?;
    let datafusion::common::ScalarValue::Int64(Some(n)) = n else {
        return None;
    };
    let n = usize::try_from(n).ok()?;
    match op {
        Operator::LtEq => Some((window, 0, n)),
        Operator::Lt => Some((window, 0, n.saturating_sub(1))),
        Operator::Eq if n >= 1 => Some((window, n - 1, 1)),
        _ => None,
    }
}

/// `r >= l - a AND r <= l + b` (BETWEEN, as the optimizer leaves it) in a
/// join condition, `l` and `r` timestamp columns of the left and right
/// inputs, `a` and `b` constant intervals: the bounds of an interval join.
fn interval_bounds(
    filter: &Expr,
    left: &LogicalPlan,
    right: &LogicalPlan,
) -> Option<crate::spec::IntervalBounds> {
    use datafusion::logical_expr::utils::split_conjunction;
    use datafusion::logical_expr::{BinaryExpr, Operator};
    let column_of = |e: &Expr, plan: &LogicalPlan| -> Option<usize> {
        let Expr::Column(c) = e else { return None };
        let i = plan.schema().index_of_column(c).ok()?;
        matches!(
            plan.schema().field(i).data_type(),
            datafusion::arrow::datatypes::DataType::Timestamp(..)
        )
        .then_some(i)
    };
    // `l ± interval` → (l's position, signed µs).
    let shifted = |e: &Expr| -> Option<(usize, i64)> {
        if let Some(i) = column_of(e, left) {
            return Some((i, 0));
        }
        let Expr::BinaryExpr(BinaryExpr {
            left: l,
            op,
            right: r,
        }) = e
        else {
            return None;
        };
        let i = column_of(l, left)?;
        let Expr::Literal(datafusion::common::ScalarValue::IntervalMonthDayNano(Some(v)), _) =
            r.as_ref()
        else {
            return None;
        };
        if v.months != 0 {
            return None;
        }
        let us = i64::from(v.days) * 86_400_000_000 + v.nanoseconds / 1_000;
        match op {
            Operator::Plus => Some((i, us)),
            Operator::Minus => Some((i, -us)),
            _ => None,
        }
    };
    let (mut low, mut high) = (None, None);
    for c in split_conjunction(filter) {
        let Expr::BinaryExpr(BinaryExpr {
            left: a,
            op,
            right: b,
        }) = c
        else {
            continue;
        };
        // Normalise to `r OP l ± x`.
        let (r, op, l) = if column_of(a, right).is_some() {
            (a, *op, b)
        } else if column_of(b, right).is_some() {
            let flipped = match op {
                Operator::Lt => Operator::Gt,
                Operator::LtEq => Operator::GtEq,
                Operator::Gt => Operator::Lt,
                Operator::GtEq => Operator::LtEq,
                other => *other,
            };
            (b, flipped, a)
        } else {
            continue;
        };
        let (Some(rt), Some((lt, shift))) = (column_of(r, right), shifted(l)) else {
            continue;
        };
        match op {
            Operator::Gt | Operator::GtEq => low = Some((lt, rt, shift)),
            Operator::Lt | Operator::LtEq => high = Some((lt, rt, shift)),
            _ => {}
        }
    }
    let ((l1, r1, lo), (l2, r2, hi)) = (low?, high?);
    (l1 == l2 && r1 == r2 && lo <= hi).then_some(crate::spec::IntervalBounds {
        left_time: l1,
        right_time: r1,
        before_us: -lo,
        after_us: hi,
    })
}

/// The position among `agg`'s group keys of `window_end`, for EMIT ON
/// WINDOW CLOSE.
fn window_end_key(agg: &datafusion::logical_expr::Aggregate) -> Result<Option<usize>> {
    if matches!(agg.group_expr.as_slice(), [Expr::GroupingSet(_)]) {
        return unsupported("EMIT ON WINDOW CLOSE with grouping sets");
    }
    Ok((0..agg.group_expr.len()).find(|i| agg.schema.field(*i).name() == "window_end"))
}

/// One aggregate call, if a HashAgg can maintain it.
fn agg_call(
    kind: AggKind,
    params: &datafusion::logical_expr::expr::AggregateFunctionParams,
    output_type: datafusion::arrow::datatypes::DataType,
) -> Result<AggCall> {
    let name = kind.name();
    let (arg, delimiter, delimiter_expr) = match (kind, params.args.as_slice()) {
        (AggKind::StringAgg, [arg, Expr::Literal(value, _)]) => {
            let delimiter = if value.is_null() {
                String::new()
            } else {
                value.to_string()
            };
            (arg, Some(delimiter), None)
        }
        (AggKind::StringAgg, [arg, delimiter]) => {
            check_expr(delimiter)?;
            (arg, None, Some(delimiter.clone()))
        }
        (_, [arg]) => (arg, None, None),
        (_, args) => return unsupported(format!("{name} with {} arguments", args.len())),
    };
    check_expr(arg)?;
    if params.null_treatment == Some(datafusion::logical_expr::expr::NullTreatment::IgnoreNulls) {
        return unsupported(format!("{name}(… IGNORE NULLS) in materialized views"));
    }
    if let Some(filter) = &params.filter {
        check_expr(filter)?;
    }
    if params.distinct
        && !matches!(
            kind,
            AggKind::Count
                | AggKind::Sum
                | AggKind::Avg
                | AggKind::Min
                | AggKind::Max
                | AggKind::StringAgg
                | AggKind::ArrayAgg
        )
    {
        return unsupported(format!("{name}(DISTINCT …) in materialized views"));
    }
    // Order-sensitive aggregates keep each value under its sort keys; with
    // no ORDER BY they list values in ascending order. For the rest the
    // order does not matter.
    let mut order_by = Vec::new();
    let mut order_options = Vec::new();
    if kind.order_sensitive() {
        for s in &params.order_by {
            check_expr(&s.expr)?;
            order_by.push(s.expr.clone());
            order_options.push((!s.asc, s.nulls_first));
        }
    }
    if params.distinct && !order_by.is_empty() && order_by.iter().any(|o| o != arg) {
        // Postgres's own rule.
        return Err(PlanError::InvalidDefinition(
            "in an aggregate with DISTINCT, ORDER BY expressions must appear in argument list"
                .into(),
        ));
    }
    Ok(AggCall {
        kind,
        arg: arg.clone(),
        output_type,
        distinct: params.distinct,
        filter: params.filter.as_deref().cloned(),
        delimiter,
        delimiter_expr,
        order_by,
        order_options,
        append_only_input: false,
    })
}

/// Hash partitioning on every column of `plan`'s output.
fn whole_row(plan: &LogicalPlan) -> Partitioner {
    Partitioner::Hash {
        exprs: plan
            .schema()
            .columns()
            .into_iter()
            .map(Expr::Column)
            .collect(),
        schema: plan.schema().clone(),
    }
}

struct Lowering<'a> {
    graph: StreamGraph,
    opts: &'a StreamPlanOptions,
    /// EMIT ON WINDOW CLOSE was asked for and the aggregate it applies to
    /// (the one nearest the view's output) is not reached yet.
    eowc_pending: bool,
    /// Below a `LIMIT`, whose count DataFusion also hands the scans as a
    /// hint (`TableScan::fetch`); the `LIMIT` itself is what a view keeps.
    under_limit: bool,
}

fn unsupported<T>(what: impl Into<String>) -> Result<T> {
    Err(PlanError::Unsupported(what.into()))
}

/// Refuses expressions the streaming operators cannot evaluate.
fn check_expr(e: &Expr) -> Result<()> {
    let mut bad = None;
    e.apply(|e| {
        let what = match e {
            Expr::ScalarSubquery(_) | Expr::Exists(_) | Expr::InSubquery(_) => {
                Some("subqueries in materialized views")
            }
            Expr::Placeholder(_) => Some("parameters in materialized views"),
            Expr::OuterReferenceColumn(..) => Some("correlated subqueries in materialized views"),
            Expr::WindowFunction(_) => Some("window functions in materialized views"),
            e if is_now_marker(e) => Some(
                "now() in a materialized view outside a comparison in WHERE (`ts > now() - INTERVAL …`)",
            ),
            _ => None,
        };
        if let Some(what) = what {
            bad = Some(what);
            return Ok(datafusion::common::tree_node::TreeNodeRecursion::Stop);
        }
        Ok(datafusion::common::tree_node::TreeNodeRecursion::Continue)
    })?;
    match bad {
        Some(what) => unsupported(what),
        None => Ok(()),
    }
}

impl Lowering<'_> {
    fn state_table(&self, node: usize) -> u64 {
        view_state_table(self.opts.view_id) + node as u64 + 1
    }

    /// The error table of the node about to be added.
    fn error_table(&self) -> u64 {
        view_error_table(self.opts.view_id, self.graph.nodes.len())
    }

    fn node(&mut self, plan: &LogicalPlan) -> Result<usize> {
        if self.eowc_pending
            && !matches!(
                plan,
                LogicalPlan::Projection(_)
                    | LogicalPlan::Filter(_)
                    | LogicalPlan::SubqueryAlias(_)
                    | LogicalPlan::Sort(_)
                    | LogicalPlan::Aggregate(_)
            )
        {
            return unsupported(format!(
                "EMIT ON WINDOW CLOSE over {}: it applies to a GROUP BY on a window function's window_end",
                plan.display()
            ));
        }
        match plan {
            LogicalPlan::TableScan(scan) => {
                let Some(source) = as_stream_source(&scan.source) else {
                    return unsupported(format!(
                        "reading {} in a materialized view",
                        scan.table_name
                    ));
                };
                if !scan.filters.is_empty() || (scan.fetch.is_some() && !self.under_limit) {
                    return Err(PlanError::Internal(
                        "scan with pushed-down filters or limit".into(),
                    ));
                }
                let projection = scan
                    .projection
                    .clone()
                    .unwrap_or_else(|| (0..source.schema.fields().len()).collect());
                let id = self.graph.nodes.len();
                let watermark = source.watermark.clone();
                if let Some(connector) = source.connector.clone() {
                    // Splits spread over the subtasks: a source of its own
                    // parallelism, which what follows it chains into.
                    return Ok(self.graph.add_node(
                        OperatorSpec::ConnectorSource {
                            source_id: source.table_id,
                            source_name: source.name.clone(),
                            connector,
                            source_schema: Arc::new(DFSchema::try_from(
                                source.schema.as_ref().clone(),
                            )?),
                            projection,
                            state_table: self.state_table(id),
                            watermark,
                        },
                        self.opts.parallelism,
                        scan.projected_schema.clone(),
                    ));
                }
                if source.view {
                    // The view's committed output, followed as it changes.
                    return Ok(self.graph.add_node(
                        OperatorSpec::ViewSource {
                            view_id: source.table_id,
                            view_name: source.name.clone(),
                            view_schema: Arc::new(DFSchema::try_from(
                                source.schema.as_ref().clone(),
                            )?),
                            projection,
                            state_table: self.state_table(id),
                        },
                        1,
                        scan.projected_schema.clone(),
                    ));
                }
                Ok(self.graph.add_node(
                    OperatorSpec::TableSource {
                        table_id: source.table_id,
                        table_name: source.name.clone(),
                        projection,
                        state_table: self.state_table(id),
                        append_only: source.append_only,
                        watermark,
                        versioned: source.versioned,
                    },
                    1,
                    scan.projected_schema.clone(),
                ))
            }
            LogicalPlan::Filter(filter) if row_number_limit(filter).is_some() => {
                let (window, offset, limit) = row_number_limit(filter)
                    .ok_or_else(|| PlanError::Internal("row_number filter vanished".into()))?;
                self.top_n(window, offset, limit)
            }
            LogicalPlan::Filter(filter) => {
                let mut bounds = Vec::new();
                let mut rest = Vec::new();
                for conjunct in split_conjunction(&filter.predicate) {
                    match temporal_bound(conjunct)? {
                        Some(bound) => bounds.push(bound),
                        None => rest.push(conjunct.clone()),
                    }
                }
                let mut node = self.node(&filter.input)?;
                if let Some(predicate) = conjunction(rest) {
                    check_expr(&predicate)?;
                    let errors = Some(self.error_table());
                    node = self.stateless(
                        node,
                        OperatorSpec::Filter {
                            predicate,
                            input_schema: filter.input.schema().clone(),
                            errors,
                        },
                        plan,
                    );
                }
                if !bounds.is_empty() {
                    for b in &bounds {
                        check_expr(&b.row)?;
                    }
                    let id = self.graph.nodes.len();
                    let temporal = self.graph.add_node(
                        OperatorSpec::TemporalFilter {
                            bounds,
                            input_schema: filter.input.schema().clone(),
                            state_table: self.state_table(id),
                        },
                        self.opts.parallelism,
                        plan.schema().clone(),
                    );
                    // The row's hash is its key group, where its state lives.
                    self.graph
                        .connect(node, temporal, 0, whole_row(&filter.input));
                    node = temporal;
                }
                Ok(node)
            }
            LogicalPlan::Projection(p) => {
                for e in &p.expr {
                    check_expr(e)?;
                }
                let input = self.node(&p.input)?;
                let errors = Some(self.error_table());
                Ok(self.stateless(
                    input,
                    OperatorSpec::Project {
                        exprs: p.expr.clone(),
                        input_schema: p.input.schema().clone(),
                        errors,
                    },
                    plan,
                ))
            }
            // An alias renames, a sort without a limit orders nothing in a view.
            LogicalPlan::SubqueryAlias(a) => self.node(&a.input),
            LogicalPlan::Aggregate(agg) => {
                for e in &agg.group_expr {
                    check_expr(e)?;
                }
                // Group columns (with grouping sets, also the grouping id) come first.
                let n_groups = agg.schema.fields().len() - agg.aggr_expr.len();
                let mut aggs = Vec::with_capacity(agg.aggr_expr.len());
                for (i, e) in agg.aggr_expr.iter().enumerate() {
                    let Expr::AggregateFunction(f) = e.clone().unalias() else {
                        return Err(PlanError::Internal(format!("not an aggregate: {e}")));
                    };
                    let name = f.func.name().to_string();
                    let Some(kind) = AggKind::from_name(&name) else {
                        return unsupported(format!(
                            "aggregate function {name} in materialized views"
                        ));
                    };
                    aggs.push(agg_call(
                        kind,
                        &f.params,
                        agg.schema.field(n_groups + i).data_type().clone(),
                    )?);
                }
                let eowc = std::mem::take(&mut self.eowc_pending);
                let mut input = self.node(&agg.input)?;
                let (emit_on_window_close, close_after_key) = if eowc {
                    let (key, after) = self.window_close_key(agg, input)?;
                    (Some(key), after)
                } else {
                    (None, false)
                };
                if emit_on_window_close.is_some() {
                    self.check_watermarks(input)?;
                }
                let append_only = self.append_only(input);
                for a in &mut aggs {
                    a.append_only_input = append_only;
                }
                let mut group_exprs = agg.group_expr.clone();
                let mut input_schema = agg.input.schema().clone();
                let mut empty_set = None;
                if let [Expr::GroupingSet(sets)] = agg.group_expr.as_slice() {
                    (input, group_exprs, input_schema, empty_set) =
                        self.expand(input, sets, agg)?;
                }
                let (p, partitioner) = self.keyed(input, group_exprs.clone(), &input_schema);
                let id = self.graph.nodes.len();
                let errors = Some(self.error_table());
                let node = self.graph.add_node(
                    OperatorSpec::HashAgg {
                        group_exprs,
                        aggs,
                        input_schema,
                        state_table: self.state_table(id),
                        empty_set,
                        late_rows_table: emit_on_window_close
                            .map(|_| late_rows_state_table(self.opts.view_id)),
                        close_after_key,
                        state_ttl_us: self.opts.state_ttl_us,
                        emit_on_window_close,
                        errors,
                    },
                    p,
                    plan.schema().clone(),
                );
                self.graph.connect(input, node, 0, partitioner);
                Ok(node)
            }
            LogicalPlan::Join(join) => {
                let join_type = match join.join_type {
                    JoinType::Inner => StreamJoinType::Inner,
                    JoinType::Left => StreamJoinType::Left,
                    JoinType::Right => StreamJoinType::Right,
                    JoinType::Full => StreamJoinType::Full,
                    JoinType::LeftSemi => StreamJoinType::LeftSemi,
                    JoinType::RightSemi => StreamJoinType::RightSemi,
                    JoinType::LeftAnti => StreamJoinType::LeftAnti,
                    JoinType::RightAnti => StreamJoinType::RightAnti,
                    JoinType::LeftMark | JoinType::RightMark => {
                        return unsupported(
                            "EXISTS or IN subqueries under OR or in SELECT lists in materialized views",
                        );
                    }
                };
                // `x NOT IN (SELECT y …)` (a null-aware anti join) keeps a
                // row unless some y equals x, is NULL, or exists while x is
                // NULL: an anti join on that condition, which has no equal
                // keys to hash on.
                let (on, filter) = if join.null_aware {
                    let conditions = join.on.iter().map(|(l, r)| {
                        l.clone()
                            .eq(r.clone())
                            .or(l.clone().is_null())
                            .or(r.clone().is_null())
                    });
                    let filter = conjunction(conditions.chain(join.filter.clone()));
                    (Vec::new(), filter)
                } else {
                    (join.on.clone(), join.filter.clone())
                };
                // A join without equal keys (a cross join, an uncorrelated
                // scalar subquery, NOT IN) is one key: every row meets every
                // row in a single subtask.
                let (left_keys, right_keys): (Vec<Expr>, Vec<Expr>) = if on.is_empty() {
                    (vec![lit(true)], vec![lit(true)])
                } else {
                    on.iter().cloned().unzip()
                };
                let left = self.node(&join.left)?;
                let right = self.node(&join.right)?;
                let temporal = self.versioned(right);
                if temporal {
                    if !matches!(join_type, StreamJoinType::Inner | StreamJoinType::Left) {
                        return unsupported(
                            "temporal joins (FOR SYSTEM_TIME AS OF) other than JOIN and LEFT JOIN with the versioned table on the right",
                        );
                    }
                    if on.is_empty() {
                        return unsupported("temporal joins without an equality condition");
                    }
                    if !self.append_only(left) {
                        return unsupported(
                            "temporal joins whose left input is not append-only (a stream or an APPEND ONLY table)",
                        );
                    }
                }
                if self.versioned(left) {
                    return unsupported(
                        "FOR SYSTEM_TIME AS OF on the left side of a join (it marks the versioned table, on the right)",
                    );
                }
                let id = self.graph.nodes.len();
                let p = if on.is_empty() {
                    1
                } else {
                    self.opts.parallelism
                };
                let errors = Some(self.error_table());
                let node = self.graph.add_node(
                    OperatorSpec::HashJoin {
                        join_type,
                        left_keys: left_keys.clone(),
                        right_keys: right_keys.clone(),
                        filter: filter.clone(),
                        errors,
                        left_schema: join.left.schema().clone(),
                        right_schema: join.right.schema().clone(),
                        null_equals_null: join.null_equality == NullEquality::NullEqualsNull,
                        state_table: self.state_table(id),
                        interval: if join_type == StreamJoinType::Inner
                            && self.append_only(left)
                            && self.append_only(right)
                        {
                            filter
                                .as_ref()
                                .and_then(|f| interval_bounds(f, &join.left, &join.right))
                        } else {
                            None
                        },
                        temporal,
                        state_ttl_us: self.opts.state_ttl_us,
                    },
                    p,
                    plan.schema().clone(),
                );
                self.graph.connect(
                    left,
                    node,
                    0,
                    Partitioner::Hash {
                        exprs: left_keys,
                        schema: join.left.schema().clone(),
                    },
                );
                self.graph.connect(
                    right,
                    node,
                    1,
                    Partitioner::Hash {
                        exprs: right_keys,
                        schema: join.right.schema().clone(),
                    },
                );
                Ok(node)
            }
            LogicalPlan::Sort(sort) => {
                let limit = sort.fetch.unwrap_or(usize::MAX);
                self.sorted_top_n(sort, 0, limit, plan)
            }
            LogicalPlan::Limit(l) => {
                use datafusion::logical_expr::{FetchType, SkipType};
                let (SkipType::Literal(offset), FetchType::Literal(fetch)) =
                    (l.get_skip_type()?, l.get_fetch_type()?)
                else {
                    return unsupported("LIMIT and OFFSET that are not constants");
                };
                let limit = fetch.unwrap_or(usize::MAX);
                let LogicalPlan::Sort(sort) = l.input.as_ref() else {
                    // Without ORDER BY any rows will do (RisingWave keeps
                    // any n). A view keeps the first by their values, so
                    // that which rows it holds does not depend on the order
                    // they came in, and a replay keeps the same ones.
                    if limit == usize::MAX && offset == 0 {
                        return self.node(&l.input);
                    }
                    let order: Vec<datafusion::logical_expr::SortExpr> = l
                        .input
                        .schema()
                        .columns()
                        .into_iter()
                        .map(|c| Expr::Column(c).sort(true, false))
                        .collect();
                    self.under_limit = true;
                    let node = self.add_top_n(&l.input, vec![], &order, offset, limit, None, plan);
                    self.under_limit = false;
                    return node;
                };
                self.sorted_top_n(sort, offset, limit, plan)
            }
            LogicalPlan::Union(u) => {
                let inputs = u
                    .inputs
                    .iter()
                    .map(|i| self.node(i))
                    .collect::<Result<Vec<_>>>()?;
                let p = self.opts.parallelism;
                let node = self.graph.add_node(
                    OperatorSpec::Union {
                        inputs: inputs.len(),
                    },
                    p,
                    plan.schema().clone(),
                );
                for (port, (input, plan)) in inputs.into_iter().zip(&u.inputs).enumerate() {
                    // Hashing on the whole row keeps each row's changes in
                    // order on one path; the same parallelism needs no shuffle.
                    let partitioner = if self.graph.nodes[input].parallelism == p {
                        Partitioner::Forward
                    } else {
                        whole_row(plan)
                    };
                    self.graph.connect(input, node, port, partitioner);
                }
                Ok(node)
            }
            LogicalPlan::Window(window) => self.over_window(window, plan),
            LogicalPlan::Distinct(_) => unsupported("DISTINCT ON in materialized views"),
            LogicalPlan::EmptyRelation(e) => {
                Ok(self.values(usize::from(e.produce_one_row), vec![], plan))
            }
            LogicalPlan::Values(v) => {
                let cells: Vec<Expr> = v.values.iter().flatten().cloned().collect();
                // Literals only: what DataFusion has not folded to one
                // (`now()`, a function of no constant) would be evaluated
                // once, when the view starts.
                for c in &cells {
                    check_expr(c)?;
                    if !matches!(c, Expr::Literal(..)) {
                        return unsupported(format!(
                            "VALUES with an expression that is not a constant ({c}) in materialized views"
                        ));
                    }
                }
                Ok(self.values(v.values.len(), cells, plan))
            }
            LogicalPlan::Unnest(u) => {
                use datafusion::common::NullHandling;
                if !u.struct_type_columns.is_empty() {
                    return unsupported("unnest of a struct in materialized views");
                }
                if u.options.recursions.iter().any(|r| r.depth != 1)
                    || u.list_type_columns.iter().any(|(_, l)| l.depth != 1)
                {
                    return unsupported("unnest of nested arrays in materialized views");
                }
                let lists: Vec<usize> = u.list_type_columns.iter().map(|(i, _)| *i).collect();
                let input = self.node(&u.input)?;
                Ok(self.stateless(
                    input,
                    OperatorSpec::Unnest {
                        lists,
                        outputs: u.dependency_indices.clone(),
                        nulls: match u.options.null_handling {
                            NullHandling::Drop => UnnestNulls::Drop,
                            NullHandling::Preserve => UnnestNulls::Preserve,
                            NullHandling::PreserveAndExpandEmpty => {
                                UnnestNulls::PreserveAndExpandEmpty
                            }
                        },
                    },
                    plan,
                ))
            }
            LogicalPlan::RecursiveQuery(_) => unsupported("recursive queries"),
            other => unsupported(format!("{} in materialized views", other.display())),
        }
    }

    /// Lowers grouping sets to an Expand in front of the HashAgg; returns the
    /// Expand node, the HashAgg's group expressions over its output (the
    /// group columns and the grouping id, as in `agg`'s schema) and that
    /// output's schema.
    fn expand(
        &mut self,
        input: usize,
        sets: &datafusion::logical_expr::GroupingSet,
        agg: &datafusion::logical_expr::Aggregate,
    ) -> Result<(usize, Vec<Expr>, DFSchemaRef, Option<u64>)> {
        use datafusion::logical_expr::GroupingSet;
        let exprs: Vec<Expr> = sets.distinct_expr().into_iter().cloned().collect();
        let k = exprs.len();
        if k >= 16 {
            return unsupported("grouping sets over more than 15 expressions");
        }
        let lists: Vec<Vec<Expr>> = match sets {
            GroupingSet::GroupingSets(lists) => lists.clone(),
            // (a, b), (a), ()
            GroupingSet::Rollup(e) => (0..=e.len()).rev().map(|i| e[..i].to_vec()).collect(),
            // Every subset.
            GroupingSet::Cube(e) => (0..1u32 << e.len())
                .map(|bits| {
                    e.iter()
                        .enumerate()
                        .filter(|(i, _)| bits & (1 << i) == 0)
                        .map(|(_, x)| x.clone())
                        .collect()
                })
                .collect(),
        };
        // The grouping id as DataFusion computes it: one bit per expression
        // (1 = left out), the first expression the most significant, and
        // above them the ordinal of a set that repeats an earlier one.
        let mut seen: std::collections::HashMap<Vec<bool>, u64> = Default::default();
        let mut out_sets = Vec::with_capacity(lists.len());
        for list in &lists {
            let nulls: Vec<bool> = exprs.iter().map(|e| !list.contains(e)).collect();
            let mask = nulls.iter().fold(0u64, |acc, n| (acc << 1) | u64::from(*n));
            let ordinal = seen.entry(nulls.clone()).or_insert(0);
            out_sets.push((nulls, mask | (*ordinal << k)));
            *ordinal += 1;
        }
        let empty_set = lists
            .iter()
            .position(|l| l.is_empty())
            .map(|i| out_sets[i].1);
        // Output: the input's columns, then the group columns and the id
        // with the names and types the aggregate's schema gives them.
        let mut fields: Vec<(Option<datafusion::common::TableReference>, Arc<Field>)> = agg
            .input
            .schema()
            .iter()
            .map(|(q, f)| (q.cloned(), f.clone()))
            .collect();
        let mut group_cols = Vec::with_capacity(k + 1);
        for i in 0..=k {
            let f = agg.schema.field(i);
            let name = format!("__weir_expand_{i}");
            group_cols.push(Expr::Column(Column::new_unqualified(&name)));
            fields.push((
                None,
                Arc::new(Field::new(name, f.data_type().clone(), true)),
            ));
        }
        let schema = Arc::new(DFSchema::new_with_metadata(
            fields,
            agg.input.schema().metadata().clone(),
        )?);
        let p = self.graph.nodes[input].parallelism;
        let node = self.graph.add_node(
            OperatorSpec::Expand {
                group_exprs: exprs,
                sets: out_sets,
                input_schema: agg.input.schema().clone(),
            },
            p,
            schema.clone(),
        );
        self.graph.connect(input, node, 0, Partitioner::Forward);
        Ok((node, group_cols, schema, empty_set))
    }

    /// Parallelism and input edge of a stateful operator keyed by `keys`
    /// (over `schema`, `input`'s output): `streaming_parallelism` behind a
    /// hash exchange, or with no keys a single subtask that everything
    /// reaches.
    fn keyed(&self, input: usize, keys: Vec<Expr>, schema: &DFSchemaRef) -> (usize, Partitioner) {
        if keys.is_empty() {
            let partitioner = if self.graph.nodes[input].parallelism == 1 {
                Partitioner::Forward
            } else {
                Partitioner::Global
            };
            (1, partitioner)
        } else {
            (
                self.opts.parallelism,
                Partitioner::Hash {
                    exprs: keys,
                    schema: schema.clone(),
                },
            )
        }
    }

    /// `ORDER BY … [LIMIT n] [OFFSET k]` over the whole input.
    fn sorted_top_n(
        &mut self,
        sort: &datafusion::logical_expr::Sort,
        offset: usize,
        limit: usize,
        plan: &LogicalPlan,
    ) -> Result<usize> {
        let order: Vec<datafusion::logical_expr::SortExpr> = sort.expr.clone();
        self.add_top_n(&sort.input, vec![], &order, offset, limit, None, plan)
    }

    /// Window functions sharing one `PARTITION BY` and `ORDER BY`.
    fn over_window(
        &mut self,
        window: &datafusion::logical_expr::Window,
        plan: &LogicalPlan,
    ) -> Result<usize> {
        let mut functions = Vec::new();
        for e in &window.window_expr {
            let Expr::WindowFunction(f) = e.clone().unalias() else {
                return Err(PlanError::Internal("not a window function".into()));
            };
            functions.push(*f);
        }
        let Some(first) = functions.first() else {
            return Err(PlanError::Internal("window without functions".into()));
        };
        let (partition_by, order) = (
            first.params.partition_by.clone(),
            first.params.order_by.clone(),
        );
        for f in &functions {
            if f.params.partition_by != partition_by || f.params.order_by != order {
                return unsupported(
                    "window functions with different PARTITION BY or ORDER BY over the same rows in materialized views (compute them in separate subqueries)",
                );
            }
            if f.params.distinct {
                return unsupported("DISTINCT in window functions");
            }
            for e in f
                .params
                .args
                .iter()
                .chain(&f.params.partition_by)
                .chain(f.params.order_by.iter().map(|s| &s.expr))
                .chain(f.params.filter.as_deref())
            {
                check_expr(e)?;
            }
        }
        let input = self.node(&window.input)?;
        let (p, partitioner) = self.keyed(input, partition_by.clone(), window.input.schema());
        let over =
            |l: &mut Self, functions: Vec<Expr>, input: &DFSchemaRef, output: DFSchemaRef| {
                let id = l.graph.nodes.len();
                l.graph.add_node(
                    OperatorSpec::OverWindow {
                        partition_by: partition_by.clone(),
                        order_by: order.iter().map(|s| s.expr.clone()).collect(),
                        directions: order.iter().map(|s| (!s.asc, s.nulls_first)).collect(),
                        functions,
                        input_schema: input.clone(),
                        state_table: l.state_table(id),
                    },
                    p,
                    output,
                )
            };
        let Some((forward, backward)) =
            crate::frames::split(&window.window_expr, window.input.schema())
        else {
            let node = over(
                self,
                window.window_expr.clone(),
                window.input.schema(),
                plan.schema().clone(),
            );
            self.graph.connect(input, node, 0, partitioner);
            return Ok(node);
        };
        // Functions read in opposite directions (a running sum beside a sum
        // to the partition's end) go to two OverWindows, one after the
        // other, so that each streams a large partition; a Project puts
        // the columns back in the query's order.
        let inputs = window.input.schema().fields().len();
        let columns = |functions: &[usize]| -> Result<DFSchemaRef> {
            let mut picked: Vec<usize> = (0..inputs).collect();
            picked.extend(functions.iter().map(|f| inputs + f));
            let fields = picked
                .iter()
                .map(|i| {
                    let (q, f) = plan.schema().qualified_field(*i);
                    (q.cloned(), f.clone())
                })
                .collect();
            Ok(Arc::new(DFSchema::new_with_metadata(
                fields,
                plan.schema().metadata().clone(),
            )?))
        };
        let exprs = |functions: &[usize]| -> Vec<Expr> {
            functions
                .iter()
                .map(|f| window.window_expr[*f].clone())
                .collect()
        };
        let first_schema = columns(&forward)?;
        let first = over(
            self,
            exprs(&forward),
            window.input.schema(),
            first_schema.clone(),
        );
        self.graph.connect(input, first, 0, partitioner);
        let both: Vec<usize> = forward.iter().chain(&backward).copied().collect();
        let second = over(self, exprs(&backward), &first_schema, columns(&both)?);
        self.graph.connect(first, second, 0, Partitioner::Forward);
        let order_back = plan
            .schema()
            .iter()
            .map(|(q, f)| Expr::Column(datafusion::common::Column::new(q.cloned(), f.name())))
            .collect();
        let second_schema = self.graph.nodes[second].schema.clone();
        Ok(self.stateless(
            second,
            OperatorSpec::Project {
                exprs: order_back,
                input_schema: second_schema,
                errors: None,
            },
            plan,
        ))
    }

    /// `ROW_NUMBER() OVER (PARTITION BY … ORDER BY …)` kept to a range.
    fn top_n(
        &mut self,
        window: &datafusion::logical_expr::Window,
        offset: usize,
        limit: usize,
    ) -> Result<usize> {
        let Some(Expr::WindowFunction(f)) = window.window_expr.first().map(|e| e.clone().unalias())
        else {
            return Err(PlanError::Internal("not a window function".into()));
        };
        let window_plan = LogicalPlan::Window(window.clone());
        let rank = RankKind::from_name(f.fun.name())
            .ok_or_else(|| PlanError::Internal("not a ranking function".into()))?;
        self.add_top_n(
            &window.input,
            f.params.partition_by.clone(),
            &f.params.order_by,
            offset,
            limit,
            Some(rank),
            &window_plan,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn add_top_n(
        &mut self,
        input_plan: &LogicalPlan,
        partition_by: Vec<Expr>,
        order: &[datafusion::logical_expr::SortExpr],
        offset: usize,
        limit: usize,
        numbered: Option<RankKind>,
        plan: &LogicalPlan,
    ) -> Result<usize> {
        if limit == usize::MAX && numbered.is_none() {
            // ORDER BY alone orders nothing in a view.
            return self.node(input_plan);
        }
        for e in partition_by.iter().chain(order.iter().map(|s| &s.expr)) {
            check_expr(e)?;
        }
        if limit > 100_000 {
            return unsupported("top-N of more than 100000 rows per partition");
        }
        let input = self.node(input_plan)?;
        let append_only_input = self.append_only(input);
        let (p, partitioner) = self.keyed(input, partition_by.clone(), input_plan.schema());
        let id = self.graph.nodes.len();
        let node = self.graph.add_node(
            OperatorSpec::TopN {
                partition_by,
                order_by: order.iter().map(|s| s.expr.clone()).collect(),
                directions: order.iter().map(|s| (!s.asc, s.nulls_first)).collect(),
                limit,
                offset,
                row_number: numbered.is_some(),
                rank: numbered.unwrap_or_default(),
                append_only_input,
                input_schema: input_plan.schema().clone(),
                state_table: self.state_table(id),
            },
            p,
            plan.schema().clone(),
        );
        self.graph.connect(input, node, 0, partitioner);
        Ok(node)
    }

    /// Every source under `node` has a watermark: windows can only close
    /// when event time advances on every input.
    /// `EMIT ON WINDOW CLOSE`: the group key that says when a group is
    /// complete, and whether it is an event time (complete once the
    /// watermark passes it) rather than a window's end (complete when the
    /// watermark reaches it): `window_end`, or else the column a source's
    /// watermark is defined over, passed through unchanged.
    fn window_close_key(
        &self,
        agg: &datafusion::logical_expr::Aggregate,
        input: usize,
    ) -> Result<(usize, bool)> {
        if let Some(key) = window_end_key(agg)? {
            return Ok((key, false));
        }
        agg.group_expr
            .iter()
            .position(|e| matches!(e, Expr::Column(c) if self.is_watermark_column(input, &c.name)))
            .map(|key| (key, true))
            .map_or_else(
                || {
                    unsupported(
                        "EMIT ON WINDOW CLOSE without window_end (of TUMBLE, HOP or CUMULATE) \
                         or the watermark's column in GROUP BY",
                    )
                },
                Ok,
            )
    }

    /// Whether column `name` of `node`'s output is, unchanged through
    /// filters and projections, the column a source's watermark is defined
    /// over (`WATERMARK FOR ts AS ts - …`).
    fn is_watermark_column(&self, node: usize, name: &str) -> bool {
        let n = &self.graph.nodes[node];
        let below = || {
            self.graph
                .in_edges(node)
                .all(|e| self.is_watermark_column(e.from, name))
        };
        match &n.spec {
            OperatorSpec::Filter { .. } => below(),
            OperatorSpec::Project { exprs, .. } => {
                let at = n.schema.fields().iter().position(|f| f.name() == name);
                at.is_some_and(
                    |i| matches!(exprs[i].clone().unalias(), Expr::Column(c) if c.name == name),
                ) && below()
            }
            spec => spec.source_watermark().is_some_and(|w| {
                let columns = w.expr.column_refs();
                columns.len() == 1 && columns.iter().all(|c| c.name == name)
            }),
        }
    }

    fn check_watermarks(&self, node: usize) -> Result<()> {
        let source = match &self.graph.nodes[node].spec {
            OperatorSpec::TableSource { table_name, .. } => Some(table_name),
            OperatorSpec::ConnectorSource { source_name, .. } => Some(source_name),
            OperatorSpec::Values { .. } => {
                return Err(PlanError::InvalidDefinition(
                    "EMIT ON WINDOW CLOSE needs a watermark on every input; VALUES (or a query without a table) has none".into(),
                ));
            }
            OperatorSpec::ViewSource { view_name, .. } => {
                return Err(PlanError::InvalidDefinition(format!(
                    "EMIT ON WINDOW CLOSE needs a watermark on every input; materialized view \"{view_name}\", read through its changelog, has none"
                )));
            }
            _ => None,
        };
        if let Some(name) = source
            && self.graph.nodes[node].spec.source_watermark().is_none()
        {
            return Err(PlanError::InvalidDefinition(format!(
                "EMIT ON WINDOW CLOSE needs a watermark on \"{name}\" (WATERMARK FOR column AS expression)"
            )));
        }
        let inputs: Vec<usize> = self.graph.in_edges(node).map(|e| e.from).collect();
        inputs
            .into_iter()
            .try_for_each(|i| self.check_watermarks(i))
    }

    /// Whether `node` reads a table at its current version (`FOR
    /// SYSTEM_TIME AS OF PROCTIME()`), through filters and projections.
    fn versioned(&self, node: usize) -> bool {
        match &self.graph.nodes[node].spec {
            OperatorSpec::TableSource { versioned, .. } => *versioned,
            OperatorSpec::Filter { .. } | OperatorSpec::Project { .. } => {
                self.graph.in_edges(node).any(|e| self.versioned(e.from))
            }
            _ => false,
        }
    }

    /// Whether `node` only ever emits inserts: sources of append-only
    /// tables, and what filters, projects, unions or inner-joins only them;
    /// a temporal join of an append-only left input.
    fn append_only(&self, node: usize) -> bool {
        let inputs: Vec<usize> = self.graph.in_edges(node).map(|e| e.from).collect();
        match &self.graph.nodes[node].spec {
            OperatorSpec::TableSource { append_only, .. } => *append_only,
            // Sources read with FORMAT PLAIN: every record is an insert
            // (FORMAT DEBEZIUM records are changes).
            OperatorSpec::ConnectorSource { connector, .. } => {
                connector.format.as_deref().is_none_or(|f| f == "PLAIN")
            }
            OperatorSpec::Values { .. } => true,
            OperatorSpec::Filter { .. }
            | OperatorSpec::Project { .. }
            | OperatorSpec::Expand { .. }
            | OperatorSpec::Unnest { .. }
            | OperatorSpec::Union { .. }
            | OperatorSpec::HashJoin {
                join_type: StreamJoinType::Inner,
                temporal: false,
                ..
            } => inputs.iter().all(|i| self.append_only(*i)),
            // Right-side changes touch no earlier result.
            OperatorSpec::HashJoin { temporal: true, .. } => self
                .graph
                .in_edges(node)
                .filter(|e| e.input == 0)
                .all(|e| self.append_only(e.from)),
            // EMIT ON WINDOW CLOSE: each window once, final.
            OperatorSpec::HashAgg {
                emit_on_window_close: Some(_),
                ..
            } => true,
            _ => false,
        }
    }

    /// A one-input operator without state: same parallelism as its input,
    /// forward edge, so it can chain.
    /// A source of constant rows, at parallelism 1; what reads it chains
    /// into it as into any source.
    fn values(&mut self, rows: usize, cells: Vec<Expr>, plan: &LogicalPlan) -> usize {
        let id = self.graph.nodes.len();
        self.graph.add_node(
            OperatorSpec::Values {
                rows,
                cells,
                state_table: self.state_table(id),
            },
            1,
            plan.schema().clone(),
        )
    }

    fn stateless(&mut self, input: usize, spec: OperatorSpec, plan: &LogicalPlan) -> usize {
        let p = self.graph.nodes[input].parallelism;
        let node = self.graph.add_node(spec, p, plan.schema().clone());
        self.graph.connect(input, node, 0, Partitioner::Forward);
        node
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::StreamSourceTable;
    use crate::spec::Partitioner;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::provider_as_source;
    use datafusion::functions_aggregate::expr_fn::{count, sum};
    use datafusion::logical_expr::{LogicalPlanBuilder, col, lit};
    use std::sync::Arc;

    fn scan(name: &str, id: u64) -> LogicalPlanBuilder {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("v", DataType::Int64, true),
        ]));
        let table = Arc::new(StreamSourceTable {
            table_id: id,
            name: name.into(),
            schema,
            append_only: false,
            watermark: None,
            versioned: false,
            connector: None,
            view: false,
        });
        LogicalPlanBuilder::scan(name, provider_as_source(table), None).unwrap()
    }

    fn opts(parallelism: usize) -> StreamPlanOptions {
        StreamPlanOptions {
            parallelism,
            chaining: true,
            checkpoint_mode: Default::default(),
            state_backend: None,
            emit_on_window_close: false,
            state_ttl_us: None,
            view_id: 5,
            sink: None,
            retain_history_ms: Some(60_000),
        }
    }

    #[test]
    fn a_sink_ends_the_job_keyed_by_its_primary_key() {
        let plan = scan("t", 1)
            .aggregate(vec![col("k")], vec![sum(col("v"))])
            .unwrap()
            .build()
            .unwrap();
        let mut o = opts(2);
        o.sink = Some(SinkTarget {
            name: "out".into(),
            connector: Default::default(),
            key: vec!["k".into()],
        });
        let g = lower(&plan, &o).unwrap();
        let last = g.nodes.last().unwrap();
        let OperatorSpec::Sink {
            key,
            append_only_input,
            state_table,
            ..
        } = &last.spec
        else {
            panic!("{}", last.spec.name());
        };
        assert_eq!((key.as_slice(), *append_only_input), (&[0][..], false));
        assert_eq!(*state_table, 5 << 16);
        let into_sink = g.edges.last().unwrap();
        let Partitioner::Hash { exprs, .. } = &into_sink.partitioner else {
            panic!("not hashed by key");
        };
        assert_eq!(exprs.len(), 1);
        o.sink.as_mut().unwrap().key = vec!["nope".into()];
        let e = lower(&plan, &o).unwrap_err();
        assert!(e.to_string().contains("primary_key names \"nope\""), "{e}");
    }

    #[test]
    fn aggregate_runs_behind_a_hash_exchange_on_its_keys() {
        let plan = scan("t", 1)
            .filter(col("v").gt(lit(0i64)))
            .unwrap()
            .aggregate(vec![col("k")], vec![count(lit(1)), sum(col("v"))])
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&plan, &opts(3)).unwrap();
        let names: Vec<&str> = g.nodes.iter().map(|n| n.spec.name()).collect();
        assert_eq!(
            names,
            vec!["TableSource", "Filter", "HashAgg", "Materialize"]
        );
        let p: Vec<usize> = g.nodes.iter().map(|n| n.parallelism).collect();
        assert_eq!(p, vec![1, 1, 3, 3]);
        assert!(matches!(g.edges[1].partitioner, Partitioner::Hash { .. }));
        assert_eq!(
            g.state_tables(),
            vec![
                (5 << 16) + 1,
                view_error_table(5, 1),
                (5 << 16) + 3,
                view_error_table(5, 2),
                5 << 16,
                view_changelog_table(5)
            ],
            "the source's position, the filter's errors, the aggregate's groups and errors, the view's rows, then its changelog"
        );
    }

    #[test]
    fn a_job_graph_survives_the_wire() {
        let plan = scan("t", 1)
            .filter(col("v").gt(lit(0i64)).and(col("k").is_not_null()))
            .unwrap()
            .aggregate(vec![col("k")], vec![count(lit(1)), sum(col("v"))])
            .unwrap()
            .build()
            .unwrap();
        let graph = crate::job_graph::JobGraph::from_stream_graph(lower(&plan, &opts(2)).unwrap());
        let bytes = crate::wire::encode_job_graph(&graph).unwrap();
        let back = crate::wire::decode_job_graph(&bytes).unwrap();
        assert_eq!(back.explain(), graph.explain());
        assert_eq!(back.stream.explain(), graph.stream.explain());
        for (a, b) in back.stream.nodes.iter().zip(&graph.stream.nodes) {
            // Columns and types; functional dependencies do not travel
            // (the executor does not use them).
            assert_eq!(a.schema.inner(), b.schema.inner());
            assert_eq!(a.schema.columns(), b.schema.columns());
        }
        assert!(crate::wire::decode_job_graph(b"not a graph").is_err());
    }

    #[test]
    fn global_aggregate_runs_once() {
        let plan = scan("t", 1)
            .aggregate(Vec::<Expr>::new(), vec![count(lit(1))])
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&plan, &opts(4)).unwrap();
        assert!(g.nodes.iter().all(|n| n.parallelism == 1));
    }

    #[test]
    fn join_hashes_both_inputs() {
        let plan = scan("a", 1)
            .join(
                scan("b", 2).build().unwrap(),
                JoinType::Inner,
                (vec!["a.k"], vec!["b.k"]),
                None,
            )
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&plan, &opts(2)).unwrap();
        let join = g
            .nodes
            .iter()
            .position(|n| n.spec.name() == "HashJoin")
            .unwrap();
        let inputs: Vec<_> = g.in_edges(join).collect();
        assert_eq!(inputs.len(), 2);
        assert!(
            inputs
                .iter()
                .all(|e| matches!(e.partitioner, Partitioner::Hash { .. }))
        );
        assert_eq!(
            inputs.iter().map(|e| e.input).collect::<Vec<_>>(),
            vec![0, 1]
        );
    }

    #[test]
    fn values_of_constants_are_a_source_and_anything_else_is_refused() {
        let values = LogicalPlanBuilder::values(vec![vec![lit(1i64)], vec![lit(2i64)]])
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&values, &opts(1)).unwrap();
        assert!(matches!(
            g.nodes[0].spec,
            OperatorSpec::Values { rows: 2, ref cells, .. } if cells.len() == 2
        ));
        let computed = LogicalPlanBuilder::values(vec![vec![lit(1i64) + lit(2i64)]])
            .unwrap()
            .build()
            .unwrap();
        assert!(matches!(
            lower(&computed, &opts(1)),
            Err(PlanError::Unsupported(_))
        ));
    }

    #[test]
    fn limit_without_order_by_keeps_the_first_rows_by_value() {
        let limit = scan("a", 1).limit(1, Some(3)).unwrap().build().unwrap();
        let g = lower(&limit, &opts(1)).unwrap();
        let top = g
            .nodes
            .iter()
            .find_map(|n| match &n.spec {
                OperatorSpec::TopN {
                    order_by,
                    directions,
                    limit,
                    offset,
                    ..
                } => Some((order_by.clone(), directions.clone(), *limit, *offset)),
                _ => None,
            })
            .expect("a TopN");
        assert_eq!(top.0, vec![col("a.k"), col("a.v")]);
        assert_eq!(top.1, vec![(false, false), (false, false)]);
        assert_eq!((top.2, top.3), (3, 1));
    }

    #[test]
    fn outer_joins_keep_their_kind_and_cross_joins_run_once() {
        let left = scan("a", 1)
            .join(
                scan("b", 2).build().unwrap(),
                JoinType::Left,
                (vec!["a.k"], vec!["b.k"]),
                None,
            )
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&left, &opts(2)).unwrap();
        let join = g
            .nodes
            .iter()
            .find(|n| n.spec.name() == "HashJoin")
            .unwrap();
        assert!(matches!(
            join.spec,
            OperatorSpec::HashJoin {
                join_type: StreamJoinType::Left,
                ..
            }
        ));
        assert_eq!(join.parallelism, 2);
        let cross = scan("a", 1)
            .cross_join(scan("b", 2).build().unwrap())
            .unwrap()
            .build()
            .unwrap();
        let g = lower(&cross, &opts(2)).unwrap();
        let join = g
            .nodes
            .iter()
            .find(|n| n.spec.name() == "HashJoin")
            .unwrap();
        assert_eq!(join.parallelism, 1);
    }
}

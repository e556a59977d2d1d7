//! The operator and edge descriptions that flow from the planner to the
//! executor: every kind of streaming operator Weir has, in one place.
//!
//! Expressions are DataFusion logical [`Expr`]s over the operator's input
//! schema; the executor turns them into physical expressions once, when a
//! subtask is deployed, and evaluates them on whole batches.

use std::fmt;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchemaRef;
use datafusion::logical_expr::Expr;

/// What one StreamGraph node does.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum OperatorSpec {
    /// Reads a table: first its snapshot (backfill), then its change log.
    TableSource {
        table_id: u64,
        table_name: String,
        /// Indices into the table's stored columns that the query reads.
        projection: Vec<usize>,
        /// Where the source keeps its log position.
        state_table: u64,
        /// The table takes inserts only (a stream, an `APPEND ONLY` table).
        #[serde(default)]
        append_only: bool,
        /// The table's `WATERMARK FOR`, if any.
        #[serde(default)]
        watermark: Option<SourceWatermark>,
        /// `FOR SYSTEM_TIME AS OF PROCTIME()`: the versioned side of a
        /// temporal join (the source itself reads as any other).
        #[serde(default)]
        versioned: bool,
    },
    /// Reads another materialized view's committed output: its rows at one
    /// of its completed checkpoints (backfill), then its changelog, epoch
    /// by epoch, from that checkpoint on. A view over a view costs what its
    /// own layer costs, not the layers below it again.
    ViewSource {
        view_id: u64,
        view_name: String,
        /// Every column of the view, as it stores them.
        #[serde(with = "crate::wire::schema")]
        view_schema: DFSchemaRef,
        /// Indices into the view's columns that the query reads.
        projection: Vec<usize>,
        /// Where the source keeps the last epoch of the view it emitted.
        state_table: u64,
    },
    /// Reads an external system through a connector (`CREATE SOURCE … WITH
    /// (connector = '…')`): its splits are spread over the subtasks, each
    /// split's position is state.
    ConnectorSource {
        source_id: u64,
        source_name: String,
        connector: ConnectorSpec,
        /// Every column of the source, as declared.
        #[serde(with = "crate::wire::schema")]
        source_schema: DFSchemaRef,
        /// Indices into the source's columns that the query reads.
        projection: Vec<usize>,
        /// Where the subtasks keep their splits' positions and watermarks.
        state_table: u64,
        #[serde(default)]
        watermark: Option<SourceWatermark>,
    },
    /// Constant rows (`VALUES`, or the one row of a query without a table
    /// in `FROM`): inserted once, at the job's first start; the rows being
    /// part of every checkpoint after that, a restore emits nothing.
    Values {
        /// How many rows (a query without a table has one of no columns).
        rows: usize,
        /// The cells, row by row, each a literal of its column's type.
        #[serde(with = "crate::wire::exprs")]
        cells: Vec<Expr>,
        /// Where the source notes that its rows went out.
        state_table: u64,
    },
    /// Keeps rows whose predicate is true.
    Filter {
        #[serde(with = "crate::wire::expr")]
        predicate: Expr,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        /// Where the rows whose predicate fails are counted
        /// (`executor::errors`); `None`: a failing row fails the task.
        #[serde(default)]
        errors: Option<u64>,
    },
    /// Computes new columns.
    Project {
        #[serde(with = "crate::wire::exprs")]
        exprs: Vec<Expr>,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        /// As the Filter's.
        #[serde(default)]
        errors: Option<u64>,
    },
    /// Grouped aggregation that retracts: input hash-partitioned on the
    /// group keys.
    HashAgg {
        #[serde(with = "crate::wire::exprs")]
        group_exprs: Vec<Expr>,
        aggs: Vec<AggCall>,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        state_table: u64,
        /// Grouping sets with the empty set `()`: its grouping id (its row
        /// exists even over no rows).
        #[serde(default)]
        empty_set: Option<u64>,
        /// `EMIT ON WINDOW CLOSE`: the position of `window_end` among the
        /// group keys. Groups are emitted once, as inserts, when the
        /// watermark reaches their window's end, and then forgotten; rows
        /// of windows already closed are dropped as late.
        #[serde(default)]
        emit_on_window_close: Option<usize>,
        /// With `EMIT ON WINDOW CLOSE`: where the late rows are counted, per
        /// window end, as a multiset of `(window_end)` rows in the format a
        /// view's rows have (`weir_catalog.late_rows` reads it).
        #[serde(default)]
        late_rows_table: Option<u64>,
        /// With `EMIT ON WINDOW CLOSE`: the key is not a window's end but
        /// the event time a source's watermark is defined over (`GROUP BY
        /// ts`): a group is complete once the watermark has passed it.
        #[serde(default)]
        close_after_key: bool,
        /// State TTL in microseconds of processing time: groups no row has
        /// written for that long are forgotten and leave the output.
        #[serde(default)]
        state_ttl_us: Option<i64>,
        /// Where rows whose group keys or arguments fail are counted (see
        /// `Filter`).
        #[serde(default)]
        errors: Option<u64>,
    },
    /// Equi-join of any kind in [`StreamJoinType`]; both inputs
    /// hash-partitioned on their keys.
    HashJoin {
        /// Inner, outer, semi or anti (absent in graphs of older Weirs,
        /// which only had inner joins).
        #[serde(default)]
        join_type: StreamJoinType,
        #[serde(with = "crate::wire::exprs")]
        left_keys: Vec<Expr>,
        #[serde(with = "crate::wire::exprs")]
        right_keys: Vec<Expr>,
        /// Non-equi condition over the joined row, if any.
        #[serde(with = "crate::wire::opt_expr")]
        filter: Option<Expr>,
        /// Where rows whose join keys fail are counted (see `Filter`).
        #[serde(default)]
        errors: Option<u64>,
        #[serde(with = "crate::wire::schema")]
        left_schema: DFSchemaRef,
        #[serde(with = "crate::wire::schema")]
        right_schema: DFSchemaRef,
        /// Whether a NULL key matches a NULL key.
        null_equals_null: bool,
        state_table: u64,
        /// An interval join (`r.ts BETWEEN l.ts - before AND l.ts + after`
        /// in ON) of append-only inputs: rows the watermark has left too
        /// far behind to match any future row are dropped from state.
        #[serde(default)]
        interval: Option<IntervalBounds>,
        /// A temporal join (`JOIN t FOR SYSTEM_TIME AS OF PROCTIME()`):
        /// each left row meets the right side as it is when the row
        /// arrives; right-side changes touch no earlier result, and left
        /// rows (append-only) are not kept.
        #[serde(default)]
        temporal: bool,
        /// State TTL in microseconds of processing time: a join key's rows
        /// on one side that no row has written for that long are forgotten.
        #[serde(default)]
        state_ttl_us: Option<i64>,
    },
    /// Grouping sets (`GROUPING SETS`, `ROLLUP`, `CUBE`): every row goes
    /// out once per set, as its input columns, then the group expressions
    /// (NULL where the set leaves one out), then the set's grouping id, for
    /// a HashAgg grouping on the last two (Flink's and RisingWave's Expand).
    Expand {
        #[serde(with = "crate::wire::exprs")]
        group_exprs: Vec<Expr>,
        /// Per set: which group expressions it leaves out (NULL), and its id.
        sets: Vec<(Vec<bool>, u64)>,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
    },
    /// `unnest(…)` in a select list (also `generate_series(…)` there): each
    /// input row goes out once per element of its arrays, the arrays in
    /// lockstep with NULL past the end of the shorter ones, as Postgres
    /// runs set-returning functions side by side.
    Unnest {
        /// Input columns holding the arrays.
        lists: Vec<usize>,
        /// For each output column, the input column it comes from (an
        /// array's column gives its elements).
        outputs: Vec<usize>,
        /// What a NULL or empty array gives.
        nulls: UnnestNulls,
    },
    /// Top-N per partition (`ORDER BY … LIMIT n [OFFSET k]`, or
    /// `ROW_NUMBER() OVER (PARTITION BY … ORDER BY …) <= n`): keeps the rows
    /// ranked `offset + 1 ..= offset + limit` in each partition, retracting
    /// and adding as rows enter and leave that range.
    TopN {
        #[serde(with = "crate::wire::exprs")]
        partition_by: Vec<Expr>,
        #[serde(with = "crate::wire::exprs")]
        order_by: Vec<Expr>,
        /// Per `order_by` expression: (descending, nulls first).
        directions: Vec<(bool, bool)>,
        limit: usize,
        offset: usize,
        /// Emit each row's number (`ROW_NUMBER()`, or `rank` as below) as a
        /// last column.
        row_number: bool,
        /// How rows are numbered: positions (`ROW_NUMBER()`, and `LIMIT`),
        /// or `RANK()` / `DENSE_RANK()`, where rows that tie share a number.
        /// The rows kept are those numbered `offset + 1 ..= offset + limit`.
        #[serde(default)]
        rank: RankKind,
        /// The input only inserts: rows past the top can be forgotten.
        append_only_input: bool,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        state_table: u64,
    },
    /// Window functions over partitions (`lag(x) OVER (PARTITION BY …
    /// ORDER BY …)`, `sum(x) OVER (…)`, `row_number() OVER (…)` without a
    /// filter on it): every input row goes out with the functions' values,
    /// kept current as rows come and go. Input hash-partitioned on
    /// `partition_by`; every function shares it and `order_by`.
    OverWindow {
        #[serde(with = "crate::wire::exprs")]
        partition_by: Vec<Expr>,
        #[serde(with = "crate::wire::exprs")]
        order_by: Vec<Expr>,
        /// Per `order_by` expression: (descending, nulls first).
        directions: Vec<(bool, bool)>,
        /// The window function expressions, as DataFusion planned them.
        #[serde(with = "crate::wire::exprs")]
        functions: Vec<Expr>,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        state_table: u64,
    },
    /// Temporal filter (`WHERE ts > now() - INTERVAL '1' HOUR`): each row is
    /// in the output while processing time is inside its visibility
    /// interval, which `bounds` (all of them) give; rows are inserted when it
    /// starts and deleted when it ends. Input hash-partitioned on the whole
    /// row.
    TemporalFilter {
        bounds: Vec<TemporalBound>,
        #[serde(with = "crate::wire::schema")]
        input_schema: DFSchemaRef,
        state_table: u64,
    },
    /// `UNION ALL` of `inputs` inputs of the same column types.
    Union { inputs: usize },
    /// Keeps the view's rows (with multiplicities) in state for `SELECT`,
    /// and their changes per epoch for `SUBSCRIBE`.
    Materialize {
        view_id: u64,
        state_table: u64,
        #[serde(default)]
        changelog: Option<ChangelogSpec>,
    },
    /// `CREATE SINK`: the job's changes go to a system outside Weir, made
    /// visible there when the checkpoint that covers them completes. Its
    /// state (`state_table`) holds what is prepared but not yet committed.
    Sink {
        sink_id: u64,
        sink_name: String,
        connector: ConnectorSpec,
        /// The columns that identify a row downstream (`primary_key`), by
        /// position: an upsert sink writes and deletes by them.
        key: Vec<usize>,
        /// Whether the input only ever inserts.
        append_only_input: bool,
        state_table: u64,
    },
}

impl OperatorSpec {
    /// Short name, as in EXPLAIN.
    pub fn name(&self) -> &'static str {
        match self {
            OperatorSpec::TableSource { .. } => "TableSource",
            OperatorSpec::ViewSource { .. } => "ViewSource",
            OperatorSpec::ConnectorSource { .. } => "ConnectorSource",
            OperatorSpec::Values { .. } => "Values",
            OperatorSpec::Filter { .. } => "Filter",
            OperatorSpec::Project { .. } => "Project",
            OperatorSpec::HashAgg { .. } => "HashAgg",
            OperatorSpec::HashJoin { .. } => "HashJoin",
            OperatorSpec::Union { .. } => "Union",
            OperatorSpec::Expand { .. } => "Expand",
            OperatorSpec::Unnest { .. } => "Unnest",
            OperatorSpec::TopN { .. } => "TopN",
            OperatorSpec::OverWindow { .. } => "OverWindow",
            OperatorSpec::TemporalFilter { .. } => "TemporalFilter",
            OperatorSpec::Materialize { .. } => "Materialize",
            OperatorSpec::Sink { .. } => "Sink",
        }
    }

    /// Number of inputs.
    pub fn inputs(&self) -> usize {
        match self {
            OperatorSpec::TableSource { .. }
            | OperatorSpec::ViewSource { .. }
            | OperatorSpec::ConnectorSource { .. }
            | OperatorSpec::Values { .. } => 0,
            OperatorSpec::HashJoin { .. } => 2,
            OperatorSpec::Union { inputs } => *inputs,
            _ => 1,
        }
    }

    /// Heads a source task: reads a table or a connector, takes checkpoint
    /// triggers from the JobMaster.
    pub fn is_source(&self) -> bool {
        self.inputs() == 0
    }

    /// The source's `WATERMARK FOR`, if it is a source that has one.
    pub fn source_watermark(&self) -> Option<&SourceWatermark> {
        match self {
            OperatorSpec::TableSource { watermark, .. }
            | OperatorSpec::ConnectorSource { watermark, .. } => watermark.as_ref(),
            _ => None,
        }
    }

    /// State tables the operator owns, known before it runs.
    pub fn state_tables(&self) -> Vec<u64> {
        match self {
            OperatorSpec::HashAgg {
                state_table,
                late_rows_table,
                errors,
                ..
            } => std::iter::once(*state_table)
                .chain(*late_rows_table)
                .chain(*errors)
                .collect(),
            OperatorSpec::HashJoin {
                state_table,
                errors,
                ..
            } => std::iter::once(*state_table).chain(*errors).collect(),
            OperatorSpec::TableSource { state_table, .. }
            | OperatorSpec::ViewSource { state_table, .. }
            | OperatorSpec::ConnectorSource { state_table, .. }
            | OperatorSpec::Values { state_table, .. }
            | OperatorSpec::TopN { state_table, .. }
            | OperatorSpec::OverWindow { state_table, .. }
            | OperatorSpec::TemporalFilter { state_table, .. }
            | OperatorSpec::Sink { state_table, .. } => vec![*state_table],
            OperatorSpec::Materialize {
                state_table,
                changelog,
                ..
            } => std::iter::once(*state_table)
                .chain(changelog.as_ref().map(|c| c.table))
                .collect(),
            OperatorSpec::Filter { errors, .. } | OperatorSpec::Project { errors, .. } => {
                errors.iter().copied().collect()
            }
            OperatorSpec::Union { .. }
            | OperatorSpec::Expand { .. }
            | OperatorSpec::Unnest { .. } => vec![],
        }
    }
}

/// What an `Unnest` makes of a row whose array is NULL or empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum UnnestNulls {
    /// No row (Postgres's `unnest`).
    Drop,
    /// A NULL array gives one row with NULL; an empty one none.
    Preserve,
    /// Both give one row with NULL.
    PreserveAndExpandEmpty,
}

fn list(exprs: &[Expr]) -> String {
    exprs.iter().map(show).collect::<Vec<_>>().join(", ")
}

/// An expression as EXPLAIN prints it: DataFusion's form, but interval
/// literals as SQL (`INTERVAL '1 minute'`) rather than their debug form.
fn show(e: &Expr) -> String {
    use datafusion::common::ScalarValue;
    use datafusion::common::tree_node::{Transformed, TreeNode};
    let readable = e.clone().transform(|e| {
        Ok(match &e {
            Expr::Literal(ScalarValue::IntervalMonthDayNano(Some(v)), _) => {
                let mut parts = Vec::new();
                if v.months != 0 {
                    parts.push(format!("{} mons", v.months));
                }
                if v.days != 0 {
                    parts.push(format!("{} days", v.days));
                }
                if v.nanoseconds != 0 || parts.is_empty() {
                    parts.push(time_text(v.nanoseconds));
                }
                let text = format!("INTERVAL '{}'", parts.join(" "));
                Transformed::yes(Expr::Column(datafusion::common::Column::from_name(text)))
            }
            _ => Transformed::no(e),
        })
    });
    match readable {
        Ok(t) => t.data.to_string(),
        Err(_) => e.to_string(),
    }
}

/// Nanoseconds in the largest unit that divides them: `2 hours`,
/// `90 seconds`, `1.5 seconds`.
fn time_text(ns: i64) -> String {
    const S: i64 = 1_000_000_000;
    for (len, unit) in [(3_600 * S, "hour"), (60 * S, "minute"), (S, "second")] {
        if ns % len == 0 {
            let n = ns / len;
            return format!("{n} {unit}{}", if n.abs() == 1 { "" } else { "s" });
        }
    }
    format!("{} seconds", ns as f64 / S as f64)
}

/// `ORDER BY` keys as in EXPLAIN: `b DESC NULLS FIRST, c ASC`.
fn sort_list(order_by: &[Expr], directions: &[(bool, bool)]) -> String {
    order_by
        .iter()
        .zip(directions)
        .map(|(e, (desc, nulls_first))| {
            format!(
                "{e} {}{}",
                if *desc { "DESC" } else { "ASC" },
                if *nulls_first { " NULLS FIRST" } else { "" }
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for OperatorSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OperatorSpec::TableSource {
                table_name,
                append_only,
                watermark,
                versioned,
                ..
            } => {
                write!(f, "TableSource: {table_name}")?;
                if *append_only {
                    write!(f, " append_only")?;
                }
                if *versioned {
                    write!(f, " current_version")?;
                }
                if let Some(w) = watermark {
                    write!(f, " watermark=({})", w.sql)?;
                }
                Ok(())
            }
            OperatorSpec::ViewSource { view_name, .. } => {
                write!(f, "ViewSource: {view_name} (its changelog)")
            }
            OperatorSpec::ConnectorSource {
                source_name,
                connector,
                watermark,
                ..
            } => {
                write!(
                    f,
                    "ConnectorSource: {source_name} connector={}",
                    connector.connector
                )?;
                if let Some(w) = watermark {
                    write!(f, " watermark=({})", w.sql)?;
                }
                Ok(())
            }
            OperatorSpec::Values { rows, .. } => write!(f, "Values: {rows} rows"),
            OperatorSpec::Filter { predicate, .. } => write!(f, "Filter: {}", show(predicate)),
            OperatorSpec::Project { exprs, .. } => write!(f, "Project: {}", list(exprs)),
            OperatorSpec::HashAgg {
                group_exprs,
                aggs,
                emit_on_window_close,
                ..
            } => {
                let aggs: Vec<String> = aggs.iter().map(|a| a.to_string()).collect();
                write!(
                    f,
                    "HashAgg: group=[{}] aggs=[{}]",
                    list(group_exprs),
                    aggs.join(", ")
                )?;
                if let Some(i) = emit_on_window_close {
                    write!(f, " emit=on_window_close({})", group_exprs[*i])?;
                }
                Ok(())
            }
            OperatorSpec::HashJoin {
                left_keys,
                right_keys,
                filter,
                join_type,
                interval,
                temporal,
                ..
            } => {
                let on: Vec<String> = left_keys
                    .iter()
                    .zip(right_keys)
                    .map(|(l, r)| format!("{} = {}", show(l), show(r)))
                    .collect();
                write!(
                    f,
                    "HashJoin: type={} on=[{}]",
                    join_type.name(),
                    on.join(", ")
                )?;
                if let Some(filter) = filter {
                    write!(f, " filter={}", show(filter))?;
                }
                if let Some(i) = interval {
                    write!(
                        f,
                        " interval=[-{}, +{}] (state cleaned by watermark)",
                        micros_text(i.before_us),
                        micros_text(i.after_us)
                    )?;
                }
                if *temporal {
                    write!(f, " temporal (right side at its current version)")?;
                }
                Ok(())
            }
            OperatorSpec::Union { inputs } => write!(f, "Union: {inputs} inputs"),
            OperatorSpec::TopN {
                partition_by,
                order_by,
                directions,
                limit,
                offset,
                row_number,
                rank,
                ..
            } => {
                write!(
                    f,
                    "TopN: partition=[{}] order=[{}] limit={limit} offset={offset}",
                    list(partition_by),
                    sort_list(order_by, directions)
                )?;
                if *row_number {
                    write!(f, " {}", rank.name())?;
                }
                Ok(())
            }
            OperatorSpec::OverWindow {
                partition_by,
                order_by,
                directions,
                functions,
                input_schema,
                ..
            } => write!(
                f,
                "OverWindow: partition=[{}] order=[{}] functions=[{}] reads=[{}]",
                list(partition_by),
                sort_list(order_by, directions),
                functions
                    .iter()
                    .map(|e| match e.clone().unalias() {
                        Expr::WindowFunction(w) => format!("{}({})", w.fun, list(&w.params.args)),
                        other => other.to_string(),
                    })
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::frames::reads(functions, input_schema)
            ),
            OperatorSpec::TemporalFilter { bounds, .. } => {
                let bounds: Vec<String> = bounds.iter().map(|b| b.to_string()).collect();
                write!(f, "TemporalFilter: {}", bounds.join(" AND "))
            }
            OperatorSpec::Expand {
                group_exprs, sets, ..
            } => {
                let sets: Vec<String> = sets
                    .iter()
                    .map(|(nulls, _)| {
                        let kept: Vec<String> = group_exprs
                            .iter()
                            .zip(nulls)
                            .filter(|(_, null)| !**null)
                            .map(|(e, _)| e.to_string())
                            .collect();
                        format!("({})", kept.join(", "))
                    })
                    .collect();
                write!(f, "Expand: sets=[{}]", sets.join(", "))
            }
            OperatorSpec::Unnest { lists, .. } => {
                let lists: Vec<String> = lists.iter().map(|c| format!("#{c}")).collect();
                write!(f, "Unnest: columns=[{}]", lists.join(", "))
            }
            OperatorSpec::Materialize { view_id, .. } => write!(f, "Materialize: view {view_id}"),
            OperatorSpec::Sink {
                sink_name,
                connector,
                ..
            } => write!(f, "Sink: {sink_name} connector={}", connector.connector),
        }
    }
}

/// `right.ts ∈ [left.ts - before, left.ts + after]`, as column positions
/// in each side's rows and microseconds.
/// A view's changelog (`SUBSCRIBE`): where the Materialize operator keeps
/// each epoch's changes, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChangelogSpec {
    pub table: u64,
    /// `retain_history`, in milliseconds of barrier time.
    pub retain_ms: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IntervalBounds {
    pub left_time: usize,
    pub right_time: usize,
    pub before_us: i64,
    pub after_us: i64,
}

/// `row cmp now() + delta`: one bound of a row's visibility in a
/// [`OperatorSpec::TemporalFilter`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct TemporalBound {
    /// A timestamp expression over the input row.
    #[serde(with = "crate::wire::expr")]
    pub row: Expr,
    pub cmp: TemporalCmp,
    pub delta_us: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TemporalCmp {
    Lt,
    LtEq,
    Gt,
    GtEq,
}

impl TemporalBound {
    /// The moment (microseconds) this bound opens or closes the row's
    /// visibility, given the row expression's value `row_us`: `(from,
    /// until)`, one of them unbounded. Visible while `from <= now < until`.
    pub fn interval(&self, row_us: i64) -> (i64, i64) {
        let b = row_us.saturating_sub(self.delta_us);
        match self.cmp {
            TemporalCmp::Gt => (i64::MIN, b),
            TemporalCmp::GtEq => (i64::MIN, b.saturating_add(1)),
            TemporalCmp::Lt => (b.saturating_add(1), i64::MAX),
            TemporalCmp::LtEq => (b, i64::MAX),
        }
    }
}

impl fmt::Display for TemporalBound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let op = match self.cmp {
            TemporalCmp::Lt => "<",
            TemporalCmp::LtEq => "<=",
            TemporalCmp::Gt => ">",
            TemporalCmp::GtEq => ">=",
        };
        write!(f, "{} {op} now()", show(&self.row))?;
        match self.delta_us {
            0 => Ok(()),
            d if d < 0 => write!(f, " - {}", micros_text(-d)),
            d => write!(f, " + {}", micros_text(d)),
        }
    }
}

/// `90000000` → `1m 30s`.
fn micros_text(us: i64) -> String {
    let mut parts = Vec::new();
    let mut rest = us;
    for (unit, len) in [
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
    ] {
        if rest >= len {
            parts.push(format!("{}{unit}", rest / len));
            rest %= len;
        }
    }
    if rest > 0 || parts.is_empty() {
        parts.push(format!("{rest}us"));
    }
    parts.join(" ")
}

/// How a TopN numbers the rows of a partition.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RankKind {
    /// 1, 2, 3, … in order, ties broken by the row's values.
    #[default]
    RowNumber,
    /// Ties share a number; the next row's number counts them (1, 1, 3).
    Rank,
    /// Ties share a number; the next is one more (1, 1, 2).
    DenseRank,
}

impl RankKind {
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "row_number" => RankKind::RowNumber,
            "rank" => RankKind::Rank,
            "dense_rank" => RankKind::DenseRank,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            RankKind::RowNumber => "row_number",
            RankKind::Rank => "rank",
            RankKind::DenseRank => "dense_rank",
        }
    }
}

/// A connector's definition as the DDL gave it: `WITH (connector = '…',
/// …) FORMAT … ENCODE … (…)`. The executor's connectors check and read it.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct ConnectorSpec {
    /// `connector = '…'`, in lower case.
    pub connector: String,
    /// Every other `WITH` option, by its name in lower case.
    pub options: std::collections::BTreeMap<String, String>,
    /// `FORMAT …` (`PLAIN`, `UPSERT`, `DEBEZIUM`), upper case.
    #[serde(default)]
    pub format: Option<String>,
    /// `ENCODE …` (`JSON`, `CSV`, `AVRO`), upper case.
    #[serde(default)]
    pub encode: Option<String>,
    /// The options after `ENCODE …`, by name.
    #[serde(default)]
    pub encode_options: std::collections::BTreeMap<String, String>,
    /// `INCLUDE what AS column`: what the connector knows of each record
    /// beyond its value (a Kafka key, partition, offset, timestamp), as
    /// the source's last columns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<IncludeColumn>,
    /// `ENCODE … (dead_letter_table = 'name')`, resolved by the catalog:
    /// the table (id) in which every job reading the source keeps the
    /// records it could not decode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dead_letter_table: Option<u64>,
}

/// One `INCLUDE what [AS column]` of a source.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IncludeColumn {
    /// `key`, `partition`, `offset` or `timestamp`.
    pub what: String,
    pub column: String,
}

/// How a source derives watermarks: event time is complete up to the
/// largest value of `expr` over the rows read so far.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct SourceWatermark {
    /// Over the table's columns (before the source's projection).
    #[serde(with = "crate::wire::expr")]
    pub expr: Expr,
    #[serde(with = "crate::wire::schema")]
    pub table_schema: DFSchemaRef,
    /// The expression as the user wrote it, for EXPLAIN.
    pub sql: String,
}

/// The kinds of join a HashJoin maintains under retractions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum StreamJoinType {
    #[default]
    Inner,
    /// Every left row, with NULLs where nothing on the right matches.
    Left,
    Right,
    Full,
    /// Left rows with at least one match (`EXISTS`, `IN`); left columns only.
    LeftSemi,
    /// Left rows without a match (`NOT EXISTS`); left columns only.
    LeftAnti,
    RightSemi,
    RightAnti,
}

impl StreamJoinType {
    pub fn name(self) -> &'static str {
        match self {
            StreamJoinType::Inner => "inner",
            StreamJoinType::Left => "left",
            StreamJoinType::Right => "right",
            StreamJoinType::Full => "full",
            StreamJoinType::LeftSemi => "left semi",
            StreamJoinType::LeftAnti => "left anti",
            StreamJoinType::RightSemi => "right semi",
            StreamJoinType::RightAnti => "right anti",
        }
    }

    /// Whether rows of `side` (0 left, 1 right) without a match are kept,
    /// padded with NULLs.
    pub fn preserves(self, side: usize) -> bool {
        matches!(
            (self, side),
            (StreamJoinType::Full, _) | (StreamJoinType::Left, 0) | (StreamJoinType::Right, 1)
        )
    }

    /// For semi and anti joins: the side whose rows are the output, and
    /// whether they are kept when matched (semi) or when not (anti).
    pub fn filtering(self) -> Option<(usize, bool)> {
        match self {
            StreamJoinType::LeftSemi => Some((0, true)),
            StreamJoinType::LeftAnti => Some((0, false)),
            StreamJoinType::RightSemi => Some((1, true)),
            StreamJoinType::RightAnti => Some((1, false)),
            _ => None,
        }
    }
}

/// The aggregate functions a HashAgg can maintain under retractions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AggKind {
    Count,
    Sum,
    Avg,
    Min,
    Max,
    BoolAnd,
    BoolOr,
    StddevSamp,
    StddevPop,
    VarSamp,
    VarPop,
    /// `string_agg(x, delimiter)`, values in ascending order.
    StringAgg,
    /// `array_agg(x)`, values (NULLs included) in ascending order.
    ArrayAgg,
    /// `first_value(x ORDER BY …)` and `last_value(…)`: the value of the
    /// first (last) row in the call's order.
    FirstValue,
    LastValue,
    /// `bit_and`, `bit_or`, `bit_xor` of integers.
    BitAnd,
    BitOr,
    BitXor,
}

impl AggKind {
    /// By DataFusion's name of the function.
    pub fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "count" => AggKind::Count,
            "sum" => AggKind::Sum,
            "avg" | "mean" => AggKind::Avg,
            "min" => AggKind::Min,
            "max" => AggKind::Max,
            "bool_and" => AggKind::BoolAnd,
            "bool_or" => AggKind::BoolOr,
            "stddev" | "stddev_samp" => AggKind::StddevSamp,
            "stddev_pop" => AggKind::StddevPop,
            "var" | "var_samp" | "var_sample" | "variance" => AggKind::VarSamp,
            "var_pop" | "var_population" => AggKind::VarPop,
            "string_agg" => AggKind::StringAgg,
            "array_agg" => AggKind::ArrayAgg,
            "first_value" => AggKind::FirstValue,
            "last_value" => AggKind::LastValue,
            "bit_and" => AggKind::BitAnd,
            "bit_or" => AggKind::BitOr,
            "bit_xor" => AggKind::BitXor,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            AggKind::Count => "count",
            AggKind::Sum => "sum",
            AggKind::Avg => "avg",
            AggKind::Min => "min",
            AggKind::Max => "max",
            AggKind::BoolAnd => "bool_and",
            AggKind::BoolOr => "bool_or",
            AggKind::StddevSamp => "stddev_samp",
            AggKind::StddevPop => "stddev_pop",
            AggKind::VarSamp => "var_samp",
            AggKind::VarPop => "var_pop",
            AggKind::StringAgg => "string_agg",
            AggKind::ArrayAgg => "array_agg",
            AggKind::FirstValue => "first_value",
            AggKind::LastValue => "last_value",
            AggKind::BitAnd => "bit_and",
            AggKind::BitOr => "bit_or",
            AggKind::BitXor => "bit_xor",
        }
    }

    /// Whether the result depends on the order rows arrive in (and so an
    /// `ORDER BY` inside the call matters).
    pub fn order_sensitive(self) -> bool {
        matches!(
            self,
            AggKind::StringAgg | AggKind::ArrayAgg | AggKind::FirstValue | AggKind::LastValue
        )
    }
}

/// One aggregate call of a HashAgg.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AggCall {
    pub kind: AggKind,
    /// The argument over the input schema.
    #[serde(with = "crate::wire::expr")]
    pub arg: Expr,
    /// The type of the result, as DataFusion's logical plan says.
    #[serde(with = "crate::wire::data_type")]
    pub output_type: DataType,
    /// `agg(DISTINCT …)`: each value counts once however often it occurs.
    #[serde(default)]
    pub distinct: bool,
    /// `FILTER (WHERE …)`: only rows where it is true are aggregated.
    #[serde(default, with = "crate::wire::opt_expr")]
    pub filter: Option<Expr>,
    /// `string_agg`'s delimiter.
    #[serde(default)]
    pub delimiter: Option<String>,
    /// `string_agg`'s delimiter when it is not a constant: each value is
    /// preceded by its own row's.
    #[serde(default, with = "crate::wire::opt_expr")]
    pub delimiter_expr: Option<Expr>,
    /// `ORDER BY` inside the call (order-sensitive aggregates): the keys,
    /// and for each whether it is descending and whether NULLs come first.
    #[serde(default, with = "crate::wire::exprs")]
    pub order_by: Vec<Expr>,
    #[serde(default)]
    pub order_options: Vec<(bool, bool)>,
    /// The input is append-only, so min and max never have to give a value
    /// back: they keep only the current one instead of every value.
    #[serde(default)]
    pub append_only_input: bool,
}

impl fmt::Display for AggCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let distinct = if self.distinct { "DISTINCT " } else { "" };
        write!(f, "{}({distinct}{})", self.kind.name(), self.arg)?;
        if let Some(filter) = &self.filter {
            write!(f, " FILTER (WHERE {filter})")?;
        }
        Ok(())
    }
}

/// Where a job's operators keep their keyed state (`SET state_backend`):
/// Flink's `EmbeddedRocksDBStateBackend` and `HashMapStateBackend`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateBackend {
    /// In the subtask's RocksDB instance on local disk, with the hot keys
    /// cached within the slot's managed memory: state may outgrow memory.
    #[default]
    #[serde(rename = "rocksdb")]
    RocksDb,
    /// In memory, all of it, written to RocksDB only at checkpoints:
    /// fastest, bounded by the slot's managed memory (past it the job
    /// fails).
    Heap,
}

impl StateBackend {
    pub fn name(self) -> &'static str {
        match self {
            StateBackend::RocksDb => "rocksdb",
            StateBackend::Heap => "heap",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "rocksdb" => Some(StateBackend::RocksDb),
            "heap" | "hashmap" => Some(StateBackend::Heap),
            _ => None,
        }
    }
}

/// How a job's subtasks treat barriers (`SET checkpoint_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckpointMode {
    /// Flink's BarrierBuffer: a channel that delivered barrier *n* is held
    /// back until every channel has; each checkpoint holds exactly the
    /// records before it, so a restart neither loses nor repeats anything.
    #[default]
    ExactlyOnce,
    /// Flink's BarrierTracker: barriers are counted, no channel is ever
    /// held back; records after the barrier on a fast channel may already
    /// be in the checkpoint's state, so after a restart they are counted
    /// again. Lower latency under skew, duplicates after failures.
    AtLeastOnce,
}

impl CheckpointMode {
    pub fn name(self) -> &'static str {
        match self {
            CheckpointMode::ExactlyOnce => "exactly_once",
            CheckpointMode::AtLeastOnce => "at_least_once",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.to_lowercase().replace(['-', ' '], "_").as_str() {
            "exactly_once" => Some(CheckpointMode::ExactlyOnce),
            "at_least_once" => Some(CheckpointMode::AtLeastOnce),
            _ => None,
        }
    }
}

/// How records travel along an edge (Flink's `StreamPartitioner`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub enum Partitioner {
    /// Subtask i to subtask i; the only edge that can be chained.
    Forward,
    /// By hash of expressions over the sender's output, into key groups.
    Hash {
        #[serde(with = "crate::wire::exprs")]
        exprs: Vec<Expr>,
        #[serde(with = "crate::wire::schema")]
        schema: DFSchemaRef,
    },
    /// Everything to subtask 0.
    Global,
    /// Round robin.
    Rebalance,
}

impl fmt::Display for Partitioner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Partitioner::Forward => write!(f, "FORWARD"),
            Partitioner::Hash { exprs, .. } => write!(f, "HASH({})", list(exprs)),
            Partitioner::Global => write!(f, "GLOBAL"),
            Partitioner::Rebalance => write!(f, "REBALANCE"),
        }
    }
}

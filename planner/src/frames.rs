//! How far a window function's value reaches along its partition: the
//! rows before and after a row that its value at that row depends on.
//!
//! `lag(x, 2)` reads the row two back, `lead(x)` the next one, and
//! `sum(x) OVER (ROWS BETWEEN 3 PRECEDING AND 1 FOLLOWING)` its frame;
//! their values are bounded in rows. `row_number()`, `rank()`, a running
//! sum (`RANGE UNBOUNDED PRECEDING`, the default with `ORDER BY`) and any
//! aggregate over the whole partition are not: a change anywhere can
//! change every row's value. OverWindow uses the bound to evaluate only
//! the rows around a change, reading a partition by ranges instead of
//! whole; without one, it streams a large partition a page at a time
//! when DataFusion can compute the functions so ([`reads`]; see
//! `executor::operators::over_window`).

use datafusion::common::{DFSchema, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::expr::{NullTreatment, WindowFunction};
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::logical_expr::{
    Expr, WindowFrameBound, WindowFrameUnits, WindowFunctionDefinition,
};
use datafusion::physical_expr::window::PlainAggregateWindowExpr;
use datafusion::physical_planner::create_window_expr;

/// The rows before (`preceding`) and after (`following`) a row that the
/// window functions' values at that row read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reach {
    pub preceding: u64,
    pub following: u64,
}

impl Reach {
    fn union(self, other: Reach) -> Reach {
        Reach {
            preceding: self.preceding.max(other.preceding),
            following: self.following.max(other.following),
        }
    }

    /// Reads rows `from..=to` relative to the row (negative: before it).
    fn span(from: i64, to: i64) -> Reach {
        Reach {
            preceding: (-from.min(to)).max(0) as u64,
            following: from.max(to).max(0) as u64,
        }
    }
}

/// How OverWindow reads a touched partition for its functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reads {
    /// The rows around each change.
    Around(Reach),
    /// All of it, a page at a time: every function's value at a row
    /// depends on the rows before it and a bounded number after it
    /// (`row_number`, `rank`, running sums), so DataFusion computes them
    /// in bounded memory (its `uses_bounded_memory`).
    Streamed,
    /// All of it, a page at a time, twice: the first pass counts the
    /// partition and computes its aggregates over the whole partition,
    /// the second streams as [`Reads::Streamed`] does, with `ntile` and
    /// `percent_rank` from the count (see [`Streaming`]).
    TwoPasses,
    /// All of it, a page at a time from its last row back (after a first
    /// pass when `two_passes`): each function's value at a row depends on
    /// the rows after it and a bounded number before it (frames from the
    /// current row to `UNBOUNDED FOLLOWING`, `cume_dist`), which read
    /// backwards is what DataFusion streams.
    Backward { two_passes: bool },
    /// All of it at once: functions that do not stream at all, or that
    /// stream in opposite directions together (a running sum and a sum to
    /// the partition's end), which the planner gives two OverWindows
    /// instead ([`split`]).
    Whole,
}

impl std::fmt::Display for Reads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reads::Around(r) => write!(
                f,
                "rows around each change, {} preceding and {} following",
                r.preceding, r.following
            ),
            Reads::Streamed => f.write_str("whole partition, a page at a time"),
            Reads::TwoPasses => f.write_str("whole partition, two passes a page at a time"),
            Reads::Backward { two_passes: false } => {
                f.write_str("whole partition, a page at a time from its end")
            }
            Reads::Backward { two_passes: true } => {
                f.write_str("whole partition, two passes a page at a time from its end")
            }
            Reads::Whole => f.write_str("whole partition"),
        }
    }
}

/// How a function's values come when its partition is streamed.
#[derive(Debug, Clone, PartialEq)]
pub enum Streaming {
    /// DataFusion streams it: the value of the [`streamed`] expression,
    /// read from the partition's first row on.
    Bounded,
    /// DataFusion streams its reverse (`sum(x) OVER (ORDER BY t ROWS
    /// BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING)` is a running sum
    /// read from the partition's last row back).
    Reversed,
    /// The same at every row: an aggregate over the whole partition
    /// (`sum(x) OVER (PARTITION BY g)`, `count(*) OVER ()`), computed in
    /// a first pass.
    Total,
    /// `ntile(n)`: from the row's `row_number()` (the [`streamed`]
    /// expression, either way) and the partition's count.
    Ntile(u64),
    /// `percent_rank()`: from the row's `rank()` (the [`streamed`]
    /// expression) and the partition's count.
    PercentRank,
    /// `cume_dist()`: from the row's `rank()` read backwards (one more
    /// than the rows after its peers) and the partition's count.
    CumeDist,
}

impl Streaming {
    fn forward(&self) -> bool {
        !matches!(self, Streaming::Reversed | Streaming::CumeDist)
    }

    fn backward(&self) -> bool {
        !matches!(self, Streaming::Bounded | Streaming::PercentRank)
    }

    fn first_pass(&self) -> bool {
        !matches!(self, Streaming::Bounded | Streaming::Reversed)
    }
}

/// How OverWindow reads a partition for `functions` over rows of
/// `input`.
pub fn reads(functions: &[Expr], input: &DFSchema) -> Reads {
    if let Some(r) = reach(functions) {
        return Reads::Around(r);
    }
    let Some(kinds) = functions
        .iter()
        .map(|f| streaming(f, input))
        .collect::<Option<Vec<_>>>()
    else {
        return Reads::Whole;
    };
    let two_passes = kinds.iter().any(Streaming::first_pass);
    if kinds.iter().all(Streaming::forward) {
        match two_passes {
            true => Reads::TwoPasses,
            false => Reads::Streamed,
        }
    } else if kinds.iter().all(Streaming::backward) {
        Reads::Backward { two_passes }
    } else {
        Reads::Whole
    }
}

/// For `functions` that stream only in opposite directions together
/// ([`Reads::Whole`], though each streams), the ones read forwards and the
/// ones read backwards (indices): two OverWindows, one after the other,
/// stream them. `None` otherwise.
pub fn split(functions: &[Expr], input: &DFSchema) -> Option<(Vec<usize>, Vec<usize>)> {
    if reads(functions, input) != Reads::Whole {
        return None;
    }
    let kinds = functions
        .iter()
        .map(|f| streaming(f, input))
        .collect::<Option<Vec<_>>>()?;
    let (forward, backward): (Vec<usize>, Vec<usize>) =
        (0..kinds.len()).partition(|i| kinds[*i].forward());
    (!forward.is_empty() && !backward.is_empty()).then_some((forward, backward))
}

/// How `function`'s values come when its partition is streamed; `None`
/// when they cannot (it needs the partition whole).
pub fn streaming(function: &Expr, input: &DFSchema) -> Option<Streaming> {
    let props = ExecutionProps::new();
    let ctx = PhysicalPlanningContext::default();
    let physical = create_window_expr(function, input, &props, &ctx).ok()?;
    if physical.uses_bounded_memory() {
        return Some(Streaming::Bounded);
    }
    let Expr::WindowFunction(w) = function.clone().unalias() else {
        return None;
    };
    let reversed = || {
        physical
            .get_reverse_expr()
            .is_some_and(|r| r.uses_bounded_memory())
            .then_some(Streaming::Reversed)
    };
    match &w.fun {
        WindowFunctionDefinition::AggregateUDF(_) => {
            // Every row's frame the whole partition (as DataFusion's
            // `is_window_constant_in_partition`), from its first row, so
            // DataFusion plans it without sliding; a FILTER is not read.
            let frame = &w.params.window_frame;
            let whole_end = match frame.end_bound {
                WindowFrameBound::CurrentRow => {
                    frame.units == WindowFrameUnits::Range && w.params.order_by.is_empty()
                }
                ref end => end.is_unbounded(),
            };
            let plain = physical.as_any().is::<PlainAggregateWindowExpr>();
            match frame.start_bound.is_unbounded()
                && whole_end
                && plain
                && w.params.filter.is_none()
            {
                true => Some(Streaming::Total),
                false => reversed(),
            }
        }
        WindowFunctionDefinition::WindowUDF(udf) => match udf.name() {
            "ntile" => match w.params.args.first() {
                Some(Expr::Literal(v, _)) => integer(v)
                    .filter(|n| *n > 0)
                    .map(|n| Streaming::Ntile(n as u64)),
                _ => None,
            },
            "percent_rank" => Some(Streaming::PercentRank),
            "cume_dist" => Some(Streaming::CumeDist),
            _ => reversed(),
        },
    }
}

/// What a streamed partition's runs compute for `function` (see
/// [`Streaming`]), read forwards or `backward`: the function itself
/// (reversed by the executor when it streams so), or the `row_number()`
/// or `rank()` its value comes from, over the same partition and in the
/// order it is read. `None` for a [`Streaming::Total`] or a function that
/// does not stream.
pub fn streamed(function: &Expr, input: &DFSchema, backward: bool) -> Option<Expr> {
    use datafusion::functions_window::rank::rank_udwf;
    match streaming(function, input)? {
        Streaming::Bounded | Streaming::Reversed => Some(function.clone()),
        Streaming::Total => None,
        Streaming::Ntile(_) => row_number_over(function, backward),
        Streaming::PercentRank | Streaming::CumeDist => over(function, rank_udwf(), backward),
    }
}

/// `row_number()` over `function`'s partition, in its order or (with
/// `backward`) the reverse.
pub fn row_number_over(function: &Expr, backward: bool) -> Option<Expr> {
    over(
        function,
        datafusion::functions_window::row_number::row_number_udwf(),
        backward,
    )
}

fn over(
    function: &Expr,
    udwf: std::sync::Arc<datafusion::logical_expr::WindowUDF>,
    backward: bool,
) -> Option<Expr> {
    let Expr::WindowFunction(w) = function.clone().unalias() else {
        return None;
    };
    let mut helper = WindowFunction::new(WindowFunctionDefinition::WindowUDF(udwf), vec![]);
    helper.params.partition_by = w.params.partition_by;
    helper.params.order_by = match backward {
        true => w.params.order_by.iter().map(|s| s.reverse()).collect(),
        false => w.params.order_by,
    };
    Some(Expr::from(helper))
}

/// The reach of every function together; `None` when one of them reads
/// its whole partition (or a reach Weir cannot bound).
pub fn reach(functions: &[Expr]) -> Option<Reach> {
    let mut all = Reach::span(0, 0);
    for f in functions {
        let Expr::WindowFunction(w) = f.clone().unalias() else {
            return None;
        };
        all = all.union(function_reach(&w)?);
    }
    Some(all)
}

fn function_reach(w: &WindowFunction) -> Option<Reach> {
    if w.params.null_treatment == Some(NullTreatment::IgnoreNulls) {
        // The nearest non-NULL row may be anywhere.
        return None;
    }
    match &w.fun {
        WindowFunctionDefinition::WindowUDF(udf) => match udf.name() {
            "lag" | "lead" => {
                let offset = match w.params.args.get(1) {
                    None => 1,
                    // DataFusion reads a NULL offset as 0.
                    Some(Expr::Literal(v, _)) if v.is_null() => 0,
                    Some(Expr::Literal(v, _)) => integer(v)?,
                    Some(_) => return None,
                };
                let offset = if udf.name() == "lag" { -offset } else { offset };
                Some(Reach::span(offset, offset))
            }
            "first_value" | "last_value" | "nth_value" => frame_reach(w),
            _ => None,
        },
        WindowFunctionDefinition::AggregateUDF(_) => frame_reach(w),
    }
}

/// The reach of a `ROWS` frame with bounds at fixed offsets.
fn frame_reach(w: &WindowFunction) -> Option<Reach> {
    let frame = &w.params.window_frame;
    if frame.units != WindowFrameUnits::Rows {
        return None;
    }
    let offset = |bound: &WindowFrameBound| match bound {
        WindowFrameBound::CurrentRow => Some(0),
        WindowFrameBound::Preceding(v) => integer(v).map(|n| -n),
        WindowFrameBound::Following(v) => integer(v),
    };
    Some(Reach::span(
        offset(&frame.start_bound)?,
        offset(&frame.end_bound)?,
    ))
}

/// An integer literal (`None` for NULL, which in a frame bound means
/// UNBOUNDED).
fn integer(v: &ScalarValue) -> Option<i64> {
    match v
        .cast_to(&datafusion::arrow::datatypes::DataType::Int64)
        .ok()?
    {
        ScalarValue::Int64(Some(n)) => Some(n),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::functions_window::expr_fn::{lag, lead, row_number};
    use datafusion::logical_expr::expr::WindowFunction;
    use datafusion::logical_expr::{ExprFunctionExt, WindowFrame, col};

    fn rows(start: WindowFrameBound, end: WindowFrameBound) -> Expr {
        Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
            .order_by(vec![col("b").sort(true, false)])
            .window_frame(WindowFrame::new_bounds(WindowFrameUnits::Rows, start, end))
            .build()
            .unwrap()
    }

    fn n(v: u64) -> ScalarValue {
        ScalarValue::UInt64(Some(v))
    }

    #[test]
    fn offsets_and_row_frames_are_bounded() {
        let lag2 = lag(col("b"), Some(2), None);
        let lead1 = lead(col("b"), Some(1), None);
        assert_eq!(
            reach(&[lag2.clone(), lead1]),
            Some(Reach {
                preceding: 2,
                following: 1
            })
        );
        let frame = rows(
            WindowFrameBound::Preceding(n(3)),
            WindowFrameBound::Following(n(1)),
        );
        assert_eq!(
            reach(&[frame]),
            Some(Reach {
                preceding: 3,
                following: 1
            })
        );
        let ahead = rows(
            WindowFrameBound::Following(n(2)),
            WindowFrameBound::Following(n(4)),
        );
        assert_eq!(
            reach(&[ahead, lag2]),
            Some(Reach {
                preceding: 2,
                following: 4
            })
        );
        let back = lead(col("b"), Some(-3), Some(ScalarValue::Int64(Some(0))));
        assert_eq!(
            reach(&[back]),
            Some(Reach {
                preceding: 3,
                following: 0
            })
        );
    }

    #[test]
    fn whole_partition_functions_are_not() {
        assert_eq!(reach(&[row_number()]), None);
        let running = Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap();
        assert_eq!(reach(&[running]), None, "RANGE UNBOUNDED PRECEDING");
        let unbounded = rows(
            WindowFrameBound::Preceding(ScalarValue::UInt64(None)),
            WindowFrameBound::CurrentRow,
        );
        assert_eq!(reach(&[lag(col("b"), Some(1), None), unbounded]), None);
    }

    #[test]
    fn running_functions_stream_and_the_rest_read_whole() {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use datafusion::functions_window::expr_fn::{cume_dist, ntile, percent_rank, rank};
        let schema =
            DFSchema::try_from(Schema::new(vec![Field::new("b", DataType::Int64, true)])).unwrap();
        let by_b = |e: Expr| {
            e.order_by(vec![col("b").sort(true, false)])
                .build()
                .unwrap()
        };
        let running = by_b(Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")])));
        assert_eq!(
            reads(&[by_b(row_number()), by_b(rank()), running], &schema),
            Reads::Streamed
        );
        let total = Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]));
        assert_eq!(
            reads(&[total.clone(), by_b(row_number())], &schema),
            Reads::TwoPasses,
            "the whole partition's sum, first"
        );
        assert_eq!(streaming(&total, &schema), Some(Streaming::Total));
        let thirds = by_b(ntile(datafusion::prelude::lit(3i64)));
        assert_eq!(streaming(&thirds, &schema), Some(Streaming::Ntile(3)));
        assert_eq!(
            streaming(&by_b(percent_rank()), &schema),
            Some(Streaming::PercentRank)
        );
        assert_eq!(
            reads(&[by_b(row_number()), by_b(cume_dist())], &schema),
            Reads::Whole
        );
        let rest = Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
            .order_by(vec![col("b").sort(true, false)])
            .window_frame(WindowFrame::new_bounds(
                WindowFrameUnits::Rows,
                WindowFrameBound::CurrentRow,
                WindowFrameBound::Following(ScalarValue::UInt64(None)),
            ))
            .build()
            .unwrap();
        assert_eq!(
            reads(std::slice::from_ref(&rest), &schema),
            Reads::Backward { two_passes: false },
            "the rest's sum, a running sum read backwards"
        );
        assert_eq!(
            reads(&[rest.clone(), by_b(cume_dist())], &schema),
            Reads::Backward { two_passes: true }
        );
        assert_eq!(
            reads(&[rest.clone(), by_b(rank())], &schema),
            Reads::Whole,
            "one forwards, one backwards"
        );
        assert_eq!(
            split(&[rest.clone(), by_b(rank()), by_b(cume_dist())], &schema),
            Some((vec![1], vec![0, 2])),
            "so they go to two OverWindows"
        );
        assert_eq!(split(&[rest, by_b(cume_dist())], &schema), None);
        assert!(matches!(
            reads(&[lag(col("b"), Some(1), None)], &schema),
            Reads::Around(_)
        ));
    }
}

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
    /// All of it at once (`ntile`, `cume_dist`, frames that end
    /// `UNBOUNDED FOLLOWING`: no value is known before the last row).
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
            Reads::Whole => f.write_str("whole partition"),
        }
    }
}

/// How OverWindow reads a partition for `functions` over rows of
/// `input`.
pub fn reads(functions: &[Expr], input: &DFSchema) -> Reads {
    if let Some(r) = reach(functions) {
        return Reads::Around(r);
    }
    let props = ExecutionProps::new();
    let ctx = PhysicalPlanningContext::default();
    let bounded = functions
        .iter()
        .all(|f| create_window_expr(f, input, &props, &ctx).is_ok_and(|w| w.uses_bounded_memory()));
    if bounded {
        Reads::Streamed
    } else {
        Reads::Whole
    }
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
        use datafusion::functions_window::expr_fn::{cume_dist, rank};
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
            reads(&[total], &schema),
            Reads::Whole,
            "the whole partition's sum"
        );
        assert_eq!(
            reads(&[by_b(row_number()), by_b(cume_dist())], &schema),
            Reads::Whole
        );
        assert!(matches!(
            reads(&[lag(col("b"), Some(1), None)], &schema),
            Reads::Around(_)
        ));
    }
}

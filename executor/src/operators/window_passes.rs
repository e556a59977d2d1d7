//! What a streamed partition's window runs compute, when some functions
//! need more than the rows before each row: an aggregate over the whole
//! partition (`sum(x) OVER (PARTITION BY g)`), `ntile(n)` and
//! `percent_rank()` need the partition's count or total before any value
//! (and `cume_dist()`, read backwards, too).
//! A first pass over the partition, a page at a time, counts its rows and
//! feeds each whole-partition aggregate's accumulator (once for the
//! partition as it was before a chunk and once as it is after); the runs
//! of [`super::window_run`] then stream what DataFusion can stream
//! (`row_number()` for `ntile`, `rank()` for `percent_rank` and, read
//! from the partition's end, for `cume_dist`, the bounded functions
//! themselves or their reverse) and each row's values are put together
//! from the two ([`StreamPlan::columns`]), with DataFusion's formulas.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray, Float64Array, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::UInt64Type;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::Accumulator;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::window::{PlainAggregateWindowExpr, WindowExpr};
use datafusion::physical_planner::create_window_expr;
use planner::frames::Streaming;

use crate::{ExecError, Result};

/// Where one function's values come from.
enum Column {
    /// The runs' column `i`.
    Streamed(usize),
    /// Whole-partition aggregate `i` of the first pass.
    Total(usize),
    /// `ntile(buckets)`, from the runs' `row_number()` column (counted
    /// from the partition's end when it is read `backward`).
    Ntile {
        row_number: usize,
        buckets: u64,
        backward: bool,
    },
    /// `percent_rank()`, from the runs' `rank()` column.
    PercentRank { rank: usize },
    /// `cume_dist()`, from the runs' `rank()` column read backwards.
    CumeDist { rank: usize },
}

/// How a streamed partition's functions are computed.
pub(super) struct StreamPlan {
    /// What the runs compute (never empty: DataFusion's window operator
    /// wants a function).
    pub(super) runs: Vec<Arc<dyn WindowExpr>>,
    columns: Vec<Column>,
    /// The whole-partition aggregates, each a `PlainAggregateWindowExpr`.
    totals: Vec<Arc<dyn WindowExpr>>,
}

/// What a first pass learned about a partition.
pub(super) struct Facts {
    count: u64,
    totals: Vec<ScalarValue>,
}

/// A first pass over a partition in progress.
pub(super) struct FirstPass {
    count: u64,
    accumulators: Vec<(Arc<dyn WindowExpr>, Box<dyn Accumulator>)>,
}

impl StreamPlan {
    /// The plan for `functions` (every one streams, per
    /// [`planner::frames::streaming`], in the direction the partition is
    /// read: forwards, or `backward` from its end) over rows of `input`.
    pub(super) fn new(functions: &[Expr], input: &DFSchema, backward: bool) -> Result<Self> {
        let props = ExecutionProps::new();
        let ctx = PhysicalPlanningContext::default();
        let physical = |e: &Expr| -> Result<Arc<dyn WindowExpr>> {
            Ok(create_window_expr(e, input, &props, &ctx)?)
        };
        let mut plan = Self {
            runs: Vec::new(),
            columns: Vec::new(),
            totals: Vec::new(),
        };
        for f in functions {
            let kind = planner::frames::streaming(f, input).ok_or_else(|| {
                ExecError::Protocol(
                    "a window function that needs its partition whole, streamed".into(),
                )
            })?;
            if kind == Streaming::Total {
                plan.columns.push(Column::Total(plan.totals.len()));
                plan.totals.push(physical(f)?);
                continue;
            }
            let streamed = planner::frames::streamed(f, input, backward).ok_or_else(|| {
                ExecError::Protocol("a window function with nothing to stream".into())
            })?;
            let mut run = physical(&streamed)?;
            if kind == Streaming::Reversed {
                run = run.get_reverse_expr().ok_or_else(|| {
                    ExecError::Protocol("a window function with no reverse, read backwards".into())
                })?;
            }
            let i = plan.runs.len();
            plan.runs.push(run);
            plan.columns.push(match kind {
                Streaming::Ntile(buckets) => Column::Ntile {
                    row_number: i,
                    buckets,
                    backward,
                },
                Streaming::PercentRank => Column::PercentRank { rank: i },
                Streaming::CumeDist => Column::CumeDist { rank: i },
                _ => Column::Streamed(i),
            });
        }
        if plan.runs.is_empty()
            && let Some(row_number) = functions
                .first()
                .and_then(|f| planner::frames::row_number_over(f, backward))
        {
            plan.runs.push(physical(&row_number)?);
        }
        Ok(plan)
    }

    /// Whether the values need [`StreamPlan::first_pass`].
    pub(super) fn two_passes(&self) -> bool {
        !self
            .columns
            .iter()
            .all(|c| matches!(c, Column::Streamed(_)))
    }

    /// A first pass, to feed with the partition's rows in order.
    pub(super) fn first_pass(&self) -> Result<FirstPass> {
        let accumulators = self
            .totals
            .iter()
            .map(|t| {
                let plain = t
                    .as_any()
                    .downcast_ref::<PlainAggregateWindowExpr>()
                    .ok_or_else(|| {
                        ExecError::Protocol("a whole-partition aggregate that slides".into())
                    })?;
                Ok((t.clone(), plain.get_aggregate_expr().create_accumulator()?))
            })
            .collect::<Result<_>>()?;
        Ok(FirstPass {
            count: 0,
            accumulators,
        })
    }

    /// The output columns of a run's batch (`inputs` input columns, then
    /// the runs' columns): the input columns, then each function's
    /// values, given what the first pass learned.
    pub(super) fn columns(
        &self,
        batch: &RecordBatch,
        inputs: usize,
        facts: Option<&Facts>,
    ) -> Result<Vec<ArrayRef>> {
        let n = batch.num_rows();
        let mut out: Vec<ArrayRef> = batch.columns()[..inputs].to_vec();
        let run = |i: usize| -> Result<&UInt64Array> {
            batch
                .column(inputs + i)
                .as_primitive_opt::<UInt64Type>()
                .ok_or_else(|| ExecError::Protocol("row_number or rank is not a UInt64".into()))
        };
        let facts = || facts.ok_or_else(|| ExecError::Protocol("no first pass".into()));
        for c in &self.columns {
            out.push(match c {
                Column::Streamed(i) => batch.column(inputs + i).clone(),
                Column::Total(i) => facts()?.totals[*i].to_array_of_size(n)?,
                Column::Ntile {
                    row_number,
                    buckets,
                    backward,
                } => {
                    let count = facts()?.count;
                    // The row's place from the first row, 0 on.
                    let place = |rn: u64| match backward {
                        true => count.saturating_sub(rn),
                        false => rn.saturating_sub(1),
                    };
                    Arc::new(UInt64Array::from_iter_values(
                        run(*row_number)?
                            .values()
                            .iter()
                            .map(|rn| ntile(place(*rn), count, *buckets)),
                    ))
                }
                Column::PercentRank { rank } => {
                    let denominator = (facts()?.count as f64 - 1.0).max(1.0);
                    Arc::new(Float64Array::from_iter_values(
                        run(*rank)?
                            .values()
                            .iter()
                            .map(|r| r.saturating_sub(1) as f64 / denominator),
                    ))
                }
                Column::CumeDist { rank } => {
                    // The rows up to the row's last peer: all but those
                    // after its peers, one fewer than its rank backwards.
                    let count = facts()?.count;
                    Arc::new(Float64Array::from_iter_values(
                        run(*rank)?
                            .values()
                            .iter()
                            .map(|r| (count + 1).saturating_sub(*r) as f64 / count.max(1) as f64),
                    ))
                }
            });
        }
        Ok(out)
    }
}

/// The bucket of row `i` (from 0) of `rows` in `ntile(n)`, as DataFusion
/// computes it: the first `rows % n` buckets hold one row more.
fn ntile(i: u64, rows: u64, n: u64) -> u64 {
    let base = rows / n;
    let remainder = rows % n;
    let large = base + 1;
    let large_rows = remainder * large;
    if i < large_rows {
        i / large + 1
    } else {
        remainder + (i - large_rows) / base.max(1) + 1
    }
}

impl FirstPass {
    /// The partition's next rows, in order.
    pub(super) fn update(&mut self, rows: &RecordBatch) -> Result<()> {
        self.count += rows.num_rows() as u64;
        for (expr, accumulator) in &mut self.accumulators {
            accumulator.update_batch(&expr.evaluate_args(rows)?)?;
        }
        Ok(())
    }

    pub(super) fn finish(self) -> Result<Facts> {
        Ok(Facts {
            count: self.count,
            totals: self
                .accumulators
                .into_iter()
                .map(|(_, mut a)| a.evaluate())
                .collect::<datafusion::common::Result<_>>()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ntile;

    #[test]
    fn ntile_buckets_as_postgres() {
        // ntile(4) over 10 rows: buckets of 3, 3, 2, 2.
        let b: Vec<u64> = (0..10).map(|i| ntile(i, 10, 4)).collect();
        assert_eq!(b, vec![1, 1, 1, 2, 2, 2, 3, 3, 4, 4]);
        // More buckets than rows: one row each.
        let b: Vec<u64> = (0..3).map(|i| ntile(i, 3, 5)).collect();
        assert_eq!(b, vec![1, 2, 3]);
    }
}

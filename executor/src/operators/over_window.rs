//! OverWindow: window functions over partitions (`lag`, `lead`,
//! `first_value`, `sum(x) OVER (…)`, `row_number()` without a filter on it,
//! any frame DataFusion supports), every input row going out with the
//! functions' values and kept current under inserts, updates and deletes.
//!
//! Input arrives hash-partitioned on `PARTITION BY`. Each partition keeps
//! its rows in `ORDER BY` order (see [`SortedPartitions`]). For every chunk
//! the operator evaluates each touched partition before and after applying
//! the chunk's changes and emits the difference: a new row can change its
//! neighbours' `lag`, a running sum, every row's `count(*) OVER ()`, so only
//! rows whose output actually changed go out (`-D` old, `+I` new).
//!
//! The functions run as DataFusion evaluates them in batch (its physical
//! `WindowExpr` on one sorted partition), so their meaning is DataFusion's,
//! frames and all. A change costs a pass over its partition: cheap for the
//! usual small partitions, linear for one huge one. State grows with the
//! input, as it must: any retraction can change any row's value.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::window::WindowExpr;
use datafusion::physical_planner::create_window_expr;
use planner::spec::OperatorSpec;
use storage::chunk::Chunk;
use storage::codec::RowCodec;
use storage::state::StateWrite;

use super::sorted_partitions::{SortedPartitions, diff};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{ExecError, Result, expr};

pub struct OverWindow {
    rows: SortedPartitions,
    functions: Vec<Arc<dyn WindowExpr>>,
    /// Arrow schema of the input rows a partition is decoded into.
    input_schema: SchemaRef,
    /// Encodes output rows (input columns, then one per function).
    output_codec: RowCodec,
    schema: SchemaRef,
}

impl OverWindow {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::OverWindow {
            partition_by,
            order_by,
            directions,
            functions,
            input_schema,
            state_table,
        } = spec
        else {
            return Err(ExecError::Protocol(
                "OverWindow built from another spec".into(),
            ));
        };
        let props = ExecutionProps::new();
        let ctx = PhysicalPlanningContext::default();
        let functions = functions
            .iter()
            .map(|f| Ok(create_window_expr(f, input_schema, &props, &ctx)?))
            .collect::<Result<Vec<_>>>()?;
        if output.fields().len() != input_schema.fields().len() + functions.len() {
            return Err(ExecError::Protocol(
                "OverWindow output is not its input plus one column per function".into(),
            ));
        }
        Ok(Self {
            rows: SortedPartitions::new(
                "OverWindow",
                None,
                partition_by,
                order_by,
                directions,
                input_schema,
                *state_table,
            )?,
            functions,
            input_schema: expr::output_schema(input_schema),
            output_codec: RowCodec::new(expr::types(output))?,
            schema: expr::output_schema(output),
        })
    }

    /// The partition's output rows, encoded, in the partition's order.
    fn evaluate(&mut self, partition: &[u8], key_group: u16) -> Result<Vec<Vec<u8>>> {
        let (n, mut columns) = self.rows.columns(partition, key_group)?;
        if n == 0 {
            return Ok(Vec::new());
        }
        let batch = expr::batch(&self.input_schema, columns.clone(), n)?;
        for f in &self.functions {
            let values: ArrayRef = f.evaluate(&batch)?;
            let t = self.schema.field(columns.len()).data_type();
            columns.push(if values.data_type() == t {
                values
            } else {
                planner::functions::numeric_special::cast_keeping_specials(&values, t)?
            });
        }
        Ok(self.output_codec.encode(&columns)?)
    }
}

impl Operator for OverWindow {
    fn name(&self) -> &'static str {
        "OverWindow"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.rows.state_table()]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        self.rows.restore(ctx)
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.rows.report());
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let keys = self.rows.keys(chunk.data())?;
        let touched = keys.touched();
        self.rows.load(&touched)?;
        let before = touched
            .iter()
            .map(|(p, kg)| self.evaluate(p, *kg))
            .collect::<Result<Vec<_>>>()?;
        self.rows.apply_chunk(&keys, &chunk)?;
        let mut changes = Vec::new();
        for ((p, key_group), old) in touched.into_iter().zip(before) {
            changes.extend(diff(old, self.evaluate(&p, key_group)?));
        }
        self.rows.settle()?;
        if changes.is_empty() {
            return Ok(());
        }
        let (n, ops): (usize, Vec<_>) =
            (changes.len(), changes.iter().map(|(op, _)| *op).collect());
        let columns = self
            .output_codec
            .decode(changes.iter().map(|(_, row)| row.as_slice()))?;
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        self.rows.checkpoint(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::functions_window::expr_fn::lag;
    use datafusion::logical_expr::expr::WindowFunction;
    use datafusion::logical_expr::{ExprFunctionExt, col};
    use datafusion::prelude::Expr;
    use storage::chunk::Op;

    const I: Op = Op::Insert;
    const D: Op = Op::Delete;

    fn over(functions: Vec<Expr>, names: &[&str]) -> OverWindow {
        let input = Arc::new(int_schema(&["a", "b"]));
        let mut all = vec!["a", "b"];
        all.extend_from_slice(names);
        let spec = OperatorSpec::OverWindow {
            partition_by: vec![col("a")],
            order_by: vec![col("b")],
            directions: vec![(false, false)],
            functions,
            input_schema: input,
            state_table: 7,
        };
        OverWindow::new(&spec, &int_schema(&all)).unwrap()
    }

    fn feed(w: &mut OverWindow, ops: &[Op], a: &[i64], b: &[i64]) -> Vec<String> {
        let a: Vec<Option<i64>> = a.iter().copied().map(Some).collect();
        let b: Vec<Option<i64>> = b.iter().copied().map(Some).collect();
        let (c, _) = chunk(ops, vec![ints(&a), ints(&b)]);
        let mut out = vec![];
        w.process_batch(0, c, &mut out).unwrap();
        pretty(&out)
    }

    fn lag_b() -> Expr {
        lag(col("b"), Some(1), None)
            .partition_by(vec![col("a")])
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap()
    }

    #[test]
    fn lag_follows_inserts_and_deletes_in_the_middle() {
        let mut w = over(vec![lag_b()], &["prev"]);
        assert_eq!(
            feed(&mut w, &[I, I, I], &[1, 1, 2], &[10, 30, 5]),
            vec!["+I 1 10 NULL", "+I 1 30 10", "+I 2 5 NULL"]
        );
        // 20 lands between 10 and 30: 30's previous row changes.
        assert_eq!(
            feed(&mut w, &[I], &[1], &[20]),
            vec!["-D 1 30 10", "+I 1 20 10", "+I 1 30 20"]
        );
        let mut writes = vec![];
        w.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut v = over(vec![lag_b()], &["prev"]);
        v.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(
            feed(&mut v, &[D], &[1], &[20]),
            vec!["-D 1 20 10", "-D 1 30 20", "+I 1 30 10"]
        );
    }

    #[test]
    fn running_sum_changes_only_the_rows_after_the_change() {
        let running = Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
            .partition_by(vec![col("a")])
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap();
        let mut w = over(vec![running], &["total"]);
        assert_eq!(
            feed(&mut w, &[I, I], &[1, 1], &[1, 2]),
            vec!["+I 1 1 1", "+I 1 2 3"]
        );
        assert_eq!(
            feed(&mut w, &[I], &[1], &[5]),
            vec!["+I 1 5 8"],
            "rows before 5 keep their sums"
        );
    }
}

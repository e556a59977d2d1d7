//! Project: evaluates the output columns on the whole batch; ops unchanged.
//! A row whose expressions fail is left out and its error counted
//! (`crate::errors`).

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use storage::chunk::Chunk;

use storage::state::StateWrite;

use crate::errors::{ErrorCollection, run_or_collect};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{Result, expr};

pub struct Project {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
    /// Where rows whose expressions fail are counted (`crate::errors`).
    errors: Option<ErrorCollection>,
}

impl Project {
    pub fn new(exprs: &[Expr], input_schema: &DFSchema, output: &DFSchema) -> Result<Self> {
        Ok(Self {
            exprs: expr::compile(exprs, input_schema)?,
            schema: expr::output_schema(output),
            errors: None,
        })
    }

    /// Counts the rows whose expressions fail in `table` instead of failing.
    pub fn collecting_errors(mut self, table: Option<u64>) -> Result<Self> {
        self.errors = table.map(ErrorCollection::new).transpose()?;
        Ok(self)
    }
}

impl Operator for Project {
    fn name(&self) -> &'static str {
        "Project"
    }

    fn tables(&self) -> Vec<u64> {
        ErrorCollection::tables(&self.errors)
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        ErrorCollection::start(&mut self.errors, ctx)
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let (exprs, schema) = (&self.exprs, &self.schema);
        let Some((chunk, data)) = run_or_collect(&chunk, self.errors.as_mut(), |c| {
            let columns = expr::evaluate(exprs, c.data())?;
            expr::batch(schema, columns, c.num_rows())
        })?
        else {
            return Ok(());
        };
        out.push(chunk.with_data(data));
        Ok(())
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        ErrorCollection::checkpoint_if_any(&mut self.errors, writes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, int_schema, ints, pretty};
    use datafusion::logical_expr::{col, lit};
    use storage::chunk::Op;

    #[test]
    fn computes_columns_and_keeps_ops() {
        let (c, input) = chunk(
            &[Op::UpdateDelete, Op::UpdateInsert],
            vec![ints(&[Some(1), Some(2)]), ints(&[Some(10), None])],
        );
        let output = int_schema(&["sum", "a"]);
        let mut p = Project::new(&[col("a") + col("b"), col("a")], &input, &output).unwrap();
        let mut out = vec![];
        p.process_batch(0, c, &mut out).unwrap();
        assert_eq!(pretty(&out), vec!["-U 11 1", "+U NULL 2"]);
        let _ = lit(1);
    }
}

//! Project: evaluates the output columns on the whole batch; ops unchanged.

use std::sync::Arc;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use storage::chunk::Chunk;

use crate::operator::{Collector, Operator};
use crate::{Result, expr};

pub struct Project {
    exprs: Vec<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
}

impl Project {
    pub fn new(exprs: &[Expr], input_schema: &DFSchema, output: &DFSchema) -> Result<Self> {
        Ok(Self {
            exprs: expr::compile(exprs, input_schema)?,
            schema: expr::output_schema(output),
        })
    }
}

impl Operator for Project {
    fn name(&self) -> &'static str {
        "Project"
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let columns = expr::evaluate(&self.exprs, chunk.data())?;
        let data = expr::batch(&self.schema, columns, chunk.num_rows())?;
        out.push(chunk.with_data(data));
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

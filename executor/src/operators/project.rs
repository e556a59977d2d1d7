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

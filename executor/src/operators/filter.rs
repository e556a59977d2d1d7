//! Filter: keeps the rows (of any op) whose predicate is true. A dropped
//! `-U` or `+U` is fine: every downstream operator acts on the sign alone.

use std::sync::Arc;

use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use storage::chunk::Chunk;

use crate::operator::{Collector, Operator};
use crate::{Result, expr};

pub struct Filter {
    predicate: Arc<dyn PhysicalExpr>,
}

impl Filter {
    pub fn new(predicate: &Expr, input_schema: &DFSchema) -> Result<Self> {
        let mut compiled = expr::compile(std::slice::from_ref(predicate), input_schema)?;
        Ok(Self {
            predicate: compiled.remove(0),
        })
    }
}

impl Operator for Filter {
    fn name(&self) -> &'static str {
        "Filter"
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let mask = expr::predicate_mask(&self.predicate, chunk.data())?;
        let kept = chunk.filter(&mask)?;
        if !kept.is_empty() {
            out.push(kept);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, ints};
    use datafusion::logical_expr::{col, lit};
    use storage::chunk::Op;

    #[test]
    fn keeps_matching_rows_with_their_ops() {
        let (c, schema) = chunk(
            &[Op::Insert, Op::Delete, Op::Insert],
            vec![ints(&[Some(1), Some(5), None])],
        );
        let mut f = Filter::new(&col("a").gt(lit(2i64)), &schema).unwrap();
        let mut out = vec![];
        f.process_batch(0, c, &mut out).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].num_rows(), 1);
        assert_eq!(out[0].op(0), Op::Delete);
    }
}

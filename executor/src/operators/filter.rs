//! Filter: keeps the rows (of any op) whose predicate is true. A dropped
//! `-U` or `+U` is fine: every downstream operator acts on the sign alone.
//! A row whose predicate fails is left out and its error counted
//! (`crate::errors`).

use std::sync::Arc;

use datafusion::common::DFSchema;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use storage::chunk::Chunk;

use storage::state::StateWrite;

use crate::errors::{ErrorCollection, run_or_collect};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{Result, expr};

pub struct Filter {
    predicate: Arc<dyn PhysicalExpr>,
    /// Where rows whose predicate fails are counted (`crate::errors`).
    errors: Option<ErrorCollection>,
}

impl Filter {
    pub fn new(predicate: &Expr, input_schema: &DFSchema) -> Result<Self> {
        let mut compiled = expr::compile(std::slice::from_ref(predicate), input_schema)?;
        Ok(Self {
            predicate: compiled.remove(0),
            errors: None,
        })
    }

    /// Counts the rows whose predicate fails in `table` instead of failing.
    pub fn collecting_errors(mut self, table: Option<u64>) -> Result<Self> {
        self.errors = table.map(ErrorCollection::new).transpose()?;
        Ok(self)
    }
}

impl Operator for Filter {
    fn name(&self) -> &'static str {
        "Filter"
    }

    fn tables(&self) -> Vec<u64> {
        ErrorCollection::tables(&self.errors)
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        ErrorCollection::start(&mut self.errors, ctx)
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let predicate = &self.predicate;
        let Some((chunk, mask)) = run_or_collect(&chunk, self.errors.as_mut(), |c| {
            expr::predicate_mask(predicate, c.data())
        })?
        else {
            return Ok(());
        };
        let kept = chunk.filter(&mask)?;
        if !kept.is_empty() {
            out.push(kept);
        }
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

//! ValuesSource: the head of a source task over constant rows — a view
//! over `VALUES`, or over a query without a table in `FROM` (`SELECT 1`,
//! `FROM generate_series(1, 10)`), whose one row of no columns is what the
//! rest of the plan computes from.
//!
//! The rows go out once, before the first barrier, as a table's backfill
//! does: a restart before the first completed checkpoint finds no mark and
//! sends them again, with the rest of the job's state equally empty. Every
//! checkpoint after that holds the mark, and what the rows made downstream,
//! so a restore sends nothing.

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::Expr;
use storage::chunk::Chunk;
use storage::state::StateWrite;

use crate::error::ExecError;
use crate::operator::OperatorContext;
use crate::{Result, expr};

const SENT_KEY: &[u8] = b"sent";

#[derive(Debug)]
pub struct ValuesSource {
    rows: usize,
    cells: Vec<Expr>,
    state_table: u64,
    schema: SchemaRef,
    /// The rows went out in an earlier run (restored) or in this one.
    sent: bool,
}

impl ValuesSource {
    pub fn new(rows: usize, cells: Vec<Expr>, state_table: u64, output: &DFSchema) -> Self {
        Self {
            rows,
            cells,
            state_table,
            schema: expr::output_schema(output),
            sent: false,
        }
    }

    /// Whether a completed checkpoint already holds the rows.
    pub fn restore(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.sent = ctx
            .state
            .scan(self.state_table, 0..1)?
            .iter()
            .any(|e| e.key == SENT_KEY);
        Ok(())
    }

    /// On a fresh start, the rows as inserts; afterwards nothing.
    pub fn backfill(&mut self) -> Result<Option<Chunk>> {
        if self.sent {
            return Ok(None);
        }
        self.sent = true;
        if self.rows == 0 {
            return Ok(None);
        }
        let width = self.schema.fields().len();
        if self.cells.len() != self.rows * width {
            return Err(ExecError::Protocol(format!(
                "{} values for {} rows of {width} columns",
                self.cells.len(),
                self.rows
            )));
        }
        let columns = (0..width)
            .map(|c| {
                let column = (0..self.rows).map(|r| match &self.cells[r * width + c] {
                    Expr::Literal(v, _) => Ok(v.clone()),
                    e => Err(ExecError::Protocol(format!(
                        "VALUES cell {e} is no literal"
                    ))),
                });
                let values = column.collect::<Result<Vec<ScalarValue>>>()?;
                let array = ScalarValue::iter_to_array(values)?;
                let field = self.schema.field(c);
                Ok(if array.data_type() == field.data_type() {
                    array
                } else {
                    planner::functions::numeric_special::cast_keeping_specials(
                        &array,
                        field.data_type(),
                    )?
                })
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        Ok(Some(Chunk::inserts(expr::batch(
            &self.schema,
            columns,
            self.rows,
        )?)))
    }

    /// The mark that the rows went out, as a state write.
    pub fn snapshot(&self, writes: &mut Vec<StateWrite>) {
        if self.sent {
            writes.push(StateWrite {
                table: self.state_table,
                key_group: 0,
                key: SENT_KEY.to_vec(),
                value: Some(Vec::new()),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx, int_schema};
    use datafusion::arrow::array::{Array, Int64Array};
    use datafusion::logical_expr::lit;
    use std::sync::Arc;

    #[test]
    fn rows_go_out_once_and_not_again_after_a_restore() {
        let schema = int_schema(&["a", "b"]);
        let cells = vec![
            lit(1i64),
            lit(10i64),
            lit(2i64),
            lit(ScalarValue::Int64(None)),
        ];
        let mut s = ValuesSource::new(2, cells.clone(), 5, &schema);
        s.restore(&ctx(Arc::new(MemState::default()))).unwrap();
        let chunk = s.backfill().unwrap().expect("rows on a fresh start");
        let b = chunk.data();
        let col = |i: usize| {
            b.column(i)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .clone()
        };
        assert_eq!(col(0).values(), &[1, 2]);
        assert_eq!(col(1).value(0), 10);
        assert!(col(1).is_null(1));
        assert!(s.backfill().unwrap().is_none(), "once");
        let mut writes = vec![];
        s.snapshot(&mut writes);
        let mut again = ValuesSource::new(2, cells, 5, &schema);
        again
            .restore(&ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))))
            .unwrap();
        assert!(
            again.backfill().unwrap().is_none(),
            "restored: already sent"
        );
    }

    #[test]
    fn a_query_without_a_table_is_one_row_of_no_columns() {
        let mut s = ValuesSource::new(1, vec![], 5, &DFSchema::empty());
        s.restore(&ctx(Arc::new(MemState::default()))).unwrap();
        let chunk = s.backfill().unwrap().unwrap();
        assert_eq!(chunk.num_rows(), 1);
        assert_eq!(chunk.data().num_columns(), 0);
    }
}

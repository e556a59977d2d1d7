//! Unnest: `unnest(array)` (and `generate_series(…)`, which the front end
//! writes as the unnest of an array) in a select list, as Flink's
//! `UNNEST` and RisingWave's ProjectSet. Each input row goes out once per
//! element of its arrays, with the same change op, so a row's delete
//! retracts exactly the rows its insert made: the arrays are a function of
//! the row. Several arrays go in lockstep, NULL past the end of the
//! shorter ones, as Postgres runs set-returning functions side by side.
//!
//! An update's two halves may expand to different numbers of rows, so they
//! go out as a delete and an insert.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, ListArray, UInt32Array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Field, SchemaRef};
use datafusion::common::DFSchema;
use planner::spec::UnnestNulls;
use storage::chunk::{Chunk, Op};

use crate::operator::{Collector, Operator};
use crate::{ExecError, Result, expr};

pub struct Unnest {
    lists: Vec<usize>,
    outputs: Vec<usize>,
    nulls: UnnestNulls,
    schema: SchemaRef,
}

impl Unnest {
    pub fn new(
        lists: &[usize],
        outputs: &[usize],
        nulls: UnnestNulls,
        output: &DFSchema,
    ) -> Result<Self> {
        let schema = expr::output_schema(output);
        if outputs.len() != schema.fields().len() {
            return Err(ExecError::Protocol(format!(
                "unnest with {} output columns for a schema of {}",
                outputs.len(),
                schema.fields().len()
            )));
        }
        Ok(Self {
            lists: lists.to_vec(),
            outputs: outputs.to_vec(),
            nulls,
            schema,
        })
    }

    /// How many rows an array gives.
    fn length(&self, list: &ListArray, row: usize) -> usize {
        match (list.is_valid(row), self.nulls) {
            (true, UnnestNulls::PreserveAndExpandEmpty) => list.value_length(row).max(1) as usize,
            (true, _) => list.value_length(row) as usize,
            (false, UnnestNulls::Drop) => 0,
            (false, _) => 1,
        }
    }
}

/// `array` as a `List` (a `LargeList` or `FixedSizeList` is cast).
fn as_list(array: &ArrayRef) -> Result<ListArray> {
    let list = match array.data_type() {
        DataType::List(_) => array.clone(),
        DataType::LargeList(f) | DataType::FixedSizeList(f, _) => cast(
            array,
            &DataType::List(Arc::new(Field::new_list_field(f.data_type().clone(), true))),
        )?,
        other => {
            return Err(ExecError::Protocol(format!(
                "unnest of a column of type {other}"
            )));
        }
    };
    Ok(list
        .as_any()
        .downcast_ref::<ListArray>()
        .expect("a List array")
        .clone())
}

impl Operator for Unnest {
    fn name(&self) -> &'static str {
        "Unnest"
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let data = chunk.data();
        let lists: Vec<ListArray> = self
            .lists
            .iter()
            .map(|i| as_list(data.column(*i)))
            .collect::<Result<_>>()?;
        // Per output row: the input row, and per array the element's index
        // in its values (none past its end).
        let mut rows: Vec<u32> = Vec::new();
        let mut ops: Vec<Op> = Vec::new();
        let mut elements: Vec<Vec<Option<u32>>> = vec![Vec::new(); lists.len()];
        for row in 0..chunk.num_rows() {
            let n = lists.iter().map(|l| self.length(l, row)).max().unwrap_or(1);
            let op = match chunk.op(row) {
                Op::UpdateDelete => Op::Delete,
                Op::UpdateInsert => Op::Insert,
                op => op,
            };
            for k in 0..n {
                rows.push(row as u32);
                ops.push(op);
                for (list, out) in lists.iter().zip(&mut elements) {
                    let present = list.is_valid(row) && k < list.value_length(row) as usize;
                    out.push(present.then(|| (list.value_offsets()[row] as usize + k) as u32));
                }
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
        let rows = UInt32Array::from(rows);
        let unnested: Vec<ArrayRef> = lists
            .iter()
            .zip(elements)
            .map(|(list, at)| take(list.values(), &UInt32Array::from(at), None))
            .collect::<std::result::Result<_, _>>()?;
        let mut columns = Vec::with_capacity(self.outputs.len());
        for (i, input) in self.outputs.iter().enumerate() {
            let column = match self.lists.iter().position(|l| l == input) {
                Some(l) => unnested[l].clone(),
                None => take(data.column(*input), &rows, None)?,
            };
            let t = self.schema.field(i).data_type();
            columns.push(if column.data_type() == t {
                column
            } else {
                cast(&column, t)?
            });
        }
        let n = rows.len();
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::pretty;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{Int64Type, Schema};

    #[test]
    fn arrays_in_lockstep_with_nulls_past_the_shorter() {
        let a = Int64Array::from(vec![1, 2, 3, 4]);
        let xs = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(10), Some(11)]),
            Some(vec![]),
            None,
            Some(vec![Some(40)]),
        ]);
        let ys = ListArray::from_iter_primitive::<Int64Type, _, _>(vec![
            Some(vec![Some(7)]),
            Some(vec![]),
            None,
            Some(vec![Some(8), Some(9), Some(10)]),
        ]);
        let input = RecordBatch::try_from_iter(vec![
            ("a", Arc::new(a) as ArrayRef),
            ("xs", Arc::new(xs) as ArrayRef),
            ("ys", Arc::new(ys) as ArrayRef),
        ])
        .unwrap();
        let output = DFSchema::try_from(Schema::new(vec![
            Field::new("a", DataType::Int64, true),
            Field::new("x", DataType::Int64, true),
            Field::new("y", DataType::Int64, true),
        ]))
        .unwrap();
        let chunk = Chunk::with_ops(
            &[Op::Insert, Op::Insert, Op::UpdateDelete, Op::UpdateInsert],
            input,
        );
        let run = |nulls| {
            let mut u = Unnest::new(&[1, 2], &[0, 1, 2], nulls, &output).unwrap();
            let mut out = vec![];
            u.process_batch(0, chunk.clone(), &mut out).unwrap();
            pretty(&out)
        };
        assert_eq!(
            run(UnnestNulls::Drop),
            vec![
                "+I 1 10 7",
                "+I 1 11 NULL",
                "+I 4 40 8",
                "+I 4 NULL 9",
                "+I 4 NULL 10"
            ]
        );
        assert_eq!(
            run(UnnestNulls::PreserveAndExpandEmpty),
            vec![
                "+I 1 10 7",
                "+I 1 11 NULL",
                "+I 2 NULL NULL",
                "-D 3 NULL NULL",
                "+I 4 40 8",
                "+I 4 NULL 9",
                "+I 4 NULL 10"
            ]
        );
    }
}

//! Expand: the front half of grouping sets (`GROUPING SETS`, `ROLLUP`,
//! `CUBE`), as Flink's and RisingWave's Expand. Each input row goes out once
//! per grouping set — its own columns, then the group expressions with
//! those the set leaves out as NULL, then the set's grouping id — so that
//! one HashAgg grouping on the last columns computes every set at once and
//! retracts through all of them.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, new_null_array};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use storage::chunk::Chunk;

use crate::operator::{Collector, Operator};
use crate::{Result, expr};

pub struct Expand {
    group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    sets: Vec<(Vec<bool>, u64)>,
    schema: SchemaRef,
}

impl Expand {
    pub fn new(
        group_exprs: &[Expr],
        sets: &[(Vec<bool>, u64)],
        input_schema: &DFSchema,
        output: &DFSchema,
    ) -> Result<Self> {
        Ok(Self {
            group_exprs: expr::compile(group_exprs, input_schema)?,
            sets: sets.to_vec(),
            schema: expr::output_schema(output),
        })
    }
}

impl Operator for Expand {
    fn name(&self) -> &'static str {
        "Expand"
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let n = chunk.num_rows();
        let data = chunk.data();
        let values = expr::evaluate(&self.group_exprs, data)?;
        let k = values.len();
        let id_type = self.schema.field(data.num_columns() + k).data_type();
        for (nulls, id) in &self.sets {
            let mut columns: Vec<ArrayRef> = data.columns().to_vec();
            for (i, (v, null)) in values.iter().zip(nulls).enumerate() {
                let t = self.schema.field(data.num_columns() + i).data_type();
                columns.push(if *null {
                    new_null_array(t, n)
                } else if v.data_type() == t {
                    v.clone()
                } else {
                    planner::functions::numeric_special::cast_keeping_specials(v, t)?
                });
            }
            columns.push(
                ScalarValue::UInt64(Some(*id))
                    .cast_to(id_type)?
                    .to_array_of_size(n)?,
            );
            out.push(chunk.with_data(expr::batch(&self.schema, columns, n)?));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, ints, pretty};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::logical_expr::col;
    use storage::chunk::Op;

    #[test]
    fn one_row_per_set_with_left_out_columns_null() {
        let (c, input) = chunk(
            &[Op::Delete],
            vec![ints(&[Some(1)]), ints(&[Some(2)]), ints(&[Some(3)])],
        );
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        fields.push(Field::new("g0", DataType::Int64, true));
        fields.push(Field::new("g1", DataType::Int64, true));
        fields.push(Field::new("id", DataType::UInt8, false));
        let output = DFSchema::try_from(Schema::new(fields)).unwrap();
        // ROLLUP(a, b): (a, b), (a), ().
        let sets = vec![
            (vec![false, false], 0),
            (vec![false, true], 1),
            (vec![true, true], 3),
        ];
        let mut e = Expand::new(&[col("a"), col("b")], &sets, &input, &output).unwrap();
        let mut out = vec![];
        e.process_batch(0, c, &mut out).unwrap();
        assert_eq!(
            pretty(&out),
            vec![
                "-D 1 2 3 1 2 0",
                "-D 1 2 3 1 NULL 1",
                "-D 1 2 3 NULL NULL 3"
            ]
        );
    }
}

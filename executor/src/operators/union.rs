//! Union: `UNION ALL` of any number of inputs. Stateless: every change of
//! every input passes through with its op, under the union's column names.
//! (`UNION`, `INTERSECT` and `EXCEPT` are planned as this followed by a
//! grouping, or as semi and anti joins.)

use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use storage::chunk::Chunk;

use crate::operator::{Collector, Operator};
use crate::{Result, expr};

pub struct Union {
    schema: SchemaRef,
}

impl Union {
    pub fn new(output: &DFSchema) -> Self {
        Self {
            schema: expr::output_schema(output),
        }
    }
}

impl Operator for Union {
    fn name(&self) -> &'static str {
        "Union"
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let n = chunk.num_rows();
        // Inputs may differ in type where the union widened them (an int
        // column and a count, say); the output has the union's types.
        let columns = chunk
            .data()
            .columns()
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| {
                if c.data_type() == f.data_type() {
                    Ok(c.clone())
                } else {
                    Ok(cast(c, f.data_type())?)
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let data = expr::batch(&self.schema, columns, n)?;
        out.push(chunk.with_data(data));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, int_schema, ints, pretty};
    use storage::chunk::Op;

    #[test]
    fn passes_every_input_through_under_its_own_names() {
        let mut u = Union::new(&int_schema(&["x"]));
        let mut out = vec![];
        let (a, _) = chunk(&[Op::Insert], vec![ints(&[Some(1)])]);
        let (b, _) = chunk(&[Op::Delete], vec![ints(&[Some(2)])]);
        u.process_batch(0, a, &mut out).unwrap();
        u.process_batch(2, b, &mut out).unwrap();
        assert_eq!(pretty(&out), vec!["+I 1", "-D 2"]);
        assert!(out.iter().all(|c| c.schema().field(0).name() == "x"));
    }
}

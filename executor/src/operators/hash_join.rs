//! HashJoin: inner equi-join of two changelogs.
//!
//! Both inputs arrive hash-partitioned on their join keys. Each side keeps
//! its rows as a multiset per join key. A change on one side is first applied
//! to that side's state, then joined with the other side's current rows and
//! emitted with the change's sign: Δ(L ⋈ R) = ΔL ⋈ R + L' ⋈ ΔR, one input
//! at a time. Rows with a NULL key never match (unless the plan asks for
//! NULL-safe equality) and are not stored.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray};
use datafusion::arrow::compute::{cast, prep_null_mask_filter};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::logical_expr::ExprSchemable;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::OperatorSpec;
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{ExecError, Result, expr};

type Side = HashMap<Vec<u8>, HashMap<Vec<u8>, i64>>;

pub struct HashJoin {
    keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    key_types: Vec<DataType>,
    key_codec: RowCodec,
    row_codecs: [RowCodec; 2],
    filter: Option<Arc<dyn PhysicalExpr>>,
    schema: SchemaRef,
    null_equals_null: bool,
    state_table: u64,
    sides: [Side; 2],
    /// (side, key, row) changed since the last barrier → key group.
    dirty: HashMap<(u8, Vec<u8>, Vec<u8>), u16>,
}

fn types(schema: &DFSchema) -> Vec<DataType> {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect()
}

/// State key: side, key length, key, row.
fn state_key(side: u8, key: &[u8], row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(5 + key.len() + row.len());
    k.push(side);
    k.extend_from_slice(&(key.len() as u32).to_be_bytes());
    k.extend_from_slice(key);
    k.extend_from_slice(row);
    k
}

fn split_state_key(k: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let side = *k.first()?;
    let len = u32::from_be_bytes(k.get(1..5)?.try_into().ok()?) as usize;
    let key = k.get(5..5 + len)?;
    Some((side, key, &k[5 + len..]))
}

impl HashJoin {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::HashJoin {
            left_keys,
            right_keys,
            filter,
            left_schema,
            right_schema,
            null_equals_null,
            state_table,
        } = spec
        else {
            return Err(ExecError::Protocol(
                "HashJoin built from another spec".into(),
            ));
        };
        let left = expr::compile(left_keys, left_schema)?;
        let right = expr::compile(right_keys, right_schema)?;
        let key_types: Vec<DataType> = left_keys
            .iter()
            .map(|e| Ok(e.get_type(left_schema.as_ref())?))
            .collect::<Result<_>>()?;
        let filter = match filter {
            Some(f) => Some(expr::compile(std::slice::from_ref(f), output)?.remove(0)),
            None => None,
        };
        Ok(Self {
            keys: [left, right],
            key_codec: RowCodec::new(key_types.clone())?,
            key_types,
            row_codecs: [
                RowCodec::new(types(left_schema))?,
                RowCodec::new(types(right_schema))?,
            ],
            filter,
            schema: expr::output_schema(output),
            null_equals_null: *null_equals_null,
            state_table: *state_table,
            sides: [HashMap::new(), HashMap::new()],
            dirty: HashMap::new(),
        })
    }
}

impl Operator for HashJoin {
    fn name(&self) -> &'static str {
        "HashJoin"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.state_table]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            let (side, key, row) = split_state_key(&e.key)
                .ok_or_else(|| storage::StorageError::Corrupt("join state key".into()))?;
            let count = i64::from_be_bytes(
                e.value
                    .as_slice()
                    .try_into()
                    .map_err(|_| storage::StorageError::Corrupt("join count".into()))?,
            );
            let side = self
                .sides
                .get_mut(side as usize)
                .ok_or_else(|| storage::StorageError::Corrupt("side".into()))?;
            side.entry(key.to_vec())
                .or_default()
                .insert(row.to_vec(), count);
        }
        Ok(())
    }

    fn process_batch(&mut self, input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let side = input.min(1);
        let other = 1 - side;
        let n = chunk.num_rows();
        let data = chunk.data();
        let mut keys = expr::evaluate(&self.keys[side], data)?;
        for (k, t) in keys.iter_mut().zip(&self.key_types) {
            if k.data_type() != t {
                *k = cast(k, t)?;
            }
        }
        let key_groups = expr::key_groups(&keys, n)?;
        let key_bytes = self.key_codec.encode(&keys)?;
        let rows = self.row_codecs[side].encode(data.columns())?;

        let mut matched: Vec<(Op, Vec<u8>, Vec<u8>)> = Vec::new();
        for r in 0..n {
            if !self.null_equals_null && keys.iter().any(|k| k.is_null(r)) {
                continue;
            }
            let sign = chunk.op(r).sign();
            let key = &key_bytes[r];
            let mine = self.sides[side].entry(key.clone()).or_default();
            let count = mine.entry(rows[r].clone()).or_insert(0);
            *count += sign;
            if *count <= 0 {
                if *count < 0 {
                    tracing::error!(
                        state_table = self.state_table,
                        "join row retracted below zero"
                    );
                }
                mine.remove(&rows[r]);
                if mine.is_empty() {
                    self.sides[side].remove(key);
                }
            }
            self.dirty
                .insert((side as u8, key.clone(), rows[r].clone()), key_groups[r]);
            let op = if sign > 0 { Op::Insert } else { Op::Delete };
            if let Some(theirs) = self.sides[other].get(key) {
                for (their_row, their_count) in theirs {
                    for _ in 0..*their_count {
                        let (l, rr) = if side == 0 {
                            (rows[r].clone(), their_row.clone())
                        } else {
                            (their_row.clone(), rows[r].clone())
                        };
                        matched.push((op, l, rr));
                    }
                }
            }
        }
        if matched.is_empty() {
            return Ok(());
        }
        let mut columns: Vec<ArrayRef> =
            self.row_codecs[0].decode(matched.iter().map(|m| m.1.as_slice()))?;
        columns.extend(self.row_codecs[1].decode(matched.iter().map(|m| m.2.as_slice()))?);
        let ops: Vec<Op> = matched.iter().map(|m| m.0).collect();
        let joined = Chunk::with_ops(&ops, expr::batch(&self.schema, columns, matched.len())?);
        let joined = match &self.filter {
            None => joined,
            Some(f) => {
                let mask = f.evaluate(joined.data())?.into_array(joined.num_rows())?;
                let mask = mask
                    .as_any()
                    .downcast_ref::<BooleanArray>()
                    .ok_or_else(|| ExecError::Protocol("join filter is not boolean".into()))?;
                joined.filter(&prep_null_mask_filter(mask))?
            }
        };
        if !joined.is_empty() {
            out.push(joined);
        }
        Ok(())
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        for ((side, key, row), key_group) in self.dirty.drain() {
            let count = self.sides[side as usize]
                .get(&key)
                .and_then(|m| m.get(&row))
                .copied();
            writes.push(StateWrite {
                table: self.state_table,
                key_group,
                key: state_key(side, &key, &row),
                value: count.map(|c| c.to_be_bytes().to_vec()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::common::Column;
    use datafusion::logical_expr::Expr;
    use std::sync::Arc;

    fn join() -> HashJoin {
        let left = Arc::new(int_schema(&["a", "b"]));
        let right = Arc::new(int_schema(&["c", "d"]));
        let out = int_schema(&["a", "b", "c", "d"]);
        let spec = OperatorSpec::HashJoin {
            left_keys: vec![Expr::Column(Column::from_name("a"))],
            right_keys: vec![Expr::Column(Column::from_name("c"))],
            filter: None,
            left_schema: left,
            right_schema: right,
            null_equals_null: false,
            state_table: 5,
        };
        HashJoin::new(&spec, &out).unwrap()
    }

    fn feed(
        j: &mut HashJoin,
        side: usize,
        ops: &[Op],
        x: &[Option<i64>],
        y: &[Option<i64>],
    ) -> Vec<String> {
        let (c, _) = chunk(ops, vec![ints(x), ints(y)]);
        let mut out = vec![];
        j.process_batch(side, c, &mut out).unwrap();
        pretty(&out)
    }

    #[test]
    fn joins_and_retracts() {
        let mut j = join();
        assert!(
            feed(
                &mut j,
                0,
                &[Op::Insert, Op::Insert],
                &[Some(1), None],
                &[Some(10), Some(11)]
            )
            .is_empty()
        );
        assert_eq!(
            feed(
                &mut j,
                1,
                &[Op::Insert, Op::Insert],
                &[Some(1), None],
                &[Some(7), Some(8)]
            ),
            vec!["+I 1 10 1 7"]
        );
        assert_eq!(
            feed(&mut j, 0, &[Op::Insert], &[Some(1)], &[Some(12)]),
            vec!["+I 1 12 1 7"]
        );
        assert_eq!(
            feed(
                &mut j,
                1,
                &[Op::UpdateDelete, Op::UpdateInsert],
                &[Some(1), Some(1)],
                &[Some(7), Some(9)]
            )
            .len(),
            4
        );
        let mut writes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut k = join();
        k.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        let mut got = feed(&mut k, 1, &[Op::Delete], &[Some(1)], &[Some(9)]);
        got.sort();
        assert_eq!(got, vec!["-D 1 10 1 9", "-D 1 12 1 9"]);
    }
}

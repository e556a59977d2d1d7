//! TopN: the rows ranked `offset + 1 ..= offset + limit` of each
//! partition, kept up to date under inserts, updates and deletes
//! (`ORDER BY … LIMIT` in a view, `ROW_NUMBER() … <= n` per group, `= 1`
//! for deduplication).
//!
//! Input arrives hash-partitioned on the partition keys (or all in one
//! subtask). Each partition keeps its rows as an ordered multiset keyed by
//! (sort key, row), the sort key encoded so that bytes compare as the
//! `ORDER BY` does. For every chunk the operator notes the top range of each
//! partition it touches, applies the changes, and emits the difference:
//! `-D` for rows that left the range, `+I` for rows that entered it — and,
//! with `ROW_NUMBER()` in the output, for rows whose number changed.
//!
//! A retracted row may bring a row from below the range back up, so every
//! row is kept — unless the input is append-only, when nothing is ever
//! retracted and rows below the range are forgotten (bounded state).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::logical_expr::ExprSchemable;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::{OperatorSpec, RankKind};
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{ExecError, Result, expr};

/// (sort key, row) → copies.
type Ranked = BTreeMap<(Vec<u8>, Vec<u8>), i64>;

/// (partition, sort key, row): one stored entry.
type EntryKey = (Vec<u8>, Vec<u8>, Vec<u8>);

/// A partition's rows in the top range, with their row numbers.
type Top = Vec<(Vec<u8>, i64)>;

pub struct TopN {
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    partition_types: Vec<DataType>,
    partition_codec: RowCodec,
    order_by: Vec<Arc<dyn PhysicalExpr>>,
    sort_codec: RowCodec,
    row_codec: RowCodec,
    limit: usize,
    offset: usize,
    row_number: bool,
    rank: RankKind,
    append_only_input: bool,
    schema: SchemaRef,
    state_table: u64,
    partitions: HashMap<Vec<u8>, Ranked>,
    /// (partition, sort key, row) changed since the last barrier → key group.
    dirty: HashMap<EntryKey, u16>,
}

/// State key: partition length, partition, sort key length, sort key, row.
fn state_key(partition: &[u8], sort: &[u8], row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + partition.len() + sort.len() + row.len());
    k.extend_from_slice(&(partition.len() as u32).to_be_bytes());
    k.extend_from_slice(partition);
    k.extend_from_slice(&(sort.len() as u32).to_be_bytes());
    k.extend_from_slice(sort);
    k.extend_from_slice(row);
    k
}

fn split_state_key(k: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let len = |at: usize| -> Option<usize> {
        Some(u32::from_be_bytes(k.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let p = len(0)?;
    let partition = k.get(4..4 + p)?;
    let s = len(4 + p)?;
    let sort = k.get(8 + p..8 + p + s)?;
    Some((partition, sort, k.get(8 + p + s..)?))
}

impl TopN {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::TopN {
            partition_by,
            order_by,
            directions,
            limit,
            offset,
            row_number,
            rank,
            append_only_input,
            input_schema,
            state_table,
        } = spec
        else {
            return Err(ExecError::Protocol("TopN built from another spec".into()));
        };
        let partition_types: Vec<DataType> = partition_by
            .iter()
            .map(|e| Ok(e.get_type(input_schema.as_ref())?))
            .collect::<Result<_>>()?;
        let sort_fields = order_by
            .iter()
            .zip(directions)
            .map(|(e, (desc, nulls_first))| {
                Ok((e.get_type(input_schema.as_ref())?, *desc, *nulls_first))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            partition_by: expr::compile(partition_by, input_schema)?,
            partition_codec: RowCodec::new(partition_types.clone())?,
            partition_types,
            order_by: expr::compile(order_by, input_schema)?,
            sort_codec: RowCodec::sorted(sort_fields)?,
            row_codec: RowCodec::new(expr::types(input_schema))?,
            limit: *limit,
            offset: *offset,
            row_number: *row_number,
            rank: *rank,
            // Rows below the range can come back into it through ties under
            // RANK and DENSE_RANK; only positions are safe to cut.
            append_only_input: *append_only_input && *rank == RankKind::RowNumber,
            schema: expr::output_schema(output),
            state_table: *state_table,
            partitions: HashMap::new(),
            dirty: HashMap::new(),
        })
    }

    /// The partition's rows numbered within the range, with their numbers.
    fn top(&self, partition: &[u8]) -> Top {
        let Some(ranked) = self.partitions.get(partition) else {
            return Vec::new();
        };
        let (lo, hi) = (self.offset as i64 + 1, (self.offset + self.limit) as i64);
        let mut out = Vec::new();
        let mut position = 0i64;
        let mut distinct = 0i64;
        let mut number = 0i64;
        let mut previous: Option<&Vec<u8>> = None;
        for ((sort, row), copies) in ranked {
            let new_key = previous != Some(sort);
            if new_key {
                distinct += 1;
            }
            for _ in 0..(*copies).max(0) {
                position += 1;
                number = match self.rank {
                    RankKind::RowNumber => position,
                    RankKind::Rank if new_key && previous != Some(sort) => position,
                    RankKind::Rank => number,
                    RankKind::DenseRank => distinct,
                };
                previous = Some(sort);
                if number > hi {
                    return out;
                }
                if number >= lo {
                    out.push((row.clone(), number));
                }
            }
        }
        out
    }

    /// Append-only input: rows below the range can never come back up, so
    /// they are forgotten. `key_group` is the partition's.
    fn forget_below_top(&mut self, partition: &[u8], key_group: u16) {
        let keep = (self.offset + self.limit) as i64;
        let Some(ranked) = self.partitions.get_mut(partition) else {
            return;
        };
        let mut seen = 0i64;
        let mut forgotten = Vec::new();
        for (key, copies) in ranked.iter_mut() {
            let room = (keep - seen).max(0);
            if *copies > room {
                *copies = room;
                forgotten.push(key.clone());
            }
            seen += *copies;
        }
        ranked.retain(|_, copies| *copies > 0);
        for (sort, row) in forgotten {
            self.dirty
                .insert((partition.to_vec(), sort, row), key_group);
        }
    }

    fn emit(&self, rows: Vec<(Op, Vec<u8>, i64)>, out: &mut Collector) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        let mut columns: Vec<ArrayRef> = self
            .row_codec
            .decode(rows.iter().map(|(_, r, _)| r.as_slice()))?;
        if self.row_number {
            let numbers: ArrayRef = Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, _, n)| *n),
            ));
            let t = self.schema.field(columns.len()).data_type();
            columns.push(if t == &DataType::Int64 {
                numbers
            } else {
                cast(&numbers, t)?
            });
        }
        let ops: Vec<Op> = rows.iter().map(|(op, _, _)| *op).collect();
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }
}

/// What changed between two top ranges: rows (with their numbers, when
/// shown) that left, then rows that entered.
fn diff(before: Top, after: Top, numbered: bool) -> Vec<(Op, Vec<u8>, i64)> {
    let key = |(row, n): &(Vec<u8>, i64)| (row.clone(), if numbered { *n } else { 0 });
    let mut counts: BTreeMap<(Vec<u8>, i64), i64> = BTreeMap::new();
    for r in &before {
        *counts.entry(key(r)).or_default() -= 1;
    }
    for r in &after {
        *counts.entry(key(r)).or_default() += 1;
    }
    let mut out = Vec::new();
    for ((row, n), c) in &counts {
        for _ in 0..(-c).max(0) {
            out.push((Op::Delete, row.clone(), *n));
        }
    }
    for ((row, n), c) in counts {
        for _ in 0..c.max(0) {
            out.push((Op::Insert, row.clone(), n));
        }
    }
    out
}

impl Operator for TopN {
    fn name(&self) -> &'static str {
        "TopN"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.state_table]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            let (partition, sort, row) = split_state_key(&e.key)
                .ok_or_else(|| storage::StorageError::Corrupt("top-n state key".into()))?;
            let copies = i64::from_be_bytes(
                e.value
                    .as_slice()
                    .try_into()
                    .map_err(|_| storage::StorageError::Corrupt("top-n count".into()))?,
            );
            self.partitions
                .entry(partition.to_vec())
                .or_default()
                .insert((sort.to_vec(), row.to_vec()), copies);
        }
        Ok(())
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let n = chunk.num_rows();
        let data = chunk.data();
        let mut partition_keys = expr::evaluate(&self.partition_by, data)?;
        for (k, t) in partition_keys.iter_mut().zip(&self.partition_types) {
            if k.data_type() != t {
                *k = cast(k, t)?;
            }
        }
        let key_groups = expr::key_groups(&partition_keys, n)?;
        let partitions = if self.partition_by.is_empty() {
            vec![Vec::new(); n]
        } else {
            self.partition_codec.encode(&partition_keys)?
        };
        let sort_keys = self
            .sort_codec
            .encode(&expr::evaluate(&self.order_by, data)?)?;
        let rows = self.row_codec.encode(data.columns())?;

        // Each touched partition's top range before the chunk, and its key
        // group.
        let mut before: Vec<(Vec<u8>, u16, Top)> = Vec::new();
        let mut touched: HashSet<&[u8]> = HashSet::new();
        for r in 0..n {
            let p = &partitions[r];
            if touched.insert(p.as_slice()) {
                before.push((p.clone(), key_groups[r], self.top(p)));
            }
            let ranked = self.partitions.entry(p.clone()).or_default();
            let key = (sort_keys[r].clone(), rows[r].clone());
            let copies = ranked.entry(key.clone()).or_insert(0);
            *copies += chunk.op(r).sign();
            if *copies <= 0 {
                if *copies < 0 {
                    tracing::error!(
                        state_table = self.state_table,
                        "top-n row retracted below zero"
                    );
                }
                ranked.remove(&key);
            }
            self.dirty.insert((p.clone(), key.0, key.1), key_groups[r]);
        }
        let mut changes = Vec::new();
        for (p, key_group, old) in before {
            if self.append_only_input {
                self.forget_below_top(&p, key_group);
            }
            let new = self.top(&p);
            changes.extend(diff(old, new, self.row_number));
            if self.partitions.get(&p).is_some_and(|r| r.is_empty()) {
                self.partitions.remove(&p);
            }
        }
        self.emit(changes, out)
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        for ((partition, sort, row), key_group) in self.dirty.drain() {
            let copies = self
                .partitions
                .get(&partition)
                .and_then(|r| r.get(&(sort.clone(), row.clone())))
                .copied();
            writes.push(StateWrite {
                table: self.state_table,
                key_group,
                key: state_key(&partition, &sort, &row),
                value: copies.map(|c| c.to_be_bytes().to_vec()),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::logical_expr::col;

    fn top_n(limit: usize, offset: usize, row_number: bool, append_only: bool) -> TopN {
        let input = Arc::new(int_schema(&["a", "b"]));
        let output = if row_number {
            int_schema(&["a", "b", "rn"])
        } else {
            int_schema(&["a", "b"])
        };
        let spec = OperatorSpec::TopN {
            partition_by: vec![col("a")],
            order_by: vec![col("b")],
            directions: vec![(true, false)],
            limit,
            offset,
            row_number,
            rank: RankKind::RowNumber,
            append_only_input: append_only,
            input_schema: input,
            state_table: 9,
        };
        TopN::new(&spec, &output).unwrap()
    }

    fn feed(t: &mut TopN, ops: &[Op], a: &[i64], b: &[i64]) -> Vec<String> {
        let a: Vec<Option<i64>> = a.iter().copied().map(Some).collect();
        let b: Vec<Option<i64>> = b.iter().copied().map(Some).collect();
        let (c, _) = chunk(ops, vec![ints(&a), ints(&b)]);
        let mut out = vec![];
        t.process_batch(0, c, &mut out).unwrap();
        pretty(&out)
    }

    const I: Op = Op::Insert;
    const D: Op = Op::Delete;

    #[test]
    fn keeps_the_top_two_per_partition_and_promotes_on_delete() {
        let mut t = top_n(2, 0, false, false);
        assert_eq!(
            feed(&mut t, &[I, I, I, I], &[1, 1, 1, 2], &[5, 9, 7, 1]),
            vec!["+I 1 7", "+I 1 9", "+I 2 1"]
        );
        // 9 leaves; 5 comes back up from below the top.
        assert_eq!(feed(&mut t, &[D], &[1], &[9]), vec!["-D 1 9", "+I 1 5"]);
        let mut writes = vec![];
        t.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut u = top_n(2, 0, false, false);
        u.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(feed(&mut u, &[I], &[1], &[8]), vec!["-D 1 5", "+I 1 8"]);
    }

    #[test]
    fn row_numbers_move_with_the_rows_above() {
        let mut t = top_n(3, 0, true, false);
        assert_eq!(
            feed(&mut t, &[I, I], &[1, 1], &[5, 3]),
            vec!["+I 1 3 2", "+I 1 5 1"]
        );
        // A new first row renumbers the others.
        assert_eq!(
            feed(&mut t, &[I], &[1], &[9]),
            vec!["-D 1 3 2", "-D 1 5 1", "+I 1 3 3", "+I 1 5 2", "+I 1 9 1"]
        );
    }

    #[test]
    fn append_only_input_forgets_rows_below_the_top() {
        let mut t = top_n(1, 1, false, true);
        assert_eq!(
            feed(&mut t, &[I, I, I], &[1, 1, 1], &[5, 9, 7]),
            vec!["+I 1 7"]
        );
        assert_eq!(
            t.partitions[&t.partition_codec.encode(&[ints(&[Some(1)])]).unwrap()[0]].len(),
            2
        );
    }
}

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
//! Kept rows need not be in memory: a partition is paged (see
//! `sorted_partitions`), and the range is read from its first pages.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use planner::spec::{OperatorSpec, RankKind};
use storage::chunk::{Chunk, Op};
use storage::state::StateWrite;

use super::sorted_partitions::{SortedPartitions, diff, split_entry};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{ExecError, Result, expr};

/// A partition's rows in the top range, with their row numbers.
type Top = Vec<(Vec<u8>, i64)>;

pub struct TopN {
    rows: SortedPartitions,
    limit: usize,
    offset: usize,
    row_number: bool,
    rank: RankKind,
    append_only_input: bool,
    schema: SchemaRef,
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
        Ok(Self {
            rows: SortedPartitions::new(
                "TopN",
                // Twice the range, so that a few deletions from it do
                // not send it to the store for the next page.
                Some((2 * (offset + limit)).clamp(64, 4096)),
                partition_by,
                order_by,
                directions,
                input_schema,
                *state_table,
            )?,
            limit: *limit,
            offset: *offset,
            row_number: *row_number,
            rank: *rank,
            // Rows below the range can come back into it through ties under
            // RANK and DENSE_RANK; only positions are safe to cut.
            append_only_input: *append_only_input && *rank == RankKind::RowNumber,
            schema: expr::output_schema(output),
        })
    }

    /// The partition's rows numbered within the range, with their numbers.
    fn top(&mut self, partition: &[u8], key_group: u16) -> Result<Top> {
        let range = (self.offset as i64 + 1, (self.offset + self.limit) as i64);
        let rank = self.rank;
        loop {
            let Some(ranked) = self.rows.get(partition, key_group)? else {
                return Ok(Vec::new());
            };
            let (top, past) = Self::top_of(ranked, range, rank);
            if past || !ranked.is_partial() {
                return Ok(top);
            }
            // The known rows end within the range: read on.
            self.rows.read_more(partition, key_group)?;
        }
    }

    /// The known rows numbered within the range, and whether a row past
    /// the range was reached.
    fn top_of(
        ranked: &super::sorted_partitions::Ranked,
        (lo, hi): (i64, i64),
        rank: RankKind,
    ) -> (Top, bool) {
        let mut out = Vec::new();
        let mut position = 0i64;
        let mut distinct = 0i64;
        let mut number = 0i64;
        let mut previous: Option<&[u8]> = None;
        for (entry, copies) in ranked.iter() {
            let (sort, row) = split_entry(entry);
            let new_key = previous != Some(sort);
            if new_key {
                distinct += 1;
            }
            for _ in 0..(*copies).max(0) {
                position += 1;
                number = match rank {
                    RankKind::RowNumber => position,
                    RankKind::Rank if new_key && previous != Some(sort) => position,
                    RankKind::Rank => number,
                    RankKind::DenseRank => distinct,
                };
                previous = Some(sort);
                if number > hi {
                    return (out, true);
                }
                if number >= lo {
                    out.push((row.to_vec(), number));
                }
            }
        }
        (out, false)
    }

    fn emit(&self, rows: Vec<(Op, (Vec<u8>, i64))>, out: &mut Collector) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        let mut columns: Vec<ArrayRef> = self
            .rows
            .row_codec
            .decode(rows.iter().map(|(_, (r, _))| r.as_slice()))?;
        if self.row_number {
            let numbers: ArrayRef = Arc::new(Int64Array::from_iter_values(
                rows.iter().map(|(_, (_, n))| *n),
            ));
            let t = self.schema.field(columns.len()).data_type();
            columns.push(if t == &DataType::Int64 {
                numbers
            } else {
                cast(&numbers, t)?
            });
        }
        let ops: Vec<Op> = rows.iter().map(|(op, _)| *op).collect();
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }

    /// The top range as diffable keys: a row's number counts only when it
    /// is shown.
    fn shown(&self, top: Top) -> impl Iterator<Item = (Vec<u8>, i64)> + use<> {
        let numbered = self.row_number;
        top.into_iter()
            .map(move |(row, n)| (row, if numbered { n } else { 0 }))
    }
}

impl Operator for TopN {
    fn name(&self) -> &'static str {
        "TopN"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.rows.state_table()]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        self.rows.restore(ctx)
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.rows.report());
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let keys = self.rows.keys(chunk.data())?;
        // Each touched partition's top range before the chunk.
        let touched = keys.touched();
        self.rows.load(&touched)?;
        let before = touched
            .iter()
            .map(|(p, kg)| self.top(p, *kg))
            .collect::<Result<Vec<Top>>>()?;
        self.rows.apply_chunk(&keys, &chunk)?;
        let mut changes = Vec::new();
        for ((p, key_group), old) in touched.into_iter().zip(before) {
            if self.append_only_input {
                // Rows below the range can never come back up.
                self.rows
                    .truncate(&p, key_group, (self.offset + self.limit) as i64)?;
            }
            let new = self.top(&p, key_group)?;
            changes.extend(diff(self.shown(old), self.shown(new)));
        }
        self.rows.settle()?;
        self.emit(changes, out)
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        self.rows.checkpoint(writes)
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

    /// The top range by a separate recomputation: `b` descending, then
    /// the row (all of whose `a` are 1), numbered.
    fn expected_top(
        rows: &std::collections::BTreeMap<i64, i64>,
        offset: usize,
        limit: usize,
    ) -> Vec<String> {
        let mut out: Vec<String> = rows
            .iter()
            .rev()
            .flat_map(|(b, n)| std::iter::repeat_n(*b, *n as usize))
            .enumerate()
            .skip(offset)
            .take(limit)
            .map(|(i, b)| format!("1 {b} {}", i + 1))
            .collect();
        out.sort();
        out
    }

    #[test]
    fn one_partition_far_past_memory_keeps_a_page_and_the_right_top() {
        use crate::state::StateStore;
        use storage::memory::MemoryPool;
        let state = Arc::new(MemState::default());
        let pool = Arc::new(MemoryPool::new(64 << 10));
        let start = |restored: bool| {
            let mut t = top_n(5, 2, true, false);
            t.on_start(&rocksdb_ctx(state.clone(), &pool, restored), &mut vec![])
                .unwrap();
            t
        };
        let mut t = start(false);
        let mut rows = std::collections::BTreeMap::<i64, i64>::new();
        let mut shown = std::collections::BTreeMap::<String, i64>::new();
        let mut next = random_below(7u64);
        for step in 0..300 {
            let (mut ops, mut bs) = (vec![], vec![]);
            for _ in 0..10 {
                // Mostly inserts; deletes often of the top rows, so that
                // rows from past the first page come up.
                let total: i64 = rows.values().sum();
                if total > 0 && next(3) == 0 {
                    let b = if next(2) == 0 {
                        *rows.keys().next_back().unwrap()
                    } else {
                        *rows.keys().nth(next(rows.len() as u64) as usize).unwrap()
                    };
                    *rows.get_mut(&b).unwrap() -= 1;
                    if rows[&b] == 0 {
                        rows.remove(&b);
                    }
                    ops.push(D);
                    bs.push(b);
                } else {
                    let b = next(5_000) as i64;
                    *rows.entry(b).or_default() += 1;
                    ops.push(I);
                    bs.push(b);
                }
            }
            for line in feed(&mut t, &ops, &vec![1; ops.len()], &bs) {
                let (op, row) = line.split_at(3);
                *shown.entry(row.to_string()).or_default() += if op == "+I " { 1 } else { -1 };
            }
            shown.retain(|_, n| *n != 0);
            let got: Vec<String> = shown.keys().cloned().collect();
            assert!(shown.values().all(|n| *n == 1), "step {step}: {shown:?}");
            assert_eq!(got, expected_top(&rows, 2, 5), "step {step}");
            assert!(
                t.rows.report().bytes_in_memory <= 64 << 10,
                "step {step}: {:?}",
                t.rows.report()
            );
            if step == 150 {
                // A checkpoint, as the task applies it, then a restore.
                let mut writes = vec![];
                t.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
                    .unwrap();
                state.put(writes).unwrap();
                drop(t);
                t = start(true);
            }
        }
        let total: i64 = rows.values().sum();
        assert!(total > 800, "{total} rows");
        let (c, _) = chunk(&[I], vec![ints(&[Some(1)]), ints(&[Some(0)])]);
        let keys = t.rows.keys(c.data()).unwrap();
        let ranked = t.rows.get(&keys.partitions[0], keys.key_groups[0]);
        let ranked = ranked.unwrap().unwrap();
        assert!(ranked.is_partial());
        assert!(
            (ranked.len() as i64) < total / 4,
            "{} of {total} rows in memory",
            ranked.len()
        );
    }

    #[test]
    fn append_only_input_forgets_rows_below_the_top() {
        let mut t = top_n(1, 1, false, true);
        assert_eq!(
            feed(&mut t, &[I, I, I], &[1, 1, 1], &[5, 9, 7]),
            vec!["+I 1 7"]
        );
        let (c, _) = chunk(&[I], vec![ints(&[Some(1)]), ints(&[Some(0)])]);
        let keys = t.rows.keys(c.data()).unwrap();
        let ranked = t.rows.get(&keys.partitions[0], keys.key_groups[0]);
        assert_eq!(ranked.unwrap().unwrap().len(), 2);
    }
}

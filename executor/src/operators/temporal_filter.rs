//! TemporalFilter: `WHERE ts > now() - INTERVAL '1' HOUR` and the like in a
//! view. Each row has a visibility interval `[from, until)` in processing
//! time, from its bounds; it is in the output while the clock is inside it.
//!
//! A row arriving inside its interval goes out at once, one arriving before
//! it waits, one arriving after it is dropped. A timer per row inserts it
//! when its interval opens and deletes it when it closes. Rows are kept only
//! while something is still to happen to them: a row out for good (no end)
//! is forgotten, and so is an expired one — so state holds the rows inside a
//! sliding window, not the whole input. A deleted input row that is not in
//! state was either expired (nothing to do) or out with no end (delete it):
//! its `until` tells which.
//!
//! Whether a row is out is decided by the operator's own timers, never by
//! re-reading the clock, so what it emitted and what it keeps agree, and
//! after a restore each row's `shown` flag says what downstream has.
//!
//! The waiting rows are keyed state (`r ‖ row`) in a [`StateCache`], their
//! timers a [`TimerQueue`] (`t ‖ due ‖ row`) in the same table: with the
//! `rocksdb` backend a window of rows larger than memory stays on disk.

use datafusion::arrow::array::{Array, BooleanArray, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::{OperatorSpec, TemporalBound};
use std::sync::Arc;
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext, processing_time_us};
use crate::state::{StateCache, StateCodec, TimerQueue};
use crate::{ExecError, Result, expr};

/// A row that is waiting to go out or to be retracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    copies: i64,
    from: i64,
    until: i64,
    /// Whether the row is out (downstream has it).
    shown: bool,
}

impl Pending {
    /// When its next change is due.
    fn due(&self) -> i64 {
        if self.shown { self.until } else { self.from }
    }

    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(25);
        v.extend_from_slice(&self.copies.to_be_bytes());
        v.extend_from_slice(&self.from.to_be_bytes());
        v.extend_from_slice(&self.until.to_be_bytes());
        v.push(self.shown as u8);
        v
    }

    fn decode(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<i64> {
            Some(i64::from_be_bytes(
                bytes.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        Some(Self {
            copies: word(0)?,
            from: word(1)?,
            until: word(2)?,
            shown: *bytes.get(24)? != 0,
        })
    }
}

/// Store key prefixes of the waiting rows and of their timers.
const ROW: u8 = b'r';
const TIMER: u8 = b't';

fn row_key(row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + row.len());
    k.push(ROW);
    k.extend_from_slice(row);
    k
}

struct PendingCodec;

impl StateCodec for PendingCodec {
    type Value = Pending;

    fn encode(&self, p: &Pending) -> Vec<u8> {
        p.encode()
    }

    fn decode(&self, bytes: &[u8]) -> Result<Pending> {
        Ok(Pending::decode(bytes)
            .ok_or_else(|| storage::StorageError::Corrupt("temporal filter row".into()))?)
    }

    fn heap_size(&self, _: &Pending) -> usize {
        0
    }
}

pub struct TemporalFilter {
    bounds: Vec<TemporalBound>,
    row_exprs: Vec<Arc<dyn PhysicalExpr>>,
    codec: RowCodec,
    schema: SchemaRef,
    state_table: u64,
    /// `r ‖ row` → the row's fate.
    pending: StateCache<PendingCodec>,
    /// (due, row) for every pending row that has something due.
    timers: TimerQueue,
}

impl TemporalFilter {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::TemporalFilter {
            bounds,
            input_schema,
            state_table,
        } = spec
        else {
            return Err(ExecError::Protocol(
                "TemporalFilter built from another spec".into(),
            ));
        };
        let row_exprs: Vec<_> = bounds.iter().map(|b| b.row.clone()).collect();
        Ok(Self {
            bounds: bounds.clone(),
            row_exprs: expr::compile(&row_exprs, input_schema)?,
            codec: RowCodec::new(expr::types(input_schema))?,
            schema: expr::output_schema(output),
            state_table: *state_table,
            pending: StateCache::new(*state_table, "TemporalFilter", PendingCodec).under(ROW..=ROW),
            timers: TimerQueue::new(*state_table, TIMER),
        })
    }

    /// Every row's visibility interval; `None` where a bound is NULL (the
    /// comparison is never true).
    fn intervals(&self, data: &RecordBatch) -> Result<Vec<Option<(i64, i64)>>> {
        let mut out = vec![Some((i64::MIN, i64::MAX)); data.num_rows()];
        for (bound, values) in self
            .bounds
            .iter()
            .zip(expr::evaluate(&self.row_exprs, data)?)
        {
            let micros = expr::timestamp_micros(&values)?;
            for (r, slot) in out.iter_mut().enumerate() {
                if micros.is_null(r) {
                    *slot = None;
                    continue;
                }
                if let Some((from, until)) = slot {
                    let (f, u) = bound.interval(micros.value(r));
                    *from = (*from).max(f);
                    *until = (*until).min(u);
                }
            }
        }
        Ok(out)
    }

    /// Row `row` (in `key_group`) goes from `old` to `p`.
    fn set(
        &mut self,
        row: &[u8],
        key_group: u16,
        p: Option<Pending>,
        old: Option<Pending>,
    ) -> Result<()> {
        if let Some(old) = old
            && old.due() != i64::MAX
        {
            self.timers.remove(old.due(), row, key_group);
        }
        if let Some(p) = p
            && p.due() != i64::MAX
        {
            self.timers.add(p.due(), row, key_group);
        }
        *self.pending.get_mut(&row_key(row), key_group)? = p;
        Ok(())
    }

    fn emit(&self, rows: Vec<(Op, &[u8])>, out: &mut Collector) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        let ops: Vec<Op> = rows.iter().map(|(op, _)| *op).collect();
        let columns = self.codec.decode(rows.iter().map(|(_, r)| *r))?;
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }
}

impl Operator for TemporalFilter {
    fn name(&self) -> &'static str {
        "TemporalFilter"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.state_table]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        self.pending.start(ctx)?;
        self.timers.start(ctx)
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.pending.report());
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let data = chunk.data();
        let now = processing_time_us();
        let intervals = self.intervals(data)?;
        let rows = self.codec.encode_rows(data.columns(), chunk.num_rows())?;
        let key_groups = expr::key_groups(data.columns(), chunk.num_rows())?;
        let keys: Vec<Vec<u8>> = rows.iter().map(|r| row_key(r)).collect();
        self.pending.load(
            keys.iter()
                .zip(&key_groups)
                .map(|(k, kg)| (k.as_slice(), *kg)),
        )?;
        let mut passed = vec![false; chunk.num_rows()];
        for (r, row) in rows.iter().enumerate() {
            let Some((from, until)) = intervals[r] else {
                continue;
            };
            let key_group = key_groups[r];
            let insert = chunk.op(r).sign() > 0;
            let old = self.pending.get(&keys[r], key_group)?.copied();
            match (insert, old) {
                (true, Some(mut p)) => {
                    // More copies of a waiting row share its fate.
                    p.copies += 1;
                    passed[r] = p.shown;
                    self.set(row, key_group, Some(p), old)?;
                }
                (true, None) if now >= until => {} // already expired
                (true, None) => {
                    let shown = now >= from;
                    passed[r] = shown;
                    if !(shown && until == i64::MAX) {
                        let p = Pending {
                            copies: 1,
                            from,
                            until,
                            shown,
                        };
                        self.set(row, key_group, Some(p), None)?;
                    }
                }
                (false, Some(mut p)) => {
                    p.copies -= 1;
                    passed[r] = p.shown;
                    let next = (p.copies > 0).then_some(p);
                    self.set(row, key_group, next, old)?;
                }
                // Out with no end, or expired (then downstream has it no
                // more).
                (false, None) => passed[r] = until == i64::MAX,
            }
        }
        self.pending.settle()?;
        self.timers.settle()?;
        let kept = chunk.filter(&BooleanArray::from(passed))?;
        if !kept.is_empty() {
            out.push(kept);
        }
        Ok(())
    }

    fn next_timer(&self) -> Option<i64> {
        self.timers.next()
    }

    fn on_timer(&mut self, now_us: i64, out: &mut Collector) -> Result<()> {
        let mut changes: Vec<(Op, Vec<u8>, i64)> = Vec::new();
        for (due, row, key_group) in self.timers.expired(now_us)? {
            let Some(old) = self.pending.get(&row_key(&row), key_group)?.copied() else {
                continue;
            };
            if old.due() != due {
                return Err(ExecError::Protocol(
                    "a temporal filter's timer and row disagree".into(),
                ));
            }
            let mut p = old;
            let next = if !p.shown && now_us < p.until {
                changes.push((Op::Insert, row.clone(), p.copies));
                p.shown = true;
                // Out for good: nothing left to do for it.
                (p.until != i64::MAX).then_some(p)
            } else {
                if p.shown {
                    changes.push((Op::Delete, row.clone(), p.copies));
                }
                None
            };
            // Its timer at `due` is gone already: no old one to remove.
            self.set(&row, key_group, next, None)?;
        }
        self.pending.settle()?;
        self.timers.settle()?;
        let rows: Vec<(Op, &[u8])> = changes
            .iter()
            .flat_map(|(op, row, copies)| {
                std::iter::repeat_n((*op, row.as_slice()), (*copies).max(0) as usize)
            })
            .collect();
        self.emit(rows, out)
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        self.pending.checkpoint(writes)?;
        self.timers.checkpoint(writes);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::logical_expr::col;
    use planner::spec::TemporalCmp;

    const S: i64 = 1_000_000;
    const I: Op = Op::Insert;
    const D: Op = Op::Delete;

    /// Rows (a) with `a` in microseconds, kept while `a cmp now() + delta`.
    fn filter(cmp: TemporalCmp, delta_us: i64) -> TemporalFilter {
        let schema = Arc::new(int_schema(&["a"]));
        let spec = OperatorSpec::TemporalFilter {
            bounds: vec![TemporalBound {
                row: col("a"),
                cmp,
                delta_us,
            }],
            input_schema: schema.clone(),
            state_table: 5,
        };
        TemporalFilter::new(&spec, &schema).unwrap()
    }

    fn feed(f: &mut TemporalFilter, ops: &[Op], a: &[i64]) -> Vec<String> {
        let a: Vec<Option<i64>> = a.iter().copied().map(Some).collect();
        let (c, _) = chunk(ops, vec![ints(&a)]);
        let mut out = vec![];
        f.process_batch(0, c, &mut out).unwrap();
        pretty(&out)
    }

    fn tick(f: &mut TemporalFilter, now: i64) -> Vec<String> {
        let mut out = vec![];
        f.on_timer(now, &mut out).unwrap();
        pretty(&out)
    }

    #[test]
    fn rows_leave_when_their_window_slides_past() {
        // a > now() - 10s
        let mut f = filter(TemporalCmp::Gt, -10 * S);
        let now = processing_time_us();
        let (fresh, old) = (now + 60 * S, now - 60 * S);
        assert_eq!(
            feed(&mut f, &[I, I, I], &[fresh, old, fresh]),
            vec![format!("+I {fresh}"), format!("+I {fresh}")],
            "the old row has expired already"
        );
        assert_eq!(f.next_timer(), Some(fresh + 10 * S));
        assert_eq!(tick(&mut f, fresh), Vec::<String>::new());
        // The state survives a restore, and the row leaves on time.
        let mut writes = vec![];
        f.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut g = filter(TemporalCmp::Gt, -10 * S);
        let mut c = ctx(Arc::new(MemState(std::sync::Mutex::new(writes))));
        c.restored_from = Some(1);
        g.on_start(&c, &mut vec![]).unwrap();
        assert_eq!(
            tick(&mut g, fresh + 10 * S),
            vec![format!("-D {fresh}"), format!("-D {fresh}")]
        );
        assert!(g.pending.cached().next().is_none() && g.timers.next().is_none());
        // A delete of an expired row has nothing to retract.
        assert_eq!(feed(&mut g, &[D], &[old]), Vec::<String>::new());
    }

    #[test]
    fn future_rows_wait_and_then_stay() {
        // a <= now()
        let mut f = filter(TemporalCmp::LtEq, 0);
        let now = processing_time_us();
        let later = now + 3600 * S;
        assert_eq!(feed(&mut f, &[I], &[later]), Vec::<String>::new());
        // Deleted before its time: it never goes out.
        assert_eq!(feed(&mut f, &[D, I], &[later, later]), Vec::<String>::new());
        assert_eq!(tick(&mut f, later), vec![format!("+I {later}")]);
        assert!(
            f.pending.cached().next().is_none(),
            "out for good: forgotten"
        );
        assert_eq!(feed(&mut f, &[D], &[later]), vec![format!("-D {later}")]);
    }
}

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

use std::collections::{BTreeSet, HashMap};

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
use crate::{ExecError, Result, expr};

/// A row that is waiting to go out or to be retracted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Pending {
    copies: i64,
    from: i64,
    until: i64,
    /// Whether the row is out (downstream has it).
    shown: bool,
    key_group: u16,
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

    fn decode(bytes: &[u8], key_group: u16) -> Option<Self> {
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
            key_group,
        })
    }
}

pub struct TemporalFilter {
    bounds: Vec<TemporalBound>,
    row_exprs: Vec<Arc<dyn PhysicalExpr>>,
    codec: RowCodec,
    schema: SchemaRef,
    state_table: u64,
    pending: HashMap<Vec<u8>, Pending>,
    /// (due, row) for every pending row.
    timers: BTreeSet<(i64, Vec<u8>)>,
    /// Rows changed since the last barrier → key group.
    dirty: HashMap<Vec<u8>, u16>,
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
            pending: HashMap::new(),
            timers: BTreeSet::new(),
            dirty: HashMap::new(),
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

    fn set(&mut self, row: Vec<u8>, p: Option<Pending>, old: Option<Pending>) {
        if let Some(old) = old {
            self.timers.remove(&(old.due(), row.clone()));
        }
        let key_group = p.or(old).map(|p| p.key_group).unwrap_or_default();
        self.dirty.insert(row.clone(), key_group);
        match p {
            Some(p) => {
                if p.due() != i64::MAX {
                    self.timers.insert((p.due(), row.clone()));
                }
                self.pending.insert(row, p);
            }
            None => {
                self.pending.remove(&row);
            }
        }
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
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            let p = Pending::decode(&e.value, e.key_group)
                .ok_or_else(|| storage::StorageError::Corrupt("temporal filter row".into()))?;
            self.timers.insert((p.due(), e.key.clone()));
            self.pending.insert(e.key, p);
        }
        Ok(())
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let data = chunk.data();
        let now = processing_time_us();
        let intervals = self.intervals(data)?;
        let rows = self.codec.encode_rows(data.columns(), chunk.num_rows())?;
        let key_groups = expr::key_groups(data.columns(), chunk.num_rows())?;
        let mut passed = vec![false; chunk.num_rows()];
        for (r, row) in rows.into_iter().enumerate() {
            let Some((from, until)) = intervals[r] else {
                continue;
            };
            let insert = chunk.op(r).sign() > 0;
            let old = self.pending.get(&row).copied();
            match (insert, old) {
                (true, Some(mut p)) => {
                    // More copies of a waiting row share its fate.
                    p.copies += 1;
                    passed[r] = p.shown;
                    self.set(row, Some(p), old);
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
                            key_group: key_groups[r],
                        };
                        self.set(row, Some(p), None);
                    }
                }
                (false, Some(mut p)) => {
                    p.copies -= 1;
                    passed[r] = p.shown;
                    let next = (p.copies > 0).then_some(p);
                    self.set(row, next, old);
                }
                // Out with no end, or expired (then downstream has it no
                // more).
                (false, None) => passed[r] = until == i64::MAX,
            }
        }
        let kept = chunk.filter(&BooleanArray::from(passed))?;
        if !kept.is_empty() {
            out.push(kept);
        }
        Ok(())
    }

    fn next_timer(&self) -> Option<i64> {
        self.timers.first().map(|(t, _)| *t)
    }

    fn on_timer(&mut self, now_us: i64, out: &mut Collector) -> Result<()> {
        let mut changes: Vec<(Op, Vec<u8>, i64)> = Vec::new();
        while let Some((due, _)) = self.timers.first()
            && *due <= now_us
        {
            let Some((_, row)) = self.timers.pop_first() else {
                break;
            };
            let Some(old) = self.pending.get(&row).copied() else {
                continue;
            };
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
            self.set(row, next, Some(old));
        }
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
        for (row, key_group) in self.dirty.drain() {
            writes.push(StateWrite {
                table: self.state_table,
                key_group,
                value: self.pending.get(&row).map(Pending::encode),
                key: row,
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
        g.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(
            tick(&mut g, fresh + 10 * S),
            vec![format!("-D {fresh}"), format!("-D {fresh}")]
        );
        assert!(g.pending.is_empty() && g.timers.is_empty());
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
        assert!(f.pending.is_empty(), "out for good: forgotten");
        assert_eq!(feed(&mut f, &[D], &[later]), vec![format!("-D {later}")]);
    }
}

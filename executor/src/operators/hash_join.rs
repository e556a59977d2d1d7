//! HashJoin: equi-join of two changelogs, of any kind in
//! [`StreamJoinType`] — inner, left/right/full outer, semi and anti.
//!
//! Both inputs arrive hash-partitioned on their join keys. Each side keeps
//! its rows as a multiset per join key, and for every row its **degree**:
//! how many rows of the other side match it (equal key and the extra `ON`
//! condition), as Flink's outer-join state keeps its "number of
//! associations". A change on one side is applied to that side's state,
//! joined with the other side's current rows and emitted with the change's
//! sign: Δ(L ⋈ R) = ΔL ⋈ R + L' ⋈ ΔR, one input at a time.
//!
//! The degree is what makes outer, semi and anti joins retract correctly:
//! a preserved row whose degree goes from 0 to 1 retracts its NULL-padded
//! row before its first match is emitted, and emits it again when its
//! degree falls back to 0; a semi join emits a row when its degree leaves
//! 0 and retracts it when it returns there, an anti join the reverse.
//!
//! The rows are map state ([`MapLayout`]): per side and join key, a map
//! from row to [`Entry`], each row one entry in the store, so that a
//! changed degree writes one row, not the key's whole set. The maps are
//! paged: a join key's rows are read a page at a time when the cache lacks
//! them, and a hot key that outgrows its share of the cache keeps only its
//! first page in memory. Adding or retracting a row reads that row's entry
//! alone; only joining with a key's rows reads all of them (which the
//! output holds anyway), and the next settle cuts the key back.
//!
//! Rows with a NULL key never match (unless the plan asks for NULL-safe
//! equality): they are not stored, and pass straight through as unmatched
//! where the join keeps unmatched rows.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, UInt32Array};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::logical_expr::ExprSchemable;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::{IntervalBounds, OperatorSpec, StreamJoinType};
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use super::ttl::Ttl;
use crate::errors::{ErrorCollection, run_or_collect};
use crate::message::{Barrier, Watermark};
use crate::operator::{Collector, Operator, OperatorContext};
use crate::state::{
    MapCodec, MapLayout, MapValue, PREFETCH_ROWS, StateCache, StateCodec, TimerQueue,
};
use crate::{ExecError, Result, expr};

/// A stored row: how many copies, and how many other-side rows match it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Entry {
    count: i64,
    degree: i64,
}

impl Entry {
    fn encode(self) -> Vec<u8> {
        let mut v = self.count.to_be_bytes().to_vec();
        v.extend_from_slice(&self.degree.to_be_bytes());
        v
    }

    /// 16 bytes; 8 (count only) from inner joins of older Weirs, whose
    /// degrees nothing reads.
    fn decode(v: &[u8]) -> Option<Self> {
        let int = |b: &[u8]| b.try_into().ok().map(i64::from_be_bytes);
        match v.len() {
            8 => Some(Entry {
                count: int(v)?,
                degree: 0,
            }),
            16 => Some(Entry {
                count: int(&v[..8])?,
                degree: int(&v[8..])?,
            }),
            _ => None,
        }
    }
}

/// The join's state: (side, join key) → row → entry.
struct JoinCodec;

impl StateCodec for JoinCodec {
    type Value = Entry;

    fn encode(&self, entry: &Entry) -> Vec<u8> {
        entry.encode()
    }

    fn decode(&self, bytes: &[u8]) -> Result<Entry> {
        Ok(Entry::decode(bytes)
            .ok_or_else(|| storage::StorageError::Corrupt("join count".into()))?)
    }

    fn heap_size(&self, _: &Entry) -> usize {
        0
    }
}

impl MapCodec for JoinCodec {
    fn key_len(&self, stored: &[u8]) -> Result<usize> {
        let (_, key, _) = split_state_key(stored)
            .ok_or_else(|| storage::StorageError::Corrupt("join state key".into()))?;
        Ok(5 + key.len())
    }
}

/// One output row: which side's rows (None = NULLs) with which op.
type Out = (Op, Option<Vec<u8>>, Option<Vec<u8>>);

/// Rows of a join key read from the store at a time.
const JOIN_PAGE: usize = 4096;

type Rows = StateCache<MapLayout<JoinCodec>>;

/// Reads the rows of a paged join key that memory lacks: before iterating
/// them.
fn read_whole(rows: &mut Rows, key: &[u8], key_group: u16) -> Result<()> {
    rows.get_at(key, key_group, false, |layout, at, map| match (at, map) {
        (Some(at), Some(map)) if map.is_partial() => layout.read_whole(at, map),
        _ => Ok(()),
    })
}

/// Reads `row`'s entry under a paged join key if memory lacks it: before
/// reading or changing it alone.
fn fetch(rows: &mut Rows, key: &[u8], key_group: u16, row: &[u8]) -> Result<()> {
    rows.get_at(key, key_group, false, |layout, at, map| match (at, map) {
        (Some(at), Some(map)) => layout.fetch(at, map, row),
        _ => Ok(()),
    })
}

pub struct HashJoin {
    join_type: StreamJoinType,
    keys: [Vec<Arc<dyn PhysicalExpr>>; 2],
    key_types: Vec<DataType>,
    key_codec: RowCodec,
    row_codecs: [RowCodec; 2],
    /// The extra `ON` condition, over the left columns then the right.
    filter: Option<Arc<dyn PhysicalExpr>>,
    /// Schema the filter is evaluated over: left columns then right.
    pair_schema: SchemaRef,
    schema: SchemaRef,
    null_equals_null: bool,
    state_table: u64,
    /// (side, join key) → row → entry; see the module docs.
    rows: Rows,
    /// Interval join: see [`IntervalState`].
    interval: Option<IntervalState>,
    /// Temporal join: see [`OperatorSpec::HashJoin`]'s `temporal`.
    temporal: bool,
    /// Temporal join: left rows held back until the first barrier, by which
    /// the right side's backfill (the table as it was when the job started)
    /// has all arrived; `None` after it.
    held: Option<Vec<Chunk>>,
    /// State TTL (Flink's idle state retention): the rows of a join key on
    /// one side that no row has written for the TTL are forgotten; results
    /// already emitted stay, later rows no longer meet them, and a
    /// retraction of a forgotten row is ignored.
    /// Keyed by [`side_key`].
    ttl: Option<Ttl>,
    /// Where rows whose join keys fail are counted instead of failing the
    /// task (`crate::errors`).
    errors: Option<ErrorCollection>,
}

/// Store key tags of each side's time index (rows' keys start with their
/// side, 0 or 1; the state TTL's are 0x20 and 0x21).
const TIME_TAGS: [u8; 2] = [0x10, 0x11];

/// An interval join's rows by event time, so that the watermark can drop
/// those no future row can match: a left row once `l.ts + after` is behind
/// the watermark, a right row once `r.ts + before` is.
struct IntervalState {
    bounds: IntervalBounds,
    /// Per side: each stored row's state key at its time (µs), in the
    /// store, only the earliest of each key group in memory.
    by_time: [TimerQueue; 2],
}

impl IntervalState {
    fn new(bounds: IntervalBounds, table: u64) -> Self {
        Self {
            bounds,
            by_time: TIME_TAGS.map(|tag| TimerQueue::new(table, tag)),
        }
    }
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

/// The state key of one side's rows under a join key: the prefix of each
/// row's [`state_key`].
fn side_key(side: usize, key: &[u8]) -> Vec<u8> {
    state_key(side as u8, key, &[])
}

fn split_state_key(k: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let side = *k.first()?;
    let len = u32::from_be_bytes(k.get(1..5)?.try_into().ok()?) as usize;
    let key = k.get(5..5 + len)?;
    Some((side, key, &k[5 + len..]))
}

fn op(sign: i64) -> Op {
    if sign > 0 { Op::Insert } else { Op::Delete }
}

impl HashJoin {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::HashJoin {
            join_type,
            left_keys,
            right_keys,
            filter,
            left_schema,
            right_schema,
            null_equals_null,
            state_table,
            interval,
            temporal,
            state_ttl_us,
            ..
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
        let pair = left_schema.join(right_schema)?;
        let filter = match filter {
            Some(f) => Some(expr::compile(std::slice::from_ref(f), &pair)?.remove(0)),
            None => None,
        };
        Ok(Self {
            join_type: *join_type,
            keys: [left, right],
            key_codec: RowCodec::new(key_types.clone())?,
            key_types,
            row_codecs: [
                RowCodec::new(expr::types(left_schema))?,
                RowCodec::new(expr::types(right_schema))?,
            ],
            filter,
            pair_schema: expr::output_schema(&pair),
            schema: expr::output_schema(output),
            null_equals_null: *null_equals_null,
            state_table: *state_table,
            rows: StateCache::new(
                *state_table,
                "HashJoin",
                MapLayout::paged(JoinCodec, JOIN_PAGE),
            )
            .under(0..=1),
            interval: interval.map(|bounds| IntervalState::new(bounds, *state_table)),
            temporal: *temporal,
            held: temporal.then(Vec::new),
            ttl: state_ttl_us.map(|t| Ttl::new(*state_table, "HashJoin", t)),
            errors: None,
        })
    }

    /// Counts the rows whose join keys fail in `table` instead of failing.
    pub fn collecting_errors(mut self, table: Option<u64>) -> Result<Self> {
        self.errors = table.map(ErrorCollection::new).transpose()?;
        Ok(self)
    }

    /// Interval join: notes when stored rows of `side` happened.
    fn index_times(
        &mut self,
        side: usize,
        columns: &[ArrayRef],
        stored: &[(usize, Vec<u8>, Vec<u8>, u16)],
    ) -> Result<()> {
        let Some(state) = &mut self.interval else {
            return Ok(());
        };
        let col = if side == 0 {
            state.bounds.left_time
        } else {
            state.bounds.right_time
        };
        let times: Vec<Option<i64>> = expr::timestamp_micros(&columns[col])?.iter().collect();
        for (r, key, row, kg) in stored {
            if let Some(t) = times[*r] {
                state.by_time[side].add(t, &state_key(side as u8, key, row), *kg);
            }
        }
        for queue in &mut state.by_time {
            queue.settle()?;
        }
        Ok(())
    }

    /// Rows of side `other` under `key` that match `row` of the other side
    /// (the `ON` condition holds), with their counts; and the errors of the
    /// pairs whose condition fails, with the count of each pair.
    ///
    /// A pair whose condition fails matches nothing and is an error kept
    /// as data (`crate::errors`), counted by whichever of its rows changes:
    /// the same pair fails again when either row goes, so the count comes
    /// back down, and outer-join degrees, which count only matches, agree.
    #[allow(clippy::type_complexity)]
    fn matches(
        &mut self,
        side: usize,
        (key, key_group): (&[u8], u16),
        row: &[u8],
    ) -> Result<(Vec<(Vec<u8>, i64)>, Vec<(crate::Failure, i64)>)> {
        let other = 1 - side;
        let theirs_key = side_key(other, key);
        read_whole(&mut self.rows, &theirs_key, key_group)?;
        let Some(theirs) = self.rows.get(&theirs_key, key_group)? else {
            return Ok(Default::default());
        };
        let candidates: Vec<(&[u8], i64)> = theirs.iter().map(|(r, e)| (r, e.count)).collect();
        let Some(filter) = &self.filter else {
            let all = candidates
                .into_iter()
                .map(|(r, c)| (r.to_vec(), c))
                .collect();
            return Ok((all, Vec::new()));
        };
        let n = candidates.len();
        let mine = self.row_codecs[side].decode(std::iter::repeat_n(row, n))?;
        let them = self.row_codecs[other].decode(candidates.iter().map(|(r, _)| *r))?;
        let columns = if side == 0 {
            mine.into_iter().chain(them).collect()
        } else {
            them.into_iter().chain(mine).collect()
        };
        let pairs = expr::batch(&self.pair_schema, columns, n)?;
        let (mask, failed) = match expr::predicate_mask(filter, &pairs) {
            Ok(mask) => (mask, Vec::new()),
            Err(e) if self.errors.is_none() => return Err(e),
            // Pair by pair, to tell the ones that fail.
            Err(_) => {
                let mut keep = Vec::with_capacity(n);
                let mut failed = Vec::new();
                for (i, (_, count)) in candidates.iter().enumerate() {
                    match expr::predicate_mask(filter, &pairs.slice(i, 1)) {
                        Ok(m) => keep.push(m.value(0)),
                        Err(e) => {
                            failed.push((e.failure(), *count));
                            keep.push(false);
                        }
                    }
                }
                (BooleanArray::from(keep), failed)
            }
        };
        let matched = candidates
            .into_iter()
            .enumerate()
            .filter(|(i, _)| mask.value(*i))
            .map(|(_, (r, c))| (r.to_vec(), c))
            .collect();
        Ok((matched, failed))
    }

    /// Reads the own entries of rows `slice` under keys memory holds part
    /// of: one batched read per key rather than a point read per row.
    fn prefetch(
        &mut self,
        side: usize,
        slice: std::ops::Range<usize>,
        null_keys: &[bool],
        key_bytes: &[Vec<u8>],
        key_groups: &[u16],
        rows: &[Vec<u8>],
    ) -> Result<()> {
        self.rows.fetch_entries(
            slice
                .filter(|r| !null_keys[*r])
                .map(|r| (side_key(side, &key_bytes[r]), key_groups[r], &rows[r])),
        )
    }

    /// Applies one change of `row` (key and its key group, or None for a
    /// NULL key that matches nothing) on `side`, pushing what the join emits.
    fn apply(
        &mut self,
        side: usize,
        key: Option<(&[u8], u16)>,
        row: &[u8],
        sign: i64,
        out: &mut Vec<Out>,
    ) -> Result<()> {
        let other = 1 - side;
        // The row's own entry, wherever it is (a temporal join keeps no
        // left rows: they only look up).
        let own = match key {
            Some((k, key_group)) if !(self.temporal && side == 0) => {
                let state_key = side_key(side, k);
                fetch(&mut self.rows, &state_key, key_group, row)?;
                Some((state_key, key_group))
            }
            _ => None,
        };
        if let (Some(ttl), Some((state_key, key_group))) = (&mut self.ttl, &own) {
            let stored = self
                .rows
                .get(state_key, *key_group)?
                .is_some_and(|rows| rows.contains(row));
            if sign < 0 && !stored {
                // A row the TTL forgot: what it produced stays.
                return Ok(());
            }
            ttl.touch(state_key, *key_group, crate::operator::processing_time_us())?;
        }
        let (matched, failed) = match key {
            Some(key) => self.matches(side, key, row)?,
            None => Default::default(),
        };
        if let Some(errors) = &mut self.errors {
            for (failure, count) in failed {
                errors.add(&failure, sign * count)?;
            }
        }
        let degree: i64 = matched.iter().map(|(_, c)| *c).sum();
        // The other side's matched rows gain or lose one match each (an
        // inner join never reads degrees: it skips the bookkeeping and the
        // state writes it would cost).
        let mut crossed = Vec::new();
        let degrees = self.join_type != StreamJoinType::Inner && !self.temporal;
        if let Some((k, key_group)) = key
            && degrees
            && !matched.is_empty()
            && let Some(theirs) = self.rows.get_mut(&side_key(other, k), key_group)?
        {
            for (r, _) in &matched {
                if let Some(e) = theirs.get_mut(r) {
                    let before = e.degree;
                    e.degree += sign;
                    if (before == 0) != (e.degree == 0) {
                        crossed.push((r.clone(), e.count));
                    }
                }
            }
        }
        let pair = |mine: &[u8], theirs: &[u8]| -> (Option<Vec<u8>>, Option<Vec<u8>>) {
            if side == 0 {
                (Some(mine.to_vec()), Some(theirs.to_vec()))
            } else {
                (Some(theirs.to_vec()), Some(mine.to_vec()))
            }
        };
        let alone = |s: usize, r: &[u8]| -> (Option<Vec<u8>>, Option<Vec<u8>>) {
            if s == 0 {
                (Some(r.to_vec()), None)
            } else {
                (None, Some(r.to_vec()))
            }
        };
        let repeat =
            |out: &mut Vec<Out>, op: Op, rows: (Option<Vec<u8>>, Option<Vec<u8>>), n: i64| {
                for _ in 0..n.max(0) {
                    out.push((op, rows.0.clone(), rows.1.clone()));
                }
            };
        if self.temporal {
            if side == 0 {
                // The row meets the right side as it is now, once.
                for (r, count) in &matched {
                    repeat(out, op(sign), pair(row, r), *count);
                }
                if self.join_type.preserves(0) && degree == 0 {
                    repeat(out, op(sign), alone(0, row), 1);
                }
                return Ok(());
            }
            // A right-side change only changes what later left rows meet.
        } else {
            match self.join_type.filtering() {
                Some((kept, semi)) if kept == side => {
                    if (degree > 0) == semi {
                        repeat(out, op(sign), alone(side, row), 1);
                    }
                }
                Some((_, semi)) => {
                    // A row of the output side starts or stops having matches.
                    for (r, count) in &crossed {
                        let now_matched = sign > 0;
                        let shown = now_matched == semi;
                        repeat(
                            out,
                            if shown { Op::Insert } else { Op::Delete },
                            alone(other, r),
                            *count,
                        );
                    }
                }
                None => {
                    let theirs_padded = self.join_type.preserves(other);
                    if theirs_padded && sign > 0 {
                        for (r, count) in &crossed {
                            repeat(out, Op::Delete, alone(other, r), *count);
                        }
                    }
                    for (r, count) in &matched {
                        repeat(out, op(sign), pair(row, r), *count);
                    }
                    if theirs_padded && sign < 0 {
                        for (r, count) in &crossed {
                            repeat(out, Op::Insert, alone(other, r), *count);
                        }
                    }
                    if self.join_type.preserves(side) && degree == 0 {
                        repeat(out, op(sign), alone(side, row), 1);
                    }
                }
            }
        }
        // This side's own state.
        if let Some((state_key, key_group)) = own {
            let mine = self
                .rows
                .get_mut(&state_key, key_group)?
                .get_or_insert_with(MapValue::default);
            let e = mine.get_or_insert_with(row, Entry::default);
            e.count += sign;
            e.degree = degree;
            if e.count <= 0 {
                if e.count < 0 {
                    tracing::error!(
                        state_table = self.state_table,
                        "join row retracted below zero"
                    );
                }
                mine.remove(row);
            }
        }
        Ok(())
    }

    /// Builds the output chunk: NULLs where a side is absent.
    fn emit(&self, rows: Vec<Out>) -> Result<Chunk> {
        let n = rows.len();
        let mut columns: Vec<ArrayRef> = Vec::new();
        let sides: Vec<usize> = match self.join_type.filtering() {
            Some((kept, _)) => vec![kept],
            None => vec![0, 1],
        };
        for s in sides {
            let present: Vec<&[u8]> = rows
                .iter()
                .filter_map(|r| {
                    if s == 0 {
                        r.1.as_deref()
                    } else {
                        r.2.as_deref()
                    }
                })
                .collect();
            let decoded = self.row_codecs[s].decode(present.iter().copied())?;
            if present.len() == n {
                columns.extend(decoded);
                continue;
            }
            let mut next = 0u32;
            let indices: UInt32Array = rows
                .iter()
                .map(|r| {
                    let has = if s == 0 { r.1.is_some() } else { r.2.is_some() };
                    has.then(|| {
                        next += 1;
                        next - 1
                    })
                })
                .collect();
            for c in decoded {
                columns.push(take(c.as_ref(), &indices, None)?);
            }
        }
        let ops: Vec<Op> = rows.iter().map(|r| r.0).collect();
        Ok(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ))
    }
}

impl Operator for HashJoin {
    fn name(&self) -> &'static str {
        "HashJoin"
    }

    fn tables(&self) -> Vec<u64> {
        std::iter::once(self.state_table)
            .chain(ErrorCollection::tables(&self.errors))
            .collect()
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.rows.report());
        out.extend(self.ttl.as_ref().map(Ttl::report));
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        ErrorCollection::start(&mut self.errors, ctx)?;
        self.rows.start(ctx)?;
        if let Some(state) = &mut self.interval {
            for queue in &mut state.by_time {
                queue.start(ctx)?;
            }
        }
        let Some(ttl) = &mut self.ttl else {
            return Ok(());
        };
        ttl.start(ctx)?;
        if ctx.restored_from.is_none() || ttl.next().is_some() {
            return Ok(());
        }
        // A checkpoint from before the TTL's clock was kept in the store:
        // its rows get a whole TTL from the restart.
        let now = crate::operator::processing_time_us();
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            if !matches!(e.key.first(), Some(0 | 1)) {
                continue;
            }
            let (side, key, _) = split_state_key(&e.key)
                .ok_or_else(|| storage::StorageError::Corrupt("join state key".into()))?;
            ttl.touch(&side_key(side.into(), key), e.key_group, now)?;
        }
        ttl.settle()
    }

    fn next_timer(&self) -> Option<i64> {
        self.ttl.as_ref()?.next()
    }

    fn on_timer(&mut self, now_us: i64, _out: &mut Collector) -> Result<()> {
        let Some(ttl) = &mut self.ttl else {
            return Ok(());
        };
        for (key, key_group) in ttl.expired(now_us)? {
            read_whole(&mut self.rows, &key, key_group)?;
            if let Some(rows) = self.rows.get_mut(&key, key_group)? {
                rows.clear();
            }
        }
        ttl.settle()?;
        self.rows.settle()
    }

    fn handle_watermark(
        &mut self,
        watermark: Watermark,
        _out: &mut Collector,
    ) -> Result<Option<Watermark>> {
        let Some(state) = &mut self.interval else {
            return Ok(Some(watermark));
        };
        // A left row at l.ts matches right rows up to l.ts + after; right
        // rows still to come are at or after the watermark (later ones are
        // late). Likewise a right row and l.ts <= r.ts + before.
        let horizon = [
            watermark.timestamp.saturating_sub(state.bounds.after_us),
            watermark.timestamp.saturating_sub(state.bounds.before_us),
        ];
        for (side, horizon) in horizon.into_iter().enumerate() {
            // Rows strictly before the horizon go.
            for (_, stored, kg) in state.by_time[side].expired(horizon.saturating_sub(1))? {
                let (s, key, row) = split_state_key(&stored)
                    .ok_or_else(|| storage::StorageError::Corrupt("join time index".into()))?;
                let state_key = side_key(s.into(), key);
                fetch(&mut self.rows, &state_key, kg, row)?;
                if let Some(rows) = self.rows.get_mut(&state_key, kg)? {
                    rows.remove(row);
                }
            }
            state.by_time[side].settle()?;
        }
        self.rows.settle()?;
        Ok(Some(watermark))
    }

    fn process_batch(&mut self, input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let side = input.min(1);
        if side == 0
            && let Some(held) = &mut self.held
        {
            held.push(chunk);
            return Ok(());
        }
        let key_exprs = &self.keys[side];
        let Some((chunk, mut keys)) = run_or_collect(&chunk, self.errors.as_mut(), |c| {
            expr::evaluate(key_exprs, c.data())
        })?
        else {
            return Ok(());
        };
        let n = chunk.num_rows();
        let data = chunk.data();
        for (k, t) in keys.iter_mut().zip(&self.key_types) {
            if k.data_type() != t {
                *k = cast(k, t)?;
            }
        }
        let key_groups = expr::key_groups(&keys, n)?;
        let key_bytes = self.key_codec.encode_rows(&keys, n)?;
        let rows = self.row_codecs[side].encode_rows(data.columns(), n)?;
        let null_key = |r: usize| !self.null_equals_null && keys.iter().any(|k| k.is_null(r));
        let null_keys: Vec<bool> = (0..n).map(null_key).collect();

        // The join keys' rows on both sides, read in one go where the cache
        // lacks them (a temporal join keeps no left rows).
        let sides: &[usize] = if self.temporal && side == 0 {
            &[1]
        } else {
            &[0, 1]
        };
        if self.rows.reads_store() {
            let wanted: Vec<(Vec<u8>, u16)> = (0..n)
                .filter(|r| !null_keys[*r])
                .flat_map(|r| sides.iter().map(move |s| (r, *s)))
                .map(|(r, s)| (side_key(s, &key_bytes[r]), key_groups[r]))
                .collect();
            self.rows
                .load(wanted.iter().map(|(k, kg)| (k.as_slice(), *kg)))?;
        }
        if let Some(ttl) = &mut self.ttl
            && !(self.temporal && side == 0)
        {
            // The expiries of this side's keys, likewise.
            let touched: Vec<(Vec<u8>, u16)> = (0..n)
                .filter(|r| !null_keys[*r])
                .map(|r| (side_key(side, &key_bytes[r]), key_groups[r]))
                .collect();
            ttl.load(touched.iter().map(|(k, kg)| (k.as_slice(), *kg)))?;
        }

        let mut emitted: Vec<Out> = Vec::new();
        let mut stored = Vec::new();
        let prefetch = !(self.temporal && side == 0);
        for r in 0..n {
            if prefetch && r % PREFETCH_ROWS == 0 {
                let slice = r..(r + PREFETCH_ROWS).min(n);
                self.prefetch(side, slice, &null_keys, &key_bytes, &key_groups, &rows)?;
            }
            let sign = chunk.op(r).sign();
            if null_keys[r] {
                self.apply(side, None, &rows[r], sign, &mut emitted)?;
                continue;
            }
            let key = (key_bytes[r].as_slice(), key_groups[r]);
            self.apply(side, Some(key), &rows[r], sign, &mut emitted)?;
            if sign > 0 && self.interval.is_some() {
                stored.push((r, key_bytes[r].clone(), rows[r].clone(), key_groups[r]));
            }
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.settle()?;
        }
        self.rows.settle()?;
        if !stored.is_empty() {
            self.index_times(side, data.columns(), &stored)?;
        }
        if !emitted.is_empty() {
            out.push(self.emit(emitted)?);
        }
        Ok(())
    }

    fn before_checkpoint(&mut self, _barrier: &Barrier, out: &mut Collector) -> Result<()> {
        // Every left row that arrived before the first barrier meets the
        // whole table, as it was when the job started.
        for chunk in self.held.take().unwrap_or_default() {
            self.process_batch(0, chunk, out)?;
        }
        Ok(())
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        ErrorCollection::checkpoint_if_any(&mut self.errors, writes);
        if let Some(state) = &mut self.interval {
            for queue in &mut state.by_time {
                queue.checkpoint(writes);
            }
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.checkpoint(writes)?;
        }
        self.rows.checkpoint(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use crate::state::StateStore;
    use datafusion::common::Column;
    use datafusion::logical_expr::Expr;
    use std::sync::Arc;
    use storage::memory::MemoryPool;

    fn join() -> HashJoin {
        join_of(StreamJoinType::Inner, None)
    }

    fn join_of(join_type: StreamJoinType, filter: Option<Expr>) -> HashJoin {
        let left = Arc::new(int_schema(&["a", "b"]));
        let right = Arc::new(int_schema(&["c", "d"]));
        let out = match join_type.filtering() {
            Some((0, _)) => int_schema(&["a", "b"]),
            Some(_) => int_schema(&["c", "d"]),
            None => int_schema(&["a", "b", "c", "d"]),
        };
        let spec = OperatorSpec::HashJoin {
            join_type,
            left_keys: vec![Expr::Column(Column::from_name("a"))],
            right_keys: vec![Expr::Column(Column::from_name("c"))],
            filter,
            errors: None,
            left_schema: left,
            right_schema: right,
            null_equals_null: false,
            state_table: 5,
            interval: None,
            temporal: false,
            state_ttl_us: None,
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

    const I: Op = Op::Insert;
    const D: Op = Op::Delete;

    #[test]
    fn a_pair_whose_on_condition_fails_matches_nothing_and_is_counted_until_a_row_goes() {
        use datafusion::logical_expr::{col, lit};
        let on = (col("b") / col("d")).gt(lit(0i64));
        let mut j = join_of(StreamJoinType::Left, Some(on))
            .collecting_errors(Some(9))
            .unwrap();
        j.on_start(&ctx(Arc::new(MemState::default())), &mut vec![])
            .unwrap();
        let errors = |j: &mut HashJoin| {
            let mut writes = vec![];
            j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
                .unwrap();
            writes
                .iter()
                .filter(|w| w.table == 9)
                .map(|w| {
                    w.value
                        .as_ref()
                        .map(|v| i64::from_be_bytes(v[..8].try_into().unwrap()))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            feed(&mut j, 0, &[I], &[Some(1)], &[Some(10)]),
            vec!["+I 1 10 NULL NULL"]
        );
        // 10 / 0 fails, twice (the right row is there twice): still padded.
        assert!(feed(&mut j, 1, &[I, I], &[Some(1), Some(1)], &[Some(0), Some(0)]).is_empty());
        assert_eq!(errors(&mut j), vec![Some(2)]);
        // A pair that holds replaces the padding.
        assert_eq!(
            feed(&mut j, 1, &[I], &[Some(1)], &[Some(5)]),
            vec!["-D 1 10 NULL NULL", "+I 1 10 1 5"]
        );
        // The left row goes: its failing pairs go with it.
        assert_eq!(
            feed(&mut j, 0, &[D], &[Some(1)], &[Some(10)]),
            vec!["-D 1 10 1 5"]
        );
        assert_eq!(errors(&mut j), vec![None]);
    }

    #[test]
    fn left_join_pads_and_retracts_the_padding() {
        let mut j = join_of(StreamJoinType::Left, None);
        assert_eq!(
            feed(&mut j, 0, &[I, I], &[Some(1), None], &[Some(10), Some(11)]),
            vec!["+I 1 10 NULL NULL", "+I NULL 11 NULL NULL"]
        );
        // The first match replaces the padded row; the second adds one.
        assert_eq!(
            feed(&mut j, 1, &[I, I], &[Some(1), Some(1)], &[Some(7), Some(8)]),
            vec!["-D 1 10 NULL NULL", "+I 1 10 1 7", "+I 1 10 1 8"]
        );
        assert_eq!(
            feed(&mut j, 1, &[D], &[Some(1)], &[Some(7)]),
            vec!["-D 1 10 1 7"]
        );
        // The last match goes: padded again.
        assert_eq!(
            feed(&mut j, 1, &[D], &[Some(1)], &[Some(8)]),
            vec!["-D 1 10 1 8", "+I 1 10 NULL NULL"]
        );
        // Right rows without a match are not kept in a left join.
        assert!(feed(&mut j, 1, &[I], &[Some(2)], &[Some(1)]).is_empty());
        assert_eq!(
            feed(&mut j, 0, &[D, D], &[Some(1), None], &[Some(10), Some(11)]),
            vec!["-D 1 10 NULL NULL", "-D NULL 11 NULL NULL"]
        );
    }

    #[test]
    fn full_join_degrees_survive_a_restore_and_follow_the_on_condition() {
        use datafusion::logical_expr::col;
        // ON a = c AND b < d
        let cond = Some(col("b").lt(col("d")));
        let mut j = join_of(StreamJoinType::Full, cond.clone());
        assert_eq!(
            feed(&mut j, 0, &[I], &[Some(1)], &[Some(5)]),
            vec!["+I 1 5 NULL NULL"]
        );
        // Same key but the condition fails: both sides padded.
        assert_eq!(
            feed(&mut j, 1, &[I], &[Some(1)], &[Some(3)]),
            vec!["+I NULL NULL 1 3"]
        );
        assert_eq!(
            feed(&mut j, 1, &[I], &[Some(1)], &[Some(9)]),
            vec!["-D 1 5 NULL NULL", "+I 1 5 1 9"]
        );
        let mut writes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut k = join_of(StreamJoinType::Full, cond);
        k.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(
            feed(&mut k, 1, &[D], &[Some(1)], &[Some(9)]),
            vec!["-D 1 5 1 9", "+I 1 5 NULL NULL"]
        );
    }

    #[test]
    fn semi_and_anti_joins_flip_when_the_first_match_comes_and_the_last_goes() {
        let no_rows: Vec<String> = vec![];
        let mut semi = join_of(StreamJoinType::LeftSemi, None);
        assert_eq!(
            feed(
                &mut semi,
                0,
                &[I, I],
                &[Some(1), None],
                &[Some(10), Some(11)]
            ),
            no_rows
        );
        assert_eq!(
            feed(&mut semi, 1, &[I], &[Some(1)], &[Some(7)]),
            vec!["+I 1 10"]
        );
        // A second match changes nothing; only losing the last one does.
        assert_eq!(feed(&mut semi, 1, &[I], &[Some(1)], &[Some(8)]), no_rows);
        assert_eq!(feed(&mut semi, 1, &[D], &[Some(1)], &[Some(7)]), no_rows);
        assert_eq!(
            feed(&mut semi, 1, &[D], &[Some(1)], &[Some(8)]),
            vec!["-D 1 10"]
        );

        let mut anti = join_of(StreamJoinType::LeftAnti, None);
        assert_eq!(
            feed(
                &mut anti,
                0,
                &[I, I],
                &[Some(1), None],
                &[Some(10), Some(11)]
            ),
            vec!["+I 1 10", "+I NULL 11"]
        );
        assert_eq!(
            feed(&mut anti, 1, &[I], &[Some(1)], &[Some(7)]),
            vec!["-D 1 10"]
        );
        assert_eq!(feed(&mut anti, 1, &[I], &[Some(1)], &[Some(8)]), no_rows);
        assert_eq!(feed(&mut anti, 1, &[D], &[Some(1)], &[Some(7)]), no_rows);
        assert_eq!(
            feed(&mut anti, 1, &[D], &[Some(1)], &[Some(8)]),
            vec!["+I 1 10"]
        );
        // A matched row leaving a semi join's output side retracts it.
        assert_eq!(
            feed(&mut semi, 1, &[I], &[Some(1)], &[Some(9)]),
            vec!["+I 1 10"]
        );
        assert_eq!(
            feed(&mut semi, 0, &[D], &[Some(1)], &[Some(10)]),
            vec!["-D 1 10"]
        );
    }

    #[test]
    fn an_interval_join_forgets_rows_the_watermark_has_passed() {
        // d (right time) within [b - 5, b + 10] of b (left time).
        let mut j = join_of(StreamJoinType::Inner, None);
        let bounds = IntervalBounds {
            left_time: 1,
            right_time: 1,
            before_us: 5,
            after_us: 10,
        };
        j.interval = Some(IntervalState::new(bounds, 5));
        feed(
            &mut j,
            0,
            &[I, I],
            &[Some(1), Some(2)],
            &[Some(100), Some(200)],
        );
        feed(&mut j, 1, &[I], &[Some(1)], &[Some(105)]);
        let mut writes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        // Watermark 111: left row at 100 can only meet right rows up to 110.
        let wm = Watermark {
            column: 0,
            timestamp: 111,
        };
        assert_eq!(j.handle_watermark(wm, &mut vec![]).unwrap(), Some(wm));
        assert_eq!(
            stored_rows(&j, 0),
            1,
            "the row at 100 is gone, the one at 200 stays"
        );
        // The right row at 105 meets left rows up to 105 + 5 = 110 only.
        assert_eq!(stored_rows(&j, 1), 0);
        let mut deletes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(2), &mut deletes)
            .unwrap();
        let rows_deleted = deletes
            .iter()
            .filter(|w| w.value.is_none() && w.key[0] <= 1)
            .count();
        assert_eq!(rows_deleted, 2);
        // A restore rebuilds the time index from the stored rows.
        writes.extend(deletes);
        let mut k = join_of(StreamJoinType::Inner, None);
        k.interval = Some(IntervalState::new(bounds, 5));
        let mut c = ctx(Arc::new(MemState(std::sync::Mutex::new(writes))));
        c.restored_from = Some(1);
        k.on_start(&c, &mut vec![]).unwrap();
        let wm = Watermark {
            column: 0,
            timestamp: 1_000,
        };
        k.handle_watermark(wm, &mut vec![]).unwrap();
        assert_eq!(stored_rows(&k, 0) + stored_rows(&k, 1), 0);
    }

    #[test]
    fn a_left_join_past_its_cache_spills_rows_and_reads_them_back() {
        let state = Arc::new(MemState::default());
        let pool = Arc::new(MemoryPool::new(256 << 10));
        let started =
            |state: &Arc<MemState>, restored: bool| left_join_over(state, &pool, restored);
        let mut j = started(&state, false);
        let n = 5_000i64;
        let keys: Vec<Option<i64>> = (0..n).map(Some).collect();
        let values: Vec<Option<i64>> = (0..n).map(|k| Some(k * 10)).collect();
        let ops = vec![I; n as usize];
        // Every left row is padded: no right rows yet.
        let out = feed(&mut j, 0, &ops, &keys, &values);
        assert_eq!(out.len(), n as usize);
        assert!(out.iter().all(|r| r.ends_with("NULL NULL")));
        assert!(j.rows.stats().evictions > 0, "{:?}", j.rows.stats());
        assert!(pool.used() <= pool.capacity());
        // A right row for every other key, in batches: each replaces its
        // key's padding, read back from the store where it was spilled.
        let even: Vec<Option<i64>> = (0..n).step_by(2).map(Some).collect();
        let mut out = vec![];
        for part in even.chunks(1000) {
            out.extend(feed(&mut j, 1, &vec![I; part.len()], part, part));
        }
        assert!(j.rows.stats().misses > 0);
        assert_eq!(out.len(), n as usize);
        for k in (0..n).step_by(2).take(50) {
            assert!(out.contains(&format!("-D {k} {} NULL NULL", k * 10)));
            assert!(out.contains(&format!("+I {k} {} {k} {k}", k * 10)));
        }
        // A checkpoint while rows are dirty, then a restart from the store:
        // deleting the right rows brings every padding back.
        let mut writes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        state.put(writes).unwrap();
        drop(j);
        let mut k = started(&state, true);
        let mut out = vec![];
        for part in even.chunks(1000) {
            out.extend(feed(&mut k, 1, &vec![D; part.len()], part, part));
        }
        assert_eq!(out.len(), n as usize);
        for key in (0..n).step_by(2).take(50) {
            assert!(out.contains(&format!("-D {key} {} {key} {key}", key * 10)));
            assert!(out.contains(&format!("+I {key} {} NULL NULL", key * 10)));
        }
    }

    #[test]
    fn a_hot_join_key_keeps_a_page_in_memory_and_joins_all_its_rows() {
        let state = Arc::new(MemState::default());
        let pool = Arc::new(MemoryPool::new(64 << 10));
        let started = |restored: bool| left_join_over(&state, &pool, restored);
        let mut j = started(false);
        // 3,000 left rows under one key: padded, as the right has none.
        let n = 3_000i64;
        for part in (0..n).collect::<Vec<_>>().chunks(100) {
            let values: Vec<Option<i64>> = part.iter().map(|v| Some(*v)).collect();
            let out = feed(
                &mut j,
                0,
                &vec![I; part.len()],
                &vec![Some(1); part.len()],
                &values,
            );
            assert_eq!(out.len(), part.len());
            assert!(j.rows.stats().bytes <= 64 << 10, "{:?}", j.rows.stats());
        }
        assert!(
            stored_rows(&j, 0) < 1_000,
            "{} of {n} rows in memory",
            stored_rows(&j, 0)
        );
        // Retracting a row in the store reads that row alone.
        let out = feed(&mut j, 0, &[D], &[Some(1)], &[Some(2_999)]);
        assert_eq!(out, vec!["-D 1 2999 NULL NULL"]);
        // A right row meets every left row, from memory and the store.
        let out = feed(&mut j, 1, &[I], &[Some(1)], &[Some(7)]);
        assert_eq!(out.len() as i64, 2 * (n - 1));
        for v in [0, 1_500, 2_998] {
            assert!(out.contains(&format!("-D 1 {v} NULL NULL")), "{v}");
            assert!(out.contains(&format!("+I 1 {v} 1 7")), "{v}");
        }
        assert!(!out.iter().any(|r| r.contains(" 2999 ")));
        assert!(stored_rows(&j, 0) < 1_000, "cut back after the chunk");
        // Across a checkpoint and a restore, the degrees held: the right
        // row's going pads every left row again.
        let mut writes = vec![];
        j.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        state.put(writes).unwrap();
        drop(j);
        let mut k = started(true);
        let out = feed(&mut k, 1, &[D], &[Some(1)], &[Some(7)]);
        assert_eq!(out.len() as i64, 2 * (n - 1));
        assert!(out.contains(&"+I 1 2998 NULL NULL".to_string()));
        assert!(out.contains(&"-D 1 0 1 7".to_string()));
        assert!(k.rows.stats().bytes <= 64 << 10);
    }

    /// A left join started over `state` with the rocksdb backend in `pool`.
    fn left_join_over(state: &Arc<MemState>, pool: &Arc<MemoryPool>, restored: bool) -> HashJoin {
        let mut j = join_of(StreamJoinType::Left, None);
        j.on_start(&rocksdb_ctx(state.clone(), pool, restored), &mut vec![])
            .unwrap();
        j
    }

    /// The rows side `side` holds in memory.
    fn stored_rows(j: &HashJoin, side: u8) -> usize {
        j.rows
            .cached()
            .filter(|(k, _)| k[0] == side)
            .map(|(_, rows)| rows.len())
            .sum()
    }
}

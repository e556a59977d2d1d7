//! HashAgg: grouped aggregation that stays correct under deletes and updates.
//!
//! Input arrives hash-partitioned on the group keys. For every chunk the
//! operator updates each touched group's accumulators by the row's sign, then
//! emits one change per touched group: `+I` for a new group, `-D` for a group
//! whose last row went away, `-U`/`+U` when its output changed. A query
//! without `GROUP BY` has one group that always exists, so the view holds one
//! row even over an empty table, as in Postgres.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::array::TimestampMicrosecondArray;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use datafusion::common::{DFSchema, ScalarValue};
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::AggCall;
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use super::accumulator::{AccState, Aggregate, Prepared, encoding};
use super::ttl::Ttl;
use super::value_sets::ValueSets;
use crate::errors::{ErrorCollection, run_or_collect};
use crate::message::{Barrier, Watermark};
use crate::operator::{Collector, Operator, OperatorContext};
use crate::state::{PREFETCH_ROWS, StateCache, StateCodec, StateStore, TimerQueue};
use crate::{Result, expr};

const STATE_VERSION: u8 = 1;

/// Store key tag of EMIT ON WINDOW CLOSE's open groups (group keys, as
/// Arrow rows, start with a byte below 3; see [`super::ttl::EXPIRY`]).
const WINDOW_TIMERS: u8 = 0x22;

/// The first bytes of group keys; the table's other state (timers,
/// expiries) uses tags from 0x10 on.
const GROUP_KEYS: std::ops::RangeInclusive<u8> = 0..=0x0f;

/// The state of EMIT ON WINDOW CLOSE: open groups by window end.
struct WindowClose {
    /// Which group key is `window_end`.
    key: usize,
    /// The key is an event time, not a window's end: a group is complete
    /// once the watermark is past it, not when the watermark reaches it.
    after: bool,
    /// Each open group (its key) at its window's end (µs): a timer the
    /// watermark fires, kept in the store with only the earliest in memory.
    open: TimerQueue,
    /// The last watermark (µs): windows ending at or before it are closed.
    watermark: Option<i64>,
    /// Rows dropped since the last barrier for arriving after their window
    /// closed, by (key group, window end); added to the counts in
    /// `late_table` at the barrier, when there is one.
    late: HashMap<(u16, i64), i64>,
    late_table: Option<u64>,
    store: Option<Arc<dyn StateStore>>,
}

/// Encodes a window end as the `(window_end)` row of the late-rows table.
fn late_codec() -> Result<RowCodec> {
    Ok(RowCodec::new(vec![late_rows_type()])?)
}

/// The type of `window_end` in the late-rows table.
pub fn late_rows_type() -> DataType {
    DataType::Timestamp(TimeUnit::Microsecond, None)
}

pub(crate) struct Group {
    /// Input rows in the group (inserts minus retractions).
    rows: i64,
    accs: Vec<AccState>,
}

impl Group {
    fn new(aggs: &[Aggregate]) -> Self {
        Group {
            rows: 0,
            accs: aggs.iter().map(|a| a.init()).collect(),
        }
    }
}

/// A group's state bytes: a version, the row count, each accumulator.
pub(crate) struct GroupCodec {
    aggs: usize,
}

impl StateCodec for GroupCodec {
    type Value = Group;

    fn encode(&self, g: &Group) -> Vec<u8> {
        let mut out = vec![STATE_VERSION];
        out.extend_from_slice(&g.rows.to_be_bytes());
        for acc in &g.accs {
            encoding::put(&mut out, acc);
        }
        out
    }

    fn decode(&self, bytes: &[u8]) -> Result<Group> {
        let mut r = encoding::Reader(bytes);
        let version = r.u8()?;
        if version != STATE_VERSION {
            return Err(storage::StorageError::Corrupt(format!(
                "aggregate state version {version}"
            ))
            .into());
        }
        let rows = r.i64()?;
        let accs = (0..self.aggs)
            .map(|_| encoding::get(&mut r))
            .collect::<Result<_>>()?;
        Ok(Group { rows, accs })
    }

    fn heap_size(&self, g: &Group) -> usize {
        g.accs.capacity() * std::mem::size_of::<AccState>()
            + g.accs.iter().map(AccState::heap_size).sum::<usize>()
    }
}

/// A group's outputs, or the message of the error computing them.
type RowOrError = std::result::Result<Vec<ScalarValue>, crate::Failure>;

/// What a group's row is, given its state: the parts of [`HashAgg`] that
/// decide it, borrowed apart from its groups.
struct Rows<'a> {
    aggs: &'a [Aggregate],
    global: bool,
    always: Option<&'a [u8]>,
    keep_errors: bool,
}

impl<'a> Rows<'a> {
    /// Borrows only the fields named, so that the groups stay free to
    /// change while it is in use.
    fn of(
        aggs: &'a [Aggregate],
        global: bool,
        always: &'a Option<(Vec<u8>, u16)>,
        errors: &Option<ErrorCollection>,
    ) -> Self {
        Rows {
            aggs,
            global,
            always: always.as_ref().map(|(k, _)| k.as_slice()),
            keep_errors: errors.is_some(),
        }
    }

    fn visible(&self, key: &[u8], g: &Group) -> bool {
        self.global || g.rows > 0 || self.always == Some(key)
    }

    /// The outputs of group `key` (in key group `key_group`), reading
    /// its value sets as they need.
    fn outputs(
        &self,
        key: &[u8],
        key_group: u16,
        g: &Group,
        sets: &mut Option<ValueSets>,
    ) -> Result<Vec<ScalarValue>> {
        let mut out = Vec::with_capacity(self.aggs.len());
        for (i, (a, s)) in self.aggs.iter().zip(&g.accs).enumerate() {
            out.push(match sets {
                Some(sets) if a.set_backed() => sets.output(a, i, key, key_group, s)?,
                _ => a.output(s)?,
            });
        }
        Ok(out)
    }

    /// A visible group's outputs; when an aggregate's own value fails (a
    /// decimal `sum` past 38 digits) and errors are kept as data, the
    /// error's message instead: such a group has no row in the view, and
    /// its error is counted while its state stays so.
    fn outputs_or_error(
        &self,
        key: &[u8],
        key_group: u16,
        g: &Group,
        sets: &mut Option<ValueSets>,
    ) -> Result<RowOrError> {
        match self.outputs(key, key_group, g, sets) {
            Ok(v) => Ok(Ok(v)),
            Err(e) if self.keep_errors => Ok(Err(e.failure())),
            Err(e) => Err(e),
        }
    }

    /// The group's row, if it has one.
    fn row(
        &self,
        key: &[u8],
        key_group: u16,
        g: Option<&Group>,
        sets: &mut Option<ValueSets>,
    ) -> Result<Option<RowOrError>> {
        match g {
            Some(g) if self.visible(key, g) => {
                Ok(Some(self.outputs_or_error(key, key_group, g, sets)?))
            }
            _ => Ok(None),
        }
    }

    /// Folds row `row` of a batch (arguments `args`) into group `key`'s
    /// state `g` by `sign`.
    #[allow(clippy::too_many_arguments)]
    fn fold(
        &self,
        key: &[u8],
        key_group: u16,
        g: &mut Group,
        sets: &mut Option<ValueSets>,
        args: &[Prepared],
        row: usize,
        sign: i64,
    ) -> Result<()> {
        g.rows += sign;
        for (i, agg) in self.aggs.iter().enumerate() {
            match sets {
                Some(sets) if agg.set_backed() => {
                    // A multiset an earlier version kept in the group.
                    sets.migrate(agg, i, key, key_group, &mut g.accs[i])?;
                    if let (Some(value), AccState::Distinct(n)) =
                        (agg.encoded(&args[i], row), &mut g.accs[i])
                    {
                        sets.update(i, key, key_group, n, value, sign)?;
                    }
                }
                _ => agg.update(&mut g.accs[i], &args[i], row, sign),
            }
        }
        Ok(())
    }

    /// Deletes the value sets a group leaves behind as it is forgotten.
    fn forget(
        &self,
        key: &[u8],
        key_group: u16,
        g: &Group,
        sets: &mut Option<ValueSets>,
    ) -> Result<()> {
        let Some(sets) = sets else {
            return Ok(());
        };
        for (i, acc) in g.accs.iter().enumerate() {
            if matches!(acc, AccState::Distinct(n) if *n != 0) {
                sets.forget(i, key, key_group)?;
            }
        }
        Ok(())
    }
}

pub struct HashAgg {
    group_exprs: Vec<Arc<dyn PhysicalExpr>>,
    aggs: Vec<Aggregate>,
    key_codec: RowCodec,
    schema: SchemaRef,
    state_table: u64,
    global: bool,
    /// With grouping sets including the empty set `()`: that set's group
    /// key and key group. Its row exists even over no rows, as a global
    /// aggregate's does.
    always: Option<(Vec<u8>, u16)>,
    /// EMIT ON WINDOW CLOSE: see [`HashAgg::emit_on_window_close`].
    eowc: Option<WindowClose>,
    /// Group key → its state.
    groups: StateCache<GroupCodec>,
    /// The aggregates' value sets, when any keeps one.
    sets: Option<ValueSets>,
    /// State TTL: see [`HashAgg::with_state_ttl`].
    ttl: Option<Ttl>,
    /// Where rows whose group keys or arguments fail are counted
    /// (`crate::errors`).
    errors: Option<ErrorCollection>,
}

impl HashAgg {
    pub fn new(
        group_exprs: &[Expr],
        aggs: &[AggCall],
        input_schema: &DFSchema,
        output: &DFSchema,
        state_table: u64,
    ) -> Result<Self> {
        let schema = expr::output_schema(output);
        let key_types = schema
            .fields()
            .iter()
            .take(group_exprs.len())
            .map(|f| f.data_type().clone())
            .collect();
        let aggs: Vec<Aggregate> = aggs
            .iter()
            .map(|a| Aggregate::new(a, input_schema))
            .collect::<Result<_>>()?;
        Ok(Self {
            group_exprs: expr::compile(group_exprs, input_schema)?,
            sets: aggs
                .iter()
                .any(Aggregate::set_backed)
                .then(|| ValueSets::new(state_table)),
            key_codec: RowCodec::new(key_types)?,
            schema,
            state_table,
            global: group_exprs.is_empty(),
            always: None,
            eowc: None,
            groups: StateCache::new(state_table, "HashAgg", GroupCodec { aggs: aggs.len() })
                .under(GROUP_KEYS),
            aggs,
            ttl: None,
            errors: None,
        })
    }

    /// Counts the rows whose group keys or arguments fail in `table`
    /// instead of failing.
    pub fn collecting_errors(mut self, table: Option<u64>) -> Result<Self> {
        self.errors = table.map(ErrorCollection::new).transpose()?;
        Ok(self)
    }

    fn new_group(&self) -> Group {
        Group::new(&self.aggs)
    }

    /// Grouping sets: `id` is the grouping id of the empty set `()`, the
    /// last group column; the others are NULL in its row.
    pub fn with_empty_set(mut self, id: u64) -> Result<Self> {
        let n = self.group_exprs.len();
        let columns = self
            .schema
            .fields()
            .iter()
            .take(n)
            .enumerate()
            .map(|(i, f)| {
                if i + 1 == n {
                    Ok(ScalarValue::UInt64(Some(id))
                        .cast_to(f.data_type())?
                        .to_array_of_size(1)?)
                } else {
                    Ok(datafusion::arrow::array::new_null_array(f.data_type(), 1))
                }
            })
            .collect::<Result<Vec<ArrayRef>>>()?;
        let key = self.key_codec.encode(&columns)?.remove(0);
        let key_group = expr::key_groups(&columns, 1)?[0];
        self.always = Some((key, key_group));
        Ok(self)
    }

    /// Emits each group once, when the watermark reaches the end of its
    /// window (group key `window_end_key`), then forgets it: an append-only
    /// result whose state stays bounded (RisingWave's EMIT ON WINDOW CLOSE,
    /// Flink's window aggregate).
    /// Rows dropped as late are counted per window end in `late_table`.
    /// With `after`, the key is the event time itself (`GROUP BY ts` over
    /// the watermark's column): a group closes once the watermark is past
    /// it, and a row is late when its time is below the watermark.
    pub fn emit_on_window_close(
        mut self,
        window_end_key: usize,
        late_table: Option<u64>,
        after: bool,
    ) -> Self {
        self.eowc = Some(WindowClose {
            key: window_end_key,
            after,
            open: TimerQueue::new(self.state_table, WINDOW_TIMERS),
            watermark: None,
            late: HashMap::new(),
            late_table,
            store: None,
        });
        self
    }

    /// State TTL (Flink's idle state retention): a group no row has
    /// written for `ttl_us` of processing time is forgotten, and its row
    /// leaves the output; a later row of its key starts it afresh, and a
    /// retraction of a row it had is ignored. Global aggregates keep their
    /// one row.
    pub fn with_state_ttl(mut self, ttl_us: Option<i64>) -> Self {
        self.ttl = ttl_us
            .filter(|_| !self.global)
            .map(|t| Ttl::new(self.state_table, "HashAgg", t));
        self
    }

    /// EMIT ON WINDOW CLOSE: window ends of `keys` (the key columns of a
    /// batch).
    fn window_ends(&self, keys: &[ArrayRef]) -> Result<Option<Vec<Option<i64>>>> {
        match &self.eowc {
            Some(w) => Ok(Some(expr::timestamp_micros(&keys[w.key])?.iter().collect())),
            None => Ok(None),
        }
    }

    /// Keeps the groups and the value sets within memory: after each
    /// chunk, timer and watermark.
    fn settle(&mut self) -> Result<()> {
        self.groups.settle()?;
        match &mut self.sets {
            Some(sets) => sets.settle(),
            None => Ok(()),
        }
    }

    /// Builds the output chunk from (op, group key, aggregate values).
    fn emit(&self, rows: Vec<(Op, &[u8], Vec<ScalarValue>)>, out: &mut Collector) -> Result<()> {
        if rows.is_empty() {
            return Ok(());
        }
        let n = rows.len();
        let mut columns: Vec<ArrayRef> = if self.group_exprs.is_empty() {
            vec![]
        } else {
            self.key_codec.decode(rows.iter().map(|(_, k, _)| *k))?
        };
        for i in 0..self.aggs.len() {
            let values = rows.iter().map(|(_, _, v)| v[i].clone());
            columns.push(ScalarValue::iter_to_array(values)?);
        }
        let ops: Vec<Op> = rows.iter().map(|(op, _, _)| *op).collect();
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }
}

impl HashAgg {
    /// A checkpoint taken before the open windows and the TTL's clock were
    /// kept in the store has groups but no timers: index its groups now,
    /// as restarts once did (restored groups get a whole TTL from now).
    fn index_legacy_state(&mut self, ctx: &OperatorContext) -> Result<()> {
        let index_eowc = self.eowc.as_ref().is_some_and(|w| w.open.next().is_none());
        let index_ttl = self.ttl.as_ref().is_some_and(|t| t.next().is_none());
        if ctx.restored_from.is_none() || !(index_eowc || index_ttl) {
            return Ok(());
        }
        let groups: Vec<(Vec<u8>, u16)> = ctx
            .state
            .scan(self.state_table, ctx.key_groups.clone())?
            .into_iter()
            .filter(|e| e.key.first().is_none_or(|b| GROUP_KEYS.contains(b)))
            .map(|e| (e.key, e.key_group))
            .collect();
        if groups.is_empty() {
            return Ok(());
        }
        tracing::info!(
            state_table = self.state_table,
            groups = groups.len(),
            "indexing the groups of an earlier checkpoint's aggregate"
        );
        if let Some(ttl) = &mut self.ttl
            && index_ttl
        {
            let now = crate::operator::processing_time_us();
            for (key, key_group) in &groups {
                ttl.touch(key, *key_group, now)?;
            }
            ttl.settle()?;
        }
        if index_eowc {
            let keys = self
                .key_codec
                .decode(groups.iter().map(|(k, _)| k.as_slice()))?;
            let ends = self.window_ends(&keys)?.unwrap_or_default();
            if let Some(w) = &mut self.eowc {
                for ((key, key_group), end) in groups.iter().zip(ends) {
                    w.open.add(end.unwrap_or(i64::MIN), key, *key_group);
                }
                w.open.settle()?;
            }
        }
        Ok(())
    }

    /// EMIT ON WINDOW CLOSE: folds rows into their (open) windows and emits
    /// nothing; rows of closed windows are dropped as late.
    fn accumulate_windows(
        &mut self,
        chunk: &Chunk,
        key_bytes: &[Vec<u8>],
        key_groups: &[u16],
        args: &[super::accumulator::Prepared],
        ends: &[Option<i64>],
    ) -> Result<()> {
        let Some(w) = &mut self.eowc else {
            return Ok(());
        };
        let shape = Rows::of(&self.aggs, self.global, &self.always, &self.errors);
        let n = key_bytes.len();
        for (row, key) in key_bytes.iter().enumerate() {
            if let Some(sets) = &mut self.sets
                && row % PREFETCH_ROWS == 0
            {
                let slice = row..(row + PREFETCH_ROWS).min(n);
                sets.prefetch(shape.aggs, slice, key_bytes, key_groups, args)?;
            }
            let end = ends[row].unwrap_or(i64::MIN);
            if w.watermark
                .is_some_and(|wm| end < wm || (end == wm && !w.after))
            {
                *w.late.entry((key_groups[row], end)).or_default() += 1;
                continue;
            }
            let sign = chunk.op(row).sign();
            let slot = self.groups.get_mut(key, key_groups[row])?;
            if slot.is_none() {
                // A new group: its window's end closes it.
                w.open.add(end, key, key_groups[row]);
            }
            let g = slot.get_or_insert_with(|| Group::new(&self.aggs));
            shape.fold(key, key_groups[row], g, &mut self.sets, args, row, sign)?;
        }
        w.open.settle()
    }
}

impl Operator for HashAgg {
    fn name(&self) -> &'static str {
        "HashAgg"
    }

    fn tables(&self) -> Vec<u64> {
        let late = self.eowc.as_ref().and_then(|w| w.late_table);
        std::iter::once(self.state_table)
            .chain(late)
            .chain(ErrorCollection::tables(&self.errors))
            .collect()
    }

    fn on_start(&mut self, ctx: &OperatorContext, out: &mut Collector) -> Result<()> {
        ErrorCollection::start(&mut self.errors, ctx)?;
        self.groups.start(ctx)?;
        if let Some(sets) = &mut self.sets {
            sets.start(ctx)?;
        }
        if let Some(w) = &mut self.eowc {
            w.store = Some(ctx.state.clone());
            w.open.start(ctx)?;
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.start(ctx)?;
        }
        self.index_legacy_state(ctx)?;
        if self.global && self.groups.get(&[], 0)?.is_none() {
            // The one row of an aggregate without GROUP BY, over no rows.
            let g = self.new_group();
            let values = Rows::of(&self.aggs, self.global, &self.always, &self.errors).outputs(
                &[],
                0,
                &g,
                &mut self.sets,
            )?;
            self.groups.insert(&[], 0, g)?;
            self.emit(vec![(Op::Insert, &[], values)], out)?;
        }
        if let Some((key, key_group)) = self.always.clone()
            && ctx.key_groups.contains(&key_group)
            && self.groups.get(&key, key_group)?.is_none()
        {
            // The empty grouping set's row, over no rows.
            let g = self.new_group();
            let values = Rows::of(&self.aggs, self.global, &self.always, &self.errors).outputs(
                &key,
                key_group,
                &g,
                &mut self.sets,
            )?;
            self.groups.insert(&key, key_group, g)?;
            self.emit(vec![(Op::Insert, &key, values)], out)?;
        }
        self.settle()
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        // Rows whose keys or arguments fail are counted, not aggregated.
        let (group_exprs, aggs) = (&self.group_exprs, &self.aggs);
        let Some((chunk, (keys, args))) = run_or_collect(&chunk, self.errors.as_mut(), |c| {
            let keys = expr::evaluate(group_exprs, c.data())?;
            let args = aggs
                .iter()
                .map(|a| a.prepare(c.data()))
                .collect::<Result<Vec<_>>>()?;
            Ok((keys, args))
        })?
        else {
            return Ok(());
        };
        let n = chunk.num_rows();
        let key_groups = expr::key_groups(&keys, n)?;
        let key_bytes = if self.global {
            vec![Vec::new(); n]
        } else {
            self.key_codec.encode(&keys)?
        };
        // The groups not cached, in one read.
        self.groups.load(
            key_bytes
                .iter()
                .map(Vec::as_slice)
                .zip(key_groups.iter().copied()),
        )?;
        if let Some(ttl) = &mut self.ttl {
            ttl.load(
                key_bytes
                    .iter()
                    .map(Vec::as_slice)
                    .zip(key_groups.iter().copied()),
            )?;
        }
        if let Some(ends) = self.window_ends(&keys)? {
            self.accumulate_windows(&chunk, &key_bytes, &key_groups, &args, &ends)?;
            return self.settle();
        }

        let shape = Rows::of(&self.aggs, self.global, &self.always, &self.errors);
        // Each touched group's output before this chunk, in first-touch order.
        let mut touched: Vec<(&[u8], u16, Option<RowOrError>)> = Vec::new();
        let mut seen: HashSet<&[u8]> = HashSet::new();
        let now = crate::operator::processing_time_us();
        for row in 0..n {
            if let Some(sets) = &mut self.sets
                && row % PREFETCH_ROWS == 0
            {
                let slice = row..(row + PREFETCH_ROWS).min(n);
                sets.prefetch(shape.aggs, slice, &key_bytes, &key_groups, &args)?;
            }
            let (key, key_group) = (key_bytes[row].as_slice(), key_groups[row]);
            let sign = chunk.op(row).sign();
            if let Some(ttl) = &mut self.ttl {
                if sign < 0 && self.groups.get(key, key_group)?.is_none() {
                    // A row of a group the TTL forgot.
                    continue;
                }
                ttl.touch(key, key_group, now)?;
            }
            if seen.insert(key) {
                let old = shape.row(
                    key,
                    key_group,
                    self.groups.get(key, key_group)?,
                    &mut self.sets,
                )?;
                touched.push((key, key_group, old));
            }
            let g = self
                .groups
                .get_mut(key, key_group)?
                .get_or_insert_with(|| Group::new(shape.aggs));
            shape.fold(key, key_group, g, &mut self.sets, &args, row, sign)?;
        }

        let mut rows = Vec::with_capacity(touched.len() * 2);
        let mut gone = Vec::new();
        for (key, key_group, old) in touched {
            let g = self.groups.get(key, key_group)?;
            if let Some(g) = g
                && g.rows < 0
            {
                tracing::error!(
                    state_table = self.state_table,
                    rows = g.rows,
                    "group retracted below zero rows"
                );
            }
            let new = shape.row(key, key_group, g, &mut self.sets)?;
            if new.is_none() {
                gone.push((key, key_group));
            }
            // A failing output is no row: its error counts instead.
            if let Some(errors) = &mut self.errors {
                if let Some(Err(m)) = &old {
                    errors.add(m, -1)?;
                }
                if let Some(Err(m)) = &new {
                    errors.add(m, 1)?;
                }
            }
            match (old.and_then(|o| o.ok()), new.and_then(|n| n.ok())) {
                (None, Some(n)) => rows.push((Op::Insert, key, n)),
                (Some(o), None) => rows.push((Op::Delete, key, o)),
                (Some(o), Some(n)) if o != n => {
                    rows.push((Op::UpdateDelete, key, o));
                    rows.push((Op::UpdateInsert, key, n));
                }
                _ => {}
            }
        }
        self.emit(rows, out)?;
        for (key, key_group) in gone {
            if let Some(g) = self.groups.remove(key, key_group)? {
                shape.forget(key, key_group, &g, &mut self.sets)?;
            }
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.settle()?;
        }
        self.settle()
    }

    fn next_timer(&self) -> Option<i64> {
        self.ttl.as_ref()?.next()
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.groups.report());
        out.extend(self.sets.as_ref().map(ValueSets::report));
        out.extend(self.ttl.as_ref().map(Ttl::report));
    }

    fn on_timer(&mut self, now_us: i64, out: &mut Collector) -> Result<()> {
        let Some(ttl) = &mut self.ttl else {
            return Ok(());
        };
        let shape = Rows::of(&self.aggs, self.global, &self.always, &self.errors);
        let mut rows = Vec::new();
        for (key, key_group) in ttl.expired(now_us)? {
            let Some(g) = self.groups.remove(&key, key_group)? else {
                continue;
            };
            if shape.visible(&key, &g) {
                match shape.outputs_or_error(&key, key_group, &g, &mut self.sets)? {
                    Ok(values) => rows.push((key.clone(), values)),
                    Err(m) => {
                        if let Some(errors) = &mut self.errors {
                            errors.add(&m, -1)?;
                        }
                    }
                }
            }
            shape.forget(&key, key_group, &g, &mut self.sets)?;
        }
        self.emit(
            rows.iter()
                .map(|(k, v)| (Op::Delete, k.as_slice(), v.clone()))
                .collect(),
            out,
        )?;
        if let Some(ttl) = &mut self.ttl {
            ttl.settle()?;
        }
        self.settle()
    }

    fn handle_watermark(
        &mut self,
        watermark: Watermark,
        out: &mut Collector,
    ) -> Result<Option<Watermark>> {
        let Some(w) = &mut self.eowc else {
            return Ok(Some(watermark));
        };
        if w.watermark.is_some_and(|old| old >= watermark.timestamp) {
            return Ok(Some(watermark));
        }
        w.watermark = Some(watermark.timestamp);
        if !w.late.is_empty() {
            tracing::debug!(
                state_table = self.state_table,
                windows = w.late.len(),
                "rows later than the watermark dropped"
            );
        }
        // Every window ending at or before the watermark is complete (every
        // event time before it).
        let first_open = if w.after {
            watermark.timestamp
        } else {
            watermark.timestamp.saturating_add(1)
        };
        // In (window end, group key) order.
        let closed = w.open.expired(first_open.saturating_sub(1))?;
        w.open.settle()?;
        let shape = Rows::of(&self.aggs, self.global, &self.always, &self.errors);
        let mut rows = Vec::new();
        for (_, key, key_group) in closed {
            let Some(g) = self.groups.remove(&key, key_group)? else {
                continue;
            };
            if g.rows > 0 {
                rows.push((
                    key.clone(),
                    shape.outputs(&key, key_group, &g, &mut self.sets)?,
                ));
            }
            shape.forget(&key, key_group, &g, &mut self.sets)?;
        }
        self.emit(
            rows.iter()
                .map(|(k, v)| (Op::Insert, k.as_slice(), v.clone()))
                .collect(),
            out,
        )?;
        self.settle()?;
        Ok(Some(watermark))
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        ErrorCollection::checkpoint_if_any(&mut self.errors, writes);
        self.groups.checkpoint(writes)?;
        if let Some(sets) = &mut self.sets {
            sets.checkpoint(writes)?;
        }
        if let Some(ttl) = &mut self.ttl {
            ttl.checkpoint(writes)?;
        }
        let Some(w) = &mut self.eowc else {
            return Ok(());
        };
        w.open.checkpoint(writes);
        let late = std::mem::take(&mut w.late);
        if let (Some(table), Some(store)) = (w.late_table, &w.store)
            && !late.is_empty()
        {
            // The epoch's late rows, added to the counts committed so far.
            let late: Vec<((u16, i64), i64)> = late.into_iter().collect();
            let ends =
                TimestampMicrosecondArray::from_iter_values(late.iter().map(|((_, e), _)| *e));
            let keys = late_codec()?.encode(&[Arc::new(ends) as ArrayRef])?;
            let at: Vec<(u16, &[u8])> = late
                .iter()
                .zip(&keys)
                .map(|(((kg, _), _), k)| (*kg, k.as_slice()))
                .collect();
            let counts = store.get_many(table, &at)?;
            for ((((key_group, _), added), key), count) in late.into_iter().zip(keys).zip(counts) {
                let count = match count {
                    Some(bytes) => crate::operator::stored_count(&bytes, "late row count")?,
                    None => 0,
                };
                writes.push(StateWrite {
                    table,
                    key_group,
                    key,
                    value: Some((count + added).to_be_bytes().to_vec()),
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::arrow::datatypes::DataType;
    use datafusion::logical_expr::col;
    use planner::spec::AggKind;

    fn agg(kind: AggKind, arg: &str, output_type: DataType) -> AggCall {
        AggCall {
            kind,
            arg: col(arg),
            output_type,
            distinct: false,
            filter: None,
            delimiter: None,
            delimiter_expr: None,
            order_by: Vec::new(),
            order_options: Vec::new(),
            append_only_input: false,
        }
    }

    fn op(global: bool) -> HashAgg {
        let input = int_schema(&["a", "b"]);
        let mut names = vec!["a", "cnt", "sum", "min", "max", "avg"];
        if global {
            names.remove(0);
        }
        let mut output = int_schema(&names);
        if let Some(f) = output.fields().last() {
            let mut fields: Vec<_> = output.fields().iter().map(|f| f.as_ref().clone()).collect();
            let last = fields.len() - 1;
            fields[last] = f.as_ref().clone().with_data_type(DataType::Float64);
            output = DFSchema::try_from(datafusion::arrow::datatypes::Schema::new(fields)).unwrap();
        }
        let groups = if global { vec![] } else { vec![col("a")] };
        HashAgg::new(
            &groups,
            &[
                agg(AggKind::Count, "b", DataType::Int64),
                agg(AggKind::Sum, "b", DataType::Int64),
                agg(AggKind::Min, "b", DataType::Int64),
                agg(AggKind::Max, "b", DataType::Int64),
                agg(AggKind::Avg, "b", DataType::Float64),
            ],
            &input,
            &output,
            7,
        )
        .unwrap()
    }

    fn feed(a: &mut HashAgg, ops: &[Op], x: &[i64], y: &[Option<i64>]) -> Vec<String> {
        let (c, _) = chunk(
            ops,
            vec![
                ints(&x.iter().map(|v| Some(*v)).collect::<Vec<_>>()),
                ints(y),
            ],
        );
        let mut out = vec![];
        a.process_batch(0, c, &mut out).unwrap();
        pretty(&out)
    }

    #[test]
    fn min_and_max_survive_deleting_the_extreme() {
        let mut a = op(false);
        assert_eq!(
            feed(
                &mut a,
                &[Op::Insert, Op::Insert, Op::Insert],
                &[1, 1, 2],
                &[Some(5), Some(9), None]
            ),
            vec!["+I 1 2 14 5 9 7.0", "+I 2 0 NULL NULL NULL NULL"]
        );
        assert_eq!(
            feed(&mut a, &[Op::Delete], &[1], &[Some(9)]),
            vec!["-U 1 2 14 5 9 7.0", "+U 1 1 5 5 5 5.0"]
        );
        assert_eq!(
            feed(&mut a, &[Op::Delete], &[1], &[Some(5)]),
            vec!["-D 1 1 5 5 5 5.0"]
        );
    }

    #[test]
    fn state_round_trips_through_checkpoint() {
        let mut a = op(false);
        feed(
            &mut a,
            &[Op::Insert, Op::Insert],
            &[1, 1],
            &[Some(5), Some(9)],
        );
        let mut writes = vec![];
        a.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let state = Arc::new(MemState(std::sync::Mutex::new(writes)));
        let mut b = op(false);
        b.on_start(&ctx(state), &mut vec![]).unwrap();
        assert_eq!(
            feed(&mut b, &[Op::Delete], &[1], &[Some(5)]),
            vec!["-U 1 2 14 5 9 7.0", "+U 1 1 9 9 9 9.0"]
        );
    }

    #[test]
    fn state_ttl_forgets_idle_groups_and_their_rows() {
        let mut a = op(false).with_state_ttl(Some(1_000_000));
        let none: Vec<String> = vec![];
        assert_eq!(
            feed(&mut a, &[Op::Insert], &[1], &[Some(5)]),
            vec!["+I 1 1 5 5 5 5.0"]
        );
        let due = a.next_timer().expect("a timer for the group");
        let mut out = vec![];
        a.on_timer(due - 1, &mut out).unwrap();
        assert!(out.is_empty(), "not yet");
        a.on_timer(due, &mut out).unwrap();
        assert_eq!(pretty(&out), vec!["-D 1 1 5 5 5 5.0"]);
        assert_eq!(a.next_timer(), None);
        // A retraction of a forgotten row is ignored; the key starts afresh.
        assert_eq!(feed(&mut a, &[Op::Delete], &[1], &[Some(5)]), none);
        assert_eq!(
            feed(&mut a, &[Op::Insert], &[1], &[Some(7)]),
            vec!["+I 1 1 7 7 7 7.0"]
        );
        let mut writes = vec![];
        a.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let groups = writes.iter().filter(|w| w.key[0] < 0x10).count();
        assert_eq!(groups, 1, "the group's state, written again");
        // Its expiry and timer, beside it.
        assert!(writes.iter().any(|w| w.key[0] == super::super::ttl::EXPIRY));
    }

    #[test]
    fn global_aggregate_has_a_row_when_empty() {
        let mut a = op(true);
        let mut out = vec![];
        a.on_start(&ctx(Arc::new(MemState::default())), &mut out)
            .unwrap();
        assert_eq!(pretty(&out), vec!["+I 0 NULL NULL NULL NULL"]);
        assert_eq!(
            feed(&mut a, &[Op::Insert], &[1], &[Some(3)]),
            vec!["-U 0 NULL NULL NULL NULL", "+U 1 3 3 3 3.0"]
        );
        assert_eq!(
            feed(&mut a, &[Op::Delete], &[1], &[Some(3)]),
            vec!["-U 1 3 3 3 3.0", "+U 0 NULL NULL NULL NULL"]
        );
    }

    #[test]
    fn emit_on_window_close_emits_closed_windows_once_and_survives_a_restore() {
        // Group key `a` plays window_end (µs).
        let state = Arc::new(MemState::default());
        let mut w = op(false).emit_on_window_close(0, Some(99), false);
        w.on_start(&ctx(state.clone()), &mut vec![]).unwrap();
        let none: Vec<String> = vec![];
        assert_eq!(
            feed(
                &mut w,
                &[Op::Insert, Op::Insert, Op::Insert],
                &[10, 10, 20],
                &[Some(1), Some(2), Some(5)]
            ),
            none
        );
        let mut out = vec![];
        let wm = Watermark {
            column: 0,
            timestamp: 15,
        };
        assert_eq!(w.handle_watermark(wm, &mut out).unwrap(), Some(wm));
        assert_eq!(pretty(&out), vec!["+I 10 2 3 1 2 1.5"]);
        // A row for the closed window is late, twice.
        assert_eq!(feed(&mut w, &[Op::Insert], &[10], &[Some(9)]), none);
        assert_eq!(feed(&mut w, &[Op::Insert], &[10], &[Some(8)]), none);
        let late_counts = |state: &MemState| -> Vec<i64> {
            state
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|w| w.table == 99)
                .filter_map(|w| w.value.as_ref())
                .map(|v| i64::from_be_bytes(v[..8].try_into().unwrap()))
                .collect()
        };
        let mut writes = vec![];
        w.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        // The closed window's group is deleted, the open one's kept.
        let groups: Vec<(u8, bool)> = writes
            .iter()
            .filter(|w| w.table == 7 && w.key.first().is_some_and(|b| *b < 0x10))
            .map(|w| (*w.key.last().unwrap(), w.value.is_some()))
            .collect();
        assert_eq!(groups, vec![(10, false), (20, true)]);
        state.put(writes).unwrap();
        assert_eq!(late_counts(&state), vec![2]);

        let mut again = op(false).emit_on_window_close(0, Some(99), false);
        let mut c = ctx(state.clone());
        c.restored_from = Some(1);
        again.on_start(&c, &mut vec![]).unwrap();
        // One more late row adds to the count committed.
        again.handle_watermark(wm, &mut vec![]).unwrap();
        assert_eq!(feed(&mut again, &[Op::Insert], &[10], &[Some(7)]), none);
        let mut out = vec![];
        again
            .handle_watermark(
                Watermark {
                    column: 0,
                    timestamp: 20,
                },
                &mut out,
            )
            .unwrap();
        assert_eq!(pretty(&out), vec!["+I 20 1 5 5 5 5.0"]);
        let mut writes = vec![];
        again
            .handle_checkpoint(&Barrier::checkpoint(2), &mut writes)
            .unwrap();
        state.put(writes).unwrap();
        assert_eq!(late_counts(&state).last(), Some(&3));
    }

    /// Per group `a`: count(DISTINCT b), min(b), max(b),
    /// last_value(b ORDER BY b DESC) (the least), sum(b).
    fn set_op() -> HashAgg {
        let input = int_schema(&["a", "b"]);
        let output = int_schema(&["a", "distinct", "min", "max", "last", "sum"]);
        let mut distinct = agg(AggKind::Count, "b", DataType::Int64);
        distinct.distinct = true;
        let mut last = agg(AggKind::LastValue, "b", DataType::Int64);
        last.order_by = vec![col("b")];
        last.order_options = vec![(true, false)];
        HashAgg::new(
            &[col("a")],
            &[
                distinct,
                agg(AggKind::Min, "b", DataType::Int64),
                agg(AggKind::Max, "b", DataType::Int64),
                last,
                agg(AggKind::Sum, "b", DataType::Int64),
            ],
            &input,
            &output,
            7,
        )
        .unwrap()
    }

    #[test]
    fn a_group_far_past_memory_keeps_a_page_of_its_values_and_the_right_answers() {
        use crate::state::StateStore;
        use storage::memory::MemoryPool;
        let state = Arc::new(MemState::default());
        let pool = Arc::new(MemoryPool::new(64 << 10));
        let start = |restored: bool| {
            let mut a = set_op();
            a.on_start(&rocksdb_ctx(state.clone(), &pool, restored), &mut vec![])
                .unwrap();
            a
        };
        let mut a = start(false);
        // The recomputation: group 1's values and their copies.
        let mut values = std::collections::BTreeMap::<i64, i64>::new();
        let mut shown = std::collections::BTreeMap::<String, i64>::new();
        let mut next = random_below(11u64);
        for step in 0..300 {
            let (mut ops, mut bs) = (vec![], vec![]);
            for _ in 0..10 {
                // Mostly inserts; deletes often of the least or the
                // greatest value, so that values from past the first
                // page come up.
                if !values.is_empty() && next(3) == 0 {
                    let b = match next(3) {
                        0 => *values.keys().next().unwrap(),
                        1 => *values.keys().next_back().unwrap(),
                        _ => *values
                            .keys()
                            .nth(next(values.len() as u64) as usize)
                            .unwrap(),
                    };
                    *values.get_mut(&b).unwrap() -= 1;
                    if values[&b] == 0 {
                        values.remove(&b);
                    }
                    ops.push(Op::Delete);
                    bs.push(Some(b));
                } else {
                    let b = next(5_000) as i64;
                    *values.entry(b).or_default() += 1;
                    ops.push(Op::Insert);
                    bs.push(Some(b));
                }
            }
            for line in feed(&mut a, &ops, &vec![1; ops.len()], &bs) {
                let (op, row) = line.split_at(3);
                let sign = if op == "+I " || op == "+U " { 1 } else { -1 };
                *shown.entry(row.to_string()).or_default() += sign;
            }
            shown.retain(|_, n| *n != 0);
            let expected: Vec<String> = match (values.keys().next(), values.keys().next_back()) {
                (Some(min), Some(max)) => {
                    let sum: i64 = values.iter().map(|(v, c)| v * c).sum();
                    vec![format!("1 {} {min} {max} {min} {sum}", values.len())]
                }
                _ => vec![],
            };
            assert_eq!(
                shown.keys().cloned().collect::<Vec<_>>(),
                expected,
                "step {step}"
            );
            assert!(shown.values().all(|n| *n == 1), "step {step}: {shown:?}");
            let sets = a.sets.as_ref().unwrap().report();
            assert!(sets.bytes_in_memory <= 64 << 10, "step {step}: {sets:?}");
            if step == 150 {
                // A checkpoint, as the task applies it, then a restore.
                let mut writes = vec![];
                a.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
                    .unwrap();
                state.put(writes).unwrap();
                drop(a);
                a = start(true);
            }
        }
        assert!(values.len() > 700, "{} values", values.len());
        // Four value sets (count, min, max, last_value) of hundreds of
        // values each: memory holds a small part of them.
        let sets = a.sets.as_ref().unwrap().report();
        assert!(
            sets.bytes_in_memory < 32 << 10,
            "{} values: {sets:?}",
            values.len()
        );
    }

    #[test]
    fn a_multiset_kept_in_the_group_by_an_earlier_version_moves_into_its_value_set() {
        // Group 1 with values 5 and 9, 9 twice, as an earlier version
        // wrote it: each multiset inline, max's in ascending order.
        let ascending = RowCodec::new(vec![DataType::Int64]).unwrap();
        let enc = |v: i64| ascending.encode(&[ints(&[Some(v)])]).unwrap().remove(0);
        let set: std::collections::BTreeMap<Vec<u8>, i64> =
            [(enc(5), 1), (enc(9), 2)].into_iter().collect();
        let g = Group {
            rows: 3,
            accs: vec![
                AccState::Values(set.clone()),
                AccState::Values(set.clone()),
                AccState::Values(set.clone()),
                AccState::Values(set),
                AccState::SumI64 { sum: 23, n: 3 },
            ],
        };
        let key_column = ints(&[Some(1)]);
        let key = RowCodec::new(vec![DataType::Int64])
            .unwrap()
            .encode(std::slice::from_ref(&key_column))
            .unwrap()
            .remove(0);
        let key_group = expr::key_groups(&[key_column], 1).unwrap()[0];
        // last_value(b ORDER BY b DESC) was kept under its sort key.
        let descending = RowCodec::sorted(vec![
            (DataType::Int64, true, false),
            (DataType::Int64, false, false),
        ])
        .unwrap();
        let enc2 = |v: i64| {
            descending
                .encode(&[ints(&[Some(v)]), ints(&[Some(v)])])
                .unwrap()
                .remove(0)
        };
        let mut g = g;
        g.accs[3] = AccState::Values([(enc2(5), 1), (enc2(9), 2)].into_iter().collect());
        let state = Arc::new(MemState::default());
        crate::state::StateStore::put(
            state.as_ref(),
            vec![StateWrite {
                table: 7,
                key_group,
                key,
                value: Some(GroupCodec { aggs: 5 }.encode(&g)),
            }],
        )
        .unwrap();
        for backend_ctx in [
            {
                let mut c = ctx(state.clone());
                c.restored_from = Some(1);
                c
            },
            rocksdb_ctx(
                state.clone(),
                &Arc::new(storage::memory::MemoryPool::new(64 << 20)),
                true,
            ),
        ] {
            let mut a = set_op();
            a.on_start(&backend_ctx, &mut vec![]).unwrap();
            assert_eq!(
                feed(&mut a, &[Op::Delete], &[1], &[Some(9)]),
                vec!["-U 1 2 5 9 5 23", "+U 1 2 5 9 5 14"]
            );
            assert_eq!(
                feed(&mut a, &[Op::Delete], &[1], &[Some(9)]),
                vec!["-U 1 2 5 9 5 14", "+U 1 1 5 5 5 5"]
            );
            assert_eq!(
                feed(&mut a, &[Op::Insert], &[1], &[Some(7)]),
                vec!["-U 1 1 5 5 5 5", "+U 1 2 5 7 5 12"]
            );
            assert_eq!(feed(&mut a, &[Op::Insert], &[1], &[Some(7)]).len(), 2);
            assert_eq!(feed(&mut a, &[Op::Delete], &[1], &[Some(7)]).len(), 2);
        }
    }

    #[test]
    fn group_keys_start_below_the_tags_of_the_tables_other_state() {
        use datafusion::arrow::array::{BooleanArray, Float64Array, ListArray, StringArray};
        use datafusion::arrow::datatypes::Int32Type;
        let columns: Vec<ArrayRef> = vec![
            ints(&[Some(1), None, Some(-5), Some(i64::MAX)]),
            Arc::new(StringArray::from(vec![
                Some(""),
                None,
                Some("x"),
                Some("\u{ff}"),
            ])),
            Arc::new(BooleanArray::from(vec![
                Some(true),
                None,
                Some(false),
                Some(true),
            ])),
            Arc::new(Float64Array::from(vec![
                Some(-0.0),
                None,
                Some(f64::NAN),
                Some(1e300),
            ])),
            Arc::new(ListArray::from_iter_primitive::<Int32Type, _, _>(vec![
                Some(vec![Some(1)]),
                None,
                Some(vec![]),
                Some(vec![None]),
            ])),
        ];
        for c in &columns {
            let codec = RowCodec::new(vec![c.data_type().clone()]).unwrap();
            for key in codec.encode(std::slice::from_ref(c)).unwrap() {
                assert!(key[0] < 0x10, "{:?} starts with {}", c.data_type(), key[0]);
            }
        }
    }
}

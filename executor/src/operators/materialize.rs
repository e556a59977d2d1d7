//! Materialize: the last operator of every view's job. It keeps the view's
//! rows as a multiset (row → count) and writes the changed rows at every
//! checkpoint; the committed state table *is* the view that `SELECT` reads
//! (see [`read_view`]). With a changelog it also records each row's net
//! change per checkpoint epoch, for `SUBSCRIBE` (see [`super::changelog`]).

use std::ops::Range;

use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use storage::chunk::Chunk;
use storage::codec::RowCodec;
use storage::state::{StateEntry, StateScan, StateWrite};

use super::changelog::{Change, Changelog, OPEN_EPOCH};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::state::{I64Codec, StateCache};
use crate::{Result, expr};

pub struct Materialize {
    codec: RowCodec,
    state_table: u64,
    /// Row → count.
    rows: StateCache<I64Codec>,
    /// With a changelog: [`OPEN_EPOCH`] ‖ row → the row's count at the
    /// last barrier, for the rows changed since. One epoch's changes, kept
    /// like any state: with the rocksdb backend what outgrows memory waits
    /// in the changelog's table until the barrier.
    before: Option<StateCache<I64Codec>>,
    changelog: Option<Changelog>,
    key_groups: Range<u16>,
}

fn open_key(row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(OPEN_EPOCH.len() + row.len());
    k.extend_from_slice(&OPEN_EPOCH);
    k.extend_from_slice(row);
    k
}

/// A view row's count.
const COUNT: I64Codec = I64Codec("view row count");

fn codec_for(schema: &SchemaRef) -> Result<RowCodec> {
    Ok(RowCodec::new(
        schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect(),
    )?)
}

impl Materialize {
    pub fn new(schema: &DFSchema, state_table: u64, changelog: Option<Changelog>) -> Result<Self> {
        Ok(Self {
            codec: codec_for(&expr::output_schema(schema))?,
            state_table,
            rows: StateCache::new(state_table, "Materialize", COUNT),
            before: changelog.as_ref().map(|log| {
                StateCache::new(log.table(), "Materialize (changelog)", COUNT)
                    .under(OPEN_EPOCH[0]..=OPEN_EPOCH[0])
                    .uncounted()
            }),
            changelog,
            key_groups: 0..storage::keys::MAX_PARALLELISM,
        })
    }
}

impl Operator for Materialize {
    fn name(&self) -> &'static str {
        "Materialize"
    }

    fn tables(&self) -> Vec<u64> {
        let mut tables = vec![self.state_table];
        tables.extend(self.changelog.as_ref().map(Changelog::table));
        tables
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        if let Some(log) = &mut self.changelog {
            log.start(ctx);
        }
        if let Some(before) = &mut self.before {
            before.start(ctx)?;
        }
        self.key_groups = ctx.key_groups.clone();
        self.rows.start(ctx)
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, _out: &mut Collector) -> Result<()> {
        let data = chunk.data();
        let key_groups = expr::key_groups(data.columns(), chunk.num_rows())?;
        let encoded = self.codec.encode_rows(data.columns(), chunk.num_rows())?;
        self.rows.load(
            encoded
                .iter()
                .map(Vec::as_slice)
                .zip(key_groups.iter().copied()),
        )?;
        let open: Vec<Vec<u8>> = match &mut self.before {
            Some(before) => {
                let open: Vec<Vec<u8>> = encoded.iter().map(|r| open_key(r)).collect();
                before.load(
                    open.iter()
                        .map(Vec::as_slice)
                        .zip(key_groups.iter().copied()),
                )?;
                open
            }
            None => Vec::new(),
        };
        for (r, row) in encoded.into_iter().enumerate() {
            let sign = chunk.op(r).sign();
            let count = self.rows.get_mut(&row, key_groups[r])?;
            let before = count.unwrap_or(0);
            // A count may dip below zero for a while: a row's insert and
            // delete can come from different upstream subtasks, in either
            // order. At a barrier every channel has delivered its part, so
            // committed counts are exact.
            *count = Some(before + sign).filter(|c| *c != 0);
            if let Some(cache) = &mut self.before {
                let then = cache.get_mut(&open[r], key_groups[r])?;
                if then.is_none() {
                    *then = Some(before);
                }
            }
        }
        if let Some(before) = &mut self.before {
            before.settle()?;
        }
        self.rows.settle()
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.rows.report());
        out.extend(self.before.as_ref().map(StateCache::report));
    }

    fn handle_checkpoint(&mut self, barrier: &Barrier, writes: &mut Vec<StateWrite>) -> Result<()> {
        if let (Some(before), Some(log)) = (&mut self.before, &mut self.changelog) {
            // The epoch's net change of each row it touched, a page at a
            // time, into the changelog.
            let rows = &mut self.rows;
            before.drain(self.key_groups.clone(), OPEN_EPOCH[0], |page| {
                let page: Vec<(Vec<u8>, u16, i64)> = page
                    .into_iter()
                    .map(|(key, kg, then)| (key[OPEN_EPOCH.len()..].to_vec(), kg, then))
                    .collect();
                rows.load(page.iter().map(|(row, kg, _)| (row.as_slice(), *kg)))?;
                let mut changes = Vec::new();
                for (row, key_group, then) in page {
                    let now = rows.get(&row, key_group)?.copied().unwrap_or(0);
                    if now != then {
                        changes.push(Change {
                            key_group,
                            row,
                            diff: now - then,
                        });
                    }
                }
                rows.settle()?;
                log.record(barrier, changes)
            })?;
            log.checkpoint(barrier, writes)?;
        }
        self.rows.checkpoint(writes)
    }
}

/// The committed rows of a view in some key groups (all of them:
/// `0..MAX_PARALLELISM`), each repeated by its count.
pub fn read_view(
    state: &dyn StateScan,
    state_table: u64,
    schema: &SchemaRef,
    key_groups: std::ops::Range<u16>,
) -> Result<Vec<RecordBatch>> {
    Ok(read_view_page(state, state_table, schema, key_groups, None, usize::MAX)?.0)
}

/// Where [`read_view_page`] goes on: a key group and the key to start
/// from in it.
pub type ViewCursor = (u16, Vec<u8>);

/// About `limit` of a view's rows in `key_groups`, from `cursor` on (the
/// start when `None`), and where the next page starts (`None`: no more):
/// a view read a page at a time, so that what a reader holds does not
/// grow with the view.
pub fn read_view_page(
    state: &dyn StateScan,
    state_table: u64,
    schema: &SchemaRef,
    key_groups: std::ops::Range<u16>,
    cursor: Option<ViewCursor>,
    limit: usize,
) -> Result<(Vec<RecordBatch>, Option<ViewCursor>)> {
    let limit = limit.max(1);
    let (mut key_group, mut from) = cursor.unwrap_or((key_groups.start, Vec::new()));
    let mut entries = Vec::new();
    while key_group < key_groups.end && entries.len() < limit {
        let want = limit - entries.len();
        let page = state.scan_state_from(state_table, key_group, &from, want)?;
        match page.last() {
            Some(last) if page.len() == want => {
                from = last.key.clone();
                from.push(0);
            }
            _ => {
                key_group += 1;
                from.clear();
            }
        }
        entries.extend(page);
    }
    let next = (key_group < key_groups.end).then_some((key_group, from));
    Ok((rows_from_entries(&entries, schema)?, next))
}

/// A view's rows from its state entries (row → count).
pub fn rows_from_entries(entries: &[StateEntry], schema: &SchemaRef) -> Result<Vec<RecordBatch>> {
    let codec = codec_for(schema)?;
    // The key counts beside the rows (`crate::state`) are not rows.
    let rows: Vec<&StateEntry> = entries
        .iter()
        .filter(|e| e.key.first() != Some(&crate::state::COUNT_TAG))
        .collect();
    let mut batches = Vec::new();
    for page in rows.chunks(8192) {
        let unique = codec.decode_batch(schema, page.iter().map(|e| e.key.as_slice()))?;
        let mut indices = Vec::with_capacity(page.len());
        for (i, e) in page.iter().enumerate() {
            let count = i64::from_be_bytes(e.value.as_slice().try_into().unwrap_or_default());
            indices.extend(std::iter::repeat_n(i as u32, count.max(0) as usize));
        }
        if indices.len() == page.len() {
            batches.push(unique);
        } else {
            batches.push(take_record_batch(&unique, &UInt32Array::from(indices))?);
        }
    }
    Ok(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, chunk, ctx, int_schema, ints, rocksdb_ctx};
    use crate::state::StateStore;
    use datafusion::arrow::array::AsArray;
    use std::sync::Arc;
    use storage::chunk::Op;

    fn feed(m: &mut Materialize, ops: &[Op], a: &[i64]) {
        let (c, _) = chunk(
            ops,
            vec![ints(&a.iter().map(|v| Some(*v)).collect::<Vec<_>>())],
        );
        m.process_batch(0, c, &mut vec![]).unwrap();
    }

    #[test]
    fn keeps_a_multiset_and_writes_only_changed_rows() {
        let schema = int_schema(&["a"]);
        let mut m = Materialize::new(&schema, 9, None).unwrap();
        feed(&mut m, &[Op::Insert, Op::Insert, Op::Insert], &[1, 1, 2]);
        let mut writes = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        assert_eq!(writes.len(), 2, "two distinct rows");
        feed(&mut m, &[Op::Delete, Op::Delete], &[1, 2]);
        let mut more = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(2), &mut more)
            .unwrap();
        assert_eq!(
            more.iter().filter(|w| w.value.is_none()).count(),
            1,
            "row 2 is gone"
        );
        // Restore from the committed writes and read the view back.
        writes.extend(more);
        let state = Arc::new(MemState(std::sync::Mutex::new(writes.clone())));
        let mut restored = Materialize::new(&schema, 9, None).unwrap();
        restored.on_start(&ctx(state), &mut vec![]).unwrap();
        assert_eq!(restored.rows.stats().keys, 1);

        let dir = tempfile::tempdir().unwrap();
        let store = storage::KvStore::open(dir.path(), 1 << 20).unwrap();
        store.write_state(writes).unwrap();
        let batches = read_view(
            &store,
            9,
            &expr::output_schema(&schema),
            0..storage::keys::MAX_PARALLELISM,
        )
        .unwrap();
        let n: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(n, 1);
    }

    #[test]
    fn the_changelog_holds_each_epochs_net_change_per_row() {
        let schema = int_schema(&["a"]);
        let mut m = Materialize::new(&schema, 9, Some(Changelog::new(10, 60_000))).unwrap();
        let state = Arc::new(MemState::default());
        m.on_start(&ctx(state.clone()), &mut vec![]).unwrap();
        // The changelog's entries of an epoch, as (epoch, diff).
        let diffs = |epoch: u64| -> Vec<(u64, i64)> {
            let mut d: Vec<(u64, i64)> = state
                .0
                .lock()
                .unwrap()
                .iter()
                .filter(|w| w.table == 10 && w.key[..8] == epoch.to_be_bytes())
                .map(|w| {
                    let v = w.value.as_ref().unwrap();
                    (epoch, i64::from_be_bytes(v[8..16].try_into().unwrap()))
                })
                .collect();
            d.sort();
            d
        };
        feed(&mut m, &[Op::Insert, Op::Insert, Op::Insert], &[1, 1, 2]);
        let mut writes = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        state.put(writes).unwrap();
        assert_eq!(diffs(1), vec![(1, 1), (1, 2)]);
        // Row 3 comes and goes within the epoch: no change for it.
        feed(&mut m, &[Op::Insert, Op::Delete, Op::Delete], &[3, 3, 1]);
        let mut more = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(2), &mut more)
            .unwrap();
        state.put(more).unwrap();
        assert_eq!(diffs(2), vec![(2, -1)]);
        assert_eq!(m.tables(), vec![9, 10]);
    }

    #[test]
    fn an_epoch_with_more_changes_than_memory_waits_in_the_store() {
        let schema = int_schema(&["a"]);
        let mut m = Materialize::new(&schema, 9, Some(Changelog::new(10, 60_000))).unwrap();
        let state = Arc::new(MemState::default());
        // Room for a few hundred keys per cache.
        let pool = Arc::new(storage::memory::MemoryPool::new(64 << 10));
        let c = rocksdb_ctx(state.clone(), &pool, false);
        m.on_start(&c, &mut vec![]).unwrap();
        // Epoch 1: rows 0..5000 once; epoch 2: each even row again, each
        // row divisible by 3 gone.
        let all: Vec<i64> = (0..5000).collect();
        for part in all.chunks(500) {
            feed(&mut m, &vec![Op::Insert; part.len()], part);
        }
        let mut writes = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        state.put(writes).unwrap();
        let before = m.before.as_ref().unwrap().stats();
        assert!(before.evictions > 0, "the epoch outgrew memory: {before:?}");
        let even: Vec<i64> = (0..5000).filter(|v| v % 2 == 0).collect();
        for part in even.chunks(500) {
            feed(&mut m, &vec![Op::Insert; part.len()], part);
        }
        let thirds: Vec<i64> = (0..5000).filter(|v| v % 3 == 0).collect();
        for part in thirds.chunks(500) {
            feed(&mut m, &vec![Op::Delete; part.len()], part);
        }
        let mut writes = vec![];
        m.handle_checkpoint(&Barrier::checkpoint(2), &mut writes)
            .unwrap();
        state.put(writes).unwrap();

        // Each epoch's diffs, by row, recomputed apart.
        let codec = codec_for(&expr::output_schema(&schema)).unwrap();
        let mut got: std::collections::BTreeMap<(u64, i64), i64> = Default::default();
        let mut open = 0;
        let entries = state.scan(10, 0..storage::keys::MAX_PARALLELISM).unwrap();
        for e in &entries {
            if e.key.starts_with(&OPEN_EPOCH) {
                open += 1;
                continue;
            }
            if e.key.is_empty() {
                continue;
            }
            let epoch = u64::from_be_bytes(e.key[..8].try_into().unwrap());
            let cols = codec.decode(std::iter::once(&e.key[8..])).unwrap();
            let a = cols[0]
                .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                .value(0);
            got.insert(
                (epoch, a),
                i64::from_be_bytes(e.value[8..16].try_into().unwrap()),
            );
        }
        assert_eq!(open, 0, "nothing of an open epoch is left in the store");
        let mut want = std::collections::BTreeMap::new();
        for a in 0..5000i64 {
            want.insert((1, a), 1);
            let diff = i64::from(a % 2 == 0) - i64::from(a % 3 == 0);
            if diff != 0 {
                want.insert((2, a), diff);
            }
        }
        assert_eq!(got.len(), want.len());
        assert_eq!(got, want);
    }
}

//! A view's changelog: how its rows changed at each checkpoint epoch, kept
//! for the view's `retain_history` so that `SUBSCRIBE` can follow the view
//! and a subscriber can resume from the last epoch it saw, with no gap and
//! no duplicate. The Materialize operator writes it next to the view's rows,
//! in the same checkpoint, so a completed checkpoint *n* holds every epoch
//! up to *n* — a reader of checkpoint *n* sees whole epochs or none.
//!
//! Layout of the changelog state table, each change in its row's key group:
//! * `epoch · row` → `barrier time · diff`: the row's net change in the
//!   epoch (the count after checkpoint `epoch` minus the count before it);
//!   epoch and time are big-endian u64, diff a big-endian i64.
//! * the empty key → the *horizon*: the last epoch trimmed from this key
//!   group. Every epoch after the largest horizon of any key group is whole.
//! * [`OPEN_EPOCH`] `· row` → the row's count before the epoch in progress,
//!   for rows the Materialize operator let go of from memory; deleted at
//!   the barrier, before the snapshot, so never in a checkpoint.
//!
//! Trimming goes by the barrier's time, which every subtask reads from the
//! same barrier, so all subtasks keep and drop the same epochs.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use storage::codec::RowCodec;
use storage::state::{StateEntry, StateScan, StateWrite};

use crate::message::Barrier;
use crate::operator::OperatorContext;
use crate::state::StateStore;
use crate::{ExecError, Result};

/// The key prefix of the epoch in progress (see the module docs).
pub(crate) const OPEN_EPOCH: [u8; 8] = [0xFF; 8];

/// One row's net change in an epoch, in its key group.
pub struct Change {
    pub key_group: u16,
    pub row: Vec<u8>,
    pub diff: i64,
}

/// The writer's side, owned by a Materialize operator.
pub struct Changelog {
    table: u64,
    retain_ms: u64,
    state: Option<Arc<dyn StateStore>>,
    key_groups: Range<u16>,
    /// Epochs this subtask has written since it started → barrier time.
    epochs: BTreeMap<u64, u64>,
    /// Restored entries may be older than anything in `epochs`.
    restored: bool,
}

impl Changelog {
    pub fn new(table: u64, retain_ms: u64) -> Self {
        Self {
            table,
            retain_ms,
            state: None,
            key_groups: 0..0,
            epochs: BTreeMap::new(),
            restored: false,
        }
    }

    pub fn table(&self) -> u64 {
        self.table
    }

    pub fn start(&mut self, ctx: &OperatorContext) {
        self.state = Some(ctx.state.clone());
        self.key_groups = ctx.key_groups.clone();
        self.restored = ctx.restored_from.is_some();
    }

    /// Writes some of epoch `barrier.checkpoint_id`'s changes into the
    /// store, before [`Changelog::checkpoint`] of the same barrier (a page
    /// at a time, so that an epoch with many changes needs no more memory
    /// than a page).
    pub fn record(&mut self, barrier: &Barrier, changes: Vec<Change>) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let mut writes = Vec::with_capacity(changes.len());
        self.write(barrier, changes, &mut writes);
        match &self.state {
            Some(state) => state.put(writes),
            None => Err(ExecError::Service(
                "a view's changelog written before it started".into(),
            )),
        }
    }

    /// Deletes the epochs older than the retention, at the barrier, but
    /// none after the barrier's `keep_after` (a reading view needs them).
    pub fn checkpoint(&mut self, barrier: &Barrier, writes: &mut Vec<StateWrite>) -> Result<()> {
        let cutoff = barrier.timestamp_ms.saturating_sub(self.retain_ms);
        let keep_after = barrier.keep_after;
        let aged = self
            .epochs
            .first_key_value()
            .is_some_and(|(e, t)| *t < cutoff && *e <= keep_after);
        if self.restored || aged {
            self.trim(cutoff, keep_after, writes)?;
            self.restored = false;
            self.epochs.retain(|e, t| *t >= cutoff || *e > keep_after);
        }
        Ok(())
    }

    fn write(&mut self, barrier: &Barrier, changes: Vec<Change>, writes: &mut Vec<StateWrite>) {
        self.epochs
            .insert(barrier.checkpoint_id, barrier.timestamp_ms);
        let mut value = Vec::with_capacity(16);
        value.extend_from_slice(&barrier.timestamp_ms.to_be_bytes());
        for c in changes {
            let mut key = Vec::with_capacity(8 + c.row.len());
            key.extend_from_slice(&barrier.checkpoint_id.to_be_bytes());
            key.extend_from_slice(&c.row);
            value.truncate(8);
            value.extend_from_slice(&c.diff.to_be_bytes());
            writes.push(StateWrite {
                table: self.table,
                key_group: c.key_group,
                key,
                value: Some(value.clone()),
            });
        }
    }

    /// Deletes, in each key group, the entries written before `cutoff`
    /// (of epochs up to `keep_after`) and moves the key group's horizon to the last epoch deleted. The
    /// aged epochs are the key group's first ones (keys start with the
    /// epoch, and epochs go by time): the first entry of each epoch is
    /// read to find where they end, and they go as one range, so a trim
    /// costs a read per epoch, not per change (after a restart, or with a
    /// long retention, an epoch can hold millions of changes).
    fn trim(&self, cutoff: u64, keep_after: u64, writes: &mut Vec<StateWrite>) -> Result<()> {
        let Some(state) = &self.state else {
            return Ok(());
        };
        for kg in self.key_groups.clone() {
            let mut last_trimmed = None;
            let mut from = vec![0u8];
            while let Some(e) = state.scan_from(self.table, kg, &from, 1)?.pop() {
                if e.key.starts_with(&OPEN_EPOCH) {
                    break;
                }
                let (epoch, time, _) = decode(&e.key, &e.value)?;
                if time >= cutoff || epoch > keep_after {
                    break;
                }
                last_trimmed = Some(epoch);
                // (Up to OPEN_EPOCH, at most: no epoch is that large.)
                from = epoch.saturating_add(1).to_be_bytes().to_vec();
            }
            if let Some(epoch) = last_trimmed {
                state.delete_range(self.table, kg, &[0], &from)?;
                writes.push(StateWrite {
                    table: self.table,
                    key_group: kg,
                    key: Vec::new(),
                    value: Some(epoch.to_be_bytes().to_vec()),
                });
            }
        }
        Ok(())
    }
}

fn corrupt(what: &str) -> ExecError {
    storage::StorageError::Corrupt(format!("view changelog: {what}")).into()
}

/// (epoch, barrier time, diff) of a changelog entry.
fn decode(key: &[u8], value: &[u8]) -> Result<(u64, u64, i64)> {
    let epoch = key
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt("short key"))?;
    let time = value
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .map(u64::from_be_bytes)
        .ok_or_else(|| corrupt("short value"))?;
    let diff = value
        .get(8..16)
        .and_then(|b| b.try_into().ok())
        .map(i64::from_be_bytes)
        .ok_or_else(|| corrupt("short value"))?;
    Ok((epoch, time, diff))
}

/// The columns of [`read_changes`]' batches: `epoch`, `diff`, then the
/// view's.
pub fn changes_schema(view: &SchemaRef) -> SchemaRef {
    let mut fields = vec![
        Field::new("epoch", DataType::Int64, false),
        Field::new("diff", DataType::Int64, false),
    ];
    fields.extend(view.fields().iter().map(|f| f.as_ref().clone()));
    Arc::new(Schema::new(fields))
}

/// A view's changes after epoch `since`, as committed in `state`.
pub struct Changes {
    /// Every epoch after this one is whole; `since` must not be older.
    pub horizon: u64,
    /// Rows of [`changes_schema`], in epoch order.
    pub batches: Vec<RecordBatch>,
}

/// Reads a view's changes after epoch `since` in some key groups, a page
/// at a time, in the order a subscriber applies them: by epoch, and in
/// each epoch its deletes before its inserts. No page holds two epochs, or
/// deletes and inserts both, so that pages from readers of other key
/// groups merge by their first row. Memory is a page, whatever the size
/// of an epoch or of the history.
///
/// Each key group's next epoch with changes is found with one seek, so a
/// read costs a seek per key group and epoch that has changes, plus the
/// changes (read twice, once per kind). The horizons are read first: when
/// `since` is older than one of them the reader is refused anyway, so no
/// change is read (a `SINCE 0` on a view with a long history would read
/// all of it).
pub struct ChangeReader {
    table: u64,
    schema: SchemaRef,
    view: SchemaRef,
    codec: RowCodec,
    horizon: u64,
    /// (next epoch with changes, key group) of every key group not at it.
    next: BinaryHeap<Reverse<(u64, u16)>>,
    at: Option<Position>,
}

/// Where a [`ChangeReader`] is: the epoch, which kind of change, the key
/// groups with changes in the epoch, and the last key read in the current
/// one.
struct Position {
    epoch: u64,
    inserts: bool,
    key_groups: Vec<u16>,
    index: usize,
    after: Option<Vec<u8>>,
}

impl ChangeReader {
    pub fn open(
        state: &dyn StateScan,
        table: u64,
        view: &SchemaRef,
        key_groups: Range<u16>,
        since: u64,
    ) -> Result<Self> {
        let mut horizon = 0;
        for kg in key_groups.clone() {
            for h in state.scan_state_from(table, kg, &[], 1)? {
                if h.key.is_empty() {
                    horizon = horizon.max(epoch_of(&h.value)?);
                }
            }
        }
        let mut reader = Self {
            table,
            schema: changes_schema(view),
            view: view.clone(),
            codec: RowCodec::new(
                view.fields()
                    .iter()
                    .map(|f| f.data_type().clone())
                    .collect(),
            )?,
            horizon,
            next: BinaryHeap::new(),
            at: None,
        };
        if since >= horizon {
            for kg in key_groups {
                reader.seek(state, kg, since.saturating_add(1))?;
            }
        }
        Ok(reader)
    }

    /// Every epoch after this one is whole; `since` must not be older
    /// (if it is, the reader reads nothing).
    pub fn horizon(&self) -> u64 {
        self.horizon
    }

    /// Notes `key_group`'s first epoch with changes from `epoch` on.
    fn seek(&mut self, state: &dyn StateScan, key_group: u16, epoch: u64) -> Result<()> {
        if let Some(e) = state
            .scan_state_from(self.table, key_group, &epoch.to_be_bytes(), 1)?
            .pop()
            && !e.key.starts_with(&OPEN_EPOCH)
        {
            self.next.push(Reverse((
                epoch_of(&e.key[..8.min(e.key.len())])?,
                key_group,
            )));
        }
        Ok(())
    }

    /// The next page of at most about `limit` changes, as rows of
    /// [`changes_schema`]; `None` when all are read.
    pub fn next_page(
        &mut self,
        state: &dyn StateScan,
        limit: usize,
    ) -> Result<Option<RecordBatch>> {
        let limit = limit.max(1);
        let mut rows: Vec<(i64, Vec<u8>)> = Vec::new();
        loop {
            let Some(at) = &mut self.at else {
                let Some(Reverse((epoch, _))) = self.next.peek().copied() else {
                    return Ok(None);
                };
                let mut key_groups = Vec::new();
                while let Some(Reverse((e, kg))) = self.next.peek().copied()
                    && e == epoch
                {
                    self.next.pop();
                    key_groups.push(kg);
                }
                key_groups.sort_unstable();
                self.at = Some(Position {
                    epoch,
                    inserts: false,
                    key_groups,
                    index: 0,
                    after: None,
                });
                continue;
            };
            let prefix = at.epoch.to_be_bytes();
            let kg = at.key_groups[at.index];
            let from = at.after.as_deref().unwrap_or(&prefix);
            let want = limit - rows.len();
            let page = state.scan_state_prefix_from(self.table, kg, &prefix, from, want)?;
            let full = page.len() == want;
            if let Some(last) = page.last() {
                // The next key after the last read.
                let mut after = last.key.clone();
                after.push(0);
                at.after = Some(after);
            }
            for e in page {
                let (_, _, diff) = decode(&e.key, &e.value)?;
                if (diff > 0) == at.inserts {
                    rows.push((diff, e.key[8..].to_vec()));
                }
            }
            if !full {
                // This key group is done with this kind of change.
                at.index += 1;
                at.after = None;
                if at.index == at.key_groups.len() {
                    let (epoch, inserts) = (at.epoch, at.inserts);
                    if inserts {
                        let done = self.at.take().map(|p| p.key_groups).unwrap_or_default();
                        for kg in done {
                            self.seek(state, kg, epoch.saturating_add(1))?;
                        }
                    } else {
                        at.inserts = true;
                        at.index = 0;
                    }
                    if !rows.is_empty() {
                        return self.batch(epoch, rows).map(Some);
                    }
                    continue;
                }
            }
            if rows.len() >= limit {
                let epoch = at.epoch;
                return self.batch(epoch, rows).map(Some);
            }
        }
    }

    fn batch(&self, epoch: u64, rows: Vec<(i64, Vec<u8>)>) -> Result<RecordBatch> {
        let decoded = self
            .codec
            .decode_batch(&self.view, rows.iter().map(|(_, r)| r.as_slice()))?;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch as i64; rows.len()])),
            Arc::new(Int64Array::from_iter_values(rows.iter().map(|(d, _)| *d))),
        ];
        columns.extend(decoded.columns().iter().cloned());
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

fn epoch_of(bytes: &[u8]) -> Result<u64> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| corrupt("epoch"))
}

/// The changes after epoch `since` among a changelog's entries, in
/// [`ChangeReader`]'s order and pages.
pub fn changes_from_entries(
    entries: &[StateEntry],
    view: &SchemaRef,
    since: u64,
) -> Result<Changes> {
    let mut horizon = 0;
    let mut changes: Vec<(u64, i64, &[u8])> = Vec::new();
    for e in entries {
        if e.key.is_empty() {
            let epoch = e
                .value
                .as_slice()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| corrupt("horizon"))?;
            horizon = horizon.max(epoch);
            continue;
        }
        let (epoch, _, diff) = decode(&e.key, &e.value)?;
        if epoch > since {
            changes.push((epoch, diff, &e.key[8..]));
        }
    }
    changes.sort_by_key(|(epoch, diff, _)| (*epoch, *diff > 0));
    let codec = RowCodec::new(
        view.fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect(),
    )?;
    let schema = changes_schema(view);
    let mut batches = Vec::new();
    let pages = changes
        .chunk_by(|a, b| (a.0, a.1 > 0) == (b.0, b.1 > 0))
        .flat_map(|same| same.chunks(8192));
    for page in pages {
        let rows = codec.decode_batch(view, page.iter().map(|(_, _, r)| *r))?;
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from_iter_values(
                page.iter().map(|(e, _, _)| *e as i64),
            )),
            Arc::new(Int64Array::from_iter_values(
                page.iter().map(|(_, d, _)| *d),
            )),
        ];
        columns.extend(rows.columns().iter().cloned());
        batches.push(RecordBatch::try_new(schema.clone(), columns)?);
    }
    Ok(Changes { horizon, batches })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx};
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::Int64Type;

    fn barrier(id: u64, at: u64) -> Barrier {
        Barrier {
            timestamp_ms: at,
            ..Barrier::checkpoint(id)
        }
    }

    fn change(kg: u16, row: &[u8], diff: i64) -> Change {
        Change {
            key_group: kg,
            row: row.to_vec(),
            diff,
        }
    }

    /// Applies writes to the committed state, as a checkpoint would.
    fn commit(state: &MemState, writes: Vec<StateWrite>) {
        state.0.lock().unwrap().extend(writes);
    }

    fn row(v: i64) -> Vec<u8> {
        let codec = RowCodec::new(vec![DataType::Int64]).unwrap();
        codec
            .encode(&[Arc::new(Int64Array::from(vec![Some(v)])) as ArrayRef])
            .unwrap()
            .remove(0)
    }

    #[test]
    fn trims_by_barrier_time_and_moves_the_horizon() {
        let state = Arc::new(MemState::default());
        let mut log = Changelog::new(5, 10_000);
        log.start(&ctx(state.clone()));
        let mut w = vec![];
        log.record(&barrier(1, 1_000), vec![change(3, &row(1), 1)])
            .unwrap();
        log.checkpoint(&barrier(1, 1_000), &mut w).unwrap();
        log.record(&barrier(2, 2_000), vec![change(9, &row(2), -1)])
            .unwrap();
        log.checkpoint(&barrier(2, 2_000), &mut w).unwrap();
        assert!(w.is_empty(), "the changes went into the store");
        // At 11.5 s epoch 1 (1 s) has aged out, epoch 2 (2 s) has not.
        log.checkpoint(&barrier(4, 11_500), &mut w).unwrap();
        let aged = [1u64.to_be_bytes().as_slice(), &row(1)].concat();
        assert_eq!(
            state.get(5, 3, &aged).unwrap(),
            None,
            "deleted in the store"
        );
        let kept = [2u64.to_be_bytes().as_slice(), &row(2)].concat();
        assert!(state.get(5, 9, &kept).unwrap().is_some(), "epoch 2 kept");
        assert_eq!(
            w,
            vec![StateWrite {
                table: 5,
                key_group: 3,
                key: vec![],
                value: Some(1u64.to_be_bytes().to_vec())
            }],
            "the horizon moves at the barrier; key group 9 keeps epoch 2"
        );
        commit(&state, std::mem::take(&mut w));
        // Nothing aged: no scan, no writes.
        log.checkpoint(&barrier(5, 11_600), &mut w).unwrap();
        assert!(w.is_empty());
        log.record(&barrier(6, 12_000), vec![change(9, &row(42), 2)])
            .unwrap();
        log.checkpoint(&barrier(6, 12_000), &mut w).unwrap();
        commit(&state, w);

        let dir = tempfile::tempdir().unwrap();
        let kv = storage::KvStore::open(dir.path(), 1 << 20).unwrap();
        let committed = state.0.lock().unwrap().clone();
        kv.write_state(committed).unwrap();
        let view: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let changes = read_all(&kv, &view, 1, 100);
        assert_eq!(changes.0, 1, "horizon");
        assert_eq!(
            changes.1,
            vec![vec![(2, -1, 2)], vec![(6, 2, 42)]],
            "(epoch, diff, row) in order"
        );
        assert!(read_all(&kv, &view, 6, 100).1.is_empty());
        // From before the horizon: refused by the reader, so nothing read.
        assert_eq!(read_all(&kv, &view, 0, 100), (1, vec![]));
    }

    #[test]
    fn a_reader_keeps_the_epochs_after_its_position_past_the_retention() {
        let state = Arc::new(MemState::default());
        let mut log = Changelog::new(5, 1_000);
        log.start(&ctx(state.clone()));
        let mut w = vec![];
        for (epoch, at) in [(1, 1_000), (2, 2_000), (3, 3_000)] {
            log.record(&barrier(epoch, at), vec![change(0, &row(epoch as i64), 1)])
                .unwrap();
            log.checkpoint(&barrier(epoch, at), &mut w).unwrap();
        }
        w.clear();
        let at = |epoch: u64| [epoch.to_be_bytes().as_slice(), &row(epoch as i64)].concat();
        // Every epoch has aged out, but a reader is at epoch 1.
        log.checkpoint(&barrier(4, 60_000).keeping_after(1), &mut w)
            .unwrap();
        assert_eq!(state.get(5, 0, &at(1)).unwrap(), None, "epoch 1 went");
        assert!(state.get(5, 0, &at(2)).unwrap().is_some(), "epoch 2 kept");
        assert!(state.get(5, 0, &at(3)).unwrap().is_some(), "epoch 3 kept");
        // The reader moved on.
        log.checkpoint(&barrier(5, 61_000).keeping_after(2), &mut w)
            .unwrap();
        assert_eq!(state.get(5, 0, &at(2)).unwrap(), None, "epoch 2 went");
        assert!(state.get(5, 0, &at(3)).unwrap().is_some(), "epoch 3 kept");
    }

    /// A reader's horizon and pages, each as (epoch, diff, a) rows.
    #[allow(clippy::type_complexity)]
    fn read_all(
        kv: &storage::KvStore,
        view: &SchemaRef,
        since: u64,
        limit: usize,
    ) -> (u64, Vec<Vec<(i64, i64, i64)>>) {
        let mut reader = ChangeReader::open(kv, 5, view, 0..128, since).unwrap();
        let mut pages = Vec::new();
        while let Some(b) = reader.next_page(kv, limit).unwrap() {
            let col = |i: usize| b.column(i).as_primitive::<Int64Type>().values().to_vec();
            let (e, d, a) = (col(0), col(1), col(2));
            pages.push((0..b.num_rows()).map(|i| (e[i], d[i], a[i])).collect());
        }
        (reader.horizon(), pages)
    }

    #[test]
    fn pages_go_by_epoch_deletes_first_and_hold_one_kind() {
        // Epoch 3: key groups 1 and 7 both insert and delete; epoch 5 only
        // key group 7; epoch 4 nothing. Pages of at most 2 changes.
        let mut w = Vec::new();
        let mut put = |kg: u16, epoch: u64, a: i64, diff: i64| {
            let mut value = 1_000u64.to_be_bytes().to_vec();
            value.extend_from_slice(&diff.to_be_bytes());
            w.push(StateWrite {
                table: 5,
                key_group: kg,
                key: [epoch.to_be_bytes().as_slice(), &row(a)].concat(),
                value: Some(value),
            });
        };
        put(1, 3, 10, 1);
        put(1, 3, 11, -1);
        put(1, 3, 12, 3);
        put(7, 3, 20, -2);
        put(7, 3, 21, 1);
        put(7, 3, 22, -1);
        put(7, 5, 30, 1);
        put(1, 2, 99, 1);
        let dir = tempfile::tempdir().unwrap();
        let kv = storage::KvStore::open(dir.path(), 1 << 20).unwrap();
        kv.write_state(w).unwrap();
        let view: SchemaRef = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        let (horizon, pages) = read_all(&kv, &view, 2, 2);
        assert_eq!(horizon, 0);
        assert_eq!(
            pages,
            vec![
                vec![(3, -1, 11), (3, -2, 20)],
                vec![(3, -1, 22)],
                vec![(3, 1, 10), (3, 3, 12)],
                vec![(3, 1, 21)],
                vec![(5, 1, 30)],
            ],
            "epoch 2 is not after since; each page one epoch and one kind"
        );
        // The whole read in one page per (epoch, kind).
        let (_, pages) = read_all(&kv, &view, 0, 1000);
        assert_eq!(pages.len(), 4, "{pages:?}");
        assert_eq!(pages[0], vec![(2, 1, 99)]);
        // The same entries, read whole, come in the same order and pages.
        let entries = kv.scan_state(5, 0..128).unwrap();
        let whole = changes_from_entries(&entries, &view, 2).unwrap();
        let rows: Vec<usize> = whole.batches.iter().map(|b| b.num_rows()).collect();
        assert_eq!(rows, vec![3, 3, 1]);
    }

    #[test]
    fn a_restored_subtask_trims_what_it_did_not_write() {
        let state = Arc::new(MemState::default());
        let mut first = Changelog::new(5, 1_000);
        first.start(&ctx(state.clone()));
        let mut w = vec![];
        first
            .record(&barrier(1, 1_000), vec![change(0, b"x", 1)])
            .unwrap();
        first.checkpoint(&barrier(1, 1_000), &mut w).unwrap();
        commit(&state, w);
        let mut restored = Changelog::new(5, 1_000);
        let mut c = ctx(state.clone());
        c.restored_from = Some(1);
        restored.start(&c);
        let mut w = vec![];
        restored.checkpoint(&barrier(2, 5_000), &mut w).unwrap();
        let aged = [1u64.to_be_bytes().as_slice(), b"x"].concat();
        assert_eq!(state.get(5, 0, &aged).unwrap(), None, "entry deleted");
        assert_eq!(w.len(), 1, "horizon set: {w:?}");
    }
}

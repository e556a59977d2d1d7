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

use std::collections::BTreeMap;
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

    /// Deletes the epochs older than the retention, at the barrier.
    pub fn checkpoint(&mut self, barrier: &Barrier, writes: &mut Vec<StateWrite>) -> Result<()> {
        let cutoff = barrier.timestamp_ms.saturating_sub(self.retain_ms);
        let aged = self
            .epochs
            .first_key_value()
            .is_some_and(|(_, t)| *t < cutoff);
        if self.restored || aged {
            self.trim(cutoff, writes)?;
            self.restored = false;
            self.epochs.retain(|_, t| *t >= cutoff);
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
    /// and moves the key group's horizon to the last epoch deleted. The
    /// aged epochs are the key group's first ones (keys start with the
    /// epoch, and epochs go by time): the first entry of each epoch is
    /// read to find where they end, and they go as one range, so a trim
    /// costs a read per epoch, not per change (after a restart, or with a
    /// long retention, an epoch can hold millions of changes).
    fn trim(&self, cutoff: u64, writes: &mut Vec<StateWrite>) -> Result<()> {
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
                if time >= cutoff {
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

/// Reads the changes of epochs after `since` in `key_groups`. The
/// horizons are read first: when `since` is older than one of them the
/// reader is refused anyway, so no change is read (a `SINCE 0` on a view
/// with a long history would read all of it).
pub fn read_changes(
    state: &dyn StateScan,
    table: u64,
    view: &SchemaRef,
    key_groups: Range<u16>,
    since: u64,
) -> Result<Changes> {
    let mut entries = Vec::new();
    for kg in key_groups.clone() {
        entries.extend(
            state
                .scan_state_from(table, kg, &[], 1)?
                .into_iter()
                .filter(|h| h.key.is_empty()),
        );
    }
    let gone = changes_from_entries(&entries, view, since)?;
    if since < gone.horizon {
        return Ok(gone);
    }
    let from = since.saturating_add(1).to_be_bytes();
    for kg in key_groups {
        entries.extend(state.scan_state_from(table, kg, &from, usize::MAX)?);
    }
    changes_from_entries(&entries, view, since)
}

/// The changes after epoch `since` among a changelog's entries.
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
    changes.sort_by_key(|(epoch, _, _)| *epoch);
    let codec = RowCodec::new(
        view.fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect(),
    )?;
    let schema = changes_schema(view);
    let mut batches = Vec::new();
    for page in changes.chunks(8192) {
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
        let changes = read_changes(&kv, 5, &view, 0..128, 1).unwrap();
        assert_eq!(changes.horizon, 1);
        let b = &changes.batches[0];
        let col = |i: usize| b.column(i).as_primitive::<Int64Type>().values().to_vec();
        assert_eq!(col(0), vec![2, 6], "epochs, in order");
        assert_eq!(col(1), vec![-1, 2], "diffs");
        assert_eq!(col(2), vec![2, 42], "rows");
        let later = read_changes(&kv, 5, &view, 0..128, 6).unwrap();
        assert!(later.batches.is_empty());
        // From before the horizon: refused by the reader, so nothing read.
        let gone = read_changes(&kv, 5, &view, 0..128, 0).unwrap();
        assert_eq!((gone.horizon, gone.batches.len()), (1, 0));
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

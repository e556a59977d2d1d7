//! The state store of one TaskManager.
//!
//! Operators never write RocksDB directly. At a checkpoint barrier each
//! operator hands its changed keys to its task, the task hands them to the
//! TaskManager with its acknowledgement, and they are **staged** here under
//! `(job, checkpoint)`. When the JobMaster declares the checkpoint complete the
//! TaskManager **commits** it: every staged write of that job up to that
//! checkpoint, plus the job's committed checkpoint id, in one atomic, synced
//! write batch. RocksDB therefore holds exactly the state of the latest
//! committed checkpoint of every job, which is what restarts restore and what
//! `SELECT` reads.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use crate::keys::{self, JOB_CHECKPOINT, MAX_PARALLELISM};
use crate::kv::KvWrite;
use crate::{KvStore, Result, StorageError};

/// One key written by an operator at a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub table: u64,
    pub key_group: u16,
    pub key: Vec<u8>,
    /// `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

/// A committed state entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub key_group: u16,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

type Staged = BTreeMap<(u64, u64), Vec<KvWrite>>;

/// Operator state of one TaskManager, with staged (uncommitted) checkpoints.
#[derive(Debug)]
pub struct StateStore {
    kv: Arc<KvStore>,
    staged: Mutex<Staged>,
}

impl StateStore {
    pub fn new(kv: Arc<KvStore>) -> Self {
        Self {
            kv,
            staged: Mutex::new(BTreeMap::new()),
        }
    }

    fn staged(&self) -> Result<std::sync::MutexGuard<'_, Staged>> {
        self.staged
            .lock()
            .map_err(|_| StorageError::Internal("state store lock poisoned".into()))
    }

    /// Stages one subtask's writes for checkpoint `checkpoint` of `job`.
    pub fn stage(&self, job: u64, checkpoint: u64, writes: Vec<StateWrite>) -> Result<()> {
        let mut staged = self.staged()?;
        let entry = staged.entry((job, checkpoint)).or_default();
        entry.extend(
            writes
                .into_iter()
                .map(|w| (keys::state_key(w.table, w.key_group, &w.key), w.value)),
        );
        Ok(())
    }

    /// Commits every staged checkpoint of `job` up to `checkpoint`, atomically.
    pub fn commit(&self, job: u64, checkpoint: u64) -> Result<()> {
        let writes: Vec<KvWrite> = {
            let mut staged = self.staged()?;
            let ids: Vec<(u64, u64)> = staged
                .range((job, 0)..=(job, checkpoint))
                .map(|(k, _)| *k)
                .collect();
            ids.into_iter()
                .flat_map(|k| staged.remove(&k).unwrap_or_default())
                .collect()
        };
        let marker = (
            keys::with_id(JOB_CHECKPOINT, job),
            Some(checkpoint.to_be_bytes().to_vec()),
        );
        self.kv
            .write(writes.into_iter().chain(std::iter::once(marker)), true)
    }

    /// Forgets staged checkpoints of `job` (after a failure or when dropped).
    pub fn discard_staged(&self, job: u64) -> Result<()> {
        self.staged()?.retain(|(j, _), _| *j != job);
        Ok(())
    }

    /// The last committed checkpoint of `job`, if any.
    pub fn committed_checkpoint(&self, job: u64) -> Result<Option<u64>> {
        Ok(match self.kv.get(&keys::with_id(JOB_CHECKPOINT, job))? {
            Some(v) => {
                Some(u64::from_be_bytes(v.as_slice().try_into().map_err(
                    |_| StorageError::Corrupt("checkpoint id".into()),
                )?))
            }
            None => None,
        })
    }

    /// The committed entries of `table` in `key_groups`.
    pub fn scan(&self, table: u64, key_groups: std::ops::Range<u16>) -> Result<Vec<StateEntry>> {
        self.scan_many(&[table], key_groups)
            .map(|mut v| v.pop().unwrap_or_default())
    }

    /// Committed entries of several tables, read from one snapshot.
    pub fn scan_many(
        &self,
        tables: &[u64],
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<Vec<StateEntry>>> {
        self.kv.with_snapshot(|snap| {
            tables
                .iter()
                .map(|t| {
                    let (from, to) = keys::state_range(*t, key_groups.clone());
                    Ok(snap
                        .scan(&from, &to, usize::MAX)?
                        .into_iter()
                        .map(|(k, v)| {
                            let (key_group, key) = keys::split_state_key(&k);
                            StateEntry {
                                key_group,
                                key: key.to_vec(),
                                value: v,
                            }
                        })
                        .collect())
                })
                .collect()
        })
    }

    /// Removes a dropped job's tables and checkpoint marker.
    /// Writes committed entries restored from elsewhere (a checkpoint
    /// downloaded from the JobManager's checkpoint storage): `(table, entry)`.
    pub fn import(&self, entries: Vec<(u64, StateEntry)>) -> Result<()> {
        self.kv.write(
            entries
                .into_iter()
                .map(|(t, e)| (keys::state_key(t, e.key_group, &e.key), Some(e.value))),
            false,
        )
    }

    pub fn drop_job(&self, job: u64, tables: &[u64]) -> Result<()> {
        self.discard_staged(job)?;
        for t in tables {
            let (from, to) = keys::state_range(*t, 0..MAX_PARALLELISM);
            self.kv.delete_range(&from, &to, false)?;
        }
        self.kv
            .write([(keys::with_id(JOB_CHECKPOINT, job), None)], true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(table: u64, kg: u16, key: &str, value: Option<&str>) -> StateWrite {
        StateWrite {
            table,
            key_group: kg,
            key: key.into(),
            value: value.map(|v| v.into()),
        }
    }

    #[test]
    fn staged_writes_are_invisible_until_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::new(Arc::new(KvStore::open(dir.path(), 1 << 20).unwrap()));
        store.stage(1, 1, vec![w(7, 3, "a", Some("1"))]).unwrap();
        store
            .stage(
                1,
                2,
                vec![w(7, 3, "a", Some("2")), w(7, 90, "b", Some("x"))],
            )
            .unwrap();
        assert!(store.scan(7, 0..128).unwrap().is_empty());
        store.commit(1, 1).unwrap();
        assert_eq!(store.scan(7, 0..128).unwrap()[0].value, b"1");
        assert_eq!(store.committed_checkpoint(1).unwrap(), Some(1));
        store.commit(1, 2).unwrap();
        let all = store.scan(7, 0..128).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].value, b"2");
        assert_eq!(store.scan(7, 64..128).unwrap().len(), 1);
        store.stage(1, 3, vec![w(7, 3, "a", None)]).unwrap();
        store.commit(1, 3).unwrap();
        assert_eq!(store.scan(7, 0..128).unwrap().len(), 1);
    }
}

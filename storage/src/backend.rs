//! A stateful subtask's keyed state backend: Flink's
//! `RocksDBKeyedStateBackend` with incremental checkpoints.
//!
//! Each stateful subtask owns one RocksDB instance in its slot's directory,
//! sharing the slot's memory ([`SlotMemory`]). A checkpoint has two parts,
//! as in Flink:
//!
//! * **synchronous**, on the task once the barrier has aligned
//!   ([`KeyedStateBackend::snapshot`]): the operators' changed keys are
//!   written and a RocksDB checkpoint — a memtable flush and hard links to
//!   the live SST files — is taken into a local directory;
//! * **asynchronous**, while the task goes on: the new SST files and the
//!   private files are copied to checkpoint storage
//!   ([`CheckpointStorage::upload`], reusing the SST files of the last
//!   checkpoint it was told is complete) and the subtask's [`StateHandle`]
//!   goes to the JobMaster with its acknowledgement.
//!
//! The live instance runs ahead of the last completed checkpoint by the
//! checkpoints still pending, so `SELECT` reads the local RocksDB
//! checkpoint of the last *completed* one ([`KeyedStateBackend::read_view`]),
//! opened read-only when first asked for.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::checkpoint_storage::{
    CheckpointStorage, FileHandle, HandleFormat, LocalSnapshot, StateHandle, TableRange,
};
use crate::kv::SlotMemory;
use crate::state::{StateEntry, StateScan, StateWrite};
use crate::{KvStore, Result, StorageError};

/// Why a snapshot failed.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The operators' changes were not written: the backend is unusable.
    #[error("state changes could not be written: {0}")]
    Lost(StorageError),
    /// Only this checkpoint failed.
    #[error(transparent)]
    Declined(StorageError),
}

#[derive(Debug, Default)]
struct Inner {
    /// SST files of the last completed checkpoint, by local name: already
    /// in checkpoint storage, so the next snapshot references them.
    confirmed: HashMap<String, FileHandle>,
    /// Files uploaded for checkpoints not yet known to be complete.
    uploaded: BTreeMap<u64, Vec<FileHandle>>,
    /// Local RocksDB checkpoints, by id.
    local: BTreeMap<u64, PathBuf>,
    /// The completed checkpoint readers see, opened when first read.
    view: Option<(u64, Option<Arc<KvStore>>)>,
}

/// One stateful subtask's state; see the module docs.
#[derive(Debug)]
pub struct KeyedStateBackend {
    /// Taken only by `drop`, to close RocksDB before its directory goes.
    kv: Option<KvStore>,
    /// The slot's memory, for reopening the instance on restore.
    memory: SlotMemory,
    dir: PathBuf,
    /// Unique prefix of its shared files' names in checkpoint storage.
    instance: String,
    vertex: usize,
    subtask: usize,
    tables: Vec<TableRange>,
    inner: Mutex<Inner>,
}

fn io_err(e: std::io::Error) -> StorageError {
    StorageError::from_io(e, "local state")
}

impl KeyedStateBackend {
    /// Creates an empty backend in `dir` (deleting what was there) for
    /// subtask `subtask` of vertex `vertex`, owning `tables`.
    pub fn create(
        dir: PathBuf,
        memory: &SlotMemory,
        (vertex, subtask): (usize, usize),
        tables: Vec<TableRange>,
    ) -> Result<Self> {
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_err)?;
        }
        std::fs::create_dir_all(&dir).map_err(io_err)?;
        let kv = KvStore::open_in_slot(&dir.join("db"), memory)?;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        Ok(Self {
            kv: Some(kv),
            memory: memory.clone(),
            dir,
            instance: format!("{vertex}-{subtask}-{nanos:x}"),
            vertex,
            subtask,
            tables,
            inner: Mutex::new(Inner::default()),
        })
    }

    fn kv(&self) -> Result<&KvStore> {
        self.kv
            .as_ref()
            .ok_or_else(|| StorageError::Internal("state backend closed".into()))
    }

    fn inner(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| StorageError::Internal("state backend lock poisoned".into()))
    }

    pub fn tables(&self) -> &[TableRange] {
        &self.tables
    }

    /// The live value of one key (what operators read while they run).
    pub fn get(&self, table: u64, key_group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.kv()?.get_state(table, key_group, key)
    }

    /// The live values of several keys of `table`, in order.
    pub fn get_many(&self, table: u64, keys: &[(u16, &[u8])]) -> Result<Vec<Option<Vec<u8>>>> {
        self.kv()?.get_states(table, keys)
    }

    /// The bytes `table`'s keys take in the instance's files.
    pub fn disk_bytes(&self, table: u64) -> Result<u64> {
        let (from, to) = crate::keys::state_range(table, 0..crate::keys::MAX_PARALLELISM);
        Ok(self.kv()?.disk_bytes(&from, &to))
    }

    /// Writes keys an operator let go of between barriers: they are part
    /// of the next snapshot, as the keys it hands over at the barrier are.
    pub fn put(&self, writes: Vec<StateWrite>) -> Result<()> {
        self.kv()?.write_state(writes)
    }

    /// Deletes a range of keys between barriers, as [`Self::put`] writes
    /// them (see [`KvStore::delete_state_range`]).
    pub fn delete_range(&self, table: u64, key_group: u16, from: &[u8], to: &[u8]) -> Result<()> {
        self.kv()?.delete_state_range(table, key_group, from, to)
    }

    /// The synchronous part of checkpoint `id`: writes the operators'
    /// changes and takes a local RocksDB checkpoint.
    ///
    /// If the changes cannot be written the backend no longer matches its
    /// operators and must not be snapshotted again ([`SnapshotError::Lost`]:
    /// the task has to restart from the last completed checkpoint); if only
    /// the RocksDB checkpoint fails, this checkpoint is lost but the
    /// backend is sound ([`SnapshotError::Declined`]).
    pub fn snapshot(
        &self,
        id: u64,
        writes: Vec<StateWrite>,
    ) -> std::result::Result<LocalSnapshot, SnapshotError> {
        self.kv()
            .and_then(|kv| kv.write_state(writes))
            .map_err(SnapshotError::Lost)?;
        self.local_checkpoint(id).map_err(SnapshotError::Declined)
    }

    fn local_checkpoint(&self, id: u64) -> Result<LocalSnapshot> {
        let dir = self.dir.join(format!("chk-{id}"));
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(io_err)?;
        }
        if let Err(e) = self.kv()?.checkpoint_to(&dir) {
            // A half-made checkpoint would only take space (a full disk
            // would stay full).
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io_err)? {
            let entry = entry.map_err(io_err)?;
            let size = entry.metadata().map_err(io_err)?.len();
            files.push((entry.file_name().to_string_lossy().into_owned(), size));
        }
        files.sort();
        self.inner()?.local.insert(id, dir.clone());
        Ok(LocalSnapshot { dir, files })
    }

    /// The asynchronous part: uploads the snapshot of checkpoint `id` and
    /// returns the subtask's handle.
    pub async fn upload(
        &self,
        storage: &CheckpointStorage,
        job: u64,
        id: u64,
        snapshot: &LocalSnapshot,
    ) -> Result<StateHandle> {
        let reuse = self.inner()?.confirmed.clone();
        let files = storage
            .upload(
                job,
                id,
                (self.vertex, self.subtask),
                &self.instance,
                snapshot,
                &reuse,
            )
            .await?;
        self.inner()?.uploaded.insert(id, files.clone());
        Ok(StateHandle {
            vertex: self.vertex,
            subtask: self.subtask,
            tables: self.tables.clone(),
            files,
            format: HandleFormat::RocksDb,
        })
    }

    /// Checkpoint `id` is complete: its files become the base of the next
    /// snapshot and its local copy what readers see.
    pub fn complete(&self, id: u64) -> Result<()> {
        let stale: Vec<PathBuf> = {
            let mut inner = self.inner()?;
            if let Some(files) = inner.uploaded.remove(&id) {
                inner.confirmed = files
                    .into_iter()
                    .filter(|f| f.shared)
                    .map(|f| (f.name.clone(), f))
                    .collect();
            }
            inner.uploaded.retain(|k, _| *k > id);
            if !inner.local.contains_key(&id) {
                return Ok(());
            }
            inner.view = Some((id, None));
            let keep = inner.local.split_off(&id);
            std::mem::replace(&mut inner.local, keep)
                .into_values()
                .collect()
        };
        // An open reader of an older view keeps its (unlinked) files.
        for dir in stale {
            std::fs::remove_dir_all(dir).map_err(io_err)?;
        }
        Ok(())
    }

    /// Checkpoint `id` will not complete.
    pub fn abort(&self, id: u64) -> Result<()> {
        let dir = {
            let mut inner = self.inner()?;
            inner.uploaded.remove(&id);
            if inner.view.as_ref().is_some_and(|(v, _)| *v == id) {
                return Ok(());
            }
            inner.local.remove(&id)
        };
        if let Some(dir) = dir {
            std::fs::remove_dir_all(dir).map_err(io_err)?;
        }
        Ok(())
    }

    /// The state of the last completed checkpoint, for readers; `None`
    /// before the first.
    pub fn read_view(&self) -> Result<Option<Arc<KvStore>>> {
        let mut inner = self.inner()?;
        let Some((id, open)) = inner.view.clone() else {
            return Ok(None);
        };
        if let Some(kv) = open {
            return Ok(Some(kv));
        }
        let dir = inner
            .local
            .get(&id)
            .cloned()
            .ok_or_else(|| StorageError::Internal(format!("no local checkpoint {id}")))?;
        let kv = Arc::new(KvStore::open_read_only(&dir)?);
        inner.view = Some((id, Some(kv.clone())));
        Ok(Some(kv))
    }

    /// Restores the state of `handles` (a completed checkpoint's, for this
    /// subtask's tables and key groups), then makes it the read view of
    /// checkpoint `id`.
    ///
    /// The handle that holds most of the subtask's key groups becomes the
    /// instance itself: its files are downloaded into the instance's
    /// directory and opened, and the key groups that are not the subtask's
    /// are deleted as ranges, so the time this takes depends on the files,
    /// not on the number of keys (Flink's incremental RocksDB restore).
    /// Other handles (after a rescale) have their overlapping key groups
    /// copied in. Returns the entries copied.
    pub async fn restore(
        &mut self,
        storage: &CheckpointStorage,
        id: u64,
        handles: &[StateHandle],
    ) -> Result<usize> {
        let base = handles
            .iter()
            .enumerate()
            .filter(|(_, h)| h.format == HandleFormat::RocksDb)
            .map(|(i, h)| (self.overlap(h), i))
            .filter(|(n, _)| *n > 0)
            .max()
            .map(|(_, i)| i);
        if let Some(i) = base {
            self.open_in_place(storage, &handles[i]).await?;
        }
        let mut restored = 0;
        for (i, handle) in handles.iter().enumerate() {
            if Some(i) == base {
                continue;
            }
            if handle.format == HandleFormat::Canonical {
                for t in &self.tables {
                    let entries =
                        crate::savepoint::read_canonical(storage, handle, t.table, &t.key_groups)
                            .await?;
                    restored += entries.len();
                    self.kv()?.import_state(t.table, entries)?;
                }
                continue;
            }
            if self.overlap(handle) == 0 {
                continue;
            }
            let scratch = self.dir.join(format!("restore-{i}"));
            let source = open_handle(storage, handle, &scratch).await?;
            for t in &self.tables {
                for h in handle.tables.iter().filter(|h| h.table == t.table) {
                    let from = t.key_groups.start.max(h.key_groups.start);
                    let to = t.key_groups.end.min(h.key_groups.end);
                    if from < to {
                        let entries = source.scan_state(t.table, from..to)?;
                        restored += entries.len();
                        self.kv()?.import_state(t.table, entries)?;
                    }
                }
            }
            drop(source);
            std::fs::remove_dir_all(&scratch).map_err(io_err)?;
        }
        self.local_checkpoint(id)?;
        self.complete(id)?;
        Ok(restored)
    }

    /// How many (table, key group) pairs of this subtask `handle` holds.
    fn overlap(&self, handle: &StateHandle) -> usize {
        let mut n = 0;
        for t in &self.tables {
            for h in handle.tables.iter().filter(|h| h.table == t.table) {
                let from = t.key_groups.start.max(h.key_groups.start);
                let to = t.key_groups.end.min(h.key_groups.end);
                n += to.saturating_sub(from) as usize;
            }
        }
        n
    }

    /// Makes `handle`'s snapshot the live instance, without what is not
    /// this subtask's.
    async fn open_in_place(
        &mut self,
        storage: &CheckpointStorage,
        handle: &StateHandle,
    ) -> Result<()> {
        let db = self.dir.join("db");
        drop(self.kv.take());
        std::fs::remove_dir_all(&db).map_err(io_err)?;
        storage.fetch(handle, &db).await?;
        let kv = KvStore::open_in_slot(&db, &self.memory)?;
        for h in &handle.tables {
            let ours = self
                .tables
                .iter()
                .find(|t| t.table == h.table)
                .map(|t| t.key_groups.clone());
            let foreign = match ours {
                None => vec![h.key_groups.clone()],
                Some(r) => vec![
                    h.key_groups.start..r.start.min(h.key_groups.end),
                    r.end.max(h.key_groups.start)..h.key_groups.end,
                ],
            };
            for range in foreign.into_iter().filter(|r| r.start < r.end) {
                let (from, to) = crate::keys::state_range(h.table, range);
                kv.delete_range(&from, &to, false)?;
            }
        }
        self.kv = Some(kv);
        Ok(())
    }
}

impl StateScan for KeyedStateBackend {
    /// The live state (what the subtask's operators restore from).
    fn scan_state(&self, table: u64, key_groups: std::ops::Range<u16>) -> Result<Vec<StateEntry>> {
        self.kv()?.scan_state(table, key_groups)
    }

    fn scan_state_from(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        self.kv()?.scan_state_from(table, key_group, from, limit)
    }

    fn scan_state_prefix(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
    ) -> Result<Vec<StateEntry>> {
        self.kv()?.scan_state_prefix(table, key_group, prefix)
    }

    fn scan_state_prefix_from(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        self.kv()?
            .scan_state_prefix_from(table, key_group, prefix, from, limit)
    }

    fn scan_state_prefix_back(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        self.kv()?
            .scan_state_prefix_back(table, key_group, prefix, before, limit)
    }
}

impl Drop for KeyedStateBackend {
    fn drop(&mut self) {
        drop(self.kv.take());
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), error = %e, "could not delete local state");
        }
    }
}

/// Downloads one subtask's snapshot into `dir` (checking every file) and
/// opens it read-only.
pub async fn open_handle(
    storage: &CheckpointStorage,
    handle: &StateHandle,
    dir: &Path,
) -> Result<KvStore> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(io_err)?;
    }
    storage.fetch(handle, dir).await?;
    KvStore::open_read_only(dir)
}

/// A completed checkpoint's part of a table, opened where it lies: a
/// subtask's snapshot downloaded into a scratch directory, deleted when
/// this is dropped, or the entries of a savepoint in the canonical format.
pub enum StoredTable {
    Opened {
        kv: Arc<KvStore>,
        key_groups: std::ops::Range<u16>,
        /// Dropped after `kv`, with the last part of its snapshot.
        dir: Arc<ScratchDir>,
    },
    Entries(Vec<StateEntry>),
}

/// A directory deleted when dropped.
pub struct ScratchDir(pub PathBuf);

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Opens `table`'s parts in `key_groups` of a completed checkpoint, to be
/// read a page at a time ([`read_handles`] reads them whole); snapshots
/// go into directories named `scratch` followed by `-0`, `-1`, …
pub async fn open_table(
    storage: &CheckpointStorage,
    handles: &[StateHandle],
    table: u64,
    key_groups: std::ops::Range<u16>,
    scratch: &Path,
) -> Result<Vec<StoredTable>> {
    let mut out = Vec::new();
    for (i, handle) in handles
        .iter()
        .filter(|h| h.overlaps(table, &key_groups))
        .enumerate()
    {
        if handle.format == HandleFormat::Canonical {
            out.push(StoredTable::Entries(
                crate::savepoint::read_canonical(storage, handle, table, &key_groups).await?,
            ));
            continue;
        }
        let dir = Arc::new(ScratchDir(PathBuf::from(format!(
            "{}-{i}",
            scratch.display()
        ))));
        let kv = Arc::new(open_handle(storage, handle, &dir.0).await?);
        for key_groups in handle_ranges(handle, table, &key_groups) {
            out.push(StoredTable::Opened {
                kv: kv.clone(),
                key_groups,
                dir: dir.clone(),
            });
        }
    }
    Ok(out)
}

/// The key groups of `table` within `key_groups` that `handle` holds,
/// one range per table part it has.
fn handle_ranges<'a>(
    handle: &'a StateHandle,
    table: u64,
    key_groups: &'a std::ops::Range<u16>,
) -> impl Iterator<Item = std::ops::Range<u16>> + 'a {
    handle
        .tables
        .iter()
        .filter(move |h| h.table == table)
        .map(|h| key_groups.start.max(h.key_groups.start)..key_groups.end.min(h.key_groups.end))
        .filter(|r| r.start < r.end)
}

/// The entries of `table` in `key_groups` of a completed checkpoint,
/// read straight from checkpoint storage (through `scratch`).
pub async fn read_handles(
    storage: &CheckpointStorage,
    handles: &[StateHandle],
    table: u64,
    key_groups: std::ops::Range<u16>,
    scratch: &Path,
) -> Result<Vec<StateEntry>> {
    let mut out = Vec::new();
    for (i, handle) in handles
        .iter()
        .filter(|h| h.overlaps(table, &key_groups))
        .enumerate()
    {
        if handle.format == HandleFormat::Canonical {
            out.extend(
                crate::savepoint::read_canonical(storage, handle, table, &key_groups).await?,
            );
            continue;
        }
        let dir = scratch.join(i.to_string());
        let kv = open_handle(storage, handle, &dir).await?;
        for range in handle_ranges(handle, table, &key_groups) {
            out.extend(kv.scan_state(table, range)?);
        }
        drop(kv);
        std::fs::remove_dir_all(&dir).map_err(io_err)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(kg: u16, key: &str, value: &str) -> StateWrite {
        StateWrite {
            table: 7,
            key_group: kg,
            key: key.into(),
            value: Some(value.into()),
        }
    }

    fn backend(dir: &Path, subtask: usize, key_groups: std::ops::Range<u16>) -> KeyedStateBackend {
        KeyedStateBackend::create(
            dir.join(format!("b{subtask}")),
            &SlotMemory::new(8 << 20),
            (0, subtask),
            vec![TableRange {
                table: 7,
                key_groups,
            }],
        )
        .unwrap()
    }

    #[tokio::test]
    async fn incremental_snapshots_restore_at_another_parallelism() {
        let local = tempfile::tempdir().unwrap();
        let remote = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(remote.path().to_str().unwrap()).unwrap();
        let b = backend(local.path(), 0, 0..128);

        let s1 = b
            .snapshot(1, vec![w(3, "a", "1"), w(100, "b", "2")])
            .unwrap();
        let h1 = b.upload(&storage, 1, 1, &s1).await.unwrap();
        assert!(b.read_view().unwrap().is_none(), "nothing completed yet");
        b.complete(1).unwrap();
        let view = b.read_view().unwrap().unwrap();
        assert_eq!(view.scan_state(7, 0..128).unwrap().len(), 2);

        // Pending writes are not in the read view.
        let s2 = b.snapshot(2, vec![w(5, "c", "3")]).unwrap();
        assert_eq!(view.scan_state(7, 0..128).unwrap().len(), 2);
        let h2 = b.upload(&storage, 1, 2, &s2).await.unwrap();
        let shared = |h: &StateHandle| -> Vec<String> {
            h.files
                .iter()
                .filter(|f| f.shared)
                .map(|f| f.path.clone())
                .collect()
        };
        // Checkpoint 2 references checkpoint 1's SST and adds one.
        assert!(shared(&h1).iter().all(|p| shared(&h2).contains(p)));
        assert_eq!(shared(&h2).len(), shared(&h1).len() + 1);
        b.complete(2).unwrap();
        assert_eq!(
            b.read_view()
                .unwrap()
                .unwrap()
                .scan_state(7, 0..128)
                .unwrap()
                .len(),
            3
        );

        // Two subtasks restore half each: each opens the checkpoint's files
        // in place (nothing copied) and drops the other half.
        let mut left = backend(local.path(), 1, 0..64);
        let mut right = backend(local.path(), 2, 64..128);
        for b in [&mut left, &mut right] {
            let copied = b.restore(&storage, 2, std::slice::from_ref(&h2)).await;
            assert_eq!(copied.unwrap(), 0);
        }
        let right_keys = right.scan_state(7, 0..128).unwrap();
        assert_eq!(right_keys.len(), 1);
        assert_eq!(right_keys[0].key, b"b");
        assert_eq!(right.get(7, 100, b"b").unwrap().as_deref(), Some(&b"2"[..]));
        assert_eq!(right.get(7, 3, b"a").unwrap(), None, "not its key group");
        assert_eq!(
            left.read_view()
                .unwrap()
                .unwrap()
                .scan_state(7, 0..128)
                .unwrap()
                .len(),
            2
        );
        // One subtask restores both halves again: one opened in place,
        // the other copied.
        let sl = left.snapshot(3, vec![]).unwrap();
        let hl = left.upload(&storage, 1, 3, &sl).await.unwrap();
        let sr = right.snapshot(3, vec![]).unwrap();
        let hr = right.upload(&storage, 1, 3, &sr).await.unwrap();
        let mut whole = backend(local.path(), 3, 0..128);
        let copied = whole.restore(&storage, 3, &[hl, hr]).await.unwrap();
        // Equal halves: the later opens in place, the earlier's 2 keys are
        // copied.
        assert_eq!(copied, 2);
        assert_eq!(whole.scan_state(7, 0..128).unwrap().len(), 3);
        let scratch = local.path().join("scratch");
        let read = read_handles(&storage, &[h2], 7, 64..128, &scratch)
            .await
            .unwrap();
        assert_eq!(read.len(), 1);
    }
}

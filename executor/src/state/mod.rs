//! Keyed state as operators see it: one interface over two backends, as
//! Flink's `KeyedStateBackend` over its `HashMapStateBackend` and
//! `EmbeddedRocksDBStateBackend`.
//!
//! A stateful subtask owns a RocksDB instance (`storage::backend`), the
//! [`StateStore`] here. An operator keeps its keys in a [`StateCache`], a
//! map from key to value whose [`StateLayout`] says how a value lies in the
//! store: whole under its key (value state, any [`StateCodec`]), or as a
//! map with one store entry per map key under the key ([`MapLayout`]: map
//! and sorted-map state, read back with one prefix scan). Either way:
//!
//! * with the **heap** backend the cache holds every key, loaded when the
//!   subtask starts; the store is written only at checkpoint barriers;
//! * with the **rocksdb** backend the cache holds the hot keys only: a key
//!   it lacks is read from the store when touched, and when the slot's
//!   managed memory is spent the coldest keys leave the cache, the changed
//!   ones written to the store first.
//!
//! Writing a changed key into the live store between barriers is safe: a
//! checkpoint is the live store *plus* the keys still dirty in caches, taken
//! once the barrier has aligned, so it holds exactly the state as of the
//! barrier either way; a failed task's store is thrown away and rebuilt
//! from the last completed checkpoint.
//!
//! Either way every cached byte is reserved from the slot's operator share
//! of managed memory (`storage::memory::MemoryPool`): a heap-backed operator
//! that needs more fails its job with "out of managed memory" (SQLSTATE
//! `53200` at the server) instead of growing the process without bound.

mod cache;
mod layout;
mod map;
mod timers;

use std::ops::Range;

pub use cache::{COUNT_TAG, CacheStats, StateCache};
pub use layout::{I64Codec, KeyedValue, StateCodec, StateLayout};
pub use map::{MapAt, MapCodec, MapLayout, MapValue};
pub use planner::spec::StateBackend;
use storage::state::{StateEntry, StateWrite};
pub use timers::TimerQueue;

use crate::Result;

/// One operator's state in one subtask, as of its latest checkpoint
/// (`weir_catalog.state`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct OperatorStateStats {
    pub operator: String,
    pub table: u64,
    /// `rocksdb` or `heap`.
    pub backend: String,
    /// Keys in state (in memory or not), as of the latest checkpoint;
    /// `None` for state restored from before keys were counted.
    pub keys: Option<u64>,
    /// Keys in memory; with the heap backend, all of them.
    pub keys_in_memory: u64,
    pub bytes_in_memory: u64,
    /// The table's bytes in the subtask's RocksDB files (compressed; what
    /// is still in its write buffers is not counted).
    pub bytes_on_disk: u64,
    pub cache_hits: u64,
    pub cache_misses: u64,
    pub evictions: u64,
}

/// Rows of a chunk whose entries an operator reads in one batch
/// ([`MapLayout::fetch_many`]) before changing them one by one: what the
/// batch holds stays bounded (a few hundred bytes a row) whatever the
/// chunk's size, and the sorted keys of a large batch share RocksDB
/// blocks. Measured on 400,000-row chunks into one huge key: 4,096 rows a
/// batch ran 1.3 times slower than 65,536, and the whole chunk at once
/// peaked 150 MiB higher for no more speed (`docs/benchmarks.md`, "One
/// huge key").
pub const PREFETCH_ROWS: usize = 65536;

/// The words every "out of managed memory" error starts with.
pub const OUT_OF_MANAGED_MEMORY: &str = "out of managed memory";

/// Heap reservations from the slot's pool are made in steps of at most
/// this size (and at most 1/64 of the pool), so that growing state does
/// not touch the shared counter on every batch.
pub(crate) const STEP: usize = 1 << 20;

/// Keeps `reserved` (bytes taken from the slot's pool for heap state) up
/// with `bytes` (what the state holds): reserves more in steps, gives back
/// what is two steps too much, and fails with "out of managed memory"
/// naming `what` when the pool has no more.
pub(crate) fn reserve_heap(
    pool: &storage::memory::MemoryPool,
    reserved: &mut usize,
    bytes: usize,
    what: &str,
) -> Result<()> {
    let step = (pool.capacity() / 64).clamp(1, STEP);
    if bytes > *reserved {
        let need = (bytes - *reserved).div_ceil(step) * step;
        if !pool.try_reserve(need) {
            return Err(crate::ExecError::OutOfMemory(format!(
                "{OUT_OF_MANAGED_MEMORY}: {what} needs more than the {} MiB the operators of \
                 its slot may use (raise --managed-memory-mb, or SET state_backend = \
                 'rocksdb' before creating the view)",
                pool.capacity() >> 20
            )));
        }
        *reserved += need;
    } else if *reserved - bytes > 2 * step {
        let keep = bytes.div_ceil(step) * step + step;
        pool.release(*reserved - keep);
        *reserved = keep;
    }
    Ok(())
}

/// A subtask's keyed state store: the committed state it restored from,
/// plus what its operators wrote since (see the module docs).
pub trait StateStore: Send + Sync {
    /// The entries of `table` in `key_groups`, in key order.
    fn scan(&self, table: u64, key_groups: Range<u16>) -> Result<Vec<StateEntry>>;

    /// At most `limit` entries of `table` in `key_group` from key `from`
    /// on, in key order: a page of a range that may be large.
    fn scan_from(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>>;

    /// The entries of `table` in `key_group` whose keys start with
    /// `prefix`, in key order: one key's map state.
    fn scan_prefix(&self, table: u64, key_group: u16, prefix: &[u8]) -> Result<Vec<StateEntry>>;

    /// At most `limit` of the entries [`StateStore::scan_prefix`] yields,
    /// from key `from` on: a page of one key's map state.
    fn scan_prefix_from(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let mut page = self.scan_prefix(table, key_group, prefix)?;
        page.retain(|e| e.key.as_slice() >= from);
        page.truncate(limit);
        Ok(page)
    }

    /// At most `limit` of the entries [`StateStore::scan_prefix`] yields,
    /// below key `before` (`None`: from the last), last first: a page of
    /// one key's map state read backwards.
    fn scan_prefix_back(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let mut page = self.scan_prefix(table, key_group, prefix)?;
        page.retain(|e| before.is_none_or(|b| e.key.as_slice() < b));
        page.reverse();
        page.truncate(limit);
        Ok(page)
    }

    /// The value of one key.
    fn get(&self, table: u64, key_group: u16, key: &[u8]) -> Result<Option<Vec<u8>>>;

    /// The values of several keys of `table`, in the order asked.
    fn get_many(&self, table: u64, keys: &[(u16, &[u8])]) -> Result<Vec<Option<Vec<u8>>>> {
        keys.iter()
            .map(|(key_group, key)| self.get(table, *key_group, key))
            .collect()
    }

    /// Writes keys a cache let go of before the barrier that would have
    /// written them.
    fn put(&self, writes: Vec<StateWrite>) -> Result<()>;

    /// Deletes the keys of `table` in `key_group` from `from` up to, not
    /// including, `to`, as [`StateStore::put`] would: a store that can
    /// deletes the range at once (RocksDB's range tombstone), without
    /// reading it; this default deletes it a page at a time.
    fn delete_range(&self, table: u64, key_group: u16, from: &[u8], to: &[u8]) -> Result<()> {
        let mut from = from.to_vec();
        loop {
            let page = self.scan_from(table, key_group, &from, 1024)?;
            let full = page.len() == 1024;
            let deletes: Vec<StateWrite> = page
                .into_iter()
                .take_while(|e| e.key.as_slice() < to)
                .map(|e| StateWrite {
                    table,
                    key_group,
                    key: e.key,
                    value: None,
                })
                .collect();
            let done = !full || deletes.len() < 1024;
            if let Some(last) = deletes.last() {
                from = [last.key.as_slice(), &[0]].concat();
            }
            self.put(deletes)?;
            if done {
                return Ok(());
            }
        }
    }
}

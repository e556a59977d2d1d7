//! A thin wrapper over one RocksDB instance: atomic batches, prefix scans and
//! consistent multi-prefix reads from one snapshot.

use std::path::Path;

use rocksdb::{
    Cache, DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteBufferManager,
    WriteOptions,
};

use std::sync::Arc;

use crate::Result;
use crate::memory::MemoryPool;

/// One write of a batch: `None` deletes the key.
pub(crate) type KvWrite = (Vec<u8>, Option<Vec<u8>>);

/// A slot's managed memory (see [`crate::memory`]): half for its RocksDB
/// instances, which share one block cache and one write-buffer budget,
/// half for its operators' caches ([`MemoryPool`]), so the state of
/// several subtasks in a slot cannot outgrow the slot's share.
#[derive(Clone)]
pub struct SlotMemory {
    cache: Cache,
    buffers: WriteBufferManager,
    operators: Arc<MemoryPool>,
    bytes: usize,
}

impl std::fmt::Debug for SlotMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlotMemory")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl SlotMemory {
    /// `bytes` in all: half for RocksDB, its block cache with the write
    /// buffers (a quarter) charged to it, so RocksDB stays within its
    /// half; half for operator caches.
    pub fn new(bytes: usize) -> Self {
        let rocksdb = bytes / 2;
        let cache = Cache::new_lru_cache(rocksdb.max(2 << 20));
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            rocksdb / 2,
            false,
            cache.clone(),
        );
        Self {
            cache,
            buffers,
            operators: Arc::new(MemoryPool::new(bytes - rocksdb)),
            bytes,
        }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The operators' share.
    pub fn operators(&self) -> &Arc<MemoryPool> {
        &self.operators
    }

    /// Bytes RocksDB holds in the slot's block cache and write buffers.
    pub fn rocksdb_usage(&self) -> usize {
        self.cache.get_usage()
    }
}

/// One RocksDB instance.
pub struct KvStore {
    db: DB,
    /// Writes skip the write-ahead log: the instance is made durable by
    /// checkpoints, not by its WAL.
    no_wal: bool,
}

impl std::fmt::Debug for KvStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvStore")
            .field("path", &self.db.path())
            .finish()
    }
}

impl KvStore {
    /// Opens (creating if missing) the database at `path`, with
    /// `memory_bytes` for RocksDB's own memory: half for the block cache,
    /// half for (two) write buffers.
    pub fn open(path: &Path, memory_bytes: usize) -> Result<Self> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.set_write_buffer_size((memory_bytes / 4).max(1 << 20));
        opts.set_max_write_buffer_number(2);
        let mut block = rocksdb::BlockBasedOptions::default();
        block.set_block_cache(&rocksdb::Cache::new_lru_cache(memory_bytes / 2));
        opts.set_block_based_table_factory(&block);
        let db = DB::open(&opts, path)?;
        Ok(Self { db, no_wal: false })
    }

    /// Opens (creating if missing) a subtask's state instance in a slot:
    /// memory from the slot's share, no write-ahead log (a checkpoint
    /// flushes it; what is not checkpointed is redone from the sources).
    pub fn open_in_slot(path: &Path, memory: &SlotMemory) -> Result<Self> {
        let mut opts = Options::default();
        opts.create_if_missing(true);
        opts.set_compression_type(rocksdb::DBCompressionType::Lz4);
        opts.set_write_buffer_manager(&memory.buffers);
        // Many small instances: keep their info logs small (they grow with
        // every error, for example while the disk is full).
        opts.set_max_log_file_size(256 << 10);
        opts.set_keep_log_file_num(2);
        let mut block = rocksdb::BlockBasedOptions::default();
        block.set_block_cache(&memory.cache);
        // Operators read keys that may not exist (a new group, a join key
        // never seen): a bloom filter answers most of those without a
        // block read. Index and filter blocks live in the slot's cache, so
        // they count against its memory too.
        block.set_bloom_filter(10.0, false);
        block.set_cache_index_and_filter_blocks(true);
        block.set_pin_l0_filter_and_index_blocks_in_cache(true);
        // Partitioned, as Flink's bounded-memory RocksDB setup: a lookup
        // loads one small filter (and index) partition, not a whole file's
        // filter; with a cache far smaller than the state, whole filters
        // would be read from disk and checksummed on every miss. The
        // top-level indexes stay pinned, and index and filter blocks are
        // evicted after data blocks.
        block.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        block.set_partition_filters(true);
        block.set_metadata_block_size(4096);
        block.set_pin_top_level_index_and_filter(true);
        block.set_cache_index_and_filter_blocks_with_high_priority(true);
        opts.set_block_based_table_factory(&block);
        let db = DB::open(&opts, path)?;
        Ok(Self { db, no_wal: true })
    }

    /// Opens a RocksDB checkpoint directory for reading.
    pub fn open_read_only(path: &Path) -> Result<Self> {
        let mut opts = Options::default();
        // Every file opened now and kept open: a reader that holds the
        // instance (a SELECT streaming a view) reads on after a newer
        // checkpoint replaces this one and its directory is deleted.
        opts.set_max_open_files(-1);
        let db = DB::open_for_read_only(&opts, path, false)?;
        Ok(Self { db, no_wal: true })
    }

    /// Takes a RocksDB checkpoint into `dir` (which must not exist): the
    /// memtable is flushed and the live SST files are hard-linked, so the
    /// directory is an openable copy of the database as of now.
    pub fn checkpoint_to(&self, dir: &Path) -> Result<()> {
        rocksdb::checkpoint::Checkpoint::new(&self.db)?.create_checkpoint(dir)?;
        Ok(())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get(key)?)
    }

    /// The values of `keys`, in order, in one batched lookup (RocksDB's
    /// `MultiGet`).
    pub fn multi_get<K: AsRef<[u8]>>(&self, keys: &[K]) -> Result<Vec<Option<Vec<u8>>>> {
        self.db
            .multi_get(keys)
            .into_iter()
            .map(|r| r.map_err(Into::into))
            .collect()
    }

    /// Applies all writes atomically; with `sync` they are on disk (WAL
    /// fsynced) when this returns.
    pub fn write(&self, writes: impl IntoIterator<Item = KvWrite>, sync: bool) -> Result<()> {
        let mut batch = WriteBatch::default();
        for (k, v) in writes {
            match v {
                Some(v) => batch.put(k, v),
                None => batch.delete(k),
            }
        }
        let mut opts = WriteOptions::default();
        opts.set_sync(sync && !self.no_wal);
        opts.disable_wal(self.no_wal);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// Deletes every key in `[from, to)`.
    pub fn delete_range(&self, from: &[u8], to: &[u8], sync: bool) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.delete_range(from, to);
        let mut opts = WriteOptions::default();
        opts.set_sync(sync && !self.no_wal);
        opts.disable_wal(self.no_wal);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// Runs `f` against one consistent snapshot of the database.
    pub fn with_snapshot<T>(&self, f: impl FnOnce(&SnapshotReader<'_>) -> Result<T>) -> Result<T> {
        let snapshot = self.db.snapshot();
        f(&SnapshotReader {
            db: &self.db,
            snapshot: &snapshot,
        })
    }

    /// The bytes of the keys and values in `[from, to)` as written (before
    /// compression), counted by reading them: O(keys), O(1) memory.
    pub fn range_bytes(&self, from: &[u8], to: &[u8]) -> Result<u64> {
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(to.to_vec());
        let mut total = 0u64;
        for item in self
            .db
            .iterator_opt(IteratorMode::From(from, Direction::Forward), opts)
        {
            let (k, v) = item?;
            total += (k.len() + v.len()) as u64;
        }
        Ok(total)
    }

    /// The bytes of the SST files that hold `[from, to)`, as RocksDB
    /// estimates them (compressed; write buffers not counted).
    pub fn disk_bytes(&self, from: &[u8], to: &[u8]) -> u64 {
        self.db
            .get_approximate_sizes(&[rocksdb::Range::new(from, to)])
            .first()
            .copied()
            .unwrap_or(0)
    }

    /// Scans `[from, to)` outside any snapshot.
    pub fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_snapshot(|s| s.scan(from, to, limit))
    }

    /// Scans `[from, to)` backwards outside any snapshot.
    pub fn scan_back(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_snapshot(|s| s.scan_back(from, to, limit))
    }
}

/// Reads from one RocksDB snapshot.
pub struct SnapshotReader<'a> {
    db: &'a DB,
    snapshot: &'a rocksdb::Snapshot<'a>,
}

impl SnapshotReader<'_> {
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.snapshot.get(key)?)
    }

    /// Key-value pairs in `[from, to)`, at most `limit` of them.
    pub fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(self.snapshot);
        opts.set_iterate_upper_bound(to.to_vec());
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_opt(IteratorMode::From(from, Direction::Forward), opts)
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            out.push((k.to_vec(), v.to_vec()));
        }
        Ok(out)
    }

    /// Key-value pairs in `[from, to)`, last first, at most `limit` of
    /// them.
    pub fn scan_back(
        &self,
        from: &[u8],
        to: &[u8],
        limit: usize,
    ) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(self.snapshot);
        opts.set_iterate_lower_bound(from.to_vec());
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_opt(IteratorMode::From(to, Direction::Reverse), opts)
        {
            if out.len() >= limit {
                break;
            }
            let (k, v) = item?;
            // The seek lands on `to` itself when it is a key.
            if k.as_ref() < to {
                out.push((k.to_vec(), v.to_vec()));
            }
        }
        Ok(out)
    }
}

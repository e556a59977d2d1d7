//! A thin wrapper over one RocksDB instance: atomic batches, prefix scans and
//! consistent multi-prefix reads from one snapshot.

use std::path::Path;

use rocksdb::{DB, Direction, IteratorMode, Options, ReadOptions, WriteBatch, WriteOptions};

use crate::Result;

/// One write of a batch: `None` deletes the key.
pub(crate) type KvWrite = (Vec<u8>, Option<Vec<u8>>);

/// One RocksDB instance.
pub struct KvStore {
    db: DB,
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
        Ok(Self { db })
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get(key)?)
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
        opts.set_sync(sync);
        self.db.write_opt(batch, &opts)?;
        Ok(())
    }

    /// Deletes every key in `[from, to)`.
    pub fn delete_range(&self, from: &[u8], to: &[u8], sync: bool) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.delete_range(from, to);
        let mut opts = WriteOptions::default();
        opts.set_sync(sync);
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

    /// Scans `[from, to)` outside any snapshot.
    pub fn scan(&self, from: &[u8], to: &[u8], limit: usize) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        self.with_snapshot(|s| s.scan(from, to, limit))
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

    /// The last key-value pair in `[from, to)`.
    pub fn last(&self, from: &[u8], to: &[u8]) -> Result<Option<(Vec<u8>, Vec<u8>)>> {
        let mut opts = ReadOptions::default();
        opts.set_snapshot(self.snapshot);
        opts.set_iterate_lower_bound(from.to_vec());
        let mut it = self
            .db
            .iterator_opt(IteratorMode::From(to, Direction::Reverse), opts);
        loop {
            match it.next() {
                None => return Ok(None),
                Some(item) => {
                    let (k, v) = item?;
                    if k.as_ref() < to {
                        return Ok(Some((k.to_vec(), v.to_vec())));
                    }
                }
            }
        }
    }
}

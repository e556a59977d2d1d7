//! User tables: current rows plus a change log, written together.
//!
//! Every DML statement becomes one [`Chunk`] of changes over the table's
//! *stored* schema (the user's columns, plus a hidden `_row_id` when the table
//! has no primary key). [`TableStore::apply`] checks keys, then writes the
//! changed rows, the log entry and the table's counters in one synced
//! RocksDB batch: once it returns, the statement is durable and every view's
//! source can read it from the log. A reader of [`TableStore::snapshot`] gets
//! the rows and the log position they correspond to, from one RocksDB
//! snapshot — the starting point of a backfill.
//!
//! A write that changes several tables at once (a transaction's `COMMIT`)
//! gets a *commit number*, recorded with each table's log entry. A
//! checkpoint barrier carries the last commit number it includes, so that
//! every source of a view takes the entries of one commit into the same
//! checkpoint ([`LogEntry::commit`]): no view ever shows part of one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock};

use datafusion::arrow::array::{Array, ArrayRef, Int64Array, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use tokio::sync::watch;

use crate::chunk::Chunk;
use crate::chunk::Op;
use crate::codec::RowCodec;
use crate::keys::{self, TABLE_COMMIT, TABLE_INGEST, TABLE_LOG, TABLE_ROW, TABLE_ROW_ID};
use crate::kv::KvWrite;
use crate::{KvStore, Result, StorageError};

/// Name of the hidden key column of tables without a primary key.
pub const ROW_ID_COLUMN: &str = "_row_id";

/// Rows per batch when a table is scanned.
const SCAN_BATCH_ROWS: usize = 4096;

/// How a table is keyed and laid out.
#[derive(Debug, Clone)]
pub struct TableDesc {
    pub id: u64,
    pub name: String,
    /// Stored schema: user columns, then `_row_id` if `row_id` is true.
    pub schema: SchemaRef,
    /// Indices (into `schema`) of the key columns.
    pub key_columns: Vec<usize>,
    /// Whether the key is the hidden `_row_id`.
    pub row_id: bool,
}

/// A writer that applies a job's epochs to a table
/// ([`TableStore::ingest`]): subtask `subtask` of job `job`. A connector
/// table's own job has the table's id; other jobs write too (the
/// dead-letter table of a source every view reads), so the job is part of
/// the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriterId {
    pub job: u64,
    pub subtask: u32,
}

impl WriterId {
    /// The marker key's suffix: `job subtask`.
    fn key_suffix(&self) -> [u8; 12] {
        let mut k = [0u8; 12];
        k[..8].copy_from_slice(&self.job.to_be_bytes());
        k[8..].copy_from_slice(&self.subtask.to_be_bytes());
        k
    }
}

struct Counters {
    last_seq: u64,
    next_row_id: i64,
}

pub(crate) struct TableHandle {
    pub(crate) desc: TableDesc,
    key_codec: RowCodec,
    pub(crate) row_codec: RowCodec,
    writer: Mutex<Counters>,
    seq: watch::Sender<u64>,
    /// The last checkpoint each ingesting writer applied.
    ingested: watch::Sender<BTreeMap<WriterId, u64>>,
}

impl TableHandle {
    pub(crate) fn keys_of(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        let cols: Vec<ArrayRef> = self
            .desc
            .key_columns
            .iter()
            .map(|i| batch.column(*i).clone())
            .collect();
        self.key_codec.encode(&cols)
    }
}

/// What [`TableStore::ingest`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ingested {
    /// The log sequence number of the changes; `None` when they changed
    /// nothing.
    pub seq: Option<u64>,
    /// The writer had applied this checkpoint already: nothing was done.
    pub duplicate: bool,
    /// Rows dropped because a column that takes no NULL (a key column)
    /// was NULL.
    pub null_rows: usize,
}

/// A row's key, and the encoded row a change leaves under it (`None`:
/// none, it was deleted).
pub(crate) type KeyedRow = (Vec<u8>, Option<Vec<u8>>);

/// One entry of a table's change log.
#[derive(Debug, Clone)]
pub struct LogEntry {
    pub seq: u64,
    /// The commit number of a write that changed other tables too; `None`
    /// for a write of this table alone.
    pub commit: Option<u64>,
    pub changes: Chunk,
}

/// All tables of the database.
pub struct TableStore {
    kv: Arc<KvStore>,
    tables: RwLock<HashMap<u64, Arc<TableHandle>>>,
    /// Taken by writes to several tables, so that commit numbers become
    /// visible in their order.
    commit_lock: Mutex<()>,
    /// The last commit number whose entries every table's log shows.
    last_commit: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for TableStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableStore").finish_non_exhaustive()
    }
}

fn counters_key(table: u64) -> Vec<u8> {
    keys::with_id(TABLE_ROW_ID, table)
}

fn last_commit_key() -> Vec<u8> {
    vec![TABLE_COMMIT]
}

impl TableStore {
    pub fn new(kv: Arc<KvStore>) -> Result<Self> {
        let last_commit = match kv.get(&last_commit_key())? {
            Some(v) => u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| StorageError::Corrupt("last commit number".into()))?,
            ),
            None => 0,
        };
        Ok(Self {
            kv,
            tables: RwLock::new(HashMap::new()),
            commit_lock: Mutex::new(()),
            last_commit: last_commit.into(),
        })
    }

    /// The last commit number of a write to several tables: a checkpoint
    /// triggered now includes it and every one before it.
    pub fn last_commit(&self) -> u64 {
        self.last_commit.load(std::sync::atomic::Ordering::Acquire)
    }

    pub(crate) fn handle(&self, id: u64) -> Result<Arc<TableHandle>> {
        self.tables
            .read()
            .map_err(|_| StorageError::Internal("table map poisoned".into()))?
            .get(&id)
            .cloned()
            .ok_or(StorageError::UnknownTable(id))
    }

    /// Makes a table known (at creation, or when the catalog is loaded).
    pub fn open_table(&self, desc: TableDesc) -> Result<()> {
        let key_types = desc
            .key_columns
            .iter()
            .map(|i| desc.schema.field(*i).data_type().clone())
            .collect();
        let row_types = desc
            .schema
            .fields()
            .iter()
            .map(|f| f.data_type().clone())
            .collect();
        let (last_seq, next_row_id) = match self.kv.get(&counters_key(desc.id))? {
            Some(v) if v.len() == 16 => (
                u64::from_be_bytes(v[0..8].try_into().unwrap_or_default()),
                i64::from_be_bytes(v[8..16].try_into().unwrap_or_default()),
            ),
            Some(_) => {
                return Err(StorageError::Corrupt(format!(
                    "counters of table {}",
                    desc.id
                )));
            }
            None => (0, 1),
        };
        let (from, to) = keys::id_range(TABLE_INGEST, desc.id);
        let mut ingested = BTreeMap::new();
        for (k, v) in self.kv.scan(&from, &to, usize::MAX)? {
            let writer = match k.get(9..) {
                Some(s) if s.len() == 12 => Some(WriterId {
                    job: u64::from_be_bytes(s[..8].try_into().unwrap_or_default()),
                    subtask: u32::from_be_bytes(s[8..].try_into().unwrap_or_default()),
                }),
                // Written before writers were named by job: the table's own.
                Some(s) if s.len() == 4 => Some(WriterId {
                    job: desc.id,
                    subtask: u32::from_be_bytes(s.try_into().unwrap_or_default()),
                }),
                _ => None,
            };
            let checkpoint = v.as_slice().try_into().ok();
            let (Some(w), Some(c)) = (writer, checkpoint) else {
                return Err(StorageError::Corrupt(format!(
                    "ingest marker of table {}",
                    desc.id
                )));
            };
            let c = u64::from_be_bytes(c);
            ingested
                .entry(w)
                .and_modify(|d: &mut u64| *d = (*d).max(c))
                .or_insert(c);
        }
        let handle = TableHandle {
            ingested: watch::channel(ingested).0,
            key_codec: RowCodec::new(key_types)?,
            row_codec: RowCodec::new(row_types)?,
            writer: Mutex::new(Counters {
                last_seq,
                next_row_id,
            }),
            seq: watch::channel(last_seq).0,
            desc,
        };
        self.tables
            .write()
            .map_err(|_| StorageError::Internal("table map poisoned".into()))?
            .insert(handle.desc.id, Arc::new(handle));
        Ok(())
    }

    pub fn desc(&self, id: u64) -> Result<TableDesc> {
        Ok(self.handle(id)?.desc.clone())
    }

    /// Deletes a table's rows, log and counters.
    pub fn drop_table(&self, id: u64) -> Result<()> {
        for tag in [TABLE_ROW, TABLE_LOG, TABLE_INGEST, TABLE_COMMIT] {
            let (from, to) = keys::id_range(tag, id);
            self.kv.delete_range(&from, &to, false)?;
        }
        self.kv.write([(counters_key(id), None)], true)?;
        if let Ok(mut t) = self.tables.write() {
            t.remove(&id);
        }
        Ok(())
    }

    /// Reserves `n` hidden row ids for inserts into a table without a key.
    pub fn allocate_row_ids(&self, id: u64, n: usize) -> Result<i64> {
        let h = self.handle(id)?;
        let mut c = h
            .writer
            .lock()
            .map_err(|_| StorageError::Internal("poisoned".into()))?;
        let first = c.next_row_id;
        c.next_row_id += n as i64;
        Ok(first)
    }

    /// Applies one statement's changes durably; returns its log sequence
    /// number. Fails without writing anything if a key constraint is violated.
    pub fn apply(&self, id: u64, changes: &Chunk) -> Result<u64> {
        Ok(self.apply_many(&[(id, changes)])?[0])
    }

    /// Applies changes to several tables in one durable write: all or
    /// none (a stream's late rows and its on-time rows). Returns each
    /// table's new log sequence number.
    pub fn apply_many(&self, changes: &[(u64, &Chunk)]) -> Result<Vec<u64>> {
        let mut ids: Vec<u64> = changes.iter().map(|(id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        if ids.len() != changes.len() {
            return Err(StorageError::Internal(
                "one write may change each table once".into(),
            ));
        }
        let handles = changes
            .iter()
            .map(|(id, _)| self.handle(*id))
            .collect::<Result<Vec<_>>>()?;
        // Commit numbers are handed out and published in one order.
        let several = changes.len() > 1;
        let _commit = several
            .then(|| self.commit_lock.lock())
            .transpose()
            .map_err(|_| StorageError::Internal("poisoned".into()))?;
        // Writers lock in table order, so that two writes never wait on
        // each other.
        let mut order: Vec<usize> = (0..changes.len()).collect();
        order.sort_by_key(|i| changes[*i].0);
        let mut guards = Vec::with_capacity(changes.len());
        for i in &order {
            guards.push((
                *i,
                handles[*i]
                    .writer
                    .lock()
                    .map_err(|_| StorageError::Internal("poisoned".into()))?,
            ));
        }
        guards.sort_by_key(|(i, _)| *i);
        let mut writes: Vec<KvWrite> = Vec::new();
        let mut seqs = Vec::with_capacity(changes.len());
        for (((id, chunk), h), (_, counters)) in changes.iter().zip(&handles).zip(guards.iter_mut())
        {
            seqs.push(self.stage(*id, h, chunk, counters, &mut writes)?);
        }
        let commit = several.then(|| self.last_commit() + 1);
        if let Some(commit) = commit {
            for ((id, _), seq) in changes.iter().zip(&seqs) {
                writes.push((
                    keys::with_id_and(TABLE_COMMIT, *id, &seq.to_be_bytes()),
                    Some(commit.to_be_bytes().to_vec()),
                ));
            }
            writes.push((last_commit_key(), Some(commit.to_be_bytes().to_vec())));
        }
        self.kv.write(writes, true)?;
        for ((h, (_, counters)), seq) in handles.iter().zip(guards.iter_mut()).zip(&seqs) {
            counters.last_seq = *seq;
            h.seq.send_replace(*seq);
        }
        if let Some(commit) = commit {
            // After every table's log shows the entries.
            self.last_commit
                .store(commit, std::sync::atomic::Ordering::Release);
        }
        Ok(seqs)
    }

    /// Applies what a connector read into a table (`CREATE TABLE … WITH
    /// (connector = …)`), as the commit of `writer`'s `checkpoint`: once,
    /// however often it is called (the marker of the last checkpoint each
    /// writer applied is written with the rows).
    ///
    /// The changes are *upserts*, not checked like a statement's: a row
    /// replaces the row of its key, if any; a retraction removes the row
    /// of its key, whatever its other columns, or does nothing. A table
    /// without a key takes inserts only (each gets a hidden row id).
    /// Rows with a NULL in a column that takes none are dropped.
    pub fn ingest(
        &self,
        id: u64,
        writer: WriterId,
        checkpoint: u64,
        changes: &Chunk,
    ) -> Result<Ingested> {
        let h = self.handle(id)?;
        let mut counters = h
            .writer
            .lock()
            .map_err(|_| StorageError::Internal("poisoned".into()))?;
        let marker = keys::with_id_and(TABLE_INGEST, id, &writer.key_suffix());
        let legacy = || keys::with_id_and(TABLE_INGEST, id, &writer.subtask.to_be_bytes());
        let done = match self.kv.get(&marker)? {
            None if writer.job == id => self.kv.get(&legacy())?,
            v => v,
        };
        if let Some(v) = done {
            let done = v
                .as_slice()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| StorageError::Corrupt(format!("ingest marker of table {id}")))?;
            if done >= checkpoint {
                return Ok(Ingested {
                    duplicate: true,
                    ..Default::default()
                });
            }
        }
        let data = changes.data();
        let schema = &h.desc.schema;
        let user_columns = schema.fields().len() - usize::from(h.desc.row_id);
        if data.num_columns() != user_columns {
            return Err(StorageError::Internal(format!(
                "{} columns ingested into table \"{}\" of {user_columns}",
                data.num_columns(),
                h.desc.name
            )));
        }
        // A row that adds needs every NOT NULL column; a retraction only
        // its key (a deletion may name nothing else).
        let mut keep: Vec<bool> = vec![true; data.num_rows()];
        for (i, field) in schema.fields().iter().take(user_columns).enumerate() {
            let col = data.column(i);
            if !field.is_nullable() && col.null_count() > 0 {
                let key = h.desc.key_columns.contains(&i);
                for (r, k) in keep.iter_mut().enumerate() {
                    if col.is_null(r) && (key || changes.op(r).sign() > 0) {
                        *k = false;
                    }
                }
            }
        }
        let null_rows = keep.iter().filter(|k| !**k).count();
        let mut writes: Vec<KvWrite> = Vec::new();
        let mut next_row_id = counters.next_row_id;
        let log: Option<Chunk> = if h.desc.row_id {
            // No key to find an earlier row by: inserts only.
            let mask: datafusion::arrow::array::BooleanArray = keep
                .iter()
                .enumerate()
                .map(|(r, k)| Some(*k && changes.op(r).sign() > 0))
                .collect();
            let rows = datafusion::arrow::compute::filter_record_batch(data, &mask)?;
            let n = rows.num_rows() as i64;
            let ids: ArrayRef =
                Arc::new(Int64Array::from_iter_values(next_row_id..next_row_id + n));
            next_row_id += n;
            let mut columns = rows.columns().to_vec();
            columns.push(ids);
            let stored = RecordBatch::try_new(schema.clone(), columns)?;
            for (key, row) in h
                .keys_of(&stored)?
                .into_iter()
                .zip(h.row_codec.encode(stored.columns())?)
            {
                writes.push((keys::with_id_and(TABLE_ROW, id, &key), Some(row)));
            }
            (n > 0).then(|| Chunk::inserts(stored))
        } else {
            let row_keys = h.keys_of(data)?;
            let rows = h.row_codec.encode(data.columns())?;
            // The row each touched key has now, over what is stored.
            let mut overlay: HashMap<&[u8], Option<&[u8]>> = HashMap::new();
            let mut stored: HashMap<&[u8], Option<Vec<u8>>> = HashMap::new();
            let mut out: Vec<(Op, Vec<u8>)> = Vec::new();
            for r in (0..data.num_rows()).filter(|r| keep[*r]) {
                let key = row_keys[r].as_slice();
                let current: Option<Vec<u8>> = match overlay.get(key) {
                    Some(v) => v.map(<[u8]>::to_vec),
                    None => {
                        let v = self.kv.get(&keys::with_id_and(TABLE_ROW, id, key))?;
                        stored.insert(key, v.clone());
                        v
                    }
                };
                if changes.op(r).sign() > 0 {
                    if current.as_deref() == Some(rows[r].as_slice()) {
                        continue;
                    }
                    match current {
                        Some(old) => {
                            out.push((Op::UpdateDelete, old));
                            out.push((Op::UpdateInsert, rows[r].clone()));
                        }
                        None => out.push((Op::Insert, rows[r].clone())),
                    }
                    overlay.insert(key, Some(rows[r].as_slice()));
                } else if let Some(old) = current {
                    out.push((Op::Delete, old));
                    overlay.insert(key, None);
                }
            }
            for (key, now) in &overlay {
                if stored.get(key).and_then(|v| v.as_deref()) != *now {
                    writes.push((
                        keys::with_id_and(TABLE_ROW, id, key),
                        now.map(<[u8]>::to_vec),
                    ));
                }
            }
            if out.is_empty() {
                None
            } else {
                let ops: Vec<Op> = out.iter().map(|(op, _)| *op).collect();
                let batch = h
                    .row_codec
                    .decode_batch(schema, out.iter().map(|(_, row)| row.as_slice()))?;
                Some(Chunk::with_ops(&ops, batch))
            }
        };
        let seq = match &log {
            Some(chunk) => {
                let seq = counters.last_seq + 1;
                writes.push((
                    keys::with_id_and(TABLE_LOG, id, &seq.to_be_bytes()),
                    Some(chunk.to_ipc()?),
                ));
                seq
            }
            None => counters.last_seq,
        };
        let mut c = seq.to_be_bytes().to_vec();
        c.extend_from_slice(&next_row_id.to_be_bytes());
        writes.push((counters_key(id), Some(c)));
        writes.push((marker, Some(checkpoint.to_be_bytes().to_vec())));
        self.kv.write(writes, true)?;
        counters.next_row_id = next_row_id;
        h.ingested.send_modify(|m| {
            m.insert(writer, checkpoint);
        });
        if log.is_some() {
            counters.last_seq = seq;
            h.seq.send_replace(seq);
        }
        Ok(Ingested {
            seq: log.is_some().then_some(seq),
            duplicate: false,
            null_rows,
        })
    }

    /// Checks one table's changes and adds their writes (rows, log entry,
    /// counters) to `writes`; returns the sequence number they get.
    fn stage(
        &self,
        id: u64,
        h: &TableHandle,
        changes: &Chunk,
        counters: &mut Counters,
        writes: &mut Vec<KvWrite>,
    ) -> Result<u64> {
        for (key, row) in self.check_changes(h, changes, &HashMap::new())? {
            writes.push((keys::with_id_and(TABLE_ROW, id, &key), row));
        }
        let data = changes.data();
        let seq = counters.last_seq + 1;
        if h.desc.row_id {
            let ids = data
                .column(h.desc.key_columns[0])
                .as_any()
                .downcast_ref::<Int64Array>()
                .ok_or_else(|| StorageError::Internal("row id column is not int8".into()))?;
            if let Some(max) = ids.iter().flatten().max() {
                counters.next_row_id = counters.next_row_id.max(max + 1);
            }
        }
        writes.push((
            keys::with_id_and(TABLE_LOG, id, &seq.to_be_bytes()),
            Some(changes.to_ipc()?),
        ));
        let mut c = seq.to_be_bytes().to_vec();
        c.extend_from_slice(&counters.next_row_id.to_be_bytes());
        writes.push((counters_key(id), Some(c)));
        Ok(seq)
    }

    /// Checks one statement's changes against the rows under their keys:
    /// those of `earlier` (changes not yet written: an open transaction's)
    /// where it has the key, else the stored ones. An insert needs no row
    /// under its key; a retraction needs the very row it retracts (the
    /// statement read it from a snapshot: if another statement changed or
    /// deleted it since, the change log would retract a row that is not
    /// there). Returns each row's key and what it leaves there, in order.
    ///
    /// An insert into a table keyed by its hidden row id is not looked up:
    /// its id was allocated for it ([`TableStore::allocate_row_ids`]).
    pub(crate) fn check_changes(
        &self,
        h: &TableHandle,
        changes: &Chunk,
        earlier: &HashMap<Vec<u8>, Option<Vec<u8>>>,
    ) -> Result<Vec<KeyedRow>> {
        let data = changes.data();
        for (i, field) in h.desc.schema.fields().iter().enumerate() {
            if !field.is_nullable() && data.column(i).null_count() > 0 {
                let col = data.column(i);
                if (0..data.num_rows()).any(|r| col.is_null(r) && changes.op(r).sign() > 0) {
                    return Err(StorageError::NullValue(field.name().clone()));
                }
            }
        }
        let row_keys = h.keys_of(data)?;
        let rows = h.row_codec.encode(data.columns())?;
        // What this statement has done so far: the row under each key it
        // touched, if any.
        let mut overlay: HashMap<&[u8], Option<&Vec<u8>>> = HashMap::new();
        let mut out = Vec::with_capacity(rows.len());
        for (r, (key, row)) in row_keys.iter().zip(&rows).enumerate() {
            let op = changes.op(r);
            let current: Option<Vec<u8>> = match overlay.get(key.as_slice()) {
                Some(v) => v.cloned(),
                None => match earlier.get(key) {
                    Some(v) => v.clone(),
                    None if h.desc.row_id && op == Op::Insert => None,
                    None => self.kv.get(&keys::with_id_and(TABLE_ROW, h.desc.id, key))?,
                },
            };
            if op.sign() > 0 {
                if current.is_some() {
                    return Err(self.duplicate(h, data, r));
                }
                overlay.insert(key, Some(row));
                out.push((key.clone(), Some(row.clone())));
            } else {
                if current.as_ref() != Some(row) {
                    return Err(StorageError::SerializationFailure(h.desc.name.clone()));
                }
                overlay.insert(key, None);
                out.push((key.clone(), None));
            }
        }
        Ok(out)
    }

    fn duplicate(&self, h: &TableHandle, data: &RecordBatch, row: usize) -> StorageError {
        let schema = &h.desc.schema;
        let names: Vec<&str> = h
            .desc
            .key_columns
            .iter()
            .map(|i| schema.field(*i).name().as_str())
            .collect();
        let values: Vec<String> = h
            .desc
            .key_columns
            .iter()
            .map(|i| {
                datafusion::arrow::util::display::array_value_to_string(data.column(*i), row)
                    .unwrap_or_default()
            })
            .collect();
        StorageError::DuplicateKey {
            constraint: format!("{}_pkey", h.desc.name),
            key: format!("{})=({}", names.join(", "), values.join(", ")),
        }
    }

    /// The table's rows and the log sequence number they include, read from
    /// one snapshot.
    pub fn snapshot(&self, id: u64) -> Result<(Vec<RecordBatch>, u64)> {
        let mut at = 0;
        let mut batches = Vec::new();
        self.snapshot_pages(
            id,
            |seq| {
                at = seq;
                true
            },
            |batch| {
                batches.push(batch);
                true
            },
        )?;
        Ok((batches, at))
    }

    /// [`TableStore::snapshot`] a page at a time, from one snapshot: first
    /// the log sequence number the rows include to `seq`, then each page
    /// of rows to `page`, for as long as they return true. What the caller
    /// keeps is up to it: a reader that streams the pages holds one.
    pub fn snapshot_pages(
        &self,
        id: u64,
        seq: impl FnOnce(u64) -> bool,
        mut page: impl FnMut(RecordBatch) -> bool,
    ) -> Result<()> {
        let h = self.handle(id)?;
        self.kv.with_snapshot(|snap| {
            let at = match snap.get(&counters_key(id))? {
                Some(v) if v.len() == 16 => {
                    u64::from_be_bytes(v[0..8].try_into().unwrap_or_default())
                }
                _ => 0,
            };
            if !seq(at) {
                return Ok(());
            }
            let (mut from, to) = keys::id_range(TABLE_ROW, id);
            loop {
                let rows = snap.scan(&from, &to, SCAN_BATCH_ROWS)?;
                let Some((last, _)) = rows.last() else { break };
                let mut next = last.clone();
                next.push(0);
                let batch = h
                    .row_codec
                    .decode_batch(&h.desc.schema, rows.iter().map(|(_, v)| v.as_slice()))?;
                if !page(batch) || rows.len() < SCAN_BATCH_ROWS {
                    break;
                }
                from = next;
            }
            Ok(())
        })
    }

    /// Log entries after `after`, at most `max` of them.
    pub fn read_log(&self, id: u64, after: u64, max: usize) -> Result<Vec<LogEntry>> {
        let seq_of = |k: &[u8]| {
            k.get(9..17)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| StorageError::Corrupt("short log key".into()))
        };
        let from = keys::with_id_and(TABLE_LOG, id, &(after + 1).to_be_bytes());
        let (_, to) = keys::id_range(TABLE_LOG, id);
        let mut entries = self
            .kv
            .scan(&from, &to, max)?
            .into_iter()
            .map(|(k, v)| {
                Ok(LogEntry {
                    seq: seq_of(&k)?,
                    commit: None,
                    changes: Chunk::from_ipc(&v)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let Some(last) = entries.last().map(|e| e.seq) else {
            return Ok(entries);
        };
        // Which of them were written with other tables'.
        let from = keys::with_id_and(TABLE_COMMIT, id, &(after + 1).to_be_bytes());
        let to = keys::with_id_and(TABLE_COMMIT, id, &(last + 1).to_be_bytes());
        for (k, v) in self.kv.scan(&from, &to, usize::MAX)? {
            let seq = seq_of(&k)?;
            let commit = v
                .as_slice()
                .try_into()
                .map(u64::from_be_bytes)
                .map_err(|_| StorageError::Corrupt("commit number".into()))?;
            if let Some(e) = entries.iter_mut().find(|e| e.seq == seq) {
                e.commit = Some(commit);
            }
        }
        Ok(entries)
    }

    /// Follows the table's last log sequence number.
    pub fn subscribe(&self, id: u64) -> Result<watch::Receiver<u64>> {
        Ok(self.handle(id)?.seq.subscribe())
    }

    /// Follows the last checkpoint each writer of `ingest` applied.
    pub fn ingested(&self, id: u64) -> Result<watch::Receiver<BTreeMap<WriterId, u64>>> {
        Ok(self.handle(id)?.ingested.subscribe())
    }

    /// The bytes table `id` holds, as `(rows, change log)`: its keys and
    /// values as written, counted by reading them (what `pg_relation_size`
    /// and `pg_table_size` report).
    pub fn stored_bytes(&self, id: u64) -> Result<(u64, u64)> {
        let (from, to) = keys::id_range(keys::TABLE_ROW, id);
        let rows = self.kv.range_bytes(&from, &to)?;
        let (from, to) = keys::id_range(keys::TABLE_LOG, id);
        let log = self.kv.range_bytes(&from, &to)?;
        Ok((rows, log))
    }

    pub fn last_seq(&self, id: u64) -> Result<u64> {
        Ok(*self.handle(id)?.seq.borrow())
    }

    /// Deletes log entries up to and including `upto` (all consumers have
    /// checkpointed past them).
    pub fn truncate_log(&self, id: u64, upto: u64) -> Result<()> {
        for tag in [TABLE_LOG, TABLE_COMMIT] {
            let (from, _) = keys::id_range(tag, id);
            let to = keys::with_id_and(tag, id, &(upto + 1).to_be_bytes());
            self.kv.delete_range(&from, &to, false)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::Op;
    use datafusion::arrow::array::StringArray;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    fn writer(subtask: u32) -> WriterId {
        WriterId { job: 1, subtask }
    }

    fn store() -> (tempfile::TempDir, TableStore) {
        let dir = tempfile::tempdir().unwrap();
        let kv = Arc::new(KvStore::open(dir.path(), 1 << 20).unwrap());
        let s = TableStore::new(kv).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Utf8, true),
        ]));
        s.open_table(TableDesc {
            id: 1,
            name: "t".into(),
            schema,
            key_columns: vec![0],
            row_id: false,
        })
        .unwrap();
        (dir, s)
    }

    fn rows(s: &TableStore, k: Vec<i64>, v: Vec<&str>) -> RecordBatch {
        RecordBatch::try_new(
            s.desc(1).unwrap().schema,
            vec![
                Arc::new(Int64Array::from(k)),
                Arc::new(StringArray::from(v)),
            ],
        )
        .unwrap()
    }

    #[test]
    fn apply_snapshot_and_log() {
        let (_d, s) = store();
        let seq = s
            .apply(1, &Chunk::inserts(rows(&s, vec![2, 1], vec!["b", "a"])))
            .unwrap();
        assert_eq!(seq, 1);
        let err = s
            .apply(1, &Chunk::inserts(rows(&s, vec![3, 1], vec!["c", "x"])))
            .unwrap_err();
        assert!(matches!(err, StorageError::DuplicateKey { .. }), "{err}");
        let upd = Chunk::with_ops(
            &[Op::UpdateDelete, Op::UpdateInsert],
            rows(&s, vec![1, 1], vec!["a", "z"]),
        );
        assert_eq!(s.apply(1, &upd).unwrap(), 2);
        let (batches, seq) = s.snapshot(1).unwrap();
        assert_eq!(seq, 2);
        let b = &batches[0];
        assert_eq!(b.num_rows(), 2);
        let v = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
        assert_eq!(v.value(0), "z");
        let log = s.read_log(1, 1, 10).unwrap();
        assert_eq!(log.len(), 1);
        assert_eq!(log[0].changes.op(1), Op::UpdateInsert);
    }
    #[test]
    fn retracting_a_row_changed_meanwhile_is_a_serialization_failure() {
        let (_d, s) = store();
        s.apply(1, &Chunk::inserts(rows(&s, vec![1], vec!["a"])))
            .unwrap();
        // Two statements both read (1, 'a'); the first updates it.
        let first = Chunk::with_ops(
            &[Op::UpdateDelete, Op::UpdateInsert],
            rows(&s, vec![1, 1], vec!["a", "b"]),
        );
        s.apply(1, &first).unwrap();
        let second = Chunk::with_ops(&[Op::Delete], rows(&s, vec![1], vec!["a"]));
        let err = s.apply(1, &second).unwrap_err();
        assert!(
            matches!(err, StorageError::SerializationFailure(_)),
            "{err}"
        );
        assert_eq!(s.last_seq(1).unwrap(), 2, "nothing logged");
        let gone = Chunk::with_ops(&[Op::Delete], rows(&s, vec![2], vec!["x"]));
        assert!(s.apply(1, &gone).is_err(), "a row that never was");
    }

    #[test]
    fn ingest_upserts_by_key_once_per_checkpoint() {
        let (_d, s) = store();
        s.apply(1, &Chunk::inserts(rows(&s, vec![1], vec!["a"])))
            .unwrap();
        // Key 1 replaced, key 2 inserted then deleted by key alone, key 3
        // inserted twice (the second wins), key 4 deleted though absent.
        let c = Chunk::with_ops(
            &[
                Op::Insert,
                Op::Insert,
                Op::Delete,
                Op::Insert,
                Op::Insert,
                Op::Delete,
            ],
            rows(
                &s,
                vec![1, 2, 2, 3, 3, 4],
                vec!["b", "x", "?", "c", "d", "?"],
            ),
        );
        let done = s.ingest(1, writer(0), 5, &c).unwrap();
        assert_eq!(done.seq, Some(2));
        let log = s.read_log(1, 1, 10).unwrap();
        let ops: Vec<Op> = (0..log[0].changes.num_rows())
            .map(|r| log[0].changes.op(r))
            .collect();
        use Op::*;
        assert_eq!(
            ops,
            vec![
                UpdateDelete,
                UpdateInsert,
                Insert,
                Delete,
                Insert,
                UpdateDelete,
                UpdateInsert
            ]
        );
        let (batches, _) = s.snapshot(1).unwrap();
        let v = batches[0]
            .column(1)
            .as_any()
            .downcast_ref::<StringArray>()
            .unwrap();
        assert_eq!((v.value(0), v.value(1)), ("b", "d"));
        assert_eq!(batches[0].num_rows(), 2);
        // The same checkpoint again, or an older one: nothing.
        assert!(s.ingest(1, writer(0), 5, &c).unwrap().duplicate);
        assert!(s.ingest(1, writer(0), 4, &c).unwrap().duplicate);
        // Another writer's checkpoint 5 is its own; rows that change
        // nothing log nothing.
        let same = Chunk::inserts(rows(&s, vec![1], vec!["b"]));
        let done = s.ingest(1, writer(1), 5, &same).unwrap();
        assert_eq!((done.seq, done.duplicate), (None, false));
        // So is another job's subtask 0 (a source's dead letters, which
        // every job reading the source writes).
        let other = WriterId { job: 9, subtask: 0 };
        assert!(!s.ingest(1, other, 1, &same).unwrap().duplicate);
        assert!(s.ingest(1, other, 1, &same).unwrap().duplicate);
        assert_eq!(s.last_seq(1).unwrap(), 2);
        // A NULL key drops its row, not the others. (What a connector
        // reads is nullable throughout.)
        let nullable: Vec<Field> = s
            .desc(1)
            .unwrap()
            .schema
            .fields()
            .iter()
            .map(|f| f.as_ref().clone().with_nullable(true))
            .collect();
        let nulls = Chunk::inserts(
            RecordBatch::try_new(
                Arc::new(Schema::new(nullable)),
                vec![
                    Arc::new(Int64Array::from(vec![None, Some(7)])),
                    Arc::new(StringArray::from(vec!["n", "g"])),
                ],
            )
            .unwrap(),
        );
        let done = s.ingest(1, writer(0), 6, &nulls).unwrap();
        assert_eq!((done.seq, done.null_rows), (Some(3), 1));
    }

    #[test]
    fn ingest_into_a_table_without_key_numbers_its_rows() {
        let dir = tempfile::tempdir().unwrap();
        let kv = Arc::new(KvStore::open(dir.path(), 1 << 20).unwrap());
        let s = TableStore::new(kv.clone()).unwrap();
        let user = Schema::new(vec![Field::new("v", DataType::Utf8, true)]);
        let stored = Arc::new(Schema::new(vec![
            Field::new("v", DataType::Utf8, true),
            Field::new(ROW_ID_COLUMN, DataType::Int64, false),
        ]));
        let desc = TableDesc {
            id: 2,
            name: "plain".into(),
            schema: stored,
            key_columns: vec![1],
            row_id: true,
        };
        s.open_table(desc.clone()).unwrap();
        let batch = RecordBatch::try_new(
            Arc::new(user),
            vec![Arc::new(StringArray::from(vec!["a", "a", "b"]))],
        )
        .unwrap();
        s.ingest(2, writer(0), 1, &Chunk::inserts(batch.clone()))
            .unwrap();
        s.ingest(2, writer(0), 2, &Chunk::inserts(batch)).unwrap();
        let (batches, seq) = s.snapshot(2).unwrap();
        assert_eq!(seq, 2);
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), 6);
        // The counters and markers survive a reopen.
        let again = TableStore::new(kv).unwrap();
        again.open_table(desc).unwrap();
        assert_eq!(again.allocate_row_ids(2, 1).unwrap(), 7);
        assert!(
            again
                .ingest(
                    2,
                    writer(0),
                    2,
                    &Chunk::inserts(batches[0].project(&[0]).unwrap())
                )
                .unwrap()
                .duplicate
        );
    }
}

//! A transaction block's writes, held until it ends.
//!
//! Inside `BEGIN … COMMIT` each statement's changes are checked as they
//! would be if written at once (keys, NOT NULL, rows changed since they
//! were read), against the stored rows *and* the block's own earlier
//! changes, but nothing is written: [`PendingWrites`] keeps them. `COMMIT`
//! writes them all with [`TableStore::commit_pending`], every table's in
//! one durable RocksDB write, so that no reader, view or restart ever sees
//! part of a transaction. `ROLLBACK` drops them; `ROLLBACK TO SAVEPOINT`
//! drops those after a mark.
//!
//! The block reads its own writes: a scan of a table it changed shows the
//! stored rows with the block's changes laid over them
//! ([`TableStore::overlay_page`], [`TableStore::pending_rows`]).

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::array::{BooleanArray, RecordBatch};

use crate::chunk::Chunk;
use crate::table::TableStore;
use crate::{Result, StorageError};

/// The most bytes of changes one transaction block holds before it
/// commits: they are kept in memory until then.
pub const MAX_PENDING_BYTES: usize = 1 << 30;

/// An open transaction block's changes, in the order its statements made
/// them.
#[derive(Debug, Clone, Default)]
pub struct PendingWrites {
    tables: BTreeMap<u64, TablePending>,
    /// The table each statement's changes went to, in order: what
    /// [`TableStore::rollback_pending`] undoes back to a mark.
    order: Vec<u64>,
    bytes: usize,
}

#[derive(Debug, Clone, Default)]
struct TablePending {
    chunks: Vec<Chunk>,
    /// What the block leaves under each key it touched: the encoded row,
    /// or `None` where it deleted the row.
    rows: HashMap<Vec<u8>, Option<Vec<u8>>>,
}

impl PendingWrites {
    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// A mark to roll back to (`SAVEPOINT`).
    pub fn mark(&self) -> usize {
        self.order.len()
    }

    /// Whether the block changed table `id`.
    pub fn touches(&self, id: u64) -> bool {
        self.tables.contains_key(&id)
    }

    /// The tables the block changed.
    pub fn tables(&self) -> impl Iterator<Item = u64> + '_ {
        self.tables.keys().copied()
    }
}

impl TableStore {
    /// Checks one statement's `changes` to table `id` against the stored
    /// rows and the block's earlier changes, and keeps them in `pending`.
    /// On error `pending` is as it was.
    pub fn stage_pending(
        &self,
        pending: &mut PendingWrites,
        id: u64,
        changes: Chunk,
    ) -> Result<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let h = self.handle(id)?;
        let bytes = changes.data().get_array_memory_size();
        if pending.bytes + bytes > MAX_PENDING_BYTES {
            return Err(StorageError::TooLarge(format!(
                "a transaction block holds at most {} MiB of changes until it commits; commit in smaller transactions",
                MAX_PENDING_BYTES >> 20
            )));
        }
        let rows = match pending.tables.get(&id) {
            Some(table) => self.check_changes(&h, &changes, &table.rows)?,
            None => self.check_changes(&h, &changes, &HashMap::new())?,
        };
        let table = pending.tables.entry(id).or_default();
        table.rows.extend(rows);
        table.chunks.push(changes);
        pending.order.push(id);
        pending.bytes += bytes;
        Ok(())
    }

    /// Writes the block's changes, every table's in one durable write (one
    /// change-log entry per table), checked again against what is stored
    /// now: a row the block read and another transaction changed since
    /// fails the whole commit (`40001`), with nothing written.
    pub fn commit_pending(&self, pending: &PendingWrites) -> Result<()> {
        let mut merged = Vec::with_capacity(pending.tables.len());
        for (id, table) in &pending.tables {
            let schema = self.handle(*id)?.desc.schema.clone();
            merged.push((*id, Chunk::concat(&schema, &table.chunks)?));
        }
        let refs: Vec<(u64, &Chunk)> = merged.iter().map(|(id, c)| (*id, c)).collect();
        if !refs.is_empty() {
            self.apply_many(&refs)?;
        }
        Ok(())
    }

    /// Drops the changes made after `mark` (`ROLLBACK TO SAVEPOINT`).
    pub fn rollback_pending(&self, pending: &mut PendingWrites, mark: usize) -> Result<()> {
        let mut dropped: BTreeMap<u64, usize> = BTreeMap::new();
        for id in pending.order.drain(mark.min(pending.order.len())..) {
            *dropped.entry(id).or_default() += 1;
        }
        for (id, n) in dropped {
            let Some(table) = pending.tables.get_mut(&id) else {
                continue;
            };
            let keep = table.chunks.len().saturating_sub(n);
            for c in table.chunks.drain(keep..) {
                pending.bytes = pending
                    .bytes
                    .saturating_sub(c.data().get_array_memory_size());
            }
            if table.chunks.is_empty() {
                pending.tables.remove(&id);
                continue;
            }
            // What the remaining changes leave under each key, replayed
            // (they were checked when they were made).
            let h = self.handle(id)?;
            table.rows.clear();
            for chunk in &table.chunks {
                let keys = h.keys_of(chunk.data())?;
                let rows = h.row_codec.encode(chunk.data().columns())?;
                for (r, (key, row)) in keys.into_iter().zip(rows).enumerate() {
                    let row = (chunk.op(r).sign() > 0).then_some(row);
                    table.rows.insert(key, row);
                }
            }
        }
        Ok(())
    }

    /// A page of table `id`'s stored rows without those the block changed
    /// or deleted; [`TableStore::pending_rows`] adds what it left in their
    /// place.
    pub fn overlay_page(
        &self,
        pending: &PendingWrites,
        id: u64,
        page: RecordBatch,
    ) -> Result<RecordBatch> {
        let Some(table) = pending.tables.get(&id) else {
            return Ok(page);
        };
        let h = self.handle(id)?;
        let keys = h.keys_of(&page)?;
        let keep: BooleanArray = keys
            .iter()
            .map(|k| Some(!table.rows.contains_key(k)))
            .collect();
        Ok(datafusion::arrow::compute::filter_record_batch(
            &page, &keep,
        )?)
    }

    /// The rows the block inserted or updated in table `id` and has not
    /// deleted since, in the table's stored schema.
    pub fn pending_rows(&self, pending: &PendingWrites, id: u64) -> Result<Option<RecordBatch>> {
        let Some(table) = pending.tables.get(&id) else {
            return Ok(None);
        };
        let h = self.handle(id)?;
        let live: Vec<&[u8]> = table.rows.values().flatten().map(Vec::as_slice).collect();
        if live.is_empty() {
            return Ok(None);
        }
        Ok(Some(h.row_codec.decode_batch(&h.desc.schema, live)?))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;
    use crate::KvStore;
    use crate::chunk::Op;
    use crate::table::TableDesc;

    /// Tables 1 and 2, both `(k bigint primary key, v text)`.
    fn store() -> (tempfile::TempDir, TableStore) {
        let dir = tempfile::tempdir().unwrap();
        let kv = Arc::new(KvStore::open(dir.path(), 1 << 20).unwrap());
        let s = TableStore::new(kv).unwrap();
        for id in [1, 2] {
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, false),
                Field::new("v", DataType::Utf8, true),
            ]));
            s.open_table(TableDesc {
                id,
                name: format!("t{id}"),
                schema,
                key_columns: vec![0],
                row_id: false,
            })
            .unwrap();
        }
        (dir, s)
    }

    fn rows(s: &TableStore, k: &[i64], v: &[&str]) -> RecordBatch {
        RecordBatch::try_new(
            s.desc(1).unwrap().schema,
            vec![
                Arc::new(Int64Array::from(k.to_vec())),
                Arc::new(StringArray::from(v.to_vec())),
            ],
        )
        .unwrap()
    }

    /// What a reader inside the block sees of table `id`, sorted.
    fn seen(s: &TableStore, p: &PendingWrites, id: u64) -> Vec<(i64, String)> {
        let (pages, _) = s.snapshot(id).unwrap();
        let mut out = Vec::new();
        let mut batches: Vec<RecordBatch> = pages
            .into_iter()
            .map(|b| s.overlay_page(p, id, b).unwrap())
            .collect();
        batches.extend(s.pending_rows(p, id).unwrap());
        for b in batches {
            let k = b.column(0).as_any().downcast_ref::<Int64Array>().unwrap();
            let v = b.column(1).as_any().downcast_ref::<StringArray>().unwrap();
            for i in 0..b.num_rows() {
                out.push((k.value(i), v.value(i).to_string()));
            }
        }
        out.sort();
        out
    }

    fn kv(pairs: &[(i64, &str)]) -> Vec<(i64, String)> {
        pairs.iter().map(|(k, v)| (*k, v.to_string())).collect()
    }

    #[test]
    fn a_block_reads_its_own_writes_and_commits_them_at_once() {
        let (_d, s) = store();
        s.apply(1, &Chunk::inserts(rows(&s, &[1, 2], &["a", "b"])))
            .unwrap();
        let mut p = PendingWrites::default();
        s.stage_pending(&mut p, 1, Chunk::inserts(rows(&s, &[3], &["c"])))
            .unwrap();
        let update = Chunk::with_ops(
            &[Op::UpdateDelete, Op::UpdateInsert],
            rows(&s, &[1, 1], &["a", "z"]),
        );
        s.stage_pending(&mut p, 1, update).unwrap();
        let delete = Chunk::with_ops(&[Op::Delete], rows(&s, &[2], &["b"]));
        s.stage_pending(&mut p, 1, delete).unwrap();
        s.stage_pending(&mut p, 2, Chunk::inserts(rows(&s, &[9], &["x"])))
            .unwrap();
        // Nothing is stored yet; the block sees its changes.
        assert_eq!(s.last_seq(1).unwrap(), 1);
        assert_eq!(s.last_seq(2).unwrap(), 0);
        assert_eq!(seen(&s, &p, 1), kv(&[(1, "z"), (3, "c")]));
        assert_eq!(seen(&s, &p, 2), kv(&[(9, "x")]));
        // A key the block inserted is taken, for the block.
        let again = Chunk::inserts(rows(&s, &[3], &["again"]));
        let err = s.stage_pending(&mut p, 1, again).unwrap_err();
        assert!(matches!(err, StorageError::DuplicateKey { .. }), "{err}");
        // One log entry per table, written together.
        s.commit_pending(&p).unwrap();
        assert_eq!(s.last_seq(1).unwrap(), 2);
        assert_eq!(s.last_seq(2).unwrap(), 1);
        let empty = PendingWrites::default();
        assert_eq!(seen(&s, &empty, 1), kv(&[(1, "z"), (3, "c")]));
        assert_eq!(s.read_log(1, 1, 10).unwrap()[0].changes.num_rows(), 4);
    }

    #[test]
    fn rolling_back_to_a_mark_forgets_what_came_after() {
        let (_d, s) = store();
        let mut p = PendingWrites::default();
        s.stage_pending(&mut p, 1, Chunk::inserts(rows(&s, &[1], &["a"])))
            .unwrap();
        let mark = p.mark();
        let delete = Chunk::with_ops(&[Op::Delete], rows(&s, &[1], &["a"]));
        s.stage_pending(&mut p, 1, delete).unwrap();
        s.stage_pending(&mut p, 2, Chunk::inserts(rows(&s, &[5], &["e"])))
            .unwrap();
        assert_eq!(seen(&s, &p, 1), kv(&[]));
        s.rollback_pending(&mut p, mark).unwrap();
        assert_eq!(seen(&s, &p, 1), kv(&[(1, "a")]));
        assert!(!p.touches(2));
        s.commit_pending(&p).unwrap();
        assert_eq!(seen(&s, &PendingWrites::default(), 1), kv(&[(1, "a")]));
        assert_eq!(s.last_seq(2).unwrap(), 0);
    }

    #[test]
    fn a_commit_over_a_row_changed_since_writes_nothing() {
        let (_d, s) = store();
        s.apply(1, &Chunk::inserts(rows(&s, &[1], &["a"]))).unwrap();
        let mut p = PendingWrites::default();
        s.stage_pending(&mut p, 2, Chunk::inserts(rows(&s, &[7], &["g"])))
            .unwrap();
        let delete = Chunk::with_ops(&[Op::Delete], rows(&s, &[1], &["a"]));
        s.stage_pending(&mut p, 1, delete).unwrap();
        // Another session updates the row the block deletes.
        let other = Chunk::with_ops(
            &[Op::UpdateDelete, Op::UpdateInsert],
            rows(&s, &[1, 1], &["a", "b"]),
        );
        s.apply(1, &other).unwrap();
        let err = s.commit_pending(&p).unwrap_err();
        assert!(
            matches!(err, StorageError::SerializationFailure(_)),
            "{err}"
        );
        assert_eq!(s.last_seq(2).unwrap(), 0, "no part of the block is written");
    }

    #[test]
    fn a_commit_over_several_tables_numbers_their_log_entries() {
        let (_d, s) = store();
        s.apply(1, &Chunk::inserts(rows(&s, &[1], &["a"]))).unwrap();
        assert_eq!(s.last_commit(), 0, "a write of one table has no number");
        let mut p = PendingWrites::default();
        s.stage_pending(&mut p, 1, Chunk::inserts(rows(&s, &[2], &["b"])))
            .unwrap();
        s.stage_pending(&mut p, 2, Chunk::inserts(rows(&s, &[3], &["c"])))
            .unwrap();
        s.commit_pending(&p).unwrap();
        assert_eq!(s.last_commit(), 1);
        let one = s.read_log(1, 0, 10).unwrap();
        let commits: Vec<_> = one.iter().map(|e| (e.seq, e.commit)).collect();
        assert_eq!(commits, vec![(1, None), (2, Some(1))]);
        let two = s.read_log(2, 0, 10).unwrap();
        assert_eq!(two[0].commit, Some(1));
        // Truncating the log takes the numbers with it.
        s.truncate_log(1, 2).unwrap();
        assert!(s.read_log(1, 0, 10).unwrap().is_empty());
    }
}

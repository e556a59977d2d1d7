//! Rows whose expressions fail are errors kept as data, as Materialize
//! keeps them: the job goes on without the row, and the error is counted.
//!
//! A row that makes a view's expression fail (division by zero, a bad
//! cast, an overflow) would otherwise fail its task, and the job would
//! restart into the same row until its restart strategy gives up — a view
//! stopped for good by a row that was already acknowledged. Instead, an
//! operator that evaluates expressions (Filter, Project, HashAgg for its
//! group keys, arguments and its aggregates' own values, HashJoin for its
//! join keys and, pair by pair, its other `ON` conditions; a hash exchange
//! sends a row whose key fails to the first subtask, which counts it)
//! finds the rows
//! that fail, leaves them out of its output and counts each error message
//! in an [`ErrorCollection`]: up for an inserted row, down for a deleted
//! one. The counts are state like any other, checkpointed in the
//! operator's error table (`planner::view_error_table`); `SELECT` on the
//! view reads them at the same checkpoint as the rows and fails with the
//! error while any is counted. Deleting or fixing the row retracts it
//! (its old version fails the same way), and the view heals.

use std::collections::{HashMap, HashSet};

use datafusion::arrow::array::{BooleanArray, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use storage::chunk::Chunk;
use storage::codec::RowCodec;
use storage::state::StateWrite;

use crate::operator::OperatorContext;
use crate::{ErrorKind, Failure, Result};

/// The columns of an error table as `SELECT` reads it: one row per error
/// counted, its kind (`ErrorKind::name`) and its message.
pub fn error_schema() -> SchemaRef {
    std::sync::Arc::new(Schema::new(vec![
        Field::new("kind", DataType::Utf8, false),
        Field::new("error", DataType::Utf8, false),
    ]))
}

/// The failures an error table's rows hold, in `error_schema`'s columns.
pub fn failures(batch: &datafusion::arrow::array::RecordBatch) -> Vec<Failure> {
    use datafusion::arrow::array::AsArray;
    let (Some(kinds), Some(messages)) = (
        batch.column(0).as_string_opt::<i32>(),
        batch.column(1).as_string_opt::<i32>(),
    ) else {
        return Vec::new();
    };
    kinds
        .iter()
        .zip(messages.iter())
        .map(|(k, m)| Failure::new(ErrorKind::from_name(k.unwrap_or("")), m.unwrap_or("")))
        .collect()
}

/// One operator's count of each error message, by key group.
pub struct ErrorCollection {
    table: u64,
    codec: RowCodec,
    /// Where this subtask counts new errors: its first key group.
    key_group: u16,
    /// (key group, encoded kind and message) → count.
    counts: HashMap<(u16, Vec<u8>), i64>,
    /// Entries changed since the last barrier.
    dirty: HashSet<(u16, Vec<u8>)>,
}

impl ErrorCollection {
    pub fn new(table: u64) -> Result<Self> {
        Ok(Self {
            table,
            codec: RowCodec::new(vec![DataType::Utf8, DataType::Utf8])?,
            key_group: 0,
            counts: HashMap::new(),
            dirty: Default::default(),
        })
    }

    /// The tables of an operator's collection, if it keeps one.
    pub fn tables(errors: &Option<Self>) -> Vec<u64> {
        errors.iter().map(|e| e.table).collect()
    }

    /// `on_start` of an operator's collection, if it keeps one.
    pub fn start(errors: &mut Option<Self>, ctx: &OperatorContext) -> Result<()> {
        errors.as_mut().map_or(Ok(()), |e| e.on_start(ctx))
    }

    /// `checkpoint` of an operator's collection, if it keeps one.
    pub fn checkpoint_if_any(errors: &mut Option<Self>, writes: &mut Vec<StateWrite>) {
        if let Some(e) = errors {
            e.checkpoint(writes);
        }
    }

    /// Restores the counts of this subtask's key groups.
    pub fn on_start(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.key_group = ctx.key_groups.start;
        for e in ctx.state.scan(self.table, ctx.key_groups.clone())? {
            let count = crate::operator::stored_count(&e.value, "error count")?;
            self.counts.insert((e.key_group, e.key), count);
        }
        Ok(())
    }

    /// Counts one row's error: `sign` 1 for a row that arrives, -1 for
    /// one that goes.
    pub fn add(&mut self, failure: &Failure, sign: i64) -> Result<()> {
        let key = self
            .codec
            .encode(&[
                std::sync::Arc::new(StringArray::from(vec![failure.kind.name()])),
                std::sync::Arc::new(StringArray::from(vec![failure.message.as_str()])),
            ])?
            .remove(0);
        let mine = (self.key_group, key.clone());
        let at = if sign < 0 && self.counts.get(&mine).copied().unwrap_or(0) <= 0 {
            // Counted in another key group before a rescale.
            self.counts
                .iter()
                .find(|((_, k), c)| *k == key && **c > 0)
                .map(|(at, _)| at.clone())
                .unwrap_or(mine)
        } else {
            mine
        };
        if sign > 0 && !self.counts.keys().any(|(_, k)| *k == key) {
            tracing::warn!(
                error = %failure,
                "a row's expression failed; the row is left out and the error kept until the row goes"
            );
        }
        let c = self.counts.entry(at.clone()).or_insert(0);
        *c += sign;
        if *c == 0 {
            self.counts.remove(&at);
        }
        self.dirty.insert(at);
        Ok(())
    }

    /// Writes the counts changed since the last barrier.
    pub fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) {
        for (key_group, key) in self.dirty.drain() {
            let value = self
                .counts
                .get(&(key_group, key.clone()))
                .map(|c| c.to_be_bytes().to_vec());
            writes.push(StateWrite {
                table: self.table,
                key_group,
                key,
                value,
            });
        }
    }
}

/// Runs `f` over `chunk`; if it fails and there is a collection, runs it
/// row by row to find the rows that fail, counts their errors, and runs it
/// once more over the others.
pub fn run_or_collect<T>(
    chunk: &Chunk,
    errors: Option<&mut ErrorCollection>,
    f: impl Fn(&Chunk) -> Result<T>,
) -> Result<Option<(Chunk, T)>> {
    let e = match f(chunk) {
        Ok(t) => return Ok(Some((chunk.clone(), t))),
        Err(e) => e,
    };
    let Some(errors) = errors else {
        return Err(e);
    };
    let n = chunk.num_rows();
    let mut keep = Vec::with_capacity(n);
    for row in 0..n {
        match f(&chunk.slice(row, 1)) {
            Ok(_) => keep.push(true),
            Err(e) => {
                errors.add(&e.failure(), chunk.op(row).sign())?;
                keep.push(false);
            }
        }
    }
    if !keep.contains(&true) {
        return Ok(None);
    }
    let kept = chunk.filter(&BooleanArray::from(keep))?;
    let t = f(&kept)?;
    Ok(Some((kept, t)))
}

//! Sinks: how a job's changes reach a system outside Weir, exactly once.
//!
//! Flink's two-phase commit (FLIP-143's `SinkWriter` and `Committer`),
//! kept small. A [`SinkWriter`] writes the changes as they come, invisibly
//! (a hidden file, rows held back). At a checkpoint's barrier it
//! *prepares*: makes what it wrote durable and returns a *committable*,
//! the few bytes that say how to make it visible (a file to rename). The
//! committable is state of the checkpoint. When the checkpoint completes,
//! the writer *commits* it. So what a sink shows is exactly what the
//! completed checkpoints cover: after a failure the job restarts from the
//! last completed checkpoint, whose committables are committed again (a
//! commit must be idempotent: the notice of completion may have been lost
//! or the commit half done), and what the failed attempt wrote after it is
//! discarded.
//!
//! [`CommittingSink`] runs that protocol around any writer at the end of a
//! subtask's chain. Each subtask keeps its pending committables under its
//! own key in the first key group it owns, so after a rescale every old
//! subtask's entry is restored by exactly one new subtask, which commits
//! it and cleans up after that writer.

mod blackhole;
mod encode;
mod file;
mod kafka;
mod kafka_transactions;
mod postgres;
mod table;

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use planner::spec::{ConnectorSpec, OperatorSpec};
use storage::chunk::Chunk;
use storage::state::StateWrite;

use crate::operator::OperatorContext;
use crate::task::TableLog;
use crate::{ExecError, Result};

pub use encode::Encoder;
pub use table::TABLE_SINK;
pub(crate) use table::TableWriter;

/// The sink connectors Weir has, as `connector = '…'` names them.
pub const SINK_CONNECTORS: &[&str] = &["blackhole", "file", "kafka", "postgres"];

/// What a sink's writer knows about the rows it gets.
#[derive(Debug, Clone)]
pub struct SinkContext {
    pub sink_id: u64,
    pub subtask: usize,
    /// The sink's columns.
    pub schema: SchemaRef,
    /// `primary_key`, by column position.
    pub key: Vec<usize>,
    /// Whether the sink's query only ever inserts.
    pub append_only_input: bool,
}

/// A sink's connector: checks its options and target, opens writers.
#[async_trait]
pub trait SinkConnector: Send + Sync {
    /// Checks that the target is there and can take the rows (at
    /// `CREATE SINK`).
    async fn check(&self) -> Result<()>;
    /// A writer for one subtask.
    fn writer(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter>>;
}

/// Writes one subtask's changes; see the module documentation.
#[async_trait]
pub trait SinkWriter: Send {
    /// Discards what writers `writers` wrote that no completed checkpoint
    /// covers: everything not prepared, and what was prepared for a
    /// checkpoint after `restored` (the checkpoint the job restarted from;
    /// `None` on a fresh start). `writers` is this subtask's index, and
    /// those of the subtasks that no longer exist whose state this one
    /// restored. Called once, before any write, after the restored
    /// committables are committed.
    async fn clean_up(&mut self, _writers: &[usize], _restored: Option<u64>) -> Result<()> {
        Ok(())
    }
    /// Writes changes, not yet visible.
    async fn write(&mut self, chunk: &Chunk) -> Result<()>;
    /// The barrier of `checkpoint`: what was written since the last
    /// prepare, made durable; `None` when there is nothing to commit.
    async fn prepare(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>>;
    /// Makes a prepared committable visible. Idempotent.
    async fn commit(&mut self, checkpoint: u64, committable: &[u8]) -> Result<()>;
}

/// The connector of a sink whose rows have `ctx`'s columns, its options
/// checked. `tables`: Weir's tables, for the job of a table that reads a
/// connector ([`TABLE_SINK`]), which users cannot name.
pub fn sink(
    spec: &ConnectorSpec,
    ctx: &SinkContext,
    tables: Option<&Arc<dyn TableLog>>,
) -> Result<Box<dyn SinkConnector>> {
    if let (TABLE_SINK, Some(tables)) = (spec.connector.as_str(), tables) {
        return Ok(Box::new(table::TableSink::new(tables.clone())));
    }
    match spec.connector.as_str() {
        "blackhole" => Ok(Box::new(blackhole::Blackhole::new(spec)?)),
        "file" => Ok(Box::new(file::FileSink::new(spec, ctx)?)),
        "kafka" => Ok(Box::new(kafka::KafkaSink::new(spec, ctx)?)),
        "postgres" => Ok(Box::new(postgres::PostgresSink::new(spec, ctx)?)),
        other => Err(ExecError::InvalidOption(format!(
            "unknown sink connector \"{other}\"; sink connectors are: {}",
            SINK_CONNECTORS.join(", ")
        ))),
    }
}

/// What a writer of the sink of `spec` (an [`OperatorSpec::Sink`]) knows,
/// with the sink's connector, name and state table.
fn context(
    spec: &OperatorSpec,
    schema: SchemaRef,
    subtask: usize,
) -> Result<(SinkContext, &ConnectorSpec, &str, u64)> {
    let OperatorSpec::Sink {
        sink_id,
        sink_name,
        connector,
        key,
        append_only_input,
        state_table,
    } = spec
    else {
        return Err(ExecError::Protocol(format!(
            "{} is not a sink",
            spec.name()
        )));
    };
    let ctx = SinkContext {
        sink_id: *sink_id,
        subtask,
        schema,
        key: key.clone(),
        append_only_input: *append_only_input,
    };
    Ok((ctx, connector, sink_name, *state_table))
}

/// Checks the options of the sink of `spec` (whose rows have `schema`)
/// and that its target is there: at `CREATE SINK`.
pub async fn check(spec: &OperatorSpec, schema: SchemaRef) -> Result<()> {
    let (ctx, connector, _, _) = context(spec, schema, 0)?;
    sink(connector, &ctx, None)?.check().await
}

/// `FORMAT PLAIN` over a query that updates or deletes: the changes other
/// than inserts would be lost, so the user must say so.
pub(crate) fn plain_needs_append_only(
    spec: &ConnectorSpec,
    ctx: &SinkContext,
    force_append_only: bool,
) -> Result<()> {
    if ctx.append_only_input || force_append_only {
        return Ok(());
    }
    Err(ExecError::InvalidOption(format!(
        "connector {} with FORMAT PLAIN writes inserts only, but the sink's query also \
         updates or deletes rows; add force_append_only = 'true' to drop those changes",
        spec.connector
    )))
}

/// The rows of `chunk` that add (`+I`, `+U`); those that retract are
/// dropped (`FORMAT PLAIN`).
pub(crate) fn inserts(chunk: &Chunk) -> Result<Option<datafusion::arrow::array::RecordBatch>> {
    use datafusion::arrow::array::BooleanArray;
    if chunk.signs().all(|s| s > 0) {
        return Ok((!chunk.is_empty()).then(|| chunk.data().clone()));
    }
    let mask: BooleanArray = chunk.signs().map(|s| Some(s > 0)).collect();
    let kept = datafusion::arrow::compute::filter_record_batch(chunk.data(), &mask)?;
    Ok((kept.num_rows() > 0).then_some(kept))
}

/// What `chunk` does to a result keyed by the columns `key`, whatever the
/// order of its rows: per key (in the order keys first appear), the row
/// the key now has (`true`), or a row of the key that is gone (`false`).
/// A row added and retracted in the chunk cancels out.
pub(crate) fn upserts(chunk: &Chunk, key: &[usize]) -> Result<Vec<(usize, bool)>> {
    use std::collections::HashMap;

    use datafusion::arrow::row::{RowConverter, SortField};
    let batch = chunk.data();
    let rows_of = |columns: &[usize]| -> Result<datafusion::arrow::row::Rows> {
        let fields = columns
            .iter()
            .map(|c| SortField::new(batch.schema().field(*c).data_type().clone()))
            .collect();
        let arrays: Vec<_> = columns.iter().map(|c| batch.column(*c).clone()).collect();
        Ok(RowConverter::new(fields)?.convert_columns(&arrays)?)
    };
    let all: Vec<usize> = (0..batch.num_columns()).collect();
    let (rows, keys) = (rows_of(&all)?, rows_of(key)?);
    // Net count of each whole row, and a row index where it occurs.
    let mut net: HashMap<&[u8], (i64, usize)> = HashMap::new();
    for (i, sign) in chunk.signs().enumerate() {
        let e = net.entry(rows.row(i).data()).or_insert((0, i));
        e.0 += sign;
    }
    // Per key: the row it has now, else a row it lost.
    let mut order: Vec<&[u8]> = Vec::new();
    let mut by_key: HashMap<&[u8], (Option<usize>, Option<usize>)> = HashMap::new();
    for i in 0..chunk.num_rows() {
        let Some(&(count, first)) = net.get(rows.row(i).data()) else {
            continue;
        };
        if first != i || count == 0 {
            continue;
        }
        let k = keys.row(i).data();
        let e = by_key.entry(k).or_insert_with(|| {
            order.push(k);
            (None, None)
        });
        if count > 0 {
            e.0 = Some(i);
        } else {
            e.1 = Some(i);
        }
    }
    Ok(order
        .into_iter()
        .filter_map(|k| match by_key[k] {
            (Some(now), _) => Some((now, true)),
            (None, Some(gone)) => Some((gone, false)),
            (None, None) => None,
        })
        .collect())
}

/// A checkpoint's changes, held back until its barrier by a writer that
/// applies a whole checkpoint in one transaction of the target (the
/// postgres sink, the exactly-once kafka sink). The committable is the
/// writer's index and the changes as Arrow IPC ([`Held::decode`]): a
/// commit after a rescale may be another subtask's, and its target keeps
/// a high-water mark per writer.
pub(crate) struct Held {
    subtask: usize,
    schema: SchemaRef,
    chunks: Vec<Chunk>,
}

impl Held {
    pub(crate) fn new(ctx: &SinkContext) -> Self {
        Self {
            subtask: ctx.subtask,
            schema: ctx.schema.clone(),
            chunks: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, chunk: &Chunk) {
        self.chunks.push(chunk.clone());
    }

    /// The committable of what was held since the last barrier; `None`
    /// when nothing was.
    pub(crate) fn prepare(&mut self) -> Result<Option<Vec<u8>>> {
        if self.chunks.is_empty() {
            return Ok(None);
        }
        let chunk = Chunk::concat(&self.schema, &std::mem::take(&mut self.chunks))?;
        let mut out = (self.subtask as u32).to_be_bytes().to_vec();
        out.extend(chunk.to_ipc()?);
        Ok(Some(out))
    }

    /// The writer and the changes of a committable of `connector`'s.
    pub(crate) fn decode(connector: &str, committable: &[u8]) -> Result<(usize, Chunk)> {
        let (writer, ipc) = committable.split_at_checked(4).ok_or_else(|| {
            ExecError::Protocol(format!("{connector} sink: committable too short"))
        })?;
        let writer = u32::from_be_bytes(writer.try_into().expect("4 bytes")) as usize;
        Ok((writer, Chunk::from_ipc(ipc)?))
    }
}

/// The state key under which writer `subtask` keeps its pending
/// committables: `prefix subtask`.
fn writer_key(prefix: &[u8], subtask: usize) -> Vec<u8> {
    let mut key = prefix.to_vec();
    key.extend_from_slice(&(subtask as u32).to_be_bytes());
    key
}

fn encode_pending(pending: &BTreeMap<u64, Vec<u8>>) -> Vec<u8> {
    let mut out = Vec::new();
    for (checkpoint, c) in pending {
        out.extend_from_slice(&checkpoint.to_be_bytes());
        out.extend_from_slice(&(c.len() as u32).to_be_bytes());
        out.extend_from_slice(c);
    }
    out
}

fn decode_pending(mut bytes: &[u8]) -> Result<BTreeMap<u64, Vec<u8>>> {
    let corrupt = || ExecError::Protocol("corrupt sink state".into());
    let mut out = BTreeMap::new();
    while !bytes.is_empty() {
        let checkpoint =
            u64::from_be_bytes(bytes.get(..8).ok_or_else(corrupt)?.try_into().unwrap());
        let len = u32::from_be_bytes(bytes.get(8..12).ok_or_else(corrupt)?.try_into().unwrap());
        let end = 12 + len as usize;
        out.insert(checkpoint, bytes.get(12..end).ok_or_else(corrupt)?.to_vec());
        bytes = &bytes[end..];
    }
    Ok(out)
}

/// The last step of a sink's subtasks: a writer, and the committables it
/// prepared that no completed checkpoint is known to have committed.
pub struct CommittingSink {
    sink_name: String,
    writer: Box<dyn SinkWriter>,
    state_table: u64,
    /// What the keys of its entries start with: nothing at the end of a
    /// sink's subtask, which owns its state table; a tag where it shares
    /// the table with an operator (a source's dead letters).
    prefix: &'static [u8],
    subtask: usize,
    /// Where this subtask's entry lives: its first key group.
    home: u16,
    pending: BTreeMap<u64, Vec<u8>>,
    /// Entries of other writers restored here, deleted at the next
    /// checkpoint (their committables are committed by then).
    restored: Vec<(u16, Vec<u8>)>,
}

impl std::fmt::Debug for CommittingSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommittingSink")
            .field("sink", &self.sink_name)
            .field("subtask", &self.subtask)
            .finish()
    }
}

impl CommittingSink {
    /// The sink of `spec` (an [`OperatorSpec::Sink`]) whose rows have
    /// `schema`, for subtask `subtask`, which reaches Weir's tables through
    /// `tables`.
    pub fn new(
        spec: &OperatorSpec,
        schema: SchemaRef,
        subtask: usize,
        tables: &Arc<dyn TableLog>,
    ) -> Result<Self> {
        let (ctx, connector, sink_name, state_table) = context(spec, schema, subtask)?;
        let writer = sink(connector, &ctx, Some(tables))?.writer(&ctx)?;
        Ok(Self::with_writer(
            sink_name.to_string(),
            writer,
            state_table,
            b"",
            subtask,
        ))
    }

    /// Runs the protocol around `writer` of subtask `subtask`, keeping its
    /// entries in `state_table` under keys that start with `prefix`.
    pub(crate) fn with_writer(
        sink_name: String,
        writer: Box<dyn SinkWriter>,
        state_table: u64,
        prefix: &'static [u8],
        subtask: usize,
    ) -> Self {
        Self {
            sink_name,
            writer,
            state_table,
            prefix,
            subtask,
            home: 0,
            pending: BTreeMap::new(),
            restored: Vec::new(),
        }
    }

    /// Restores: commits the committables of the checkpoint restored from
    /// (and any earlier ones never known committed), then lets the writer
    /// discard the rest.
    pub async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.home = ctx.key_groups.start;
        let mut committables = BTreeMap::new();
        let mut writers = vec![self.subtask];
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            let Some(writer) = e.key.strip_prefix(self.prefix) else {
                continue;
            };
            let writer = u32::from_be_bytes(
                writer
                    .try_into()
                    .map_err(|_| ExecError::Protocol("corrupt sink state key".into()))?,
            ) as usize;
            for (checkpoint, c) in decode_pending(&e.value)? {
                committables.insert((checkpoint, writer), c);
            }
            // A writer that still exists cleans up after itself.
            if writer >= ctx.parallelism {
                writers.push(writer);
            }
            if (e.key_group, &e.key) != (self.home, &writer_key(self.prefix, self.subtask)) {
                self.restored.push((e.key_group, e.key));
            }
        }
        for ((checkpoint, _), c) in &committables {
            self.writer.commit(*checkpoint, c).await?;
        }
        if !committables.is_empty() {
            tracing::info!(sink = %self.sink_name, subtask = self.subtask, committed = committables.len(), "sink committed restored checkpoints");
        }
        self.writer.clean_up(&writers, ctx.restored_from).await
    }

    pub async fn write(&mut self, chunk: &Chunk) -> Result<()> {
        if chunk.is_empty() {
            return Ok(());
        }
        self.writer.write(chunk).await
    }

    /// The barrier of `checkpoint`: prepare, and keep what is pending.
    pub async fn checkpoint(
        &mut self,
        checkpoint: u64,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        if let Some(c) = self.writer.prepare(checkpoint).await? {
            self.pending.insert(checkpoint, c);
        }
        for (key_group, key) in self.restored.drain(..) {
            writes.push(StateWrite {
                table: self.state_table,
                key_group,
                key,
                value: None,
            });
        }
        // Written every time, even empty: after a rescale the entry tells
        // the new owner of this key group which writer to clean up after.
        writes.push(StateWrite {
            table: self.state_table,
            key_group: self.home,
            key: writer_key(self.prefix, self.subtask),
            value: Some(encode_pending(&self.pending)),
        });
        Ok(())
    }

    /// Checkpoint `checkpoint` completed: commit what it (and any earlier
    /// one) prepared.
    pub async fn commit(&mut self, checkpoint: u64) -> Result<()> {
        let later = self.pending.split_off(&(checkpoint + 1));
        let due = std::mem::replace(&mut self.pending, later);
        for (id, c) in &due {
            self.writer.commit(*id, c).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upserts_do_not_depend_on_the_order_of_a_chunks_rows() {
        use std::sync::Arc;

        use datafusion::arrow::array::{Int64Array, RecordBatch};
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        use storage::chunk::Op;
        let chunk = |ops: &[Op], k: &[i64], v: &[i64]| {
            let schema = Arc::new(Schema::new(vec![
                Field::new("k", DataType::Int64, false),
                Field::new("v", DataType::Int64, false),
            ]));
            let data = RecordBatch::try_new(
                schema,
                vec![
                    Arc::new(Int64Array::from(k.to_vec())),
                    Arc::new(Int64Array::from(v.to_vec())),
                ],
            )
            .unwrap();
            Chunk::with_ops(ops, data)
        };
        use Op::*;
        // Key 1 updated (new image first), key 2 deleted, key 3 inserted
        // and deleted again, key 4 inserted.
        let c = chunk(
            &[UpdateInsert, Delete, Insert, UpdateDelete, Delete, Insert],
            &[1, 2, 3, 1, 3, 4],
            &[11, 20, 30, 10, 30, 40],
        );
        assert_eq!(
            upserts(&c, &[0]).unwrap(),
            vec![(0, true), (1, false), (5, true)]
        );
        let plain = inserts(&c).unwrap().unwrap();
        assert_eq!(plain.num_rows(), 3);
    }

    #[test]
    fn pending_committables_round_trip() {
        let mut p = BTreeMap::new();
        assert!(decode_pending(&encode_pending(&p)).unwrap().is_empty());
        p.insert(3, b"a".to_vec());
        p.insert(7, Vec::new());
        p.insert(9, b"file\0name".to_vec());
        assert_eq!(decode_pending(&encode_pending(&p)).unwrap(), p);
        assert!(decode_pending(&[0, 1, 2]).is_err());
    }
}

//! ConnectorSource: the head of a task that reads a connector's splits.
//!
//! Each split this subtask owns (see [`connectors::owned_splits`]) is read
//! by a fetcher of its own, a tokio task that runs ahead of the source task
//! by a few batches (Flink's `SplitFetcher` and element queue). Batches
//! arrive with the position after them, and the source records a split's
//! position only when it emits that batch, so the positions a barrier
//! snapshots are exactly those of the rows before it.
//!
//! When every split it owns has ended (a bounded source, or none at all),
//! the subtask's watermark goes to the end of time, as Flink's bounded
//! sources do: windows downstream close.
//!
//! A record that cannot be decoded is skipped and counted, per split, in
//! the same state as the split's position, so the count is exactly that of
//! the records the completed checkpoints cover (`weir_catalog.source_errors`
//! sums it from the acknowledgements). With a dead-letter table the
//! skipped records are also kept there: they are written as a sink writes,
//! through [`CommittingSink`] around a [`TableWriter`], applied to the
//! table when the checkpoint that covers them completes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use planner::spec::OperatorSpec;
use storage::chunk::Chunk;
use storage::state::StateWrite;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::event_time::EventTime;
use crate::connectors::{self, Pace, ReadBatch, Rejected, SourceConnector};
use crate::message::Watermark;
use crate::operator::OperatorContext;
use crate::sinks::{CommittingSink, TableWriter};
use crate::task::{DecodeErrors, TableLog};
use crate::{ExecError, Result, expr};

const WATERMARK_KEY: &[u8] = b"watermark";
/// The dead-letter writer's entries start with this.
const DEAD_LETTERS_PREFIX: &[u8] = b"dead/";
/// Batches fetched ahead of the task, over all its splits.
const QUEUE: usize = 8;

fn split_key(split: usize) -> Vec<u8> {
    format!("split/{split}").into_bytes()
}

fn errors_key(split: usize) -> Vec<u8> {
    format!("errors/{split}").into_bytes()
}

/// The number in a state key `prefix N` (`split/3`, `errors/3`).
fn split_of(key: &[u8], prefix: &str) -> Option<usize> {
    std::str::from_utf8(key)
        .ok()?
        .strip_prefix(prefix)?
        .parse()
        .ok()
}

/// A split's skipped records as state: the count, then if there was one,
/// the last error's time and text.
fn encode_errors(e: &DecodeErrors) -> Vec<u8> {
    let mut out = e.records.to_be_bytes().to_vec();
    if let Some((at, message)) = &e.last {
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(message.as_bytes());
    }
    out
}

/// [`encode_errors`]'s bytes, as the skipped records of `source`.
fn decode_errors(source: u64, bytes: &[u8]) -> Result<DecodeErrors> {
    let corrupt = || ExecError::Storage(storage::StorageError::Corrupt("source errors".into()));
    let records = u64::from_be_bytes(
        bytes
            .get(..8)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(corrupt)?,
    );
    let last = match bytes.get(8..16) {
        None => None,
        Some(at) => Some((
            i64::from_be_bytes(at.try_into().map_err(|_| corrupt())?),
            String::from_utf8_lossy(&bytes[16..]).into_owned(),
        )),
    };
    Ok(DecodeErrors {
        source,
        records,
        last,
    })
}

/// What a fetcher hands the task.
enum Fetched {
    Batch(usize, ReadBatch),
    Ended(usize),
    Failed(ExecError),
}

#[derive(Debug, Default)]
struct SplitState {
    /// After the last batch emitted; `None` before the first.
    position: Option<Vec<u8>>,
    /// When the split last had nothing more to read beyond that position
    /// (see [`ReadBatch::as_of`]); `None` while it has more.
    caught_up: Option<Instant>,
    ended: bool,
    /// The records it skipped (its source's id is not set).
    errors: DecodeErrors,
}

pub struct ConnectorSource {
    source_id: u64,
    name: String,
    connector: Arc<dyn SourceConnector>,
    projection: Vec<usize>,
    schema: SchemaRef,
    state_table: u64,
    event_time: EventTime,
    splits: BTreeMap<usize, SplitState>,
    queue: Option<mpsc::Receiver<Fetched>>,
    fetchers: Vec<JoinHandle<()>>,
    /// The first key group of this subtask: where its watermark is kept.
    home: u16,
    /// The last barrier this subtask emitted, and when.
    last_barrier: Option<(u64, Instant)>,
    /// The splits' positions at each barrier not yet known completed.
    at_barrier: BTreeMap<u64, Vec<(usize, Vec<u8>)>>,
    /// With a dead-letter table: its writer, and the records skipped since
    /// the last barrier, with when.
    dead_letters: Option<(CommittingSink, Vec<(Rejected, i64)>)>,
}

impl std::fmt::Debug for ConnectorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectorSource")
            .field("name", &self.name)
            .field("splits", &self.splits)
            .finish()
    }
}

impl Drop for ConnectorSource {
    fn drop(&mut self) {
        for f in &self.fetchers {
            f.abort();
        }
    }
}

impl ConnectorSource {
    /// The source of `spec` for subtask `subtask` of job `job`, which
    /// reaches Weir's tables (a dead-letter table) through `tables`.
    pub fn new(
        spec: &OperatorSpec,
        output: &DFSchema,
        job: u64,
        subtask: usize,
        tables: &Arc<dyn TableLog>,
    ) -> Result<Self> {
        let OperatorSpec::ConnectorSource {
            source_id,
            source_name,
            connector,
            source_schema,
            projection,
            state_table,
            watermark,
        } = spec
        else {
            return Err(ExecError::Protocol("not a connector source".into()));
        };
        let columns = expr::output_schema(source_schema);
        let dead_letters = connector.dead_letter_table.map(|table| {
            let writer = TableWriter::new(
                tables.clone(),
                table,
                job,
                subtask,
                connectors::dead_letter_schema(),
            );
            let sink = CommittingSink::with_writer(
                format!("{source_name} (dead letters)"),
                Box::new(writer),
                *state_table,
                DEAD_LETTERS_PREFIX,
                subtask,
            );
            (sink, Vec::new())
        });
        Ok(Self {
            source_id: *source_id,
            name: source_name.clone(),
            connector: connectors::source(connector, &columns)?,
            projection: projection.clone(),
            schema: expr::output_schema(output),
            state_table: *state_table,
            event_time: EventTime::new(watermark.as_ref())?,
            splits: BTreeMap::new(),
            queue: None,
            fetchers: Vec::new(),
            home: 0,
            last_barrier: None,
            at_barrier: BTreeMap::new(),
            dead_letters,
        })
    }

    /// Finds the splits this subtask owns and their positions at the last
    /// committed checkpoint, and starts a fetcher on each.
    pub async fn open(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.home = ctx.key_groups.start;
        let splits = self.connector.splits().await?;
        for s in connectors::owned_splits(splits, &ctx.key_groups) {
            self.splits.insert(s, SplitState::default());
        }
        let mut watermark: Option<i64> = None;
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            if e.key == WATERMARK_KEY {
                // After a rescale a subtask may find several: the least is safe.
                let v: [u8; 8] = e
                    .value
                    .as_slice()
                    .try_into()
                    .map_err(|_| storage::StorageError::Corrupt("source watermark".into()))?;
                let v = i64::from_be_bytes(v);
                watermark = Some(watermark.map_or(v, |w| w.min(v)));
            } else if let Some(split) = split_of(&e.key, "split/")
                && let Some(state) = self.splits.get_mut(&split)
            {
                state.position = Some(e.value);
            } else if let Some(split) = split_of(&e.key, "errors/")
                && let Some(state) = self.splits.get_mut(&split)
            {
                state.errors = decode_errors(0, &e.value)?;
            }
        }
        // The dead letters of the checkpoint restored are applied first.
        if let Some((sink, _)) = &mut self.dead_letters {
            sink.open(ctx).await?;
        }
        if let Some(w) = watermark {
            self.event_time.advance(w);
        }
        let (tx, rx) = mpsc::channel(QUEUE);
        for (split, state) in &self.splits {
            let mut reader =
                self.connector
                    .reader(*split, state.position.as_deref(), Pace::Rated)?;
            let tx = tx.clone();
            let split = *split;
            self.fetchers.push(tokio::spawn(async move {
                loop {
                    let fetched = match reader.next().await {
                        Ok(Some(b)) => Fetched::Batch(split, b),
                        Ok(None) => Fetched::Ended(split),
                        Err(e) => Fetched::Failed(e),
                    };
                    let last = !matches!(fetched, Fetched::Batch(..));
                    if tx.send(fetched).await.is_err() || last {
                        return;
                    }
                }
            }));
        }
        self.queue = Some(rx);
        self.check_ended();
        tracing::debug!(source = %self.name, splits = ?self.splits.keys().collect::<Vec<_>>(), "source splits");
        Ok(())
    }

    /// Every split has ended: event time is complete.
    fn check_ended(&mut self) {
        if self.splits.values().all(|s| s.ended) {
            self.event_time.advance(i64::MAX);
        }
    }

    /// The next rows, projected, waiting for them; cancel-safe. Waits for
    /// ever once every split has ended.
    pub async fn next(&mut self) -> Result<Option<Chunk>> {
        let Some(queue) = self.queue.as_mut() else {
            return std::future::pending().await;
        };
        match queue.recv().await {
            None => {
                self.queue = None;
                Ok(None)
            }
            Some(Fetched::Failed(e)) => Err(e),
            Some(Fetched::Ended(split)) => {
                if let Some(s) = self.splits.get_mut(&split) {
                    s.ended = true;
                }
                self.check_ended();
                Ok(None)
            }
            Some(Fetched::Batch(split, batch)) => {
                if let Some(s) = self.splits.get_mut(&split) {
                    s.position = Some(batch.position);
                    s.caught_up = batch.caught_up.then_some(batch.as_of);
                    if let Some(last) = batch.rejected.last() {
                        let now = crate::operator::processing_time_us();
                        s.errors.records += batch.rejected.len() as u64;
                        s.errors.last = Some((now, last.error.clone()));
                        if let Some((_, pending)) = &mut self.dead_letters {
                            pending.extend(batch.rejected.into_iter().map(|r| (r, now)));
                        }
                    }
                }
                if batch.data.num_rows() == 0 {
                    return Ok(None);
                }
                self.event_time.observe(&batch.data)?;
                let data = batch.data.project(&self.projection)?;
                let data = expr::batch(&self.schema, data.columns().to_vec(), data.num_rows())?;
                Ok(Some(match &batch.ops {
                    Some(ops) => Chunk::with_ops(ops, data),
                    None => Chunk::inserts(data),
                }))
            }
        }
    }

    /// The watermark, if it advanced.
    pub fn take_watermark(&mut self) -> Option<Watermark> {
        self.event_time.take()
    }

    /// Whether the rows emitted before checkpoint `checkpoint`'s barrier
    /// are all there was to read when the previous checkpoint's barrier
    /// went out: whatever was written before that checkpoint was triggered
    /// is in. (A split's "nothing more" from a read begun earlier may be
    /// stale: a record written meanwhile is not in it.) `FLUSH` relies on
    /// this; a subtask that did not emit the previous barrier is behind.
    pub fn caught_up(&self, checkpoint: u64) -> bool {
        let Some((previous, at)) = self.last_barrier else {
            return false;
        };
        previous + 1 == checkpoint
            && self
                .splits
                .values()
                .all(|s| s.ended || s.caught_up.is_some_and(|t| t >= at))
            && self.queue.as_ref().is_none_or(|q| q.is_empty())
    }

    /// Checkpoint `checkpoint`'s barrier went out now.
    pub fn barrier_emitted(&mut self, checkpoint: u64) {
        self.last_barrier = Some((checkpoint, Instant::now()));
        let positions = self
            .splits
            .iter()
            .filter_map(|(split, s)| Some((*split, s.position.clone()?)))
            .collect();
        self.at_barrier.insert(checkpoint, positions);
    }

    /// Checkpoint `checkpoint` completed: the connector may let go of what
    /// comes before the positions it holds, and the dead letters it covers
    /// go into their table.
    pub async fn committed(&mut self, checkpoint: u64) -> Result<()> {
        let later = self.at_barrier.split_off(&(checkpoint + 1));
        let done = std::mem::replace(&mut self.at_barrier, later);
        if let Some((_, positions)) = done.into_iter().next_back() {
            for (split, position) in positions {
                self.connector.committed(split, &position);
            }
        }
        if let Some((sink, _)) = &mut self.dead_letters {
            sink.commit(checkpoint).await?;
        }
        Ok(())
    }

    /// The barrier of `checkpoint`: each split's position and errors, the
    /// watermark, and the dead letters prepared, as state writes.
    pub async fn snapshot(&mut self, checkpoint: u64, writes: &mut Vec<StateWrite>) -> Result<()> {
        for (split, state) in &self.splits {
            let key_group = connectors::split_key_group(*split);
            if let Some(p) = &state.position {
                writes.push(StateWrite {
                    table: self.state_table,
                    key_group,
                    key: split_key(*split),
                    value: Some(p.clone()),
                });
            }
            if state.errors.records > 0 {
                writes.push(StateWrite {
                    table: self.state_table,
                    key_group,
                    key: errors_key(*split),
                    value: Some(encode_errors(&state.errors)),
                });
            }
        }
        self.event_time
            .snapshot(self.state_table, self.home, WATERMARK_KEY, writes);
        if let Some((sink, pending)) = &mut self.dead_letters {
            if !pending.is_empty() {
                let rows = connectors::dead_letter_rows(&self.name, pending)?;
                pending.clear();
                sink.write(&Chunk::inserts(rows)).await?;
            }
            sink.checkpoint(checkpoint, writes).await?;
        }
        Ok(())
    }

    /// The records this subtask's splits skipped, as of the last snapshot's
    /// state: what its acknowledgement reports.
    pub fn decode_errors(&self) -> DecodeErrors {
        let mut all = DecodeErrors {
            source: self.source_id,
            ..Default::default()
        };
        for s in self.splits.values() {
            all.add(&s.errors);
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_errors_round_trip() {
        for e in [
            DecodeErrors::default(),
            DecodeErrors {
                source: 0,
                records: 3,
                last: Some((1_700_000_000_000_000, "expected value at line 1".into())),
            },
        ] {
            assert_eq!(decode_errors(0, &encode_errors(&e)).unwrap(), e);
        }
        assert!(decode_errors(0, &[1, 2]).is_err());
        assert_eq!(split_of(b"errors/12", "errors/"), Some(12));
        assert_eq!(split_of(b"split/12", "errors/"), None);
    }
}

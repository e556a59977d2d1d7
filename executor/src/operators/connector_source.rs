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
use crate::connectors::{self, Pace, ReadBatch, SourceConnector};
use crate::message::Watermark;
use crate::operator::OperatorContext;
use crate::{ExecError, Result, expr};

const WATERMARK_KEY: &[u8] = b"watermark";
/// Batches fetched ahead of the task, over all its splits.
const QUEUE: usize = 8;

fn split_key(split: usize) -> Vec<u8> {
    format!("split/{split}").into_bytes()
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
}

pub struct ConnectorSource {
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
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::ConnectorSource {
            source_name,
            connector,
            source_schema,
            projection,
            state_table,
            watermark,
            ..
        } = spec
        else {
            return Err(ExecError::Protocol("not a connector source".into()));
        };
        let columns = expr::output_schema(source_schema);
        Ok(Self {
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
            } else if let Some(split) = std::str::from_utf8(&e.key)
                .ok()
                .and_then(|k| k.strip_prefix("split/"))
                .and_then(|n| n.parse::<usize>().ok())
                && let Some(state) = self.splits.get_mut(&split)
            {
                state.position = Some(e.value);
            }
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
    /// comes before the positions it holds.
    pub fn committed(&mut self, checkpoint: u64) {
        let later = self.at_barrier.split_off(&(checkpoint + 1));
        let done = std::mem::replace(&mut self.at_barrier, later);
        if let Some((_, positions)) = done.into_iter().next_back() {
            for (split, position) in positions {
                self.connector.committed(split, &position);
            }
        }
    }

    /// Each split's position, and the watermark, as state writes.
    pub fn snapshot(&self, writes: &mut Vec<StateWrite>) {
        for (split, state) in &self.splits {
            if let Some(p) = &state.position {
                writes.push(StateWrite {
                    table: self.state_table,
                    key_group: connectors::split_key_group(*split),
                    key: split_key(*split),
                    value: Some(p.clone()),
                });
            }
        }
        self.event_time
            .snapshot(self.state_table, self.home, WATERMARK_KEY, writes);
    }
}

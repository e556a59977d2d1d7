//! TableSource: the head of a source task. It reads a table's snapshot once
//! (the backfill), then follows the table's change log.
//!
//! Its position — the last log sequence number it emitted — is its state.
//! Backfill happens before the first barrier: a restart before the first
//! completed checkpoint finds no position and backfills again, with the rest
//! of the job's state equally empty, so nothing is counted twice. After that
//! the position travels with every checkpoint, so a restart resumes exactly
//! after the last row the committed views include.
//!
//! A log entry written together with other tables' (one transaction's
//! commit, numbered) is emitted only once a barrier includes its commit
//! number, just before that barrier: every source of the job then puts the
//! commit's entries into the same checkpoint, and no view shows half of
//! it. The entries after it wait behind it, to keep the table's order.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use storage::chunk::Chunk;
use storage::state::StateWrite;
use tokio::sync::watch;

use planner::spec::SourceWatermark;

use super::event_time::EventTime;
use crate::message::Watermark;
use crate::operator::OperatorContext;
use crate::task::{RowStream, TableLog};
use crate::{Result, expr};

const POSITION_KEY: &[u8] = b"position";
const WATERMARK_KEY: &[u8] = b"watermark";
/// Log entries read per poll.
const LOG_BATCH: usize = 256;

/// The most rows in a chunk the source emits: a write of millions of rows
/// (one `INSERT … SELECT`, one `COPY`) enters the dataflow in pieces, so
/// that what each operator builds per chunk (encoded keys and rows, batched
/// reads) stays bounded. DataFusion's default batch size.
pub const MAX_CHUNK_ROWS: usize = 8192;

pub struct TableSource {
    table_id: u64,
    projection: Vec<usize>,
    state_table: u64,
    schema: SchemaRef,
    log: Arc<dyn TableLog>,
    position: Option<u64>,
    /// The table's last sequence number; `None` until [`TableSource::open`].
    seq: Option<watch::Receiver<u64>>,
    /// `WATERMARK FOR`.
    event_time: EventTime,
    /// The last commit to several tables the latest barrier included:
    /// entries of later ones wait for a barrier.
    released: u64,
    /// Whether the next entry waits for a barrier.
    held: bool,
}

impl std::fmt::Debug for TableSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableSource")
            .field("table_id", &self.table_id)
            .field("position", &self.position)
            .finish()
    }
}

impl TableSource {
    pub fn new(
        table_id: u64,
        projection: Vec<usize>,
        state_table: u64,
        output: &DFSchema,
        log: Arc<dyn TableLog>,
    ) -> Self {
        Self {
            table_id,
            projection,
            state_table,
            schema: expr::output_schema(output),
            log,
            position: None,
            seq: None,
            event_time: EventTime::default(),
            released: 0,
            held: false,
        }
    }

    /// Derives watermarks from `w` (see [`SourceWatermark`]).
    pub fn with_watermark(mut self, w: &SourceWatermark) -> Result<Self> {
        self.event_time = EventTime::new(Some(w))?;
        Ok(self)
    }

    /// The watermark, if it advanced since the last call.
    pub fn take_watermark(&mut self) -> Option<Watermark> {
        self.event_time.take()
    }

    /// Starts following the table's log.
    pub async fn open(&mut self) -> Result<()> {
        self.seq = Some(self.log.subscribe(self.table_id).await?);
        Ok(())
    }

    pub fn table_id(&self) -> u64 {
        self.table_id
    }

    /// The last log sequence number emitted.
    pub fn position(&self) -> u64 {
        self.position.unwrap_or(0)
    }

    /// Restores the position (and watermark) of the last committed
    /// checkpoint.
    pub fn restore(&mut self, ctx: &OperatorContext) -> Result<()> {
        for e in ctx.state.scan(self.state_table, 0..1)? {
            let v: [u8; 8] = e
                .value
                .as_slice()
                .try_into()
                .map_err(|_| storage::StorageError::Corrupt("source state".into()))?;
            if e.key == POSITION_KEY {
                self.position = Some(u64::from_be_bytes(v));
            } else if e.key == WATERMARK_KEY {
                self.event_time.restore(&v)?;
            }
        }
        Ok(())
    }

    fn project(&mut self, chunk: Chunk) -> Result<Chunk> {
        // The expression reads the user columns, a prefix of the stored ones.
        let n = e_columns(&chunk);
        self.event_time
            .observe(&chunk.data().project(&(0..n).collect::<Vec<_>>())?)?;
        let data = chunk.data().project(&self.projection)?;
        let data = expr::batch(&self.schema, data.columns().to_vec(), data.num_rows())?;
        Ok(chunk.with_data(data))
    }

    /// On a fresh start, the table's rows, read from one snapshot a page
    /// at a time as the stream is polled (a table of any size is backfilled
    /// in the memory of a few pages; [`TableSource::backfill_chunks`] turns
    /// each into chunks to emit); afterwards nothing.
    pub async fn backfill_stream(&mut self) -> Result<Option<RowStream>> {
        if self.position.is_some() {
            return Ok(None);
        }
        let (seq, rows) = self.log.clone().snapshot_stream(self.table_id).await?;
        self.position = Some(seq);
        Ok(Some(rows))
    }

    /// A page of the backfill as inserts.
    pub fn backfill_chunks(&mut self, page: RecordBatch) -> Result<Vec<Chunk>> {
        if page.num_rows() == 0 {
            return Ok(Vec::new());
        }
        Ok(self.project(Chunk::inserts(page))?.split(MAX_CHUNK_ROWS))
    }

    /// The whole backfill at once.
    #[cfg(test)]
    pub async fn backfill(&mut self) -> Result<Vec<Chunk>> {
        use futures::StreamExt;
        let mut out = Vec::new();
        if let Some(mut rows) = self.backfill_stream().await? {
            while let Some(page) = rows.next().await {
                out.extend(self.backfill_chunks(page?)?);
            }
        }
        Ok(out)
    }

    /// Log entries after the position, up to a batch of them, as far as
    /// the next entry of a commit the latest barrier did not include;
    /// advances.
    pub async fn poll(&mut self) -> Result<Vec<Chunk>> {
        let entries = self
            .log
            .read_log(self.table_id, self.position(), LOG_BATCH)
            .await?;
        let mut out = Vec::with_capacity(entries.len());
        for entry in entries {
            if entry.commit.is_some_and(|c| c > self.released) {
                self.held = true;
                break;
            }
            self.position = Some(entry.seq);
            out.extend(self.project(entry.changes)?.split(MAX_CHUNK_ROWS));
        }
        Ok(out)
    }

    /// The log entries a barrier that includes the commits up to `commit`
    /// takes in before it, from those written before it was triggered.
    pub async fn before_barrier(&mut self, commit: u64) -> Result<Vec<Chunk>> {
        self.released = self.released.max(commit);
        self.held = false;
        let target = self.latest();
        let mut out = Vec::new();
        while self.position() < target && !self.held {
            let chunks = self.poll().await?;
            if chunks.is_empty() && !self.held {
                break;
            }
            out.extend(chunks);
        }
        Ok(out)
    }

    /// The table's last log sequence number.
    pub fn latest(&self) -> u64 {
        self.seq.as_ref().map(|s| *s.borrow()).unwrap_or(0)
    }

    /// Whether the log has entries past the position that may go now.
    pub fn has_more(&self) -> bool {
        !self.held && self.latest() > self.position()
    }

    /// Waits until the table's log grows.
    pub async fn changed(&mut self) {
        let Some(seq) = self.seq.as_mut() else {
            return std::future::pending().await;
        };
        if seq.changed().await.is_err() {
            // The table was dropped; the job is being cancelled.
            std::future::pending::<()>().await;
        }
    }

    /// The position (and watermark) as state writes.
    pub fn snapshot(&self, writes: &mut Vec<StateWrite>) {
        writes.push(StateWrite {
            table: self.state_table,
            key_group: 0,
            key: POSITION_KEY.to_vec(),
            value: Some(self.position().to_be_bytes().to_vec()),
        });
        self.event_time
            .snapshot(self.state_table, 0, WATERMARK_KEY, writes);
    }
}

/// How many leading columns a watermark expression may read: the stored
/// row id, if any, comes after the user columns and is never named.
fn e_columns(chunk: &Chunk) -> usize {
    let schema = chunk.schema();
    let n = schema.fields().len();
    match schema.fields().last() {
        Some(f) if f.name() == storage::table::ROW_ID_COLUMN => n - 1,
        _ => n,
    }
}

/// A TaskManager in the JobManager's process reads the tables directly.
#[async_trait::async_trait]
impl TableLog for storage::table::TableStore {
    async fn subscribe(&self, table: u64) -> Result<watch::Receiver<u64>> {
        Ok(storage::table::TableStore::subscribe(self, table)?)
    }

    async fn snapshot(&self, table: u64) -> Result<(Vec<RecordBatch>, u64)> {
        Ok(storage::table::TableStore::snapshot(self, table)?)
    }

    async fn snapshot_stream(self: Arc<Self>, table: u64) -> Result<(u64, RowStream)> {
        use futures::StreamExt;
        let (seq_tx, seq_rx) = tokio::sync::oneshot::channel::<Result<u64>>();
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<RecordBatch>>(2);
        tokio::task::spawn_blocking(move || {
            let mut seq_tx = Some(seq_tx);
            let read = self.snapshot_pages(
                table,
                |seq| seq_tx.take().is_some_and(|s| s.send(Ok(seq)).is_ok()),
                // Stops when the reader is gone.
                |page| tx.blocking_send(Ok(page)).is_ok(),
            );
            if let Err(e) = read {
                match seq_tx.take() {
                    Some(s) => drop(s.send(Err(e.into()))),
                    None => drop(tx.blocking_send(Err(e.into()))),
                }
            }
        });
        let seq = seq_rx
            .await
            .map_err(|_| crate::ExecError::Service("the table snapshot reader stopped".into()))??;
        let rows = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|page| (page, rx))
        });
        Ok((seq, rows.boxed()))
    }

    async fn read_log(
        &self,
        table: u64,
        after: u64,
        max: usize,
    ) -> Result<Vec<storage::table::LogEntry>> {
        Ok(storage::table::TableStore::read_log(
            self, table, after, max,
        )?)
    }

    async fn ingest(
        &self,
        table: u64,
        writer: storage::table::WriterId,
        checkpoint: u64,
        changes: &Chunk,
    ) -> Result<storage::table::Ingested> {
        Ok(storage::table::TableStore::ingest(
            self, table, writer, checkpoint, changes,
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx, int_schema};
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use storage::table::{TableDesc, TableStore};

    fn table() -> (tempfile::TempDir, Arc<TableStore>) {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            TableStore::new(Arc::new(
                storage::KvStore::open(dir.path(), 1 << 20).unwrap(),
            ))
            .unwrap(),
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int64, false),
            Field::new("b", DataType::Int64, true),
        ]));
        store
            .open_table(TableDesc {
                id: 1,
                name: "t".into(),
                schema,
                key_columns: vec![0],
                row_id: false,
            })
            .unwrap();
        (dir, store)
    }

    fn insert(store: &TableStore, a: i64) {
        let schema = store.desc(1).unwrap().schema;
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![a])),
                Arc::new(Int64Array::from(vec![a * 10])),
            ],
        )
        .unwrap();
        store.apply(1, &Chunk::inserts(batch)).unwrap();
    }

    #[tokio::test]
    async fn backfills_then_follows_and_resumes_from_its_position() {
        let (_dir, store) = table();
        insert(&store, 1);
        insert(&store, 2);
        let output = int_schema(&["b"]);
        let mut s = TableSource::new(1, vec![1], 7, &output, store.clone());
        s.restore(&ctx(Arc::new(MemState::default()))).unwrap();
        s.open().await.unwrap();
        let snapshot = s.backfill().await.unwrap();
        assert_eq!(snapshot.iter().map(|c| c.num_rows()).sum::<usize>(), 2);
        assert_eq!(snapshot[0].data().num_columns(), 1, "projected");
        assert!(!s.has_more());
        insert(&store, 3);
        assert!(s.has_more());
        assert_eq!(s.poll().await.unwrap().len(), 1);
        let mut writes = vec![];
        s.snapshot(&mut writes);
        insert(&store, 4);
        // A restart from that checkpoint resumes after row 3, without a backfill.
        let mut again = TableSource::new(1, vec![1], 7, &output, store);
        again
            .restore(&ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))))
            .unwrap();
        again.open().await.unwrap();
        assert!(again.backfill().await.unwrap().is_empty());
        let rest = again.poll().await.unwrap();
        assert_eq!(rest.len(), 1);
        assert_eq!(
            rest[0]
                .data()
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0),
            40
        );
    }

    #[tokio::test]
    async fn watermarks_follow_the_largest_value_and_survive_a_restore() {
        let (_dir, store) = table();
        insert(&store, 3);
        insert(&store, 1);
        let table_schema = Arc::new(int_schema(&["a", "b"]));
        let w = SourceWatermark {
            expr: datafusion::logical_expr::col("b"),
            table_schema,
            sql: "b".into(),
        };
        let output = int_schema(&["a"]);
        let mut s = TableSource::new(1, vec![0], 7, &output, store.clone())
            .with_watermark(&w)
            .unwrap();
        s.restore(&ctx(Arc::new(MemState::default()))).unwrap();
        s.open().await.unwrap();
        s.backfill().await.unwrap();
        assert_eq!(s.take_watermark().map(|w| w.timestamp), Some(30));
        assert_eq!(s.take_watermark(), None, "only when it advances");
        insert(&store, 2);
        s.poll().await.unwrap();
        assert_eq!(s.take_watermark(), None, "never backwards");
        insert(&store, 5);
        s.poll().await.unwrap();
        assert_eq!(s.take_watermark().map(|w| w.timestamp), Some(50));
        let mut writes = vec![];
        s.snapshot(&mut writes);
        let mut again = TableSource::new(1, vec![0], 7, &output, store)
            .with_watermark(&w)
            .unwrap();
        again
            .restore(&ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))))
            .unwrap();
        assert_eq!(again.take_watermark().map(|w| w.timestamp), Some(50));
    }
}

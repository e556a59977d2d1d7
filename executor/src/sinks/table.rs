//! The last step of the job of a table that reads a connector (`CREATE
//! TABLE … WITH (connector = …)`, RisingWave's form): what the connector
//! read during an epoch is applied to the Weir table when the epoch's
//! checkpoint completes, by `TableLog::ingest`. The checkpoint holds the
//! connector's positions (Kafka offsets), so the table holds exactly the
//! records the completed checkpoints cover, each once: an epoch committed
//! again after a failure is recognised by the table's per-writer marker.
//!
//! Not a connector users name: the server builds this sink for the table.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use storage::chunk::Chunk;
use storage::table::WriterId;

use super::{SinkConnector, SinkContext, SinkWriter};
use crate::task::TableLog;
use crate::{ExecError, Result};

/// The sink connector's name in the job's plan.
pub const TABLE_SINK: &str = "weir_table";

pub(super) struct TableSink {
    tables: Arc<dyn TableLog>,
}

impl TableSink {
    pub(super) fn new(tables: Arc<dyn TableLog>) -> Self {
        Self { tables }
    }
}

#[async_trait]
impl SinkConnector for TableSink {
    async fn check(&self) -> Result<()> {
        Ok(())
    }

    fn writer(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter>> {
        // The table's own job has the table's id.
        Ok(Box::new(TableWriter::new(
            self.tables.clone(),
            ctx.sink_id,
            ctx.sink_id,
            ctx.subtask,
            ctx.schema.clone(),
        )))
    }
}

/// One subtask's writer: holds an epoch's changes until its checkpoint.
pub(crate) struct TableWriter {
    tables: Arc<dyn TableLog>,
    table: u64,
    /// The job writing; with a subtask's index, the table's marker of
    /// what that writer applied.
    job: u64,
    subtask: u32,
    schema: SchemaRef,
    epoch: Vec<Chunk>,
}

impl TableWriter {
    /// Subtask `subtask` of job `job`, writing rows of `schema` into
    /// table `table`.
    pub(crate) fn new(
        tables: Arc<dyn TableLog>,
        table: u64,
        job: u64,
        subtask: usize,
        schema: SchemaRef,
    ) -> Self {
        Self {
            tables,
            table,
            job,
            subtask: subtask as u32,
            schema,
            epoch: Vec::new(),
        }
    }
}

#[async_trait]
impl SinkWriter for TableWriter {
    async fn write(&mut self, chunk: &Chunk) -> Result<()> {
        self.epoch.push(chunk.clone());
        Ok(())
    }

    /// The committable is the writer's index and the epoch's changes (as
    /// Arrow IPC, none if there were none): state of the checkpoint until
    /// it is applied. Every epoch has one, so that the table's marker of
    /// each writer says which checkpoints it has applied (`FLUSH` waits
    /// for them).
    async fn prepare(&mut self, _checkpoint: u64) -> Result<Option<Vec<u8>>> {
        let mut out = self.subtask.to_be_bytes().to_vec();
        if !self.epoch.is_empty() {
            let chunks = std::mem::take(&mut self.epoch);
            out.extend_from_slice(&Chunk::concat(&self.schema, &chunks)?.to_ipc()?);
        }
        Ok(Some(out))
    }

    async fn commit(&mut self, checkpoint: u64, committable: &[u8]) -> Result<()> {
        let (writer, ipc) = committable
            .split_first_chunk::<4>()
            .ok_or_else(|| ExecError::Protocol("corrupt table committable".into()))?;
        let chunk = if ipc.is_empty() {
            Chunk::inserts(RecordBatch::new_empty(self.schema.clone()))
        } else {
            Chunk::from_ipc(ipc)?
        };
        let done = self
            .tables
            .ingest(
                self.table,
                WriterId {
                    job: self.job,
                    subtask: u32::from_be_bytes(*writer),
                },
                checkpoint,
                &chunk,
            )
            .await?;
        if done.null_rows > 0 {
            tracing::warn!(
                table = self.table,
                checkpoint,
                rows = done.null_rows,
                "rows with NULL in a NOT NULL or key column were dropped"
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int64Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use storage::table::{TableDesc, TableStore};

    #[tokio::test]
    async fn an_epoch_is_applied_once_and_empty_epochs_advance_the_marker() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(
            TableStore::new(Arc::new(
                storage::KvStore::open(dir.path(), 1 << 20).unwrap(),
            ))
            .unwrap(),
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, false),
            Field::new("v", DataType::Int64, true),
        ]));
        store
            .open_table(TableDesc {
                id: 9,
                name: "t".into(),
                schema: schema.clone(),
                key_columns: vec![0],
                row_id: false,
            })
            .unwrap();
        let tables: Arc<dyn TableLog> = store.clone();
        let ctx = SinkContext {
            sink_id: 9,
            subtask: 1,
            schema: schema.clone(),
            key: vec![0],
            append_only_input: true,
        };
        let mut w = TableSink::new(tables).writer(&ctx).unwrap();
        let batch = |k: Vec<i64>, v: Vec<i64>| {
            RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(Int64Array::from(k)), Arc::new(Int64Array::from(v))],
            )
            .unwrap()
        };
        w.write(&Chunk::inserts(batch(vec![1, 2], vec![10, 20])))
            .await
            .unwrap();
        w.write(&Chunk::inserts(batch(vec![1], vec![11])))
            .await
            .unwrap();
        let c = w.prepare(4).await.unwrap().unwrap();
        w.commit(4, &c).await.unwrap();
        // Committed again after a restore: nothing changes.
        w.commit(4, &c).await.unwrap();
        let (rows, seq) = store.snapshot(9).unwrap();
        assert_eq!(seq, 1);
        assert_eq!(rows[0].num_rows(), 2);
        let v = rows[0]
            .column(1)
            .as_any()
            .downcast_ref::<Int64Array>()
            .unwrap();
        assert_eq!(v.values(), &[11, 20]);
        let empty = w.prepare(5).await.unwrap().unwrap();
        w.commit(5, &empty).await.unwrap();
        let writer = WriterId { job: 9, subtask: 1 };
        assert_eq!(store.ingested(9).unwrap().borrow().get(&writer), Some(&5));
        assert_eq!(store.last_seq(9).unwrap(), 1);
    }
}

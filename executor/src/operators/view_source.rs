//! ViewSource: the head of a source task that reads another materialized
//! view's committed output, so that a view over a view does the work of
//! its own layer only (RisingWave's MV-on-MV).
//!
//! The upstream view's job keeps a changelog next to its rows (see
//! [`super::changelog`]): every completed checkpoint *n* of that job holds
//! the view's rows at *n* and the net change of each epoch up to *n*. The
//! source reads only completed checkpoints:
//! * **backfill**: on a fresh start, the view's rows at its latest completed
//!   checkpoint *C*, as inserts, before the first barrier (as a table's
//!   source does: a restart before the first completed checkpoint of this
//!   job backfills again, with the rest of its state as empty);
//! * then, whenever the upstream completes another checkpoint *A*, the
//!   changes of every epoch after its position up to *A*, read whole before
//!   the next barrier: a checkpoint of this job never holds part of an
//!   upstream epoch, so a transaction that is one epoch upstream is one
//!   checkpoint here too.
//!
//! Its position — the last upstream epoch it emitted — is its state, so a
//! restart of either job resumes with no gap and no duplicate. The
//! upstream keeps the epochs after the position of every reader's oldest
//! retained checkpoint (the JobManager tells its barriers so), whatever the
//! view's `retain_history`.

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{Int64Type, SchemaRef};
use datafusion::common::DFSchema;
use storage::chunk::{Chunk, Op};
use storage::state::StateWrite;

use super::table_source::MAX_CHUNK_ROWS;
use crate::operator::OperatorContext;
use crate::task::{RowStream, ViewLog};
use crate::{ExecError, Result, expr};

const POSITION_KEY: &[u8] = b"epoch";

pub struct ViewSource {
    view_id: u64,
    view_name: String,
    /// The reading job: the upstream holds its changes for it.
    job: u64,
    projection: Vec<usize>,
    state_table: u64,
    /// Every column of the view, as it stores them.
    view_schema: SchemaRef,
    /// The source's output.
    schema: SchemaRef,
    log: Arc<dyn ViewLog>,
    /// The last upstream epoch emitted; `None` before the backfill.
    position: Option<u64>,
    /// The upstream's latest completed checkpoint, as last seen.
    latest: u64,
}

impl std::fmt::Debug for ViewSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewSource")
            .field("view_id", &self.view_id)
            .field("position", &self.position)
            .finish()
    }
}

/// What the upstream completed after the position: read page by page.
pub struct ViewRead {
    /// The epoch the read ends at.
    pub at: u64,
    pub pages: RowStream,
}

impl ViewSource {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        view_id: u64,
        view_name: String,
        job: u64,
        projection: Vec<usize>,
        state_table: u64,
        view_schema: &DFSchema,
        output: &DFSchema,
        log: Arc<dyn ViewLog>,
    ) -> Self {
        Self {
            view_id,
            view_name,
            job,
            projection,
            state_table,
            view_schema: expr::output_schema(view_schema),
            schema: expr::output_schema(output),
            log,
            position: None,
            latest: 0,
        }
    }

    pub fn view_id(&self) -> u64 {
        self.view_id
    }

    /// The last upstream epoch emitted.
    pub fn position(&self) -> u64 {
        self.position.unwrap_or(0)
    }

    /// Restores the position of the last committed checkpoint.
    pub fn restore(&mut self, ctx: &OperatorContext) -> Result<()> {
        for e in ctx.state.scan(self.state_table, 0..1)? {
            if e.key == POSITION_KEY {
                let v: [u8; 8] = e
                    .value
                    .as_slice()
                    .try_into()
                    .map_err(|_| storage::StorageError::Corrupt("view source state".into()))?;
                self.position = Some(u64::from_be_bytes(v));
            }
        }
        Ok(())
    }

    /// On a fresh start, the view's rows at its latest completed
    /// checkpoint, read a page at a time; afterwards nothing.
    pub async fn backfill_stream(&mut self) -> Result<Option<RowStream>> {
        if self.position.is_some() {
            return Ok(None);
        }
        let (at, rows) = self
            .log
            .snapshot(self.view_id, self.view_schema.clone(), self.job)
            .await?;
        self.position = Some(at);
        self.latest = self.latest.max(at);
        Ok(Some(rows))
    }

    /// A page of the backfill as inserts.
    pub fn backfill_chunks(&self, page: RecordBatch) -> Result<Vec<Chunk>> {
        if page.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let data = self.project(page.columns())?;
        Ok(Chunk::inserts(data).split(MAX_CHUNK_ROWS))
    }

    fn project(&self, columns: &[datafusion::arrow::array::ArrayRef]) -> Result<RecordBatch> {
        let rows = columns.first().map_or(0, |c| c.len());
        let picked = self
            .projection
            .iter()
            .map(|i| {
                columns.get(*i).cloned().ok_or_else(|| {
                    ExecError::Protocol(format!(
                        "view source of \"{}\" projects column {i} of {}",
                        self.view_name,
                        columns.len()
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        expr::batch(&self.schema, picked, rows)
    }

    /// Whether the upstream completed a checkpoint after the position.
    pub fn has_more(&self) -> bool {
        self.position.is_some() && self.latest > self.position()
    }

    /// Waits (a while) for the upstream to complete a checkpoint after the
    /// position.
    pub async fn changed(&mut self) -> Result<()> {
        let latest = self
            .log
            .completed_after(self.view_id, self.position())
            .await?;
        self.latest = self.latest.max(latest);
        Ok(())
    }

    /// Starts reading every epoch after the position up to the upstream's
    /// latest completed checkpoint; `None` when there is none.
    pub async fn read(&mut self) -> Result<Option<ViewRead>> {
        let since = self.position();
        let changes = self
            .log
            .changes(self.view_id, self.view_schema.clone(), since)
            .await?;
        self.latest = self.latest.max(changes.at);
        if changes.at <= since {
            return Ok(None);
        }
        if since < changes.horizon {
            return Err(ExecError::Service(format!(
                "materialized view \"{}\" no longer has the changes after epoch {since} \
                 (it has dropped epochs up to {}): a view reading it cannot go on",
                self.view_name, changes.horizon
            )));
        }
        Ok(Some(ViewRead {
            at: changes.at,
            pages: changes.pages,
        }))
    }

    /// The read ended at epoch `at`: everything up to it was emitted.
    pub fn advance(&mut self, at: u64) {
        self.position = Some(at);
    }

    /// A page of changes (`epoch, diff, columns…`, one kind of change per
    /// page) as chunks: each row repeated by its diff, an insert when its
    /// count went up, a delete when it went down.
    pub fn change_chunks(&self, page: RecordBatch) -> Result<Vec<Chunk>> {
        if page.num_rows() == 0 {
            return Ok(Vec::new());
        }
        if page.num_columns() < 2 {
            return Err(ExecError::Protocol(
                "a page of view changes without epoch and diff".into(),
            ));
        }
        let diffs = page.column(1).as_primitive::<Int64Type>();
        let mut indices = Vec::with_capacity(page.num_rows());
        let mut ops = Vec::with_capacity(page.num_rows());
        for (i, d) in diffs.values().iter().enumerate() {
            let op = if *d > 0 { Op::Insert } else { Op::Delete };
            for _ in 0..d.unsigned_abs() {
                indices.push(i as u32);
                ops.push(op);
            }
        }
        let indices = UInt32Array::from(indices);
        let columns = page.columns()[2..]
            .iter()
            .map(|c| take(c, &indices, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let data = self.project(&columns)?;
        Ok(Chunk::with_ops(&ops, data).split(MAX_CHUNK_ROWS))
    }

    /// The position as a state write.
    pub fn snapshot(&self, writes: &mut Vec<StateWrite>) {
        writes.push(StateWrite {
            table: self.state_table,
            key_group: 0,
            key: POSITION_KEY.to_vec(),
            value: Some(self.position().to_be_bytes().to_vec()),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    struct NoLog;

    #[async_trait::async_trait]
    impl ViewLog for NoLog {
        async fn snapshot(&self, _: u64, _: SchemaRef, _: u64) -> Result<(u64, RowStream)> {
            unreachable!()
        }
        async fn changes(&self, _: u64, _: SchemaRef, _: u64) -> Result<crate::task::ViewChanges> {
            unreachable!()
        }
        async fn completed_after(&self, _: u64, _: u64) -> Result<u64> {
            unreachable!()
        }
    }

    #[test]
    fn a_page_of_changes_is_rows_repeated_by_their_diffs() {
        let view = Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
        ]);
        let out = Schema::new(vec![Field::new("s", DataType::Utf8, true)]);
        let source = ViewSource::new(
            7,
            "v".into(),
            9,
            vec![1],
            3,
            &DFSchema::try_from(view).unwrap(),
            &DFSchema::try_from(out).unwrap(),
            Arc::new(NoLog),
        );
        let page = RecordBatch::try_from_iter(vec![
            (
                "epoch",
                Arc::new(Int64Array::from(vec![4, 4])) as datafusion::arrow::array::ArrayRef,
            ),
            ("diff", Arc::new(Int64Array::from(vec![-2, -1]))),
            ("k", Arc::new(Int64Array::from(vec![1, 2]))),
            ("s", Arc::new(StringArray::from(vec!["a", "b"]))),
        ])
        .unwrap();
        let chunks = source.change_chunks(page).unwrap();
        assert_eq!(chunks.len(), 1);
        let c = &chunks[0];
        assert_eq!(
            (0..c.num_rows()).map(|i| c.op(i)).collect::<Vec<_>>(),
            vec![Op::Delete; 3]
        );
        let s = c.data().column(0).as_string::<i32>();
        assert_eq!(
            s.iter().map(|v| v.unwrap()).collect::<Vec<_>>(),
            vec!["a", "a", "b"]
        );
    }
}

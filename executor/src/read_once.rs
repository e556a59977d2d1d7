//! A DataFusion plan over a stream of batches that is read once: how a
//! `SELECT` reads a table's or view's pages from a pinned snapshot (in
//! the server), and how OverWindow feeds a partition's pages to
//! DataFusion's window operator ([`crate::operators`]). DataFusion's
//! `StreamingTableExec` runs it; executing the plan a second time is an
//! error, not a silent empty read.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DataFusionError;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::LexOrdering;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::{PartitionStream, StreamingTableExec};
use futures::stream::BoxStream;

/// Batches as they come.
pub type Batches = BoxStream<'static, datafusion::common::Result<RecordBatch>>;

/// A plan that reads `batches` (of `schema`) once as it runs: `what` names
/// them in the error of a second read; `ordering`, when given, is the
/// order they truthfully come in.
pub fn plan(
    what: &'static str,
    schema: SchemaRef,
    batches: Batches,
    projection: Option<&Vec<usize>>,
    ordering: Option<LexOrdering>,
    limit: Option<usize>,
) -> datafusion::common::Result<StreamingTableExec> {
    let partition = Arc::new(ReadOnce {
        what,
        schema: schema.clone(),
        batches: std::sync::Mutex::new(Some(batches)),
    });
    StreamingTableExec::try_new(schema, vec![partition], projection, ordering, false, limit)
}

struct ReadOnce {
    what: &'static str,
    schema: SchemaRef,
    batches: std::sync::Mutex<Option<Batches>>,
}

impl std::fmt::Debug for ReadOnce {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReadOnce({})", self.what)
    }
}

impl PartitionStream for ReadOnce {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches = self.batches.lock().ok().and_then(|mut b| b.take());
        let schema = self.schema.clone();
        match batches {
            Some(batches) => Box::pin(RecordBatchStreamAdapter::new(schema, batches)),
            None => {
                let what = self.what;
                Box::pin(RecordBatchStreamAdapter::new(
                    schema,
                    futures::stream::once(async move {
                        Err(DataFusionError::Internal(format!(
                            "{what} were read twice in one plan"
                        )))
                    }),
                ))
            }
        }
    }
}

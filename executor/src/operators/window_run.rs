//! Window functions over a partition streamed a page at a time: the
//! whole-partition functions of [`super::over_window`] whose values
//! DataFusion can compute with bounded memory (`row_number`, `rank`,
//! running sums, `RANGE … PRECEDING` frames: each row's value depends on
//! the rows before it and a bounded number after).
//!
//! A [`WindowRun`] is DataFusion's `BoundedWindowAggExec`, the operator it
//! runs these functions with in batch, over a stream the caller feeds:
//! the caller pushes a page of a partition's rows in order and takes the
//! output rows that are ready, which DataFusion emits as soon as no later
//! row can change them, keeping only the rows it still needs. Two runs
//! go side by side, over the partition as it was before a chunk and as it
//! is after, and [`OutputDiff`] compares their outputs entry by entry as
//! they come, so no side is ever whole in memory.

use std::collections::VecDeque;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::execution::TaskContext;
use datafusion::physical_expr::window::WindowExpr;
use datafusion::physical_expr::{LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::execution_plan::ExecutionPlan;
use datafusion::physical_plan::windows::BoundedWindowAggExec;
use datafusion::physical_plan::{InputOrderMode, SendableRecordBatchStream};
use futures::StreamExt;
use futures::channel::mpsc;
use storage::chunk::Op;

use storage::codec::RowCodec;

use super::sorted_partitions::{diff, split_entry};
use crate::{ExecError, Result, expr};

type Feed = mpsc::UnboundedSender<datafusion::common::Result<RecordBatch>>;

/// One evaluation of the functions over one partition, fed in order.
struct WindowRun {
    feed: Option<Feed>,
    out: SendableRecordBatchStream,
    /// Entry keys of the rows fed whose outputs are not out yet, one per
    /// row, in order.
    waiting: VecDeque<Arc<[u8]>>,
    finished: bool,
}

impl WindowRun {
    /// A run of `functions` (every one [`WindowExpr::uses_bounded_memory`],
    /// at least one)
    /// over rows of `schema`.
    fn new(
        functions: &[Arc<dyn WindowExpr>],
        schema: SchemaRef,
        task: &Arc<TaskContext>,
    ) -> Result<Self> {
        let (feed, pages) = mpsc::unbounded();
        // The rows come in the partition's order, all in one partition:
        // so they are, truthfully, sorted on the partition too.
        let ordering = functions.first().and_then(|f| {
            LexOrdering::new(
                f.partition_by()
                    .iter()
                    .map(|e| PhysicalSortExpr::new_default(e.clone()))
                    .chain(f.order_by().iter().cloned()),
            )
        });
        let input = crate::read_once::plan(
            "a partition's window pages",
            schema,
            pages.boxed(),
            None,
            ordering,
            None,
        )?;
        let exec = BoundedWindowAggExec::try_new(
            functions.to_vec(),
            Arc::new(input),
            InputOrderMode::Sorted,
            false,
        )?;
        Ok(Self {
            feed: Some(feed),
            out: exec.execute(0, task.clone())?,
            waiting: VecDeque::new(),
            finished: false,
        })
    }

    /// Feeds the next rows of the partition, with their entry keys.
    fn feed(&mut self, keys: Vec<Arc<[u8]>>, rows: RecordBatch) -> Result<()> {
        let feed = self
            .feed
            .as_ref()
            .ok_or_else(|| ExecError::Protocol("a window run fed after its end".into()))?;
        self.waiting.extend(keys);
        feed.unbounded_send(Ok(rows))
            .map_err(|_| ExecError::Protocol("a window run stopped reading".into()))
    }

    /// The partition has no more rows.
    fn end(&mut self) {
        self.feed = None;
    }

    /// The key of the first row fed whose output is not out yet (`None`:
    /// every row fed is out).
    fn first_waiting(&self) -> Option<&[u8]> {
        self.waiting.front().map(|k| &**k)
    }

    /// Takes the output that is ready: each row's entry key and its
    /// output columns (input columns, then the functions' values).
    fn ready(
        &mut self,
        mut take: impl FnMut(&[Arc<[u8]>], RecordBatch) -> Result<()>,
    ) -> Result<()> {
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        while !self.finished {
            // DataFusion's streams spend tokio's cooperative budget and,
            // once a task has spent its own, yield to be woken later; this
            // loop is no task to wake, so it polls outside any budget.
            let next = std::pin::pin!(tokio::task::unconstrained(self.out.next()));
            match next.poll(&mut cx) {
                Poll::Ready(Some(batch)) => {
                    let batch = batch?;
                    let n = batch.num_rows();
                    if n > self.waiting.len() {
                        return Err(ExecError::Protocol(
                            "window functions gave more rows than they were fed".into(),
                        ));
                    }
                    let keys: Vec<Arc<[u8]>> = self.waiting.drain(..n).collect();
                    take(&keys, batch)?;
                }
                Poll::Ready(None) => self.finished = true,
                Poll::Pending => break,
            }
        }
        Ok(())
    }
}

/// Output rows of one run, in entry order: (entry key, encoded row).
type Outputs = VecDeque<(Arc<[u8]>, Vec<u8>)>;

/// Compares the outputs of two runs over a partition, before and after a
/// chunk, entry by entry as they come out.
pub(super) struct OutputDiff {
    before: WindowRun,
    after: WindowRun,
    old: Outputs,
    new: Outputs,
    /// Rows are fed from the partition's last entry back.
    backward: bool,
}

impl OutputDiff {
    /// Two runs of `functions` over rows of `schema`, in `task`, fed in
    /// entry order or (`backward`) the reverse.
    pub(super) fn new(
        functions: &[Arc<dyn WindowExpr>],
        schema: &SchemaRef,
        task: &Arc<TaskContext>,
        backward: bool,
    ) -> Result<Self> {
        Ok(Self {
            before: WindowRun::new(functions, schema.clone(), task)?,
            after: WindowRun::new(functions, schema.clone(), task)?,
            old: VecDeque::new(),
            new: VecDeque::new(),
            backward,
        })
    }

    /// Feeds each run its rows of `page` (one entry key per row: before,
    /// after), decoded with `codec` into `schema`.
    pub(super) fn feed(
        &mut self,
        page: &mut [Vec<Arc<[u8]>>; 2],
        codec: &RowCodec,
        schema: &SchemaRef,
    ) -> Result<()> {
        for (keys, run) in page.iter_mut().zip([&mut self.before, &mut self.after]) {
            if keys.is_empty() {
                continue;
            }
            let keys = std::mem::take(keys);
            let n = keys.len();
            let columns = codec.decode(keys.iter().map(|k| split_entry(k).1))?;
            run.feed(keys, expr::batch(schema, columns, n)?)?;
        }
        Ok(())
    }

    /// The partition has no more rows.
    pub(super) fn end(&mut self) {
        self.before.end();
        self.after.end();
    }

    /// Takes both runs' ready output (`encode` turns an output batch of
    /// the run before, 0, or after, 1, into encoded rows) and appends to
    /// `changes` the differences of every entry both have given out
    /// whole; with `end`, of all that is left.
    pub(super) fn compare(
        &mut self,
        end: bool,
        encode: &impl Fn(usize, RecordBatch) -> Result<Vec<Vec<u8>>>,
        changes: &mut Vec<(Op, Vec<u8>)>,
    ) -> Result<()> {
        for (side, (run, queue)) in [
            (&mut self.before, &mut self.old),
            (&mut self.after, &mut self.new),
        ]
        .into_iter()
        .enumerate()
        {
            run.ready(|keys, batch| {
                queue.extend(keys.iter().cloned().zip(encode(side, batch)?));
                Ok(())
            })?;
            if end && !run.finished {
                return Err(ExecError::Protocol(
                    "window functions did not finish at the partition's end".into(),
                ));
            }
        }
        // Entries before the first row either run still waits for (in the
        // order rows are fed) are whole on both sides: later rows come
        // after them.
        let backward = self.backward;
        let first = |a: &[u8], b: &[u8]| -> bool { (a <= b) != backward };
        let bound: Option<Arc<[u8]>> =
            match (self.before.first_waiting(), self.after.first_waiting()) {
                (Some(a), Some(b)) => Some(Arc::from(if first(a, b) { a } else { b })),
                (Some(a), None) | (None, Some(a)) => Some(Arc::from(a)),
                (None, None) => None,
            };
        loop {
            let key = match (self.old.front(), self.new.front()) {
                (None, None) => break,
                (Some((a, _)), None) | (None, Some((a, _))) => a.clone(),
                (Some((a, _)), Some((b, _))) => match first(a, b) {
                    true => a.clone(),
                    false => b.clone(),
                },
            };
            if bound
                .as_ref()
                .is_some_and(|bound| key == *bound || first(bound, &key))
            {
                break;
            }
            let take = |queue: &mut Outputs| {
                let mut rows = Vec::new();
                while queue.front().is_some_and(|(k, _)| *k == key) {
                    rows.push(queue.pop_front().expect("front").1);
                }
                rows
            };
            let (old, new) = (take(&mut self.old), take(&mut self.new));
            if old != new {
                changes.extend(diff(old, new));
            }
        }
        Ok(())
    }
}

/// Output columns as the operator's output types.
pub(super) fn output_columns(columns: &[ArrayRef], schema: &SchemaRef) -> Result<Vec<ArrayRef>> {
    columns
        .iter()
        .zip(schema.fields())
        .map(|(c, f)| {
            Ok(if c.data_type() == f.data_type() {
                c.clone()
            } else {
                planner::functions::numeric_special::cast_keeping_specials(c, f.data_type())?
            })
        })
        .collect()
}

//! `SUBSCRIBE`: a client follows a materialized view's changes.
//!
//! A view's job keeps a changelog next to its rows (written by the
//! Materialize operator at every checkpoint barrier, see
//! `executor::operators::changelog`), so a subscription only ever reads
//! completed checkpoints: first the view's rows at the latest one (epoch
//! *C*, op `insert`), then, as checkpoints complete, the changes of every
//! epoch after *C*, in epoch order. Each epoch arrives whole, so a client
//! that has seen a row of epoch *e* has seen every change up to *e − 1*,
//! and one that reconnects with `SINCE e` (the last epoch it saw whole)
//! gets what followed, with no gap and no duplicate, as long as the view
//! still retains that history (`retain_history`).
//!
//! Rows are `weir_epoch bigint, weir_op text, <the view's columns>`, with
//! `weir_op` `insert` or `delete` (a row's count going up or down; an
//! update is a delete and an insert in one epoch) — or `progress`, with
//! NULL columns, when asked for: epoch *e* is complete.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use cluster::CompletedCheckpoint;
use cluster::gateway::ViewStream;
use datafusion::arrow::array::{
    ArrayRef, AsArray, Int64Array, RecordBatch, StringArray, UInt32Array, new_null_array,
};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use futures::StreamExt;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::catalog::Entry;
use crate::engine::Database;
use crate::error::{Result, ServerError};
use crate::sql::stmt;

/// How long a subscription waits for a completed checkpoint before it
/// looks again anyway (the job may have been restarted meanwhile).
const RECHECK: Duration = Duration::from_secs(1);

/// One client's subscription to one view.
pub struct Subscription {
    db: Arc<Database>,
    view: String,
    job: u64,
    changelog_table: u64,
    retain_history_ms: u64,
    view_schema: SchemaRef,
    schema: SchemaRef,
    /// Every change up to this epoch is in `ready` or delivered; `None`
    /// until the snapshot has been read.
    frontier: Option<u64>,
    progress: bool,
    ready: VecDeque<RecordBatch>,
    /// A read in progress: what checkpoint *at* adds, a page at a time.
    reading: Option<Reading>,
    completed: Option<watch::Receiver<CompletedCheckpoint>>,
}

/// A read of checkpoint `at`: the view's rows (the snapshot) or its
/// changes after the frontier, as pages to take one at a time, so that a
/// subscription holds a page, not the view or its history.
struct Reading {
    at: u64,
    snapshot: bool,
    /// Only ever used through `&mut` (the lock makes a session `Sync`).
    pages: tokio::sync::Mutex<ViewStream>,
}

impl std::fmt::Debug for Subscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("view", &self.view)
            .field("frontier", &self.frontier)
            .finish()
    }
}

impl Subscription {
    pub async fn open(db: &Arc<Database>, s: &stmt::Subscribe) -> Result<Self> {
        let view = stmt::object_name(&s.view)?;
        let entry = db.catalog.by_name(&view).ok_or_else(|| {
            ServerError::UndefinedTable(format!("relation \"{view}\" does not exist"))
        })?;
        let Entry::MaterializedView {
            id,
            sql,
            retain_history_ms,
            ..
        } = entry
        else {
            return Err(ServerError::WrongObjectType(format!(
                "\"{}\" is a {}: SUBSCRIBE follows materialized views",
                view,
                entry.kind()
            )));
        };
        if retain_history_ms == 0 {
            return Err(ServerError::NotInPrerequisiteState(format!(
                "materialized view \"{}\" keeps no changes to subscribe to (retain_history = 'off')",
                view
            )));
        }
        let view_schema = crate::engine::context::view_schema(db, id, &sql).await?;
        let mut fields = vec![
            Field::new("weir_epoch", DataType::Int64, false),
            Field::new("weir_op", DataType::Utf8, false),
        ];
        fields.extend(
            view_schema
                .fields()
                .iter()
                .map(|f| f.as_ref().clone().with_nullable(true)),
        );
        let mut sub = Self {
            db: db.clone(),
            view: view.to_string(),
            job: id,
            changelog_table: planner::view_changelog_table(id),
            retain_history_ms,
            view_schema,
            schema: Arc::new(Schema::new(fields)),
            frontier: s.since,
            progress: s.progress,
            ready: VecDeque::new(),
            reading: None,
            completed: None,
        };
        if s.since.is_some() {
            // A resumed subscription learns at once whether the view
            // still has its history.
            sub.poll().await?;
        }
        Ok(sub)
    }

    /// `weir_epoch`, `weir_op`, then the view's columns.
    pub fn schema(&self) -> SchemaRef {
        self.schema.clone()
    }

    /// Waits until rows are ready or `deadline` passes (`None`: for as
    /// long as it takes), then takes up to `max` of them.
    pub async fn fetch(
        &mut self,
        max: usize,
        deadline: Option<Instant>,
    ) -> Result<Vec<RecordBatch>> {
        loop {
            // What is ready, once a read in progress is done or `max`
            // rows are ready (a read goes on a page at a time).
            let ready: usize = self.ready.iter().map(|b| b.num_rows()).sum();
            if ready > 0 && (self.reading.is_none() || ready >= max) {
                return Ok(self.take(max));
            }
            self.poll().await?;
            if !self.ready.is_empty() || self.reading.is_some() {
                continue;
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(Vec::new());
            }
            self.wait(deadline).await;
        }
    }

    fn take(&mut self, mut max: usize) -> Vec<RecordBatch> {
        let mut out = Vec::new();
        while max > 0 {
            let Some(batch) = self.ready.pop_front() else {
                break;
            };
            if batch.num_rows() <= max {
                max -= batch.num_rows();
                out.push(batch);
            } else {
                out.push(batch.slice(0, max));
                self.ready
                    .push_front(batch.slice(max, batch.num_rows() - max));
                max = 0;
            }
        }
        out
    }

    /// Until the job completes another checkpoint, `deadline` passes or
    /// [`RECHECK`] has gone by.
    async fn wait(&mut self, deadline: Option<Instant>) {
        let mut until = Instant::now() + RECHECK;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        match &mut self.completed {
            Some(rx) => {
                if let Ok(Err(_)) = tokio::time::timeout_at(until, rx.changed()).await {
                    // That JobMaster is gone; find the job's current one.
                    self.completed = None;
                }
            }
            None => {
                self.completed = self
                    .db
                    .cluster
                    .job_manager
                    .completed_checkpoints(self.job)
                    .ok();
                if self.completed.is_none() {
                    tokio::time::sleep_until(until).await;
                }
            }
        }
    }

    /// Reads the next page of what the latest completed checkpoint adds
    /// (and starts reading it when no read is in progress).
    async fn poll(&mut self) -> Result<()> {
        if !matches!(
            self.db.catalog.get(self.job),
            Some(Entry::MaterializedView { .. })
        ) {
            return Err(ServerError::UndefinedTable(format!(
                "materialized view \"{}\" was dropped",
                self.view
            )));
        }
        if self.reading.is_none() {
            self.reading = self.start_reading().await?;
        }
        let Some(reading) = &mut self.reading else {
            return Ok(());
        };
        match reading.pages.get_mut().next().await {
            Some(page) => {
                let page = page.map_err(|e| self.db.job_error(e))?;
                let (at, snapshot) = (reading.at, reading.snapshot);
                match snapshot {
                    true => {
                        let n = page.num_rows();
                        self.push(at, vec!["insert"; n], page.columns().to_vec())?;
                    }
                    false => self.push_changes(&page)?,
                }
            }
            None => {
                let at = reading.at;
                self.reading = None;
                self.advance(at)?;
            }
        }
        Ok(())
    }

    /// Starts reading the latest completed checkpoint, if it is after the
    /// frontier.
    async fn start_reading(&mut self) -> Result<Option<Reading>> {
        let jm = &self.db.cluster.job_manager;
        let Some(since) = self.frontier else {
            let (at, pages) = jm
                .read_view_stream_at(
                    self.job,
                    planner::view_state_table(self.job),
                    self.view_schema.clone(),
                )
                .await
                .map_err(|e| self.db.job_error(e))?;
            // No checkpoint yet: nothing to show.
            return Ok((at > 0).then_some(Reading {
                at,
                snapshot: true,
                pages: pages.into(),
            }));
        };
        let (at, changes) = jm
            .read_changes(
                self.job,
                self.changelog_table,
                self.view_schema.clone(),
                since,
            )
            .await
            .map_err(|e| self.db.job_error(e))?;
        if since < changes.horizon {
            return Err(ServerError::NotInPrerequisiteState(format!(
                "materialized view \"{}\" no longer has the changes after epoch {since}: \
                 it keeps {} of history (retain_history) and has dropped epochs up to {}; \
                 resume from a later epoch or subscribe again without SINCE",
                self.view,
                humantime(self.retain_history_ms),
                changes.horizon
            )));
        }
        Ok((at > since).then_some(Reading {
            at,
            snapshot: false,
            pages: changes.batches.into(),
        }))
    }

    /// Epoch `at` is whole.
    fn advance(&mut self, at: u64) -> Result<()> {
        self.frontier = Some(at);
        if self.progress {
            let columns = self
                .view_schema
                .fields()
                .iter()
                .map(|f| new_null_array(f.data_type(), 1))
                .collect();
            self.push(at, vec!["progress"], columns)?;
        }
        Ok(())
    }

    /// Changes (`epoch, diff, columns…`, in epoch order) as rows: each
    /// repeated by its diff, an epoch's deletes before its inserts (pages
    /// come that way, one kind of change each).
    fn push_changes(&mut self, changes: &RecordBatch) -> Result<()> {
        let epochs = changes.column(0).as_primitive::<Int64Type>();
        let diffs = changes.column(1).as_primitive::<Int64Type>();
        let mut indices = Vec::new();
        let mut out_epochs = Vec::new();
        let mut ops = Vec::new();
        let mut start = 0;
        while start < changes.num_rows() {
            let epoch = epochs.value(start);
            let mut end = start;
            while end < changes.num_rows() && epochs.value(end) == epoch {
                end += 1;
            }
            for (op, wanted) in [("delete", false), ("insert", true)] {
                for i in start..end {
                    let d = diffs.value(i);
                    if (d > 0) == wanted {
                        for _ in 0..d.unsigned_abs() {
                            indices.push(i as u32);
                            out_epochs.push(epoch);
                            ops.push(op);
                        }
                    }
                }
            }
            start = end;
        }
        let indices = UInt32Array::from(indices);
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(out_epochs)),
            Arc::new(StringArray::from(ops)),
        ];
        for c in &changes.columns()[2..] {
            columns.push(take(c, &indices, None)?);
        }
        self.ready
            .push_back(RecordBatch::try_new(self.schema.clone(), columns)?);
        Ok(())
    }

    fn push(&mut self, epoch: u64, ops: Vec<&str>, view_columns: Vec<ArrayRef>) -> Result<()> {
        let n = ops.len();
        let mut columns: Vec<ArrayRef> = vec![
            Arc::new(Int64Array::from(vec![epoch as i64; n])),
            Arc::new(StringArray::from(ops)),
        ];
        columns.extend(view_columns);
        self.ready
            .push_back(RecordBatch::try_new(self.schema.clone(), columns)?);
        Ok(())
    }
}

/// `600000` → `10 minutes`.
fn humantime(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        s if s >= 86_400 && s % 86_400 == 0 => format!("{} days", s / 86_400),
        s if s >= 3_600 && s % 3_600 == 0 => format!("{} hours", s / 3_600),
        s if s >= 60 && s % 60 == 0 => format!("{} minutes", s / 60),
        s => format!("{s} seconds"),
    }
}

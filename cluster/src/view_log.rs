//! Views read by other views' jobs (`executor::operators::view_source`):
//! the JobManager serves a view's committed output — its rows at a
//! completed checkpoint, its changelog after an epoch — and keeps, for
//! every job reading a view, the epochs that job may still need.
//!
//! A view's changelog is trimmed by its `retain_history` at each barrier
//! (`executor::operators::changelog`). A reader needs every epoch after
//! the position of its oldest retained checkpoint (a restore may go back
//! that far) or of a savepoint, however old: the JobMaster stamps each
//! barrier of the view's job with the lowest such position
//! ([`ChangelogHolds::keep_after`]), and the trim keeps every epoch after
//! it. A reader holds from the moment it reads the view's snapshot; the
//! holds follow its checkpoints ([`JobManager::update_changelog_holds`])
//! and go with the reader.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use executor::task::{RowStream, ViewChanges, ViewLog};
use futures::StreamExt;

use crate::{ClusterError, JobManager};

/// How long [`ViewLog::completed_after`] waits before it answers anyway.
const WAIT: Duration = Duration::from_secs(1);

/// view → reading job → the last epoch of the view that job has for sure:
/// it may need every epoch after it.
#[derive(Debug, Default)]
pub(crate) struct ChangelogHolds {
    holds: Mutex<HashMap<u64, HashMap<u64, u64>>>,
}

impl ChangelogHolds {
    /// Job `reader` may need the epochs of `view` after `epoch`, or after
    /// an older epoch it holds already.
    pub(crate) fn hold(&self, view: u64, reader: u64, epoch: u64) {
        if let Ok(mut h) = self.holds.lock() {
            let e = h.entry(view).or_default().entry(reader).or_insert(epoch);
            *e = (*e).min(epoch);
        }
    }

    /// Job `reader` needs only the epochs of `view` after `epoch` now.
    fn set(&self, view: u64, reader: u64, epoch: u64) {
        if let Ok(mut h) = self.holds.lock() {
            h.entry(view).or_default().insert(reader, epoch);
        }
    }

    /// Job `job` is gone: as a reader, and as a view read.
    pub(crate) fn release(&self, job: u64) {
        if let Ok(mut h) = self.holds.lock() {
            h.remove(&job);
            for readers in h.values_mut() {
                readers.remove(&job);
            }
            h.retain(|_, readers| !readers.is_empty());
        }
    }

    /// The epoch of `view` after which its changelog keeps everything
    /// (`u64::MAX`: no reader needs any).
    pub(crate) fn keep_after(&self, view: u64) -> u64 {
        self.holds
            .lock()
            .ok()
            .and_then(|h| h.get(&view).and_then(|r| r.values().min().copied()))
            .unwrap_or(u64::MAX)
    }
}

fn exec(e: ClusterError) -> executor::ExecError {
    executor::ExecError::Service(e.to_string())
}

impl JobManager {
    /// Job `reader` will read view `view`'s changes after `epoch` (at
    /// start-up, before either job runs: 0, everything, until its
    /// checkpoints say).
    pub fn hold_changelog(&self, view: u64, reader: u64, epoch: u64) {
        self.holds.hold(view, reader, epoch);
    }

    /// Moves every reader's hold on the views it reads to where its oldest
    /// retained checkpoint (or savepoint) left it. A reader without a
    /// checkpoint keeps the hold it took when it read the snapshot.
    pub fn update_changelog_holds(&self) {
        for reader in self.view_sources() {
            let Some(positions) = reader.positions else {
                continue;
            };
            for view in reader.views {
                if let Some(epoch) = positions.get(&view) {
                    self.holds.set(view, reader.job, *epoch);
                }
            }
        }
    }
}

/// The JobManager as the playground's own TaskManager reads views from
/// it: weakly, as the JobManager holds that TaskManager (through the
/// ResourceManager), and a cycle would keep both, and the stores they
/// hold, alive after the database closes.
pub(crate) struct LocalViewLog(pub(crate) Weak<JobManager>);

impl LocalViewLog {
    fn jm(&self) -> executor::Result<Arc<JobManager>> {
        self.0
            .upgrade()
            .ok_or_else(|| executor::ExecError::Service("the job manager has stopped".into()))
    }
}

#[async_trait]
impl ViewLog for LocalViewLog {
    async fn snapshot(
        &self,
        view: u64,
        schema: SchemaRef,
        reader: u64,
    ) -> executor::Result<(u64, RowStream)> {
        self.jm()?.snapshot(view, schema, reader).await
    }

    async fn changes(
        &self,
        view: u64,
        schema: SchemaRef,
        since: u64,
    ) -> executor::Result<ViewChanges> {
        self.jm()?.changes(view, schema, since).await
    }

    async fn completed_after(&self, view: u64, after: u64) -> executor::Result<u64> {
        self.jm()?.completed_after(view, after).await
    }
}

#[async_trait]
impl ViewLog for JobManager {
    async fn snapshot(
        &self,
        view: u64,
        schema: SchemaRef,
        reader: u64,
    ) -> executor::Result<(u64, RowStream)> {
        let jm = self.master(view).map_err(exec)?;
        // Held before the read: the snapshot is at this checkpoint or later.
        self.holds.hold(view, reader, jm.completed().borrow().id);
        let (at, rows) = jm
            .read_view_stream(planner::view_state_table(view), schema)
            .await
            .map_err(exec)?;
        Ok((at, rows.map(|r| r.map_err(exec)).boxed()))
    }

    async fn changes(
        &self,
        view: u64,
        schema: SchemaRef,
        since: u64,
    ) -> executor::Result<ViewChanges> {
        let jm = self.master(view).map_err(exec)?;
        let (at, changes) = jm
            .read_changes(planner::view_changelog_table(view), schema, since)
            .await
            .map_err(exec)?;
        Ok(ViewChanges {
            at,
            horizon: changes.horizon,
            pages: changes.batches.map(|r| r.map_err(exec)).boxed(),
        })
    }

    async fn completed_after(&self, view: u64, after: u64) -> executor::Result<u64> {
        let mut completed = self.master(view).map_err(exec)?.completed();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let id = completed.borrow_and_update().id;
            if id > after {
                return Ok(id);
            }
            match tokio::time::timeout_at(deadline, completed.changed()).await {
                Ok(Ok(())) => {}
                // Time is up, or the view's JobMaster was replaced (a
                // rescale): the reader asks again.
                Err(_) | Ok(Err(_)) => return Ok(id),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_slowest_reader_holds_and_a_gone_one_releases() {
        let h = ChangelogHolds::default();
        assert_eq!(h.keep_after(5), u64::MAX, "no reader");
        h.hold(5, 7, 10);
        h.hold(5, 8, 4);
        assert_eq!(h.keep_after(5), 4);
        h.hold(5, 8, 9);
        assert_eq!(h.keep_after(5), 4, "a hold only goes back");
        h.set(5, 8, 12);
        assert_eq!(h.keep_after(5), 10, "its checkpoints move it on");
        h.release(7);
        assert_eq!(h.keep_after(5), 12);
        h.release(5);
        assert_eq!(h.keep_after(5), u64::MAX, "the view is gone");
    }
}

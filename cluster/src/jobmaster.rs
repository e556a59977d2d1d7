//! The JobMaster of one job: gets slots from the ResourceManager, deploys
//! the ExecutionGraph's subtasks to TaskManagers, runs the
//! CheckpointCoordinator and restarts the job when a task fails (Flink's
//! fixed-delay restart strategy).
//!
//! Checkpoints: every `checkpoint_interval` (or at once when asked, for
//! `FLUSH`) the coordinator picks the next id and tells every source subtask
//! to emit a barrier. When the last subtask acknowledges, it asks each
//! TaskManager of the job to commit that checkpoint's staged state, and only
//! then publishes the checkpoint as completed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use executor::message::Barrier;
use executor::task::{SourcePosition, TaskDeployment, TaskId};
use planner::execution_graph::{ExecutionGraph, ExecutionState};
use planner::job_graph::JobGraph;
use planner::spec::OperatorSpec;
use tokio::sync::{Notify, watch};

use crate::checkpoint::{CompletedCheckpoint, PendingCheckpoint};
use crate::config::ClusterConfig;
use crate::gateway::{JobMasterGateway, ResourceManagerGateway, TaskExecutorGateway};
use crate::{ClusterError, Result};

/// Where a job is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobState {
    Running,
    Restarting,
    Failed(String),
    Canceled,
}

struct Inner {
    exec: ExecutionGraph,
    attempt: u64,
    state: JobState,
    restarts: u32,
    next_checkpoint: u64,
    pending: Option<PendingCheckpoint>,
    /// The pending checkpoint is complete and being committed.
    committing: bool,
}

/// The JobMaster of one job.
pub(crate) struct JobMaster {
    pub(crate) job: u64,
    rm: Arc<dyn ResourceManagerGateway>,
    config: ClusterConfig,
    inner: Mutex<Inner>,
    completed: watch::Sender<CompletedCheckpoint>,
    trigger: Notify,
    me: Weak<JobMaster>,
}

impl std::fmt::Debug for JobMaster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobMaster").field("job", &self.job).finish()
    }
}

fn poisoned() -> ClusterError {
    ClusterError::Internal("job master lock poisoned".into())
}

impl JobMaster {
    /// Allocates slots, deploys the job and starts its checkpoints.
    pub(crate) async fn start(
        job: u64,
        graph: JobGraph,
        rm: Arc<dyn ResourceManagerGateway>,
        config: ClusterConfig,
    ) -> Result<Arc<Self>> {
        let slots = rm
            .request_slots(job, ExecutionGraph::slots_needed(&graph))
            .await?;
        let exec = match ExecutionGraph::build(graph, &slots) {
            Ok(exec) => exec,
            Err(e) => {
                rm.release_slots(job).await?;
                return Err(e.into());
            }
        };
        // Checkpoint ids continue after the last committed one, so that a
        // restarted job never reuses an id.
        let mut last = 0;
        for tm in Self::task_executors_of(&rm, &exec)? {
            last = last.max(tm.committed_checkpoint(job).await?.unwrap_or(0));
        }
        let jm = Arc::new_cyclic(|me| JobMaster {
            job,
            rm,
            config,
            inner: Mutex::new(Inner {
                exec,
                attempt: 0,
                state: JobState::Running,
                restarts: 0,
                next_checkpoint: last + 1,
                pending: None,
                committing: false,
            }),
            completed: watch::channel(CompletedCheckpoint {
                id: last,
                positions: HashMap::new(),
            })
            .0,
            trigger: Notify::new(),
            me: me.clone(),
        });
        if let Err(e) = jm.deploy().await {
            let _ = jm.stop(false).await;
            return Err(e);
        }
        tokio::spawn(Self::run_checkpoints(Arc::downgrade(&jm)));
        Ok(jm)
    }

    fn task_executors_of(
        rm: &Arc<dyn ResourceManagerGateway>,
        exec: &ExecutionGraph,
    ) -> Result<Vec<Arc<dyn TaskExecutorGateway>>> {
        let slots: BTreeSet<_> = exec.all().map(|ev| ev.slot.task_manager.clone()).collect();
        let mut out = Vec::new();
        for tm in slots {
            if let Some(ev) = exec.all().find(|ev| ev.slot.task_manager == tm) {
                out.push(rm.task_executor(&ev.slot)?);
            }
        }
        Ok(out)
    }

    fn task_executors(&self) -> Result<Vec<Arc<dyn TaskExecutorGateway>>> {
        let inner = self.inner.lock().map_err(|_| poisoned())?;
        Self::task_executors_of(&self.rm, &inner.exec)
    }

    /// Submits every subtask of the current attempt.
    async fn deploy(&self) -> Result<()> {
        let (graph, attempt, subtasks) = {
            let mut inner = self.inner.lock().map_err(|_| poisoned())?;
            for ev in inner.exec.subtasks.iter_mut().flatten() {
                ev.state = ExecutionState::Deploying;
            }
            let subtasks: Vec<_> = inner
                .exec
                .all()
                .map(|ev| (ev.vertex, ev.subtask, ev.slot.clone()))
                .collect();
            (Arc::new(inner.exec.job.clone()), inner.attempt, subtasks)
        };
        let me: Arc<dyn JobMasterGateway> = self
            .me
            .upgrade()
            .ok_or_else(|| ClusterError::Internal("job master gone".into()))?;
        for (vertex, subtask, slot) in subtasks {
            let tm = self.rm.task_executor(&slot)?;
            let deployment = TaskDeployment {
                id: TaskId {
                    job: self.job,
                    vertex,
                    subtask,
                },
                attempt,
                graph: graph.clone(),
            };
            tm.submit_task(deployment, me.clone()).await?;
        }
        tracing::info!(job = self.job, attempt, "job deployed");
        Ok(())
    }

    /// Stops the job's tasks and checkpoints; frees its slots and, with
    /// `drop_state`, deletes its state.
    pub(crate) async fn stop(&self, drop_state: bool) -> Result<()> {
        let tables = {
            let mut inner = self.inner.lock().map_err(|_| poisoned())?;
            inner.state = JobState::Canceled;
            inner.pending = None;
            for ev in inner.exec.subtasks.iter_mut().flatten() {
                ev.state = ExecutionState::Canceled;
            }
            inner.exec.job.stream.state_tables()
        };
        self.trigger.notify_one();
        for tm in self.task_executors()? {
            tm.cancel_job(self.job).await?;
            if drop_state {
                tm.drop_job_state(self.job, tables.clone()).await?;
            }
        }
        self.rm.release_slots(self.job).await
    }

    pub(crate) fn state(&self) -> JobState {
        self.inner
            .lock()
            .map(|i| i.state.clone())
            .unwrap_or(JobState::Failed("lock poisoned".into()))
    }

    /// Subtasks with their slots and states.
    pub(crate) fn execution_graph(&self) -> Option<ExecutionGraph> {
        self.inner.lock().ok().map(|i| i.exec.clone())
    }

    /// Tables the job's sources read.
    pub(crate) fn source_tables(&self) -> Vec<u64> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        inner
            .exec
            .job
            .stream
            .nodes
            .iter()
            .filter_map(|n| match n.spec {
                OperatorSpec::TableSource { table_id, .. } => Some(table_id),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn completed(&self) -> watch::Receiver<CompletedCheckpoint> {
        self.completed.subscribe()
    }

    /// The id the next triggered checkpoint will get.
    pub(crate) fn next_checkpoint_id(&self) -> u64 {
        self.inner
            .lock()
            .map(|i| i.next_checkpoint)
            .unwrap_or(u64::MAX)
    }

    /// Starts a checkpoint now rather than at the next interval.
    pub(crate) fn trigger_now(&self) {
        self.trigger.notify_one();
    }

    async fn run_checkpoints(me: Weak<JobMaster>) {
        loop {
            let (interval, timeout) = {
                let Some(jm) = me.upgrade() else { return };
                (jm.config.checkpoint_interval, jm.config.checkpoint_timeout)
            };
            {
                let Some(jm) = me.upgrade() else { return };
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = jm.trigger.notified() => {}
                }
            }
            let Some(jm) = me.upgrade() else { return };
            match jm.state() {
                JobState::Canceled | JobState::Failed(_) => return,
                JobState::Restarting => continue,
                JobState::Running => {}
            }
            if let Err(e) = jm.trigger_checkpoint(timeout).await {
                tracing::warn!(job = jm.job, error = %e, "checkpoint trigger failed");
            }
        }
    }

    async fn trigger_checkpoint(&self, timeout: std::time::Duration) -> Result<()> {
        let (id, sources, aborted) = {
            let mut inner = self.inner.lock().map_err(|_| poisoned())?;
            if inner.committing {
                return Ok(());
            }
            let mut aborted = None;
            if let Some(p) = &inner.pending {
                if p.started.elapsed() < timeout {
                    return Ok(());
                }
                tracing::warn!(
                    job = self.job,
                    checkpoint = p.id,
                    "checkpoint expired before completing; aborted"
                );
                aborted = Some(p.id);
                inner.pending = None;
            }
            let id = inner.next_checkpoint;
            inner.next_checkpoint += 1;
            let graph = &inner.exec.job;
            let tasks: Vec<TaskId> = inner
                .exec
                .all()
                .map(|ev| TaskId {
                    job: self.job,
                    vertex: ev.vertex,
                    subtask: ev.subtask,
                })
                .collect();
            let sources: Vec<(TaskId, planner::execution_graph::SlotId)> = inner
                .exec
                .all()
                .filter(|ev| {
                    let head = graph.vertices[ev.vertex].nodes[0];
                    matches!(
                        graph.stream.nodes[head].spec,
                        OperatorSpec::TableSource { .. }
                    )
                })
                .map(|ev| {
                    (
                        TaskId {
                            job: self.job,
                            vertex: ev.vertex,
                            subtask: ev.subtask,
                        },
                        ev.slot.clone(),
                    )
                })
                .collect();
            inner.pending = Some(PendingCheckpoint::new(id, tasks));
            (id, sources, aborted)
        };
        if let Some(old) = aborted {
            for tm in self.task_executors()? {
                tm.abort_checkpoint(self.job, old).await?;
            }
        }
        tracing::debug!(job = self.job, checkpoint = id, "trigger checkpoint");
        for (task, slot) in sources {
            self.rm
                .task_executor(&slot)?
                .trigger_checkpoint(task, Barrier::checkpoint(id))
                .await?;
        }
        Ok(())
    }

    /// Commits a checkpoint every task has acknowledged, then publishes it.
    async fn complete(self: Arc<Self>, checkpoint: CompletedCheckpoint) {
        let result = async {
            for tm in self.task_executors()? {
                tm.notify_checkpoint_complete(self.job, checkpoint.id)
                    .await?;
            }
            Ok::<_, ClusterError>(())
        }
        .await;
        if let Ok(mut inner) = self.inner.lock() {
            inner.committing = false;
        }
        match result {
            Ok(()) => {
                tracing::debug!(
                    job = self.job,
                    checkpoint = checkpoint.id,
                    "checkpoint completed"
                );
                self.completed.send_replace(checkpoint);
            }
            Err(e) => {
                tracing::error!(job = self.job, checkpoint = checkpoint.id, error = %e, "commit failed")
            }
        }
    }

    /// A task failed: cancel everything, then restart from the last
    /// committed checkpoint, or give up after `restart_attempts`.
    async fn failover(self: Arc<Self>, error: String) {
        let give_up = {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            if inner.state != JobState::Running {
                return;
            }
            inner.pending = None;
            inner.committing = false;
            inner.restarts += 1;
            if inner.restarts > self.config.restart_attempts {
                inner.state = JobState::Failed(error.clone());
                true
            } else {
                inner.state = JobState::Restarting;
                false
            }
        };
        tracing::warn!(job = self.job, error = %error, give_up, "job failed");
        if let Ok(tms) = self.task_executors() {
            for tm in tms {
                let _ = tm.cancel_job(self.job).await;
            }
        }
        if give_up {
            if let Ok(mut inner) = self.inner.lock() {
                for ev in inner.exec.subtasks.iter_mut().flatten() {
                    ev.state = ExecutionState::Failed;
                }
            }
            self.completed.send_modify(|_| {});
            return;
        }
        tokio::time::sleep(self.config.restart_delay).await;
        {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            if inner.state != JobState::Restarting {
                return;
            }
            inner.attempt += 1;
            inner.state = JobState::Running;
        }
        if let Err(e) = self.deploy().await {
            Box::pin(self.failover(e.to_string())).await;
        }
    }
}

impl JobMasterGateway for JobMaster {
    fn acknowledge_checkpoint(
        &self,
        task: &TaskId,
        checkpoint_id: u64,
        positions: Vec<SourcePosition>,
    ) {
        let done = {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            match &mut inner.pending {
                Some(p) if p.id == checkpoint_id => {
                    if p.acknowledge(task, &positions) {
                        inner.committing = true;
                        inner.pending.take().map(|p| p.complete())
                    } else {
                        None
                    }
                }
                // An ack of an aborted checkpoint, or from a cancelled attempt.
                _ => None,
            }
        };
        if let (Some(done), Some(me)) = (done, self.me.upgrade()) {
            tokio::spawn(me.complete(done));
        }
    }

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<String>,
    ) {
        if let Ok(mut inner) = self.inner.lock()
            && let Some(ev) = inner
                .exec
                .subtasks
                .get_mut(task.vertex)
                .and_then(|v| v.get_mut(task.subtask))
        {
            ev.state = state;
        }
        if state == ExecutionState::Failed
            && let Some(me) = self.me.upgrade()
        {
            let error = error.unwrap_or_else(|| format!("{task} failed"));
            tokio::spawn(me.failover(error));
        }
    }
}

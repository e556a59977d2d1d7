//! The JobMaster of one job: gets slots from the ResourceManager, deploys
//! the ExecutionGraph's subtasks to TaskManagers, runs the
//! CheckpointCoordinator and restarts the job when a task or a TaskManager
//! fails, following the configured restart strategy.
//!
//! Checkpoints: every `checkpoint_interval` (or at once when asked, for
//! `FLUSH`) the coordinator picks the next id and tells every source subtask
//! to emit a barrier. Each acknowledgement carries the task's state writes,
//! which the JobMaster stages in the JobManager's **checkpoint storage**
//! (Flink's `JobManagerCheckpointStorage`). When the last subtask has
//! acknowledged, it commits them there, asks each TaskManager of the job to
//! commit its local copy, and only then publishes the checkpoint as
//! completed.
//!
//! Failover: cancel every task, release the slots, wait as the restart
//! strategy says, ask for slots again — the lost TaskManager's are gone, a
//! new one's may have arrived — and deploy a new attempt. Each task first
//! restores its state from the checkpoint storage, so any slot will do.
//!
//! One lock orders it all: committing a checkpoint and (re)deploying hold
//! `commit` for writing, view scans for reading, so a scan sees every
//! TaskManager at the same completed checkpoint and never a half-restored
//! one.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Instant;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::message::Barrier;
use executor::task::{CheckpointAck, TaskDeployment, TaskId};
use planner::execution_graph::{ExecutionGraph, ExecutionState, SlotId};
use planner::job_graph::JobGraph;
use planner::spec::OperatorSpec;
use storage::keys::{MAX_PARALLELISM, key_group_range};
use storage::state::{StateEntry, StateStore};
use tokio::sync::{Notify, RwLock, watch};

use crate::checkpoint::{
    CheckpointStats, CheckpointStatus, CompletedCheckpoint, PendingCheckpoint,
};
use crate::config::ClusterConfig;
use crate::gateway::{JobMasterGateway, ResourceId, ResourceManagerGateway, TaskExecutorGateway};
use crate::{ClusterError, Result};

/// Where a job is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Waiting for slots and deploying, the first time.
    Created,
    Running,
    Restarting,
    Failed(String),
    Canceled,
}

struct Inner {
    /// `None` until the job has slots.
    exec: Option<ExecutionGraph>,
    attempt: u64,
    state: JobState,
    restarts: u32,
    running_since: Instant,
    /// A failure reported while the job was being (re)deployed.
    deploy_failure: Option<String>,
    /// Slots TaskManagers offered for the coming deployment (the slot pool).
    offered: BTreeSet<SlotId>,
    next_checkpoint: u64,
    pending: Option<PendingCheckpoint>,
    /// The pending checkpoint is complete and being committed.
    committing: bool,
    /// Recent checkpoints, oldest first; the pending one is in `pending`.
    history: VecDeque<CheckpointStats>,
    /// A TaskManager could not commit the last checkpoint locally: scans
    /// read the checkpoint storage until the next one commits everywhere.
    stale_task_manager: bool,
}

/// The JobMaster of one job.
pub(crate) struct JobMaster {
    pub(crate) job: u64,
    graph: JobGraph,
    rm: Arc<dyn ResourceManagerGateway>,
    storage: Arc<StateStore>,
    config: ClusterConfig,
    inner: Mutex<Inner>,
    commit: RwLock<()>,
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

/// Checkpoints the history keeps per job.
const HISTORY: usize = 100;

impl Inner {
    /// Moves a checkpoint's statistics into the history.
    fn archive(&mut self, stats: CheckpointStats) {
        self.history.push_back(stats);
        while self.history.len() > HISTORY {
            self.history.pop_front();
        }
    }

    /// The pending checkpoint, if any, ends with `status`.
    fn abort_pending(&mut self, cause: &str) {
        if let Some(p) = self.pending.take() {
            let mut stats = p.stats;
            stats.status = CheckpointStatus::Aborted;
            stats.duration = Some(p.started.elapsed());
            stats.cause = Some(cause.to_string());
            self.archive(stats);
        }
    }

    /// A checkpoint in the history ended.
    fn finish(&mut self, id: u64, status: CheckpointStatus, cause: Option<String>) {
        if let Some(s) = self.history.iter_mut().rev().find(|s| s.id == id) {
            s.status = status;
            s.duration = s.triggered_at.elapsed().ok();
            s.cause = cause;
        }
    }
}

impl JobMaster {
    /// A JobMaster for `graph`, not yet deployed.
    pub(crate) fn new(
        job: u64,
        graph: JobGraph,
        rm: Arc<dyn ResourceManagerGateway>,
        storage: Arc<StateStore>,
        config: ClusterConfig,
    ) -> Result<Arc<Self>> {
        // Checkpoint ids continue after the last committed one, so that a
        // restarted job never reuses an id.
        let last = storage.committed_checkpoint(job)?.unwrap_or(0);
        let jm = Arc::new_cyclic(|me| JobMaster {
            job,
            graph,
            rm,
            storage,
            config,
            inner: Mutex::new(Inner {
                exec: None,
                attempt: 0,
                state: JobState::Created,
                restarts: 0,
                running_since: Instant::now(),
                deploy_failure: None,
                offered: BTreeSet::new(),
                history: VecDeque::new(),
                next_checkpoint: last + 1,
                pending: None,
                committing: false,
                stale_task_manager: false,
            }),
            commit: RwLock::new(()),
            completed: watch::channel(CompletedCheckpoint {
                id: last,
                positions: HashMap::new(),
            })
            .0,
            trigger: Notify::new(),
            me: me.clone(),
        });
        tokio::spawn(Self::run_checkpoints(Arc::downgrade(&jm)));
        Ok(jm)
    }

    /// Gets slots and deploys the first attempt. On failure the job's slots
    /// are released; the caller decides whether to retry ([`Self::failover`]).
    pub(crate) async fn launch(&self) -> Result<()> {
        let result = self.allocate_and_deploy().await;
        if result.is_err() {
            self.teardown().await;
        }
        result
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| poisoned())
    }

    fn task_executors_of(
        rm: &Arc<dyn ResourceManagerGateway>,
        exec: &ExecutionGraph,
    ) -> Vec<(ResourceId, Result<Arc<dyn TaskExecutorGateway>>)> {
        let tms: BTreeSet<_> = exec.all().map(|ev| ev.slot.task_manager.clone()).collect();
        tms.into_iter()
            .map(|tm| {
                let slot = SlotId {
                    task_manager: tm.clone(),
                    index: 0,
                };
                let gateway = rm.task_executor(&slot);
                (tm, gateway)
            })
            .collect()
    }

    /// The TaskManagers of the current attempt that are still registered.
    fn task_executors(&self) -> Vec<Arc<dyn TaskExecutorGateway>> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
        match &inner.exec {
            Some(exec) => Self::task_executors_of(&self.rm, exec)
                .into_iter()
                .filter_map(|(_, g)| g.ok())
                .collect(),
            None => Vec::new(),
        }
    }

    /// Whether the current attempt runs on `tm`.
    pub(crate) fn uses_task_manager(&self, tm: &str) -> bool {
        self.lock()
            .ok()
            .and_then(|i| {
                i.exec
                    .as_ref()
                    .map(|e| e.all().any(|ev| ev.slot.task_manager == tm))
            })
            .unwrap_or(false)
    }

    /// Requests slots, builds the ExecutionGraph on them and submits every
    /// subtask; each restores its state from the checkpoint storage first.
    async fn allocate_and_deploy(&self) -> Result<()> {
        let me: Arc<dyn JobMasterGateway> = self
            .me
            .upgrade()
            .ok_or_else(|| ClusterError::Internal("job master gone".into()))?;
        self.lock()?.offered.clear();
        let slots = self
            .rm
            .request_slots(
                self.job,
                ExecutionGraph::slots_needed(&self.graph),
                me.clone(),
            )
            .await?;
        {
            let inner = self.lock()?;
            if let Some(missing) = slots.iter().find(|s| !inner.offered.contains(s)) {
                return Err(ClusterError::Internal(format!(
                    "slot {missing} was never offered"
                )));
            }
        }
        let mut exec = ExecutionGraph::build(self.graph.clone(), &slots)?;
        let _deploying = self.commit.write().await;
        let mut locations = Vec::new();
        for subtasks in &exec.subtasks {
            let mut v = Vec::new();
            for ev in subtasks {
                v.push(self.rm.task_executor(&ev.slot)?.address());
            }
            locations.push(v);
        }
        let locations = Arc::new(locations);
        for ev in exec.subtasks.iter_mut().flatten() {
            ev.state = ExecutionState::Deploying;
        }
        let attempt = {
            let mut inner = self.lock()?;
            if matches!(inner.state, JobState::Canceled | JobState::Failed(_)) {
                return Err(ClusterError::Internal(format!(
                    "job {} stopped while deploying",
                    self.job
                )));
            }
            inner.deploy_failure = None;
            inner.exec = Some(exec.clone());
            inner.stale_task_manager = false;
            inner.attempt
        };
        let graph = Arc::new(self.graph.clone());
        for ev in exec.all() {
            let tm = self.rm.task_executor(&ev.slot)?;
            let deployment = TaskDeployment {
                id: TaskId {
                    job: self.job,
                    vertex: ev.vertex,
                    subtask: ev.subtask,
                    attempt,
                },
                slot: ev.slot.index,
                graph: graph.clone(),
                locations: locations.clone(),
            };
            tm.submit_task(deployment, me.clone()).await?;
        }
        let mut inner = self.lock()?;
        if let Some(failure) = inner.deploy_failure.take() {
            return Err(ClusterError::Internal(failure));
        }
        match inner.state {
            JobState::Created | JobState::Restarting => {
                inner.state = JobState::Running;
                inner.running_since = Instant::now();
            }
            _ => {
                return Err(ClusterError::Internal(format!(
                    "job {} stopped while deploying",
                    self.job
                )));
            }
        }
        tracing::info!(job = self.job, attempt, slots = slots.len(), "job deployed");
        Ok(())
    }

    /// Cancels every task of the current attempt, drops pending checkpoint
    /// state and releases the slots.
    async fn teardown(&self) {
        let tms = self.task_executors();
        let _ = self.storage.discard_staged(self.job);
        let patience = self.config.heartbeat_timeout;
        let cancels = tms.iter().map(|tm| async move {
            match tokio::time::timeout(patience, tm.cancel_job(self.job)).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::debug!(job = self.job, error = %e, "cancel on a task manager failed")
                }
                Err(_) => {
                    tracing::warn!(job = self.job, "a task manager did not confirm the cancel")
                }
            }
        });
        futures::future::join_all(cancels).await;
        if let Err(e) = self.rm.release_slots(self.job).await {
            tracing::warn!(job = self.job, error = %e, "releasing slots failed");
        }
    }

    /// Stops the job's tasks and checkpoints; frees its slots and, with
    /// `drop_state`, deletes its state.
    pub(crate) async fn stop(&self, drop_state: bool) -> Result<()> {
        let _commit = self.commit.write().await;
        {
            let mut inner = self.lock()?;
            inner.state = JobState::Canceled;
            inner.abort_pending("job stopped");
            if let Some(exec) = &mut inner.exec {
                for ev in exec.subtasks.iter_mut().flatten() {
                    ev.state = ExecutionState::Canceled;
                }
            }
        }
        self.trigger.notify_one();
        let tables = self.graph.stream.state_tables();
        let tms = self.task_executors();
        self.teardown().await;
        if drop_state {
            for tm in tms {
                if let Err(e) = tm.drop_job_state(self.job, tables.clone()).await {
                    tracing::warn!(job = self.job, error = %e, "dropping task manager state failed");
                }
            }
            self.storage.drop_job(self.job, &tables)?;
        }
        self.completed.send_modify(|_| {});
        Ok(())
    }

    pub(crate) fn state(&self) -> JobState {
        self.inner
            .lock()
            .map(|i| i.state.clone())
            .unwrap_or(JobState::Failed("lock poisoned".into()))
    }

    /// Subtasks with their slots and states.
    pub(crate) fn execution_graph(&self) -> Option<ExecutionGraph> {
        self.inner.lock().ok().and_then(|i| i.exec.clone())
    }

    /// Attempt number and restarts so far.
    pub(crate) fn attempts(&self) -> (u64, u32) {
        self.inner
            .lock()
            .map(|i| (i.attempt, i.restarts))
            .unwrap_or_default()
    }

    /// Tables the job's sources read.
    pub(crate) fn source_tables(&self) -> Vec<u64> {
        self.graph
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

    /// Recent checkpoints, oldest first, the one in progress last.
    pub(crate) fn checkpoint_history(&self) -> Vec<CheckpointStats> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
        let mut out: Vec<CheckpointStats> = inner.history.iter().cloned().collect();
        out.extend(inner.pending.as_ref().map(|p| p.stats.clone()));
        out
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
                JobState::Restarting | JobState::Created => continue,
                JobState::Running => {}
            }
            if let Err(e) = jm.trigger_checkpoint(timeout).await {
                tracing::warn!(job = jm.job, error = %e, "checkpoint trigger failed");
            }
        }
    }

    async fn trigger_checkpoint(&self, timeout: std::time::Duration) -> Result<()> {
        let (id, sources, aborted) = {
            let mut inner = self.lock()?;
            if inner.committing || inner.state != JobState::Running {
                return Ok(());
            }
            let Some(exec) = &inner.exec else {
                return Ok(());
            };
            let graph = &exec.job;
            let attempt = inner.attempt;
            let tasks: Vec<TaskId> = exec
                .all()
                .map(|ev| TaskId {
                    job: self.job,
                    vertex: ev.vertex,
                    subtask: ev.subtask,
                    attempt,
                })
                .collect();
            let sources: Vec<(TaskId, SlotId)> = exec
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
                            attempt,
                        },
                        ev.slot.clone(),
                    )
                })
                .collect();
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
                inner.abort_pending("expired before every task acknowledged it");
                let _ = self.storage.discard_staged(self.job);
            }
            let id = inner.next_checkpoint;
            inner.next_checkpoint += 1;
            inner.pending = Some(PendingCheckpoint::new(id, tasks));
            (id, sources, aborted)
        };
        if let Some(old) = aborted {
            for tm in self.task_executors() {
                tm.abort_checkpoint(self.job, old).await?;
            }
        }
        tracing::debug!(job = self.job, checkpoint = id, "trigger checkpoint");
        for (task, slot) in sources {
            // Not awaited here: a TaskManager that hangs must not hold up
            // the coordinator (the checkpoint then expires or fails over).
            let tm = self.rm.task_executor(&slot)?;
            let job = self.job;
            tokio::spawn(async move {
                if let Err(e) = tm.trigger_checkpoint(task, Barrier::checkpoint(id)).await {
                    tracing::warn!(job, checkpoint = id, error = %e, "checkpoint trigger failed");
                }
            });
        }
        Ok(())
    }

    /// Commits a checkpoint every task has acknowledged, then publishes it.
    async fn complete(self: Arc<Self>, checkpoint: CompletedCheckpoint, attempt: u64) {
        let _commit = self.commit.write().await;
        let current = self
            .lock()
            .map(|i| i.attempt == attempt && i.committing && i.state == JobState::Running)
            .unwrap_or(false);
        if !current {
            // A failover came first and discarded the staged state.
            if let Ok(mut inner) = self.lock() {
                inner.finish(
                    checkpoint.id,
                    CheckpointStatus::Aborted,
                    Some("the job failed before it was committed".into()),
                );
            }
            return;
        }
        let storage = self.storage.clone();
        let (job, id) = (self.job, checkpoint.id);
        let stored = tokio::task::spawn_blocking(move || storage.commit(job, id))
            .await
            .map_err(|e| ClusterError::Internal(e.to_string()))
            .and_then(|r| r.map_err(ClusterError::from));
        if let Err(e) = stored {
            tracing::error!(job = self.job, checkpoint = id, error = %e, "checkpoint storage commit failed");
            if let Ok(mut inner) = self.lock() {
                inner.committing = false;
                inner.finish(id, CheckpointStatus::Failed, Some(e.to_string()));
            }
            return;
        }
        // Every TaskManager at once; one that does not answer within the
        // heartbeat timeout is about to be declared lost anyway.
        let patience = self.config.heartbeat_timeout;
        let tms = self.task_executors();
        let notified =
            futures::future::join_all(tms.iter().map(|tm| {
                tokio::time::timeout(patience, tm.notify_checkpoint_complete(self.job, id))
            }))
            .await;
        let mut stale = false;
        for result in notified {
            let error = match result {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => "no answer".to_string(),
            };
            tracing::warn!(job = self.job, checkpoint = id, error = %error, "task manager did not commit");
            stale = true;
        }
        if let Ok(mut inner) = self.lock() {
            inner.committing = false;
            inner.stale_task_manager = stale;
            inner.finish(id, CheckpointStatus::Completed, None);
        }
        tracing::debug!(job = self.job, checkpoint = id, "checkpoint completed");
        self.completed.send_replace(checkpoint);
    }

    /// A task or a TaskManager failed: cancel everything, then restart
    /// from the latest completed checkpoint as the restart strategy allows.
    pub(crate) async fn failover(self: Arc<Self>, error: String) {
        {
            let Ok(mut inner) = self.lock() else { return };
            match inner.state {
                JobState::Running | JobState::Created => inner.state = JobState::Restarting,
                JobState::Restarting => {
                    // Being deployed: the deployment checks this when it ends.
                    inner.deploy_failure.get_or_insert(error);
                    return;
                }
                JobState::Failed(_) | JobState::Canceled => return,
            }
        }
        let mut error = error;
        loop {
            let delay = {
                let _commit = self.commit.write().await;
                let Ok(mut inner) = self.lock() else { return };
                if inner.state != JobState::Restarting {
                    return;
                }
                inner.abort_pending(&format!("job restarting: {error}"));
                inner.committing = false;
                if let Some(reset) = self.config.restart_strategy.reset_after()
                    && inner.running_since.elapsed() > reset
                {
                    inner.restarts = 0;
                }
                inner.restarts += 1;
                let delay = self.config.restart_strategy.delay(inner.restarts);
                if let Some(exec) = &mut inner.exec {
                    for ev in exec.subtasks.iter_mut().flatten() {
                        ev.state = if delay.is_some() {
                            ExecutionState::Canceling
                        } else {
                            ExecutionState::Failed
                        };
                    }
                }
                if delay.is_none() {
                    inner.state = JobState::Failed(error.clone());
                }
                delay
            };
            tracing::warn!(job = self.job, error = %error, restart_in = ?delay, "job failed");
            self.teardown().await;
            let Some(delay) = delay else {
                self.completed.send_modify(|_| {});
                return;
            };
            tokio::time::sleep(delay).await;
            {
                let Ok(mut inner) = self.lock() else { return };
                if inner.state != JobState::Restarting {
                    return;
                }
                inner.attempt += 1;
            }
            match self.allocate_and_deploy().await {
                Ok(()) => return,
                Err(e) if self.state() == JobState::Restarting => error = e.to_string(),
                Err(_) => {
                    // Stopped while it got its slots: give them back.
                    self.teardown().await;
                    return;
                }
            }
        }
    }

    /// A view's rows at the latest completed checkpoint: from the
    /// TaskManagers' scan services while the job runs, else from the
    /// checkpoint storage.
    pub(crate) async fn read_view(
        &self,
        state_table: u64,
        schema: SchemaRef,
    ) -> Result<Vec<RecordBatch>> {
        let _commit = self.commit.read().await;
        if let Some(targets) = self.scan_targets(state_table) {
            let mut out = Vec::new();
            let mut complete = true;
            for (tm, key_groups) in targets {
                match tm.scan_view(state_table, schema.clone(), key_groups).await {
                    Ok(batches) => out.extend(batches),
                    Err(e) => {
                        tracing::warn!(job = self.job, error = %e, "view scan on a task manager failed; reading checkpoint storage");
                        complete = false;
                        break;
                    }
                }
            }
            if complete {
                return Ok(out);
            }
        }
        read_stored_view(self.storage.clone(), state_table, schema).await
    }

    /// The TaskManager and key groups of every subtask of the vertex that
    /// materializes `state_table`, if they hold the latest checkpoint.
    #[allow(clippy::type_complexity)]
    fn scan_targets(
        &self,
        state_table: u64,
    ) -> Option<Vec<(Arc<dyn TaskExecutorGateway>, std::ops::Range<u16>)>> {
        let inner = self.lock().ok()?;
        if inner.state != JobState::Running || inner.stale_task_manager {
            return None;
        }
        let exec = inner.exec.as_ref()?;
        let vertex = exec.job.vertices.iter().find(|v| {
            v.nodes.iter().any(|n| {
                matches!(exec.job.stream.nodes[*n].spec,
                    OperatorSpec::Materialize { state_table: t, .. } if t == state_table)
            })
        })?;
        exec.subtasks[vertex.id]
            .iter()
            .map(|ev| {
                let tm = self.rm.task_executor(&ev.slot).ok()?;
                Some((tm, key_group_range(ev.subtask, vertex.parallelism)))
            })
            .collect()
    }
}

/// A view's rows from the checkpoint storage.
pub(crate) async fn read_stored_view(
    storage: Arc<StateStore>,
    state_table: u64,
    schema: SchemaRef,
) -> Result<Vec<RecordBatch>> {
    tokio::task::spawn_blocking(move || {
        executor::operators::materialize::read_view(
            &storage,
            state_table,
            &schema,
            0..MAX_PARALLELISM,
        )
    })
    .await
    .map_err(|e| ClusterError::Internal(e.to_string()))?
    .map_err(Into::into)
}

#[async_trait]
impl JobMasterGateway for JobMaster {
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck) {
        let checkpoint_id = ack.checkpoint_id;
        let done = {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            let attempt = inner.attempt;
            match &mut inner.pending {
                Some(p) if p.id == checkpoint_id && p.is_waiting_for(task) => {
                    let last = p.acknowledge(task, &ack);
                    if let Err(e) = self.storage.stage(self.job, checkpoint_id, ack.writes) {
                        tracing::error!(job = self.job, error = %e, "staging checkpoint state failed");
                        inner.abort_pending(&format!("staging its state failed: {e}"));
                        let _ = self.storage.discard_staged(self.job);
                        return;
                    }
                    if last {
                        inner.committing = true;
                        inner.pending.take().map(|p| {
                            let (done, stats) = p.complete();
                            inner.archive(stats);
                            (done, attempt)
                        })
                    } else {
                        None
                    }
                }
                // An ack of an aborted checkpoint, or from a cancelled attempt.
                _ => None,
            }
        };
        if let (Some((done, attempt)), Some(me)) = (done, self.me.upgrade()) {
            tokio::spawn(me.complete(done, attempt));
        }
    }

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<String>,
    ) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if task.attempt != inner.attempt {
            // A report from a cancelled attempt.
            return;
        }
        if let Some(ev) = inner.exec.as_mut().and_then(|e| {
            e.subtasks
                .get_mut(task.vertex)
                .and_then(|v| v.get_mut(task.subtask))
        }) {
            ev.state = state;
        }
        drop(inner);
        if state == ExecutionState::Failed
            && let Some(me) = self.me.upgrade()
        {
            let error = error.unwrap_or_else(|| format!("{task} failed"));
            tokio::spawn(me.failover(error));
        }
    }

    async fn offer_slots(&self, job: u64, slots: Vec<SlotId>) -> Result<Vec<SlotId>> {
        let mut inner = self.lock()?;
        // Slots are wanted while the job waits for them.
        if job != self.job || !matches!(inner.state, JobState::Created | JobState::Restarting) {
            return Ok(Vec::new());
        }
        inner.offered.extend(slots.iter().cloned());
        Ok(slots)
    }

    async fn read_checkpoint_state(
        &self,
        job: u64,
        tables: Vec<u64>,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<(u64, StateEntry)>> {
        read_checkpoint_state(self.storage.clone(), job, tables, key_groups).await
    }
}

/// Committed entries of `tables` in `key_groups` from checkpoint storage.
pub(crate) async fn read_checkpoint_state(
    storage: Arc<StateStore>,
    _job: u64,
    tables: Vec<u64>,
    key_groups: std::ops::Range<u16>,
) -> Result<Vec<(u64, StateEntry)>> {
    tokio::task::spawn_blocking(move || {
        let per_table = storage.scan_many(&tables, key_groups)?;
        Ok(tables
            .iter()
            .zip(per_table)
            .flat_map(|(t, entries)| entries.into_iter().map(move |e| (*t, e)))
            .collect())
    })
    .await
    .map_err(|e| ClusterError::Internal(e.to_string()))?
}

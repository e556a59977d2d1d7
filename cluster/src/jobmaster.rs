//! The JobMaster of one job: gets slots from the ResourceManager, deploys
//! the ExecutionGraph's subtasks to TaskManagers, runs the
//! CheckpointCoordinator and restarts the job when a task or a TaskManager
//! fails, following the configured restart strategy.
//!
//! Checkpoints: every `checkpoint_interval` (no sooner than the minimum
//! pause after the last one ended, or at once when asked, for `FLUSH` and
//! `CHECKPOINT`) the coordinator picks the next id and tells every source
//! subtask to emit a barrier. Each stateful subtask snapshots its RocksDB
//! instance into **checkpoint storage** and acknowledges with the handle of
//! its files. When the last subtask has acknowledged, the JobMaster writes
//! the checkpoint's metadata file — the checkpoint exists from then on —,
//! tells each TaskManager of the job, and publishes it. It retains the last
//! `checkpoints_retained` checkpoints, counting references to the shared
//! SST files and deleting those no retained checkpoint needs. A checkpoint
//! that expires, is declined or cannot be written counts as failed; more
//! failures in a row than tolerated fail the job over.
//!
//! Failover: cancel every task, release the slots, wait as the restart
//! strategy says, ask for slots again — the lost TaskManager's are gone, a
//! new one's may have arrived — and deploy a new attempt. Each task is
//! deployed with the handles of the latest retained checkpoint that hold
//! its key groups and restores from them, so any slot will do. A file that
//! fails its checksum marks that checkpoint corrupt; the next attempt
//! restores from the one before.
//!
//! One lock orders it all: committing a checkpoint and (re)deploying hold
//! `commit` for writing, view scans for reading, so a scan sees every
//! TaskManager at the same completed checkpoint and never a half-restored
//! one.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::message::Barrier;
use executor::operators::changelog;
use executor::state::OperatorStateStats;
use executor::task::{CheckpointAck, TaskDeployment, TaskId, TaskRestore};
use executor::{ErrorKind, Failure};
use planner::execution_graph::{ExecutionGraph, ExecutionState, SlotId};
use planner::job_graph::JobGraph;
use planner::spec::OperatorSpec;
use storage::StorageError;
use storage::backend::StoredTable;
use storage::checkpoint_storage::{
    CheckpointMetadata, CheckpointStorage, FORMAT_VERSION, SharedFiles, SnapshotKind, StateHandle,
};
use storage::keys::{MAX_PARALLELISM, key_group_range};
use tokio::sync::{Notify, RwLock, watch};

use crate::checkpoint::{
    CheckpointStats, CheckpointStatus, CompletedCheckpoint, PendingCheckpoint,
};
use crate::config::ClusterConfig;
use crate::gateway::{
    ChangeStream, JobMasterGateway, ResourceId, ResourceManagerGateway, TaskExecutorGateway,
    ViewStream,
};
use crate::{ClusterError, Result};
use futures::StreamExt;
use storage::table::TableStore;

/// Where a job is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum JobState {
    /// Waiting for slots and deploying, the first time.
    Created,
    Running,
    Restarting,
    Failed(Failure),
    Canceled,
}

struct Inner {
    /// Each subtask's operator state as of its latest acknowledgement,
    /// by (vertex, subtask), with the attempt that reported it.
    state_stats: BTreeMap<(usize, usize), (u64, Vec<OperatorStateStats>)>,
    /// `None` until the job has slots.
    exec: Option<ExecutionGraph>,
    attempt: u64,
    state: JobState,
    restarts: u32,
    running_since: Instant,
    /// A failure reported while the job was being (re)deployed.
    deploy_failure: Option<Failure>,
    /// Slots TaskManagers offered for the coming deployment (the slot pool).
    offered: BTreeSet<SlotId>,
    next_checkpoint: u64,
    pending: Option<PendingCheckpoint>,
    /// The checkpoint every task acknowledged, while its metadata is written.
    committing: Option<u64>,
    /// Completed checkpoints kept, oldest first; restores use the last.
    retained: VecDeque<CheckpointMetadata>,
    /// References to shared files from `retained`.
    shared: SharedFiles,
    /// Whether `retained` has been read from checkpoint storage.
    loaded: bool,
    /// Why the job cannot be restored (every retained checkpoint is damaged).
    unrecoverable: Option<Failure>,
    /// Checkpoints failed in a row.
    failures: u32,
    /// The checkpoint the current deployment restored from.
    restored: Option<u64>,
    /// Checkpoints being read (for a savepoint): kept past retention.
    pinned: BTreeSet<u64>,
    /// When the last checkpoint ended, for the minimum pause.
    last_finished: Option<Instant>,
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
    storage: Arc<CheckpointStorage>,
    /// Local scratch space for reading checkpoints.
    scratch: PathBuf,
    config: ClusterConfig,
    /// What the job's barriers carry from outside the job.
    stamps: BarrierStamps,
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
        self.end_pending(CheckpointStatus::Aborted, cause);
    }

    /// The pending checkpoint, if any, ends with `status`.
    fn end_pending(&mut self, status: CheckpointStatus, cause: &str) {
        if let Some(p) = self.pending.take() {
            let mut stats = p.stats;
            stats.status = status;
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
        self.last_finished = Some(Instant::now());
    }

    /// Files of an abandoned checkpoint's handles that no retained
    /// checkpoint references.
    fn orphans(&self, handles: &[StateHandle]) -> Vec<String> {
        handles
            .iter()
            .flat_map(|h| h.files.iter())
            .filter(|f| f.shared && !self.shared.contains(&f.path))
            .map(|f| f.path.clone())
            .collect()
    }
}

/// What a JobMaster stamps on each barrier from outside its job.
#[derive(Clone)]
pub(crate) struct BarrierStamps {
    /// The database's tables: a barrier includes the commits to several
    /// tables made before it was triggered.
    pub(crate) tables: Arc<TableStore>,
    /// What jobs reading this one's view need of its changelog.
    pub(crate) holds: Arc<crate::view_log::ChangelogHolds>,
}

/// State tables of a vertex's operators.
pub(crate) fn vertex_tables(graph: &JobGraph, vertex: usize) -> Vec<u64> {
    graph.vertices.get(vertex).map_or_else(Vec::new, |v| {
        v.nodes
            .iter()
            .flat_map(|n| graph.stream.nodes[*n].spec.state_tables())
            .collect()
    })
}

fn millis(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// The history row of a checkpoint found damaged.
fn corrupt_stats(id: u64, why: &str) -> CheckpointStats {
    CheckpointStats {
        cause: Some(format!(
            "corrupt: {why}; restoring from the previous retained checkpoint"
        )),
        ..CheckpointStats::new(id, CheckpointStatus::Failed)
    }
}

/// Unique scratch directories for reads from checkpoint storage.
static SCRATCH: AtomicU64 = AtomicU64::new(0);

impl JobMaster {
    /// A JobMaster for `graph`, not yet deployed.
    pub(crate) fn new(
        job: u64,
        graph: JobGraph,
        rm: Arc<dyn ResourceManagerGateway>,
        storage: Arc<CheckpointStorage>,
        scratch: PathBuf,
        config: ClusterConfig,
        stamps: BarrierStamps,
    ) -> Result<Arc<Self>> {
        let jm = Arc::new_cyclic(|me| JobMaster {
            job,
            graph,
            rm,
            storage,
            scratch,
            config,
            stamps,
            inner: Mutex::new(Inner {
                exec: None,
                attempt: 0,
                state: JobState::Created,
                restarts: 0,
                running_since: Instant::now(),
                deploy_failure: None,
                offered: BTreeSet::new(),
                history: VecDeque::new(),
                next_checkpoint: 1,
                pending: None,
                committing: None,
                retained: VecDeque::new(),
                shared: SharedFiles::default(),
                loaded: false,
                unrecoverable: None,
                failures: 0,
                pinned: BTreeSet::new(),
                restored: None,
                last_finished: None,
                stale_task_manager: false,
                state_stats: BTreeMap::new(),
            }),
            commit: RwLock::new(()),
            completed: watch::channel(CompletedCheckpoint::default()).0,
            trigger: Notify::new(),
            me: me.clone(),
        });
        tokio::spawn(Self::run_checkpoints(Arc::downgrade(&jm)));
        Ok(jm)
    }

    /// Gets slots and deploys the first attempt. On failure the job's slots
    /// are released; the caller decides whether to retry ([`Self::failover`]).
    pub(crate) async fn launch(&self) -> Result<()> {
        self.load_checkpoints(0).await?;
        let result = self.allocate_and_deploy().await;
        if result.is_err() {
            self.teardown().await;
        }
        result
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner.lock().map_err(|_| poisoned())
    }

    /// Reads the job's completed checkpoints from checkpoint storage, once:
    /// the newest `checkpoints_retained` whose metadata is sound are
    /// retained, damaged ones are marked corrupt, and what no retained
    /// checkpoint needs (unfinished checkpoints, older ones, unreferenced
    /// shared files) is deleted. Checkpoint ids continue after every id
    /// ever used, so a restarted job never reuses one.
    ///
    /// Checkpoints before `floor` are obsolete too: a job restored from a
    /// savepoint starts a new history there.
    pub(crate) async fn load_checkpoints(&self, floor: u64) -> Result<()> {
        if self.lock()?.loaded {
            return Ok(());
        }
        let dirs = self.storage.checkpoint_dirs(self.job).await?;
        let keep = self.config.checkpoints_retained.max(1);
        let mut valid: Vec<CheckpointMetadata> = Vec::new();
        let mut corrupt = Vec::new();
        let mut obsolete = Vec::new();
        for (id, completed) in dirs.iter().rev() {
            if !completed || valid.len() >= keep || *id < floor {
                obsolete.push(*id);
                continue;
            }
            match self.storage.read_metadata(self.job, *id).await {
                Ok(meta) => valid.push(meta),
                Err(StorageError::Corrupt(why)) => {
                    tracing::error!(job = self.job, checkpoint = id, cause = %why,
                        "checkpoint metadata is damaged; falling back to an earlier checkpoint");
                    self.storage.mark_corrupt(self.job, *id).await?;
                    corrupt.push((*id, why));
                }
                Err(e) => return Err(e.into()),
            }
        }
        valid.reverse();
        let mut shared = SharedFiles::default();
        for meta in &valid {
            shared.add(meta);
        }
        for id in obsolete {
            self.storage.discard(self.job, id, Vec::new()).await?;
        }
        for path in self.storage.shared_files(self.job).await? {
            if !shared.contains(&path) {
                self.storage.delete(&path).await?;
            }
        }
        let mut inner = self.lock()?;
        inner.next_checkpoint = dirs.last().map_or(1, |(id, _)| id + 1);
        for (id, why) in &corrupt {
            inner.archive(corrupt_stats(*id, why));
        }
        if let Some(last) = valid.last() {
            self.completed.send_replace(CompletedCheckpoint {
                id: last.id,
                positions: last.positions.iter().map(|(k, v)| (*k, *v)).collect(),
                behind: true,
                ..Default::default()
            });
        } else if let Some((id, why)) = corrupt.first() {
            inner.unrecoverable = Some(Failure::internal(format!(
                "every retained checkpoint is damaged (the latest, {id}: {why})"
            )));
        }
        tracing::info!(job = self.job, retained = ?valid.iter().map(|m| m.id).collect::<Vec<_>>(),
            "checkpoints loaded");
        inner.retained = valid.into();
        inner.shared = shared;
        inner.loaded = true;
        Ok(())
    }

    /// A restore from checkpoint `id` found a damaged file: drop it from the
    /// retained checkpoints (the next attempt restores from the one before),
    /// mark it in storage and in the history.
    async fn discard_corrupt(&self, id: u64, why: &str) -> Result<()> {
        tracing::error!(job = self.job, checkpoint = id, cause = %why,
            "checkpoint is damaged; falling back to the previous retained checkpoint");
        {
            let mut inner = self.lock()?;
            let Some(pos) = inner.retained.iter().position(|m| m.id == id) else {
                return Ok(());
            };
            if let Some(meta) = inner.retained.remove(pos) {
                inner.shared.release(&meta);
            }
            let stats = corrupt_stats(id, why);
            match inner.history.iter_mut().find(|s| s.id == id) {
                Some(s) => {
                    s.status = stats.status;
                    s.cause = stats.cause;
                }
                None => inner.archive(stats),
            }
            match inner.retained.back() {
                Some(prev) => {
                    self.completed.send_replace(CompletedCheckpoint {
                        id: prev.id,
                        positions: prev.positions.iter().map(|(k, v)| (*k, *v)).collect(),
                        behind: true,
                        ..Default::default()
                    });
                }
                None => {
                    inner.unrecoverable = Some(Failure::internal(format!(
                        "every retained checkpoint is damaged (the last, {id}: {why})"
                    )));
                }
            }
        }
        self.storage.mark_corrupt(self.job, id).await?;
        Ok(())
    }

    /// A checkpoint failed (expired, declined, or its metadata could not be
    /// written); beyond the tolerated count in a row the job fails over.
    fn checkpoint_failed(&self, inner: &mut Inner, cause: &str) {
        inner.failures += 1;
        if inner.failures > self.config.tolerable_checkpoint_failures
            && inner.state == JobState::Running
            && let Some(me) = self.me.upgrade()
        {
            let error = Failure::internal(format!(
                "{} checkpoints failed in a row, more than the {} tolerated; the last: {cause}",
                inner.failures, self.config.tolerable_checkpoint_failures
            ));
            inner.failures = 0;
            tokio::spawn(me.failover(error));
        }
    }

    /// Deletes what an abandoned checkpoint wrote to storage.
    fn discard_files(&self, inner: &Inner, id: u64, handles: &[StateHandle]) {
        let orphans = inner.orphans(handles);
        let (storage, job) = (self.storage.clone(), self.job);
        tokio::spawn(async move {
            if let Err(e) = storage.discard(job, id, orphans).await {
                tracing::warn!(job, checkpoint = id, error = %e, "could not delete an abandoned checkpoint");
            }
        });
    }

    /// Ends the pending checkpoint `id` as failed: it expired or a task
    /// declined it.
    async fn fail_pending(&self, id: u64, cause: Failure) {
        {
            let Ok(mut inner) = self.lock() else { return };
            let Some(p) = inner.pending.as_ref().filter(|p| p.id == id) else {
                return;
            };
            let handles = p.handles().to_vec();
            tracing::warn!(job = self.job, checkpoint = id, cause = %cause, "checkpoint failed");
            inner.end_pending(CheckpointStatus::Failed, &cause.message);
            self.discard_files(&inner, id, &handles);
            // A full disk is not the job's fault, and restarting it would
            // not help: its checkpoints resume once there is space.
            if cause.kind != ErrorKind::DiskFull {
                self.checkpoint_failed(&mut inner, &cause.message);
            }
        }
        for tm in self.task_executors() {
            if let Err(e) = tm.abort_checkpoint(self.job, id).await {
                tracing::debug!(job = self.job, error = %e, "abort on a task manager failed");
            }
        }
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
        let (attempt, restore_from) = {
            let mut inner = self.lock()?;
            if let Some(why) = inner.unrecoverable.clone() {
                inner.state = JobState::Failed(why.clone());
                return Err(ClusterError::JobFailed {
                    job: self.job,
                    error: why,
                });
            }
            if matches!(inner.state, JobState::Canceled | JobState::Failed(_)) {
                return Err(ClusterError::Internal(format!(
                    "job {} stopped while deploying",
                    self.job
                )));
            }
            inner.deploy_failure = None;
            inner.exec = Some(exec.clone());
            inner.stale_task_manager = false;
            inner.restored = inner.retained.back().map(|m| m.id);
            (inner.attempt, inner.retained.back().cloned())
        };
        let graph = Arc::new(self.graph.clone());
        for ev in exec.all() {
            let tm = self.rm.task_executor(&ev.slot)?;
            let tables = vertex_tables(&graph, ev.vertex);
            let key_groups = key_group_range(ev.subtask, graph.vertices[ev.vertex].parallelism);
            let restore = restore_from
                .as_ref()
                .filter(|_| !tables.is_empty())
                .map(|meta| TaskRestore {
                    checkpoint: meta.id,
                    handles: meta
                        .handles
                        .iter()
                        .filter(|h| tables.iter().any(|t| h.overlaps(*t, &key_groups)))
                        .cloned()
                        .collect(),
                });
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
                restore,
                checkpoint_storage: self.storage.location().to_string(),
            };
            match tm.submit_task(deployment, me.clone()).await {
                Ok(()) => {}
                Err(e @ ClusterError::TaskManagerUnreachable { .. }) => {
                    self.rm
                        .disconnect_task_executor(&ev.slot.task_manager, &e.to_string());
                    return Err(e);
                }
                Err(ClusterError::CorruptCheckpoint(why)) => {
                    if let Some(meta) = &restore_from {
                        self.discard_corrupt(meta.id, &why).await?;
                    }
                    return Err(ClusterError::CorruptCheckpoint(why));
                }
                Err(e) => return Err(e),
            }
        }
        let mut inner = self.lock()?;
        if let Some(failure) = inner.deploy_failure.take() {
            if inner.state == JobState::Created {
                // A task of the first deployment failed: the job failed
                // (a new view's CREATE names it).
                return Err(ClusterError::JobFailed {
                    job: self.job,
                    error: failure,
                });
            }
            return Err(ClusterError::TaskFailed(failure));
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
            self.storage.drop_job(self.job).await?;
        }
        self.completed.send_modify(|_| {});
        Ok(())
    }

    /// The latest retained checkpoint, kept (not subsumed) until
    /// [`Self::unpin`]: for reading it at leisure.
    pub(crate) fn pin_latest(&self) -> Result<CheckpointMetadata> {
        let mut inner = self.lock()?;
        let latest =
            inner.retained.back().cloned().ok_or_else(|| {
                ClusterError::Internal(format!("job {} has no checkpoint", self.job))
            })?;
        inner.pinned.insert(latest.id);
        if let Some(s) = inner.history.iter_mut().rev().find(|s| s.id == latest.id) {
            s.kind = SnapshotKind::Savepoint;
        }
        Ok(latest)
    }

    pub(crate) fn unpin(&self, id: u64) {
        if let Ok(mut inner) = self.lock() {
            inner.pinned.remove(&id);
        }
    }

    pub(crate) fn restored_checkpoint(&self) -> Option<u64> {
        self.lock().ok().and_then(|i| i.restored)
    }

    pub(crate) fn job_graph(&self) -> &JobGraph {
        &self.graph
    }

    /// Numbers deployments from `attempt` (a job restarted by a new
    /// JobMaster, whose tasks must not be taken for the old one's).
    pub(crate) fn start_at_attempt(&self, attempt: u64) {
        if let Ok(mut inner) = self.lock() {
            inner.attempt = attempt;
        }
    }

    pub(crate) fn state(&self) -> JobState {
        self.inner
            .lock()
            .map(|i| i.state.clone())
            .unwrap_or(JobState::Failed(Failure::internal("lock poisoned")))
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

    /// Whether the job reads a connector (`CREATE SOURCE`).
    pub(crate) fn reads_connectors(&self) -> bool {
        self.graph
            .stream
            .nodes
            .iter()
            .any(|n| matches!(n.spec, OperatorSpec::ConnectorSource { .. }))
    }

    /// The dead-letter tables the job's connector sources write, each with
    /// the source's parallelism (its writers are subtasks `0..n`).
    pub(crate) fn dead_letter_tables(&self) -> Vec<(u64, usize)> {
        self.graph
            .vertices
            .iter()
            .filter_map(|v| match &self.graph.stream.nodes[*v.nodes.first()?].spec {
                OperatorSpec::ConnectorSource { connector, .. } => {
                    connector.dead_letter_table.map(|t| (t, v.parallelism))
                }
                _ => None,
            })
            .collect()
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

    /// Materialized views the job's sources read.
    pub(crate) fn source_views(&self) -> Vec<u64> {
        self.graph
            .stream
            .nodes
            .iter()
            .filter_map(|n| match n.spec {
                OperatorSpec::ViewSource { view_id, .. } => Some(view_id),
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

    /// Each subtask's operator state, by (vertex, subtask), as of its
    /// latest checkpoint in the current attempt.
    pub(crate) fn state_stats(&self) -> Vec<(usize, usize, OperatorStateStats)> {
        let Ok(inner) = self.lock() else {
            return Vec::new();
        };
        inner
            .state_stats
            .iter()
            .filter(|(_, (attempt, _))| *attempt == inner.attempt)
            .flat_map(|((v, s), (_, stats))| stats.iter().map(|st| (*v, *s, st.clone())))
            .collect()
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
            let pause = jm
                .lock()
                .ok()
                .and_then(|i| i.last_finished)
                .map(|t| {
                    jm.config
                        .min_pause_between_checkpoints
                        .saturating_sub(t.elapsed())
                })
                .unwrap_or_default();
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            if let Err(e) = jm.trigger_checkpoint(timeout).await {
                tracing::warn!(job = jm.job, error = %e, "checkpoint trigger failed");
            }
        }
    }

    async fn trigger_checkpoint(&self, timeout: Duration) -> Result<()> {
        let (id, sources) = {
            let mut inner = self.lock()?;
            // One checkpoint at a time (Flink's max-concurrent-checkpoints = 1).
            if inner.committing.is_some()
                || inner.pending.is_some()
                || inner.state != JobState::Running
            {
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
                    graph.stream.nodes[head].spec.is_source()
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
            let id = inner.next_checkpoint;
            inner.next_checkpoint += 1;
            inner.pending = Some(PendingCheckpoint::new(id, tasks));
            (id, sources)
        };
        // The checkpoint expires unless it completes within the timeout.
        let me = self.me.clone();
        tokio::spawn(async move {
            tokio::time::sleep(timeout).await;
            if let Some(jm) = me.upgrade() {
                jm.fail_pending(
                    id,
                    Failure::internal(format!(
                        "expired after {timeout:?} before every task acknowledged it"
                    )),
                )
                .await;
            }
        });
        let commit = self.stamps.tables.last_commit();
        let keep_after = self.stamps.holds.keep_after(self.job);
        tracing::debug!(
            job = self.job,
            checkpoint = id,
            commit,
            "trigger checkpoint"
        );
        for (task, slot) in sources {
            // Not awaited here: a TaskManager that hangs must not hold up
            // the coordinator (the checkpoint then expires or fails over).
            let tm = self.rm.task_executor(&slot)?;
            let job = self.job;
            tokio::spawn(async move {
                let barrier = Barrier::checkpoint(id)
                    .with_commit(commit)
                    .keeping_after(keep_after);
                if let Err(e) = tm.trigger_checkpoint(task, barrier).await {
                    tracing::warn!(job, checkpoint = id, error = %e, "checkpoint trigger failed");
                }
            });
        }
        Ok(())
    }

    /// Completes a checkpoint every task has acknowledged: writes its
    /// metadata, tells the TaskManagers, publishes it and drops the
    /// checkpoints beyond retention.
    async fn complete(
        self: Arc<Self>,
        checkpoint: CompletedCheckpoint,
        handles: Vec<StateHandle>,
        attempt: u64,
    ) {
        let _commit = self.commit.write().await;
        let id = checkpoint.id;
        let triggered_at = {
            let Ok(mut inner) = self.lock() else { return };
            let current = inner.attempt == attempt
                && inner.committing == Some(id)
                && inner.state == JobState::Running;
            if !current {
                // A failover came first.
                inner.finish(
                    id,
                    CheckpointStatus::Aborted,
                    Some("the job failed before it was completed".into()),
                );
                self.discard_files(&inner, id, &handles);
                return;
            }
            inner
                .history
                .iter()
                .rev()
                .find(|s| s.id == id)
                .map_or(SystemTime::now(), |s| s.triggered_at)
        };
        let meta = CheckpointMetadata {
            version: FORMAT_VERSION,
            job: self.job,
            id,
            kind: SnapshotKind::Checkpoint,
            triggered_at_ms: millis(triggered_at),
            completed_at_ms: millis(SystemTime::now()),
            positions: checkpoint.positions.iter().map(|(k, v)| (*k, *v)).collect(),
            handles,
        };
        if let Err(e) = self.storage.write_metadata(&meta).await {
            tracing::error!(job = self.job, checkpoint = id, error = %e, "writing checkpoint metadata failed");
            if let Ok(mut inner) = self.lock() {
                inner.committing = None;
                inner.finish(id, CheckpointStatus::Failed, Some(e.to_string()));
                self.discard_files(&inner, id, &meta.handles);
                self.checkpoint_failed(&mut inner, &e.to_string());
            }
            return;
        }
        let released = {
            let Ok(mut inner) = self.lock() else { return };
            let full = meta.full_size();
            let incremental: u64 = meta
                .handles
                .iter()
                .flat_map(|h| h.files.iter())
                .filter(|f| !f.shared || !inner.shared.contains(&f.path))
                .map(|f| f.size)
                .sum();
            if let Some(s) = inner.history.iter_mut().rev().find(|s| s.id == id) {
                s.full_bytes = full;
                s.incremental_bytes = incremental;
            }
            inner.shared.add(&meta);
            inner.retained.push_back(meta);
            let mut released = Vec::new();
            while inner.retained.len() > self.config.checkpoints_retained.max(1)
                && inner
                    .retained
                    .front()
                    .is_some_and(|m| !inner.pinned.contains(&m.id))
            {
                if let Some(old) = inner.retained.pop_front() {
                    let orphans = inner.shared.release(&old);
                    released.push((old.id, orphans));
                }
            }
            released
        };
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
            tracing::warn!(job = self.job, checkpoint = id, error = %error, "task manager did not confirm the checkpoint");
            stale = true;
        }
        if let Ok(mut inner) = self.lock() {
            inner.committing = None;
            inner.failures = 0;
            inner.stale_task_manager = stale;
            inner.finish(id, CheckpointStatus::Completed, None);
        }
        tracing::debug!(job = self.job, checkpoint = id, "checkpoint completed");
        self.completed.send_replace(checkpoint);
        for (old, orphans) in released {
            if let Err(e) = self.storage.discard(self.job, old, orphans).await {
                tracing::warn!(job = self.job, checkpoint = old, error = %e, "could not delete a subsumed checkpoint");
            }
        }
    }

    /// A task or a TaskManager failed: cancel everything, then restart
    /// from the latest completed checkpoint as the restart strategy allows.
    pub(crate) async fn failover(self: Arc<Self>, error: Failure) {
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
        // Whether this failure uses up one of the restart strategy's
        // attempts: waiting for slots, or finding a TaskManager gone (it is
        // declared lost at once, and the next attempt avoids it), do not.
        let mut counts = true;
        loop {
            let delay = {
                let _commit = self.commit.write().await;
                let Ok(mut inner) = self.lock() else { return };
                if inner.state != JobState::Restarting {
                    return;
                }
                if let Some(p) = &inner.pending {
                    let (id, handles) = (p.id, p.handles().to_vec());
                    self.discard_files(&inner, id, &handles);
                }
                inner.abort_pending(&format!("job restarting: {error}"));
                inner.committing = None;
                if let Some(reset) = self.config.restart_strategy.reset_after()
                    && inner.running_since.elapsed() > reset
                {
                    inner.restarts = 0;
                }
                // A full disk is waited out: restarting cannot fix it, so it
                // does not use up the restart strategy's attempts.
                if counts && error.kind != ErrorKind::DiskFull {
                    inner.restarts += 1;
                }
                let delay = self.config.restart_strategy.delay(inner.restarts.max(1));
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
                Err(e) if self.state() == JobState::Restarting => {
                    counts = !matches!(
                        e,
                        ClusterError::NotEnoughSlots { .. }
                            | ClusterError::TaskManagerUnreachable { .. }
                    );
                    error = e.failure();
                }
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
        Ok(self.read_rows(state_table, schema).await?.1)
    }

    /// [`JobMaster::read_view`] as a stream read a page at a time from
    /// the TaskManagers, each pinning the latest completed checkpoint
    /// before this returns (no checkpoint completes meanwhile); from the
    /// checkpoint storage, whole, when they cannot serve it.
    pub(crate) async fn read_view_stream(
        &self,
        state_table: u64,
        schema: SchemaRef,
    ) -> Result<(u64, ViewStream)> {
        {
            let _commit = self.commit.read().await;
            let at = self.lock()?.retained.back().map_or(0, |m| m.id);
            if let Some(targets) = self.scan_targets(state_table) {
                let mut parts = Vec::new();
                for (tm, key_groups) in targets {
                    match tm
                        .scan_view_stream(state_table, schema.clone(), key_groups)
                        .await
                    {
                        Ok(part) => parts.push(part),
                        Err(e) => {
                            tracing::warn!(job = self.job, error = %e, "view scan on a task manager failed; reading checkpoint storage");
                            parts.clear();
                            break;
                        }
                    }
                }
                if !parts.is_empty() {
                    return Ok((at, futures::stream::iter(parts).flatten().boxed()));
                }
            }
        }
        let (at, rows) = self.read_rows(state_table, schema).await?;
        Ok((at, futures::stream::iter(rows.into_iter().map(Ok)).boxed()))
    }

    /// A view's changes after epoch `since` from its changelog table at
    /// the latest completed checkpoint, with that checkpoint's id: read a
    /// page at a time as the stream is polled, from the TaskManagers while
    /// the job runs (each pins the checkpoint before this returns), else
    /// from the checkpoint's files. A `since` older than the horizon reads
    /// nothing.
    pub(crate) async fn read_changes(
        &self,
        changelog_table: u64,
        schema: SchemaRef,
        since: u64,
    ) -> Result<(u64, ChangeStream)> {
        let _commit = self.commit.read().await;
        let latest = self.lock()?.retained.back().cloned();
        let at = latest.as_ref().map_or(0, |m| m.id);
        if let Some(targets) = self.scan_targets(changelog_table) {
            let mut horizon = 0;
            let mut parts = Vec::new();
            let mut complete = true;
            for (tm, key_groups) in targets {
                match tm
                    .scan_changes(changelog_table, schema.clone(), key_groups, since)
                    .await
                {
                    Ok(part) => {
                        horizon = horizon.max(part.horizon);
                        parts.push(part.batches);
                    }
                    Err(e) => {
                        tracing::warn!(job = self.job, error = %e, "changelog scan on a task manager failed; reading checkpoint storage");
                        complete = false;
                        break;
                    }
                }
            }
            if complete {
                if since < horizon {
                    parts.clear();
                }
                return Ok((
                    at,
                    ChangeStream {
                        horizon,
                        batches: crate::changes::merge_by_epoch(parts),
                    },
                ));
            }
        }
        let Some(meta) = latest else {
            return Ok((
                0,
                ChangeStream {
                    horizon: 0,
                    batches: crate::changes::merge_by_epoch(Vec::new()),
                },
            ));
        };
        let base = self
            .scratch
            .join(format!("read-{}", SCRATCH.fetch_add(1, Ordering::Relaxed)));
        let stored = storage::backend::open_table(
            &self.storage,
            &meta.handles,
            changelog_table,
            0..MAX_PARALLELISM,
            &base,
        )
        .await
        .map_err(stored_error)?;
        let readers = tokio::task::spawn_blocking(move || {
            let mut readers = Vec::new();
            for part in stored {
                match part {
                    StoredTable::Opened {
                        kv,
                        key_groups,
                        dir,
                    } => {
                        let reader = changelog::ChangeReader::open(
                            &*kv,
                            changelog_table,
                            &schema,
                            key_groups,
                            since,
                        )?;
                        readers.push((reader.horizon(), Ok((kv, reader, dir))));
                    }
                    StoredTable::Entries(entries) => {
                        // A savepoint's canonical files: read whole.
                        let changes = changelog::changes_from_entries(&entries, &schema, since)?;
                        readers.push((changes.horizon, Err(changes.batches)));
                    }
                }
            }
            Ok::<_, executor::ExecError>(readers)
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))??;
        let horizon = readers.iter().map(|(h, _)| *h).max().unwrap_or(0);
        let mut parts = Vec::new();
        if since >= horizon {
            for (_, part) in readers {
                parts.push(match part {
                    Ok((kv, reader, dir)) => crate::changes::pages(kv, reader, dir),
                    Err(batches) => futures::stream::iter(batches.into_iter().map(Ok)).boxed(),
                });
            }
        }
        Ok((
            at,
            ChangeStream {
                horizon,
                batches: crate::changes::merge_by_epoch(parts),
            },
        ))
    }

    /// Reads a view's rows at the latest completed checkpoint; no
    /// checkpoint completes meanwhile.
    async fn read_rows(&self, table: u64, schema: SchemaRef) -> Result<(u64, Vec<RecordBatch>)> {
        let _commit = self.commit.read().await;
        let latest = self.lock()?.retained.back().cloned();
        let at = latest.as_ref().map_or(0, |m| m.id);
        if let Some(targets) = self.scan_targets(table) {
            let mut rows = Vec::new();
            let mut complete = true;
            for (tm, key_groups) in targets {
                match tm.scan_view(table, schema.clone(), key_groups).await {
                    Ok(part) => rows.extend(part),
                    Err(e) => {
                        tracing::warn!(job = self.job, error = %e, "view scan on a task manager failed; reading checkpoint storage");
                        complete = false;
                        break;
                    }
                }
            }
            if complete {
                return Ok((at, rows));
            }
        }
        let Some(meta) = latest else {
            return Ok((0, Vec::new()));
        };
        let entries = read_stored_entries(&self.storage, &self.scratch, &meta, table).await?;
        Ok((
            at,
            executor::operators::materialize::rows_from_entries(&entries, &schema)?,
        ))
    }

    /// Where the oldest retained checkpoint left the job's sources: the
    /// log before it may go, as no restore can need it (`None` until the
    /// job has a checkpoint).
    pub(crate) fn truncation_positions(&self) -> Option<HashMap<u64, u64>> {
        let inner = self.lock().ok()?;
        let oldest = inner.retained.front()?;
        Some(oldest.positions.iter().map(|(k, v)| (*k, *v)).collect())
    }

    /// The TaskManager and key groups of every subtask of the vertex that
    /// keeps `state_table` (a view's rows, or a view's late-row counts), if
    /// they hold the latest checkpoint.
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
                exec.job.stream.nodes[*n]
                    .spec
                    .state_tables()
                    .contains(&state_table)
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

/// A state table's entries in a stored checkpoint, in all key groups.
async fn read_stored_entries(
    storage: &CheckpointStorage,
    scratch: &std::path::Path,
    meta: &CheckpointMetadata,
    table: u64,
) -> Result<Vec<storage::state::StateEntry>> {
    let dir = scratch.join(format!("read-{}", SCRATCH.fetch_add(1, Ordering::Relaxed)));
    let entries =
        storage::backend::read_handles(storage, &meta.handles, table, 0..MAX_PARALLELISM, &dir)
            .await;
    let _ = std::fs::remove_dir_all(&dir);
    entries.map_err(stored_error)
}

fn stored_error(e: StorageError) -> ClusterError {
    match e {
        StorageError::Corrupt(why) => ClusterError::CorruptCheckpoint(why),
        e => e.into(),
    }
}

#[async_trait]
impl JobMasterGateway for JobMaster {
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck) {
        let checkpoint_id = ack.checkpoint_id;
        if let Some(why) = ack.declined.clone() {
            if let Some(me) = self.me.upgrade() {
                let cause = Failure::new(why.kind, format!("{task} declined it: {why}"));
                tokio::spawn(async move { me.fail_pending(checkpoint_id, cause).await });
            }
            return;
        }
        let done = {
            let Ok(mut inner) = self.inner.lock() else {
                return;
            };
            let attempt = inner.attempt;
            if task.attempt == attempt && !ack.state_stats.is_empty() {
                inner.state_stats.insert(
                    (task.vertex, task.subtask),
                    (attempt, ack.state_stats.clone()),
                );
            }
            let pending = inner.pending.as_ref().map(|p| p.id);
            match &mut inner.pending {
                Some(p) if p.id == checkpoint_id && p.is_waiting_for(task) => {
                    if p.acknowledge(task, ack) {
                        inner.committing = Some(checkpoint_id);
                        inner.pending.take().map(|p| {
                            let (done, handles, stats) = p.complete();
                            inner.archive(stats);
                            (done, handles, attempt)
                        })
                    } else {
                        None
                    }
                }
                // An ack of an aborted checkpoint, or from a cancelled
                // attempt: what it uploaded is no use.
                _ => {
                    if let Some(h) = ack.state
                        && pending != Some(checkpoint_id)
                        && inner.committing != Some(checkpoint_id)
                        && !inner.retained.iter().any(|m| m.id == checkpoint_id)
                    {
                        self.discard_files(&inner, checkpoint_id, &[h]);
                    }
                    None
                }
            }
        };
        if let (Some((done, handles, attempt)), Some(me)) = (done, self.me.upgrade()) {
            tokio::spawn(me.complete(done, handles, attempt));
        }
    }

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<Failure>,
    ) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        if task.attempt != inner.attempt || inner.exec.is_none() {
            // A report from a cancelled attempt, or — before this JobMaster
            // deployed anything — from a task of an earlier JobManager.
            return;
        }
        if let Some(ev) = inner.exec.as_mut().and_then(|e| {
            e.subtasks
                .get_mut(task.vertex)
                .and_then(|v| v.get_mut(task.subtask))
        }) {
            ev.state = state;
        }
        if state == ExecutionState::Failed && inner.state == JobState::Created {
            // The first deployment is still submitting tasks: it fails when
            // it ends, and its caller decides (a new view's CREATE fails,
            // a recovered job goes to the restart strategy).
            inner.deploy_failure.get_or_insert_with(|| {
                error.unwrap_or_else(|| Failure::internal(format!("{task} failed")))
            });
            return;
        }
        drop(inner);
        if state == ExecutionState::Failed
            && let Some(me) = self.me.upgrade()
        {
            let error = error.unwrap_or_else(|| Failure::internal(format!("{task} failed")));
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
}

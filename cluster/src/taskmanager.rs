//! The TaskExecutor: a TaskManager's slot table, its running tasks and its
//! local state store.
//!
//! Start-up follows Flink's TaskExecutor ([`TaskExecutor::connect`]):
//! register with the ResourceManager (resource id, address, hardware, slot
//! report), retrying with back-off until the registration timeout, then
//! heartbeat. When the ResourceManager no longer knows it (the JobManager
//! restarted) or stays unreachable past the heartbeat timeout, it cancels
//! everything it runs and registers again.
//!
//! State: every stateful subtask gets its own keyed state backend (one
//! RocksDB instance, [`KeyedStateBackend`]) when deployed, filled from the
//! checkpoint handles its deployment names. Tasks report to the
//! TaskExecutor through [`TaskReporter`]; at a checkpoint it runs the
//! backend's synchronous part on the task (write the changed keys, take a
//! RocksDB checkpoint), then uploads the new files to checkpoint storage in
//! the background and acknowledges to the job's JobMaster with the handle.
//! When the JobMaster says the checkpoint is complete, the local copy of
//! that checkpoint becomes what the view-scan service reads. Cancelling a
//! job deletes its backends: local state lives as long as the tasks.
//!
//! Managed memory: each slot owns an equal share of the TaskManager's
//! managed memory (`storage::SlotMemory`): the backends of a slot share one
//! block cache and one write-buffer budget in half of it, the operators'
//! state caches of its tasks the other half, so a slot's state cannot
//! crowd out another's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::Failure;
use executor::exchange::LocalShuffle;
use executor::message::Barrier;
use executor::operators::changelog;
use executor::state::StateStore;
use executor::task::{
    CheckpointAck, RemoteChannels, TableLog, TaskCommand, TaskDeployment, TaskEnvironment, TaskId,
    TaskReporter, ViewLog, build_task,
};
use futures::FutureExt;
use planner::execution_graph::{ExecutionState, SlotId};
use std::panic::AssertUnwindSafe;
use storage::SlotMemory;
use storage::backend::{KeyedStateBackend, SnapshotError};
use storage::checkpoint_storage::{CheckpointStorage, TableRange};
use storage::keys::key_group_range;
use storage::state::{StateEntry, StateScan};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::config::ClusterConfig;
use crate::gateway::{
    ChangeStream, HardwareDescription, JobMasterGateway, ResourceId, ResourceManagerGateway,
    SlotMemoryUsed, SlotReport, SlotStatus, TaskExecutorGateway, TaskExecutorRegistration,
    ViewStream,
};
use crate::{ClusterError, Result};

struct RunningTask {
    id: TaskId,
    attempt: u64,
    commands: mpsc::UnboundedSender<TaskCommand>,
    handle: JoinHandle<()>,
}

/// A task's keyed state store: its backend (none for a stateless task).
struct BackendReader(Option<Arc<KeyedStateBackend>>);

impl BackendReader {
    fn backend(&self) -> executor::Result<&KeyedStateBackend> {
        self.0
            .as_deref()
            .ok_or_else(|| executor::ExecError::Service("a stateless task has no state".into()))
    }
}

impl StateStore for BackendReader {
    fn get(&self, table: u64, key_group: u16, key: &[u8]) -> executor::Result<Option<Vec<u8>>> {
        Ok(self.backend()?.get(table, key_group, key)?)
    }

    fn get_many(
        &self,
        table: u64,
        keys: &[(u16, &[u8])],
    ) -> executor::Result<Vec<Option<Vec<u8>>>> {
        Ok(self.backend()?.get_many(table, keys)?)
    }

    fn put(&self, writes: Vec<storage::state::StateWrite>) -> executor::Result<()> {
        Ok(self.backend()?.put(writes)?)
    }

    fn delete_range(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        to: &[u8],
    ) -> executor::Result<()> {
        Ok(self.backend()?.delete_range(table, key_group, from, to)?)
    }

    fn scan(
        &self,
        table: u64,
        key_groups: std::ops::Range<u16>,
    ) -> executor::Result<Vec<StateEntry>> {
        match &self.0 {
            Some(b) => Ok(b.scan_state(table, key_groups)?),
            None => Ok(Vec::new()),
        }
    }

    fn scan_from(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        limit: usize,
    ) -> executor::Result<Vec<StateEntry>> {
        match &self.0 {
            Some(b) => Ok(b.scan_state_from(table, key_group, from, limit)?),
            None => Ok(Vec::new()),
        }
    }

    fn scan_prefix(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
    ) -> executor::Result<Vec<StateEntry>> {
        Ok(self
            .backend()?
            .scan_state_prefix(table, key_group, prefix)?)
    }

    fn scan_prefix_from(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> executor::Result<Vec<StateEntry>> {
        Ok(self
            .backend()?
            .scan_state_prefix_from(table, key_group, prefix, from, limit)?)
    }

    fn scan_prefix_back(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> executor::Result<Vec<StateEntry>> {
        Ok(self
            .backend()?
            .scan_state_prefix_back(table, key_group, prefix, before, limit)?)
    }
}

/// What a TaskManager is made of, besides its slots and tasks.
pub struct TaskExecutorServices {
    pub resource_id: ResourceId,
    /// Where this TaskManager serves its shuffle (and TaskExecutor RPC).
    pub address: String,
    /// Where subtasks' state backends live.
    pub state_dir: std::path::PathBuf,
    /// Each slot's share of managed memory.
    pub slot_memory: Vec<SlotMemory>,
    pub tables: Arc<dyn TableLog>,
    /// Materialized views, as views over them read them.
    pub views: Arc<dyn ViewLog>,
    pub remote: Arc<dyn RemoteChannels>,
}

/// A TaskManager.
pub struct TaskExecutor {
    resource_id: ResourceId,
    address: String,
    state_dir: std::path::PathBuf,
    slot_memory: Vec<SlotMemory>,
    tables: Arc<dyn TableLog>,
    views: Arc<dyn ViewLog>,
    remote: Arc<dyn RemoteChannels>,
    shuffle: Arc<LocalShuffle>,
    slots: Mutex<Vec<BTreeSet<u64>>>,
    tasks: Mutex<HashMap<u64, Vec<RunningTask>>>,
    masters: Mutex<HashMap<u64, Arc<dyn JobMasterGateway>>>,
    /// The state backend of each running stateful task.
    backends: Mutex<HashMap<TaskId, Arc<KeyedStateBackend>>>,
    /// Checkpoint storage of each job, as its deployments name it.
    storage: Mutex<HashMap<u64, Arc<CheckpointStorage>>>,
    hardware: HardwareDescription,
    me: Weak<TaskExecutor>,
}

impl std::fmt::Debug for TaskExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskExecutor")
            .field("resource_id", &self.resource_id)
            .finish()
    }
}

fn poisoned() -> ClusterError {
    ClusterError::Internal("task executor lock poisoned".into())
}

impl TaskExecutor {
    /// Creates a TaskExecutor with one empty slot per state store.
    pub fn new(services: TaskExecutorServices, config: &ClusterConfig) -> Arc<Self> {
        let slots = services.slot_memory.len();
        Arc::new_cyclic(|me| TaskExecutor {
            resource_id: services.resource_id,
            address: services.address,
            state_dir: services.state_dir,
            slot_memory: services.slot_memory,
            tables: services.tables,
            views: services.views,
            remote: services.remote,
            shuffle: Arc::new(LocalShuffle::default()),
            slots: Mutex::new(vec![BTreeSet::new(); slots]),
            backends: Mutex::new(HashMap::new()),
            storage: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            masters: Mutex::new(HashMap::new()),
            hardware: HardwareDescription {
                cpu_cores: std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1),
                managed_memory_bytes: config.managed_memory_bytes,
            },
            me: me.clone(),
        })
    }

    /// The shuffle of this TaskManager (served over RPC by the cluster).
    pub fn shuffle(&self) -> &Arc<LocalShuffle> {
        &self.shuffle
    }

    /// The state backends of `job`'s tasks here.
    fn backends_of(&self, job: u64) -> Result<Vec<Arc<KeyedStateBackend>>> {
        Ok(self
            .backends
            .lock()
            .map_err(|_| poisoned())?
            .iter()
            .filter(|(t, _)| t.job == job)
            .map(|(_, b)| b.clone())
            .collect())
    }

    /// Drops `job`'s state backends, deleting their local state.
    /// The backends holding `table` in (part of) `key_groups`, each with
    /// its part.
    #[allow(clippy::type_complexity)]
    fn holders(
        &self,
        table: u64,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<(Arc<KeyedStateBackend>, std::ops::Range<u16>)>> {
        Ok(self
            .backends
            .lock()
            .map_err(|_| poisoned())?
            .values()
            .filter_map(|b| {
                let t = b.tables().iter().find(|t| t.table == table)?;
                let from = t.key_groups.start.max(key_groups.start);
                let to = t.key_groups.end.min(key_groups.end);
                (from < to).then(|| (b.clone(), from..to))
            })
            .collect())
    }

    fn drop_backends(&self, job: u64) -> Result<()> {
        let dropped: Vec<_> = {
            let mut backends = self.backends.lock().map_err(|_| poisoned())?;
            let ids: Vec<TaskId> = backends.keys().filter(|t| t.job == job).cloned().collect();
            ids.iter().filter_map(|t| backends.remove(t)).collect()
        };
        drop(dropped);
        self.storage.lock().map_err(|_| poisoned())?.remove(&job);
        Ok(())
    }

    fn storage_of(&self, job: u64) -> Option<Arc<CheckpointStorage>> {
        self.storage.lock().ok()?.get(&job).cloned()
    }

    /// Registers with the ResourceManager — retrying with back-off, for at
    /// most `registration_timeout` — and returns once registered.
    pub async fn register(
        self: &Arc<Self>,
        rm: &Arc<dyn ResourceManagerGateway>,
        config: &ClusterConfig,
    ) -> Result<String> {
        let started = Instant::now();
        let mut backoff = Duration::from_millis(100);
        loop {
            let registration = TaskExecutorRegistration {
                resource_id: self.resource_id.clone(),
                address: self.address.clone(),
                hardware: self.hardware.clone(),
                slots: self.slot_report()?,
            };
            match rm.register_task_executor(registration, self.clone()).await {
                Ok(id) => {
                    tracing::info!(resource_id = %self.resource_id, job_manager = %id, "registered at the resource manager");
                    return Ok(id);
                }
                Err(e) => {
                    if started.elapsed() >= config.registration_timeout {
                        return Err(ClusterError::RegistrationTimeout {
                            timeout: config.registration_timeout,
                            error: e.to_string(),
                        });
                    }
                    tracing::warn!(error = %e, retry_in = ?backoff, "registration at the resource manager failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Registers, then heartbeats for as long as the TaskManager lives;
    /// registers again whenever the ResourceManager loses it. Returns only
    /// when a registration times out.
    pub async fn connect(
        self: Arc<Self>,
        rm: Arc<dyn ResourceManagerGateway>,
        config: ClusterConfig,
    ) -> Result<()> {
        loop {
            self.register(&rm, &config).await?;
            let mut last_ok = Instant::now();
            // The first heartbeat goes at once: it opens the heartbeat
            // stream, whose breaking tells the JobManager at once that this
            // process is gone.
            let mut first = true;
            loop {
                if !std::mem::take(&mut first) {
                    tokio::time::sleep(config.heartbeat_interval).await;
                }
                let report = self.slot_report()?;
                match rm
                    .heartbeat_from_task_executor(&self.resource_id, report)
                    .await
                {
                    Ok(()) => last_ok = Instant::now(),
                    Err(ClusterError::UnknownTaskManager(_)) => {
                        tracing::warn!(
                            "the resource manager does not know this task manager; registering again"
                        );
                        break;
                    }
                    Err(e) if last_ok.elapsed() > config.heartbeat_timeout => {
                        tracing::warn!(error = %e, "job manager unreachable past the heartbeat timeout; registering again");
                        break;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat to the resource manager failed")
                    }
                }
            }
            // The JobManager lost us or we lost it: whatever ran here is
            // being restarted elsewhere.
            self.cancel_all().await;
        }
    }

    /// Creates an in-process TaskExecutor, registers it with `rm` and keeps
    /// it connected (the playground's TaskManager).
    pub async fn start(
        services: TaskExecutorServices,
        config: &ClusterConfig,
        rm: Arc<dyn ResourceManagerGateway>,
    ) -> Result<Arc<Self>> {
        let te = Self::new(services, config);
        te.register(&rm, config).await?;
        // Weak: the ResourceManager holds this TaskExecutor, so a strong
        // reference here would keep both alive for ever.
        let weak = Arc::downgrade(&te);
        let rm = Arc::downgrade(&rm);
        let interval = config.heartbeat_interval;
        let config = config.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let (Some(te), Some(rm)) = (weak.upgrade(), rm.upgrade()) else {
                    break;
                };
                let Ok(report) = te.slot_report() else { break };
                match rm
                    .heartbeat_from_task_executor(&te.resource_id, report)
                    .await
                {
                    Ok(()) => {}
                    // Declared lost (its heartbeats were late): what ran
                    // here is being restarted; offer the slots again, as
                    // a TaskManager in its own process does.
                    Err(ClusterError::UnknownTaskManager(_)) => {
                        tracing::warn!(
                            "the resource manager does not know this task manager; registering again"
                        );
                        te.cancel_all().await;
                        if let Err(e) = te.register(&rm, &config).await {
                            tracing::error!(error = %e, "registering again failed");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "heartbeat to the resource manager failed")
                    }
                }
            }
        });
        Ok(te)
    }

    /// Cancels every job and frees every slot.
    async fn cancel_all(&self) {
        let mut jobs: BTreeSet<u64> = match self.tasks.lock() {
            Ok(t) => t.keys().copied().collect(),
            Err(_) => return,
        };
        if let Ok(b) = self.backends.lock() {
            jobs.extend(b.keys().map(|t| t.job));
        }
        for job in jobs {
            let _ = self.cancel_job(job).await;
        }
        if let Ok(mut slots) = self.slots.lock() {
            for jobs in slots.iter_mut() {
                jobs.clear();
            }
        }
    }

    fn slot_report(&self) -> Result<SlotReport> {
        let slots = self.slots.lock().map_err(|_| poisoned())?;
        Ok(SlotReport {
            slots: slots
                .iter()
                .enumerate()
                .map(|(i, jobs)| SlotStatus {
                    slot: SlotId {
                        task_manager: self.resource_id.clone(),
                        index: i,
                    },
                    jobs: jobs.iter().copied().collect(),
                    memory_used: self
                        .slot_memory
                        .get(i)
                        .map(|m| SlotMemoryUsed {
                            operators: m.operators().used() as u64,
                            rocksdb: m.rocksdb_usage() as u64,
                        })
                        .unwrap_or_default(),
                })
                .collect(),
        })
    }

    fn master(&self, job: u64) -> Option<Arc<dyn JobMasterGateway>> {
        self.masters.lock().ok()?.get(&job).cloned()
    }

    fn send(&self, job: u64, pick: impl Fn(&TaskId) -> bool, cmd: TaskCommand) -> Result<()> {
        let tasks = self.tasks.lock().map_err(|_| poisoned())?;
        for t in tasks
            .get(&job)
            .into_iter()
            .flatten()
            .filter(|t| pick(&t.id))
        {
            // A task that already ended has dropped its receiver; nothing to tell it.
            let _ = t.commands.send(cmd.clone());
        }
        Ok(())
    }

    /// Slot `slot`'s managed memory.
    fn slot_memory(&self, slot: usize) -> Result<&SlotMemory> {
        self.slot_memory
            .get(slot)
            .ok_or_else(|| ClusterError::Internal(format!("no slot {slot}")))
    }

    /// Creates a stateful task's backend and fills it from the checkpoint
    /// its deployment names; `None` for a stateless task.
    async fn restore_state(
        &self,
        deployment: &TaskDeployment,
    ) -> Result<Option<Arc<KeyedStateBackend>>> {
        let id = &deployment.id;
        let graph = &deployment.graph;
        let tables = crate::jobmaster::vertex_tables(graph, id.vertex);
        if tables.is_empty() {
            return Ok(None);
        }
        let memory = self.slot_memory(deployment.slot)?;
        let parallelism = graph.vertices[id.vertex].parallelism;
        let key_groups = key_group_range(id.subtask, parallelism);
        let storage = match self.storage_of(id.job) {
            Some(s) if s.location() == deployment.checkpoint_storage => s,
            _ => {
                let s = Arc::new(CheckpointStorage::open(&deployment.checkpoint_storage)?);
                self.storage
                    .lock()
                    .map_err(|_| poisoned())?
                    .insert(id.job, s.clone());
                s
            }
        };
        let dir = self.state_dir.join(format!(
            "slot-{}/job-{}-{}-{}-{}",
            deployment.slot, id.job, id.vertex, id.subtask, id.attempt
        ));
        let mut backend = KeyedStateBackend::create(
            dir,
            memory,
            (id.vertex, id.subtask),
            tables
                .into_iter()
                .map(|table| TableRange {
                    table,
                    key_groups: key_groups.clone(),
                })
                .collect(),
        )?;
        if let Some(restore) = &deployment.restore {
            let restored = backend
                .restore(&storage, restore.checkpoint, &restore.handles)
                .await
                .map_err(|e| match e {
                    storage::StorageError::Corrupt(why) => ClusterError::CorruptCheckpoint(why),
                    e => e.into(),
                })?;
            tracing::debug!(task = %id, checkpoint = restore.checkpoint, entries_copied = restored, "state restored");
        }
        let backend = Arc::new(backend);
        self.backends
            .lock()
            .map_err(|_| poisoned())?
            .insert(id.clone(), backend.clone());
        Ok(Some(backend))
    }
}

impl TaskReporter for TaskExecutor {
    fn acknowledge_checkpoint(&self, task: &TaskId, mut ack: CheckpointAck) {
        let Some(master) = self.master(task.job) else {
            return;
        };
        let backend = self.backends.lock().ok().and_then(|b| b.get(task).cloned());
        let Some(backend) = backend else {
            master.acknowledge_checkpoint(task, ack);
            return;
        };
        let id = ack.checkpoint_id;
        let task = task.clone();
        let decline = move |mut ack: CheckpointAck, task: &TaskId, e: storage::StorageError| {
            tracing::error!(task = %task, checkpoint = id, error = %e, "snapshot failed");
            ack.declined = Some(executor::classify_storage(&e));
            ack
        };
        // Synchronous part, on the task: its changes in, a RocksDB checkpoint out.
        let snapshot = match backend.snapshot(id, std::mem::take(&mut ack.writes)) {
            Ok(s) => s,
            Err(SnapshotError::Declined(e)) => {
                return master.acknowledge_checkpoint(&task, decline(ack, &task, e));
            }
            Err(lost @ SnapshotError::Lost(_)) => {
                // Its state no longer matches its operators: restart the
                // job from the last completed checkpoint.
                tracing::error!(task = %task, checkpoint = id, error = %lost, "state backend lost changes");
                let e = storage::StorageError::Internal(lost.to_string());
                master.acknowledge_checkpoint(&task, decline(ack, &task, e));
                master.update_task_execution_state(
                    &task,
                    ExecutionState::Failed,
                    Some(lost_failure(&lost)),
                );
                return;
            }
        };
        for s in &mut ack.state_stats {
            s.bytes_on_disk = backend.disk_bytes(s.table).unwrap_or(0);
        }
        let Some(storage) = self.storage_of(task.job) else {
            let e = storage::StorageError::Internal("no checkpoint storage".into());
            return master.acknowledge_checkpoint(&task, decline(ack, &task, e));
        };
        // Asynchronous part: the task goes on while the files are copied.
        tokio::spawn(async move {
            let ack = match backend.upload(&storage, task.job, id, &snapshot).await {
                Ok(handle) => CheckpointAck {
                    state: Some(handle),
                    ..ack
                },
                Err(e) => decline(ack, &task, e),
            };
            master.acknowledge_checkpoint(&task, ack);
        });
    }

    fn state_changed(&self, task: &TaskId, state: ExecutionState, error: Option<Failure>) {
        if let Some(m) = self.master(task.job) {
            m.update_task_execution_state(task, state, error);
        }
    }
}

/// A backend that lost its changes fails its task; a full disk stays a
/// full disk (the restart strategy waits it out).
fn lost_failure(lost: &SnapshotError) -> Failure {
    let kind = match lost {
        SnapshotError::Lost(e) | SnapshotError::Declined(e) => executor::classify_storage(e).kind,
    };
    Failure::new(kind, lost.to_string())
}

#[async_trait]
impl TaskExecutorGateway for TaskExecutor {
    fn resource_id(&self) -> ResourceId {
        self.resource_id.clone()
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    async fn request_slot(
        &self,
        slot: SlotId,
        job: u64,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()> {
        {
            let mut slots = self.slots.lock().map_err(|_| poisoned())?;
            let jobs = slots
                .get_mut(slot.index)
                .ok_or_else(|| ClusterError::Internal(format!("no slot {slot}")))?;
            jobs.insert(job);
        }
        let accepted = job_master.offer_slots(job, vec![slot.clone()]).await;
        if !matches!(&accepted, Ok(a) if a.contains(&slot)) {
            if let Some(jobs) = self
                .slots
                .lock()
                .map_err(|_| poisoned())?
                .get_mut(slot.index)
            {
                jobs.remove(&job);
            }
            return Err(ClusterError::Internal(format!(
                "job {job} declined slot {slot}: {}",
                accepted.err().map(|e| e.to_string()).unwrap_or_default()
            )));
        }
        Ok(())
    }

    async fn free_slots(&self, job: u64) -> Result<()> {
        for jobs in self.slots.lock().map_err(|_| poisoned())?.iter_mut() {
            jobs.remove(&job);
        }
        Ok(())
    }

    async fn submit_task(
        &self,
        deployment: TaskDeployment,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()> {
        let me = self
            .me
            .upgrade()
            .ok_or_else(|| ClusterError::Internal("task executor gone".into()))?;
        let backend = self.restore_state(&deployment).await?;
        self.masters
            .lock()
            .map_err(|_| poisoned())?
            .insert(deployment.id.job, job_master);
        let memory = self.slot_memory(deployment.slot)?.operators().clone();
        let env = TaskEnvironment {
            tables: self.tables.clone(),
            views: self.views.clone(),
            state: Arc::new(BackendReader(backend)),
            memory,
            shuffle: self.shuffle.clone(),
            remote: self.remote.clone(),
            address: self.address.clone(),
            reporter: me.clone(),
        };
        let (task, commands) = build_task(&deployment, &env)?;
        let id = deployment.id.clone();
        let span = tracing::info_span!(
            "task",
            job = id.job,
            vertex = id.vertex,
            subtask = id.subtask,
            attempt = id.attempt
        );
        let task_id = id.clone();
        let handle = crate::task_runtime::handle().spawn(
            async move {
                // A panicking operator fails its task like an error does.
                if AssertUnwindSafe(task.run()).catch_unwind().await.is_err() {
                    tracing::error!(task = %task_id, "task panicked");
                    me.state_changed(
                        &task_id,
                        ExecutionState::Failed,
                        Some(Failure::internal("task panicked")),
                    );
                }
            }
            .instrument(span),
        );
        self.tasks
            .lock()
            .map_err(|_| poisoned())?
            .entry(id.job)
            .or_default()
            .push(RunningTask {
                attempt: id.attempt,
                id,
                commands,
                handle,
            });
        Ok(())
    }

    async fn cancel_job(&self, job: u64) -> Result<()> {
        // The JobMaster holds the ResourceManager, which holds this
        // TaskExecutor: forget it, or neither is ever freed.
        self.masters.lock().map_err(|_| poisoned())?.remove(&job);
        let tasks = self
            .tasks
            .lock()
            .map_err(|_| poisoned())?
            .remove(&job)
            .unwrap_or_default();
        let mut attempts = BTreeSet::new();
        for t in &tasks {
            // Abort rather than ask: a task may be waiting on a full channel.
            t.handle.abort();
            attempts.insert(t.attempt);
        }
        for t in tasks {
            let _ = t.handle.await;
        }
        for attempt in attempts {
            self.shuffle.release(job, attempt);
        }
        // Local state lives as long as the tasks: a redeployment, here or
        // elsewhere, restores from checkpoint storage.
        self.drop_backends(job)
    }

    async fn trigger_checkpoint(&self, task: TaskId, barrier: Barrier) -> Result<()> {
        self.send(
            task.job,
            |t| *t == task,
            TaskCommand::TriggerCheckpoint(barrier),
        )
    }

    async fn notify_checkpoint_complete(&self, job: u64, checkpoint_id: u64) -> Result<()> {
        for backend in self.backends_of(job)? {
            backend.complete(checkpoint_id)?;
        }
        self.send(
            job,
            |_| true,
            TaskCommand::NotifyCheckpointComplete(checkpoint_id),
        )
    }

    async fn abort_checkpoint(&self, job: u64, checkpoint_id: u64) -> Result<()> {
        for backend in self.backends_of(job)? {
            backend.abort(checkpoint_id)?;
        }
        Ok(())
    }

    async fn drop_job_state(&self, job: u64, _tables: Vec<u64>) -> Result<()> {
        self.masters.lock().map_err(|_| poisoned())?.remove(&job);
        self.drop_backends(job)
    }

    async fn scan_view(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<RecordBatch>> {
        use futures::TryStreamExt;
        self.scan_view_stream(state_table, schema, key_groups)
            .await?
            .try_collect()
            .await
    }

    async fn scan_view_stream(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<ViewStream> {
        // Rows a page holds: a few MiB of them at a time.
        const PAGE: usize = 16_384;
        let mut views = Vec::new();
        for (backend, range) in self.holders(state_table, key_groups)? {
            // Before its first completed checkpoint a view is empty.
            if let Some(view) = backend.read_view()? {
                views.push((view, range));
            }
        }
        let (tx, rx) = mpsc::channel::<Result<RecordBatch>>(2);
        tokio::task::spawn_blocking(move || {
            for (view, range) in views {
                let mut cursor = None;
                loop {
                    let page = executor::operators::materialize::read_view_page(
                        &*view,
                        state_table,
                        &schema,
                        range.clone(),
                        cursor,
                        PAGE,
                    );
                    let (batches, next) = match page {
                        Ok(page) => page,
                        Err(e) => {
                            let _ = tx.blocking_send(Err(e.into()));
                            return;
                        }
                    };
                    for batch in batches {
                        if tx.blocking_send(Ok(batch)).is_err() {
                            // The reader is gone.
                            return;
                        }
                    }
                    match next {
                        Some(next) => cursor = Some(next),
                        None => break,
                    }
                }
            }
        });
        Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
    }

    async fn scan_changes(
        &self,
        changelog_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
        since: u64,
    ) -> Result<ChangeStream> {
        let backends = self.holders(changelog_table, key_groups)?;
        // Pin each backend's checkpoint and read its horizons now; the
        // changes as the stream is polled.
        let readers = tokio::task::spawn_blocking(move || {
            let mut readers = Vec::new();
            for (backend, range) in backends {
                if let Some(view) = backend.read_view()? {
                    let reader = changelog::ChangeReader::open(
                        &*view,
                        changelog_table,
                        &schema,
                        range,
                        since,
                    )?;
                    readers.push((view, reader));
                }
            }
            Ok::<_, executor::ExecError>(readers)
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))??;
        let horizon = readers.iter().map(|(_, r)| r.horizon()).max().unwrap_or(0);
        // From before the horizon of any part: refused, nothing read.
        let streams = match since < horizon {
            true => Vec::new(),
            false => readers
                .into_iter()
                .map(|(view, reader)| crate::changes::pages(view, reader, ()))
                .collect(),
        };
        Ok(ChangeStream {
            horizon,
            batches: crate::changes::merge_by_epoch(streams),
        })
    }
}

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
//! Deploying a task first restores its state: the first task of a job
//! attempt clears the job's local state, and every task downloads its
//! operators' state tables in its key groups from the JobManager's
//! checkpoint storage. Cancelling a job deletes its local copy: it lives as
//! long as the job's tasks run here. Tasks report to it through [`TaskReporter`]; it
//! stages their checkpoint writes locally, forwards them with the
//! acknowledgement to the job's JobMaster, and commits the local copy when
//! the JobMaster says the checkpoint is complete. The local copy is what
//! the view-scan service reads.
//!
//! Managed memory: each slot has its own RocksDB instance, opened with an
//! equal share of the TaskManager's managed memory for its block cache and
//! write buffers, and the tasks of a slot keep their state there — a slot's
//! state cannot crowd out another's.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::exchange::LocalShuffle;
use executor::message::Barrier;
use executor::operator::StateReader;
use executor::task::{
    CheckpointAck, RemoteChannels, TableLog, TaskCommand, TaskDeployment, TaskEnvironment, TaskId,
    TaskReporter, build_task,
};
use futures::FutureExt;
use planner::execution_graph::{ExecutionState, SlotId};
use std::panic::AssertUnwindSafe;
use storage::keys::key_group_range;
use storage::state::{StateEntry, StateStore};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::config::ClusterConfig;
use crate::gateway::{
    HardwareDescription, JobMasterGateway, ResourceId, ResourceManagerGateway, SlotReport,
    SlotStatus, TaskExecutorGateway, TaskExecutorRegistration,
};
use crate::{ClusterError, Result};

struct RunningTask {
    id: TaskId,
    attempt: u64,
    commands: mpsc::UnboundedSender<TaskCommand>,
    handle: JoinHandle<()>,
}

/// Reads committed operator state for restoring tasks.
struct StoreReader(Arc<StateStore>);

impl StateReader for StoreReader {
    fn scan(
        &self,
        table: u64,
        key_groups: std::ops::Range<u16>,
    ) -> executor::Result<Vec<StateEntry>> {
        Ok(self.0.scan(table, key_groups)?)
    }
}

/// What a TaskManager is made of, besides its slots and tasks.
pub struct TaskExecutorServices {
    pub resource_id: ResourceId,
    /// Where this TaskManager serves its shuffle (and TaskExecutor RPC).
    pub address: String,
    /// One local state store per slot, each with its share of memory.
    pub state: Vec<Arc<StateStore>>,
    pub tables: Arc<dyn TableLog>,
    pub remote: Arc<dyn RemoteChannels>,
}

/// A TaskManager.
pub struct TaskExecutor {
    resource_id: ResourceId,
    address: String,
    state: Vec<Arc<StateStore>>,
    tables: Arc<dyn TableLog>,
    remote: Arc<dyn RemoteChannels>,
    shuffle: Arc<LocalShuffle>,
    slots: Mutex<Vec<BTreeSet<u64>>>,
    tasks: Mutex<HashMap<u64, Vec<RunningTask>>>,
    masters: Mutex<HashMap<u64, Arc<dyn JobMasterGateway>>>,
    /// The slot of each running task, for its checkpoint writes.
    task_slots: Mutex<HashMap<TaskId, usize>>,
    /// The attempt of each job whose state this TaskManager holds.
    /// For every job whose state this TaskManager holds: the attempt it
    /// was restored for and the job's state tables.
    prepared: tokio::sync::Mutex<HashMap<u64, (u64, Vec<u64>)>>,
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
        let slots = services.state.len();
        Arc::new_cyclic(|me| TaskExecutor {
            resource_id: services.resource_id,
            address: services.address,
            state: services.state,
            tables: services.tables,
            remote: services.remote,
            shuffle: Arc::new(LocalShuffle::default()),
            slots: Mutex::new(vec![BTreeSet::new(); slots]),
            task_slots: Mutex::new(HashMap::new()),
            tasks: Mutex::new(HashMap::new()),
            masters: Mutex::new(HashMap::new()),
            prepared: tokio::sync::Mutex::new(HashMap::new()),
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

    fn store(&self, slot: usize) -> Result<Arc<StateStore>> {
        self.state
            .get(slot)
            .cloned()
            .ok_or_else(|| ClusterError::Internal(format!("no slot {slot}")))
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
            loop {
                tokio::time::sleep(config.heartbeat_interval).await;
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
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let (Some(te), Some(rm)) = (weak.upgrade(), rm.upgrade()) else {
                    break;
                };
                let Ok(report) = te.slot_report() else { break };
                if let Err(e) = rm
                    .heartbeat_from_task_executor(&te.resource_id, report)
                    .await
                {
                    tracing::warn!(error = %e, "heartbeat to the resource manager failed");
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
        jobs.extend(self.prepared.lock().await.keys().copied());
        for job in jobs {
            let _ = self.cancel_job(job).await;
        }
        if let Ok(mut slots) = self.slots.lock() {
            for jobs in slots.iter_mut() {
                jobs.clear();
            }
        }
    }

    /// Deletes a job's local state in every slot's store.
    async fn drop_local_state(&self, job: u64, tables: Vec<u64>) -> Result<()> {
        let stores = self.state.clone();
        tokio::task::spawn_blocking(move || {
            stores.iter().try_for_each(|s| s.drop_job(job, &tables))
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))??;
        Ok(())
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

    /// Puts the state a task restores from into the local store: on the
    /// first task of a job attempt, clear the job's local state; then
    /// download the task's state tables in its key groups.
    async fn restore_state(
        &self,
        deployment: &TaskDeployment,
        job_master: &Arc<dyn JobMasterGateway>,
    ) -> Result<()> {
        let job = deployment.id.job;
        let graph = &deployment.graph;
        {
            let mut prepared = self.prepared.lock().await;
            if prepared.get(&job).map(|(a, _)| *a) != Some(deployment.id.attempt) {
                let tables = graph.stream.state_tables();
                self.drop_local_state(job, tables.clone()).await?;
                prepared.insert(job, (deployment.id.attempt, tables));
            }
        }
        let vertex = graph
            .vertices
            .get(deployment.id.vertex)
            .ok_or_else(|| ClusterError::Internal(format!("no vertex {}", deployment.id.vertex)))?;
        let tables: Vec<u64> = vertex
            .nodes
            .iter()
            .flat_map(|n| graph.stream.nodes[*n].spec.state_tables())
            .collect();
        if tables.is_empty() {
            return Ok(());
        }
        let key_groups = key_group_range(deployment.id.subtask, vertex.parallelism);
        let entries = job_master
            .read_checkpoint_state(job, tables, key_groups)
            .await?;
        let restored = entries.len();
        let state = self.store(deployment.slot)?;
        tokio::task::spawn_blocking(move || state.import(entries))
            .await
            .map_err(|e| ClusterError::Internal(e.to_string()))??;
        tracing::debug!(task = %deployment.id, entries = restored, "state restored");
        Ok(())
    }
}

impl TaskReporter for TaskExecutor {
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck) {
        let Some(master) = self.master(task.job) else {
            return;
        };
        let slot = self
            .task_slots
            .lock()
            .ok()
            .and_then(|s| s.get(task).copied());
        let staged = match slot.map(|s| self.store(s)) {
            Some(Ok(store)) => store.stage(task.job, ack.checkpoint_id, ack.writes.clone()),
            _ => Err(storage::StorageError::Internal(format!(
                "{task} has no slot"
            ))),
        };
        if let Err(e) = staged {
            tracing::error!(task = %task, error = %e, "staging checkpoint state failed");
            master.update_task_execution_state(task, ExecutionState::Failed, Some(e.to_string()));
            return;
        }
        master.acknowledge_checkpoint(task, ack);
    }

    fn state_changed(&self, task: &TaskId, state: ExecutionState, error: Option<String>) {
        if let Some(m) = self.master(task.job) {
            m.update_task_execution_state(task, state, error);
        }
    }
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
        self.restore_state(&deployment, &job_master).await?;
        self.masters
            .lock()
            .map_err(|_| poisoned())?
            .insert(deployment.id.job, job_master);
        let env = TaskEnvironment {
            tables: self.tables.clone(),
            state: Arc::new(StoreReader(self.store(deployment.slot)?)),
            shuffle: self.shuffle.clone(),
            remote: self.remote.clone(),
            address: self.address.clone(),
            reporter: me.clone(),
        };
        let (task, commands) = build_task(&deployment, &env)?;
        let id = deployment.id.clone();
        self.task_slots
            .lock()
            .map_err(|_| poisoned())?
            .insert(id.clone(), deployment.slot);
        let span = tracing::info_span!(
            "task",
            job = id.job,
            vertex = id.vertex,
            subtask = id.subtask,
            attempt = id.attempt
        );
        let task_id = id.clone();
        let handle = tokio::spawn(
            async move {
                // A panicking operator fails its task like an error does.
                if AssertUnwindSafe(task.run()).catch_unwind().await.is_err() {
                    tracing::error!(task = %task_id, "task panicked");
                    me.state_changed(
                        &task_id,
                        ExecutionState::Failed,
                        Some("task panicked".into()),
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
        self.task_slots
            .lock()
            .map_err(|_| poisoned())?
            .retain(|t, _| t.job != job);
        for store in &self.state {
            store.discard_staged(job)?;
        }
        // The local copy lives as long as the tasks: a redeployment, here
        // or elsewhere, restores from the checkpoint storage.
        let held = self.prepared.lock().await.remove(&job);
        if let Some((_, tables)) = held {
            self.drop_local_state(job, tables).await?;
        }
        Ok(())
    }

    async fn trigger_checkpoint(&self, task: TaskId, barrier: Barrier) -> Result<()> {
        self.send(
            task.job,
            |t| *t == task,
            TaskCommand::TriggerCheckpoint(barrier),
        )
    }

    async fn notify_checkpoint_complete(&self, job: u64, checkpoint_id: u64) -> Result<()> {
        // The stores of the slots that run the job's tasks.
        let stores: Vec<Arc<StateStore>> = {
            let slots: BTreeSet<usize> = self
                .task_slots
                .lock()
                .map_err(|_| poisoned())?
                .iter()
                .filter(|(t, _)| t.job == job)
                .map(|(_, s)| *s)
                .collect();
            slots
                .into_iter()
                .filter_map(|s| self.state.get(s).cloned())
                .collect()
        };
        tokio::task::spawn_blocking(move || {
            stores.iter().try_for_each(|s| s.commit(job, checkpoint_id))
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))??;
        self.send(
            job,
            |_| true,
            TaskCommand::NotifyCheckpointComplete(checkpoint_id),
        )
    }

    async fn abort_checkpoint(&self, job: u64, _checkpoint_id: u64) -> Result<()> {
        for store in &self.state {
            store.discard_staged(job)?;
        }
        Ok(())
    }

    async fn drop_job_state(&self, job: u64, tables: Vec<u64>) -> Result<()> {
        self.masters.lock().map_err(|_| poisoned())?.remove(&job);
        self.prepared.lock().await.remove(&job);
        self.drop_local_state(job, tables).await
    }

    async fn scan_view(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<RecordBatch>> {
        // Only the slot that runs the subtask holds these key groups.
        let stores = self.state.clone();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            for store in &stores {
                out.extend(executor::operators::materialize::read_view(
                    store,
                    state_table,
                    &schema,
                    key_groups.clone(),
                )?);
            }
            Ok::<_, executor::ExecError>(out)
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))?
        .map_err(Into::into)
    }
}

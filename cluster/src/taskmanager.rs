//! The TaskExecutor: a TaskManager's slot table, its running tasks and its
//! state store.
//!
//! Start-up follows Flink's TaskExecutor: register with the ResourceManager
//! (resource id, address, hardware, slot report), retrying with back-off,
//! then heartbeat. Tasks report to it through [`TaskReporter`]; it stages
//! their checkpoint state and forwards acknowledgements to the job's
//! JobMaster, and commits the staged state when the JobMaster says the
//! checkpoint is complete.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::exchange::LocalShuffle;
use executor::message::Barrier;
use executor::operator::StateReader;
use executor::task::{
    SourcePosition, TaskCommand, TaskDeployment, TaskEnvironment, TaskId, TaskReporter, build_task,
};
use futures::FutureExt;
use planner::execution_graph::{ExecutionState, SlotId};
use std::panic::AssertUnwindSafe;
use storage::state::{StateEntry, StateStore, StateWrite};
use storage::table::TableStore;
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

/// A TaskManager.
pub struct TaskExecutor {
    resource_id: ResourceId,
    state: Arc<StateStore>,
    tables: Arc<TableStore>,
    shuffle: Arc<LocalShuffle>,
    slots: Mutex<Vec<BTreeSet<u64>>>,
    tasks: Mutex<HashMap<u64, Vec<RunningTask>>>,
    masters: Mutex<HashMap<u64, Arc<dyn JobMasterGateway>>>,
    me: Weak<TaskExecutor>,
}

impl std::fmt::Debug for TaskExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TaskExecutor")
            .field("resource_id", &self.resource_id)
            .finish()
    }
}

fn me_for_panic(me: &Weak<TaskExecutor>) -> Result<Arc<TaskExecutor>> {
    me.upgrade()
        .ok_or_else(|| ClusterError::Internal("task executor gone".into()))
}

fn poisoned() -> ClusterError {
    ClusterError::Internal("task executor lock poisoned".into())
}

impl TaskExecutor {
    /// Creates the TaskExecutor, registers it with `rm` and starts its
    /// heartbeats.
    pub async fn start(
        resource_id: ResourceId,
        config: &ClusterConfig,
        rm: Arc<dyn ResourceManagerGateway>,
        state: Arc<StateStore>,
        tables: Arc<TableStore>,
    ) -> Result<Arc<Self>> {
        let te = Arc::new_cyclic(|me| TaskExecutor {
            resource_id,
            state,
            tables,
            shuffle: Arc::new(LocalShuffle::default()),
            slots: Mutex::new(vec![BTreeSet::new(); config.slots_per_task_manager]),
            tasks: Mutex::new(HashMap::new()),
            masters: Mutex::new(HashMap::new()),
            me: me.clone(),
        });
        let registration = TaskExecutorRegistration {
            resource_id: te.resource_id.clone(),
            address: "in-process".into(),
            hardware: HardwareDescription {
                cpu_cores: std::thread::available_parallelism()
                    .map(|n| n.get())
                    .unwrap_or(1),
                managed_memory_bytes: config.managed_memory_bytes,
            },
            slots: te.slot_report()?,
        };
        let mut backoff = Duration::from_millis(100);
        loop {
            match rm
                .register_task_executor(registration.clone(), te.clone())
                .await
            {
                Ok(()) => break,
                Err(e) => {
                    tracing::warn!(error = %e, retry_in = ?backoff, "registration with the resource manager failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        let weak = Arc::downgrade(&te);
        // Weak: the ResourceManager holds this TaskExecutor, so a strong
        // reference here would keep both alive for ever.
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
}

impl TaskReporter for TaskExecutor {
    fn acknowledge_checkpoint(
        &self,
        task: &TaskId,
        checkpoint_id: u64,
        writes: Vec<StateWrite>,
        positions: Vec<SourcePosition>,
    ) {
        if let Err(e) = self.state.stage(task.job, checkpoint_id, writes) {
            tracing::error!(task = %task, error = %e, "staging checkpoint state failed");
            if let Some(m) = self.master(task.job) {
                m.update_task_execution_state(task, ExecutionState::Failed, Some(e.to_string()));
            }
            return;
        }
        if let Some(m) = self.master(task.job) {
            m.acknowledge_checkpoint(task, checkpoint_id, positions);
        }
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

    async fn request_slot(&self, slot: SlotId, job: u64) -> Result<()> {
        let mut slots = self.slots.lock().map_err(|_| poisoned())?;
        let jobs = slots
            .get_mut(slot.index)
            .ok_or_else(|| ClusterError::Internal(format!("no slot {slot}")))?;
        jobs.insert(job);
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
        self.masters
            .lock()
            .map_err(|_| poisoned())?
            .insert(deployment.id.job, job_master);
        let env = TaskEnvironment {
            tables: self.tables.clone(),
            state: Arc::new(StoreReader(self.state.clone())),
            shuffle: self.shuffle.clone(),
            reporter: me,
        };
        let (task, commands) = build_task(&deployment, &env)?;
        let id = deployment.id.clone();
        let span = tracing::info_span!(
            "task",
            job = id.job,
            vertex = id.vertex,
            subtask = id.subtask
        );
        let reporter = me_for_panic(&self.me)?;
        let task_id = id.clone();
        let handle = tokio::spawn(
            async move {
                // A panicking operator fails its task like an error does.
                if AssertUnwindSafe(task.run()).catch_unwind().await.is_err() {
                    tracing::error!(task = %task_id, "task panicked");
                    reporter.state_changed(
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
                id,
                attempt: deployment.attempt,
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
        self.state.discard_staged(job)?;
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
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || state.commit(job, checkpoint_id))
            .await
            .map_err(|e| ClusterError::Internal(e.to_string()))??;
        self.send(
            job,
            |_| true,
            TaskCommand::NotifyCheckpointComplete(checkpoint_id),
        )
    }

    async fn abort_checkpoint(&self, job: u64, _checkpoint_id: u64) -> Result<()> {
        Ok(self.state.discard_staged(job)?)
    }

    async fn committed_checkpoint(&self, job: u64) -> Result<Option<u64>> {
        Ok(self.state.committed_checkpoint(job)?)
    }

    async fn drop_job_state(&self, job: u64, tables: Vec<u64>) -> Result<()> {
        self.masters.lock().map_err(|_| poisoned())?.remove(&job);
        Ok(self.state.drop_job(job, &tables)?)
    }

    async fn scan_view(&self, state_table: u64, schema: SchemaRef) -> Result<Vec<RecordBatch>> {
        let state = self.state.clone();
        tokio::task::spawn_blocking(move || {
            executor::operators::materialize::read_view(&state, state_table, &schema)
        })
        .await
        .map_err(|e| ClusterError::Internal(e.to_string()))?
        .map_err(Into::into)
    }
}

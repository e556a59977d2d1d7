//! The ResourceManager and its slot manager: which TaskManagers are
//! registered, their slots, and which jobs hold each slot; and the
//! heartbeat monitor that declares silent TaskManagers lost.
//!
//! Slots are shared between jobs: a slot is a unit of a TaskManager's
//! parallelism, and Weir runs many views at once, so a request is served by
//! the least-loaded slots instead of exclusive ones (a deliberate difference
//! from Flink's per-job slots, where four slots would hold at most four
//! views). Within a job the rule of Flink's slot sharing holds: a request for
//! *n* slots returns *n* distinct slots and subtask *i* of every vertex runs
//! in slot *i*, so subtasks of one vertex never share a slot. Among equally
//! loaded slots, slot 0 of every TaskManager comes before slot 1 of any, so
//! a job spreads over TaskManagers (Flink's `evenly-spread-out-slots`).
//!
//! A pending request waits for TaskManagers to register up to the slot
//! request timeout. A TaskManager is lost when its heartbeat connection
//! drops or it stays silent past the heartbeat timeout; its slots go, and
//! listeners ([`ResourceManager::lost_task_managers`]) fail over its jobs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use planner::execution_graph::SlotId;
use tokio::sync::{Notify, broadcast};

use crate::gateway::{
    JobMasterGateway, ResourceId, ResourceManagerGateway, SlotMemoryUsed, SlotReport,
    TaskExecutorGateway, TaskExecutorRegistration, TaskManagerInfo,
};
use crate::{ClusterError, Result};

struct Registered {
    registration: TaskExecutorRegistration,
    gateway: Arc<dyn TaskExecutorGateway>,
    registered_at: SystemTime,
    last_heartbeat: SystemTime,
    /// Jobs holding each slot, by slot index.
    slot_jobs: Vec<BTreeSet<u64>>,
    /// Each slot's managed memory in use, as of the last report.
    slot_memory_used: Vec<SlotMemoryUsed>,
    /// Tells this registration from an earlier one of the same TaskManager.
    instance: u64,
}

/// The ResourceManager of a JobManager.
pub struct ResourceManager {
    /// Identifies this run of the JobManager (Flink's leader session id).
    id: String,
    task_managers: Mutex<BTreeMap<ResourceId, Registered>>,
    slots_changed: Notify,
    slot_request_timeout: Duration,
    heartbeat_timeout: Duration,
    lost: broadcast::Sender<ResourceId>,
    /// The TaskManagers lost lately, newest last (for introspection).
    lost_lately: Mutex<Vec<TaskManagerInfo>>,
    registrations: std::sync::atomic::AtomicU64,
}

impl std::fmt::Debug for ResourceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceManager")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ResourceManager {
    /// Creates the ResourceManager and starts its heartbeat monitor.
    pub fn start(slot_request_timeout: Duration, heartbeat_timeout: Duration) -> Arc<Self> {
        let nanos = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let rm = Arc::new(Self {
            id: format!("{:x}-{:x}", std::process::id(), nanos),
            task_managers: Mutex::new(BTreeMap::new()),
            slots_changed: Notify::new(),
            slot_request_timeout,
            heartbeat_timeout,
            lost: broadcast::channel(64).0,
            lost_lately: Mutex::new(Vec::new()),
            registrations: std::sync::atomic::AtomicU64::new(0),
        });
        tokio::spawn(Self::monitor(Arc::downgrade(&rm)));
        rm
    }

    /// This JobManager run's id, as registration answers it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// TaskManagers declared lost, as they are.
    pub fn lost_task_managers(&self) -> broadcast::Receiver<ResourceId> {
        self.lost.subscribe()
    }

    /// Which registration of `resource_id` is current.
    pub fn registration_instance(&self, resource_id: &str) -> Option<u64> {
        self.lock().ok()?.get(resource_id).map(|tm| tm.instance)
    }

    /// Declares a TaskManager lost if `instance` is still its current
    /// registration (a connection of an earlier one ending says nothing).
    pub fn disconnect_instance(&self, resource_id: &ResourceId, instance: u64, cause: &str) {
        if self.registration_instance(resource_id) == Some(instance) {
            self.disconnect_task_executor(resource_id, cause);
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<ResourceId, Registered>>> {
        self.task_managers
            .lock()
            .map_err(|_| ClusterError::Internal("resource manager lock poisoned".into()))
    }

    /// Declares TaskManagers lost whose last heartbeat is older than the
    /// timeout.
    async fn monitor(me: Weak<Self>) {
        loop {
            let period = match me.upgrade() {
                Some(rm) => (rm.heartbeat_timeout / 4).max(Duration::from_millis(50)),
                None => return,
            };
            tokio::time::sleep(period).await;
            let Some(rm) = me.upgrade() else { return };
            let silent: Vec<ResourceId> = match rm.lock() {
                Ok(tms) => tms
                    .values()
                    .filter(|tm| {
                        tm.last_heartbeat
                            .elapsed()
                            .is_ok_and(|e| e > rm.heartbeat_timeout)
                    })
                    .map(|tm| tm.registration.resource_id.clone())
                    .collect(),
                Err(_) => return,
            };
            for id in silent {
                rm.disconnect_task_executor(
                    &id,
                    &format!("no heartbeat for {:?}", rm.heartbeat_timeout),
                );
            }
        }
    }

    /// The `count` least-loaded slots, or how many there are.
    fn choose(&self, count: usize) -> Result<Result<Vec<SlotId>, (usize, usize)>> {
        let tms = self.lock()?;
        let mut all: Vec<(usize, usize, SlotId)> = tms
            .iter()
            .flat_map(|(id, r)| {
                r.slot_jobs.iter().enumerate().map(move |(i, jobs)| {
                    (
                        jobs.len(),
                        i,
                        SlotId {
                            task_manager: id.clone(),
                            index: i,
                        },
                    )
                })
            })
            .collect();
        let total = all.len();
        let free = all.iter().filter(|(load, _, _)| *load == 0).count();
        if total < count {
            return Ok(Err((total, free)));
        }
        all.sort();
        let mut chosen: Vec<SlotId> = all.into_iter().take(count).map(|(_, _, s)| s).collect();
        chosen.sort();
        Ok(Ok(chosen))
    }
}

#[async_trait]
impl ResourceManagerGateway for ResourceManager {
    async fn register_task_executor(
        &self,
        registration: TaskExecutorRegistration,
        gateway: Arc<dyn TaskExecutorGateway>,
    ) -> Result<String> {
        let known = self.lock()?.contains_key(&registration.resource_id);
        if known {
            // The same TaskManager again: whatever it ran is gone.
            self.disconnect_task_executor(&registration.resource_id, "registered again");
        }
        tracing::info!(
            resource_id = %registration.resource_id,
            address = %registration.address,
            slots = registration.slots.slots.len(),
            cpu_cores = registration.hardware.cpu_cores,
            "task manager registered"
        );
        let slot_jobs = registration
            .slots
            .slots
            .iter()
            .map(|s| s.jobs.iter().copied().collect())
            .collect();
        let slot_memory_used = registration
            .slots
            .slots
            .iter()
            .map(|s| s.memory_used)
            .collect();
        let now = SystemTime::now();
        self.lock()?.insert(
            registration.resource_id.clone(),
            Registered {
                registration,
                gateway,
                registered_at: now,
                last_heartbeat: now,
                slot_jobs,
                slot_memory_used,
                instance: self
                    .registrations
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            },
        );
        self.slots_changed.notify_waiters();
        Ok(self.id.clone())
    }

    async fn heartbeat_from_task_executor(
        &self,
        resource_id: &ResourceId,
        slots: SlotReport,
    ) -> Result<()> {
        let mut tms = self.lock()?;
        let tm = tms
            .get_mut(resource_id)
            .ok_or_else(|| ClusterError::UnknownTaskManager(resource_id.clone()))?;
        tm.last_heartbeat = SystemTime::now();
        tm.slot_memory_used = slots.slots.iter().map(|s| s.memory_used).collect();
        Ok(())
    }

    fn disconnect_task_executor(&self, resource_id: &ResourceId, cause: &str) {
        let removed = match self.lock() {
            Ok(mut tms) => tms.remove(resource_id),
            Err(_) => None,
        };
        if let Some(tm) = removed {
            if let Ok(mut lost) = self.lost_lately.lock() {
                let mut info = info(&tm);
                info.state = "LOST";
                info.slots_free = 0;
                lost.push(info);
                let excess = lost.len().saturating_sub(16);
                lost.drain(..excess);
            }
            tracing::warn!(resource_id = %resource_id, cause, "task manager lost");
            let _ = self.lost.send(resource_id.clone());
            self.slots_changed.notify_waiters();
        }
    }

    async fn request_slots(
        &self,
        job: u64,
        count: usize,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<Vec<SlotId>> {
        let deadline = tokio::time::Instant::now() + self.slot_request_timeout;
        'request: loop {
            let slots = loop {
                // A pending request: wait for TaskManagers to bring slots.
                let notified = self.slots_changed.notified();
                match self.choose(count)? {
                    Ok(slots) => break slots,
                    Err((total, free)) => {
                        if tokio::time::timeout_at(deadline, notified).await.is_err() {
                            return Err(ClusterError::NotEnoughSlots {
                                needed: count,
                                total,
                                free,
                            });
                        }
                    }
                }
            };
            for slot in &slots {
                let gateway = self.task_executor(slot)?;
                match gateway
                    .request_slot(slot.clone(), job, job_master.clone())
                    .await
                {
                    Ok(()) => {}
                    // Gone before its heartbeats said so: lost now, and the
                    // request is served by the TaskManagers that are left.
                    Err(e @ ClusterError::TaskManagerUnreachable { .. }) => {
                        self.disconnect_task_executor(&slot.task_manager, &e.to_string());
                        if let Ok(mut tms) = self.lock() {
                            for tm in tms.values_mut() {
                                for jobs in tm.slot_jobs.iter_mut() {
                                    jobs.remove(&job);
                                }
                            }
                        }
                        continue 'request;
                    }
                    Err(e) => return Err(e),
                }
                if let Some(tm) = self.lock()?.get_mut(&slot.task_manager) {
                    tm.slot_jobs[slot.index].insert(job);
                }
            }
            return Ok(slots);
        }
    }

    fn preview_slots(&self, count: usize) -> Result<Vec<SlotId>> {
        match self.choose(count)? {
            Ok(slots) => Ok(slots),
            Err((total, free)) => Err(ClusterError::NotEnoughSlots {
                needed: count,
                total,
                free,
            }),
        }
    }

    async fn release_slots(&self, job: u64) -> Result<()> {
        let gateways: Vec<Arc<dyn TaskExecutorGateway>> = {
            let mut tms = self.lock()?;
            tms.values_mut()
                .filter_map(|tm| {
                    // Every slot must let go of the job: no short-circuit.
                    let mut held = false;
                    for jobs in tm.slot_jobs.iter_mut() {
                        held |= jobs.remove(&job);
                    }
                    held.then(|| tm.gateway.clone())
                })
                .collect()
        };
        for g in gateways {
            // A TaskManager that cannot be reached has lost the job anyway.
            if let Err(e) = g.free_slots(job).await {
                tracing::debug!(job, error = %e, "free slots failed");
            }
        }
        self.slots_changed.notify_waiters();
        Ok(())
    }

    fn task_executor(&self, slot: &SlotId) -> Result<Arc<dyn TaskExecutorGateway>> {
        self.lock()?
            .get(&slot.task_manager)
            .map(|tm| tm.gateway.clone())
            .ok_or_else(|| ClusterError::UnknownTaskManager(slot.task_manager.clone()))
    }

    fn task_managers(&self) -> Vec<TaskManagerInfo> {
        let Ok(tms) = self.lock() else {
            return Vec::new();
        };
        let mut out: Vec<TaskManagerInfo> = tms.values().map(info).collect();
        drop(tms);
        if let Ok(lost) = self.lost_lately.lock() {
            out.extend(
                lost.iter()
                    .filter(|l| !out.iter().any(|r| r.resource_id == l.resource_id))
                    .cloned()
                    .collect::<Vec<_>>(),
            );
        }
        out
    }
}

fn info(tm: &Registered) -> TaskManagerInfo {
    TaskManagerInfo {
        resource_id: tm.registration.resource_id.clone(),
        address: tm.registration.address.clone(),
        cpu_cores: tm.registration.hardware.cpu_cores,
        managed_memory_bytes: tm.registration.hardware.managed_memory_bytes,
        slots_total: tm.slot_jobs.len(),
        slots_free: tm.slot_jobs.iter().filter(|j| j.is_empty()).count(),
        registered_at: tm.registered_at,
        last_heartbeat: tm.last_heartbeat,
        state: "REGISTERED",
        slot_jobs: tm
            .slot_jobs
            .iter()
            .map(|j| j.iter().copied().collect())
            .collect(),
        slot_memory_used: tm.slot_memory_used.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::{HardwareDescription, SlotStatus};
    use datafusion::arrow::array::RecordBatch;
    use datafusion::arrow::datatypes::SchemaRef;
    use executor::message::Barrier;
    use executor::task::{CheckpointAck, TaskDeployment, TaskId};
    use planner::execution_graph::ExecutionState;

    /// A TaskManager that answers, or one whose process is gone.
    struct FakeTaskManager {
        id: String,
        gone: bool,
    }

    #[async_trait]
    impl TaskExecutorGateway for FakeTaskManager {
        fn resource_id(&self) -> ResourceId {
            self.id.clone()
        }
        fn address(&self) -> String {
            self.id.clone()
        }
        async fn request_slot(
            &self,
            _: SlotId,
            _: u64,
            _: Arc<dyn JobMasterGateway>,
        ) -> Result<()> {
            if self.gone {
                return Err(ClusterError::TaskManagerUnreachable {
                    resource_id: self.id.clone(),
                    error: "tcp connect error".into(),
                });
            }
            Ok(())
        }
        async fn free_slots(&self, _: u64) -> Result<()> {
            Ok(())
        }
        async fn submit_task(&self, _: TaskDeployment, _: Arc<dyn JobMasterGateway>) -> Result<()> {
            Ok(())
        }
        async fn cancel_job(&self, _: u64) -> Result<()> {
            Ok(())
        }
        async fn trigger_checkpoint(&self, _: TaskId, _: Barrier) -> Result<()> {
            Ok(())
        }
        async fn notify_checkpoint_complete(&self, _: u64, _: u64) -> Result<()> {
            Ok(())
        }
        async fn abort_checkpoint(&self, _: u64, _: u64) -> Result<()> {
            Ok(())
        }
        async fn drop_job_state(&self, _: u64, _: Vec<u64>) -> Result<()> {
            Ok(())
        }
        async fn scan_view(
            &self,
            _: u64,
            _: SchemaRef,
            _: std::ops::Range<u16>,
        ) -> Result<Vec<RecordBatch>> {
            Ok(Vec::new())
        }
        async fn scan_changes(
            &self,
            _: u64,
            _: SchemaRef,
            _: std::ops::Range<u16>,
            _: u64,
        ) -> Result<crate::gateway::ChangeStream> {
            Err(ClusterError::Internal("not here".into()))
        }
    }

    struct FakeJobMaster;

    #[async_trait]
    impl JobMasterGateway for FakeJobMaster {
        fn acknowledge_checkpoint(&self, _: &TaskId, _: CheckpointAck) {}
        fn update_task_execution_state(
            &self,
            _: &TaskId,
            _: ExecutionState,
            _: Option<executor::Failure>,
        ) {
        }
        async fn offer_slots(&self, _: u64, slots: Vec<SlotId>) -> Result<Vec<SlotId>> {
            Ok(slots)
        }
    }

    async fn register(rm: &ResourceManager, id: &str, gone: bool) {
        let slots = (0..2)
            .map(|index| SlotStatus {
                slot: SlotId {
                    task_manager: id.to_string(),
                    index,
                },
                jobs: Vec::new(),
                memory_used: Default::default(),
            })
            .collect();
        rm.register_task_executor(
            TaskExecutorRegistration {
                resource_id: id.to_string(),
                address: id.to_string(),
                hardware: HardwareDescription {
                    cpu_cores: 2,
                    managed_memory_bytes: 1 << 20,
                },
                slots: SlotReport { slots },
            },
            Arc::new(FakeTaskManager {
                id: id.to_string(),
                gone,
            }),
        )
        .await
        .unwrap();
    }

    #[tokio::test]
    async fn a_task_manager_found_gone_is_lost_at_once_and_never_chosen() {
        // Heartbeats would take a minute to notice.
        let rm = ResourceManager::start(Duration::from_secs(5), Duration::from_secs(60));
        let mut lost = rm.lost_task_managers();
        register(&rm, "alive", false).await;
        register(&rm, "gone", true).await;
        // Spread evenly, the job's first choice has a slot on each.
        let slots = rm
            .request_slots(7, 2, Arc::new(FakeJobMaster))
            .await
            .expect("slots on the TaskManager that is left");
        assert!(slots.iter().all(|s| s.task_manager == "alive"), "{slots:?}");
        assert_eq!(lost.try_recv().ok().as_deref(), Some("gone"));
        assert!(rm.registration_instance("gone").is_none());
        let taken: usize = rm
            .task_managers()
            .iter()
            .filter(|t| t.state == "REGISTERED")
            .map(|t| t.slot_jobs.iter().filter(|j| j.contains(&7)).count())
            .sum();
        assert_eq!(taken, 2);
    }
}

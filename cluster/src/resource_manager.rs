//! The ResourceManager and its slot manager: which TaskManagers are
//! registered, their slots, and which jobs hold each slot.
//!
//! Slots are shared between jobs: a slot is a unit of a TaskManager's
//! parallelism, and Weir runs many views at once, so a request is served by
//! the least-loaded slots instead of exclusive ones (a deliberate difference
//! from Flink's per-job slots, where four slots would hold at most four
//! views). Within a job the rule of Flink's slot sharing holds: a request for
//! *n* slots returns *n* distinct slots and subtask *i* of every vertex runs
//! in slot *i*, so subtasks of one vertex never share a slot.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use planner::execution_graph::SlotId;
use tokio::sync::Notify;

use crate::gateway::{
    ResourceId, ResourceManagerGateway, SlotReport, TaskExecutorGateway, TaskExecutorRegistration,
    TaskManagerInfo,
};
use crate::{ClusterError, Result};

struct Registered {
    registration: TaskExecutorRegistration,
    gateway: Arc<dyn TaskExecutorGateway>,
    last_heartbeat: SystemTime,
    /// Jobs holding each slot, by slot index.
    slot_jobs: Vec<BTreeSet<u64>>,
}

/// The ResourceManager of a JobManager.
pub struct ResourceManager {
    task_managers: Mutex<BTreeMap<ResourceId, Registered>>,
    slots_changed: Notify,
    slot_request_timeout: Duration,
}

impl std::fmt::Debug for ResourceManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResourceManager").finish_non_exhaustive()
    }
}

impl ResourceManager {
    pub fn new(slot_request_timeout: Duration) -> Self {
        Self {
            task_managers: Mutex::new(BTreeMap::new()),
            slots_changed: Notify::new(),
            slot_request_timeout,
        }
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, BTreeMap<ResourceId, Registered>>> {
        self.task_managers
            .lock()
            .map_err(|_| ClusterError::Internal("resource manager lock poisoned".into()))
    }

    /// The `count` least-loaded slots, or how many there are.
    fn choose(&self, count: usize) -> Result<Result<Vec<SlotId>, (usize, usize)>> {
        let tms = self.lock()?;
        let mut all: Vec<(usize, SlotId)> = tms
            .iter()
            .flat_map(|(id, r)| {
                r.slot_jobs.iter().enumerate().map(move |(i, jobs)| {
                    (
                        jobs.len(),
                        SlotId {
                            task_manager: id.clone(),
                            index: i,
                        },
                    )
                })
            })
            .collect();
        let total = all.len();
        let free = all.iter().filter(|(load, _)| *load == 0).count();
        if total < count {
            return Ok(Err((total, free)));
        }
        all.sort();
        let mut chosen: Vec<SlotId> = all.into_iter().take(count).map(|(_, s)| s).collect();
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
    ) -> Result<()> {
        tracing::info!(
            resource_id = %registration.resource_id,
            address = %registration.address,
            slots = registration.slots.slots.len(),
            "task manager registered"
        );
        let slot_jobs = registration
            .slots
            .slots
            .iter()
            .map(|s| s.jobs.iter().copied().collect())
            .collect();
        self.lock()?.insert(
            registration.resource_id.clone(),
            Registered {
                registration,
                gateway,
                last_heartbeat: SystemTime::now(),
                slot_jobs,
            },
        );
        self.slots_changed.notify_waiters();
        Ok(())
    }

    async fn heartbeat_from_task_executor(
        &self,
        resource_id: &ResourceId,
        _slots: SlotReport,
    ) -> Result<()> {
        let mut tms = self.lock()?;
        let tm = tms
            .get_mut(resource_id)
            .ok_or_else(|| ClusterError::UnknownTaskManager(resource_id.clone()))?;
        tm.last_heartbeat = SystemTime::now();
        Ok(())
    }

    async fn request_slots(&self, job: u64, count: usize) -> Result<Vec<SlotId>> {
        let deadline = tokio::time::Instant::now() + self.slot_request_timeout;
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
            gateway.request_slot(slot.clone(), job).await?;
            if let Some(tm) = self.lock()?.get_mut(&slot.task_manager) {
                tm.slot_jobs[slot.index].insert(job);
            }
        }
        Ok(slots)
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
            g.free_slots(job).await?;
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
        tms.values()
            .map(|tm| TaskManagerInfo {
                resource_id: tm.registration.resource_id.clone(),
                address: tm.registration.address.clone(),
                slots_total: tm.slot_jobs.len(),
                slots_free: tm.slot_jobs.iter().filter(|j| j.is_empty()).count(),
                last_heartbeat: tm.last_heartbeat,
            })
            .collect()
    }
}

//! The service interfaces between the JobManager and the TaskManagers, as
//! Flink's RPC gateways. In `weir playground` they are called in-process; a
//! multi-process cluster serves the same traits over gRPC.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::message::Barrier;
use executor::task::{SourcePosition, TaskDeployment, TaskId};
use planner::execution_graph::{ExecutionState, SlotId};

use crate::Result;

/// Identifies a TaskManager (Flink's `ResourceID`).
pub type ResourceId = String;

/// What a TaskManager says about itself when it registers.
#[derive(Debug, Clone)]
pub struct TaskExecutorRegistration {
    pub resource_id: ResourceId,
    pub address: String,
    pub hardware: HardwareDescription,
    pub slots: SlotReport,
}

/// Flink's `HardwareDescription`.
#[derive(Debug, Clone)]
pub struct HardwareDescription {
    pub cpu_cores: usize,
    pub managed_memory_bytes: usize,
}

/// Which slots a TaskManager has and which jobs they hold.
#[derive(Debug, Clone, Default)]
pub struct SlotReport {
    pub slots: Vec<SlotStatus>,
}

/// One slot in a [`SlotReport`].
#[derive(Debug, Clone)]
pub struct SlotStatus {
    pub slot: SlotId,
    pub jobs: Vec<u64>,
}

/// A registered TaskManager as the ResourceManager sees it.
#[derive(Debug, Clone)]
pub struct TaskManagerInfo {
    pub resource_id: ResourceId,
    pub address: String,
    pub slots_total: usize,
    pub slots_free: usize,
    pub last_heartbeat: SystemTime,
}

/// The ResourceManager, as TaskManagers and JobMasters call it.
#[async_trait]
pub trait ResourceManagerGateway: Send + Sync {
    /// A TaskManager announces itself and its slots.
    async fn register_task_executor(
        &self,
        registration: TaskExecutorRegistration,
        gateway: Arc<dyn TaskExecutorGateway>,
    ) -> Result<()>;

    /// Periodic liveness signal with the current slot report.
    async fn heartbeat_from_task_executor(
        &self,
        resource_id: &ResourceId,
        slots: SlotReport,
    ) -> Result<()>;

    /// A JobMaster asks for `count` slots, each on a different slot index,
    /// so that no two subtasks of a vertex share one.
    async fn request_slots(&self, job: u64, count: usize) -> Result<Vec<SlotId>>;

    /// The slots `request_slots` would return, without allocating them.
    fn preview_slots(&self, count: usize) -> Result<Vec<SlotId>>;

    /// The job no longer needs its slots.
    async fn release_slots(&self, job: u64) -> Result<()>;

    /// The TaskManager that owns `slot`.
    fn task_executor(&self, slot: &SlotId) -> Result<Arc<dyn TaskExecutorGateway>>;

    /// Every registered TaskManager.
    fn task_managers(&self) -> Vec<TaskManagerInfo>;
}

/// A TaskManager, as the ResourceManager and JobMasters call it.
#[async_trait]
pub trait TaskExecutorGateway: Send + Sync {
    fn resource_id(&self) -> ResourceId;

    /// The ResourceManager assigns `slot` to `job`.
    async fn request_slot(&self, slot: SlotId, job: u64) -> Result<()>;

    /// The job's slots are free again.
    async fn free_slots(&self, job: u64) -> Result<()>;

    /// Starts one subtask; the task reports to `job_master`.
    async fn submit_task(
        &self,
        deployment: TaskDeployment,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()>;

    /// Cancels every task of `job` and waits until they have stopped.
    async fn cancel_job(&self, job: u64) -> Result<()>;

    /// Tells a source subtask to emit `barrier`.
    async fn trigger_checkpoint(&self, task: TaskId, barrier: Barrier) -> Result<()>;

    /// Commits the job's staged state up to `checkpoint_id` and tells its tasks.
    async fn notify_checkpoint_complete(&self, job: u64, checkpoint_id: u64) -> Result<()>;

    /// Drops staged state of an aborted checkpoint.
    async fn abort_checkpoint(&self, job: u64, checkpoint_id: u64) -> Result<()>;

    /// The last committed checkpoint of `job` in this TaskManager's state.
    async fn committed_checkpoint(&self, job: u64) -> Result<Option<u64>>;

    /// Deletes a dropped job's state.
    async fn drop_job_state(&self, job: u64, tables: Vec<u64>) -> Result<()>;

    /// Reads a view's rows at its latest committed checkpoint (the
    /// queryable-state service behind `SELECT`).
    async fn scan_view(&self, state_table: u64, schema: SchemaRef) -> Result<Vec<RecordBatch>>;
}

/// A JobMaster, as TaskManagers call it.
pub trait JobMasterGateway: Send + Sync {
    fn acknowledge_checkpoint(
        &self,
        task: &TaskId,
        checkpoint_id: u64,
        positions: Vec<SourcePosition>,
    );

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<String>,
    );
}

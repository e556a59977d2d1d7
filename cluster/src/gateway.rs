//! The service interfaces between the JobManager and the TaskManagers, as
//! Flink's RPC gateways. In `weir playground` they are called in-process; a
//! multi-process cluster serves the same traits over gRPC.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::message::Barrier;
use executor::task::{CheckpointAck, TaskDeployment, TaskId};
use planner::execution_graph::{ExecutionState, SlotId};

use crate::Result;

/// A view's rows as they are read.
pub type ViewStream = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// A view's changes after an epoch, read a page at a time
/// (pages in the order of
/// [`executor::operators::changelog::ChangeReader`]), and the horizon read before them.
pub struct ChangeStream {
    /// Every epoch after this one is whole; a `since` older than it reads
    /// nothing.
    pub horizon: u64,
    pub batches: ViewStream,
}

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
    /// Managed memory in use: by the operators' state caches, and by
    /// RocksDB (block cache and write buffers).
    pub memory_used: SlotMemoryUsed,
}

/// A slot's managed memory in use, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SlotMemoryUsed {
    pub operators: u64,
    pub rocksdb: u64,
}

/// A registered TaskManager as the ResourceManager sees it.
#[derive(Debug, Clone)]
pub struct TaskManagerInfo {
    pub resource_id: ResourceId,
    pub address: String,
    pub cpu_cores: usize,
    pub managed_memory_bytes: usize,
    pub slots_total: usize,
    pub slots_free: usize,
    pub registered_at: SystemTime,
    pub last_heartbeat: SystemTime,
    /// `REGISTERED`, or `LOST` for one lost lately.
    pub state: &'static str,
    /// Jobs holding each slot, by slot index.
    pub slot_jobs: Vec<Vec<u64>>,
    /// Each slot's managed memory in use, as of the last heartbeat.
    pub slot_memory_used: Vec<SlotMemoryUsed>,
}

/// The ResourceManager, as TaskManagers and JobMasters call it.
#[async_trait]
pub trait ResourceManagerGateway: Send + Sync {
    /// A TaskManager announces itself and its slots; the answer is the
    /// JobManager's id, which changes when it restarts.
    async fn register_task_executor(
        &self,
        registration: TaskExecutorRegistration,
        gateway: Arc<dyn TaskExecutorGateway>,
    ) -> Result<String>;

    /// Periodic liveness signal with the current slot report. An error
    /// means the ResourceManager no longer knows the TaskManager: it must
    /// register again.
    async fn heartbeat_from_task_executor(
        &self,
        resource_id: &ResourceId,
        slots: SlotReport,
    ) -> Result<()>;

    /// The TaskManager is gone (its connection dropped, or it missed its
    /// heartbeats): its slots are removed and its jobs fail over.
    fn disconnect_task_executor(&self, resource_id: &ResourceId, cause: &str);

    /// A JobMaster asks for `count` distinct slots, so that no two subtasks
    /// of a vertex share one; waits for TaskManagers to bring them up to the
    /// slot request timeout. Each chosen TaskManager allocates its slot and
    /// offers it to `job_master`; the request returns the slots accepted.
    async fn request_slots(
        &self,
        job: u64,
        count: usize,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<Vec<SlotId>>;

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

    /// Where the TaskManager serves its shuffle: the address input channels
    /// of its subtasks' consumers connect to.
    fn address(&self) -> String;

    /// The ResourceManager assigns `slot` to `job`: the TaskManager
    /// allocates it and offers it to the job's JobMaster (Flink's
    /// `requestSlot` then `offerSlots`). An error if the offer is declined.
    async fn request_slot(
        &self,
        slot: SlotId,
        job: u64,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()>;

    /// The job's slots are free again.
    async fn free_slots(&self, job: u64) -> Result<()>;

    /// Starts one subtask, after restoring its state from the job's latest
    /// completed checkpoint; the task reports to `job_master`.
    async fn submit_task(
        &self,
        deployment: TaskDeployment,
        job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()>;

    /// Cancels every task of `job` and waits until they have stopped.
    async fn cancel_job(&self, job: u64) -> Result<()>;

    /// Tells a source subtask to emit `barrier`.
    async fn trigger_checkpoint(&self, task: TaskId, barrier: Barrier) -> Result<()>;

    /// Checkpoint `checkpoint_id` is complete: its local copies become what
    /// view scans read, its files the base of the next snapshots; tells the
    /// job's tasks.
    async fn notify_checkpoint_complete(&self, job: u64, checkpoint_id: u64) -> Result<()>;

    /// Drops the local copies of an aborted checkpoint.
    async fn abort_checkpoint(&self, job: u64, checkpoint_id: u64) -> Result<()>;

    /// Deletes a dropped job's state.
    async fn drop_job_state(&self, job: u64, tables: Vec<u64>) -> Result<()>;

    /// Reads a view's rows in `key_groups` at the checkpoint this
    /// TaskManager committed last (the queryable-state service behind
    /// `SELECT`).
    async fn scan_view(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<RecordBatch>>;

    /// [`TaskExecutorGateway::scan_view`] as a stream: the checkpoint is
    /// pinned when the call returns and its rows are read a page at a
    /// time as the stream is polled, so that a reader's memory does not
    /// grow with the view. By default the whole read, as one.
    async fn scan_view_stream(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<ViewStream> {
        use futures::StreamExt;
        let batches = self.scan_view(state_table, schema, key_groups).await?;
        Ok(futures::stream::iter(batches.into_iter().map(Ok)).boxed())
    }

    /// Reads a view's changes after epoch `since` in `key_groups` from its
    /// changelog table, at the checkpoint this TaskManager committed last
    /// (what `SUBSCRIBE` follows): pinned when the call returns, read a
    /// page at a time as the stream is polled.
    async fn scan_changes(
        &self,
        changelog_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
        since: u64,
    ) -> Result<ChangeStream>;
}

/// A JobMaster, as TaskManagers call it. Acknowledgements and state
/// changes are one-way messages, delivered in the order they were sent.
#[async_trait]
pub trait JobMasterGateway: Send + Sync {
    /// A task took its part of a checkpoint: where its snapshot is in
    /// checkpoint storage, its source positions and alignment time — or
    /// why it declined.
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck);

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<executor::Failure>,
    );

    /// A TaskManager offers slots it allocated for `job`; the answer is
    /// the ones the JobMaster accepts into its slot pool.
    async fn offer_slots(&self, job: u64, slots: Vec<SlotId>) -> Result<Vec<SlotId>>;
}

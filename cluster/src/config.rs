//! Cluster settings, with Flink's defaults where Flink has one.

use std::time::Duration;

/// Settings of the JobManager and TaskManagers.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Slots of each TaskManager (`taskmanager.numberOfTaskSlots`).
    pub slots_per_task_manager: usize,
    /// Time between checkpoints (`execution.checkpointing.interval`); 1 s.
    pub checkpoint_interval: Duration,
    /// A checkpoint not complete after this is aborted; 10 min as in Flink.
    pub checkpoint_timeout: Duration,
    /// TaskManager heartbeat interval (`heartbeat.interval`); 10 s.
    pub heartbeat_interval: Duration,
    /// A TaskManager silent this long is lost (`heartbeat.timeout`); 50 s.
    pub heartbeat_timeout: Duration,
    /// Fixed-delay restart strategy: attempts before a job stays failed.
    pub restart_attempts: u32,
    /// Fixed-delay restart strategy: delay between attempts.
    pub restart_delay: Duration,
    /// A job that cannot get its slots within this time fails (Flink's
    /// `slot.request.timeout`, 5 min there; short here, where the
    /// TaskManagers of a playground are all there from the start).
    pub slot_request_timeout: Duration,
    /// RocksDB block cache per TaskManager, shared by its slots.
    pub managed_memory_bytes: usize,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            slots_per_task_manager: 4,
            checkpoint_interval: Duration::from_secs(1),
            checkpoint_timeout: Duration::from_secs(600),
            heartbeat_interval: Duration::from_secs(10),
            heartbeat_timeout: Duration::from_secs(50),
            restart_attempts: 3,
            restart_delay: Duration::from_secs(1),
            slot_request_timeout: Duration::from_secs(10),
            managed_memory_bytes: 128 << 20,
        }
    }
}

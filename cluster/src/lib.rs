//! Weir's cluster layer, after Flink's runtime: the JobManager side
//! (Dispatcher, ResourceManager, a JobMaster per job with its
//! CheckpointCoordinator) and the TaskManager side (TaskExecutor with its slot
//! table and tasks).
//!
//! The two sides talk only through the gateway traits in [`gateway`]. In a
//! playground ([`Cluster::playground`]) they are plain calls within one
//! process; a standalone JobManager ([`Cluster::job_manager`]) and
//! TaskManagers ([`run_task_manager`]) serve and call them over tonic gRPC
//! (`proto/cluster.proto`, module `rpc`), including the network shuffle
//! between TaskManagers.

mod changes;
mod checkpoint;
pub mod config;
mod error;
pub mod gateway;
mod jobmanager;
mod jobmaster;
mod process;
mod resource_manager;
mod rpc;
mod task_runtime;
mod taskmanager;
mod view_log;

pub use checkpoint::{CheckpointStats, CheckpointStatus, CompletedCheckpoint};
pub use config::{ClusterConfig, RestartStrategy};
pub use error::{ClusterError, Result};
pub use jobmanager::{JobManager, JobSources, JobStatus};
pub use process::{Cluster, TaskManagerOptions, run_task_manager};
pub use resource_manager::ResourceManager;
pub use task_runtime::STACK_BYTES as TASK_STACK_BYTES;
pub use taskmanager::TaskExecutor;

//! Weir's cluster layer, after Flink's runtime: the JobManager side
//! (Dispatcher, ResourceManager, a JobMaster per job with its
//! CheckpointCoordinator) and the TaskManager side (TaskExecutor with its slot
//! table and tasks).
//!
//! The two sides talk only through the gateway traits in [`gateway`] — the
//! same interfaces a multi-process cluster serves over RPC. [`MiniCluster`]
//! wires one JobManager and one TaskManager in one process, for
//! `weir playground` and tests.

mod checkpoint;
pub mod config;
mod error;
pub mod gateway;
mod jobmanager;
mod jobmaster;
mod minicluster;
mod resource_manager;
mod taskmanager;

pub use checkpoint::CompletedCheckpoint;
pub use config::ClusterConfig;
pub use error::{ClusterError, Result};
pub use jobmanager::{JobManager, JobSources, JobStatus};
pub use minicluster::MiniCluster;
pub use resource_manager::ResourceManager;
pub use taskmanager::TaskExecutor;

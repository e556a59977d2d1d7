//! The executor's one error type: what a task or an operator can fail with.

use datafusion::arrow::error::ArrowError;
use datafusion::error::DataFusionError;

/// Errors of a running task.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
    /// A broken protocol invariant (barrier order, schema): a bug.
    #[error("protocol violation: {0}")]
    Protocol(String),
    #[error("{0}")]
    Unsupported(String),
    /// A connector option that is missing, unknown or out of range.
    #[error("{0}")]
    InvalidOption(String),
    /// An external system a connector reads or writes failed.
    #[error("{0}")]
    Connector(String),
    #[error("channel closed")]
    ChannelClosed,
    /// An input channel's far end failed (a TaskManager or the network).
    #[error("input channel broken: {0}")]
    ChannelBroken(String),
    /// An operator's state needs more managed memory than its slot has
    /// (`crate::state::OUT_OF_MANAGED_MEMORY`).
    #[error("{0}")]
    OutOfMemory(String),
    /// A service of the TaskManager or JobManager (table log, state) failed.
    #[error("{0}")]
    Service(String),
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;

//! The cluster's one error type: scheduling, jobs, checkpoints and RPC.

/// Errors of the cluster layer.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A job cannot get the slots it needs.
    #[error("job needs {needed} slots but the cluster has {total} ({free} free)")]
    NotEnoughSlots {
        needed: usize,
        total: usize,
        free: usize,
    },
    #[error("job {0} not found")]
    UnknownJob(u64),
    #[error("job {job} failed: {error}")]
    JobFailed { job: u64, error: executor::Failure },
    /// A task failed while its job was being deployed again (the job
    /// restarts, or fails, with the task's failure, its kind kept).
    #[error("{0}")]
    TaskFailed(executor::Failure),
    #[error("task manager {0} is not registered")]
    UnknownTaskManager(String),
    /// A TaskManager could not register with the JobManager in time.
    #[error("could not register with the job manager within {timeout:?}: {error}")]
    RegistrationTimeout {
        timeout: std::time::Duration,
        error: String,
    },
    /// A cluster RPC failed (the peer is down or unreachable).
    #[error("cluster rpc: {0}")]
    Rpc(String),
    /// A TaskManager could not be reached at all (its process is gone, or
    /// the network to it): it is declared lost at once.
    #[error("task manager {resource_id} is unreachable: {error}")]
    TaskManagerUnreachable { resource_id: String, error: String },
    #[error("savepoint \"{0}\" does not exist")]
    UnknownSavepoint(String),
    #[error("savepoint \"{0}\" already exists")]
    SavepointExists(String),
    #[error("savepoint \"{savepoint}\" holds no state of job {job}")]
    NotInSavepoint { savepoint: String, job: u64 },
    /// A checkpoint file failed its checksum (or is missing) on restore.
    #[error("corrupt checkpoint: {0}")]
    CorruptCheckpoint(String),
    #[error(transparent)]
    Exec(#[from] executor::ExecError),
    #[error(transparent)]
    Storage(#[from] storage::StorageError),
    #[error(transparent)]
    Plan(#[from] planner::PlanError),
    #[error("{0}")]
    Internal(String),
}

impl ClusterError {
    /// This error as a job's failure: its kind told from the variants, its
    /// message as it reads.
    pub fn failure(&self) -> executor::Failure {
        let kind = match self {
            ClusterError::JobFailed { error, .. } | ClusterError::TaskFailed(error) => error.kind,
            ClusterError::Exec(e) => e.failure().kind,
            ClusterError::Storage(e) => executor::classify_storage(e).kind,
            _ => executor::ErrorKind::Internal,
        };
        executor::Failure::new(kind, self.to_string())
    }
}

pub type Result<T, E = ClusterError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use executor::{ErrorKind, Failure};

    use super::ClusterError;

    #[test]
    fn a_task_failure_keeps_its_kind_and_words() {
        let task = Failure::new(ErrorKind::InvalidText, "offset 1 cannot be decoded");
        let failure = ClusterError::TaskFailed(task).failure();
        assert_eq!(failure.kind, ErrorKind::InvalidText);
        assert_eq!(failure.message, "offset 1 cannot be decoded");
        let other = ClusterError::Internal("lost".into()).failure();
        assert_eq!(other.kind, ErrorKind::Internal);
    }
}

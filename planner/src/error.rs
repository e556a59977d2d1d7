use datafusion::error::DataFusionError;

/// Errors of the planner.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// SQL that Weir does not (yet) support in this position; names the feature.
    #[error("{0} is not supported")]
    Unsupported(String),
    /// A view that cannot be defined as written (for example EMIT ON WINDOW
    /// CLOSE over a table without a watermark).
    #[error("{0}")]
    InvalidDefinition(String),
    #[error(transparent)]
    DataFusion(#[from] DataFusionError),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

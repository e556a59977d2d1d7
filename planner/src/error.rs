//! The planner's one error type; the server maps it to SQLSTATEs.

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
    /// A statement that does not say what it must (a window function
    /// without its table's name): Postgres's `42601`.
    #[error("{0}")]
    Syntax(String),
    /// A relation the statement names that does not exist (`42P01`).
    #[error("{0}")]
    UndefinedTable(String),
    /// A column the statement names that does not exist (`42703`).
    #[error("{0}")]
    UndefinedColumn(String),
    /// An argument of the wrong type (`42804`).
    #[error("{0}")]
    DatatypeMismatch(String),
    /// An argument value a function does not take (`22023`).
    #[error("{0}")]
    InvalidParameter(String),
    /// Text that does not read as a value of its type (`22P02`).
    #[error("{0}")]
    InvalidText(String),
    /// A scalar subquery that returned more than one row (`21000`).
    #[error("{0}")]
    CardinalityViolation(String),
    /// A value nested too deeply to process (`54001`).
    #[error("{0}")]
    StatementTooComplex(String),
    #[error("{0}")]
    Internal(String),
}

impl PlanError {
    /// As a DataFusion error, for the traits DataFusion calls back through
    /// (table functions, schema providers): the server finds it again by
    /// its type.
    pub fn into_datafusion(self) -> DataFusionError {
        match self {
            PlanError::DataFusion(e) => e,
            other => DataFusionError::External(Box::new(other)),
        }
    }
}

pub type Result<T, E = PlanError> = std::result::Result<T, E>;

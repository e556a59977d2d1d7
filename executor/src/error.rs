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
    /// A record a connector read that cannot be decoded, where the source
    /// fails on one (`ignore_parse_errors = 'false'`).
    #[error("{0}")]
    Decode(String),
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

/// What kind of failure an error is, as a client is to see it. Each is
/// told from the error's type and variant, once, where the error arises;
/// the kind travels with the message (through the cluster, into a view's
/// error table), and the server maps it to a SQLSTATE.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    DivisionByZero,
    /// A number past its type's range, or a decimal past its precision.
    NumericOutOfRange,
    /// Text that is not a value of its type (a bad cast or parse).
    InvalidText,
    /// Text with a character its type cannot hold (`\u0000`).
    UntranslatableCharacter,
    NotNullViolation,
    /// A value Weir cannot represent or compute yet.
    UnsupportedValue,
    /// A function given an argument value it does not take.
    InvalidParameter,
    /// A scalar subquery that returned more than one row.
    CardinalityViolation,
    /// State that outgrew its slot's managed memory.
    OutOfMemory,
    /// The disk (or quota) is full.
    DiskFull,
    /// A value nested too deeply to process.
    StatementTooComplex,
    /// Anything else: a bug, a lost service, a broken channel.
    Internal,
}

impl ErrorKind {
    const NAMES: [(ErrorKind, &'static str); 12] = [
        (ErrorKind::DivisionByZero, "division_by_zero"),
        (ErrorKind::NumericOutOfRange, "numeric_out_of_range"),
        (ErrorKind::InvalidText, "invalid_text"),
        (
            ErrorKind::UntranslatableCharacter,
            "untranslatable_character",
        ),
        (ErrorKind::NotNullViolation, "not_null_violation"),
        (ErrorKind::UnsupportedValue, "unsupported_value"),
        (ErrorKind::InvalidParameter, "invalid_parameter"),
        (ErrorKind::CardinalityViolation, "cardinality_violation"),
        (ErrorKind::OutOfMemory, "out_of_memory"),
        (ErrorKind::DiskFull, "disk_full"),
        (ErrorKind::StatementTooComplex, "statement_too_complex"),
        (ErrorKind::Internal, "internal"),
    ];

    /// Its name where it is stored or sent (an error table's rows, RPC).
    pub fn name(self) -> &'static str {
        Self::NAMES
            .iter()
            .find(|(k, _)| *k == self)
            .map_or("internal", |(_, n)| n)
    }

    /// The kind a name stands for; one this build does not know is
    /// `Internal`.
    pub fn from_name(name: &str) -> Self {
        Self::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map_or(ErrorKind::Internal, |(k, _)| *k)
    }
}

/// A failure as a client is to see it: its kind and its message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Failure {
    pub kind: ErrorKind,
    pub message: String,
}

impl Failure {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl ExecError {
    /// What this error is, told from its variants.
    pub fn failure(&self) -> Failure {
        match self {
            ExecError::DataFusion(d) => classify_datafusion(d),
            ExecError::Arrow(a) => classify_arrow(a),
            ExecError::Storage(s) => classify_storage(s),
            ExecError::OutOfMemory(m) => Failure::new(ErrorKind::OutOfMemory, m.clone()),
            ExecError::Decode(m) => Failure::new(ErrorKind::InvalidText, m.clone()),
            other => Failure::internal(other.to_string()),
        }
    }
}

/// What a storage error is.
pub fn classify_storage(e: &storage::StorageError) -> Failure {
    use storage::StorageError as S;
    match e {
        S::Arrow(a) => classify_arrow(a),
        S::DiskFull(_) => Failure::new(ErrorKind::DiskFull, e.to_string()),
        S::NullValue(_) => Failure::new(ErrorKind::NotNullViolation, e.to_string()),
        _ => Failure::internal(e.to_string()),
    }
}

/// What a DataFusion error is: by its root cause's variant; for an error
/// Weir's own code raised inside DataFusion (`External`), by its type.
pub fn classify_datafusion(e: &DataFusionError) -> Failure {
    let root = e.find_root();
    match root {
        DataFusionError::ArrowError(a, _) => classify_arrow(a),
        DataFusionError::External(inner) => {
            if let Some(x) = inner.downcast_ref::<ExecError>() {
                return x.failure();
            }
            if let Some(p) = inner.downcast_ref::<planner::PlanError>() {
                return classify_plan(p);
            }
            if let Some(s) = inner.downcast_ref::<storage::StorageError>() {
                return classify_storage(s);
            }
            if let Some(a) = inner.downcast_ref::<ArrowError>() {
                return classify_arrow(a);
            }
            Failure::internal(inner.to_string())
        }
        DataFusionError::ResourcesExhausted(m) => Failure::new(ErrorKind::OutOfMemory, m.clone()),
        DataFusionError::NotImplemented(m) => Failure::new(ErrorKind::UnsupportedValue, m.clone()),
        // A `NotImplemented` error a DataFusion task turned into text.
        DataFusionError::Execution(m) if let Some(at) = m.find(NOT_IMPLEMENTED) => Failure::new(
            ErrorKind::UnsupportedValue,
            &m[at + NOT_IMPLEMENTED.len()..],
        ),
        DataFusionError::Execution(m) => Failure::new(datafusion_execution_kind(m), m.clone()),
        other => Failure::internal(other.to_string()),
    }
}

/// How DataFusion's `NotImplemented` error reads.
const NOT_IMPLEMENTED: &str = "This feature is not implemented: ";

/// What a planner error raised while a query runs (by one of Weir's own
/// functions) is.
fn classify_plan(e: &planner::PlanError) -> Failure {
    use planner::PlanError as P;
    let kind = match e {
        P::DataFusion(d) => return classify_datafusion(d),
        P::InvalidParameter(_) => ErrorKind::InvalidParameter,
        P::InvalidText(_) => ErrorKind::InvalidText,
        P::CardinalityViolation(_) => ErrorKind::CardinalityViolation,
        P::StatementTooComplex(_) => ErrorKind::StatementTooComplex,
        P::Unsupported(_) => ErrorKind::UnsupportedValue,
        _ => ErrorKind::Internal,
    };
    Failure::new(kind, e.to_string())
}

/// DataFusion's own execution errors are text only (`exec_err!`), with no
/// variant to tell them by: the one place their words are read. Weir's
/// own errors never come here; they travel typed.
fn datafusion_execution_kind(m: &str) -> ErrorKind {
    const WORDS: &[(&str, ErrorKind)] = &[
        ("divide by zero", ErrorKind::DivisionByZero),
        ("division by zero", ErrorKind::DivisionByZero),
        ("overflow", ErrorKind::NumericOutOfRange),
        ("out of range", ErrorKind::NumericOutOfRange),
        ("cast", ErrorKind::InvalidText),
        ("parse", ErrorKind::InvalidText),
        ("invalid input syntax", ErrorKind::InvalidText),
    ];
    let lower = m.to_lowercase();
    WORDS
        .iter()
        .find(|(w, _)| lower.contains(w))
        .map_or(ErrorKind::Internal, |(_, k)| *k)
}

/// Postgres's name of an Arrow integer type, in "integer out of range".
fn integer_type_name(arrow_name: &str) -> Option<&'static str> {
    Some(match arrow_name {
        "Int16" | "UInt8" | "Int8" => "smallint",
        "Int32" | "UInt16" => "integer",
        "Int64" | "UInt32" | "UInt64" => "bigint",
        _ => return None,
    })
}

/// What an Arrow error is, worded as Postgres words it. Arrow folds some
/// kinds into one variant (a cast past an integer's range is a
/// `CastError`, as is a bad text); those are told apart by the words of
/// Arrow's own kernels.
pub fn classify_arrow(e: &ArrowError) -> Failure {
    use ErrorKind as K;
    match e {
        ArrowError::DivideByZero => Failure::new(K::DivisionByZero, "division by zero"),
        // A number that does not fit the integer type it is cast to.
        ArrowError::CastError(m)
            if m.starts_with("Can't cast value")
                && let Some(t) = m.rsplit(' ').next().and_then(integer_type_name) =>
        {
            Failure::new(K::NumericOutOfRange, format!("{t} out of range"))
        }
        ArrowError::ParseError(m) if m.starts_with("unsupported Unicode escape sequence") => {
            Failure::new(K::UntranslatableCharacter, m.clone())
        }
        // A decimal past its precision (a total of more than 38 digits).
        ArrowError::CastError(m)
            if m.starts_with("Cannot cast to Decimal") && m.contains("Overflowing") =>
        {
            Failure::new(K::NumericOutOfRange, format!("numeric field overflow: {m}"))
        }
        ArrowError::CastError(m) | ArrowError::ParseError(m) => {
            Failure::new(K::InvalidText, m.clone())
        }
        // A value with more integer digits than a numeric(p, s) holds.
        ArrowError::InvalidArgumentError(m) if m.contains("too large to store in a Decimal") => {
            Failure::new(K::NumericOutOfRange, format!("numeric field overflow: {m}"))
        }
        ArrowError::ArithmeticOverflow(m) => Failure::new(K::NumericOutOfRange, m.clone()),
        ArrowError::ComputeError(m) if m.contains("Overflow") || m.contains("overflow") => {
            Failure::new(K::NumericOutOfRange, m.clone())
        }
        ArrowError::InvalidArgumentError(m) if m.contains("non-nullable") => {
            Failure::new(K::NotNullViolation, m.clone())
        }
        ArrowError::ComputeError(m) | ArrowError::InvalidArgumentError(m) => {
            Failure::internal(m.clone())
        }
        // An error of Weir's own code inside an Arrow callback.
        ArrowError::ExternalError(inner) => {
            if let Some(x) = inner.downcast_ref::<ExecError>() {
                x.failure()
            } else if let Some(s) = inner.downcast_ref::<storage::StorageError>() {
                classify_storage(s)
            } else if let Some(d) = inner.downcast_ref::<DataFusionError>() {
                classify_datafusion(d)
            } else {
                Failure::internal(inner.to_string())
            }
        }
        other => Failure::internal(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_survives_its_name() {
        for (kind, name) in ErrorKind::NAMES {
            assert_eq!(kind.name(), name);
            assert_eq!(ErrorKind::from_name(name), kind);
        }
        assert_eq!(
            ErrorKind::from_name("from a newer build"),
            ErrorKind::Internal
        );
    }

    #[test]
    fn weir_errors_inside_datafusion_are_told_by_type() {
        let e = planner::PlanError::InvalidParameter("cannot delete from scalar".into())
            .into_datafusion();
        assert_eq!(
            classify_datafusion(&e),
            Failure::new(ErrorKind::InvalidParameter, "cannot delete from scalar")
        );
        let e = ExecError::DataFusion(DataFusionError::External(Box::new(ExecError::OutOfMemory(
            "out of managed memory: a view".into(),
        ))));
        assert_eq!(e.failure().kind, ErrorKind::OutOfMemory);
        let e = ExecError::Storage(storage::StorageError::DiskFull("RocksDB".into()));
        assert_eq!(e.failure().kind, ErrorKind::DiskFull);
        // Wrapped in context, the root still decides.
        let e = DataFusionError::ArrowError(Box::new(ArrowError::DivideByZero), None)
            .context("evaluating a projection");
        assert_eq!(
            classify_datafusion(&e),
            Failure::new(ErrorKind::DivisionByZero, "division by zero")
        );
    }

    #[test]
    fn arrow_kernels_are_worded_as_postgres_words_them() {
        let e = ArrowError::CastError("Can't cast value 300 to type Int8".into());
        assert_eq!(
            classify_arrow(&e),
            Failure::new(ErrorKind::NumericOutOfRange, "smallint out of range")
        );
        let e = ArrowError::CastError("Cannot cast string 'x' to value of Int32 type".into());
        assert_eq!(classify_arrow(&e).kind, ErrorKind::InvalidText);
        let e = ArrowError::ComputeError("Overflow happened on: 9223372036854775807 + 1".into());
        assert_eq!(classify_arrow(&e).kind, ErrorKind::NumericOutOfRange);
        let e = ExecError::Decode("kafka topic t partition 0 offset 1 cannot be decoded".into());
        assert_eq!(e.failure().kind, ErrorKind::InvalidText);
        let e = ExecError::Protocol("barrier 3 after 4".into());
        assert_eq!(e.failure().kind, ErrorKind::Internal);
    }

    #[test]
    fn datafusions_own_execution_errors_are_read_once() {
        let e = DataFusionError::Execution("Overflow happened on: 1 * 2".into());
        assert_eq!(classify_datafusion(&e).kind, ErrorKind::NumericOutOfRange);
        let e = DataFusionError::Execution("something else broke".into());
        assert_eq!(classify_datafusion(&e).kind, ErrorKind::Internal);
        let e = DataFusionError::NotImplemented("interval of months in a sum".into());
        assert_eq!(
            classify_datafusion(&e),
            Failure::new(ErrorKind::UnsupportedValue, "interval of months in a sum")
        );
    }
}

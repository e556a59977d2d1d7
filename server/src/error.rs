//! The one place where errors become Postgres errors: every failure of every
//! layer maps to a SQLSTATE here, and the session goes on.

use datafusion::arrow::error::ArrowError;
use datafusion::common::SchemaError;
use datafusion::error::DataFusionError;
use executor::{ErrorKind, Failure};
use pgwire::error::{ErrorInfo, PgWireError};

/// An error answered to a client.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Syntax(String),
    #[error("{0}")]
    UndefinedTable(String),
    #[error("{0}")]
    UndefinedColumn(String),
    #[error("{0}")]
    UndefinedFunction(String),
    #[error("{0}")]
    DuplicateObject(String),
    #[error("{0}")]
    DuplicateColumn(String),
    #[error("{0}")]
    DependentObjects(String),
    #[error("{0} is not supported")]
    Unsupported(String),
    /// A value that an operation is not defined on, told in Postgres's
    /// words (`cannot convert NaN to integer`).
    #[error("{0}")]
    UnsupportedValue(String),
    #[error("{0}")]
    DatatypeMismatch(String),
    #[error("{0}")]
    UniqueViolation(String),
    /// A concurrent statement changed a row this one read (retry it).
    #[error("{0}")]
    SerializationFailure(String),
    #[error("{0}")]
    NotNullViolation(String),
    #[error("{0}")]
    InvalidText(String),
    #[error("division by zero")]
    DivisionByZero,
    /// Division by zero, told with where it happened.
    #[error("{0}")]
    DivisionByZeroIn(String),
    /// Another error of a value (SQLSTATE class 22).
    #[error("{0}")]
    DataException(String),
    #[error("{0}")]
    NumericOutOfRange(String),
    #[error("{0}")]
    InvalidParameter(String),
    #[error("{0}")]
    InsufficientResources(String),
    #[error("{0}")]
    DiskFull(String),
    /// A job's state needs more managed memory than its slot has.
    #[error("{0}")]
    OutOfMemory(String),
    #[error("{0}")]
    UndefinedObject(String),
    #[error("{0}")]
    DuplicateName(String),
    #[error("{0}")]
    DuplicateSchema(String),
    #[error("{0}")]
    InvalidName(String),
    /// A name reserved for the system's objects (`pg_…` schemas).
    #[error("{0}")]
    ReservedName(String),
    /// A checkpoint file failed its checksum.
    #[error("{0}")]
    DataCorrupted(String),
    #[error("{0}")]
    Io(String),
    /// An external system a connector reads or writes cannot be reached
    /// or failed.
    #[error("{0}")]
    ConnectionFailure(String),
    #[error("{0}")]
    InvalidDatabase(String),
    #[error("{0}")]
    InvalidRole(String),
    #[error("{0}")]
    WrongObjectType(String),
    #[error("{0}")]
    InvalidTableDefinition(String),
    #[error("{0}")]
    InvalidObjectDefinition(String),
    /// What was asked for is no longer, or not yet, there (a view's
    /// history before its horizon).
    #[error("{0}")]
    NotInPrerequisiteState(String),
    #[error("{0}")]
    InvalidCursorName(String),
    /// Text longer than its column's declared length.
    #[error("{0}")]
    StringDataRightTruncation(String),
    /// A prepared statement that does not exist.
    #[error("{0}")]
    InvalidStatementName(String),
    #[error("{0}")]
    DuplicateCursor(String),
    #[error("{0}")]
    ReadOnlyTransaction(String),
    /// A statement in a transaction block after an error, before its end.
    #[error("{0}")]
    InFailedTransaction(String),
    /// A statement that may not run inside this transaction block.
    #[error("{0}")]
    ActiveTransaction(String),
    /// A statement that needs a transaction block, outside one.
    #[error("{0}")]
    NoActiveTransaction(String),
    /// `ROLLBACK TO` or `RELEASE` of a savepoint the block does not have.
    #[error("{0}")]
    InvalidSavepoint(String),
    /// A read-only run-time parameter.
    #[error("{0}")]
    CantChangeParameter(String),
    #[error("{0}")]
    InvalidSchemaName(String),
    /// A message out of place in the wire protocol.
    #[error("{0}")]
    Protocol(String),
    /// More than Weir takes in one go.
    #[error("{0}")]
    ProgramLimitExceeded(String),
    /// Expressions or queries nested deeper than Weir plans.
    #[error("{0}")]
    StatementTooComplex(String),
    /// COPY data that is not in the format the COPY said.
    #[error("{0}")]
    BadCopyFormat(String),
    /// Bytes that are not UTF-8.
    #[error("{0}")]
    CharacterNotInRepertoire(String),
    /// No cast between the two types (`1::jsonb`).
    #[error("{0}")]
    CannotCoerce(String),
    /// A character no text holds (`\u0000` in JSON).
    #[error("{0}")]
    UntranslatableCharacter(String),
    /// `statement_timeout` passed, or the client cancelled.
    #[error("{0}")]
    QueryCanceled(String),
    /// A connection limit is reached.
    #[error("{0}")]
    TooManyConnections(String),
    /// The object is in use (the session's own role, for one).
    #[error("{0}")]
    ObjectInUse(String),
    /// A scalar subquery that found more than one row.
    #[error("{0}")]
    CardinalityViolation(String),
    /// A role without the privilege a statement needs.
    #[error("{0}")]
    InsufficientPrivilege(String),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = ServerError> = std::result::Result<T, E>;

impl ServerError {
    /// The Postgres SQLSTATE.
    pub fn sqlstate(&self) -> &'static str {
        match self {
            ServerError::Syntax(_) => "42601",
            ServerError::UndefinedTable(_) => "42P01",
            ServerError::UndefinedColumn(_) => "42703",
            ServerError::UndefinedFunction(_) => "42883",
            ServerError::DuplicateObject(_) => "42P07",
            ServerError::DuplicateColumn(_) => "42701",
            ServerError::DependentObjects(_) => "2BP01",
            ServerError::Unsupported(_) | ServerError::UnsupportedValue(_) => "0A000",
            ServerError::DatatypeMismatch(_) => "42804",
            ServerError::InvalidTableDefinition(_) => "42P16",
            ServerError::InvalidObjectDefinition(_) => "42P17",
            ServerError::UniqueViolation(_) => "23505",
            ServerError::SerializationFailure(_) => "40001",
            ServerError::NotNullViolation(_) => "23502",
            ServerError::InvalidText(_) => "22P02",
            ServerError::DivisionByZero | ServerError::DivisionByZeroIn(_) => "22012",
            ServerError::DataException(_) => "22000",
            ServerError::NumericOutOfRange(_) => "22003",
            ServerError::InvalidParameter(_) => "22023",
            ServerError::CardinalityViolation(_) => "21000",
            ServerError::InsufficientResources(_) => "53000",
            ServerError::DiskFull(_) => "53100",
            ServerError::OutOfMemory(_) => "53200",
            ServerError::UndefinedObject(_) => "42704",
            ServerError::DuplicateName(_) => "42710",
            ServerError::DuplicateSchema(_) => "42P06",
            ServerError::InvalidName(_) => "42602",
            ServerError::ReservedName(_) => "42939",
            ServerError::DataCorrupted(_) => "XX001",
            ServerError::Io(_) => "58030",
            ServerError::ConnectionFailure(_) => "08001",
            ServerError::InvalidDatabase(_) => "3D000",
            ServerError::InvalidRole(_) => "28000",
            ServerError::WrongObjectType(_) => "42809",
            ServerError::NotInPrerequisiteState(_) => "55000",
            ServerError::InvalidCursorName(_) => "34000",
            ServerError::InvalidStatementName(_) => "26000",
            ServerError::StringDataRightTruncation(_) => "22001",
            ServerError::DuplicateCursor(_) => "42P03",
            ServerError::CantChangeParameter(_) => "55P02",
            ServerError::ReadOnlyTransaction(_) => "25006",
            ServerError::InFailedTransaction(_) => "25P02",
            ServerError::ActiveTransaction(_) => "25001",
            ServerError::NoActiveTransaction(_) => "25P01",
            ServerError::InvalidSavepoint(_) => "3B001",
            ServerError::QueryCanceled(_) => "57014",
            ServerError::InsufficientPrivilege(_) => "42501",
            ServerError::ObjectInUse(_) => "55006",
            ServerError::TooManyConnections(_) => "53300",
            ServerError::BadCopyFormat(_) => "22P04",
            ServerError::Protocol(_) => "08P01",
            ServerError::InvalidSchemaName(_) => "3F000",
            ServerError::ProgramLimitExceeded(_) => "54000",
            ServerError::StatementTooComplex(_) => "54001",
            ServerError::CharacterNotInRepertoire(_) => "22021",
            ServerError::UntranslatableCharacter(_) => "22P05",
            ServerError::CannotCoerce(_) => "42846",
            ServerError::Internal(_) => "XX000",
        }
    }

    pub fn unsupported(what: impl Into<String>) -> Self {
        ServerError::Unsupported(what.into())
    }

    /// As a pgwire error response.
    pub fn into_pgwire(self) -> PgWireError {
        PgWireError::UserError(Box::new(self.into_error_info()))
    }

    pub fn into_error_info(self) -> ErrorInfo {
        ErrorInfo::new(
            "ERROR".to_owned(),
            self.sqlstate().to_owned(),
            self.to_string(),
        )
    }
}

impl From<ServerError> for PgWireError {
    fn from(e: ServerError) -> Self {
        e.into_pgwire()
    }
}

fn from_arrow(e: &ArrowError) -> ServerError {
    from_failure(executor::classify_arrow(e))
}

/// The error a failure told by its kind stands for.
fn from_failure(f: Failure) -> ServerError {
    match f.kind {
        ErrorKind::DivisionByZero => ServerError::DivisionByZero,
        kind => with_kind(kind, f.message),
    }
}

/// The error of `kind`, told as `message`.
fn with_kind(kind: ErrorKind, message: String) -> ServerError {
    match kind {
        ErrorKind::DivisionByZero => ServerError::DivisionByZeroIn(message),
        ErrorKind::NumericOutOfRange => ServerError::NumericOutOfRange(message),
        ErrorKind::InvalidText => ServerError::InvalidText(message),
        ErrorKind::UntranslatableCharacter => ServerError::UntranslatableCharacter(message),
        ErrorKind::NotNullViolation => ServerError::NotNullViolation(message),
        ErrorKind::UnsupportedValue => ServerError::UnsupportedValue(message),
        ErrorKind::InvalidParameter => ServerError::InvalidParameter(message),
        ErrorKind::CardinalityViolation => ServerError::CardinalityViolation(message),
        ErrorKind::OutOfMemory => ServerError::OutOfMemory(message),
        ErrorKind::DiskFull => ServerError::DiskFull(message),
        ErrorKind::StatementTooComplex => ServerError::StatementTooComplex(message),
        ErrorKind::Internal => ServerError::Internal(message),
    }
}

impl From<DataFusionError> for ServerError {
    fn from(e: DataFusionError) -> Self {
        from_datafusion(&e)
    }
}

/// The error a DataFusion error stands for: by the root cause's variant,
/// and for errors Weir's own code raised inside DataFusion (`External`),
/// by their type.
fn from_datafusion(e: &DataFusionError) -> ServerError {
    let root = e.find_root();
    match root {
        DataFusionError::SQL(p, _) => ServerError::from(p.as_ref().clone()),
        DataFusionError::ArrowError(a, _) => from_arrow(a),
        DataFusionError::SchemaError(s, _) => match s.as_ref() {
            // DataFusion pulls a correlated subquery up into a join
            // one level at a time; a column of a query further out is
            // then missing from the join it made (`__correlated_sq_n`).
            SchemaError::FieldNotFound {
                field,
                valid_fields,
            } if valid_fields.iter().any(|c| {
                c.relation
                    .as_ref()
                    .is_some_and(|r| r.table().starts_with("__correlated_sq"))
            }) =>
            {
                ServerError::Unsupported(format!(
                    "a correlated subquery that refers to a column of a query two or more \
                         levels out ({field})"
                ))
            }
            SchemaError::FieldNotFound { .. } => {
                ServerError::UndefinedColumn(strip(&root.to_string()))
            }
            SchemaError::AmbiguousReference { .. } => ServerError::Syntax(strip(&root.to_string())),
            _ => ServerError::DuplicateColumn(strip(&root.to_string())),
        },
        DataFusionError::NotImplemented(m) if m.starts_with("cannot convert ") => {
            ServerError::UnsupportedValue(m.clone())
        }
        DataFusionError::NotImplemented(m) => ServerError::Unsupported(feature(m)),
        DataFusionError::Plan(m) => classify_plan(m),
        DataFusionError::ResourcesExhausted(m) => ServerError::InsufficientResources(m.clone()),
        DataFusionError::External(inner) => {
            if let Some(se) = inner.downcast_ref::<ServerError>() {
                return se.clone();
            }
            if let Some(pe) = inner.downcast_ref::<planner::PlanError>() {
                return from_plan(pe);
            }
            from_failure(executor::classify_datafusion(root))
        }
        DataFusionError::Execution(_) => from_failure(executor::classify_datafusion(root)),
        other => ServerError::Internal(strip(&other.to_string())),
    }
}

/// Drops DataFusion's "Error during planning: " style prefixes.
fn strip(m: &str) -> String {
    for prefix in [
        "Error during planning: ",
        "Schema error: ",
        "Execution error: ",
        "Arrow error: ",
    ] {
        if let Some(rest) = m.strip_prefix(prefix) {
            return rest.to_string();
        }
    }
    m.to_string()
}

fn classify_plan(m: &str) -> ServerError {
    let lower = m.to_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| lower.contains(w));
    if let Some(at) =
        m.strip_prefix("Accessing outer reference columns is not allowed in the plan: ")
    {
        // DataFusion could not pull the outer column out of the subquery,
        // and the front end did not give it one to refer to instead
        // (`pg_catalog::outer_refs` gives it only to qualified names).
        ServerError::Unsupported(format!(
            "a correlated subquery that cannot be turned into a join (outer column in {}: for \
             example, an outer column not qualified by its table's name, or one in the ON \
             condition of a right or full join inside the subquery)",
            at.lines().next().unwrap_or(at).trim()
        ))
    } else if m.starts_with("Correlated scalar subquery must be aggregated") {
        ServerError::Unsupported(
            "a correlated scalar subquery that neither aggregates nor is a single SELECT of one \
             value (a set operation, or a LIMIT that is not a number)"
                .into(),
        )
    } else if lower.starts_with("cannot cast type") {
        ServerError::CannotCoerce(m.to_string())
    } else if lower.contains("table") && lower.contains("not found") {
        // DataFusion: "table 'weir.public.t' not found"; Postgres names the
        // relation as written: `t`, or `s.t` in another schema.
        let full = m.split('\'').nth(1).unwrap_or(m);
        let in_database = full.strip_prefix("weir.").unwrap_or(full);
        let name = in_database.strip_prefix("public.").unwrap_or(in_database);
        ServerError::UndefinedTable(format!("relation \"{name}\" does not exist"))
    } else if any(&[
        "non-boolean predicate",
        "must be boolean",
        "expected boolean",
    ]) {
        // Postgres: argument of WHERE must be type boolean.
        ServerError::DatatypeMismatch(m.to_string())
    } else if any(&[
        "invalid function",
        "unknown function",
        "no function matches",
        "coercion",
        "cannot coerce",
        "cannot infer common",
        "failed to coerce",
        "does not support",
        "cannot be cast",
        // `interval * 2`: no such operator for these types.
        "cannot get result type",
    ]) {
        // Postgres: function or operator does not exist for these types.
        ServerError::UndefinedFunction(m.to_string())
    } else if any(&["unsupported", "not supported"]) {
        ServerError::Unsupported(feature(m))
    } else {
        ServerError::Syntax(m.to_string())
    }
}

/// The feature a DataFusion "not supported" message names, worded for
/// [`ServerError::Unsupported`]'s "… is not supported": "FETCH clause is
/// not supported yet" is "FETCH clause", "Unsupported SQL type JSONB" is
/// "type JSONB".
fn feature(m: &str) -> String {
    let mut f = m.trim().trim_end_matches('.').trim_end();
    f = f.strip_suffix(" yet").unwrap_or(f);
    for suffix in [" is not supported", " are not supported", " not supported"] {
        if let Some(head) = f.strip_suffix(suffix) {
            f = head;
            break;
        }
    }
    if let Some(t) = f.strip_prefix("Unsupported SQL type ") {
        return format!("type {t}");
    }
    // A subquery left in the plan: DataFusion could not turn it into a join.
    if let Some(e) = f.strip_prefix("Physical plan does not support logical expression ") {
        let kind = e.split('(').next().unwrap_or(e);
        return format!(
            "a correlated subquery that cannot be turned into a join ({kind}: for example, one \
             with a set operation, or a LIMIT per outer row in IN)"
        );
    }
    f.strip_prefix("Unsupported ").unwrap_or(f).to_string()
}

impl From<datafusion::arrow::error::ArrowError> for ServerError {
    fn from(e: datafusion::arrow::error::ArrowError) -> Self {
        DataFusionError::from(e).into()
    }
}

impl From<storage::StorageError> for ServerError {
    fn from(e: storage::StorageError) -> Self {
        use storage::StorageError as S;
        match e {
            S::DuplicateKey { .. } => ServerError::UniqueViolation(e.to_string()),
            S::NullValue(_) => ServerError::NotNullViolation(e.to_string()),
            S::SerializationFailure(_) => ServerError::SerializationFailure(e.to_string()),
            S::Arrow(a) => from_arrow(&a),
            S::DiskFull(_) => ServerError::DiskFull(e.to_string()),
            S::Corrupt(_) => ServerError::DataCorrupted(e.to_string()),
            S::CheckpointStorage(_) => ServerError::Io(e.to_string()),
            S::Unsupported(m) => ServerError::Unsupported(m),
            S::TooLarge(m) => ServerError::ProgramLimitExceeded(m),
            other => ServerError::Internal(other.to_string()),
        }
    }
}

impl From<planner::PlanError> for ServerError {
    fn from(e: planner::PlanError) -> Self {
        from_plan(&e)
    }
}

fn from_plan(e: &planner::PlanError) -> ServerError {
    use planner::PlanError as P;
    match e {
        P::Unsupported(m) => ServerError::Unsupported(m.clone()),
        P::InvalidDefinition(m) => ServerError::InvalidObjectDefinition(m.clone()),
        P::Syntax(m) => ServerError::Syntax(m.clone()),
        P::UndefinedTable(m) => ServerError::UndefinedTable(m.clone()),
        P::UndefinedColumn(m) => ServerError::UndefinedColumn(m.clone()),
        P::DatatypeMismatch(m) => ServerError::DatatypeMismatch(m.clone()),
        P::InvalidParameter(m) => ServerError::InvalidParameter(m.clone()),
        P::InvalidText(m) => ServerError::InvalidText(m.clone()),
        P::CardinalityViolation(m) => ServerError::CardinalityViolation(m.clone()),
        P::StatementTooComplex(m) => ServerError::StatementTooComplex(m.clone()),
        P::DataFusion(d) => from_datafusion(d),
        P::Internal(m) => ServerError::Internal(m.clone()),
    }
}

impl From<executor::ExecError> for ServerError {
    fn from(e: executor::ExecError) -> Self {
        use executor::ExecError as E;
        match e {
            E::Unsupported(m) => ServerError::Unsupported(m),
            E::InvalidOption(m) => ServerError::InvalidParameter(m),
            E::Connector(m) => ServerError::ConnectionFailure(m),
            E::DataFusion(d) => d.into(),
            E::Storage(s) => s.into(),
            E::Arrow(a) => from_arrow(&a),
            other => from_failure(other.failure()),
        }
    }
}

impl ServerError {
    /// The job of `kind` `name` (a materialized view, a sink) failed for
    /// good; the SQLSTATE is the task's failure's (division by zero, a bad
    /// cast, a record that cannot be decoded).
    pub fn job_failed(kind: &str, name: &str, error: &Failure) -> Self {
        with_kind(error.kind, format!("{kind} \"{name}\" failed: {error}"))
    }

    /// Materialized view `name` holds `rows` rows whose expressions fail,
    /// the first with `error`: the error, with its SQLSTATE, and where.
    pub fn view_error(name: &str, error: &Failure, rows: usize) -> Self {
        let message = format!(
            "{error} (materialized view \"{name}\" holds {rows} row{} whose expression fails; delete or correct {} to clear it)",
            if rows == 1 { "" } else { "s" },
            if rows == 1 { "it" } else { "them" },
        );
        match error.kind {
            ErrorKind::Internal => ServerError::DataException(message),
            kind => with_kind(kind, message),
        }
    }
}

impl From<cluster::ClusterError> for ServerError {
    fn from(e: cluster::ClusterError) -> Self {
        use cluster::ClusterError as C;
        match e {
            C::NotEnoughSlots { .. } => ServerError::InsufficientResources(e.to_string()),
            C::Exec(x) => x.into(),
            C::Storage(s) => s.into(),
            C::Plan(p) => p.into(),
            C::CorruptCheckpoint(_) => ServerError::DataCorrupted(e.to_string()),
            C::UnknownSavepoint(_) | C::NotInSavepoint { .. } => {
                ServerError::UndefinedObject(e.to_string())
            }
            C::SavepointExists(_) => ServerError::DuplicateName(e.to_string()),
            other => from_failure(other.failure()),
        }
    }
}

impl From<datafusion::sql::sqlparser::parser::ParserError> for ServerError {
    fn from(e: datafusion::sql::sqlparser::parser::ParserError) -> Self {
        use datafusion::sql::sqlparser::parser::ParserError as P;
        match e {
            P::RecursionLimitExceeded => ServerError::StatementTooComplex(
                "statement is too complex: its expressions are nested too deeply".into(),
            ),
            e => ServerError::Syntax(e.to_string()),
        }
    }
}

/// What a caught panic said.
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsupported_features_are_named_once() {
        for (datafusion, ours) in [
            (
                "FETCH clause is not supported yet",
                "FETCH clause is not supported",
            ),
            ("Unsupported SQL type JSONB", "type JSONB is not supported"),
            ("LATERAL joins", "LATERAL joins is not supported"),
            (
                "Physical plan does not support logical expression ScalarSubquery(<subquery>) is \
                 not supported",
                "a correlated subquery that cannot be turned into a join (ScalarSubquery: for \
                 example, one with a set operation, or a LIMIT per outer row in IN) is not \
                 supported",
            ),
        ] {
            let e: ServerError = DataFusionError::NotImplemented(datafusion.to_string()).into();
            assert_eq!(e.to_string(), ours);
            assert_eq!(e.sqlstate(), "0A000");
        }
    }
}

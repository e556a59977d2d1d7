use datafusion::arrow::error::ArrowError;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("rocksdb: {0}")]
    RocksDb(#[from] rocksdb::Error),
    #[error("arrow: {0}")]
    Arrow(#[from] ArrowError),
    #[error("corrupt data: {0}")]
    Corrupt(String),
    #[error(
        "duplicate key value violates unique constraint \"{constraint}\": Key ({key}) already exists"
    )]
    DuplicateKey { constraint: String, key: String },
    #[error("null value in column \"{0}\" violates not-null constraint")]
    NullValue(String),
    /// A row the statement read was changed by another statement since.
    #[error("could not serialize access to table \"{0}\" due to a concurrent update")]
    SerializationFailure(String),
    #[error("unknown table id {0}")]
    UnknownTable(u64),
    #[error("{0}")]
    Internal(String),
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

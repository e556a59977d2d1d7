//! The storage layer's one error type: RocksDB, checkpoint files, table rows.

use datafusion::arrow::error::ArrowError;

/// Errors of the storage layer.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    #[error("rocksdb: {0}")]
    RocksDb(rocksdb::Error),
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
    #[error("checkpoint storage: {0}")]
    CheckpointStorage(String),
    /// The disk (or quota) is full.
    #[error("could not write {0}: no space left on device")]
    DiskFull(String),
    #[error("{0}")]
    Unsupported(String),
    /// More than one write takes (a transaction block's changes).
    #[error("{0}")]
    TooLarge(String),
    #[error("{0}")]
    Internal(String),
}

impl From<rocksdb::Error> for StorageError {
    fn from(e: rocksdb::Error) -> Self {
        // RocksDB reports ENOSPC as an IOError with the OS's message.
        if e.as_ref().contains("No space left on device") {
            StorageError::DiskFull("RocksDB".into())
        } else {
            StorageError::RocksDb(e)
        }
    }
}

impl StorageError {
    /// An I/O error while writing `what`; a full disk is told apart.
    pub fn from_io(e: std::io::Error, what: &str) -> Self {
        if e.kind() == std::io::ErrorKind::StorageFull || e.raw_os_error() == Some(28) {
            StorageError::DiskFull(what.to_string())
        } else {
            StorageError::CheckpointStorage(format!("{what}: {e}"))
        }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;

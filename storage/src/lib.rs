//! Weir's ground floor: everything that touches RocksDB.
//!
//! Two kinds of durable data live here, on two RocksDB instances per process:
//!
//! * the **meta store** ([`meta::MetaStore`]): the catalog and the user's
//!   tables. A table is its current rows *and* a change log; every DML
//!   statement is written to both in one synchronous write batch, so an
//!   acknowledged `INSERT` survives `kill -9` and views can replay it.
//! * the **state store** ([`state::StateStore`]): the TaskManager's operator
//!   state. Operators hand their changed keys over at a checkpoint barrier; the
//!   writes are *staged* until the JobMaster declares the checkpoint complete
//!   and are then committed in one atomic batch. So RocksDB only ever holds the
//!   state of a completed checkpoint, and a `SELECT` scanning it reads a
//!   consistent snapshot.
//!
//! [`chunk::Chunk`] — an Arrow batch plus a change-op column — is the unit of
//! data everywhere above this crate, so it is defined here.

pub mod chunk;
pub mod codec;
mod error;
pub mod keys;
mod kv;
pub mod meta;
pub mod state;
pub mod table;

pub use error::{Result, StorageError};
pub use kv::KvStore;

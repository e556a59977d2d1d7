//! Weir's ground floor: everything that touches RocksDB.
//!
//! Two kinds of durable data live here:
//!
//! * the **meta store** ([`meta::MetaStore`]): the catalog and the user's
//!   tables. A table is its current rows *and* a change log; every DML
//!   statement is written to both in one synchronous write batch, so an
//!   acknowledged `INSERT` survives `kill -9` and views can replay it.
//! * **keyed state backends** ([`backend::KeyedStateBackend`]): one RocksDB
//!   instance per stateful subtask, in its TaskManager slot's memory.
//!   Operators hand their changed keys over at a checkpoint barrier; the
//!   backend writes them, takes a RocksDB checkpoint and copies the new SST
//!   files to **checkpoint storage** ([`checkpoint_storage`]), which holds
//!   the completed checkpoints every restart restores from.
//!
//! [`chunk::Chunk`] — an Arrow batch plus a change-op column — is the unit of
//! data everywhere above this crate, so it is defined here.

pub mod backend;
pub mod checkpoint_storage;
pub mod chunk;
pub mod codec;
mod error;
pub mod keys;
mod kv;
pub mod memory;
pub mod meta;
pub mod pending;
pub mod savepoint;
pub mod state;
pub mod table;

pub use error::{Result, StorageError};
pub use kv::{KvStore, SlotMemory};

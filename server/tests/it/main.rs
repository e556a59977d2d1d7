//! Weir's process-level tests, in one binary: each module is what used
//! to be a test binary of its own. They start real `weir` processes (and
//! PostgreSQL, a Kafka-protocol broker, an S3 server where a test needs
//! one) and talk to them over pgwire, as users do.
//!
//! One binary is built and linked once, instead of once per file; run a
//! module's tests by its name, e.g. `cargo test -p server --test it
//! slt::` (and `SLT=<file> …` for one `.slt` file).

mod common;

mod checkpoint_storage;
mod cluster;
mod consistency;
mod differential;
mod disk_full;
mod extended;
mod file_sink;
mod file_source;
mod jdbc;
mod kafka;
mod log_truncation;
mod odbc;
mod postgres_cdc;
mod postgres_sink;
mod protocol;
mod psql;
mod psycopg;
mod restart;
mod robustness;
mod roles;
mod session;
mod slt;
mod smoke;
mod state_backend;
mod subscribe;
mod transactions;
mod view_chains;
mod wire;

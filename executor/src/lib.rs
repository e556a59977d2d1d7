//! Weir's executor: the StreamTasks that run operator chains over Arrow
//! chunks, the in-band messages between them, and barrier alignment.
//!
//! A subtask is a [`task::StreamTask`]: an [`exchange::InputGate`] over its
//! input channels (or a table source), the aligner that turns barriers from
//! every channel into one aligned barrier, a chain of [`operator::Operator`]s
//! called directly, and [`exchange::OutputWriter`]s that partition its output.
//! Checkpointing lives in the task, once: operators only see
//! `handle_checkpoint` after alignment.
//!
//! The executor knows nothing of sessions or the cluster: it reports to the
//! TaskManager through [`task::TaskReporter`], which `cluster/` implements.

pub mod connectors;
mod error;
pub mod errors;
pub mod exchange;
pub mod expr;
pub mod formats;
pub mod message;
pub mod operator;
pub mod operators;
mod postgres;
pub mod read_once;
pub mod sinks;
pub mod state;
pub mod task;

pub use error::{
    ErrorKind, ExecError, Failure, Result, classify_arrow, classify_datafusion, classify_storage,
};

//! Weir's planner: pure functions from a DataFusion logical plan to the three
//! graphs of Flink's runtime.
//!
//! ```text
//! LogicalPlan ──lower──► StreamGraph ──chain──► JobGraph ──expand──► ExecutionGraph
//!  (DataFusion)          one node per operator   one vertex per chain  one subtask per
//!                        edges carry partitioners                      vertex × parallelism
//! ```
//!
//! Nothing here does I/O or knows about the cluster: the server hands in an
//! optimised logical plan, the JobMaster hands in the slots it got.

pub mod context;
pub mod decimal_division;
mod error;
pub mod execution_graph;
pub mod frames;
pub mod functions;
pub mod job_graph;
mod lower;
pub mod proctime;
pub mod source;
pub mod spec;
pub mod stream_graph;
pub mod temporal;
pub mod windows;
pub mod wire;

pub use error::{PlanError, Result};
pub use lower::{
    SinkTarget, StreamPlanOptions, check_deterministic, late_rows_state_table, lower,
    view_changelog_table, view_state_table,
};

//! The ExecutionGraph: every JobVertex expanded into `parallelism` subtasks
//! (Flink's `ExecutionVertex`), each with the slot it was given and the state
//! of its current attempt.
//!
//! Slot sharing as in Flink's default group: the job gets as many slots as
//! its largest parallelism, and subtask *i* of every vertex goes to slot *i*,
//! so two subtasks of one vertex never share a slot.

use std::fmt::{self, Write};

use crate::job_graph::JobGraph;
use crate::{PlanError, Result};

/// A slot of a TaskManager.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotId {
    pub task_manager: String,
    pub index: usize,
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}#{}", self.task_manager, self.index)
    }
}

/// Flink's `ExecutionState`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecutionState {
    Created,
    Scheduled,
    Deploying,
    Running,
    Finished,
    Canceling,
    Canceled,
    Failed,
}

impl fmt::Display for ExecutionState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ExecutionState::Created => "CREATED",
            ExecutionState::Scheduled => "SCHEDULED",
            ExecutionState::Deploying => "DEPLOYING",
            ExecutionState::Running => "RUNNING",
            ExecutionState::Finished => "FINISHED",
            ExecutionState::Canceling => "CANCELING",
            ExecutionState::Canceled => "CANCELED",
            ExecutionState::Failed => "FAILED",
        };
        f.write_str(s)
    }
}

/// One parallel instance of a vertex.
#[derive(Debug, Clone)]
pub struct ExecutionVertex {
    pub vertex: usize,
    pub subtask: usize,
    pub slot: SlotId,
    pub state: ExecutionState,
}

/// All subtasks of a job.
#[derive(Debug, Clone)]
pub struct ExecutionGraph {
    pub job: JobGraph,
    /// `subtasks[vertex][subtask]`.
    pub subtasks: Vec<Vec<ExecutionVertex>>,
}

impl ExecutionGraph {
    /// Number of slots the job needs.
    pub fn slots_needed(job: &JobGraph) -> usize {
        job.vertices
            .iter()
            .map(|v| v.parallelism)
            .max()
            .unwrap_or(1)
    }

    /// Expands `job` over `slots` (at least [`Self::slots_needed`] of them).
    pub fn build(job: JobGraph, slots: &[SlotId]) -> Result<Self> {
        let need = Self::slots_needed(&job);
        if slots.len() < need {
            return Err(PlanError::Internal(format!(
                "job needs {need} slots, got {}",
                slots.len()
            )));
        }
        let subtasks = job
            .vertices
            .iter()
            .map(|v| {
                (0..v.parallelism)
                    .map(|i| ExecutionVertex {
                        vertex: v.id,
                        subtask: i,
                        slot: slots[i].clone(),
                        state: ExecutionState::Created,
                    })
                    .collect()
            })
            .collect();
        Ok(Self { job, subtasks })
    }

    /// Every subtask.
    pub fn all(&self) -> impl Iterator<Item = &ExecutionVertex> {
        self.subtasks.iter().flatten()
    }

    /// EXPLAIN text.
    pub fn explain(&self) -> String {
        let mut out = String::from("ExecutionGraph:\n");
        for ev in self.all() {
            let p = self.job.vertices[ev.vertex].parallelism;
            let _ = writeln!(
                out,
                "  Vertex {} [{}] subtask {}/{} -> slot {} ({})",
                ev.vertex,
                self.job.vertex_name(ev.vertex),
                ev.subtask + 1,
                p,
                ev.slot,
                ev.state
            );
        }
        out
    }
}

//! The CheckpointCoordinator's bookkeeping: one pending checkpoint at a time
//! (Flink's default `max-concurrent-checkpoints = 1`), which completes when
//! every subtask has acknowledged it.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use executor::task::{SourcePosition, TaskId};

/// A checkpoint every subtask has acknowledged and every TaskManager has
/// committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompletedCheckpoint {
    pub id: u64,
    /// Table id → log sequence number every source of the job has passed.
    pub positions: HashMap<u64, u64>,
}

/// Flink's `PendingCheckpoint`.
#[derive(Debug)]
pub(crate) struct PendingCheckpoint {
    pub(crate) id: u64,
    pub(crate) started: Instant,
    waiting: HashSet<TaskId>,
    positions: HashMap<u64, u64>,
}

impl PendingCheckpoint {
    pub(crate) fn new(id: u64, tasks: impl IntoIterator<Item = TaskId>) -> Self {
        Self {
            id,
            started: Instant::now(),
            waiting: tasks.into_iter().collect(),
            positions: HashMap::new(),
        }
    }

    /// Whether `task` has yet to acknowledge.
    pub(crate) fn is_waiting_for(&self, task: &TaskId) -> bool {
        self.waiting.contains(task)
    }

    /// Records an acknowledgement; true when it was the last one.
    pub(crate) fn acknowledge(&mut self, task: &TaskId, positions: &[SourcePosition]) -> bool {
        if self.waiting.remove(task) {
            for p in positions {
                self.positions
                    .entry(p.table)
                    .and_modify(|s| *s = (*s).min(p.seq))
                    .or_insert(p.seq);
            }
        }
        self.waiting.is_empty()
    }

    pub(crate) fn complete(self) -> CompletedCheckpoint {
        CompletedCheckpoint {
            id: self.id,
            positions: self.positions,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(v: usize, s: usize) -> TaskId {
        TaskId {
            job: 1,
            vertex: v,
            subtask: s,
            attempt: 0,
        }
    }

    #[test]
    fn completes_on_last_ack_with_minimum_positions() {
        let mut p = PendingCheckpoint::new(3, [t(0, 0), t(1, 0), t(2, 0)]);
        assert!(!p.acknowledge(&t(0, 0), &[SourcePosition { table: 5, seq: 10 }]));
        assert!(
            !p.acknowledge(&t(0, 0), &[]),
            "a duplicate ack does not count"
        );
        assert!(!p.acknowledge(&t(1, 0), &[SourcePosition { table: 5, seq: 7 }]));
        assert!(p.acknowledge(&t(2, 0), &[]));
        let c = p.complete();
        assert_eq!(c.id, 3);
        assert_eq!(c.positions[&5], 7);
    }
}

//! The CheckpointCoordinator's bookkeeping: one pending checkpoint at a time
//! (Flink's default `max-concurrent-checkpoints = 1`), which completes when
//! every subtask has acknowledged it; and the statistics of recent
//! checkpoints (Flink's checkpoint history, `weir_catalog.checkpoints`).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant, SystemTime};

use executor::task::{CheckpointAck, DecodeErrors, TaskId};
use storage::checkpoint_storage::{SnapshotKind, StateHandle};

/// Where a checkpoint got to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CheckpointStatus {
    InProgress,
    Completed,
    /// Its state could not be committed.
    Failed,
    /// Expired, or dropped by a failover before it completed.
    Aborted,
}

impl std::fmt::Display for CheckpointStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            CheckpointStatus::InProgress => "IN_PROGRESS",
            CheckpointStatus::Completed => "COMPLETED",
            CheckpointStatus::Failed => "FAILED",
            CheckpointStatus::Aborted => "ABORTED",
        })
    }
}

/// One checkpoint as the history shows it.
#[derive(Debug, Clone)]
pub struct CheckpointStats {
    pub id: u64,
    pub kind: SnapshotKind,
    pub status: CheckpointStatus,
    pub triggered_at: SystemTime,
    /// From trigger to completion (or failure).
    pub duration: Option<Duration>,
    /// The longest any task held channels back to align the barrier.
    pub alignment: Duration,
    /// Bytes of every file the checkpoint references.
    pub full_bytes: u64,
    /// Bytes of the files it added to checkpoint storage (the rest it
    /// shares with earlier checkpoints).
    pub incremental_bytes: u64,
    pub acknowledged: usize,
    pub tasks: usize,
    /// Why it failed or was aborted.
    pub cause: Option<String>,
}

impl CheckpointStats {
    /// A checkpoint triggered now, with nothing acknowledged yet.
    pub(crate) fn new(id: u64, status: CheckpointStatus) -> Self {
        Self {
            id,
            kind: SnapshotKind::Checkpoint,
            status,
            triggered_at: SystemTime::now(),
            duration: None,
            alignment: Duration::ZERO,
            full_bytes: 0,
            incremental_bytes: 0,
            acknowledged: 0,
            tasks: 0,
            cause: None,
        }
    }
}

/// A checkpoint every subtask has acknowledged and every TaskManager has
/// committed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompletedCheckpoint {
    pub id: u64,
    /// Table id → log sequence number every source of the job has passed.
    pub positions: HashMap<u64, u64>,
    /// A connector source had more to read than it had read at the
    /// barrier (`FLUSH` waits for a checkpoint where none had).
    pub behind: bool,
    /// Per source (id) the job reads through a connector: the records its
    /// subtasks could not decode, up to this checkpoint.
    pub decode_errors: BTreeMap<u64, DecodeErrors>,
}

/// Flink's `PendingCheckpoint`.
#[derive(Debug)]
pub(crate) struct PendingCheckpoint {
    pub(crate) id: u64,
    pub(crate) started: Instant,
    waiting: HashSet<TaskId>,
    positions: HashMap<u64, u64>,
    behind: bool,
    decode_errors: BTreeMap<u64, DecodeErrors>,
    handles: Vec<StateHandle>,
    pub(crate) stats: CheckpointStats,
}

impl PendingCheckpoint {
    pub(crate) fn new(id: u64, tasks: impl IntoIterator<Item = TaskId>) -> Self {
        let waiting: HashSet<TaskId> = tasks.into_iter().collect();
        Self {
            id,
            started: Instant::now(),
            stats: CheckpointStats {
                tasks: waiting.len(),
                ..CheckpointStats::new(id, CheckpointStatus::InProgress)
            },
            waiting,
            positions: HashMap::new(),
            behind: false,
            decode_errors: BTreeMap::new(),
            handles: Vec::new(),
        }
    }

    /// Whether `task` has yet to acknowledge.
    pub(crate) fn is_waiting_for(&self, task: &TaskId) -> bool {
        self.waiting.contains(task)
    }

    /// Records an acknowledgement; true when it was the last one.
    pub(crate) fn acknowledge(&mut self, task: &TaskId, ack: CheckpointAck) -> bool {
        if self.waiting.remove(task) {
            for p in &ack.positions {
                self.positions
                    .entry(p.table)
                    .and_modify(|s| *s = (*s).min(p.seq))
                    .or_insert(p.seq);
            }
            self.behind |= ack.behind;
            if let Some(e) = &ack.decode_errors {
                self.decode_errors
                    .entry(e.source)
                    .or_insert_with(|| DecodeErrors {
                        source: e.source,
                        ..Default::default()
                    })
                    .add(e);
            }
            self.stats.acknowledged += 1;
            self.stats.alignment = self.stats.alignment.max(ack.alignment);
            self.handles.extend(ack.state);
        }
        self.waiting.is_empty()
    }

    /// Handles acknowledged so far (to clean up after an abort).
    pub(crate) fn handles(&self) -> &[StateHandle] {
        &self.handles
    }

    /// The checkpoint, its subtasks' handles and its statistics (still in
    /// progress: its metadata is yet to be written).
    pub(crate) fn complete(self) -> (CompletedCheckpoint, Vec<StateHandle>, CheckpointStats) {
        (
            CompletedCheckpoint {
                id: self.id,
                positions: self.positions,
                behind: self.behind,
                decode_errors: self.decode_errors,
            },
            self.handles,
            self.stats,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use executor::task::SourcePosition;

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
        let ack = |seq: Option<u64>, alignment_ms: u64| CheckpointAck {
            checkpoint_id: 3,
            positions: seq
                .map(|seq| vec![SourcePosition { table: 5, seq }])
                .unwrap_or_default(),
            alignment: Duration::from_millis(alignment_ms),
            ..Default::default()
        };
        let mut p = PendingCheckpoint::new(3, [t(0, 0), t(1, 0), t(2, 0)]);
        assert!(!p.acknowledge(&t(0, 0), ack(Some(10), 0)));
        assert!(
            !p.acknowledge(&t(0, 0), ack(None, 0)),
            "a duplicate ack does not count"
        );
        assert!(!p.acknowledge(&t(1, 0), ack(Some(7), 4)));
        assert!(p.acknowledge(&t(2, 0), ack(None, 2)));
        assert_eq!(p.stats.acknowledged, 3);
        assert_eq!(p.stats.alignment, Duration::from_millis(4));
        let (c, _, _) = p.complete();
        assert_eq!(c.id, 3);
        assert_eq!(c.positions[&5], 7);
        assert!(c.decode_errors.is_empty());
    }

    #[test]
    fn decode_errors_are_summed_per_source_and_the_latest_error_kept() {
        let ack = |records: u64, last: Option<(i64, &str)>| CheckpointAck {
            checkpoint_id: 1,
            decode_errors: Some(DecodeErrors {
                source: 8,
                records,
                last: last.map(|(t, m)| (t, m.to_string())),
            }),
            ..Default::default()
        };
        let mut p = PendingCheckpoint::new(1, [t(0, 0), t(0, 1), t(0, 2)]);
        p.acknowledge(&t(0, 0), ack(2, Some((20, "late"))));
        p.acknowledge(&t(0, 1), ack(0, None));
        p.acknowledge(&t(0, 2), ack(1, Some((10, "early"))));
        let (c, _, _) = p.complete();
        assert_eq!(
            c.decode_errors[&8],
            DecodeErrors {
                source: 8,
                records: 3,
                last: Some((20, "late".into()))
            }
        );
    }
}

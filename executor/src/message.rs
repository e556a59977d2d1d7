//! What travels on a channel between subtasks: data and control, in order.

use storage::chunk::Chunk;

/// A message on a channel.
#[derive(Debug, Clone)]
pub enum Message {
    Chunk(Chunk),
    Barrier(Barrier),
    Watermark(Watermark),
    /// The channel's far end failed (network shuffle only): the consuming
    /// task fails instead of taking the silence for the end of its input.
    Broken(String),
}

/// Kind of snapshot a barrier asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    Checkpoint,
    Savepoint,
}

/// A change to the job that takes effect at the barrier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mutation {
    None,
    Stop,
    Pause,
    Resume,
}

/// Flink's `CheckpointBarrier`: everything before it belongs to checkpoint
/// `checkpoint_id`, everything after to the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    pub checkpoint_id: u64,
    pub kind: BarrierKind,
    pub mutation: Mutation,
    /// When the coordinator triggered it (milliseconds since the Unix
    /// epoch), as Flink's barrier carries: one clock for every subtask, so
    /// decisions by time (a view's changelog retention) agree across them.
    pub timestamp_ms: u64,
    /// The last commit to several tables at once that the checkpoint
    /// includes (`storage::table::TableStore::last_commit` when it was
    /// triggered): every source of a job takes the log entries of one such
    /// commit into the same checkpoint. `u64::MAX`: every commit.
    pub commit: u64,
    /// A view's changelog keeps every epoch after this one, whatever its
    /// retention: a job reading the view through it still needs them
    /// (`u64::MAX`: no reader needs any).
    pub keep_after: u64,
}

impl Barrier {
    /// A checkpoint barrier stamped with this machine's clock.
    pub fn checkpoint(checkpoint_id: u64) -> Self {
        Self {
            checkpoint_id,
            kind: BarrierKind::Checkpoint,
            mutation: Mutation::None,
            timestamp_ms: (crate::operator::processing_time_us() / 1000).max(0) as u64,
            commit: u64::MAX,
            keep_after: u64::MAX,
        }
    }

    /// The barrier, including the commits to several tables up to
    /// `commit` and none after.
    pub fn with_commit(self, commit: u64) -> Self {
        Self { commit, ..self }
    }

    /// The barrier, keeping a view's changes after epoch `keep_after`.
    pub fn keeping_after(self, keep_after: u64) -> Self {
        Self { keep_after, ..self }
    }
}

/// Event time has reached `timestamp` (microseconds) on `column`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Watermark {
    pub column: usize,
    pub timestamp: i64,
}

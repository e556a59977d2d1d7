//! The operator contract, push-style as Arroyo's `ArrowOperator`.
//!
//! A StreamTask owns a chain of operators and calls them directly, one
//! message at a time, never concurrently. Barrier alignment happens in the
//! task before an operator sees `handle_checkpoint`, so an operator never
//! needs to know how many channels feed it.

use std::ops::Range;
use std::sync::Arc;

use storage::chunk::Chunk;
use storage::memory::MemoryPool;
use storage::state::StateWrite;

use crate::Result;
use crate::message::{Barrier, Watermark};
use crate::state::{StateBackend, StateStore};

/// What an operator knows about where it runs.
#[derive(Clone)]
pub struct OperatorContext {
    pub job_id: u64,
    pub subtask: usize,
    pub parallelism: usize,
    /// The key groups this subtask owns.
    pub key_groups: Range<u16>,
    /// The subtask's keyed state store.
    pub state: Arc<dyn StateStore>,
    /// The completed checkpoint the subtask restores (`None`: a fresh start).
    pub restored_from: Option<u64>,
    /// Where the job's operators keep their state.
    pub backend: StateBackend,
    /// The operator share of the slot's managed memory.
    pub memory: Arc<MemoryPool>,
}

impl std::fmt::Debug for OperatorContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorContext")
            .field("job_id", &self.job_id)
            .field("subtask", &self.subtask)
            .field("parallelism", &self.parallelism)
            .finish()
    }
}

/// A count kept in state as 8 big-endian bytes (a view row's, an error's,
/// a window's late rows); `what` names it if the bytes are not a count.
pub fn stored_count(value: &[u8], what: &str) -> crate::Result<i64> {
    let bytes = value
        .try_into()
        .map_err(|_| storage::StorageError::Corrupt(what.to_string()))?;
    Ok(i64::from_be_bytes(bytes))
}

/// Processing time: microseconds since the Unix epoch on this machine's clock.
pub fn processing_time_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as i64)
        .unwrap_or(0)
}

/// Output of one call: the chunks an operator emits.
pub type Collector = Vec<Chunk>;

/// A streaming operator.
pub trait Operator: Send {
    /// Name for logs and EXPLAIN.
    fn name(&self) -> &'static str;

    /// State tables this operator writes, known before it runs.
    fn tables(&self) -> Vec<u64> {
        Vec::new()
    }

    /// Called once before any message. Restores state from the last committed
    /// checkpoint (empty on a fresh job). May emit initial output, which the
    /// task sends before any input is processed.
    fn on_start(&mut self, _ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// Processes one chunk from input `input` (0, or 1 for the right side of
    /// a two-input operator). Must not block.
    fn process_batch(&mut self, input: usize, chunk: Chunk, out: &mut Collector) -> Result<()>;

    /// Event time advanced; returns the watermark to forward, if any.
    fn handle_watermark(
        &mut self,
        watermark: Watermark,
        _out: &mut Collector,
    ) -> Result<Option<Watermark>> {
        Ok(Some(watermark))
    }

    /// The processing time (microseconds since the Unix epoch) at which the
    /// operator wants [`Operator::on_timer`] called, if any.
    fn next_timer(&self) -> Option<i64> {
        None
    }

    /// Processing time has reached `now_us` (at or after `next_timer`).
    fn on_timer(&mut self, _now_us: i64, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// The barrier has arrived on every input, and the operator may emit
    /// what must be in this checkpoint's output (before the barrier).
    /// Called before [`Operator::handle_checkpoint`].
    fn before_checkpoint(&mut self, _barrier: &Barrier, _out: &mut Collector) -> Result<()> {
        Ok(())
    }

    /// The barrier has arrived on every input: write every state key changed
    /// since the previous barrier into `writes`. The writes become visible
    /// when the checkpoint completes.
    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        _writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        Ok(())
    }

    /// What the operator's keyed state holds now (`weir_catalog.state`),
    /// reported with each checkpoint.
    fn state_stats(&self, _out: &mut Vec<crate::state::OperatorStateStats>) {}

    /// Checkpoint `checkpoint_id` has completed and its state is committed.
    fn handle_commit(&mut self, _checkpoint_id: u64) -> Result<()> {
        Ok(())
    }

    /// The task is shutting down.
    fn on_close(&mut self) -> Result<()> {
        Ok(())
    }
}

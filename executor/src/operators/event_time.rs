//! Event time at a source: the watermark a source task derives from the
//! rows it reads (`WATERMARK FOR column AS expr`), shared by table and
//! connector sources.
//!
//! The watermark is the largest value of the expression seen so far; it is
//! sent downstream only when it advances, and travels with checkpoints so a
//! restart never moves event time backwards.

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::max;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::SourceWatermark;
use storage::state::StateWrite;

use crate::message::Watermark;
use crate::{Result, expr};

/// A source's event-time watermark.
#[derive(Default)]
pub(crate) struct EventTime {
    /// The expression over the source's columns; `None`: no watermark.
    expr: Option<Arc<dyn PhysicalExpr>>,
    /// The largest value seen (microseconds since the epoch).
    seen: Option<i64>,
    /// The watermark last sent downstream.
    emitted: Option<i64>,
}

impl EventTime {
    pub(crate) fn new(w: Option<&SourceWatermark>) -> Result<Self> {
        let expr = match w {
            Some(w) => {
                Some(expr::compile(std::slice::from_ref(&w.expr), &w.table_schema)?.remove(0))
            }
            None => None,
        };
        Ok(Self {
            expr,
            seen: None,
            emitted: None,
        })
    }

    /// Raises the watermark to the largest value of the expression over
    /// `data` (the source's columns, before any projection).
    pub(crate) fn observe(&mut self, data: &RecordBatch) -> Result<()> {
        let Some(e) = &self.expr else {
            return Ok(());
        };
        let values = e.evaluate(data)?.into_array(data.num_rows())?;
        if let Some(max) = max(&expr::timestamp_micros(&values)?) {
            self.advance(max);
        }
        Ok(())
    }

    /// Raises the watermark to `to` (a finished input: `i64::MAX`).
    pub(crate) fn advance(&mut self, to: i64) {
        self.seen = Some(self.seen.map_or(to, |w| w.max(to)));
    }

    /// The watermark, if it advanced since the last call.
    pub(crate) fn take(&mut self) -> Option<Watermark> {
        let w = self.seen?;
        if self.emitted.is_some_and(|e| e >= w) {
            return None;
        }
        self.emitted = Some(w);
        Some(Watermark {
            column: 0,
            timestamp: w,
        })
    }

    /// The watermark sent so far, as a state write under `key`.
    pub(crate) fn snapshot(
        &self,
        table: u64,
        key_group: u16,
        key: &[u8],
        writes: &mut Vec<StateWrite>,
    ) {
        if let Some(w) = self.emitted {
            writes.push(StateWrite {
                table,
                key_group,
                key: key.to_vec(),
                value: Some(w.to_be_bytes().to_vec()),
            });
        }
    }

    /// Restores a watermark written by [`EventTime::snapshot`].
    pub(crate) fn restore(&mut self, value: &[u8]) -> Result<()> {
        self.advance(decode(value)?);
        Ok(())
    }
}

/// A watermark as [`EventTime::snapshot`] wrote it.
pub(crate) fn decode(value: &[u8]) -> Result<i64> {
    let v: [u8; 8] = value
        .try_into()
        .map_err(|_| storage::StorageError::Corrupt("source watermark".into()))?;
    Ok(i64::from_be_bytes(v))
}

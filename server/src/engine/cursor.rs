//! Cursors: `DECLARE name CURSOR [WITH HOLD] FOR SELECT …` and `… FOR
//! SUBSCRIBE …`, read with `FETCH` and skipped with `MOVE`.
//!
//! A cursor over a `SELECT` answers from the snapshot the query read when
//! it was declared (Postgres's too reads one snapshot): the rows are
//! computed at `DECLARE` and handed out by `FETCH`. Weir runs every
//! statement as its own transaction, so a cursor `WITHOUT HOLD` (the
//! default) lives until the `COMMIT` or `ROLLBACK` that ends the block it
//! was declared in, or the end of the connection; one `WITH HOLD` until
//! `CLOSE`. A cursor over `SUBSCRIBE` follows the view until `CLOSE`.

use std::collections::VecDeque;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;

use crate::engine::subscribe::Subscription;
use crate::error::Result;

/// One open cursor.
#[derive(Debug)]
pub enum Cursor {
    Subscribe(Box<Subscription>),
    Rows {
        schema: SchemaRef,
        /// The rows not fetched yet.
        rows: VecDeque<RecordBatch>,
        /// `WITH HOLD`: outlives the transaction block.
        hold: bool,
    },
}

impl Cursor {
    pub fn rows(schema: SchemaRef, batches: Vec<RecordBatch>, hold: bool) -> Self {
        Cursor::Rows {
            schema,
            rows: batches.into_iter().filter(|b| b.num_rows() > 0).collect(),
            hold,
        }
    }

    pub fn schema(&self) -> SchemaRef {
        match self {
            Cursor::Subscribe(sub) => sub.schema(),
            Cursor::Rows { schema, .. } => schema.clone(),
        }
    }

    /// Whether the end of a transaction block closes it.
    pub fn closes_with_transaction(&self) -> bool {
        matches!(self, Cursor::Rows { hold: false, .. })
    }

    /// The next `max` rows (fewer at the end); a subscription waits for
    /// them until `deadline`.
    pub async fn fetch(
        &mut self,
        max: usize,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Vec<RecordBatch>> {
        match self {
            Cursor::Subscribe(sub) => sub.fetch(max, deadline).await,
            Cursor::Rows { rows, .. } => {
                let mut out = Vec::new();
                let mut left = max;
                while left > 0
                    && let Some(batch) = rows.pop_front()
                {
                    if batch.num_rows() <= left {
                        left -= batch.num_rows();
                        out.push(batch);
                    } else {
                        out.push(batch.slice(0, left));
                        rows.push_front(batch.slice(left, batch.num_rows() - left));
                        left = 0;
                    }
                }
                Ok(out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::Int32Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    #[tokio::test]
    async fn rows_come_out_in_order_across_batches() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let batch = |v: Vec<i32>| {
            RecordBatch::try_new(schema.clone(), vec![Arc::new(Int32Array::from(v))]).unwrap()
        };
        let mut c = Cursor::rows(
            schema.clone(),
            vec![batch(vec![1, 2, 3]), batch(vec![4, 5])],
            false,
        );
        let values = |b: Vec<RecordBatch>| -> Vec<i32> {
            b.iter()
                .flat_map(|b| {
                    b.column(0)
                        .as_any()
                        .downcast_ref::<Int32Array>()
                        .unwrap()
                        .values()
                        .to_vec()
                })
                .collect()
        };
        assert_eq!(values(c.fetch(2, None).await.unwrap()), vec![1, 2]);
        assert_eq!(values(c.fetch(2, None).await.unwrap()), vec![3, 4]);
        assert_eq!(values(c.fetch(usize::MAX, None).await.unwrap()), vec![5]);
        assert!(c.fetch(1, None).await.unwrap().is_empty());
        assert!(c.closes_with_transaction());
    }
}

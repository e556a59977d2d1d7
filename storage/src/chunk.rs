//! A [`Chunk`] is what flows between operators: an Arrow [`RecordBatch`] plus
//! a change-op column, as Flink's `RowKind` (`+I`, `-D`, `-U`, `+U`).
//!
//! The op column is kept beside the batch, not inside it, so operators can
//! hand `data` straight to DataFusion expressions and Arrow kernels.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, Int8Array, RecordBatch};
use datafusion::arrow::compute::{concat_batches, filter, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::ipc::reader::StreamReader;
use datafusion::arrow::ipc::writer::StreamWriter;

use crate::{Result, StorageError};

/// The kind of change a row carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(i8)]
pub enum Op {
    /// `+I`: a new row.
    Insert = 0,
    /// `-D`: a row removed.
    Delete = 1,
    /// `-U`: the old image of an updated row.
    UpdateDelete = 2,
    /// `+U`: the new image of an updated row.
    UpdateInsert = 3,
}

impl Op {
    /// `+1` for rows that add, `-1` for rows that retract.
    pub fn sign(self) -> i64 {
        match self {
            Op::Insert | Op::UpdateInsert => 1,
            Op::Delete | Op::UpdateDelete => -1,
        }
    }

    pub fn from_i8(v: i8) -> Result<Self> {
        Ok(match v {
            0 => Op::Insert,
            1 => Op::Delete,
            2 => Op::UpdateDelete,
            3 => Op::UpdateInsert,
            other => return Err(StorageError::Corrupt(format!("bad op {other}"))),
        })
    }

    /// Flink's short form.
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Insert => "+I",
            Op::Delete => "-D",
            Op::UpdateDelete => "-U",
            Op::UpdateInsert => "+U",
        }
    }
}

/// Name of the op column when a chunk is serialised as one batch.
pub const OP_COLUMN: &str = "__op";

/// A batch of changes.
#[derive(Debug, Clone)]
pub struct Chunk {
    ops: Int8Array,
    data: RecordBatch,
}

impl Chunk {
    /// Panics if the lengths differ: that is a bug in the caller.
    pub fn new(ops: Int8Array, data: RecordBatch) -> Self {
        assert_eq!(
            ops.len(),
            data.num_rows(),
            "op column and batch differ in length"
        );
        Self { ops, data }
    }

    /// Every row of `data` as an insert.
    pub fn inserts(data: RecordBatch) -> Self {
        let ops = Int8Array::from(vec![Op::Insert as i8; data.num_rows()]);
        Self { ops, data }
    }

    /// Rows with the given ops.
    pub fn with_ops(ops: &[Op], data: RecordBatch) -> Self {
        let ops = Int8Array::from_iter_values(ops.iter().map(|op| *op as i8));
        Self::new(ops, data)
    }

    pub fn ops(&self) -> &Int8Array {
        &self.ops
    }

    pub fn op(&self, row: usize) -> Op {
        // Ops are validated when a chunk is decoded; anything else is ours.
        Op::from_i8(self.ops.value(row)).unwrap_or(Op::Insert)
    }

    /// `+1`/`-1` per row.
    pub fn signs(&self) -> impl Iterator<Item = i64> + '_ {
        (0..self.ops.len()).map(|i| self.op(i).sign())
    }

    pub fn data(&self) -> &RecordBatch {
        &self.data
    }

    pub fn into_parts(self) -> (Int8Array, RecordBatch) {
        (self.ops, self.data)
    }

    pub fn num_rows(&self) -> usize {
        self.data.num_rows()
    }

    pub fn is_empty(&self) -> bool {
        self.num_rows() == 0
    }

    pub fn schema(&self) -> SchemaRef {
        self.data.schema()
    }

    /// Keeps the rows where `mask` is true.
    pub fn filter(&self, mask: &BooleanArray) -> Result<Self> {
        let ops = filter(&self.ops, mask)?;
        let ops = ops
            .as_any()
            .downcast_ref::<Int8Array>()
            .cloned()
            .ok_or_else(|| StorageError::Internal("filter changed the op column's type".into()))?;
        Ok(Self {
            ops,
            data: filter_record_batch(&self.data, mask)?,
        })
    }

    /// `len` rows from `offset` (zero-copy).
    pub fn slice(&self, offset: usize, len: usize) -> Self {
        Self {
            ops: self.ops.slice(offset, len),
            data: self.data.slice(offset, len),
        }
    }

    /// The chunk in pieces of at most `max_rows` rows (zero-copy slices;
    /// one piece when it is no larger), never parting an update's `-U`
    /// from the `+U` after it: so that what an operator builds per chunk
    /// stays bounded whatever the size of a write.
    pub fn split(self, max_rows: usize) -> Vec<Chunk> {
        let n = self.num_rows();
        let max_rows = max_rows.max(2);
        if n <= max_rows {
            return vec![self];
        }
        let mut pieces = Vec::with_capacity(n.div_ceil(max_rows));
        let mut start = 0;
        while start < n {
            let mut end = (start + max_rows).min(n);
            if end < n && self.op(end) == Op::UpdateInsert {
                // Its -U is the last row of this piece: keep them together.
                end -= 1;
            }
            pieces.push(self.slice(start, end - start));
            start = end;
        }
        pieces
    }

    /// The same ops over other columns (a projection).
    pub fn with_data(&self, data: RecordBatch) -> Self {
        Self::new(self.ops.clone(), data)
    }

    /// Concatenates chunks of one schema.
    pub fn concat(schema: &SchemaRef, chunks: &[Chunk]) -> Result<Self> {
        let ops: Vec<&dyn Array> = chunks.iter().map(|c| &c.ops as &dyn Array).collect();
        let ops = if ops.is_empty() {
            Int8Array::from(Vec::<i8>::new())
        } else {
            datafusion::arrow::compute::concat(&ops)?
                .as_any()
                .downcast_ref::<Int8Array>()
                .cloned()
                .ok_or_else(|| StorageError::Internal("concat changed the op type".into()))?
        };
        let data = concat_batches(schema, chunks.iter().map(|c| &c.data))?;
        Ok(Self { ops, data })
    }

    /// Rows at `indices`, in that order.
    pub fn take(&self, indices: &datafusion::arrow::array::UInt32Array) -> Result<Self> {
        let ops = take(&self.ops, indices, None)?;
        let ops = ops
            .as_any()
            .downcast_ref::<Int8Array>()
            .cloned()
            .ok_or_else(|| StorageError::Internal("take changed the op column's type".into()))?;
        let columns = self
            .data
            .columns()
            .iter()
            .map(|c| take(c, indices, None))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        let data = RecordBatch::try_new_with_options(
            self.data.schema(),
            columns,
            &datafusion::arrow::array::RecordBatchOptions::new()
                .with_row_count(Some(indices.len())),
        )?;
        Ok(Self { ops, data })
    }

    /// The chunk as one batch whose last column is the op.
    pub fn to_batch(&self) -> Result<RecordBatch> {
        let schema = self.data.schema();
        let mut fields: Vec<Arc<Field>> = schema.fields().iter().cloned().collect();
        fields.push(Arc::new(Field::new(OP_COLUMN, DataType::Int8, false)));
        let mut columns: Vec<ArrayRef> = self.data.columns().to_vec();
        columns.push(Arc::new(self.ops.clone()));
        Ok(RecordBatch::try_new_with_options(
            Arc::new(Schema::new(fields)),
            columns,
            &datafusion::arrow::array::RecordBatchOptions::new()
                .with_row_count(Some(self.num_rows())),
        )?)
    }

    /// Inverse of [`Chunk::to_batch`].
    pub fn from_batch(batch: RecordBatch) -> Result<Self> {
        let n = batch.num_columns();
        let Some(op_col) = n.checked_sub(1) else {
            return Err(StorageError::Corrupt(
                "chunk batch without op column".into(),
            ));
        };
        let ops = batch
            .column(op_col)
            .as_any()
            .downcast_ref::<Int8Array>()
            .cloned()
            .ok_or_else(|| StorageError::Corrupt("op column is not int8".into()))?;
        for v in ops.values().iter() {
            Op::from_i8(*v)?;
        }
        let data = batch.project(&(0..op_col).collect::<Vec<_>>())?;
        Ok(Self { ops, data })
    }

    /// Arrow IPC stream bytes, as written to table logs.
    pub fn to_ipc(&self) -> Result<Vec<u8>> {
        let batch = self.to_batch()?;
        let mut buf = Vec::new();
        {
            let mut w = StreamWriter::try_new(&mut buf, &batch.schema())?;
            w.write(&batch)?;
            w.finish()?;
        }
        Ok(buf)
    }

    /// Decodes [`Chunk::to_ipc`] output.
    pub fn from_ipc(bytes: &[u8]) -> Result<Self> {
        let mut reader = StreamReader::try_new(bytes, None)?;
        let batch = reader
            .next()
            .ok_or_else(|| StorageError::Corrupt("empty IPC stream".into()))??;
        Self::from_batch(batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("a", DataType::Int64, false),
                Field::new("b", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2, 3])),
                Arc::new(StringArray::from(vec![Some("x"), None, Some("z")])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn ipc_round_trip_keeps_ops() {
        let c = Chunk::with_ops(&[Op::Insert, Op::UpdateDelete, Op::UpdateInsert], batch());
        let back = Chunk::from_ipc(&c.to_ipc().unwrap()).unwrap();
        assert_eq!(back.data(), c.data());
        assert_eq!(back.op(1), Op::UpdateDelete);
        assert_eq!(back.signs().collect::<Vec<_>>(), vec![1, -1, 1]);
    }

    #[test]
    fn split_keeps_an_updates_two_rows_together() {
        let c = Chunk::with_ops(&[Op::Insert, Op::UpdateDelete, Op::UpdateInsert], batch());
        let sizes = |pieces: Vec<Chunk>| pieces.iter().map(Chunk::num_rows).collect::<Vec<_>>();
        assert_eq!(sizes(c.clone().split(3)), vec![3]);
        // A cut between -U and +U moves before the -U.
        assert_eq!(sizes(c.clone().split(2)), vec![1, 2]);
        let pieces = c.clone().split(2);
        assert_eq!(pieces[1].op(0), Op::UpdateDelete);
        assert_eq!(
            pieces[1].data().column(0).as_ref(),
            &Int64Array::from(vec![2, 3]) as &dyn Array
        );
        let inserts = Chunk::inserts(batch());
        assert_eq!(sizes(inserts.split(2)), vec![2, 1]);
    }

    #[test]
    fn filter_applies_to_ops_too() {
        let c = Chunk::with_ops(&[Op::Insert, Op::Delete, Op::Insert], batch());
        let f = c
            .filter(&BooleanArray::from(vec![false, true, false]))
            .unwrap();
        assert_eq!(f.num_rows(), 1);
        assert_eq!(f.op(0), Op::Delete);
    }
}

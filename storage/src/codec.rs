//! Row codec: Arrow's row format turns a tuple of columns into bytes that
//! compare like the values and decode back into columns, a batch at a time.
//! Weir uses it for table primary keys, group keys and state values.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};

use crate::Result;

/// Encodes and decodes rows of fixed column types.
#[derive(Debug)]
pub struct RowCodec {
    types: Vec<DataType>,
    converter: RowConverter,
}

impl RowCodec {
    pub fn new(types: Vec<DataType>) -> Result<Self> {
        let converter =
            RowConverter::new(types.iter().map(|t| SortField::new(t.clone())).collect())?;
        Ok(Self { types, converter })
    }

    /// A codec whose bytes sort as `ORDER BY` with these directions:
    /// `(type, descending, nulls_first)` per column.
    pub fn sorted(fields: Vec<(DataType, bool, bool)>) -> Result<Self> {
        let converter = RowConverter::new(
            fields
                .iter()
                .map(|(t, descending, nulls_first)| {
                    SortField::new_with_options(
                        t.clone(),
                        datafusion::arrow::compute::SortOptions {
                            descending: *descending,
                            nulls_first: *nulls_first,
                        },
                    )
                })
                .collect(),
        )?;
        Ok(Self {
            types: fields.into_iter().map(|(t, _, _)| t).collect(),
            converter,
        })
    }

    pub fn types(&self) -> &[DataType] {
        &self.types
    }

    /// One byte string per row of `columns`.
    pub fn encode(&self, columns: &[ArrayRef]) -> Result<Vec<Vec<u8>>> {
        self.encode_rows(columns, columns.first().map_or(0, |c| c.len()))
    }

    /// As [`Self::encode`], for `rows` rows: a codec of no columns (the
    /// key of a join without equalities) gives each row empty bytes, and
    /// there is no column to count the rows by.
    pub fn encode_rows(&self, columns: &[ArrayRef], rows: usize) -> Result<Vec<Vec<u8>>> {
        if self.types.is_empty() {
            return Ok(vec![Vec::new(); rows]);
        }
        let rows = self.converter.convert_columns(columns)?;
        Ok(rows.iter().map(|r| r.as_ref().to_vec()).collect())
    }

    /// Columns back from encoded rows.
    pub fn decode<'a>(&self, rows: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<ArrayRef>> {
        let parser = self.converter.parser();
        let rows: Vec<_> = rows.into_iter().map(|r| parser.parse(r)).collect();
        Ok(self.converter.convert_rows(rows)?)
    }

    /// Decodes into a batch of `schema` (which must have these types).
    pub fn decode_batch<'a>(
        &self,
        schema: &SchemaRef,
        rows: impl IntoIterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch> {
        let rows: Vec<&[u8]> = rows.into_iter().collect();
        let n = rows.len();
        let columns = self.decode(rows)?;
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(schema),
            columns,
            &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(n)),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Array, Int32Array, StringArray};

    #[test]
    fn round_trip() {
        let codec = RowCodec::new(vec![DataType::Int32, DataType::Utf8]).unwrap();
        let cols: Vec<ArrayRef> = vec![
            Arc::new(Int32Array::from(vec![Some(1), None])),
            Arc::new(StringArray::from(vec![Some("a"), Some("b")])),
        ];
        let rows = codec.encode(&cols).unwrap();
        let back = codec.decode(rows.iter().map(|r| r.as_slice())).unwrap();
        assert_eq!(back[0].as_ref(), cols[0].as_ref());
        assert!(back[0].is_null(1));
        assert_eq!(back[1].as_ref(), cols[1].as_ref());
    }
}

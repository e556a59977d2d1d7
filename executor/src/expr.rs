//! Physical expressions for operators, built once per subtask from the
//! planner's logical expressions and evaluated on whole batches; plus the one
//! hash function that routes keys to key groups.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, BooleanArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::{cast, prep_null_mask_filter};
use datafusion::arrow::datatypes::{DataType, Int64Type, TimeUnit};
use datafusion::arrow::datatypes::{Field, Schema, SchemaRef};
use datafusion::common::DFSchema;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::{PhysicalExpr, create_physical_expr};
use storage::keys::MAX_PARALLELISM;

use crate::{ExecError, Result};

/// Fixed so that a key maps to the same key group in every process and
/// after every restart: state is stored by key group.
const KEY_HASH: RandomState = RandomState::with_seed(0x5745_4952);

/// Compiles logical expressions over `schema`.
pub fn compile(exprs: &[Expr], schema: &DFSchema) -> Result<Vec<Arc<dyn PhysicalExpr>>> {
    let props = ExecutionProps::new();
    let ctx = PhysicalPlanningContext::default();
    exprs
        .iter()
        .map(|e| Ok(create_physical_expr(e, schema, &props, &ctx)?))
        .collect()
}

/// Evaluates expressions on a batch, one array each.
pub fn evaluate(exprs: &[Arc<dyn PhysicalExpr>], batch: &RecordBatch) -> Result<Vec<ArrayRef>> {
    exprs
        .iter()
        .map(|e| Ok(e.evaluate(batch)?.into_array(batch.num_rows())?))
        .collect()
}

/// The key group of every row of `keys`.
pub fn key_groups(keys: &[ArrayRef], rows: usize) -> Result<Vec<u16>> {
    let mut hashes = vec![0u64; rows];
    if !keys.is_empty() {
        create_hashes(keys, &KEY_HASH, &mut hashes)?;
    }
    Ok(hashes
        .into_iter()
        .map(|h| (h % MAX_PARALLELISM as u64) as u16)
        .collect())
}

/// The Arrow schema operators emit for a logical schema: every field
/// nullable, so that expressions DataFusion cannot prove non-null never make
/// a batch invalid.
pub fn output_schema(schema: &DFSchema) -> SchemaRef {
    Arc::new(Schema::new(
        schema
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), f.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ))
}

/// `columns` as a batch of `schema` (same types), keeping the row count even
/// when there are no columns.
pub fn batch(schema: &SchemaRef, columns: Vec<ArrayRef>, rows: usize) -> Result<RecordBatch> {
    Ok(RecordBatch::try_new_with_options(
        Arc::clone(schema),
        columns,
        &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(rows)),
    )?)
}

/// Evaluates a boolean predicate on `batch` as a selection mask: NULL is
/// not true (SQL's WHERE and ON).
pub fn predicate_mask(
    predicate: &Arc<dyn PhysicalExpr>,
    batch: &RecordBatch,
) -> Result<BooleanArray> {
    let values = predicate.evaluate(batch)?.into_array(batch.num_rows())?;
    let mask = values
        .as_any()
        .downcast_ref::<BooleanArray>()
        .ok_or_else(|| ExecError::Protocol(format!("predicate {predicate} is not boolean")))?;
    Ok(if mask.null_count() > 0 {
        prep_null_mask_filter(mask)
    } else {
        mask.clone()
    })
}

/// The column types of a logical schema, in order.
pub fn types(schema: &DFSchema) -> Vec<DataType> {
    schema
        .fields()
        .iter()
        .map(|f| f.data_type().clone())
        .collect()
}

/// A timestamp column as microseconds since the epoch: the unit of
/// watermarks.
pub fn timestamp_micros(column: &ArrayRef) -> Result<Int64Array> {
    let us = cast(column, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
    Ok(cast(&us, &DataType::Int64)?
        .as_primitive::<Int64Type>()
        .clone())
}

//! `proctime()`: processing time, the moment a row is written.
//!
//! As in RisingWave, it is meant for a column's default
//! (`pt timestamptz DEFAULT proctime()`): the value is fixed when the row is
//! inserted and stored with it, so every view downstream sees the same
//! value on every replay, and a `WATERMARK FOR pt` gives processing-time
//! windows. In a view's query it would change on every recomputation, so
//! it is refused there like `random()`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use crate::context::UTC;

#[derive(Debug, PartialEq, Eq, Hash)]
struct ProcTime {
    signature: Signature,
}

/// The `proctime()` function.
pub fn udf() -> ScalarUDF {
    ScalarUDF::new_from_impl(ProcTime {
        signature: Signature::nullary(Volatility::Volatile),
    })
}

impl ScalarUDFImpl for ProcTime {
    fn name(&self) -> &str {
        "proctime"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Timestamp(
            TimeUnit::Microsecond,
            Some(Arc::from(UTC)),
        ))
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> Result<ColumnarValue> {
        // Evaluated where the row is written, never while planning.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_micros() as i64)
            .unwrap_or(0);
        Ok(ColumnarValue::Scalar(ScalarValue::TimestampMicrosecond(
            Some(now),
            Some(Arc::from(UTC)),
        )))
    }
}

//! `weir_one_row(count, value)`: the value of a scalar subquery that is
//! to yield at most one row, or Postgres's error when it yields more.
//!
//! DataFusion turns a correlated scalar subquery into a join only when the
//! subquery aggregates. Postgres runs one that does not, and fails at run
//! time if it finds two rows for an outer row. So the SQL front end writes
//! `(SELECT b.y FROM b WHERE b.x = o.id)` as `(SELECT
//! weir_one_row(count(*), max(b.y)) FROM b WHERE b.x = o.id)`: with at
//! most one row, `max` is that row's value, and more rows are the error.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Postgres's message (SQLSTATE `21000`).
pub const MORE_THAN_ONE_ROW: &str =
    "more than one row returned by a subquery used as an expression";

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![Arc::new(ScalarUDF::new_from_impl(OneRow {
        signature: Signature::any(2, Volatility::Immutable),
    }))]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct OneRow {
    signature: Signature,
}

impl ScalarUDFImpl for OneRow {
    fn name(&self) -> &str {
        "weir_one_row"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args[1].clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let too_many = match &args.args[0] {
            ColumnarValue::Scalar(s) => match s {
                ScalarValue::Int64(Some(n)) => *n > 1,
                ScalarValue::Int64(None) | ScalarValue::Null => false,
                other => {
                    return Err(DataFusionError::Internal(format!(
                        "weir_one_row counts in bigint, not {}",
                        other.data_type()
                    )));
                }
            },
            ColumnarValue::Array(a) => match a.data_type() {
                DataType::Int64 => a
                    .as_primitive::<Int64Type>()
                    .iter()
                    .flatten()
                    .any(|n| n > 1),
                other => {
                    return Err(DataFusionError::Internal(format!(
                        "weir_one_row counts in bigint, not {other}"
                    )));
                }
            },
        };
        if too_many {
            return Err(
                crate::PlanError::CardinalityViolation(MORE_THAN_ONE_ROW.to_string())
                    .into_datafusion(),
            );
        }
        Ok(args.args[1].clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::Field;
    use datafusion::config::ConfigOptions;

    fn call(counts: Vec<Option<i64>>) -> Result<ColumnarValue> {
        let n = counts.len();
        let udf = &udfs()[0];
        udf.invoke_with_args(ScalarFunctionArgs {
            args: vec![
                ColumnarValue::Array(Arc::new(Int64Array::from(counts))),
                ColumnarValue::Array(Arc::new(StringArray::from(vec![Some("a"); n]))),
            ],
            arg_fields: vec![
                Arc::new(Field::new("n", DataType::Int64, true)),
                Arc::new(Field::new("v", DataType::Utf8, true)),
            ],
            number_rows: n,
            return_field: Arc::new(Field::new("r", DataType::Utf8, true)),
            config_options: Arc::new(ConfigOptions::default()),
        })
    }

    #[test]
    fn passes_at_most_one_row_and_fails_on_two() {
        let ok = call(vec![Some(0), Some(1), None]).unwrap();
        let ColumnarValue::Array(a) = ok else {
            panic!("an array in, an array out")
        };
        assert_eq!(a.len(), 3);
        let e = call(vec![Some(1), Some(2)]).unwrap_err();
        assert!(e.to_string().contains(MORE_THAN_ONE_ROW), "{e}");
    }
}

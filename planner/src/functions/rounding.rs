//! Numbers made whole as Postgres makes them.
//!
//! Arrow's casts from `numeric` or a float to an integer cut the fraction
//! off: `3.7::int` is 3 and `-3.5::int` is -3. Postgres rounds: a
//! `numeric` half away from zero (4 and -4), a float half to even as C's
//! `rint` does (`2.5::float8::int` is 2), and `round(float8)` is `rint`
//! too. [`PgRounding`], run after type coercion, rounds first — `round(x)`
//! for a decimal, `weir_rint(x)` for a float — and casts after.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::{DataType, Float32Type, Float64Type};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, TryCast, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![rint()]
}

fn rint() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Rint {
        signature: Signature::uniform(
            1,
            vec![DataType::Float64, DataType::Float32],
            Volatility::Immutable,
        ),
    }))
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct PgRounding;

impl AnalyzerRule for PgRounding {
    fn name(&self) -> &str {
        "weir_pg_rounding"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite)
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

/// `x` made whole: `round(x)` for a decimal, `weir_rint(x)` for a float.
fn whole(x: Expr, t: &DataType) -> Option<Expr> {
    if let Expr::ScalarFunction(f) = &x
        && matches!(f.name(), "round" | "weir_rint")
    {
        return None;
    }
    if is_float(t) {
        Some(Expr::ScalarFunction(ScalarFunction::new_udf(
            rint(),
            vec![x],
        )))
    } else if matches!(t, DataType::Decimal128(_, s) | DataType::Decimal256(_, s) if *s > 0) {
        Some(datafusion::functions::math::expr_fn::round(vec![x]))
    } else {
        None
    }
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let type_of = |x: &Expr| x.get_type(schema as &dyn ExprSchema);
    // The input of a cast to an integer, rounded.
    let rounded = |expr: &Expr| type_of(expr).ok().and_then(|t| whole(expr.clone(), &t));
    match e {
        Expr::Cast(Cast { expr, field }) if field.data_type().is_integer() => {
            Ok(match rounded(&expr) {
                Some(w) => Transformed::yes(Expr::Cast(Cast {
                    expr: Box::new(w),
                    field,
                })),
                None => Transformed::no(Expr::Cast(Cast { expr, field })),
            })
        }
        Expr::TryCast(TryCast { expr, field }) if field.data_type().is_integer() => {
            Ok(match rounded(&expr) {
                Some(w) => Transformed::yes(Expr::TryCast(TryCast {
                    expr: Box::new(w),
                    field,
                })),
                None => Transformed::no(Expr::TryCast(TryCast { expr, field })),
            })
        }
        // `round(float8)` with no places is `rint`.
        Expr::ScalarFunction(f)
            if f.name() == "round"
                && f.args.len() == 1
                && type_of(&f.args[0]).is_ok_and(|t| is_float(&t)) =>
        {
            Ok(Transformed::yes(Expr::ScalarFunction(
                ScalarFunction::new_udf(rint(), f.args),
            )))
        }
        e => Ok(Transformed::no(e)),
    }
}

/// `weir_rint(x)`: `x` rounded to a whole number, half to even.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Rint {
    signature: Signature,
}

impl ScalarUDFImpl for Rint {
    fn name(&self) -> &str {
        "weir_rint"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args.first().cloned().unwrap_or(DataType::Float64))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        Ok(match &args.args[0] {
            ColumnarValue::Scalar(ScalarValue::Float64(v)) => {
                ColumnarValue::Scalar(ScalarValue::Float64(v.map(f64::round_ties_even)))
            }
            ColumnarValue::Scalar(ScalarValue::Float32(v)) => {
                ColumnarValue::Scalar(ScalarValue::Float32(v.map(f32::round_ties_even)))
            }
            ColumnarValue::Array(a) => match a.data_type() {
                DataType::Float64 => ColumnarValue::Array(Arc::new(
                    a.as_primitive::<Float64Type>()
                        .unary::<_, Float64Type>(f64::round_ties_even),
                )),
                DataType::Float32 => ColumnarValue::Array(Arc::new(
                    a.as_primitive::<Float32Type>()
                        .unary::<_, Float32Type>(f32::round_ties_even),
                )),
                t => {
                    return Err(DataFusionError::Internal(format!("weir_rint of {t}")));
                }
            },
            other => {
                return Err(DataFusionError::Internal(format!(
                    "weir_rint of {}",
                    other.data_type()
                )));
            }
        })
    }
}

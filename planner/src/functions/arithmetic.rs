//! Arithmetic as Postgres does it.
//!
//! * Integer `+`, `-` and `*` fail with `integer out of range` (22003) on
//!   overflow; DataFusion's wrap around (`2147483647 + 1` is
//!   `-2147483648`). [`CheckedArithmetic`], an analyzer rule run after type
//!   coercion, rewrites them into `weir_checked_add` / `_sub` / `_mul`,
//!   which use Arrow's checked kernels.
//! * `sum(bigint)` is `numeric` in Postgres, so it never overflows where
//!   Postgres would not; DataFusion's is a `bigint` that wraps.
//!   [`SumAsNumeric`], run before type coercion, sums a `bigint` argument
//!   as `numeric(38, 0)`.
//! * `mod(a, b)` is Postgres's function for `%`.
//! * `interval * number`, `number * interval` and `interval / number`,
//!   which DataFusion refuses to type, are planned as Postgres's interval
//!   multiplication, and `timestamp - timestamp` as Postgres's interval
//!   (days and time), by [`PgOperators`], an expression planner consulted
//!   by DataFusion's SQL planner (`super::intervals`).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{AggregateFunction, ScalarFunction};
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr};
use datafusion::logical_expr::type_coercion::binary::binary_numeric_coercion;
use datafusion::logical_expr::{
    BinaryExpr, Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::sql::sqlparser::ast::BinaryOperator;

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![
        checked(Op::Add),
        checked(Op::Sub),
        checked(Op::Mul),
        Arc::new(ScalarUDF::new_from_impl(Mod {
            signature: Signature::user_defined(Volatility::Immutable),
        })),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
}

fn checked(op: Op) -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Checked {
        op,
        signature: Signature::user_defined(Volatility::Immutable),
    }))
}

/// `weir_checked_add(a, b)` and its siblings: integers of one type.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Checked {
    op: Op,
    signature: Signature,
}

/// Postgres's name of an integer type, for its out-of-range message.
fn integer_name(t: &DataType) -> &'static str {
    match t {
        DataType::Int16 => "smallint",
        DataType::Int64 => "bigint",
        _ => "integer",
    }
}

fn is_integer(t: &DataType) -> bool {
    matches!(t, DataType::Int16 | DataType::Int32 | DataType::Int64)
}

/// Evaluates a binary kernel over two arguments, as arrays or scalars.
fn binary(
    args: &ScalarFunctionArgs,
    f: impl Fn(&ArrayRef, &ArrayRef) -> Result<ArrayRef>,
) -> Result<ColumnarValue> {
    let [l, r] = args.args.as_slice() else {
        return Err(DataFusionError::Internal("two arguments expected".into()));
    };
    let scalar = matches!((l, r), (ColumnarValue::Scalar(_), ColumnarValue::Scalar(_)));
    let rows = if scalar { 1 } else { args.number_rows };
    let out = f(&l.to_array(rows)?, &r.to_array(rows)?)?;
    Ok(if scalar {
        ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
    } else {
        ColumnarValue::Array(out)
    })
}

impl ScalarUDFImpl for Checked {
    fn name(&self) -> &str {
        match self.op {
            Op::Add => "weir_checked_add",
            Op::Sub => "weir_checked_sub",
            Op::Mul => "weir_checked_mul",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        let Some((first, rest)) = args.split_first().filter(|(_, rest)| !rest.is_empty()) else {
            return Err(DataFusionError::Plan(format!(
                "{} takes two or more arguments",
                self.name()
            )));
        };
        let t = rest.iter().fold(first.clone(), |t, a| {
            binary_numeric_coercion(&t, a).unwrap_or(DataType::Int64)
        });
        Ok(vec![t; args.len()])
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args.first().cloned().unwrap_or(DataType::Int64))
    }

    /// `a op b op c …`, evaluated from the left as the chain it stands for.
    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let op = self.op;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if scalar { 1 } else { args.number_rows };
        let mut terms = args.args.iter();
        let Some(first) = terms.next() else {
            return Err(DataFusionError::Internal("no arguments".into()));
        };
        let mut acc = first.to_array(rows)?;
        for term in terms {
            let r = term.to_array(rows)?;
            let result = match op {
                Op::Add => numeric::add(&acc, &r),
                Op::Sub => numeric::sub(&acc, &r),
                Op::Mul => numeric::mul(&acc, &r),
            };
            acc = result.map_err(|e| match e {
                ArrowError::ArithmeticOverflow(_) => DataFusionError::ArrowError(
                    Box::new(ArrowError::ArithmeticOverflow(format!(
                        "{} out of range",
                        integer_name(acc.data_type())
                    ))),
                    None,
                ),
                other => DataFusionError::ArrowError(Box::new(other), None),
            })?;
        }
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&acc, 0)?)
        } else {
            ColumnarValue::Array(acc)
        })
    }
}

/// `mod(a, b)`: the remainder of `a / b`, with `a`'s sign; `b = 0` is an
/// error (22012), as in Postgres.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Mod {
    signature: Signature,
}

impl ScalarUDFImpl for Mod {
    fn name(&self) -> &str {
        "mod"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        match args {
            [l, r] => {
                let t = binary_numeric_coercion(l, r).ok_or_else(|| {
                    DataFusionError::Plan(format!("function mod({l}, {r}) does not exist"))
                })?;
                Ok(vec![t.clone(), t])
            }
            _ => Err(DataFusionError::Plan("mod takes two arguments".into())),
        }
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        Ok(args.first().cloned().unwrap_or(DataType::Int64))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        binary(&args, |l, r| {
            numeric::rem(l, r).map_err(|e| DataFusionError::ArrowError(Box::new(e), None))
        })
    }
}

fn call(udf: Arc<ScalarUDF>, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(udf, args))
}

/// Integer `+`, `-`, `*` checked for overflow; runs after type coercion.
#[derive(Debug, Default)]
pub(crate) struct CheckedArithmetic;

impl AnalyzerRule for CheckedArithmetic {
    fn name(&self) -> &str {
        "weir_checked_arithmetic"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, checked_operators)
    }
}

fn checked_operators(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = e else {
        return Ok(Transformed::no(e));
    };
    let udf = match op {
        Operator::Plus => Some(Op::Add),
        Operator::Minus => Some(Op::Sub),
        Operator::Multiply => Some(Op::Mul),
        _ => None,
    };
    let types = (type_of(&left, schema), type_of(&right, schema));
    match (udf, types) {
        (Some(op), (Ok(l), Ok(r))) if is_integer(&l) && l == r => {
            let udf = checked(op);
            // A chain `a + b + c …` (ORMs and generated SQL write them
            // thousands of terms long) becomes one call over its terms.
            // Nested calls would each be named over their whole subtree,
            // and DataFusion names an expression whenever it types it:
            // cubic in the chain's length.
            match *left {
                Expr::ScalarFunction(mut f) if f.func.name() == udf.name() => {
                    f.args.push(*right);
                    Ok(Transformed::yes(Expr::ScalarFunction(f)))
                }
                left => Ok(Transformed::yes(call(udf, vec![left, *right]))),
            }
        }
        _ => Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
            left, op, right,
        )))),
    }
}

/// The type of `e`; a checked call has its first term's, found without
/// typing (and so naming) the call itself.
fn type_of(e: &Expr, schema: &DFSchema) -> Result<DataType> {
    let mut e = e;
    while let Expr::ScalarFunction(f) = e {
        match f.args.first() {
            Some(first) if f.func.name().starts_with("weir_checked_") => e = first,
            _ => break,
        }
    }
    e.get_type(schema as &dyn ExprSchema)
}

/// `sum(bigint)` as `sum(numeric)`; runs before type coercion, so that
/// whatever uses the sum is typed for a numeric.
#[derive(Debug, Default)]
pub(crate) struct SumAsNumeric;

impl AnalyzerRule for SumAsNumeric {
    fn name(&self) -> &str {
        "weir_sum_as_numeric"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, sum_as_numeric)
    }
}

fn sum_as_numeric(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::AggregateFunction(mut agg)
            if agg.func.name() == "sum"
                && agg.params.args.len() == 1
                && agg.params.args[0]
                    .get_type(schema as &dyn ExprSchema)
                    .is_ok_and(|t| t == DataType::Int64) =>
        {
            let arg = agg.params.args.remove(0);
            agg.params.args.push(Expr::Cast(Cast::new(
                Box::new(arg),
                DataType::Decimal128(38, 0),
            )));
            Ok(Transformed::yes(Expr::AggregateFunction(
                AggregateFunction {
                    func: agg.func,
                    params: agg.params,
                },
            )))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// The SQL planner's hook for binary operators DataFusion cannot type.
#[derive(Debug, Default)]
pub(crate) struct PgOperators;

impl ExprPlanner for PgOperators {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let interval = |e: &Expr| {
            matches!(
                e.get_type(schema as &dyn ExprSchema),
                Ok(DataType::Interval(_) | DataType::Duration(_))
            )
        };
        let timestamp = |e: &Expr| {
            matches!(
                e.get_type(schema as &dyn ExprSchema),
                Ok(DataType::Timestamp(..))
            )
        };
        let number = |e: &Expr| {
            e.get_type(schema as &dyn ExprSchema)
                .is_ok_and(|t| t.is_numeric())
        };
        let planned = match expr.op {
            BinaryOperator::Minus if timestamp(&expr.left) && timestamp(&expr.right) => Some(
                super::intervals::timestamp_difference(expr.left.clone(), expr.right.clone()),
            ),
            BinaryOperator::Multiply if interval(&expr.left) && number(&expr.right) => Some(
                super::intervals::multiply(expr.left.clone(), expr.right.clone()),
            ),
            BinaryOperator::Multiply if number(&expr.left) && interval(&expr.right) => Some(
                super::intervals::multiply(expr.right.clone(), expr.left.clone()),
            ),
            BinaryOperator::Divide if interval(&expr.left) && number(&expr.right) => Some(
                super::intervals::divide(expr.left.clone(), expr.right.clone()),
            ),
            _ => None,
        };
        Ok(match planned {
            Some(e) => PlannerResult::Planned(e),
            None => PlannerResult::Original(expr),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int32Array;

    fn args(l: ArrayRef, r: ArrayRef) -> ScalarFunctionArgs {
        let n = l.len();
        ScalarFunctionArgs {
            args: vec![ColumnarValue::Array(l), ColumnarValue::Array(r)],
            arg_fields: vec![],
            number_rows: n,
            return_field: Arc::new(datafusion::arrow::datatypes::Field::new(
                "r",
                DataType::Int32,
                true,
            )),
            config_options: Arc::new(ConfigOptions::default()),
        }
    }

    #[test]
    fn integer_overflow_is_an_error() {
        let add = Checked {
            op: Op::Add,
            signature: Signature::user_defined(Volatility::Immutable),
        };
        let e = add
            .invoke_with_args(args(
                Arc::new(Int32Array::from(vec![i32::MAX])),
                Arc::new(Int32Array::from(vec![1])),
            ))
            .unwrap_err();
        assert!(e.to_string().contains("integer out of range"), "{e}");
        let ok = add
            .invoke_with_args(args(
                Arc::new(Int32Array::from(vec![1, 2])),
                Arc::new(Int32Array::from(vec![3, 4])),
            ))
            .unwrap();
        let ColumnarValue::Array(a) = ok else {
            panic!("an array")
        };
        assert_eq!(
            a.as_any().downcast_ref::<Int32Array>().unwrap().values(),
            &[4, 6]
        );
    }

    #[test]
    fn mod_keeps_the_dividends_sign() {
        let m = Mod {
            signature: Signature::user_defined(Volatility::Immutable),
        };
        let ColumnarValue::Array(a) = m
            .invoke_with_args(args(
                Arc::new(Int32Array::from(vec![7, -7])),
                Arc::new(Int32Array::from(vec![3, 3])),
            ))
            .unwrap()
        else {
            panic!("an array")
        };
        assert_eq!(
            a.as_any().downcast_ref::<Int32Array>().unwrap().values(),
            &[1, -1]
        );
    }
}

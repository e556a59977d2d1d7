//! SQL as Postgres means it, where DataFusion's built-ins differ: functions
//! (registered in every context that plans SQL and in the registry job
//! graphs are decoded with, so a view computes exactly what a `SELECT` of
//! the same query does), analyzer rules and SQL-planner hooks.
//!
//! - `to_char(timestamp, text)` takes Postgres's template patterns
//!   (`YYYY-MM-DD HH24:MI:SS`, see [`to_char`]); DataFusion's takes
//!   chrono's (`%Y-%m-%d`) and copies Postgres patterns through as text, a
//!   wrong answer.
//! - intervals compare, subtract and multiply as Postgres's ([`intervals`]);
//! - integer arithmetic fails on overflow, `sum(bigint)` is numeric, and
//!   `mod()` exists ([`arithmetic`]);
//! - text becomes integers, numerics and timestamps as Postgres reads
//!   them ([`input`]);
//! - `encode` and `decode` know the `escape` format ([`bytea`]);
//! - `jsonb` is a type, with its operators and functions ([`jsonb`]);
//! - `numeric` has `NaN` and `±Infinity` ([`numeric_special`]);
//! - a scalar subquery that finds two rows is an error ([`one_row`]).

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, StringBuilder, TimestampMicrosecondArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::expr_rewriter::NamePreserver;
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};

mod age;
mod arithmetic;
mod bytea;
mod decimal_sum;
mod input;
pub mod intervals;
pub mod jsonb;
pub mod numeric_special;
pub mod one_row;
mod rounding;
mod similar_to;
mod special_sums;
mod to_char;

use to_char::Template;

/// Weir's versions of functions DataFusion also has, and Postgres's that
/// it lacks.
pub fn udfs() -> Vec<Arc<ScalarUDF>> {
    let mut all = vec![Arc::new(ScalarUDF::new_from_impl(ToChar {
        signature: Signature::any(2, Volatility::Immutable),
    }))];
    all.extend(intervals::udfs());
    all.extend(arithmetic::udfs());
    all.extend(input::udfs());
    all.extend(bytea::udfs());
    all.extend(jsonb::udfs());
    all.extend(similar_to::udfs());
    all.extend(rounding::udfs());
    all.extend(age::udfs());
    all.extend(numeric_special::udfs());
    all.extend(one_row::udfs());
    all
}

type Rule = Arc<dyn datafusion::optimizer::AnalyzerRule + Send + Sync>;

/// Analyzer rules that must run before DataFusion's type coercion.
pub fn early_analyzer_rules() -> Vec<Rule> {
    vec![Arc::new(arithmetic::SumAsNumeric)]
}

/// Analyzer rules that give SQL Postgres's meaning where DataFusion's
/// differs; they run after DataFusion's own (after type coercion).
pub fn analyzer_rules() -> Vec<Rule> {
    vec![
        Arc::new(input::TextInput),
        Arc::new(intervals::PgIntervals),
        Arc::new(arithmetic::CheckedArithmetic),
        Arc::new(jsonb::JsonbInput),
        Arc::new(jsonb::JsonbOrder),
        Arc::new(decimal_sum::WideWindowSum),
        Arc::new(similar_to::SimilarTo),
        Arc::new(rounding::PgRounding),
        // Last: it sees every decimal computation the others write.
        Arc::new(numeric_special::NumericSpecials),
    ]
}

/// Analyzer rules for batch queries only (see [`special_sums`] and
/// [`decimal_sum`]).
pub fn batch_analyzer_rules() -> Vec<Rule> {
    vec![
        Arc::new(special_sums::SpecialSums),
        Arc::new(decimal_sum::WideDecimalSum),
    ]
}

type Planner = Arc<dyn datafusion::logical_expr::planner::ExprPlanner>;

/// Hooks of the SQL planner that go before DataFusion's own (whose `@>`
/// and `||` are for arrays).
pub fn first_expr_planners() -> Vec<Planner> {
    vec![Arc::new(jsonb::JsonbOperators)]
}

/// Hooks of the SQL planner for what DataFusion would refuse to plan.
pub fn expr_planners() -> Vec<Planner> {
    vec![Arc::new(arithmetic::PgOperators)]
}

/// The SQL planner's hook for the types Weir adds (`jsonb`).
pub fn type_planner() -> Arc<dyn datafusion::logical_expr::planner::TypePlanner> {
    Arc::new(jsonb::JsonbType)
}

/// The type a function `name` takes by name as an argument (`arg`, the
/// text `Decimal128(10, 2)`), for its return type.
fn type_argument(name: &str, arg: Option<&ScalarValue>) -> Result<DataType> {
    match arg {
        Some(ScalarValue::Utf8(Some(t))) => t
            .parse()
            .map_err(|e| DataFusionError::Internal(format!("{name} type {t}: {e}"))),
        _ => Err(DataFusionError::Internal(format!(
            "{name} takes a type name as its second argument"
        ))),
    }
}

/// Rewrites every expression of `plan` bottom-up with `f`, given the
/// schema of the node's inputs, for an analyzer rule.
pub fn rewrite_plan(
    plan: LogicalPlan,
    f: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| rewrite_node(node, &f))
        .map(|t| t.data)
}

/// As [`rewrite_plan`], and first, at each `Sort`, every sort key for which
/// `key` (given the input's schema) gives another expression sorts by that
/// instead: for values whose Arrow order is not Postgres's (intervals,
/// `jsonb`).
pub fn rewrite_plan_and_sorts(
    plan: LogicalPlan,
    key: impl Fn(&Expr, &DFSchema) -> Option<Expr>,
    f: impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<LogicalPlan> {
    plan.transform_up_with_subqueries(|node| {
        let node = match node {
            LogicalPlan::Sort(mut sort) => {
                let schema = sort.input.schema().clone();
                let mut changed = false;
                for s in sort.expr.iter_mut() {
                    if let Some(e) = key(&s.expr, &schema) {
                        s.expr = e;
                        changed = true;
                    }
                }
                let node = LogicalPlan::Sort(sort);
                if changed {
                    Transformed::yes(node)
                } else {
                    Transformed::no(node)
                }
            }
            other => Transformed::no(other),
        };
        node.transform_data(|n| rewrite_node(n, &f))
    })
    .map(|t| t.data)
}

/// [`rewrite_plan`]'s step at one node. The node keeps the names of its
/// outputs (an aggregate's or a projection's columns are named after their
/// expressions, and the nodes above refer to them by those names) and its
/// schema is derived again, as types may change.
pub fn rewrite_node(
    node: LogicalPlan,
    f: &impl Fn(Expr, &DFSchema) -> Result<Transformed<Expr>>,
) -> Result<Transformed<LogicalPlan>> {
    let mut schema = DFSchema::empty();
    for input in node.inputs() {
        schema.merge(input.schema());
    }
    if node.inputs().is_empty() {
        schema.merge(node.schema());
    }
    let names = NamePreserver::new(&node);
    let node = node.map_expressions(|e| {
        let saved = names.save(&e);
        Ok(e.transform_up(|e| f(e, &schema))?
            .update_data(|e| saved.restore(e)))
    })?;
    if !node.transformed {
        return Ok(node);
    }
    node.map_data(|n| n.recompute_schema())
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToChar {
    signature: Signature,
}

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        "to_char"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args.first() {
            Some(
                DataType::Timestamp(..) | DataType::Date32 | DataType::Date64 | DataType::Null,
            ) => Ok(DataType::Utf8),
            Some(other) => Err(DataFusionError::NotImplemented(format!(
                "to_char of {other} (only timestamps and dates)"
            ))),
            None => Err(DataFusionError::Plan("to_char takes two arguments".into())),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [value, pattern] = args.args.as_slice() else {
            return Err(DataFusionError::Plan("to_char takes two arguments".into()));
        };
        let value = value.to_array(rows)?;
        let pattern = pattern.to_array(rows)?;
        let pattern = cast(&pattern, &DataType::Utf8)?;
        let pattern = pattern
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
            .ok_or_else(|| DataFusionError::Internal("to_char pattern".into()))?;
        // Weir's time zone is UTC: a timestamptz formats as its UTC time.
        let zone = matches!(value.data_type(), DataType::Timestamp(_, Some(_))).then_some("UTC");
        let micros = cast(&value, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        let micros = micros
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .ok_or_else(|| DataFusionError::Internal("to_char value".into()))?;
        let mut out = StringBuilder::with_capacity(rows, rows * 16);
        let mut compiled: Option<(&str, Template)> = None;
        let mut text = String::new();
        for i in 0..rows {
            if micros.is_null(i) || pattern.is_null(i) {
                out.append_null();
                continue;
            }
            let p = pattern.value(i);
            if compiled.as_ref().is_none_or(|(src, _)| *src != p) {
                compiled = Some((p, Template::compile(p)));
            }
            let Some((_, template)) = compiled.as_ref() else {
                continue;
            };
            let us = micros.value(i);
            let t = chrono::DateTime::from_timestamp_micros(us)
                .ok_or_else(|| DataFusionError::Execution("timestamp out of range".into()))?
                .naive_utc();
            text.clear();
            template.format(&t, us.rem_euclid(1_000_000) as u32, zone, &mut text);
            out.append_value(&text);
        }
        let array: ArrayRef = Arc::new(out.finish());
        Ok(match array.len() {
            1 if rows == 1 => ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?),
            _ => ColumnarValue::Array(array),
        })
    }
}

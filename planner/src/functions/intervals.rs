//! Intervals as Postgres computes with them.
//!
//! Arrow's `IntervalMonthDayNano` keeps months, days and nanoseconds apart
//! and orders them field by field, so `interval '500 hours' > interval
//! '7 days'` is false (0 days < 7 days). Postgres compares intervals by one
//! span, a month counting 30 days and a day 24 hours (`interval_cmp_value`),
//! so it is true, and `interval '1 day' = interval '24 hours'`. DataFusion
//! also has no `interval * number`, and its `timestamp - timestamp` keeps
//! the whole difference in the time field (`527:59:59`) where Postgres
//! moves whole days into the days field (`21 days 23:59:59`).
//!
//! [`PgIntervals`], an analyzer rule run after type coercion, rewrites
//! comparisons (`=`, `<>`, `<`, …, `BETWEEN`) of intervals, and sort keys
//! that are intervals, into comparisons of `weir_interval_span`.
//!
//! The SQL planner's hook (`super::arithmetic::PgOperators`) plans
//! `timestamp - timestamp` as `justify_hours(…)` of an interval, and
//! `interval * n`, `n * interval` and `interval / n`, which DataFusion
//! cannot type, as `weir_interval_mul` and `weir_interval_div`.
//!
//! The functions are also Postgres's own (`justify_hours`, `justify_days`,
//! `justify_interval`).

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, Decimal128Builder, Float64Array, IntervalMonthDayNanoArray,
    IntervalMonthDayNanoBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, IntervalMonthDayNano, IntervalUnit};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Between, BinaryExpr, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

const NANOS_PER_DAY: i128 = 86_400_000_000_000;
const DAYS_PER_MONTH: i128 = 30;
const INTERVAL: DataType = DataType::Interval(IntervalUnit::MonthDayNano);

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(Kind::Span))),
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(
            Kind::JustifyHours,
        ))),
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(Kind::JustifyDays))),
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(
            Kind::JustifyInterval,
        ))),
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(Kind::Mul))),
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(Kind::Div))),
    ]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// `weir_interval_span(i)`: the interval as one number of nanoseconds
    /// (decimal), ordered as Postgres orders intervals.
    Span,
    JustifyHours,
    JustifyDays,
    JustifyInterval,
    /// `weir_interval_mul(i, factor)`.
    Mul,
    /// `weir_interval_div(i, divisor)`.
    Div,
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct IntervalFn {
    kind: Kind,
    signature: Signature,
}

impl IntervalFn {
    fn new(kind: Kind) -> Self {
        let signature = match kind {
            Kind::Mul | Kind::Div => {
                Signature::exact(vec![INTERVAL, DataType::Float64], Volatility::Immutable)
            }
            _ => Signature::exact(vec![INTERVAL], Volatility::Immutable),
        };
        Self { kind, signature }
    }
}

/// `weir_interval_span(e)`.
fn interval_span(e: Expr) -> Expr {
    call(Kind::Span, vec![e])
}

fn float(e: Expr) -> Expr {
    Expr::Cast(datafusion::logical_expr::Cast::new(
        Box::new(e),
        DataType::Float64,
    ))
}

fn interval(e: Expr) -> Expr {
    Expr::Cast(datafusion::logical_expr::Cast::new(Box::new(e), INTERVAL))
}

/// `a - b` of timestamps, as Postgres subtracts them.
pub(super) fn timestamp_difference(a: Expr, b: Expr) -> Expr {
    let diff = Expr::BinaryExpr(BinaryExpr::new(Box::new(a), Operator::Minus, Box::new(b)));
    call(Kind::JustifyHours, vec![interval(diff)])
}

/// `i * factor`, as Postgres multiplies an interval (or a duration).
pub(super) fn multiply(i: Expr, factor: Expr) -> Expr {
    call(Kind::Mul, vec![interval(i), float(factor)])
}

/// `i / divisor`, as Postgres divides an interval.
pub(super) fn divide(i: Expr, divisor: Expr) -> Expr {
    call(Kind::Div, vec![interval(i), float(divisor)])
}

fn call(kind: Kind, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(
        Arc::new(ScalarUDF::new_from_impl(IntervalFn::new(kind))),
        args,
    ))
}

/// Postgres's `interval_cmp_value`, in nanoseconds.
fn span(i: IntervalMonthDayNano) -> i128 {
    (i.months as i128 * DAYS_PER_MONTH + i.days as i128) * NANOS_PER_DAY + i.nanoseconds as i128
}

fn justify_hours(i: IntervalMonthDayNano) -> IntervalMonthDayNano {
    let nanos = i.nanoseconds as i128;
    let mut days = i.days as i128 + nanos / NANOS_PER_DAY;
    let mut rest = nanos % NANOS_PER_DAY;
    // The days and the time take one sign, as in Postgres.
    if days > 0 && rest < 0 {
        rest += NANOS_PER_DAY;
        days -= 1;
    } else if days < 0 && rest > 0 {
        rest -= NANOS_PER_DAY;
        days += 1;
    }
    IntervalMonthDayNano::new(i.months, days as i32, rest as i64)
}

fn justify_days(i: IntervalMonthDayNano) -> IntervalMonthDayNano {
    let days = i.days as i64;
    let mut months = i.months as i64 + days / DAYS_PER_MONTH as i64;
    let mut rest = days % DAYS_PER_MONTH as i64;
    if months > 0 && rest < 0 {
        rest += DAYS_PER_MONTH as i64;
        months -= 1;
    } else if months < 0 && rest > 0 {
        rest -= DAYS_PER_MONTH as i64;
        months += 1;
    }
    IntervalMonthDayNano::new(months as i32, rest as i32, i.nanoseconds)
}

/// Postgres's `interval_justify_interval`: days into months, time into
/// days, all three of one sign.
fn justify_interval(i: IntervalMonthDayNano) -> IntervalMonthDayNano {
    let mut months = i.months as i64;
    let mut days = i.days as i64;
    let mut time = i.nanoseconds as i128;
    let per_day = NANOS_PER_DAY;
    if (days > 0 && time > 0) || (days < 0 && time < 0) {
        let whole = time / per_day;
        time -= whole * per_day;
        days += whole as i64;
    }
    let whole_months = days / DAYS_PER_MONTH as i64;
    days -= whole_months * DAYS_PER_MONTH as i64;
    months += whole_months;
    if months > 0 && (days < 0 || (days == 0 && time < 0)) {
        days += DAYS_PER_MONTH as i64;
        months -= 1;
    } else if months < 0 && (days > 0 || (days == 0 && time > 0)) {
        days -= DAYS_PER_MONTH as i64;
        months += 1;
    }
    let whole = time / per_day;
    time -= whole * per_day;
    days += whole as i64;
    if days > 0 && time < 0 {
        time += per_day;
        days -= 1;
    } else if days < 0 && time > 0 {
        time -= per_day;
        days += 1;
    }
    IntervalMonthDayNano::new(months as i32, days as i32, time as i64)
}

/// Postgres's `interval_mul`: the fraction of months spills into days (a
/// month of 30 days), the fraction of days into time.
fn mul(i: IntervalMonthDayNano, factor: f64) -> Result<IntervalMonthDayNano> {
    let months = i.months as f64 * factor;
    let days = i.days as f64 * factor;
    let whole_months = months.trunc();
    let days = days + (months - whole_months) * DAYS_PER_MONTH as f64;
    let whole_days = days.trunc();
    let nanos = i.nanoseconds as f64 * factor + (days - whole_days) * NANOS_PER_DAY as f64;
    let fits = |v: f64, max: f64| v.is_finite() && v.abs() <= max;
    if !fits(whole_months, i32::MAX as f64)
        || !fits(whole_days, i32::MAX as f64)
        || !fits(nanos, i64::MAX as f64)
    {
        return Err(DataFusionError::Execution("interval out of range".into()));
    }
    // Postgres keeps microseconds.
    let micros = (nanos / 1000.0).round() as i64;
    Ok(IntervalMonthDayNano::new(
        whole_months as i32,
        whole_days as i32,
        micros * 1000,
    ))
}

impl ScalarUDFImpl for IntervalFn {
    fn name(&self) -> &str {
        match self.kind {
            Kind::Span => "weir_interval_span",
            Kind::JustifyHours => "justify_hours",
            Kind::JustifyDays => "justify_days",
            Kind::JustifyInterval => "justify_interval",
            Kind::Mul => "weir_interval_mul",
            Kind::Div => "weir_interval_div",
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(match self.kind {
            Kind::Span => DataType::Decimal128(38, 0),
            _ => INTERVAL,
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<Result<Vec<_>>>()?;
        let intervals = cast(&arrays[0], &INTERVAL)?;
        let intervals = intervals
            .as_any()
            .downcast_ref::<IntervalMonthDayNanoArray>()
            .ok_or_else(|| DataFusionError::Internal("interval argument".into()))?;
        let out: ArrayRef = match self.kind {
            Kind::Span => {
                let mut b = Decimal128Builder::with_capacity(rows);
                for v in intervals.iter() {
                    b.append_option(v.map(span));
                }
                Arc::new(b.finish().with_precision_and_scale(38, 0)?)
            }
            Kind::Mul | Kind::Div => {
                let factors = cast(&arrays[1], &DataType::Float64)?;
                let factors = factors
                    .as_any()
                    .downcast_ref::<Float64Array>()
                    .ok_or_else(|| DataFusionError::Internal("interval factor".into()))?;
                let mut b = IntervalMonthDayNanoBuilder::with_capacity(rows);
                for (i, f) in intervals.iter().zip(factors.iter()) {
                    match (i, f) {
                        (Some(_), Some(f)) if self.kind == Kind::Div && f == 0.0 => {
                            return Err(DataFusionError::ArrowError(
                                Box::new(datafusion::arrow::error::ArrowError::DivideByZero),
                                None,
                            ));
                        }
                        (Some(i), Some(f)) if self.kind == Kind::Div => {
                            b.append_value(mul(i, 1.0 / f)?)
                        }
                        (Some(i), Some(f)) => b.append_value(mul(i, f)?),
                        _ => b.append_null(),
                    }
                }
                Arc::new(b.finish())
            }
            kind => {
                let f = match kind {
                    Kind::JustifyHours => justify_hours,
                    Kind::JustifyDays => justify_days,
                    _ => justify_interval,
                };
                let mut b = IntervalMonthDayNanoBuilder::with_capacity(rows);
                for v in intervals.iter() {
                    b.append_option(v.map(f));
                }
                Arc::new(b.finish())
            }
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct PgIntervals;

impl AnalyzerRule for PgIntervals {
    fn name(&self) -> &str {
        "weir_pg_intervals"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan_and_sorts(
            plan,
            |e, schema| is_interval(e, schema).then(|| interval_span(e.clone())),
            rewrite,
        )
    }
}

fn type_of(e: &Expr, schema: &DFSchema) -> Option<DataType> {
    e.get_type(schema as &dyn ExprSchema).ok()
}

fn is_interval(e: &Expr, schema: &DFSchema) -> bool {
    matches!(type_of(e, schema), Some(DataType::Interval(_)))
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let (lt, rt) = (type_of(&left, schema), type_of(&right, schema));
            let interval = |t: &Option<DataType>| matches!(t, Some(DataType::Interval(_)));
            let comparison = matches!(
                op,
                Operator::Eq
                    | Operator::NotEq
                    | Operator::Lt
                    | Operator::LtEq
                    | Operator::Gt
                    | Operator::GtEq
                    | Operator::IsDistinctFrom
                    | Operator::IsNotDistinctFrom
            );
            if comparison && interval(&lt) && interval(&rt) {
                return Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                    Box::new(interval_span(*left)),
                    op,
                    Box::new(interval_span(*right)),
                ))));
            }
            Ok(Transformed::no(Expr::BinaryExpr(BinaryExpr::new(
                left, op, right,
            ))))
        }
        Expr::Between(Between {
            expr,
            negated,
            low,
            high,
        }) if is_interval(&expr, schema)
            && is_interval(&low, schema)
            && is_interval(&high, schema) =>
        {
            Ok(Transformed::yes(Expr::Between(Between::new(
                Box::new(interval_span(*expr)),
                negated,
                Box::new(interval_span(*low)),
                Box::new(interval_span(*high)),
            ))))
        }
        other => Ok(Transformed::no(other)),
    }
}

/// An interval's text in a form DataFusion reads, or `None` when it reads
/// this one already. Postgres's `[-]H:MM:SS[.f]` fields and ISO 8601
/// (`P…T…`) are turned into months, days and microseconds.
pub fn interval_text(s: &str) -> crate::Result<Option<String>> {
    if datafusion::arrow::compute::kernels::cast_utils::parse_interval_month_day_nano(s).is_ok() {
        return Ok(None);
    }
    let trimmed = s.trim();
    let parsed = if trimmed.starts_with(['P', 'p']) || trimmed.starts_with("-P") {
        pg_interval::Interval::from_iso(trimmed)
    } else {
        pg_interval::Interval::from_postgres(trimmed)
    };
    match parsed {
        Ok(i) => Ok(Some(format!(
            "{} months {} days {} microseconds",
            i.months, i.days, i.microseconds
        ))),
        Err(_) => Err(crate::PlanError::InvalidText(format!(
            "invalid input syntax for type interval: \"{s}\""
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iv(months: i32, days: i32, hours: i64) -> IntervalMonthDayNano {
        IntervalMonthDayNano::new(months, days, hours * 3_600_000_000_000)
    }

    #[test]
    fn spans_order_as_postgres() {
        assert!(span(iv(0, 0, 500)) > span(iv(0, 7, 0)));
        assert_eq!(span(iv(0, 1, 0)), span(iv(0, 0, 24)));
        assert_eq!(span(iv(1, 0, 0)), span(iv(0, 30, 0)));
    }

    #[test]
    fn justify_as_postgres() {
        // 527:59:59 → 21 days 23:59:59
        let i = IntervalMonthDayNano::new(0, 0, (527 * 3600 + 59 * 60 + 59) * 1_000_000_000);
        let j = justify_hours(i);
        assert_eq!((j.months, j.days), (0, 21));
        assert_eq!(j.nanoseconds, (23 * 3600 + 59 * 60 + 59) * 1_000_000_000);
        let j = justify_days(IntervalMonthDayNano::new(0, 65, 0));
        assert_eq!((j.months, j.days), (2, 5));
        let j = justify_hours(IntervalMonthDayNano::new(0, 1, -3_600_000_000_000));
        assert_eq!((j.days, j.nanoseconds), (0, 23 * 3_600_000_000_000));
        // justify_interval('1 mon -1 hour') = 29 days 23:00:00
        let j = justify_interval(IntervalMonthDayNano::new(1, 0, -3_600_000_000_000));
        assert_eq!(
            (j.months, j.days, j.nanoseconds),
            (0, 29, 23 * 3_600_000_000_000)
        );
    }

    #[test]
    fn multiplication_spills_fractions_down() {
        // interval '1 month' * 1.5 = 1 mon 15 days
        let m = mul(iv(1, 0, 0), 1.5).unwrap();
        assert_eq!((m.months, m.days, m.nanoseconds), (1, 15, 0));
        // interval '1 day' / 4 = 06:00:00
        let m = mul(iv(0, 1, 0), 0.25).unwrap();
        assert_eq!(
            (m.months, m.days, m.nanoseconds),
            (0, 0, 6 * 3_600_000_000_000)
        );
        assert!(mul(iv(0, 1, 0), f64::INFINITY).is_err());
    }
}

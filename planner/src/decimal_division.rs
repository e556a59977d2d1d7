//! Numeric division with Postgres's precision.
//!
//! Arrow divides decimals to the dividend's scale plus 4, so `1 / 3.0` is
//! `0.3333` where Postgres answers with at least 16 significant digits
//! (`0.33333333333333333333`). Decimal literals are `numeric` in Weir, as
//! in Postgres (`crate::context::new_context`), so this matters for everyday SQL.
//! This analyzer rule runs after DataFusion's type coercion and casts the
//! dividend of a decimal division up to scale 16, or as far as Arrow's
//! 128-bit kernel has room for: it multiplies the dividend by
//! `10^(4 + divisor's scale)` before dividing, within 38 digits.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, ExprSchema, Result as DfResult};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::{BinaryExpr, Cast, Expr, ExprSchemable, LogicalPlan, Operator};
use datafusion::optimizer::AnalyzerRule;

/// Postgres's minimum significant digits of a division's result.
const MIN_SIGNIFICANT_DIGITS: i8 = 16;
/// Decimal128's digits.
const MAX_PRECISION: i8 = 38;
/// The scale Arrow's division adds to the dividend's.
const ARROW_DIV_SCALE_INCREMENT: i8 = 4;

#[derive(Debug, Default)]
pub struct DecimalDivision;

impl AnalyzerRule for DecimalDivision {
    fn name(&self) -> &str {
        "weir_decimal_division"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> DfResult<LogicalPlan> {
        crate::functions::rewrite_plan(plan, widen)
    }
}

/// `l / r` of decimals, with `l` cast to the scale that gives the quotient
/// Postgres's digits.
fn widen(e: Expr, schema: &DFSchema) -> DfResult<Transformed<Expr>> {
    let Expr::BinaryExpr(BinaryExpr {
        left,
        op: Operator::Divide,
        right,
    }) = &e
    else {
        return Ok(Transformed::no(e));
    };
    let (Ok(DataType::Decimal128(p1, s1)), Ok(DataType::Decimal128(p2, s2))) = (
        left.get_type(schema as &dyn ExprSchema),
        right.get_type(schema as &dyn ExprSchema),
    ) else {
        return Ok(Transformed::no(e));
    };
    let integer_digits = p1 as i8 - s1;
    let room = MAX_PRECISION - ARROW_DIV_SCALE_INCREMENT - s2.max(0) - integer_digits;
    if room < s1 {
        return Ok(Transformed::yes(wide_division(
            left,
            right,
            integer_digits,
            s1,
            p2,
            s2,
        )));
    }
    let scale = MIN_SIGNIFICANT_DIGITS.min(room);
    if scale <= s1 {
        return Ok(Transformed::no(e));
    }
    let widened = Expr::Cast(Cast::new(
        left.clone(),
        DataType::Decimal128((integer_digits + scale) as u8, scale),
    ));
    Ok(Transformed::yes(Expr::BinaryExpr(BinaryExpr {
        left: Box::new(widened),
        op: Operator::Divide,
        right: right.clone(),
    })))
}

/// `l / r` where Arrow's 128-bit kernel has no room: the dividend's
/// integer digits, its scale and the divisor's scale need more than 38
/// digits once the dividend is scaled up for the quotient. That is the
/// everyday case of Postgres's unconstrained `numeric` (38 digits, 10 of
/// them decimals, in Weir): `sum(price * (1 - discount)) / sum(price)`
/// would fail with `22003` where Postgres answers. The division runs in
/// 256 bits (76 digits), where it has room, and the quotient comes back
/// as a 128-bit decimal with Postgres's 16 significant decimals (more if
/// an operand has more, up to 20); only a quotient too large for that
/// overflows.
fn wide_division(left: &Expr, right: &Expr, integer_digits: i8, s1: i8, p2: u8, s2: i8) -> Expr {
    const WIDE_PRECISION: i8 = 76;
    let dividend_scale = s1.max(MIN_SIGNIFICANT_DIGITS);
    let dividend = Expr::Cast(Cast::new(
        Box::new(left.clone()),
        DataType::Decimal256(
            (integer_digits + dividend_scale).min(WIDE_PRECISION) as u8,
            dividend_scale,
        ),
    ));
    let divisor = Expr::Cast(Cast::new(
        Box::new(right.clone()),
        DataType::Decimal256(p2, s2),
    ));
    let quotient = Expr::BinaryExpr(BinaryExpr {
        left: Box::new(dividend),
        op: Operator::Divide,
        right: Box::new(divisor),
    });
    let scale = MIN_SIGNIFICANT_DIGITS.max(s1).max(s2).min(20);
    Expr::Cast(Cast::new(
        Box::new(quotient),
        DataType::Decimal128(MAX_PRECISION as u8, scale),
    ))
}

/// Registers the rule in `ctx`.
pub fn register(ctx: &datafusion::prelude::SessionContext) {
    ctx.add_analyzer_rule(Arc::new(DecimalDivision));
}

//! Numeric division with Postgres's precision.
//!
//! Arrow divides decimals to the dividend's scale plus 4, so `1 / 3.0` is
//! `0.3333` where Postgres answers with at least 16 significant digits
//! (`0.33333333333333333333`). Decimal literals are `numeric` in Weir, as
//! in Postgres (`context::new_context`), so this matters for everyday SQL.
//! This analyzer rule runs after DataFusion's type coercion and casts the
//! dividend of a decimal division up to scale 16, or as far as Arrow's
//! 128-bit kernel has room for: it multiplies the dividend by
//! `10^(4 + divisor's scale)` before dividing, within 38 digits.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode};
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
        plan.transform_up_with_subqueries(|node| {
            let mut schema = DFSchema::empty();
            for input in node.inputs() {
                schema.merge(input.schema());
            }
            if node.inputs().is_empty() {
                schema.merge(node.schema());
            }
            node.map_expressions(|e| e.transform_up(|e| widen(e, &schema)))
        })
        .map(|t| t.data)
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
    let (Ok(DataType::Decimal128(p1, s1)), Ok(DataType::Decimal128(_, s2))) = (
        left.get_type(schema as &dyn ExprSchema),
        right.get_type(schema as &dyn ExprSchema),
    ) else {
        return Ok(Transformed::no(e));
    };
    let integer_digits = p1 as i8 - s1;
    let room = MAX_PRECISION - ARROW_DIV_SCALE_INCREMENT - s2.max(0) - integer_digits;
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

/// Registers the rule in `ctx`.
pub fn register(ctx: &datafusion::prelude::SessionContext) {
    ctx.add_analyzer_rule(Arc::new(DecimalDivision));
}

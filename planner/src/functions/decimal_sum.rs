//! `sum` of a `numeric` in a batch query, without wrapping.
//!
//! DataFusion sums `Decimal128` values in 128 bits with wrapping
//! arithmetic, so a total past what 128 bits hold comes out as a wrong
//! number (two rows of 9e37 sum to a negative one). Postgres's `numeric`
//! has no such limit; Weir's holds 38 digits. [`WideDecimalSum`] makes the
//! total exact, or `22003`: each `sum(x)` of a decimal sums `x` as a
//! 76-digit `Decimal256`, and a projection above the aggregate casts the
//! total back to the type and name the query expects — a cast that fails on
//! a total of more than 38 digits.
//!
//! Only for batch queries: a view's `sum` is the HashAgg operator's own,
//! which sums decimals in 256 bits and reports such a total as the view's
//! error (`executor::operators::accumulator`).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{Aggregate, Expr, ExprSchemable, LogicalPlan, Projection, cast};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(super) struct WideDecimalSum;

impl AnalyzerRule for WideDecimalSum {
    fn name(&self) -> &str {
        "weir_wide_decimal_sum"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan.transform_up_with_subqueries(widen)?.data)
    }
}

fn widen(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Aggregate(agg) = &plan else {
        return Ok(Transformed::no(plan));
    };
    let input_schema = agg.input.schema();
    let mut changed = false;
    let mut aggr_expr = Vec::with_capacity(agg.aggr_expr.len());
    for e in &agg.aggr_expr {
        let widened = match e {
            Expr::AggregateFunction(f)
                if f.func.name() == "sum"
                    && f.params.args.len() == 1
                    && matches!(
                        f.params.args[0].get_type(input_schema.as_ref())?,
                        DataType::Decimal128(..)
                    ) =>
            {
                let DataType::Decimal128(_, s) =
                    f.params.args[0].get_type(input_schema.as_ref())?
                else {
                    unreachable!("matched above")
                };
                let mut params = f.params.clone();
                params.args = vec![cast(params.args[0].clone(), DataType::Decimal256(76, s))];
                let wide = Expr::AggregateFunction(AggregateFunction {
                    func: Arc::clone(&f.func),
                    params,
                });
                changed = true;
                wide.alias(e.schema_name().to_string())
            }
            _ => e.clone(),
        };
        aggr_expr.push(widened);
    }
    if !changed {
        return Ok(Transformed::no(plan));
    }
    let wide = Aggregate::try_new(Arc::clone(&agg.input), agg.group_expr.clone(), aggr_expr)?;
    let wide_schema = Arc::clone(&wide.schema);
    // Each column as the query knew it: the totals cast back.
    let columns = agg
        .schema
        .iter()
        .zip(wide_schema.iter())
        .map(|((qualifier, field), (wq, wf))| {
            let column = Expr::Column(Column::from((wq, wf)));
            let e = if wf.data_type() == field.data_type() {
                column
            } else {
                cast(column, field.data_type().clone())
            };
            e.alias_qualified(qualifier.cloned(), field.name())
        })
        .collect();
    let projection = Projection::try_new(columns, Arc::new(LogicalPlan::Aggregate(wide)))?;
    Ok(Transformed::yes(LogicalPlan::Projection(projection)))
}

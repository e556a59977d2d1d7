//! `sum` of a `numeric`, without wrapping.
//!
//! DataFusion sums `Decimal128` values in 128 bits with wrapping
//! arithmetic, so a total past what 128 bits hold comes out as a wrong
//! number (two rows of 9e37 sum to a negative one). Postgres's `numeric`
//! has no such limit; Weir's holds 38 digits. These rules make the total
//! exact, or `22003`: each `sum(x)` of a decimal sums `x` as a 76-digit
//! `Decimal256`, and a projection above casts the total back to the type
//! and name the query expects — a cast that fails on a total of more than
//! 38 digits.
//!
//! [`WideDecimalSum`] is for batch queries only: a view's `sum` is the
//! HashAgg operator's own, which sums decimals in 256 bits and reports such
//! a total as the view's error (`executor::operators::accumulator`).
//! [`WideWindowSum`] does the same for `sum(x) OVER (…)`, in batch queries
//! and in views alike (their OverWindow runs DataFusion's window functions;
//! the cast back is a projection, whose failure the view reports).

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{Column, DFSchema, Result};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::AggregateFunction;
use datafusion::logical_expr::{
    Aggregate, Expr, ExprSchemable, LogicalPlan, Projection, Window, cast,
};
use datafusion::optimizer::AnalyzerRule;

/// The analyzer rule for aggregates (see the module's docs).
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

/// The analyzer rule for window functions (see the module's docs).
#[derive(Debug, Default)]
pub(super) struct WideWindowSum;

impl AnalyzerRule for WideWindowSum {
    fn name(&self) -> &str {
        "weir_wide_window_sum"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        Ok(plan.transform_up_with_subqueries(widen_window)?.data)
    }
}

/// The scale of `sum`'s one decimal argument, if `name` is `sum`.
fn decimal_sum_scale(name: &str, args: &[Expr], schema: &DFSchema) -> Result<Option<i8>> {
    if name != "sum" || args.len() != 1 {
        return Ok(None);
    }
    Ok(match args[0].get_type(schema)? {
        DataType::Decimal128(_, s) => Some(s),
        _ => None,
    })
}

fn widen(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Aggregate(agg) = &plan else {
        return Ok(Transformed::no(plan));
    };
    let widened = widen_sums(&agg.aggr_expr, agg.input.schema(), |e, schema| {
        // Under the alias an earlier rewrite may have named it with.
        let Expr::AggregateFunction(f) = unaliased(e) else {
            return Ok(None);
        };
        Ok(
            decimal_sum_scale(f.func.name(), &f.params.args, schema)?.map(|s| {
                let mut params = f.params.clone();
                params.args = vec![wide(&params.args[0], s)];
                Expr::AggregateFunction(AggregateFunction {
                    func: Arc::clone(&f.func),
                    params,
                })
            }),
        )
    })?;
    let Some(aggr_expr) = widened else {
        return Ok(Transformed::no(plan));
    };
    let wide = Aggregate::try_new(Arc::clone(&agg.input), agg.group_expr.clone(), aggr_expr)?;
    let projection = cast_back(&agg.schema, LogicalPlan::Aggregate(wide))?;
    Ok(Transformed::yes(projection))
}

fn widen_window(plan: LogicalPlan) -> Result<Transformed<LogicalPlan>> {
    let LogicalPlan::Window(window) = &plan else {
        return Ok(Transformed::no(plan));
    };
    let widened = widen_sums(&window.window_expr, window.input.schema(), |e, schema| {
        let Expr::WindowFunction(f) = unaliased(e) else {
            return Ok(None);
        };
        Ok(
            decimal_sum_scale(f.fun.name(), &f.params.args, schema)?.map(|s| {
                let mut f = f.as_ref().clone();
                f.params.args = vec![wide(&f.params.args[0], s)];
                Expr::WindowFunction(Box::new(f))
            }),
        )
    })?;
    let Some(window_expr) = widened else {
        return Ok(Transformed::no(plan));
    };
    let wide = Window::try_new(window_expr, Arc::clone(&window.input))?;
    let projection = cast_back(&window.schema, LogicalPlan::Window(wide))?;
    Ok(Transformed::yes(projection))
}

fn unaliased(e: &Expr) -> &Expr {
    match e {
        Expr::Alias(a) => unaliased(&a.expr),
        e => e,
    }
}

/// `exprs` with each one `widen` gives a wide form of replaced by it,
/// under the name it had; `None` if there was none.
fn widen_sums(
    exprs: &[Expr],
    schema: &DFSchema,
    widen: impl Fn(&Expr, &DFSchema) -> Result<Option<Expr>>,
) -> Result<Option<Vec<Expr>>> {
    let mut changed = false;
    let out = exprs
        .iter()
        .map(|e| {
            Ok(match widen(e, schema)? {
                Some(w) => {
                    changed = true;
                    w.alias(e.schema_name().to_string())
                }
                None => e.clone(),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(changed.then_some(out))
}

/// `x` as a 76-digit decimal of scale `s`.
fn wide(x: &Expr, s: i8) -> Expr {
    cast(x.clone(), DataType::Decimal256(76, s))
}

/// Each column of `wide` as the query knew it (`schema`): the totals cast
/// back to their type, under their names.
fn cast_back(schema: &DFSchema, wide: LogicalPlan) -> Result<LogicalPlan> {
    let wide_schema = Arc::clone(wide.schema());
    let columns = schema
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
    Ok(LogicalPlan::Projection(Projection::try_new(
        columns,
        Arc::new(wide),
    )?))
}

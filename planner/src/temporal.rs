//! Temporal filters: `WHERE ts > now() - INTERVAL '1 hour'` in a view.
//!
//! A view must equal its query recomputed at any moment, and with `now()`
//! in `WHERE` that answer changes as time passes: a row enters the view when
//! `now()` reaches the start of its visibility and leaves at the end
//! (RisingWave's temporal filter, Materialize's `mz_now()`). DataFusion's
//! optimizer would fold `now()` into the moment of `CREATE`, so before it
//! runs, [`mark_now`] replaces `now()` in filters with [`NowMarker`], a
//! volatile function it leaves alone. Lowering then turns every conjunct
//! comparing a row expression with `now() ± a fixed interval` into a bound
//! of the row's visibility interval, for the TemporalFilter operator.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::ScalarValue;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::logical_expr::simplify::SimplifyContext;
use datafusion::logical_expr::{
    BinaryExpr, ColumnarValue, Expr, LogicalPlan, Operator, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, Volatility,
};
use datafusion::optimizer::simplify_expressions::ExprSimplifier;

use crate::spec::{TemporalBound, TemporalCmp};
use crate::{PlanError, Result};

/// Name of the marker; not a function users can call.
pub const NOW_MARKER: &str = "__weir_now";

/// Stands for `now()` in a view's filter until lowering takes it out.
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct NowMarker {
    signature: Signature,
}

impl NowMarker {
    pub fn udf() -> Arc<ScalarUDF> {
        Arc::new(ScalarUDF::new_from_impl(NowMarker {
            signature: Signature::nullary(Volatility::Volatile),
        }))
    }
}

impl ScalarUDFImpl for NowMarker {
    fn name(&self) -> &str {
        NOW_MARKER
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> datafusion::common::Result<DataType> {
        Ok(now_type())
    }

    fn invoke_with_args(&self, _: ScalarFunctionArgs) -> datafusion::common::Result<ColumnarValue> {
        datafusion::common::internal_err!("now() in a view is evaluated by its TemporalFilter")
    }
}

/// What DataFusion's `now()` returns.
fn now_type() -> DataType {
    DataType::Timestamp(TimeUnit::Nanosecond, Some("+00:00".into()))
}

/// Whether `e` is the marker.
pub fn is_now_marker(e: &Expr) -> bool {
    matches!(e, Expr::ScalarFunction(f) if f.func.name() == NOW_MARKER)
}

pub(crate) fn contains_now(e: &Expr) -> bool {
    e.exists(|e| Ok(is_now_marker(e))).unwrap_or(false)
}

/// Replaces `now()` (and `current_timestamp`) in the predicates of `plan`'s
/// filters with the marker, before the optimizer folds them into constants.
pub fn mark_now(plan: LogicalPlan) -> Result<LogicalPlan> {
    let marker = NowMarker::udf();
    let plan = plan.transform_up_with_subqueries(|node| {
        if !matches!(node, LogicalPlan::Filter(_)) {
            return Ok(Transformed::no(node));
        }
        node.map_expressions(|e| {
            e.transform(|e| match &e {
                Expr::ScalarFunction(f) if matches!(f.func.name(), "now" | "current_timestamp") => {
                    Ok(Transformed::yes(Expr::ScalarFunction(
                        datafusion::logical_expr::expr::ScalarFunction::new_udf(
                            marker.clone(),
                            vec![],
                        ),
                    )))
                }
                _ => Ok(Transformed::no(e)),
            })
        })
    })?;
    Ok(plan.data)
}

/// `conjunct` as a bound of the row's visibility, if it mentions `now()`:
/// `row_expr op now() + delta`, either way round, `delta` a fixed length of
/// time. Other uses of `now()` are refused.
pub fn temporal_bound(conjunct: &Expr) -> Result<Option<TemporalBound>> {
    if !contains_now(conjunct) {
        return Ok(None);
    }
    let refuse = || {
        Err(PlanError::Unsupported(
            "now() in a materialized view other than in WHERE as `expression <, <=, > or >= now() ± a fixed interval`, joined by AND,".into(),
        ))
    };
    let Expr::BinaryExpr(BinaryExpr { left, op, right }) = conjunct else {
        return refuse();
    };
    let (row, now_side, op) = match (contains_now(left), contains_now(right)) {
        (false, true) => (left.as_ref(), right.as_ref(), *op),
        (true, false) => match op.swap() {
            Some(op) => (right.as_ref(), left.as_ref(), op),
            None => return refuse(),
        },
        _ => return refuse(),
    };
    let cmp = match op {
        Operator::Lt => TemporalCmp::Lt,
        Operator::LtEq => TemporalCmp::LtEq,
        Operator::Gt => TemporalCmp::Gt,
        Operator::GtEq => TemporalCmp::GtEq,
        _ => return refuse(),
    };
    if !now_side.column_refs().is_empty() {
        return refuse();
    }
    // `now_side` at two moments: a fixed offset from now() gives the same
    // difference at both; a month or a year does not (one after January
    // and one after a leap February).
    let (t0, t1) = (0i64, 983_404_800_000_000i64); // 1970-01-01, 2001-03-01
    let (d0, d1) = (offset(now_side, t0)?, offset(now_side, t1)?);
    match (d0, d1) {
        (Some(d0), Some(d1)) if d0 == d1 => Ok(Some(TemporalBound {
            row: row.clone(),
            cmp,
            delta_us: d0,
        })),
        _ => Err(PlanError::Unsupported(
            "now() ± an interval that is not a fixed length of time (months, years) in a materialized view".into(),
        )),
    }
}

/// `now_side - now()` in microseconds with now() at `t_us`.
fn offset(now_side: &Expr, t_us: i64) -> Result<Option<i64>> {
    let at = now_side
        .clone()
        .transform(|e| {
            Ok(if is_now_marker(&e) {
                Transformed::yes(Expr::Literal(
                    ScalarValue::TimestampNanosecond(Some(t_us * 1000), Some("+00:00".into())),
                    None,
                ))
            } else {
                Transformed::no(e)
            })
        })?
        .data;
    let simplifier = ExprSimplifier::new(SimplifyContext::default());
    let value = match simplifier.simplify(at)? {
        Expr::Literal(v, _) => v,
        _ => return Ok(None),
    };
    let micros = value.cast_to(&DataType::Timestamp(TimeUnit::Microsecond, None));
    Ok(match micros {
        Ok(ScalarValue::TimestampMicrosecond(Some(v), _)) => Some(v - t_us),
        _ => None,
    })
}

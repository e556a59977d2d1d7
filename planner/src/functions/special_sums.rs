//! `sum` and `avg` of a `numeric` in batch queries, with `NaN` and the
//! infinities as Postgres sums them (see [`super::numeric_special`]).
//!
//! A view's `sum` and `avg` are the HashAgg operator's own, which counts
//! the special values of each group beside its total
//! (`executor::operators::accumulator`). A batch query's are DataFusion's,
//! which would add the values that stand for them as numbers; [`SpecialSums`],
//! a rule for batch queries only, run before [`super::decimal_sum`]'s,
//! gives them `weir_numeric_sum` and `weir_numeric_avg` instead: the total
//! in 256 bits (a total of more than 38 digits is `22003`, never wrapped),
//! the count, and how many values were `NaN`, `Infinity` and `-Infinity`.
//! Any `NaN`, or infinities of both signs, make the result `NaN`; else an
//! infinity is the result. `avg` rounds half away from zero, as Postgres.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, AsArray};
use datafusion::arrow::datatypes::{
    DataType, Decimal128Type, Decimal256Type, Field, FieldRef, Int64Type, i256,
};
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::function::{AccumulatorArgs, StateFieldsArgs};
use datafusion::logical_expr::{
    Accumulator, AggregateUDF, AggregateUDFImpl, Expr, ExprSchemable, LogicalPlan, Signature,
    Volatility,
};
use datafusion::optimizer::AnalyzerRule;

use super::numeric_special::{Special, divide_rounded, overflow};

fn udaf(avg: bool) -> Arc<AggregateUDF> {
    Arc::new(AggregateUDF::new_from_impl(SpecialSum {
        avg,
        signature: Signature::any(1, Volatility::Immutable),
    }))
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(super) struct SpecialSums;

impl AnalyzerRule for SpecialSums {
    fn name(&self) -> &str {
        "weir_special_sums"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite)
    }
}

/// Whether `sum(x)` or `avg(x)` (`name`, `args`, `distinct`) is one this
/// module computes: of one decimal, each value once.
pub(super) fn handled(name: &str, args: &[Expr], distinct: bool, schema: &DFSchema) -> bool {
    matches!(name, "sum" | "avg")
        && !distinct
        && args.len() == 1
        && args[0]
            .get_type(schema as &dyn ExprSchema)
            .is_ok_and(|t| matches!(t, DataType::Decimal128(..)))
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    match e {
        Expr::AggregateFunction(mut a)
            if handled(a.func.name(), &a.params.args, a.params.distinct, schema) =>
        {
            a.func = udaf(a.func.name() == "avg");
            Ok(Transformed::yes(Expr::AggregateFunction(a)))
        }
        e => Ok(Transformed::no(e)),
    }
}

/// `weir_numeric_sum(x)` or `weir_numeric_avg(x)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SpecialSum {
    avg: bool,
    signature: Signature,
}

impl AggregateUDFImpl for SpecialSum {
    fn name(&self) -> &str {
        if self.avg {
            "weir_numeric_avg"
        } else {
            "weir_numeric_sum"
        }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// DataFusion's type for the same `sum` or `avg`.
    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        use datafusion::functions_aggregate::{average::avg_udaf, sum::sum_udaf};
        if self.avg {
            avg_udaf().return_type(args)
        } else {
            sum_udaf().return_type(args)
        }
    }

    fn state_fields(&self, args: StateFieldsArgs) -> Result<Vec<FieldRef>> {
        let scale = decimal_scale(args.input_fields.first().map(|f| f.data_type()))?;
        let field = |name: &str, t: DataType| {
            Arc::new(Field::new(format!("{}[{name}]", args.name), t, true))
        };
        Ok(vec![
            field("sum", DataType::Decimal256(76, scale)),
            field("count", DataType::Int64),
            field("nan", DataType::Int64),
            field("infinity", DataType::Int64),
            field("-infinity", DataType::Int64),
        ])
    }

    fn accumulator(&self, args: AccumulatorArgs) -> Result<Box<dyn Accumulator>> {
        let scale = decimal_scale(args.expr_fields.first().map(|f| f.data_type()))?;
        Ok(Box::new(SumAccumulator {
            avg: self.avg,
            scale,
            out: args.return_type().clone(),
            sum: i256::ZERO,
            n: 0,
            specials: [0; 3],
        }))
    }
}

fn decimal_scale(t: Option<&DataType>) -> Result<i8> {
    match t {
        Some(DataType::Decimal128(_, s)) => Ok(*s),
        other => Err(DataFusionError::Internal(format!(
            "weir_numeric_sum of {other:?}"
        ))),
    }
}

#[derive(Debug)]
struct SumAccumulator {
    avg: bool,
    /// The input's scale.
    scale: i8,
    out: DataType,
    sum: i256,
    n: i64,
    /// `NaN`, `Infinity`, `-Infinity`.
    specials: [i64; 3],
}

impl Accumulator for SumAccumulator {
    fn update_batch(&mut self, values: &[ArrayRef]) -> Result<()> {
        let Some(values) = values.first() else {
            return Ok(());
        };
        for v in values.as_primitive::<Decimal128Type>().iter().flatten() {
            self.n += 1;
            match Special::of(v) {
                Some(s) => self.specials[s as usize] += 1,
                None => self.sum = self.sum.wrapping_add(i256::from_i128(v)),
            }
        }
        Ok(())
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> Result<()> {
        let [sum, n, nan, inf, neg_inf] = states else {
            return Err(DataFusionError::Internal(
                "weir_numeric_sum merges five states".into(),
            ));
        };
        for v in sum.as_primitive::<Decimal256Type>().iter().flatten() {
            self.sum = self.sum.wrapping_add(v);
        }
        let total = |a: &ArrayRef| a.as_primitive::<Int64Type>().iter().flatten().sum::<i64>();
        self.n += total(n);
        self.specials[0] += total(nan);
        self.specials[1] += total(inf);
        self.specials[2] += total(neg_inf);
        Ok(())
    }

    fn state(&mut self) -> Result<Vec<ScalarValue>> {
        Ok(vec![
            ScalarValue::Decimal256(Some(self.sum), 76, self.scale),
            ScalarValue::Int64(Some(self.n)),
            ScalarValue::Int64(Some(self.specials[0])),
            ScalarValue::Int64(Some(self.specials[1])),
            ScalarValue::Int64(Some(self.specials[2])),
        ])
    }

    fn evaluate(&mut self) -> Result<ScalarValue> {
        let DataType::Decimal128(p, s) = self.out else {
            return Err(DataFusionError::Internal(format!(
                "weir_numeric_sum into {}",
                self.out
            )));
        };
        if self.n == 0 {
            return Ok(ScalarValue::Decimal128(None, p, s));
        }
        if let Some(special) = Special::of_counts(self.specials) {
            return Ok(ScalarValue::Decimal128(Some(special.value()), p, s));
        }
        let ten = i256::from_i128(10);
        let mut v = self.sum;
        for _ in self.scale..s {
            v = v.wrapping_mul(ten);
        }
        if self.avg {
            v = divide_rounded(v, self.n);
        }
        match v.to_i128() {
            Some(v) if v.unsigned_abs() < 10u128.pow(38) => {
                Ok(ScalarValue::Decimal128(Some(v), p, s))
            }
            _ => Err(overflow(format!(
                "numeric field overflow: the {} is more than 38 digits",
                if self.avg { "avg" } else { "sum" }
            ))),
        }
    }

    fn size(&self) -> usize {
        size_of::<Self>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Decimal128Array;

    fn acc(avg: bool, out: DataType) -> SumAccumulator {
        SumAccumulator {
            avg,
            scale: 2,
            out,
            sum: i256::ZERO,
            n: 0,
            specials: [0; 3],
        }
    }

    fn values(v: &[i128]) -> ArrayRef {
        Arc::new(
            Decimal128Array::from(v.to_vec())
                .with_precision_and_scale(10, 2)
                .unwrap(),
        )
    }

    #[test]
    fn sums_as_postgres() {
        let mut sum = acc(false, DataType::Decimal128(20, 2));
        sum.update_batch(&[values(&[150, 250])]).unwrap();
        assert_eq!(
            sum.evaluate().unwrap(),
            ScalarValue::Decimal128(Some(400), 20, 2)
        );
        sum.update_batch(&[values(&[Special::Infinity.value()])])
            .unwrap();
        assert_eq!(
            sum.evaluate().unwrap(),
            ScalarValue::Decimal128(Some(Special::Infinity.value()), 20, 2)
        );
        sum.update_batch(&[values(&[Special::NegInfinity.value()])])
            .unwrap();
        assert_eq!(
            sum.evaluate().unwrap(),
            ScalarValue::Decimal128(Some(Special::NaN.value()), 20, 2)
        );
    }

    #[test]
    fn averages_round_half_away_from_zero() {
        let mut avg = acc(true, DataType::Decimal128(14, 6));
        avg.update_batch(&[values(&[-100, -100, -101])]).unwrap();
        // -3.01 / 3 = -1.003333…
        assert_eq!(
            avg.evaluate().unwrap(),
            ScalarValue::Decimal128(Some(-1_003_333), 14, 6)
        );
        let mut state = acc(true, DataType::Decimal128(14, 6));
        let merged: Vec<ArrayRef> = avg
            .state()
            .unwrap()
            .iter()
            .map(|s| s.to_array().unwrap())
            .collect();
        state.merge_batch(&merged).unwrap();
        assert_eq!(state.evaluate().unwrap(), avg.evaluate().unwrap());
    }
}

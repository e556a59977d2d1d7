//! `numeric`'s `NaN`, `Infinity` and `-Infinity`, as Postgres has them.
//!
//! Weir's `numeric` is Arrow's `Decimal128`, which has no such values. They
//! are kept as three values no 38-digit decimal reaches (see [`NAN`]),
//! chosen so that Arrow's own order is Postgres's: `-Infinity` below every
//! number, `Infinity` above, and `NaN` above everything and equal to
//! itself. Comparisons, sorting, grouping, joins, `min`, `max` and
//! `count` need nothing more.
//!
//! Everything that computes with a decimal would take them for huge
//! numbers, so [`NumericSpecials`], an analyzer rule run after Weir's
//! other rewrites, leaves no decimal computation to Arrow alone:
//! - `+ - * / %` become `weir_numeric_add` … `weir_numeric_mod`, and
//!   unary minus `weir_numeric_neg`: Arrow's kernels on the finite values,
//!   then Postgres's answer where an operand is special (`Infinity - 1`
//!   is `Infinity`, `Infinity * 0` is `NaN`, `1 / Infinity` is `0`);
//! - casts from a decimal, and from a float to a decimal, become
//!   `weir_numeric_cast`: special values stay special (`NaN` as a float,
//!   `'Infinity'` as text), become an error where Postgres gives one
//!   (`cannot convert NaN to integer`; `Infinity` in a `numeric(p, s)`);
//! - `round`, `trunc`, `ceil`, `floor`, `abs` and `sign` of a decimal
//!   become `weir_numeric_round` and so on, with Postgres's answers;
//! - `sum` and `avg` count special values beside their totals (in views
//!   the HashAgg operator, in batch queries `super::special_sums`);
//! - every other function and aggregate that takes a decimal (`stddev`,
//!   `sum(DISTINCT …)`, `to_json` …) gets it through `weir_numeric_finite`,
//!   which fails with `0A000` on a special value: an error, never a number
//!   made from a sentinel.
//!
//! Text and binary output, the binary input of parameters, and sinks
//! (which write `NaN` to Postgres and refuse it in JSON, CSV and Parquet)
//! check for these values where they leave Weir.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, PrimitiveArray, StringBuilder, new_empty_array,
};
use datafusion::arrow::compute::kernels::numeric;
use datafusion::arrow::compute::{cast, cast_with_options};
use datafusion::arrow::datatypes::{
    ArrowNativeTypeOp, DataType, Decimal128Type, Decimal256Type, DecimalType, Field, FieldRef,
    Float32Type, Float64Type, i256,
};
use datafusion::arrow::error::ArrowError;
use datafusion::common::format::DEFAULT_CAST_OPTIONS;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    BinaryExpr, Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, Operator, ReturnFieldArgs,
    ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, TryCast, Volatility,
    WindowFunctionDefinition,
};
use datafusion::optimizer::AnalyzerRule;

/// `NaN` in a `Decimal128`: the largest value, so that it sorts above
/// everything and equals itself, as in Postgres. No 38-digit number comes
/// near these three.
pub const NAN: i128 = i128::MAX;
/// `Infinity` in a `Decimal128`.
pub const INFINITY: i128 = i128::MAX - 1;
/// `-Infinity` in a `Decimal128`: `-INFINITY`, so negation maps the two
/// infinities onto each other.
pub const NEG_INFINITY: i128 = -INFINITY;

/// Precision and scale of a `numeric` declared without them: the one
/// decimal type that holds `Infinity` (Postgres allows no infinity in a
/// `numeric(p, s)`).
pub const UNCONSTRAINED: (u8, i8) = (38, 10);

/// One of `numeric`'s values that are not numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Special {
    NaN,
    Infinity,
    NegInfinity,
}

impl Special {
    /// The special value `v` stands for, if any.
    pub fn of(v: i128) -> Option<Special> {
        Raw::special(v)
    }

    /// Postgres's text for it.
    pub fn text(self) -> &'static str {
        match self {
            Special::NaN => "NaN",
            Special::Infinity => "Infinity",
            Special::NegInfinity => "-Infinity",
        }
    }

    /// Its `Decimal128` value.
    pub fn value(self) -> i128 {
        self.raw()
    }

    /// The value Postgres's text input gives for `text`, if it spells one
    /// (`'NaN'`, `'inf'`, `'-Infinity'`, in any case).
    pub fn parse(text: &str) -> Option<Special> {
        match text.trim().to_ascii_lowercase().as_str() {
            "nan" => Some(Special::NaN),
            "infinity" | "+infinity" | "inf" | "+inf" => Some(Special::Infinity),
            "-infinity" | "-inf" => Some(Special::NegInfinity),
            _ => None,
        }
    }

    fn raw<T: Raw>(self) -> T {
        match self {
            Special::NaN => T::nan(),
            Special::Infinity => T::infinity(),
            Special::NegInfinity => T::infinity().neg_wrapping(),
        }
    }

    /// What a `sum` or `avg` is, given how many of its values were `NaN`,
    /// `Infinity` and `-Infinity`, if any was: `NaN` for any `NaN` or for
    /// infinities of both signs, else the infinity.
    pub fn of_counts(counts: [i64; 3]) -> Option<Special> {
        let [nan, inf, neg_inf] = counts.map(|c| c > 0);
        if nan || (inf && neg_inf) {
            Some(Special::NaN)
        } else if inf {
            Some(Special::Infinity)
        } else if neg_inf {
            Some(Special::NegInfinity)
        } else {
            None
        }
    }

    fn negate(self) -> Special {
        match self {
            Special::NaN => Special::NaN,
            Special::Infinity => Special::NegInfinity,
            Special::NegInfinity => Special::Infinity,
        }
    }

    fn float(self) -> f64 {
        match self {
            Special::NaN => f64::NAN,
            Special::Infinity => f64::INFINITY,
            Special::NegInfinity => f64::NEG_INFINITY,
        }
    }

    /// The error Postgres gives for storing it in a `numeric(p, s)`, if
    /// any: an infinity does not fit.
    pub(super) fn check_fits(self, precision: u8, scale: i8) -> Result<()> {
        if self == Special::NaN || precision >= UNCONSTRAINED.0 {
            return Ok(());
        }
        Err(overflow(format!(
            "numeric field overflow: a field with precision {precision}, scale {scale} cannot hold an infinite value"
        )))
    }
}

/// `sum / n` rounded half away from zero, as Postgres rounds an `avg`.
pub fn divide_rounded(sum: i256, n: i64) -> i256 {
    let n = i256::from_i128(n as i128);
    let (q, r) = (sum.wrapping_div(n), sum.wrapping_rem(n));
    if r.wrapping_abs().wrapping_mul(i256::from_i128(2)) >= n.wrapping_abs() {
        let step = if sum.is_negative() == n.is_negative() {
            i256::ONE
        } else {
            i256::MINUS_ONE
        };
        q.wrapping_add(step)
    } else {
        q
    }
}

/// The error for a value that does not fit (`22003`).
pub fn overflow(message: String) -> DataFusionError {
    DataFusionError::ArrowError(Box::new(ArrowError::ArithmeticOverflow(message)), None)
}

/// A decimal's 128- or 256-bit integer, with its three special values.
trait Raw: ArrowNativeTypeOp + Ord {
    fn nan() -> Self;
    fn infinity() -> Self;
    fn ten() -> Self;

    fn special(self) -> Option<Special> {
        if self == Self::nan() {
            Some(Special::NaN)
        } else if self == Self::infinity() {
            Some(Special::Infinity)
        } else if self == Self::infinity().neg_wrapping() {
            Some(Special::NegInfinity)
        } else {
            None
        }
    }

    fn sign(self) -> i8 {
        match self.cmp(&Self::ZERO) {
            std::cmp::Ordering::Less => -1,
            std::cmp::Ordering::Equal => 0,
            std::cmp::Ordering::Greater => 1,
        }
    }

    /// `10^n`.
    fn pow10(n: i8) -> Self {
        (0..n.max(0)).fold(Self::ONE, |acc, _| acc.mul_wrapping(Self::ten()))
    }
}

impl Raw for i128 {
    fn nan() -> Self {
        NAN
    }
    fn infinity() -> Self {
        INFINITY
    }
    fn ten() -> Self {
        10
    }
}

/// In 256 bits (Weir's wide sums and divisions), the largest values of
/// that width, beyond its 76 digits.
impl Raw for i256 {
    fn nan() -> Self {
        i256::MAX
    }
    fn infinity() -> Self {
        i256::MAX.wrapping_sub(i256::ONE)
    }
    fn ten() -> Self {
        i256::from_i128(10)
    }
}

/// Whether `t` is a decimal of 128 or 256 bits.
fn is_decimal(t: &DataType) -> bool {
    matches!(t, DataType::Decimal128(..) | DataType::Decimal256(..))
}

/// The special value of each row of a decimal array, or `None` when the
/// array holds none (the common case, found with one pass).
fn specials(array: &ArrayRef) -> Option<Vec<Option<Special>>> {
    fn of<T: DecimalType>(a: &PrimitiveArray<T>) -> Option<Vec<Option<Special>>>
    where
        T::Native: Raw,
    {
        let any = a
            .iter()
            .any(|v| v.is_some_and(|v| Raw::special(v).is_some()));
        any.then(|| a.iter().map(|v| v.and_then(Raw::special)).collect())
    }
    match array.data_type() {
        DataType::Decimal128(..) => of(array.as_primitive::<Decimal128Type>()),
        DataType::Decimal256(..) => of(array.as_primitive::<Decimal256Type>()),
        DataType::Float32 => float_specials(
            array
                .as_primitive::<Float32Type>()
                .iter()
                .map(|v| v.map(f64::from)),
        ),
        DataType::Float64 => float_specials(array.as_primitive::<Float64Type>().iter()),
        _ => None,
    }
}

fn float_specials(
    values: impl Iterator<Item = Option<f64>> + Clone,
) -> Option<Vec<Option<Special>>> {
    let special = |v: f64| {
        if v.is_nan() {
            Some(Special::NaN)
        } else if v == f64::INFINITY {
            Some(Special::Infinity)
        } else if v == f64::NEG_INFINITY {
            Some(Special::NegInfinity)
        } else {
            None
        }
    };
    let any = values
        .clone()
        .any(|v| v.is_some_and(|v| special(v).is_some()));
    any.then(|| values.map(|v| v.and_then(special)).collect())
}

/// `array` with its special rows (as `specials` found them) replaced by
/// `1` (`one`) or `0`, so that Arrow's kernels see only numbers.
fn zap(array: &ArrayRef, specials: &[Option<Special>], one: bool) -> Result<ArrayRef> {
    fn go<T: DecimalType>(a: &PrimitiveArray<T>, s: &[Option<Special>], one: bool) -> ArrayRef
    where
        T::Native: Raw,
    {
        let scale = match a.data_type() {
            DataType::Decimal128(_, s) | DataType::Decimal256(_, s) => *s,
            _ => 0,
        };
        let fill = if one {
            <T::Native as Raw>::pow10(scale)
        } else {
            T::Native::ZERO
        };
        let values: Vec<T::Native> = a
            .values()
            .iter()
            .zip(s)
            .map(|(v, s)| if s.is_some() { fill } else { *v })
            .collect();
        Arc::new(
            PrimitiveArray::<T>::new(values.into(), a.nulls().cloned())
                .with_data_type(a.data_type().clone()),
        )
    }
    Ok(match array.data_type() {
        DataType::Decimal128(..) => go(array.as_primitive::<Decimal128Type>(), specials, one),
        DataType::Decimal256(..) => go(array.as_primitive::<Decimal256Type>(), specials, one),
        DataType::Float32 | DataType::Float64 => {
            let a = cast(array, &DataType::Float64)?;
            let values: Vec<Option<f64>> = a
                .as_primitive::<Float64Type>()
                .iter()
                .zip(specials)
                .map(|(v, s)| if s.is_some() { Some(0.0) } else { v })
                .collect();
            cast(
                &(Arc::new(PrimitiveArray::<Float64Type>::from(values)) as ArrayRef),
                array.data_type(),
            )?
        }
        other => {
            return Err(DataFusionError::Internal(format!(
                "numeric specials of {other}"
            )));
        }
    })
}

/// What a row of a result becomes.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Outcome {
    /// The value Arrow computed.
    Computed,
    Special(Special),
    /// A decimal `value` (in `1`s), as `sign` of a special value.
    Whole(i8),
    /// The left operand, at the result's scale (`5 % Infinity`).
    Left,
}

/// `out` with its rows replaced as `outcome` says, keeping its type.
/// `left` is the left operand, for [`Outcome::Left`].
fn patch(
    out: &ArrayRef,
    left: Option<&ArrayRef>,
    outcome: impl Fn(usize) -> Result<Outcome>,
) -> Result<ArrayRef> {
    fn decimals<T: DecimalType>(
        out: &PrimitiveArray<T>,
        left: Option<&ArrayRef>,
        outcome: impl Fn(usize) -> Result<Outcome>,
    ) -> Result<ArrayRef>
    where
        T::Native: Raw,
    {
        let (precision, scale) = match out.data_type() {
            DataType::Decimal128(p, s) | DataType::Decimal256(p, s) => (*p, *s),
            _ => (38, 0),
        };
        let wide = matches!(out.data_type(), DataType::Decimal256(..));
        let left = match left {
            Some(l) => Some(cast(l, out.data_type())?),
            None => None,
        };
        let mut values: Vec<T::Native> = out.values().to_vec();
        for (i, v) in values.iter_mut().enumerate() {
            if out.is_null(i) {
                continue;
            }
            match outcome(i)? {
                Outcome::Computed => {}
                Outcome::Special(s) => {
                    if !wide {
                        s.check_fits(precision, scale)?;
                    }
                    *v = s.raw();
                }
                Outcome::Whole(n) => {
                    let one = <T::Native as Raw>::pow10(scale);
                    *v = match n {
                        0 => T::Native::ZERO,
                        n if n < 0 => one.neg_wrapping(),
                        _ => one,
                    };
                }
                Outcome::Left => {
                    if let Some(l) = &left {
                        *v = l.as_primitive::<T>().value(i);
                    }
                }
            }
        }
        Ok(Arc::new(
            PrimitiveArray::<T>::new(values.into(), out.nulls().cloned())
                .with_data_type(out.data_type().clone()),
        ))
    }
    fn floats(out: &ArrayRef, outcome: impl Fn(usize) -> Result<Outcome>) -> Result<ArrayRef> {
        let wide = cast(out, &DataType::Float64)?;
        let wide = wide.as_primitive::<Float64Type>();
        let mut values: Vec<f64> = wide.values().to_vec();
        for (i, v) in values.iter_mut().enumerate() {
            if wide.is_null(i) {
                continue;
            }
            match outcome(i)? {
                Outcome::Special(s) => *v = s.float(),
                Outcome::Whole(n) => *v = n as f64,
                Outcome::Computed | Outcome::Left => {}
            }
        }
        let patched: ArrayRef = Arc::new(PrimitiveArray::<Float64Type>::new(
            values.into(),
            wide.nulls().cloned(),
        ));
        Ok(cast(&patched, out.data_type())?)
    }
    match out.data_type() {
        DataType::Decimal128(..) => decimals(out.as_primitive::<Decimal128Type>(), left, outcome),
        DataType::Decimal256(..) => decimals(out.as_primitive::<Decimal256Type>(), left, outcome),
        DataType::Float64 | DataType::Float32 => floats(out, outcome),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => {
            let text = cast(out, &DataType::Utf8)?;
            let text = text.as_string::<i32>();
            let mut b = StringBuilder::with_capacity(text.len(), text.value_data().len());
            for i in 0..text.len() {
                if text.is_null(i) {
                    b.append_null();
                    continue;
                }
                match outcome(i)? {
                    Outcome::Special(s) => b.append_value(s.text()),
                    Outcome::Whole(n) => b.append_value(n.to_string()),
                    Outcome::Computed | Outcome::Left => b.append_value(text.value(i)),
                }
            }
            Ok(cast(&(Arc::new(b.finish()) as ArrayRef), out.data_type())?)
        }
        other => {
            // Integers and the rest have no such values.
            for i in 0..out.len() {
                if out.is_null(i) {
                    continue;
                }
                if let Outcome::Special(s) = outcome(i)? {
                    return Err(not_a_number(s, other));
                }
            }
            Ok(out.clone())
        }
    }
}

/// Postgres's error for a special value where `t` has none.
fn not_a_number(s: Special, t: &DataType) -> DataFusionError {
    let what = if s == Special::NaN { "NaN" } else { "infinity" };
    let name = match t {
        DataType::Int16 => "smallint".to_string(),
        DataType::Int32 => "integer".to_string(),
        DataType::Int64 => "bigint".to_string(),
        DataType::Int8
        | DataType::UInt8
        | DataType::UInt16
        | DataType::UInt32
        | DataType::UInt64 => "integer".to_string(),
        other => other.to_string(),
    };
    DataFusionError::NotImplemented(format!("cannot convert {what} to {name}"))
}

/// The arguments of a call as arrays of one length, and whether they were
/// all scalars (the result is then a scalar too).
fn arrays(args: &ScalarFunctionArgs) -> Result<(Vec<ArrayRef>, bool)> {
    let scalar = args
        .args
        .iter()
        .all(|a| matches!(a, ColumnarValue::Scalar(_)));
    let rows = if scalar { 1 } else { args.number_rows };
    let arrays = args
        .args
        .iter()
        .map(|a| a.to_array(rows))
        .collect::<Result<_>>()?;
    Ok((arrays, scalar))
}

/// The first argument of a call as an array, and whether it was a scalar
/// (the others are constants the function reads as they are).
fn first(args: &ScalarFunctionArgs) -> Result<(ArrayRef, bool)> {
    match args.args.first() {
        Some(ColumnarValue::Scalar(s)) => Ok((s.to_array()?, true)),
        Some(ColumnarValue::Array(a)) => Ok((a.clone(), false)),
        None => Err(DataFusionError::Internal("no arguments".into())),
    }
}

fn columnar(out: ArrayRef, scalar: bool) -> Result<ColumnarValue> {
    Ok(if scalar {
        ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
    } else {
        ColumnarValue::Array(out)
    })
}

fn arrow_error(e: ArrowError) -> DataFusionError {
    DataFusionError::ArrowError(Box::new(e), None)
}

/// An operand of arithmetic: special, or a number of some sign.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Class {
    Special(Special),
    Number(i8),
}

fn class_at(array: &ArrayRef, specials: Option<&Vec<Option<Special>>>, i: usize) -> Class {
    if let Some(s) = specials.and_then(|s| s[i]) {
        return Class::Special(s);
    }
    let sign = match array.data_type() {
        DataType::Decimal128(..) => array.as_primitive::<Decimal128Type>().value(i).sign(),
        DataType::Decimal256(..) => array.as_primitive::<Decimal256Type>().value(i).sign(),
        _ => 1,
    };
    Class::Number(sign)
}

/// Decimal arithmetic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Mod,
}

impl Op {
    fn of(op: Operator) -> Option<Op> {
        Some(match op {
            Operator::Plus => Op::Add,
            Operator::Minus => Op::Sub,
            Operator::Multiply => Op::Mul,
            Operator::Divide => Op::Div,
            Operator::Modulo => Op::Mod,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Op::Add => "weir_numeric_add",
            Op::Sub => "weir_numeric_sub",
            Op::Mul => "weir_numeric_mul",
            Op::Div => "weir_numeric_div",
            Op::Mod => "weir_numeric_mod",
        }
    }

    fn kernel(self, l: &ArrayRef, r: &ArrayRef) -> Result<ArrayRef> {
        match self {
            Op::Add => numeric::add(l, r),
            Op::Sub => numeric::sub(l, r),
            Op::Mul => numeric::mul(l, r),
            Op::Div => numeric::div(l, r),
            Op::Mod => numeric::rem(l, r),
        }
        .map_err(arrow_error)
    }

    /// Postgres's answer for `l op r` when either is special.
    fn special(self, l: Class, r: Class) -> Result<Outcome> {
        use Class::{Number, Special as S};
        use Special::{Infinity, NaN, NegInfinity};
        let inf = |sign: i8| Outcome::Special(if sign < 0 { NegInfinity } else { Infinity });
        let sign = |s: Special| if s == NegInfinity { -1 } else { 1 };
        let division_by_zero = || {
            Err(DataFusionError::ArrowError(
                Box::new(ArrowError::DivideByZero),
                None,
            ))
        };
        Ok(match (self, l, r) {
            (_, Number(_), Number(_)) => Outcome::Computed,
            (_, S(NaN), _) | (_, _, S(NaN)) => Outcome::Special(NaN),
            (Op::Add, S(a), S(b)) if a != b => Outcome::Special(NaN),
            (Op::Add, S(a), _) | (Op::Add, _, S(a)) => Outcome::Special(a),
            (Op::Sub, S(a), S(b)) if a == b => Outcome::Special(NaN),
            (Op::Sub, S(a), _) => Outcome::Special(a),
            (Op::Sub, _, S(b)) => Outcome::Special(b.negate()),
            (Op::Mul, S(_), Number(0)) | (Op::Mul, Number(0), S(_)) => Outcome::Special(NaN),
            (Op::Mul, S(a), S(b)) => inf(sign(a) * sign(b)),
            (Op::Mul, S(a), Number(n)) | (Op::Mul, Number(n), S(a)) => inf(sign(a) * n),
            (Op::Div, S(_), S(_)) => Outcome::Special(NaN),
            (Op::Div, S(_), Number(0)) => return division_by_zero(),
            (Op::Div, S(a), Number(n)) => inf(sign(a) * n),
            (Op::Div, Number(_), S(_)) => Outcome::Whole(0),
            (Op::Mod, S(_), Number(0)) => return division_by_zero(),
            (Op::Mod, S(_), _) => Outcome::Special(NaN),
            (Op::Mod, Number(_), S(_)) => Outcome::Left,
        })
    }
}

/// `weir_numeric_add(l, r)` and its siblings: `l op r` of decimals.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Arith {
    op: Op,
    signature: Signature,
}

impl ScalarUDFImpl for Arith {
    fn name(&self) -> &str {
        self.op.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    /// Arrow's type for the result, the type DataFusion gives `l op r`.
    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        let [l, r] = args else {
            return Err(DataFusionError::Plan(format!(
                "{} takes two arguments",
                self.name()
            )));
        };
        Ok(self
            .op
            .kernel(&new_empty_array(l), &new_empty_array(r))?
            .data_type()
            .clone())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (arrays, scalar) = arrays(&args)?;
        let [l, r] = arrays.as_slice() else {
            return Err(DataFusionError::Internal("two arguments expected".into()));
        };
        let (ls, rs) = (specials(l), specials(r));
        if ls.is_none() && rs.is_none() {
            return columnar(self.op.kernel(l, r)?, scalar);
        }
        let divides = matches!(self.op, Op::Div | Op::Mod);
        let zl = match &ls {
            Some(s) => zap(l, s, false)?,
            None => l.clone(),
        };
        // A divisor is made 1 where either operand is special: `NaN / 0`
        // is `NaN`, not Arrow's division by zero.
        let zr = match (&rs, &ls) {
            (Some(s), Some(l)) if divides => {
                let either: Vec<Option<Special>> = s.iter().zip(l).map(|(r, l)| r.or(*l)).collect();
                zap(r, &either, true)?
            }
            (None, Some(l)) if divides => zap(r, l, true)?,
            (Some(s), _) => zap(r, s, divides)?,
            (None, _) => r.clone(),
        };
        let out = self.op.kernel(&zl, &zr)?;
        let out = patch(&out, Some(l), |i| {
            if l.is_null(i) || r.is_null(i) {
                return Ok(Outcome::Computed);
            }
            self.op
                .special(class_at(l, ls.as_ref(), i), class_at(r, rs.as_ref(), i))
        })?;
        columnar(out, scalar)
    }
}

/// What a one-argument function does to a special value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    /// The value itself (`round`, `trunc`, `ceil`, `floor`, casts).
    Keep,
    /// `-x`.
    Negate,
    /// `abs(x)`.
    Abs,
    /// `sign(x)`: `NaN`, or `1` and `-1` for the infinities.
    Sign,
}

impl Kind {
    fn outcome(self, s: Special) -> Outcome {
        match (self, s) {
            (_, Special::NaN) => Outcome::Special(Special::NaN),
            (Kind::Keep, s) => Outcome::Special(s),
            (Kind::Negate, s) => Outcome::Special(s.negate()),
            (Kind::Abs, _) => Outcome::Special(Special::Infinity),
            (Kind::Sign, Special::Infinity) => Outcome::Whole(1),
            (Kind::Sign, _) => Outcome::Whole(-1),
        }
    }
}

/// The functions of one decimal that Postgres defines on special values,
/// by their DataFusion names, with what they do to them.
const WRAPPED: &[(&str, Kind)] = &[
    ("round", Kind::Keep),
    ("trunc", Kind::Keep),
    ("ceil", Kind::Keep),
    ("floor", Kind::Keep),
    ("abs", Kind::Abs),
    ("signum", Kind::Sign),
];

/// `weir_numeric_round(x, …)` and the like: DataFusion's function of the
/// finite values, Postgres's answer for the special ones.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Wrapped {
    name: String,
    inner: Arc<ScalarUDF>,
    kind: Kind,
}

impl Wrapped {
    fn new(inner: Arc<ScalarUDF>, kind: Kind) -> Self {
        Self {
            name: format!("weir_numeric_{}", inner.name()),
            inner,
            kind,
        }
    }
}

impl ScalarUDFImpl for Wrapped {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        self.inner.signature()
    }

    fn coerce_types(&self, args: &[DataType]) -> Result<Vec<DataType>> {
        Ok(args.to_vec())
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        self.inner.return_type(args)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn invoke_with_args(&self, mut args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let x = match args.args.first() {
            Some(ColumnarValue::Array(a)) => a.clone(),
            Some(ColumnarValue::Scalar(s)) => s.to_array()?,
            None => return self.inner.invoke_with_args(args),
        };
        let Some(s) = specials(&x) else {
            return self.inner.invoke_with_args(args);
        };
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        args.args[0] = if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&zap(&x, &s, false)?, 0)?)
        } else {
            ColumnarValue::Array(zap(&x, &s, false)?)
        };
        let rows = args.number_rows;
        let out = self.inner.invoke_with_args(args)?;
        let all_scalar = matches!(out, ColumnarValue::Scalar(_));
        let out = out.to_array(if all_scalar { 1 } else { rows })?;
        let kind = self.kind;
        let out = patch(&out, None, |i| {
            let i = if scalar { 0 } else { i };
            Ok(match s[i] {
                Some(s) => kind.outcome(s),
                None => Outcome::Computed,
            })
        })?;
        columnar(out, all_scalar)
    }
}

/// `weir_numeric_neg(x)`: `-x` of a decimal.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Neg {
    signature: Signature,
}

impl ScalarUDFImpl for Neg {
    fn name(&self) -> &str {
        "weir_numeric_neg"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        args.first()
            .cloned()
            .ok_or_else(|| DataFusionError::Plan("weir_numeric_neg takes one argument".into()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (arrays, scalar) = arrays(&args)?;
        let x = &arrays[0];
        let s = specials(x);
        let zapped = match &s {
            Some(s) => zap(x, s, false)?,
            None => x.clone(),
        };
        let out = numeric::neg(&zapped).map_err(arrow_error)?;
        let out = match &s {
            Some(s) => patch(&out, None, |i| {
                Ok(s[i].map_or(Outcome::Computed, |s| Kind::Negate.outcome(s)))
            })?,
            None => out,
        };
        columnar(out, scalar)
    }
}

/// `weir_numeric_cast(x, 'type')`: a cast of a decimal, or of a float to
/// a decimal, that keeps special values special.
#[derive(Debug, PartialEq, Eq, Hash)]
struct NumericCast {
    signature: Signature,
}

impl ScalarUDFImpl for NumericCast {
    fn name(&self) -> &str {
        "weir_numeric_cast"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal(
            "weir_numeric_cast's type comes from its arguments".into(),
        ))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let t = super::type_argument(self.name(), args.scalar_arguments.get(1).copied().flatten())?;
        Ok(Arc::new(Field::new(self.name(), t, true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let target = args.return_field.data_type().clone();
        let (x, scalar) = first(&args)?;
        columnar(cast_keeping_specials(&x, &target)?, scalar)
    }
}

/// `x` (a decimal, or a float) cast to `target` as Arrow casts it (an
/// error where a value does not fit), its special values kept special:
/// `NaN` and the infinities as a float's, as text, as the decimal values
/// that stand for them, or Postgres's error where `target` has none.
pub fn cast_keeping_specials(x: &ArrayRef, target: &DataType) -> Result<ArrayRef> {
    if x.data_type() == target {
        return Ok(x.clone());
    }
    // Between floats, NaN and the infinities are what they are.
    let keep_floats = is_float(x.data_type()) && is_float(target);
    let Some(s) = specials(x).filter(|_| !keep_floats) else {
        return Ok(cast_with_options(x, target, &DEFAULT_CAST_OPTIONS)?);
    };
    let out = cast_with_options(&zap(x, &s, false)?, target, &DEFAULT_CAST_OPTIONS)?;
    patch(&out, None, |i| {
        Ok(s[i].map_or(Outcome::Computed, Outcome::Special))
    })
}

/// `weir_numeric_finite(x, 'what')`: `x`, or `0A000` if it is special,
/// for what is not defined on special values here.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Finite {
    signature: Signature,
}

impl ScalarUDFImpl for Finite {
    fn name(&self) -> &str {
        "weir_numeric_finite"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        args.first()
            .cloned()
            .ok_or_else(|| DataFusionError::Plan("weir_numeric_finite takes two arguments".into()))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let (x, _) = first(&args)?;
        if let Some(s) = specials(&x) {
            let what = match &args.args.get(1) {
                Some(ColumnarValue::Scalar(ScalarValue::Utf8(Some(w)))) => w.clone(),
                _ => "this function".into(),
            };
            if let Some(s) = s.into_iter().flatten().next() {
                return Err(DataFusionError::NotImplemented(format!(
                    "numeric {} in {what} is not supported",
                    s.text()
                )));
            }
        }
        Ok(args.args[0].clone())
    }
}

fn sig(n: usize) -> Signature {
    Signature::any(n, Volatility::Immutable)
}

fn arith(op: Op) -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Arith {
        op,
        signature: sig(2),
    }))
}

fn neg() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Neg { signature: sig(1) }))
}

fn numeric_cast() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(NumericCast { signature: sig(2) }))
}

fn finite() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(Finite { signature: sig(2) }))
}

/// DataFusion's function `name` of [`WRAPPED`].
fn datafusion_function(name: &str) -> Option<Arc<ScalarUDF>> {
    use datafusion::functions::math;
    Some(match name {
        "round" => math::round(),
        "trunc" => math::trunc(),
        "ceil" => math::ceil(),
        "floor" => math::floor(),
        "abs" => math::abs(),
        "signum" => math::signum(),
        _ => return None,
    })
}

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    let mut all = vec![
        arith(Op::Add),
        arith(Op::Sub),
        arith(Op::Mul),
        arith(Op::Div),
        arith(Op::Mod),
        neg(),
        numeric_cast(),
        finite(),
    ];
    for (name, kind) in WRAPPED {
        if let Some(inner) = datafusion_function(name) {
            all.push(Arc::new(ScalarUDF::new_from_impl(Wrapped::new(
                inner, *kind,
            ))));
        }
    }
    all
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct NumericSpecials;

impl AnalyzerRule for NumericSpecials {
    fn name(&self) -> &str {
        "weir_numeric_specials"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite)
    }
}

fn call(udf: Arc<ScalarUDF>, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(udf, args))
}

fn text(s: &str) -> Expr {
    Expr::Literal(ScalarValue::Utf8(Some(s.to_string())), None)
}

fn type_of(e: &Expr, schema: &DFSchema) -> Option<DataType> {
    e.get_type(schema as &dyn ExprSchema).ok()
}

/// Whether `e` may be a special value, as far as its form tells.
fn may_be_special(e: &Expr, schema: &DFSchema) -> bool {
    match e {
        Expr::Literal(ScalarValue::Decimal128(v, ..), _) => {
            v.is_some_and(|v| Special::of(v).is_some())
        }
        Expr::Literal(ScalarValue::Decimal256(v, ..), _) => {
            v.is_some_and(|v| Raw::special(v).is_some())
        }
        Expr::Literal(ScalarValue::Float64(Some(v)), _) => !v.is_finite(),
        Expr::Literal(ScalarValue::Float32(Some(v)), _) => !v.is_finite(),
        Expr::Literal(..) => false,
        Expr::Alias(a) => may_be_special(&a.expr, schema),
        // Integers become finite decimals; text may spell `NaN`.
        Expr::Cast(c) => !type_of(&c.expr, schema)
            .is_some_and(|t| t.is_integer() || matches!(t, DataType::Boolean | DataType::Null)),
        Expr::ScalarFunction(f) => f.func.name() != "weir_numeric_finite",
        _ => true,
    }
}

fn is_float(t: &DataType) -> bool {
    matches!(t, DataType::Float32 | DataType::Float64)
}

/// Whether `e` is a decimal that may be special.
fn special_decimal(e: &Expr, schema: &DFSchema) -> bool {
    type_of(e, schema).is_some_and(|t| is_decimal(&t)) && may_be_special(e, schema)
}

/// `args` with each decimal among them checked to be finite, for `what`.
fn guard(args: &mut [Expr], what: &str, schema: &DFSchema) -> bool {
    let mut changed = false;
    for a in args.iter_mut() {
        if special_decimal(a, schema) {
            let inner = std::mem::replace(a, Expr::Literal(ScalarValue::Null, None));
            *a = call(finite(), vec![inner, text(what)]);
            changed = true;
        }
    }
    changed
}

/// Aggregates and window functions that only compare, count or pass on
/// their decimal arguments.
fn passes_values(name: &str) -> bool {
    matches!(
        name,
        "min"
            | "max"
            | "count"
            | "first_value"
            | "last_value"
            | "any_value"
            | "nth_value"
            | "lag"
            | "lead"
            | "coalesce"
            | "nullif"
            | "nvl"
            | "ifnull"
            | "greatest"
            | "least"
    )
}

/// Operators that only compare decimals, which Arrow's order does right.
fn compares(op: Operator) -> bool {
    matches!(
        op,
        Operator::Eq
            | Operator::NotEq
            | Operator::Lt
            | Operator::LtEq
            | Operator::Gt
            | Operator::GtEq
            | Operator::IsDistinctFrom
            | Operator::IsNotDistinctFrom
            | Operator::And
            | Operator::Or
    )
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    Ok(match e {
        Expr::BinaryExpr(BinaryExpr { left, op, right }) => {
            let decimals = (
                special_decimal(&left, schema),
                special_decimal(&right, schema),
            );
            let both = type_of(&left, schema).is_some_and(|t| is_decimal(&t))
                && type_of(&right, schema).is_some_and(|t| is_decimal(&t));
            match Op::of(op) {
                Some(op) if both && (decimals.0 || decimals.1) => {
                    Transformed::yes(call(arith(op), vec![*left, *right]))
                }
                None if compares(op) => {
                    Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right }))
                }
                _ if decimals.0 || decimals.1 => {
                    let mut args = [*left, *right];
                    guard(&mut args, &format!("operator {op}"), schema);
                    let [left, right] = args;
                    Transformed::yes(Expr::BinaryExpr(BinaryExpr::new(
                        Box::new(left),
                        op,
                        Box::new(right),
                    )))
                }
                _ => Transformed::no(Expr::BinaryExpr(BinaryExpr { left, op, right })),
            }
        }
        Expr::Negative(x) if special_decimal(&x, schema) => Transformed::yes(call(neg(), vec![*x])),
        Expr::Cast(Cast { expr, field }) => {
            let from = type_of(&expr, schema);
            let to = field.data_type();
            let wanted = match &from {
                Some(f) if is_decimal(f) => f != to && may_be_special(&expr, schema),
                Some(f) if is_float(f) => is_decimal(to) && may_be_special(&expr, schema),
                _ => false,
            };
            if wanted {
                Transformed::yes(call(numeric_cast(), vec![*expr, text(&to.to_string())]))
            } else {
                Transformed::no(Expr::Cast(Cast { expr, field }))
            }
        }
        Expr::TryCast(TryCast { expr, field }) if special_decimal(&expr, schema) => {
            let mut args = [*expr];
            guard(&mut args, "a cast", schema);
            let [expr] = args;
            Transformed::yes(Expr::TryCast(TryCast {
                expr: Box::new(expr),
                field,
            }))
        }
        Expr::ScalarFunction(mut f) => {
            let name = f.func.name().to_string();
            if name.starts_with("weir_numeric_") || passes_values(&name) {
                return Ok(Transformed::no(Expr::ScalarFunction(f)));
            }
            let first_special = f.args.first().is_some_and(|a| special_decimal(a, schema));
            if let Some((_, kind)) = WRAPPED.iter().find(|(n, _)| *n == name)
                && first_special
            {
                let wrapped = Wrapped::new(f.func.clone(), *kind);
                return Ok(Transformed::yes(Expr::ScalarFunction(
                    ScalarFunction::new_udf(Arc::new(ScalarUDF::new_from_impl(wrapped)), f.args),
                )));
            }
            if guard(&mut f.args, &name, schema) {
                Transformed::yes(Expr::ScalarFunction(f))
            } else {
                Transformed::no(Expr::ScalarFunction(f))
            }
        }
        Expr::AggregateFunction(mut a) => {
            let name = a.func.name().to_string();
            // `sum` and `avg` count special values beside their totals.
            let counted =
                super::special_sums::handled(&name, &a.params.args, a.params.distinct, schema);
            if !passes_values(&name) && !counted && guard(&mut a.params.args, &name, schema) {
                Transformed::yes(Expr::AggregateFunction(a))
            } else {
                Transformed::no(Expr::AggregateFunction(a))
            }
        }
        Expr::WindowFunction(mut w) => {
            let name = match &w.fun {
                WindowFunctionDefinition::AggregateUDF(f) => f.name().to_string(),
                WindowFunctionDefinition::WindowUDF(f) => f.name().to_string(),
            };
            if !passes_values(&name) && guard(&mut w.params.args, &name, schema) {
                Transformed::yes(Expr::WindowFunction(w))
            } else {
                Transformed::no(Expr::WindowFunction(w))
            }
        }
        other => Transformed::no(other),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinels_order_as_postgres_orders() {
        assert!(NEG_INFINITY < -(10i128.pow(38)));
        assert!(10i128.pow(38) < INFINITY);
        const { assert!(INFINITY < NAN) };
        assert_eq!(Special::of(NAN), Some(Special::NaN));
        assert_eq!(Special::of(-INFINITY), Some(Special::NegInfinity));
        assert_eq!(Special::of(10i128.pow(37)), None);
        assert_eq!(Special::parse(" -inf "), Some(Special::NegInfinity));
        assert_eq!(Special::parse("NAN"), Some(Special::NaN));
        assert_eq!(Special::parse("1"), None);
    }

    #[test]
    fn arithmetic_with_special_values_as_postgres() {
        use Class::{Number as N, Special as S};
        use Special::*;
        let sp = Outcome::Special;
        assert_eq!(Op::Add.special(S(Infinity), N(1)).unwrap(), sp(Infinity));
        assert_eq!(
            Op::Add.special(S(Infinity), S(NegInfinity)).unwrap(),
            sp(NaN)
        );
        assert_eq!(Op::Sub.special(S(Infinity), S(Infinity)).unwrap(), sp(NaN));
        assert_eq!(Op::Sub.special(N(1), S(Infinity)).unwrap(), sp(NegInfinity));
        assert_eq!(Op::Mul.special(S(Infinity), N(0)).unwrap(), sp(NaN));
        assert_eq!(
            Op::Mul.special(S(Infinity), N(-1)).unwrap(),
            sp(NegInfinity)
        );
        assert_eq!(
            Op::Div.special(N(1), S(Infinity)).unwrap(),
            Outcome::Whole(0)
        );
        assert_eq!(Op::Div.special(S(NaN), N(0)).unwrap(), sp(NaN));
        assert!(Op::Div.special(S(Infinity), N(0)).is_err());
        assert_eq!(Op::Mod.special(N(5), S(Infinity)).unwrap(), Outcome::Left);
        assert_eq!(Op::Mod.special(S(Infinity), N(2)).unwrap(), sp(NaN));
    }

    #[test]
    fn arrow_result_types_are_datafusions() {
        use datafusion::logical_expr::type_coercion::binary::BinaryTypeCoercer;
        let types = [
            DataType::Decimal128(38, 10),
            DataType::Decimal128(10, 2),
            DataType::Decimal128(5, 0),
        ];
        for (op, operator) in [
            (Op::Add, Operator::Plus),
            (Op::Sub, Operator::Minus),
            (Op::Mul, Operator::Multiply),
            (Op::Div, Operator::Divide),
            (Op::Mod, Operator::Modulo),
        ] {
            for l in &types {
                for r in &types {
                    let ours = arith(op).return_type(&[l.clone(), r.clone()]).unwrap();
                    let theirs = BinaryTypeCoercer::new(l, &operator, r).get_result_type();
                    if let Ok(theirs) = theirs {
                        assert_eq!(ours, theirs, "{l} {operator} {r}");
                    }
                }
            }
        }
    }
}

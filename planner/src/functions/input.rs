//! Text read as a value of a type, as Postgres's input functions read it.
//!
//! Arrow's casts from text differ from Postgres's in what they accept and
//! in how they fail: `'2020-04-15 12:02'` (no seconds) is no timestamp to
//! Arrow, `' 12 '` no integer; `'99999999999'::int` is a parse error
//! (`22P02`) where Postgres says the value is out of range (`22003`), and
//! `'NaN'::numeric` an unknown string where Postgres has a value (kept as
//! `super::numeric_special` describes).
//!
//! [`TextInput`], an analyzer rule run after type coercion, rewrites every
//! cast of text to `smallint`, `integer`, `bigint`, `numeric(p, s)`,
//! `timestamp` and `timestamptz` — the literals' (`timestamp '…'`,
//! `'…'::int`), the ones coercion adds (`ts > '2020-01-01 12:00'`, an
//! `INSERT` of text into a column, `COPY`) and the query's own — into
//! `weir_text_input(text, 'type')`, which reads the text as Postgres does.

use std::sync::Arc;

use chrono::{NaiveDate, NaiveDateTime, NaiveTime};
use datafusion::arrow::array::{
    Array, ArrayRef, Decimal128Builder, Int16Builder, Int32Builder, Int64Builder, StringArray,
    TimestampMicrosecondBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef, TimeUnit};
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ReturnFieldArgs, ScalarFunctionArgs,
    ScalarUDF, ScalarUDFImpl, Signature, TryCast, Volatility,
};
use datafusion::optimizer::AnalyzerRule;

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![udf()]
}

fn udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(TextInputFn {
        signature: Signature::any(2, Volatility::Immutable),
    }))
}

/// Whether Weir reads text as `t` itself.
fn handled(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::Decimal128(..)
            | DataType::Timestamp(..)
    )
}

fn is_text(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct TextInput;

impl AnalyzerRule for TextInput {
    fn name(&self) -> &str {
        "weir_text_input"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite)
    }
}

fn rewrite(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let (expr, data_type) = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field })
            if handled(field.data_type()) =>
        {
            (expr, field.data_type())
        }
        _ => return Ok(Transformed::no(e)),
    };
    if !expr
        .get_type(schema as &dyn ExprSchema)
        .is_ok_and(|t| is_text(&t))
    {
        return Ok(Transformed::no(e));
    }
    let call = Expr::ScalarFunction(ScalarFunction::new_udf(
        udf(),
        vec![
            expr.as_ref().clone(),
            Expr::Literal(ScalarValue::Utf8(Some(data_type.to_string())), None),
        ],
    ));
    Ok(Transformed::yes(call))
}

/// `weir_text_input(text, 'type')`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct TextInputFn {
    signature: Signature,
}

impl ScalarUDFImpl for TextInputFn {
    fn name(&self) -> &str {
        "weir_text_input"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Err(DataFusionError::Internal(
            "weir_text_input's type comes from its arguments".into(),
        ))
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> Result<FieldRef> {
        let t = super::type_argument(self.name(), args.scalar_arguments.get(1).copied().flatten())?;
        Ok(Arc::new(Field::new(self.name(), t, true)))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let target = args.return_field.data_type().clone();
        let rows = args.number_rows;
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        let text = cast(
            &args.args[0].to_array(if scalar { 1 } else { rows })?,
            &DataType::Utf8,
        )?;
        let text = text
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| DataFusionError::Internal("weir_text_input text".into()))?;
        let out = read(text, &target)?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

fn invalid(type_name: &str, s: &str) -> DataFusionError {
    DataFusionError::ArrowError(
        Box::new(ArrowError::ParseError(format!(
            "invalid input syntax for type {type_name}: \"{s}\""
        ))),
        None,
    )
}

fn out_of_range(message: String) -> DataFusionError {
    DataFusionError::ArrowError(Box::new(ArrowError::ArithmeticOverflow(message)), None)
}

fn read(text: &StringArray, target: &DataType) -> Result<ArrayRef> {
    Ok(match target {
        DataType::Int16 => {
            let mut b = Int16Builder::with_capacity(text.len());
            for v in text.iter() {
                b.append_option(v.map(|s| integer(s, "smallint")).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Int32 => {
            let mut b = Int32Builder::with_capacity(text.len());
            for v in text.iter() {
                b.append_option(v.map(|s| integer(s, "integer")).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Int64 => {
            let mut b = Int64Builder::with_capacity(text.len());
            for v in text.iter() {
                b.append_option(v.map(|s| integer(s, "bigint")).transpose()?);
            }
            Arc::new(b.finish())
        }
        DataType::Decimal128(p, s) => {
            let mut b = Decimal128Builder::with_capacity(text.len());
            for v in text.iter() {
                b.append_option(v.map(|v| numeric(v, *p, *s)).transpose()?);
            }
            Arc::new(b.finish().with_precision_and_scale(*p, *s)?)
        }
        DataType::Timestamp(unit, zone) => {
            let with_zone = zone.is_some();
            let name = if with_zone {
                "timestamp with time zone"
            } else {
                "timestamp without time zone"
            };
            let mut b = TimestampMicrosecondBuilder::with_capacity(text.len());
            for v in text.iter() {
                b.append_option(
                    v.map(|s| timestamp_micros(s, with_zone).ok_or_else(|| invalid(name, s)))
                        .transpose()?,
                );
            }
            let micros: ArrayRef = Arc::new(b.finish().with_timezone_opt(zone.clone()));
            if *unit == TimeUnit::Microsecond {
                micros
            } else {
                cast(&micros, target)?
            }
        }
        other => {
            return Err(DataFusionError::Internal(format!(
                "weir_text_input to {other}"
            )));
        }
    })
}

/// An integer of `T` as Postgres reads one: blanks around it allowed.
fn integer<T: TryFrom<i128>>(s: &str, type_name: &str) -> Result<T> {
    let t = s.trim();
    let digits = t.strip_prefix(['+', '-']).unwrap_or(t);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid(type_name, s));
    }
    let too_big = || {
        out_of_range(format!(
            "value \"{s}\" is out of range for type {type_name}"
        ))
    };
    let v: i128 = t.parse().map_err(|_| too_big())?;
    T::try_from(v).map_err(|_| too_big())
}

/// A decimal as Postgres reads a `numeric(p, s)`: rounded half away from
/// zero to `s` places; an exponent allowed.
fn numeric(s: &str, precision: u8, scale: i8) -> Result<i128> {
    let t = s.trim();
    if let Some(special) = super::numeric_special::Special::parse(t) {
        special.check_fits(precision, scale)?;
        return Ok(special.value());
    }
    let (negative, rest) = match t.as_bytes().first() {
        Some(b'-') => (true, &t[1..]),
        Some(b'+') => (false, &t[1..]),
        _ => (false, t),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(i) => (
            &rest[..i],
            rest[i + 1..]
                .parse::<i32>()
                .map_err(|_| invalid("numeric", s))?,
        ),
        None => (rest, 0),
    };
    let (whole, fraction) = match mantissa.split_once('.') {
        Some((w, f)) => (w, f),
        None => (mantissa, ""),
    };
    if whole.is_empty() && fraction.is_empty()
        || !whole.bytes().all(|b| b.is_ascii_digit())
        || !fraction.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(invalid("numeric", s));
    }
    // The digits, and where the decimal point falls among them.
    let digits: Vec<u8> = whole
        .bytes()
        .chain(fraction.bytes())
        .map(|b| b - b'0')
        .collect();
    let point = whole.len() as i64 + exponent as i64;
    let overflow = || {
        out_of_range(format!(
            "numeric field overflow: a field with precision {precision}, scale {scale} must round to an absolute value less than 10^{}",
            precision as i64 - scale as i64
        ))
    };
    // Digits kept: those before the point, and `scale` after it.
    let keep = point + scale as i64;
    let mut value: i128 = 0;
    for i in 0..keep.max(0) as usize {
        let d = digits.get(i).copied().unwrap_or(0);
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(d as i128))
            .ok_or_else(overflow)?;
    }
    let next = if keep >= 0 {
        digits.get(keep as usize).copied().unwrap_or(0)
    } else {
        0
    };
    if next >= 5 {
        value = value.checked_add(1).ok_or_else(overflow)?;
    }
    if value >= 10i128.pow(precision as u32) {
        return Err(overflow());
    }
    Ok(if negative { -value } else { value })
}

/// A timestamp as Postgres reads one, as microseconds since the epoch:
/// `YYYY-MM-DD` (or with `/`), then optionally ` ` or `T` and
/// `HH:MM[:SS[.fraction]]`, then optionally a zone (`Z`, `UTC`, `GMT`,
/// `±HH`, `±HH:MM`, `±HHMM`); or `epoch`. A `timestamp` ignores the zone,
/// as Postgres does; a `timestamptz` is the instant it names (without one,
/// the session's zone, UTC).
fn timestamp_micros(s: &str, with_zone: bool) -> Option<i64> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("epoch") {
        return Some(0);
    }
    let mut p = Cursor {
        s: t.as_bytes(),
        i: 0,
    };
    let year = p.number(1, 6)? as i32;
    let sep = p.peek()?;
    if sep != b'-' && sep != b'/' {
        return None;
    }
    p.i += 1;
    let month = p.number(1, 2)? as u32;
    p.expect(sep)?;
    let day = p.number(1, 2)? as u32;
    let date = NaiveDate::from_ymd_opt(year, month, day)?;
    let mut time = NaiveTime::MIN;
    // The time, after a blank or a T.
    let before_time = p.i;
    if matches!(p.peek(), Some(b' ' | b'T' | b't')) {
        p.i += 1;
        while p.peek() == Some(b' ') {
            p.i += 1;
        }
        match p.number(1, 2) {
            Some(hour) => {
                p.expect(b':')?;
                let minute = p.number(2, 2)?;
                let mut second = 0;
                let mut micros = 0;
                if p.peek() == Some(b':') {
                    p.i += 1;
                    second = p.number(2, 2)?;
                    if p.peek() == Some(b'.') {
                        p.i += 1;
                        let start = p.i;
                        let frac = p.number(1, 9)?;
                        let digits = (p.i - start) as u32;
                        micros = if digits <= 6 {
                            frac * 10u64.pow(6 - digits)
                        } else {
                            // Postgres rounds to microseconds.
                            (frac + 5 * 10u64.pow(digits - 7)) / 10u64.pow(digits - 6)
                        };
                    }
                }
                if micros >= 1_000_000 {
                    return None;
                }
                let base = NaiveTime::from_hms_opt(hour as u32, minute as u32, second as u32)?;
                time = base + chrono::Duration::microseconds(micros as i64);
            }
            // A zone right after the date (`2020-01-01 +05`).
            None => p.i = before_time,
        }
    }
    let mut offset_seconds: i64 = 0;
    while p.peek() == Some(b' ') {
        p.i += 1;
    }
    let rest = &t[p.i..];
    if !rest.is_empty() {
        let utc = matches!(
            rest.to_ascii_uppercase().as_str(),
            "Z" | "UTC" | "GMT" | "+00" | "-00"
        );
        if utc {
            // offset 0
        } else if let Some(sign) = match rest.as_bytes()[0] {
            b'+' => Some(1),
            b'-' => Some(-1),
            _ => None,
        } {
            p.i += 1;
            let hours = p.number(1, 2)? as i64;
            let mut minutes = 0;
            if p.peek() == Some(b':') {
                p.i += 1;
                minutes = p.number(2, 2)? as i64;
            } else if p.i < p.s.len() {
                minutes = p.number(2, 2)? as i64;
            }
            if p.i != p.s.len() || hours > 15 || minutes > 59 {
                return None;
            }
            offset_seconds = sign * (hours * 3600 + minutes * 60);
        } else {
            return None;
        }
    }
    let local = NaiveDateTime::new(date, time);
    let micros = local.and_utc().timestamp_micros();
    Some(if with_zone {
        micros - offset_seconds * 1_000_000
    } else {
        micros
    })
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn expect(&mut self, b: u8) -> Option<()> {
        (self.peek()? == b).then(|| self.i += 1)
    }

    /// `min` to `max` digits.
    fn number(&mut self, min: usize, max: usize) -> Option<u64> {
        let start = self.i;
        while self.i - start < max && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        if self.i - start < min {
            self.i = start;
            return None;
        }
        std::str::from_utf8(&self.s[start..self.i])
            .ok()?
            .parse()
            .ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str, zone: bool) -> Option<String> {
        timestamp_micros(s, zone).map(|us| {
            chrono::DateTime::from_timestamp_micros(us)
                .unwrap()
                .naive_utc()
                .format("%Y-%m-%d %H:%M:%S%.f")
                .to_string()
        })
    }

    #[test]
    fn timestamps_as_postgres_reads_them() {
        assert_eq!(
            ts("2020-04-15 12:02", false).unwrap(),
            "2020-04-15 12:02:00"
        );
        assert_eq!(
            ts(" 2020-04-15T12:02:03.5 ", false).unwrap(),
            "2020-04-15 12:02:03.500"
        );
        assert_eq!(ts("2020-04-15", false).unwrap(), "2020-04-15 00:00:00");
        assert_eq!(
            ts("2020/4/5 1:02:03", false).unwrap(),
            "2020-04-05 01:02:03"
        );
        assert_eq!(
            ts("2020-04-15 12:00+02", true).unwrap(),
            "2020-04-15 10:00:00"
        );
        assert_eq!(
            ts("2020-04-15 12:00:00-05:30", true).unwrap(),
            "2020-04-15 17:30:00"
        );
        // A timestamp without time zone ignores the zone.
        assert_eq!(
            ts("2020-04-15 12:00+02", false).unwrap(),
            "2020-04-15 12:00:00"
        );
        assert_eq!(
            ts("2020-04-15 12:00:00Z", true).unwrap(),
            "2020-04-15 12:00:00"
        );
        assert_eq!(
            ts("2020-04-15 12:00:00 UTC", true).unwrap(),
            "2020-04-15 12:00:00"
        );
        assert_eq!(
            ts("2020-04-15 12:00:00.1234567", false).unwrap(),
            "2020-04-15 12:00:00.123457"
        );
        assert_eq!(ts("epoch", false).unwrap(), "1970-01-01 00:00:00");
        assert!(ts("2020-02-30", false).is_none());
        assert!(ts("2020-04-15 25:00", false).is_none());
        assert!(ts("yesterday-ish", false).is_none());
    }

    #[test]
    fn integers_as_postgres_reads_them() {
        assert_eq!(integer::<i32>(" 12 ", "integer").unwrap(), 12);
        assert_eq!(integer::<i32>("-2147483648", "integer").unwrap(), i32::MIN);
        let e = integer::<i32>("2147483648", "integer").unwrap_err();
        assert!(
            e.to_string().contains("out of range for type integer"),
            "{e}"
        );
        let e = integer::<i32>("1.5", "integer").unwrap_err();
        assert!(
            e.to_string()
                .contains("invalid input syntax for type integer"),
            "{e}"
        );
    }

    #[test]
    fn numerics_as_postgres_reads_them() {
        assert_eq!(numeric("1.005", 10, 2).unwrap(), 101);
        assert_eq!(numeric("-1.005", 10, 2).unwrap(), -101);
        assert_eq!(numeric(" 12 ", 10, 2).unwrap(), 1200);
        assert_eq!(numeric("1e3", 10, 2).unwrap(), 100000);
        assert_eq!(numeric(".5", 10, 0).unwrap(), 1);
        assert_eq!(numeric("999.99", 5, 2).unwrap(), 99999);
        assert!(
            numeric("999.995", 5, 2)
                .unwrap_err()
                .to_string()
                .contains("overflow")
        );
        assert!(
            numeric("12345", 5, 2)
                .unwrap_err()
                .to_string()
                .contains("overflow")
        );
        assert_eq!(numeric(" NaN ", 10, 2).unwrap(), i128::MAX);
        assert_eq!(numeric("-inf", 38, 10).unwrap(), -(i128::MAX - 1));
        assert!(
            numeric("Infinity", 10, 2)
                .unwrap_err()
                .to_string()
                .contains("cannot hold an infinite value")
        );
        assert!(numeric("1.2.3", 10, 2).is_err());
    }
}

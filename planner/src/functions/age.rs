//! `age(a, b)`: the difference of two timestamps in years, months and days,
//! as Postgres's `timestamp_age` forms it.
//!
//! Postgres subtracts the two dates field by field, then borrows: a
//! negative number of days takes a month of the earlier date's month
//! length, whichever argument it is. `age('2024-03-01', '2023-01-15')` is `1 year 1 mon 17 days`
//! (January has 31 days), where `timestamp - timestamp` gives `411 days`.

use std::sync::Arc;

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, Timelike};
use datafusion::arrow::array::{Array, AsArray, IntervalMonthDayNanoBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, IntervalMonthDayNano, IntervalUnit, TimeUnit, TimestampMicrosecondType,
};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![Arc::new(ScalarUDF::new_from_impl(Age {
        signature: Signature::any(2, Volatility::Immutable),
    }))]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Age {
    signature: Signature,
}

impl ScalarUDFImpl for Age {
    fn name(&self) -> &str {
        "age"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        for t in args {
            if !matches!(
                t,
                DataType::Timestamp(..) | DataType::Date32 | DataType::Null
            ) {
                return Err(DataFusionError::Plan(format!(
                    "function age({}) does not exist",
                    args.iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        Ok(DataType::Interval(IntervalUnit::MonthDayNano))
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let n = args.number_rows;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let rows = if scalar { 1 } else { n };
        let micros = |a: &ColumnarValue| -> Result<_> {
            let a = a.to_array(rows)?;
            let a = cast(&a, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
            Ok(a.as_primitive::<TimestampMicrosecondType>().clone())
        };
        let (a, b) = (micros(&args.args[0])?, micros(&args.args[1])?);
        let mut out = IntervalMonthDayNanoBuilder::with_capacity(rows);
        for i in 0..rows {
            if a.is_null(i) || b.is_null(i) {
                out.append_null();
                continue;
            }
            let at = |v: i64| {
                DateTime::from_timestamp_micros(v)
                    .map(|t| t.naive_utc())
                    .ok_or_else(|| DataFusionError::Execution("timestamp out of range".into()))
            };
            out.append_value(age(at(a.value(i))?, at(b.value(i))?));
        }
        let out = out.finish();
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(Arc::new(out))
        })
    }
}

fn days_in_month(year: i32, month: u32) -> i64 {
    let (y, m) = if month == 12 {
        (year + 1, 1)
    } else {
        (year, month + 1)
    };
    NaiveDate::from_ymd_opt(y, m, 1)
        .and_then(|next| {
            NaiveDate::from_ymd_opt(year, month, 1).map(|first| (next - first).num_days())
        })
        .unwrap_or(30)
}

/// Postgres's `timestamp_age(a, b)`.
fn age(a: NaiveDateTime, b: NaiveDateTime) -> IntervalMonthDayNano {
    let sign = if a < b { -1 } else { 1 };
    let field = |x: i64, y: i64| sign * (x - y);
    let mut micros = field(
        i64::from(a.nanosecond() / 1000),
        i64::from(b.nanosecond() / 1000),
    );
    let mut sec = field(i64::from(a.second()), i64::from(b.second()));
    let mut min = field(i64::from(a.minute()), i64::from(b.minute()));
    let mut hour = field(i64::from(a.hour()), i64::from(b.hour()));
    let mut day = field(i64::from(a.day()), i64::from(b.day()));
    let mut mon = field(i64::from(a.month()), i64::from(b.month()));
    let mut year = field(i64::from(a.year()), i64::from(b.year()));
    borrow(&mut micros, &mut sec, 1_000_000);
    borrow(&mut sec, &mut min, 60);
    borrow(&mut min, &mut hour, 60);
    borrow(&mut hour, &mut day, 24);
    // A month borrowed has the length of the earlier date's month.
    let earlier = if a < b { a } else { b };
    while day < 0 {
        day += days_in_month(earlier.year(), earlier.month());
        mon -= 1;
    }
    borrow(&mut mon, &mut year, 12);
    let nanos = (((hour * 60 + min) * 60 + sec) * 1_000_000 + micros) * 1000;
    IntervalMonthDayNano::new(
        (sign * (year * 12 + mon)) as i32,
        (sign * day) as i32,
        sign * nanos,
    )
}

/// Carries a negative field from the next larger one, `base` at a time.
fn borrow(field: &mut i64, larger: &mut i64, base: i64) {
    while *field < 0 {
        *field += base;
        *larger -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> NaiveDateTime {
        NaiveDateTime::parse_from_str(s, "%Y-%m-%d %H:%M:%S").unwrap()
    }

    /// Expectations are PostgreSQL 15's answers.
    #[test]
    fn ages_as_in_postgres() {
        // 1 year 1 mon 17 days
        assert_eq!(
            age(ts("2024-03-01 00:00:00"), ts("2023-01-15 00:00:00")),
            IntervalMonthDayNano::new(13, 17, 0)
        );
        // -1 years -1 mons -17 days
        assert_eq!(
            age(ts("2023-01-15 00:00:00"), ts("2024-03-01 00:00:00")),
            IntervalMonthDayNano::new(-13, -17, 0)
        );
        // 01:30:00
        assert_eq!(
            age(ts("2024-01-01 10:00:00"), ts("2024-01-01 08:30:00")),
            IntervalMonthDayNano::new(0, 0, 5_400_000_000_000)
        );
        // 1 mon 23:00:00
        assert_eq!(
            age(ts("2024-03-01 00:00:00"), ts("2024-01-31 01:00:00")),
            IntervalMonthDayNano::new(1, 0, 23 * 3_600_000_000_000)
        );
        // -1 mons -1 days -01:00:00
        assert_eq!(
            age(ts("2024-01-31 00:00:00"), ts("2024-03-01 01:00:00")),
            IntervalMonthDayNano::new(-1, -1, -3_600_000_000_000)
        );
    }
}

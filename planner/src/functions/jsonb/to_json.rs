//! SQL values as `jsonb`, as Postgres's `to_jsonb` makes them: numbers and
//! booleans as themselves, a `jsonb` as its value, arrays as arrays, rows
//! as objects, and anything else as the string of its text (timestamps in
//! ISO 8601 with a `T`, as Postgres writes them in JSON).

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Date32Type, Decimal128Type, DecimalType, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, Time64MicrosecondType, TimeUnit, TimestampMicrosecondType,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::common::Result;

use super::value::Json;
use super::{null_at, read_error, text_of};

/// Row `i` of `a` as `jsonb`; SQL NULL is JSON `null`.
pub(super) fn to_json(a: &ArrayRef, i: usize) -> Result<Json> {
    if null_at(a, i) {
        return Ok(Json::Null);
    }
    let number = |s: String| Json::Number(s);
    Ok(match a.data_type() {
        DataType::Null => Json::Null,
        DataType::Boolean => Json::Bool(a.as_boolean().value(i)),
        DataType::Int8 => number(a.as_primitive::<Int8Type>().value(i).to_string()),
        DataType::Int16 => number(a.as_primitive::<Int16Type>().value(i).to_string()),
        DataType::Int32 => number(a.as_primitive::<Int32Type>().value(i).to_string()),
        DataType::Int64 => number(a.as_primitive::<Int64Type>().value(i).to_string()),
        DataType::UInt8 => number(a.as_primitive::<UInt8Type>().value(i).to_string()),
        DataType::UInt16 => number(a.as_primitive::<UInt16Type>().value(i).to_string()),
        DataType::UInt32 => number(a.as_primitive::<UInt32Type>().value(i).to_string()),
        DataType::UInt64 => number(a.as_primitive::<UInt64Type>().value(i).to_string()),
        DataType::Float32 => float(a.as_primitive::<Float32Type>().value(i) as f64)?,
        DataType::Float64 => float(a.as_primitive::<Float64Type>().value(i))?,
        DataType::Decimal128(_, s) => {
            let v = a.as_primitive::<Decimal128Type>().value(i);
            number(Decimal128Type::format_decimal(v, 38, *s))
        }
        // Weir's jsonb.
        DataType::LargeUtf8 => Json::parse(a.as_string::<i64>().value(i)).map_err(read_error)?,
        DataType::Utf8 => Json::String(a.as_string::<i32>().value(i).to_owned()),
        DataType::Utf8View => Json::String(a.as_string_view().value(i).to_owned()),
        DataType::Date32 => {
            let days = a.as_primitive::<Date32Type>().value(i);
            let date = chrono::NaiveDate::from_num_days_from_ce_opt(days + 719_163);
            match date {
                Some(d) => Json::String(d.format("%Y-%m-%d").to_string()),
                None => Json::String(text_of(a, i)?),
            }
        }
        DataType::Timestamp(TimeUnit::Microsecond, zone) => {
            let us = a.as_primitive::<TimestampMicrosecondType>().value(i);
            iso_timestamp(us, zone.is_some())
                .map_or_else(|| text_of(a, i).map(Json::String), |s| Ok(Json::String(s)))?
        }
        DataType::Timestamp(_, zone) => {
            let zone = zone.clone();
            let us = cast(a, &DataType::Timestamp(TimeUnit::Microsecond, zone.clone()))?;
            return to_json(&us, i);
        }
        DataType::Time64(TimeUnit::Microsecond) => {
            let us = a.as_primitive::<Time64MicrosecondType>().value(i);
            let secs = us.div_euclid(1_000_000);
            Json::String(format!(
                "{:02}:{:02}:{:02}{}",
                secs / 3600,
                secs / 60 % 60,
                secs % 60,
                fraction(us.rem_euclid(1_000_000))
            ))
        }
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            let bytes = cast(a, &DataType::Binary)?;
            let bytes = bytes.as_binary::<i32>().value(i);
            let mut s = String::with_capacity(2 + bytes.len() * 2);
            s.push_str("\\x");
            for b in bytes {
                s.push_str(&format!("{b:02x}"));
            }
            Json::String(s)
        }
        DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..) => {
            let items = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value(i),
                DataType::LargeList(_) => a.as_list::<i64>().value(i),
                _ => a.as_fixed_size_list().value(i),
            };
            Json::Array(
                (0..items.len())
                    .map(|j| to_json(&items, j))
                    .collect::<Result<_>>()?,
            )
        }
        DataType::Struct(fields) => {
            let s = a.as_struct();
            Json::object(
                fields
                    .iter()
                    .zip(s.columns())
                    .map(|(f, c)| Ok((f.name().clone(), to_json(c, i)?)))
                    .collect::<Result<_>>()?,
            )
        }
        _ => Json::String(text_of(a, i)?),
    })
}

/// A double as `jsonb`: Postgres's shortest text of it, a string for the
/// values JSON has no number for.
fn float(v: f64) -> Result<Json> {
    Ok(if v.is_nan() {
        Json::String("NaN".into())
    } else if v.is_infinite() {
        Json::String(if v > 0.0 { "Infinity" } else { "-Infinity" }.into())
    } else {
        Json::Number(super::value::canonical_number(&format!("{v}")).map_err(read_error)?)
    })
}

/// `.5`, `.000001`: fractional seconds as Postgres prints them, trailing
/// zeros dropped; nothing for whole seconds.
fn fraction(micros: i64) -> String {
    if micros == 0 {
        return String::new();
    }
    let digits = format!("{micros:06}");
    format!(".{}", digits.trim_end_matches('0'))
}

/// `2020-01-01T12:00:00.5`, with `+00:00` for a `timestamptz` (Weir's zone
/// is UTC).
fn iso_timestamp(us: i64, zoned: bool) -> Option<String> {
    let t = chrono::DateTime::from_timestamp_micros(us)?.naive_utc();
    Some(format!(
        "{}{}{}",
        t.format("%Y-%m-%dT%H:%M:%S"),
        fraction(us.rem_euclid(1_000_000)),
        if zoned { "+00:00" } else { "" }
    ))
}

//! SQL functions whose Postgres meaning differs from DataFusion's built-in
//! of the same name. They are registered in every context that plans SQL
//! and in the registry job graphs are decoded with, so a view computes
//! exactly what a `SELECT` of the same query does.
//!
//! `to_char(timestamp, text)` takes Postgres's template patterns
//! (`YYYY-MM-DD HH24:MI:SS`); DataFusion's takes chrono's (`%Y-%m-%d`) and
//! copies Postgres patterns through as text, a wrong answer.

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, StringBuilder, TimestampMicrosecondArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, TimeUnit};
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// Weir's versions of functions DataFusion also has.
pub fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![Arc::new(ScalarUDF::new_from_impl(ToChar {
        signature: Signature::any(2, Volatility::Immutable),
    }))]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct ToChar {
    signature: Signature,
}

impl ScalarUDFImpl for ToChar {
    fn name(&self) -> &str {
        "to_char"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        match args.first() {
            Some(
                DataType::Timestamp(..) | DataType::Date32 | DataType::Date64 | DataType::Null,
            ) => Ok(DataType::Utf8),
            Some(other) => Err(DataFusionError::NotImplemented(format!(
                "to_char of {other} (only timestamps and dates)"
            ))),
            None => Err(DataFusionError::Plan("to_char takes two arguments".into())),
        }
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let [value, pattern] = args.args.as_slice() else {
            return Err(DataFusionError::Plan("to_char takes two arguments".into()));
        };
        let value = value.to_array(rows)?;
        let pattern = pattern.to_array(rows)?;
        let pattern = cast(&pattern, &DataType::Utf8)?;
        let pattern = pattern
            .as_any()
            .downcast_ref::<datafusion::arrow::array::StringArray>()
            .ok_or_else(|| DataFusionError::Internal("to_char pattern".into()))?;
        // Weir's time zone is UTC: a timestamptz formats as its UTC time.
        let micros = cast(&value, &DataType::Timestamp(TimeUnit::Microsecond, None))?;
        let micros = micros
            .as_any()
            .downcast_ref::<TimestampMicrosecondArray>()
            .ok_or_else(|| DataFusionError::Internal("to_char value".into()))?;
        let mut out = StringBuilder::with_capacity(rows, rows * 16);
        let mut compiled: Option<(String, String)> = None;
        for i in 0..rows {
            if micros.is_null(i) || pattern.is_null(i) {
                out.append_null();
                continue;
            }
            let p = pattern.value(i);
            if compiled.as_ref().is_none_or(|(src, _)| src != p) {
                compiled = Some((p.to_string(), chrono_format(p)));
            }
            let format = compiled
                .as_ref()
                .map(|(_, f)| f.as_str())
                .unwrap_or_default();
            let t = chrono::DateTime::from_timestamp_micros(micros.value(i))
                .ok_or_else(|| DataFusionError::Execution("timestamp out of range".into()))?
                .naive_utc();
            out.append_value(t.format(format).to_string());
        }
        let array: ArrayRef = Arc::new(out.finish());
        Ok(match array.len() {
            1 if rows == 1 => ColumnarValue::Scalar(ScalarValue::try_from_array(&array, 0)?),
            _ => ColumnarValue::Array(array),
        })
    }
}

/// A Postgres `to_char` template as a chrono format string.
fn chrono_format(pattern: &str) -> String {
    // Longest patterns first; `FM` (fill mode) drops the padding.
    const PATTERNS: &[(&str, &str, &str)] = &[
        ("HH24", "%H", "%-H"),
        ("HH12", "%I", "%-I"),
        ("YYYY", "%Y", "%Y"),
        ("Month", "%B", "%B"),
        ("MONTH", "%B", "%B"),
        ("month", "%B", "%B"),
        ("DDD", "%j", "%-j"),
        ("Mon", "%b", "%b"),
        ("MON", "%b", "%b"),
        ("Day", "%A", "%A"),
        ("DAY", "%A", "%A"),
        ("Dy", "%a", "%a"),
        ("DY", "%a", "%a"),
        ("YY", "%y", "%y"),
        ("MM", "%m", "%-m"),
        ("DD", "%d", "%-d"),
        ("HH", "%I", "%-I"),
        ("MI", "%M", "%-M"),
        ("SS", "%S", "%-S"),
        ("MS", "%3f", "%3f"),
        ("US", "%6f", "%6f"),
        ("AM", "%p", "%p"),
        ("PM", "%p", "%p"),
        ("am", "%P", "%P"),
        ("pm", "%P", "%P"),
        ("IW", "%V", "%-V"),
        ("ID", "%u", "%u"),
        ("TZ", "UTC", "UTC"),
    ];
    let mut out = String::new();
    let mut rest = pattern;
    while let Some(c) = rest.chars().next() {
        if c == '"' {
            // "literal text"
            let end = rest[1..].find('"').map_or(rest.len(), |e| e + 2);
            out.push_str(&rest[1..end.saturating_sub(1).max(1)].replace('%', "%%"));
            rest = &rest[end.min(rest.len())..];
            continue;
        }
        let fill = rest.starts_with("FM");
        let body = if fill { &rest[2..] } else { rest };
        if let Some((p, padded, unpadded)) = PATTERNS.iter().find(|(p, ..)| body.starts_with(p)) {
            out.push_str(if fill { unpadded } else { padded });
            rest = &body[p.len()..];
            continue;
        }
        if c == '%' {
            out.push_str("%%");
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn postgres_templates_become_chrono_formats() {
        let t = chrono::NaiveDate::from_ymd_opt(2026, 3, 4)
            .unwrap()
            .and_hms_micro_opt(15, 6, 7, 890_000)
            .unwrap();
        let f = |p: &str| t.format(&chrono_format(p)).to_string();
        assert_eq!(f("YYYY-MM-DD"), "2026-03-04");
        assert_eq!(f("HH24:MI:SS.MS"), "15:06:07.890");
        assert_eq!(f("HH12 AM"), "03 PM");
        assert_eq!(f("FMDD/FMMM \"at\" HH24"), "4/3 at 15");
        assert_eq!(f("Dy, DD Mon YYYY 100%"), "Wed, 04 Mar 2026 100%");
    }
}

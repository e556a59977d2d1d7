//! SQL column types as Weir stores them in Arrow.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, IntervalUnit, TimeUnit};
use datafusion::sql::sqlparser::ast::{DataType as SqlType, ExactNumberInfo, TimezoneInfo};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::{Result, ServerError};

/// Precision and scale of `numeric` without a declared precision.
pub const DEFAULT_NUMERIC: (u8, i8) = (38, 10);

/// The zone of `timestamptz` values: stored as UTC instants.
pub const UTC: &str = planner::context::UTC;

/// The Arrow type of a column declared as `t`.
pub fn arrow_type(t: &SqlType) -> Result<DataType> {
    Ok(match t {
        SqlType::Boolean | SqlType::Bool => DataType::Boolean,
        SqlType::SmallInt(_) | SqlType::Int2(_) => DataType::Int16,
        SqlType::Int(_) | SqlType::Integer(_) | SqlType::Int4(_) => DataType::Int32,
        SqlType::BigInt(_) | SqlType::Int8(_) => DataType::Int64,
        SqlType::Real | SqlType::Float4 => DataType::Float32,
        SqlType::DoublePrecision | SqlType::Float8 | SqlType::Double(_) => DataType::Float64,
        SqlType::Float(_) => DataType::Float64,
        SqlType::Numeric(info) | SqlType::Decimal(info) | SqlType::Dec(info) => match info {
            ExactNumberInfo::None => DataType::Decimal128(DEFAULT_NUMERIC.0, DEFAULT_NUMERIC.1),
            ExactNumberInfo::Precision(p) => decimal(*p, 0)?,
            ExactNumberInfo::PrecisionAndScale(p, s) => decimal(*p, *s)?,
        },
        SqlType::Text
        | SqlType::Varchar(_)
        | SqlType::CharacterVarying(_)
        | SqlType::CharVarying(_)
        | SqlType::String(_)
        | SqlType::Char(_)
        | SqlType::Character(_) => DataType::Utf8,
        SqlType::Date => DataType::Date32,
        SqlType::Timestamp(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            DataType::Timestamp(TimeUnit::Microsecond, None)
        }
        SqlType::Timestamp(_, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC)))
        }
        SqlType::Time(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => {
            DataType::Time64(TimeUnit::Microsecond)
        }
        SqlType::Interval { .. } => DataType::Interval(IntervalUnit::MonthDayNano),
        SqlType::Bytea => DataType::Binary,
        SqlType::JSONB => planner::functions::jsonb::JSONB,
        SqlType::JSON => {
            return Err(ServerError::unsupported(
                "type json (jsonb is supported: declare the column jsonb)",
            ));
        }
        SqlType::Custom(name, _) if name.to_string().eq_ignore_ascii_case("timestamptz") => {
            DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC)))
        }
        other => return Err(ServerError::unsupported(format!("type {other}"))),
    })
}

fn decimal(p: u64, s: i64) -> Result<DataType> {
    if p == 0 || p > 38 {
        return Err(ServerError::InvalidParameter(format!(
            "NUMERIC precision {p} must be between 1 and 38"
        )));
    }
    if s < 0 || s as u64 > p {
        return Err(ServerError::InvalidParameter(format!(
            "NUMERIC scale {s} must be between 0 and precision {p}"
        )));
    }
    Ok(DataType::Decimal128(p as u8, s as i8))
}

/// Parses a type name as written in DDL (the catalog stores them so).
pub fn parse_type(text: &str) -> Result<DataType> {
    let t = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(text)?
        .parse_data_type()?;
    arrow_type(&t)
}

/// The SQL name of an Arrow type, for `CAST(… AS …)` and for users.
pub fn sql_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int16 => "smallint".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal128(p, s) => format!("numeric({p},{s})"),
        DataType::LargeUtf8 => "jsonb".into(),
        DataType::Utf8 | DataType::Utf8View => "text".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(_, None) => "timestamp".into(),
        DataType::Timestamp(_, Some(_)) => "timestamptz".into(),
        DataType::Time32(_) | DataType::Time64(_) => "time".into(),
        DataType::Interval(_) => "interval".into(),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "bytea".into(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_type_maps() {
        for (sql, expected) in [
            ("boolean", DataType::Boolean),
            ("smallint", DataType::Int16),
            ("int", DataType::Int32),
            ("bigint", DataType::Int64),
            ("real", DataType::Float32),
            ("double precision", DataType::Float64),
            ("numeric(10,2)", DataType::Decimal128(10, 2)),
            ("numeric", DataType::Decimal128(38, 10)),
            ("text", DataType::Utf8),
            ("varchar(20)", DataType::Utf8),
            ("date", DataType::Date32),
            (
                "timestamp",
                DataType::Timestamp(TimeUnit::Microsecond, None),
            ),
            (
                "timestamptz",
                DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC))),
            ),
            (
                "timestamp with time zone",
                DataType::Timestamp(TimeUnit::Microsecond, Some(Arc::from(UTC))),
            ),
            ("interval", DataType::Interval(IntervalUnit::MonthDayNano)),
            ("bytea", DataType::Binary),
            ("jsonb", DataType::LargeUtf8),
            ("time", DataType::Time64(TimeUnit::Microsecond)),
            (
                "time without time zone",
                DataType::Time64(TimeUnit::Microsecond),
            ),
        ] {
            assert_eq!(parse_type(sql).unwrap(), expected, "{sql}");
        }
        assert!(parse_type("point").is_err());
        assert!(parse_type("time with time zone").is_err());
    }
}

//! Parameters of the extended protocol: their types (from the client, or
//! inferred by DataFusion), and their values turned into SQL literals that
//! replace the `$n` placeholders before a statement runs.

use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, Value};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pgwire::api::Type;
use pgwire::api::portal::Portal;

use crate::error::{Result, ServerError};

/// The SQL type to cast a parameter of `t` to, if any.
fn cast_type(t: &Type) -> Option<&'static str> {
    Some(match *t {
        Type::BOOL => "boolean",
        Type::INT2 => "smallint",
        Type::INT4 => "integer",
        Type::INT8 => "bigint",
        Type::FLOAT4 => "real",
        Type::FLOAT8 => "double precision",
        Type::NUMERIC => "numeric",
        Type::DATE => "date",
        Type::TIMESTAMP => "timestamp",
        Type::TIMESTAMPTZ => "timestamp with time zone",
        Type::INTERVAL => "interval",
        _ => return None,
    })
}

fn parse_expr(sql: &str) -> Result<SqlExpr> {
    Ok(Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)?
        .parse_expr()?)
}

fn bad(i: usize, t: &Type, what: impl std::fmt::Display) -> ServerError {
    ServerError::InvalidText(format!(
        "invalid value for parameter ${} of type {}: {what}",
        i + 1,
        t.name()
    ))
}

/// A parameter's bytes as text: not UTF-8 is `22021`, as in Postgres.
fn utf8(i: usize, t: &Type, b: &[u8]) -> Result<String> {
    String::from_utf8(b.to_vec()).map_err(|e| {
        ServerError::CharacterNotInRepertoire(format!(
            "invalid byte sequence for encoding \"UTF8\" in parameter ${} of type {}: {e}",
            i + 1,
            t.name()
        ))
    })
}

/// The text form of a binary parameter value of type `t`.
fn binary_to_text(i: usize, t: &Type, b: &[u8]) -> Result<String> {
    let fixed = |n: usize| -> Result<&[u8]> {
        if b.len() == n {
            Ok(b)
        } else {
            Err(bad(i, t, format!("expected {n} bytes, got {}", b.len())))
        }
    };
    Ok(match *t {
        Type::BOOL => (fixed(1)?[0] != 0).to_string(),
        Type::INT2 => i16::from_be_bytes(fixed(2)?.try_into().unwrap_or_default()).to_string(),
        Type::INT4 => i32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default()).to_string(),
        Type::INT8 => i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default()).to_string(),
        Type::FLOAT4 => f32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default()).to_string(),
        Type::FLOAT8 => f64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default()).to_string(),
        Type::NUMERIC => {
            use postgres_types::FromSql;
            rust_decimal::Decimal::from_sql(t, b)
                .map_err(|e| bad(i, t, e))?
                .to_string()
        }
        Type::DATE => {
            use postgres_types::FromSql;
            chrono::NaiveDate::from_sql(t, b)
                .map_err(|e| bad(i, t, e))?
                .to_string()
        }
        Type::TIMESTAMP => {
            use postgres_types::FromSql;
            chrono::NaiveDateTime::from_sql(t, b)
                .map_err(|e| bad(i, t, e))?
                .to_string()
        }
        Type::TIMESTAMPTZ => {
            use postgres_types::FromSql;
            chrono::DateTime::<chrono::Utc>::from_sql(t, b)
                .map_err(|e| bad(i, t, e))?
                .to_rfc3339()
        }
        Type::INTERVAL => {
            let b = fixed(16)?;
            let micros = i64::from_be_bytes(b[0..8].try_into().unwrap_or_default());
            let days = i32::from_be_bytes(b[8..12].try_into().unwrap_or_default());
            let months = i32::from_be_bytes(b[12..16].try_into().unwrap_or_default());
            format!("{months} months {days} days {micros} microseconds")
        }
        _ => utf8(i, t, b)?,
    })
}

/// The literal for parameter `i` of `portal`, of type `t`.
pub fn literal<S>(portal: &Portal<S>, i: usize, t: &Type) -> Result<SqlExpr> {
    let Some(Some(bytes)) = portal.parameters.get(i) else {
        return Ok(SqlExpr::value(Value::Null));
    };
    if *t == Type::BYTEA {
        let raw: Vec<u8> = if portal.parameter_format.is_binary(i) {
            bytes.to_vec()
        } else {
            let s = utf8(i, t, bytes)?;
            match s.strip_prefix("\\x") {
                Some(hex) => decode_hex(hex).ok_or_else(|| bad(i, t, "bad hex"))?,
                None => s.as_bytes().to_vec(),
            }
        };
        let hex: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        return parse_expr(&format!("decode('{hex}', 'hex')"));
    }
    let text = if portal.parameter_format.is_binary(i) {
        binary_to_text(i, t, bytes)?
    } else {
        utf8(i, t, bytes)?
    };
    let quoted = SqlExpr::value(Value::SingleQuotedString(text)).to_string();
    match cast_type(t) {
        Some(sql_type) => parse_expr(&format!("CAST({quoted} AS {sql_type})")),
        None => parse_expr(&quoted),
    }
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

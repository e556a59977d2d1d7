//! Parameters of the extended protocol: their types (from the client, or
//! inferred by DataFusion), and their values turned into SQL literals that
//! replace the `$n` placeholders before a statement runs.

use std::collections::HashMap;
use std::ops::ControlFlow;

use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{
    ArrayElemTypeDef, DataType as SqlType, Expr as SqlExpr, Statement, Value, visit_expressions_mut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use pgwire::api::Type;
use pgwire::api::portal::Portal;
use postgres_types::Kind;

use crate::error::{Result, ServerError};

/// The SQL type to cast a parameter of `t` to, if any.
fn cast_type(t: &Type) -> Option<String> {
    Some(
        match *t {
            Type::BOOL => "boolean",
            Type::INT2 => "smallint",
            Type::INT4 | Type::OID => "integer",
            Type::INT8 => "bigint",
            Type::FLOAT4 => "real",
            Type::FLOAT8 => "double precision",
            Type::NUMERIC => "numeric",
            Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => "text",
            Type::DATE => "date",
            Type::TIME => "time",
            Type::TIMESTAMP => "timestamp",
            Type::TIMESTAMPTZ => "timestamp with time zone",
            Type::INTERVAL => "interval",
            Type::BYTEA => "bytea",
            Type::JSONB => "jsonb",
            _ => {
                return match t.kind() {
                    Kind::Array(element) => cast_type(element).map(|e| format!("{e}[]")),
                    _ => None,
                };
            }
        }
        .to_string(),
    )
}

/// The types of `$n`s the statement casts (`$1::int[]`), which is how
/// Postgres types a parameter the client left untyped; DataFusion does not
/// infer them from a cast.
pub fn cast_types(stmt: &Statement) -> HashMap<String, Type> {
    let mut found = HashMap::new();
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(stmt, |e| {
        if let SqlExpr::Cast {
            expr, data_type, ..
        } = e
            && let SqlExpr::Value(v) = expr.as_ref()
            && let Value::Placeholder(p) = &v.value
        {
            let arrow = match data_type {
                SqlType::Array(ArrayElemTypeDef::SquareBracket(inner, _)) => {
                    crate::sql::types::arrow_type(inner).ok().map(|t| {
                        DataType::List(std::sync::Arc::new(
                            datafusion::arrow::datatypes::Field::new_list_field(t, true),
                        ))
                    })
                }
                t => crate::sql::types::arrow_type(t).ok(),
            };
            if let Some(t) = arrow.and_then(|t| arrow_pg::datatypes::into_pg_type(&t).ok()) {
                found.entry(p.clone()).or_insert(t);
            }
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Gives each `$n` whose type the client declared that type, so that the
/// statement is described (its result columns, its other parameters) as
/// it will run: `SELECT $1` with `$1` an interval returns an interval.
pub fn declare_types(stmt: &mut Statement, types: &[Option<Type>]) -> Result<()> {
    let mut casts = HashMap::new();
    for (i, t) in types.iter().enumerate() {
        if let Some(sql) = t.as_ref().and_then(cast_type) {
            let data_type = Parser::new(&PostgreSqlDialect {})
                .try_with_sql(&sql)?
                .parse_data_type()?;
            casts.insert(format!("${}", i + 1), data_type);
        }
    }
    if casts.is_empty() {
        return Ok(());
    }
    let _ = visit_expressions_mut(stmt, |e| {
        if let SqlExpr::Value(v) = e
            && let Value::Placeholder(p) = &v.value
            && let Some(data_type) = casts.get(p)
        {
            *e = crate::sql::rewrite::cast(e.clone(), data_type.clone());
        }
        ControlFlow::<()>::Continue(())
    });
    Ok(())
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
        // NaN and the infinities: no digits, and the sign word says which.
        Type::NUMERIC if b.len() >= 8 && matches!(b[4..6], [0xC0 | 0xD0 | 0xF0, 0]) => match b[4] {
            0xC0 => "NaN",
            0xD0 => "Infinity",
            _ => "-Infinity",
        }
        .to_string(),
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
        Type::OID => u32::from_be_bytes(fixed(4)?.try_into().unwrap_or_default()).to_string(),
        Type::TIME => {
            let micros = i64::from_be_bytes(fixed(8)?.try_into().unwrap_or_default());
            chrono::NaiveTime::from_num_seconds_from_midnight_opt(
                (micros.div_euclid(1_000_000)) as u32,
                (micros.rem_euclid(1_000_000) * 1000) as u32,
            )
            .ok_or_else(|| bad(i, t, "time out of range"))?
            .to_string()
        }
        Type::INTERVAL => {
            let b = fixed(16)?;
            let micros = i64::from_be_bytes(b[0..8].try_into().unwrap_or_default());
            let days = i32::from_be_bytes(b[8..12].try_into().unwrap_or_default());
            let months = i32::from_be_bytes(b[12..16].try_into().unwrap_or_default());
            format!("{months} months {days} days {micros} microseconds")
        }
        // jsonb's binary form is a version byte (1) and the text.
        Type::JSONB => match b.split_first() {
            Some((1, text)) => utf8(i, t, text)?,
            _ => return Err(bad(i, t, "unsupported jsonb version number")),
        },
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
            crate::sql::literals::bytea(&utf8(i, t, bytes)?)?
        };
        return Ok(crate::sql::literals::decode_call(&raw));
    }
    if let Kind::Array(element) = t.kind() {
        let binary = portal.parameter_format.is_binary(i);
        return array_literal(i, t, element, bytes, binary);
    }
    let mut text = if portal.parameter_format.is_binary(i) {
        binary_to_text(i, t, bytes)?
    } else {
        utf8(i, t, bytes)?
    };
    if *t == Type::INTERVAL
        && let Some(canonical) = crate::sql::literals::interval_text(&text)?
    {
        text = canonical;
    }
    let quoted = SqlExpr::value(Value::SingleQuotedString(text)).to_string();
    match cast_type(t) {
        Some(sql_type) => parse_expr(&format!("CAST({quoted} AS {sql_type})")),
        None => parse_expr(&quoted),
    }
}

/// An array parameter as `CAST(ARRAY['…', …] AS element[])`; each
/// element's text is read as the element type reads text.
fn array_literal(
    i: usize,
    t: &Type,
    element: &Type,
    bytes: &[u8],
    binary: bool,
) -> Result<SqlExpr> {
    let Some(element_sql) = cast_type(element).filter(|_| *element != Type::BYTEA) else {
        return Err(ServerError::unsupported(format!(
            "parameters of type {}",
            t.name()
        )));
    };
    let elements = if binary {
        binary_array(i, t, element, bytes)?
    } else {
        crate::sql::literals::array_elements(&utf8(i, t, bytes)?)?
    };
    let items: Vec<String> = elements
        .into_iter()
        .map(|e| match e {
            None => "NULL".to_string(),
            Some(text) => SqlExpr::value(Value::SingleQuotedString(text)).to_string(),
        })
        .collect();
    parse_expr(&format!(
        "CAST(ARRAY[{}] AS {element_sql}[])",
        items.join(", ")
    ))
}

/// The elements of a one-dimensional array in the binary format: its
/// dimensions, then each element as length and bytes (-1 for NULL).
fn binary_array(i: usize, t: &Type, element: &Type, b: &[u8]) -> Result<Vec<Option<String>>> {
    fn take<'a>(rest: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (head, tail) = rest.split_at_checked(n)?;
        *rest = tail;
        Some(head)
    }
    let mut rest = b;
    let word = |rest: &mut &[u8]| -> Result<i32> {
        let w = take(rest, 4).ok_or_else(|| bad(i, t, "truncated array"))?;
        Ok(i32::from_be_bytes(w.try_into().unwrap_or_default()))
    };
    let dims = word(&mut rest)?;
    let _has_nulls = word(&mut rest)?;
    let _element_oid = word(&mut rest)?;
    let len = match dims {
        0 => 0,
        1 => {
            let n = word(&mut rest)?;
            let _lower_bound = word(&mut rest)?;
            usize::try_from(n).map_err(|_| bad(i, t, "negative array length"))?
        }
        _ => {
            return Err(ServerError::unsupported(
                "multidimensional array parameters",
            ));
        }
    };
    let mut out = Vec::with_capacity(len.min(b.len() / 4));
    for _ in 0..len {
        let n = word(&mut rest)?;
        let Ok(n) = usize::try_from(n) else {
            out.push(None);
            continue;
        };
        let value = take(&mut rest, n).ok_or_else(|| bad(i, t, "truncated array element"))?;
        out.push(Some(binary_to_text(i, element, value)?));
    }
    if !rest.is_empty() {
        return Err(bad(i, t, "trailing bytes after the array"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binary_arrays() {
        let mut b = Vec::new();
        for w in [1i32, 1, 23, 2, 1, 4] {
            b.extend(w.to_be_bytes());
        }
        b.extend(7i32.to_be_bytes());
        b.extend((-1i32).to_be_bytes());
        assert_eq!(
            binary_array(0, &Type::INT4_ARRAY, &Type::INT4, &b).unwrap(),
            vec![Some("7".into()), None]
        );
        assert!(binary_array(0, &Type::INT4_ARRAY, &Type::INT4, &b[..b.len() - 2]).is_err());
    }
}

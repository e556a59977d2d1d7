//! Text input of types whose Postgres syntax DataFusion does not read.
//!
//! DataFusion casts a string to `bytea` by taking its bytes, so
//! `'\xdead'::bytea` would be six bytes of text rather than two; and its
//! interval parser knows `1 day 2 hours` but not the `1 day 04:05:06` that
//! Postgres (and psycopg, JDBC and psql) write, nor ISO 8601's
//! `P1DT4H5M6S`. These are wrong answers or needless errors, so the text
//! is put into a form DataFusion reads before it plans: string literals
//! typed `bytea`, `interval` or an array in every statement (`normalize`,
//! from `stmt::parse`), those written into such columns by `INSERT …
//! VALUES` (`type_string`), and text parameters of those types (`params`).
//! DataFusion would likewise cast `'{a,b}'` to `text[]` as the one element
//! `{a,b}`.

use std::ops::ControlFlow;

use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{
    Array, ArrayElemTypeDef, DataType as SqlType, Expr, Interval, Statement, TypedString, Value,
    visit_expressions_mut,
};

use crate::error::{Result, ServerError};
use crate::sql::rewrite::{call, cast};
pub use planner::functions::intervals::interval_text;

/// Rewrites the `bytea` and `interval` literals of `stmt`.
pub fn normalize(stmt: &mut Statement) -> Result<()> {
    let mut failed = None;
    let _ = visit_expressions_mut(stmt, |e| {
        if let Err(err) = normalize_expr(e) {
            failed = Some(err);
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    failed.map_or(Ok(()), Err)
}

fn normalize_expr(e: &mut Expr) -> Result<()> {
    match e {
        Expr::Interval(Interval {
            value,
            leading_field: None,
            last_field: None,
            ..
        })
        | Expr::Cast {
            expr: value,
            data_type: SqlType::Interval { .. },
            ..
        } => {
            if let Some(s) = string(value)
                && let Some(canonical) = interval_text(s)?
            {
                **value = Expr::value(Value::SingleQuotedString(canonical));
            }
        }
        Expr::Cast {
            expr,
            data_type: data_type @ SqlType::Array(ArrayElemTypeDef::SquareBracket(..)),
            ..
        } => {
            if let Some(s) = string(expr) {
                *e = array_cast(s, data_type)?;
            }
        }
        Expr::Cast {
            expr,
            data_type: SqlType::Bytea,
            ..
        } => {
            if let Some(s) = string(expr) {
                *e = decode_call(&bytea(s)?);
            }
        }
        Expr::TypedString(TypedString {
            data_type: SqlType::Bytea,
            value,
            ..
        }) => {
            if let Value::SingleQuotedString(s) = &value.value {
                *e = decode_call(&bytea(s)?);
            }
        }
        Expr::TypedString(TypedString {
            data_type: SqlType::Interval { .. },
            value,
            ..
        }) => {
            if let Value::SingleQuotedString(s) = &value.value
                && let Some(canonical) = interval_text(s)?
            {
                value.value = Value::SingleQuotedString(canonical);
            }
        }
        _ => {}
    }
    Ok(())
}

/// A string literal written into a column of type `t` (`INSERT … VALUES`),
/// read as that type reads text.
pub fn type_string(e: &mut Expr, t: &DataType) -> Result<()> {
    let Some(s) = string(e) else {
        return Ok(());
    };
    match t {
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => {
            *e = decode_call(&bytea(s)?);
        }
        DataType::Interval(_) => {
            let text = interval_text(s)?.unwrap_or_else(|| s.to_string());
            *e = cast(
                Expr::value(Value::SingleQuotedString(text)),
                SqlType::Interval {
                    fields: None,
                    precision: None,
                },
            );
        }
        _ => {}
    }
    Ok(())
}

/// The text of a string literal, also through a cast to `text` (as a
/// parameter declared `text` is written): in Postgres a text is read as
/// the type it is cast to, as a literal is.
fn string(e: &Expr) -> Option<&str> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => Some(s),
            _ => None,
        },
        Expr::Cast {
            expr,
            data_type:
                SqlType::Text | SqlType::Varchar(_) | SqlType::CharacterVarying(_) | SqlType::String(_),
            ..
        } => string(expr),
        Expr::Nested(inner) => string(inner),
        _ => None,
    }
}

/// `decode('<hex>', 'hex')`: bytes as a SQL expression DataFusion plans.
pub fn decode_call(bytes: &[u8]) -> Expr {
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let text = |s: String| Expr::value(Value::SingleQuotedString(s));
    call("decode", vec![text(hex), text("hex".into())])
}

/// The bytes of a `bytea` in Postgres's input syntax: `\x` and hex digits,
/// or the escape format, where `\\` is a backslash and `\ooo` an octal byte.
pub fn bytea(s: &str) -> Result<Vec<u8>> {
    let bad = || ServerError::InvalidText(format!("invalid input syntax for type bytea: \"{s}\""));
    if let Some(hex) = s.strip_prefix("\\x").or_else(|| s.strip_prefix("\\X")) {
        let digits: Vec<u8> = hex.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
        if !digits.len().is_multiple_of(2) {
            return Err(ServerError::InvalidText(format!(
                "invalid hexadecimal data: odd number of digits in \"{s}\""
            )));
        }
        return digits
            .chunks(2)
            .map(|pair| {
                std::str::from_utf8(pair)
                    .ok()
                    .and_then(|p| u8::from_str_radix(p, 16).ok())
                    .ok_or_else(|| {
                        ServerError::InvalidText(format!("invalid hexadecimal digit in \"{s}\""))
                    })
            })
            .collect();
    }
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' {
            out.push(b[i]);
            i += 1;
        } else if b.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let octal = b.get(i + 1..i + 4).ok_or_else(bad)?;
            if !(b'0'..=b'3').contains(&octal[0])
                || !octal[1..].iter().all(|c| (b'0'..=b'7').contains(c))
            {
                return Err(bad());
            }
            out.push(octal.iter().fold(0u8, |n, c| n * 8 + (c - b'0')));
            i += 4;
        }
    }
    Ok(out)
}

/// The elements of a one-dimensional array literal, `{a,"b c",NULL}`: an
/// unquoted `NULL` is a NULL, quotes and backslashes escape.
pub fn array_elements(s: &str) -> Result<Vec<Option<String>>> {
    let malformed = || ServerError::InvalidText(format!("malformed array literal: \"{s}\""));
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(malformed)?;
    let mut out = Vec::new();
    if inner.trim().is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let element = if chars.next_if_eq(&'"').is_some() {
            let mut text = String::new();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => text.extend(chars.next()),
                    Some(c) => text.push(c),
                    None => return Err(malformed()),
                }
            }
            while chars.next_if(|c| c.is_whitespace()).is_some() {}
            Some(text)
        } else {
            let mut text = String::new();
            while let Some(c) = chars.next_if(|c| *c != ',') {
                match c {
                    '{' => return Err(ServerError::unsupported("multidimensional arrays")),
                    '"' | '}' => return Err(malformed()),
                    '\\' => text.extend(chars.next()),
                    c => text.push(c),
                }
            }
            let text = text.trim_end().to_string();
            if text.is_empty() {
                return Err(malformed());
            }
            (!text.eq_ignore_ascii_case("null")).then_some(text)
        };
        out.push(element);
        match chars.next() {
            Some(',') => {}
            None => return Ok(out),
            Some(_) => return Err(malformed()),
        }
    }
}

/// `'{1,2}'::int[]`: the array literal's elements, each read as the
/// element type reads text (DataFusion would make a one-element array of
/// the whole string).
fn array_cast(s: &str, data_type: &SqlType) -> Result<Expr> {
    let items = array_elements(s)?
        .into_iter()
        .map(|e| match e {
            None => Expr::value(Value::Null),
            Some(text) => Expr::value(Value::SingleQuotedString(text)),
        })
        .collect();
    Ok(cast(
        Expr::Array(Array {
            elem: items,
            named: true,
        }),
        data_type.clone(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytea_reads_hex_and_escape_formats() {
        assert_eq!(bytea("\\xdead").unwrap(), vec![0xde, 0xad]);
        assert_eq!(bytea("\\xDE AD").unwrap(), vec![0xde, 0xad]);
        assert_eq!(bytea("a\\\\b\\001").unwrap(), b"a\\b\x01".to_vec());
        assert_eq!(bytea("plain").unwrap(), b"plain".to_vec());
        assert!(bytea("\\xabc").is_err());
        assert!(bytea("\\xzz").is_err());
        assert!(bytea("bad\\9").is_err());
        assert!(bytea("end\\").is_err());
    }

    #[test]
    fn array_literals() {
        assert_eq!(array_elements("{}").unwrap(), Vec::<Option<String>>::new());
        assert_eq!(
            array_elements(r#"{a, "b c",NULL,"NULL","x\"y"}"#).unwrap(),
            vec![
                Some("a".into()),
                Some("b c".into()),
                None,
                Some("NULL".into()),
                Some("x\"y".into())
            ]
        );
        assert!(array_elements("{a").is_err());
        assert!(array_elements("{a,,b}").is_err());
        assert!(array_elements("{{1},{2}}").is_err());
    }

    #[test]
    fn intervals_in_postgres_and_iso_forms() {
        assert_eq!(interval_text("1 day 2 hours").unwrap(), None);
        assert_eq!(
            interval_text("1 year 2 months 3 days 04:05:06.789").unwrap(),
            Some("14 months 3 days 14706789000 microseconds".into())
        );
        assert_eq!(
            interval_text("3 days 0:00:05").unwrap(),
            Some("0 months 3 days 5000000 microseconds".into())
        );
        assert_eq!(
            interval_text("P1Y2M3DT4H5M6S").unwrap(),
            Some("14 months 3 days 14706000000 microseconds".into())
        );
        assert!(interval_text("garbage").is_err());
    }
}

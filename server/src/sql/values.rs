//! `INSERT … VALUES` of plain literals, read straight into Arrow arrays.
//!
//! Most writes are a `VALUES` list of numbers, strings, booleans and NULLs,
//! or the same with bound parameters (`CAST('…' AS type)`, see `params`).
//! Planning such a list with DataFusion costs far more than the rows are
//! worth, so a list whose every value is such a literal, going into a
//! column whose type reads it exactly as Postgres would, becomes arrays
//! here. Anything else (an expression, `DEFAULT`, a text literal for a
//! number column, a number with a fraction for an integer column, a value
//! out of range) returns `None`, and the statement is planned as before:
//! this path only takes what it is sure of, and answers it the same way.

use std::borrow::Cow;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float32Builder, Float64Builder, Int16Builder, Int32Builder,
    Int64Builder, StringBuilder, new_null_array,
};
use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{DataType as SqlType, Expr, UnaryOperator, Value};

/// One literal, as written.
enum Literal<'a> {
    Null,
    /// Digits with an optional sign: an integer.
    Integer(i64),
    /// A number with a fraction or an exponent, as text.
    Fraction(Cow<'a, str>),
    Text(&'a str),
    Bool(bool),
}

/// The columns `rows` make, one array of `types[i]` per column; `None`
/// when a value is anything but a literal the column's type reads as
/// Postgres reads it.
pub fn literal_columns(rows: &[&[Expr]], types: &[DataType]) -> Option<Vec<ArrayRef>> {
    if rows.iter().any(|r| r.len() != types.len()) {
        return None;
    }
    types
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let values = rows
                .iter()
                .map(|r| literal(&r[i]))
                .collect::<Option<Vec<_>>>()?;
            column(&values, t)
        })
        .collect()
}

fn literal(e: &Expr) -> Option<Literal<'_>> {
    match e {
        Expr::Value(v) => match &v.value {
            Value::Null => Some(Literal::Null),
            Value::Boolean(b) => Some(Literal::Bool(*b)),
            Value::Number(n, false) => number(n, false),
            Value::SingleQuotedString(s) => Some(Literal::Text(s)),
            _ => None,
        },
        Expr::UnaryOp {
            op: UnaryOperator::Minus,
            expr,
        } => match expr.as_ref() {
            Expr::Value(v) => match &v.value {
                Value::Number(n, false) => number(n, true),
                _ => None,
            },
            _ => None,
        },
        // A bound parameter: its text, read as the type it was sent as.
        Expr::Cast {
            expr,
            data_type,
            format: None,
            ..
        } => {
            let Expr::Value(v) = expr.as_ref() else {
                return None;
            };
            let text = match &v.value {
                Value::SingleQuotedString(s) => s.as_str(),
                Value::Null => return Some(Literal::Null),
                _ => return None,
            };
            match data_type {
                SqlType::SmallInt(_)
                | SqlType::Int(_)
                | SqlType::Integer(_)
                | SqlType::BigInt(_)
                | SqlType::Int2(_)
                | SqlType::Int4(_)
                | SqlType::Int8(_) => {
                    let t = text.trim();
                    let (negative, digits) = match t.strip_prefix('-') {
                        Some(d) => (true, d),
                        None => (false, t.strip_prefix('+').unwrap_or(t)),
                    };
                    match number(digits, negative)? {
                        Literal::Integer(v) => Some(Literal::Integer(v)),
                        _ => None,
                    }
                }
                SqlType::DoublePrecision | SqlType::Float8 | SqlType::Real | SqlType::Float4 => {
                    let t = text.trim();
                    let digits = t.strip_prefix(['-', '+']).unwrap_or(t);
                    plain_number(digits).then_some(Literal::Fraction(Cow::Borrowed(t)))
                }
                SqlType::Text => Some(Literal::Text(text)),
                SqlType::Boolean | SqlType::Bool => match text.trim() {
                    "t" | "true" => Some(Literal::Bool(true)),
                    "f" | "false" => Some(Literal::Bool(false)),
                    _ => None,
                },
                _ => None,
            }
        }
        _ => None,
    }
}

/// Digits, an optional fraction and an optional exponent: a number as SQL
/// writes one (no sign, no spaces, no `Infinity`).
fn plain_number(s: &str) -> bool {
    let (mantissa, exponent) = match s.find(['e', 'E']) {
        Some(at) => (&s[..at], Some(&s[at + 1..])),
        None => (s, None),
    };
    let digits = |d: &str| !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit());
    let mantissa_ok = match mantissa.split_once('.') {
        Some((a, b)) => {
            (digits(a) || digits(b)) && (a.is_empty() || digits(a)) && (b.is_empty() || digits(b))
        }
        None => digits(mantissa),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['-', '+']).unwrap_or(e)));
    mantissa_ok && exponent_ok
}

fn number(n: &str, negative: bool) -> Option<Literal<'_>> {
    if !plain_number(n) {
        return None;
    }
    if n.bytes().all(|b| b.is_ascii_digit()) {
        // i64::MIN has no positive counterpart: parse with the sign.
        let v: i64 = if negative {
            format!("-{n}").parse().ok()?
        } else {
            n.parse().ok()?
        };
        return Some(Literal::Integer(v));
    }
    Some(Literal::Fraction(if negative {
        Cow::Owned(format!("-{n}"))
    } else {
        Cow::Borrowed(n)
    }))
}

/// A float read from its digits; `None` beyond the type's range (an
/// overflow, or an underflow to zero), which Postgres refuses.
fn float<F: std::str::FromStr + Into<f64> + Copy>(s: &str) -> Option<F> {
    let v: F = s.parse().ok()?;
    let wide: f64 = v.into();
    let mantissa = s.split(['e', 'E']).next().unwrap_or(s);
    let zero_digits = mantissa.bytes().all(|b| !(b'1'..=b'9').contains(&b));
    (wide.is_finite() && (wide != 0.0 || zero_digits)).then_some(v)
}

fn column(values: &[Literal<'_>], t: &DataType) -> Option<ArrayRef> {
    if values.iter().all(|v| matches!(v, Literal::Null)) {
        return Some(new_null_array(t, values.len()));
    }
    // One array from `builder`, each value by the arm it matches; a value
    // no arm takes leaves the list to the planner.
    macro_rules! build {
        ($builder:ident, $($value:pat => $append:expr),+) => {{
            let mut b = $builder::with_capacity(values.len());
            for v in values {
                match v {
                    Literal::Null => b.append_null(),
                    $($value => b.append_value($append),)+
                    _ => return None,
                }
            }
            Some(Arc::new(b.finish()) as ArrayRef)
        }};
    }
    let n = values.len();
    match t {
        DataType::Int16 => build!(Int16Builder, Literal::Integer(i) => i16::try_from(*i).ok()?),
        DataType::Int32 => build!(Int32Builder, Literal::Integer(i) => i32::try_from(*i).ok()?),
        DataType::Int64 => build!(Int64Builder, Literal::Integer(i) => *i),
        // An integer rounds to the nearest float, as reading its digits does.
        DataType::Float64 => build!(
            Float64Builder,
            Literal::Integer(i) => *i as f64,
            Literal::Fraction(s) => float(s)?
        ),
        DataType::Float32 => build!(
            Float32Builder,
            Literal::Integer(i) => *i as f32,
            Literal::Fraction(s) => float(s)?
        ),
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(n, 0);
            for v in values {
                match v {
                    Literal::Null => b.append_null(),
                    Literal::Text(s) => b.append_value(s),
                    _ => return None,
                }
            }
            Some(Arc::new(b.finish()))
        }
        DataType::Boolean => build!(BooleanBuilder, Literal::Bool(x) => *x),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Float64Type, Int32Type, Int64Type};
    use datafusion::sql::sqlparser::ast::{SetExpr, Statement};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    use super::*;

    fn rows(values: &str) -> Vec<Vec<Expr>> {
        let sql = format!("INSERT INTO t VALUES {values}");
        let stmt = Parser::parse_sql(&PostgreSqlDialect {}, &sql)
            .unwrap()
            .remove(0);
        let Statement::Insert(insert) = stmt else {
            panic!("not an insert")
        };
        let SetExpr::Values(v) = *insert.source.unwrap().body else {
            panic!("not VALUES")
        };
        v.rows.into_iter().map(|r| r.content).collect()
    }

    fn literal_columns(rows: &[Vec<Expr>], types: &[DataType]) -> Option<Vec<ArrayRef>> {
        let rows: Vec<&[Expr]> = rows.iter().map(Vec::as_slice).collect();
        super::literal_columns(&rows, types)
    }

    #[test]
    fn literals_become_arrays_of_the_column_types() {
        let types = [
            DataType::Int64,
            DataType::Int32,
            DataType::Float64,
            DataType::Utf8,
        ];
        let cols = literal_columns(
            &rows(
                "(1, -2, -1.5, 'a'), (-9223372036854775808, NULL, 2, NULL), (3, 4, 2.5e3, 'it''s')",
            ),
            &types,
        )
        .unwrap();
        let big = cols[0].as_primitive::<Int64Type>();
        assert_eq!(big.values().to_vec(), vec![1, i64::MIN, 3]);
        let small = cols[1].as_primitive::<Int32Type>();
        assert_eq!(
            (small.value(0), small.is_null(1), small.value(2)),
            (-2, true, 4)
        );
        let float = cols[2].as_primitive::<Float64Type>();
        assert_eq!(float.values().to_vec(), vec![-1.5, 2.0, 2500.0]);
        let text = cols[3].as_string::<i32>();
        assert_eq!(
            (text.value(0), text.is_null(1), text.value(2)),
            ("a", true, "it's")
        );
    }

    #[test]
    fn parameters_are_read_as_the_type_they_were_sent_as() {
        let types = [DataType::Int64, DataType::Float64, DataType::Boolean];
        let cols = literal_columns(
            &rows(
                "(CAST(' 42' AS bigint), CAST('-0.25' AS double precision), CAST('t' AS boolean))",
            ),
            &types,
        )
        .unwrap();
        assert_eq!(cols[0].as_primitive::<Int64Type>().value(0), 42);
        assert_eq!(cols[1].as_primitive::<Float64Type>().value(0), -0.25);
        assert!(cols[2].as_boolean().value(0));
    }

    #[test]
    fn anything_else_is_left_to_the_planner() {
        for (values, t) in [
            // Postgres rounds 1.5 into an integer column.
            ("(1.5)", DataType::Int64),
            ("(70000)", DataType::Int16),
            ("('12')", DataType::Int64),
            ("(1 + 1)", DataType::Int64),
            ("(DEFAULT)", DataType::Int64),
            ("(5)", DataType::Utf8),
            ("('2024-01-01')", DataType::Date32),
            ("(CAST('Infinity' AS double precision))", DataType::Float64),
            // Out of the type's range: Postgres refuses it.
            ("(1e400)", DataType::Float64),
            ("(1e-400)", DataType::Float64),
            ("(1e39)", DataType::Float32),
        ] {
            assert!(
                literal_columns(&rows(values), std::slice::from_ref(&t)).is_none(),
                "{values} into {t}"
            );
        }
    }
}

//! A `jsonb` value as Postgres keeps one, read from and printed as text.
//!
//! Weir stores a `jsonb` as its canonical text (Arrow `LargeUtf8`, see the
//! parent module): the text Postgres prints for it. Objects have each key
//! once (the last one written wins) in Postgres's key order (shorter keys
//! first, then bytewise); numbers are `numeric`s, printed without exponent
//! at the scale written (`1.50e1` is `15.0`); `", "` and `": "` separate.
//! Two equal values are one text, so `=`, `GROUP BY`, `DISTINCT` and joins
//! on the text agree with Postgres's jsonb equality (but for numbers of
//! equal value written at different scales, `1.0` and `1`).
//!
//! Text is read with `jiter` (its raw number bytes keep what a double would
//! round); nesting is limited to [`MAX_DEPTH`], where Postgres would run out
//! of stack.

use std::cmp::Ordering;
use std::fmt::Write;

use jiter::{Jiter, Peek};

/// Deeper nesting than this is refused (`54001`), as Postgres refuses what
/// would exceed its stack. Reading, printing and comparing recurse; 200
/// levels stay well inside a 2 MiB thread stack in a debug build.
pub const MAX_DEPTH: usize = 200;

/// A `jsonb` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Json {
    Null,
    Bool(bool),
    /// A number's canonical `numeric` text.
    Number(String),
    String(String),
    Array(Vec<Json>),
    /// Keys unique, in [`key_order`].
    Object(Vec<(String, Json)>),
}

/// Why text is no `jsonb`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadError {
    /// Not JSON (`22P02`).
    Syntax(String),
    /// `\u0000`, which no text holds (`22P05`).
    NulCharacter,
    /// A number beyond `numeric`'s range (`22003`).
    NumberOutOfRange,
    /// Nested deeper than [`MAX_DEPTH`] (`54001`).
    TooDeep,
}

/// Postgres's order of object keys: shorter first, then bytewise.
pub fn key_order(a: &str, b: &str) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.as_bytes().cmp(b.as_bytes()))
}

impl Json {
    /// Reads JSON text.
    pub fn parse(text: &str) -> Result<Json, ReadError> {
        let mut j = Jiter::new(text.as_bytes());
        let peek = j.peek().map_err(|e| syntax(&e))?;
        let v = read(&mut j, peek, 0)?;
        j.finish().map_err(|e| syntax(&e))?;
        Ok(v)
    }

    /// An object of `pairs`, sorted, the last of equal keys kept.
    pub fn object(pairs: Vec<(String, Json)>) -> Json {
        let mut pairs: Vec<(usize, (String, Json))> = pairs.into_iter().enumerate().collect();
        // Stable by key, then the last written of each key survives.
        pairs.sort_by(|(i, (a, _)), (j, (b, _))| key_order(a, b).then(i.cmp(j)));
        let mut out: Vec<(String, Json)> = Vec::with_capacity(pairs.len());
        for (_, (k, v)) in pairs {
            match out.last_mut() {
                Some((last, slot)) if *last == k => *slot = v,
                _ => out.push((k, v)),
            }
        }
        Json::Object(out)
    }

    /// The value of key `k` of an object.
    pub fn field(&self, k: &str) -> Option<&Json> {
        match self {
            Json::Object(pairs) => pairs
                .binary_search_by(|(key, _)| key_order(key, k))
                .ok()
                .map(|i| &pairs[i].1),
            _ => None,
        }
    }

    /// Element `i` of an array, counting from its end when negative. A
    /// scalar is, as in Postgres, an array of itself alone.
    pub fn element(&self, i: i64) -> Option<&Json> {
        let one = std::slice::from_ref(self);
        let items = match self {
            Json::Array(items) => items.as_slice(),
            Json::Object(_) => return None,
            _ => one,
        };
        let at = if i < 0 { items.len() as i64 + i } else { i };
        usize::try_from(at).ok().and_then(|at| items.get(at))
    }

    /// Follows a path of keys and (for arrays) positions, as `#>` does.
    pub fn path<S: AsRef<str>>(&self, path: &[S]) -> Option<&Json> {
        let mut at = self;
        for step in path {
            let step = step.as_ref();
            at = match at {
                Json::Object(_) => at.field(step)?,
                Json::Array(_) => at.element(step.trim().parse().ok()?)?,
                _ => return None,
            };
        }
        Some(at)
    }

    /// Postgres's name of the value's type, as `jsonb_typeof` gives it.
    pub fn type_name(&self) -> &'static str {
        match self {
            Json::Null => "null",
            Json::Bool(_) => "boolean",
            Json::Number(_) => "number",
            Json::String(_) => "string",
            Json::Array(_) => "array",
            Json::Object(_) => "object",
        }
    }

    /// The value as `->>` gives it: a string's own text, NULL for `null`,
    /// the JSON text of anything else.
    pub fn as_text(&self) -> Option<String> {
        match self {
            Json::Null => None,
            Json::String(s) => Some(s.clone()),
            other => Some(other.to_string()),
        }
    }

    /// Whether `self @> other`: every key and element of `other` is in
    /// `self`, recursively; at the top, an array contains a scalar that is
    /// one of its elements.
    pub fn contains(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Array(items), b) if !matches!(b, Json::Array(_) | Json::Object(_)) => {
                items.iter().any(|a| a.same_scalar(b))
            }
            _ => self.contains_nested(other),
        }
    }

    fn contains_nested(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Object(_), Json::Object(want)) => want
                .iter()
                .all(|(k, v)| self.field(k).is_some_and(|have| have.contains_nested(v))),
            (Json::Array(have), Json::Array(want)) => want.iter().all(|w| match w {
                Json::Array(_) | Json::Object(_) => have.iter().any(|h| h.contains_nested(w)),
                scalar => have.iter().any(|h| h.same_scalar(scalar)),
            }),
            (Json::Array(_) | Json::Object(_), _) | (_, Json::Array(_) | Json::Object(_)) => false,
            (a, b) => a.same_scalar(b),
        }
    }

    /// Scalar equality; numbers by value (`1.0` is `1`).
    fn same_scalar(&self, other: &Json) -> bool {
        match (self, other) {
            (Json::Number(a), Json::Number(b)) => number_value(a) == number_value(b),
            (Json::Array(_) | Json::Object(_), _) => false,
            (a, b) => a == b,
        }
    }

    /// Whether `?` finds `key`: a key of an object, a string element of an
    /// array, or the string itself.
    pub fn has_key(&self, key: &str) -> bool {
        match self {
            Json::Object(_) => self.field(key).is_some(),
            Json::Array(items) => items
                .iter()
                .any(|i| matches!(i, Json::String(s) if s == key)),
            Json::String(s) => s == key,
            _ => false,
        }
    }

    /// Without the object fields whose value is `null`, at every depth.
    pub fn strip_nulls(self) -> Json {
        match self {
            Json::Object(pairs) => Json::Object(
                pairs
                    .into_iter()
                    .filter(|(_, v)| *v != Json::Null)
                    .map(|(k, v)| (k, v.strip_nulls()))
                    .collect(),
            ),
            Json::Array(items) => Json::Array(items.into_iter().map(Json::strip_nulls).collect()),
            other => other,
        }
    }

    /// Bytes whose order (as bytes) is Postgres's order of `jsonb` values:
    /// `null` < strings < numbers < booleans < arrays < objects; arrays and
    /// objects by their size first, then element by element (objects key,
    /// value, key, … in their key order); numbers by value; strings
    /// bytewise. As in Postgres, an empty array at the top sorts first.
    pub fn sort_key(&self) -> Vec<u8> {
        let mut out = Vec::new();
        if matches!(self, Json::Array(items) if items.is_empty()) {
            out.push(0x01);
        } else {
            self.write_sort_key(&mut out);
        }
        out
    }

    fn write_sort_key(&self, out: &mut Vec<u8>) {
        match self {
            Json::Null => out.push(0x10),
            Json::String(s) => {
                out.push(0x20);
                write_sort_string(out, s);
            }
            Json::Number(n) => {
                out.push(0x30);
                write_sort_number(out, n);
            }
            Json::Bool(b) => out.extend([0x40, *b as u8]),
            Json::Array(items) => {
                out.push(0x50);
                out.extend((items.len() as u32).to_be_bytes());
                for item in items {
                    item.write_sort_key(out);
                }
            }
            Json::Object(pairs) => {
                out.push(0x60);
                out.extend((pairs.len() as u32).to_be_bytes());
                for (k, v) in pairs {
                    write_sort_string(out, k);
                    v.write_sort_key(out);
                }
            }
        }
    }

    /// Writes the value as Postgres's `jsonb_pretty` does: four spaces per
    /// level, one element per line.
    pub fn pretty(&self) -> String {
        let mut out = String::new();
        self.write_pretty(&mut out, 0);
        out
    }

    fn write_pretty(&self, out: &mut String, level: usize) {
        let indent = |out: &mut String, level: usize| {
            out.push('\n');
            out.extend(std::iter::repeat_n("    ", level));
        };
        match self {
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    indent(out, level + 1);
                    item.write_pretty(out, level + 1);
                }
                indent(out, level);
                out.push(']');
            }
            Json::Object(pairs) => {
                out.push('{');
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    indent(out, level + 1);
                    write_string(out, k);
                    out.push_str(": ");
                    v.write_pretty(out, level + 1);
                }
                indent(out, level);
                out.push('}');
            }
            scalar => {
                let _ = write!(out, "{scalar}");
            }
        }
    }
}

impl std::fmt::Display for Json {
    /// Postgres's text of the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Json::Null => f.write_str("null"),
            Json::Bool(b) => write!(f, "{b}"),
            Json::Number(n) => f.write_str(n),
            Json::String(s) => {
                let mut out = String::with_capacity(s.len() + 2);
                write_string(&mut out, s);
                f.write_str(&out)
            }
            Json::Array(items) => {
                f.write_str("[")?;
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                f.write_str("]")
            }
            Json::Object(pairs) => {
                f.write_str("{")?;
                let mut key = String::new();
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    key.clear();
                    write_string(&mut key, k);
                    write!(f, "{key}: {v}")?;
                }
                f.write_str("}")
            }
        }
    }
}

/// A JSON string literal as Postgres escapes one.
pub fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn syntax(e: &impl std::fmt::Display) -> ReadError {
    ReadError::Syntax(e.to_string())
}

fn read(j: &mut Jiter, peek: Peek, depth: usize) -> Result<Json, ReadError> {
    if depth >= MAX_DEPTH {
        return Err(ReadError::TooDeep);
    }
    Ok(match peek {
        Peek::Null => {
            j.known_null().map_err(|e| syntax(&e))?;
            Json::Null
        }
        Peek::True | Peek::False => Json::Bool(j.known_bool(peek).map_err(|e| syntax(&e))?),
        Peek::String => {
            let s = j.known_str().map_err(|e| syntax(&e))?;
            if s.contains('\0') {
                return Err(ReadError::NulCharacter);
            }
            Json::String(s.to_owned())
        }
        Peek::Array => {
            let mut items = Vec::new();
            let mut next = j.known_array().map_err(|e| syntax(&e))?;
            while let Some(p) = next {
                items.push(read(j, p, depth + 1)?);
                next = j.array_step().map_err(|e| syntax(&e))?;
            }
            Json::Array(items)
        }
        Peek::Object => {
            let mut pairs = Vec::new();
            let mut key = j.known_object().map_err(|e| syntax(&e))?.map(str::to_owned);
            while let Some(k) = key {
                if k.contains('\0') {
                    return Err(ReadError::NulCharacter);
                }
                let p = j.peek().map_err(|e| syntax(&e))?;
                let v = read(j, p, depth + 1)?;
                pairs.push((k, v));
                key = j.next_key().map_err(|e| syntax(&e))?.map(str::to_owned);
            }
            Json::object(pairs)
        }
        p if p.is_num() => {
            let bytes = j.known_number_bytes(p).map_err(|e| syntax(&e))?;
            let text = std::str::from_utf8(bytes).map_err(|e| syntax(&e))?;
            Json::Number(canonical_number(text)?)
        }
        other => return Err(ReadError::Syntax(format!("unexpected {other:?}"))),
    })
}

/// The largest exponent a `numeric` holds.
const MAX_EXPONENT: i64 = 131_072;

/// A JSON number's text as Postgres's `numeric` prints it: no exponent, as
/// many decimals as written (less the exponent), no sign on zero.
pub fn canonical_number(text: &str) -> Result<String, ReadError> {
    let bad = || ReadError::Syntax(format!("Token \"{text}\" is invalid."));
    let (negative, rest) = match text.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, text),
    };
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => {
            let e = &rest[at + 1..];
            let digits = e.strip_prefix(['+', '-']).unwrap_or(e);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            let e: i64 = e.parse().unwrap_or(if e.starts_with('-') {
                i64::MIN / 2
            } else {
                i64::MAX / 2
            });
            (&rest[..at], e)
        }
        None => (rest, 0),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((i, f)) if !f.is_empty() => (i, f),
        Some(_) => return Err(bad()),
        None => (mantissa, ""),
    };
    let valid_int = !int.is_empty()
        && int.bytes().all(|b| b.is_ascii_digit())
        && (int == "0" || !int.starts_with('0'));
    if !valid_int || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let digits: String = format!("{int}{frac}");
    if digits.bytes().all(|b| b == b'0') {
        let scale = (frac.len() as i64 - exponent).clamp(0, MAX_EXPONENT) as usize;
        return Ok(if scale == 0 {
            "0".into()
        } else {
            format!("0.{}", "0".repeat(scale))
        });
    }
    if exponent.abs() > MAX_EXPONENT {
        return Err(ReadError::NumberOutOfRange);
    }
    // The decimal point sits after `point` digits of `digits`.
    let point = int.len() as i64 + exponent;
    let scale = (frac.len() as i64 - exponent).max(0) as usize;
    let mut out = String::new();
    if negative {
        out.push('-');
    }
    let int_part: String = if point <= 0 {
        String::new()
    } else if point as usize >= digits.len() {
        format!("{digits}{}", "0".repeat(point as usize - digits.len()))
    } else {
        digits[..point as usize].to_string()
    };
    let int_part = int_part.trim_start_matches('0');
    out.push_str(if int_part.is_empty() { "0" } else { int_part });
    if scale > 0 {
        out.push('.');
        let frac_part: String = if point < 0 {
            format!("{}{digits}", "0".repeat((-point) as usize))
        } else if (point as usize) < digits.len() {
            digits[point as usize..].to_string()
        } else {
            String::new()
        };
        out.push_str(&frac_part);
        for _ in frac_part.len()..scale {
            out.push('0');
        }
    }
    Ok(out)
}

/// A string, prefix-free and in byte order: `0x00` escaped as `0x00 0xff`,
/// the end `0x00 0x00`.
fn write_sort_string(out: &mut Vec<u8>, s: &str) {
    for &b in s.as_bytes() {
        out.push(b);
        if b == 0 {
            out.push(0xff);
        }
    }
    out.extend([0, 0]);
}

/// A canonical number, prefix-free and in order of value: its sign, then
/// (as `0.d1d2… × 10^e`) its exponent and its significant digits, both
/// inverted for a negative number so that larger magnitudes sort lower.
fn write_sort_number(out: &mut Vec<u8>, n: &str) {
    let (negative, magnitude) = match n.strip_prefix('-') {
        Some(m) => (true, m),
        None => (false, n),
    };
    let (int, frac) = magnitude.split_once('.').unwrap_or((magnitude, ""));
    let all: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
    let Some(first) = all.iter().position(|&d| d != b'0') else {
        out.push(0x80);
        return;
    };
    let last = all.iter().rposition(|&d| d != b'0').unwrap_or(first);
    let exponent = int.len() as i64 - first as i64;
    let biased = (exponent + (1 << 31)).clamp(0, u32::MAX as i64) as u32;
    let digits = &all[first..=last];
    if negative {
        out.push(0x40);
        out.extend((u32::MAX - biased).to_be_bytes());
        out.extend(digits.iter().map(|d| 0xff - d));
        out.push(0xff);
    } else {
        out.push(0xc0);
        out.extend(biased.to_be_bytes());
        out.extend(digits);
        out.push(0x00);
    }
}

/// A canonical number's value as text: trailing zeros of the fraction
/// dropped, so that equal values are equal texts.
fn number_value(n: &str) -> &str {
    if n.contains('.') {
        n.trim_end_matches('0').trim_end_matches('.')
    } else {
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(s: &str) -> String {
        Json::parse(s).unwrap().to_string()
    }

    #[test]
    fn prints_as_postgres() {
        // Postgres 15's output for the same input.
        assert_eq!(
            canon(r#"{"b":1,"aa":2,"a":3, "x":1.50e1, "y": -0, "z": 1e-3}"#),
            r#"{"a": 3, "b": 1, "x": 15.0, "y": 0, "z": 0.001, "aa": 2}"#
        );
        assert_eq!(canon(r#"{"a":1, "a":2}"#), r#"{"a": 2}"#);
        assert_eq!(
            canon(r#" [1, [ ], {}, "\u00e9\t\u0001", true, null] "#),
            "[1, [], {}, \"é\\t\\u0001\", true, null]"
        );
        assert_eq!(canon("-12.340"), "-12.340");
        assert_eq!(canon("1E+2"), "100");
        assert_eq!(canon("12e-1"), "1.2");
        assert_eq!(canon("0.000"), "0.000");
        assert_eq!(canon("-0.0e1"), "0");
        assert_eq!(
            canon("123456789012345678901234567890"),
            "123456789012345678901234567890"
        );
        assert_eq!(canon("1e400").len(), 401);
    }

    #[test]
    fn refuses_what_postgres_refuses() {
        for bad in [
            "{x", "", "[1,]", "01", "1.", ".5", "NaN", "Infinity", "'a'", "[1] 2", "+1",
        ] {
            assert!(
                matches!(Json::parse(bad), Err(ReadError::Syntax(_))),
                "{bad}"
            );
        }
        assert_eq!(Json::parse(r#""\u0000""#), Err(ReadError::NulCharacter));
        assert_eq!(Json::parse("1e200000"), Err(ReadError::NumberOutOfRange));
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(Json::parse(&deep), Err(ReadError::TooDeep));
        let n = MAX_DEPTH - 1;
        let deepest = format!("{}{}", "[".repeat(n), "]".repeat(n));
        let v = Json::parse(&deepest).unwrap();
        assert!(v.contains(&v.clone()));
        assert_eq!(v.to_string(), deepest);
    }

    #[test]
    fn sorts_as_postgres() {
        // PostgreSQL 15's ORDER BY of these values (C collation).
        let sorted = [
            "[]",
            "null",
            r#""B""#,
            r#""a""#,
            r#""aa""#,
            "-3",
            "-0.5",
            "-0.25",
            "0",
            "0.001",
            "1.0",
            "2",
            "10.5",
            "false",
            "true",
            "[null]",
            r#"["a"]"#,
            "[1]",
            "[2]",
            "[[]]",
            "[{}]",
            "[1, 2]",
            "{}",
            r#"{"a": null}"#,
            r#"{"a": 1}"#,
            r#"{"a": 2}"#,
            r#"{"a": []}"#,
            r#"{"b": 0}"#,
            r#"{"b": 1, "d": 1}"#,
            r#"{"c": 1, "aa": 1}"#,
        ];
        let keys: Vec<Vec<u8>> = sorted
            .iter()
            .map(|s| Json::parse(s).unwrap().sort_key())
            .collect();
        for (i, pair) in keys.windows(2).enumerate() {
            assert!(pair[0] < pair[1], "{} < {}", sorted[i], sorted[i + 1]);
        }
        let key = |s: &str| Json::parse(s).unwrap().sort_key();
        assert_eq!(key("1.0"), key("1"));
        assert_eq!(key(r#"{"a": [1.50]}"#), key(r#"{"a": [1.5]}"#));
        assert!(key("-12.5") < key("-12.25"));
        assert!(key("12.25") < key("12.5"));
        assert!(key("99") < key("100"));
        assert!(key("-100") < key("-99"));
    }

    #[test]
    fn containment_and_lookup() {
        let j = |s: &str| Json::parse(s).unwrap();
        assert!(j("[1,2]").contains(&j("1")));
        assert!(!j(r#"{"a":[1,2]}"#).contains(&j(r#"{"a":1}"#)));
        assert!(j(r#"{"a":{"b":1,"c":2}}"#).contains(&j(r#"{"a":{"b":1}}"#)));
        assert!(j("[[1,2],3]").contains(&j("[[1]]")));
        assert!(!j("[1,[2]]").contains(&j("[2]")));
        assert!(j(r#"{"a":1.0}"#).contains(&j(r#"{"a":1}"#)));
        assert_eq!(j("[1,2,3]").element(-1), Some(&j("3")));
        assert_eq!(j(r#""x""#).element(0), Some(&j(r#""x""#)));
        assert_eq!(j(r#"{"a":[5,6]}"#).path(&["a", "1"]), Some(&j("6")));
        assert!(j(r#""foo""#).has_key("foo"));
        assert!(!j("[1,2]").has_key("1"));
        assert_eq!(
            j(r#"{"a":null,"b":[null,{"c":null}]}"#)
                .strip_nulls()
                .to_string(),
            r#"{"b": [null, {}]}"#
        );
        assert_eq!(j("{}").pretty(), "{\n}");
        assert_eq!(
            j(r#"{"a":[1,{"b":null}],"c":{}}"#).pretty(),
            "{\n    \"a\": [\n        1,\n        {\n            \"b\": null\n        }\n    ],\n    \"c\": {\n    }\n}"
        );
    }
}

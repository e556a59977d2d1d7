//! `COPY t FROM STDIN` and `COPY t | (query) TO STDOUT`, in Postgres's text
//! and CSV formats.
//!
//! `COPY … TO STDOUT` answers from the same consistent snapshot a `SELECT`
//! does; each row is encoded as the text a `SELECT` would send and then
//! written as a COPY line. `COPY … FROM STDIN` gathers the client's data
//! until `CopyDone`, decodes every line (so a bad line rejects the whole
//! COPY, as in Postgres, and nothing of it is written), and inserts the
//! rows in one durable write through the path `INSERT` takes, which gives
//! them the table's casts, defaults and NOT NULL checks.
//!
//! The CSV reader is Weir's own, not the `csv` crate's: Postgres tells a
//! quoted empty field (an empty string) from an unquoted one (NULL), which
//! a record reader that drops the quoting cannot.

use datafusion::sql::sqlparser::ast::{
    CopyLegacyCsvOption, CopyLegacyOption, CopyOption, CopySource, CopyTarget, Ident, ObjectName,
    Query,
};

use crate::error::{Result, ServerError};

/// The format of a COPY's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    Text,
    Csv,
}

/// What `WITH (…)` said about the data's format.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOptions {
    pub format: CopyFormat,
    pub delimiter: u8,
    /// The spelling of NULL: `\N` in text, the unquoted empty string in CSV.
    pub null: String,
    pub header: bool,
    pub quote: u8,
    pub escape: u8,
}

impl CopyOptions {
    pub fn new(format: CopyFormat) -> Self {
        match format {
            CopyFormat::Text => CopyOptions {
                format,
                delimiter: b'\t',
                null: "\\N".into(),
                header: false,
                quote: b'"',
                escape: b'"',
            },
            CopyFormat::Csv => CopyOptions {
                format,
                delimiter: b',',
                null: String::new(),
                header: false,
                quote: b'"',
                escape: b'"',
            },
        }
    }
}

/// A `COPY` statement, checked.
#[derive(Debug, Clone)]
pub enum Copy {
    /// `COPY t [(cols)] FROM STDIN`.
    In {
        table: ObjectName,
        columns: Vec<Ident>,
        options: CopyOptions,
    },
    /// `COPY t [(cols)] TO STDOUT` or `COPY (query) TO STDOUT`, as the
    /// query whose rows are written.
    Out {
        query: Box<Query>,
        options: CopyOptions,
    },
}

/// Checks a parsed `COPY`: only STDIN and STDOUT (the server reads and
/// writes no files of the client's naming), text or CSV.
pub fn plan(
    source: CopySource,
    to: bool,
    target: CopyTarget,
    options: &[CopyOption],
    legacy: &[CopyLegacyOption],
) -> Result<Copy> {
    match (&target, to) {
        (CopyTarget::Stdin, false) | (CopyTarget::Stdout, true) => {}
        (CopyTarget::Stdout, false) => {
            return Err(ServerError::Syntax(
                "COPY FROM takes STDIN, not STDOUT".into(),
            ));
        }
        (CopyTarget::Stdin, true) => {
            return Err(ServerError::Syntax(
                "COPY TO takes STDOUT, not STDIN".into(),
            ));
        }
        _ => {
            return Err(ServerError::unsupported(
                "COPY to or from a file or program on the server (use STDIN / STDOUT, or psql's \\copy)",
            ));
        }
    }
    let options = copy_options(options, legacy)?;
    match (source, to) {
        (
            CopySource::Table {
                table_name,
                columns,
            },
            false,
        ) => Ok(Copy::In {
            table: table_name,
            columns,
            options,
        }),
        (CopySource::Query(_), false) => Err(ServerError::Syntax(
            "COPY FROM takes a table, not a query".into(),
        )),
        (CopySource::Query(query), true) => Ok(Copy::Out { query, options }),
        (
            CopySource::Table {
                table_name,
                columns,
            },
            true,
        ) => {
            let list = if columns.is_empty() {
                "*".to_string()
            } else {
                columns
                    .iter()
                    .map(|c| c.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let sql = format!("SELECT {list} FROM {table_name}");
            let query = match crate::sql::stmt::parse(&sql)?.pop() {
                Some(crate::sql::stmt::Stmt::Sql(s)) => match *s {
                    datafusion::sql::sqlparser::ast::Statement::Query(q) => q,
                    other => return Err(ServerError::Internal(format!("not a query: {other}"))),
                },
                _ => return Err(ServerError::Internal(format!("not a query: {sql}"))),
            };
            Ok(Copy::Out { query, options })
        }
    }
}

fn one_byte(what: &str, c: char) -> Result<u8> {
    if c.is_ascii() {
        Ok(c as u8)
    } else {
        Err(ServerError::unsupported(format!(
            "a COPY {what} that is not a single one-byte character"
        )))
    }
}

fn copy_options(options: &[CopyOption], legacy: &[CopyLegacyOption]) -> Result<CopyOptions> {
    let format = options
        .iter()
        .find_map(|o| match o {
            CopyOption::Format(f) => Some(f.value.to_lowercase()),
            _ => None,
        })
        .or_else(|| {
            legacy.iter().find_map(|o| match o {
                CopyLegacyOption::Csv(_) => Some("csv".into()),
                CopyLegacyOption::Binary => Some("binary".into()),
                _ => None,
            })
        });
    let format = match format.as_deref() {
        None | Some("text") => CopyFormat::Text,
        Some("csv") => CopyFormat::Csv,
        Some("binary") => return Err(ServerError::unsupported("COPY's binary format")),
        Some(other) => {
            return Err(ServerError::InvalidParameter(format!(
                "COPY format \"{other}\" not recognized (text or csv)"
            )));
        }
    };
    let mut out = CopyOptions::new(format);
    let csv_only = |what: &str| {
        if format == CopyFormat::Csv {
            Ok(())
        } else {
            Err(ServerError::Unsupported(format!(
                "COPY {what} available only in CSV mode"
            )))
        }
    };
    for o in options {
        match o {
            CopyOption::Format(_) | CopyOption::Freeze(_) => {}
            CopyOption::Delimiter(c) => out.delimiter = one_byte("delimiter", *c)?,
            CopyOption::Null(n) => out.null = n.clone(),
            CopyOption::Header(h) => out.header = *h,
            CopyOption::Quote(c) => {
                csv_only("quote")?;
                out.quote = one_byte("quote", *c)?;
            }
            CopyOption::Escape(c) => {
                csv_only("escape")?;
                out.escape = one_byte("escape", *c)?;
            }
            CopyOption::Encoding(e) => {
                if !matches!(
                    e.to_lowercase().replace('-', "").as_str(),
                    "utf8" | "unicode"
                ) {
                    return Err(ServerError::unsupported(format!(
                        "COPY ENCODING '{e}' (Weir's data is UTF8)"
                    )));
                }
            }
            other => return Err(ServerError::unsupported(format!("the COPY option {other}"))),
        }
    }
    for o in legacy {
        match o {
            CopyLegacyOption::Binary => {}
            CopyLegacyOption::Delimiter(c) => out.delimiter = one_byte("delimiter", *c)?,
            CopyLegacyOption::Null(n) => out.null = n.clone(),
            CopyLegacyOption::Header => out.header = true,
            CopyLegacyOption::Csv(csv) => {
                for c in csv {
                    match c {
                        CopyLegacyCsvOption::Header => out.header = true,
                        CopyLegacyCsvOption::Quote(q) => out.quote = one_byte("quote", *q)?,
                        CopyLegacyCsvOption::Escape(e) => out.escape = one_byte("escape", *e)?,
                        other => {
                            return Err(ServerError::unsupported(format!(
                                "the COPY option {other}"
                            )));
                        }
                    }
                }
            }
            other => return Err(ServerError::unsupported(format!("the COPY option {other}"))),
        }
    }
    if out.header && format == CopyFormat::Text {
        return Err(ServerError::Unsupported(
            "COPY HEADER available only in CSV mode".into(),
        ));
    }
    if out.delimiter == b'\n'
        || out.delimiter == b'\r'
        || out.delimiter == b'\\' && format == CopyFormat::Text
    {
        return Err(ServerError::InvalidParameter(
            "COPY delimiter cannot be newline, carriage return or (in text) backslash".into(),
        ));
    }
    Ok(out)
}

/// One row as a COPY line: `fields` are the values as text, `None` for
/// NULL.
pub fn encode_line(fields: &[Option<&[u8]>], o: &CopyOptions, out: &mut Vec<u8>) {
    for (i, f) in fields.iter().enumerate() {
        if i > 0 {
            out.push(o.delimiter);
        }
        let Some(v) = f else {
            out.extend_from_slice(o.null.as_bytes());
            continue;
        };
        match o.format {
            CopyFormat::Text => {
                for &b in *v {
                    match b {
                        b'\\' => out.extend_from_slice(b"\\\\"),
                        b'\t' => out.extend_from_slice(b"\\t"),
                        b'\n' => out.extend_from_slice(b"\\n"),
                        b'\r' => out.extend_from_slice(b"\\r"),
                        b if b == o.delimiter => {
                            out.push(b'\\');
                            out.push(b);
                        }
                        b => out.push(b),
                    }
                }
            }
            CopyFormat::Csv => {
                let needs_quotes = v.is_empty() && o.null.is_empty()
                    || *v == o.null.as_bytes()
                    || v.iter()
                        .any(|&b| b == o.delimiter || b == o.quote || b == b'\n' || b == b'\r')
                    || *v == b"\\.";
                if needs_quotes {
                    out.push(o.quote);
                    for &b in *v {
                        if b == o.quote || b == o.escape {
                            out.push(o.escape);
                        }
                        out.push(b);
                    }
                    out.push(o.quote);
                } else {
                    out.extend_from_slice(v);
                }
            }
        }
    }
    out.push(b'\n');
}

/// The header line of CSV output: the column names.
pub fn header_line(names: &[String], o: &CopyOptions) -> Vec<u8> {
    let mut out = Vec::new();
    let fields: Vec<Option<&[u8]>> = names.iter().map(|n| Some(n.as_bytes())).collect();
    encode_line(&fields, o, &mut out);
    out
}

/// The rows of a COPY's data, each a value per column (`None` for NULL).
/// `width` is the number of columns each line must have.
pub fn decode(data: &[u8], o: &CopyOptions, width: usize) -> Result<Vec<Vec<Option<String>>>> {
    let text = std::str::from_utf8(data).map_err(|e| {
        ServerError::CharacterNotInRepertoire(format!(
            "invalid byte sequence for encoding \"UTF8\" in COPY data: {e}"
        ))
    })?;
    let rows = match o.format {
        CopyFormat::Text => decode_text(text, o)?,
        CopyFormat::Csv => decode_csv(text, o)?,
    };
    let skip = usize::from(o.header);
    let rows: Vec<_> = rows.into_iter().skip(skip).collect();
    for (i, row) in rows.iter().enumerate() {
        if row.len() != width {
            let line = i + 1 + skip;
            return Err(ServerError::BadCopyFormat(if row.len() < width {
                format!(
                    "missing data for a column: COPY line {line} has {} of {width} columns",
                    row.len()
                )
            } else {
                format!(
                    "extra data after last expected column: COPY line {line} has {} columns, the table {width}",
                    row.len()
                )
            }));
        }
    }
    Ok(rows)
}

fn decode_text(text: &str, o: &CopyOptions) -> Result<Vec<Vec<Option<String>>>> {
    let mut rows = Vec::new();
    // A final newline ends the last line; it does not start another.
    let body = text.strip_suffix('\n').unwrap_or(text);
    if body.is_empty() {
        return Ok(rows);
    }
    for (n, line) in body.split('\n').enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line == "\\." {
            break;
        }
        let mut row = Vec::new();
        for raw in split_unescaped(line, o.delimiter as char) {
            if raw == o.null {
                row.push(None);
            } else {
                row.push(Some(unescape_text(raw).map_err(|e| {
                    ServerError::BadCopyFormat(format!("COPY line {}: {e}", n + 1))
                })?));
            }
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Splits at each delimiter not escaped by a backslash.
fn split_unescaped(line: &str, delimiter: char) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == delimiter {
            out.push(&line[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&line[start..]);
    out
}

/// Text format's backslash escapes: `\t`, `\n`, `\\`, octal `\NNN`, hex
/// `\xHH`, and a backslash before any other character is that character.
fn unescape_text(raw: &str) -> std::result::Result<String, String> {
    if !raw.contains('\\') {
        return Ok(raw.to_string());
    }
    let mut bytes = Vec::with_capacity(raw.len());
    let b = raw.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] != b'\\' || i + 1 == b.len() {
            bytes.push(b[i]);
            i += 1;
            continue;
        }
        let c = b[i + 1];
        i += 2;
        match c {
            b'b' => bytes.push(8),
            b'f' => bytes.push(12),
            b'n' => bytes.push(b'\n'),
            b'r' => bytes.push(b'\r'),
            b't' => bytes.push(b'\t'),
            b'v' => bytes.push(11),
            b'0'..=b'7' => {
                let mut v = u32::from(c - b'0');
                for _ in 0..2 {
                    match b.get(i) {
                        Some(d @ b'0'..=b'7') => {
                            v = v * 8 + u32::from(d - b'0');
                            i += 1;
                        }
                        _ => break,
                    }
                }
                bytes.push((v & 0xff) as u8);
            }
            b'x' if b.get(i).is_some_and(u8::is_ascii_hexdigit) => {
                let mut v = 0u32;
                for _ in 0..2 {
                    match b.get(i).and_then(|d| (*d as char).to_digit(16)) {
                        Some(d) => {
                            v = v * 16 + d;
                            i += 1;
                        }
                        None => break,
                    }
                }
                bytes.push(v as u8);
            }
            c => bytes.push(c),
        }
    }
    String::from_utf8(bytes).map_err(|_| "an escape makes invalid UTF-8".to_string())
}

fn decode_csv(text: &str, o: &CopyOptions) -> Result<Vec<Vec<Option<String>>>> {
    let (q, e, d) = (o.quote as char, o.escape as char, o.delimiter as char);
    let mut rows = Vec::new();
    let mut row: Vec<Option<String>> = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut in_quotes = false;
    let mut line_start = true;
    let mut chars = text.chars().peekable();
    let mut line = 1;
    let end_field = |row: &mut Vec<Option<String>>, field: &mut String, quoted: bool| {
        let v = std::mem::take(field);
        row.push(if !quoted && v == o.null {
            None
        } else {
            Some(v)
        });
    };
    while let Some(c) = chars.next() {
        if in_quotes {
            if c == e && e != q && chars.peek() == Some(&q) {
                field.push(q);
                chars.next();
            } else if c == q {
                if e == q && chars.peek() == Some(&q) {
                    field.push(q);
                    chars.next();
                } else {
                    in_quotes = false;
                }
            } else {
                if c == '\n' {
                    line += 1;
                }
                field.push(c);
            }
            continue;
        }
        if line_start && c == '\\' && text_at_end_marker(&mut chars.clone()) {
            break;
        }
        line_start = false;
        match c {
            c if c == q => {
                in_quotes = true;
                quoted = true;
            }
            c if c == d => {
                end_field(&mut row, &mut field, quoted);
                quoted = false;
            }
            '\r' if chars.peek() == Some(&'\n') => {}
            '\n' | '\r' => {
                end_field(&mut row, &mut field, quoted);
                quoted = false;
                rows.push(std::mem::take(&mut row));
                line_start = true;
                line += 1;
            }
            c => field.push(c),
        }
    }
    if in_quotes {
        return Err(ServerError::BadCopyFormat(format!(
            "unterminated CSV quoted field at COPY line {line}"
        )));
    }
    if !line_start {
        end_field(&mut row, &mut field, quoted);
        rows.push(row);
    }
    Ok(rows)
}

/// After a `\` at the start of a line: whether it is `\.` alone on it.
fn text_at_end_marker(rest: &mut std::iter::Peekable<std::str::Chars<'_>>) -> bool {
    rest.next() == Some('.') && matches!(rest.next(), None | Some('\n') | Some('\r'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text() -> CopyOptions {
        CopyOptions::new(CopyFormat::Text)
    }

    fn csv() -> CopyOptions {
        CopyOptions::new(CopyFormat::Csv)
    }

    fn s(v: &str) -> Option<String> {
        Some(v.to_string())
    }

    #[test]
    fn text_lines_round_trip_escapes_and_nulls() {
        let o = text();
        let mut out = Vec::new();
        encode_line(&[Some(b"a\tb\\c\nd"), None, Some(b"")], &o, &mut out);
        assert_eq!(out, b"a\\tb\\\\c\\nd\t\\N\t\n");
        let rows = decode(&out, &o, 3).unwrap();
        assert_eq!(rows, vec![vec![s("a\tb\\c\nd"), None, s("")]]);
        let rows = decode(b"1\t\\x41\\101\\q\n2\t\\N\t\\N\n\\.\nignored\n", &o, 2);
        assert!(rows.is_err(), "the second line has three columns");
        let rows = decode(b"1\t\\x41\\101\\q\n\\.\nignored\n", &o, 2).unwrap();
        assert_eq!(rows, vec![vec![s("1"), s("AAq")]]);
    }

    #[test]
    fn csv_tells_quoted_empty_from_null() {
        let o = csv();
        let rows = decode(b"1,,\"\"\r\n2,\"a,\"\"b\"\"\nc\",x\n", &o, 3).unwrap();
        assert_eq!(
            rows,
            vec![
                vec![s("1"), None, s("")],
                vec![s("2"), s("a,\"b\"\nc"), s("x")]
            ]
        );
        let mut out = Vec::new();
        encode_line(&[Some(b"a,\"b\""), None, Some(b"")], &o, &mut out);
        assert_eq!(out, b"\"a,\"\"b\"\"\",,\"\"\n");
        assert!(decode(b"1,\"open\n", &o, 2).is_err());
    }

    #[test]
    fn csv_header_is_skipped_and_end_marker_ends() {
        let o = CopyOptions {
            header: true,
            ..csv()
        };
        let rows = decode(b"id,name\n1,x\n\\.\n", &o, 2).unwrap();
        assert_eq!(rows, vec![vec![s("1"), s("x")]]);
    }

    #[test]
    fn options_check_their_format() {
        let header = [CopyOption::Header(true)];
        assert!(copy_options(&header, &[]).is_err(), "HEADER needs CSV");
        let both = [
            CopyOption::Format(Ident::new("csv")),
            CopyOption::Header(true),
        ];
        assert!(copy_options(&both, &[]).unwrap().header);
        let binary = [CopyOption::Format(Ident::new("binary"))];
        assert!(copy_options(&binary, &[]).is_err());
        let legacy = [CopyLegacyOption::Csv(vec![CopyLegacyCsvOption::Header])];
        let o = copy_options(&[], &legacy).unwrap();
        assert_eq!(
            (o.format, o.header, o.delimiter),
            (CopyFormat::Csv, true, b',')
        );
    }
}

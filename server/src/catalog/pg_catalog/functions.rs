//! The functions clients call on the catalogs (`format_type`,
//! `pg_get_userbyid`, `pg_table_is_visible`, `current_setting`, …) and the
//! `reg*` conversions between names and oids, as DataFusion UDFs over one
//! statement's view of the catalog and session.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Int32Array, Int64Array, ListBuilder, StringArray,
    StringBuilder, TimestampMicrosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int32Type, TimeUnit};
use datafusion::error::{DataFusionError, Result as DfResult};
use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

use super::tables::{Kind, V, row};
use super::*;
use crate::catalog::Entry;
use crate::error::ServerError;

/// What the functions know of the relations: built from the catalog's
/// entries alone (no view is planned), once per statement.
#[derive(Debug, Default)]
pub(super) struct Names {
    /// oid → (schema, name, relkind).
    by_oid: HashMap<i32, (String, String, &'static str)>,
    /// (schema, name) → oid.
    by_name: HashMap<(String, String), i32>,
    /// A view's query, by oid.
    definitions: HashMap<i32, String>,
    /// A primary key's index or constraint oid → its table's schema and
    /// name, and key columns.
    keys: HashMap<i32, (String, String, Vec<String>)>,
}

impl Names {
    fn of(db: &Arc<dyn CatalogView>) -> Self {
        let mut names = Names::default();
        let mut add = |oid: i32, schema: &str, name: &str, kind: &'static str| {
            names
                .by_oid
                .insert(oid, (schema.to_string(), name.to_string(), kind));
            names
                .by_name
                .insert((schema.to_string(), name.to_string()), oid);
        };
        for (i, t) in super::TABLE_NAMES.iter().enumerate() {
            add(system_oid(t, i), "pg_catalog", t, "r");
        }
        for (i, t) in super::information_schema::VIEW_NAMES.iter().enumerate() {
            add(
                INFORMATION_SCHEMA_FIRST_OID + i as i32,
                "information_schema",
                t,
                "v",
            );
        }
        let entries = db.catalog().all();
        for e in &entries {
            let oid = relation_oid(e.id());
            let kind = match e {
                Entry::Table { .. } => "r",
                Entry::View { .. } => "v",
                Entry::MaterializedView { .. } => "m",
                Entry::Source { .. } | Entry::Sink { .. } => "f",
            };
            add(oid, e.schema(), e.name(), kind);
            if let Entry::Table { primary_key, .. } = e
                && !primary_key.is_empty()
            {
                add(
                    index_oid(e.id()),
                    e.schema(),
                    &format!("{}_pkey", e.name()),
                    "i",
                );
            }
        }
        for e in entries {
            let id = e.id();
            let oid = relation_oid(id);
            match e {
                Entry::View { sql, .. } | Entry::MaterializedView { sql, .. } => {
                    names.definitions.insert(oid, sql);
                }
                Entry::Table {
                    name,
                    schema,
                    primary_key,
                    ..
                } if !primary_key.is_empty() => {
                    let key = (schema, name, primary_key);
                    names.keys.insert(index_oid(id), key.clone());
                    names.keys.insert(constraint_oid(id), key);
                }
                _ => {}
            }
        }
        names
    }

    /// `'name'::regclass`: a relation named as SQL names it (`t`,
    /// `public.t`, `"T"`), in the search path when unqualified.
    fn regclass(&self, text: &str, search_path: &[String]) -> Option<i32> {
        if let Ok(oid) = text.trim().parse::<i32>() {
            return Some(oid);
        }
        let parts = split_name(text);
        match parts.as_slice() {
            [name] => ["pg_catalog".to_string()]
                .iter()
                .chain(search_path)
                .find_map(|s| self.by_name.get(&(s.clone(), name.clone())).copied()),
            [schema, name] => self.by_name.get(&(schema.clone(), name.clone())).copied(),
            [_db, schema, name] => self.by_name.get(&(schema.clone(), name.clone())).copied(),
            _ => None,
        }
    }
}

/// The oid of `information_schema`'s first view; the others follow it.
pub(super) const INFORMATION_SCHEMA_FIRST_OID: i32 = 12_500;

/// The oid of a `pg_catalog` table: Postgres's own for those clients name
/// by number, others after them.
pub(super) fn system_oid(table: &str, index: usize) -> i32 {
    match table {
        "pg_type" => 1247,
        "pg_attribute" => 1249,
        "pg_proc" => 1255,
        "pg_class" => 1259,
        "pg_database" => 1262,
        "pg_namespace" => 2615,
        "pg_constraint" => 2606,
        "pg_index" => 2610,
        "pg_description" => 2609,
        "pg_attrdef" => 2604,
        "pg_am" => 2601,
        "pg_authid" => 1260,
        _ => 12_000 + index as i32,
    }
}

/// `a.b`, `"A".b`: the parts of a qualified name, as SQL resolves them.
fn split_name(text: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    let mut was_quoted = false;
    let mut chars = text.trim().chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => {
                quoted = !quoted;
                was_quoted = true;
            }
            '.' if !quoted => {
                parts.push(if was_quoted {
                    cur.clone()
                } else {
                    cur.to_lowercase()
                });
                cur.clear();
                was_quoted = false;
            }
            c => cur.push(c),
        }
    }
    parts.push(if was_quoted { cur } else { cur.to_lowercase() });
    parts
}

type Body = dyn Fn(&[ArrayRef], usize) -> DfResult<ArrayRef> + Send + Sync;
type ReturnType = dyn Fn(&[DataType]) -> DfResult<DataType> + Send + Sync;

/// A function given by a closure over whole columns.
struct Udf {
    name: String,
    signature: Signature,
    returns: Box<ReturnType>,
    body: Box<Body>,
}

impl std::fmt::Debug for Udf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Udf").field("name", &self.name).finish()
    }
}

impl PartialEq for Udf {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Udf {}

impl std::hash::Hash for Udf {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state)
    }
}

impl ScalarUDFImpl for Udf {
    fn name(&self) -> &str {
        &self.name
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> DfResult<DataType> {
        (self.returns)(args)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        let rows = args.number_rows;
        let arrays = args
            .args
            .iter()
            .map(|a| a.to_array(rows))
            .collect::<DfResult<Vec<_>>>()?;
        (self.body)(&arrays, rows).map(ColumnarValue::Array)
    }
}

fn udf(
    name: &str,
    arity: std::ops::RangeInclusive<usize>,
    returns: impl Fn(&[DataType]) -> DfResult<DataType> + Send + Sync + 'static,
    body: impl Fn(&[ArrayRef], usize) -> DfResult<ArrayRef> + Send + Sync + 'static,
) -> ScalarUDF {
    udf_with(Volatility::Stable, name, arity, returns, body)
}

/// A function that does something (`pg_cancel_backend`): volatile, so that
/// planning (a Describe, say) never folds it into a constant by running it.
fn action(
    name: &str,
    arity: std::ops::RangeInclusive<usize>,
    returns: impl Fn(&[DataType]) -> DfResult<DataType> + Send + Sync + 'static,
    body: impl Fn(&[ArrayRef], usize) -> DfResult<ArrayRef> + Send + Sync + 'static,
) -> ScalarUDF {
    udf_with(Volatility::Volatile, name, arity, returns, body)
}

fn udf_with(
    volatility: Volatility,
    name: &str,
    arity: std::ops::RangeInclusive<usize>,
    returns: impl Fn(&[DataType]) -> DfResult<DataType> + Send + Sync + 'static,
    body: impl Fn(&[ArrayRef], usize) -> DfResult<ArrayRef> + Send + Sync + 'static,
) -> ScalarUDF {
    let fname = name.to_string();
    let signature = if *arity.start() == 0 && *arity.end() == 0 {
        Signature::nullary(volatility)
    } else {
        Signature::variadic_any(volatility)
    };
    ScalarUDF::new_from_impl(Udf {
        name: name.to_string(),
        signature,
        returns: Box::new(move |args: &[DataType]| {
            if !arity.contains(&args.len()) {
                return Err(DataFusionError::Plan(format!(
                    "function {fname} does not take {} arguments",
                    args.len()
                )));
            }
            returns(args)
        }),
        body: Box::new(body),
    })
}

/// Column `i` as Int32 (oids), NULL where absent or not a number.
fn ints(args: &[ArrayRef], i: usize, rows: usize) -> DfResult<Int32Array> {
    match args.get(i) {
        Some(a) if a.data_type() == &DataType::Utf8 => {
            let s = a.as_string::<i32>();
            Ok(s.iter()
                .map(|v| v.and_then(|v| v.trim().parse::<i32>().ok()))
                .collect())
        }
        Some(a) => Ok(cast(a, &DataType::Int32)?
            .as_primitive::<Int32Type>()
            .clone()),
        None => Ok(Int32Array::new_null(rows)),
    }
}

fn texts(args: &[ArrayRef], i: usize, rows: usize) -> DfResult<StringArray> {
    match args.get(i) {
        Some(a) => Ok(cast(a, &DataType::Utf8)?.as_string::<i32>().clone()),
        None => Ok(StringArray::new_null(rows)),
    }
}

/// Text as a string literal, as Postgres's `quote_literal` writes it:
/// quotes doubled, and with a backslash, backslashes doubled in an `E''`
/// string.
fn quote_literal(v: &str) -> String {
    let quoted = v.replace('\'', "''");
    if v.contains('\\') {
        format!("E'{}'", quoted.replace('\\', "\\\\"))
    } else {
        format!("'{quoted}'")
    }
}

fn utf8(_: &[DataType]) -> DfResult<DataType> {
    Ok(DataType::Utf8)
}

fn boolean(_: &[DataType]) -> DfResult<DataType> {
    Ok(DataType::Boolean)
}

/// One `format()` result: `arg(n)` is the n-th argument (from 0).
fn pg_format<'a>(fmt: &str, arg: impl Fn(usize) -> DfResult<Option<&'a str>>) -> DfResult<String> {
    let mut out = String::new();
    let mut next = 0;
    let mut chars = fmt.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut digits = String::new();
        while let Some(d) = chars.peek().filter(|d| d.is_ascii_digit()) {
            digits.push(*d);
            chars.next();
        }
        let index = if !digits.is_empty() && chars.peek() == Some(&'$') {
            chars.next();
            digits
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| n - 1)
        } else if digits.is_empty() {
            None
        } else {
            return Err(DataFusionError::Execution(
                "format(): widths are not supported".into(),
            ));
        };
        let kind = chars.next();
        if kind == Some('%') {
            out.push('%');
            continue;
        }
        let n = index.unwrap_or(next);
        next = n + 1;
        let value = arg(n)?;
        match kind {
            Some('s') => out.push_str(value.unwrap_or("")),
            Some('I') => match value {
                Some(v) => out.push_str(&crate::sql::stmt::quote_ident(v)),
                None => {
                    return Err(DataFusionError::Execution(
                        "null values cannot be formatted as an SQL identifier".into(),
                    ));
                }
            },
            Some('L') => match value {
                Some(v) => out.push_str(&quote_literal(v)),
                None => out.push_str("NULL"),
            },
            other => {
                return Err(DataFusionError::Execution(format!(
                    "unrecognized format() type specifier \"{}\"",
                    other.map(String::from).unwrap_or_default()
                )));
            }
        }
    }
    Ok(out)
}

/// A text function of the first argument as an oid.
fn by_oid_text(
    name: &str,
    arity: std::ops::RangeInclusive<usize>,
    f: impl Fn(Option<i32>) -> Option<String> + Send + Sync + 'static,
) -> ScalarUDF {
    udf(name, arity, utf8, move |args, rows| {
        let oids = ints(args, 0, rows)?;
        Ok(Arc::new(oids.iter().map(&f).collect::<StringArray>()))
    })
}

/// A function that is the same for every row.
fn constant(
    name: &str,
    arity: std::ops::RangeInclusive<usize>,
    t: DataType,
    value: V,
) -> ScalarUDF {
    let rt = t.clone();
    udf(
        name,
        arity,
        move |_| Ok(rt.clone()),
        move |_, rows| {
            let a: ArrayRef = match (&t, &value) {
                (DataType::Utf8, V::T(s)) => Arc::new(StringArray::from(vec![s.as_str(); rows])),
                (DataType::Utf8, _) => Arc::new(StringArray::new_null(rows)),
                (DataType::Boolean, V::B(b)) => Arc::new(BooleanArray::from(vec![*b; rows])),
                (DataType::Int32, V::I(i)) => Arc::new(Int32Array::from(vec![*i as i32; rows])),
                (DataType::Int64, V::I(i)) => Arc::new(Int64Array::from(vec![*i; rows])),
                (DataType::Int64, _) => Arc::new(Int64Array::new_null(rows)),
                (DataType::Timestamp(_, _), V::I(us)) => Arc::new(
                    TimestampMicrosecondArray::from(vec![*us; rows])
                        .with_timezone(crate::sql::types::UTC),
                ),
                _ => {
                    return Err(DataFusionError::Internal(format!(
                        "constant {value:?} as {t}"
                    )));
                }
            };
            Ok(a)
        },
    )
}

/// Registers the catalog functions in a statement's context.
pub(super) fn register(
    ctx: &SessionContext,
    db: &Arc<dyn CatalogView>,
    session: &Arc<SessionInfo>,
) {
    let names = Arc::new(Names::of(db));
    let mut fns = vec![
        constant(
            "version",
            0..=0,
            DataType::Utf8,
            V::T(format!(
                "PostgreSQL {} on {}-linux, compiled by rustc",
                crate::SERVER_VERSION,
                std::env::consts::ARCH
            )),
        ),
        constant(
            "current_database",
            0..=0,
            DataType::Utf8,
            session.database.as_str().into(),
        ),
        constant(
            "current_user",
            0..=0,
            DataType::Utf8,
            session.user.as_str().into(),
        ),
        constant(
            "session_user",
            0..=0,
            DataType::Utf8,
            session.user.as_str().into(),
        ),
        constant(
            "pg_backend_pid",
            0..=0,
            DataType::Int32,
            V::I(session.backend_pid as i64),
        ),
        constant(
            "pg_postmaster_start_time",
            0..=0,
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::sql::types::UTC.into())),
            V::I(
                db.started_at()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_micros() as i64),
            ),
        ),
        constant("pg_is_in_recovery", 0..=0, DataType::Boolean, V::B(false)),
        // The one tablespace, pg_default, is the data directory.
        constant(
            "pg_tablespace_location",
            1..=1,
            DataType::Utf8,
            V::T(String::new()),
        ),
        // `ARRAY(SELECT 'p' || x || 's' FROM unnest(a) x)` (see rewrite).
        udf(
            "weir_array_concat_each",
            3..=3,
            |_| {
                Ok(DataType::List(Arc::new(Field::new_list_field(
                    DataType::Utf8,
                    true,
                ))))
            },
            concat_each,
        ),
        // `information_schema._pg_expandarray(a)`: each element with its
        // position, as rows (the rewrite unnests this list of them).
        udf(
            "weir_pg_expandarray",
            1..=1,
            |_| {
                Ok(DataType::new_list(
                    DataType::Struct(expanded_fields()),
                    true,
                ))
            },
            expand_array,
        ),
        // Comments are not kept: every object's description is NULL.
        constant("obj_description", 1..=2, DataType::Utf8, V::N),
        constant("col_description", 2..=2, DataType::Utf8, V::N),
        constant("shobj_description", 2..=2, DataType::Utf8, V::N),
        // Indexes are not kept apart from their table (the primary key
        // is the rows' key), and the database's size is not measured.
        constant("pg_indexes_size", 1..=1, DataType::Int64, V::I(0)),
        constant("pg_database_size", 1..=1, DataType::Int64, V::N),
        constant(
            "pg_relation_is_publishable",
            1..=1,
            DataType::Boolean,
            V::B(false),
        ),
        constant(
            "pg_get_statisticsobjdef_columns",
            1..=1,
            DataType::Utf8,
            V::N,
        ),
        constant("pg_get_partkeydef", 1..=1, DataType::Utf8, V::N),
        constant(
            "pg_function_is_visible",
            1..=1,
            DataType::Boolean,
            V::B(true),
        ),
        constant("pg_type_is_visible", 1..=1, DataType::Boolean, V::B(true)),
        udf("pg_size_pretty", 1..=1, utf8, |args, rows| {
            let n = cast(&args[0], &DataType::Int64)?;
            let n = n.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
            let _ = rows;
            Ok(Arc::new(
                n.iter()
                    .map(|v| v.map(size_pretty))
                    .collect::<StringArray>(),
            ))
        }),
        udf("format_type", 2..=2, utf8, |args, rows| {
            let oids = ints(args, 0, rows)?;
            let mods = ints(args, 1, rows)?;
            Ok(Arc::new(
                oids.iter()
                    .zip(mods.iter())
                    .map(|(o, m)| {
                        o.map(|o| {
                            types::format_type(o, m.unwrap_or(-1)).unwrap_or_else(|| "???".into())
                        })
                    })
                    .collect::<StringArray>(),
            ))
        }),
        udf("pg_get_expr", 2..=3, utf8, |args, rows| {
            Ok(Arc::new(texts(args, 0, rows)?))
        }),
        {
            let info = session.clone();
            by_oid_text("pg_get_userbyid", 1..=1, move |o| {
                o.map(|o| match info.roles.iter().find(|r| r.oid == o) {
                    Some(r) => r.name.clone(),
                    None => format!("unknown (OID={o})"),
                })
            })
        },
        udf("pg_encoding_to_char", 1..=1, utf8, |args, rows| {
            let e = ints(args, 0, rows)?;
            Ok(Arc::new(
                e.iter()
                    .map(|e| {
                        e.map(|e| match e {
                            0 => "SQL_ASCII",
                            6 => "UTF8",
                            _ => "",
                        })
                    })
                    .collect::<StringArray>(),
            ))
        }),
        udf("quote_literal", 1..=1, utf8, |args, rows| {
            let t = texts(args, 0, rows)?;
            Ok(Arc::new(
                t.iter()
                    .map(|v| v.map(quote_literal))
                    .collect::<StringArray>(),
            ))
        }),
        // As `quote_literal`, but NULL is the text `NULL`.
        udf("quote_nullable", 1..=1, utf8, |args, rows| {
            let t = texts(args, 0, rows)?;
            Ok(Arc::new(
                t.iter()
                    .map(|v| Some(v.map_or_else(|| "NULL".to_string(), quote_literal)))
                    .collect::<StringArray>(),
            ))
        }),
        udf("quote_ident", 1..=1, utf8, |args, rows| {
            let t = texts(args, 0, rows)?;
            Ok(Arc::new(
                t.iter()
                    .map(|v| v.map(crate::sql::stmt::quote_ident))
                    .collect::<StringArray>(),
            ))
        }),
        udf(
            "array_upper",
            2..=2,
            |_| Ok(DataType::Int32),
            |args, rows| list_bound(args, rows, true),
        ),
        udf(
            "array_lower",
            2..=2,
            |_| Ok(DataType::Int32),
            |args, rows| list_bound(args, rows, false),
        ),
        udf("pg_typeof", 1..=1, utf8, |args, rows| {
            let (oid, m) = types::of_arrow(args[0].data_type());
            let name = types::format_type(oid, m).unwrap_or_else(|| "unknown".into());
            Ok(Arc::new(StringArray::from(vec![name; rows])))
        }),
        udf("pg_get_function_result", 1..=1, utf8, |args, rows| {
            Ok(Arc::new(StringArray::new_null(ints(args, 0, rows)?.len())))
        }),
        udf("pg_get_function_arguments", 1..=1, utf8, |args, rows| {
            Ok(Arc::new(StringArray::new_null(ints(args, 0, rows)?.len())))
        }),
        udf(
            "pg_get_function_identity_arguments",
            1..=1,
            utf8,
            |args, rows| Ok(Arc::new(StringArray::new_null(ints(args, 0, rows)?.len()))),
        ),
    ];
    // A relation's privileges are the role's grants (a superuser holds
    // all of them, and anyone may read the catalogs); the other kinds are
    // granted to everyone (USAGE on public, CONNECT, EXECUTE), as the
    // defaults of Postgres have them.
    for (name, arity, columns) in [
        ("has_table_privilege", 2..=3, false),
        ("has_any_column_privilege", 2..=3, false),
        ("has_column_privilege", 3..=4, true),
    ] {
        let (info, names) = (session.clone(), names.clone());
        fns.push(udf(name, arity, boolean, move |args, rows| {
            // (user, table, [column,] privilege) or (table, [column,] privilege).
            let full = args.len() == if columns { 4 } else { 3 };
            let user = full.then(|| texts(args, 0, rows)).transpose()?;
            let tables = texts(args, usize::from(full), rows)?;
            let privileges = texts(args, args.len() - 1, rows)?;
            let mut out = Vec::with_capacity(rows);
            for i in 0..rows {
                let role = match &user {
                    Some(u) if u.is_null(i) => None,
                    Some(u) => {
                        let u = u.value(i);
                        info.roles
                            .iter()
                            .find(|r| r.name == u || u.parse() == Ok(r.oid))
                    }
                    None => info.role(),
                };
                if tables.is_null(i) || privileges.is_null(i) {
                    out.push(None);
                    continue;
                }
                let Some(role) = role else {
                    out.push(Some(false));
                    continue;
                };
                let only_select = privileges.value(i).split(',').all(|p| {
                    let p = p.trim().to_uppercase();
                    let p = p.trim_end_matches(" WITH GRANT OPTION");
                    p == "SELECT"
                });
                let oid = names.regclass(tables.value(i), &info.search_path);
                let held = role.superuser
                    || oid.is_some_and(|oid| match names.by_oid.get(&oid) {
                        Some((schema, _, _))
                            if schema == "pg_catalog" || schema == "information_schema" =>
                        {
                            only_select
                        }
                        _ => only_select && role.select.contains(&((oid - 16384).max(0) as u64)),
                    });
                out.push(Some(held));
            }
            Ok(Arc::new(BooleanArray::from(out)))
        }));
    }
    for (name, arity) in [
        ("has_schema_privilege", 2..=3),
        ("has_database_privilege", 2..=3),
        ("has_function_privilege", 2..=3),
        ("has_sequence_privilege", 2..=3),
        ("has_type_privilege", 2..=3),
        ("pg_has_role", 2..=3),
    ] {
        fns.push(constant(name, arity, DataType::Boolean, V::B(true)));
    }
    let s = session.clone();
    // `set_config(name, value, is_local)`: the value as it is kept. Each
    // statement is its own transaction, so a local setting ends with it.
    let info = session.clone();
    fns.push(udf("set_config", 3..=3, utf8, move |args, rows| {
        let (names, values) = (texts(args, 0, rows)?, texts(args, 1, rows)?);
        let local = cast(&args[2], &DataType::Boolean)?;
        let local = local.as_boolean();
        let mut out = Vec::with_capacity(rows);
        for i in 0..rows {
            if names.is_null(i) {
                return Err(DataFusionError::Execution(
                    "SET requires parameter name".into(),
                ));
            }
            let (name, value) = (names.value(i).to_lowercase(), values.value(i));
            let kept = if crate::sql::settings::WEIR_SETTINGS.contains(&name.as_str()) {
                value.to_string()
            } else {
                crate::sql::settings::check(&name, value)
                    .map_err(|e| DataFusionError::External(Box::new(e)))?
            };
            if !local.value(i) {
                info.set_by_query
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push((name, kept.clone()));
            }
            out.push(Some(kept));
        }
        Ok(Arc::new(StringArray::from(out)))
    }));
    fns.push(udf("current_setting", 1..=2, utf8, move |args, rows| {
        let n = texts(args, 0, rows)?;
        let missing_ok = args.get(1).map(|a| {
            cast(a, &DataType::Boolean)
                .ok()
                .and_then(|b| b.as_boolean().iter().next().flatten())
                .unwrap_or(false)
        });
        n.iter()
            .map(|n| match n {
                None => Ok(None),
                Some(n) => match s.setting(n) {
                    Some(v) => Ok(Some(v.to_string())),
                    None if missing_ok == Some(true) => Ok(None),
                    None => Err(DataFusionError::External(Box::new(
                        crate::error::ServerError::UndefinedObject(format!(
                            "unrecognized configuration parameter \"{n}\""
                        )),
                    ))),
                },
            })
            .collect::<DfResult<StringArray>>()
            .map(|a| Arc::new(a) as ArrayRef)
    }));
    let s = session.clone();
    fns.push(udf("current_schema", 0..=0, utf8, move |_, rows| {
        let first = s
            .search_path
            .iter()
            .find(|p| s.namespace_oid(p).is_some())
            .cloned();
        Ok(Arc::new(StringArray::from(vec![first; rows])))
    }));
    let s = session.clone();
    fns.push(udf(
        "current_schemas",
        1..=1,
        |_| {
            Ok(DataType::List(Arc::new(Field::new(
                "item",
                DataType::Utf8,
                true,
            ))))
        },
        move |args, rows| {
            let implicit = cast(&args[0], &DataType::Boolean)?;
            let implicit = implicit.as_boolean();
            let mut b = ListBuilder::new(StringBuilder::new());
            for i in 0..rows {
                if implicit.is_null(i) {
                    b.append_null();
                    continue;
                }
                if implicit.value(i) && !s.search_path.iter().any(|p| p == "pg_catalog") {
                    b.values().append_value("pg_catalog");
                }
                for p in s
                    .search_path
                    .iter()
                    .filter(|p| s.namespace_oid(p).is_some())
                {
                    b.values().append_value(p);
                }
                b.append(true);
            }
            Ok(Arc::new(b.finish()))
        },
    ));
    // `parse_ident('a."B".c')`: the parts of a qualified name, unquoted
    // parts in lower case (Grafana splits a table's name with it).
    fns.push(udf(
        "parse_ident",
        1..=2,
        |_| {
            Ok(DataType::List(Arc::new(Field::new(
                "item",
                DataType::Utf8,
                true,
            ))))
        },
        |args, rows| {
            let texts = texts(args, 0, rows)?;
            let mut b = ListBuilder::new(StringBuilder::new());
            for t in texts.iter() {
                match t {
                    Some(t) => {
                        for part in split_name(t) {
                            b.values().append_value(part);
                        }
                        b.append(true);
                    }
                    None => b.append_null(),
                }
            }
            Ok(Arc::new(b.finish()))
        },
    ));
    let (n, s) = (names.clone(), session.clone());
    fns.push(udf(
        "pg_table_is_visible",
        1..=1,
        boolean,
        move |args, rows| {
            let oids = ints(args, 0, rows)?;
            Ok(Arc::new(
                oids.iter()
                    .map(|o| {
                        o.map(|o| {
                            // Visible: the first relation of its name along
                            // the path (pg_catalog first).
                            n.by_oid.get(&o).is_some_and(|(schema, name, _)| {
                                std::iter::once("pg_catalog")
                                    .chain(s.search_path.iter().map(String::as_str))
                                    .find(|p| {
                                        n.by_name.contains_key(&(p.to_string(), name.clone()))
                                    })
                                    == Some(schema.as_str())
                            })
                        })
                    })
                    .collect::<BooleanArray>(),
            ))
        },
    ));
    let n = names.clone();
    fns.push(udf("pg_get_viewdef", 1..=2, utf8, move |args, rows| {
        let s = session_less_regclass(&n, args, rows)?;
        Ok(Arc::new(
            s.iter()
                .map(|o| o.and_then(|o| n.definitions.get(&o).map(|d| format!(" {d};"))))
                .collect::<StringArray>(),
        ))
    }));
    let n = names.clone();
    // `pg_get_indexdef(index [, column, pretty])`: the index's definition,
    // or with a column number above 0 that key column's name.
    fns.push(udf("pg_get_indexdef", 1..=3, utf8, move |args, rows| {
        let oids = ints(args, 0, rows)?;
        let columns = ints(args, 1, rows)?;
        let out = (0..rows)
            .map(|i| {
                let oid = (!oids.is_null(i)).then(|| oids.value(i))?;
                let (schema, table, key) = n.keys.get(&oid)?;
                match (!columns.is_null(i)).then(|| columns.value(i)) {
                    Some(c) if c > 0 => key
                        .get(c as usize - 1)
                        .map(|k| crate::sql::stmt::quote_ident(k)),
                    _ => Some(super::tables::key_index_def(schema, table, key)),
                }
            })
            .collect::<StringArray>();
        Ok(Arc::new(out))
    }));
    // Postgres's `format(text, …)`: `%s` (NULL as nothing), `%I` (an
    // identifier, quoted where it must be), `%L` (a literal, NULL as
    // NULL), `%%`, each optionally `%n$` for the n-th argument.
    fns.push(udf("format", 1..=100, utf8, |args, rows| {
        let fmts = texts(args, 0, rows)?;
        let values = (1..args.len())
            .map(|i| texts(args, i, rows))
            .collect::<DfResult<Vec<_>>>()?;
        let mut out = Vec::with_capacity(rows);
        for r in 0..rows {
            if fmts.is_null(r) {
                out.push(None);
                continue;
            }
            let arg = |n: usize| -> DfResult<Option<&str>> {
                let a = values.get(n).ok_or_else(|| {
                    DataFusionError::Execution("too few arguments for format()".into())
                })?;
                Ok((!a.is_null(r)).then(|| a.value(r)))
            };
            out.push(Some(pg_format(fmts.value(r), arg)?));
        }
        Ok(Arc::new(StringArray::from(out)))
    }));
    let n = names.clone();
    fns.push(by_oid_text("pg_get_constraintdef", 1..=2, move |o| {
        let (_, _, key) = n.keys.get(&o?)?;
        Some(super::tables::key_constraint_def(key))
    }));
    // The reg* conversions the rewrite turns `::regclass` (and kin) into:
    // from text, the object's oid; from an oid, its name.
    for kind in [
        "regclass",
        "regtype",
        "regnamespace",
        "regproc",
        "regrole",
        "to_regclass",
        "to_regtype",
    ] {
        let (n, s) = (names.clone(), session.clone());
        fns.push(udf(
            &format!("weir_{kind}"),
            1..=1,
            move |args| {
                Ok(
                    if matches!(
                        args[0],
                        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
                    ) && kind != "regproc"
                    {
                        DataType::Int32
                    } else {
                        DataType::Utf8
                    },
                )
            },
            move |args, rows| reg_convert(kind, &n, &s, &args[0], rows),
        ));
    }
    // Relation sizes: a table's rows (`pg_relation_size`), with its change
    // log (`pg_table_size`, `pg_total_relation_size`), in bytes as written;
    // 0 for a view, which stores nothing; NULL for what Weir does not
    // measure (a materialized view's state lives with its job's tasks).
    for (name, arity, with_log) in [
        ("pg_relation_size", 1..=2, false),
        ("pg_table_size", 1..=1, true),
        ("pg_total_relation_size", 1..=1, true),
    ] {
        let (n, db) = (names.clone(), db.clone());
        fns.push(udf(
            name,
            arity,
            |_| Ok(DataType::Int64),
            move |args, rows| {
                let oids = session_less_regclass(&n, args, rows)?;
                let mut out = Vec::with_capacity(rows);
                for oid in oids.iter() {
                    let size = match oid.and_then(|o| relation_entry(db.as_ref(), o)) {
                        Some(Entry::Table { id, .. }) => {
                            let (rows, log) = db
                                .cluster()
                                .tables
                                .stored_bytes(id)
                                .map_err(|e| DataFusionError::External(Box::new(e)))?;
                            Some((rows + if with_log { log } else { 0 }) as i64)
                        }
                        Some(Entry::View { .. }) => Some(0),
                        _ => None,
                    };
                    out.push(size);
                }
                Ok(Arc::new(Int64Array::from(out)))
            },
        ));
    }
    // `pg_cancel_backend(pid)`, `pg_terminate_backend(pid [, timeout])`:
    // true when the backend was signalled, false when there is none.
    for (name, arity, terminate) in [
        ("pg_cancel_backend", 1..=1, false),
        ("pg_terminate_backend", 1..=2, true),
    ] {
        let (info, db) = (session.clone(), db.clone());
        fns.push(action(name, arity, boolean, move |args, rows| {
            let pids = ints(args, 0, rows)?;
            let role = info.role().ok_or_else(|| {
                DataFusionError::Execution(format!("role \"{}\" does not exist", info.user))
            })?;
            let mut out = Vec::with_capacity(rows);
            for pid in pids.iter() {
                let Some(pid) = pid else {
                    out.push(None);
                    continue;
                };
                match db.activity().signal(pid, role, &info.roles, terminate) {
                    crate::catalog::activity::Signalled::Sent => out.push(Some(true)),
                    crate::catalog::activity::Signalled::NoSuchBackend => out.push(Some(false)),
                    crate::catalog::activity::Signalled::NotAllowed(why) => {
                        return Err(DataFusionError::External(Box::new(
                            ServerError::InsufficientPrivilege(why),
                        )));
                    }
                }
            }
            Ok(Arc::new(BooleanArray::from(out)))
        }));
    }
    for f in fns {
        ctx.register_udf(f);
    }
}

/// The catalog entry whose relation oid is `oid`.
fn relation_entry(db: &dyn CatalogView, oid: i32) -> Option<Entry> {
    let id = u64::try_from(oid.checked_sub(FIRST_USER_OID)?).ok()?;
    db.catalog().get(id)
}

/// `pg_get_viewdef` takes an oid or a name.
fn session_less_regclass(n: &Names, args: &[ArrayRef], rows: usize) -> DfResult<Int32Array> {
    if args[0].data_type() == &DataType::Utf8 {
        let t = texts(args, 0, rows)?;
        Ok(t.iter()
            .map(|t| t.and_then(|t| n.regclass(t, &["public".to_string()])))
            .collect())
    } else {
        ints(args, 0, rows)
    }
}

fn reg_convert(
    kind: &str,
    n: &Names,
    s: &SessionInfo,
    arg: &ArrayRef,
    rows: usize,
) -> DfResult<ArrayRef> {
    let is_text = matches!(
        arg.data_type(),
        DataType::Utf8 | DataType::Utf8View | DataType::LargeUtf8
    );
    if kind == "regproc" {
        // Functions are named by name in Weir's catalogs; none is `-`.
        let names = cast(arg, &DataType::Utf8)?;
        return Ok(Arc::new(
            names
                .as_string::<i32>()
                .iter()
                .map(|v| v.map(|v| if v == "0" { "-" } else { v }))
                .collect::<StringArray>(),
        ));
    }
    if is_text {
        let t = cast(arg, &DataType::Utf8)?;
        let t = t.as_string::<i32>();
        let mut out = Vec::with_capacity(rows);
        for v in t.iter() {
            let Some(v) = v else {
                out.push(None);
                continue;
            };
            let oid = match kind {
                "regclass" | "to_regclass" => n.regclass(v, &s.search_path),
                "regtype" | "to_regtype" => {
                    let name = v.trim().trim_start_matches("pg_catalog.");
                    types::TYPES
                        .iter()
                        .find(|t| t.name == name || t.sql_name == name)
                        .map(|t| t.oid)
                        .or_else(|| name.parse().ok())
                }
                "regnamespace" => s
                    .namespace_oid(v.trim().trim_matches('"'))
                    .or_else(|| v.trim().parse().ok()),
                "regrole" => s
                    .roles
                    .iter()
                    .find(|r| r.name == v.trim().trim_matches('"'))
                    .map(|r| r.oid)
                    .or_else(|| v.trim().parse().ok()),
                _ => None,
            };
            match oid {
                Some(o) => out.push(Some(o)),
                None if kind.starts_with("to_") => out.push(None),
                None => {
                    let e = match kind {
                        "regclass" => {
                            ServerError::UndefinedTable(format!("relation \"{v}\" does not exist"))
                        }
                        "regtype" => {
                            ServerError::UndefinedObject(format!("type \"{v}\" does not exist"))
                        }
                        "regnamespace" => {
                            ServerError::InvalidSchemaName(format!("schema \"{v}\" does not exist"))
                        }
                        _ => ServerError::UndefinedObject(format!("role \"{v}\" does not exist")),
                    };
                    return Err(DataFusionError::External(Box::new(e)));
                }
            }
        }
        return Ok(Arc::new(Int32Array::from(out)));
    }
    let oids = ints(std::slice::from_ref(arg), 0, rows)?;
    Ok(Arc::new(
        oids.iter()
            .map(|o| {
                // Postgres prints no object (oid 0) as `-`.
                o.map(|o| match kind {
                    _ if o == 0 => "-".to_string(),
                    "regtype" => types::format_type(o, -1).unwrap_or_else(|| o.to_string()),
                    "regnamespace" => s
                        .namespaces
                        .iter()
                        .find(|(oid, _)| *oid == o)
                        .map_or_else(|| o.to_string(), |(_, n)| crate::sql::stmt::quote_ident(n)),
                    "regrole" => s
                        .roles
                        .iter()
                        .find(|r| r.oid == o)
                        .map_or_else(|| o.to_string(), |r| crate::sql::stmt::quote_ident(&r.name)),
                    _ => match n.by_oid.get(&o) {
                        Some((schema, name, _))
                            if schema == "pg_catalog" || s.search_path.contains(schema) =>
                        {
                            crate::sql::stmt::quote_ident(name)
                        }
                        Some((schema, name, _)) => format!(
                            "{}.{}",
                            crate::sql::stmt::quote_ident(schema),
                            crate::sql::stmt::quote_ident(name)
                        ),
                        None => o.to_string(),
                    },
                })
            })
            .collect::<StringArray>(),
    ))
}

/// Each element of the list `args[1]` between the texts `args[0]` and
/// `args[2]`; an absent list is an empty one, as `ARRAY(SELECT …)` over no
/// rows is.
fn concat_each(args: &[ArrayRef], rows: usize) -> DfResult<ArrayRef> {
    let (prefix, suffix) = (texts(args, 0, rows)?, texts(args, 2, rows)?);
    let mut out = ListBuilder::new(StringBuilder::new());
    let list = match args[1].data_type() {
        DataType::List(_) => Some(args[1].as_list::<i32>()),
        _ => None,
    };
    for i in 0..rows {
        if let Some(l) = list.filter(|l| !l.is_null(i)) {
            let items = cast(&l.value(i), &DataType::Utf8)?;
            for item in items.as_string::<i32>() {
                out.values().append_option(
                    item.map(|v| format!("{}{v}{}", prefix.value(i), suffix.value(i))),
                );
            }
        }
        out.append(true);
    }
    Ok(Arc::new(out.finish()))
}

/// `_pg_expandarray`'s record: the element `x` and its position `n`.
fn expanded_fields() -> datafusion::arrow::datatypes::Fields {
    vec![
        Field::new("x", DataType::Int32, true),
        Field::new("n", DataType::Int32, false),
    ]
    .into()
}

fn expand_array(args: &[ArrayRef], rows: usize) -> DfResult<ArrayRef> {
    use datafusion::arrow::array::{ListArray, StructArray};
    use datafusion::arrow::buffer::OffsetBuffer;
    let DataType::List(_) = args[0].data_type() else {
        return Err(DataFusionError::Plan(
            "_pg_expandarray takes an array".into(),
        ));
    };
    let list = args[0].as_list::<i32>();
    let values = cast(list.values(), &DataType::Int32)?;
    let mut positions = Vec::with_capacity(values.len());
    let mut lengths = Vec::with_capacity(rows);
    for i in 0..rows {
        let len = if list.is_null(i) {
            0
        } else {
            list.value_length(i) as usize
        };
        lengths.push(len);
        positions.extend(1..=len as i32);
    }
    // The kept elements: each row's slice of the values, in order.
    let offsets = list.value_offsets();
    let take: datafusion::arrow::array::UInt32Array = (0..rows)
        .flat_map(|i| {
            let start = offsets[i] as u32;
            (0..lengths[i] as u32).map(move |k| start + k)
        })
        .collect();
    let xs = datafusion::arrow::compute::take(&values, &take, None)?;
    let records = StructArray::try_new(
        expanded_fields(),
        vec![xs, Arc::new(Int32Array::from(positions))],
        None,
    )?;
    Ok(Arc::new(ListArray::try_new(
        Arc::new(Field::new_list_field(
            DataType::Struct(expanded_fields()),
            true,
        )),
        OffsetBuffer::from_lengths(lengths),
        Arc::new(records),
        None,
    )?))
}

fn list_bound(args: &[ArrayRef], rows: usize, upper: bool) -> DfResult<ArrayRef> {
    let dims = ints(args, 1, rows)?;
    let out: Int32Array = match args[0].data_type() {
        DataType::List(_) => {
            let l = args[0].as_list::<i32>();
            (0..rows)
                .map(|i| {
                    if l.is_null(i) || dims.value(i) != 1 || dims.is_null(i) {
                        return None;
                    }
                    let len = l.value_length(i);
                    (len > 0).then_some(if upper { len } else { 1 })
                })
                .collect()
        }
        _ => Int32Array::new_null(rows),
    };
    Ok(Arc::new(out))
}

fn size_pretty(bytes: i64) -> String {
    let mut v = bytes as f64;
    for unit in ["bytes", "kB", "MB", "GB", "TB"] {
        if v.abs() < 10_240.0 || unit == "TB" {
            return format!("{} {unit}", v.round() as i64);
        }
        v /= 1024.0;
    }
    unreachable!()
}

/// `pg_proc`: the functions DataFusion offers, in `pg_catalog`.
pub(super) fn proc_rows(db: &Arc<dyn CatalogView>, cols: &[(&str, Kind)]) -> Vec<Vec<V>> {
    let _ = db;
    let ctx = planner::context::new_context();
    let state = ctx.state();
    let mut names: Vec<(String, &str)> = state
        .scalar_functions()
        .keys()
        .map(|n| (n.clone(), "f"))
        .chain(state.aggregate_functions().keys().map(|n| (n.clone(), "a")))
        .chain(state.window_functions().keys().map(|n| (n.clone(), "w")))
        .collect();
    names.sort();
    names.dedup_by(|a, b| a.0 == b.0);
    names
        .into_iter()
        .enumerate()
        .map(|(i, (name, kind))| {
            row(
                cols,
                vec![
                    ("oid", V::I(20_000 + i as i64)),
                    ("proname", name.into()),
                    ("pronamespace", PG_CATALOG_OID.into()),
                    ("proowner", SUPERUSER_OID.into()),
                    ("prolang", 12.into()),
                    ("procost", V::F(1.0)),
                    ("prorows", V::F(0.0)),
                    ("provariadic", 0.into()),
                    ("prosupport", "-".into()),
                    ("prokind", kind.into()),
                    ("prosecdef", false.into()),
                    ("proleakproof", false.into()),
                    ("proisstrict", false.into()),
                    ("proretset", false.into()),
                    ("provolatile", "i".into()),
                    ("proparallel", "s".into()),
                    ("pronargs", 0.into()),
                    ("pronargdefaults", 0.into()),
                    ("prorettype", 2283.into()),
                    ("proargtypes", V::A(Vec::new())),
                ],
            )
        })
        .collect()
}

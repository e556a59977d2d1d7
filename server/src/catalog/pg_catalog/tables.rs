//! The rows of `pg_catalog`'s tables, built from Weir's catalog.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, BooleanBuilder, Float32Builder, Int16Builder, Int32Builder, Int64Builder,
    ListBuilder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, TimeUnit};
use datafusion::error::{DataFusionError, Result as DfResult};

use super::columns::PG_CATALOG;
use super::types::{self, TYPES};
use super::*;
use crate::catalog::Entry;
pub(super) use crate::sql::pg_tables::{EMPTY_TABLES, TABLE_NAMES};

/// How a catalog column is stored in Arrow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// `oid` (and `regtype`): Int32, reported to clients as `oid`.
    Oid,
    Int2,
    Int4,
    Int8,
    Float4,
    Bool,
    /// `name`, `text`, `regproc` (as the function's name), `pg_node_tree`
    /// (as SQL text).
    Text,
    /// Postgres's one-byte `"char"`.
    Char,
    Timestamptz,
    TextArray,
    Int2Array,
    OidArray,
}

/// One value of a catalog row.
#[derive(Debug, Clone)]
pub(super) enum V {
    N,
    I(i64),
    F(f64),
    B(bool),
    T(String),
    A(Vec<V>),
}

impl From<&str> for V {
    fn from(s: &str) -> Self {
        V::T(s.to_string())
    }
}

impl From<String> for V {
    fn from(s: String) -> Self {
        V::T(s)
    }
}

impl From<i32> for V {
    fn from(i: i32) -> Self {
        V::I(i as i64)
    }
}

impl From<i64> for V {
    fn from(i: i64) -> Self {
        V::I(i)
    }
}

impl From<bool> for V {
    fn from(b: bool) -> Self {
        V::B(b)
    }
}

impl<T: Into<V>> From<Option<T>> for V {
    fn from(o: Option<T>) -> Self {
        o.map_or(V::N, Into::into)
    }
}

fn field(name: &str, kind: Kind) -> Field {
    let item = |t: DataType| Arc::new(Field::new("item", t, true));
    let (t, meta) = match kind {
        Kind::Oid => (DataType::Int32, Some(("pg.oid_alias", "oid"))),
        Kind::Int2 => (DataType::Int16, None),
        Kind::Int4 => (DataType::Int32, None),
        Kind::Int8 => (DataType::Int64, None),
        Kind::Float4 => (DataType::Float32, None),
        Kind::Bool => (DataType::Boolean, None),
        Kind::Text => (DataType::Utf8, None),
        Kind::Char => (DataType::Utf8, Some(("pg.char", "true"))),
        Kind::Timestamptz => (
            DataType::Timestamp(TimeUnit::Microsecond, Some(crate::sql::types::UTC.into())),
            None,
        ),
        Kind::TextArray => (DataType::List(item(DataType::Utf8)), None),
        Kind::Int2Array => (DataType::List(item(DataType::Int16)), None),
        Kind::OidArray => (DataType::List(item(DataType::Int32)), None),
    };
    let f = Field::new(name, t, true);
    match meta {
        Some((k, v)) => f.with_metadata(HashMap::from([(k.to_string(), v.to_string())])),
        None => f,
    }
}

/// A batch of `columns` from `rows` (each row a value per column).
pub(super) fn batch(columns: &[(&str, Kind)], rows: Vec<Vec<V>>) -> DfResult<RecordBatch> {
    let schema: SchemaRef = Arc::new(Schema::new(
        columns
            .iter()
            .map(|(n, k)| field(n, *k))
            .collect::<Vec<_>>(),
    ));
    let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
    for (i, (name, kind)) in columns.iter().enumerate() {
        let values = rows.iter().map(|r| r.get(i).unwrap_or(&V::N));
        let bad = |v: &V| {
            DataFusionError::Internal(format!("catalog column {name} ({kind:?}) given {v:?}"))
        };
        let array: ArrayRef = match kind {
            Kind::Oid | Kind::Int4 => {
                let mut b = Int32Builder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::I(i) => b.append_value(*i as i32),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Int2 => {
                let mut b = Int16Builder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::I(i) => b.append_value(*i as i16),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Int8 => {
                let mut b = Int64Builder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::I(i) => b.append_value(*i),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Float4 => {
                let mut b = Float32Builder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::F(f) => b.append_value(*f as f32),
                        V::I(i) => b.append_value(*i as f32),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Bool => {
                let mut b = BooleanBuilder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::B(x) => b.append_value(*x),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Text | Kind::Char => {
                let mut b = StringBuilder::new();
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::T(s) => b.append_value(s),
                        V::I(i) => b.append_value(i.to_string()),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Timestamptz => {
                let mut b =
                    TimestampMicrosecondBuilder::new().with_timezone(crate::sql::types::UTC);
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::I(us) => b.append_value(*us),
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::TextArray => {
                let mut b = ListBuilder::new(StringBuilder::new());
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::A(items) => {
                            for item in items {
                                match item {
                                    V::T(s) => b.values().append_value(s),
                                    _ => b.values().append_null(),
                                }
                            }
                            b.append(true);
                        }
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::Int2Array => {
                let mut b = ListBuilder::new(Int16Builder::new());
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::A(items) => {
                            for item in items {
                                match item {
                                    V::I(i) => b.values().append_value(*i as i16),
                                    _ => b.values().append_null(),
                                }
                            }
                            b.append(true);
                        }
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
            Kind::OidArray => {
                let mut b = ListBuilder::new(Int32Builder::new());
                for v in values {
                    match v {
                        V::N => b.append_null(),
                        V::A(items) => {
                            for item in items {
                                match item {
                                    V::I(i) => b.values().append_value(*i as i32),
                                    _ => b.values().append_null(),
                                }
                            }
                            b.append(true);
                        }
                        other => return Err(bad(other)),
                    }
                }
                Arc::new(b.finish())
            }
        };
        arrays.push(array);
    }
    let list_fields_match = schema.fields().iter().zip(&arrays).all(|(f, a)| {
        !matches!(f.data_type(), DataType::List(_)) || f.data_type() == a.data_type()
    });
    if !list_fields_match {
        return Err(DataFusionError::Internal(
            "catalog list column of the wrong type".into(),
        ));
    }
    Ok(RecordBatch::try_new(schema, arrays)?)
}

/// A table's column list, as Postgres 15 has it.
pub(super) fn columns_of(
    list: &'static [(&'static str, &'static [(&'static str, Kind)])],
    table: &str,
) -> Option<&'static [(&'static str, Kind)]> {
    list.iter().find(|(t, _)| *t == table).map(|(_, c)| *c)
}

/// A row given as `(column, value)` pairs; the columns not named are NULL.
pub(super) fn row(columns: &[(&str, Kind)], values: Vec<(&str, V)>) -> Vec<V> {
    for (name, _) in &values {
        debug_assert!(
            columns.iter().any(|(c, _)| c == name),
            "no catalog column {name}"
        );
    }
    row_of_some(columns, values)
}

/// A row from `values`, of which `columns` need not have every one: the
/// role tables (`pg_roles`, `pg_authid`, `pg_user`, `pg_shadow`) describe
/// the same roles with different columns.
fn row_of_some(columns: &[(&str, Kind)], values: Vec<(&str, V)>) -> Vec<V> {
    let mut out = vec![V::N; columns.len()];
    for (name, v) in values {
        if let Some(i) = columns.iter().position(|(c, _)| *c == name) {
            out[i] = v;
        }
    }
    out
}

/// A relation of Weir's catalog, as the catalogs describe it.
#[derive(Debug, Clone)]
pub(super) struct Relation {
    pub id: u64,
    pub oid: i32,
    pub name: String,
    pub schema: String,
    pub namespace: i32,
    /// `r`, `v`, `m` or `f`.
    pub relkind: &'static str,
    pub columns: Vec<Attribute>,
    /// Positions (0-based) of the primary key's columns.
    pub primary_key: Vec<usize>,
    /// A view's query.
    pub definition: Option<String>,
    /// A source's or sink's connector: its foreign server.
    pub connector: Option<String>,
}

#[derive(Debug, Clone)]
pub(super) struct Attribute {
    pub name: String,
    pub type_oid: i32,
    pub typmod: i32,
    pub not_null: bool,
    pub default: Option<String>,
}

impl Relation {
    pub(super) fn key_name(&self) -> String {
        format!("{}_pkey", self.name)
    }

    pub(super) fn key_columns(&self) -> Vec<String> {
        self.primary_key
            .iter()
            .map(|i| self.columns[*i].name.clone())
            .collect()
    }
}

/// Every relation of the catalog. A view whose query no longer plans is
/// listed without columns.
pub(super) async fn relations(db: &Arc<dyn CatalogView>) -> Vec<Relation> {
    let mut out = Vec::new();
    let schemas = db.catalog().schemas();
    let namespace = |schema: &str| match schemas.iter().find(|(n, _)| n == schema) {
        Some((_, id)) if schema != crate::sql::stmt::DEFAULT_SCHEMA => relation_oid(*id),
        _ => PUBLIC_OID,
    };
    let mut entries = db.catalog().all();
    entries.sort_by_key(|e| e.id());
    for entry in entries {
        let (relkind, declared, key, sql) = match &entry {
            Entry::Table {
                columns,
                primary_key,
                ..
            } => ("r", Some(columns.clone()), primary_key.clone(), None),
            Entry::Source { columns, .. } => ("f", Some(columns.clone()), Vec::new(), None),
            Entry::View { sql, .. } => ("v", None, Vec::new(), Some(sql.clone())),
            Entry::MaterializedView { sql, .. } => ("m", None, Vec::new(), Some(sql.clone())),
            Entry::Sink { sql, .. } => ("f", None, Vec::new(), Some(sql.clone())),
        };
        let columns = match (&declared, &sql) {
            (Some(cols), _) => cols
                .iter()
                .map(|c| {
                    let (type_oid, typmod) =
                        types::of_declared(&c.sql_type).unwrap_or((types::TEXT, -1));
                    Attribute {
                        name: c.name.clone(),
                        type_oid,
                        typmod,
                        not_null: c.not_null || key.contains(&c.name),
                        default: c.default.clone(),
                    }
                })
                .collect(),
            (None, Some(sql)) => match db.clone().view_schema(entry.id(), sql).await {
                Ok(schema) => schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let (type_oid, typmod) = types::of_arrow(f.data_type());
                        Attribute {
                            name: f.name().clone(),
                            type_oid,
                            typmod,
                            not_null: false,
                            default: None,
                        }
                    })
                    .collect(),
                Err(_) => Vec::new(),
            },
            (None, None) => Vec::new(),
        };
        let primary_key = key
            .iter()
            .filter_map(|k| columns.iter().position(|c: &Attribute| &c.name == k))
            .collect();
        out.push(Relation {
            id: entry.id(),
            oid: relation_oid(entry.id()),
            name: entry.name().to_string(),
            schema: entry.schema().to_string(),
            namespace: namespace(entry.schema()),
            relkind,
            columns,
            primary_key,
            // A sink's query is not a view's definition.
            definition: if matches!(entry, Entry::Sink { .. }) {
                None
            } else {
                sql
            },
            connector: match &entry {
                Entry::Source { connector, .. } | Entry::Sink { connector, .. } => {
                    Some(connector.connector.clone())
                }
                _ => None,
            },
        });
    }
    out
}

/// What Postgres has as views among `pg_catalog`'s relations (the rest
/// are tables).
const SYSTEM_VIEWS: &[&str] = &[
    "pg_group",
    "pg_indexes",
    "pg_matviews",
    "pg_roles",
    "pg_sequences",
    "pg_settings",
    "pg_shadow",
    "pg_stat_activity",
    "pg_stat_all_tables",
    "pg_stat_user_tables",
    "pg_statio_user_tables",
    "pg_tables",
    "pg_timezone_names",
    "pg_user",
    "pg_views",
];

/// The type oid of a catalog column of `kind`.
fn kind_oid(kind: Kind) -> i32 {
    match kind {
        Kind::Oid => 26,
        Kind::Int2 => 21,
        Kind::Int4 => 23,
        Kind::Int8 => 20,
        Kind::Float4 => 700,
        Kind::Bool => 16,
        Kind::Text => 25,
        Kind::Char => 18,
        Kind::Timestamptz => 1184,
        Kind::TextArray => 1009,
        Kind::Int2Array => 1005,
        Kind::OidArray => 1028,
    }
}

/// `pg_catalog`'s tables and views and `information_schema`'s views, as
/// `pg_class` and `pg_attribute` describe them, so that psql's `\dS` and
/// `\d pg_class` find them. The other catalogs (`pg_tables`,
/// `information_schema.tables`, …) list Weir's own relations only.
pub(super) fn system_relations() -> Vec<Relation> {
    let relation =
        |oid, name: &str, schema: &str, namespace, relkind, cols: &[(&str, Kind)]| Relation {
            id: 0,
            oid,
            name: name.to_string(),
            schema: schema.to_string(),
            namespace,
            relkind,
            columns: cols
                .iter()
                .map(|(name, kind)| Attribute {
                    name: name.to_string(),
                    type_oid: kind_oid(*kind),
                    typmod: -1,
                    not_null: false,
                    default: None,
                })
                .collect(),
            primary_key: Vec::new(),
            definition: None,
            connector: None,
        };
    let catalog = TABLE_NAMES.iter().enumerate().filter_map(|(i, t)| {
        let relkind = if SYSTEM_VIEWS.contains(t) { "v" } else { "r" };
        let cols = columns_of(PG_CATALOG, t)?;
        Some(relation(
            super::functions::system_oid(t, i),
            t,
            "pg_catalog",
            PG_CATALOG_OID,
            relkind,
            cols,
        ))
    });
    let information_schema = super::information_schema::VIEW_NAMES
        .iter()
        .enumerate()
        .filter_map(|(i, t)| {
            let cols = columns_of(super::columns::INFORMATION_SCHEMA, t)?;
            Some(relation(
                super::functions::INFORMATION_SCHEMA_FIRST_OID + i as i32,
                t,
                "information_schema",
                INFORMATION_SCHEMA_OID,
                "v",
                cols,
            ))
        });
    catalog.chain(information_schema).collect()
}

/// The namespaces: `(oid, name)`.
pub(super) const NAMESPACES: &[(i32, &str)] = &[
    (PG_CATALOG_OID, "pg_catalog"),
    (PUBLIC_OID, "public"),
    (INFORMATION_SCHEMA_OID, "information_schema"),
    (WEIR_CATALOG_OID, crate::catalog::system::SCHEMA),
];

/// Sources and sinks are foreign tables of one foreign-data wrapper,
/// `weir`, with a foreign server per connector.
const FDW_OID: i32 = 13_100;

fn server_oid(index: usize) -> i32 {
    FDW_OID + 1 + index as i32
}

/// The connectors, sources' and sinks', by name.
fn connectors() -> Vec<&'static str> {
    let mut all: Vec<&str> = executor::connectors::SOURCE_CONNECTORS
        .iter()
        .chain(executor::sinks::SINK_CONNECTORS)
        .copied()
        .collect();
    all.sort();
    all.dedup();
    all
}

/// Builds the table `name` of `pg_catalog`, or `None` if there is none.
pub(super) async fn build(
    db: &Arc<dyn CatalogView>,
    session: &SessionInfo,
    name: &str,
) -> DfResult<Option<RecordBatch>> {
    let Some(cols) = columns_of(PG_CATALOG, name) else {
        return Ok(None);
    };
    if EMPTY_TABLES.contains(&name) {
        return batch(cols, Vec::new()).map(Some);
    }
    let r = |values: Vec<(&str, V)>| row(cols, values);
    let owner = || V::from(SUPERUSER_OID);
    let rows: Vec<Vec<V>> = match name {
        "pg_am" => vec![
            r(vec![
                ("oid", 2.into()),
                ("amname", "heap".into()),
                ("amhandler", "heap_tableam_handler".into()),
                ("amtype", "t".into()),
            ]),
            r(vec![
                ("oid", 403.into()),
                ("amname", "btree".into()),
                ("amhandler", "bthandler".into()),
                ("amtype", "i".into()),
            ]),
        ],
        "pg_namespace" => session
            .namespaces
            .iter()
            .map(|(oid, n)| {
                r(vec![
                    ("oid", (*oid).into()),
                    ("nspname", n.as_str().into()),
                    ("nspowner", owner()),
                ])
            })
            .collect(),
        "pg_database" => vec![r(vec![
            ("oid", DATABASE_OID.into()),
            ("datname", session.database.as_str().into()),
            ("datdba", owner()),
            ("encoding", 6.into()),
            ("datlocprovider", "c".into()),
            ("datistemplate", false.into()),
            ("datallowconn", true.into()),
            ("datconnlimit", (-1).into()),
            ("datfrozenxid", 0.into()),
            ("datminmxid", 1.into()),
            ("dattablespace", 1663.into()),
            ("datcollate", "C".into()),
            ("datctype", "C".into()),
        ])],
        "pg_tablespace" => [(1663, "pg_default"), (1664, "pg_global")]
            .into_iter()
            .map(|(oid, n)| {
                r(vec![
                    ("oid", oid.into()),
                    ("spcname", n.into()),
                    ("spcowner", owner()),
                ])
            })
            .collect(),
        "pg_collation" => [
            (100, "default", "d", ""),
            (950, "C", "c", "C"),
            (951, "POSIX", "c", "POSIX"),
        ]
        .into_iter()
        .map(|(oid, n, provider, locale)| {
            r(vec![
                ("oid", oid.into()),
                ("collname", n.into()),
                ("collnamespace", PG_CATALOG_OID.into()),
                ("collowner", owner()),
                ("collprovider", provider.into()),
                ("collisdeterministic", true.into()),
                ("collencoding", (-1).into()),
                ("collcollate", (!locale.is_empty()).then_some(locale).into()),
                ("collctype", (!locale.is_empty()).then_some(locale).into()),
            ])
        })
        .collect(),
        "pg_language" => [(12, "internal"), (13, "c"), (14, "sql")]
            .into_iter()
            .map(|(oid, n)| {
                r(vec![
                    ("oid", oid.into()),
                    ("lanname", n.into()),
                    ("lanowner", owner()),
                    ("lanispl", false.into()),
                    ("lanpltrusted", (n == "sql").into()),
                    ("lanplcallfoid", 0.into()),
                    ("laninline", 0.into()),
                    ("lanvalidator", 0.into()),
                ])
            })
            .collect(),
        "pg_type" => type_rows(cols),
        "pg_roles" | "pg_authid" => role_rows(cols, session),
        "pg_stat_activity" => activity_rows(db, cols, session),
        "pg_user" | "pg_shadow" => {
            let mut login = session.clone();
            login.roles.retain(|r| r.login);
            role_rows(cols, &login)
        }
        "pg_settings" => session
            .settings
            .iter()
            .map(|(k, v)| {
                r(vec![
                    ("name", k.as_str().into()),
                    ("setting", v.as_str().into()),
                    ("category", "Weir".into()),
                    ("context", "user".into()),
                    ("vartype", "string".into()),
                    ("source", "session".into()),
                    ("boot_val", v.as_str().into()),
                    ("reset_val", v.as_str().into()),
                    ("pending_restart", false.into()),
                ])
            })
            .collect(),
        "pg_foreign_data_wrapper" => vec![r(vec![
            ("oid", FDW_OID.into()),
            ("fdwname", "weir".into()),
            ("fdwowner", owner()),
            ("fdwhandler", 0.into()),
            ("fdwvalidator", 0.into()),
        ])],
        "pg_foreign_server" => connectors()
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                r(vec![
                    ("oid", server_oid(i).into()),
                    ("srvname", c.into()),
                    ("srvowner", owner()),
                    ("srvfdw", FDW_OID.into()),
                ])
            })
            .collect(),
        "pg_proc" => super::functions::proc_rows(db, cols),
        "pg_description" => Vec::new(),
        _ => relation_rows(db, name, cols).await?,
    };
    batch(cols, rows).map(Some)
}

fn type_rows(cols: &[(&str, Kind)]) -> Vec<Vec<V>> {
    let mut rows = Vec::new();
    for ty in TYPES {
        let io = |suffix: &str| V::from(format!("{}{suffix}", ty.io));
        rows.push(row(
            cols,
            vec![
                ("oid", ty.oid.into()),
                ("typname", ty.name.into()),
                ("typnamespace", PG_CATALOG_OID.into()),
                ("typowner", SUPERUSER_OID.into()),
                ("typlen", V::I(ty.len as i64)),
                ("typbyval", ty.byval.into()),
                ("typtype", if ty.pseudo { "p" } else { "b" }.into()),
                ("typcategory", ty.category.into()),
                (
                    "typispreferred",
                    matches!(
                        ty.name,
                        "bool" | "text" | "float8" | "oid" | "timestamptz" | "interval"
                    )
                    .into(),
                ),
                ("typisdefined", true.into()),
                ("typdelim", ",".into()),
                ("typrelid", 0.into()),
                (
                    "typsubscript",
                    if ty.elem != 0 {
                        "array_subscript_handler"
                    } else {
                        "-"
                    }
                    .into(),
                ),
                ("typelem", ty.elem.into()),
                ("typarray", ty.array.into()),
                ("typinput", io("in")),
                ("typoutput", io("out")),
                ("typreceive", io("recv")),
                ("typsend", io("send")),
                ("typmodin", "-".into()),
                ("typmodout", "-".into()),
                ("typanalyze", "-".into()),
                ("typalign", ty.align.into()),
                ("typstorage", if ty.len == -1 { "x" } else { "p" }.into()),
                ("typnotnull", false.into()),
                ("typbasetype", 0.into()),
                ("typtypmod", (-1).into()),
                ("typndims", 0.into()),
                ("typcollation", if ty.collatable { 100 } else { 0 }.into()),
            ],
        ));
        if ty.array != 0 {
            rows.push(row(
                cols,
                vec![
                    ("oid", ty.array.into()),
                    ("typname", format!("_{}", ty.name).into()),
                    ("typnamespace", PG_CATALOG_OID.into()),
                    ("typowner", SUPERUSER_OID.into()),
                    ("typlen", (-1).into()),
                    ("typbyval", false.into()),
                    ("typtype", "b".into()),
                    ("typcategory", "A".into()),
                    ("typispreferred", false.into()),
                    ("typisdefined", true.into()),
                    ("typdelim", ",".into()),
                    ("typrelid", 0.into()),
                    ("typsubscript", "array_subscript_handler".into()),
                    ("typelem", ty.oid.into()),
                    ("typarray", 0.into()),
                    ("typinput", "array_in".into()),
                    ("typoutput", "array_out".into()),
                    ("typreceive", "array_recv".into()),
                    ("typsend", "array_send".into()),
                    ("typmodin", "-".into()),
                    ("typmodout", "-".into()),
                    ("typanalyze", "array_typanalyze".into()),
                    ("typalign", if ty.align == "d" { "d" } else { "i" }.into()),
                    ("typstorage", "x".into()),
                    ("typnotnull", false.into()),
                    ("typbasetype", 0.into()),
                    ("typtypmod", (-1).into()),
                    ("typndims", 0.into()),
                    ("typcollation", if ty.collatable { 100 } else { 0 }.into()),
                ],
            ));
        }
    }
    rows
}

/// One row per logged-in connection. As in Postgres, what another role's
/// connection is running is shown to superusers only.
fn activity_rows(
    db: &Arc<dyn CatalogView>,
    cols: &[(&str, Kind)],
    session: &SessionInfo,
) -> Vec<Vec<V>> {
    let micros = |t: std::time::SystemTime| {
        V::I(
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64),
        )
    };
    let superuser = session.role().is_some_and(|r| r.superuser);
    db.activity()
        .all()
        .into_iter()
        .map(|b| {
            let visible = superuser || b.user == session.user;
            let mut values = vec![
                ("datid", V::from(DATABASE_OID)),
                ("datname", session.database.as_str().into()),
                ("pid", b.pid.into()),
                ("usesysid", b.user_oid.into()),
                ("usename", b.user.as_str().into()),
                ("application_name", b.application_name.as_str().into()),
                ("backend_start", micros(b.backend_start)),
                ("backend_type", "client backend".into()),
            ];
            if visible {
                values.extend([
                    ("client_addr", b.client.ip().to_string().into()),
                    ("client_port", i64::from(b.client.port()).into()),
                    ("query_start", b.query_start.map_or(V::N, micros)),
                    ("state_change", micros(b.state_change)),
                    ("state", b.state.into()),
                    ("query", b.query.as_str().into()),
                ]);
            } else {
                values.push(("query", "<insufficient privilege>".into()));
            }
            row(cols, values)
        })
        .collect()
}

fn role_rows(cols: &[(&str, Kind)], session: &SessionInfo) -> Vec<Vec<V>> {
    session
        .roles
        .iter()
        .map(|role| {
            let name = role.name.as_str();
            // Postgres shows a password to no one but a superuser, and
            // then only as its verifier; Weir shows that one is set.
            let password = || match &role.secret {
                Some(_) => V::from("********"),
                None => V::N,
            };
            row_of_some(
                cols,
                vec![
                    ("oid", role.oid.into()),
                    ("rolname", name.into()),
                    ("rolsuper", role.superuser.into()),
                    ("rolinherit", true.into()),
                    ("rolcreaterole", (role.create_role || role.superuser).into()),
                    ("rolcreatedb", (role.create_db || role.superuser).into()),
                    ("rolcanlogin", role.login.into()),
                    ("rolreplication", false.into()),
                    ("rolconnlimit", role.connection_limit.into()),
                    ("rolpassword", password()),
                    ("rolbypassrls", role.superuser.into()),
                    ("usename", name.into()),
                    ("usesysid", role.oid.into()),
                    ("usecreatedb", (role.create_db || role.superuser).into()),
                    ("usesuper", role.superuser.into()),
                    ("userepl", false.into()),
                    ("usebypassrls", role.superuser.into()),
                    ("passwd", password()),
                ],
            )
        })
        .collect()
}

/// The tables that describe relations.
async fn relation_rows(
    db: &Arc<dyn CatalogView>,
    name: &str,
    cols: &[(&str, Kind)],
) -> DfResult<Vec<Vec<V>>> {
    let mut rels = relations(db).await;
    if matches!(name, "pg_class" | "pg_attribute") {
        rels.extend(system_relations());
    }
    let r = |values: Vec<(&str, V)>| row(cols, values);
    let owner = || V::from(SUPERUSER_OID);
    let user = || V::from(crate::SUPERUSER);
    let mut rows = Vec::new();
    match name {
        "pg_class" => {
            for rel in &rels {
                let has_key = !rel.primary_key.is_empty();
                rows.push(r(vec![
                    ("oid", rel.oid.into()),
                    ("relname", rel.name.as_str().into()),
                    ("relnamespace", rel.namespace.into()),
                    ("reltype", 0.into()),
                    ("reloftype", 0.into()),
                    ("relowner", owner()),
                    (
                        "relam",
                        if matches!(rel.relkind, "r" | "m") {
                            2
                        } else {
                            0
                        }
                        .into(),
                    ),
                    ("relfilenode", 0.into()),
                    ("reltablespace", 0.into()),
                    ("relpages", 0.into()),
                    ("reltuples", V::F(-1.0)),
                    ("relallvisible", 0.into()),
                    ("reltoastrelid", 0.into()),
                    ("relhasindex", has_key.into()),
                    ("relisshared", false.into()),
                    ("relpersistence", "p".into()),
                    ("relkind", rel.relkind.into()),
                    ("relnatts", V::I(rel.columns.len() as i64)),
                    ("relchecks", 0.into()),
                    ("relhasrules", (rel.relkind == "v").into()),
                    ("relhastriggers", false.into()),
                    ("relhassubclass", false.into()),
                    ("relrowsecurity", false.into()),
                    ("relforcerowsecurity", false.into()),
                    ("relispopulated", true.into()),
                    ("relreplident", if has_key { "d" } else { "n" }.into()),
                    ("relispartition", false.into()),
                    ("relrewrite", 0.into()),
                    ("relfrozenxid", 0.into()),
                    ("relminmxid", 0.into()),
                ]));
                if has_key {
                    rows.push(r(vec![
                        ("oid", index_oid(rel.id).into()),
                        ("relname", rel.key_name().into()),
                        ("relnamespace", rel.namespace.into()),
                        ("reltype", 0.into()),
                        ("reloftype", 0.into()),
                        ("relowner", owner()),
                        ("relam", 403.into()),
                        ("relfilenode", 0.into()),
                        ("reltablespace", 0.into()),
                        ("relpages", 0.into()),
                        ("reltuples", V::F(-1.0)),
                        ("relallvisible", 0.into()),
                        ("reltoastrelid", 0.into()),
                        ("relhasindex", false.into()),
                        ("relisshared", false.into()),
                        ("relpersistence", "p".into()),
                        ("relkind", "i".into()),
                        ("relnatts", V::I(rel.primary_key.len() as i64)),
                        ("relchecks", 0.into()),
                        ("relhasrules", false.into()),
                        ("relhastriggers", false.into()),
                        ("relhassubclass", false.into()),
                        ("relrowsecurity", false.into()),
                        ("relforcerowsecurity", false.into()),
                        ("relispopulated", true.into()),
                        ("relreplident", "n".into()),
                        ("relispartition", false.into()),
                        ("relrewrite", 0.into()),
                        ("relfrozenxid", 0.into()),
                        ("relminmxid", 0.into()),
                    ]));
                }
            }
        }
        "pg_attribute" => {
            for rel in &rels {
                for (i, c) in rel.columns.iter().enumerate() {
                    let ty = types::by_oid(c.type_oid);
                    rows.push(r(vec![
                        ("attrelid", rel.oid.into()),
                        ("attname", c.name.as_str().into()),
                        ("atttypid", c.type_oid.into()),
                        ("attstattarget", (-1).into()),
                        ("attlen", V::I(ty.map_or(-1, |t| t.len) as i64)),
                        ("attnum", V::I(i as i64 + 1)),
                        (
                            "attndims",
                            if types::by_array_oid(c.type_oid).is_some() {
                                1
                            } else {
                                0
                            }
                            .into(),
                        ),
                        ("attcacheoff", (-1).into()),
                        ("atttypmod", c.typmod.into()),
                        ("attbyval", ty.is_some_and(|t| t.byval).into()),
                        ("attalign", ty.map_or("i", |t| t.align).into()),
                        (
                            "attstorage",
                            if ty.is_none_or(|t| t.len == -1) {
                                "x"
                            } else {
                                "p"
                            }
                            .into(),
                        ),
                        ("attcompression", "".into()),
                        ("attnotnull", c.not_null.into()),
                        ("atthasdef", c.default.is_some().into()),
                        ("atthasmissing", false.into()),
                        ("attidentity", "".into()),
                        ("attgenerated", "".into()),
                        ("attisdropped", false.into()),
                        ("attislocal", true.into()),
                        ("attinhcount", 0.into()),
                        (
                            "attcollation",
                            if ty.is_some_and(|t| t.collatable) {
                                100
                            } else {
                                0
                            }
                            .into(),
                        ),
                    ]));
                }
                // The key's index has the key's columns.
                if !rel.primary_key.is_empty() {
                    for (n, i) in rel.primary_key.iter().enumerate() {
                        let c = &rel.columns[*i];
                        rows.push(r(vec![
                            ("attrelid", index_oid(rel.id).into()),
                            ("attname", c.name.as_str().into()),
                            ("atttypid", c.type_oid.into()),
                            ("attnum", V::I(n as i64 + 1)),
                            ("atttypmod", c.typmod.into()),
                            ("attnotnull", false.into()),
                            ("atthasdef", false.into()),
                            ("attisdropped", false.into()),
                            ("attidentity", "".into()),
                            ("attgenerated", "".into()),
                        ]));
                    }
                }
            }
        }
        "pg_attrdef" => {
            for rel in &rels {
                for (i, c) in rel.columns.iter().enumerate() {
                    if let Some(d) = &c.default {
                        rows.push(r(vec![
                            (
                                "oid",
                                V::I(
                                    CONSTRAINT_OID_BASE as i64 / 2
                                        + rel.id as i64 * 1000
                                        + i as i64,
                                ),
                            ),
                            ("adrelid", rel.oid.into()),
                            ("adnum", V::I(i as i64 + 1)),
                            ("adbin", d.as_str().into()),
                        ]));
                    }
                }
            }
        }
        "pg_index" => {
            for rel in rels.iter().filter(|r| !r.primary_key.is_empty()) {
                let keys: Vec<V> = rel
                    .primary_key
                    .iter()
                    .map(|i| V::I(*i as i64 + 1))
                    .collect();
                let n = V::I(keys.len() as i64);
                rows.push(r(vec![
                    ("indexrelid", index_oid(rel.id).into()),
                    ("indrelid", rel.oid.into()),
                    ("indnatts", n.clone()),
                    ("indnkeyatts", n),
                    ("indisunique", true.into()),
                    ("indnullsnotdistinct", false.into()),
                    ("indisprimary", true.into()),
                    ("indisexclusion", false.into()),
                    ("indimmediate", true.into()),
                    ("indisclustered", false.into()),
                    ("indisvalid", true.into()),
                    ("indcheckxmin", false.into()),
                    ("indisready", true.into()),
                    ("indislive", true.into()),
                    ("indisreplident", false.into()),
                    ("indkey", V::A(keys.clone())),
                    ("indcollation", V::A(keys.iter().map(|_| V::I(0)).collect())),
                    ("indclass", V::A(keys.iter().map(|_| V::I(0)).collect())),
                    ("indoption", V::A(keys.iter().map(|_| V::I(0)).collect())),
                ]));
            }
        }
        "pg_constraint" => {
            for rel in rels.iter().filter(|r| !r.primary_key.is_empty()) {
                let keys: Vec<V> = rel
                    .primary_key
                    .iter()
                    .map(|i| V::I(*i as i64 + 1))
                    .collect();
                rows.push(r(vec![
                    ("oid", constraint_oid(rel.id).into()),
                    ("conname", rel.key_name().into()),
                    ("connamespace", rel.namespace.into()),
                    ("contype", "p".into()),
                    ("condeferrable", false.into()),
                    ("condeferred", false.into()),
                    ("convalidated", true.into()),
                    ("conrelid", rel.oid.into()),
                    ("contypid", 0.into()),
                    ("conindid", index_oid(rel.id).into()),
                    ("conparentid", 0.into()),
                    ("confrelid", 0.into()),
                    ("confupdtype", " ".into()),
                    ("confdeltype", " ".into()),
                    ("confmatchtype", " ".into()),
                    ("conislocal", true.into()),
                    ("coninhcount", 0.into()),
                    ("connoinherit", true.into()),
                    ("conkey", V::A(keys)),
                ]));
            }
        }
        "pg_tables" => {
            for rel in rels.iter().filter(|r| r.relkind == "r") {
                rows.push(r(vec![
                    ("schemaname", rel.schema.as_str().into()),
                    ("tablename", rel.name.as_str().into()),
                    ("tableowner", user()),
                    ("hasindexes", (!rel.primary_key.is_empty()).into()),
                    ("hasrules", false.into()),
                    ("hastriggers", false.into()),
                    ("rowsecurity", false.into()),
                ]));
            }
        }
        "pg_views" => {
            for rel in rels.iter().filter(|r| r.relkind == "v") {
                rows.push(r(vec![
                    ("schemaname", rel.schema.as_str().into()),
                    ("viewname", rel.name.as_str().into()),
                    ("viewowner", user()),
                    ("definition", rel.definition.clone().into()),
                ]));
            }
        }
        "pg_matviews" => {
            for rel in rels.iter().filter(|r| r.relkind == "m") {
                rows.push(r(vec![
                    ("schemaname", rel.schema.as_str().into()),
                    ("matviewname", rel.name.as_str().into()),
                    ("matviewowner", user()),
                    ("hasindexes", false.into()),
                    ("ispopulated", true.into()),
                    ("definition", rel.definition.clone().into()),
                ]));
            }
        }
        "pg_indexes" => {
            for rel in rels.iter().filter(|r| !r.primary_key.is_empty()) {
                rows.push(r(vec![
                    ("schemaname", rel.schema.as_str().into()),
                    ("tablename", rel.name.as_str().into()),
                    ("indexname", rel.key_name().into()),
                    ("indexdef", index_def(rel).into()),
                ]));
            }
        }
        "pg_foreign_table" => {
            let servers = connectors();
            for rel in &rels {
                let Some(c) = &rel.connector else { continue };
                let server = servers.iter().position(|s| s == c);
                rows.push(r(vec![
                    ("ftrelid", rel.oid.into()),
                    ("ftserver", server.map_or(0, server_oid).into()),
                ]));
            }
        }
        "pg_stat_user_tables" | "pg_stat_all_tables" | "pg_statio_user_tables" => {
            for rel in rels.iter().filter(|r| matches!(r.relkind, "r" | "m")) {
                rows.push(r(vec![
                    ("relid", rel.oid.into()),
                    ("schemaname", rel.schema.as_str().into()),
                    ("relname", rel.name.as_str().into()),
                ]));
            }
        }
        other => {
            return Err(DataFusionError::Internal(format!(
                "no rows for pg_catalog.{other}"
            )));
        }
    }
    Ok(rows)
}

/// `pg_get_indexdef` of a primary key's index.
pub(super) fn index_def(rel: &Relation) -> String {
    key_index_def(&rel.schema, &rel.name, &rel.key_columns())
}

/// The definition of the unique index of `table`'s primary key `key`.
pub(super) fn key_index_def(schema: &str, table: &str, key: &[String]) -> String {
    format!(
        "CREATE UNIQUE INDEX {} ON {}.{} USING btree ({})",
        crate::sql::stmt::quote_ident(&format!("{table}_pkey")),
        crate::sql::stmt::quote_ident(schema),
        crate::sql::stmt::quote_ident(table),
        quoted_list(key)
    )
}

/// `pg_get_constraintdef` of a primary key.
pub(super) fn key_constraint_def(key: &[String]) -> String {
    format!("PRIMARY KEY ({})", quoted_list(key))
}

fn quoted_list(names: &[String]) -> String {
    names
        .iter()
        .map(|c| crate::sql::stmt::quote_ident(c))
        .collect::<Vec<_>>()
        .join(", ")
}

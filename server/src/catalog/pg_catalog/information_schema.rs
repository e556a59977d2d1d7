//! `information_schema`: the SQL standard's catalog views, filled from the
//! same relations as `pg_catalog`.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;

use super::columns::INFORMATION_SCHEMA;
use super::tables::{Relation, V, batch, columns_of, relations, row};
use super::types;
use super::*;

/// Every view of `information_schema`.
pub(super) const VIEW_NAMES: &[&str] = &[
    "applicable_roles",
    "character_sets",
    "check_constraints",
    "column_privileges",
    "columns",
    "constraint_column_usage",
    "domains",
    "element_types",
    "enabled_roles",
    "key_column_usage",
    "parameters",
    "referential_constraints",
    "role_table_grants",
    "routines",
    "schemata",
    "sequences",
    "table_constraints",
    "table_privileges",
    "tables",
    "triggers",
    "usage_privileges",
    "views",
];

#[derive(Debug)]
pub(super) struct InformationSchema {
    pub db: Arc<dyn CatalogView>,
    pub session: Arc<SessionInfo>,
}

#[async_trait]
impl SchemaProvider for InformationSchema {
    fn table_names(&self) -> Vec<String> {
        VIEW_NAMES.iter().map(|s| s.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(cols) = columns_of(INFORMATION_SCHEMA, name) else {
            return Ok(None);
        };
        let rels = if matches!(
            name,
            "tables"
                | "columns"
                | "views"
                | "table_constraints"
                | "key_column_usage"
                | "constraint_column_usage"
                | "table_privileges"
                | "role_table_grants"
        ) {
            relations(&self.db).await
        } else {
            Vec::new()
        };
        let rows = rows(name, cols, &rels, &self.session);
        let batch = batch(cols, rows)?;
        Ok(Some(Arc::new(MemTable::try_new(
            batch.schema(),
            vec![vec![batch]],
        )?)))
    }

    fn table_exist(&self, name: &str) -> bool {
        VIEW_NAMES.contains(&name)
    }
}

fn yes(b: bool) -> V {
    if b { "YES" } else { "NO" }.into()
}

fn rows(
    name: &str,
    cols: &[(&str, super::tables::Kind)],
    rels: &[Relation],
    session: &SessionInfo,
) -> Vec<Vec<V>> {
    // As in Postgres, materialized views are not in the standard's views
    // (`pg_class` and `pg_matviews` have them): tools that list tables
    // from both (Metabase) would otherwise see their columns twice.
    let rels: Vec<Relation> = rels.iter().filter(|r| r.relkind != "m").cloned().collect();
    let rels = rels.as_slice();
    let r = |values: Vec<(&str, V)>| row(cols, values);
    let db = || V::from(session.database.as_str());
    let user = || V::from(session.user.as_str());
    let mut out = Vec::new();
    match name {
        "schemata" => {
            for (_, ns) in &session.namespaces {
                out.push(r(vec![
                    ("catalog_name", db()),
                    ("schema_name", ns.as_str().into()),
                    ("schema_owner", user()),
                ]));
            }
        }
        "character_sets" => out.push(r(vec![
            ("character_set_name", "UTF8".into()),
            ("character_repertoire", "UCS".into()),
            ("form_of_use", "UTF8".into()),
            ("default_collate_catalog", db()),
            ("default_collate_schema", "pg_catalog".into()),
            ("default_collate_name", "C".into()),
        ])),
        "enabled_roles" => out.push(r(vec![("role_name", user())])),
        "tables" => {
            for rel in rels {
                let table_type = match rel.relkind {
                    "r" => "BASE TABLE",
                    "v" => "VIEW",
                    _ => "FOREIGN",
                };
                out.push(r(vec![
                    ("table_catalog", db()),
                    ("table_schema", rel.schema.as_str().into()),
                    ("table_name", rel.name.as_str().into()),
                    ("table_type", table_type.into()),
                    ("is_insertable_into", yes(rel.relkind == "r")),
                    ("is_typed", yes(false)),
                ]));
            }
        }
        "views" => {
            for rel in rels.iter().filter(|r| r.relkind == "v") {
                out.push(r(vec![
                    ("table_catalog", db()),
                    ("table_schema", rel.schema.as_str().into()),
                    ("table_name", rel.name.as_str().into()),
                    ("view_definition", rel.definition.clone().into()),
                    ("check_option", "NONE".into()),
                    ("is_updatable", yes(false)),
                    ("is_insertable_into", yes(false)),
                    ("is_trigger_updatable", yes(false)),
                    ("is_trigger_deletable", yes(false)),
                    ("is_trigger_insertable_into", yes(false)),
                ]));
            }
        }
        "columns" => {
            for rel in rels {
                for (i, c) in rel.columns.iter().enumerate() {
                    out.push(r(column_values(rel, i, c, db(), session)));
                }
            }
        }
        "table_constraints" => {
            for rel in rels.iter().filter(|r| !r.primary_key.is_empty()) {
                out.push(r(vec![
                    ("constraint_catalog", db()),
                    ("constraint_schema", rel.schema.as_str().into()),
                    ("constraint_name", rel.key_name().into()),
                    ("table_catalog", db()),
                    ("table_schema", rel.schema.as_str().into()),
                    ("table_name", rel.name.as_str().into()),
                    ("constraint_type", "PRIMARY KEY".into()),
                    ("is_deferrable", yes(false)),
                    ("initially_deferred", yes(false)),
                    ("enforced", yes(true)),
                    ("nulls_distinct", V::N),
                ]));
            }
        }
        "key_column_usage" | "constraint_column_usage" => {
            for rel in rels.iter().filter(|r| !r.primary_key.is_empty()) {
                for (n, c) in rel.key_columns().into_iter().enumerate() {
                    let mut values = vec![
                        ("constraint_catalog", db()),
                        ("constraint_schema", rel.schema.as_str().into()),
                        ("constraint_name", rel.key_name().into()),
                        ("table_catalog", db()),
                        ("table_schema", rel.schema.as_str().into()),
                        ("table_name", rel.name.as_str().into()),
                        ("column_name", c.into()),
                    ];
                    if name == "key_column_usage" {
                        values.push(("ordinal_position", V::I(n as i64 + 1)));
                    }
                    out.push(r(values));
                }
            }
        }
        "table_privileges" | "role_table_grants" => {
            for rel in rels {
                let privileges: &[&str] = if rel.relkind == "r" {
                    &["INSERT", "SELECT", "UPDATE", "DELETE"]
                } else {
                    &["SELECT"]
                };
                for p in privileges {
                    out.push(r(vec![
                        ("grantor", user()),
                        ("grantee", user()),
                        ("table_catalog", db()),
                        ("table_schema", rel.schema.as_str().into()),
                        ("table_name", rel.name.as_str().into()),
                        ("privilege_type", (*p).into()),
                        ("is_grantable", yes(true)),
                        ("with_hierarchy", yes(false)),
                    ]));
                }
            }
        }
        // Weir has no check constraints, domains, routines of its own,
        // sequences, triggers, foreign keys or granted roles.
        _ => {}
    }
    out
}

/// One row of `information_schema.columns`.
fn column_values<'a>(
    rel: &Relation,
    i: usize,
    c: &super::tables::Attribute,
    db: V,
    session: &SessionInfo,
) -> Vec<(&'a str, V)> {
    let ty = types::by_oid(c.type_oid);
    let elem = types::by_array_oid(c.type_oid);
    let data_type = if elem.is_some() {
        "ARRAY".to_string()
    } else {
        ty.map_or("USER-DEFINED", |t| t.sql_name).to_string()
    };
    let udt = elem
        .map(|e| format!("_{}", e.name))
        .or_else(|| ty.map(|t| t.name.to_string()));
    let (precision, radix, scale) = match c.type_oid {
        types::INT2 => (Some(16), Some(2), Some(0)),
        types::INT4 => (Some(32), Some(2), Some(0)),
        types::INT8 => (Some(64), Some(2), Some(0)),
        types::FLOAT4 => (Some(24), Some(2), None),
        types::FLOAT8 => (Some(53), Some(2), None),
        types::NUMERIC if c.typmod >= 4 => (
            Some((c.typmod - 4) >> 16),
            Some(10),
            Some((c.typmod - 4) & 0xffff),
        ),
        types::NUMERIC => (None, Some(10), None),
        _ => (None, None, None),
    };
    let char_len = matches!(c.type_oid, types::VARCHAR | types::BPCHAR)
        .then_some(c.typmod - 4)
        .filter(|l| *l > 0);
    let octets = matches!(c.type_oid, types::VARCHAR | types::BPCHAR | types::TEXT)
        .then(|| char_len.map_or(1_073_741_824, |l| l * 4));
    let datetime = matches!(
        c.type_oid,
        types::DATE | types::TIME | types::TIMESTAMP | types::TIMESTAMPTZ | types::INTERVAL
    )
    .then_some(if c.type_oid == types::DATE { 0 } else { 6 });
    let collatable = ty.is_some_and(|t| t.collatable);
    let _ = session;
    vec![
        ("table_catalog", db.clone()),
        ("table_schema", rel.schema.as_str().into()),
        ("table_name", rel.name.as_str().into()),
        ("column_name", c.name.as_str().into()),
        ("ordinal_position", V::I(i as i64 + 1)),
        ("column_default", c.default.clone().into()),
        ("is_nullable", yes(!c.not_null)),
        ("data_type", data_type.into()),
        ("character_maximum_length", char_len.into()),
        ("character_octet_length", octets.into()),
        ("numeric_precision", precision.into()),
        ("numeric_precision_radix", radix.into()),
        ("numeric_scale", scale.into()),
        ("datetime_precision", datetime.into()),
        (
            "collation_catalog",
            if collatable { db.clone() } else { V::N },
        ),
        (
            "collation_schema",
            if collatable {
                "pg_catalog".into()
            } else {
                V::N
            },
        ),
        ("collation_name", if collatable { "C".into() } else { V::N }),
        ("udt_catalog", db.clone()),
        ("udt_schema", "pg_catalog".into()),
        ("udt_name", udt.into()),
        ("dtd_identifier", V::I(i as i64 + 1).to_text()),
        ("is_self_referencing", yes(false)),
        ("is_identity", yes(false)),
        ("identity_cycle", yes(false)),
        ("is_generated", "NEVER".into()),
        ("is_updatable", yes(rel.relkind == "r")),
    ]
}

impl V {
    fn to_text(&self) -> V {
        match self {
            V::I(i) => V::T(i.to_string()),
            other => other.clone(),
        }
    }
}

//! The catalogs Postgres clients read: `pg_catalog` and
//! `information_schema`, filled from Weir's catalog on every statement.
//!
//! psql's meta-commands, JDBC's `DatabaseMetaData`, ODBC's catalog
//! functions and BI tools learn what a database holds by querying these
//! tables, so they must say what Postgres would say about the same objects:
//! tables (and streams) are relkind `r`, views `v`, materialized views `m`,
//! and sources and sinks, which hold no rows of their own, are foreign
//! tables (`f`), as an external table is in Postgres. A primary key is a
//! unique index and a `p` constraint; a column default is a `pg_attrdef`.
//!
//! Object ids are stable: a relation's oid is `16384 +` its catalog id
//! (16384 is Postgres's first user oid), its key's index and constraint
//! follow in ranges of their own, and the built-in namespaces, types, roles
//! and access methods keep Postgres's own oids, which clients hard-code.
//!
//! Tables Postgres has but Weir never fills (policies, publications,
//! inheritance, …) exist with their columns and no rows, so that a client's
//! query plans; the front end drops the parts of a query that read them when
//! that cannot change its answer (`crate::sql::rewrite`), since those are also where the queries use
//! SQL that DataFusion does not plan.

mod columns;
mod functions;
mod information_schema;
mod tables;
mod types;

/// Whether `name` is one of the system's schemas (`pg_catalog`,
/// `information_schema`, `weir_catalog`), where users create nothing.
pub fn is_system_schema(name: &str) -> bool {
    tables::NAMESPACES
        .iter()
        .any(|(oid, n)| *n == name && *oid != PUBLIC_OID)
}

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{MemTable, SchemaProvider, TableProvider};
use datafusion::error::Result as DfResult;
use datafusion::execution::context::SessionContext;

use crate::catalog::view::CatalogView;

use tables::{NAMESPACES, TABLE_NAMES};

/// Namespace oids, as in Postgres (`public` 2200, `pg_catalog` 11); Weir's
/// own schemas follow.
pub const PG_CATALOG_OID: i32 = 11;
pub const PUBLIC_OID: i32 = 2200;
pub const INFORMATION_SCHEMA_OID: i32 = 13_000;
pub const WEIR_CATALOG_OID: i32 = 13_001;
/// The one database, `weir`.
pub const DATABASE_OID: i32 = 16_383;
/// The bootstrap superuser's oid, as in Postgres.
pub const SUPERUSER_OID: i32 = 10;
/// First oid of user objects (`FirstNormalObjectId`).
pub const FIRST_USER_OID: i32 = 16_384;
/// A primary key's index and constraint: these plus the table's id.
const INDEX_OID_BASE: i32 = 1_000_000_000;
const CONSTRAINT_OID_BASE: i32 = 1_100_000_000;

/// The oid of the relation with catalog id `id`.
pub fn relation_oid(id: u64) -> i32 {
    FIRST_USER_OID + id as i32
}

pub fn index_oid(id: u64) -> i32 {
    INDEX_OID_BASE + id as i32
}

pub fn constraint_oid(id: u64) -> i32 {
    CONSTRAINT_OID_BASE + id as i32
}

/// What a statement's catalog functions know of its connection.
#[derive(Debug, Clone)]
pub struct SessionInfo {
    pub user: String,
    pub database: String,
    /// Settings as `SHOW` answers them, by lower-case name.
    pub settings: Vec<(String, String)>,
    pub search_path: Vec<String>,
    pub backend_pid: i32,
    /// What `set_config()` set during the statement, for the session to
    /// take when the statement has run.
    pub set_by_query: Arc<std::sync::Mutex<Vec<(String, String)>>>,
    /// Every role, as the statement began.
    pub roles: Vec<crate::catalog::roles::Role>,
    /// Every schema, `(oid, name)`: the system's, then users'.
    pub namespaces: Vec<(i32, String)>,
}

impl SessionInfo {
    /// A connection of `user` whose settings are `settings` (as `SHOW ALL`
    /// lists them).
    pub fn new(user: &str, settings: Vec<(String, String)>, backend_pid: i32) -> Self {
        let search_path = settings
            .iter()
            .find(|(k, _)| k == "search_path")
            .map(|(_, v)| {
                crate::catalog::search_path::split(v)
                    .into_iter()
                    .map(|s| if s == "$user" { user.to_string() } else { s })
                    .collect()
            })
            .unwrap_or_else(|| vec!["public".to_string()]);
        Self {
            user: user.to_string(),
            database: crate::DATABASE.to_string(),
            settings,
            search_path,
            backend_pid,
            set_by_query: Default::default(),
            roles: Vec::new(),
            namespaces: Vec::new(),
        }
    }

    /// The oid of the schema `name`.
    pub fn namespace_oid(&self, name: &str) -> Option<i32> {
        self.namespaces
            .iter()
            .find(|(_, n)| n == name)
            .map(|(oid, _)| *oid)
    }

    /// The role of the session, if it still exists.
    pub fn role(&self) -> Option<&crate::catalog::roles::Role> {
        self.roles.iter().find(|r| r.name == self.user)
    }

    pub fn setting(&self, name: &str) -> Option<&str> {
        let name = name.to_lowercase();
        self.settings
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Adds `pg_catalog`, `information_schema` and the catalog functions to a
/// statement's context.
pub fn register(ctx: &SessionContext, db: Arc<dyn CatalogView>, mut session: SessionInfo) {
    session.roles = db.roles().all();
    session.namespaces = NAMESPACES
        .iter()
        .map(|(oid, n)| (*oid, n.to_string()))
        .chain(
            db.catalog()
                .schemas()
                .into_iter()
                .filter(|(n, _)| n != crate::sql::stmt::DEFAULT_SCHEMA)
                .map(|(n, id)| (relation_oid(id), n)),
        )
        .collect();
    let session = Arc::new(session);
    if let Some(catalog) = ctx.catalog("weir") {
        let _ = catalog.register_schema(
            "pg_catalog",
            Arc::new(PgCatalogSchema {
                db: db.clone(),
                session: session.clone(),
            }),
        );
        let _ = catalog.register_schema(
            "information_schema",
            Arc::new(information_schema::InformationSchema {
                db: db.clone(),
                session: session.clone(),
            }),
        );
    }
    functions::register(ctx, &db, &session);
}

/// `pg_catalog` for one statement: each table is built when the statement
/// names it.
#[derive(Debug)]
pub struct PgCatalogSchema {
    db: Arc<dyn CatalogView>,
    session: Arc<SessionInfo>,
}

#[async_trait]
impl SchemaProvider for PgCatalogSchema {
    fn table_names(&self) -> Vec<String> {
        TABLE_NAMES.iter().map(|s| s.to_string()).collect()
    }

    async fn table(&self, name: &str) -> DfResult<Option<Arc<dyn TableProvider>>> {
        let Some(batch) = tables::build(&self.db, &self.session, name).await? else {
            return Ok(None);
        };
        let table = MemTable::try_new(batch.schema(), vec![vec![batch]])?;
        Ok(Some(Arc::new(table)))
    }

    fn table_exist(&self, name: &str) -> bool {
        TABLE_NAMES.contains(&name)
    }
}

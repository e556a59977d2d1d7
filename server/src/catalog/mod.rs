//! The catalog: tables, views and materialized views, persisted in the meta
//! store as JSON (one entry per object, in id order, so that everything an
//! object depends on is loaded before it).

pub mod activity;
pub mod pg_catalog;
pub mod restore_errors;
pub mod roles;
pub mod search_path;
pub mod system;
pub mod view;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, RwLock};

use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use serde::{Deserialize, Serialize};
use storage::meta::MetaStore;
use storage::table::{ROW_ID_COLUMN, TableDesc};

use crate::error::{Result, ServerError};
use crate::sql::stmt::{DEFAULT_SCHEMA, QualifiedName};
use crate::sql::types;

/// A table column.
/// How long a materialized view keeps its changes unless told otherwise:
/// long enough for a subscriber to reconnect and resume.
pub const DEFAULT_RETAIN_HISTORY_MS: u64 = 10 * 60 * 1000;

fn default_retain_history_ms() -> u64 {
    DEFAULT_RETAIN_HISTORY_MS
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Column {
    pub name: String,
    /// The type as declared, re-parsed on load.
    pub sql_type: String,
    pub not_null: bool,
    /// `DEFAULT expr`, as SQL text: what an `INSERT` that leaves the column
    /// out writes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<String>,
}

/// `WATERMARK FOR column AS expr`, the expression kept as SQL text.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WatermarkDef {
    pub column: String,
    pub expr: String,
}

/// The job of a table that reads a connector (`CREATE TABLE … WITH
/// (connector = …)`): the connector's rows, applied to the table at each
/// completed checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ingest {
    pub connector: planner::spec::ConnectorSpec,
    /// The job's parallelism when the table was created.
    pub parallelism: usize,
}

/// Entries written before schemas existed are all in `public`.
fn default_schema() -> String {
    DEFAULT_SCHEMA.to_string()
}

/// One catalog object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    Table {
        id: u64,
        name: String,
        /// The schema it is in.
        #[serde(default = "default_schema")]
        schema: String,
        columns: Vec<Column>,
        primary_key: Vec<String>,
        /// Created by `CREATE STREAM`.
        #[serde(default)]
        stream: bool,
        /// INSERT only (`APPEND ONLY`, and every stream).
        #[serde(default)]
        append_only: bool,
        #[serde(default)]
        watermark: Option<WatermarkDef>,
        /// `WITH (late_rows = 'name')`: the stream (id) that takes the rows
        /// that arrive behind the watermark, instead of this one.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        late_rows: Option<u64>,
        /// `WITH (connector = …)`: what the table's own job reads into it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        ingest: Option<Ingest>,
    },
    View {
        id: u64,
        name: String,
        /// The schema it is in.
        #[serde(default = "default_schema")]
        schema: String,
        sql: String,
        depends_on: Vec<u64>,
    },
    /// `CREATE SOURCE`: rows of an external system, read by each job that
    /// uses them through the connector; nothing is stored.
    Source {
        id: u64,
        name: String,
        /// The schema it is in.
        #[serde(default = "default_schema")]
        schema: String,
        columns: Vec<Column>,
        #[serde(default)]
        watermark: Option<WatermarkDef>,
        connector: planner::spec::ConnectorSpec,
    },
    MaterializedView {
        id: u64,
        name: String,
        /// The schema it is in.
        #[serde(default = "default_schema")]
        schema: String,
        sql: String,
        parallelism: usize,
        chaining: bool,
        #[serde(default)]
        checkpoint_mode: planner::spec::CheckpointMode,
        /// `EMIT ON WINDOW CLOSE`.
        #[serde(default)]
        emit_on_window_close: bool,
        /// `streaming_state_ttl` when it was created (microseconds).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_ttl_us: Option<i64>,
        /// `state_backend` when it was created (`None`: by its state).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_backend: Option<planner::spec::StateBackend>,
        /// `WITH (retain_history = …)`: how long the view keeps its
        /// changes for `SUBSCRIBE` (milliseconds; 0: none).
        #[serde(default = "default_retain_history_ms")]
        retain_history_ms: u64,
        /// Its job reads the materialized views it names through their
        /// changelogs (false for views created before Weir could: they
        /// keep inlining them, which their state was built by).
        #[serde(default)]
        reads_changelogs: bool,
        depends_on: Vec<u64>,
    },
    /// `CREATE SINK`: a job like a materialized view's, whose changes go
    /// to an external system through the connector instead of into state.
    Sink {
        id: u64,
        name: String,
        /// The schema it is in.
        #[serde(default = "default_schema")]
        schema: String,
        sql: String,
        connector: planner::spec::ConnectorSpec,
        /// `primary_key`: the columns that identify a row downstream.
        #[serde(default)]
        key: Vec<String>,
        parallelism: usize,
        chaining: bool,
        #[serde(default)]
        checkpoint_mode: planner::spec::CheckpointMode,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_ttl_us: Option<i64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        state_backend: Option<planner::spec::StateBackend>,
        /// As a materialized view's.
        #[serde(default)]
        reads_changelogs: bool,
        depends_on: Vec<u64>,
    },
}

impl Entry {
    pub fn id(&self) -> u64 {
        match self {
            Entry::Table { id, .. }
            | Entry::View { id, .. }
            | Entry::Source { id, .. }
            | Entry::MaterializedView { id, .. }
            | Entry::Sink { id, .. } => *id,
        }
    }

    /// Its name in its schema.
    pub fn name(&self) -> &str {
        match self {
            Entry::Table { name, .. }
            | Entry::View { name, .. }
            | Entry::Source { name, .. }
            | Entry::MaterializedView { name, .. }
            | Entry::Sink { name, .. } => name,
        }
    }

    pub fn schema(&self) -> &str {
        match self {
            Entry::Table { schema, .. }
            | Entry::View { schema, .. }
            | Entry::Source { schema, .. }
            | Entry::MaterializedView { schema, .. }
            | Entry::Sink { schema, .. } => schema,
        }
    }

    /// Its schema and name.
    pub fn qualified(&self) -> QualifiedName {
        QualifiedName {
            schema: self.schema().to_string(),
            name: self.name().to_string(),
        }
    }

    /// As Postgres names the kind in messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Entry::Table { stream: true, .. } => "stream",
            Entry::Table { .. } => "table",
            Entry::View { .. } => "view",
            Entry::Source { .. } => "source",
            Entry::MaterializedView { .. } => "materialized view",
            Entry::Sink { .. } => "sink",
        }
    }

    pub fn depends_on(&self) -> &[u64] {
        match self {
            // A connector table has no late rows; it may keep dead letters.
            Entry::Table {
                ingest: Some(ingest),
                ..
            } => ingest.connector.dead_letter_table.as_slice(),
            Entry::Table { late_rows, .. } => late_rows.as_slice(),
            Entry::Source { connector, .. } => connector.dead_letter_table.as_slice(),
            Entry::View { depends_on, .. }
            | Entry::MaterializedView { depends_on, .. }
            | Entry::Sink { depends_on, .. } => depends_on,
        }
    }
}

/// The error for a relation whose name is taken (Postgres's words).
pub fn already_exists(name: &impl std::fmt::Display) -> ServerError {
    ServerError::DuplicateObject(format!("relation \"{name}\" already exists"))
}

/// A connector's `FORMAT … ENCODE … (…)` and `WITH` options as text, for
/// `SHOW SOURCES` and `SHOW SINKS`, a password masked.
pub fn connector_text(connector: &planner::spec::ConnectorSpec) -> (String, String) {
    let list = |options: &BTreeMap<String, String>| {
        options
            .iter()
            .map(|(k, v)| {
                if k.contains("password") {
                    format!("{k} = '********'")
                } else {
                    format!("{k} = '{v}'")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    };
    let format = match (&connector.format, &connector.encode) {
        (Some(f), Some(e)) if connector.encode_options.is_empty() => format!("{f} {e}"),
        (Some(f), Some(e)) => format!("{f} {e} ({})", list(&connector.encode_options)),
        _ => String::new(),
    };
    (format, list(&connector.options))
}

/// How a table is stored, derived from its entry.
pub fn table_desc(entry: &Entry) -> Result<TableDesc> {
    let Entry::Table {
        id,
        name,
        columns,
        primary_key,
        ..
    } = entry
    else {
        return Err(ServerError::Internal(format!(
            "{} is not a table",
            entry.name()
        )));
    };
    let mut fields = column_fields(columns)?;
    let (key_columns, row_id) = if primary_key.is_empty() {
        fields.push(Field::new(ROW_ID_COLUMN, DataType::Int64, false));
        (vec![fields.len() - 1], true)
    } else {
        let keys = primary_key
            .iter()
            .map(|k| {
                columns.iter().position(|c| &c.name == k).ok_or_else(|| {
                    ServerError::UndefinedColumn(format!(
                        "column \"{k}\" named in key does not exist"
                    ))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        (keys, false)
    };
    Ok(TableDesc {
        id: *id,
        name: name.clone(),
        schema: Arc::new(Schema::new(fields)),
        key_columns,
        row_id,
    })
}

/// Declared columns as Arrow fields.
fn column_fields(columns: &[Column]) -> Result<Vec<Field>> {
    columns
        .iter()
        .map(|c| {
            Ok(Field::new(
                &c.name,
                types::parse_type(&c.sql_type)?,
                !c.not_null,
            ))
        })
        .collect()
}

/// The columns of a source, as an Arrow schema.
pub fn source_schema(columns: &[Column]) -> Result<SchemaRef> {
    Ok(Arc::new(Schema::new(column_fields(columns)?)))
}

/// The user-visible schema of a table (without the hidden row id).
pub fn user_schema(desc: &TableDesc) -> SchemaRef {
    if desc.row_id {
        let n = desc.schema.fields().len() - 1;
        Arc::new(Schema::new(desc.schema.fields()[..n].to_vec()))
    } else {
        desc.schema.clone()
    }
}

/// The catalog, in memory and in the meta store.
#[derive(Debug)]
pub struct Catalog {
    meta: Arc<MetaStore>,
    entries: RwLock<BTreeMap<u64, Entry>>,
    /// The schemas users created, by name.
    schemas: RwLock<BTreeMap<String, SchemaEntry>>,
}

/// A schema that a user created (`public` and the system's are not).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SchemaEntry {
    /// From the catalog's id counter, so that its oid is unique among
    /// relations' (see `pg_catalog`).
    pub id: u64,
}

fn poisoned() -> ServerError {
    ServerError::Internal("catalog lock poisoned".into())
}

impl Catalog {
    /// Loads every entry from the meta store; with the ids of those that
    /// cannot be read, and why (they are left out, not lost).
    pub fn load(meta: Arc<MetaStore>) -> Result<(Self, Vec<(u64, String)>)> {
        let mut entries = BTreeMap::new();
        let mut unreadable = Vec::new();
        for (id, bytes) in meta.load_catalog()? {
            match serde_json::from_slice::<Entry>(&bytes) {
                Ok(entry) => {
                    entries.insert(id, entry);
                }
                Err(e) => unreadable.push((id, format!("catalog entry {id} is unreadable: {e}"))),
            }
        }
        let mut schemas = BTreeMap::new();
        for (name, bytes) in meta.load_schemas()? {
            // Objects in a schema whose record is unreadable can still be
            // named and dropped; only the schema is missing.
            match serde_json::from_slice::<SchemaEntry>(&bytes) {
                Ok(entry) => {
                    schemas.insert(name, entry);
                }
                Err(error) => tracing::error!(schema = %name, %error, "schema is unreadable"),
            }
        }
        let catalog = Self {
            meta,
            entries: RwLock::new(entries),
            schemas: RwLock::new(schemas),
        };
        Ok((catalog, unreadable))
    }

    pub fn allocate_id(&self) -> Result<u64> {
        Ok(self.meta.allocate_ids("catalog", 1)?)
    }

    /// Every entry in id order.
    pub fn all(&self) -> Vec<Entry> {
        self.entries
            .read()
            .map(|e| e.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn get(&self, id: u64) -> Option<Entry> {
        self.entries.read().ok()?.get(&id).cloned()
    }

    pub fn by_name(&self, name: &QualifiedName) -> Option<Entry> {
        self.entries
            .read()
            .ok()?
            .values()
            .find(|e| e.name() == name.name && e.schema() == name.schema)
            .cloned()
    }

    /// The schemas users created, by name, with `public` (id 0).
    pub fn schemas(&self) -> Vec<(String, u64)> {
        let mut out = vec![(DEFAULT_SCHEMA.to_string(), 0)];
        if let Ok(schemas) = self.schemas.read() {
            out.extend(schemas.iter().map(|(n, s)| (n.clone(), s.id)));
        }
        out
    }

    /// Whether objects can be created in the schema `name`.
    pub fn has_schema(&self, name: &str) -> bool {
        name == DEFAULT_SCHEMA || self.schemas.read().is_ok_and(|s| s.contains_key(name))
    }

    /// Checks that an object can be created as `name`: its schema exists
    /// and is not one of the system's, and no object has the name.
    /// `Ok(false)` when one has and `if_not_exists` makes that no error
    /// (the statement then does nothing).
    pub fn check_new_name(&self, name: &QualifiedName, if_not_exists: bool) -> Result<bool> {
        if !self.has_schema(&name.schema) {
            return Err(if pg_catalog::is_system_schema(&name.schema) {
                ServerError::InsufficientPrivilege(format!(
                    "permission denied to create \"{}.{}\": schema {} is the system's",
                    name.schema, name.name, name.schema
                ))
            } else {
                ServerError::InvalidSchemaName(format!("schema \"{}\" does not exist", name.schema))
            });
        }
        match self.by_name(name) {
            Some(_) if if_not_exists => Ok(false),
            Some(_) => Err(already_exists(name)),
            None => Ok(true),
        }
    }

    /// Adds a schema durably.
    pub fn add_schema(&self, name: &str) -> Result<()> {
        let entry = SchemaEntry {
            id: self.allocate_id()?,
        };
        let bytes = serde_json::to_vec(&entry).map_err(|e| ServerError::Internal(e.to_string()))?;
        self.meta.put_schema(name, Some(bytes))?;
        self.schemas
            .write()
            .map_err(|_| poisoned())?
            .insert(name.to_string(), entry);
        Ok(())
    }

    /// Removes a schema durably (its objects must be gone already).
    pub fn remove_schema(&self, name: &str) -> Result<()> {
        self.meta.put_schema(name, None)?;
        self.schemas.write().map_err(|_| poisoned())?.remove(name);
        Ok(())
    }

    /// Adds an entry durably.
    pub fn add(&self, entry: Entry) -> Result<()> {
        let bytes = serde_json::to_vec(&entry).map_err(|e| ServerError::Internal(e.to_string()))?;
        self.meta
            .update_catalog(vec![(entry.id(), bytes)], vec![])?;
        self.entries
            .write()
            .map_err(|_| poisoned())?
            .insert(entry.id(), entry);
        Ok(())
    }

    /// Removes entries durably.
    pub fn remove(&self, ids: &[u64]) -> Result<()> {
        self.meta.update_catalog(vec![], ids.to_vec())?;
        let mut entries = self.entries.write().map_err(|_| poisoned())?;
        for id in ids {
            entries.remove(id);
        }
        Ok(())
    }

    /// Every entry that depends on `id`, directly or not, dependents first.
    pub fn dependents(&self, id: u64) -> Vec<Entry> {
        let all = self.all();
        let mut found: BTreeSet<u64> = BTreeSet::new();
        let mut frontier = vec![id];
        while let Some(cur) = frontier.pop() {
            for e in &all {
                if e.depends_on().contains(&cur) && found.insert(e.id()) {
                    frontier.push(e.id());
                }
            }
        }
        // Higher ids were created later and depend on lower ones: drop them first.
        all.into_iter()
            .filter(|e| found.contains(&e.id()))
            .rev()
            .collect()
    }
}

//! DDL: `CREATE` and `DROP` of tables, streams, sources, views,
//! materialized views and schemas. A materialized view is a catalog entry
//! plus a job (`jobs.rs`): its query is lowered into a StreamGraph,
//! chained into a JobGraph and handed to the JobManager, and `CREATE`
//! returns once the job has backfilled what the tables held. A table that
//! reads a connector gets its ingest job from `ingest.rs`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::DFSchema;
use datafusion::logical_expr::ExprSchemable;
use datafusion::sql::sqlparser::ast::{
    ColumnOption, CreateTable, CreateTableOptions, CreateView, Expr as SqlExpr, ObjectName,
    ObjectType, Query, SelectItem, SetExpr, SqlOption, TableConstraint,
};
use storage::table::ROW_ID_COLUMN;

use crate::catalog::{Column, Entry, WatermarkDef, table_desc};
use crate::engine::jobs;
use crate::engine::session::Session;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::{
    self, QualifiedName, TableOptions, WatermarkClause, apply_pg_names, ident, object_name,
};
use crate::sql::types;

/// `CREATE TABLE` and `CREATE STREAM`.
pub async fn create_table(
    db: &Arc<Database>,
    session: &Session,
    ct: CreateTable,
    options: TableOptions,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let name = object_name(&ct.name)?;
    let tag = if options.source.is_some() {
        "CREATE SOURCE"
    } else if options.stream {
        "CREATE STREAM"
    } else {
        "CREATE TABLE"
    };
    if ct.query.is_some() || ct.like.is_some() || ct.clone.is_some() {
        return Err(ServerError::unsupported("CREATE TABLE … AS / LIKE / CLONE"));
    }
    if ct.external || ct.temporary {
        return Err(ServerError::unsupported("EXTERNAL and TEMPORARY tables"));
    }
    if !db.catalog.check_new_name(&name, ct.if_not_exists)? {
        return Ok(QueryResult::command(tag));
    }
    if ct.columns.is_empty() {
        return Err(ServerError::unsupported("tables without columns"));
    }
    let mut columns = Vec::with_capacity(ct.columns.len());
    let mut primary_key: Vec<String> = Vec::new();
    for c in &ct.columns {
        let col_name = ident(&c.name);
        if col_name == ROW_ID_COLUMN {
            return Err(ServerError::InvalidParameter(format!(
                "column name \"{ROW_ID_COLUMN}\" is reserved"
            )));
        }
        if columns.iter().any(|x: &Column| x.name == col_name) {
            return Err(ServerError::DuplicateColumn(format!(
                "column \"{col_name}\" specified more than once"
            )));
        }
        types::arrow_type(&c.data_type)?;
        let mut not_null = false;
        let mut default = None;
        for opt in &c.options {
            match &opt.option {
                ColumnOption::Default(e) => {
                    let sql = e.to_string();
                    crate::engine::context::column_default(
                        &sql,
                        &types::arrow_type(&c.data_type)?,
                    )?;
                    default = Some(sql);
                }
                ColumnOption::NotNull => not_null = true,
                ColumnOption::Null => not_null = false,
                ColumnOption::PrimaryKey(_) => {
                    if !primary_key.is_empty() {
                        return Err(ServerError::Syntax(format!(
                            "multiple primary keys for table \"{name}\" are not allowed"
                        )));
                    }
                    primary_key.push(col_name.clone());
                    not_null = true;
                }
                other => return Err(ServerError::unsupported(format!("column option {other}"))),
            }
        }
        columns.push(Column {
            name: col_name,
            sql_type: c.data_type.to_string(),
            not_null,
            default,
        });
    }
    // The columns a connector fills from a record's metadata (`INCLUDE key
    // AS k`), which a key may name.
    if let Some(connector) = options.source.as_ref().or(options.connector.as_ref()) {
        crate::engine::ingest::include_columns(connector, &mut columns)?;
    }
    for constraint in &ct.constraints {
        match constraint {
            TableConstraint::PrimaryKey(pk) => {
                if !primary_key.is_empty() {
                    return Err(ServerError::Syntax(format!(
                        "multiple primary keys for table \"{name}\" are not allowed"
                    )));
                }
                for ic in &pk.columns {
                    let SqlExpr::Identifier(i) = &ic.column.expr else {
                        return Err(ServerError::unsupported("primary keys on expressions"));
                    };
                    let k = ident(i);
                    let Some(col) = columns.iter_mut().find(|c| c.name == k) else {
                        return Err(ServerError::UndefinedColumn(format!(
                            "column \"{k}\" named in key does not exist"
                        )));
                    };
                    col.not_null = true;
                    if primary_key.contains(&k) {
                        return Err(ServerError::DuplicateColumn(format!(
                            "column \"{k}\" appears twice in primary key constraint"
                        )));
                    }
                    primary_key.push(k);
                }
            }
            other => {
                return Err(ServerError::unsupported(format!(
                    "table constraint {other}"
                )));
            }
        }
    }
    if options.append_only && !primary_key.is_empty() {
        return Err(ServerError::InvalidTableDefinition(format!(
            "append-only {} \"{name}\" cannot have a primary key",
            if options.source.is_some() {
                "source"
            } else if options.stream {
                "stream"
            } else {
                "table"
            }
        )));
    }
    let watermark = match &options.watermark {
        Some(w) => Some(watermark_def(&columns, w)?),
        None => None,
    };
    if let Some(connector) = options.source {
        return create_source(db, name, columns, watermark, connector).await;
    }
    if let Some(connector) = options.connector {
        crate::engine::ingest::check(
            &name.to_string(),
            &connector,
            &primary_key,
            options.append_only,
        )?;
        return create_connector_table(
            db,
            Entry::Table {
                id: 0,
                name: name.name,
                schema: name.schema,
                columns,
                primary_key,
                stream: options.stream,
                append_only: options.append_only,
                watermark,
                late_rows: None,
                ingest: Some(crate::catalog::Ingest {
                    connector,
                    parallelism: session.streaming_parallelism,
                }),
            },
            tag,
        )
        .await;
    }
    let late_rows = match late_rows_option(&ct.table_options)? {
        Some(late) => {
            if watermark.is_none() || !options.append_only {
                return Err(ServerError::InvalidTableDefinition(format!(
                    "late_rows needs a watermark on an append-only table or stream (\"{name}\")"
                )));
            }
            // In the table's schema.
            let late = QualifiedName {
                schema: name.schema.clone(),
                name: late,
            };
            if db.catalog.by_name(&late).is_some() {
                return Err(crate::catalog::already_exists(&late));
            }
            // The late rows' stream: the same columns, no watermark.
            let entry = Entry::Table {
                id: db.catalog.allocate_id()?,
                name: late.name,
                schema: late.schema,
                columns: columns.clone(),
                primary_key: vec![],
                stream: true,
                append_only: true,
                watermark: None,
                late_rows: None,
                ingest: None,
            };
            Some(db.add_table(entry)?)
        }
        None => None,
    };
    let entry = Entry::Table {
        id: db.catalog.allocate_id()?,
        name: name.name,
        schema: name.schema,
        columns,
        primary_key,
        stream: options.stream,
        append_only: options.append_only,
        watermark,
        late_rows,
        ingest: None,
    };
    db.add_table(entry)?;
    Ok(QueryResult::command(tag))
}

/// `CREATE TABLE … WITH (connector = …)`: the connector checks its
/// options and the columns, then the table is created and its job started.
async fn create_connector_table(
    db: &Arc<Database>,
    mut entry: Entry,
    tag: &str,
) -> Result<QueryResult> {
    let owner = entry.qualified();
    let Entry::Table {
        id,
        columns,
        ingest: Some(ingest),
        ..
    } = &mut entry
    else {
        return Err(ServerError::Internal("not a connector table".into()));
    };
    executor::connectors::complete(&mut ingest.connector);
    executor::connectors::source(&ingest.connector, &crate::catalog::source_schema(columns)?)?
        .splits()
        .await?;
    let dead_letters = crate::engine::dead_letters::resolve(db, &owner, &mut ingest.connector)?;
    *id = db.catalog.allocate_id()?;
    let desc = table_desc(&entry)?;
    db.catalog.add(entry.clone())?;
    db.cluster.tables.open_table(desc)?;
    if let Err(e) = crate::engine::ingest::start(db, &entry).await {
        db.catalog.remove(&[entry.id()])?;
        crate::engine::ingest::stop(db, &entry).await?;
        db.cluster.tables.drop_table(entry.id())?;
        crate::engine::dead_letters::undo(db, dead_letters)?;
        return Err(e);
    }
    Ok(QueryResult::command(tag))
}

/// `CREATE SOURCE`: the connector checks its options and the columns
/// against what it can read before anything is written.
async fn create_source(
    db: &Arc<Database>,
    name: QualifiedName,
    columns: Vec<Column>,
    watermark: Option<WatermarkDef>,
    mut connector: planner::spec::ConnectorSpec,
) -> Result<QueryResult> {
    if connector.connector == "postgres-cdc" {
        return Err(ServerError::unsupported(
            "CREATE SOURCE with connector postgres-cdc (create a table: CREATE TABLE … \
             (…, PRIMARY KEY (…)) WITH (connector = 'postgres-cdc', …))",
        ));
    }
    executor::connectors::complete(&mut connector);
    // The connector checks its options (and which FORMAT it takes), then
    // that what it reads is there (a Kafka topic on its brokers).
    let source =
        executor::connectors::source(&connector, &crate::catalog::source_schema(&columns)?)?;
    if connector.format.as_deref() == Some("UPSERT") {
        return Err(ServerError::unsupported(
            "CREATE SOURCE with FORMAT UPSERT (create a table: CREATE TABLE … (…, PRIMARY KEY \
             (k)) INCLUDE KEY AS k WITH (…) FORMAT UPSERT ENCODE JSON)",
        ));
    }
    source.splits().await?;
    let dead_letters = crate::engine::dead_letters::resolve(db, &name, &mut connector)?;
    let entry = Entry::Source {
        id: db.catalog.allocate_id()?,
        name: name.name,
        schema: name.schema,
        columns,
        watermark,
        connector,
    };
    if let Err(e) = db.catalog.add(entry) {
        crate::engine::dead_letters::undo(db, dead_letters)?;
        return Err(e);
    }
    Ok(QueryResult::command("CREATE SOURCE"))
}

/// The value of option `name` in `WITH (…)`, the only option a `kind`
/// ("table", "materialized view") takes; any other is refused.
fn only_option<'a>(
    options: &'a CreateTableOptions,
    kind: &str,
    name: &str,
) -> Result<Option<&'a SqlExpr>> {
    let list = match options {
        CreateTableOptions::None => return Ok(None),
        CreateTableOptions::With(list) => list,
        other => return Err(ServerError::unsupported(format!("{kind} options {other}"))),
    };
    let mut found = None;
    for option in list {
        let SqlOption::KeyValue { key, value } = option else {
            return Err(ServerError::unsupported(format!("{kind} option {option}")));
        };
        let key = ident(key);
        if key != name {
            return Err(ServerError::InvalidParameter(format!(
                "unrecognized parameter \"{key}\" ({kind}s take {name})"
            )));
        }
        found = Some(value);
    }
    Ok(found)
}

/// A string literal's text.
fn quoted(value: &SqlExpr) -> Option<String> {
    match value {
        SqlExpr::Value(v) => v.value.clone().into_string(),
        _ => None,
    }
}

/// A materialized view's `WITH (retain_history = '10 minutes' | 'off')`,
/// in milliseconds (0: off).
fn retain_history_option(options: &CreateTableOptions) -> Result<Option<u64>> {
    let Some(value) = only_option(options, "materialized view", "retain_history")? else {
        return Ok(None);
    };
    quoted(value)
        .as_deref()
        .and_then(crate::sql::settings::parse_duration_us)
        .map(|us| Some(us.map_or(0, |us| (us / 1000) as u64)))
        .ok_or_else(|| {
            ServerError::InvalidParameter(format!(
                "retain_history takes a duration in quotes ('10 minutes', '1 hour') or 'off', not {value}"
            ))
        })
}

/// `WITH (late_rows = 'name')`, the only table option there is.
fn late_rows_option(options: &CreateTableOptions) -> Result<Option<String>> {
    let Some(value) = only_option(options, "table", "late_rows")? else {
        return Ok(None);
    };
    quoted(value).map(Some).ok_or_else(|| {
        ServerError::InvalidParameter(format!(
            "late_rows takes a stream name in quotes, not {value}"
        ))
    })
}

/// Checks `WATERMARK FOR column AS expr`: the column is a timestamp and the
/// expression a timestamp over the table's columns.
fn watermark_def(columns: &[Column], w: &WatermarkClause) -> Result<WatermarkDef> {
    let Some(col) = columns.iter().find(|c| c.name == w.column) else {
        return Err(ServerError::UndefinedColumn(format!(
            "column \"{}\" named in WATERMARK FOR does not exist",
            w.column
        )));
    };
    let is_timestamp = |t: &DataType| matches!(t, DataType::Timestamp(..));
    if !is_timestamp(&types::parse_type(&col.sql_type)?) {
        return Err(ServerError::DatatypeMismatch(format!(
            "the watermark column \"{}\" must be a timestamp, not {}",
            col.name, col.sql_type
        )));
    }
    let fields = columns
        .iter()
        .map(|c| Ok(Field::new(&c.name, types::parse_type(&c.sql_type)?, true)))
        .collect::<Result<Vec<_>>>()?;
    let schema = DFSchema::try_from(Schema::new(fields))?;
    let sql = w.expr.to_string();
    let expr = planner::context::new_context().parse_sql_expr(&sql, &schema)?;
    let t = expr.get_type(&schema)?;
    if !is_timestamp(&t) {
        return Err(ServerError::DatatypeMismatch(format!(
            "the watermark expression {sql} is {t}, not a timestamp"
        )));
    }
    Ok(WatermarkDef {
        column: w.column.clone(),
        expr: sql,
    })
}

/// The view's query text, with Postgres column names and the optional
/// column list applied, and its `CORRESPONDING`s written out.
async fn view_sql(db: &Arc<Database>, cv: &CreateView) -> Result<String> {
    let mut q = cv.query.clone();
    jobs::write_out_corresponding(db, &mut q).await?;
    let names = crate::sql::stmt::output_names(&q);
    // Postgres's error for a view with two columns of one name (DataFusion
    // would call the names ambiguous).
    let given: Option<Vec<String>> = if cv.columns.is_empty() {
        names.clone()
    } else {
        Some(cv.columns.iter().map(|c| ident(&c.name)).collect())
    };
    if let Some(given) = &given {
        let mut seen = BTreeSet::new();
        if let Some(twice) = given.iter().find(|n| !seen.insert(n.as_str())) {
            return Err(ServerError::DuplicateColumn(format!(
                "column \"{twice}\" specified more than once"
            )));
        }
    }
    apply_pg_names(&mut q);
    let cols: Vec<String> = if !cv.columns.is_empty() {
        cv.columns.iter().map(|c| ident(&c.name)).collect()
    } else {
        // A cast of a column (`a::bigint`) is named after the column only
        // once planned (see `apply_pg_names`), which a view's columns are
        // not: they take the names from a column list instead.
        match names {
            Some(names) if casts_a_column(&q) => names,
            _ => return Ok(q.to_string()),
        }
    };
    let cols: Vec<String> = cols.iter().map(|c| format!("\"{c}\"")).collect();
    Ok(format!(
        "SELECT * FROM ({q}) AS __view({})",
        cols.join(", ")
    ))
}

/// Whether `q`'s select list has an unnamed cast of a column.
fn casts_a_column(q: &Query) -> bool {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return false;
    };
    select.projection.iter().any(|item| {
        matches!(
            item,
            SelectItem::UnnamedExpr(SqlExpr::Cast { expr, .. })
                if matches!(expr.as_ref(), SqlExpr::Identifier(_) | SqlExpr::CompoundIdentifier(_))
        )
    })
}

/// `CREATE [MATERIALIZED] VIEW`.
pub async fn create_view(
    db: &Arc<Database>,
    session: &Session,
    cv: CreateView,
    emit_on_window_close: bool,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let name = object_name(&cv.name)?;
    let tag = if cv.materialized {
        "CREATE MATERIALIZED VIEW"
    } else {
        "CREATE VIEW"
    };
    if cv.or_replace || cv.or_alter {
        return Err(ServerError::unsupported("CREATE OR REPLACE VIEW"));
    }
    if !db.catalog.check_new_name(&name, cv.if_not_exists)? {
        return Ok(QueryResult::command(tag));
    }
    let sql = view_sql(db, &cv).await?;
    jobs::check_query(db, &sql).await?;
    let depends_on = jobs::dependencies(db, &sql)?;
    let id = db.catalog.allocate_id()?;
    if !cv.materialized {
        if emit_on_window_close {
            return Err(ServerError::Syntax(
                "EMIT ON WINDOW CLOSE ends a CREATE MATERIALIZED VIEW only".into(),
            ));
        }
        if !matches!(cv.options, CreateTableOptions::None) {
            return Err(ServerError::unsupported(format!(
                "options of a view ({}); materialized views take retain_history",
                cv.options
            )));
        }
        db.catalog.add(Entry::View {
            id,
            name: name.name,
            schema: name.schema,
            sql,
            depends_on,
        })?;
        return Ok(QueryResult::command(tag));
    }
    let mut options = jobs::JobOptions::of_session(session, emit_on_window_close);
    if let Some(ms) = retain_history_option(&cv.options)? {
        options.retain_history_ms = ms;
    }
    let graph = jobs::job_graph(db, &sql, id, &options).await?;
    let entry = Entry::MaterializedView {
        id,
        name: name.name,
        schema: name.schema,
        sql,
        parallelism: options.parallelism,
        chaining: options.chaining,
        checkpoint_mode: options.checkpoint_mode,
        emit_on_window_close,
        state_ttl_us: options.state_ttl_us,
        state_backend: options.state_backend,
        retain_history_ms: options.retain_history_ms,
        reads_changelogs: options.reads_changelogs,
        depends_on,
    };
    jobs::start(db, entry, graph).await?;
    Ok(QueryResult::command(tag))
}

/// `EXPLAIN CREATE MATERIALIZED VIEW`: the three graphs, with the slots the
/// subtasks would get now.
pub async fn explain_view(
    db: &Arc<Database>,
    session: &Session,
    cv: CreateView,
    emit_on_window_close: bool,
) -> Result<QueryResult> {
    let sql = view_sql(db, &cv).await?;
    let id = db.catalog.allocate_id()?;
    let options = jobs::JobOptions::of_session(session, emit_on_window_close);
    let graph = jobs::job_graph(db, &sql, id, &options).await?;
    let stream = graph.stream.explain();
    let job = graph.explain();
    let exec = db.cluster.job_manager.preview(graph)?.explain();
    let lines = [stream, job, exec]
        .iter()
        .flat_map(|s| s.lines().map(str::to_string))
        .collect();
    QueryResult::text("QUERY PLAN", lines)
}

fn kind_of(t: &ObjectType) -> Result<&'static str> {
    Ok(match t {
        ObjectType::Table => "table",
        ObjectType::Stream => "stream",
        ObjectType::View => "view",
        ObjectType::MaterializedView => "materialized view",
        other => return Err(ServerError::unsupported(format!("DROP {other}"))),
    })
}

/// `CREATE SCHEMA [IF NOT EXISTS] name`.
pub async fn create_schema(
    db: &Arc<Database>,
    name: &datafusion::sql::sqlparser::ast::SchemaName,
    if_not_exists: bool,
) -> Result<QueryResult> {
    use datafusion::sql::sqlparser::ast::SchemaName;
    let _ddl = db.ddl_lock.lock().await;
    let SchemaName::Simple(name) = name else {
        return Err(ServerError::unsupported("CREATE SCHEMA … AUTHORIZATION"));
    };
    let name = stmt::simple_name(name)?;
    if db.catalog.has_schema(&name) || crate::catalog::pg_catalog::is_system_schema(&name) {
        if if_not_exists {
            return Ok(QueryResult::command("CREATE SCHEMA"));
        }
        return Err(ServerError::DuplicateSchema(format!(
            "schema \"{name}\" already exists"
        )));
    }
    if name.starts_with("pg_") {
        return Err(ServerError::ReservedName(format!(
            "unacceptable schema name \"{name}\": the prefix \"pg_\" is reserved for system \
             schemas"
        )));
    }
    db.catalog.add_schema(&name)?;
    Ok(QueryResult::command("CREATE SCHEMA"))
}

/// `DROP SCHEMA [IF EXISTS] name, … [CASCADE | RESTRICT]`: with `CASCADE`
/// the schemas' objects go too, and every object elsewhere that depends
/// on them.
pub async fn drop_schema(
    db: &Arc<Database>,
    if_exists: bool,
    names: &[ObjectName],
    cascade: bool,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let names = names
        .iter()
        .map(stmt::simple_name)
        .collect::<Result<Vec<_>>>()?;
    // Check everything before dropping anything.
    let mut schemas = Vec::new();
    for name in names {
        if name == stmt::DEFAULT_SCHEMA {
            return Err(ServerError::unsupported(format!(
                "DROP SCHEMA {name} (unqualified names are always in {name})"
            )));
        }
        if crate::catalog::pg_catalog::is_system_schema(&name) {
            return Err(ServerError::DependentObjects(format!(
                "cannot drop schema {name} because it is required by the database system"
            )));
        }
        if !db.catalog.has_schema(&name) {
            if if_exists {
                continue;
            }
            return Err(ServerError::InvalidSchemaName(format!(
                "schema \"{name}\" does not exist"
            )));
        }
        schemas.push(name);
    }
    let all = db.catalog.all();
    let members: Vec<&Entry> = all
        .iter()
        .filter(|e| schemas.iter().any(|s| s == e.schema()))
        .collect();
    if let Some(first) = members.first()
        && !cascade
    {
        let list: Vec<String> = members
            .iter()
            .map(|e| format!("{} {}", e.kind(), e.qualified()))
            .collect();
        return Err(ServerError::DependentObjects(format!(
            "cannot drop schema {} because other objects depend on it ({} in it); use DROP \
             SCHEMA … CASCADE to drop them too",
            first.schema(),
            list.join(", ")
        )));
    }
    let mut targets: BTreeMap<u64, Entry> = BTreeMap::new();
    for entry in members {
        targets.extend(
            db.catalog
                .dependents(entry.id())
                .into_iter()
                .map(|d| (d.id(), d)),
        );
        targets.insert(entry.id(), entry.clone());
    }
    // Later objects depend on earlier ones: drop them first.
    for entry in targets.values().rev() {
        drop_entry(db, entry).await?;
    }
    for name in schemas {
        db.catalog.remove_schema(&name)?;
    }
    Ok(QueryResult::command("DROP SCHEMA"))
}

/// `DROP TABLE | VIEW | MATERIALIZED VIEW [IF EXISTS] … [CASCADE]`.
pub async fn drop(
    db: &Arc<Database>,
    object_type: ObjectType,
    if_exists: bool,
    names: Vec<ObjectName>,
    cascade: bool,
) -> Result<QueryResult> {
    let names = names.iter().map(object_name).collect::<Result<Vec<_>>>()?;
    drop_objects(db, kind_of(&object_type)?, if_exists, &names, cascade).await
}

/// `DROP <kind> [IF EXISTS] names [CASCADE]`.
pub async fn drop_objects(
    db: &Arc<Database>,
    kind: &str,
    if_exists: bool,
    names: &[QualifiedName],
    cascade: bool,
) -> Result<QueryResult> {
    let _ddl = db.ddl_lock.lock().await;
    let tag = format!("DROP {}", kind.to_uppercase());
    // Check everything before dropping anything.
    let mut targets = Vec::new();
    // Objects named in this statement may depend on each other.
    let named: BTreeSet<u64> = names
        .iter()
        .filter_map(|n| db.catalog.by_name(n).map(|e| e.id()))
        .collect();
    for name in names {
        let Some(entry) = db.catalog.by_name(name) else {
            if if_exists {
                continue;
            }
            if !db.catalog.has_schema(&name.schema) {
                return Err(ServerError::InvalidSchemaName(format!(
                    "schema \"{}\" does not exist",
                    name.schema
                )));
            }
            return Err(ServerError::UndefinedTable(format!(
                "{kind} \"{name}\" does not exist"
            )));
        };
        if entry.kind() != kind {
            return Err(ServerError::WrongObjectType(format!(
                "\"{name}\" is not a {kind}"
            )));
        }
        let dependents = db.catalog.dependents(entry.id());
        let others: Vec<&Entry> = dependents
            .iter()
            .filter(|d| !named.contains(&d.id()))
            .collect();
        if !others.is_empty() && !cascade {
            let list: Vec<String> = others
                .iter()
                .map(|d| format!("{} {}", d.kind(), d.qualified()))
                .collect();
            return Err(ServerError::DependentObjects(format!(
                "cannot drop {kind} {name} because other objects depend on it ({} depends on it); \
                 use DROP … CASCADE to drop the dependent objects too",
                list.join(", ")
            )));
        }
        targets.extend(dependents);
        targets.push(entry);
    }
    let mut dropped = BTreeSet::new();
    for entry in targets {
        if dropped.insert(entry.id()) {
            drop_entry(db, &entry).await?;
        }
    }
    Ok(QueryResult::command(&tag))
}

async fn drop_entry(db: &Arc<Database>, entry: &Entry) -> Result<()> {
    // The catalog goes first: a crash afterwards leaves unreferenced data,
    // never a catalog entry without its data.
    db.catalog.remove(&[entry.id()])?;
    db.restore_errors.remove(&[entry.id()]);
    match entry {
        Entry::MaterializedView { id, .. } | Entry::Sink { id, .. } => {
            match db.cluster.job_manager.cancel_job(*id, true).await {
                Ok(()) | Err(cluster::ClusterError::UnknownJob(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Entry::Table { id, .. } => {
            crate::engine::ingest::stop(db, entry).await?;
            db.cluster.tables.drop_table(*id)?
        }
        Entry::View { .. } | Entry::Source { .. } => {}
    }
    Ok(())
}

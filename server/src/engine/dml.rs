//! DML: `INSERT`, `UPDATE` and `DELETE` become one chunk of changes over the
//! table's stored columns, applied to the table (rows and changelog) in one
//! durable write. The client's acknowledgement follows that write.
//!
//! DataFusion computes what to write: the rows an `INSERT` produces (with its
//! casts to the column types), and the old and new rows an `UPDATE` or
//! `DELETE` touches.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::DataType;
use datafusion::logical_expr::LogicalPlan;
use datafusion::sql::sqlparser::ast::{
    Assignment, AssignmentTarget, Delete, FromTable, Insert, Statement, TableFactor, TableObject,
    TableWithJoins, Update,
};
use storage::chunk::{Chunk, Op};
use storage::table::TableDesc;

use crate::catalog::{Entry, table_desc};
use crate::engine::context::{Mode, context, plan_statement, reading_block};
use crate::engine::transaction::Transaction;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::{QualifiedName, ident, object_name};

fn target(db: &Database, name: &QualifiedName, verb: &str) -> Result<TableDesc> {
    match db.catalog.by_name(name) {
        Some(Entry::Table {
            append_only: true,
            stream,
            ..
        }) if verb != "insert into" => Err(ServerError::WrongObjectType(format!(
            "cannot {verb} {} \"{name}\": it is append-only (INSERT only)",
            if stream { "stream" } else { "table" }
        ))),
        Some(entry @ Entry::Table { .. }) => table_desc(&entry),
        Some(other) => Err(ServerError::WrongObjectType(format!(
            "cannot {verb} {} \"{name}\"",
            other.kind()
        ))),
        None => Err(ServerError::UndefinedTable(format!(
            "relation \"{name}\" does not exist"
        ))),
    }
}

async fn apply(
    db: &Database,
    tx: Option<&mut Transaction>,
    table: u64,
    chunk: Chunk,
) -> Result<usize> {
    let n = chunk.num_rows();
    crate::engine::transaction::write(db, tx, vec![(table, chunk)]).await?;
    Ok(n)
}

async fn collect(
    ctx: &datafusion::prelude::SessionContext,
    plan: LogicalPlan,
) -> Result<Vec<RecordBatch>> {
    Ok(ctx.execute_logical_plan(plan).await?.collect().await?)
}

/// The declared length of each of a table's columns that has one
/// (`varchar(n)`, `char(n)`), by position, with the type's name.
fn declared_lengths(db: &Database, table: u64) -> Vec<Option<(usize, &'static str)>> {
    let Some(Entry::Table { columns, .. }) = db.catalog.get(table) else {
        return Vec::new();
    };
    columns
        .iter()
        .map(|c| {
            let t = c.sql_type.to_lowercase();
            let name = if t.starts_with("varchar") || t.starts_with("character varying") {
                "character varying"
            } else if t.starts_with("char") || t.starts_with("bpchar") {
                "character"
            } else {
                return None;
            };
            let (_, n) = t.split_once('(')?;
            Some((n.trim_end_matches(')').trim().parse().ok()?, name))
        })
        .collect()
}

/// Refuses text longer than its column's declared length (22001), as
/// Postgres does when storing into `varchar(n)` or `char(n)`; blanks past
/// the length are dropped instead, as there.
fn check_lengths(db: &Database, desc: &TableDesc, columns: &mut [ArrayRef]) -> Result<()> {
    use datafusion::arrow::array::{Array, AsArray};
    for (i, declared) in declared_lengths(db, desc.id).into_iter().enumerate() {
        let (Some((limit, type_name)), Some(column)) = (declared, columns.get_mut(i)) else {
            continue;
        };
        let Some(text) = column.as_string_opt::<i32>() else {
            continue;
        };
        if text
            .iter()
            .flatten()
            .all(|v| v.len() <= limit || v.chars().count() <= limit)
        {
            continue;
        }
        let mut fixed = datafusion::arrow::array::StringBuilder::with_capacity(text.len(), 0);
        for v in text.iter() {
            match v {
                Some(v) if v.chars().count() > limit => {
                    let (cut, _) = v.char_indices().nth(limit).unwrap_or((v.len(), ' '));
                    if !v[cut..].chars().all(|c| c == ' ') {
                        return Err(ServerError::StringDataRightTruncation(format!(
                            "value too long for type {type_name}({limit})"
                        )));
                    }
                    fixed.append_value(&v[..cut]);
                }
                other => fixed.append_option(other),
            }
        }
        *column = Arc::new(fixed.finish());
    }
    Ok(())
}

/// Casts `columns` to the stored schema, checking NOT NULL and declared
/// lengths.
fn stored_batch(db: &Database, desc: &TableDesc, columns: Vec<ArrayRef>) -> Result<RecordBatch> {
    let columns = columns
        .iter()
        .zip(desc.schema.fields())
        .map(|(c, f)| {
            if c.data_type() == f.data_type() {
                Ok(c.clone())
            } else {
                // Never a silent NULL for a value that does not convert,
                // and a numeric NaN or infinity kept as one (or refused
                // where the column's type has none).
                planner::functions::numeric_special::cast_keeping_specials(c, f.data_type())
            }
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| {
            let message = e.to_string();
            match ServerError::from(e) {
                ServerError::NumericOutOfRange(m) => ServerError::NumericOutOfRange(m),
                _ => ServerError::InvalidText(message),
            }
        })?;
    let mut columns = columns;
    check_lengths(db, desc, &mut columns)?;
    for (c, f) in columns.iter().zip(desc.schema.fields()) {
        if !f.is_nullable() && c.null_count() > 0 {
            return Err(ServerError::NotNullViolation(format!(
                "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                f.name(),
                desc.name
            )));
        }
    }
    RecordBatch::try_new(desc.schema.clone(), columns)
        .map_err(|e| ServerError::Internal(e.to_string()))
}

/// `INSERT INTO t [(cols)] VALUES … | SELECT …`.
pub async fn insert(
    db: &Arc<Database>,
    tx: Option<&mut Transaction>,
    insert: Insert,
) -> Result<QueryResult> {
    insert_with(db, tx, insert, None).await
}

/// The name under which `COPY … FROM STDIN`'s rows are read by the
/// `INSERT` that writes them.
/// A schema of its own, in the context of that one statement.
const COPY_ROWS: &str = "weir_copy.rows";

/// `COPY t [(columns)] FROM STDIN`'s decoded rows (text, `None` for NULL),
/// inserted as `INSERT INTO t (columns) SELECT …` would insert them: cast
/// to the column types, defaults for the columns not named, NOT NULL
/// checked, in one durable write.
///
/// A value that does not fit its column fails the whole `COPY`, with the
/// line it is on (`first_line` is the line of `rows[0]`) and its column.
pub async fn copy_in(
    db: &Arc<Database>,
    tx: Option<&mut Transaction>,
    table: &QualifiedName,
    columns: &[String],
    rows: &[Vec<Option<String>>],
    first_line: usize,
) -> Result<usize> {
    let desc = target(db, table, "copy to")?;
    let names: Vec<String> = if columns.is_empty() {
        crate::catalog::user_schema(&desc)
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    } else {
        columns.to_vec()
    };
    let schema = Arc::new(datafusion::arrow::datatypes::Schema::new(
        names
            .iter()
            .map(|n| datafusion::arrow::datatypes::Field::new(n, DataType::Utf8, true))
            .collect::<Vec<_>>(),
    ));
    let arrays: Vec<ArrayRef> = (0..names.len())
        .map(|i| Arc::new(StringArray::from_iter(rows.iter().map(|r| r[i].as_deref()))) as _)
        .collect();
    let batch =
        RecordBatch::try_new(schema, arrays).map_err(|e| ServerError::Internal(e.to_string()))?;
    let list = names
        .iter()
        .map(|n| quote(n))
        .collect::<Vec<_>>()
        .join(", ");
    let sql = format!(
        "INSERT INTO {} ({list}) SELECT {list} FROM {COPY_ROWS}",
        table.to_sql()
    );
    let Some(crate::sql::stmt::Stmt::Sql(stmt)) = crate::sql::stmt::parse(&sql)?.pop() else {
        return Err(ServerError::Internal(format!("not an INSERT: {sql}")));
    };
    let Statement::Insert(insert) = *stmt else {
        return Err(ServerError::Internal(format!("not an INSERT: {sql}")));
    };
    match insert_with(db, tx, insert.clone(), Some(batch.clone())).await {
        Ok(QueryResult::Command { rows, .. }) => Ok(rows.unwrap_or(0)),
        Ok(_) => Err(ServerError::Internal("INSERT returned rows".into())),
        Err(e) if is_data_error(&e) => {
            let Some(row) = failing_row(db, &desc, &insert, &batch).await else {
                return Err(e);
            };
            let message = e.to_string();
            // The column whose text the message quotes, if one does.
            use datafusion::arrow::array::Array;
            let column = (0..batch.num_columns()).find_map(|c| {
                let text = batch.column(c).as_any().downcast_ref::<StringArray>()?;
                let v = text.is_valid(row).then(|| text.value(row))?;
                (message.contains(&format!("'{v}'")) || message.contains(&format!("\"{v}\"")))
                    .then(|| format!(", column {}: \"{v}\"", names[c]))
            });
            let context = format!(
                "COPY {}, line {}{}",
                table.name,
                first_line + row,
                column.unwrap_or_default()
            );
            Err(with_context(e, &context))
        }
        Err(e) => Err(e),
    }
}

/// Whether `e` is about a value (its text, range, length or NULL): one
/// row of a `COPY` is to blame, and can be found.
fn is_data_error(e: &ServerError) -> bool {
    matches!(
        e,
        ServerError::InvalidText(_)
            | ServerError::NumericOutOfRange(_)
            | ServerError::NotNullViolation(_)
            | ServerError::StringDataRightTruncation(_)
    )
}

fn with_context(e: ServerError, context: &str) -> ServerError {
    match e {
        ServerError::InvalidText(m) => ServerError::InvalidText(format!("{m} ({context})")),
        ServerError::NumericOutOfRange(m) => {
            ServerError::NumericOutOfRange(format!("{m} ({context})"))
        }
        ServerError::NotNullViolation(m) => {
            ServerError::NotNullViolation(format!("{m} ({context})"))
        }
        ServerError::StringDataRightTruncation(m) => {
            ServerError::StringDataRightTruncation(format!("{m} ({context})"))
        }
        other => other,
    }
}

/// The first row of `rows` that the `INSERT` of a `COPY` cannot store,
/// found by halving: the rows before it store, it does not.
async fn failing_row(
    db: &Arc<Database>,
    desc: &TableDesc,
    insert: &Insert,
    rows: &RecordBatch,
) -> Option<usize> {
    let stores = |from: usize, len: usize| {
        let slice = rows.slice(from, len);
        async move {
            let mut columns = planned_rows(db, None, desc, insert.clone(), Some(slice)).await?;
            if desc.row_id {
                columns.push(Arc::new(Int64Array::from(vec![0; len])));
            }
            stored_batch(db, desc, columns).map(|_| ())
        }
    };
    let (mut from, mut to) = (0, rows.num_rows());
    if stores(from, to).await.is_ok() {
        return None;
    }
    // rows[from..to] fail; rows[..from] store.
    while to - from > 1 {
        let mid = from + (to - from) / 2;
        if stores(from, mid - from).await.is_ok() {
            from = mid;
        } else {
            to = mid;
        }
    }
    Some(from)
}

/// Whether `COPY table FROM STDIN` may write into `table`.
pub fn copy_target(db: &Database, table: &QualifiedName) -> Result<()> {
    target(db, table, "copy to").map(|_| ())
}

/// An `INSERT`; with `rows`, the statement reads them as `weir_copy.rows`.
async fn insert_with(
    db: &Arc<Database>,
    tx: Option<&mut Transaction>,
    insert: Insert,
    rows: Option<RecordBatch>,
) -> Result<QueryResult> {
    if insert.returning.is_some() || insert.on.is_some() || insert.overwrite {
        return Err(ServerError::unsupported(
            "INSERT … RETURNING / ON CONFLICT / OVERWRITE",
        ));
    }
    let TableObject::TableName(name) = &insert.table else {
        return Err(ServerError::unsupported("INSERT INTO a table function"));
    };
    let desc = target(db, &object_name(name)?, "insert into")?;
    let late = match db.catalog.get(desc.id) {
        Some(Entry::Table {
            late_rows: Some(late),
            watermark: Some(w),
            ..
        }) => Some((late, w)),
        _ => None,
    };
    if late.is_some() && tx.is_some() {
        // Which rows are late depends on the stream's watermark when they
        // are written, which a block's writes are not yet.
        return Err(ServerError::unsupported(
            "INSERT into a stream WITH (late_rows = …) inside a transaction block",
        ));
    }
    let fast = match rows {
        None => literal_values(db, &desc, &insert),
        Some(_) => None,
    };
    let mut columns = match fast {
        Some(columns) => columns,
        None => planned_rows(db, tx.as_deref(), &desc, insert, rows).await?,
    };
    let n = columns.first().map_or(0, |c| c.len());
    if desc.row_id {
        let first = db.cluster.tables.allocate_row_ids(desc.id, n)?;
        columns.push(Arc::new(Int64Array::from_iter_values(
            first..first + n as i64,
        )));
    }
    let batch = stored_batch(db, &desc, columns)?;
    let n = match late {
        Some((late, w)) => insert_behind_watermark(db, &desc, late, &w, batch).await?,
        None => apply(db, tx, desc.id, Chunk::inserts(batch)).await?,
    };
    Ok(QueryResult::Command {
        tag: "INSERT".into(),
        rows: Some(n),
    })
}

/// The rows an `INSERT` writes, each of the table's user columns, as
/// DataFusion computes them: its `SELECT` or `VALUES` planned and run.
async fn planned_rows(
    db: &Arc<Database>,
    tx: Option<&Transaction>,
    desc: &TableDesc,
    insert: Insert,
    rows: Option<RecordBatch>,
) -> Result<Vec<ArrayRef>> {
    let mut insert = insert;
    if let Some(source) = insert.source.as_mut() {
        // `INSERT … SELECT g FROM generate_series(1, 3) g` and the other
        // Postgres spellings a query may use.
        crate::sql::rewrite::rewrite(source)?;
        replace_default_keywords(db, desc, &insert.columns, source)?;
        name_source_columns(source);
        // As in Postgres, `VALUES` shorter than the table fills the
        // leading columns; the rest get NULL.
        if insert.columns.is_empty()
            && let datafusion::sql::sqlparser::ast::SetExpr::Values(values) = source.body.as_ref()
            && let Some(width) = values.rows.first().map(|r| r.len())
            && width < crate::catalog::user_schema(desc).fields().len()
        {
            insert.columns = desc.schema.fields()[..width]
                .iter()
                .map(|f| {
                    datafusion::sql::sqlparser::ast::ObjectName::from(vec![
                        datafusion::sql::sqlparser::ast::Ident::with_quote('"', f.name()),
                    ])
                })
                .collect();
        }
    }
    let ctx = context(db, Mode::Batch);
    reading_block(&ctx, tx);
    if let Some(rows) = rows {
        if let Some(catalog) = ctx.catalog("weir") {
            catalog.register_schema(
                "weir_copy",
                Arc::new(datafusion::catalog::MemorySchemaProvider::new()),
            )?;
        }
        ctx.register_batch(COPY_ROWS, rows)?;
    }
    // A long VALUES list is planned a slice at a time: planning is linear
    // in each slice, and the statement can be stopped between slices.
    let mut schema = None;
    let mut batches = Vec::new();
    let user_names: Vec<String> = crate::catalog::user_schema(desc)
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    for part in values_in_slices(insert) {
        let part_columns = part.columns.clone();
        let LogicalPlan::Dml(dml) = plan_statement(&ctx, Statement::Insert(part)).await? else {
            return Err(ServerError::Internal("INSERT did not plan as DML".into()));
        };
        let input_schema = dml.input.schema().inner().clone();
        let targets: Vec<String> = if part_columns.is_empty() {
            user_names.clone()
        } else {
            part_columns
                .iter()
                .map(|c| object_name(c).map_or_else(|_| c.to_string(), |n| n.name))
                .collect()
        };
        let produced = collect(&ctx, dml.input.as_ref().clone())
            .await
            .map_err(|e| name_not_null_column(e, &input_schema, &targets, desc))?;
        for b in produced {
            let first = schema.get_or_insert_with(|| input_schema.clone());
            batches.push(
                RecordBatch::try_new(first.clone(), b.columns().to_vec())
                    .map_err(|e| ServerError::Internal(e.to_string()))?,
            );
        }
        schema.get_or_insert(input_schema);
    }
    let user = crate::catalog::user_schema(desc);
    let schema = schema.ok_or_else(|| ServerError::Internal("INSERT planned nothing".into()))?;
    let rows =
        concat_batches(&schema, &batches).map_err(|e| ServerError::Internal(e.to_string()))?;
    Ok(rows.columns()[..user.fields().len()].to_vec())
}

/// An `INSERT … VALUES` of plain literals into the table's columns, as
/// arrays without planning (see [`crate::sql::values`]); `None` when the
/// statement needs the planner.
fn literal_values(db: &Database, desc: &TableDesc, insert: &Insert) -> Option<Vec<ArrayRef>> {
    use datafusion::sql::sqlparser::ast::SetExpr;
    let source = insert.source.as_ref()?;
    let SetExpr::Values(values) = source.body.as_ref() else {
        return None;
    };
    if source.with.is_some()
        || source.order_by.is_some()
        || source.limit_clause.is_some()
        || source.fetch.is_some()
    {
        return None;
    }
    let user = crate::catalog::user_schema(desc);
    let Some(Entry::Table {
        columns: declared, ..
    }) = db.catalog.get(desc.id)
    else {
        return None;
    };
    // Where each named (or leading) column's values go.
    let width = values.rows.first()?.len();
    let positions: Vec<usize> = if insert.columns.is_empty() {
        (0..width.min(user.fields().len())).collect()
    } else {
        insert
            .columns
            .iter()
            .map(|c| {
                let name = object_name(c).ok()?.name;
                user.fields().iter().position(|f| *f.name() == name)
            })
            .collect::<Option<_>>()?
    };
    let mut seen = vec![false; user.fields().len()];
    for p in &positions {
        if std::mem::replace(&mut seen[*p], true) {
            return None;
        }
    }
    // A column left out gets its default, which needs the planner.
    if seen
        .iter()
        .zip(declared.iter())
        .any(|(named, c)| !named && c.default.is_some())
    {
        return None;
    }
    let types: Vec<DataType> = positions
        .iter()
        .map(|p| user.field(*p).data_type().clone())
        .collect();
    let rows: Vec<&[datafusion::sql::sqlparser::ast::Expr]> =
        values.rows.iter().map(|r| r.as_slice()).collect();
    let given = crate::sql::values::literal_columns(&rows, &types)?;
    let n = values.rows.len();
    let mut columns: Vec<ArrayRef> = user
        .fields()
        .iter()
        .map(|f| datafusion::arrow::array::new_null_array(f.data_type(), n))
        .collect();
    for (p, c) in positions.into_iter().zip(given) {
        columns[p] = c;
    }
    Some(columns)
}

/// DataFusion's NOT NULL check names the column of the rows inserted
/// (`column3` of a `VALUES` list); Postgres names the table's column:
/// the one the `VALUES` column goes to (`targets`, in order), or the one
/// at the same place in the inserted rows.
fn name_not_null_column(
    e: ServerError,
    input: &datafusion::arrow::datatypes::SchemaRef,
    targets: &[String],
    desc: &TableDesc,
) -> ServerError {
    let ServerError::NotNullViolation(m) = &e else {
        return e;
    };
    let Some((name, _)) = m
        .strip_prefix("Column '")
        .and_then(|rest| rest.split_once("' is declared as non-nullable"))
    else {
        return e;
    };
    let column = match name
        .strip_prefix("column")
        .and_then(|n| n.parse::<usize>().ok())
    {
        Some(n) if n >= 1 => targets.get(n - 1).cloned(),
        _ => input
            .index_of(name)
            .ok()
            .and_then(|i| desc.schema.fields().get(i))
            .map(|f| f.name().clone()),
    };
    match column {
        Some(column) => ServerError::NotNullViolation(format!(
            "null value in column \"{column}\" of relation \"{}\" violates not-null constraint",
            desc.name
        )),
        None => e,
    }
}

/// Rows of a `VALUES` list planned at once.
const VALUES_SLICE: usize = 4096;

/// `insert`, or — when it inserts a plain `VALUES` list longer than
/// [`VALUES_SLICE`] rows — one `INSERT` per slice of the list.
fn values_in_slices(mut insert: Insert) -> Vec<Insert> {
    use datafusion::sql::sqlparser::ast::SetExpr;
    let Some(source) = insert.source.as_mut() else {
        return vec![insert];
    };
    let plain = source.with.is_none()
        && source.order_by.is_none()
        && source.limit_clause.is_none()
        && source.fetch.is_none();
    let rows = match source.body.as_mut() {
        SetExpr::Values(values) if plain && values.rows.len() > VALUES_SLICE => {
            std::mem::take(&mut values.rows)
        }
        _ => return vec![insert],
    };
    let mut parts = Vec::with_capacity(rows.len().div_ceil(VALUES_SLICE));
    let mut rows = rows.into_iter().peekable();
    while rows.peek().is_some() {
        let mut part = insert.clone();
        if let Some(SetExpr::Values(values)) = part.source.as_mut().map(|s| s.body.as_mut()) {
            values.rows = rows.by_ref().take(VALUES_SLICE).collect();
        }
        parts.push(part);
    }
    parts
}

/// An insert into a stream `WITH (late_rows = …)`: rows whose watermark
/// column is behind the stream's watermark (the largest watermark
/// expression of the rows before them) go to the late rows' stream, the
/// rest to the stream, in one durable write. Statements take turns, so each
/// sees the watermark its predecessors left.
async fn insert_behind_watermark(
    db: &Database,
    desc: &TableDesc,
    late: u64,
    w: &crate::catalog::WatermarkDef,
    batch: RecordBatch,
) -> Result<usize> {
    let user = crate::catalog::user_schema(desc);
    let df = datafusion::common::DFSchema::try_from(user.as_ref().clone())?;
    let ctx = planner::context::new_context();
    let exprs = [
        ctx.parse_sql_expr(&w.expr, &df)?,
        ctx.parse_sql_expr(&format!("\"{}\"", w.column.replace('"', "\"\"")), &df)?,
    ];
    let compiled = executor::expr::compile(&exprs, &df)?;
    let micros = |b: &RecordBatch| -> Result<(Int64Array, Int64Array)> {
        let user_cols = b.columns()[..user.fields().len()].to_vec();
        let b = RecordBatch::try_new(user.clone(), user_cols)
            .map_err(|e| ServerError::Internal(e.to_string()))?;
        let values = executor::expr::evaluate(&compiled, &b)?;
        Ok((
            executor::expr::timestamp_micros(&values[0])?,
            executor::expr::timestamp_micros(&values[1])?,
        ))
    };
    let mut watermarks = db.stream_watermarks.lock().await;
    let current = match watermarks.get(&desc.id) {
        Some(wm) => Some(*wm),
        None => {
            // First write since the server started: the stream's rows
            // say, read a page at a time.
            use executor::task::TableLog;
            use futures::StreamExt;
            let (_, mut rows) = db.cluster.tables.clone().snapshot_stream(desc.id).await?;
            let mut max = None;
            while let Some(b) = rows.next().await {
                max = max.max(micros(&b?)?.0.iter().flatten().max());
            }
            max
        }
    };
    let (marks, times) = micros(&batch)?;
    let is_late: Vec<bool> = times
        .iter()
        .map(|t| matches!((t, current), (Some(t), Some(wm)) if t < wm))
        .collect();
    let on_time = datafusion::arrow::compute::filter_record_batch(
        &batch,
        &is_late.iter().map(|l| Some(!l)).collect(),
    )
    .map_err(|e| ServerError::Internal(e.to_string()))?;
    let late_rows = datafusion::arrow::compute::filter_record_batch(
        &batch,
        &is_late.iter().map(|l| Some(*l)).collect(),
    )
    .map_err(|e| ServerError::Internal(e.to_string()))?;
    let advanced = marks
        .iter()
        .zip(&is_late)
        .filter(|(_, late)| !**late)
        .filter_map(|(m, _)| m)
        .max()
        .max(current);
    let mut writes = Vec::new();
    if on_time.num_rows() > 0 {
        writes.push((desc.id, Chunk::inserts(on_time)));
    }
    if late_rows.num_rows() > 0 {
        // The late stream numbers its rows itself.
        let late_desc = db.cluster.tables.desc(late)?;
        let n = late_rows.num_rows();
        let first = db.cluster.tables.allocate_row_ids(late, n)?;
        let mut columns = late_rows.columns()[..user.fields().len()].to_vec();
        columns.push(Arc::new(Int64Array::from_iter_values(
            first..first + n as i64,
        )));
        writes.push((late, Chunk::inserts(stored_batch(db, &late_desc, columns)?)));
    }
    let n = batch.num_rows();
    crate::engine::transaction::write(db, None, writes).await?;
    if let Some(wm) = advanced {
        watermarks.insert(desc.id, wm);
    }
    Ok(n)
}

/// `VALUES (1, DEFAULT)`: each `DEFAULT` becomes its column's default
/// expression, or NULL.
fn replace_default_keywords(
    db: &Database,
    desc: &TableDesc,
    columns: &[datafusion::sql::sqlparser::ast::ObjectName],
    source: &mut datafusion::sql::sqlparser::ast::Query,
) -> Result<()> {
    use datafusion::sql::sqlparser::ast::{Expr as SqlExpr, SetExpr};
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let SetExpr::Values(values) = source.body.as_mut() else {
        return Ok(());
    };
    let Some(Entry::Table {
        columns: declared, ..
    }) = db.catalog.get(desc.id)
    else {
        return Ok(());
    };
    let names: Vec<String> = if columns.is_empty() {
        declared.iter().map(|c| c.name.clone()).collect()
    } else {
        columns
            .iter()
            .map(|c| object_name(c).map(|n| n.name))
            .collect::<Result<_>>()?
    };
    // Each position's column type, for the string literals whose text
    // DataFusion would misread (see `literals`).
    let types: Vec<Option<DataType>> = names
        .iter()
        .map(|n| {
            declared
                .iter()
                .find(|c| &c.name == n)
                .and_then(|c| crate::sql::types::parse_type(&c.sql_type).ok())
        })
        .collect();
    for row in &mut values.rows {
        for (i, e) in row.iter_mut().enumerate() {
            if let Some(Some(t)) = types.get(i) {
                crate::sql::literals::type_string(e, t)?;
            }
            let SqlExpr::Identifier(id) = e else {
                continue;
            };
            if id.quote_style.is_some() || !id.value.eq_ignore_ascii_case("default") {
                continue;
            }
            let default = names
                .get(i)
                .and_then(|n| declared.iter().find(|c| &c.name == n))
                .and_then(|c| c.default.clone())
                .unwrap_or_else(|| "NULL".into());
            *e = Parser::new(&PostgreSqlDialect {})
                .try_with_sql(&default)
                .and_then(|mut p| p.parse_expr())
                .map_err(|e| ServerError::Internal(format!("stored default {default}: {e}")))?;
        }
    }
    Ok(())
}

/// Gives every item of an `INSERT … SELECT` a distinct name: only positions
/// matter there, and Postgres accepts `SELECT v, v`.
fn name_source_columns(source: &mut datafusion::sql::sqlparser::ast::Query) {
    use datafusion::sql::sqlparser::ast::{Ident, SelectItem, SetExpr};
    let SetExpr::Select(select) = source.body.as_mut() else {
        return;
    };
    for (i, item) in select.projection.iter_mut().enumerate() {
        let expr = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e.clone(),
            _ => continue,
        };
        *item = SelectItem::ExprWithAlias {
            expr,
            alias: Ident::with_quote('"', format!("__column_{i}")),
        };
    }
}

fn single_table(t: &TableWithJoins, verb: &str) -> Result<QualifiedName> {
    if !t.joins.is_empty() {
        return Err(ServerError::unsupported(format!("{verb} with joins")));
    }
    match &t.relation {
        TableFactor::Table { name, .. } => object_name(name),
        other => Err(ServerError::unsupported(format!("{verb} of {other}"))),
    }
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Runs `SELECT <stored columns>[, extra] FROM <relation> [WHERE …]`.
async fn select_rows(
    db: &Arc<Database>,
    tx: Option<&Transaction>,
    desc: &TableDesc,
    relation: &TableWithJoins,
    extra: &[String],
    selection: Option<&datafusion::sql::sqlparser::ast::Expr>,
) -> Result<RecordBatch> {
    let mut items: Vec<String> = desc
        .schema
        .fields()
        .iter()
        .map(|f| quote(f.name()))
        .collect();
    items.extend(extra.iter().cloned());
    let mut sql = format!("SELECT {} FROM {}", items.join(", "), relation);
    if let Some(sel) = selection {
        sql.push_str(&format!(" WHERE {sel}"));
    }
    let ctx = context(db, Mode::Dml(desc.id));
    reading_block(&ctx, tx);
    let Some(crate::sql::stmt::Stmt::Sql(s)) = crate::sql::stmt::parse(&sql)?.pop() else {
        return Err(ServerError::Internal(format!("cannot re-parse {sql}")));
    };
    let plan = plan_statement(&ctx, *s).await?;
    let schema = plan.schema().inner().clone();
    let batches = collect(&ctx, plan).await?;
    concat_batches(&schema, &batches).map_err(|e| ServerError::Internal(e.to_string()))
}

/// `UPDATE t SET c = e, … [WHERE …]`.
pub async fn update(
    db: &Arc<Database>,
    tx: Option<&mut Transaction>,
    update: Update,
) -> Result<QueryResult> {
    if update.from.is_some() || update.returning.is_some() || update.limit.is_some() {
        return Err(ServerError::unsupported(
            "UPDATE … FROM / RETURNING / LIMIT",
        ));
    }
    let name = single_table(&update.table, "UPDATE")?;
    let desc = target(db, &name, "update")?;
    // Which stored column each assignment sets.
    let mut assigned: Vec<Option<usize>> = vec![None; desc.schema.fields().len()];
    let column_types: Vec<Option<String>> = match db.catalog.get(desc.id) {
        Some(Entry::Table { columns, .. }) => columns
            .iter()
            .map(|c| {
                let t = c.sql_type.to_lowercase();
                // Lengths are checked when the row is stored.
                let base = t.split('(').next().unwrap_or_default().trim().to_string();
                let t = if [
                    "varchar",
                    "character varying",
                    "char",
                    "character",
                    "bpchar",
                ]
                .contains(&base.as_str())
                {
                    "text".to_string()
                } else {
                    t
                };
                Some(t)
            })
            .collect(),
        _ => Vec::new(),
    };
    let mut extra = Vec::new();
    for (k, Assignment { target, value }) in update.assignments.iter().enumerate() {
        let AssignmentTarget::ColumnName(col) = target else {
            return Err(ServerError::unsupported("UPDATE of a column tuple"));
        };
        let Some(last) = col.0.last().and_then(|p| p.as_ident()) else {
            return Err(ServerError::Syntax(format!("bad column {col}")));
        };
        let col_name = ident(last);
        let Some(i) = desc
            .schema
            .fields()
            .iter()
            .position(|f| f.name() == &col_name && f.name() != storage::table::ROW_ID_COLUMN)
        else {
            return Err(ServerError::UndefinedColumn(format!(
                "column \"{col_name}\" of relation \"{name}\" does not exist"
            )));
        };
        if assigned[i].is_some() {
            return Err(ServerError::Syntax(format!(
                "multiple assignments to same column \"{col_name}\""
            )));
        }
        assigned[i] = Some(k);
        // Cast as the column's type, as Postgres assigns: text is read
        // by the type's input rules.
        let cast_to = column_types
            .get(i)
            .cloned()
            .flatten()
            .map(|t| format!("CAST(({value}) AS {t})"))
            .unwrap_or_else(|| value.to_string());
        extra.push(format!("{cast_to} AS {}", quote(&format!("__new_{k}"))));
    }
    let rows = select_rows(
        db,
        tx.as_deref(),
        &desc,
        &update.table,
        &extra,
        update.selection.as_ref(),
    )
    .await?;
    let n_stored = desc.schema.fields().len();
    let old = rows
        .project(&(0..n_stored).collect::<Vec<_>>())
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    let new_columns: Vec<ArrayRef> = (0..n_stored)
        .map(|i| match assigned[i] {
            Some(k) => rows.column(n_stored + k).clone(),
            None => rows.column(i).clone(),
        })
        .collect();
    let new = stored_batch(db, &desc, new_columns)?;
    let n = old.num_rows();
    let both = concat_batches(&desc.schema, [&old, &new])
        .map_err(|e| ServerError::Internal(e.to_string()))?;
    let ops: Vec<Op> = std::iter::repeat_n(Op::UpdateDelete, n)
        .chain(std::iter::repeat_n(Op::UpdateInsert, n))
        .collect();
    apply(db, tx, desc.id, Chunk::with_ops(&ops, both)).await?;
    Ok(QueryResult::Command {
        tag: "UPDATE".into(),
        rows: Some(n),
    })
}

/// `DELETE FROM t [WHERE …]`.
/// `TRUNCATE [TABLE] t, …`: every row of each table deleted as `DELETE
/// FROM t` deletes them, so that views see the rows go. Weir has no
/// sequences and no foreign keys, so `RESTART IDENTITY` and `CASCADE`
/// change nothing more.
pub async fn truncate(
    db: &Arc<Database>,
    mut tx: Option<&mut Transaction>,
    truncate: datafusion::sql::sqlparser::ast::Truncate,
) -> Result<QueryResult> {
    if truncate.partitions.is_some() || truncate.on_cluster.is_some() {
        return Err(ServerError::unsupported(
            "TRUNCATE … PARTITION | ON CLUSTER",
        ));
    }
    let names = truncate
        .table_names
        .iter()
        .map(|t| object_name(&t.name))
        .collect::<Result<Vec<_>>>()?;
    // Every table checked before any is emptied.
    for name in &names {
        target(db, name, "truncate")?;
    }
    for name in names {
        let sql = format!("DELETE FROM {}", name.to_sql());
        let Some(crate::sql::stmt::Stmt::Sql(stmt)) = crate::sql::stmt::parse(&sql)?.pop() else {
            return Err(ServerError::Internal(format!("not a DELETE: {sql}")));
        };
        let Statement::Delete(d) = *stmt else {
            return Err(ServerError::Internal(format!("not a DELETE: {sql}")));
        };
        delete(db, tx.as_deref_mut(), d).await?;
    }
    Ok(QueryResult::command("TRUNCATE TABLE"))
}

pub async fn delete(
    db: &Arc<Database>,
    tx: Option<&mut Transaction>,
    delete: Delete,
) -> Result<QueryResult> {
    if !delete.tables.is_empty()
        || delete.using.is_some()
        || delete.returning.is_some()
        || delete.limit.is_some()
    {
        return Err(ServerError::unsupported(
            "DELETE … USING / RETURNING / LIMIT",
        ));
    }
    let (FromTable::WithFromKeyword(from) | FromTable::WithoutKeyword(from)) = &delete.from;
    let [relation] = from.as_slice() else {
        return Err(ServerError::unsupported("DELETE from several tables"));
    };
    let name = single_table(relation, "DELETE")?;
    let desc = target(db, &name, "delete from")?;
    let rows = select_rows(
        db,
        tx.as_deref(),
        &desc,
        relation,
        &[],
        delete.selection.as_ref(),
    )
    .await?;
    let n = rows.num_rows();
    let ops = vec![Op::Delete; n];
    apply(db, tx, desc.id, Chunk::with_ops(&ops, rows)).await?;
    Ok(QueryResult::Command {
        tag: "DELETE".into(),
        rows: Some(n),
    })
}

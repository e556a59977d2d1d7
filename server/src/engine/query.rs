//! Queries: `SELECT` runs on DataFusion over tables' current rows and views'
//! state at their latest committed checkpoint; `SHOW` and `EXPLAIN`.

use std::sync::Arc;

use datafusion::arrow::datatypes::{Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::execution::context::SessionContext;
use datafusion::sql::sqlparser::ast::{Query, Statement};

use crate::engine::context::{Mode, context, plan_statement};
use crate::engine::session::Session;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::apply_pg_names;

/// `SELECT …`.
pub async fn select(
    db: &Arc<Database>,
    session: &mut Session,
    mut q: Query,
) -> Result<QueryResult> {
    let info = session.catalog_info();
    let set_by_query = info.set_by_query.clone();
    let ctx = context(db, Mode::Batch);
    crate::catalog::pg_catalog::register(&ctx, db.clone(), info);
    crate::engine::context::reading_block(&ctx, session.tx.as_ref());
    let names = prepare(&ctx, &mut q).await?;
    let plan = plan_statement(&ctx, Statement::Query(Box::new(q))).await?;
    let schema = renamed(plan.schema().inner(), names.as_deref());
    let batches = ctx
        .execute_logical_plan(plan)
        .await?
        .collect()
        .await?
        .into_iter()
        .map(|b| RecordBatch::try_new(renamed(&b.schema(), names.as_deref()), b.columns().to_vec()))
        .collect::<std::result::Result<_, _>>()?;
    let settings = std::mem::take(&mut *set_by_query.lock().unwrap_or_else(|e| e.into_inner()));
    for (name, value) in settings {
        session.set(&name, &value)?;
    }
    Ok(QueryResult::Rows { schema, batches })
}

/// A query as DataFusion is to plan it: Postgres's catalog spellings
/// rewritten, its columns named as Postgres names them where DataFusion
/// can use those names. Returns the names the client is to see, which the
/// result's schema takes after planning (see [`renamed`]): they are of
/// what the client wrote, before the rewrite, and may repeat. A
/// `CORRESPONDING` is written out first (it needs `ctx`), as it decides
/// which columns there are.
pub async fn prepare(ctx: &SessionContext, q: &mut Query) -> Result<Option<Vec<String>>> {
    crate::sql::corresponding::resolve(ctx, q).await?;
    let names = crate::sql::stmt::output_names(q);
    apply_pg_names(q);
    crate::sql::rewrite::rewrite(q)?;
    crate::sql::stmt::distinct_output_names(q);
    Ok(names)
}

/// `schema` with its fields named `names`, when given; otherwise with the
/// names the catalog rewrite had to make unique given back (see
/// [`crate::sql::rewrite::SAME_NAME`]).
pub fn renamed(schema: &SchemaRef, names: Option<&[String]>) -> SchemaRef {
    let marker = crate::sql::rewrite::SAME_NAME;
    match names {
        None if schema.fields().iter().any(|f| f.name().starts_with(marker)) => {
            Arc::new(Schema::new_with_metadata(
                schema
                    .fields()
                    .iter()
                    .map(|f| {
                        let name = f
                            .name()
                            .split_once(':')
                            .map_or(f.name().as_str(), |(_, n)| n);
                        let name = name.to_string();
                        f.as_ref().clone().with_name(name)
                    })
                    .collect::<Vec<_>>(),
                schema.metadata().clone(),
            ))
        }
        Some(names) if names.len() == schema.fields().len() => Arc::new(Schema::new_with_metadata(
            schema
                .fields()
                .iter()
                .zip(names)
                .map(|(f, n)| f.as_ref().clone().with_name(n))
                .collect::<Vec<_>>(),
            schema.metadata().clone(),
        )),
        _ => schema.clone(),
    }
}

/// A batch query's context: the catalog's tables and views, and the
/// catalogs Postgres clients read with their functions.
pub fn query_context(db: &Arc<Database>, session: &Session) -> SessionContext {
    let ctx = context(db, Mode::Batch);
    crate::catalog::pg_catalog::register(&ctx, db.clone(), session.catalog_info());
    crate::engine::context::reading_block(&ctx, session.tx.as_ref());
    ctx
}

/// `EXPLAIN SELECT …`: DataFusion's logical and physical plans.
pub async fn explain(db: &Arc<Database>, session: &Session, mut q: Query) -> Result<QueryResult> {
    let ctx = query_context(db, session);
    prepare(&ctx, &mut q).await?;
    let sql = format!("EXPLAIN {q}");
    let df = ctx.sql(&sql).await?;
    let schema = df.schema().inner().clone();
    let batches = df.collect().await?;
    Ok(QueryResult::Rows { schema, batches })
}

/// `SHOW TABLES [FROM | IN schema] [LIKE 'pattern']`: with a schema, its
/// tables by their names there; without, every table (named `s.t` outside
/// `public`, as `SHOW MATERIALIZED VIEWS` names views).
pub fn show_tables(
    db: &Arc<Database>,
    options: &datafusion::sql::sqlparser::ast::ShowStatementOptions,
) -> Result<QueryResult> {
    use datafusion::sql::sqlparser::ast::{ShowStatementFilter, ShowStatementFilterPosition};
    if options.starts_with.is_some() || options.limit.is_some() {
        return Err(ServerError::unsupported(
            "SHOW TABLES … STARTS WITH | LIMIT",
        ));
    }
    let schema = match options
        .show_in
        .as_ref()
        .and_then(|i| i.parent_name.as_ref())
    {
        Some(name) => {
            let schema = match name.0.as_slice() {
                [_, _] => crate::sql::stmt::object_name(name)?.name,
                _ => crate::sql::stmt::simple_name(name)?,
            };
            if !db.catalog.has_schema(&schema) {
                return Err(ServerError::InvalidSchemaName(format!(
                    "schema \"{schema}\" does not exist"
                )));
            }
            Some(schema)
        }
        None => None,
    };
    let mut names: Vec<String> = db
        .catalog
        .all()
        .into_iter()
        .filter(|e| e.kind() == "table")
        .filter_map(|e| match &schema {
            Some(s) if s == e.schema() => Some(e.name().to_string()),
            Some(_) => None,
            None => Some(e.qualified().to_string()),
        })
        .collect();
    names.sort();
    let pattern = match &options.filter_position {
        None => None,
        Some(ShowStatementFilterPosition::Infix(f) | ShowStatementFilterPosition::Suffix(f)) => {
            match f {
                ShowStatementFilter::Like(p) => Some((p.clone(), false)),
                ShowStatementFilter::ILike(p) => Some((p.clone(), true)),
                other => {
                    return Err(ServerError::unsupported(format!(
                        "SHOW TABLES {other} (LIKE 'pattern' filters)"
                    )));
                }
            }
        }
    };
    if let Some((pattern, insensitive)) = pattern {
        use datafusion::arrow::array::{Scalar, StringArray};
        use datafusion::arrow::compute::kernels::comparison::{ilike, like};
        let all = StringArray::from(names.clone());
        let pattern = Scalar::new(StringArray::from(vec![pattern]));
        let keep = if insensitive {
            ilike(&all, &pattern)
        } else {
            like(&all, &pattern)
        }
        .map_err(|e| ServerError::InvalidParameter(e.to_string()))?;
        names = names
            .into_iter()
            .zip(keep.iter())
            .filter_map(|(n, k)| k.unwrap_or(false).then_some(n))
            .collect();
    }
    QueryResult::text("Name", names)
}

/// `SHOW CREATE [MATERIALIZED] VIEW name`: its name and the statement
/// that creates it, from the query the catalog keeps (names qualified).
pub fn show_create_view(
    db: &Arc<Database>,
    name: &crate::sql::stmt::QualifiedName,
    materialized: bool,
) -> Result<QueryResult> {
    use crate::catalog::Entry;
    let kind = if materialized {
        "materialized view"
    } else {
        "view"
    };
    let sql = match db.catalog.by_name(name) {
        Some(Entry::View { sql, .. }) if !materialized => sql,
        Some(Entry::MaterializedView { sql, .. }) if materialized => sql,
        Some(other) => {
            return Err(ServerError::WrongObjectType(format!(
                "\"{name}\" is a {}, not a {kind}",
                other.kind()
            )));
        }
        None => {
            return Err(ServerError::UndefinedTable(format!(
                "{kind} \"{name}\" does not exist"
            )));
        }
    };
    let create = format!("CREATE {} {} AS {sql}", kind.to_uppercase(), name.to_sql());
    QueryResult::texts(
        &["Name", "Create Sql"],
        vec![vec![name.to_string(), create]],
    )
}

/// `SHOW SCHEMAS`: every schema, the system's and users'.
pub fn show_schemas(db: &Arc<Database>) -> Result<QueryResult> {
    let mut names: Vec<String> = [
        "pg_catalog",
        "information_schema",
        crate::catalog::system::SCHEMA,
    ]
    .into_iter()
    .map(String::from)
    .chain(db.catalog.schemas().into_iter().map(|(n, _)| n))
    .collect();
    names.sort();
    QueryResult::text("Name", names)
}

/// `SHOW VIEWS`, `SHOW MATERIALIZED VIEWS`.
pub fn show_objects(db: &Arc<Database>, kind: &str) -> Result<QueryResult> {
    let mut names: Vec<String> = db
        .catalog
        .all()
        .into_iter()
        .filter(|e| e.kind() == kind)
        .map(|e| e.qualified().to_string())
        .collect();
    names.sort();
    QueryResult::text("Name", names)
}

/// `SHOW SOURCES`: each source with its connector and options.
pub fn show_sources(db: &Arc<Database>) -> Result<QueryResult> {
    let rows = db
        .catalog
        .all()
        .into_iter()
        .filter_map(|e| match &e {
            crate::catalog::Entry::Source { connector, .. } => {
                let (format, options) = crate::catalog::connector_text(connector);
                Some(vec![
                    e.qualified().to_string(),
                    connector.connector.clone(),
                    format,
                    options,
                ])
            }
            _ => None,
        })
        .collect();
    QueryResult::texts(&["name", "connector", "format", "options"], rows)
}

/// `SHOW JOBS`: every view's job and where its subtasks run.
pub fn show_jobs(db: &Arc<Database>) -> Result<QueryResult> {
    let rows = db
        .cluster
        .job_manager
        .jobs()
        .into_iter()
        .map(|j| {
            let view = db
                .catalog
                .get(j.job)
                .map(|e| e.qualified().to_string())
                .unwrap_or_default();
            let subtasks: Vec<String> = j
                .subtasks
                .iter()
                .map(|(vertex, i, slot, state)| format!("{vertex}#{i}@{slot}:{state}"))
                .collect();
            vec![
                j.job.to_string(),
                view,
                j.state,
                j.last_checkpoint.to_string(),
                subtasks.join(" "),
            ]
        })
        .collect();
    QueryResult::texts(
        &["job", "name", "state", "last_checkpoint", "subtasks"],
        rows,
    )
}

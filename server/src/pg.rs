//! The pgwire front end: one [`Connection`] per client socket, serving the
//! simple and the extended query protocol over a [`Session`].

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use arrow_pg::datatypes::{arrow_schema_to_pg_fields, into_pg_type};
use arrow_pg::encoder::{Encoder, encode_value};
use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
use datafusion::sql::sqlparser::ast::Statement;
use futures::{FutureExt, Sink, SinkExt, stream};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::DataRowEncoder;
use pgwire::api::results::{FieldFormat, FieldInfo, QueryResponse, Response, Tag};
use pgwire::api::stmt::QueryParser;
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, PgWireServerHandlers, Type};
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyOutResponse};
use pgwire::messages::data::{DataRow, RowDescription};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use tokio::net::TcpListener;

use crate::context::plan_statement;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::params;
use crate::session::Session;
use crate::stmt::{self, Stmt};
use crate::subscribe::Subscription;

/// The user and the database clients connect as.
pub const USER: &str = "weir";
pub const DATABASE: &str = "weir";

/// A statement prepared by the extended protocol.
#[derive(Debug, Clone)]
pub struct Prepared {
    stmt: Stmt,
    /// Types of `$1`, `$2`, …
    param_types: Vec<Type>,
    /// Columns of the result, for queries.
    schema: Option<SchemaRef>,
}

/// Parses and describes statements for the extended protocol.
#[derive(Debug)]
pub struct Parser {
    db: Arc<Database>,
    /// The connection's session: `FETCH` is described by its cursor.
    session: Arc<tokio::sync::Mutex<Session>>,
}

impl Parser {
    async fn prepare(&self, sql: &str, client_types: &[Option<Type>]) -> Result<Option<Prepared>> {
        let mut stmts = stmt::parse(sql)?;
        if stmts.len() > 1 {
            return Err(ServerError::Syntax(
                "cannot insert multiple commands into a prepared statement".into(),
            ));
        }
        let Some(stmt) = stmts.pop() else {
            return Ok(None);
        };
        let mut param_types = Vec::new();
        let mut schema = None;
        match &stmt {
            Stmt::Subscribe {
                subscribe,
                copy: false,
            } => {
                schema = Some(Subscription::open(&self.db, subscribe).await?.schema());
            }
            Stmt::Fetch { cursor, .. } => {
                schema = self
                    .session
                    .lock()
                    .await
                    .cursors
                    .get(cursor)
                    .map(Subscription::schema);
            }
            _ => {}
        }
        if let Stmt::Sql(s) = &stmt {
            let names = stmt::placeholders(s);
            let mut names_seen = None;
            let planned = match s.as_ref() {
                Statement::Query(q) => {
                    let mut q = q.clone();
                    names_seen = crate::query::prepare(&mut q)?;
                    Some(Statement::Query(q))
                }
                Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)
                    if !names.is_empty() =>
                {
                    Some(s.as_ref().clone())
                }
                _ => None,
            };
            let mut inferred = HashMap::new();
            if let Some(planned) = planned {
                let is_query = matches!(planned, Statement::Query(_));
                let ctx = {
                    let session = self.session.lock().await;
                    crate::query::query_context(&self.db, &session)
                };
                match plan_statement(&ctx, planned).await {
                    Ok(plan) => {
                        if is_query {
                            schema = Some(crate::query::renamed(
                                plan.schema().inner(),
                                names_seen.as_deref(),
                            ));
                        }
                        inferred = plan.get_parameter_types().unwrap_or_default();
                    }
                    // A query must plan; DML may still run without inference.
                    Err(e) if is_query => return Err(e),
                    Err(_) => {}
                }
            }
            let count = names
                .iter()
                .filter_map(|n| n.trim_start_matches('$').parse::<usize>().ok())
                .max()
                .unwrap_or(0)
                .max(client_types.len());
            for i in 0..count {
                let from_client = client_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .filter(|t| *t != Type::UNKNOWN);
                let t = from_client.unwrap_or_else(|| {
                    inferred
                        .get(&format!("${}", i + 1))
                        .cloned()
                        .flatten()
                        .and_then(|dt| into_pg_type(&dt).ok())
                        .unwrap_or(Type::TEXT)
                });
                param_types.push(t);
            }
        }
        Ok(Some(Prepared {
            stmt,
            param_types,
            schema,
        }))
    }
}

fn fields(schema: &SchemaRef, format: &Format) -> PgWireResult<Vec<FieldInfo>> {
    arrow_schema_to_pg_fields(schema, format, None)
}

#[async_trait]
impl QueryParser for Parser {
    type Statement = Prepared;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        types: &[Option<Type>],
    ) -> PgWireResult<Option<Prepared>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        Ok(self.prepare(sql, types).await?)
    }

    fn get_parameter_types(&self, stmt: &Prepared) -> PgWireResult<Vec<Type>> {
        Ok(stmt.param_types.clone())
    }

    fn get_result_schema(
        &self,
        stmt: &Prepared,
        format: Option<&Format>,
    ) -> PgWireResult<Vec<FieldInfo>> {
        match &stmt.schema {
            Some(schema) => fields(schema, format.unwrap_or(&Format::UnifiedText)),
            None => Ok(Vec::new()),
        }
    }
}

/// One client connection.
#[derive(Debug)]
pub struct Connection {
    db: Arc<Database>,
    session: Arc<tokio::sync::Mutex<Session>>,
    parser: Arc<Parser>,
}

impl Connection {
    pub fn new(db: Arc<Database>) -> Self {
        let session = Arc::new(tokio::sync::Mutex::new(Session::new(
            db.default_parallelism,
        )));
        Self {
            parser: Arc::new(Parser {
                db: db.clone(),
                session: session.clone(),
            }),
            db,
            session,
        }
    }

    /// Runs one statement; a panic becomes an error, never a dead server.
    async fn run(&self, stmt: Stmt) -> Result<QueryResult> {
        let mut session = self.session.lock().await;
        let fut = self.db.execute(&mut session, stmt);
        match std::panic::AssertUnwindSafe(fut).catch_unwind().await {
            Ok(r) => r,
            Err(panic) => {
                let msg = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                tracing::error!(panic = %msg, "statement panicked");
                Err(ServerError::Internal(format!("internal error: {msg}")))
            }
        }
    }
}

/// Sends a subscription's rows as they come, each batch flushed at once
/// (a query response would hold them back until it ends), until the client
/// goes or the subscription fails. With `copy`, as COPY's text format
/// (`COPY (SUBSCRIBE …) TO STDOUT`).
async fn stream_subscription<C>(
    client: &mut C,
    mut sub: Box<Subscription>,
    format: &Format,
    describe: bool,
    copy: bool,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    let format = if copy { &Format::UnifiedText } else { format };
    let fields = Arc::new(fields(&sub.schema(), format)?);
    if copy {
        let n = fields.len();
        let start = CopyOutResponse::new(0, n as i16, vec![0; n]);
        client
            .send(PgWireBackendMessage::CopyOutResponse(start))
            .await?;
    } else if describe {
        let description = RowDescription::new(fields.iter().map(Into::into).collect());
        client
            .send(PgWireBackendMessage::RowDescription(description))
            .await?;
    }
    loop {
        let batches = sub.fetch(usize::MAX, None).await?;
        let mut rows = Vec::new();
        for batch in &batches {
            encode_rows(&fields, batch, &mut rows);
        }
        for row in rows {
            let row = row?;
            let message = if copy {
                PgWireBackendMessage::CopyData(CopyData::new(copy_text(&row).into()))
            } else {
                PgWireBackendMessage::DataRow(row)
            };
            client.feed(message).await?;
        }
        client.flush().await?;
    }
}

/// A text-format row as a line of COPY's text format: tab-separated,
/// `\N` for NULL, backslash escapes.
fn copy_text(row: &DataRow) -> Vec<u8> {
    let mut out = Vec::with_capacity(row.data.len() + 1);
    let mut data = &row.data[..];
    for i in 0..row.field_count {
        if i > 0 {
            out.push(b'\t');
        }
        let Some((len, rest)) = data.split_first_chunk::<4>() else {
            break;
        };
        let len = i32::from_be_bytes(*len);
        data = rest;
        if len < 0 {
            out.extend_from_slice(b"\\N");
            continue;
        }
        let (value, rest) = data.split_at((len as usize).min(data.len()));
        data = rest;
        for &b in value {
            match b {
                b'\\' => out.extend_from_slice(b"\\\\"),
                b'\t' => out.extend_from_slice(b"\\t"),
                b'\n' => out.extend_from_slice(b"\\n"),
                b'\r' => out.extend_from_slice(b"\\r"),
                b => out.push(b),
            }
        }
    }
    out.push(b'\n');
    out
}

/// Encodes a batch's rows. NULLs are written here rather than left to
/// `arrow_pg`, whose interval encoder does not check for them.
fn encode_rows(
    fields: &Arc<Vec<FieldInfo>>,
    batch: &RecordBatch,
    out: &mut Vec<PgWireResult<DataRow>>,
) {
    let schema = batch.schema();
    let mut encoder = DataRowEncoder::new(fields.clone());
    // Timestamps in text as Postgres prints them: no trailing zeros, "+00".
    let timestamps: Vec<Option<(Int64Array, bool)>> = batch
        .columns()
        .iter()
        .zip(fields.iter())
        .map(|(a, f)| match a.data_type() {
            DataType::Timestamp(_, tz) if f.format() == FieldFormat::Text => {
                cast(a, &DataType::Timestamp(TimeUnit::Microsecond, None))
                    .ok()
                    .and_then(|c| cast(&c, &DataType::Int64).ok())
                    .map(|c| (c.as_primitive::<Int64Type>().clone(), tz.is_some()))
            }
            _ => None,
        })
        .collect();
    // Floats in text as Postgres prints them: shortest round-trip digits,
    // "4" not "4.0", and NaN / Infinity spelled its way.
    let floats: Vec<Option<datafusion::arrow::array::Float64Array>> = batch
        .columns()
        .iter()
        .zip(fields.iter())
        .map(|(a, f)| match a.data_type() {
            DataType::Float32 | DataType::Float64 if f.format() == FieldFormat::Text => {
                cast(a, &DataType::Float64)
                    .ok()
                    .map(|c| c.as_primitive::<Float64Type>().clone())
            }
            _ => None,
        })
        .collect();
    for row in 0..batch.num_rows() {
        for (col, array) in batch.columns().iter().enumerate() {
            let result = if array.is_null(row) {
                Encoder::encode_field(&mut encoder, &None::<i8>, &fields[col])
            } else if let Some(values) = &floats[col] {
                let v = values.value(row);
                let text = if v.is_nan() {
                    "NaN".to_string()
                } else if v.is_infinite() {
                    if v > 0.0 { "Infinity" } else { "-Infinity" }.to_string()
                } else if array.data_type() == &DataType::Float32 {
                    (v as f32).to_string()
                } else {
                    v.to_string()
                };
                Encoder::encode_field(&mut encoder, &text, &fields[col])
            } else if let Some((micros, tz)) = &timestamps[col] {
                let text = chrono::DateTime::from_timestamp_micros(micros.value(row))
                    .map(|t| {
                        let s = t.naive_utc().format("%Y-%m-%d %H:%M:%S%.f").to_string();
                        if *tz { format!("{s}+00") } else { s }
                    })
                    .unwrap_or_default();
                Encoder::encode_field(&mut encoder, &text, &fields[col])
            } else {
                encode_value(&mut encoder, array, row, schema.field(col), &fields[col])
            };
            if let Err(e) = result {
                out.push(Err(e));
                return;
            }
        }
        out.push(Ok(encoder.take_row()));
    }
}

fn to_response(result: QueryResult, format: &Format) -> PgWireResult<Response> {
    match result {
        QueryResult::Rows { schema, batches } => {
            let fields = Arc::new(fields(&schema, format)?);
            let mut rows = Vec::new();
            for batch in &batches {
                encode_rows(&fields, batch, &mut rows);
            }
            Ok(Response::Query(QueryResponse::new(
                fields,
                stream::iter(rows),
            )))
        }
        QueryResult::Subscribe { .. } => {
            Err(ServerError::Internal("a subscription is streamed, not answered".into()).into())
        }
        QueryResult::Command { tag, rows } => {
            let t = match tag.as_str() {
                "BEGIN" => return Ok(Response::TransactionStart(Tag::new("BEGIN"))),
                "COMMIT" | "ROLLBACK" => return Ok(Response::TransactionEnd(Tag::new(&tag))),
                "INSERT" => Tag::new("INSERT").with_oid(0),
                _ => Tag::new(&tag),
            };
            Ok(Response::Execution(match rows {
                Some(n) => t.with_rows(n),
                None => t,
            }))
        }
    }
}

#[async_trait]
impl NoopStartupHandler for Connection {
    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let meta = client.metadata();
        let user = meta.get("user").cloned().unwrap_or_default();
        let database = meta
            .get("database")
            .cloned()
            .unwrap_or_else(|| user.clone());
        if user != USER {
            return Err(ServerError::InvalidRole(format!("role \"{user}\" does not exist")).into());
        }
        if database != DATABASE {
            return Err(ServerError::InvalidDatabase(format!(
                "database \"{database}\" does not exist"
            ))
            .into());
        }
        Ok(())
    }
}

#[async_trait]
impl SimpleQueryHandler for Connection {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let stmts = match stmt::parse(query) {
            Ok(s) => s,
            Err(e) => return Ok(vec![Response::Error(Box::new(e.into_error_info()))]),
        };
        if stmts.len() > 1 && stmts.iter().any(|s| matches!(s, Stmt::Subscribe { .. })) {
            let e = ServerError::unsupported(
                "SUBSCRIBE with other statements in one query string (send it alone)",
            );
            return Ok(vec![Response::Error(Box::new(e.into_error_info()))]);
        }
        let mut out = Vec::with_capacity(stmts.len());
        for s in stmts {
            match self.run(s).await {
                Ok(QueryResult::Subscribe { sub, copy }) => {
                    stream_subscription(client, sub, &Format::UnifiedText, true, copy).await?;
                }
                Ok(r) => out.push(to_response(r, &Format::UnifiedText)?),
                Err(e) => {
                    // Postgres stops at the first failing statement.
                    out.push(Response::Error(Box::new(e.into_error_info())));
                    break;
                }
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ExtendedQueryHandler for Connection {
    type Statement = Prepared;
    type QueryParser = Parser;

    fn query_parser(&self) -> Arc<Parser> {
        self.parser.clone()
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Prepared>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let prepared = &portal.statement.statement;
        let mut stmt = prepared.stmt.clone();
        if let Stmt::Sql(s) = &mut stmt {
            let mut values = HashMap::new();
            for (i, t) in prepared.param_types.iter().enumerate() {
                values.insert(format!("${}", i + 1), params::literal(portal, i, t)?);
            }
            stmt::bind(s, &values)?;
        }
        match self.run(stmt).await? {
            QueryResult::Subscribe { sub, copy } => {
                let format = &portal.result_column_format;
                stream_subscription(client, sub, format, false, copy).await?;
                Ok(Response::EmptyQuery)
            }
            result => to_response(result, &portal.result_column_format),
        }
    }
}

/// The handlers of one connection.
struct Handlers(Arc<Connection>);

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.0.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.0.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.0.clone()
    }
}

/// Accepts clients until `shutdown` resolves.
pub async fn serve(
    db: Arc<Database>,
    listener: TcpListener,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let handlers = Handlers(Arc::new(Connection::new(db.clone())));
                    tokio::spawn(async move {
                        if let Err(e) = pgwire::tokio::process_socket(socket, None, handlers).await {
                            tracing::debug!(%peer, error = %e, "connection ended with an error");
                        }
                    });
                }
                Err(e) => tracing::warn!(error = %e, "accept failed"),
            },
            _ = &mut shutdown => break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn copy_text_escapes_and_writes_nulls() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Utf8, true),
        ]));
        let batch = RecordBatch::try_new(
            schema.clone(),
            vec![
                Arc::new(Int32Array::from(vec![Some(1), None])),
                Arc::new(StringArray::from(vec![
                    Some("tab\there\\ and\nline"),
                    Some("x"),
                ])),
            ],
        )
        .unwrap();
        let fields = Arc::new(fields(&schema, &Format::UnifiedText).unwrap());
        let mut rows = Vec::new();
        encode_rows(&fields, &batch, &mut rows);
        let lines: Vec<String> = rows
            .into_iter()
            .map(|r| String::from_utf8(copy_text(&r.unwrap())).unwrap())
            .collect();
        assert_eq!(lines, vec!["1\ttab\\there\\\\ and\\nline\n", "\\N\tx\n"]);
    }
}

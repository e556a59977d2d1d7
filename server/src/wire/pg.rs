//! The pgwire front end: one [`Connection`] per client socket, serving the
//! simple and the extended query protocol over a [`Session`].

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::Arc;

use arrow_pg::datatypes::{arrow_schema_to_pg_fields, into_pg_type};
use arrow_pg::encoder::{Encoder, encode_value};
use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, Decimal128Array, Int64Array, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, TimeUnit};
use datafusion::sql::sqlparser::ast::Statement;
use futures::{Sink, SinkExt, stream};
use pgwire::api::auth::sasl::SASLState;
use pgwire::api::auth::{
    StartupHandler, protocol_negotiation, save_startup_parameters_to_metadata,
};
use pgwire::api::cancel::{CancelHandler, DefaultCancelHandler};
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler, send_describe_response};
use pgwire::api::results::DataRowEncoder;
use pgwire::api::results::{
    CopyResponse, DescribePortalResponse, FieldFormat, FieldInfo, QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionGuard, ConnectionHandle, ConnectionManager,
    PgWireServerHandlers, Type,
};
use pgwire::api::{PgWireConnectionState, PidSecretKeyGenerator, RandomPidSecretKeyGenerator};
use pgwire::error::ErrorInfo;
use pgwire::error::{PgWireError, PgWireResult};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail, CopyOutResponse};
use pgwire::messages::data::{DataRow, RowDescription};
use pgwire::messages::extendedquery::{Describe, Parse, ParseComplete, TARGET_TYPE_BYTE_PORTAL};
use pgwire::messages::response::{ReadyForQuery, TransactionStatus};
use pgwire::messages::startup::{Authentication, BackendKeyData};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use planner::functions::jsonb::is_jsonb;
use planner::functions::numeric_special::Special;
use tokio::net::TcpListener;

use crate::engine::QueryResult;
use crate::engine::api::Engine;
use crate::engine::session::Session;
use crate::engine::subscribe::Subscription;
use crate::error::{Result, ServerError};
use crate::sql::copy::{CopyFormat, CopyOptions};
use crate::sql::params;
use crate::sql::stmt::{self, Stmt};

/// A statement prepared by the extended protocol.
#[derive(Debug, Clone)]
pub struct Prepared {
    stmt: Stmt,
    /// The text the client prepared (what `pg_stat_activity` shows).
    text: String,
    /// Types of `$1`, `$2`, …
    param_types: Vec<Type>,
    /// Columns of the result, for queries.
    schema: Option<SchemaRef>,
}

/// Parses and describes statements for the extended protocol.
#[derive(Debug)]
pub struct Parser {
    engine: Arc<dyn Engine>,
    /// The connection's session: `FETCH` is described by its cursor.
    session: Arc<tokio::sync::Mutex<Session>>,
}

impl Parser {
    async fn prepare(&self, sql: &str, client_types: &[Option<Type>]) -> Result<Option<Prepared>> {
        let mut stmts = parse_off_the_runtime(sql)?;
        if stmts.len() > 1 {
            return Err(ServerError::Syntax(
                "cannot insert multiple commands into a prepared statement".into(),
            ));
        }
        let Some(stmt) = stmts.pop() else {
            return Ok(None);
        };
        let mut param_types = Vec::new();
        let mut stmt = stmt;
        let described = {
            let session = self.session.lock().await;
            self.engine.qualify(&session, &mut stmt)?;
            self.engine
                .clone()
                .describe(&session, &stmt, client_types)
                .await?
        };
        let schema = described.schema;
        if let Stmt::Sql(s) = &stmt {
            let names = stmt::placeholders(s);
            let inferred = described.inferred;
            let cast = params::cast_types(s);
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
                let name = format!("${}", i + 1);
                let t = from_client
                    .or_else(|| cast.get(&name).cloned())
                    .unwrap_or_else(|| {
                        inferred
                            .get(&name)
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
            text: sql.to_string(),
            param_types,
            schema,
        }))
    }
}

/// The row description of `schema`. A column of no type (`SELECT NULL`,
/// or `SELECT $1` of a parameter the client left untyped) is `text`, as
/// Postgres resolves it, rather than `unknown`; a `jsonb` column (stored as
/// `LargeUtf8`, see `planner::functions::jsonb`) is `jsonb`.
fn fields(schema: &SchemaRef, format: &Format) -> PgWireResult<Vec<FieldInfo>> {
    let typed = datafusion::arrow::datatypes::Schema::new_with_metadata(
        schema
            .fields()
            .iter()
            .map(|f| match f.data_type() {
                DataType::Null => Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8)),
                _ => f.clone(),
            })
            .collect::<Vec<_>>(),
        schema.metadata().clone(),
    );
    let infos = arrow_schema_to_pg_fields(&Arc::new(typed), format, None)?;
    Ok(infos
        .into_iter()
        .zip(schema.fields().iter())
        .map(|(info, f)| {
            if is_jsonb(f.data_type()) {
                FieldInfo::new(
                    info.name().to_owned(),
                    None,
                    None,
                    Type::JSONB,
                    info.format(),
                )
            } else {
                info
            }
        })
        .collect())
}

/// A `jsonb` value's text, for the wire: as it is in text, after the
/// version byte `1` in binary.
#[derive(Debug)]
struct JsonbText<'a>(&'a str);

impl pgwire::types::ToSqlText for JsonbText<'_> {
    fn to_sql_text(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
        _: &pgwire::types::format::FormatOptions,
    ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(self.0.as_bytes());
        Ok(postgres_types::IsNull::No)
    }
}

impl postgres_types::ToSql for JsonbText<'_> {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(&[1]);
        out.extend_from_slice(self.0.as_bytes());
        Ok(postgres_types::IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::JSONB
    }

    postgres_types::to_sql_checked!();
}

/// A `numeric` `NaN` or `±Infinity`, in text or in Postgres's binary form
/// (no digits, and the sign word says which).
#[derive(Debug)]
struct SpecialNumeric(Special);

impl pgwire::types::ToSqlText for SpecialNumeric {
    fn to_sql_text(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
        _: &pgwire::types::format::FormatOptions,
    ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        out.extend_from_slice(self.0.text().as_bytes());
        Ok(postgres_types::IsNull::No)
    }
}

impl postgres_types::ToSql for SpecialNumeric {
    fn to_sql(
        &self,
        _: &Type,
        out: &mut bytes::BytesMut,
    ) -> Result<postgres_types::IsNull, Box<dyn std::error::Error + Sync + Send>> {
        let sign: u16 = match self.0 {
            Special::NaN => 0xC000,
            Special::Infinity => 0xD000,
            Special::NegInfinity => 0xF000,
        };
        // ndigits, weight, sign, dscale.
        out.extend_from_slice(&[0, 0, 0, 0]);
        out.extend_from_slice(&sign.to_be_bytes());
        out.extend_from_slice(&[0, 0]);
        Ok(postgres_types::IsNull::No)
    }

    fn accepts(ty: &Type) -> bool {
        *ty == Type::NUMERIC
    }

    postgres_types::to_sql_checked!();
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
    engine: Arc<dyn Engine>,
    session: Arc<tokio::sync::Mutex<Session>>,
    parser: Arc<Parser>,
    /// The reported parameters as the client was last told them.
    reported: std::sync::Mutex<HashMap<&'static str, String>>,
    /// The server's registry of connections by backend key, which a cancel
    /// request (sent on a connection of its own) is looked up in.
    manager: Arc<ConnectionManager>,
    /// This connection's entry in `manager`, once the startup registered
    /// it (Weir's, not pgwire's: pgwire would drop a statement that writes
    /// half way); the guard takes the entry out when the connection goes.
    cancel: std::sync::OnceLock<(Arc<ConnectionHandle>, ConnectionGuard)>,
    /// The `COPY … FROM STDIN` in progress: its target and the data so far.
    copy_in: std::sync::Mutex<Option<PendingCopy>>,
    /// How the client proves who it is, and how far it has got.
    auth: Arc<crate::wire::auth::Authenticator>,
    sasl: std::sync::Mutex<SASLState>,
    /// The connection's place in its role's connection limit.
    login: std::sync::OnceLock<crate::catalog::roles::Login>,
    /// Its row of `pg_stat_activity`, once logged in.
    activity: std::sync::OnceLock<crate::catalog::activity::Entry>,
    /// Notified by `pg_terminate_backend`: the connection loop closes the
    /// connection.
    pub terminate: Arc<tokio::sync::Notify>,
    /// A second handle on the client's socket, to notice that the client
    /// has gone while one of its statements runs.
    probe: std::sync::OnceLock<tokio::net::TcpStream>,
    /// The names of the statements the client prepared (pgwire keeps the
    /// statements; `DEALLOCATE ALL` needs their names).
    prepared_names: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

/// A `COPY … FROM STDIN` waiting for the client's `CopyDone`.
#[derive(Debug)]
struct PendingCopy {
    table: crate::sql::stmt::QualifiedName,
    columns: Vec<String>,
    /// The number of columns each line holds.
    width: usize,
    options: CopyOptions,
    data: Vec<u8>,
}

/// The most data one `COPY … FROM STDIN` may send: it is held in memory
/// until `CopyDone`, so that a bad line leaves nothing written.
const MAX_COPY_IN_BYTES: usize = 1 << 30;

impl Connection {
    pub fn new(
        engine: Arc<dyn Engine>,
        manager: Arc<ConnectionManager>,
        auth: Arc<crate::wire::auth::Authenticator>,
    ) -> Self {
        let session = Arc::new(tokio::sync::Mutex::new(engine.new_session()));
        Self {
            parser: Arc::new(Parser {
                engine: engine.clone(),
                session: session.clone(),
            }),
            engine,
            session,
            reported: Default::default(),
            manager,
            cancel: Default::default(),
            copy_in: Default::default(),
            auth,
            sasl: std::sync::Mutex::new(SASLState::Initial),
            login: Default::default(),
            activity: Default::default(),
            terminate: Default::default(),
            probe: Default::default(),
            prepared_names: Default::default(),
        }
    }

    /// Takes a statement's result to the client's door: a `COPY … FROM
    /// STDIN` starts gathering data here; anything else is a response.
    fn respond(&self, result: QueryResult, format: &Format) -> PgWireResult<Response> {
        match result {
            QueryResult::CopyIn {
                table,
                columns,
                options,
            } => {
                let width = self.engine.copy_width(&table, &columns)?;
                *self.copy_in.lock().unwrap_or_else(|e| e.into_inner()) = Some(PendingCopy {
                    table,
                    columns,
                    width,
                    options,
                    data: Vec::new(),
                });
                Ok(Response::CopyIn(CopyResponse::new(
                    0,
                    width,
                    stream::empty(),
                )))
            }
            result => to_response(result, format),
        }
    }

    /// Resolves when a cancel request for this connection arrives, from
    /// now on; never, before the startup has registered the connection.
    async fn cancelled(&self) -> impl std::future::Future<Output = ()> + use<> {
        let rx = match self.cancel.get() {
            Some((handle, _)) => Some(handle.start_query().await),
            None => None,
        };
        async move {
            // The sender is dropped, not fired, when the next statement
            // starts: only a fired one is a cancel.
            if let Some(rx) = rx
                && rx.await.is_ok()
            {
                return;
            }
            std::future::pending::<()>().await
        }
    }

    /// Runs one statement; a panic becomes an error, never a dead server.
    /// A query (which changes nothing) is cancelled after
    /// `statement_timeout` or by a cancel request; a statement that writes
    /// runs to its end, so that nothing is left half done.
    async fn run(&self, stmt: Stmt, text: &str) -> Result<QueryResult> {
        let activity = self.activity.get();
        if let Some(a) = activity {
            a.active(text);
        }
        let result = self.run_statement(stmt).await;
        if let Some(a) = activity {
            a.idle();
        }
        result
    }

    async fn run_statement(&self, stmt: Stmt) -> Result<QueryResult> {
        let session = self.session.clone().lock_owned().await;
        let timeout = session.statement_timeout();
        let engine = self.engine.clone();
        self.supervise(timeout, async move {
            let mut session = session;
            engine.execute(&mut session, stmt).await
        })
        .await
    }

    /// Runs a statement's work on a thread of its own (`crate::engine::control`)
    /// and stops it — until its commit point — when a cancel request or
    /// `pg_cancel_backend`/`pg_terminate_backend` arrives, `timeout`
    /// passes, or the client goes away.
    async fn supervise<T: Send + 'static>(
        &self,
        timeout: Option<std::time::Duration>,
        work: impl std::future::Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let control = crate::engine::control::Control::new();
        let _stop_if_dropped = crate::engine::control::StopOnDrop(control.clone());
        let run = crate::engine::control::run(control.clone(), work);
        tokio::pin!(run);
        let cancelled = self.cancelled().await;
        let deadline = async {
            match timeout {
                Some(t) => tokio::time::sleep(t).await,
                None => std::future::pending().await,
            }
        };
        let gone = self.client_gone();
        tokio::select! {
            result = &mut run => return result,
            () = cancelled => control.stop(user_cancel()),
            () = deadline => control.stop(ServerError::QueryCanceled(
                "canceling statement due to statement timeout".into(),
            )),
            () = gone => {
                tracing::info!("client went away; stopping its statement");
                control.stop(ServerError::QueryCanceled(
                    "canceling statement: the client closed the connection".into(),
                ))
            }
        };
        // Stopped, or past its commit point and so left to finish.
        run.await
    }

    /// Resolves when the client has closed its side of the socket
    /// (checked once a second, as Postgres's
    /// `client_connection_check_interval`), even if it sent more first (a
    /// driver's Terminate message, unread while the statement runs); never
    /// when the connection has no socket to check.
    async fn client_gone(&self) {
        use futures::FutureExt;
        let Some(probe) = self.probe.get() else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(CLIENT_CHECK_INTERVAL).await;
            match probe.ready(tokio::io::Interest::READABLE).now_or_never() {
                Some(Ok(ready)) if ready.is_read_closed() => return,
                Some(Err(_)) => return,
                _ => {}
            }
        }
    }
}

impl Connection {
    /// `DEALLOCATE` and `DISCARD`: statements about what the connection
    /// holds in pgwire's store (prepared statements, portals), answered
    /// here rather than by the engine.
    async fn connection_statement<C>(&self, client: &C, stmt: &Stmt) -> Option<Result<QueryResult>>
    where
        C: ClientPortalStore,
        C::PortalStore: PortalStore,
    {
        let Stmt::Sql(s) = stmt else {
            return None;
        };
        let store = client.portal_store();
        let forget_all = || {
            let names = std::mem::take(
                &mut *self
                    .prepared_names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            for name in names {
                store.rm_statement(&name);
            }
        };
        Some(match s.as_ref() {
            Statement::Deallocate { name, .. }
                if name.quote_style.is_none() && name.value.eq_ignore_ascii_case("all") =>
            {
                forget_all();
                Ok(QueryResult::command("DEALLOCATE ALL"))
            }
            Statement::Deallocate { name, .. } => {
                let name = stmt::ident(name);
                let known = self
                    .prepared_names
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&name);
                if known || store.get_statement(&name).is_some() {
                    store.rm_statement(&name);
                    Ok(QueryResult::command("DEALLOCATE"))
                } else {
                    Err(ServerError::InvalidStatementName(format!(
                        "prepared statement \"{name}\" does not exist"
                    )))
                }
            }
            Statement::Discard { object_type } => {
                use datafusion::sql::sqlparser::ast::DiscardObject;
                match object_type {
                    // Postgres: CLOSE ALL; SET SESSION AUTHORIZATION DEFAULT;
                    // RESET ALL; DEALLOCATE ALL; UNLISTEN *; … (no temporary
                    // tables, sequences, locks or listeners here).
                    DiscardObject::ALL => {
                        forget_all();
                        store.clear_portals();
                        let mut session = self.session.lock().await;
                        session.cursors.clear();
                        session.reset_all();
                        Ok(QueryResult::command("DISCARD ALL"))
                    }
                    // No plans are cached, no sequences or temporary tables exist.
                    DiscardObject::PLANS => Ok(QueryResult::command("DISCARD PLANS")),
                    DiscardObject::SEQUENCES => Ok(QueryResult::command("DISCARD SEQUENCES")),
                    DiscardObject::TEMP => Ok(QueryResult::command("DISCARD TEMP")),
                }
            }
            _ => return None,
        })
    }
}

impl Connection {
    /// An error the front end reported itself (a statement that did not
    /// parse or bind) fails the open transaction block as the engine's
    /// own errors do: pgwire's transaction status has seen it.
    async fn follow_client_state<C: ClientInfo>(&self, client: &C) {
        if client.transaction_status() == TransactionStatus::Error {
            self.session.lock().await.transaction_failed();
        }
    }
}

/// Parses `sql`; a long text is parsed with the worker thread handed over
/// to the runtime's other tasks meanwhile, so that other clients, the
/// dataflow and the heartbeats do not wait for it.
fn parse_off_the_runtime(sql: &str) -> Result<Vec<Stmt>> {
    const LONG: usize = 64 << 10;
    let multi_thread = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if sql.len() > LONG && multi_thread {
        tokio::task::block_in_place(|| stmt::parse(sql))
    } else {
        stmt::parse(sql)
    }
}

/// How often a running statement checks that its client is still there.
const CLIENT_CHECK_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

impl Connection {
    /// Tells the client of each reported parameter (`DateStyle`,
    /// `TimeZone`, `application_name`, …) whose value it does not know, as
    /// Postgres does after a `SET` and at startup.
    async fn report_parameters<C>(&self, client: &mut C) -> PgWireResult<()>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let changed: Vec<(&'static str, String)> = {
            let session = self.session.lock().await;
            let mut told = self.reported.lock().unwrap_or_else(|e| e.into_inner());
            session
                .settings()
                .into_iter()
                .filter_map(|(name, value)| {
                    let name = crate::sql::settings::reported_name(&name)?;
                    (told.get(name) != Some(&value)).then(|| {
                        told.insert(name, value.clone());
                        (name, value)
                    })
                })
                .collect()
        };
        if let (Some(a), Some((_, name))) = (
            self.activity.get(),
            changed.iter().find(|(n, _)| *n == "application_name"),
        ) {
            a.set_application_name(name);
        }
        for (name, value) in changed {
            client
                .feed(PgWireBackendMessage::ParameterStatus(
                    pgwire::messages::startup::ParameterStatus::new(name.to_string(), value),
                ))
                .await?;
        }
        Ok(())
    }
}

/// Whether `s` only reads or writes rows: what one query string's
/// implicit transaction holds.
fn reads_or_writes_rows(s: &Stmt) -> bool {
    matches!(s, Stmt::Sql(s) if matches!(
        s.as_ref(),
        Statement::Query(_)
            | Statement::Insert(_)
            | Statement::Update(_)
            | Statement::Delete(_)
            | Statement::Truncate(_)
    ))
}

/// `BEGIN`, `COMMIT` or `ROLLBACK`, as the engine runs them.
fn transaction_statement(sql: &str) -> PgWireResult<Stmt> {
    stmt::parse(sql)?
        .pop()
        .ok_or_else(|| ServerError::Internal(format!("{sql} did not parse")).into())
}

/// The command tag of a statement whose rows are not a `SELECT`'s.
fn command_tag(stmt: &Stmt) -> Option<&'static str> {
    matches!(stmt, Stmt::Fetch { skip: false, .. }).then_some("FETCH")
}

fn tagged(mut response: Response, tag: Option<&str>) -> Response {
    if let (Response::Query(q), Some(tag)) = (&mut response, tag) {
        q.set_command_tag(tag);
    }
    response
}

/// The error a statement ends with when the client cancels it.
fn user_cancel() -> ServerError {
    ServerError::QueryCanceled("canceling statement due to user request".into())
}

/// The settings a client sent in its startup packet: each named parameter
/// and the `-c name=value` (or `--name=value`) of `options`.
fn startup_settings(meta: &HashMap<String, String>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (k, v) in meta {
        if k == "options" {
            let mut words = v.split_whitespace();
            while let Some(w) = words.next() {
                let pair = match w {
                    "-c" => words.next(),
                    w => w.strip_prefix("-c").or_else(|| w.strip_prefix("--")),
                };
                if let Some((name, value)) = pair.and_then(|p| p.split_once('=')) {
                    out.push((name.replace('-', "_"), value.to_string()));
                }
            }
        } else if crate::sql::settings::default_of(k).is_some()
            && crate::sql::settings::check(k, crate::sql::settings::default_of(k).unwrap_or(""))
                .is_ok()
        {
            out.push((k.clone(), v.clone()));
        }
    }
    out
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
    cancelled: impl std::future::Future<Output = ()>,
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
    tokio::pin!(cancelled);
    let text_copy = CopyOptions::new(CopyFormat::Text);
    // Rows taken at a time: a page of a read, as it comes.
    const ROWS: usize = 16_384;
    loop {
        let batches = tokio::select! {
            batches = sub.fetch(ROWS, None) => batches?,
            () = &mut cancelled => return Err(user_cancel().into()),
        };
        let mut rows = Vec::new();
        for batch in &batches {
            encode_rows(&fields, batch, &mut rows);
        }
        for row in rows {
            let row = row?;
            let message = if copy {
                PgWireBackendMessage::CopyData(CopyData::new(copy_line(&row, &text_copy).into()))
            } else {
                PgWireBackendMessage::DataRow(row)
            };
            client.feed(message).await?;
        }
        client.flush().await?;
    }
}

/// A text-format row's values, `None` for NULL.
fn row_values(row: &DataRow) -> Vec<Option<&[u8]>> {
    let mut out = Vec::with_capacity(row.field_count as usize);
    let mut data = &row.data[..];
    for _ in 0..row.field_count {
        let Some((len, rest)) = data.split_first_chunk::<4>() else {
            break;
        };
        let len = i32::from_be_bytes(*len);
        data = rest;
        if len < 0 {
            out.push(None);
            continue;
        }
        let (value, rest) = data.split_at((len as usize).min(data.len()));
        data = rest;
        out.push(Some(value));
    }
    out
}

/// A text-format row as a line of COPY data.
fn copy_line(row: &DataRow, options: &CopyOptions) -> Vec<u8> {
    let mut out = Vec::with_capacity(row.data.len() + 1);
    crate::sql::copy::encode_line(&row_values(row), options, &mut out);
    out
}

/// `COPY … TO STDOUT`: the rows as a COPY data stream, each encoded as the
/// text a `SELECT` sends.
fn copy_out(
    schema: &SchemaRef,
    batches: &[RecordBatch],
    options: &CopyOptions,
) -> PgWireResult<Response> {
    let fields = Arc::new(fields(schema, &Format::UnifiedText)?);
    let mut rows = Vec::new();
    for batch in batches {
        encode_rows(&fields, batch, &mut rows);
    }
    let mut data = Vec::with_capacity(rows.len() + 1);
    if options.header {
        let names: Vec<String> = schema.fields().iter().map(|f| f.name().clone()).collect();
        data.push(Ok(CopyData::new(
            crate::sql::copy::header_line(&names, options).into(),
        )));
    }
    for row in rows {
        data.push(row.map(|r| CopyData::new(copy_line(&r, options).into())));
    }
    Ok(Response::CopyOut(CopyResponse::new(
        0,
        fields.len(),
        stream::iter(data),
    )))
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
    // NaN and the infinities of numeric columns, in text and in binary.
    let numerics: Vec<Option<&Decimal128Array>> = batch
        .columns()
        .iter()
        .map(|a| a.as_any().downcast_ref::<Decimal128Array>())
        .collect();
    // Numerics in text exactly, by Arrow: `arrow_pg` goes through
    // rust_decimal, which holds 28 digits where Decimal128 holds 38.
    let decimals: Vec<Option<&Decimal128Array>> = batch
        .columns()
        .iter()
        .zip(fields.iter())
        .map(|(a, f)| match a.data_type() {
            DataType::Decimal128(_, _) if f.format() == FieldFormat::Text => {
                a.as_any().downcast_ref::<Decimal128Array>()
            }
            _ => None,
        })
        .collect();
    // Times in text as Postgres prints them: fractions only when there
    // are some, without trailing zeros.
    let times: Vec<Option<Int64Array>> = batch
        .columns()
        .iter()
        .zip(fields.iter())
        .map(|(a, f)| match a.data_type() {
            DataType::Time32(_) | DataType::Time64(_) if f.format() == FieldFormat::Text => {
                cast(a, &DataType::Time64(TimeUnit::Microsecond))
                    .ok()
                    .and_then(|c| cast(&c, &DataType::Int64).ok())
                    .map(|c| c.as_primitive::<Int64Type>().clone())
            }
            _ => None,
        })
        .collect();
    for row in 0..batch.num_rows() {
        for (col, array) in batch.columns().iter().enumerate() {
            let result = if array.is_null(row) {
                Encoder::encode_field(&mut encoder, &None::<i8>, &fields[col])
            } else if let Some(micros) = &times[col] {
                let text = time_text(micros.value(row));
                Encoder::encode_field(&mut encoder, &text, &fields[col])
            } else if is_jsonb(array.data_type()) {
                let text = JsonbText(array.as_string::<i64>().value(row));
                Encoder::encode_field(&mut encoder, &text, &fields[col])
            } else if let Some(special) = numerics[col].and_then(|a| Special::of(a.value(row))) {
                Encoder::encode_field(&mut encoder, &SpecialNumeric(special), &fields[col])
            } else if let Some(values) = decimals[col] {
                let text = values.value_as_string(row);
                let text = match values.data_type() {
                    DataType::Decimal128(p, s)
                        if (*p, *s) == crate::sql::types::DEFAULT_NUMERIC =>
                    {
                        unconstrained_numeric_text(text)
                    }
                    _ => text,
                };
                Encoder::encode_field(&mut encoder, &text, &fields[col])
            } else if let Some(values) = &floats[col] {
                let single = array.data_type() == &DataType::Float32;
                let text = float_text(values.value(row), single);
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

/// A `numeric` declared without precision, as text. Postgres keeps each
/// such value at the scale it was written with (`1.5`, `2.25`, `2`); Weir
/// keeps them all at scale 10 (`types::DEFAULT_NUMERIC`) and writes them
/// without the zeros that scale adds, which is Postgres's text wherever
/// the value's own last digit is not a zero (`1.50` is written `1.5`).
fn unconstrained_numeric_text(text: String) -> String {
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}

/// A time of day, `micros` after midnight, as Postgres writes it:
/// `12:30:00`, `12:30:00.5`.
fn time_text(micros: i64) -> String {
    let (secs, fraction) = (micros.div_euclid(1_000_000), micros.rem_euclid(1_000_000));
    let mut text = format!("{:02}:{:02}:{:02}", secs / 3600, secs / 60 % 60, secs % 60);
    if fraction > 0 {
        let digits = format!("{fraction:06}");
        text.push('.');
        text.push_str(digits.trim_end_matches('0'));
    }
    text
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
        QueryResult::CopyOut {
            schema,
            batches,
            options,
        } => copy_out(&schema, &batches, &options),
        QueryResult::Subscribe { .. } | QueryResult::CopyIn { .. } => Err(ServerError::Internal(
            "a subscription or COPY FROM is the connection's, not a response".into(),
        )
        .into()),
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

/// Backend pids and cancel keys, unique across the server's connections.
static PID_GENERATOR: std::sync::LazyLock<RandomPidSecretKeyGenerator> =
    std::sync::LazyLock::new(RandomPidSecretKeyGenerator::default);

/// A startup error: FATAL, and the connection closes.
fn fatal(e: ServerError) -> PgWireError {
    PgWireError::UserError(Box::new(ErrorInfo::new(
        "FATAL".to_owned(),
        e.sqlstate().to_owned(),
        e.to_string(),
    )))
}

impl Connection {
    /// Lets in a client whose identity is settled: the role must exist
    /// and may log in, the database must be Weir's, and the role's
    /// connection limit must have room. Then the session starts.
    async fn admit<C>(&self, client: &mut C, authenticated: bool) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let meta = client.metadata().clone();
        let user = meta.get("user").cloned().unwrap_or_default();
        let database = meta
            .get("database")
            .cloned()
            .unwrap_or_else(|| user.clone());
        let role = match self.engine.role(&user) {
            Some(role) => role,
            None if authenticated => {
                return Err(PgWireError::InvalidPassword(user));
            }
            None => {
                return Err(fatal(ServerError::InvalidRole(format!(
                    "role \"{user}\" does not exist"
                ))));
            }
        };
        if !role.login {
            return Err(fatal(ServerError::InvalidRole(format!(
                "role \"{user}\" is not permitted to log in"
            ))));
        }
        if database != crate::DATABASE {
            return Err(fatal(ServerError::InvalidDatabase(format!(
                "database \"{database}\" does not exist"
            ))));
        }
        match self.engine.log_in(&role) {
            Some(login) => {
                let _ = self.login.set(login);
            }
            None => {
                return Err(fatal(ServerError::TooManyConnections(format!(
                    "too many connections for role \"{user}\""
                ))));
            }
        }
        let (pid, secret_key) = client.pid_and_secret_key();
        let registered = self.manager.register(pid, secret_key.clone());
        let cancel = registered.0.clone();
        let _ = self.cancel.set(registered);
        let now = std::time::SystemTime::now();
        let _ = self.activity.set(self.engine.register_backend(
            crate::catalog::activity::Backend {
                pid,
                user: role.name.clone(),
                user_oid: role.oid,
                application_name: meta.get("application_name").cloned().unwrap_or_default(),
                client: client.socket_addr(),
                backend_start: now,
                query_start: None,
                state_change: now,
                state: "idle",
                query: String::new(),
                signals: crate::catalog::activity::Signals {
                    cancel,
                    terminate: self.terminate.clone(),
                },
            },
        ));
        {
            let mut session = self.session.lock().await;
            // `pg_backend_pid()` is the pid of the backend key, which is
            // what a cancel request names.
            session.backend_pid = pid;
            session.user = role.name.clone();
            session
                .vars
                .insert("session_authorization".into(), role.name.clone());
            session.vars.insert(
                "is_superuser".into(),
                if role.superuser { "on" } else { "off" }.into(),
            );
            for (name, value) in startup_settings(&meta) {
                session.set(&name, &value).map_err(fatal)?;
            }
        }
        client
            .feed(PgWireBackendMessage::Authentication(Authentication::Ok))
            .await?;
        self.report_parameters(client).await?;
        client
            .feed(PgWireBackendMessage::BackendKeyData(BackendKeyData::new(
                pid, secret_key,
            )))
            .await?;
        client
            .send(PgWireBackendMessage::ReadyForQuery(ReadyForQuery::new(
                TransactionStatus::Idle,
            )))
            .await?;
        client.set_state(PgWireConnectionState::ReadyForQuery);
        Ok(())
    }
}

#[async_trait]
impl StartupHandler for Connection {
    async fn on_startup<C>(
        &self,
        client: &mut C,
        message: PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        match message {
            PgWireFrontendMessage::Startup(ref startup) => {
                protocol_negotiation(client, startup).await?;
                save_startup_parameters_to_metadata(client, startup);
                let (pid, secret_key) = PID_GENERATOR.generate(client);
                client.set_pid_and_secret_key(pid, secret_key);
                if self.auth.requires_password() {
                    client.set_state(PgWireConnectionState::AuthenticationInProgress);
                    client
                        .send(PgWireBackendMessage::Authentication(self.auth.challenge()))
                        .await?;
                    Ok(())
                } else {
                    self.admit(client, false).await
                }
            }
            PgWireFrontendMessage::PasswordMessageFamily(msg) => {
                let reply = self.auth.step(client, &self.sasl, msg).await?;
                client
                    .send(PgWireBackendMessage::Authentication(reply))
                    .await?;
                if crate::wire::auth::finished(&self.sasl) {
                    self.admit(client, true).await?;
                }
                Ok(())
            }
            _ => Ok(()),
        }
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
        self.follow_client_state(client).await;
        let stmts = match parse_off_the_runtime(query) {
            Ok(s) => s,
            Err(e) => return Ok(vec![Response::Error(Box::new(e.into_error_info()))]),
        };
        let alone = |s: &Stmt| match s {
            Stmt::Subscribe { .. } => Some("SUBSCRIBE"),
            Stmt::Sql(s) if matches!(s.as_ref(), Statement::Copy { to: false, .. }) => {
                Some("COPY FROM STDIN")
            }
            _ => None,
        };
        if stmts.len() > 1
            && let Some(what) = stmts.iter().find_map(alone)
        {
            let e = ServerError::unsupported(format!(
                "{what} with other statements in one query string (send it alone)"
            ));
            return Ok(vec![Response::Error(Box::new(e.into_error_info()))]);
        }
        // As in Postgres, the statements of one query string are one
        // transaction: a failing one undoes the writes before it. Here
        // only strings that do nothing but read and write rows are, as
        // catalog changes are not transactional (see
        // `engine::transaction`), and `FLUSH` waits for what is committed.
        let implicit = stmts.len() > 1
            && stmts.iter().all(reads_or_writes_rows)
            && !self.session.lock().await.in_transaction_block();
        if implicit {
            self.run(transaction_statement("BEGIN")?, query).await?;
        }
        let mut out = Vec::with_capacity(stmts.len());
        let mut failed = false;
        for s in stmts {
            let tag = command_tag(&s);
            let result = match self.connection_statement(client, &s).await {
                Some(r) => r,
                None => self.run(s, query).await,
            };
            match result {
                Ok(QueryResult::Subscribe { sub, copy }) => {
                    let cancelled = self.cancelled().await;
                    let format = &Format::UnifiedText;
                    stream_subscription(client, sub, format, true, copy, cancelled).await?;
                }
                Ok(r) => out.push(tagged(self.respond(r, &Format::UnifiedText)?, tag)),
                Err(e) => {
                    // Postgres stops at the first failing statement.
                    out.push(Response::Error(Box::new(e.into_error_info())));
                    failed = true;
                    break;
                }
            }
        }
        if implicit {
            let end = if failed { "ROLLBACK" } else { "COMMIT" };
            if let Err(e) = self.run(transaction_statement(end)?, query).await {
                out.push(Response::Error(Box::new(e.into_error_info())));
            }
        }
        self.report_parameters(client).await?;
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

    /// As pgwire's, noting the statement's name for `DEALLOCATE ALL`.
    async fn on_parse<C>(&self, client: &mut C, message: Parse) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message.name.clone().unwrap_or_default();
        let parser = self.query_parser();
        match StoredStatement::parse(client, &message, parser).await? {
            Some(stmt) => client.portal_store().put_statement(Arc::new(stmt)),
            None => client.portal_store().put_empty_statement(&name),
        }
        if !name.is_empty() {
            self.prepared_names
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(name);
        }
        client
            .send(PgWireBackendMessage::ParseComplete(ParseComplete::new()))
            .await?;
        Ok(())
    }

    /// A cursor is a portal in Postgres, and drivers (psycopg's named
    /// cursors) describe it by its name after `DECLARE`: a portal the
    /// protocol did not bind is looked up among the session's cursors.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Prepared>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if message.target_type == TARGET_TYPE_BYTE_PORTAL
            && let Some(name) = message.name.as_deref().filter(|n| !n.is_empty())
            && client.portal_store().get_portal(name).is_none()
        {
            let schema = self.session.lock().await.cursor_schema(name);
            let Some(schema) = schema else {
                return Err(ServerError::InvalidCursorName(format!(
                    "portal \"{name}\" does not exist"
                ))
                .into());
            };
            let fields = fields(&schema, &Format::UnifiedText)?;
            return send_describe_response(client, &DescribePortalResponse::new(fields)).await;
        }
        self._on_describe(client, message).await
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
        self.follow_client_state(client).await;
        let prepared = &portal.statement.statement;
        let mut stmt = prepared.stmt.clone();
        if let Stmt::Sql(s) = &mut stmt {
            let mut values = HashMap::new();
            for (i, t) in prepared.param_types.iter().enumerate() {
                values.insert(format!("${}", i + 1), params::literal(portal, i, t)?);
            }
            stmt::bind(s, &values)?;
            // `CAST($1 AS text[])` of a text parameter is now the literal's.
            crate::sql::literals::normalize(s)?;
        }
        let tag = command_tag(&stmt);
        let result = match self.connection_statement(client, &stmt).await {
            Some(r) => r,
            None => self.run(stmt, &prepared.text).await,
        };
        self.report_parameters(client).await?;
        match result? {
            QueryResult::Subscribe { sub, copy } => {
                let format = &portal.result_column_format;
                let cancelled = self.cancelled().await;
                stream_subscription(client, sub, format, false, copy, cancelled).await?;
                Ok(Response::EmptyQuery)
            }
            result => Ok(tagged(
                self.respond(result, &portal.result_column_format)?,
                tag,
            )),
        }
    }
}

#[async_trait]
impl CopyHandler for Connection {
    async fn on_copy_data<C>(&self, _client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut pending = self.copy_in.lock().unwrap_or_else(|e| e.into_inner());
        let Some(copy) = pending.as_mut() else {
            return Err(ServerError::Protocol("CopyData outside a COPY FROM STDIN".into()).into());
        };
        if copy.data.len() + copy_data.data.len() > MAX_COPY_IN_BYTES {
            *pending = None;
            return Err(ServerError::ProgramLimitExceeded(format!(
                "COPY FROM STDIN sends at most {MAX_COPY_IN_BYTES} bytes; split the data"
            ))
            .into());
        }
        copy.data.extend_from_slice(&copy_data.data);
        Ok(())
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let pending = self
            .copy_in
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let Some(copy) = pending else {
            return Err(ServerError::Protocol("CopyDone outside a COPY FROM STDIN".into()).into());
        };
        let session = self.session.clone().lock_owned().await;
        let timeout = session.statement_timeout();
        let engine = self.engine.clone();
        let n = self
            .supervise(timeout, async move {
                let mut session = session;
                let rows = crate::sql::copy::decode(&copy.data, &copy.options, copy.width);
                let rows = match rows {
                    Ok(rows) => rows,
                    Err(e) => {
                        session.transaction_failed();
                        return Err(e);
                    }
                };
                // Lines are counted from 1, after the header line if any.
                let first_line = 1 + usize::from(copy.options.header);
                engine
                    .copy_in(&mut session, &copy.table, &copy.columns, &rows, first_line)
                    .await
            })
            .await?;
        let session = self.session.lock().await;
        if !session.in_transaction_block() {
            self.engine.flush_if_implicit(&session).await?;
        }
        client
            .send(PgWireBackendMessage::CommandComplete(
                Tag::new("COPY").with_rows(n).into(),
            ))
            .await?;
        Ok(())
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        *self.copy_in.lock().unwrap_or_else(|e| e.into_inner()) = None;
        ServerError::QueryCanceled(format!("COPY from stdin failed: {}", fail.message)).into()
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

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.0.clone()
    }

    fn cancel_handler(&self) -> Arc<impl CancelHandler> {
        Arc::new(DefaultCancelHandler::new(self.0.manager.clone()))
    }
}

/// The socket, and a second handle on it to check whether the client is
/// still there without reading what it sends.
fn with_probe(
    socket: tokio::net::TcpStream,
) -> std::io::Result<(tokio::net::TcpStream, tokio::net::TcpStream)> {
    let std = socket.into_std()?;
    let probe = std.try_clone()?;
    Ok((
        tokio::net::TcpStream::from_std(std)?,
        tokio::net::TcpStream::from_std(probe)?,
    ))
}

/// Accepts clients until `shutdown` resolves.
pub async fn serve(
    engine: Arc<dyn Engine>,
    listener: TcpListener,
    wire: crate::wire::WireConfig,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let manager = Arc::new(ConnectionManager::new());
    let count = Arc::new(crate::wire::ConnectionCount::default());
    let auth = Arc::new(crate::wire::auth::Authenticator::new(wire.auth, &engine));
    let wire = Arc::new(wire);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((socket, peer)) => {
                    let handlers = Handlers(Arc::new(Connection::new(
                        engine.clone(),
                        manager.clone(),
                        auth.clone(),
                    )));
                    let socket = match with_probe(socket) {
                        Ok((socket, probe)) => {
                            let _ = handlers.0.probe.set(probe);
                            socket
                        }
                        Err(e) => {
                            tracing::debug!(%peer, error = %e, "cannot use the accepted socket");
                            continue;
                        }
                    };
                    let (wire, count) = (wire.clone(), count.clone());
                    let terminate = handlers.0.terminate.clone();
                    tokio::spawn(async move {
                        if let Err(e) = crate::wire::serve_socket(socket, handlers, &wire, &count, terminate).await {
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

/// A float as Postgres prints it: the shortest digits that read back the
/// same, in exponent form (`1e+20`, `1.5e-07`) when the exponent is below
/// -4 or at least the type's precision (15 digits for `float8`, 6 for
/// `float4`), and `NaN`, `Infinity`, `-Infinity` spelled out.
pub fn float_text(v: f64, single: bool) -> String {
    if v.is_nan() {
        return "NaN".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    let (scientific, fixed) = if single {
        (format!("{:e}", v as f32), (v as f32).to_string())
    } else {
        (format!("{v:e}"), v.to_string())
    };
    let Some((mantissa, exponent)) = scientific.split_once('e') else {
        return fixed;
    };
    let Ok(exponent) = exponent.parse::<i32>() else {
        return fixed;
    };
    let precision = if single { 6 } else { 15 };
    if v != 0.0 && (exponent < -4 || exponent >= precision) {
        let sign = if exponent < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exponent.abs())
    } else {
        fixed
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn floats_print_as_in_postgres() {
        use super::float_text;
        // PostgreSQL 15's output for the same values.
        assert_eq!(float_text(1e20, false), "1e+20");
        assert_eq!(float_text(1e15, false), "1e+15");
        assert_eq!(float_text(1e14, false), "100000000000000");
        assert_eq!(
            float_text(1.2345678901234568e17, false),
            "1.2345678901234568e+17"
        );
        assert_eq!(float_text(0.0001, false), "0.0001");
        assert_eq!(float_text(0.00001, false), "1e-05");
        assert_eq!(float_text(1.5e-7, false), "1.5e-07");
        assert_eq!(float_text(1e100, false), "1e+100");
        assert_eq!(float_text(-2.5e-10, true), "-2.5e-10");
        assert_eq!(float_text(1234567.0, true), "1.234567e+06");
        assert_eq!(float_text(123456.0, true), "123456");
        assert_eq!(float_text(0.0, false), "0");
        assert_eq!(float_text(-0.5, false), "-0.5");
        assert_eq!(float_text(f64::NEG_INFINITY, false), "-Infinity");
    }

    use super::*;
    use datafusion::arrow::array::{Int32Array, StringArray};
    use datafusion::arrow::datatypes::{Field, Schema};

    #[test]
    fn times_are_written_as_postgres_writes_them() {
        assert_eq!(time_text(0), "00:00:00");
        assert_eq!(time_text((12 * 3600 + 30 * 60) * 1_000_000), "12:30:00");
        assert_eq!(time_text(45_296_500_000), "12:34:56.5");
        assert_eq!(time_text(86_399_999_999), "23:59:59.999999");
    }

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
            .map(|r| {
                String::from_utf8(copy_line(&r.unwrap(), &CopyOptions::new(CopyFormat::Text)))
                    .unwrap()
            })
            .collect();
        assert_eq!(lines, vec!["1\ttab\\there\\\\ and\\nline\n", "\\N\tx\n"]);
    }
}

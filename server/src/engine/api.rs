//! The engine's one door for the wire layer: everything a connection asks
//! of the database goes through [`Engine`], which [`Database`] implements.
//!
//! The wire holds a `Session` per connection and passes statements
//! (`crate::sql::stmt::Stmt`) in and results ([`QueryResult`]) out; those
//! are the engine's data types, and `crate::engine::control` is how a
//! statement's run is stopped. Everything else — the catalog, planning,
//! tables, views and the cluster — is behind this trait, so a change to
//! how a statement runs never touches pgwire's handlers, and a change to
//! the protocol never touches the engine.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use datafusion::sql::sqlparser::ast::Statement;
use pgwire::api::Type;

use crate::catalog::activity::{Backend, Entry};
use crate::catalog::roles::{Login, Role};
use crate::catalog::{table_desc, user_schema};
use crate::engine::session::Session;
use crate::engine::subscribe::Subscription;
use crate::engine::{Database, QueryResult};
use crate::error::Result;
use crate::sql::params;
use crate::sql::stmt::{self, QualifiedName, Stmt};

/// What a statement prepared by the extended protocol returns, and what
/// its placeholders were found to be.
#[derive(Debug, Default)]
pub struct Description {
    /// The result's columns: a query's, a `FETCH`'s cursor's, a
    /// `SUBSCRIBE`'s.
    pub schema: Option<SchemaRef>,
    /// The types planning inferred for `$1`, `$2`, … (a query's, or a
    /// DML statement's with placeholders).
    pub inferred: HashMap<String, Option<DataType>>,
}

/// What a connection asks of the database.
#[async_trait]
pub trait Engine: Send + Sync + std::fmt::Debug + 'static {
    /// A new connection's session, with the server's defaults.
    fn new_session(&self) -> Session;

    /// The role `user` names, if there is one.
    fn role(&self, user: &str) -> Option<Role>;

    /// Counts a login of `role` against its connection limit, until the
    /// `Login` is dropped; `None` when the limit is reached.
    fn log_in(&self, role: &Role) -> Option<Login>;

    /// Shows a connected backend in `pg_stat_activity` until the `Entry`
    /// is dropped.
    fn register_backend(&self, backend: Backend) -> Entry;

    /// Qualifies `stmt`'s unqualified names by the session's
    /// `search_path`.
    fn qualify(&self, session: &Session, stmt: &mut Stmt) -> Result<()>;

    /// What a (qualified) statement returns and what its placeholders are,
    /// for the extended protocol's Parse and Describe. `client_types` are
    /// the types the client declared for `$1`, `$2`, ….
    async fn describe(
        self: Arc<Self>,
        session: &Session,
        stmt: &Stmt,
        client_types: &[Option<Type>],
    ) -> Result<Description>;

    /// Runs one statement in `session`.
    async fn execute(self: Arc<Self>, session: &mut Session, stmt: Stmt) -> Result<QueryResult>;

    /// How many columns a `COPY table (columns) FROM STDIN` reads a line
    /// into.
    fn copy_width(&self, table: &QualifiedName, columns: &[String]) -> Result<usize>;

    /// Writes the rows a `COPY … FROM STDIN` sent, all or none (into the
    /// session's transaction block, if one is open); the number written.
    async fn copy_in(
        self: Arc<Self>,
        session: &mut Session,
        table: &QualifiedName,
        columns: &[String],
        rows: &[Vec<Option<String>>],
        first_line: usize,
    ) -> Result<usize>;

    /// After a write: with `implicit_flush` on, returns once every view
    /// has it.
    async fn flush_if_implicit(&self, session: &Session) -> Result<()>;
}

#[async_trait]
impl Engine for Database {
    fn new_session(&self) -> Session {
        Session::new(self.default_parallelism)
    }

    fn role(&self, user: &str) -> Option<Role> {
        self.roles.get(user)
    }

    fn log_in(&self, role: &Role) -> Option<Login> {
        Login::enter(&self.roles, role)
    }

    fn register_backend(&self, backend: Backend) -> Entry {
        Entry::register(&self.activity, backend)
    }

    fn qualify(&self, session: &Session, stmt: &mut Stmt) -> Result<()> {
        Database::qualify(self, session, stmt)
    }

    async fn describe(
        self: Arc<Self>,
        session: &Session,
        stmt: &Stmt,
        client_types: &[Option<Type>],
    ) -> Result<Description> {
        let mut out = Description::default();
        match stmt {
            Stmt::Subscribe {
                subscribe,
                copy: false,
            } => {
                out.schema = Some(Subscription::open(&self, subscribe).await?.schema());
            }
            Stmt::Fetch { cursor, .. } => {
                out.schema = session.cursor_schema(cursor);
            }
            _ => {}
        }
        let Stmt::Sql(s) = stmt else {
            return Ok(out);
        };
        let has_placeholders = !stmt::placeholders(s).is_empty();
        let mut planned = match s.as_ref() {
            Statement::Query(_) => s.as_ref().clone(),
            Statement::Insert(_) | Statement::Update(_) | Statement::Delete(_)
                if has_placeholders =>
            {
                s.as_ref().clone()
            }
            _ => return Ok(out),
        };
        let ctx = crate::engine::query::query_context(&self, session);
        let mut names_seen = None;
        if let Statement::Query(q) = &mut planned {
            names_seen = crate::engine::query::prepare(&ctx, q).await?;
        }
        params::declare_types(&mut planned, client_types)?;
        let is_query = matches!(planned, Statement::Query(_));
        match crate::engine::context::plan_statement(&ctx, planned).await {
            Ok(plan) => {
                if is_query {
                    out.schema = Some(crate::engine::query::renamed(
                        plan.schema().inner(),
                        names_seen.as_deref(),
                    ));
                }
                out.inferred = plan.get_parameter_types().unwrap_or_default();
            }
            // A query must plan; DML may still run without inference.
            Err(e) if is_query => return Err(e),
            Err(_) => {}
        }
        Ok(out)
    }

    async fn execute(self: Arc<Self>, session: &mut Session, stmt: Stmt) -> Result<QueryResult> {
        Database::execute(&self, session, stmt).await
    }

    fn copy_width(&self, table: &QualifiedName, columns: &[String]) -> Result<usize> {
        if !columns.is_empty() {
            return Ok(columns.len());
        }
        // A table that went meanwhile: the write fails, and says so.
        match self.catalog.by_name(table) {
            Some(entry) => Ok(user_schema(&table_desc(&entry)?).fields().len()),
            None => Ok(0),
        }
    }

    async fn copy_in(
        self: Arc<Self>,
        session: &mut Session,
        table: &QualifiedName,
        columns: &[String],
        rows: &[Vec<Option<String>>],
        first_line: usize,
    ) -> Result<usize> {
        let done = crate::engine::dml::copy_in(
            &self,
            session.tx.as_mut(),
            table,
            columns,
            rows,
            first_line,
        )
        .await;
        if done.is_err() {
            session.transaction_failed();
        }
        done
    }

    async fn flush_if_implicit(&self, session: &Session) -> Result<()> {
        Database::flush_if_implicit(self, session).await
    }
}

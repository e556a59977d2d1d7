//! Statement dispatch: `Database::execute` takes one parsed statement of a
//! session, checks it (names qualified by `search_path`, privileges,
//! read-only transactions, the commit point) and hands it to the module
//! for its kind: `ddl`, `dml`, `query`, `savepoint`, `subscribe`, `dcl`,
//! cursors and session settings. The shared state it works on is
//! `Database` (`super`).

use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Reset, Set, Statement, TransactionAccessMode, TransactionIsolationLevel,
    TransactionMode, Value,
};

use super::{Database, QueryResult, ddl, dml, leading_words, query, savepoint, transaction};
use crate::engine::cursor::Cursor;
use crate::engine::session::Session;
use crate::engine::subscribe::Subscription;
use crate::error::{Result, ServerError};
use crate::sql::stmt::{Stmt, object_name};

impl Database {
    /// A write's result, once `implicit_flush` is satisfied (inside a
    /// transaction block, by its `COMMIT`).
    async fn written(&self, session: &Session, done: Result<QueryResult>) -> Result<QueryResult> {
        let done = done?;
        if session.tx.is_none() {
            self.flush_if_implicit(session).await?;
        }
        Ok(done)
    }

    /// With `implicit_flush` on, a write returns once every view has its
    /// rows (see `FLUSH`).
    pub async fn flush_if_implicit(&self, session: &Session) -> Result<()> {
        if session.get("implicit_flush").is_ok_and(|v| v == "on") {
            self.flush().await?;
        }
        Ok(())
    }

    /// Qualifies `stmt`'s unqualified names by the session's
    /// `search_path` (see [`crate::catalog::search_path`]).
    pub fn qualify(&self, session: &Session, stmt: &mut Stmt) -> Result<()> {
        let path = session.search_path(&self.catalog);
        if path.is_default() {
            return Ok(());
        }
        path.qualify(&self.catalog, stmt)
    }

    /// Runs one statement of `session`; an error inside a transaction
    /// block fails the block (see [`transaction`]).
    pub async fn execute(
        self: &Arc<Self>,
        session: &mut Session,
        stmt: Stmt,
    ) -> Result<QueryResult> {
        let result = self.execute_statement(session, stmt).await;
        if result.is_err() {
            transaction::failed(session);
        }
        result
    }

    async fn execute_statement(
        self: &Arc<Self>,
        session: &mut Session,
        mut stmt: Stmt,
    ) -> Result<QueryResult> {
        transaction::admit(session, &stmt, changes_catalog(&stmt))?;
        self.qualify(session, &mut stmt)?;
        crate::engine::dcl::check(self, session, &stmt)?;
        if !stoppable(&stmt) {
            // Not written to be dropped half way: it runs to its end once
            // it has begun (crate::engine::control).
            crate::engine::control::commit_point()?;
        }
        if session
            .get("transaction_read_only")
            .is_ok_and(|v| v == "on")
            && let Some(what) = writes(&stmt)
        {
            return Err(ServerError::ReadOnlyTransaction(format!(
                "cannot execute {what} in a read-only transaction"
            )));
        }
        match stmt {
            Stmt::Flush => {
                self.flush().await?;
                Ok(QueryResult::command("FLUSH"))
            }
            Stmt::Checkpoint => {
                self.cluster
                    .job_manager
                    .checkpoint_all()
                    .await
                    .map_err(|e| self.job_error(e))?;
                Ok(QueryResult::command("CHECKPOINT"))
            }
            Stmt::ShowMaterializedViews => query::show_objects(self, "materialized view"),
            Stmt::ShowViews => query::show_objects(self, "view"),
            Stmt::ShowCreateView { name, materialized } => {
                query::show_create_view(self, &object_name(&name)?, materialized)
            }
            Stmt::ShowJobs => query::show_jobs(self),
            Stmt::ShowSources => query::show_sources(self),
            Stmt::ShowSinks => crate::engine::sinks::show(self),
            Stmt::CreateSink {
                name,
                if_not_exists,
                query,
                connector,
            } => {
                let name = object_name(&name)?;
                crate::engine::sinks::create(self, session, name, if_not_exists, *query, connector)
                    .await
            }
            Stmt::DropSink {
                name,
                if_exists,
                cascade,
            } => {
                let names = [object_name(&name)?];
                ddl::drop_objects(self, "sink", if_exists, &names, cascade).await
            }
            Stmt::DropSource {
                name,
                if_exists,
                cascade,
            } => {
                let names = [object_name(&name)?];
                ddl::drop_objects(self, "source", if_exists, &names, cascade).await
            }
            Stmt::SetParallelism { view, parallelism } => {
                super::jobs::set_parallelism(self, &object_name(&view)?, parallelism).await
            }
            Stmt::CreateSavepoint { name, view } => {
                let view = view.as_ref().map(object_name).transpose()?;
                savepoint::create(self, &name, view.as_ref()).await
            }
            Stmt::DropSavepoint { name, if_exists } => {
                savepoint::drop(self, &name, if_exists).await
            }
            Stmt::ShowSavepoints => savepoint::show(self),
            Stmt::RestoreSavepoint { name, view } => {
                let view = view.as_ref().map(object_name).transpose()?;
                savepoint::restore(self, &name, view.as_ref()).await
            }
            Stmt::EmitOnWindowClose(s) => match *s {
                Statement::CreateView(cv) if cv.materialized => {
                    ddl::create_view(self, session, cv, true).await
                }
                Statement::Explain { statement, .. } => match *statement {
                    Statement::CreateView(cv) if cv.materialized => {
                        ddl::explain_view(self, session, cv, true).await
                    }
                    _ => Err(emit_misplaced()),
                },
                _ => Err(emit_misplaced()),
            },
            Stmt::CreateTable { table, options } => match *table {
                Statement::CreateTable(ct) => ddl::create_table(self, session, ct, options).await,
                other => Err(ServerError::Internal(format!("not CREATE TABLE: {other}"))),
            },
            Stmt::Subscribe { subscribe, copy } => Ok(QueryResult::Subscribe {
                sub: Box::new(Subscription::open(self, &subscribe).await?),
                copy,
            }),
            Stmt::DeclareSubscribe { name, subscribe } => {
                if session.cursors.contains_key(&name) {
                    return Err(ServerError::DuplicateCursor(format!(
                        "cursor \"{name}\" already exists"
                    )));
                }
                let sub = Subscription::open(self, &subscribe).await?;
                session
                    .cursors
                    .insert(name, Cursor::Subscribe(Box::new(sub)));
                Ok(QueryResult::command("DECLARE CURSOR"))
            }
            Stmt::Fetch {
                cursor,
                count,
                timeout,
                skip,
            } => {
                let sub = session.cursors.get_mut(&cursor).ok_or_else(|| {
                    ServerError::InvalidCursorName(format!("cursor \"{cursor}\" does not exist"))
                })?;
                let max = count.map_or(usize::MAX, |n| n as usize);
                let batches = if max == 0 {
                    Vec::new()
                } else {
                    let deadline = timeout.map(|t| tokio::time::Instant::now() + t);
                    sub.fetch(max, deadline).await?
                };
                if skip {
                    return Ok(QueryResult::Command {
                        tag: "MOVE".into(),
                        rows: Some(batches.iter().map(RecordBatch::num_rows).sum()),
                    });
                }
                Ok(QueryResult::Rows {
                    schema: sub.schema(),
                    batches,
                })
            }
            Stmt::Close { cursor: None } => {
                session.cursors.clear();
                Ok(QueryResult::command("CLOSE CURSOR ALL"))
            }
            Stmt::Close {
                cursor: Some(cursor),
            } => match session.cursors.remove(&cursor) {
                Some(_) => Ok(QueryResult::command("CLOSE CURSOR")),
                None => Err(ServerError::InvalidCursorName(format!(
                    "cursor \"{cursor}\" does not exist"
                ))),
            },
            Stmt::Sql(s) => self.execute_sql(session, *s).await,
        }
    }

    async fn execute_sql(
        self: &Arc<Self>,
        session: &mut Session,
        s: Statement,
    ) -> Result<QueryResult> {
        match s {
            Statement::Query(q) => query::select(self, session, *q).await,
            Statement::Declare { stmts } => {
                for d in stmts {
                    declare_cursor(self, session, d).await?;
                }
                Ok(QueryResult::command("DECLARE CURSOR"))
            }
            Statement::Copy {
                source,
                to,
                target,
                options,
                legacy_options,
                ..
            } => match crate::sql::copy::plan(source, to, target, &options, &legacy_options)? {
                crate::sql::copy::Copy::Out { query, options } => {
                    match query::select(self, session, *query).await? {
                        QueryResult::Rows { schema, batches } => Ok(QueryResult::CopyOut {
                            schema,
                            batches,
                            options,
                        }),
                        _ => Err(ServerError::Internal("COPY's query gave no rows".into())),
                    }
                }
                crate::sql::copy::Copy::In {
                    table,
                    columns,
                    options,
                } => {
                    let table = crate::sql::stmt::object_name(&table)?;
                    // Refused now, before the client sends its data.
                    dml::copy_target(self, &table)?;
                    Ok(QueryResult::CopyIn {
                        table,
                        columns: columns.iter().map(crate::sql::stmt::ident).collect(),
                        options,
                    })
                }
            },
            Statement::Insert(insert) => {
                let done = dml::insert(self, session.tx.as_mut(), insert).await;
                self.written(session, done).await
            }
            Statement::Update(update) => {
                let done = dml::update(self, session.tx.as_mut(), update).await;
                self.written(session, done).await
            }
            Statement::Delete(delete) => {
                let done = dml::delete(self, session.tx.as_mut(), delete).await;
                self.written(session, done).await
            }
            Statement::Truncate(truncate) => {
                let done = dml::truncate(self, session.tx.as_mut(), truncate).await;
                self.written(session, done).await
            }
            Statement::CreateTable(ct) => {
                ddl::create_table(self, session, ct, Default::default()).await
            }
            Statement::CreateView(cv) => ddl::create_view(self, session, cv, false).await,
            Statement::CreateSchema {
                schema_name,
                if_not_exists,
                ..
            } => ddl::create_schema(self, &schema_name, if_not_exists).await,
            Statement::Drop {
                object_type: datafusion::sql::sqlparser::ast::ObjectType::Schema,
                if_exists,
                names,
                cascade,
                ..
            } => ddl::drop_schema(self, if_exists, &names, cascade).await,
            Statement::Drop {
                object_type,
                if_exists,
                names,
                ..
            } if crate::engine::dcl::is_role_type(&object_type) => {
                crate::engine::dcl::drop_roles(self, session, if_exists, &names)
            }
            Statement::Drop {
                object_type,
                if_exists,
                names,
                cascade,
                ..
            } => ddl::drop(self, object_type, if_exists, names, cascade).await,
            Statement::CreateRole(cr) => crate::engine::dcl::create_role(self, cr, false),
            Statement::AlterRole { name, operation } => {
                crate::engine::dcl::alter_role(self, session, &name, operation)
            }
            Statement::Grant(g) => crate::engine::dcl::grant(
                self,
                true,
                &g.privileges,
                g.objects.as_ref(),
                &g.grantees,
                g.with_grant_option,
            ),
            Statement::Revoke(r) => crate::engine::dcl::grant(
                self,
                false,
                &r.privileges,
                r.objects.as_ref(),
                &r.grantees,
                false,
            ),
            Statement::Explain {
                statement, analyze, ..
            } => match *statement {
                Statement::CreateView(cv) if cv.materialized => {
                    ddl::explain_view(self, session, cv, false).await
                }
                Statement::Query(q) if !analyze => query::explain(self, session, *q).await,
                other => Err(ServerError::unsupported(format!(
                    "EXPLAIN of {}",
                    leading_words(&other.to_string())
                ))),
            },
            Statement::ShowTables { show_options, .. } => query::show_tables(self, &show_options),
            Statement::ShowSchemas { show_options, .. }
                if show_options.show_in.is_none() && show_options.filter_position.is_none() =>
            {
                query::show_schemas(self)
            }
            Statement::ShowVariable { variable } => {
                let words = variable.iter().map(|i| i.value.clone()).collect::<Vec<_>>();
                // `SHOW TRANSACTION ISOLATION LEVEL` and `SHOW TIME ZONE`
                // are spelled in words; `SHOW ext.name` is one setting.
                let name = match words.join(" ").to_lowercase().as_str() {
                    "transaction isolation level" => "transaction_isolation".to_string(),
                    "time zone" => "timezone".to_string(),
                    "session authorization" => "session_authorization".to_string(),
                    _ => words.join("."),
                };
                if name.eq_ignore_ascii_case("all") {
                    let rows = session
                        .settings()
                        .into_iter()
                        .map(|(k, v)| vec![k, v])
                        .collect();
                    return QueryResult::texts(&["name", "setting"], rows);
                }
                QueryResult::text(&name.to_lowercase(), vec![session.get(&name)?])
            }
            Statement::Set(set) => set_variable(session, set),
            Statement::Reset(r) => {
                match r.reset {
                    Reset::ALL => session.reset_all(),
                    Reset::ConfigurationParameter(name) => session.reset(&name.to_string())?,
                }
                Ok(QueryResult::command("RESET"))
            }
            Statement::StartTransaction { modes, .. } => {
                set_transaction_modes(session, &modes, false)?;
                transaction::begin(session);
                Ok(QueryResult::command("BEGIN"))
            }
            // What `SET TRANSACTION` chose ends with the block, as in
            // Postgres, whether the commit succeeds or not.
            Statement::Commit { .. } => {
                let done = transaction::commit(self, session).await;
                end_transaction(session)?;
                done
            }
            Statement::Savepoint { name } => {
                transaction::savepoint(session, crate::sql::stmt::ident(&name))?;
                Ok(QueryResult::command("SAVEPOINT"))
            }
            Statement::ReleaseSavepoint { name } => {
                transaction::release(session, &crate::sql::stmt::ident(&name))?;
                Ok(QueryResult::command("RELEASE"))
            }
            Statement::Rollback {
                savepoint: Some(name),
                ..
            } => {
                transaction::rollback_to(self, session, &crate::sql::stmt::ident(&name))?;
                Ok(QueryResult::command("ROLLBACK"))
            }
            Statement::Rollback { .. } => {
                transaction::rollback(session);
                end_transaction(session)?;
                Ok(QueryResult::command("ROLLBACK"))
            }
            // Nothing is ever listened to (LISTEN is refused below).
            Statement::UNLISTEN { .. } => Ok(QueryResult::command("UNLISTEN")),
            other => Err(ServerError::unsupported(format!(
                "the statement {}",
                leading_words(&other.to_string())
            ))),
        }
    }
}

fn set_variable(session: &mut Session, set: Set) -> Result<QueryResult> {
    match set {
        Set::SingleAssignment {
            variable, values, ..
        } => {
            let name = variable.to_string();
            let value = values
                .iter()
                .map(|v| match v {
                    SqlExpr::Value(v) => match &v.value {
                        Value::SingleQuotedString(s) | Value::DoubleQuotedString(s) => s.clone(),
                        other => other.to_string(),
                    },
                    SqlExpr::Identifier(i) => i.value.clone(),
                    other => other.to_string(),
                })
                .collect::<Vec<_>>()
                .join(", ");
            session.set(&name, &value)?;
            Ok(QueryResult::command("SET"))
        }
        Set::SetTimeZone { value, .. } => {
            let v = match value {
                SqlExpr::Value(v) => match v.value {
                    Value::SingleQuotedString(s) => s,
                    other => other.to_string(),
                },
                other => other.to_string(),
            };
            session.set("timezone", &v)?;
            Ok(QueryResult::command("SET"))
        }
        Set::SetNames { charset_name, .. } => {
            session.set("client_encoding", &charset_name.to_string())?;
            Ok(QueryResult::command("SET"))
        }
        // Weir's reads see one committed checkpoint and its writes are
        // serializable, which satisfies every level; the level asked for
        // is kept, so that SHOW answers it.
        Set::SetTransaction {
            modes,
            snapshot: None,
            session: is_session,
        } => {
            set_transaction_modes(session, &modes, is_session)?;
            Ok(QueryResult::command("SET"))
        }
        other => Err(ServerError::unsupported(format!("{other}"))),
    }
}

/// Whether `stmt` may be stopped (cancelled, timed out) until it reaches
/// its commit point: statements that change nothing, and those that mark
/// the point where they start to (`crate::engine::control::commit_point`): DML,
/// and the creation of views and sinks, which plan and check everything
/// first.
fn stoppable(stmt: &Stmt) -> bool {
    match stmt {
        Stmt::Sql(s) => matches!(
            s.as_ref(),
            Statement::Query(_)
                | Statement::Insert(_)
                | Statement::Update(_)
                | Statement::Delete(_)
                | Statement::Explain { .. }
                | Statement::ShowVariable { .. }
                | Statement::ShowTables { .. }
                | Statement::ShowSchemas { .. }
                | Statement::Declare { .. }
                | Statement::Copy { .. }
                | Statement::CreateView(_)
        ),
        Stmt::EmitOnWindowClose(_)
        | Stmt::CreateSink { .. }
        | Stmt::Flush
        | Stmt::Checkpoint
        | Stmt::ShowMaterializedViews
        | Stmt::ShowViews
        | Stmt::ShowCreateView { .. }
        | Stmt::ShowJobs
        | Stmt::ShowSources
        | Stmt::ShowSinks
        | Stmt::ShowSavepoints
        | Stmt::Subscribe { .. }
        | Stmt::DeclareSubscribe { .. }
        | Stmt::Fetch { .. } => true,
        _ => false,
    }
}

/// The command `stmt` is, if it changes data or the catalog (which a
/// read-only transaction may not).
fn writes(stmt: &Stmt) -> Option<&'static str> {
    Some(match stmt {
        Stmt::CreateSink { .. } => "CREATE SINK",
        Stmt::DropSink { .. } => "DROP SINK",
        Stmt::DropSource { .. } => "DROP SOURCE",
        Stmt::SetParallelism { .. } => "ALTER MATERIALIZED VIEW",
        Stmt::CreateSavepoint { .. } => "CREATE SAVEPOINT",
        Stmt::DropSavepoint { .. } => "DROP SAVEPOINT",
        Stmt::RestoreSavepoint { .. } => "RESTORE SAVEPOINT",
        Stmt::EmitOnWindowClose(_) => "CREATE MATERIALIZED VIEW",
        Stmt::CreateTable { .. } => "CREATE TABLE",
        Stmt::Sql(s) => match s.as_ref() {
            Statement::Insert(_) => "INSERT",
            Statement::Copy { to: false, .. } => "COPY FROM",
            Statement::Update(_) => "UPDATE",
            Statement::Delete(_) => "DELETE",
            Statement::Truncate(_) => "TRUNCATE",
            Statement::CreateTable(_) => "CREATE TABLE",
            Statement::CreateView(_) => "CREATE VIEW",
            Statement::Drop { .. } => "DROP",
            _ => return None,
        },
        _ => return None,
    })
}

/// The catalog change `stmt` is, if it is one: what a transaction block
/// that has written refuses (see [`transaction`]).
fn changes_catalog(stmt: &Stmt) -> Option<&'static str> {
    match stmt {
        Stmt::Sql(s) => match s.as_ref() {
            Statement::Insert(_)
            | Statement::Copy { .. }
            | Statement::Update(_)
            | Statement::Delete(_)
            | Statement::Truncate(_) => None,
            Statement::CreateSchema { .. } => Some("CREATE SCHEMA"),
            Statement::CreateRole(_) => Some("CREATE ROLE"),
            Statement::AlterRole { .. } => Some("ALTER ROLE"),
            Statement::Grant(_) => Some("GRANT"),
            Statement::Revoke(_) => Some("REVOKE"),
            _ => writes(stmt),
        },
        other => writes(other),
    }
}

/// `BEGIN ISOLATION LEVEL …`, `SET [SESSION CHARACTERISTICS AS]
/// TRANSACTION …`.
fn set_transaction_modes(
    session: &mut Session,
    modes: &[TransactionMode],
    is_session: bool,
) -> Result<()> {
    for mode in modes {
        let (name, value) = match mode {
            TransactionMode::IsolationLevel(level) => (
                "transaction_isolation",
                match level {
                    TransactionIsolationLevel::Serializable => "serializable",
                    TransactionIsolationLevel::RepeatableRead => "repeatable read",
                    TransactionIsolationLevel::ReadCommitted => "read committed",
                    TransactionIsolationLevel::ReadUncommitted => "read uncommitted",
                    other => {
                        return Err(ServerError::unsupported(format!(
                            "the isolation level {other}"
                        )));
                    }
                },
            ),
            TransactionMode::AccessMode(TransactionAccessMode::ReadOnly) => {
                ("transaction_read_only", "on")
            }
            TransactionMode::AccessMode(TransactionAccessMode::ReadWrite) => {
                ("transaction_read_only", "off")
            }
        };
        session.set(name, value)?;
        if is_session {
            session.set(&format!("default_{name}"), value)?;
        }
    }
    Ok(())
}

/// The end of a transaction block: its own modes give way to the
/// session's defaults.
/// `DECLARE name [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR query`: the
/// query runs now and its rows wait for `FETCH`.
async fn declare_cursor(
    db: &Arc<Database>,
    session: &mut Session,
    d: datafusion::sql::sqlparser::ast::Declare,
) -> Result<()> {
    let (Some(query), [name]) = (d.for_query, d.names.as_slice()) else {
        return Err(ServerError::unsupported(
            "DECLARE of anything but a cursor FOR a query",
        ));
    };
    if d.binary == Some(true) {
        return Err(ServerError::unsupported("BINARY cursors"));
    }
    if d.scroll == Some(true) {
        return Err(ServerError::unsupported(
            "SCROLL cursors (cursors here only move forward)",
        ));
    }
    let name = crate::sql::stmt::ident(name);
    if session.cursors.contains_key(&name) {
        return Err(ServerError::DuplicateCursor(format!(
            "cursor \"{name}\" already exists"
        )));
    }
    let QueryResult::Rows { schema, batches } = query::select(db, session, *query).await? else {
        return Err(ServerError::Internal(
            "a cursor's query gave no rows".into(),
        ));
    };
    let hold = d.hold == Some(true);
    session
        .cursors
        .insert(name, Cursor::rows(schema, batches, hold));
    Ok(())
}

fn end_transaction(session: &mut Session) -> Result<()> {
    session.cursors.retain(|_, c| !c.closes_with_transaction());
    for name in ["transaction_isolation", "transaction_read_only"] {
        let default = session.get(&format!("default_{name}"))?;
        session.set(name, &default)?;
    }
    Ok(())
}

fn emit_misplaced() -> ServerError {
    ServerError::Syntax("EMIT ON WINDOW CLOSE ends a CREATE MATERIALIZED VIEW only".into())
}

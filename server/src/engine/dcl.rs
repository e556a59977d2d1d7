//! Statements about roles and privileges — `CREATE | ALTER | DROP ROLE`
//! (and `USER`), `GRANT` and `REVOKE SELECT` — and the check every
//! statement passes before it runs: may the session's role run it?
//!
//! The model is [`crate::catalog::roles`]'s: a superuser may run anything; any other
//! role may query the catalogs and the relations it holds `SELECT` on, set
//! its session, move its cursors and change its own password.

use std::ops::ControlFlow;
use std::sync::Arc;

use datafusion::sql::sqlparser::ast::{
    Action, AlterRoleOperation, CopySource, CreateRole, Expr, GrantObjects, Grantee, GranteeName,
    ObjectName, ObjectType, Password, Privileges, RoleOption, Statement, Value, visit_relations,
};

use crate::catalog::Entry;
use crate::catalog::roles::{self, Role, Secret};
use crate::engine::session::Session;
use crate::engine::{Database, QueryResult};
use crate::error::{Result, ServerError};
use crate::sql::stmt::{QualifiedName, Stmt, ident};

/// The role the session runs as; `None` if it was dropped meanwhile.
fn current(db: &Database, session: &Session) -> Option<Role> {
    db.roles.get(&session.user)
}

fn denied(what: impl std::fmt::Display) -> ServerError {
    ServerError::InsufficientPrivilege(format!("permission denied {what}"))
}

/// Refuses `stmt` with `42501` unless the session's role may run it.
pub fn check(db: &Database, session: &Session, stmt: &Stmt) -> Result<()> {
    let role = match current(db, session) {
        Some(r) if r.superuser => return Ok(()),
        Some(r) => r,
        None => return Err(roles::missing(&session.user)),
    };
    let statement = match stmt {
        Stmt::Flush
        | Stmt::ShowMaterializedViews
        | Stmt::ShowViews
        | Stmt::ShowCreateView { .. }
        | Stmt::ShowJobs
        | Stmt::ShowSources
        | Stmt::ShowSinks
        | Stmt::ShowSavepoints
        | Stmt::Fetch { .. }
        | Stmt::Close { .. } => return Ok(()),
        Stmt::Subscribe { subscribe, .. } | Stmt::DeclareSubscribe { subscribe, .. } => {
            return may_read(db, &role, &crate::sql::stmt::object_name(&subscribe.view)?);
        }
        Stmt::Sql(s) => s.as_ref(),
        _ => return Err(superuser_only(&role)),
    };
    match statement {
        Statement::Query(_) | Statement::Declare { .. } => reads(db, &role, statement),
        Statement::Explain { statement, .. } if matches!(**statement, Statement::Query(_)) => {
            reads(db, &role, statement)
        }
        Statement::Copy {
            source, to: true, ..
        } => match source {
            CopySource::Table { table_name, .. } => may_read_name(db, &role, table_name),
            CopySource::Query(_) => reads(db, &role, statement),
        },
        Statement::ShowVariable { .. }
        | Statement::ShowVariables { .. }
        | Statement::ShowTables { .. }
        | Statement::ShowSchemas { .. }
        | Statement::Set(_)
        | Statement::Reset(_)
        | Statement::StartTransaction { .. }
        | Statement::Commit { .. }
        | Statement::Rollback { .. }
        | Statement::Savepoint { .. }
        | Statement::ReleaseSavepoint { .. }
        | Statement::Discard { .. }
        | Statement::Deallocate { .. }
        | Statement::Close { .. } => Ok(()),
        // A role may change its own password, and nothing else of itself.
        Statement::AlterRole {
            name,
            operation: AlterRoleOperation::WithOptions { options },
        } if ident(name) == role.name
            && options.iter().all(|o| matches!(o, RoleOption::Password(_))) =>
        {
            Ok(())
        }
        _ => Err(superuser_only(&role)),
    }
}

fn superuser_only(role: &Role) -> ServerError {
    denied(format_args!(
        "for role \"{}\": only a superuser may change what Weir holds; other roles may read what they were granted SELECT on",
        role.name
    ))
}

/// Every user relation `statement` names must be granted to `role`.
fn reads(db: &Database, role: &Role, statement: &Statement) -> Result<()> {
    let mut result = Ok(());
    let _ = visit_relations(statement, |name| {
        result = may_read_name(db, role, name);
        if result.is_err() {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    result
}

/// `name` is a catalog relation (always readable), a relation of Weir's
/// catalog `role` must hold `SELECT` on, or no relation at all (a `WITH`
/// query's name, a table function), which the planner answers for.
fn may_read_name(db: &Database, role: &Role, name: &ObjectName) -> Result<()> {
    match crate::sql::stmt::object_name(name) {
        Ok(name) if name.schema == "pg_catalog" || name.schema == "information_schema" => Ok(()),
        Ok(name) => may_read(db, role, &name),
        Err(_) => Ok(()),
    }
}

fn may_read(db: &Database, role: &Role, relation: &QualifiedName) -> Result<()> {
    match db.catalog.by_name(relation) {
        Some(entry) if !role.select.contains(&entry.id()) => Err(denied(format_args!(
            "for {} {}",
            entry.kind(),
            entry.qualified()
        ))),
        _ => Ok(()),
    }
}

/// `CREATE ROLE` and, with `user`, `CREATE USER` (which may log in unless
/// it says `NOLOGIN`).
pub fn create_role(db: &Database, cr: CreateRole, user: bool) -> Result<QueryResult> {
    if !cr.in_role.is_empty()
        || !cr.in_group.is_empty()
        || !cr.role.is_empty()
        || !cr.user.is_empty()
        || !cr.admin.is_empty()
    {
        return Err(ServerError::unsupported(
            "role membership (IN ROLE, ROLE, ADMIN)",
        ));
    }
    if cr.valid_until.is_some() {
        return Err(ServerError::unsupported("VALID UNTIL"));
    }
    if cr.replication == Some(true) {
        return Err(ServerError::unsupported("the REPLICATION attribute"));
    }
    if cr.authorization_owner.is_some() {
        return Err(ServerError::unsupported("CREATE ROLE … AUTHORIZATION"));
    }
    for name in &cr.names {
        let name = role_name(name)?;
        if db.roles.get(&name).is_some() && cr.if_not_exists {
            continue;
        }
        let mut role = Role::new(&name);
        role.login = cr.login.unwrap_or(user);
        role.superuser = cr.superuser.unwrap_or(false);
        role.create_db = cr.create_db.unwrap_or(false);
        role.create_role = cr.create_role.unwrap_or(false);
        if let Some(limit) = &cr.connection_limit {
            role.connection_limit = connection_limit(limit)?;
        }
        if let Some(p) = &cr.password {
            role.secret = secret(p)?;
        }
        db.roles.create(role)?;
    }
    Ok(QueryResult::command("CREATE ROLE"))
}

/// `ALTER ROLE | USER name [WITH] option …` and `… RENAME TO`.
pub fn alter_role(
    db: &Database,
    session: &Session,
    name: &datafusion::sql::sqlparser::ast::Ident,
    operation: AlterRoleOperation,
) -> Result<QueryResult> {
    let name = ident(name);
    match operation {
        AlterRoleOperation::WithOptions { options } => {
            // Every option is checked before any is kept.
            let mut role = db.roles.get(&name).ok_or_else(|| roles::missing(&name))?;
            for option in options {
                match option {
                    RoleOption::Login(v) => role.login = v,
                    RoleOption::SuperUser(false) if name == roles::SUPERUSER => {
                        return Err(ServerError::unsupported(format!(
                            "taking the superuser attribute from \"{}\", the bootstrap superuser",
                            roles::SUPERUSER
                        )));
                    }
                    RoleOption::SuperUser(v) => role.superuser = v,
                    RoleOption::CreateDB(v) => role.create_db = v,
                    RoleOption::CreateRole(v) => role.create_role = v,
                    RoleOption::Inherit(_) | RoleOption::BypassRLS(_) => {}
                    RoleOption::ConnectionLimit(e) => role.connection_limit = connection_limit(&e)?,
                    RoleOption::Password(p) => role.secret = secret(&p)?,
                    RoleOption::Replication(true) => {
                        return Err(ServerError::unsupported("the REPLICATION attribute"));
                    }
                    RoleOption::Replication(false) => {}
                    RoleOption::ValidUntil(_) => {
                        return Err(ServerError::unsupported("VALID UNTIL"));
                    }
                }
            }
            db.roles.update(&name, |r| {
                *r = role;
                Ok(())
            })?;
        }
        AlterRoleOperation::RenameRole { role_name } => {
            if name == session.user {
                return Err(ServerError::unsupported(
                    "renaming the role of the current session",
                ));
            }
            if name == roles::SUPERUSER {
                return Err(ServerError::unsupported(format!(
                    "renaming \"{}\", the bootstrap superuser",
                    roles::SUPERUSER
                )));
            }
            db.roles.rename(&name, &ident(&role_name))?;
        }
        other => {
            return Err(ServerError::unsupported(format!(
                "ALTER ROLE {}",
                crate::engine::leading_words(&other.to_string())
            )));
        }
    }
    Ok(QueryResult::command("ALTER ROLE"))
}

/// `DROP ROLE | USER [IF EXISTS] name, …`.
pub fn drop_roles(
    db: &Database,
    session: &Session,
    if_exists: bool,
    names: &[ObjectName],
) -> Result<QueryResult> {
    let names = names.iter().map(role_name).collect::<Result<Vec<_>>>()?;
    for name in &names {
        if name == roles::SUPERUSER {
            return Err(ServerError::DependentObjects(format!(
                "cannot drop role {name} because it is required by the database system"
            )));
        }
        if *name == session.user {
            return Err(ServerError::ObjectInUse(
                "current user cannot be dropped".into(),
            ));
        }
        if db.roles.get(name).is_none() && !if_exists {
            return Err(roles::missing(name));
        }
    }
    for name in &names {
        db.roles.remove(name)?;
    }
    Ok(QueryResult::command("DROP ROLE"))
}

/// `GRANT SELECT ON …` (`grant`) or `REVOKE SELECT ON …`.
pub fn grant(
    db: &Arc<Database>,
    grant: bool,
    privileges: &Privileges,
    objects: Option<&GrantObjects>,
    grantees: &[Grantee],
    with_grant_option: bool,
) -> Result<QueryResult> {
    let verb = if grant { "GRANT" } else { "REVOKE" };
    if with_grant_option {
        return Err(ServerError::unsupported("WITH GRANT OPTION"));
    }
    match privileges {
        Privileges::Actions(actions)
            if !actions.is_empty()
                && actions
                    .iter()
                    .all(|a| matches!(a, Action::Select { columns: None })) => {}
        Privileges::Actions(actions)
            if actions
                .iter()
                .any(|a| matches!(a, Action::Select { columns: Some(_) })) =>
        {
            return Err(ServerError::unsupported(format!(
                "{verb} of column privileges"
            )));
        }
        other => {
            return Err(ServerError::unsupported(format!(
                "{verb} {other}: Weir's roles other than superusers only read, so SELECT is the one privilege to {verb}"
            )));
        }
    }
    let ids: Vec<u64> = match objects {
        Some(GrantObjects::Tables(names) | GrantObjects::Views(names)) => names
            .iter()
            .map(|n| relation_id(db, n))
            .collect::<Result<_>>()?,
        Some(GrantObjects::AllTablesInSchema { schemas }) => {
            let schemas = schemas
                .iter()
                .map(crate::sql::stmt::simple_name)
                .collect::<Result<Vec<_>>>()?;
            if let Some(missing) = schemas.iter().find(|s| !db.catalog.has_schema(s)) {
                return Err(ServerError::InvalidSchemaName(format!(
                    "schema \"{missing}\" does not exist"
                )));
            }
            db.catalog
                .all()
                .iter()
                .filter(|e| is_relation(e) && schemas.iter().any(|s| s == e.schema()))
                .map(Entry::id)
                .collect()
        }
        _ => {
            return Err(ServerError::unsupported(format!(
                "{verb} on anything but tables, views, materialized views, sources and streams"
            )));
        }
    };
    let mut names = Vec::new();
    for g in grantees {
        match &g.name {
            Some(GranteeName::ObjectName(n)) => names.push(role_name(n)?),
            _ => {
                return Err(ServerError::unsupported(format!(
                    "{verb} to {g}: name a role"
                )));
            }
        }
    }
    for name in &names {
        if db.roles.get(name).is_none() {
            return Err(roles::missing(name));
        }
    }
    for name in &names {
        db.roles.update(name, |r| {
            for id in &ids {
                if grant {
                    r.select.insert(*id);
                } else {
                    r.select.remove(id);
                }
            }
            Ok(())
        })?;
    }
    Ok(QueryResult::command(verb))
}

fn is_relation(e: &Entry) -> bool {
    !matches!(e.kind(), "sink")
}

fn relation_id(db: &Database, name: &ObjectName) -> Result<u64> {
    let name = crate::sql::stmt::object_name(name)?;
    match db.catalog.by_name(&name) {
        Some(e) if is_relation(&e) => Ok(e.id()),
        _ => Err(ServerError::UndefinedTable(format!(
            "relation \"{name}\" does not exist"
        ))),
    }
}

fn role_name(name: &ObjectName) -> Result<String> {
    match name.0.as_slice() {
        [part] => part
            .as_ident()
            .map(ident)
            .ok_or_else(|| ServerError::InvalidName(format!("invalid role name {name}"))),
        _ => Err(ServerError::InvalidName(format!(
            "role name \"{name}\" cannot be qualified"
        ))),
    }
}

fn connection_limit(e: &Expr) -> Result<i32> {
    let text = e.to_string();
    text.parse::<i32>()
        .ok()
        .filter(|n| *n >= -1)
        .ok_or_else(|| ServerError::InvalidParameter(format!("invalid connection limit: {text}")))
}

/// A role's secret from `PASSWORD 'text'` or `PASSWORD NULL`.
fn secret(p: &Password) -> Result<Option<Secret>> {
    let text = match p {
        Password::NullPassword => return Ok(None),
        Password::Password(Expr::Value(v)) => match &v.value {
            Value::SingleQuotedString(s) | Value::EscapedStringLiteral(s) => s.clone(),
            Value::Null => return Ok(None),
            other => {
                return Err(ServerError::Syntax(format!(
                    "a password is a string literal, not {other}"
                )));
            }
        },
        Password::Password(other) => {
            return Err(ServerError::Syntax(format!(
                "a password is a string literal, not {other}"
            )));
        }
    };
    // What psql's \password and pg_dump send: a verifier made elsewhere.
    let md5 = text.len() == 35
        && text.starts_with("md5")
        && text[3..].bytes().all(|b| b.is_ascii_hexdigit());
    if text.starts_with("SCRAM-SHA-256$") || md5 {
        return Err(ServerError::unsupported(
            "a password given already hashed (as psql's \\password sends it); give it in clear text, over TLS, and Weir makes the SCRAM secret",
        ));
    }
    if text.is_empty() {
        // Postgres: an empty password is no password.
        return Ok(None);
    }
    Ok(Some(Secret::of(&text)))
}

/// What `DROP` of this object type means here, for the DDL path.
pub fn is_role_type(t: &ObjectType) -> bool {
    matches!(t, ObjectType::Role | ObjectType::User)
}

//! Transaction blocks: `BEGIN … COMMIT | ROLLBACK`, savepoints inside
//! them, and what a block carries from one statement to the next.
//!
//! Outside a block every statement is its own transaction, written as it
//! ends. Inside one, DML is checked as it runs but its changes wait in the
//! block ([`storage::pending::PendingWrites`]); `COMMIT` writes the
//! changes of every table in one durable write, and they reach every view
//! in the same checkpoint. `ROLLBACK`, or a failed `COMMIT`, drops them.
//! As in Postgres, an error inside a block fails it: every statement but
//! `ROLLBACK` (or `COMMIT`, which then rolls back) is refused with `25P02`
//! until it ends.
//!
//! The block's own statements read its writes: a table it changed shows
//! them (`context`'s table scan lays them over the stored rows).
//! Materialized views show what is committed.
//!
//! Catalog changes are not transactional: one inside a block that has
//! written is refused (`25001`); before the block's first write it takes
//! effect at once, and `ROLLBACK` does not undo it.

use std::sync::Arc;

use storage::chunk::Chunk;
use storage::pending::PendingWrites;

use super::{Database, QueryResult};
use crate::engine::session::Session;
use crate::error::{Result, ServerError};
use crate::sql::stmt::Stmt;

/// An open transaction block.
#[derive(Debug, Default)]
pub struct Transaction {
    /// The changes the block has made so far.
    writes: Arc<PendingWrites>,
    /// An error ended the block's useful life: until it ends, statements
    /// are refused.
    failed: bool,
    /// `SAVEPOINT`s, oldest first, with the mark of the writes before each.
    savepoints: Vec<(String, usize)>,
}

impl Transaction {
    /// What the block's statements read over the stored rows.
    pub fn writes(&self) -> Arc<PendingWrites> {
        self.writes.clone()
    }
}

/// Whether `stmt` may run in the session's transaction state; refused with
/// `25P02` in a failed block (except what ends it or rolls back within
/// it), and with `25001` when it changes the catalog in a block that has
/// written.
pub fn admit(session: &Session, stmt: &Stmt, catalog_change: Option<&str>) -> Result<()> {
    let Some(tx) = &session.tx else {
        return Ok(());
    };
    if tx.failed && !ends_or_rolls_back(stmt) {
        return Err(ServerError::InFailedTransaction(
            "current transaction is aborted, commands ignored until end of transaction block"
                .into(),
        ));
    }
    if let Some(what) = catalog_change
        && !tx.writes.is_empty()
    {
        return Err(ServerError::ActiveTransaction(format!(
            "{what} cannot run inside a transaction block that has written: catalog changes are not transactional here; COMMIT or ROLLBACK first"
        )));
    }
    Ok(())
}

fn ends_or_rolls_back(stmt: &Stmt) -> bool {
    use datafusion::sql::sqlparser::ast::Statement;
    matches!(stmt, Stmt::Sql(s) if matches!(s.as_ref(), Statement::Commit { .. } | Statement::Rollback { .. }))
}

/// An error inside a block fails it.
pub fn failed(session: &mut Session) {
    if let Some(tx) = session.tx.as_mut() {
        tx.failed = true;
    }
}

/// `BEGIN`: a block starts (inside one, nothing changes, as in Postgres,
/// which warns).
pub fn begin(session: &mut Session) {
    if session.tx.is_none() {
        session.tx = Some(Transaction::default());
    }
}

/// `COMMIT`: the block's changes, every table's, in one durable write.
/// A failed block rolls back instead, and says so.
pub async fn commit(db: &Database, session: &mut Session) -> Result<QueryResult> {
    let Some(tx) = session.tx.take() else {
        return Ok(QueryResult::command("COMMIT"));
    };
    if tx.failed {
        return Ok(QueryResult::command("ROLLBACK"));
    }
    if !tx.writes.is_empty() {
        crate::engine::control::commit_point()?;
        let tables = db.cluster.tables.clone();
        let writes = tx.writes;
        tokio::task::spawn_blocking(move || tables.commit_pending(&writes))
            .await
            .map_err(|e| ServerError::Internal(e.to_string()))??;
        db.flush_if_implicit(session).await?;
    }
    Ok(QueryResult::command("COMMIT"))
}

/// `ROLLBACK`: the block's changes are dropped.
pub fn rollback(session: &mut Session) {
    session.tx = None;
}

/// `SAVEPOINT name`.
pub fn savepoint(session: &mut Session, name: String) -> Result<()> {
    let tx = in_block(session, "SAVEPOINT")?;
    let mark = tx.writes.mark();
    tx.savepoints.push((name, mark));
    Ok(())
}

/// `RELEASE [SAVEPOINT] name`: it and the savepoints after it go; the
/// changes stay.
pub fn release(session: &mut Session, name: &str) -> Result<()> {
    let tx = in_block(session, "RELEASE SAVEPOINT")?;
    let at = find(tx, name)?;
    tx.savepoints.truncate(at);
    Ok(())
}

/// `ROLLBACK TO [SAVEPOINT] name`: the changes after it go, the block is
/// usable again, and the savepoint stays.
pub fn rollback_to(db: &Database, session: &mut Session, name: &str) -> Result<()> {
    let tx = in_block(session, "ROLLBACK TO SAVEPOINT")?;
    let at = find(tx, name)?;
    let mark = tx.savepoints[at].1;
    tx.savepoints.truncate(at + 1);
    db.cluster
        .tables
        .rollback_pending(Arc::make_mut(&mut tx.writes), mark)?;
    tx.failed = false;
    Ok(())
}

fn in_block<'a>(session: &'a mut Session, what: &str) -> Result<&'a mut Transaction> {
    session.tx.as_mut().ok_or_else(|| {
        ServerError::NoActiveTransaction(format!("{what} can only be used in transaction blocks"))
    })
}

/// The latest savepoint called `name`.
fn find(tx: &Transaction, name: &str) -> Result<usize> {
    tx.savepoints
        .iter()
        .rposition(|(n, _)| n == name)
        .ok_or_else(|| {
            ServerError::InvalidSavepoint(format!("savepoint \"{name}\" does not exist"))
        })
}

/// One statement's changes: written now outside a block (every table's in
/// one durable write), kept in the block inside one. The statement can no
/// longer be stopped once they are written.
pub async fn write(
    db: &Database,
    tx: Option<&mut Transaction>,
    changes: Vec<(u64, Chunk)>,
) -> Result<()> {
    let changes: Vec<(u64, Chunk)> = changes.into_iter().filter(|(_, c)| !c.is_empty()).collect();
    if changes.is_empty() {
        return Ok(());
    }
    let tables = db.cluster.tables.clone();
    match tx {
        Some(tx) => {
            let writes = Arc::make_mut(&mut tx.writes);
            // A statement's changes are all kept or none.
            let mark = writes.mark();
            for (id, chunk) in changes {
                if let Err(e) = tables.stage_pending(writes, id, chunk) {
                    tables.rollback_pending(writes, mark)?;
                    return Err(e.into());
                }
            }
            Ok(())
        }
        None => {
            crate::engine::control::commit_point()?;
            tokio::task::spawn_blocking(move || {
                let refs: Vec<(u64, &Chunk)> = changes.iter().map(|(id, c)| (*id, c)).collect();
                tables.apply_many(&refs)
            })
            .await
            .map_err(|e| ServerError::Internal(e.to_string()))??;
            Ok(())
        }
    }
}

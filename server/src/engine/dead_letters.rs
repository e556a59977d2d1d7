//! Dead-letter tables: `ENCODE … (dead_letter_table = 'name')` on a source
//! or a connector table keeps each record the connector could not decode
//! in a Weir table, rather than only counting it.
//!
//! The table is an ordinary one (`SELECT`, `DELETE`, views over it),
//! created with the source if it does not exist, with the columns
//! [`executor::connectors::DEAD_LETTER_COLUMNS`] and the key `(source,
//! position)`. Every job that reads the source writes the records it skips
//! there when the checkpoint that covers them completes (see
//! `executor::operators::connector_source`), so the table holds each
//! skipped record once, however many views read the source and however
//! often a job restarts. The source depends on it: dropping the table
//! needs `CASCADE`.

use executor::connectors::{DEAD_LETTER_COLUMNS, DEAD_LETTER_KEY, decodes_records};
use executor::formats::DEAD_LETTER_TABLE;
use planner::spec::ConnectorSpec;

use crate::catalog::{Column, Entry};
use crate::engine::Database;
use crate::error::{Result, ServerError};
use crate::sql::stmt::QualifiedName;
use crate::sql::types;

/// The table a source's `dead_letter_table` names (in the source's
/// schema), checked, or created if there is none; its id is put in
/// `connector`. Returns the id of a table
/// it created, for the caller to drop if the statement fails after all.
pub(crate) fn resolve(
    db: &Database,
    source: &QualifiedName,
    connector: &mut ConnectorSpec,
) -> Result<Option<u64>> {
    let Some(name) = connector.encode_options.get(DEAD_LETTER_TABLE).cloned() else {
        return Ok(None);
    };
    let name = QualifiedName {
        schema: source.schema.clone(),
        name,
    };
    if &name == source {
        return Err(crate::catalog::already_exists(&name));
    }
    if !decodes_records(&connector.connector) {
        return Err(ServerError::InvalidParameter(format!(
            "connector {} decodes no records, so it takes no ENCODE option {DEAD_LETTER_TABLE} \
             (kafka and file do)",
            connector.connector
        )));
    }
    if let Some(entry) = db.catalog.by_name(&name) {
        check(&entry)?;
        connector.dead_letter_table = Some(entry.id());
        return Ok(None);
    }
    let entry = Entry::Table {
        id: db.catalog.allocate_id()?,
        name: name.name,
        schema: name.schema,
        columns: DEAD_LETTER_COLUMNS
            .iter()
            .map(|(name, sql_type)| Column {
                name: name.to_string(),
                sql_type: sql_type.to_string(),
                not_null: DEAD_LETTER_KEY.contains(name),
                default: None,
            })
            .collect(),
        primary_key: DEAD_LETTER_KEY.iter().map(|k| k.to_string()).collect(),
        stream: false,
        append_only: false,
        watermark: None,
        late_rows: None,
        ingest: None,
    };
    let id = db.add_table(entry)?;
    connector.dead_letter_table = Some(id);
    Ok(Some(id))
}

/// Drops a dead-letter table [`resolve`] created for a statement that
/// then failed.
pub(crate) fn undo(db: &Database, created: Option<u64>) -> Result<()> {
    if let Some(id) = created {
        db.catalog.remove(&[id])?;
        db.cluster.tables.drop_table(id)?;
    }
    Ok(())
}

/// Whether `entry` can keep dead letters: a plain table with exactly the
/// columns and key a new one would get.
fn check(entry: &Entry) -> Result<()> {
    let expected = || {
        let columns: Vec<String> = DEAD_LETTER_COLUMNS
            .iter()
            .map(|(n, t)| format!("{n} {t}"))
            .collect();
        format!(
            "({}, PRIMARY KEY ({}))",
            columns.join(", "),
            DEAD_LETTER_KEY.join(", ")
        )
    };
    let Entry::Table {
        name,
        columns,
        primary_key,
        stream: false,
        ingest: None,
        ..
    } = entry
    else {
        return Err(ServerError::WrongObjectType(format!(
            "\"{}\" is a {}; a dead-letter table is a table {}",
            entry.name(),
            entry.kind(),
            expected()
        )));
    };
    let same_columns = columns.len() == DEAD_LETTER_COLUMNS.len()
        && columns.iter().zip(DEAD_LETTER_COLUMNS).all(|(c, (n, t))| {
            c.name == n && types::parse_type(&c.sql_type).ok() == types::parse_type(t).ok()
        });
    if !same_columns || primary_key.as_slice() != DEAD_LETTER_KEY {
        return Err(ServerError::InvalidTableDefinition(format!(
            "table \"{name}\" cannot keep dead letters: a dead-letter table has the columns {}",
            expected()
        )));
    }
    Ok(())
}

/// `FLUSH`, after every job's checkpoint covers what its sources held:
/// waits until each job has applied the dead letters of that checkpoint to
/// their tables.
pub(crate) async fn flush(db: &Database) -> Result<()> {
    let jobs = &db.cluster.job_manager;
    let waits = jobs
        .dead_letter_writers()
        .into_iter()
        .filter_map(|(job, table, writers)| {
            let checkpoint = jobs.completed_checkpoints(job).ok()?.borrow().id;
            (checkpoint > 0)
                .then(|| crate::engine::ingest::wait_applied(db, table, job, writers, checkpoint))
        });
    for r in futures::future::join_all(waits).await {
        r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogs_columns_are_the_ones_the_sources_write() {
        let fields: Vec<_> = DEAD_LETTER_COLUMNS
            .iter()
            .map(|(n, t)| (n.to_string(), types::parse_type(t).unwrap()))
            .collect();
        let written: Vec<_> = executor::connectors::dead_letter_schema()
            .fields()
            .iter()
            .map(|f| (f.name().clone(), f.data_type().clone()))
            .collect();
        assert_eq!(fields, written);
    }
}

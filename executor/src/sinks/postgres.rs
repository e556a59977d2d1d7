//! `connector = 'postgres'` as a sink: the rows of a table in PostgreSQL,
//! written once per checkpoint, exactly once.
//!
//! A subtask holds the changes it gets until the barrier; the committable
//! is those changes (Arrow IPC) and the subtask's index. The commit
//! applies them in one PostgreSQL transaction, which also records, in
//! `weir_sink_progress` (created in the target's schema), the last
//! checkpoint each writer committed; a commit of a checkpoint already
//! recorded does nothing, so a commit repeated after a failure neither
//! duplicates nor rewinds anything. Checkpoint ids only grow, so the
//! record is a high-water mark.
//!
//! `type = 'upsert'` (the default) needs `primary_key`, which must be the
//! target table's primary key: per key only the last change of the
//! checkpoint counts — a delete becomes `DELETE … WHERE key`, an insert
//! `INSERT … ON CONFLICT (key) DO UPDATE`. `type = 'append-only'` inserts
//! every inserted row (the query must be append-only, or
//! `force_append_only` drops the rest). Values travel as text and are
//! cast to the target columns' types in SQL, so every type PostgreSQL can
//! read from its text form works.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Decimal128Type};
use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
use planner::functions::numeric_special::Special;
use planner::spec::ConnectorSpec;
use storage::chunk::Chunk;
use tokio_postgres::{Client, NoTls};

use super::{Held, SinkConnector, SinkContext, SinkWriter, plain_needs_append_only, upserts};
use crate::connectors::Options;
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &[
    "host",
    "port",
    "user",
    "password",
    "database",
    "schema",
    "table",
    "type (upsert | append-only)",
    "primary_key",
    "force_append_only",
];
const PROGRESS: &str = "weir_sink_progress";

/// Where and how a sink writes.
#[derive(Clone)]
struct Target {
    config: tokio_postgres::Config,
    schema: String,
    table: String,
    upsert: bool,
    /// The sink's columns.
    columns: Vec<String>,
    /// `primary_key`, by position among the sink's columns.
    key: Vec<usize>,
}

pub(super) struct PostgresSink {
    target: Arc<Target>,
}

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

impl Target {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        ExecError::Connector(format!(
            "postgres sink {}.{}: {what}: {e}",
            self.schema, self.table
        ))
    }

    fn qualified(&self, table: &str) -> String {
        format!("{}.{}", quote(&self.schema), quote(table))
    }

    async fn connect(&self) -> Result<Client> {
        let (client, conn) = self.config.connect(NoTls).await.map_err(|e| {
            ExecError::Connector(format!(
                "cannot connect to PostgreSQL at {:?}:{:?}: {e}",
                self.config.get_hosts(),
                self.config.get_ports()
            ))
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::warn!(error = %e, "postgres sink connection closed");
            }
        });
        Ok(client)
    }

    /// The target table's columns and their types, and its primary key.
    async fn describe(&self, client: &Client) -> Result<(HashMap<String, String>, Vec<String>)> {
        let rows = crate::postgres::table_columns(client, &self.schema, &self.table)
            .await
            .map_err(|e| self.failed("reading the table's columns", e))?;
        if rows.is_empty() {
            return Err(ExecError::InvalidOption(format!(
                "table {}.{} does not exist in PostgreSQL",
                self.schema, self.table
            )));
        }
        let key = rows
            .iter()
            .filter(|c| c.key)
            .map(|c| c.name.clone())
            .collect();
        let types = rows.into_iter().map(|c| (c.name, c.sql_type)).collect();
        Ok((types, key))
    }
}

impl PostgresSink {
    pub(super) fn new(spec: &ConnectorSpec, ctx: &SinkContext) -> Result<Self> {
        let mut o = Options::new("postgres", &spec.options);
        let mut config = tokio_postgres::Config::new();
        config.host(o.take("host").as_deref().unwrap_or("localhost"));
        config.port(o.parse::<u16>("port", "a port number")?.unwrap_or(5432));
        let required = |o: &mut Options, name: &str| {
            o.take(name).ok_or_else(|| {
                ExecError::InvalidOption(format!("sink connector postgres needs option {name}"))
            })
        };
        config.user(required(&mut o, "user")?);
        if let Some(p) = o.take("password") {
            config.password(p);
        }
        config.dbname(required(&mut o, "database")?);
        config.application_name("weir sink");
        config.connect_timeout(std::time::Duration::from_secs(10));
        let table = required(&mut o, "table")?;
        let schema = o.take("schema").unwrap_or_else(|| "public".into());
        let upsert = match o.take("type").as_deref().map(str::trim) {
            None | Some("upsert") => true,
            Some("append-only") => false,
            Some(other) => return Err(o.invalid("type", other, "upsert or append-only")),
        };
        let force = o.flag("force_append_only")?.unwrap_or(false);
        o.finish(OPTIONS)?;
        if let Some(f) = &spec.format {
            return Err(ExecError::InvalidOption(format!(
                "sink connector postgres takes no FORMAT (FORMAT {f}); say type = 'upsert' or 'append-only'"
            )));
        }
        if upsert && ctx.key.is_empty() {
            return Err(ExecError::InvalidOption(
                "sink connector postgres with type = 'upsert' needs primary_key = 'column[,column…]'"
                    .into(),
            ));
        }
        if !upsert {
            plain_needs_append_only(spec, ctx, force)?;
        }
        Ok(Self {
            target: Arc::new(Target {
                config,
                schema,
                table,
                upsert,
                columns: ctx
                    .schema
                    .fields()
                    .iter()
                    .map(|f| f.name().clone())
                    .collect(),
                key: ctx.key.clone(),
            }),
        })
    }
}

#[async_trait]
impl SinkConnector for PostgresSink {
    /// The table is there, has every column of the sink, and (upsert) its
    /// primary key is the sink's; the progress table is created.
    async fn check(&self) -> Result<()> {
        let t = &self.target;
        let client = t.connect().await?;
        let (types, key) = t.describe(&client).await?;
        if let Some(c) = t.columns.iter().find(|c| !types.contains_key(*c)) {
            return Err(ExecError::InvalidOption(format!(
                "table {}.{} in PostgreSQL has no column \"{c}\"",
                t.schema, t.table
            )));
        }
        if t.upsert {
            let mut want: Vec<&String> = t.key.iter().map(|i| &t.columns[*i]).collect();
            let mut have: Vec<&String> = key.iter().collect();
            want.sort();
            have.sort();
            if want != have {
                return Err(ExecError::InvalidOption(format!(
                    "primary_key ({}) is not the primary key of {}.{} in PostgreSQL ({})",
                    want.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                    t.schema,
                    t.table,
                    have.iter()
                        .map(|s| s.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                )));
            }
        }
        client
            .batch_execute(&format!(
                "CREATE TABLE IF NOT EXISTS {} (sink_id bigint, writer int, checkpoint bigint NOT NULL, \
                 PRIMARY KEY (sink_id, writer))",
                t.qualified(PROGRESS)
            ))
            .await
            .map_err(|e| t.failed("creating weir_sink_progress", e))
    }

    fn writer(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter>> {
        Ok(Box::new(PostgresWriter {
            target: self.target.clone(),
            sink_id: ctx.sink_id as i64,
            held: Held::new(ctx),
            client: None,
            statements: None,
        }))
    }
}

/// The SQL a writer runs, built from the target's column types.
struct Statements {
    /// `$1 … $n`: text arrays of every column.
    insert: String,
    /// `$1 … $k`: text arrays of the key columns.
    delete: String,
}

struct PostgresWriter {
    target: Arc<Target>,
    sink_id: i64,
    /// Changes since the last barrier.
    held: Held,
    client: Option<Client>,
    statements: Option<Statements>,
}

impl PostgresWriter {
    async fn client(&mut self) -> Result<&mut Client> {
        if self.client.is_none() {
            let t = &self.target;
            let client = t.connect().await?;
            let (types, _) = t.describe(&client).await?;
            let cast = |c: &String| -> Result<String> {
                let ty = types
                    .get(c)
                    .ok_or_else(|| t.failed("the sink's columns", format!("no column \"{c}\"")))?;
                Ok(format!("u.{}::{ty}", quote(c)))
            };
            let all: Vec<String> = t.columns.iter().map(|c| quote(c)).collect();
            let params = |n: usize| {
                (1..=n)
                    .map(|i| format!("${i}::text[]"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            let casts = t.columns.iter().map(cast).collect::<Result<Vec<_>>>()?;
            let mut insert = format!(
                "INSERT INTO {} ({}) SELECT {} FROM unnest({}) AS u({})",
                t.qualified(&t.table),
                all.join(", "),
                casts.join(", "),
                params(all.len()),
                all.join(", ")
            );
            let keys: Vec<&String> = t.key.iter().map(|i| &t.columns[*i]).collect();
            if t.upsert {
                let updates: Vec<String> = t
                    .columns
                    .iter()
                    .filter(|c| !keys.contains(c))
                    .map(|c| format!("{0} = EXCLUDED.{0}", quote(c)))
                    .collect();
                let conflict = keys.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", ");
                insert.push_str(&if updates.is_empty() {
                    format!(" ON CONFLICT ({conflict}) DO NOTHING")
                } else {
                    format!(
                        " ON CONFLICT ({conflict}) DO UPDATE SET {}",
                        updates.join(", ")
                    )
                });
            }
            let matches = keys
                .iter()
                .map(|k| Ok(format!("t.{} = {}", quote(k), cast(k)?)))
                .collect::<Result<Vec<_>>>()?;
            let delete = format!(
                "DELETE FROM {} AS t USING unnest({}) AS u({}) WHERE {}",
                t.qualified(&t.table),
                params(keys.len()),
                keys.iter().map(|k| quote(k)).collect::<Vec<_>>().join(", "),
                matches.join(" AND ")
            );
            self.statements = Some(Statements { insert, delete });
            self.client = Some(client);
        }
        Ok(self.client.as_mut().expect("just connected"))
    }
}

/// The values of `columns` of `batch`'s rows `rows`, as text arrays.
fn text_columns(
    batch: &RecordBatch,
    columns: &[usize],
    rows: &[usize],
) -> Result<Vec<Vec<Option<String>>>> {
    let options = FormatOptions::default();
    columns
        .iter()
        .map(|c| {
            let array = batch.column(*c);
            let f = ArrayFormatter::try_new(array.as_ref(), &options)?;
            // A numeric NaN or ±Infinity as Postgres's text for it.
            let decimals = match array.data_type() {
                DataType::Decimal128(..) => Some(array.as_primitive::<Decimal128Type>()),
                _ => None,
            };
            Ok(rows
                .iter()
                .map(|r| {
                    (!array.is_null(*r)).then(|| {
                        match decimals.and_then(|d| Special::of(d.value(*r))) {
                            Some(s) => s.text().to_string(),
                            None => f.value(*r).to_string(),
                        }
                    })
                })
                .collect())
        })
        .collect()
}

#[async_trait]
impl SinkWriter for PostgresWriter {
    async fn write(&mut self, chunk: &Chunk) -> Result<()> {
        self.held.push(chunk);
        Ok(())
    }

    async fn prepare(&mut self, _checkpoint: u64) -> Result<Option<Vec<u8>>> {
        self.held.prepare()
    }

    async fn commit(&mut self, checkpoint: u64, committable: &[u8]) -> Result<()> {
        let (writer, chunk) = Held::decode("postgres", committable)?;
        let writer = writer as i32;
        let target = self.target.clone();
        let sink_id = self.sink_id;
        self.client().await?;
        let statements = self.statements.as_ref().expect("built with the client");
        let (insert, delete) = (statements.insert.clone(), statements.delete.clone());
        let client = self.client.as_mut().expect("connected");
        let tx = client
            .transaction()
            .await
            .map_err(|e| target.failed("beginning a transaction", e))?;
        let progress = target.qualified(PROGRESS);
        let done: Option<i64> = tx
            .query_opt(
                &format!(
                    "SELECT checkpoint FROM {progress} WHERE sink_id = $1 AND writer = $2 FOR UPDATE"
                ),
                &[&sink_id, &writer],
            )
            .await
            .map_err(|e| target.failed("reading weir_sink_progress", e))?
            .map(|r| r.get(0));
        if done.is_some_and(|d| d >= checkpoint as i64) {
            return Ok(());
        }
        // Per key, the net change of the checkpoint.
        let batch = chunk.data();
        let all: Vec<usize> = (0..batch.num_columns()).collect();
        let (inserts, deletes): (Vec<usize>, Vec<usize>) = if target.upsert {
            let (now, gone): (Vec<_>, Vec<_>) = upserts(&chunk, &target.key)?
                .into_iter()
                .partition(|(_, p)| *p);
            (
                now.into_iter().map(|(i, _)| i).collect(),
                gone.into_iter().map(|(i, _)| i).collect(),
            )
        } else {
            (
                chunk
                    .signs()
                    .enumerate()
                    .filter(|(_, s)| *s > 0)
                    .map(|(i, _)| i)
                    .collect(),
                Vec::new(),
            )
        };
        let run = |sql: String, columns: Vec<Vec<Option<String>>>| {
            let tx = &tx;
            let target = &target;
            async move {
                let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = columns
                    .iter()
                    .map(|c| c as &(dyn tokio_postgres::types::ToSql + Sync))
                    .collect();
                tx.execute(&sql, &params)
                    .await
                    .map_err(|e| target.failed("writing", e))
            }
        };
        if !deletes.is_empty() {
            run(delete, text_columns(batch, &target.key, &deletes)?).await?;
        }
        if !inserts.is_empty() {
            run(insert, text_columns(batch, &all, &inserts)?).await?;
        }
        tx.execute(
            &format!(
                "INSERT INTO {progress} (sink_id, writer, checkpoint) VALUES ($1, $2, $3) \
                 ON CONFLICT (sink_id, writer) DO UPDATE SET checkpoint = EXCLUDED.checkpoint"
            ),
            &[&sink_id, &writer, &(checkpoint as i64)],
        )
        .await
        .map_err(|e| target.failed("writing weir_sink_progress", e))?;
        tx.commit()
            .await
            .map_err(|e| target.failed("committing", e))
    }
}

//! `connector = 'postgres-cdc'`: a PostgreSQL table's rows, then its
//! changes, through logical replication (`pgoutput`). For `CREATE TABLE …
//! WITH (connector = 'postgres-cdc')`, whose rows are upserts by key, as
//! in RisingWave.
//!
//! The source has one split. Its first reader creates the publication (if
//! asked) and the replication slot, whose creation LSN is where the change
//! stream will start, then reads the table in pages in primary-key order.
//! Each page is a batch whose position names the last key read, so a
//! restart mid-snapshot goes on after it. The pages are read after the
//! slot was created, so every change made after any page was read is
//! still in the slot: replaying them from the slot's start over the
//! snapshot, by key, ends at the table's current rows (a row may show an
//! older value while the stream catches up).
//!
//! The stream is read with `pgwire-replication`. A transaction's changes
//! become one batch at its commit, whose position is the commit's end
//! LSN, so a checkpoint never splits a transaction. The slot is told a
//! position is applied only when a checkpoint holding it has completed
//! ([`SourceConnector::committed`]), so PostgreSQL keeps what a restart
//! needs. To know it has caught up (for `FLUSH`), an idle reader writes a
//! non-transactional logical message into the WAL and waits for it to come
//! back through the slot: every transaction committed before it is then in.
//! `DROP TABLE` drops the slot, and the publication if Weir created it.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::{ArrayRef, BinaryArray, RecordBatch, StringArray};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, SchemaRef};
use pgwire_replication::{Lsn, ReplicationClient, ReplicationConfig, ReplicationEvent};
use planner::spec::ConnectorSpec;
use serde::{Deserialize, Serialize};
use storage::chunk::Op;
use tokio_postgres::{Client, NoTls};

use super::pgoutput::{self, Cell, Message};
use super::{Options, Pace, ReadBatch, SourceConnector, SplitReader};
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &[
    "hostname",
    "port",
    "username",
    "password",
    "database.name",
    "schema.name",
    "table.name",
    "slot.name",
    "publication.name",
    "publication.create.enable",
];
/// Rows per snapshot page.
const PAGE: i64 = 4096;
/// The prefix of the logical messages that mark how far the stream is.
const MARKER: &str = "weir_cdc";
/// How long the stream must be idle before a marker is written.
const IDLE: Duration = Duration::from_millis(250);

fn quote(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

/// Where the split's next read starts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Position {
    /// Reading the table: the slot's start, and the key of the last row
    /// read (text values; `None` before the first page).
    Snapshot {
        start: u64,
        after: Option<Vec<String>>,
    },
    /// Reading the slot from this LSN.
    Stream { lsn: u64 },
}

impl Position {
    fn decode(bytes: &[u8]) -> Result<Self> {
        serde_json::from_slice(bytes)
            .map_err(|e| ExecError::Protocol(format!("postgres-cdc position: {e}")))
    }

    fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

/// What the connector reads, and from where.
struct Target {
    config: tokio_postgres::Config,
    host: String,
    port: u16,
    user: String,
    password: String,
    database: String,
    schema_name: String,
    table: String,
    slot: String,
    publication: String,
    create_publication: bool,
    /// The declared columns.
    schema: SchemaRef,
}

pub(crate) struct PostgresCdc {
    target: Arc<Target>,
    /// The newest LSN a completed checkpoint holds.
    confirmed: Arc<AtomicU64>,
}

/// Names a slot when the DDL does not: fixed at `CREATE`, so every restart
/// reads the same one.
pub(crate) fn complete(spec: &mut ConnectorSpec) {
    if !spec.options.contains_key("slot.name") {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        spec.options
            .insert("slot.name".into(), format!("weir_{nanos}"));
    }
}

impl PostgresCdc {
    pub(crate) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("postgres-cdc", &spec.options);
        let need = |o: &mut Options, name: &str| {
            o.take(name).ok_or_else(|| {
                ExecError::InvalidOption(format!("connector postgres-cdc needs option {name}"))
            })
        };
        let host = need(&mut o, "hostname")?;
        let port = o.parse("port", "a port number")?.unwrap_or(5432u16);
        let user = need(&mut o, "username")?;
        let password = o.take("password").unwrap_or_default();
        let database = need(&mut o, "database.name")?;
        let schema_name = o.take("schema.name").unwrap_or_else(|| "public".into());
        let table = need(&mut o, "table.name")?;
        let slot = need(&mut o, "slot.name")?;
        if slot.is_empty()
            || slot.len() > 63
            || !slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(o.invalid(
                "slot.name",
                &slot,
                "at most 63 lower-case letters, digits and underscores",
            ));
        }
        let publication = o.take("publication.name").unwrap_or_else(|| slot.clone());
        let create_publication = o.flag("publication.create.enable")?.unwrap_or(true);
        o.finish(OPTIONS)?;
        if spec.format.is_some() {
            return Err(ExecError::InvalidOption(
                "connector postgres-cdc takes no FORMAT: it reads the table's rows and changes"
                    .into(),
            ));
        }
        let mut config = tokio_postgres::Config::new();
        config
            .host(&host)
            .port(port)
            .user(&user)
            .password(&password)
            .dbname(&database)
            .connect_timeout(Duration::from_secs(10));
        Ok(Self {
            target: Arc::new(Target {
                config,
                host,
                port,
                user,
                password,
                database,
                schema_name,
                table,
                slot,
                publication,
                create_publication,
                schema: schema.clone(),
            }),
            confirmed: Arc::new(AtomicU64::new(0)),
        })
    }
}

impl Target {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        ExecError::Connector(format!(
            "postgres-cdc {}.{}: {what}: {e}",
            self.schema_name, self.table
        ))
    }

    /// Ends the session that reads the slot, if any (an earlier reader's,
    /// left by a crash), so that the slot can be dropped.
    async fn stop_slot_reader(&self, client: &Client) -> Result<()> {
        client
            .execute(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
                &[&self.slot],
            )
            .await
            .map_err(|e| self.failed("stopping the slot's reader", e))?;
        Ok(())
    }

    fn qualified(&self) -> String {
        format!("{}.{}", quote(&self.schema_name), quote(&self.table))
    }

    async fn connect(&self) -> Result<Client> {
        let (client, conn) = self.config.connect(NoTls).await.map_err(|e| {
            ExecError::Connector(format!(
                "cannot connect to PostgreSQL at {}:{}: {e}",
                self.host, self.port
            ))
        })?;
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "postgres-cdc connection closed");
            }
        });
        Ok(client)
    }

    /// Checks that PostgreSQL can stream the table: `wal_level`, the
    /// declared columns, a primary key. Returns the key's columns and their
    /// types.
    async fn describe(&self, client: &Client) -> Result<Vec<(String, String)>> {
        let level: String = client
            .query_one("SHOW wal_level", &[])
            .await
            .map_err(|e| self.failed("reading wal_level", e))?
            .get(0);
        if level != "logical" {
            return Err(ExecError::InvalidOption(format!(
                "PostgreSQL at {}:{} has wal_level = {level}; postgres-cdc needs wal_level = logical",
                self.host, self.port
            )));
        }
        let rows = crate::postgres::table_columns(client, &self.schema_name, &self.table)
            .await
            .map_err(|e| self.failed("reading the table's columns", e))?;
        if rows.is_empty() {
            return Err(ExecError::InvalidOption(format!(
                "table {}.{} does not exist in PostgreSQL database {}",
                self.schema_name, self.table, self.database
            )));
        }
        let columns: HashSet<&str> = rows.iter().map(|c| c.name.as_str()).collect();
        for f in self.schema.fields() {
            if !columns.contains(f.name().as_str()) {
                let mut names: Vec<&str> = rows.iter().map(|c| c.name.as_str()).collect();
                names.sort();
                return Err(ExecError::InvalidOption(format!(
                    "PostgreSQL table {}.{} has no column \"{}\"; it has: {}",
                    self.schema_name,
                    self.table,
                    f.name(),
                    names.join(", ")
                )));
            }
        }
        let key: Vec<(String, String)> = rows
            .iter()
            .filter(|c| c.key)
            .map(|c| (c.name.clone(), c.sql_type.clone()))
            .collect();
        if key.is_empty() {
            return Err(ExecError::InvalidOption(format!(
                "PostgreSQL table {}.{} has no primary key; postgres-cdc reads tables by key",
                self.schema_name, self.table
            )));
        }
        Ok(key)
    }

    /// The declared columns' text values as a batch; rows that do not
    /// convert are dropped and logged.
    fn batch(&self, rows: &[Vec<Option<String>>]) -> Result<RecordBatch> {
        let convert = |rows: &[Vec<Option<String>>]| -> Result<RecordBatch> {
            let columns = self
                .schema
                .fields()
                .iter()
                .enumerate()
                .map(|(i, f)| column(rows.iter().map(|r| r[i].as_deref()), f.data_type()))
                .collect::<Result<Vec<_>>>()?;
            Ok(RecordBatch::try_new_with_options(
                self.schema.clone(),
                columns,
                &datafusion::arrow::array::RecordBatchOptions::new()
                    .with_row_count(Some(rows.len())),
            )?)
        };
        match convert(rows) {
            Ok(b) => Ok(b),
            Err(_) => {
                let mut good = Vec::with_capacity(rows.len());
                for r in rows {
                    match convert(std::slice::from_ref(r)) {
                        Ok(_) => good.push(r.clone()),
                        Err(e) => tracing::warn!(
                            table = %self.table, error = %e, row = ?r,
                            "postgres-cdc row skipped: a value does not convert to its column's type"
                        ),
                    }
                }
                convert(&good)
            }
        }
    }
}

/// PostgreSQL text values as an Arrow column of `data_type`.
fn column<'a>(
    values: impl Iterator<Item = Option<&'a str>>,
    data_type: &DataType,
) -> Result<ArrayRef> {
    match data_type {
        DataType::Binary => {
            let bytes = values
                .map(|v| {
                    v.map(|t| {
                        let hex = t.strip_prefix("\\x").unwrap_or(t);
                        (0..hex.len() / 2)
                            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
                            .collect::<std::result::Result<Vec<u8>, _>>()
                            .map_err(|e| ExecError::Connector(format!("bytea value: {e}")))
                    })
                    .transpose()
                })
                .collect::<Result<Vec<_>>>()?;
            Ok(std::sync::Arc::new(BinaryArray::from_iter(bytes)))
        }
        DataType::Timestamp(_, Some(_)) => {
            // PostgreSQL writes the offset as `+00`; Arrow reads `+00:00`.
            let text: StringArray = values
                .map(|v| {
                    v.map(|t| {
                        let b = t.as_bytes();
                        let n = b.len();
                        if n > 3
                            && (b[n - 3] == b'+' || b[n - 3] == b'-')
                            && b[n - 2..].iter().all(u8::is_ascii_digit)
                        {
                            format!("{t}:00")
                        } else {
                            t.to_string()
                        }
                    })
                })
                .collect();
            cast_text(&text, data_type)
        }
        _ => {
            let text: StringArray = values.collect();
            cast_text(&text, data_type)
        }
    }
}

fn cast_text(text: &StringArray, data_type: &DataType) -> Result<ArrayRef> {
    Ok(cast_with_options(
        text,
        data_type,
        &CastOptions {
            safe: false,
            ..Default::default()
        },
    )?)
}

#[async_trait]
impl SourceConnector for PostgresCdc {
    async fn splits(&self) -> Result<usize> {
        let client = self.target.connect().await?;
        self.target.describe(&client).await?;
        Ok(1)
    }

    fn reader(
        &self,
        _split: usize,
        position: Option<&[u8]>,
        _pace: Pace,
    ) -> Result<Box<dyn SplitReader>> {
        let position = position.map(Position::decode).transpose()?;
        if let Some(Position::Stream { lsn }) = &position {
            // The position a job restores is in a completed checkpoint.
            self.confirmed.fetch_max(*lsn, Ordering::AcqRel);
        }
        Ok(Box::new(CdcReader {
            target: self.target.clone(),
            confirmed: self.confirmed.clone(),
            position,
            client: None,
            key: Vec::new(),
            stream: None,
        }))
    }

    fn bounded(&self) -> bool {
        false
    }

    fn changelog(&self) -> bool {
        true
    }

    fn committed(&self, _split: usize, position: &[u8]) {
        if let Ok(Position::Stream { lsn }) = Position::decode(position) {
            self.confirmed.fetch_max(lsn, Ordering::AcqRel);
        }
    }

    async fn dropped(&self) -> Result<()> {
        let t = &self.target;
        let client = t.connect().await?;
        t.stop_slot_reader(&client).await?;
        // The walsender may take a moment to let go of the slot.
        for attempt in 0.. {
            match client
                .execute(
                    "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                     WHERE slot_name = $1",
                    &[&t.slot],
                )
                .await
            {
                Ok(_) => break,
                Err(_) if attempt < 20 => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(t.failed("dropping the replication slot", e)),
            }
        }
        if t.publication == t.slot {
            client
                .batch_execute(&format!(
                    "DROP PUBLICATION IF EXISTS {}",
                    quote(&t.publication)
                ))
                .await
                .map_err(|e| t.failed("dropping the publication", e))?;
        }
        Ok(())
    }
}

/// The change stream, once started.
struct Stream {
    replication: ReplicationClient,
    /// The relation id of the table in this session, and where each
    /// declared column is among its columns.
    relation: Option<(u32, Vec<usize>)>,
    /// The LSN last told to PostgreSQL as applied.
    acked: u64,
    /// Inside a transaction: its changes so far.
    open: Option<Vec<(Op, Vec<Option<String>>)>>,
    /// The marker written and not yet seen, and when it was written.
    marker: Option<(String, Instant)>,
    markers: u64,
    /// When the stream last delivered anything.
    last_event: Instant,
}

struct CdcReader {
    target: Arc<Target>,
    confirmed: Arc<AtomicU64>,
    position: Option<Position>,
    /// An ordinary connection: snapshot pages, markers.
    client: Option<Client>,
    /// The key columns and their types.
    key: Vec<(String, String)>,
    stream: Option<Stream>,
}

impl CdcReader {
    async fn client(&mut self) -> Result<&Client> {
        if self.client.is_none() {
            let client = self.target.connect().await?;
            self.key = self.target.describe(&client).await?;
            self.client = Some(client);
        }
        self.client
            .as_ref()
            .ok_or_else(|| ExecError::Protocol("postgres-cdc client".into()))
    }

    /// A fresh start: the publication, then a new slot (dropping one an
    /// earlier attempt left, which no checkpoint refers to).
    async fn begin(&mut self) -> Result<Position> {
        let t = self.target.clone();
        let client = self.client().await?;
        let exists = client
            .query_opt(
                "SELECT 1 FROM pg_publication WHERE pubname = $1",
                &[&t.publication],
            )
            .await
            .map_err(|e| t.failed("reading publications", e))?
            .is_some();
        if !exists {
            if !t.create_publication {
                return Err(ExecError::InvalidOption(format!(
                    "publication {} does not exist in PostgreSQL (publication.create.enable is false)",
                    t.publication
                )));
            }
            client
                .batch_execute(&format!(
                    "CREATE PUBLICATION {} FOR TABLE {}",
                    quote(&t.publication),
                    t.qualified()
                ))
                .await
                .map_err(|e| t.failed("creating the publication", e))?;
        } else if client
            .query_opt(
                "SELECT 1 FROM pg_publication_tables WHERE pubname = $1 \
                 AND schemaname = $2 AND tablename = $3",
                &[&t.publication, &t.schema_name, &t.table],
            )
            .await
            .map_err(|e| t.failed("reading the publication", e))?
            .is_none()
        {
            return Err(ExecError::InvalidOption(format!(
                "publication {} does not publish table {}.{}",
                t.publication, t.schema_name, t.table
            )));
        }
        t.stop_slot_reader(client).await?;
        let mut start = None;
        for attempt in 0.. {
            let made = async {
                client
                    .execute(
                        "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots \
                         WHERE slot_name = $1",
                        &[&t.slot],
                    )
                    .await?;
                client
                    .query_one(
                        "SELECT lsn::text FROM pg_create_logical_replication_slot($1, 'pgoutput')",
                        &[&t.slot],
                    )
                    .await
            }
            .await;
            match made {
                Ok(row) => {
                    start = Some(row.get::<_, String>(0));
                    break;
                }
                Err(_) if attempt < 20 => tokio::time::sleep(Duration::from_millis(100)).await,
                Err(e) => return Err(t.failed("creating the replication slot", e)),
            }
        }
        let start = Lsn::parse(start.as_deref().unwrap_or_default())
            .map_err(|e| t.failed("the slot's LSN", format!("{e:?}")))?;
        tracing::info!(slot = %t.slot, lsn = %start, "postgres-cdc slot created; reading the table");
        Ok(Position::Snapshot {
            start: start.as_u64(),
            after: None,
        })
    }

    /// The next page of the table, in key order.
    async fn page(&mut self, start: u64, after: Option<Vec<String>>) -> Result<ReadBatch> {
        let as_of = Instant::now();
        self.client().await?;
        let t = self.target.clone();
        let key = self.key.clone();
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| ExecError::Protocol("postgres-cdc client".into()))?;
        let mut select: Vec<String> = t
            .schema
            .fields()
            .iter()
            .map(|f| format!("t.{}::text", quote(f.name())))
            .collect();
        select.extend(key.iter().map(|(k, _)| format!("t.{}::text", quote(k))));
        // Output columns named c0, c1, …: an output column named like a key
        // column would make `ORDER BY` sort by its text.
        let select: Vec<String> = select
            .into_iter()
            .enumerate()
            .map(|(i, s)| format!("{s} AS c{i}"))
            .collect();
        let key_list = key
            .iter()
            .map(|(k, _)| format!("t.{}", quote(k)))
            .collect::<Vec<_>>()
            .join(", ");
        let mut sql = format!("SELECT {} FROM {} AS t", select.join(", "), t.qualified());
        let after = after.unwrap_or_default();
        if !after.is_empty() {
            let params: Vec<String> = key
                .iter()
                .enumerate()
                .map(|(i, (_, ty))| format!("${}::text::{ty}", i + 1))
                .collect();
            sql.push_str(&format!(" WHERE ({key_list}) > ({})", params.join(", ")));
        }
        sql.push_str(&format!(" ORDER BY {key_list} LIMIT {PAGE}"));
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = after
            .iter()
            .map(|v| v as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect();
        let rows = client
            .query(&sql, &params)
            .await
            .map_err(|e| t.failed("reading the table", e))?;
        let n = t.schema.fields().len();
        let values: Vec<Vec<Option<String>>> = rows
            .iter()
            .map(|r| (0..n).map(|i| r.get::<_, Option<String>>(i)).collect())
            .collect();
        let position = match rows.last() {
            Some(last) if rows.len() as i64 == PAGE => Position::Snapshot {
                start,
                after: Some(
                    (n..n + key.len())
                        .map(|i| last.get::<_, Option<String>>(i).unwrap_or_default())
                        .collect(),
                ),
            },
            _ => {
                tracing::info!(table = %t.table, "postgres-cdc snapshot read; streaming changes");
                Position::Stream { lsn: start }
            }
        };
        self.position = Some(position.clone());
        Ok(ReadBatch {
            data: t.batch(&values)?,
            ops: None,
            position: position.encode(),
            caught_up: false,
            as_of,
            rejected: Vec::new(),
        })
    }

    async fn start_stream(&mut self, lsn: u64) -> Result<()> {
        let t = &self.target;
        let config = ReplicationConfig::new(
            t.host.clone(),
            t.user.clone(),
            t.password.clone(),
            t.database.clone(),
            t.slot.clone(),
            t.publication.clone(),
        )
        .with_port(t.port)
        .with_start_lsn(Lsn::from_u64(lsn));
        let replication = ReplicationClient::connect(config)
            .await
            .map_err(|e| t.failed("starting replication", e))?;
        self.stream = Some(Stream {
            replication,
            relation: None,
            acked: 0,
            open: None,
            marker: None,
            markers: 0,
            last_event: Instant::now(),
        });
        Ok(())
    }

    /// Rows of the table from a change's cells (by relation column), or
    /// `None` when a cell is missing.
    fn row(
        &self,
        mapping: &[usize],
        cells: &[Cell],
        old: Option<&[Cell]>,
    ) -> Option<Vec<Option<String>>> {
        mapping
            .iter()
            .map(|i| match cells.get(*i)? {
                Cell::Null => Some(None),
                Cell::Text(v) => Some(Some(v.clone())),
                Cell::Unchanged => match old.and_then(|o| o.get(*i)) {
                    Some(Cell::Text(v)) => Some(Some(v.clone())),
                    Some(Cell::Null) => Some(None),
                    _ => None,
                },
            })
            .collect()
    }

    /// The next transaction's changes, or an empty batch that says the
    /// stream has caught up.
    async fn stream_next(&mut self, lsn: u64) -> Result<ReadBatch> {
        if self.stream.is_none() {
            self.start_stream(lsn).await?;
        }
        loop {
            let confirmed = self.confirmed.load(Ordering::Acquire);
            let stream = self
                .stream
                .as_mut()
                .ok_or_else(|| ExecError::Protocol("postgres-cdc stream".into()))?;
            if confirmed > stream.acked {
                stream
                    .replication
                    .update_applied_lsn(Lsn::from_u64(confirmed));
                stream.acked = confirmed;
            }
            let idle_for = stream.last_event.elapsed();
            let received = tokio::select! {
                e = stream.replication.recv() => Some(e),
                _ = tokio::time::sleep(IDLE.saturating_sub(idle_for)) => None,
            };
            let Some(received) = received else {
                self.mark().await?;
                continue;
            };
            let event = received.map_err(|e| self.target.failed("replication", e))?;
            let stream = self
                .stream
                .as_mut()
                .ok_or_else(|| ExecError::Protocol("postgres-cdc stream".into()))?;
            stream.last_event = Instant::now();
            let Some(event) = event else {
                return Err(self.target.failed("replication", "the stream ended"));
            };
            match event {
                ReplicationEvent::Begin { .. } => stream.open = Some(Vec::new()),
                ReplicationEvent::Commit { end_lsn, .. } => {
                    let changes = stream.open.take().unwrap_or_default();
                    let position = Position::Stream {
                        lsn: end_lsn.as_u64(),
                    };
                    self.position = Some(position.clone());
                    if changes.is_empty() {
                        continue;
                    }
                    let (ops, rows): (Vec<Op>, Vec<Vec<Option<String>>>) =
                        changes.into_iter().unzip();
                    return Ok(ReadBatch {
                        data: self.target.batch(&rows)?,
                        ops: Some(ops),
                        position: position.encode(),
                        caught_up: false,
                        as_of: Instant::now(),
                        rejected: Vec::new(),
                    });
                }
                ReplicationEvent::Message {
                    prefix, content, ..
                } if prefix == MARKER => {
                    let seen = String::from_utf8_lossy(&content).to_string();
                    if let Some((_, as_of)) = stream.marker.take_if(|(t, _)| *t == seen)
                        && stream.open.is_none()
                    {
                        let position = self.position.clone().unwrap_or(Position::Stream { lsn });
                        return Ok(ReadBatch {
                            data: RecordBatch::new_empty(self.target.schema.clone()),
                            ops: None,
                            position: position.encode(),
                            caught_up: true,
                            as_of,
                            rejected: Vec::new(),
                        });
                    }
                }
                ReplicationEvent::XLogData { data, .. } => {
                    let message = pgoutput::decode(&data)
                        .map_err(|e| self.target.failed("decoding pgoutput", e))?;
                    self.apply(message);
                }
                ReplicationEvent::StoppedAt { .. } => {
                    return Err(self.target.failed("replication", "the stream stopped"));
                }
                _ => {}
            }
        }
    }

    /// Takes one decoded change into the open transaction.
    fn apply(&mut self, message: Message) {
        let t = self.target.clone();
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        if let Message::Relation(r) = &message {
            if r.namespace == t.schema_name && r.name == t.table {
                let mapping = t
                    .schema
                    .fields()
                    .iter()
                    .map(|f| r.columns.iter().position(|c| c == f.name()))
                    .collect::<Option<Vec<usize>>>();
                match mapping {
                    Some(m) => stream.relation = Some((r.id, m)),
                    None => tracing::error!(
                        table = %t.table,
                        "postgres-cdc: the table lost a column Weir reads; its changes are skipped"
                    ),
                }
            }
            return;
        }
        let Some((id, mapping)) = stream.relation.clone() else {
            return;
        };
        let mut changes = Vec::new();
        let mut missing = false;
        match message {
            Message::Insert { relation, new } if relation == id => {
                match self.row(&mapping, &new, None) {
                    Some(r) => changes.push((Op::Insert, r)),
                    None => missing = true,
                }
            }
            Message::Update { relation, old, new } if relation == id => {
                // A changed key comes with the old key: its row goes.
                if let Some(old_row) = old.as_deref().and_then(|o| self.row(&mapping, o, None)) {
                    changes.push((Op::UpdateDelete, old_row));
                }
                match self.row(&mapping, &new, old.as_deref()) {
                    Some(r) => changes.push((Op::UpdateInsert, r)),
                    None => missing = true,
                }
            }
            Message::Delete { relation, old } if relation == id => {
                match self.row(&mapping, &old, None) {
                    Some(r) => changes.push((Op::Delete, r)),
                    None => missing = true,
                }
            }
            Message::Truncate { relations } if relations.contains(&id) => tracing::error!(
                table = %t.table,
                "postgres-cdc: TRUNCATE is not applied; the table keeps its rows"
            ),
            _ => {}
        }
        if missing {
            tracing::warn!(
                table = %t.table,
                "postgres-cdc change skipped: it leaves out an unchanged TOASTed value \
                 (ALTER TABLE … REPLICA IDENTITY FULL sends it)"
            );
        }
        if let Some(stream) = self.stream.as_mut() {
            stream.open.get_or_insert_with(Vec::new).extend(changes);
        }
    }

    /// Writes a marker into the WAL, unless one is on its way.
    async fn mark(&mut self) -> Result<()> {
        let Some(stream) = self.stream.as_mut() else {
            return Ok(());
        };
        stream.last_event = Instant::now();
        if stream.open.is_some()
            || stream
                .marker
                .as_ref()
                .is_some_and(|(_, at)| at.elapsed() < Duration::from_secs(5))
        {
            return Ok(());
        }
        stream.markers += 1;
        let token = format!("{}", stream.markers);
        let as_of = Instant::now();
        stream.marker = Some((token.clone(), as_of));
        let t = self.target.clone();
        let client = self.client().await?;
        if let Err(e) = client
            .execute(
                "SELECT pg_logical_emit_message(false, $1::text, $2::text)",
                &[&MARKER, &token],
            )
            .await
        {
            tracing::warn!(table = %t.table, error = %e, "postgres-cdc cannot write its progress marker; FLUSH will wait");
        }
        Ok(())
    }
}

#[async_trait]
impl SplitReader for CdcReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        loop {
            match self.position.clone() {
                None => self.position = Some(self.begin().await?),
                Some(Position::Snapshot { start, after }) => {
                    return self.page(start, after).await.map(Some);
                }
                Some(Position::Stream { lsn }) => return self.stream_next(lsn).await.map(Some),
            }
        }
    }
}

//! Connectors: how a source task reads a system outside Weir.
//!
//! Flink's FLIP-27 shape, kept small. A [`SourceConnector`] knows the
//! source's *splits* (a Kafka partition, a slice of a generator's
//! sequence) and opens a [`SplitReader`] on one of them from a position.
//! The splits are spread over the source's subtasks by key group
//! ([`split_key_group`]): each split's position is state in that key group,
//! so a rescale moves the split and its position together, and restoring
//! a checkpoint resumes every split exactly where the committed views stop.
//!
//! Each connector checks its `WITH` options when the source is created and
//! names the option that is wrong and what it allows.

mod datagen;
mod file;
pub(crate) mod kafka;
mod nexmark;
mod options;
mod pgoutput;
mod postgres_cdc;

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use planner::spec::ConnectorSpec;

use crate::{ExecError, Result};

pub use options::Options;

/// Rows read from a split.
#[derive(Debug, Clone)]
pub struct ReadBatch {
    /// In the source's columns.
    pub data: RecordBatch,
    /// The change each row is (`FORMAT DEBEZIUM`); `None`: inserts.
    pub ops: Option<Vec<storage::chunk::Op>>,
    /// Where the split's next read starts: what a checkpoint keeps.
    pub position: Vec<u8>,
    /// Nothing more was available after these rows (the generator is
    /// ahead of its rate, the partition at its end) …
    pub caught_up: bool,
    /// … as of this moment: when the read that found it out began (a
    /// Kafka fetch), so that nothing written after it is taken as read.
    pub as_of: Instant,
    /// The records among these that could not be decoded, skipped.
    pub rejected: Vec<Rejected>,
}

/// A record that could not be decoded: what a source counts, and keeps in
/// its dead-letter table if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Where the record is in the external system, as the connector names
    /// it (`partition 0 offset 17`, `/data/a.json byte 4096`): unique
    /// within the source.
    pub position: String,
    pub record: Vec<u8>,
    pub error: String,
}

/// The columns of a dead-letter table (`ENCODE … (dead_letter_table =
/// 'name')`), as SQL declares them: the source (or connector table) that
/// skipped the record, where the record is, its bytes, why it could not be
/// decoded and when it was skipped. `(source, position)` is the key, so a
/// record that several jobs skip (every view reads a source afresh), or
/// one job again after a restart, is kept once.
pub const DEAD_LETTER_COLUMNS: [(&str, &str); 5] = [
    ("source", "text"),
    ("position", "text"),
    ("record", "bytea"),
    ("error", "text"),
    ("skipped_at", "timestamptz"),
];

/// The key of a dead-letter table: `source`, `position`.
pub const DEAD_LETTER_KEY: [&str; 2] = ["source", "position"];

/// [`DEAD_LETTER_COLUMNS`] as Arrow fields (`timestamptz` at UTC, as the
/// catalog stores it).
pub fn dead_letter_schema() -> SchemaRef {
    use datafusion::arrow::datatypes::{DataType, Field, Schema, TimeUnit};
    Arc::new(Schema::new(vec![
        Field::new("source", DataType::Utf8, false),
        Field::new("position", DataType::Utf8, false),
        Field::new("record", DataType::Binary, true),
        Field::new("error", DataType::Utf8, true),
        Field::new(
            "skipped_at",
            DataType::Timestamp(TimeUnit::Microsecond, Some("+00:00".into())),
            true,
        ),
    ]))
}

/// The rows of a dead-letter table for records `source` skipped, each at
/// the time (microseconds since the epoch) given.
pub(crate) fn dead_letter_rows(source: &str, rejected: &[(Rejected, i64)]) -> Result<RecordBatch> {
    use datafusion::arrow::array::{BinaryArray, StringArray, TimestampMicrosecondArray};
    let schema = dead_letter_schema();
    Ok(RecordBatch::try_new(
        schema,
        vec![
            Arc::new(StringArray::from_iter_values(
                rejected.iter().map(|_| source),
            )),
            Arc::new(StringArray::from_iter_values(
                rejected.iter().map(|(r, _)| r.position.as_str()),
            )),
            Arc::new(BinaryArray::from_iter_values(
                rejected.iter().map(|(r, _)| r.record.as_slice()),
            )),
            Arc::new(StringArray::from_iter_values(
                rejected.iter().map(|(r, _)| r.error.as_str()),
            )),
            Arc::new(
                TimestampMicrosecondArray::from_iter_values(rejected.iter().map(|(_, t)| *t))
                    .with_timezone("+00:00"),
            ),
        ],
    )?)
}

/// Reads one split, in order.
#[async_trait]
pub trait SplitReader: Send {
    /// The next rows, waiting until there are some; `None` when the split
    /// has ended (a bounded source).
    async fn next(&mut self) -> Result<Option<ReadBatch>>;
}

/// How fast a reader goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pace {
    /// At the source's configured rate (a running job).
    Rated,
    /// As fast as it can, and only what is there when it starts (a batch
    /// `SELECT`: a bounded source whole, a Kafka topic up to its end).
    Unlimited,
}

/// A source's connector: its splits and their readers.
#[async_trait]
pub trait SourceConnector: Send + Sync {
    /// How many splits the source has.
    async fn splits(&self) -> Result<usize>;
    /// A reader of `split`, from `position` (`None`: its beginning).
    fn reader(
        &self,
        split: usize,
        position: Option<&[u8]>,
        pace: Pace,
    ) -> Result<Box<dyn SplitReader>>;
    /// Whether every split ends.
    fn bounded(&self) -> bool;
    /// Whether its records are changes (`FORMAT DEBEZIUM`), not rows.
    fn changelog(&self) -> bool {
        false
    }
    /// Whether a batch `SELECT` can read it: a bounded source, or one whose
    /// [`Pace::Unlimited`] readers stop at the end of what is there now;
    /// never a changelog, whose changes only a view can apply.
    fn batch_readable(&self) -> bool {
        self.bounded() && !self.changelog()
    }
    /// A checkpoint holding `position` for `split` has completed: what the
    /// external system keeps for a restart before it may go (a
    /// PostgreSQL slot's WAL).
    fn committed(&self, _split: usize, _position: &[u8]) {}
    /// The table or source was dropped: release what the connector holds
    /// in the external system (a replication slot).
    async fn dropped(&self) -> Result<()> {
        Ok(())
    }
}

/// The connectors Weir has, as `connector = '…'` names them.
pub const SOURCE_CONNECTORS: &[&str] = &["datagen", "file", "kafka", "nexmark", "postgres-cdc"];

/// The connector of a source with `schema` (its declared columns), its
/// options checked.
pub fn source(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Arc<dyn SourceConnector>> {
    // Connectors whose records are bytes check their FORMAT with ENCODE.
    let decodes = decodes_records(&spec.connector);
    if !decodes && spec.format.as_deref().is_some_and(|f| f != "PLAIN") {
        return Err(ExecError::InvalidOption(format!(
            "connector {} takes FORMAT PLAIN, not FORMAT {}",
            spec.connector,
            spec.format.as_deref().unwrap_or_default()
        )));
    }
    match spec.connector.as_str() {
        "datagen" => Ok(Arc::new(datagen::Datagen::new(spec, schema)?)),
        "nexmark" => Ok(Arc::new(nexmark::Nexmark::new(spec, schema)?)),
        "kafka" => Ok(Arc::new(kafka::Kafka::new(spec, schema)?)),
        "file" => Ok(Arc::new(file::Files::new(spec, schema)?)),
        "postgres-cdc" => Ok(Arc::new(postgres_cdc::PostgresCdc::new(spec, schema)?)),
        other => Err(ExecError::InvalidOption(format!(
            "unknown connector \"{other}\"; source connectors are: {}",
            SOURCE_CONNECTORS.join(", ")
        ))),
    }
}

/// Whether `connector`'s records are bytes that a `FORMAT … ENCODE …`
/// decodes (and so may fail to).
pub fn decodes_records(connector: &str) -> bool {
    matches!(connector, "kafka" | "file")
}

/// The SQL type of `INCLUDE what` for `connector`: the Kafka record's
/// `key` (bytea), `partition` (int), `offset` (bigint) or `timestamp`
/// (timestamptz).
pub fn include_type(connector: &str, what: &str) -> Result<&'static str> {
    if connector != "kafka" {
        return Err(ExecError::InvalidOption(format!(
            "connector {connector} has nothing to INCLUDE (only kafka has)"
        )));
    }
    match what {
        "key" => Ok("bytea"),
        "partition" => Ok("int"),
        "offset" => Ok("bigint"),
        "timestamp" => Ok("timestamptz"),
        other => Err(ExecError::InvalidOption(format!(
            "connector kafka cannot INCLUDE {other}; it includes key, partition, offset and timestamp"
        ))),
    }
}

/// Fills in what must be fixed when a source is created so that every job
/// reading it, and every restart of one, reads the same rows (a generator's
/// base time).
pub fn complete(spec: &mut ConnectorSpec) {
    match spec.connector.as_str() {
        "nexmark" => nexmark::complete(spec),
        "postgres-cdc" => postgres_cdc::complete(spec),
        _ => {}
    }
}

/// The key group a split's position lives in. Splits 0, 1, 2, … go to key
/// groups 0, 64, 32, 96, … (the bits of the index reversed), so any number
/// of splits spreads evenly over any parallelism's key-group ranges.
pub fn split_key_group(split: usize) -> u16 {
    ((split % storage::keys::MAX_PARALLELISM as usize) as u8).reverse_bits() as u16 >> 1
}

/// The splits of `0..splits` that the subtask owning `key_groups` reads.
pub fn owned_splits(splits: usize, key_groups: &Range<u16>) -> Vec<usize> {
    (0..splits)
        .filter(|s| key_groups.contains(&split_key_group(*s)))
        .collect()
}

/// Spaces a split's records by a fixed gap: record `n` (of the whole
/// source, counted from where this reader started) is due `n × gap` after
/// the reader started.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    start: Instant,
    first: u64,
    gap_ns: u64,
}

impl Pacer {
    pub(crate) fn new(first: u64, gap_ns: u64) -> Self {
        Self {
            start: Instant::now(),
            first,
            gap_ns,
        }
    }

    /// When record `n` is due; `None` without a rate.
    pub(crate) fn due(&self, n: u64) -> Option<Instant> {
        if self.gap_ns == 0 {
            return None;
        }
        let ns = n.saturating_sub(self.first).saturating_mul(self.gap_ns);
        Some(self.start + Duration::from_nanos(ns))
    }

    /// Whether record `n` is due now.
    pub(crate) fn is_due(&self, n: u64) -> bool {
        self.due(n).is_none_or(|d| d <= Instant::now())
    }

    /// Waits until record `n` is due.
    pub(crate) async fn wait(&self, n: u64) {
        if let Some(d) = self.due(n) {
            tokio::time::sleep_until(d.into()).await;
        }
    }
}

/// A position that is a count of records (generators).
pub(crate) fn count_position(n: u64) -> Vec<u8> {
    n.to_be_bytes().to_vec()
}

/// Where a generator's split starts: the count its position holds, or,
/// without one, the split's own index (split `s` makes records `s`, `s + n`, …).
pub(crate) fn count_start(position: Option<&[u8]>, split: usize) -> Result<u64> {
    match position {
        None => Ok(split as u64),
        Some(b) => Ok(u64::from_be_bytes(b.try_into().map_err(|_| {
            ExecError::Storage(storage::StorageError::Corrupt("split position".into()))
        })?)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_spread_over_any_parallelism() {
        for p in 1..=8usize {
            let ranges: Vec<_> = (0..p)
                .map(|i| storage::keys::key_group_range(i, p))
                .collect();
            let owned: Vec<usize> = ranges.iter().map(|r| owned_splits(p, r).len()).collect();
            assert_eq!(owned.iter().sum::<usize>(), p);
            if p.is_power_of_two() {
                assert!(owned.iter().all(|n| *n == 1), "p={p}: {owned:?}");
            }
        }
        assert_eq!(split_key_group(0), 0);
        assert_eq!(split_key_group(1), 64);
        assert_eq!(split_key_group(2), 32);
        assert_eq!(split_key_group(3), 96);
    }
}

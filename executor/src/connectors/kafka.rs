//! `connector = 'kafka'`: a topic's partitions as splits, offsets as
//! positions (RisingWave's option names).
//!
//! Each partition is a split; its position is the offset of the next
//! record to read, kept in the checkpoint with the views' state, so a
//! restore reads on from exactly where the committed views stop: each
//! record counts once. Where a partition starts when there is no position
//! yet is `scan.startup.mode`: the earliest record kept, the end of the
//! partition, the first record at or after a timestamp, or given offsets.
//! A position the topic no longer keeps (deleted by retention) reads on
//! from the earliest record kept.
//!
//! A batch `SELECT` reads every partition at least up to its end when the
//! query starts. The partitions are counted when a job starts; partitions added
//! to the topic later are read after the job next restarts.
//!
//! The client is librdkafka (the `rdkafka` crate), for the source as for
//! the sink. Each split reads with its own consumer, assigned its
//! partition (no consumer-group rebalancing: Weir's checkpoints, not the
//! group's committed offsets, say where to read), at
//! `isolation.level = read_committed`: records of aborted transactions are
//! skipped, and records of open ones wait until they commit, as for any
//! Kafka consumer that reads committed. Records compressed with gzip, LZ4,
//! Snappy or zstd are read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use futures::FutureExt;
use planner::spec::ConnectorSpec;
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::BorrowedMessage;
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

use super::{Options, Pace, ReadBatch, Rejected, SourceConnector, SplitReader};
use crate::formats::Decoder;
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &[
    "topic",
    "properties.bootstrap.server",
    "scan.startup.mode (earliest, latest, timestamp or specific-offsets)",
    "scan.startup.timestamp.millis",
    "scan.startup.specific.offsets ('partition:0,offset:42;partition:1,offset:7')",
    "properties.client.id",
    "properties.fetch.max.bytes",
];

/// How long a request to the brokers may take before it fails (a job
/// that fails then restarts by its restart strategy).
const REQUEST_DEADLINE: Duration = Duration::from_secs(15);
/// How long a read waits at a partition's end for new records.
const FETCH_WAIT: Duration = Duration::from_millis(100);
/// Records one batch carries at most.
const BATCH_RECORDS: usize = 8192;

/// Where a partition is read from when there is no position for it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Startup {
    Earliest,
    Latest,
    /// The first record with a timestamp at or after this (ms since the
    /// epoch); the end when there is none.
    Timestamp(i64),
    /// By partition; partitions not named start at the earliest record.
    Offsets(BTreeMap<i32, i64>),
}

pub(super) struct Kafka {
    shared: Arc<Shared>,
}

struct Shared {
    conn: Connection,
    fetch_max_bytes: i32,
    startup: Startup,
    decoder: Decoder,
    /// The source's columns: the decoded ones, then `INCLUDE`d ones.
    schema: SchemaRef,
    include: Vec<String>,
}

/// A topic on a Kafka cluster: `topic`, `properties.bootstrap.server` and
/// `properties.client.id`. The sink connects the same way as the source.
pub(crate) struct Connection {
    brokers: Vec<String>,
    pub(crate) topic: String,
    client_id: Option<String>,
}

impl Connection {
    /// Takes the connection's options from `o`.
    pub(crate) fn new(o: &mut Options) -> Result<Self> {
        let topic = o.take("topic").ok_or_else(|| missing("topic"))?;
        let brokers: Vec<String> = o
            .take("properties.bootstrap.server")
            .ok_or_else(|| missing("properties.bootstrap.server"))?
            .split(',')
            .map(|b| b.trim().to_string())
            .filter(|b| !b.is_empty())
            .collect();
        if brokers.is_empty() {
            return Err(o.invalid("properties.bootstrap.server", "", "host:port[,host:port…]"));
        }
        Ok(Self {
            brokers,
            topic,
            client_id: o.take("properties.client.id"),
        })
    }

    /// A librdkafka configuration with the brokers and client id.
    pub(crate) fn config(&self) -> ClientConfig {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", self.brokers.join(","));
        if let Some(id) = &self.client_id {
            config.set("client.id", id);
        }
        config
    }

    pub(crate) fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        ExecError::Connector(format!("kafka topic {}: {what}: {e}", self.topic))
    }

    /// The topic's number of partitions; an error if it does not exist.
    pub(crate) async fn partitions(&self) -> Result<usize> {
        let consumer: BaseConsumer = self
            .config()
            .create()
            .map_err(|e| self.failed("creating a client", e))?;
        let topic = self.topic.clone();
        let metadata = blocking(move || consumer.fetch_metadata(Some(&topic), REQUEST_DEADLINE))
            .await
            .map_err(|e| {
                ExecError::Connector(format!(
                    "cannot reach Kafka brokers {}: {e}",
                    self.brokers.join(",")
                ))
            })?;
        let found = metadata.topics().iter().find(|t| t.name() == self.topic);
        match found {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => {
                Ok(t.partitions().len())
            }
            Some(t)
                if t.error().is_some_and(|e| {
                    RDKafkaErrorCode::from(e) != RDKafkaErrorCode::UnknownTopicOrPartition
                }) =>
            {
                Err(self.failed(
                    "reading the topic's metadata",
                    RDKafkaErrorCode::from(t.error().expect("checked")),
                ))
            }
            _ => Err(ExecError::InvalidOption(format!(
                "topic \"{}\" does not exist on Kafka brokers {}",
                self.topic,
                self.brokers.join(",")
            ))),
        }
    }
}

/// Runs a blocking librdkafka call off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> std::result::Result<T, KafkaError> + Send + 'static,
) -> std::result::Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| e.to_string()),
        Err(e) => Err(format!("the blocking call failed: {e}")),
    }
}
impl Kafka {
    pub(super) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("kafka", &spec.options);
        let conn = Connection::new(&mut o)?;
        let fetch_max_bytes = o
            .parse::<i32>("properties.fetch.max.bytes", "a positive number of bytes")?
            .unwrap_or(1 << 20);
        if fetch_max_bytes < 1000 {
            return Err(o.invalid(
                "properties.fetch.max.bytes",
                &fetch_max_bytes.to_string(),
                "a number of bytes, at least 1000",
            ));
        }
        let timestamp = o.parse::<i64>(
            "scan.startup.timestamp.millis",
            "milliseconds since 1970-01-01",
        )?;
        let offsets = o.take("scan.startup.specific.offsets");
        let mode = o.take("scan.startup.mode");
        let startup = match (mode.as_deref().map(str::trim), timestamp, offsets) {
            (None | Some("timestamp"), Some(t), None) => Startup::Timestamp(t),
            (None | Some("specific-offsets"), None, Some(list)) => {
                Startup::Offsets(parse_offsets(&list).ok_or_else(|| {
                    o.invalid(
                        "scan.startup.specific.offsets",
                        &list,
                        "a list like 'partition:0,offset:42;partition:1,offset:7'",
                    )
                })?)
            }
            (None | Some("earliest"), None, None) => Startup::Earliest,
            (Some("latest"), None, None) => Startup::Latest,
            (Some("timestamp"), None, _) => return Err(missing("scan.startup.timestamp.millis")),
            (Some("specific-offsets"), _, None) => {
                return Err(missing("scan.startup.specific.offsets"));
            }
            (Some(m @ ("earliest" | "latest" | "timestamp" | "specific-offsets")), _, _) => {
                return Err(ExecError::InvalidOption(format!(
                    "scan.startup.mode '{m}' of connector kafka takes no other scan.startup option"
                )));
            }
            (Some(m), _, _) => {
                return Err(o.invalid(
                    "scan.startup.mode",
                    m,
                    "earliest, latest, timestamp or specific-offsets",
                ));
            }
            (None, _, _) => {
                return Err(ExecError::InvalidOption(
                    "connector kafka takes one of scan.startup.timestamp.millis and scan.startup.specific.offsets".into(),
                ));
            }
        };
        o.finish(OPTIONS)?;
        // The record's value fills the columns before the INCLUDEd ones.
        let include: Vec<String> = spec.include.iter().map(|i| i.what.clone()).collect();
        let decoded = schema.fields().len().saturating_sub(include.len());
        let value_schema = Arc::new(datafusion::arrow::datatypes::Schema::new(
            schema.fields()[..decoded].to_vec(),
        ));
        let decoder = Decoder::new(spec, &value_schema, false)?;
        if decoder.upsert() && !include.iter().any(|i| i == "key") {
            return Err(ExecError::InvalidOption(
                "FORMAT UPSERT needs the message key as a column: INCLUDE KEY AS <column>, \
                 the table's primary key"
                    .into(),
            ));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                conn,
                fetch_max_bytes,
                startup,
                decoder,
                schema: schema.clone(),
                include,
            }),
        })
    }
}

/// The decoded rows with the `INCLUDE`d columns after them, from the
/// record each row came from.
fn with_included(
    shared: &Shared,
    partition: i32,
    records: &[BorrowedMessage<'_>],
    decoded: &crate::formats::Decoded,
) -> Result<RecordBatch> {
    use datafusion::arrow::array::{
        ArrayRef, BinaryArray, Int32Array, Int64Array, TimestampMillisecondArray,
    };
    let mut columns = decoded.rows.columns().to_vec();
    let of = |i: &usize| &records[*i];
    let first = columns.len();
    for (n, what) in shared.include.iter().enumerate() {
        let array: ArrayRef = match what.as_str() {
            "key" => Arc::new(BinaryArray::from_iter(
                decoded.origin.iter().map(|i| of(i).key()),
            )),
            "partition" => Arc::new(Int32Array::from(vec![partition; decoded.origin.len()])),
            "offset" => Arc::new(Int64Array::from_iter_values(
                decoded.origin.iter().map(|i| of(i).offset()),
            )),
            _ => Arc::new(
                TimestampMillisecondArray::from_iter(
                    decoded.origin.iter().map(|i| of(i).timestamp().to_millis()),
                )
                .with_timezone("UTC"),
            ),
        };
        let target = shared.schema.field(first + n).data_type();
        columns.push(datafusion::arrow::compute::cast(&array, target)?);
    }
    Ok(RecordBatch::try_new(shared.schema.clone(), columns)?)
}

pub(crate) fn missing(option: &str) -> ExecError {
    ExecError::InvalidOption(format!("connector kafka needs option {option}"))
}

/// `partition:0,offset:42;partition:1,offset:7` (Flink's form).
fn parse_offsets(list: &str) -> Option<BTreeMap<i32, i64>> {
    let mut offsets = BTreeMap::new();
    for entry in list.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let (p, o) = entry.split_once(',')?;
        let p = p.trim().strip_prefix("partition:")?.trim().parse().ok()?;
        let o: i64 = o.trim().strip_prefix("offset:")?.trim().parse().ok()?;
        if o < 0 {
            return None;
        }
        offsets.insert(p, o);
    }
    (!offsets.is_empty()).then_some(offsets)
}

#[async_trait]
impl SourceConnector for Kafka {
    /// The topic's partitions; an error if the topic does not exist.
    async fn splits(&self) -> Result<usize> {
        self.shared.conn.partitions().await
    }

    fn reader(
        &self,
        split: usize,
        position: Option<&[u8]>,
        pace: Pace,
    ) -> Result<Box<dyn SplitReader>> {
        let offset = position
            .map(|b| {
                b.try_into().map(i64::from_be_bytes).map_err(|_| {
                    ExecError::Storage(storage::StorageError::Corrupt("kafka offset".into()))
                })
            })
            .transpose()?;
        Ok(Box::new(KafkaReader {
            shared: self.shared.clone(),
            partition: split as i32,
            consumer: None,
            offset,
            end: None,
            pace,
            at_end: false,
            skip_before: None,
        }))
    }

    fn bounded(&self) -> bool {
        false
    }

    fn changelog(&self) -> bool {
        self.shared.decoder.changelog()
    }

    fn batch_readable(&self) -> bool {
        !self.changelog()
    }
}

struct KafkaReader {
    shared: Arc<Shared>,
    partition: i32,
    /// The partition's consumer, assigned on the first read.
    consumer: Option<Arc<StreamConsumer>>,
    /// The next record's offset; `None` until the start is resolved.
    offset: Option<i64>,
    /// A batch read's end: the partition's end when it started. The read
    /// stops there or where the consumer reports the partition's end,
    /// whichever comes first, with the whole of the last batch it read (so
    /// with what a record batch holds past its first offset, for brokers
    /// that answer the end with that: tansu).
    end: Option<i64>,
    pace: Pace,
    /// Whether the consumer's last word was that the partition's end
    /// (its last stable offset) is reached.
    at_end: bool,
    /// Until a record stamped at or after this time (ms) comes, records
    /// are skipped (`scan.startup.timestamp.millis`).
    skip_before: Option<i64>,
}

impl KafkaReader {
    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        self.shared
            .conn
            .failed(&format!("{what} of partition {}", self.partition), e)
    }

    /// A consumer of the partition alone, reading committed records.
    fn consumer(&self) -> Result<StreamConsumer> {
        let max = self.shared.fetch_max_bytes;
        let mut config = self.shared.conn.config();
        config
            // Only for librdkafka's consumer queue: partitions are
            // assigned, never subscribed, and no offset is committed.
            .set("group.id", "weir-source")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("isolation.level", "read_committed")
            .set("enable.partition.eof", "true")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", FETCH_WAIT.as_millis().to_string())
            .set("fetch.max.bytes", max.to_string())
            .set("message.max.bytes", max.min(1_000_000).to_string());
        config
            .create()
            .map_err(|e| self.failed("creating a consumer", e))
    }

    /// The partition's first offset kept and the offset after its last
    /// committed record.
    async fn watermarks(&self, consumer: &Arc<StreamConsumer>) -> Result<(i64, i64)> {
        let (c, topic, p) = (
            consumer.clone(),
            self.shared.conn.topic.clone(),
            self.partition,
        );
        blocking(move || c.fetch_watermarks(&topic, p, REQUEST_DEADLINE))
            .await
            .map_err(|e| self.failed("reading the offsets", e))
    }

    /// Where the first read starts, by `scan.startup.mode`, given the
    /// partition's watermarks.
    async fn start(
        &mut self,
        consumer: &Arc<StreamConsumer>,
        (low, high): (i64, i64),
    ) -> Result<i64> {
        Ok(match self.shared.startup.clone() {
            Startup::Earliest => low,
            Startup::Latest => high,
            Startup::Timestamp(ms) => {
                // The broker's answer is where to look; the records before
                // the first one stamped at or after `ms` are skipped as they
                // come (for brokers that answer the earliest offset whatever
                // the time).
                self.skip_before = Some(ms);
                let mut tpl = TopicPartitionList::new();
                tpl.add_partition_offset(
                    &self.shared.conn.topic,
                    self.partition,
                    Offset::Offset(ms),
                )
                .map_err(|e| self.failed("looking up a timestamp", e))?;
                let c = consumer.clone();
                let found = blocking(move || c.offsets_for_times(tpl, REQUEST_DEADLINE))
                    .await
                    .map_err(|e| self.failed("looking up a timestamp", e))?;
                match found
                    .find_partition(&self.shared.conn.topic, self.partition)
                    .map(|e| e.offset())
                {
                    Some(Offset::Offset(o)) if o >= 0 => o,
                    // No record that late: start at the end.
                    _ => high,
                }
            }
            Startup::Offsets(offsets) => offsets.get(&self.partition).copied().unwrap_or(low),
        })
    }

    /// The consumer, assigned the partition at the reader's offset.
    async fn open(&mut self) -> Result<Arc<StreamConsumer>> {
        if let Some(c) = &self.consumer {
            return Ok(c.clone());
        }
        let consumer = Arc::new(self.consumer()?);
        // Asked once, for the start, a batch read's end, or both.
        let mut watermarks = None;
        let offset = match self.offset {
            Some(o) => o,
            None => {
                let w = *watermarks.insert(self.watermarks(&consumer).await?);
                self.start(&consumer, w).await?
            }
        };
        self.offset = Some(offset);
        if self.pace == Pace::Unlimited {
            let (_, high) = match watermarks {
                Some(w) => w,
                None => self.watermarks(&consumer).await?,
            };
            self.end = Some(high);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(
            &self.shared.conn.topic,
            self.partition,
            Offset::Offset(offset),
        )
        .and_then(|()| consumer.assign(&tpl))
        .map_err(|e| self.failed("assigning", e))?;
        self.consumer = Some(consumer.clone());
        Ok(consumer)
    }
}

/// Whether a consumer error is librdkafka reporting a broker connection
/// it retries on its own.
fn transient(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::BrokerTransportFailure
                | RDKafkaErrorCode::AllBrokersDown
                | RDKafkaErrorCode::Resolve
                | RDKafkaErrorCode::NotLeaderForPartition
                | RDKafkaErrorCode::LeaderNotAvailable
        )
    )
}

#[async_trait]
impl SplitReader for KafkaReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        let consumer = self.open().await?;
        let mut offset = self.offset.expect("set by open");
        if let Some(end) = self.end
            && (offset >= end || self.at_end)
        {
            return Ok(None);
        }
        let shared = self.shared.clone();
        let partition = self.partition;
        let as_of = std::time::Instant::now();
        // The first record (or the partition's end) within the wait, then
        // whatever else has come, up to a batch.
        let mut records: Vec<BorrowedMessage<'_>> = Vec::new();
        let mut bytes = 0;
        let mut event = tokio::time::timeout(FETCH_WAIT, consumer.recv()).await.ok();
        while let Some(e) = event.take() {
            match e {
                Ok(m) => {
                    self.at_end = false;
                    bytes += m.payload_len();
                    records.push(m);
                }
                Err(KafkaError::PartitionEOF(_)) => self.at_end = true,
                Err(e) if transient(&e) => {
                    tracing::warn!(topic = %shared.conn.topic, partition, error = %e, "kafka broker unreachable; retrying");
                }
                Err(e) => return Err(self.failed(&format!("reading at {offset}"), e)),
            }
            if self.at_end
                || records.len() >= BATCH_RECORDS
                || bytes >= shared.fetch_max_bytes as usize
            {
                break;
            }
            event = consumer.recv().now_or_never();
        }
        if let Some(last) = records.last() {
            offset = last.offset() + 1;
        }
        if let Some(ms) = self.skip_before {
            let first = records
                .iter()
                .position(|r| r.timestamp().to_millis().is_some_and(|t| t >= ms));
            records.drain(..first.unwrap_or(records.len()));
            if first.is_some() {
                self.skip_before = None;
            }
        }
        let values: Vec<&[u8]> = records
            .iter()
            .map(|r| r.payload().unwrap_or_default())
            .collect();
        let decoded = shared.decoder.decode(&values)?;
        shared.decoder.check(&decoded, |i| {
            format!(
                "kafka topic {} partition {partition} offset {}",
                shared.conn.topic,
                records[i].offset()
            )
        })?;
        let rejected = decoded
            .errors
            .iter()
            .map(|e| {
                let offset = records[e.index].offset();
                tracing::warn!(
                    topic = %shared.conn.topic,
                    partition,
                    offset,
                    error = %e.message,
                    "kafka record skipped: it cannot be decoded"
                );
                Rejected {
                    position: format!("partition {partition} offset {offset}"),
                    record: values[e.index].to_vec(),
                    error: e.message.clone(),
                }
            })
            .collect();
        self.offset = Some(offset);
        let data = if shared.include.is_empty() {
            decoded.rows
        } else {
            with_included(&shared, partition, &records, &decoded)?
        };
        Ok(Some(ReadBatch {
            data,
            ops: decoded.ops,
            position: offset.to_be_bytes().to_vec(),
            caught_up: self.at_end,
            as_of,
            rejected,
        }))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn kafka(options: &[(&str, &str)]) -> Result<Kafka> {
        let spec = ConnectorSpec {
            connector: "kafka".into(),
            options: [
                ("topic", "t"),
                ("properties.bootstrap.server", "127.0.0.1:9092"),
            ]
            .iter()
            .chain(options)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            format: Some("PLAIN".into()),
            encode: Some("JSON".into()),
            ..Default::default()
        };
        let schema = Arc::new(Schema::new(vec![Field::new("a", DataType::Int64, true)]));
        Kafka::new(&spec, &schema)
    }

    fn startup(options: &[(&str, &str)]) -> Startup {
        kafka(options).unwrap().shared.startup.clone()
    }

    #[test]
    fn startup_modes() {
        assert_eq!(startup(&[]), Startup::Earliest);
        assert_eq!(startup(&[("scan.startup.mode", "latest")]), Startup::Latest);
        assert_eq!(
            startup(&[("scan.startup.timestamp.millis", "1000")]),
            Startup::Timestamp(1000)
        );
        assert_eq!(
            startup(&[
                ("scan.startup.mode", "specific-offsets"),
                (
                    "scan.startup.specific.offsets",
                    "partition:0,offset:4; partition:2,offset:0"
                )
            ]),
            Startup::Offsets([(0, 4), (2, 0)].into())
        );
        for bad in [
            &[("scan.startup.mode", "newest")][..],
            &[("scan.startup.mode", "timestamp")],
            &[
                ("scan.startup.mode", "latest"),
                ("scan.startup.timestamp.millis", "1"),
            ],
            &[("scan.startup.specific.offsets", "0:4")],
            &[("scan.startup.timestamp.millis", "soon")],
            &[("group.id", "g")],
        ] {
            assert!(kafka(bad).is_err(), "{bad:?}");
        }
    }
}

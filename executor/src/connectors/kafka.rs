//! `connector = 'kafka'`: a topic's partitions as splits, offsets as
//! positions (RisingWave's option names).
//!
//! Each partition is a split; its position is the offset of the next
//! record to read, kept in the checkpoint with the views' state, so a
//! restore reads on from exactly where the committed views stop: each
//! record counts once. Where a partition starts when there is no position
//! yet is `scan.startup.mode`: the earliest record kept, the end of the
//! partition, the first record at or after a timestamp, or given offsets.
//!
//! A batch `SELECT` reads every partition up to its end when the query
//! starts. The partitions are counted when a job starts; partitions added
//! to the topic later are read after the job next restarts.
//!
//! The client is `rskafka`, in pure Rust; records compressed with gzip,
//! LZ4, Snappy or zstd are read.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use planner::spec::ConnectorSpec;
use rskafka::client::partition::{OffsetAt, PartitionClient, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::RecordAndOffset;
use rskafka::{BackoffConfig, chrono};
use tokio::sync::OnceCell;

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

/// How long a request to the brokers is retried before it fails (a job
/// that fails then restarts by its restart strategy).
const REQUEST_DEADLINE: Duration = Duration::from_secs(15);
/// How long a fetch waits at a partition's end for new records.
const FETCH_WAIT_MS: i32 = 100;

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
/// `properties.client.id`, and the client, connected on first use. The
/// sink connects the same way as the source.
pub(crate) struct Connection {
    brokers: Vec<String>,
    pub(crate) topic: String,
    client_id: Option<String>,
    client: OnceCell<Client>,
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
            client: OnceCell::new(),
        })
    }

    /// The client, connected on first use.
    async fn client(&self) -> Result<&Client> {
        self.client
            .get_or_try_init(|| async {
                let mut builder =
                    ClientBuilder::new(self.brokers.clone()).backoff_config(BackoffConfig {
                        deadline: Some(REQUEST_DEADLINE),
                        ..Default::default()
                    });
                if let Some(id) = &self.client_id {
                    builder = builder.client_id(id.as_str());
                }
                builder.build().await.map_err(|e| {
                    ExecError::Connector(format!(
                        "cannot reach Kafka brokers {}: {e}",
                        self.brokers.join(",")
                    ))
                })
            })
            .await
    }

    /// `properties.bootstrap.server`, as librdkafka takes it.
    pub(crate) fn bootstrap_servers(&self) -> String {
        self.brokers.join(",")
    }

    /// `properties.client.id`, if given.
    pub(crate) fn client_id(&self) -> Option<&str> {
        self.client_id.as_deref()
    }

    pub(crate) fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        ExecError::Connector(format!("kafka topic {}: {what}: {e}", self.topic))
    }

    /// The topic's number of partitions; an error if it does not exist.
    pub(crate) async fn partitions(&self) -> Result<usize> {
        let topics = self
            .client()
            .await?
            .list_topics()
            .await
            .map_err(|e| self.failed("listing topics", e))?;
        let Some(topic) = topics.into_iter().find(|t| t.name == self.topic) else {
            return Err(ExecError::InvalidOption(format!(
                "topic \"{}\" does not exist on Kafka brokers {}",
                self.topic,
                self.brokers.join(",")
            )));
        };
        Ok(topic.partitions.len())
    }

    /// A client of partition `partition`.
    pub(crate) async fn partition(&self, partition: i32) -> Result<PartitionClient> {
        self.client()
            .await?
            .partition_client(self.topic.clone(), partition, UnknownTopicHandling::Error)
            .await
            .map_err(|e| self.failed(&format!("partition {partition}"), e))
    }
}

impl Kafka {
    pub(super) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("kafka", &spec.options);
        let conn = Connection::new(&mut o)?;
        let fetch_max_bytes = o
            .parse::<i32>("properties.fetch.max.bytes", "a positive number of bytes")?
            .unwrap_or(1 << 20);
        if fetch_max_bytes <= 0 {
            return Err(o.invalid(
                "properties.fetch.max.bytes",
                &fetch_max_bytes.to_string(),
                "a positive number of bytes",
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
    records: &[RecordAndOffset],
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
                decoded.origin.iter().map(|i| of(i).record.key.clone()),
            )),
            "partition" => Arc::new(Int32Array::from(vec![partition; decoded.origin.len()])),
            "offset" => Arc::new(Int64Array::from_iter_values(
                decoded.origin.iter().map(|i| of(i).offset),
            )),
            _ => Arc::new(
                TimestampMillisecondArray::from_iter_values(
                    decoded
                        .origin
                        .iter()
                        .map(|i| of(i).record.timestamp.timestamp_millis()),
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
            client: None,
            offset,
            end: None,
            pace,
            warned: false,
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
    client: Option<PartitionClient>,
    /// The next record's offset; `None` until the start is resolved.
    offset: Option<i64>,
    /// A batch read's end: the partition's end when it started.
    end: Option<i64>,
    pace: Pace,
    /// Whether the broker's empty answer below its end was logged.
    warned: bool,
    /// Until a record stamped at or after this time (ms) comes, records
    /// are skipped (`scan.startup.timestamp.millis`).
    skip_before: Option<i64>,
}

impl KafkaReader {
    async fn partition(&mut self) -> Result<&PartitionClient> {
        if self.client.is_none() {
            self.client = Some(self.shared.conn.partition(self.partition).await?);
        }
        Ok(self.client.as_ref().expect("just set"))
    }

    async fn offset_at(&mut self, at: OffsetAt) -> Result<i64> {
        let p = self.partition;
        let shared = self.shared.clone();
        self.partition()
            .await?
            .get_offset(at)
            .await
            .map_err(|e| shared.conn.failed(&format!("offset of partition {p}"), e))
    }

    /// The offset after the partition's last record: the high watermark a
    /// fetch reports. (Not `ListOffsets` of the latest offset, which some
    /// brokers (tansu 0.6) answer with the start of the last record batch.)
    /// The fetch may wait a millisecond: tansu after 0.6 answers a fetch
    /// that may not wait at all with no partitions.
    async fn end_offset(&mut self) -> Result<i64> {
        let start = self.offset_at(OffsetAt::Earliest).await?;
        let p = self.partition;
        let shared = self.shared.clone();
        let (_, high_watermark) = self
            .partition()
            .await?
            .fetch_records(start, 1..2, 1)
            .await
            .map_err(|e| shared.conn.failed(&format!("end of partition {p}"), e))?;
        Ok(high_watermark)
    }

    /// Where the first read starts, by `scan.startup.mode`.
    async fn start(&mut self) -> Result<i64> {
        match self.shared.startup.clone() {
            Startup::Earliest => self.offset_at(OffsetAt::Earliest).await,
            Startup::Latest => self.end_offset().await,
            Startup::Timestamp(ms) => {
                let at = chrono::DateTime::from_timestamp_millis(ms).ok_or_else(|| {
                    ExecError::InvalidOption(format!("scan.startup.timestamp.millis {ms}"))
                })?;
                // The broker's answer is where to look; the records before
                // the first one stamped at or after `ms` are skipped as they
                // come (for brokers, such as tansu 0.6, that answer the
                // earliest offset whatever the time).
                self.skip_before = Some(ms);
                match self.offset_at(OffsetAt::Timestamp(at)).await? {
                    // No record that late: start at the end.
                    -1 => self.end_offset().await,
                    o => Ok(o),
                }
            }
            Startup::Offsets(offsets) => match offsets.get(&self.partition) {
                Some(o) => Ok(*o),
                None => self.offset_at(OffsetAt::Earliest).await,
            },
        }
    }
}

#[async_trait]
impl SplitReader for KafkaReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        let offset = match self.offset {
            Some(o) => o,
            None => {
                let o = self.start().await?;
                self.offset = Some(o);
                o
            }
        };
        if self.pace == Pace::Unlimited {
            let end = match self.end {
                Some(e) => e,
                None => {
                    let e = self.end_offset().await?;
                    self.end = Some(e);
                    e
                }
            };
            if offset >= end {
                return Ok(None);
            }
        }
        let shared = self.shared.clone();
        let partition = self.partition;
        let as_of = std::time::Instant::now();
        let (mut records, high_watermark) = self
            .partition()
            .await?
            .fetch_records(offset, 1..shared.fetch_max_bytes, FETCH_WAIT_MS)
            .await
            .map_err(|e| {
                shared
                    .conn
                    .failed(&format!("reading partition {partition} at {offset}"), e)
            })?;
        if records.is_empty() && offset < high_watermark && !self.warned {
            // Kafka answers a fetch from inside a record batch with that
            // batch; a broker that answers nothing leaves the split stuck.
            tracing::warn!(
                topic = %shared.conn.topic,
                partition,
                offset,
                high_watermark,
                "kafka broker returned no records below its high watermark"
            );
            self.warned = true;
        }
        if let Some(end) = self.end {
            records.retain(|r| r.offset < end);
        }
        let next = records.last().map_or(offset, |r| r.offset + 1);
        if let Some(ms) = self.skip_before {
            let first = records
                .iter()
                .position(|r| r.record.timestamp.timestamp_millis() >= ms);
            records.drain(..first.unwrap_or(records.len()));
            if first.is_some() {
                self.skip_before = None;
            }
        }
        let values: Vec<&[u8]> = records
            .iter()
            .map(|r| r.record.value.as_deref().unwrap_or_default())
            .collect();
        let decoded = shared.decoder.decode(&values)?;
        shared.decoder.check(&decoded, |i| {
            format!(
                "kafka topic {} partition {partition} offset {}",
                shared.conn.topic, records[i].offset
            )
        })?;
        let rejected = decoded
            .errors
            .iter()
            .map(|e| {
                let offset = records[e.index].offset;
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
        self.offset = Some(next);
        let data = if shared.include.is_empty() {
            decoded.rows
        } else {
            with_included(&shared, partition, &records, &decoded)?
        };
        Ok(Some(ReadBatch {
            data,
            ops: decoded.ops,
            position: next.to_be_bytes().to_vec(),
            caught_up: next >= high_watermark,
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

//! `connector = 'kafka'` as a sink: each change becomes a record of a
//! topic.
//!
//! - `FORMAT UPSERT ENCODE JSON` (with `primary_key`): the record's key is
//!   the JSON object of the key columns; an insert's value is the row, a
//!   delete's is empty (a tombstone). A compacted topic, or any consumer
//!   that keeps the last value per key, holds the sink's query's result.
//! - `FORMAT PLAIN ENCODE JSON | CSV`: one record per inserted row (the
//!   query must be append-only, or `force_append_only` drops the rest),
//!   keyed by `primary_key` if it is given.
//!
//! Records with a key go to partition `murmur2(key) mod partitions`, as
//! Kafka's Java producer places them, so every change of a key is in one
//! partition, in order; records without one are spread round-robin.
//!
//! Guarantees (`sink.delivery-guarantee`, Flink's option):
//! - `at-least-once` (the default): every write waits for the brokers'
//!   acknowledgement, so a barrier passes only once everything before it
//!   is in the topic; after a failure, the changes since the last
//!   completed checkpoint are written again, and a consumer can see those
//!   twice (with UPSERT the last value per key is still the query's
//!   result). Records appear as they come.
//! - `exactly-once`: a checkpoint's records are written in one Kafka
//!   transaction when the checkpoint completes, and never twice
//!   ([`super::kafka_transactions`]); `read_committed` consumers see each
//!   once. With UPSERT, a checkpoint writes one record per key it changed.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{RecordBatch, UInt32Array};
use datafusion::arrow::compute::take_record_batch;
use planner::spec::ConnectorSpec;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{FutureProducer, FutureRecord};
use storage::chunk::Chunk;

use super::kafka_transactions::{Placed, Transactions};
use super::{
    Encoder, Held, SinkConnector, SinkContext, SinkWriter, inserts, plain_needs_append_only,
    upserts,
};
use crate::connectors::Options;
use crate::connectors::kafka::Connection;
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &[
    "topic",
    "properties.bootstrap.server",
    "properties.client.id",
    "primary_key",
    "force_append_only",
    "sink.delivery-guarantee (at-least-once | exactly-once)",
    "sink.transactional-id-prefix",
];
/// How long librdkafka keeps trying to deliver a record before the write
/// fails (and the job restarts from its last checkpoint).
const DELIVERY_TIMEOUT_MS: &str = "30000";

#[derive(Clone, Copy)]
enum Format {
    Plain,
    Upsert,
}

pub(super) struct KafkaSink {
    conn: Arc<Connection>,
    format: Format,
    encoder: Encoder,
    /// `exactly-once`: the prefix of the writers' transactional ids.
    transactional: Option<String>,
}

impl KafkaSink {
    pub(super) fn new(spec: &ConnectorSpec, ctx: &SinkContext) -> Result<Self> {
        let mut o = Options::new("kafka", &spec.options);
        let conn = Connection::new(&mut o)?;
        let force = o.flag("force_append_only")?.unwrap_or(false);
        let guarantee = o.take("sink.delivery-guarantee");
        let prefix = o.take("sink.transactional-id-prefix");
        let transactional = match guarantee.as_deref().map(str::trim) {
            None | Some("at-least-once") => None,
            Some("exactly-once") => Some(
                prefix
                    .clone()
                    .unwrap_or_else(|| format!("weir-sink-{}", ctx.sink_id)),
            ),
            Some(other) => {
                return Err(o.invalid(
                    "sink.delivery-guarantee",
                    other,
                    "at-least-once or exactly-once",
                ));
            }
        };
        if prefix.is_some() && transactional.is_none() {
            return Err(ExecError::InvalidOption(
                "sink connector kafka takes sink.transactional-id-prefix only with \
                 sink.delivery-guarantee = 'exactly-once'"
                    .into(),
            ));
        }
        o.finish(OPTIONS)?;
        let (format, encoder) = match spec.format.as_deref() {
            Some("PLAIN") => {
                let encoder = Encoder::new(spec, &["JSON", "CSV"])?;
                plain_needs_append_only(spec, ctx, force)?;
                (Format::Plain, encoder)
            }
            Some("UPSERT") => {
                let encoder = Encoder::new(spec, &["JSON"])?;
                if ctx.key.is_empty() {
                    return Err(ExecError::InvalidOption(
                        "sink connector kafka with FORMAT UPSERT needs primary_key = 'column[,column…]'"
                            .into(),
                    ));
                }
                (Format::Upsert, encoder)
            }
            other => {
                return Err(ExecError::InvalidOption(format!(
                    "sink connector kafka needs FORMAT PLAIN | UPSERT ENCODE …{}",
                    other
                        .map(|f| format!(", not FORMAT {f}"))
                        .unwrap_or_default()
                )));
            }
        };
        Ok(Self {
            conn: Arc::new(conn),
            format,
            encoder,
            transactional,
        })
    }
}

#[async_trait]
impl SinkConnector for KafkaSink {
    async fn check(&self) -> Result<()> {
        self.conn.partitions().await.map(|_| ())
    }

    fn writer(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter>> {
        let exactly_once = self.transactional.as_ref().map(|prefix| ExactlyOnce {
            held: Held::new(ctx),
            transactions: Transactions::new(self.conn.clone(), prefix.clone()),
            subtask: ctx.subtask,
            sink_id: ctx.sink_id,
        });
        Ok(Box::new(KafkaWriter {
            conn: self.conn.clone(),
            format: self.format,
            encoder: self.encoder,
            key: ctx.key.clone(),
            producer: None,
            count: None,
            next: ctx.subtask,
            exactly_once,
        }))
    }
}

/// A record's key and value (`None`: a tombstone).
type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

struct KafkaWriter {
    conn: Arc<Connection>,
    format: Format,
    encoder: Encoder,
    key: Vec<usize>,
    /// The producer, opened on the first write (at least once).
    producer: Option<FutureProducer>,
    /// The topic's number of partitions, read on the first write.
    count: Option<usize>,
    /// Round-robin position for records without a key.
    next: usize,
    exactly_once: Option<ExactlyOnce>,
}

/// What a writer of an exactly-once sink keeps.
struct ExactlyOnce {
    /// The changes of the checkpoint under way.
    held: Held,
    transactions: Transactions,
    subtask: usize,
    sink_id: u64,
}

impl KafkaWriter {
    /// The JSON key of each row of `batch`, if the sink has a key.
    fn keys(&self, batch: &RecordBatch) -> Result<Option<Vec<Vec<u8>>>> {
        if self.key.is_empty() {
            return Ok(None);
        }
        Ok(Some(Encoder::Json.records(&batch.project(&self.key)?)?))
    }

    /// The records of `chunk`: in order (PLAIN), or per key its net
    /// change (UPSERT).
    fn records(&self, chunk: &Chunk) -> Result<Vec<KeyValue>> {
        let (batch, present) = match self.format {
            Format::Plain => match inserts(chunk)? {
                Some(b) => {
                    let n = b.num_rows();
                    (b, vec![true; n])
                }
                None => return Ok(Vec::new()),
            },
            Format::Upsert => {
                let changes = upserts(chunk, &self.key)?;
                let indices: UInt32Array = changes.iter().map(|(i, _)| *i as u32).collect();
                let batch = take_record_batch(chunk.data(), &indices)?;
                (batch, changes.into_iter().map(|(_, p)| p).collect())
            }
        };
        let values = self.encoder.records(&batch)?;
        let keys = self.keys(&batch)?;
        Ok(values
            .into_iter()
            .zip(present)
            .enumerate()
            .map(|(i, (value, present))| {
                let key = keys.as_ref().map(|k| k[i].clone());
                (key, present.then_some(value))
            })
            .collect())
    }
}

impl KafkaWriter {
    /// The records of `chunk`, each with its partition: `murmur2(key)`,
    /// or round-robin.
    async fn placed(&mut self, chunk: &Chunk) -> Result<Vec<Placed>> {
        let records = self.records(chunk)?;
        if records.is_empty() {
            return Ok(Vec::new());
        }
        let n = match self.count {
            Some(n) => n,
            None => *self.count.insert(self.conn.partitions().await?),
        };
        Ok(records
            .into_iter()
            .map(|(key, value)| {
                let p = match &key {
                    Some(k) => (murmur2(k) & 0x7fff_ffff) as usize % n,
                    None => {
                        self.next = self.next.wrapping_add(1);
                        self.next % n
                    }
                };
                (p as i32, key, value)
            })
            .collect())
    }
}

#[async_trait]
impl SinkWriter for KafkaWriter {
    async fn clean_up(&mut self, writers: &[usize], _restored: Option<u64>) -> Result<()> {
        if let Some(e) = &mut self.exactly_once {
            e.transactions.open(e.subtask, writers).await?;
        }
        Ok(())
    }

    async fn write(&mut self, chunk: &Chunk) -> Result<()> {
        if let Some(e) = &mut self.exactly_once {
            e.held.push(chunk);
            return Ok(());
        }
        let records = self.placed(chunk).await?;
        if records.is_empty() {
            return Ok(());
        }
        let producer = match &self.producer {
            Some(p) => p,
            None => {
                let mut config = self.conn.config();
                config
                    .set("message.timeout.ms", DELIVERY_TIMEOUT_MS)
                    .set("linger.ms", "5")
                    // Retries neither duplicate nor reorder records, so
                    // each key's changes stay in order.
                    .set("enable.idempotence", "true");
                let producer = config
                    .create()
                    .map_err(|e| self.conn.failed("creating a producer", e))?;
                self.producer.insert(producer)
            }
        };
        let topic = self.conn.topic.as_str();
        let mut pending = Vec::with_capacity(records.len());
        for (p, key, value) in &records {
            let mut record = FutureRecord::<[u8], [u8]>::to(topic).partition(*p);
            if let Some(k) = key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = value {
                record = record.payload(v.as_slice());
            }
            loop {
                match producer.send_result(record) {
                    Ok(delivery) => {
                        pending.push(delivery);
                        break;
                    }
                    // A full queue empties as the brokers acknowledge.
                    Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                        record = r;
                        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => return Err(self.conn.failed("writing", e)),
                }
            }
        }
        // Every record is acknowledged before the write returns, so a
        // barrier passes only once what came before it is in the topic.
        for delivery in pending {
            match delivery.await {
                Ok(Ok(_)) => {}
                Ok(Err((e, m))) => {
                    return Err(self.conn.failed(
                        &format!("writing partition {}", rdkafka::Message::partition(&m)),
                        e,
                    ));
                }
                Err(_) => return Err(self.conn.failed("writing", "the producer was closed")),
            }
        }
        Ok(())
    }

    async fn prepare(&mut self, _checkpoint: u64) -> Result<Option<Vec<u8>>> {
        match &mut self.exactly_once {
            Some(e) => e.held.prepare(),
            // Every write was acknowledged before it returned.
            None => Ok(None),
        }
    }

    async fn commit(&mut self, checkpoint: u64, committable: &[u8]) -> Result<()> {
        if self.exactly_once.is_none() {
            return Ok(());
        }
        let (writer, chunk) = Held::decode("kafka", committable)?;
        let records = self.placed(&chunk).await?;
        let n = records.len();
        let e = self.exactly_once.as_mut().expect("checked above");
        let written = e.transactions.commit(writer, checkpoint, records).await?;
        if written {
            tracing::debug!(
                sink_id = e.sink_id,
                writer,
                checkpoint,
                records = n,
                "kafka sink: checkpoint committed"
            );
        } else {
            tracing::info!(
                sink_id = e.sink_id,
                writer,
                checkpoint,
                "kafka sink: checkpoint already in Kafka, not written again"
            );
        }
        Ok(())
    }
}

/// Kafka's `Utils.murmur2`, which its default partitioner hashes keys
/// with.
fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    let mut h = SEED ^ data.len() as u32;
    let mut words = data.chunks_exact(4);
    for w in words.by_ref() {
        let mut k = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = words.remainder();
    if tail.len() == 3 {
        h ^= (tail[2] as u32) << 16;
    }
    if tail.len() >= 2 {
        h ^= (tail[1] as u32) << 8;
    }
    if !tail.is_empty() {
        h ^= tail[0] as u32;
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

#[cfg(test)]
mod tests {
    use super::murmur2;

    /// The cases of Kafka's own `UtilsTest.testMurmur2`.
    #[test]
    fn murmur2_is_kafkas() {
        assert_eq!(murmur2(b"21"), -973932308);
        assert_eq!(murmur2(b"foobar"), -790332482);
        assert_eq!(murmur2(b"a-little-bit-long-string"), -985981536);
        assert_eq!(murmur2(b"a-little-bit-longer-string"), -1486304829);
        assert_eq!(
            murmur2(b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8"),
            -58897971
        );
        assert_eq!(murmur2(b"abc"), 479470107);
    }
}

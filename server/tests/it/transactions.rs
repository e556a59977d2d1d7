//! Transaction blocks through pgwire, as drivers use them: a reader never
//! sees half of a committed transaction over several tables, in a view
//! whose rows live in several subtasks; `ROLLBACK` discards writes,
//! `COPY` included, in every view; a committed transaction survives
//! `kill -9`. The oracle is arithmetic: transfers keep a sum constant, and
//! rolled-back blocks move amounts no committed one does.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::SinkExt;

use crate::common;

use common::{Server, one, rows};

/// Sum of both tables' balances, which every committed transfer keeps.
const TOTAL: i64 = 2 * 40 * 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_never_sees_half_of_a_transaction_over_two_tables() {
    // A checkpoint every 10 ms: many chances for a barrier to fall between
    // a transaction's entries in the two tables' logs.
    let server = Server::start_with(&["--checkpoint-interval-ms", "10"]);
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE checking (id int PRIMARY KEY, balance bigint);
         CREATE TABLE savings (id int PRIMARY KEY, balance bigint);
         INSERT INTO checking SELECT v, 100 FROM generate_series(1, 40) AS s(v);
         INSERT INTO savings SELECT v, 100 FROM generate_series(1, 40) AS s(v);
         SET streaming_parallelism = 4;
         CREATE MATERIALIZED VIEW buckets AS
           SELECT id % 8 AS bucket, sum(balance) AS total
           FROM (SELECT id, balance FROM checking UNION ALL SELECT id, balance FROM savings) AS both_tables
           GROUP BY id % 8;",
    )
    .await
    .expect("setup");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let w = server.client().await;
        tokio::spawn(async move {
            let (mut committed, mut rolled_back) = (0u64, 0u64);
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // From a checking account to a savings account in another
                // bucket: two tables, two subtasks likely, one commit.
                let from = 1 + (i * 7) % 40;
                let to = 1 + (i * 13 + 5) % 40;
                let (amount, end) = if i % 5 == 4 {
                    (1_000_000, "ROLLBACK")
                } else {
                    (3, "COMMIT")
                };
                w.batch_execute(&format!(
                    "BEGIN;
                     UPDATE checking SET balance = balance - {amount} WHERE id = {from};
                     UPDATE savings SET balance = balance + {amount} WHERE id = {to};
                     {end}"
                ))
                .await
                .expect("transfer");
                if end == "COMMIT" {
                    committed += 1;
                } else {
                    rolled_back += 1;
                }
                i += 1;
            }
            (committed, rolled_back)
        })
    };
    for _ in 0..60 {
        let totals = rows(&c, "SELECT total FROM buckets").await;
        let total: i64 = totals.iter().map(|r| r[0].parse::<i64>().unwrap()).sum();
        assert_eq!(total, TOTAL, "a read saw part of a transaction: {totals:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let (committed, rolled_back) = writer.await.expect("writer");
    assert!(
        committed > 10 && rolled_back > 2,
        "too little happened: {committed} committed, {rolled_back} rolled back"
    );
    c.simple_query("FLUSH").await.expect("flush");
    // The view equals its recomputation from the tables, and no rolled
    // back million reached either.
    let view = one(&c, "SELECT sum(total) FROM buckets").await;
    assert_eq!(view, TOTAL.to_string());
    let max = one(
        &c,
        "SELECT max(balance) FROM (SELECT balance FROM checking UNION ALL SELECT balance FROM savings) AS b",
    )
    .await;
    assert!(max.parse::<i64>().unwrap() < 1_000_000, "max {max}");
    let recomputed = rows(
        &c,
        "SELECT id % 8, sum(balance) FROM (SELECT id, balance FROM checking UNION ALL SELECT id, balance FROM savings) AS b GROUP BY id % 8 ORDER BY 1",
    )
    .await;
    let viewed = rows(&c, "SELECT bucket, total FROM buckets ORDER BY 1").await;
    assert_eq!(viewed, recomputed);
}

async fn copy_in(c: &tokio_postgres::Transaction<'_>, sql: &str, data: &str) -> u64 {
    let sink = c.copy_in(sql).await.expect(sql);
    futures::pin_mut!(sink);
    sink.send(Bytes::from(data.to_string()))
        .await
        .expect("send");
    sink.finish().await.expect(sql)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollback_discards_copy_and_dml_in_every_view_and_commit_survives_kill_9() {
    let mut server = Server::start();
    let mut c = server.client().await;
    c.batch_execute(
        "CREATE TABLE events (id bigint, kind text);
         CREATE TABLE kinds (kind text PRIMARY KEY, label text);
         INSERT INTO kinds VALUES ('a', 'alpha');
         CREATE MATERIALIZED VIEW per_label AS
           SELECT k.label, count(*) AS n FROM events e JOIN kinds k ON e.kind = k.kind GROUP BY k.label;",
    )
    .await
    .expect("setup");
    // Rolled back: a COPY, an insert into the other table, an update.
    let tx = c.transaction().await.expect("begin");
    let n = copy_in(&tx, "COPY events FROM STDIN", "1\ta\n2\ta\n3\tb\n").await;
    assert_eq!(n, 3);
    tx.batch_execute("INSERT INTO kinds VALUES ('b', 'beta'); UPDATE kinds SET label = 'ALPHA'")
        .await
        .expect("in block");
    assert_eq!(
        tx.query_one("SELECT count(*) FROM events", &[])
            .await
            .expect("own writes")
            .get::<_, i64>(0),
        3,
        "the block reads its own COPY"
    );
    tx.rollback().await.expect("rollback");
    c.batch_execute("FLUSH").await.expect("flush");
    assert_eq!(one(&c, "SELECT count(*) FROM events").await, "0");
    assert_eq!(one(&c, "SELECT label FROM kinds").await, "alpha");
    assert!(rows(&c, "SELECT * FROM per_label").await.is_empty());
    // Committed: the same, then kill -9 before any checkpoint is asked for.
    let tx = c.transaction().await.expect("begin");
    copy_in(&tx, "COPY events FROM STDIN", "1\ta\n2\ta\n3\tb\n").await;
    tx.batch_execute("INSERT INTO kinds VALUES ('b', 'beta')")
        .await
        .expect("in block");
    tx.commit().await.expect("commit");
    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute("FLUSH").await.expect("flush");
    assert_eq!(
        rows(&c, "SELECT label, n FROM per_label ORDER BY label").await,
        vec![vec!["alpha", "2"], vec!["beta", "1"]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_fails_the_block_until_it_ends_and_the_client_sees_its_state() {
    let server = Server::start();
    let mut c = server.client().await;
    c.batch_execute("CREATE TABLE t (k int PRIMARY KEY)")
        .await
        .expect("setup");
    let tx = c.transaction().await.expect("begin");
    tx.execute("INSERT INTO t VALUES ($1)", &[&1i32])
        .await
        .expect("insert");
    let dup = tx
        .execute("INSERT INTO t VALUES ($1)", &[&1i32])
        .await
        .expect_err("duplicate");
    assert_eq!(dup.code().map(|c| c.code()), Some("23505"));
    // Extended protocol after the error: refused until the block ends.
    let refused = tx.query("SELECT k FROM t", &[]).await.expect_err("refused");
    assert_eq!(refused.code().map(|c| c.code()), Some("25P02"));
    // A statement that does not parse fails the block as well.
    drop(tx);
    let tx = c.transaction().await.expect("begin");
    tx.execute("INSERT INTO t VALUES (2)", &[])
        .await
        .expect("insert");
    tx.batch_execute("SELEC 1").await.expect_err("syntax");
    let refused = tx
        .batch_execute("INSERT INTO t VALUES (3)")
        .await
        .expect_err("refused");
    assert_eq!(refused.code().map(|c| c.code()), Some("25P02"));
    // COMMIT of a failed block rolls back, without an error, as in Postgres.
    tx.commit().await.expect("commit");
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "0");
}

//! Consistency: a reader never sees half of one statement's effect on a
//! view, even when the view's rows live in several parallel subtasks.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{Server, rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_never_show_half_done() {
    let server = Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint);
         INSERT INTO accounts SELECT v, 100 FROM generate_series(1, 40) AS s(v);
         SET streaming_parallelism = 4;
         CREATE MATERIALIZED VIEW balances AS SELECT id % 8 AS bucket, sum(balance) AS total FROM accounts GROUP BY id % 8;",
    )
    .await
    .expect("setup");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let client = server.client().await;
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // Each statement moves money between two accounts that land
                // in different buckets (and so, likely, different subtasks).
                let from = 1 + (i * 7) % 40;
                let to = 1 + (i * 13 + 5) % 40;
                if from != to {
                    client
                        .simple_query(&format!(
                            "UPDATE accounts SET balance = balance + CASE WHEN id = {from} THEN -3 ELSE 3 END \
                             WHERE id IN ({from}, {to})"
                        ))
                        .await
                        .expect("transfer");
                }
                i += 1;
            }
            i
        })
    };
    let mut reads = 0;
    for _ in 0..150 {
        let total: i64 = rows(&c, "SELECT total FROM balances")
            .await
            .iter()
            .map(|r| r[0].parse::<i64>().unwrap())
            .sum();
        assert_eq!(total, 4000, "a read saw part of a transfer");
        reads += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let transfers = writer.await.expect("writer");
    assert!(
        transfers > 10 && reads == 150,
        "too little happened: {transfers} transfers"
    );
    c.simple_query("FLUSH").await.expect("flush");
    let view: i64 = rows(&c, "SELECT sum(total) FROM balances").await[0][0]
        .parse()
        .unwrap();
    assert_eq!(view, 4000);
}

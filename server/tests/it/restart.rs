//! Durability: the server is killed with SIGKILL at 20 random moments while
//! rows stream in. After each restart every job resumes from the latest
//! checkpoint completed before the kill (so at most the writes of one
//! checkpoint interval are processed again), every acknowledged INSERT is
//! there, the views keep updating, and they equal their queries recomputed
//! from the tables. Each round prints the time from restart to the first
//! completed checkpoint of every job. `RESTART_SEED=n` replays a run.

use crate::common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::Duration;
use std::time::Instant;

use common::{Server, rows};

/// xorshift64*: enough randomness for kill moments, reproducible by seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The newest completed checkpoint of each view's job.
async fn latest_checkpoints(client: &tokio_postgres::Client) -> HashMap<String, i64> {
    rows(
        client,
        "SELECT view, max(id) FROM weir_catalog.checkpoints WHERE state = 'COMPLETED' GROUP BY view",
    )
    .await
    .into_iter()
    .map(|r| (r[0].clone(), r[1].parse().expect("id")))
    .collect()
}

const VIEWS: &[(&str, &str)] = &[
    (
        "per_kind",
        "SELECT kind, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM events GROUP BY kind",
    ),
    (
        "joined",
        "SELECT e.id, e.v, k.label FROM events e JOIN kinds k ON e.kind = k.kind",
    ),
    (
        "label_totals",
        "SELECT label, count(*) AS n FROM joined GROUP BY label",
    ),
];

/// What one writer did: ids whose INSERT was acknowledged, and ids it
/// deleted or tried to delete (a DELETE cut off by the crash may or may not
/// have happened).
#[derive(Default)]
struct Written {
    inserted: Vec<i64>,
    deleted: Vec<i64>,
}

/// Inserts, and now and then deletes, until stopped or the server dies.
async fn writer(url: String, next_id: Arc<AtomicI64>, stop: Arc<AtomicBool>) -> Written {
    let mut w = Written::default();
    let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await else {
        return w;
    };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    while !stop.load(Ordering::SeqCst) {
        let id = next_id.fetch_add(1, Ordering::SeqCst);
        let sql = format!(
            "INSERT INTO events VALUES ({id}, 'k{}', {})",
            id % 5,
            id % 97
        );
        match client.simple_query(&sql).await {
            Ok(_) => w.inserted.push(id),
            Err(_) => break,
        }
        if id % 10 == 0 {
            w.deleted.push(id - 3);
            if client
                .simple_query(&format!("DELETE FROM events WHERE id = {}", id - 3))
                .await
                .is_err()
            {
                break;
            }
        }
    }
    w
}

async fn check_views(server: &Server) {
    let client = server.client().await;
    client.simple_query("FLUSH").await.expect("flush");
    for (name, query) in VIEWS {
        let mut view = rows(&client, &format!("SELECT * FROM {name}")).await;
        let mut expected = rows(&client, query).await;
        view.sort();
        expected.sort();
        assert_eq!(
            view.len(),
            expected.len(),
            "view {name} has {} rows, its query {}",
            view.len(),
            expected.len()
        );
        assert!(view == expected, "view {name} differs from its query");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_survive_sigkill_mid_stream() {
    let mut server = Server::start();
    {
        let c = server.client().await;
        c.batch_execute(
            "CREATE TABLE events (id bigint PRIMARY KEY, kind text, v int);
             CREATE TABLE kinds (kind text PRIMARY KEY, label text);
             INSERT INTO kinds VALUES ('k0', 'zero'), ('k1', 'one'), ('k2', 'two'), ('k3', 'three');",
        )
        .await
        .expect("schema");
        for (name, query) in VIEWS {
            c.batch_execute(&format!("CREATE MATERIALIZED VIEW {name} AS {query}"))
                .await
                .expect("view");
        }
    }
    let next_id = Arc::new(AtomicI64::new(1));
    let mut survivors: std::collections::HashSet<i64> = Default::default();
    let seed = std::env::var("RESTART_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
                | 1
        });
    println!("RESTART_SEED={seed}");
    let mut rng = Rng(seed);
    let mut to_checkpoint = Vec::new();
    for round in 0..20 {
        let delay = 50 + rng.next() % 2000;
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| tokio::spawn(writer(server.url(), next_id.clone(), stop.clone())))
            .collect();
        let watcher = server.client().await;
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let before = latest_checkpoints(&watcher).await;
        drop(watcher);
        let restarted = Instant::now();
        server.crash_and_restart();
        stop.store(true, Ordering::SeqCst);
        // Every job completes a checkpoint again.
        let client = server.client().await;
        loop {
            if latest_checkpoints(&client).await.len() == VIEWS.len() {
                break;
            }
            assert!(
                restarted.elapsed() < Duration::from_secs(60),
                "round {round}: no checkpoint after the restart\n{}",
                server.log_text()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let took = restarted.elapsed();
        to_checkpoint.push(took);
        println!(
            "round {round}: killed {delay} ms into the stream; restart to first completed checkpoint of every job: {} ms",
            took.as_millis()
        );
        // Each job restored the newest checkpoint completed before the kill
        // (or one completed between that look and the kill).
        for r in rows(
            &client,
            "SELECT view, restored_checkpoint FROM weir_catalog.jobs",
        )
        .await
        {
            if let Some(seen) = before.get(&r[0]) {
                let restored: i64 = r[1].parse().unwrap_or(-1);
                assert!(
                    restored >= *seen,
                    "round {round}: {} restored checkpoint {restored}, but {seen} had completed",
                    r[0]
                );
            }
        }
        let mut deleted = std::collections::HashSet::new();
        for w in writers {
            let w = w.await.expect("writer");
            survivors.extend(w.inserted);
            deleted.extend(w.deleted);
        }
        survivors.retain(|id| !deleted.contains(id));
        let present: std::collections::HashSet<i64> = rows(&client, "SELECT id FROM events")
            .await
            .into_iter()
            .map(|r| r[0].parse().expect("id"))
            .collect();
        let lost: Vec<&i64> = survivors
            .iter()
            .filter(|id| !present.contains(id))
            .collect();
        assert!(
            lost.is_empty(),
            "round {round}: acknowledged rows lost: {lost:?}"
        );
        // Unacknowledged statements may or may not have landed; from now on
        // the table is the truth.
        survivors = present;
        check_views(&server).await;
        // The views keep following the table after the restart.
        client
            .simple_query("UPDATE kinds SET label = label || '+' WHERE kind = 'k1'")
            .await
            .expect("update kinds");
        check_views(&server).await;
    }
    to_checkpoint.sort();
    println!(
        "restart to first completed checkpoint over {} restarts: median {} ms, max {} ms",
        to_checkpoint.len(),
        to_checkpoint[to_checkpoint.len() / 2].as_millis(),
        to_checkpoint[to_checkpoint.len() - 1].as_millis()
    );
    assert!(
        survivors.len() > 20,
        "the writers wrote too little to test anything: {}",
        survivors.len()
    );
}

/// A stream that sends its late rows elsewhere finds its watermark again
/// after a SIGKILL: from its rows, not from scratch (which would take every
/// row for on time).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_rows_routing_survives_sigkill() {
    let mut server = Server::start();
    let client = server.client().await;
    client
        .batch_execute(
            "CREATE STREAM s (v int, ts timestamp, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND) \
             WITH (late_rows = 'late_s');
             INSERT INTO s VALUES (1, '2026-01-01 10:00:30');",
        )
        .await
        .expect("setup");
    server.crash_and_restart();
    let client = server.client().await;
    client
        .batch_execute(
            "INSERT INTO s VALUES (2, '2026-01-01 10:00:20'), (3, '2026-01-01 10:00:26')",
        )
        .await
        .expect("insert after restart");
    assert_eq!(
        rows(&client, "SELECT v FROM late_s").await,
        vec![vec!["2".to_string()]]
    );
    let mut on_time = rows(&client, "SELECT v FROM s").await;
    on_time.sort();
    assert_eq!(on_time, vec![vec!["1".to_string()], vec!["3".to_string()]]);
}

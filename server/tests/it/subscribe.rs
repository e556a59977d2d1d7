//! `SUBSCRIBE` through the user's door: a client follows a view's changes
//! with a cursor or a streamed query, and resumes after a crash of the
//! server from the last epoch it saw whole, with no gap and no duplicate.

use crate::common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Server, expect_error, rows};
use futures::StreamExt;
use tokio_postgres::SimpleQueryMessage;

/// A view's rows as a multiset: row (its columns as text) → count.
type Multiset = BTreeMap<Vec<String>, i64>;

fn multiset(rows: Vec<Vec<String>>) -> Multiset {
    let mut m = Multiset::new();
    for r in rows {
        *m.entry(r).or_default() += 1;
    }
    m
}

/// What a subscriber has folded so far, and the last epoch it saw whole.
#[derive(Default)]
struct Follower {
    rows: Multiset,
    whole: u64,
    last_epoch: u64,
}

impl Follower {
    /// Applies `weir_epoch, weir_op, columns…` rows in the order they came.
    fn apply(&mut self, fetched: Vec<Vec<String>>) {
        for r in fetched {
            let epoch: u64 = r[0].parse().unwrap();
            assert!(epoch >= self.last_epoch, "epochs go forward: {r:?}");
            if epoch > self.last_epoch && self.last_epoch > 0 {
                // A row of a later epoch: every earlier one is whole.
                self.whole = self.whole.max(self.last_epoch);
            }
            self.last_epoch = epoch;
            let row = r[2..].to_vec();
            match r[1].as_str() {
                "insert" => *self.rows.entry(row).or_default() += 1,
                "delete" => {
                    let n = self.rows.entry(row.clone()).or_default();
                    *n -= 1;
                    assert!(*n >= 0, "deleted a row it did not have: {row:?}");
                    if *n == 0 {
                        self.rows.remove(&row);
                    }
                }
                "progress" => self.whole = self.whole.max(epoch),
                other => panic!("unknown op {other}"),
            }
        }
    }
}

/// Fetches from `cursor` until the folded rows equal `view` (and the
/// epoch is whole), or fails after a generous bound.
async fn follow_until_equal(
    client: &tokio_postgres::Client,
    reader: &tokio_postgres::Client,
    cursor: &str,
    view: &str,
    f: &mut Follower,
) {
    let started = Instant::now();
    loop {
        let want = multiset(rows(reader, &format!("SELECT * FROM {view}")).await);
        let fetched = rows(
            client,
            &format!("FETCH ALL {cursor} WITH (timeout = '500ms')"),
        )
        .await;
        f.apply(fetched);
        if f.rows == want && f.whole == f.last_epoch {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the subscription never caught up with {view}: has {:?}, view {want:?}",
            f.rows
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_follows_a_view_and_resumes_after_a_crash() {
    let mut server = Server::start();
    let writer = server.client().await;
    rows(
        &writer,
        "CREATE TABLE t (k int PRIMARY KEY, v int);
         INSERT INTO t SELECT g, g * 10 FROM generate_series(1, 20) AS s(g);
         CREATE MATERIALIZED VIEW s AS
           SELECT k % 3 AS grp, count(*) AS n, sum(v) AS total FROM t GROUP BY k % 3;",
    )
    .await;

    let subscriber = server.client().await;
    rows(
        &subscriber,
        "DECLARE c CURSOR FOR SUBSCRIBE TO s WITH (progress)",
    )
    .await;
    // The snapshot: the view's rows, all inserts of one epoch.
    let first = rows(&subscriber, "FETCH ALL c").await;
    assert!(first.len() >= 3, "{first:?}");
    assert!(first.iter().all(|r| r[1] == "insert" || r[1] == "progress"));
    let mut f = Follower::default();
    f.apply(first);
    follow_until_equal(&subscriber, &writer, "c", "s", &mut f).await;

    // Changes: inserts, an update that moves a row between groups, deletes.
    for round in 0..4 {
        rows(
            &writer,
            &format!(
                "INSERT INTO t VALUES ({}, {round});
                 UPDATE t SET k = k + 1000 WHERE k = {};
                 DELETE FROM t WHERE k = {};",
                100 + round,
                1 + round,
                10 + round
            ),
        )
        .await;
        follow_until_equal(&subscriber, &writer, "c", "s", &mut f).await;
    }
    let resume_from = f.whole;
    assert!(resume_from > 0);

    // The server dies; writes go on after it is back.
    server.crash_and_restart();
    let writer = server.client().await;
    rows(
        &writer,
        "INSERT INTO t VALUES (500, 5), (501, 6);
         DELETE FROM t WHERE k = 15;
         FLUSH;",
    )
    .await;
    // Resume from the last whole epoch: the changes after it, exactly once.
    let subscriber = server.client().await;
    rows(
        &subscriber,
        &format!("DECLARE c CURSOR FOR SUBSCRIBE s SINCE {resume_from} WITH (progress)"),
    )
    .await;
    let mut resumed = Follower {
        rows: f.rows.clone(),
        whole: resume_from,
        last_epoch: resume_from,
    };
    follow_until_equal(&subscriber, &writer, "c", "s", &mut resumed).await;
    assert!(resumed.last_epoch > resume_from);

    // A second cursor on the same connection, then CLOSE.
    rows(&subscriber, "DECLARE d CURSOR FOR SUBSCRIBE s").await;
    let snapshot = rows(&subscriber, "FETCH 2 FROM d").await;
    assert_eq!(snapshot.len(), 2, "FETCH n takes at most n rows");
    rows(&subscriber, "CLOSE d").await;
    expect_error(
        &subscriber,
        "FETCH d",
        "34000",
        "cursor \"d\" does not exist",
    )
    .await;
    expect_error(
        &subscriber,
        "DECLARE c CURSOR FOR SUBSCRIBE s",
        "42P03",
        "already exists",
    )
    .await;

    // The view goes: the cursor says so.
    rows(&writer, "DROP MATERIALIZED VIEW s").await;
    expect_error(&subscriber, "FETCH ALL c", "42P01", "was dropped").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_streams_rows_as_they_come() {
    let server = Server::start();
    let writer = server.client().await;
    rows(
        &writer,
        "CREATE TABLE e (id int, name text);
         INSERT INTO e VALUES (1, 'one');
         CREATE MATERIALIZED VIEW ev AS SELECT id, upper(name) AS name FROM e;",
    )
    .await;

    // Extended protocol: the statement is described, rows stream.
    let extended = server.client().await;
    let stream = extended
        .query_raw("SUBSCRIBE ev", Vec::<String>::new())
        .await
        .expect("SUBSCRIBE");
    futures::pin_mut!(stream);
    let first = stream.next().await.expect("a row").expect("a row");
    assert_eq!(first.columns()[0].name(), "weir_epoch");
    assert_eq!(first.get::<_, String>("weir_op"), "insert");
    assert_eq!(first.get::<_, i32>("id"), 1);
    let snapshot_epoch: i64 = first.get("weir_epoch");

    // Simple protocol, resuming after the snapshot's epoch.
    let simple = server.client().await;
    let stream2 = simple
        .simple_query_raw(&format!("SUBSCRIBE TO ev SINCE {snapshot_epoch}"))
        .await
        .expect("SUBSCRIBE");
    futures::pin_mut!(stream2);

    rows(&writer, "INSERT INTO e VALUES (2, 'two')").await;
    let next = stream.next().await.expect("a row").expect("a row");
    assert_eq!(next.get::<_, String>("weir_op"), "insert");
    assert_eq!(next.get::<_, i32>("id"), 2);
    assert_eq!(next.get::<_, String>("name"), "TWO");
    assert!(next.get::<_, i64>("weir_epoch") > snapshot_epoch);

    let mut seen = Vec::new();
    while seen.is_empty() {
        match stream2.next().await.expect("a message").expect("a message") {
            SimpleQueryMessage::Row(r) => {
                seen.push((r.get(1).unwrap().to_string(), r.get(2).unwrap().to_string()))
            }
            _ => continue,
        }
    }
    assert_eq!(seen, vec![("insert".to_string(), "2".to_string())]);

    rows(&writer, "UPDATE e SET name = 'uno' WHERE id = 1").await;
    let a = stream.next().await.expect("a row").expect("a row");
    let b = stream.next().await.expect("a row").expect("a row");
    let change: Vec<(String, String)> = [a, b]
        .iter()
        .map(|r| (r.get::<_, String>("weir_op"), r.get::<_, String>("name")))
        .collect();
    assert_eq!(
        change,
        vec![
            ("delete".to_string(), "ONE".to_string()),
            ("insert".to_string(), "UNO".to_string())
        ],
        "an update is a delete and an insert in one epoch"
    );
}

/// psql prints `COPY (SUBSCRIBE …) TO STDOUT` rows as they come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_follows_a_view_with_copy() {
    use std::io::{BufRead, BufReader};
    let server = Server::start();
    let writer = server.client().await;
    rows(
        &writer,
        "CREATE TABLE w (id int, note text);
         INSERT INTO w VALUES (1, 'a\tb');
         CREATE MATERIALIZED VIEW wv AS SELECT id, note FROM w;",
    )
    .await;
    // psql's stdout is line-buffered on a terminal, block-buffered on a
    // pipe: stdbuf gives the test what a terminal user sees.
    let mut psql = std::process::Command::new("stdbuf")
        .args([
            "-o0",
            "psql",
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
        ])
        .args(["-U", "weir", "-d", "weir", "-X", "-c"])
        .arg("COPY (SUBSCRIBE wv) TO STDOUT")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("psql is installed by scripts/test (postgresql-client)");
    let mut lines = BufReader::new(psql.stdout.take().unwrap()).lines();
    let first = lines.next().unwrap().unwrap();
    let fields: Vec<&str> = first.split('\t').collect();
    assert_eq!(fields[1..], ["insert", "1", "a\\tb"], "{first}");
    rows(&writer, "INSERT INTO w VALUES (2, NULL)").await;
    let second = tokio::task::spawn_blocking(move || lines.next().unwrap().unwrap())
        .await
        .unwrap();
    let fields: Vec<&str> = second.split('\t').collect();
    assert_eq!(fields[1..], ["insert", "2", "\\N"], "{second}");
    assert!(fields[0].parse::<u64>().unwrap() > first.split('\t').next().unwrap().parse().unwrap());
    let _ = psql.kill();
    let _ = psql.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_errors() {
    let server = Server::start();
    let c = server.client().await;
    rows(
        &c,
        "CREATE TABLE t (a int);
         INSERT INTO t VALUES (1);
         CREATE MATERIALIZED VIEW quiet WITH (retain_history = 'off') AS SELECT a FROM t;
         CREATE MATERIALIZED VIEW short WITH (retain_history = '1 s') AS SELECT a FROM t;",
    )
    .await;
    expect_error(&c, "SUBSCRIBE nowhere", "42P01", "does not exist").await;
    expect_error(
        &c,
        "SUBSCRIBE t",
        "42809",
        "SUBSCRIBE follows materialized views",
    )
    .await;
    expect_error(&c, "SUBSCRIBE quiet", "55000", "retain_history = 'off'").await;
    expect_error(&c, "SUBSCRIBE (SELECT 1)", "0A000", "SUBSCRIBE to a query").await;
    expect_error(
        &c,
        "SUBSCRIBE short WITH (snapshot = false)",
        "22023",
        "snapshot",
    )
    .await;
    expect_error(&c, "SUBSCRIBE short; SELECT 1", "0A000", "send it alone").await;
    expect_error(
        &c,
        "COPY (SUBSCRIBE short) TO STDOUT WITH (FORMAT csv)",
        "0A000",
        "COPY (SUBSCRIBE …) TO STDOUT",
    )
    .await;
    expect_error(
        &c,
        "FETCH ALL nope",
        "34000",
        "cursor \"nope\" does not exist",
    )
    .await;
    expect_error(&c, "CLOSE nope", "34000", "does not exist").await;
    expect_error(
        &c,
        "DECLARE s SCROLL CURSOR FOR SUBSCRIBE short",
        "0A000",
        "SCROLL",
    )
    .await;
    rows(&c, "DECLARE s CURSOR FOR SUBSCRIBE short").await;
    expect_error(&c, "FETCH BACKWARD 1 s", "0A000", "only move forward").await;
    expect_error(&c, "FETCH s WITH (timeout = 'soon')", "22023", "timeout").await;
    expect_error(
        &c,
        "CREATE MATERIALIZED VIEW bad WITH (retain_history = 'forever') AS SELECT a FROM t",
        "22023",
        "retain_history",
    )
    .await;
    expect_error(
        &c,
        "CREATE VIEW bad WITH (retain_history = '1 hour') AS SELECT a FROM t",
        "0A000",
        "options of a view",
    )
    .await;
    expect_error(
        &c,
        "CREATE MATERIALIZED VIEW bad WITH (colour = 'red') AS SELECT a FROM t",
        "22023",
        "colour",
    )
    .await;

    // With one second of history, the first epochs are gone after a few:
    // resuming from before them is refused rather than missing changes.
    for i in 2..6 {
        rows(&c, &format!("INSERT INTO t VALUES ({i}); FLUSH;")).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    expect_error(
        &c,
        "DECLARE old CURSOR FOR SUBSCRIBE short SINCE 0",
        "55000",
        "no longer has the changes after epoch 0",
    )
    .await;
    // A fresh subscription still works: the rows, then what comes.
    rows(&c, "DECLARE fresh CURSOR FOR SUBSCRIBE short").await;
    let snapshot = rows(&c, "FETCH ALL fresh").await;
    assert_eq!(snapshot.len(), 5, "{snapshot:?}");

    // Resuming from where the history now starts works, and brings the
    // epochs the trims left (range deletes in RocksDB): a row inserted
    // now arrives, and nothing from before the horizon.
    rows(&c, "INSERT INTO t VALUES (6); FLUSH;").await;
    let started = Instant::now();
    let horizon = loop {
        let refused = c
            .simple_query("DECLARE kept CURSOR FOR SUBSCRIBE short SINCE 0")
            .await
            .expect_err("epoch 0 is long gone");
        let message = refused.as_db_error().expect("a server error").message();
        let horizon: u64 = message
            .split("dropped epochs up to ")
            .nth(1)
            .and_then(|m| m.split(';').next())
            .and_then(|h| h.parse().ok())
            .unwrap_or_else(|| panic!("{message}"));
        // The horizon may move on between the two statements: again.
        if c.simple_query(&format!(
            "DECLARE kept CURSOR FOR SUBSCRIBE short SINCE {horizon}"
        ))
        .await
        .is_ok()
        {
            break horizon;
        }
        assert!(started.elapsed() < Duration::from_secs(30));
    };
    let mut seen = Vec::new();
    while !seen.iter().any(|r: &Vec<String>| r[2] == "6") {
        assert!(started.elapsed() < Duration::from_secs(30), "{seen:?}");
        seen.extend(rows(&c, "FETCH ALL kept WITH (timeout = '1s')").await);
    }
    for r in &seen {
        assert!(
            r[0].parse::<u64>().unwrap() > horizon,
            "{r:?} after {horizon}"
        );
        assert_eq!(r[1], "insert", "{r:?}");
    }
}

/// Fetches `cursor` `n` rows at a time until a `progress` row of an epoch
/// at or after `until` (or of any epoch, if 0) has come.
async fn fetch_until_progress(
    client: &tokio_postgres::Client,
    cursor: &str,
    n: usize,
    until: u64,
) -> Vec<Vec<String>> {
    let started = Instant::now();
    let mut all = Vec::new();
    loop {
        let got = rows(
            client,
            &format!("FETCH {n} {cursor} WITH (timeout = '500ms')"),
        )
        .await;
        assert!(got.len() <= n, "FETCH {n} returned {}", got.len());
        let done = got
            .iter()
            .any(|r| r[1] == "progress" && r[0].parse::<u64>().unwrap() >= until);
        all.extend(got);
        if done {
            return all;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "no progress at or after epoch {until} on {cursor}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_snapshot_and_epoch_arrive_in_pages_in_order() {
    // More rows than a page (16,384 changes) in the snapshot and in one
    // statement's epoch, so both are read a page at a time.
    const N: i64 = 40_000;
    let server = Server::start();
    let c = server.client().await;
    rows(
        &c,
        &format!(
            "CREATE TABLE t (k int PRIMARY KEY, v int);
             INSERT INTO t SELECT g, g FROM generate_series(1, {N}) AS s(g);
             CREATE MATERIALIZED VIEW m AS SELECT k, v FROM t;"
        ),
    )
    .await;
    let sub = server.client().await;
    rows(&sub, "DECLARE snap CURSOR FOR SUBSCRIBE m WITH (progress)").await;
    let snapshot = fetch_until_progress(&sub, "snap", 7_000, 0).await;
    let s: u64 = snapshot.last().unwrap()[0].parse().unwrap();
    let mut f = Follower::default();
    f.apply(snapshot);
    assert_eq!(f.rows.len() as i64, N, "the snapshot holds every row");
    assert!(f.rows.contains_key(&vec![N.to_string(), N.to_string()]));

    rows(&c, "UPDATE t SET v = v + 1").await;
    rows(&c, "DELETE FROM t WHERE k % 2 = 0").await;
    // Wait until the view has both statements.
    let started = Instant::now();
    while rows(&c, "SELECT count(*) FROM m").await[0][0] != (N / 2).to_string() {
        assert!(started.elapsed() < Duration::from_secs(60));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let at: u64 = rows(
        &c,
        "SELECT max(id) FROM weir_catalog.checkpoints WHERE state = 'COMPLETED' AND view = 'm'",
    )
    .await[0][0]
        .parse()
        .unwrap();

    // Resume after the snapshot: every change since, epoch by epoch, each
    // epoch's deletes before its inserts, in pages of at most 7,000 rows.
    rows(
        &sub,
        &format!("DECLARE ch CURSOR FOR SUBSCRIBE m SINCE {s} WITH (progress)"),
    )
    .await;
    let changes = fetch_until_progress(&sub, "ch", 7_000, at).await;
    let mut last = (0u64, "delete".to_string());
    let (mut deletes, mut inserts) = (0, 0);
    for r in &changes {
        let epoch: u64 = r[0].parse().unwrap();
        assert!(epoch > s, "epoch {epoch} is not after {s}");
        if r[1] == "progress" {
            continue;
        }
        if epoch == last.0 {
            assert!(
                !(last.1 == "insert" && r[1] == "delete"),
                "a delete after an insert in epoch {epoch}"
            );
        } else {
            assert!(epoch > last.0, "epochs go forward");
        }
        match r[1].as_str() {
            "delete" => deletes += 1,
            _ => inserts += 1,
        }
        last = (epoch, r[1].clone());
    }
    // Every row's old value goes; what the delete removed of the updated
    // rows never arrives if both statements fell in one epoch (an epoch
    // holds each row's net change).
    assert!(deletes >= N, "{deletes} deletes");
    assert_eq!(inserts - deletes, -N / 2, "{last:?}");
    f.apply(changes);
    let want = multiset(rows(&c, "SELECT k::text, v::text FROM m").await);
    assert_eq!(f.rows.len(), want.len());
    assert!(
        f.rows == want,
        "the snapshot and the changes fold into the view"
    );
}

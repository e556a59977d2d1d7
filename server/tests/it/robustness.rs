//! No statement, name or restart takes the server down, and any statement
//! can be stopped:
//!
//! - objects named like window functions, Weir's system schema and SQL
//!   keywords work, and survive `kill -9` and restart;
//! - an object that cannot be restored is set aside (listed in
//!   `weir_catalog.restore_errors`), the server starts anyway and the
//!   object can be dropped;
//! - statements thousands of levels deep plan and run; deeper ones get
//!   `54001` and only that statement fails;
//! - a long statement does not hold up other clients, and a cancel
//!   request, `pg_cancel_backend`, `pg_terminate_backend`,
//!   `statement_timeout` or the client going away stops it before it writes;
//! - `DEALLOCATE` and `DISCARD` do what drivers expect of them;
//! - a row whose expression fails in a view (in a projection, a filter, a
//!   group key or an aggregate's argument) stays counted across `kill -9`
//!   and restart, and the view heals when the row is deleted.

use crate::common;

use std::time::{Duration, Instant};

use common::{Server, expect_error, one, rows};

/// A statement that runs for many minutes and writes (almost) nothing
/// until it ends: every row of a huge series is read and filtered out.
const ENDLESS_INSERT: &str =
    "INSERT INTO sink SELECT g FROM generate_series(1, 100000000000) AS s(g) WHERE g < 0";

async fn wait_until<F, Fut>(what: &str, mut ok: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ok().await {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The backend pid of the connection running `prefix…`, once it runs.
async fn running(c: &tokio_postgres::Client, prefix: &str) -> String {
    let sql = format!(
        "SELECT pid FROM pg_stat_activity WHERE state = 'active' AND query LIKE '{prefix}%'"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(r) = rows(c, &sql).await.first() {
            return r[0].clone();
        }
        assert!(Instant::now() < deadline, "{prefix}… never ran");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each query gives its rows (columns joined by `,`, rows by `|`), and no
/// catalog object was set aside at restore.
async fn check_restored(c: &tokio_postgres::Client, expected: &[(&str, &str)]) {
    for (sql, want) in expected {
        let got: Vec<String> = rows(c, sql).await.iter().map(|r| r.join(",")).collect();
        assert_eq!(got.join("|"), *want, "{sql}");
    }
    assert_eq!(
        one(c, "SELECT count(*) FROM weir_catalog.restore_errors").await,
        "0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_names_survive_a_restart() {
    let mut server = Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE clicks (id int, ts timestamp);
         INSERT INTO clicks VALUES (1, '2020-04-15 12:02:00'), (2, '2020-04-15 12:07:00');
         CREATE MATERIALIZED VIEW hop AS SELECT window_start, count(*) AS n FROM HOP(clicks, ts, INTERVAL '5' MINUTE, INTERVAL '10' MINUTE) GROUP BY window_start;
         CREATE VIEW tumble AS SELECT * FROM TUMBLE(clicks, ts, INTERVAL '5' MINUTE);
         CREATE MATERIALIZED VIEW cumulate AS SELECT window_end, count(*) AS n FROM CUMULATE(clicks, ts, INTERVAL '5' MINUTE, INTERVAL '10' MINUTE) GROUP BY window_end;
         CREATE MATERIALIZED VIEW session AS SELECT window_start, window_end, count(*) AS n FROM SESSION(clicks, ts, INTERVAL '10' MINUTE) GROUP BY window_start, window_end;
         CREATE TABLE weir_catalog (x int);
         INSERT INTO weir_catalog VALUES (42);
         CREATE TABLE \"select\" (\"from\" int);
         INSERT INTO \"select\" VALUES (1), (2), (3);
         CREATE MATERIALIZED VIEW \"from\" AS SELECT count(*) AS n, sum(\"from\") AS s FROM \"select\";
         CREATE VIEW \"table\" AS SELECT x FROM weir_catalog;
         CREATE MATERIALIZED VIEW \"order\" AS SELECT * FROM hop;
         FLUSH;",
    )
    .await
    .expect("hostile names are names like any other");
    let expected = [
        (
            "SELECT * FROM hop ORDER BY 1",
            "2020-04-15 11:55:00,1|2020-04-15 12:00:00,2|2020-04-15 12:05:00,1",
        ),
        ("SELECT count(*) FROM tumble", "2"),
        (
            "SELECT * FROM cumulate ORDER BY 1",
            "2020-04-15 12:05:00,1|2020-04-15 12:10:00,2",
        ),
        (
            "SELECT * FROM session",
            "2020-04-15 12:02:00,2020-04-15 12:17:00,2",
        ),
        ("SELECT * FROM \"from\"", "3,6"),
        ("SELECT * FROM \"table\"", "42"),
        ("SELECT count(*) FROM \"order\"", "3"),
        ("SELECT count(*) FROM weir_catalog.jobs", "5"),
    ];
    check_restored(&c, &expected).await;
    drop(c);
    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute("FLUSH").await.expect("flush after restart");
    check_restored(&c, &expected).await;
    c.batch_execute(
        "DROP MATERIALIZED VIEW \"order\", hop, cumulate, session, \"from\";
         DROP VIEW tumble, \"table\";
         DROP TABLE weir_catalog, \"select\", clicks;",
    )
    .await
    .expect("drop them all");
}

/// Schemas named like window functions and keywords, views in them found
/// through `search_path`, a restart, and a DROP SCHEMA CASCADE that
/// reaches into another schema. Expected rows are worked out by hand.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_schema_names_survive_a_restart() {
    let mut server = Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE SCHEMA hop;
         CREATE SCHEMA \"select\";
         CREATE TABLE hop.clicks (id int, ts timestamp);
         INSERT INTO hop.clicks VALUES (1, '2020-04-15 12:02:00'), (2, '2020-04-15 12:07:00');
         CREATE MATERIALIZED VIEW hop.tumble AS SELECT window_start, count(*) AS n FROM TUMBLE(hop.clicks, ts, INTERVAL '5' MINUTE) GROUP BY window_start;
         CREATE TABLE \"select\".\"from\" (x int);
         INSERT INTO \"select\".\"from\" VALUES (3), (4);
         SET search_path = \"select\", hop, public;
         CREATE MATERIALIZED VIEW \"where\" AS SELECT sum(x) AS s FROM \"from\";
         CREATE MATERIALIZED VIEW pairs AS SELECT count(*) AS n FROM clicks JOIN \"from\" ON true;
         FLUSH;",
    )
    .await
    .expect("hostile schema names are names like any other");
    let expected = [
        (
            "SELECT * FROM hop.tumble ORDER BY 1",
            "2020-04-15 12:00:00,1|2020-04-15 12:05:00,1",
        ),
        ("SELECT * FROM \"select\".\"where\"", "7"),
        ("SELECT * FROM \"select\".pairs", "4"),
    ];
    check_restored(&c, &expected).await;
    drop(c);
    server.crash_and_restart();
    // A new session has the default path: the views' stored queries name
    // their schemas.
    let c = server.client().await;
    c.batch_execute("INSERT INTO \"select\".\"from\" VALUES (5); FLUSH")
        .await
        .expect("write after restart");
    let expected_after = [
        expected[0],
        ("SELECT * FROM \"select\".\"where\"", "12"),
        ("SELECT * FROM \"select\".pairs", "6"),
    ];
    check_restored(&c, &expected_after).await;
    // pairs reads hop.clicks: it goes with hop.
    c.batch_execute("DROP SCHEMA hop CASCADE")
        .await
        .expect("drop schema hop");
    expect_error(&c, "SELECT * FROM \"select\".pairs", "42P01", "pairs").await;
    assert_eq!(one(&c, "SELECT * FROM \"select\".\"where\"").await, "12");
    c.batch_execute("DROP SCHEMA \"select\" CASCADE")
        .await
        .expect("drop schema select");
    assert_eq!(one(&c, "SELECT count(*) FROM weir_catalog.jobs").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_whose_input_is_gone_does_not_stop_the_server() {
    let mut server = Server::start();
    let c = server.client().await;
    let file = server.data_dir().join("rows.csv");
    std::fs::write(&file, "id,name\n1,a\n2,b\n").expect("write csv");
    c.batch_execute(&format!(
        "CREATE SOURCE rows (id int, name text) WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE CSV;
         CREATE MATERIALIZED VIEW counted AS SELECT count(*) AS n FROM rows;
         CREATE TABLE t (x int);
         INSERT INTO t VALUES (1);
         CREATE MATERIALIZED VIEW fine AS SELECT count(*) AS n FROM t;
         FLUSH;",
        file.display()
    ))
    .await
    .expect("setup");
    assert_eq!(one(&c, "SELECT n FROM counted").await, "2");
    drop(c);
    // The file the view's job reads is gone when the server comes back:
    // the catalog restores (the job fails as it reads), everything else
    // works, and the view and its source can go.
    server.kill9();
    std::fs::remove_file(&file).expect("remove csv");
    server.crash_and_restart();
    let c = server.client().await;
    assert_eq!(
        one(&c, "SELECT count(*) FROM weir_catalog.restore_errors").await,
        "0"
    );
    assert_eq!(one(&c, "SELECT n FROM fine").await, "1");
    // FLUSH would report the failed view; the view that runs catches up.
    c.batch_execute("INSERT INTO t VALUES (2)")
        .await
        .expect("writes go on");
    wait_until("the running view sees the write", || async {
        one(&c, "SELECT n FROM fine").await == "2"
    })
    .await;
    c.batch_execute("DROP MATERIALIZED VIEW counted; DROP SOURCE rows;")
        .await
        .expect("the view and its source can be dropped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_statements_run_or_fail_alone() {
    let server = Server::start();
    let c = server.client().await;
    c.batch_execute("CREATE TABLE t (id int); INSERT INTO t VALUES (5), (7);")
        .await
        .unwrap();
    let sum = vec!["1"; 800].join(" + ");
    assert_eq!(one(&c, &format!("SELECT {sum}")).await, "800");
    let ors: Vec<String> = (0..800).map(|i| format!("id = {i}")).collect();
    assert_eq!(
        one(
            &c,
            &format!("SELECT count(*) FROM t WHERE {}", ors.join(" OR "))
        )
        .await,
        "2"
    );
    let union = vec!["SELECT 1 AS x"; 380].join(" UNION ALL ");
    assert_eq!(
        one(&c, &format!("SELECT count(*) FROM ({union}) u")).await,
        "380"
    );
    // A view as deep, kept up to date.
    let terms = vec!["id"; 2000].join(" + ");
    let ors: Vec<String> = (0..2000).map(|i| format!("id = {i}")).collect();
    c.batch_execute(&format!(
        "CREATE MATERIALIZED VIEW deep AS SELECT id, {terms} AS s FROM t WHERE {};
         INSERT INTO t VALUES (9); FLUSH;",
        ors.join(" OR ")
    ))
    .await
    .expect("a deep view");
    let got: Vec<String> = rows(&c, "SELECT s FROM deep ORDER BY id")
        .await
        .iter()
        .map(|r| r[0].clone())
        .collect();
    assert_eq!(got, ["10000", "14000", "18000"]);
    // Too deep: this statement fails, and only it.
    let too_deep = vec!["1"; 50_000].join(" + ");
    expect_error(&c, &format!("SELECT {too_deep}"), "54001", "too complex").await;
    let union = vec!["SELECT 1"; 20_000].join(" UNION ALL ");
    expect_error(&c, &union, "54001", "too complex").await;
    assert_eq!(one(&c, "SELECT 1").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_statement_can_be_stopped_before_it_writes() {
    let server = Server::start();
    let c = server.client().await;
    c.batch_execute("CREATE TABLE sink (x bigint)")
        .await
        .unwrap();

    // A cancel request (tokio-postgres's cancel token) while another
    // client is served meanwhile.
    let writer = server.client().await;
    let token = writer.cancel_token();
    let insert = tokio::spawn(async move { writer.simple_query(ENDLESS_INSERT).await.map(|_| ()) });
    running(&c, "INSERT INTO sink").await;
    assert_eq!(one(&c, "SELECT 1").await, "1", "another client waits");
    assert!(!insert.is_finished());
    token
        .cancel_query(tokio_postgres::NoTls)
        .await
        .expect("cancel");
    let e = insert.await.unwrap().expect_err("cancelled");
    assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");

    // pg_cancel_backend.
    let writer = server.client().await;
    let insert = tokio::spawn(async move { writer.simple_query(ENDLESS_INSERT).await.map(|_| ()) });
    let pid = running(&c, "INSERT INTO sink").await;
    assert_eq!(
        one(&c, &format!("SELECT pg_cancel_backend({pid})")).await,
        "t"
    );
    let e = insert.await.unwrap().expect_err("cancelled");
    assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");

    // statement_timeout stops a write as it stops a query.
    let writer = server.client().await;
    writer
        .batch_execute("SET statement_timeout = '300ms'")
        .await
        .unwrap();
    let e = writer
        .simple_query(ENDLESS_INSERT)
        .await
        .expect_err("timed out");
    assert_eq!(e.code().map(|c| c.code()), Some("57014"), "{e}");
    let message = e.as_db_error().map(|d| d.message().to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("statement timeout")),
        "{message:?}"
    );

    // pg_terminate_backend ends the statement and the connection.
    let writer = server.client().await;
    let insert = tokio::spawn(async move { writer.simple_query(ENDLESS_INSERT).await.map(|_| ()) });
    let pid = running(&c, "INSERT INTO sink").await;
    assert_eq!(
        one(&c, &format!("SELECT pg_terminate_backend({pid})")).await,
        "t"
    );
    assert!(insert.await.unwrap().is_err());

    // A client that goes away (its socket closes): its statement stops.
    let (writer, connection) = tokio_postgres::connect(&server.url(), tokio_postgres::NoTls)
        .await
        .expect("connect");
    let connection = tokio::spawn(connection);
    let insert = tokio::spawn(async move { writer.simple_query(ENDLESS_INSERT).await.map(|_| ()) });
    running(&c, "INSERT INTO sink").await;
    insert.abort();
    connection.abort();
    wait_until("the statement of the client that left stops", || async {
        one(
            &c,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE 'INSERT INTO sink%'",
        )
        .await
            == "0"
    })
    .await;

    // Nothing was written, and writes still work.
    c.batch_execute("INSERT INTO sink VALUES (1)")
        .await
        .unwrap();
    assert_eq!(one(&c, "SELECT count(*) FROM sink").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_and_discard() {
    let server = Server::start();
    let c = server.client().await;
    let stmt = c.prepare("SELECT $1::int + 1::int").await.unwrap();
    let r = c.query_one(&stmt, &[&41i32]).await.unwrap();
    assert_eq!(r.get::<_, i32>(0), 42);
    expect_error(&c, "DEALLOCATE nothing_here", "26000", "does not exist").await;
    c.batch_execute("DEALLOCATE ALL")
        .await
        .expect("DEALLOCATE ALL");
    assert!(c.query(&stmt, &[&1i32]).await.is_err(), "deallocated");
    c.batch_execute(
        "SET streaming_parallelism = 3; DECLARE cur CURSOR WITH HOLD FOR SELECT 1; DISCARD ALL;",
    )
    .await
    .expect("DISCARD ALL");
    assert_eq!(one(&c, "SHOW streaming_parallelism").await, "4");
    expect_error(&c, "FETCH cur", "34000", "does not exist").await;
    c.batch_execute("DISCARD PLANS; DISCARD SEQUENCES; DISCARD TEMP; UNLISTEN *")
        .await
        .expect("the other resets drivers send");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_rows_stay_counted_across_a_restart() {
    let mut server = Server::start();
    let c = server.client().await;
    rows(&c, "CREATE TABLE z (id int PRIMARY KEY, a int)").await;
    rows(&c, "INSERT INTO z VALUES (1, 5), (2, 2), (3, 0)").await;
    for view in [
        "CREATE MATERIALIZED VIEW q AS SELECT id, 10 / a AS q FROM z",
        "CREATE MATERIALIZED VIEW s AS SELECT sum(100 / a) AS s, count(*) AS n FROM z",
        "CREATE MATERIALIZED VIEW g AS SELECT 12 / a AS k, count(*) AS n FROM z GROUP BY 12 / a",
    ] {
        rows(&c, view).await;
    }
    rows(&c, "FLUSH").await;
    rows(&c, "CHECKPOINT").await;
    server.crash_and_restart();
    let c = server.client().await;
    for view in ["q", "s", "g"] {
        expect_error(
            &c,
            &format!("SELECT * FROM {view}"),
            "22012",
            "division by zero",
        )
        .await;
    }
    rows(&c, "DELETE FROM z WHERE id = 3").await;
    rows(&c, "FLUSH").await;
    assert_eq!(
        rows(&c, "SELECT * FROM q ORDER BY id").await,
        vec![vec!["1", "2"], vec!["2", "5"]]
    );
    assert_eq!(rows(&c, "SELECT * FROM s").await, vec![vec!["70", "2"]]);
    assert_eq!(
        rows(&c, "SELECT * FROM g ORDER BY k").await,
        vec![vec!["2", "1"], vec!["6", "1"]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_that_cannot_be_restored_is_set_aside() {
    let mut server = Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE t (x int);
         INSERT INTO t VALUES (1), (2);
         CREATE MATERIALIZED VIEW good AS SELECT count(*) AS n FROM t;
         CREATE MATERIALIZED VIEW broken AS SELECT sum(x) AS s FROM t;
         FLUSH;",
    )
    .await
    .expect("setup");
    drop(c);
    server.kill9();
    // The stored definition of `broken` no longer plans (as after a
    // damaged catalog, or an upgrade that plans it differently): it reads
    // a table that does not exist.
    {
        let kv = std::sync::Arc::new(
            storage::KvStore::open(&server.data_dir().join("data/meta"), 8 << 20)
                .expect("open meta"),
        );
        let meta = storage::meta::MetaStore::new(kv);
        let (id, bytes) = meta
            .load_catalog()
            .expect("catalog")
            .into_iter()
            .find(|(_, b)| String::from_utf8_lossy(b).contains("\"broken\""))
            .expect("the view's entry");
        let text = String::from_utf8(bytes).expect("JSON");
        assert!(text.contains("FROM t"), "{text}");
        let damaged = text.replace("FROM t", "FROM gone");
        meta.update_catalog(vec![(id, damaged.into_bytes())], vec![])
            .expect("write the entry");
    }
    server.crash_and_restart();
    let c = server.client().await;
    let errors = rows(
        &c,
        "SELECT name, kind, error FROM weir_catalog.restore_errors",
    )
    .await;
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(errors[0][0], "broken");
    assert!(errors[0][2].contains("gone"), "{errors:?}");
    assert!(
        server.log_text().contains("gone"),
        "the log names the error"
    );
    // Everything else is served and written, and the object can be dropped.
    assert_eq!(one(&c, "SELECT n FROM good").await, "2");
    c.batch_execute("INSERT INTO t VALUES (3); FLUSH;")
        .await
        .expect("writes go on");
    assert_eq!(one(&c, "SELECT n FROM good").await, "3");
    c.batch_execute("DROP MATERIALIZED VIEW broken")
        .await
        .expect("the broken view can be dropped");
    drop(c);
    server.crash_and_restart();
    let c = server.client().await;
    assert_eq!(
        one(&c, "SELECT count(*) FROM weir_catalog.restore_errors").await,
        "0"
    );
    assert_eq!(one(&c, "SELECT n FROM good").await, "3");
}

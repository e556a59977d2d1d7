//! The `postgres` sink against Debian's PostgreSQL (started by the test):
//! a view upserted into a table and a stream appended to another, each
//! checkpoint in one transaction, exactly once across a SIGKILL; and the
//! errors of a target that does not fit.

use crate::common;

use std::time::{Duration, Instant};

use common::postgres::Postgres;
use common::{Server, expect_error, rows};

/// Waits until `pg` answers `sql` as `want`.
async fn until_equal(pg: &tokio_postgres::Client, sql: &str, want: &[Vec<String>]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = rows(pg, sql).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "PostgreSQL has {got:?}, not {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_sinks_upsert_and_append_exactly_once() {
    let postgres = Postgres::start();
    let pg = postgres.client().await;
    pg.batch_execute(
        "CREATE TABLE totals (customer text PRIMARY KEY, total bigint, n bigint);
         CREATE TABLE events (id int, kind text, at timestamp);",
    )
    .await
    .expect("target tables");
    let mut server = Server::start();
    let client = server.client().await;
    let with = |table: &str, extra: &str| {
        format!(
            "WITH (connector = 'postgres', host = '127.0.0.1', port = '{}', user = 'postgres', \
             database = 'postgres', table = '{table}'{extra})",
            postgres.port
        )
    };
    for sql in [
        "SET streaming_parallelism = 2".to_string(),
        "CREATE TABLE orders (id int PRIMARY KEY, customer varchar, amount int)".into(),
        "CREATE TABLE events (id int, kind varchar, at timestamp) APPEND ONLY".into(),
        "INSERT INTO orders SELECT i, 'c' || (i % 7), i FROM generate_series(1, 200) AS s(i)"
            .into(),
        "CREATE MATERIALIZED VIEW totals AS \
         SELECT customer, sum(amount) AS total, count(*) AS n FROM orders GROUP BY customer"
            .into(),
        format!(
            "CREATE SINK totals_pg FROM totals {}",
            with("totals", ", primary_key = 'customer'")
        ),
        format!(
            "CREATE SINK events_pg FROM events {}",
            with("events", ", type = 'append-only'")
        ),
        "INSERT INTO events SELECT i, 'k' || (i % 3), to_timestamp(1767225600 + i) \
         FROM generate_series(1, 300) AS s(i)"
            .into(),
        "UPDATE orders SET amount = amount + 1000 WHERE id % 10 = 0".into(),
        "DELETE FROM orders WHERE customer = 'c0'".into(),
        "FLUSH".into(),
    ] {
        rows(&client, &sql).await;
    }
    let view = "SELECT customer, total, n FROM totals ORDER BY customer";
    until_equal(&pg, view, &rows(&client, view).await).await;
    // The crash comes while events are being written; afterwards the
    // target holds each of them once.
    for batch in 0..5 {
        let from = 301 + batch * 100;
        rows(
            &client,
            &format!(
                "INSERT INTO events SELECT i, 'x', NULL FROM generate_series({from}, {}) AS s(i)",
                from + 99
            ),
        )
        .await;
    }
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
        "INSERT INTO events SELECT i, 'late', NULL FROM generate_series(801, 850) AS s(i)",
        "FLUSH",
    ] {
        rows(&client, sql).await;
    }
    let expected = rows(&client, view).await;
    assert_eq!(expected.len(), 8, "{expected:?}");
    until_equal(&pg, view, &expected).await;
    let counts = "SELECT count(*), count(DISTINCT id), min(id), max(id) FROM events";
    until_equal(
        &pg,
        counts,
        &[vec!["850".into(), "850".into(), "1".into(), "850".into()]],
    )
    .await;
    // Values keep their types.
    assert_eq!(
        rows(&pg, "SELECT kind, at::text FROM events WHERE id = 61").await,
        vec![vec!["k1".to_string(), "2026-01-01 00:01:01".to_string()]]
    );

    // A target that does not fit is refused when the sink is created.
    for (sql, code, message) in [
        (
            format!(
                "CREATE SINK s FROM totals {}",
                with("nope", ", primary_key = 'customer'")
            ),
            "22023",
            "table public.nope does not exist in PostgreSQL",
        ),
        (
            format!("CREATE SINK s FROM totals {}", with("totals", "")),
            "22023",
            "type = 'upsert' needs primary_key",
        ),
        (
            format!(
                "CREATE SINK s FROM totals {}",
                with("totals", ", primary_key = 'total'")
            ),
            "22023",
            "primary_key (total) is not the primary key of public.totals in PostgreSQL (customer)",
        ),
        (
            format!(
                "CREATE SINK s AS SELECT customer, total AS amount FROM totals {}",
                with("totals", ", primary_key = 'customer'")
            ),
            "22023",
            "table public.totals in PostgreSQL has no column \"amount\"",
        ),
        (
            format!(
                "CREATE SINK s FROM totals {} FORMAT PLAIN ENCODE JSON",
                with("totals", ", primary_key = 'customer'")
            ),
            "22023",
            "takes no FORMAT",
        ),
        (
            format!(
                "CREATE SINK s FROM totals {}",
                with("totals", ", type = 'append-only'")
            ),
            "22023",
            "add force_append_only = 'true'",
        ),
        (
            format!(
                "CREATE SINK s FROM totals WITH (connector = 'postgres', host = '127.0.0.1', \
                 port = '{}', user = 'postgres', database = 'postgres', table = 'totals', \
                 primary_key = 'customer')",
                common::free_port()
            ),
            "08001",
            "cannot connect to PostgreSQL",
        ),
    ] {
        expect_error(&client, &sql, code, message).await;
    }
}

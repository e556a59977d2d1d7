//! `CREATE TABLE … WITH (connector = 'postgres-cdc')` against Debian's
//! PostgreSQL (`wal_level = logical`): the table's snapshot (more than one
//! page), then inserts, updates (a changed key too), deletes and a
//! multi-statement transaction through the replication slot; a SIGKILL of
//! Weir with changes made while it is down; the errors of a definition
//! PostgreSQL cannot serve; `DROP TABLE` dropping the slot.

use crate::common;

use common::postgres::Postgres;
use common::{Server, expect_error, rows};

/// What both sides must agree on, in a form both render alike.
const SUMMARY: &str = "SELECT count(*), sum(id), sum(score), \
     md5(string_agg(CAST(id AS text) || ':' || name, ',' ORDER BY id)), \
     CAST(sum(extract(epoch FROM seen)) AS bigint), count(*) FILTER (WHERE active) \
     FROM people";

async fn pg_rows(client: &tokio_postgres::Client, sql: &str) -> Vec<Vec<String>> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

async fn assert_same(weir: &tokio_postgres::Client, pg: &tokio_postgres::Client) {
    rows(weir, "FLUSH").await;
    let expected = pg_rows(pg, SUMMARY).await;
    assert_eq!(rows(weir, SUMMARY).await, expected, "the table");
    // The view over it, against the same query on PostgreSQL.
    let by_active = "SELECT active, n, s FROM by_active ORDER BY active";
    let recomputed = "SELECT active, count(*) AS n, sum(score) AS s FROM people \
                      GROUP BY active ORDER BY active";
    assert_eq!(
        rows(weir, by_active).await,
        pg_rows(pg, recomputed).await,
        "the view"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_cdc_tables_follow_their_postgresql_table() {
    let pg = Postgres::start();
    let source = pg.client().await;
    source
        .batch_execute(
            "CREATE TABLE people (id int PRIMARY KEY, name text NOT NULL, score numeric(10,2), \
               seen timestamptz, active boolean, note text);
             INSERT INTO people SELECT i, 'p' || i, i * 1.5, \
               timestamptz '2026-01-01 00:00:00+00' + i * interval '1 hour', i % 2 = 0, 'x' \
             FROM generate_series(1, 5000) i;",
        )
        .await
        .unwrap();
    let mut server = Server::start();
    let client = server.client().await;
    let with = |table: &str| {
        format!(
            "WITH (connector = 'postgres-cdc', hostname = '127.0.0.1', port = '{}', \
             username = 'postgres', database.name = 'postgres', table.name = '{table}')",
            pg.port
        )
    };
    rows(
        &client,
        &format!(
            "CREATE TABLE people (id int PRIMARY KEY, name text, score decimal(10,2), \
             seen timestamptz, active boolean) {}",
            with("people")
        ),
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW by_active AS \
         SELECT active, count(*) AS n, sum(score) AS s FROM people GROUP BY active",
    )
    .await;
    // The snapshot: two pages.
    assert_same(&client, &source).await;
    assert_eq!(
        rows(&client, "SELECT count(*) FROM people").await[0][0],
        "5000"
    );

    source
        .batch_execute(
            "INSERT INTO people VALUES (6001, 'new', 1, now(), true, NULL);
             UPDATE people SET name = 'renamed', score = score + 1 WHERE id <= 10;
             DELETE FROM people WHERE id BETWEEN 100 AND 199;
             UPDATE people SET id = 7000 WHERE id = 50;
             BEGIN;
             INSERT INTO people VALUES (6002, 'tx', 2, NULL, false, NULL);
             DELETE FROM people WHERE id = 6001;
             COMMIT;",
        )
        .await
        .unwrap();
    assert_same(&client, &source).await;
    assert_eq!(
        rows(
            &client,
            "SELECT name FROM people WHERE id IN (50, 7000, 6001, 6002) ORDER BY id"
        )
        .await,
        vec![vec!["tx"], vec!["p50"]]
    );

    // SIGKILL; what happens in PostgreSQL meanwhile is read after the
    // restart, from the slot, once.
    server.crash_and_restart();
    source
        .batch_execute(
            "UPDATE people SET active = NOT active WHERE id % 7 = 0;
             INSERT INTO people SELECT i, 'late', 3, NULL, true, NULL FROM generate_series(8000, 8100) i;
             DELETE FROM people WHERE id < 5;",
        )
        .await
        .unwrap();
    let client = server.client().await;
    assert_same(&client, &source).await;

    // The slot is Weir's, and goes with the table.
    let slots = "SELECT count(*) FROM pg_replication_slots WHERE slot_name LIKE 'weir_%'";
    assert_eq!(pg_rows(&source, slots).await, vec![vec!["1"]]);

    expect_error(
        &client,
        &format!("CREATE SOURCE s (id int) {}", with("people")),
        "0A000",
        "CREATE SOURCE with connector postgres-cdc",
    )
    .await;
    expect_error(
        &client,
        &format!("CREATE TABLE t (id int) {}", with("people")),
        "42P16",
        "needs a PRIMARY KEY",
    )
    .await;
    expect_error(
        &client,
        &format!("CREATE TABLE t (id int PRIMARY KEY) {}", with("nope")),
        "22023",
        "table public.nope does not exist",
    )
    .await;
    expect_error(
        &client,
        &format!(
            "CREATE TABLE t (id int PRIMARY KEY, age int) {}",
            with("people")
        ),
        "22023",
        "has no column \"age\"",
    )
    .await;
    rows(&client, "DROP TABLE people CASCADE").await;
    assert_eq!(pg_rows(&source, slots).await, vec![vec!["0"]]);
    assert_eq!(
        pg_rows(&source, "SELECT count(*) FROM pg_publication").await,
        vec![vec!["0"]]
    );
}

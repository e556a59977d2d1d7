//! Run-time parameters as drivers and tools use them: SET, SHOW, RESET,
//! `set_config()`, startup parameters, transaction characteristics and
//! `statement_timeout`, over pgwire.

use crate::common;

use common::{Server, expect_error, one, rows};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_show_and_reset_the_parameters_clients_use() {
    let server = Server::start();
    let c = server.client().await;
    // Each parameter: a value it takes, and how SHOW then prints it.
    let cases = [
        (
            "search_path",
            "public, weir_catalog",
            "public, weir_catalog",
        ),
        ("DateStyle", "'ISO, DMY'", "ISO, DMY"),
        ("TimeZone", "'Etc/UTC'", "Etc/UTC"),
        ("extra_float_digits", "3", "3"),
        ("application_name", "'weir-test'", "weir-test"),
        ("client_encoding", "'utf-8'", "UTF8"),
        ("standard_conforming_strings", "on", "on"),
        ("statement_timeout", "'5s'", "5s"),
        ("IntervalStyle", "postgres", "postgres"),
    ];
    for (name, value, shown) in cases {
        let default = one(&c, &format!("SHOW {name}")).await;
        rows(&c, &format!("SET {name} = {value}")).await;
        assert_eq!(one(&c, &format!("SHOW {name}")).await, shown, "{name}");
        assert_eq!(
            one(&c, &format!("SELECT current_setting('{name}')")).await,
            shown,
            "{name}"
        );
        rows(&c, &format!("RESET {name}")).await;
        assert_eq!(one(&c, &format!("SHOW {name}")).await, default, "{name}");
    }
    assert_eq!(one(&c, "SHOW server_version_num").await, "160000");
    assert!(
        one(&c, "SELECT version()")
            .await
            .starts_with("PostgreSQL 16.0")
    );
    assert_eq!(
        one(
            &c,
            "SELECT setting FROM pg_settings WHERE name = 'datestyle'"
        )
        .await,
        "ISO, MDY"
    );

    // set_config() changes the session as SET does; a local one ends with
    // its statement, which is its transaction.
    assert_eq!(
        one(
            &c,
            "SELECT set_config('application_name', 'via-function', false)"
        )
        .await,
        "via-function"
    );
    assert_eq!(one(&c, "SHOW application_name").await, "via-function");
    assert_eq!(
        one(&c, "SELECT set_config('application_name', 'local', true)").await,
        "local"
    );
    assert_eq!(one(&c, "SHOW application_name").await, "via-function");
    rows(&c, "SET statement_timeout = 1000").await;
    rows(&c, "RESET ALL").await;
    assert_eq!(one(&c, "SHOW application_name").await, "");
    assert_eq!(one(&c, "SHOW statement_timeout").await, "0");

    // What Weir would not honour is refused, never accepted and ignored.
    expect_error(&c, "SET TimeZone = 'Europe/Berlin'", "0A000", "UTC").await;
    expect_error(&c, "SET DateStyle = 'German'", "0A000", "DateStyle").await;
    expect_error(&c, "SET client_encoding = 'LATIN1'", "0A000", "UTF8").await;
    expect_error(
        &c,
        "SET standard_conforming_strings = off",
        "0A000",
        "standard_conforming_strings",
    )
    .await;
    expect_error(
        &c,
        "SET extra_float_digits = 0",
        "0A000",
        "extra_float_digits",
    )
    .await;
    expect_error(
        &c,
        "SET extra_float_digits = 7",
        "22023",
        "extra_float_digits",
    )
    .await;
    expect_error(
        &c,
        "SET statement_timeout = 'soon'",
        "22023",
        "statement_timeout",
    )
    .await;
    expect_error(
        &c,
        "SET server_version_num = 1",
        "55P02",
        "cannot be changed",
    )
    .await;
    expect_error(
        &c,
        "SET no_such_parameter = 1",
        "42704",
        "no_such_parameter",
    )
    .await;
    expect_error(&c, "SHOW no_such_parameter", "42704", "no_such_parameter").await;
    expect_error(
        &c,
        "SELECT set_config('TimeZone', 'Asia/Tokyo', false)",
        "0A000",
        "UTC",
    )
    .await;
    assert_eq!(one(&c, "SHOW TimeZone").await, "UTC");
    // A custom (dotted) setting is kept, as in Postgres.
    rows(&c, "SET myapp.tenant = 'acme'").await;
    assert_eq!(one(&c, "SHOW myapp.tenant").await, "acme");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_characteristics_are_kept_and_read_only_is_enforced() {
    let server = Server::start();
    let c = server.client().await;
    assert_eq!(
        one(&c, "SHOW TRANSACTION ISOLATION LEVEL").await,
        "serializable"
    );
    rows(
        &c,
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL READ COMMITTED",
    )
    .await;
    assert_eq!(
        one(&c, "SHOW TRANSACTION ISOLATION LEVEL").await,
        "read committed"
    );
    assert_eq!(
        one(&c, "SHOW default_transaction_isolation").await,
        "read committed"
    );
    // BEGIN's own level lasts until COMMIT.
    rows(&c, "BEGIN ISOLATION LEVEL REPEATABLE READ").await;
    assert_eq!(
        one(&c, "SHOW transaction_isolation").await,
        "repeatable read"
    );
    rows(&c, "COMMIT").await;
    assert_eq!(
        one(&c, "SHOW transaction_isolation").await,
        "read committed"
    );

    rows(&c, "CREATE TABLE t (a int)").await;
    rows(&c, "BEGIN READ ONLY").await;
    expect_error(
        &c,
        "INSERT INTO t VALUES (1)",
        "25006",
        "read-only transaction",
    )
    .await;
    // The error failed the block, as in Postgres.
    expect_error(
        &c,
        "SELECT count(*) FROM t",
        "25P02",
        "current transaction is aborted",
    )
    .await;
    rows(&c, "ROLLBACK").await;
    rows(&c, "BEGIN READ ONLY").await;
    expect_error(
        &c,
        "CREATE TABLE u (a int)",
        "25006",
        "read-only transaction",
    )
    .await;
    rows(&c, "ROLLBACK").await;
    rows(&c, "BEGIN READ ONLY").await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "0");
    rows(&c, "ROLLBACK").await;
    rows(&c, "INSERT INTO t VALUES (1)").await;
    assert_eq!(one(&c, "SELECT count(*) FROM t").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_timeout_cancels_a_query_and_the_session_goes_on() {
    let server = Server::start();
    let c = server.client().await;
    rows(&c, "SET statement_timeout = '100ms'").await;
    expect_error(
        &c,
        "SELECT count(*) FROM generate_series(1, 10000000000)",
        "57014",
        "statement timeout",
    )
    .await;
    assert_eq!(one(&c, "SELECT 1").await, "1");
    rows(&c, "SET statement_timeout = 0").await;
    assert_eq!(
        one(&c, "SELECT count(*) FROM generate_series(1, 1000)").await,
        "1000"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_parameters_and_options_set_the_session() {
    let server = Server::start();
    let mut config: tokio_postgres::Config = server.url().parse().expect("config");
    config
        .application_name("from-startup")
        .options("-c extra_float_digits=2 --statement-timeout=7s");
    let (c, conn) = config
        .connect(tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(conn);
    assert_eq!(one(&c, "SHOW application_name").await, "from-startup");
    assert_eq!(one(&c, "SHOW extra_float_digits").await, "2");
    assert_eq!(one(&c, "SHOW statement_timeout").await, "7s");

    // A zone Weir does not work in fails the connection, with the reason.
    let mut config: tokio_postgres::Config = server.url().parse().expect("config");
    config.options("-c TimeZone=Asia/Tokyo");
    let e = config
        .connect(tokio_postgres::NoTls)
        .await
        .err()
        .expect("a zone other than UTC is refused");
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "0A000");
    assert!(db.message().contains("UTC"), "{}", db.message());
}

/// What the columns of a set-returning function in `FROM` are called, and
/// savepoints inside a block, as Postgres has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_columns_and_savepoints_are_as_in_postgres() {
    let server = common::Server::start();
    let client = server.client().await;
    for (sql, name) in [
        ("SELECT * FROM generate_series(1, 3)", "generate_series"),
        ("SELECT * FROM generate_series(1, 3) AS g", "g"),
        ("SELECT * FROM generate_series(1, 3) AS g(n)", "n"),
        ("SELECT generate_series(1, 3)", "generate_series"),
        (
            "SELECT * FROM string_to_array('a,b', ',') AS parts",
            "parts",
        ),
    ] {
        let rows = client.query(sql, &[]).await.expect(sql);
        assert_eq!(rows[0].columns()[0].name(), name, "{sql}");
    }
    let rows = client
        .query("SELECT * FROM generate_series(1, 3)", &[])
        .await
        .unwrap();
    // A series of integers is integer, as in Postgres.
    assert_eq!(
        rows.iter().map(|r| r.get::<_, i32>(0)).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    client
        .batch_execute(
            "BEGIN; SAVEPOINT a; RELEASE SAVEPOINT a; SAVEPOINT b; ROLLBACK TO SAVEPOINT b; COMMIT",
        )
        .await
        .unwrap();
}

/// `pg_stat_activity`: a row per connection, the running statement's text
/// and state, the application's name as the client last set it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_stat_activity_shows_every_connection() {
    let server = common::Server::start();
    let (other, conn) = tokio_postgres::connect(
        &format!("{} application_name=dashboard", server.url()),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    other.batch_execute("SELECT 41").await.unwrap();
    let me = server.client().await;
    me.batch_execute("SET application_name = 'console'")
        .await
        .unwrap();
    let rows = common::rows(
        &me,
        "SELECT application_name, state, query, usename, pid = pg_backend_pid() FROM pg_stat_activity ORDER BY application_name",
    )
    .await;
    assert_eq!(
        rows,
        vec![
            vec![
                "console",
                "active",
                "SELECT application_name, state, query, usename, pid = pg_backend_pid() FROM pg_stat_activity ORDER BY application_name",
                "weir",
                "t"
            ],
            vec!["dashboard", "idle", "SELECT 41", "weir", "f"],
        ]
    );
    drop(other);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while common::one(&me, "SELECT count(*) FROM pg_stat_activity").await != "1" {
        assert!(
            std::time::Instant::now() < deadline,
            "a closed connection leaves"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `INSERT … SELECT` from a series named by its alias, and the sizes psql's
/// `\dt+` and DBeaver show: a table's bytes grow with its rows, a view
/// stores nothing, a materialized view's state is not measured (NULL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relation_sizes_and_inserts_from_a_series() {
    let server = common::Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, v text);
         CREATE VIEW vv AS SELECT * FROM t;
         CREATE MATERIALIZED VIEW mv AS SELECT count(*) AS n FROM t",
    )
    .await
    .unwrap();
    let size = |sql: &'static str| {
        let c = &c;
        async move { common::one(c, sql).await }
    };
    assert_eq!(size("SELECT pg_total_relation_size('t')").await, "0");
    c.batch_execute("INSERT INTO t SELECT g, 'row ' || g FROM generate_series(1, 100) g")
        .await
        .unwrap();
    assert_eq!(common::one(&c, "SELECT count(*) FROM t").await, "100");
    let rows: i64 = size("SELECT pg_relation_size('t')").await.parse().unwrap();
    let table: i64 = size("SELECT pg_table_size('t'::regclass)")
        .await
        .parse()
        .unwrap();
    let total: i64 = size("SELECT pg_total_relation_size('t')")
        .await
        .parse()
        .unwrap();
    assert!(rows > 100 * 4, "{rows}");
    assert!(table > rows, "the change log counts in the table's size");
    assert_eq!(total, table);
    c.batch_execute("INSERT INTO t SELECT g, 'more' FROM generate_series(101, 200) g")
        .await
        .unwrap();
    let grown: i64 = size("SELECT pg_relation_size('t')").await.parse().unwrap();
    assert!(grown > rows, "{grown} after {rows}");
    assert_eq!(size("SELECT pg_total_relation_size('vv')").await, "0");
    assert_eq!(size("SELECT pg_total_relation_size('mv')").await, "NULL");
    assert_eq!(size("SELECT pg_indexes_size('t')").await, "0");
}

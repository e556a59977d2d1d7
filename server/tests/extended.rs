//! The extended protocol, as drivers use it: prepared statements with typed
//! parameters, binary results, errors that leave the connection usable.

mod common;

use common::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_statements_with_parameters_of_every_type() {
    let server = Server::start();
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE t (id int PRIMARY KEY, flag boolean, s smallint, big bigint, r real, d double precision,
                         n numeric(10,2), name text, day date, at timestamp, atz timestamptz, raw bytea)",
    )
    .await
    .expect("create");
    let insert = c
        .prepare("INSERT INTO t VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)")
        .await
        .expect("prepare insert");
    let day = chrono::NaiveDate::from_ymd_opt(2024, 2, 29).unwrap();
    let at = day.and_hms_micro_opt(12, 34, 56, 789_000).unwrap();
    let atz = chrono::DateTime::<chrono::Utc>::from_naive_utc_and_offset(at, chrono::Utc);
    let n: rust_decimal::Decimal = "12.34".parse().unwrap();
    for id in 1..=3i32 {
        let count = c
            .execute(
                &insert,
                &[
                    &id,
                    &(id % 2 == 0),
                    &(id as i16),
                    &(id as i64 * 1_000_000_000_000),
                    &1.5f32,
                    &2.25f64,
                    &n,
                    &format!("name '{id}'"),
                    &day,
                    &at,
                    &atz,
                    &vec![0xde_u8, 0xad, id as u8],
                ],
            )
            .await
            .expect("insert");
        assert_eq!(count, 1);
    }
    let row = c
        .query_one(
            "SELECT id, flag, s, big, r, d, n, name, day, at, atz, raw FROM t WHERE id = $1",
            &[&2i32],
        )
        .await
        .expect("select");
    assert_eq!(row.get::<_, i32>(0), 2);
    assert!(row.get::<_, bool>(1));
    assert_eq!(row.get::<_, i16>(2), 2);
    assert_eq!(row.get::<_, i64>(3), 2_000_000_000_000);
    assert_eq!(row.get::<_, f32>(4), 1.5);
    assert_eq!(row.get::<_, f64>(5), 2.25);
    assert_eq!(row.get::<_, rust_decimal::Decimal>(6), n);
    assert_eq!(row.get::<_, String>(7), "name '2'");
    assert_eq!(row.get::<_, chrono::NaiveDate>(8), day);
    assert_eq!(row.get::<_, chrono::NaiveDateTime>(9), at);
    assert_eq!(row.get::<_, chrono::DateTime<chrono::Utc>>(10), atz);
    assert_eq!(row.get::<_, Vec<u8>>(11), vec![0xde, 0xad, 2]);

    // Parameters in UPDATE and DELETE, and a view read with the extended protocol.
    c.batch_execute("CREATE MATERIALIZED VIEW flags AS SELECT flag, count(*) AS n, sum(big) AS total FROM t GROUP BY flag")
        .await
        .expect("view");
    assert_eq!(
        c.execute("UPDATE t SET name = $1 WHERE id = $2", &[&"renamed", &1i32])
            .await
            .expect("update"),
        1
    );
    assert_eq!(
        c.execute("DELETE FROM t WHERE id = $1", &[&3i32])
            .await
            .expect("delete"),
        1
    );
    c.batch_execute("FLUSH").await.expect("flush");
    let rows = c
        .query("SELECT flag, n, total FROM flags ORDER BY flag", &[])
        .await
        .expect("read view");
    let got: Vec<(bool, i64, i64)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![(false, 1, 1_000_000_000_000), (true, 1, 2_000_000_000_000)]
    );
    let name: String = c
        .query_one("SELECT name FROM t WHERE id = 1", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(name, "renamed");

    // Errors carry their SQLSTATE and the connection goes on.
    let raw = vec![1u8];
    let err = c
        .execute(
            &insert,
            &[
                &1i32, &true, &1i16, &1i64, &1f32, &1f64, &n, &"x", &day, &at, &atz, &raw,
            ],
        )
        .await
        .expect_err("duplicate key");
    assert_eq!(err.code().map(|c| c.code()), Some("23505"));
    let err = c
        .prepare("SELECT nope FROM t")
        .await
        .expect_err("undefined column");
    assert_eq!(err.code().map(|c| c.code()), Some("42703"));
    let err = c
        .query("SELECT * FROM nowhere", &[])
        .await
        .expect_err("undefined table");
    assert_eq!(err.code().map(|c| c.code()), Some("42P01"));
    let n: i64 = c
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .expect("still usable")
        .get(0);
    assert_eq!(n, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_protocol_runs_several_statements_and_stops_at_the_first_error() {
    let server = Server::start();
    let c = server.client().await;
    let err = c
        .batch_execute("CREATE TABLE a (x int); INSERT INTO a VALUES (1); SELECT * FROM missing; INSERT INTO a VALUES (2)")
        .await
        .expect_err("third statement fails");
    assert_eq!(err.code().map(|c| c.code()), Some("42P01"));
    let n: i64 = c
        .query_one("SELECT count(*) FROM a", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1, "statements after the failing one do not run");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_database_and_role_are_refused() {
    let server = Server::start();
    let url = format!("host=127.0.0.1 port={} user=weir dbname=other", server.port);
    let err = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code().map(|c| c.code()), Some("3D000"));
    let url = format!(
        "host=127.0.0.1 port={} user=someone dbname=weir",
        server.port
    );
    let err = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .err()
        .expect("refused");
    assert_eq!(err.code().map(|c| c.code()), Some("28000"));
}

//! The extended protocol, as drivers use it: prepared statements with typed
//! parameters, binary results, errors that leave the connection usable.

use crate::common;

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
    // sum(bigint) is numeric, as in Postgres.
    let got: Vec<(bool, i64, rust_decimal::Decimal)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        got,
        vec![
            (false, 1, rust_decimal::Decimal::from(1_000_000_000_000i64)),
            (true, 1, rust_decimal::Decimal::from(2_000_000_000_000i64))
        ]
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

/// An interval as the binary format carries it: (months, days, µs).
#[derive(Debug, PartialEq)]
struct Interval(i32, i32, i64);

impl<'a> tokio_postgres::types::FromSql<'a> for Interval {
    fn from_sql(
        _: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        let micros = i64::from_be_bytes(raw[0..8].try_into()?);
        let days = i32::from_be_bytes(raw[8..12].try_into()?);
        let months = i32::from_be_bytes(raw[12..16].try_into()?);
        Ok(Interval(months, days, micros))
    }

    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        *ty == tokio_postgres::types::Type::INTERVAL
    }
}

/// Results are described with the types Postgres gives them, and read the
/// same in text (simple protocol) and binary (tokio-postgres's extended
/// protocol): decimal literals are numeric, `timestamptz` and `now()` are
/// `timestamptz`, a series of integers is `integer`, an untyped value is
/// `text`; `bytea`, `interval` and array literals are read as Postgres
/// reads their text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn results_have_postgres_types_in_text_and_binary() {
    use tokio_postgres::types::Type;
    let server = Server::start();
    let c = server.client().await;
    let typed = c
        .prepare(
            "SELECT 0.1 + 0.2, now(), '2024-02-29 12:00:00+02'::timestamptz, NULL, \
             '\\xdead'::bytea, interval '1 year 2 mons 3 days 04:05:06.5', '{1,NULL,3}'::int[], \
             cast('{a,\"b c\"}' AS text[])",
        )
        .await
        .unwrap();
    let types: Vec<Type> = typed.columns().iter().map(|c| c.type_().clone()).collect();
    assert_eq!(
        types,
        vec![
            Type::NUMERIC,
            Type::TIMESTAMPTZ,
            Type::TIMESTAMPTZ,
            Type::TEXT,
            Type::BYTEA,
            Type::INTERVAL,
            Type::INT4_ARRAY,
            Type::TEXT_ARRAY
        ]
    );
    let row = c.query_one(&typed, &[]).await.unwrap();
    assert_eq!(
        row.get::<_, rust_decimal::Decimal>(0),
        "0.3".parse().unwrap()
    );
    assert_eq!(
        row.get::<_, chrono::DateTime<chrono::Utc>>(2).to_rfc3339(),
        "2024-02-29T10:00:00+00:00"
    );
    assert_eq!(row.get::<_, Option<String>>(3), None);
    assert_eq!(row.get::<_, Vec<u8>>(4), vec![0xde, 0xad]);
    assert_eq!(
        row.get::<_, Interval>(5),
        Interval(14, 3, (4 * 3600 + 5 * 60 + 6) * 1_000_000 + 500_000)
    );
    assert_eq!(
        row.get::<_, Vec<Option<i32>>>(6),
        vec![Some(1), None, Some(3)]
    );
    assert_eq!(row.get::<_, Vec<String>>(7), vec!["a", "b c"]);
    // The same in text.
    let text = common::rows(
        &c,
        "SELECT 0.1 + 0.2, '\\xdead'::bytea, interval '1 day 04:05:06', '{1,NULL,3}'::int[]",
    )
    .await;
    assert_eq!(
        text,
        vec![vec!["0.3", "\\xdead", "1 day 04:05:06", "{1,NULL,3}"]]
    );

    // Division keeps Postgres's 16 significant digits (Arrow's kernel
    // would keep the dividend's scale + 4), and numerics past rust_decimal's
    // 28 digits are written exactly in text.
    let text = common::rows(
        &c,
        "SELECT 1 / 3.0, 100000000000000000 / 3.0,          12345678901234567890123456.123456789012::numeric(38,12)",
    )
    .await;
    assert_eq!(
        text,
        vec![vec![
            "0.33333333333333333",
            "33333333333333333.33333333333333333",
            "12345678901234567890123456.123456789012"
        ]]
    );
    // interval * number, as Postgres multiplies intervals.
    assert_eq!(
        common::rows(&c, "SELECT interval '1 day' * 2, interval '1 hour' * 1.5").await,
        vec![vec!["2 days", "01:30:00"]]
    );

    // generate_series: integer for integers, bigint past them.
    let series = c
        .prepare("SELECT g FROM generate_series(1, 3) g")
        .await
        .unwrap();
    assert_eq!(series.columns()[0].type_(), &Type::INT4);
    let got: Vec<i32> = c
        .query(&series, &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, vec![1, 2, 3]);
    let big = c
        .prepare("SELECT * FROM generate_series(1, 5000000000) LIMIT 1")
        .await
        .unwrap();
    assert_eq!(big.columns()[0].type_(), &Type::INT8);
    assert_eq!(big.columns()[0].name(), "generate_series");
    let rows = c.prepare("SELECT generate_series(1, 2)").await.unwrap();
    assert_eq!(rows.columns()[0].type_(), &Type::INT4);

    // Parameters: the declared type describes the result; arrays and
    // intervals go both ways in binary.
    let echo = c
        .prepare_typed("SELECT $1, $2", &[Type::INTERVAL, Type::INT4_ARRAY])
        .await
        .unwrap();
    assert_eq!(echo.columns()[0].type_(), &Type::INTERVAL);
    assert_eq!(echo.columns()[1].type_(), &Type::INT4_ARRAY);
    let untyped = c.prepare("SELECT $1").await.unwrap();
    assert_eq!(untyped.columns()[0].type_(), &Type::TEXT);
    let arrays = c
        .query_one(
            "SELECT $1::int[], $2::text[]",
            &[&vec![Some(4i32), None], &vec!["x,y", "\"q\""]],
        )
        .await
        .unwrap();
    assert_eq!(arrays.get::<_, Vec<Option<i32>>>(0), vec![Some(4), None]);
    assert_eq!(arrays.get::<_, Vec<String>>(1), vec!["x,y", "\"q\""]);

    // Bad text of these types is 22P02, and the connection goes on.
    for bad in [
        "SELECT '\\x1'::bytea",
        "SELECT interval 'soon'",
        "SELECT '{1'::int[]",
    ] {
        let err = c.simple_query(bad).await.expect_err(bad);
        assert_eq!(err.code().map(|c| c.code()), Some("22P02"), "{bad}: {err}");
    }
    assert_eq!(common::one(&c, "SELECT 1").await, "1");
}

/// `jsonb` as drivers send and read it: a parameter typed `jsonb` in
/// binary (a version byte, then the text), results typed `jsonb` (oid 3802)
/// in binary and in text, each as Postgres writes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonb_travels_in_binary_and_text() {
    use tokio_postgres::types::{Json, Type};
    let server = Server::start();
    let c = server.client().await;
    c.batch_execute("CREATE TABLE docs (id int PRIMARY KEY, doc jsonb)")
        .await
        .unwrap();
    let insert = c
        .prepare_typed(
            "INSERT INTO docs VALUES ($1, $2)",
            &[Type::INT4, Type::JSONB],
        )
        .await
        .unwrap();
    let doc = serde_json::json!({"b": [1, 2.5], "a": {"x": null}, "s": "é\n"});
    c.execute(&insert, &[&1i32, &Json(&doc)]).await.unwrap();
    let select = c
        .prepare("SELECT doc, doc -> 'b', doc ->> 's' FROM docs WHERE id = $1")
        .await
        .unwrap();
    let types: Vec<Type> = select.columns().iter().map(|c| c.type_().clone()).collect();
    assert_eq!(types, vec![Type::JSONB, Type::JSONB, Type::TEXT]);
    let row = c.query_one(&select, &[&1i32]).await.unwrap();
    assert_eq!(row.get::<_, Json<serde_json::Value>>(0).0, doc);
    assert_eq!(
        row.get::<_, Json<serde_json::Value>>(1).0,
        serde_json::json!([1, 2.5])
    );
    assert_eq!(row.get::<_, String>(2), "é\n");
    // In text, keys in Postgres's order (shorter first), its spacing.
    let text = common::rows(&c, "SELECT doc FROM docs").await;
    assert_eq!(
        text,
        vec![vec![r#"{"a": {"x": null}, "b": [1, 2.5], "s": "é\n"}"#]]
    );
    // A scalar is a document too; text that is no JSON is refused
    // (22P02) and the session goes on.
    c.execute(&insert, &[&2i32, &Json(serde_json::json!(1))])
        .await
        .unwrap();
    let bad = c
        .execute("INSERT INTO docs VALUES (3, $1::text::jsonb)", &[&"{nope"])
        .await
        .unwrap_err();
    assert_eq!(bad.code().map(|c| c.code()), Some("22P02"), "{bad:?}");
    assert_eq!(
        common::rows(&c, "SELECT count(*) FROM docs").await,
        vec![vec!["2"]]
    );
}

//! The `file` source through pgwire: a directory of CSV files, a Parquet
//! file and a file of JSON lines read into views exactly once, across a SIGKILL after which a
//! new file is read too; batch `SELECT`s; bad lines skipped; errors. Bad
//! lines counted and kept in a dead-letter table once, however many views
//! read them and across a SIGKILL.

use crate::common;

use common::{Server, expect_error, one, rows};

/// `CREATE SOURCE {declaration}` of the file or directory `path`.
async fn file_source(
    client: &tokio_postgres::Client,
    declaration: &str,
    path: &std::path::Path,
    encode: &str,
) {
    let sql = format!(
        "CREATE SOURCE {declaration} WITH (connector = 'file', path = '{}') \
         FORMAT PLAIN ENCODE {encode}",
        path.display()
    );
    rows(client, &sql).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_read_once_and_new_files_after_a_restart() {
    let files = tempfile::tempdir().expect("temp dir");
    let dir = files.path().join("orders");
    std::fs::create_dir(&dir).expect("dir");
    let csv = |ids: std::ops::Range<i64>| {
        let mut s = String::from("id,amount\n");
        for i in ids {
            s.push_str(&format!("{i},{}\n", i % 10));
        }
        s
    };
    std::fs::write(dir.join("2026-01.csv"), csv(0..1000)).expect("write");
    std::fs::write(dir.join("2026-02.csv"), csv(1000..1500) + "oops,1\n").expect("write");
    // A Parquet file whose columns are in another order, one of them int32.
    let parquet = files.path().join("scores.parquet");
    {
        use datafusion::arrow::array::{ArrayRef, Int32Array, RecordBatch, StringArray};
        let batch = RecordBatch::try_from_iter([
            (
                "who",
                std::sync::Arc::new(StringArray::from_iter_values(
                    (0..5000).map(|i| format!("p{}", i % 7)),
                )) as ArrayRef,
            ),
            (
                "score",
                std::sync::Arc::new(Int32Array::from_iter_values(0..5000)) as _,
            ),
        ])
        .expect("batch");
        let file = std::fs::File::create(&parquet).expect("create");
        let mut w =
            parquet::arrow::ArrowWriter::try_new(file, batch.schema(), None).expect("writer");
        w.write(&batch).expect("write");
        w.close().expect("close");
    }
    let jsonl = files.path().join("people.jsonl");
    std::fs::write(
        &jsonl,
        "{\"id\": 1, \"name\": \"ann\"}\n{\"id\": 2, \"name\": \"bo\"}\n",
    )
    .expect("write");

    let mut server = Server::start();
    let client = server.client().await;
    file_source(&client, "orders (id bigint, amount int)", &dir, "CSV").await;
    file_source(&client, "people (id int, name text)", &jsonl, "JSON").await;
    file_source(
        &client,
        "scores (score bigint, who text)",
        &parquet,
        "PARQUET",
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW by_who AS SELECT who, count(*) AS n, sum(score) AS s FROM scores GROUP BY who",
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW totals AS SELECT count(*) AS n, count(DISTINCT id) AS ids, \
         sum(amount) AS amount FROM orders",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT * FROM totals").await,
        vec![vec!["1500", "1500", "6750"]]
    );
    assert_eq!(one(&client, "SELECT count(*) FROM orders").await, "1500");
    assert_eq!(
        rows(&client, "SELECT sum(n), sum(s) FROM by_who").await,
        vec![vec!["5000", "12497500"]]
    );
    assert_eq!(
        rows(
            &client,
            "SELECT count(*), max(score) FROM scores WHERE who = 'p3'"
        )
        .await,
        vec![vec!["714", "4994"]]
    );
    assert_eq!(
        rows(&client, "SELECT name FROM people ORDER BY id").await,
        vec![vec!["ann"], vec!["bo"]]
    );

    // A file that sorts after the others is read once the job restarts;
    // the others are not read again.
    std::fs::write(dir.join("2026-03.csv"), csv(1500..1600)).expect("write");
    server.crash_and_restart();
    let client = server.client().await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT n, ids FROM totals").await,
        vec![vec!["1600", "1600"]]
    );
    assert_eq!(one(&client, "SELECT sum(n) FROM by_who").await, "5000");
    assert!(server.log_text().contains("file record skipped"));

    let e = client
        .simple_query(
            "CREATE SOURCE gone (id int) WITH (connector = 'file', path = '/nonexistent/x.csv') \
             FORMAT PLAIN ENCODE CSV",
        )
        .await
        .expect_err("no such file");
    let db = e.as_db_error().expect("db error");
    assert_eq!(db.code().code(), "22023");
    assert!(
        db.message().contains("/nonexistent/x.csv does not exist"),
        "{}",
        db.message()
    );
}

/// `encode(bytes, 'hex')`.
fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_lines_are_counted_and_kept_once_in_a_dead_letter_table() {
    let files = tempfile::tempdir().expect("temp dir");
    let dir = files.path().join("people");
    std::fs::create_dir(&dir).expect("dir");
    let first = dir.join("a.jsonl");
    // Lines 2 and 4 are no JSON objects of the columns.
    std::fs::write(
        &first,
        "{\"id\": 1, \"name\": \"ann\"}\nnot json\n{\"id\": 2, \"name\": \"bo\"}\n\
         {\"id\": \"three\"}\n{\"id\": 4, \"name\": \"di\"}\n",
    )
    .expect("write");
    let mut server = Server::start();
    let client = server.client().await;
    let path = dir.display();
    rows(
        &client,
        &format!(
            "CREATE SOURCE people (id int, name text) WITH (connector = 'file', path = '{path}') \
             FORMAT PLAIN ENCODE JSON (dead_letter_table = 'people_errors')"
        ),
    )
    .await;
    // Two jobs read the source, and both skip the same two lines.
    rows(
        &client,
        "CREATE MATERIALIZED VIEW n_people AS SELECT count(*) AS n FROM people",
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW names AS SELECT id, name FROM people",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(one(&client, "SELECT n FROM n_people").await, "3");
    let dead = rows(
        &client,
        "SELECT source, position, encode(record, 'hex'), error <> '', skipped_at IS NOT NULL \
         FROM people_errors ORDER BY position",
    )
    .await;
    let a = first.display();
    assert_eq!(
        dead,
        vec![
            vec![
                "people".to_string(),
                format!("{a} byte 25"),
                hex("not json"),
                "t".into(),
                "t".into()
            ],
            vec![
                "people".to_string(),
                format!("{a} byte 58"),
                hex("{\"id\": \"three\"}"),
                "t".into(),
                "t".into()
            ],
        ]
    );
    let counts = "SELECT name, source, skipped, last_error IS NOT NULL, dead_letter_table \
                  FROM weir_catalog.source_errors ORDER BY name";
    assert_eq!(
        rows(&client, counts).await,
        vec![
            vec!["n_people", "people", "2", "t", "people_errors"],
            vec!["names", "people", "2", "t", "people_errors"],
        ]
    );

    // After a SIGKILL the jobs go on from their checkpoints: the lines
    // already skipped are neither counted nor kept again; a new file's
    // bad line is.
    std::fs::write(
        dir.join("b.jsonl"),
        "{\"id\": 5, \"name\": \"ed\"}\n{oops\n",
    )
    .expect("write");
    server.crash_and_restart();
    let client = server.client().await;
    rows(&client, "FLUSH").await;
    assert_eq!(one(&client, "SELECT n FROM n_people").await, "4");
    assert_eq!(
        one(&client, "SELECT count(*) FROM people_errors").await,
        "3"
    );
    assert_eq!(
        rows(&client, counts).await,
        vec![
            vec!["n_people", "people", "3", "t", "people_errors"],
            vec!["names", "people", "3", "t", "people_errors"],
        ]
    );
    assert_eq!(
        one(
            &client,
            "SELECT encode(record, 'hex') FROM people_errors WHERE position LIKE '%b.jsonl%'"
        )
        .await,
        hex("{oops")
    );
    // It is a table like any other: the fixed records can go.
    rows(
        &client,
        "DELETE FROM people_errors WHERE position LIKE '%a.jsonl%'",
    )
    .await;
    assert_eq!(
        one(&client, "SELECT count(*) FROM people_errors").await,
        "1"
    );

    // The source depends on its dead-letter table.
    expect_error(
        &client,
        "DROP TABLE people_errors",
        "2BP01",
        "source people",
    )
    .await;
    // Keeping records and failing on the first one contradict each other.
    let source = |name: &str, encode: &str| {
        format!(
            "CREATE SOURCE {name} (id int) WITH (connector = 'file', path = '{path}') \
             FORMAT PLAIN ENCODE {encode}"
        )
    };
    expect_error(
        &client,
        &source(
            "p2",
            "JSON (dead_letter_table = 'e2', ignore_parse_errors = 'false')",
        ),
        "22023",
        "choose one",
    )
    .await;
    // An existing table must have the dead-letter columns; a view is none.
    rows(&client, "CREATE TABLE other (id int)").await;
    expect_error(
        &client,
        &source("p3", "JSON (dead_letter_table = 'other')"),
        "42P16",
        "a dead-letter table has the columns (source text, position text",
    )
    .await;
    expect_error(
        &client,
        &source("p4", "JSON (dead_letter_table = 'names')"),
        "42809",
        "\"names\" is a materialized view",
    )
    .await;
    expect_error(
        &client,
        &source("p5", "JSON (dead_letter_table = 'p5')"),
        "42P07",
        "\"p5\" already exists",
    )
    .await;
    expect_error(
        &client,
        "CREATE SOURCE g (id int) WITH (connector = 'datagen') \
         FORMAT PLAIN ENCODE JSON (dead_letter_table = 'e3')",
        "22023",
        "decodes no records",
    )
    .await;
    // None of the refused statements left a table behind.
    for t in ["e2", "e3", "p3"] {
        expect_error(&client, &format!("SELECT * FROM {t}"), "42P01", t).await;
    }
    // A second source may share the table: its records are its own.
    rows(
        &client,
        &source("p6", "JSON (dead_letter_table = 'people_errors')"),
    )
    .await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW n6 AS SELECT count(*) FROM p6",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(
            &client,
            "SELECT source, count(*) FROM people_errors GROUP BY source ORDER BY source"
        )
        .await,
        vec![vec!["p6", "3"], vec!["people", "1"]]
    );
    // DROP … CASCADE takes the sources and their views with the table.
    rows(&client, "DROP TABLE people_errors CASCADE").await;
    expect_error(&client, "SELECT * FROM n_people", "42P01", "n_people").await;
}

/// A `jsonb` column of a JSON file takes whatever JSON the field holds
/// (object, array, scalar), as its document; views read it with `->>` and
/// aggregate it. Hand-checked: Postgres prints these values so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jsonb_columns_of_json_files_hold_documents() {
    let files = tempfile::tempdir().expect("temp dir");
    let path = files.path().join("events.jsonl");
    std::fs::write(
        &path,
        "{\"id\": 1, \"payload\": {\"kind\": \"click\", \"v\": 1.50, \"at\": [1, 2]}}\n\
         {\"id\": 2, \"payload\": {\"kind\": \"view\", \"v\": 2}}\n\
         {\"id\": 3, \"payload\": {\"v\": 3e1, \"kind\": \"click\"}}\n\
         {\"id\": 4, \"payload\": \"scalar\"}\n\
         {\"id\": 5}\n",
    )
    .expect("write");
    let server = Server::start();
    let client = server.client().await;
    file_source(&client, "events (id int, payload jsonb)", &path, "JSON").await;
    rows(
        &client,
        "CREATE MATERIALIZED VIEW kinds AS SELECT payload->>'kind' AS kind, count(*) AS n, \
         jsonb_agg(payload->'v' ORDER BY id) AS vs FROM events GROUP BY payload->>'kind'",
    )
    .await;
    rows(&client, "FLUSH").await;
    assert_eq!(
        rows(&client, "SELECT * FROM kinds ORDER BY kind").await,
        vec![
            vec!["click", "2", "[1.50, 30]"],
            vec!["view", "1", "[2]"],
            vec!["NULL", "2", "[null, null]"],
        ]
    );
    assert_eq!(
        rows(
            &client,
            "SELECT payload FROM events WHERE id IN (1, 4) ORDER BY id"
        )
        .await,
        vec![
            vec![r#"{"v": 1.50, "at": [1, 2], "kind": "click"}"#],
            vec![r#""scalar""#],
        ]
    );
}

//! The `file` source through pgwire: a directory of CSV files, a Parquet
//! file and a file of JSON lines read into views exactly once, across a SIGKILL after which a
//! new file is read too; batch `SELECT`s; bad lines skipped; errors.

mod common;

use common::{Server, one, rows};

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

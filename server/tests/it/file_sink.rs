//! The `file` sink through pgwire: a sink's rows appear in its directory
//! only as checkpoints complete, and exactly once across a SIGKILL and a
//! rescale in the middle of the stream. The files are read back with the file source,
//! which skips the sink's hidden staging files.

use crate::common;

use std::time::{Duration, Instant};

use common::{Server, one, rows};

const ROWS: i64 = 12_000;

/// `SELECT count(*), count(DISTINCT id)` over what the sink in `dir` has
/// committed, read through a file source declared over it.
async fn committed(client: &tokio_postgres::Client, source: &str) -> (i64, i64) {
    let got = rows(
        client,
        &format!("SELECT count(*), count(DISTINCT id) FROM {source}"),
    )
    .await;
    (got[0][0].parse().unwrap(), got[0][1].parse().unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sink_files_hold_every_row_once_across_a_crash() {
    let out = tempfile::tempdir().expect("temp dir");
    let (csv, json, parquet) = (
        out.path().join("csv"),
        out.path().join("json"),
        out.path().join("parquet"),
    );
    let mut server = Server::start();
    let client = server.client().await;
    for sql in [
        "SET streaming_parallelism = 2",
        // 12,000 rows at 3,000 a second: the crash comes mid-stream.
        &format!(
            "CREATE SOURCE gen (id bigint, grp int, name varchar) WITH (
               connector = 'datagen', datagen.split.num = '4',
               datagen.rows.per.second = '3000',
               fields.id.kind = 'sequence', fields.id.start = '1', fields.id.end = '{ROWS}',
               fields.grp.min = '0', fields.grp.max = '3', fields.name.length = '5')"
        ),
        &format!(
            "CREATE SINK to_csv FROM gen WITH (connector = 'file', path = '{}') \
             FORMAT PLAIN ENCODE CSV",
            csv.display()
        ),
        &format!(
            "CREATE SINK to_json AS SELECT id, grp FROM gen WHERE grp = 1 \
             WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE JSON",
            json.display()
        ),
        &format!(
            "CREATE SINK to_parquet AS SELECT id, name FROM gen WHERE grp = 2 \
             WITH (connector = 'file', path = '{}') FORMAT PLAIN ENCODE PARQUET",
            parquet.display()
        ),
    ] {
        rows(&client, sql).await;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    // Only committed part files are visible; the rest is hidden staging.
    let names: Vec<String> = std::fs::read_dir(&csv)
        .expect("sink directory")
        .map(|e| e.expect("entry").file_name().to_string_lossy().to_string())
        .collect();
    assert!(names.iter().any(|n| n == ".weir-staging"), "{names:?}");
    assert!(
        names
            .iter()
            .filter(|n| !n.starts_with('.'))
            .all(|n| n.starts_with("part-") && n.ends_with(".csv")),
        "{names:?}"
    );
    drop(client);
    server.crash_and_restart();
    let client = server.client().await;
    for (source, dir, columns, encode) in [
        ("back_csv", &csv, "id bigint, grp int, name varchar", "CSV"),
        ("back_json", &json, "id bigint, grp int", "JSON"),
        (
            "back_parquet",
            &parquet,
            "id bigint, name varchar",
            "PARQUET",
        ),
    ] {
        rows(
            &client,
            &format!(
                "CREATE SOURCE {source} ({columns}) WITH (connector = 'file', path = '{}') \
                 FORMAT PLAIN ENCODE {encode}",
                dir.display()
            ),
        )
        .await;
    }
    // A rescale mid-stream: the old subtasks' prepared files are committed
    // by the new ones, and nothing is lost or written twice.
    rows(&client, "ALTER SINK to_csv SET PARALLELISM = 3").await;
    rows(&client, "ALTER SINK to_json SET PARALLELISM = 1").await;
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (n, distinct) = committed(&client, "back_csv").await;
        assert_eq!(n, distinct, "a row was written twice");
        if n == ROWS {
            break;
        }
        assert!(Instant::now() < deadline, "only {n} of {ROWS} rows arrived");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    rows(&client, "FLUSH").await;
    // The other sinks hold exactly their rows of the same stream.
    let expected =
        |grp: i32| format!("SELECT count(*), count(DISTINCT id) FROM back_csv WHERE grp = {grp}");
    for (source, grp) in [("back_json", 1), ("back_parquet", 2)] {
        let want = rows(&client, &expected(grp)).await;
        let (n, distinct) = committed(&client, source).await;
        assert_eq!(
            vec![n.to_string(), distinct.to_string()],
            want[0],
            "{source}"
        );
    }
    assert_eq!(
        one(
            &client,
            "SELECT count(*) FROM back_parquet p JOIN back_csv c ON p.id = c.id AND p.name = c.name"
        )
        .await,
        one(&client, "SELECT count(*) FROM back_parquet").await
    );
    // Dropping a sink stops its job: nothing more is written.
    rows(&client, "DROP SINK to_csv").await;
    let files = std::fs::read_dir(&csv).expect("dir").count();
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(std::fs::read_dir(&csv).expect("dir").count(), files);
}

//! Table change logs are trimmed once every job reading them has
//! checkpointed past an entry, and never before: before the oldest
//! checkpoint a job retains, as a restore may go back that far (here one is
//! retained, so the oldest is the latest).

use std::sync::Arc;

use cluster::ClusterConfig;
use server::Database;
use server::catalog::Entry;
use server::engine::session::Session;

async fn sql(db: &Arc<Database>, session: &mut Session, text: &str) {
    for s in server::sql::stmt::parse(text).expect("parse") {
        db.execute(session, s)
            .await
            .unwrap_or_else(|e| panic!("{text}: {e}"));
    }
}

fn table_id(db: &Database, name: &str) -> u64 {
    match db
        .catalog
        .by_name(&server::sql::stmt::QualifiedName::public(name))
    {
        Some(Entry::Table { id, .. }) => id,
        _ => panic!("no table {name}"),
    }
}

fn log_len(db: &Database, table: u64) -> usize {
    db.cluster
        .tables
        .read_log(table, 0, usize::MAX)
        .expect("log")
        .len()
}

fn one_retained() -> ClusterConfig {
    ClusterConfig {
        checkpoints_retained: 1,
        ..ClusterConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_are_trimmed_behind_every_reader() {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(dir.path(), one_retained())
        .await
        .expect("open");
    let mut session = Session::new(2);
    sql(
        &db,
        &mut session,
        "CREATE TABLE t (k int, v int); CREATE TABLE unread (x int)",
    )
    .await;
    let t = table_id(&db, "t");
    let unread = table_id(&db, "unread");
    for i in 0..5 {
        sql(
            &db,
            &mut session,
            &format!("INSERT INTO t VALUES ({i}, {i}); INSERT INTO unread VALUES ({i})"),
        )
        .await;
    }
    assert_eq!(log_len(&db, t), 5);
    // No view reads either table: their logs can go entirely.
    db.truncate_logs().await.expect("truncate");
    assert_eq!(log_len(&db, t), 0);
    assert_eq!(log_len(&db, unread), 0);

    sql(
        &db,
        &mut session,
        "CREATE MATERIALIZED VIEW s AS SELECT k % 2 AS odd, sum(v) AS total FROM t GROUP BY k % 2",
    )
    .await;
    sql(
        &db,
        &mut session,
        "INSERT INTO t VALUES (10, 10); INSERT INTO t VALUES (11, 11); FLUSH",
    )
    .await;
    sql(&db, &mut session, "INSERT INTO t VALUES (12, 12)").await;
    // The view has checkpointed past the first two entries, not the third.
    db.truncate_logs().await.expect("truncate");
    assert!(
        log_len(&db, t) <= 1,
        "entries the view has committed are gone"
    );
    sql(&db, &mut session, "FLUSH").await;
    db.shutdown().await;
    drop(db);

    // After a restart the view still equals its query, and keeps following.
    // Background tasks of the first instance let go of RocksDB within moments.
    let mut attempts = 0;
    let db = loop {
        match Database::open(dir.path(), one_retained()).await {
            Ok(db) => break db,
            Err(e) if attempts < 50 => {
                attempts += 1;
                tracing_free_sleep(e.to_string()).await;
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };
    sql(&db, &mut session, "INSERT INTO t VALUES (13, 13); FLUSH").await;
    db.truncate_logs().await.expect("truncate");
    let view = server::query_rows(&db, "SELECT odd, total FROM s ORDER BY odd").await;
    let query =
        server::query_rows(&db, "SELECT k % 2, sum(v) FROM t GROUP BY k % 2 ORDER BY 1").await;
    assert_eq!(view, query);
    assert_eq!(
        view,
        vec![
            vec!["0".to_string(), "28".to_string()],
            vec!["1".to_string(), "28".to_string()]
        ]
    );
    db.shutdown().await;
}

async fn tracing_free_sleep(_why: String) {
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
}

/// A savepoint may take a view back to where it was: the log behind it
/// stays until the savepoint is dropped, and restoring from it replays
/// every change since.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn savepoints_hold_the_log_they_may_replay() {
    let dir = tempfile::tempdir().expect("dir");
    let db = Database::open(dir.path(), one_retained())
        .await
        .expect("open");
    let mut session = Session::new(2);
    sql(
        &db,
        &mut session,
        "CREATE TABLE t (k int, v int);
         CREATE MATERIALIZED VIEW s AS SELECT k % 2 AS odd, sum(v) AS total FROM t GROUP BY k % 2;
         INSERT INTO t VALUES (1, 1); INSERT INTO t VALUES (2, 2); FLUSH;
         CREATE SAVEPOINT sp FOR MATERIALIZED VIEW s",
    )
    .await;
    let t = table_id(&db, "t");
    for i in 3..8 {
        sql(
            &db,
            &mut session,
            &format!("INSERT INTO t VALUES ({i}, {i})"),
        )
        .await;
    }
    sql(&db, &mut session, "FLUSH; CHECKPOINT").await;
    db.truncate_logs().await.expect("truncate");
    assert!(
        log_len(&db, t) >= 5,
        "the five inserts after the savepoint are kept: {}",
        log_len(&db, t)
    );
    sql(
        &db,
        &mut session,
        "RESTORE MATERIALIZED VIEW s FROM SAVEPOINT sp; FLUSH",
    )
    .await;
    let view = server::query_rows(&db, "SELECT odd, total FROM s ORDER BY odd").await;
    let query =
        server::query_rows(&db, "SELECT k % 2, sum(v) FROM t GROUP BY k % 2 ORDER BY 1").await;
    assert_eq!(view, query);
    // Dropped, it holds nothing back.
    sql(&db, &mut session, "DROP SAVEPOINT sp; CHECKPOINT").await;
    db.truncate_logs().await.expect("truncate");
    assert!(log_len(&db, t) <= 1, "{}", log_len(&db, t));
    db.shutdown().await;
}

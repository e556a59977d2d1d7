//! Checkpoint storage, in a local directory and in an S3-compatible object
//! store: retention with shared SST files counted and deleted, and damaged
//! checkpoints detected by their checksums and skipped in favour of the
//! previous retained one.

use crate::common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::s3::S3Server;
use common::{Server, rows};

/// A server that checkpoints only when told (the interval is a minute),
/// and where its checkpoints are on disk.
struct Fixture {
    server: Server,
    root: PathBuf,
    _s3: Option<S3Server>,
}

const QUIET: [&str; 2] = ["--checkpoint-interval-ms", "60000"];

impl Fixture {
    /// Checkpoints in the data directory (the default).
    fn local() -> Self {
        let server = Server::start_with(&QUIET);
        let root = server.data_dir().join("data/checkpoints");
        Self {
            server,
            root,
            _s3: None,
        }
    }

    /// Checkpoints in an S3 bucket, under a prefix, through `s3s-fs`.
    fn s3() -> Self {
        let s3 = S3Server::start("weir");
        let mut args = QUIET.to_vec();
        args.extend(["--checkpoint-dir", "s3://weir/cluster-1/checkpoints"]);
        let server = Server::start_with_env(&args, &s3.env());
        Self {
            server,
            root: s3.dir("weir/cluster-1/checkpoints"),
            _s3: Some(s3),
        }
    }
}

/// `chk-<n>` directories with metadata under the only job's storage.
fn completed(storage: &Path) -> Vec<(u64, PathBuf)> {
    let mut out = Vec::new();
    for job in std::fs::read_dir(storage).expect("storage dir").flatten() {
        for chk in std::fs::read_dir(job.path()).expect("job dir").flatten() {
            let name = chk.file_name().to_string_lossy().into_owned();
            if let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok())
                && chk.path().join("_metadata").exists()
            {
                out.push((id, chk.path()));
            }
        }
    }
    out.sort();
    out
}

fn shared_files(storage: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for job in std::fs::read_dir(storage).expect("storage dir").flatten() {
        if let Ok(files) = std::fs::read_dir(job.path().join("shared")) {
            out.extend(files.flatten().map(|f| f.path()));
        }
    }
    out
}

/// Every file a checkpoint directory holds besides its metadata.
fn private_files(chk: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in std::fs::read_dir(chk).expect("chk dir").flatten() {
        if sub.path().is_dir() {
            out.extend(
                std::fs::read_dir(sub.path())
                    .expect("dir")
                    .flatten()
                    .map(|f| f.path()),
            );
        }
    }
    out.sort();
    out
}

async fn setup(server: &Server) -> tokio_postgres::Client {
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE t (k int, v int);
         CREATE MATERIALIZED VIEW sums AS SELECT k, sum(v) AS s, count(*) AS n FROM t GROUP BY k;",
    )
    .await
    .expect("schema");
    c
}

async fn same_as_query(c: &tokio_postgres::Client) {
    c.simple_query("FLUSH").await.expect("flush");
    let mut view = rows(c, "SELECT * FROM sums").await;
    let mut query = rows(c, "SELECT k, sum(v), count(*) FROM t GROUP BY k").await;
    view.sort();
    query.sort();
    assert_eq!(view, query);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retains_three_checkpoints_and_deletes_unshared_files() {
    retains_three_checkpoints(Fixture::local()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_retains_three_checkpoints_and_deletes_unshared_files() {
    retains_three_checkpoints(Fixture::s3()).await;
}

async fn retains_three_checkpoints(f: Fixture) {
    let storage = f.root.clone();
    let c = setup(&f.server).await;
    for round in 0..6 {
        c.simple_query(&format!(
            "INSERT INTO t SELECT x % 7, x + {round} FROM generate_series(1, 300) AS g(x)"
        ))
        .await
        .expect("insert");
        c.simple_query("CHECKPOINT").await.expect("checkpoint");
    }
    // Subsumed checkpoints are deleted just after the next one completes.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let kept = loop {
        let kept = completed(&storage);
        if kept.len() == 3 || std::time::Instant::now() > deadline {
            break kept;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(kept.len(), 3, "retained: {kept:?}");
    // Every shared file on disk is one a retained checkpoint names, and
    // every one they name is there.
    let mut named = std::collections::HashSet::new();
    for (_, chk) in &kept {
        let meta = std::fs::read_to_string(chk.join("_metadata")).expect("metadata");
        let body = &meta[meta.find('\n').expect("header") + 1..];
        let json: serde_json::Value = serde_json::from_str(body).expect("json");
        for h in json["handles"].as_array().expect("handles") {
            for f in h["files"].as_array().expect("files") {
                if f["shared"].as_bool() == Some(true) {
                    named.insert(f["path"].as_str().expect("path").to_string());
                }
            }
        }
    }
    let on_disk: std::collections::HashSet<String> = shared_files(&storage)
        .iter()
        .map(|p| {
            p.strip_prefix(&storage)
                .expect("under storage")
                .display()
                .to_string()
        })
        .collect();
    assert_eq!(on_disk, named);
    same_as_query(&c).await;
}

/// Damages the newest checkpoint's files with `damage`, restarts, and
/// checks the server restored from the one before.
async fn falls_back_when(f: Fixture, damage: fn(&Path)) {
    let Fixture {
        mut server,
        root: storage,
        _s3,
    } = f;
    let c = setup(&server).await;
    for round in 0..3 {
        c.simple_query(&format!(
            "INSERT INTO t SELECT x % 5, x * {round} FROM generate_series(1, 200) AS g(x)"
        ))
        .await
        .expect("insert");
        c.simple_query("CHECKPOINT").await.expect("checkpoint");
    }
    drop(c);
    let kept = completed(&storage);
    let (newest, dir) = kept.last().cloned().expect("a checkpoint");
    server.kill9();
    let files = private_files(&dir);
    assert!(!files.is_empty(), "no files in {}", dir.display());
    for f in &files {
        damage(f);
    }
    server.crash_and_restart();
    let c = server.client().await;
    // The views recover from the previous checkpoint and replay the log.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let history = rows(
            &c,
            &format!("SELECT state, cause FROM weir_catalog.checkpoints WHERE id = {newest}"),
        )
        .await;
        if let Some(row) = history.first()
            && row[0] == "FAILED"
        {
            assert!(row[1].starts_with("corrupt"), "cause: {}", row[1]);
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "checkpoint {newest} never shown as corrupt: {history:?}\n{}",
            server.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    same_as_query(&c).await;
    assert!(
        server.log_text().contains("checkpoint is damaged"),
        "log does not say so"
    );
    assert!(dir.join("_metadata.corrupt").exists());
    // And it goes on checkpointing.
    c.simple_query("INSERT INTO t VALUES (1, 1)")
        .await
        .expect("insert");
    c.simple_query("CHECKPOINT").await.expect("checkpoint");
    same_as_query(&c).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bit_flip_falls_back_to_the_previous_checkpoint() {
    falls_back_when(Fixture::local(), flip_a_bit).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_a_bit_flip_falls_back_to_the_previous_checkpoint() {
    falls_back_when(Fixture::s3(), flip_a_bit).await;
}

fn flip_a_bit(f: &Path) {
    let mut bytes = std::fs::read(f).expect("read");
    if bytes.is_empty() {
        return;
    }
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x10;
    std::fs::write(f, bytes).expect("write");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_truncated_file_falls_back_to_the_previous_checkpoint() {
    falls_back_when(Fixture::local(), |f| {
        let bytes = std::fs::read(f).expect("read");
        std::fs::write(f, &bytes[..bytes.len() / 2]).expect("write");
    })
    .await;
}

/// A state file larger than the pieces files move in goes to S3 as a
/// multipart upload and comes back whole: the view restores from it after
/// a kill -9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s3_state_files_larger_than_a_piece_go_in_parts() {
    let s3 = S3Server::start("weir");
    let mut args = QUIET.to_vec();
    // Room for the whole state in one memtable, so one SST holds it.
    args.extend([
        "--checkpoint-dir",
        "s3://weir/cluster-1/checkpoints",
        "--managed-memory-mb",
        "1024",
    ]);
    let mut server = Server::start_with_env(&args, &s3.env());
    let storage = s3.dir("weir/cluster-1/checkpoints");
    let c = server.client().await;
    c.batch_execute(
        "CREATE TABLE w (k int, v text);
         CREATE MATERIALIZED VIEW wide AS SELECT k, max(v) AS v, count(*) AS n FROM w GROUP BY k;
         INSERT INTO w SELECT x, md5(x::text) || md5((x + 1)::text) || md5((x + 2)::text) \
         || md5((x + 3)::text) FROM generate_series(1, 300000) AS g(x);
         CHECKPOINT;",
    )
    .await
    .expect("a wide view, checkpointed");
    let piece = storage::checkpoint_storage::PIECE as u64;
    let largest = shared_files(&storage)
        .iter()
        .map(|f| std::fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .max()
        .unwrap_or(0);
    assert!(
        largest > piece,
        "no state file is larger than a piece ({piece} bytes): the largest has {largest}"
    );
    drop(c);
    server.crash_and_restart();
    let c = server.client().await;
    let query = "SELECT count(*), sum(n), min(v), max(v), sum(length(v)) FROM wide";
    let expected = "SELECT count(DISTINCT k), count(*), min(v), max(v), sum(length(v)) FROM w";
    assert_eq!(rows(&c, query).await, rows(&c, expected).await);
    drop(s3);
}

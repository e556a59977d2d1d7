//! A full disk: writes fail with SQLSTATE 53100 and the server stays up;
//! nothing acknowledged is lost, and once space is free again writes and
//! views carry on. The data directory is a small tmpfs mounted by the test
//! (it runs as root, as the test script does).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Server, rows};

/// A tmpfs mounted for the test's lifetime.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).expect("mount point");
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "could not mount a tmpfs at {} (the test needs root)",
            dir.display()
        );
        Tmpfs(dir.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// Fills the file system holding `path` with a filler file; returns it.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut f = std::fs::File::create(&filler).expect("filler");
    let chunk = vec![0u8; 64 << 10];
    while f.write_all(&chunk).and_then(|_| f.sync_data()).is_ok() {}
    let small = vec![0u8; 512];
    while f.write_all(&small).and_then(|_| f.sync_data()).is_ok() {}
    filler
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_writes_with_53100_until_space_is_free() {
    let outer = tempfile::tempdir().expect("dir");
    let mnt = outer.path().join("mnt");
    let _tmpfs = Tmpfs::mount(&mnt, "96m");
    let server = Server::start_in(&mnt.join("data"), &["--checkpoint-interval-ms", "200"]);
    let client = server.client().await;
    client
        .batch_execute(
            "CREATE TABLE t (k int, v text);
             CREATE MATERIALIZED VIEW sizes AS SELECT k % 3 AS g, count(*) AS n, sum(length(v)) AS len FROM t GROUP BY k % 3;
             INSERT INTO t VALUES (1, 'a'), (2, 'bb'), (3, 'ccc');",
        )
        .await
        .expect("schema");
    let filler = fill(&mnt);
    let mut acknowledged = 3;
    let mut code = None;
    for k in 0..200 {
        let sql = format!("INSERT INTO t VALUES ({}, repeat('x', 200000))", 10 + k);
        match client.simple_query(&sql).await {
            Ok(_) => acknowledged += 1,
            Err(e) => {
                code = e.code().map(|c| c.code().to_string());
                println!("after {acknowledged} rows: {e:?}");
                break;
            }
        }
    }
    assert_eq!(code.as_deref(), Some("53100"), "a write on a full disk");
    // The server is up and answers reads.
    let n = rows(&client, "SELECT count(*) FROM t").await;
    assert_eq!(n[0][0], acknowledged.to_string());
    // Checkpoints go on trying meanwhile; those whose snapshots cannot be
    // written fail without failing the job over again and again.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let failed = rows(
        &client,
        "SELECT count(*) FROM weir_catalog.checkpoints WHERE state = 'FAILED'",
    )
    .await;
    println!(
        "checkpoints failed while the disk was full: {}",
        failed[0][0]
    );
    std::fs::remove_file(&filler).expect("free space");
    // Writes work again, soon.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client
            .simple_query("INSERT INTO t VALUES (1000, 'back')")
            .await
        {
            Ok(_) => break,
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "writes did not resume after space was freed: {e}\n{}",
                    server.log_text()
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    client.simple_query("FLUSH").await.expect("flush");
    let mut view = rows(&client, "SELECT * FROM sizes").await;
    let mut query = rows(
        &client,
        "SELECT k % 3, count(*), sum(length(v)) FROM t GROUP BY k % 3",
    )
    .await;
    view.sort();
    query.sort();
    assert_eq!(view, query);
    // The full disk did not use up the job's restarts.
    let jobs = rows(&client, "SELECT state, restarts FROM weir_catalog.jobs").await;
    assert_eq!(jobs, vec![vec!["RUNNING".to_string(), "0".to_string()]]);
    assert_eq!(
        rows(&client, "SELECT count(*) FROM t").await[0][0],
        (acknowledged + 1).to_string()
    );
}

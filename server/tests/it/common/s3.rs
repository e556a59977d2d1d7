//! A real S3-compatible object store for tests: `s3s-fs` (from crates.io;
//! `scripts/test` installs it), which keeps each object as a file under its
//! root, one directory per bucket. Tests can therefore look at, and damage,
//! exactly what Weir wrote through the S3 API.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use super::{free_port, wait_for_port};

const ACCESS_KEY: &str = "weir-test";
const SECRET_KEY: &str = "weir-test-secret";

pub struct S3Server {
    child: Child,
    pub port: u16,
    root: tempfile::TempDir,
}

impl S3Server {
    /// Starts a server with one empty bucket, `bucket`.
    pub fn start(bucket: &str) -> Self {
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::create_dir(root.path().join(bucket)).expect("bucket dir");
        let port = free_port();
        let log = root.path().join("s3s-fs.log");
        let child = Command::new(binary())
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY])
            .arg(root.path())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start s3s-fs");
        wait_for_port(port, "s3s-fs", &log);
        Self { child, port, root }
    }

    /// The environment a Weir process needs to reach it.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            ("AWS_ENDPOINT", format!("http://127.0.0.1:{}", self.port)),
            ("AWS_ALLOW_HTTP", "true".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_KEY.into()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    /// Where the objects under `bucket/prefix` are on disk.
    pub fn dir(&self, bucket_and_prefix: &str) -> PathBuf {
        self.root.path().join(bucket_and_prefix)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `s3s-fs` on the PATH or in cargo's bin directory.
fn binary() -> PathBuf {
    super::installed("s3s-fs", "scripts/test installs it (cargo install s3s-fs)")
}

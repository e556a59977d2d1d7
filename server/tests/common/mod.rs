//! A real `weir playground` process for end-to-end tests, reached over
//! pgwire with tokio-postgres.

#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server on its own port and data directory.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    log: PathBuf,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Server {
    pub fn start() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("weir.log");
        let mut s = Server {
            child: None,
            port: free_port(),
            dir,
            log,
        };
        s.spawn();
        s
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("log file");
        let child = Command::new(env!("CARGO_BIN_EXE_weir"))
            .args([
                "playground",
                "--listen",
                &format!("127.0.0.1:{}", self.port),
                "--data-dir",
            ])
            .arg(self.dir.path().join("data"))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start weir");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                panic!("weir did not start:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the process with SIGKILL (no shutdown at all).
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGKILL, then start again on the same data directory and port.
    pub fn crash_and_restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    pub fn url(&self) -> String {
        format!("host=127.0.0.1 port={} user=weir dbname=weir", self.port)
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        let (client, conn) = tokio_postgres::connect(&self.url(), tokio_postgres::NoTls)
            .await
            .expect("connect");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Simple-protocol query, every value as text (NULL as "NULL").
pub async fn rows(client: &tokio_postgres::Client, sql: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    for m in client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
    {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            out.push(
                (0..r.len())
                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                    .collect(),
            );
        }
    }
    out
}

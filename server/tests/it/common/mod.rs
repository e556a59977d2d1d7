//! A real `weir playground` process for end-to-end tests, reached over
//! pgwire with tokio-postgres.

#![allow(dead_code, unreachable_pub)]

pub mod kafka;
pub mod postgres;
pub mod s3;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running server on its own port and data directory.
pub struct Server {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
    /// Where the data directory is (under `dir` unless given).
    data: PathBuf,
    log: PathBuf,
    /// Extra command-line arguments of `weir playground`.
    args: Vec<String>,
    /// Extra environment variables of the process.
    env: Vec<(String, String)>,
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Server {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// A playground with extra arguments (for example cluster settings).
    pub fn start_with(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        Self::start_at(dir, data, args, &[])
    }

    /// A playground whose data directory is `data` (for example on a
    /// small file system).
    pub fn start_in(data: &Path, args: &[&str]) -> Self {
        Self::start_at(
            tempfile::tempdir().expect("temp dir"),
            data.to_path_buf(),
            args,
            &[],
        )
    }

    fn start_at(
        dir: tempfile::TempDir,
        data: PathBuf,
        args: &[&str],
        env: &[(String, String)],
    ) -> Self {
        let log = dir.path().join("weir.log");
        let mut s = Server {
            child: None,
            port: free_port(),
            dir,
            data,
            log,
            args: args.iter().map(|a| a.to_string()).collect(),
            env: env.to_vec(),
        };
        s.spawn();
        s
    }

    /// A playground with extra arguments and environment variables.
    pub fn start_with_env(args: &[&str], env: &[(String, String)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let data = dir.path().join("data");
        Self::start_at(dir, data, args, env)
    }

    pub fn data_dir(&self) -> &Path {
        self.dir.path()
    }

    fn spawn(&mut self) {
        let mut args = vec![
            "playground".to_string(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.port),
            "--data-dir".into(),
            self.data.display().to_string(),
        ];
        args.extend(self.args.iter().cloned());
        self.child = Some(spawn_weir_with(&args, &self.env, &self.log));
        wait_for_port(self.port, "weir", &self.log);
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last `n` lines of the server's log, to print with a failure.
    pub fn log_tail(&self, n: usize) -> String {
        let log = self.log_text();
        let tail: Vec<&str> = log.lines().rev().take(n).collect();
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(|c| c.id())
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
        format!(
            "host=127.0.0.1 port={} user=weir dbname=weir password={PASSWORD}",
            self.port
        )
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
        .unwrap_or_else(|e| panic!("{sql}: {e}: {:?}", e.as_db_error()))
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

/// The SQLSTATE and message of the error `sql` must fail with.
pub async fn error_of(client: &tokio_postgres::Client, sql: &str) -> (String, String) {
    let e = client.simple_query(sql).await.expect_err(sql);
    let db = e.as_db_error().unwrap_or_else(|| panic!("{sql}: {e}"));
    (db.code().code().to_string(), db.message().to_string())
}

/// `sql` fails with SQLSTATE `code` and a message containing `fragment`.
pub async fn expect_error(client: &tokio_postgres::Client, sql: &str, code: &str, fragment: &str) {
    let (got, message) = error_of(client, sql).await;
    assert_eq!(got, code, "{sql}: {message}");
    assert!(message.contains(fragment), "{sql}: {message}");
}

/// The first value of the first row of `sql`'s answer.
pub async fn one(client: &tokio_postgres::Client, sql: &str) -> String {
    rows(client, sql).await.remove(0).remove(0)
}

/// Starts `weir` with `args`, appending its log to `log`.
pub fn spawn_weir(args: &[String], log: &Path) -> Child {
    spawn_weir_with(args, &[], log)
}

/// The superuser's password of every server the tests start (which only
/// a server that asks for passwords, a JobManager by default, asks for).
pub const PASSWORD: &str = "weir-test-password";

/// Starts `weir` with `args` and extra environment variables.
pub fn spawn_weir_with(args: &[String], env: &[(String, String)], log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .expect("log file");
    Command::new(env!("CARGO_BIN_EXE_weir"))
        .args(args)
        .env("RUST_LOG", "info")
        .env("WEIR_PASSWORD", PASSWORD)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start weir")
}

/// A program on the PATH or in cargo's bin directory (where `scripts/test`
/// installs the services it builds from crates.io); `hint` says how to get
/// it when it is neither.
pub fn installed(program: &str, hint: &str) -> PathBuf {
    let cargo_bin = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .map(|h| h.join("bin").join(program));
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(program))
        .chain(cargo_bin)
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{program} is not installed: {hint}"))
}

/// Waits until something listens on `port`.
pub fn wait_for_port(port: u16, what: &str, log: &Path) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > deadline {
            panic!(
                "{what} did not start:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Connects to a server on `port`.
pub async fn connect(port: u16) -> tokio_postgres::Client {
    let url = format!("host=127.0.0.1 port={port} user=weir dbname=weir password={PASSWORD}");
    let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .expect("connect");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    client
}

/// Money moves between accounts in single UPDATEs while a reader sums a
/// view spread over four subtasks: every read sees whole statements only
/// (the server on `port` must have at least four slots).
pub async fn transfers_never_show_half_done(port: u16) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let c = connect(port).await;
    c.batch_execute(
        "CREATE TABLE accounts (id int PRIMARY KEY, balance bigint);
         INSERT INTO accounts SELECT v, 100 FROM generate_series(1, 40) AS s(v);
         SET streaming_parallelism = 4;
         CREATE MATERIALIZED VIEW balances AS SELECT id % 8 AS bucket, sum(balance) AS total FROM accounts GROUP BY id % 8;",
    )
    .await
    .expect("setup");
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let stop = stop.clone();
        let client = connect(port).await;
        tokio::spawn(async move {
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                // Each statement moves money between two accounts that land
                // in different buckets (and so, likely, different subtasks).
                let from = 1 + (i * 7) % 40;
                let to = 1 + (i * 13 + 5) % 40;
                if from != to {
                    client
                        .simple_query(&format!(
                            "UPDATE accounts SET balance = balance + CASE WHEN id = {from} THEN -3 ELSE 3 END \
                             WHERE id IN ({from}, {to})"
                        ))
                        .await
                        .expect("transfer");
                }
                i += 1;
            }
            i
        })
    };
    let mut reads = 0;
    for _ in 0..150 {
        let total: i64 = rows(&c, "SELECT total FROM balances")
            .await
            .iter()
            .map(|r| r[0].parse::<i64>().unwrap())
            .sum();
        assert_eq!(total, 4000, "a read saw part of a transfer");
        reads += 1;
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let transfers = writer.await.expect("writer");
    assert!(
        transfers > 10 && reads == 150,
        "too little happened: {transfers} transfers"
    );
    c.simple_query("FLUSH").await.expect("flush");
    let view: i64 = rows(&c, "SELECT sum(total) FROM balances").await[0][0]
        .parse()
        .unwrap();
    assert_eq!(view, 4000);
}

/// Every `.slt` file in `sql-tests/`, by name; only those whose name
/// contains `$SLT` when it is set.
pub fn slt_files() -> Vec<PathBuf> {
    // Read at run time: a test binary built for another checkout sharing
    // the target directory (a clean clone's CI run) is reused as it is,
    // and its build-time path would point at that checkout's files.
    let manifest =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    let dir = PathBuf::from(manifest).join("../sql-tests");
    let only = std::env::var("SLT").ok();
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("sql-tests/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .filter(|p| {
            only.as_ref()
                .is_none_or(|o| p.to_string_lossy().contains(o.as_str()))
        })
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .slt files in {}", dir.display());
    files
}

/// The statements of an `.slt` file expected to succeed, in order, and its
/// `sleep`s (see [`sleep_of`]).
pub fn slt_statements(path: &Path) -> Vec<String> {
    use sqllogictest::{DefaultColumnType, Record, StatementExpect};
    sqllogictest::parse_file::<DefaultColumnType>(path)
        .expect("parse")
        .into_iter()
        .filter_map(|r| match r {
            Record::Statement {
                sql,
                expected: StatementExpect::Ok | StatementExpect::Count(_),
                ..
            } => Some(sql),
            Record::Sleep { duration, .. } => Some(format!("{SLEEP}{}", duration.as_millis())),
            _ => None,
        })
        .collect()
}

/// How [`slt_statements`] writes an `.slt` `sleep` record.
const SLEEP: &str = "-- sleep ms ";

/// The pause a [`slt_statements`] entry asks for, if it is a `sleep`.
pub fn sleep_of(statement: &str) -> Option<Duration> {
    Some(Duration::from_millis(
        statement.strip_prefix(SLEEP)?.parse().ok()?,
    ))
}

/// `CREATE MATERIALIZED VIEW name [(columns)] AS query` → (name, query).
pub fn view_definition(sql: &str) -> Option<(String, String)> {
    let sql = sql.trim();
    let lower = sql.to_lowercase();
    let mut rest = lower.strip_prefix("create materialized view")?.trim_start();
    rest = rest
        .strip_prefix("if not exists")
        .unwrap_or(rest)
        .trim_start();
    // `v`, or `schema.v`.
    let name: String = rest
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
        .collect();
    rest = rest[name.len()..].trim_start();
    if rest.starts_with('(') {
        // A column list renames; it does not change values.
        rest = rest[rest.find(')')? + 1..].trim_start();
    }
    let query = rest.strip_prefix("as")?;
    let at = sql.len() - query.len();
    Some((name, sql[at..].trim().trim_end_matches(';').to_string()))
}

//! A real PostgreSQL server for differential tests: Debian's `postgresql`
//! package (`scripts/test` installs it), a throwaway cluster made with
//! `initdb` in a temporary directory and run as the `postgres` user (the
//! server refuses to run as root), on its own port, trusting local
//! connections, with `wal_level = logical` for the postgres-cdc connector.

use std::path::PathBuf;
use std::process::Command;

use super::{free_port, wait_for_port};

pub struct Postgres {
    pub port: u16,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// The newest installed server's `bin` directory.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("PostgreSQL is not installed (scripts/test installs Debian's postgresql)")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("initdb").is_file())
        .collect();
    versions.sort();
    versions
        .pop()
        .expect("no PostgreSQL server in /usr/lib/postgresql")
}

/// Runs `program args…` as the postgres user when we are root.
fn as_postgres(program: &PathBuf, args: &[&str]) -> Command {
    let root = std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false);
    if root {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(program).args(args);
        c
    } else {
        let mut c = Command::new(program);
        c.args(args);
        c
    }
}

impl Postgres {
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("weir-pg")
            .tempdir_in("/tmp")
            .expect("temp dir");
        let _ = Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir.path())
            .status();
        let data = dir.path().join("data");
        let data_s = data.display().to_string();
        let out = as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                &data_s,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
            ],
        )
        .output()
        .expect("initdb");
        assert!(
            out.status.success(),
            "initdb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = free_port();
        let log = dir.path().join("postgres.log");
        let opts = format!(
            "-p {port} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c TimeZone=UTC -c wal_level=logical",
            dir.path().display()
        );
        let status = as_postgres(
            &bin.join("pg_ctl"),
            &[
                "-D",
                &data_s,
                "-l",
                &log.display().to_string(),
                "-o",
                &opts,
                "-w",
                "start",
            ],
        )
        .status()
        .expect("pg_ctl start");
        assert!(
            status.success(),
            "PostgreSQL did not start:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        wait_for_port(port, "postgres", &log);
        Self { port, bin, dir }
    }

    pub async fn client(&self) -> tokio_postgres::Client {
        let url = format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        );
        let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
            .await
            .expect("connect to PostgreSQL");
        tokio::spawn(async move {
            let _ = conn.await;
        });
        client
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.dir.path().join("data").display().to_string();
        let _ = as_postgres(
            &self.bin.join("pg_ctl"),
            &["-D", &data, "-m", "immediate", "stop"],
        )
        .status();
    }
}

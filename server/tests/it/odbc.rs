//! ODBC through Debian's psqlODBC (`odbc-postgresql`) and unixODBC's
//! `isql` (`unixodbc`), installed by `scripts/test`: a DSN configured as a
//! user would, then queries, the table list (`SQLTables`) and a table's
//! columns (`SQLColumns`), which the driver reads from the catalogs.

use crate::common;

use std::io::Write;
use std::process::{Command, Stdio};

const DRIVER: &str = "/usr/lib/x86_64-linux-gnu/odbc/psqlodbcw.so";

/// Runs `input` through `isql -v -b` against the DSN `weir`.
fn isql(dir: &std::path::Path, input: &str) -> String {
    let isql = common::installed("isql", "apt-get install unixodbc");
    let mut child = Command::new(isql)
        .args(["-v", "-b", "-d|", "weir", "weir"])
        .env("ODBCSYSINI", dir)
        .env("ODBCINI", dir.join("odbc.ini"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run isql");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("isql");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psqlodbc_lists_tables_and_columns_and_runs_queries() {
    assert!(
        std::path::Path::new(DRIVER).is_file(),
        "{DRIVER} is missing: apt-get install odbc-postgresql (scripts/test does)"
    );
    let server = common::Server::start();
    let c = server.client().await;
    common::rows(
        &c,
        "CREATE TABLE od (id bigint PRIMARY KEY, name text NOT NULL, score double precision)",
    )
    .await;
    common::rows(&c, "INSERT INTO od VALUES (1, 'a', 1.5), (2, 'b', NULL)").await;
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("odbcinst.ini"),
        format!("[Weir PostgreSQL]\nDriver = {DRIVER}\n"),
    )
    .expect("odbcinst.ini");
    std::fs::write(
        dir.path().join("odbc.ini"),
        format!(
            "[weir]\nDriver = Weir PostgreSQL\nServername = 127.0.0.1\nPort = {}\nDatabase = weir\nUsername = weir\n",
            server.port
        ),
    )
    .expect("odbc.ini");

    let out = isql(
        dir.path(),
        "SELECT id, name, score FROM od ORDER BY id\nSELECT * FROM nowhere\nSELECT 2\n",
    );
    assert!(out.starts_with("1|a|1.5\n2|b|\n"), "{out}");
    assert!(
        out.contains("[42P01]ERROR: relation \"nowhere\" does not exist"),
        "{out}"
    );
    assert!(out.lines().any(|l| l == "2"), "the session goes on: {out}");

    // `help` is SQLTables; `help od` SQLColumns: catalog, schema, table,
    // column, SQL type, type name, size, …, nullable.
    let tables = isql(dir.path(), "help\n");
    assert_eq!(tables.trim_end(), "weir|public|od|TABLE|", "{tables}");
    let columns = isql(dir.path(), "help od\n");
    let summary: Vec<String> = columns
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split('|').collect();
            format!("{} {} {} nullable={}", f[3], f[5], f[6], f[10])
        })
        .collect();
    assert_eq!(
        summary,
        vec![
            "id int8 19 nullable=0",
            "name text 8190 nullable=0",
            "score float8 17 nullable=1",
        ],
        "{columns}"
    );
}

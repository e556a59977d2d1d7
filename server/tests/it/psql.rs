//! The user's door: Debian's `psql` (installed by `scripts/test`) against a
//! real server: README's session as it is written there, meta-commands.

use crate::common;

use std::process::Command;

/// README's "A short session", run as it is written there: each statement
/// after a `weir=>` prompt (with its `weir->` lines) goes through psql, and
/// what psql prints must be what README shows after it (lines compared
/// without trailing blanks; a statement README shows no output for must
/// only succeed). So the README cannot drift from what Weir does.
#[test]
fn readme_session_runs_as_shown() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md"))
        .expect("README.md");
    let session = readme
        .split("## A short session")
        .nth(1)
        .and_then(|s| s.split("```").nth(1))
        .expect("README has a short session in a code block");
    // (statement, the output README shows for it)
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in session.lines() {
        if let Some(sql) = line.strip_prefix("weir=> ") {
            steps.push((sql.to_string(), Vec::new()));
        } else if let Some(more) = line.strip_prefix("weir-> ") {
            let (sql, _) = steps.last_mut().expect("a continuation after a prompt");
            sql.push('\n');
            sql.push_str(more);
        } else if let Some((_, shown)) = steps.last_mut() {
            shown.push(line.to_string());
        }
    }
    assert!(steps.len() >= 5, "{steps:?}");
    let server = common::Server::start();
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.trim_end().to_string())
            .filter(|l| !l.is_empty())
            .collect()
    };
    for (sql, shown) in steps {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &server.port.to_string()])
            .args(["-U", "weir", "-d", "weir", "-X", "-v", "ON_ERROR_STOP=1"])
            .arg("-c")
            .arg(&sql)
            .output()
            .expect(PSQL);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{sql}: {stderr}");
        let shown = lines(&shown.join("\n"));
        if !shown.is_empty() {
            assert_eq!(
                lines(&String::from_utf8_lossy(&out.stdout)),
                shown,
                "README shows something else for {sql}"
            );
        }
    }
    // An error reaches psql as Postgres words it; the view is listed.
    let out = psql(&server)
        .args(["-c", "SELECT * FROM nowhere"])
        .output()
        .expect(PSQL);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ERROR:  relation \"nowhere\" does not exist"),
        "the error reaches psql: {stderr}"
    );
    let out = psql(&server)
        .args(["-c", "SHOW MATERIALIZED VIEWS"])
        .output()
        .expect(PSQL);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "Name\nspend\n(1 row)\n"
    );
}

const PSQL: &str = "psql is installed by scripts/test (postgresql-client)";

/// Debian's psql at `server`, unaligned with `|` between columns, without
/// a `.psqlrc`.
fn psql(server: &common::Server) -> Command {
    let mut c = Command::new("psql");
    c.args([
        "-h",
        "127.0.0.1",
        "-p",
        &server.port.to_string(),
        "-U",
        "weir",
        "-d",
        "weir",
        "-X",
        "-A",
        "-F",
        "|",
    ]);
    c
}

/// Each meta-command, run alone as a user types it: its output, or the
/// error psql prints.
fn meta(server: &common::Server, command: &str) -> String {
    let out = psql(server).arg("-c").arg(command).output().expect(PSQL);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.is_empty(), "{command}: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// psql's meta-commands read pg_catalog with the queries psql 15 sends, and
/// show Weir's objects as Postgres shows its own.
#[test]
fn meta_commands_list_and_describe_weirs_objects() {
    let server = common::Server::start();
    let setup = [
        "CREATE TABLE orders (id int PRIMARY KEY, name text DEFAULT 'x', amount double precision NOT NULL)",
        "CREATE VIEW v AS SELECT id, name FROM orders",
        "CREATE MATERIALIZED VIEW m AS SELECT name, count(*) AS n FROM orders GROUP BY name",
        "CREATE SOURCE s (a int, b text) WITH (connector = 'datagen', 'datagen.rows.per.second' = '1')",
    ];
    for sql in setup {
        meta(&server, sql);
    }
    let cases: &[(&str, &str)] = &[
        (
            "\\l",
            "List of databases
Name|Owner|Encoding|Collate|Ctype|ICU Locale|Locale Provider|Access privileges
weir|weir|UTF8|C|C||libc|
(1 row)
",
        ),
        (
            "\\dn",
            "List of schemas
Name|Owner
public|weir
weir_catalog|weir
(2 rows)
",
        ),
        (
            "\\dt",
            "List of relations
Schema|Name|Type|Owner
public|orders|table|weir
(1 row)
",
        ),
        (
            "\\dv",
            "List of relations
Schema|Name|Type|Owner
public|v|view|weir
(1 row)
",
        ),
        // The system's relations, with S: pg_catalog's tables and views.
        (
            "\\dvS pg_r*",
            "List of relations
Schema|Name|Type|Owner
pg_catalog|pg_roles|view|weir
(1 row)
",
        ),
        (
            "\\d pg_am",
            "Table \"pg_catalog.pg_am\"
Column|Type|Collation|Nullable|Default
oid|oid|||
amname|text|||
amhandler|text|||
amtype|\"char\"|||
",
        ),
        (
            "\\dm",
            "List of relations
Schema|Name|Type|Owner
public|m|materialized view|weir
(1 row)
",
        ),
        (
            "\\d",
            "List of relations
Schema|Name|Type|Owner
public|m|materialized view|weir
public|orders|table|weir
public|s|foreign table|weir
public|v|view|weir
(4 rows)
",
        ),
        (
            "\\d orders",
            "Table \"public.orders\"
Column|Type|Collation|Nullable|Default
id|integer||not null|
name|text|||'x'
amount|double precision||not null|
Indexes:
    \"orders_pkey\" PRIMARY KEY, btree (id)
",
        ),
        (
            "\\d v",
            "View \"public.v\"
Column|Type|Collation|Nullable|Default
id|integer|||
name|text|||
",
        ),
        (
            "\\d+ m",
            "Materialized view \"public.m\"
Column|Type|Collation|Nullable|Default|Storage|Compression|Stats target|Description
name|text||||extended|||
n|bigint||||plain|||
View definition:
 SELECT name, count(*) AS n FROM orders GROUP BY name;
Replica Identity: NOTHING
Access method: heap
",
        ),
        (
            "\\d s",
            "Foreign table \"public.s\"
Column|Type|Collation|Nullable|Default|FDW options
a|integer||||
b|text||||
Server: datagen
",
        ),
        (
            "\\d orders_pkey",
            "Index \"public.orders_pkey\"
Column|Type|Key?|Definition
id|integer|yes|id
primary key, btree, for table \"public.orders\"
",
        ),
        (
            "\\df",
            "List of functions
Schema|Name|Result data type|Argument data types|Type
(0 rows)
",
        ),
        (
            "\\du",
            "List of roles
Role name|Attributes|Member of
weir|Superuser, Create role, Create DB, Bypass RLS|{}
",
        ),
    ];
    let mut failures = Vec::new();
    for (command, expected) in cases {
        let got = meta(&server, command);
        if got != *expected {
            failures.push(format!("{command}\n--- expected\n{expected}--- got\n{got}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // \x and \timing are psql's own, around a query Weir answers.
    let out = psql(&server)
        .args([
            "-c",
            "\\x",
            "-c",
            "SELECT 1 AS a, 'b' AS b",
            "-c",
            "\\timing",
            "-c",
            "SELECT 2 AS c",
        ])
        .output()
        .expect(PSQL);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("Expanded display is on.\na|1\nb|b\nTiming is on.\nc|2\nTime: "),
        "{stdout}"
    );
}

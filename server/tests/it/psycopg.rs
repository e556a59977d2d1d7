//! psycopg 3 and SQLAlchemy 2 (from PyPI, installed by `scripts/test` in a virtualenv
//! beside the build): `tests/psycopg/weir_psycopg.py` binds parameters on
//! the server and on the client, reads through a named (server-side)
//! cursor, COPYs in and out; its findings must be what Postgres gives.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp/weir-target"));
    let python = target.join("tools/psycopg-venv/bin/python");
    assert!(
        python.is_file(),
        "{} is missing: scripts/test installs psycopg there",
        python.display()
    );
    python
}

/// Runs `tests/psycopg/<script>` against a fresh server; its output, and
/// what it said on stderr.
fn run_script(script: &str) -> (String, String) {
    let server = common::Server::start();
    let program = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/psycopg")
        .join(script);
    let out = Command::new(python())
        .arg(&program)
        .arg(server.port.to_string())
        .output()
        .expect("run python");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{script} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn psycopg_parameters_server_side_cursors_and_copy() {
    let (stdout, stderr) = run_script("weir_psycopg.py");
    let expected = "\
params: [(2, 'n2', 3.0), (3, 'n3', 4.5)]
client-side: [('n1',)]
copy in: 2
copy out: 4\ttab\\there
5\tn5

copy rows: [('4', None), ('5', '7.25')]
server-side cursor: [1, 2, 3, 4, 5]
error: 42P01
after error: (1,)
transactions: [(12, 'kept')]
types, text results: ok
types, binary results: ok
prepared, DDL, DEALLOCATE ALL, DISCARD ALL: (0,)
";
    assert_eq!(stdout, expected, "{stderr}");
}

/// Superset's way in: SQLAlchemy 2's inspector over psycopg 3
/// (`tests/psycopg/weir_sqlalchemy.py`), every answer as Postgres gives it.
#[test]
fn sqlalchemy_inspects_the_catalogs_as_superset_does() {
    let (stdout, stderr) = run_script("weir_sqlalchemy.py");
    let expected = "\
schemas: ['information_schema', 'public', 'weir_catalog']
tables: ['sa_orders']
views: ['sa_big']
materialized: ['sa_spend']
columns: [('id', 'INTEGER', False), ('customer', 'VARCHAR(20)', False), ('amount', 'NUMERIC(10, 2)', True)]
view columns: ['customer', 'total']
primary key: {'constrained_columns': ['id'], 'name': 'sa_orders_pkey', 'comment': None}
foreign keys: []
indexes: []
unique: []
comment: {'text': None}
has table: True
query: [(1, 'ann')]
";
    assert_eq!(stdout, expected, "{stderr}");
}

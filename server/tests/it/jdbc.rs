//! JDBC through Debian's pgjdbc (`libpostgresql-jdbc-java`, installed by
//! `scripts/test`): `tests/jdbc/WeirJdbc.java` connects, reads
//! DatabaseMetaData (schemas, tables, columns, primary keys), runs
//! PreparedStatements with parameters and reads ResultSetMetaData; its
//! findings must be what Postgres would answer.

use crate::common;

use std::path::Path;
use std::process::Command;

const JAR: &str = "/usr/share/java/postgresql.jar";

#[test]
fn pgjdbc_metadata_and_prepared_statements() {
    assert!(
        Path::new(JAR).is_file(),
        "{JAR} is missing: apt-get install libpostgresql-jdbc-java (scripts/test does)"
    );
    let java = common::installed("java", "apt-get install default-jdk-headless");
    let server = common::Server::start();
    let program = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/jdbc/WeirJdbc.java");
    // The JVM runs the source file itself (no javac step); pgjdbc sends
    // the JVM's zone, which Weir takes only as UTC.
    let out = Command::new(java)
        .arg("-Duser.timezone=UTC")
        .arg("-cp")
        .arg(JAR)
        .arg(&program)
        .arg(server.port.to_string())
        .output()
        .expect("run java");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "java failed:\n{stdout}\n{stderr}");
    // As from Postgres, but for one column type: `name` is a varchar(20)
    // column and Weir's results carry its values as text.
    let expected = "\
product: PostgreSQL
schemas: information_schema | pg_catalog | public | weir_catalog
tables: jt_pkey,INDEX | jv,MATERIALIZED VIEW | jt,TABLE
columns: id,int8,19,0 | name,varchar,20,0 | price,numeric,8,1 | seen,timestamptz,35,1
primary keys: id,1,jt_pkey
result columns: id:int8,name:text,price:numeric,seen:timestamptz
rows: 2,a,2.50,2026-01-02 10:00:00+00
view: a,2 | b,1
error: 42P01
after error: 1
";
    assert_eq!(stdout, expected, "{stderr}");
}

//! Weir's views against a real PostgreSQL: every `.slt` file's statements
//! are replayed on a Weir server and, translated where Weir's syntax is its
//! own, on Debian's PostgreSQL (started by the test). Whenever a view is
//! about to be dropped, and at the end, each materialized view must hold
//! what its query, run as a batch query by PostgreSQL over the same rows,
//! returns.
//!
//! Translations: `CREATE STREAM` and the clauses PostgreSQL lacks
//! (`WATERMARK FOR`, `APPEND ONLY`) become a plain `CREATE TABLE` (Weir's own
//! parser takes them out); `TUMBLE`, `HOP` and `CUMULATE` become subqueries
//! written from the windows' definitions (`date_bin`, and `generate_series`
//! for the several windows of a row: see `window_subquery`). EMIT ON WINDOW
//! CLOSE views (whose contents depend on the watermark, not only on the
//! rows) have no batch equivalent and are checked by `smoke.rs` instead. Numbers are compared to six
//! decimals: PostgreSQL's `avg` and `stddev` are numeric, Weir's double.

use crate::common;

use std::collections::BTreeMap;

use common::postgres::Postgres;
use common::{Server, rows, view_definition};

/// The statement as PostgreSQL should run it, or None when it is Weir's
/// alone (views are checked, not created, on PostgreSQL).
fn for_postgres(sql: &str) -> Option<String> {
    let lower = sql.trim().to_lowercase();
    let weir_only = [
        "create materialized view",
        "drop materialized view",
        "alter materialized view",
        "flush",
        "checkpoint",
        "set streaming_",
        "set checkpoint_mode",
        "set implicit_flush",
        "set rw_implicit_flush",
        "create savepoint",
        "drop savepoint",
        "create sink",
        "drop sink",
        "restore ",
        "show ",
        "explain ",
        "select ",
    ];
    if weir_only.iter().any(|p| lower.starts_with(p)) {
        return None;
    }
    if lower.starts_with("create stream") || lower.starts_with("create table") {
        let mut stmts = server::sql::stmt::parse(sql).expect("parse CREATE TABLE");
        if let Some(server::sql::stmt::Stmt::CreateTable { table, .. }) = stmts.pop() {
            return Some(table.to_string());
        }
    }
    if lower.starts_with("drop stream") {
        return Some(format!("DROP TABLE{}", &sql.trim()["drop stream".len()..]));
    }
    Some(sql.to_string())
}

/// Every `TUMBLE(t, ts, size)` as a subquery PostgreSQL runs; None for
/// queries with windows this test does not translate.
fn translate_query(query: &str) -> Option<String> {
    let lower = query.to_lowercase();
    // Temporal joins depend on when rows arrived, which a batch query
    // does not know.
    if lower.contains("emit on window close")
        || lower.contains("for system_time")
        || lower.contains("session(")
    {
        return None;
    }
    // PostgreSQL has no IGNORE NULLS or CORRESPONDING (over_window.slt and
    // set_ops.slt check those views against hand-computed rows).
    if lower.contains("ignore nulls") || lower.contains("corresponding") {
        return None;
    }
    // LIMIT without ORDER BY keeps any rows: not the ones PostgreSQL picks
    // (top_n.slt checks such views itself).
    if lower.contains(" limit ") && !lower.contains("order by") {
        return None;
    }
    let mut query = query.to_string();
    for kind in ["tumble(", "hop(", "cumulate("] {
        while let Some(at) = query.to_lowercase().find(kind) {
            let open = at + kind.len();
            let close = open + query[open..].find(')')?;
            let args: Vec<&str> = query[open..close].split(',').map(str::trim).collect();
            let sub = window_subquery(kind, &args)?;
            query = format!("{}{sub}{}", &query[..at], &query[close + 1..]);
        }
    }
    Some(query)
}

/// A window function's rows in plain PostgreSQL, written from the windows'
/// definitions rather than from Weir's expansion: windows aligned to the
/// epoch plus the offset; HOP's `size / slide` windows per row from
/// `generate_series` over their starts, CUMULATE's windows from
/// `generate_series` over their ends within the row's period.
fn window_subquery(kind: &str, args: &[&str]) -> Option<String> {
    let origin = |offset: Option<&&str>| match offset {
        Some(o) => format!("(TIMESTAMP '1970-01-01' + {o})"),
        None => "TIMESTAMP '1970-01-01'".into(),
    };
    // The rows go by the table's name, without its schema.
    let alias = args.first()?.rsplit('.').next()?;
    Some(match (kind, args) {
        ("tumble(", [table, ts, size, offset @ ..]) => {
            let bin = format!("date_bin({size}, w.{ts}, {})", origin(offset.first()));
            format!(
                "(SELECT w.*, {bin} AS window_start, {bin} + {size} AS window_end \
                 FROM {table} AS w) AS {alias}"
            )
        }
        ("hop(", [table, ts, slide, size, offset @ ..]) => {
            let bin = format!("date_bin({slide}, w.{ts}, {})", origin(offset.first()));
            format!(
                "(SELECT w.*, ws AS window_start, ws + {size} AS window_end \
                 FROM {table} AS w, generate_series({bin} - {size} + {slide}, {bin}, {slide}) AS ws \
                 WHERE w.{ts} >= ws AND w.{ts} < ws + {size}) AS {alias}"
            )
        }
        ("cumulate(", [table, ts, step, size, offset @ ..]) => {
            let bin = format!("date_bin({size}, w.{ts}, {})", origin(offset.first()));
            format!(
                "(SELECT w.*, {bin} AS window_start, we AS window_end \
                 FROM {table} AS w, generate_series({bin} + {step}, {bin} + {size}, {step}) AS we \
                 WHERE w.{ts} < we) AS {alias}"
            )
        }
        _ => return None,
    })
}

fn pg_error(e: &tokio_postgres::Error) -> String {
    e.as_db_error()
        .map(|d| format!("{}: {}", d.code().code(), d.message()))
        .unwrap_or_else(|| e.to_string())
}

/// A value as both servers should agree on it: numbers to six decimals.
fn normalize(v: &str) -> String {
    match v.parse::<f64>() {
        Ok(f) if v.chars().any(|c| c.is_ascii_digit()) => {
            let s = format!("{f:.6}");
            if s == "-0.000000" {
                "0.000000".into()
            } else {
                s
            }
        }
        _ => v.to_string(),
    }
}

fn normalized(mut rs: Vec<Vec<String>>) -> Vec<Vec<String>> {
    for r in &mut rs {
        for v in r.iter_mut() {
            *v = normalize(v);
        }
    }
    rs.sort();
    rs
}

async fn compare(
    weir: &tokio_postgres::Client,
    pg: &tokio_postgres::Client,
    file: &str,
    views: &BTreeMap<String, String>,
) -> usize {
    weir.simple_query("FLUSH").await.expect("flush");
    for (name, query) in views {
        let view = normalized(rows(weir, &format!("SELECT * FROM {name}")).await);
        let expected = match pg.simple_query(query).await {
            Ok(_) => normalized(rows(pg, query).await),
            Err(e) => panic!(
                "{file}: PostgreSQL cannot run view {name}'s query: {}\n{query}",
                pg_error(&e)
            ),
        };
        assert!(
            view == expected,
            "{file}: view {name} differs from PostgreSQL\nquery:      {query}\nweir:       {view:?}\npostgresql: {expected:?}"
        );
    }
    views.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_equal_postgresql_running_their_queries() {
    let files = common::slt_files();
    let postgres = Postgres::start();
    let admin = postgres.client().await;
    let mut checked = 0;
    let mut skipped = Vec::new();
    for (n, path) in files.iter().enumerate() {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if file == "errors.slt"
            || file == "late_rows.slt"
            || file == "state_ttl.slt"
            || file == "risingwave_aggregates.slt"
        {
            // errors.slt's one view is built to fail; late_rows.slt's
            // streams route rows by their watermark, which PostgreSQL
            // cannot (smoke.rs checks its views); state_ttl.slt's views
            // forget state on purpose; risingwave_aggregates.slt's use
            // aggregates PostgreSQL does not have.
            continue;
        }
        let statements = common::slt_statements(path);
        if !statements.iter().any(|s| view_definition(s).is_some()) {
            continue;
        }
        if statements
            .iter()
            .any(|s| s.trim().to_lowercase().starts_with("create source"))
        {
            // PostgreSQL has no connectors; these views are checked against
            // the same query over the bounded source, in the file itself
            // and by smoke.rs.
            continue;
        }
        // A fresh database per file, as each file gets a fresh Weir.
        let db = format!("f{n}");
        admin
            .simple_query(&format!("CREATE DATABASE {db}"))
            .await
            .expect("create database");
        let pg = {
            let url = format!(
                "host=127.0.0.1 port={} user=postgres dbname={db}",
                postgres.port
            );
            let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(async move {
                let _ = conn.await;
            });
            // Weir's processing time is the statement's time there.
            c.simple_query(
                "CREATE FUNCTION proctime() RETURNS timestamptz AS 'SELECT now()' LANGUAGE sql",
            )
            .await
            .expect("proctime()");
            c
        };
        let server = Server::start();
        let weir = server.client().await;
        let mut views: BTreeMap<String, String> = BTreeMap::new();
        for sql in &statements {
            if let Some(pause) = common::sleep_of(sql) {
                tokio::time::sleep(pause).await;
                continue;
            }
            let lower = sql.trim().to_lowercase();
            if lower.starts_with("drop materialized view")
                || lower.starts_with("drop table")
                || lower.starts_with("drop stream")
                || lower.starts_with("drop schema")
            {
                checked += compare(&weir, &pg, &file, &views).await;
            }
            if let Err(e) = weir.simple_query(sql).await {
                panic!("{file}: {sql}: {e}");
            }
            if let Some(pg_sql) = for_postgres(sql)
                && let Err(e) = pg.simple_query(&pg_sql).await
            {
                panic!("{file}: PostgreSQL: {pg_sql}: {}", pg_error(&e));
            }
            if let Some((name, query)) = view_definition(sql) {
                match translate_query(&query) {
                    Some(q) => {
                        // A plain view on PostgreSQL, so that views over it
                        // run there too.
                        let create = format!("CREATE VIEW {name} AS {q}");
                        if let Err(e) = pg.simple_query(&create).await {
                            panic!("{file}: PostgreSQL: {create}: {}", pg_error(&e));
                        }
                        views.insert(name, q);
                    }
                    None => skipped.push(format!("{file}: {name}")),
                }
            }
            if lower.starts_with("drop ") && lower.contains("cascade") {
                let left = rows(&weir, "SHOW MATERIALIZED VIEWS").await;
                views.retain(|name, _| left.iter().any(|r| &r[0] == name));
            }
            if lower.starts_with("drop materialized view") {
                views.retain(|name, _| !lower.contains(name.as_str()));
                let rest = sql.trim()["drop materialized view".len()..].trim_start();
                let rest = if rest.to_lowercase().starts_with("if exists") {
                    &rest["if exists".len()..]
                } else {
                    rest
                };
                let pg_sql = format!("DROP VIEW IF EXISTS {}", rest.trim());
                if let Err(e) = pg.simple_query(&pg_sql).await {
                    panic!("{file}: PostgreSQL: {pg_sql}: {}", pg_error(&e));
                }
            }
        }
        checked += compare(&weir, &pg, &file, &views).await;
        println!("ok   {file}");
    }
    println!(
        "{checked} view comparisons; not translated (checked by smoke.rs): {}",
        skipped.join(", ")
    );
    assert!(checked > 0, "no views were compared");
}

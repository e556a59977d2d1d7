//! Every view in `sql-tests/` survives being interrupted (in the style of
//! Arroyo's smoke tests): each `.slt` file's statements are replayed with a
//! `CHECKPOINT` every few statements, the server is killed with SIGKILL
//! halfway and restarted, every view is rescaled to another parallelism,
//! and the replay finishes. Before a view is dropped, and at the end, it
//! must equal its query computed from the tables — what an uninterrupted
//! run gives. A view with EMIT ON WINDOW CLOSE holds only the windows its
//! watermark has closed, and a temporal join the table versions its rows
//! met, which their queries alone do not say: they are compared with the
//! same views on a second server that replays the file without
//! interruptions, as are views whose query DataFusion's batch engine
//! refuses (`differential.rs` checks those against PostgreSQL).

use crate::common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Server, rows, view_definition};

/// Whether a view's rows depend on when its input arrived, not only on
/// what it is: EMIT ON WINDOW CLOSE (which windows the watermark closed)
/// and temporal joins (the table's version each row met). Such views are
/// compared with an uninterrupted run; the files keep each write in its
/// own checkpoint (FLUSH), so a replay after the crash sees the same order.
fn arrival_dependent(query: &str) -> bool {
    let words: Vec<String> = query.split_whitespace().map(|w| w.to_lowercase()).collect();
    words.ends_with(&["emit", "on", "window", "close"].map(String::from))
        || words
            .windows(2)
            .any(|w| w[0] == "for" && w[1] == "system_time")
}

/// Whether a view may hold other rows than its query returns and still be
/// right: `LIMIT` without `ORDER BY` keeps any n rows. Such views are
/// compared with the uninterrupted run too.
fn any_rows(query: &str) -> bool {
    let lower = query.to_lowercase();
    lower.contains(" limit ") && !lower.contains("order by")
}

/// Arrival-dependent views equal the same views of the uninterrupted run.
async fn compare_final(
    client: &tokio_postgres::Client,
    reference: &tokio_postgres::Client,
    file: &str,
    views: &BTreeMap<String, String>,
) -> usize {
    client.simple_query("FLUSH").await.expect("flush");
    reference.simple_query("FLUSH").await.expect("flush");
    for name in views.keys() {
        let sql = format!("SELECT * FROM {name}");
        let mut view = rows(client, &sql).await;
        let mut expected = rows(reference, &sql).await;
        view.sort();
        expected.sort();
        assert!(
            view == expected,
            "{file}: view {name} differs from the uninterrupted run's\nview:      {view:?}\nreference: {expected:?}"
        );
    }
    views.len()
}

/// Compares every view with its query; returns how many it compared.
/// A view whose query DataFusion's batch engine refuses (0A000, say two
/// aggregates with different `ORDER BY`s, which views keep) goes into
/// `batchless`, to be compared with the uninterrupted run instead.
async fn compare(
    client: &tokio_postgres::Client,
    file: &str,
    views: &BTreeMap<String, String>,
    batchless: &mut BTreeSet<String>,
) -> usize {
    client.simple_query("FLUSH").await.expect("flush");
    let mut compared = 0;
    for (name, query) in views
        .iter()
        .filter(|(_, q)| !arrival_dependent(q) && !any_rows(q))
    {
        if let Err(e) = client.simple_query(query).await {
            // A view over an endless source has no batch recomputation.
            if e.as_db_error()
                .is_some_and(|d| d.message().contains("which has no end"))
            {
                continue;
            }
            if e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED) {
                batchless.insert(name.clone());
                continue;
            }
        }
        let mut view = rows(client, &format!("SELECT * FROM {name}")).await;
        let mut expected = rows(client, query).await;
        view.sort();
        expected.sort();
        assert!(
            view == expected,
            "{file}: view {name} differs from its query after the interruption\nview:  {view:?}\nquery: {expected:?}"
        );
        compared += 1;
    }
    compared
}

async fn connect(server: &Server, settings: &[String]) -> tokio_postgres::Client {
    let client = server.client().await;
    for s in settings {
        client.simple_query(s).await.expect("setting");
    }
    client
}

// The files in two halves, every other file each: libtest runs a binary's
// tests side by side, and a replay spends most of its time waiting on
// checkpoints and restarts, so two halves take about half the time.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_survives_checkpoints_a_crash_and_a_rescale_even_files() {
    replay(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_view_survives_checkpoints_a_crash_and_a_rescale_odd_files() {
    replay(1).await;
}

/// Replays every other file of `sql-tests/`, from the `first`.
async fn replay(first: usize) {
    let files: Vec<_> = common::slt_files()
        .into_iter()
        .skip(first)
        .step_by(2)
        .collect();
    let any = !files.is_empty();
    let mut checked = 0;
    for path in files {
        let file = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if file == "errors.slt" || file == "state_ttl.slt" {
            // errors.slt's one view is built to fail; state_ttl.slt's views
            // differ from their queries on purpose, and a restart gives
            // restored state a whole new TTL.
            continue;
        }
        let statements = common::slt_statements(&path);
        if !statements.iter().any(|s| view_definition(s).is_some()) {
            continue;
        }
        let mut server = Server::start();
        let mut settings: Vec<String> = Vec::new();
        let mut client = connect(&server, &settings).await;
        // The uninterrupted run, for views whose result depends on when
        // their windows closed, and views whose query has no batch run.
        let reference = {
            let r = Server::start();
            let c = r.client().await;
            Some((r, c))
        };
        let mut batchless: BTreeSet<String> = BTreeSet::new();
        let final_views = |views: &BTreeMap<String, String>,
                           batchless: &BTreeSet<String>|
         -> BTreeMap<String, String> {
            views
                .iter()
                .filter(|(n, q)| arrival_dependent(q) || any_rows(q) || batchless.contains(*n))
                .map(|(n, q)| (n.clone(), q.clone()))
                .collect()
        };
        let mut views: BTreeMap<String, String> = BTreeMap::new();
        let crash_at = statements.len() / 2;
        // The crash waits for the end of an open transaction block: the
        // block dies with its connection, and the file's next statements
        // assume it.
        let (mut in_block, mut crashed) = (false, false);
        for (i, sql) in statements.iter().enumerate() {
            if let Some(pause) = common::sleep_of(sql) {
                tokio::time::sleep(pause).await;
                continue;
            }
            let lower = sql.trim().to_lowercase();
            if lower.starts_with("drop materialized view")
                || lower.starts_with("drop table")
                || lower.starts_with("drop source")
            {
                checked += compare(&client, &file, &views, &mut batchless).await;
                if let Some((_, r)) = &reference {
                    checked +=
                        compare_final(&client, r, &file, &final_views(&views, &batchless)).await;
                }
            }
            if let Err(e) = client.simple_query(sql).await {
                panic!("{file}: {sql}: {e:?}");
            }
            if let Some((_, r)) = &reference
                && let Err(e) = r.simple_query(sql).await
            {
                panic!("{file} (uninterrupted): {sql}: {e:?}");
            }
            if lower.starts_with("set ") {
                settings.push(sql.clone());
            }
            if let Some((name, query)) = view_definition(sql) {
                views.insert(name, query);
            }
            if lower.starts_with("drop materialized view") {
                views.retain(|name, _| !lower.contains(name.as_str()));
            }
            if lower.starts_with("drop ") && lower.contains("cascade") {
                let left = rows(&client, "SHOW MATERIALIZED VIEWS").await;
                views.retain(|name, _| left.iter().any(|r| &r[0] == name));
            }
            if i % 3 == 2 {
                client.simple_query("CHECKPOINT").await.expect("checkpoint");
            }
            if lower.starts_with("begin") || lower.starts_with("start transaction") {
                in_block = true;
            } else if (lower.starts_with("commit") || lower.starts_with("rollback"))
                && !lower.starts_with("rollback to")
            {
                in_block = false;
            }
            if i >= crash_at && !crashed && !in_block {
                crashed = true;
                server.crash_and_restart();
                client = connect(&server, &settings).await;
                for (n, name) in views.keys().enumerate() {
                    let p = rows(
                        &client,
                        &format!(
                            "SELECT count(DISTINCT subtask) FROM weir_catalog.subtasks WHERE view = '{name}'"
                        ),
                    )
                    .await;
                    let now: usize = p[0][0].parse().unwrap_or(1);
                    let other = (now + n) % 4 + 1;
                    let other = if other == now { now % 4 + 1 } else { other };
                    client
                        .simple_query(&format!(
                            "ALTER MATERIALIZED VIEW {name} SET PARALLELISM = {other}"
                        ))
                        .await
                        .unwrap_or_else(|e| {
                            panic!(
                                "{file}: rescale {name} to {other}: {e}\nserver log (last lines):\n{}",
                                server.log_tail(40)
                            )
                        });
                }
                checked += compare(&client, &file, &views, &mut batchless).await;
                if let Some((_, r)) = &reference {
                    checked +=
                        compare_final(&client, r, &file, &final_views(&views, &batchless)).await;
                }
            }
        }
        checked += compare(&client, &file, &views, &mut batchless).await;
        if let Some((_, r)) = &reference {
            checked += compare_final(&client, r, &file, &final_views(&views, &batchless)).await;
        }
        println!("ok   {file}");
    }
    assert!(checked > 0 || !any, "no views were checked");
}

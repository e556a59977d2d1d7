//! A chain of materialized views over materialized views, each level
//! reading the one below through its changelog, through pgwire: under
//! inserts, updates and deletes, across `kill -9`, every level equals a
//! recomputation of the writes kept in the test (a model of the table,
//! and the views' queries worked out on it in Rust), and the upper levels
//! really read their upstream view, not the table again.

use std::collections::BTreeMap;

use crate::common;

use common::{Server, rows};

/// The table as the test wrote it: k → (g, v).
type Model = BTreeMap<i64, (i64, i64)>;

/// What level 1 keeps: rows whose v is not a multiple of 3.
fn kept(v: i64) -> bool {
    v % 3 != 0
}

/// Level 2: per g, (sum of v, count) over level 1's rows.
fn level2(m: &Model) -> Vec<Vec<String>> {
    let mut groups: BTreeMap<i64, (i64, i64)> = BTreeMap::new();
    for (g, v) in m.values().filter(|(_, v)| kept(*v)) {
        let e = groups.entry(*g).or_default();
        e.0 += v;
        e.1 += 1;
    }
    groups
        .into_iter()
        .map(|(g, (s, n))| vec![g.to_string(), s.to_string(), n.to_string()])
        .collect()
}

/// Level 3: total, number of groups and the biggest group over level 2.
fn level3(m: &Model) -> Vec<Vec<String>> {
    let l2 = level2(m);
    if l2.is_empty() {
        return vec![vec!["NULL".into(), "0".into(), "NULL".into()]];
    }
    let total: i64 = l2.iter().map(|r| r[1].parse::<i64>().unwrap()).sum();
    let biggest = l2
        .iter()
        .map(|r| r[2].parse::<i64>().unwrap())
        .max()
        .unwrap();
    vec![vec![
        total.to_string(),
        l2.len().to_string(),
        biggest.to_string(),
    ]]
}

/// A small deterministic generator.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, n: i64) -> i64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((self.0 >> 33) % n as u64) as i64
    }
}

/// One round of writes: inserts, updates (moving rows between groups and
/// in and out of level 1) and deletes, applied to the model too.
async fn write_round(c: &tokio_postgres::Client, m: &mut Model, r: &mut Lcg) {
    for _ in 0..20 {
        let k = r.next(200);
        let (g, v) = (r.next(7), r.next(50));
        match (m.contains_key(&k), r.next(3)) {
            (false, _) => {
                c.execute(
                    "INSERT INTO t VALUES ($1, $2, $3)",
                    &[&(k as i32), &(g as i32), &v],
                )
                .await
                .expect("insert");
                m.insert(k, (g, v));
            }
            (true, 0) => {
                c.execute("DELETE FROM t WHERE k = $1", &[&(k as i32)])
                    .await
                    .expect("delete");
                m.remove(&k);
            }
            (true, _) => {
                c.execute(
                    "UPDATE t SET g = $2, v = $3 WHERE k = $1",
                    &[&(k as i32), &(g as i32), &v],
                )
                .await
                .expect("update");
                m.insert(k, (g, v));
            }
        }
    }
}

async fn check(c: &tokio_postgres::Client, m: &Model, when: &str) {
    c.batch_execute("FLUSH").await.expect("flush");
    assert_eq!(
        rows(c, "SELECT g, s, n FROM l2 ORDER BY g").await,
        level2(m),
        "level 2 {when}"
    );
    assert_eq!(
        rows(c, "SELECT total, groups, biggest FROM l3").await,
        level3(m),
        "level 3 {when}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_level_chain_equals_its_recomputation_across_kill_9() {
    let mut server = Server::start_with(&["--checkpoint-interval-ms", "50"]);
    let mut c = server.client().await;
    let mut m = Model::new();
    let mut r = Lcg(7);
    c.batch_execute("CREATE TABLE t (k int PRIMARY KEY, g int, v bigint)")
        .await
        .expect("table");
    write_round(&c, &mut m, &mut r).await;
    // Level 1 keeps a second of history: what the levels above still need
    // of it is kept for them, however long they were away.
    c.batch_execute(
        "CREATE MATERIALIZED VIEW l1 WITH (retain_history = '1 second') AS
           SELECT k, g, v FROM t WHERE v % 3 <> 0;
         CREATE MATERIALIZED VIEW l2 AS SELECT g, sum(v) AS s, count(*) AS n FROM l1 GROUP BY g;
         CREATE MATERIALIZED VIEW l3 AS
           SELECT sum(s) AS total, count(*) AS groups, max(n) AS biggest FROM l2;",
    )
    .await
    .expect("chain");
    let plan = rows(&c, "EXPLAIN CREATE MATERIALIZED VIEW x AS SELECT * FROM l2").await;
    assert!(
        plan.iter().any(|l| l[0].contains("ViewSource: l2")),
        "a view over a view reads its changelog: {plan:?}"
    );
    check(&c, &m, "after the backfill").await;
    for round in 0..5 {
        write_round(&c, &mut m, &mut r).await;
        check(&c, &m, &format!("after round {round}")).await;
    }
    // Writes the upper levels may not have reached when the process dies.
    for round in 0..3 {
        write_round(&c, &mut m, &mut r).await;
        tokio::time::sleep(std::time::Duration::from_millis(30 * round)).await;
    }
    server.crash_and_restart();
    c = server.client().await;
    check(&c, &m, "after kill -9").await;
    // Longer than level 1's retention, with writes: the levels above go on.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    for round in 0..3 {
        write_round(&c, &mut m, &mut r).await;
        check(&c, &m, &format!("after restart, round {round}")).await;
    }
    server.crash_and_restart();
    c = server.client().await;
    write_round(&c, &mut m, &mut r).await;
    check(&c, &m, "after a second kill -9").await;
}

//! State backends through pgwire, on a real server with little managed
//! memory: a `GROUP BY` whose state is many times its slots' memory keeps
//! only hot groups in memory with the `rocksdb` backend, gives results
//! equal to their closed forms, survives `kill -9`, and shows what it holds
//! in `weir_catalog.state`; the `heap` backend fails the view with `53200`
//! and leaves the server and the other views running. A join whose rows
//! are many times the memory keeps them in RocksDB the same way, and so
//! do a TopN partition, a window partition and a join key that alone are
//! many times the memory.

use crate::common;

use common::{Server, expect_error, one, rows};

/// Rows of the generated sequence, and groups (`k % GROUPS`).
const N: i64 = 400_000;
const GROUPS: i64 = 200_000;

/// A process's peak resident memory in KiB (`VmHWM`).
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// A server with 16 MiB of managed memory (4 slots of 4 MiB: 2 MiB per
/// slot for operator caches) and frequent checkpoints.
fn small_server() -> Server {
    Server::start_with(&[
        "--managed-memory-mb",
        "16",
        "--heartbeat-interval-ms",
        "200",
        "--checkpoint-interval-ms",
        "500",
    ])
}

/// Polls `sql` until it returns `want` (or a minute passes).
async fn eventually(client: &tokio_postgres::Client, sql: &str, want: &str, server: &Server) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let got = one(client, sql).await;
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{sql}: {got}, not {want}\n{}",
            server.log_tail(30)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn group_by_far_past_managed_memory_spills_to_rocksdb_and_heap_fails_with_53200() {
    // The view's groups take tens of MiB, many times the caches' share.
    let mut server = small_server();
    let c = server.client().await;
    c.batch_execute(&format!(
        "CREATE SOURCE seq (k bigint) WITH (connector = 'datagen', \
         datagen.rows.per.second = '0', fields.k.kind = 'sequence', \
         fields.k.start = '1', fields.k.end = '{N}')"
    ))
    .await
    .unwrap();
    let view = format!("SELECT k % {GROUPS} AS g, count(*) AS c, sum(k) AS s FROM seq GROUP BY 1");
    assert_eq!(one(&c, "SHOW state_backend").await, "default");
    expect_error(
        &c,
        "SET state_backend = 'disk'",
        "22023",
        "rocksdb, heap or default",
    )
    .await;
    c.batch_execute("SET streaming_parallelism = 2; SET state_backend = 'rocksdb'")
        .await
        .unwrap();
    let plan = rows(&c, &format!("EXPLAIN CREATE MATERIALIZED VIEW g AS {view}")).await;
    assert_eq!(plan[0][0], "StreamGraph (state backend: rocksdb):");
    c.batch_execute(&format!("CREATE MATERIALIZED VIEW g AS {view}"))
        .await
        .unwrap();

    // kill -9 once a checkpoint holds part of the state, and go on.
    eventually(
        &c,
        "SELECT count(*) > 0 FROM weir_catalog.checkpoints WHERE view = 'g' AND state = 'COMPLETED'",
        "t",
        &server,
    )
    .await;
    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute("FLUSH").await.unwrap();

    // Closed forms: every group holds k = g and k = g + GROUPS.
    let total = N * (N + 1) / 2;
    assert_eq!(
        rows(&c, "SELECT count(*), sum(c), sum(s) FROM g").await,
        vec![vec![GROUPS.to_string(), N.to_string(), total.to_string()]]
    );
    for g in [0, 1, 123_457, GROUPS - 1] {
        let k = if g == 0 { GROUPS } else { g };
        assert_eq!(
            rows(&c, &format!("SELECT c, s FROM g WHERE g = {g}")).await,
            vec![vec!["2".to_string(), (2 * k + GROUPS).to_string()]],
            "group {g}"
        );
    }

    // What the operators hold: a fraction of the groups, within the slots'
    // share; the rest on disk.
    c.batch_execute("CHECKPOINT").await.unwrap();
    let state = rows(
        &c,
        "SELECT operator, backend, keys_in_memory, bytes_in_memory, bytes_on_disk \
         FROM weir_catalog.state WHERE name = 'g' ORDER BY operator, subtask",
    )
    .await;
    assert_eq!(
        state.len(),
        6,
        "two subtasks of HashAgg, Materialize and its changelog: {state:?}"
    );
    let mut on_disk = 0;
    for r in &state {
        assert_eq!(r[1], "rocksdb", "{r:?}");
        let (keys, bytes): (i64, i64) = (r[2].parse().unwrap(), r[3].parse().unwrap());
        assert!(
            keys < GROUPS / 4,
            "a fraction of the groups in memory: {r:?}"
        );
        assert!(bytes <= 2 << 20, "within the slot's operator share: {r:?}");
        on_disk += r[4].parse::<i64>().unwrap();
    }
    assert!(on_disk > 0, "the groups are on disk: {state:?}");
    // Counted exactly, wherever they are: every group once in HashAgg and
    // once, as its row, in Materialize.
    assert_eq!(
        rows(
            &c,
            "SELECT operator, sum(keys) FROM weir_catalog.state WHERE name = 'g' \
             AND operator IN ('HashAgg', 'Materialize') GROUP BY 1 ORDER BY 1",
        )
        .await,
        vec![
            vec!["HashAgg".to_string(), GROUPS.to_string()],
            vec!["Materialize".to_string(), GROUPS.to_string()],
        ]
    );
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    for r in rows(
        &c,
        "SELECT managed_memory_bytes, operator_memory_used FROM weir_catalog.slots",
    )
    .await
    {
        let (share, used): (i64, i64) = (r[0].parse().unwrap(), r[1].parse().unwrap());
        assert!(
            used <= share / 2,
            "operators use at most half a slot: {r:?}"
        );
    }

    // The heap backend cannot hold the same state in the same memory: the
    // view fails, named, with 53200; the server and `g` go on.
    c.batch_execute("SET state_backend = 'heap'").await.unwrap();
    expect_error(
        &c,
        &format!("CREATE MATERIALIZED VIEW h AS {view}"),
        "53200",
        "materialized view \"h\" failed: out of managed memory",
    )
    .await;
    assert_eq!(one(&c, "SELECT sum(c) FROM g").await, N.to_string());

    // A global aggregate's state is provably small: heap by default.
    c.batch_execute("RESET state_backend").await.unwrap();
    let plan = rows(
        &c,
        "EXPLAIN CREATE MATERIALIZED VIEW n AS SELECT count(*) FROM seq",
    )
    .await;
    assert_eq!(plan[0][0], "StreamGraph (state backend: heap):");

    let pid = server.pid().expect("running");
    let peak = peak_rss_kib(pid);
    eprintln!("peak RSS of the server: {} MiB", peak >> 10);
    assert!(peak < 1_500 << 10, "peak RSS {peak} KiB");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_left_join_past_managed_memory_keeps_its_rows_in_rocksdb() {
    const ROWS: i64 = 200_000;
    let mut server = small_server();
    let c = server.client().await;
    for side in ["l", "r"] {
        c.batch_execute(&format!(
            "CREATE SOURCE {side} (k bigint) WITH (connector = 'datagen', \
             datagen.rows.per.second = '0', fields.k.kind = 'sequence', \
             fields.k.start = '1', fields.k.end = '{ROWS}')"
        ))
        .await
        .unwrap();
    }
    c.batch_execute(
        "SET streaming_parallelism = 2; SET state_backend = 'rocksdb'; \
         CREATE MATERIALIZED VIEW j AS SELECT l.k, r.k AS rk, r.k * 3 AS r3 \
         FROM l LEFT JOIN (SELECT k FROM r WHERE k % 2 = 0) r ON l.k = r.k",
    )
    .await
    .unwrap();
    eventually(
        &c,
        "SELECT count(*) > 0 FROM weir_catalog.checkpoints WHERE view = 'j' AND state = 'COMPLETED'",
        "t",
        &server,
    )
    .await;
    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute("FLUSH").await.unwrap();

    // Closed forms: every left row once; the even ones matched.
    let half = ROWS / 2;
    assert_eq!(
        rows(&c, "SELECT count(*), count(rk), sum(rk), sum(r3) FROM j").await,
        vec![vec![
            ROWS.to_string(),
            half.to_string(),
            (half * (half + 1)).to_string(),
            (3 * half * (half + 1)).to_string(),
        ]]
    );
    for k in [1, 2, 99_999, 100_000, ROWS] {
        let matched = (k % 2 == 0).then(|| k.to_string());
        assert_eq!(
            rows(&c, &format!("SELECT rk FROM j WHERE k = {k}")).await,
            vec![vec![matched.unwrap_or_else(|| "NULL".into())]],
            "left row {k}"
        );
    }

    c.batch_execute("CHECKPOINT").await.unwrap();
    let joins = rows(
        &c,
        "SELECT backend, keys_in_memory, bytes_in_memory, bytes_on_disk, cache_misses \
         FROM weir_catalog.state WHERE name = 'j' AND operator = 'HashJoin'",
    )
    .await;
    assert_eq!(joins.len(), 2, "two join subtasks: {joins:?}");
    for r in &joins {
        assert_eq!(r[0], "rocksdb", "{r:?}");
        let (keys, bytes): (i64, i64) = (r[1].parse().unwrap(), r[2].parse().unwrap());
        assert!(
            keys < ROWS / 4,
            "a fraction of the join keys in memory: {r:?}"
        );
        assert!(bytes <= 2 << 20, "within the slot's operator share: {r:?}");
        assert!(r[3].parse::<i64>().unwrap() > 0, "rows on disk: {r:?}");
    }
    // Join keys per side: every left key, the even right ones.
    assert_eq!(
        one(
            &c,
            "SELECT sum(keys) FROM weir_catalog.state WHERE name = 'j' AND operator = 'HashJoin'"
        )
        .await,
        (ROWS + ROWS / 2).to_string()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn one_huge_top_n_partition_a_hot_join_key_and_a_huge_group_keep_a_page_in_memory() {
    // 200,000 rows in one TopN partition (a view's ORDER BY … LIMIT has
    // no PARTITION BY), in one window partition (lag and a ROWS frame
    // without PARTITION BY), two more (row_number, rank and a running
    // sum, streamed through DataFusion) and three more (the partition's
    // sum and count, ntile and percent_rank: streamed twice), under one
    // join key and in one group's value sets
    // (a retractable min and max, a count of distinct values): tens of
    // MiB each, in a 2 MiB share.
    const ROWS: i64 = 200_000;
    const P: i64 = 200_003; // prime: v = k * 7919 % P is distinct per row
    let mut server = small_server();
    let c = server.client().await;
    c.batch_execute(&format!(
        "CREATE TABLE t (k bigint, v bigint, g bigint); \
         CREATE TABLE d (g bigint, name text); \
         SET state_backend = 'rocksdb'; \
         CREATE MATERIALIZED VIEW top5 AS SELECT k, v FROM t ORDER BY v DESC LIMIT 5; \
         CREATE MATERIALIZED VIEW joined AS SELECT d.name, count(*) AS c, sum(t.k) AS s \
         FROM t LEFT JOIN d ON t.g = d.g GROUP BY 1; \
         CREATE MATERIALIZED VIEW extremes AS SELECT count(*) AS c, min(v) AS mn, max(v) AS mx, \
         count(DISTINCT v % 100000) AS d FROM t; \
         CREATE MATERIALIZED VIEW neighbours AS SELECT k, v, lag(v) OVER (ORDER BY k) AS prev, \
         sum(v) OVER (ORDER BY k ROWS BETWEEN 1 PRECEDING AND 1 FOLLOWING) AS near FROM t; \
         CREATE MATERIALIZED VIEW running AS SELECT k, row_number() OVER (ORDER BY k) AS n, \
         rank() OVER (ORDER BY k / 10) AS r, sum(v) OVER (ORDER BY k / 10) AS run FROM t; \
         CREATE MATERIALIZED VIEW relative AS SELECT k, sum(v) OVER () AS total, \
         count(*) OVER () AS c, ntile(7) OVER (ORDER BY k) AS t, \
         sum(v) OVER (ORDER BY k ROWS BETWEEN CURRENT ROW AND UNBOUNDED FOLLOWING) AS rest, \
         percent_rank() OVER (ORDER BY k / 10) AS pr, \
         cume_dist() OVER (ORDER BY k / 10) AS cd FROM t; \
         INSERT INTO t SELECT k, k * 7919 % {P}, 0 FROM generate_series(1, {ROWS}) AS s(k)"
    ))
    .await
    .unwrap();
    // The top five by a separate recomputation, of the rows with v <= max.
    let expected = |max: i64| -> Vec<Vec<String>> {
        let mut all: Vec<(i64, i64)> = (1..=ROWS)
            .map(|k| (k * 7919 % P, k))
            .filter(|(v, _)| *v <= max)
            .collect();
        all.sort_unstable_by(|a, b| b.cmp(a));
        all.iter()
            .take(5)
            .map(|(v, k)| vec![k.to_string(), v.to_string()])
            .collect()
    };
    let top = "SELECT k, v FROM top5 ORDER BY v DESC";
    // The aggregates of the rows with v <= max, recomputed apart.
    let extremes = |max: i64| -> Vec<Vec<String>> {
        let v: Vec<i64> = (1..=ROWS)
            .map(|k| k * 7919 % P)
            .filter(|v| *v <= max)
            .collect();
        let distinct: std::collections::HashSet<i64> = v.iter().map(|v| v % 100_000).collect();
        vec![vec![
            v.len().to_string(),
            v.iter().min().unwrap().to_string(),
            v.iter().max().unwrap().to_string(),
            distinct.len().to_string(),
        ]]
    };
    let agg = "SELECT c, mn, mx, d FROM extremes";
    // Each row's previous v and the sum of v over it and its neighbours,
    // in k order, of the rows with v <= max, recomputed apart: their
    // number and sums weighted by k (a row paired with the wrong
    // neighbour changes them).
    let neighbours = |max: i64| -> Vec<Vec<String>> {
        let v: Vec<(i64, i64)> = (1..=ROWS)
            .map(|k| (k, k * 7919 % P))
            .filter(|(_, v)| *v <= max)
            .collect();
        let (mut prev, mut near) = (0i64, 0i64);
        for (i, (k, _)) in v.iter().enumerate() {
            if i > 0 {
                prev += k * v[i - 1].1;
            }
            let around = &v[i.saturating_sub(1)..(i + 2).min(v.len())];
            near += k * around.iter().map(|(_, v)| v).sum::<i64>();
        }
        vec![vec![
            v.len().to_string(),
            prev.to_string(),
            near.to_string(),
        ]]
    };
    let paired = "SELECT count(*), sum(k * prev), sum(k * near) FROM neighbours";
    // Row numbers in k order, ranks and running sums of v over k / 10
    // (ties of ten rows: peers share both), of the rows with v <= max,
    // recomputed apart; weighted by k, the sums taken modulo a prime to
    // stay within bigint.
    const M: i64 = 1_000_003;
    let numbered = |max: i64| -> Vec<Vec<String>> {
        let v: Vec<(i64, i64)> = (1..=ROWS)
            .map(|k| (k, k * 7919 % P))
            .filter(|(_, v)| *v <= max)
            .collect();
        let (mut n, mut r, mut run) = (0i64, 0i64, 0i64);
        let (mut below, mut before) = (0i64, 0i64);
        for (i, (k, _)) in v.iter().enumerate() {
            n += k * (i as i64 + 1);
        }
        for peers in v.chunk_by(|(a, _), (b, _)| a / 10 == b / 10) {
            let upto = before + peers.iter().map(|(_, v)| v).sum::<i64>();
            for (k, _) in peers {
                r += k * (below + 1);
                run += k * (upto % M);
            }
            below += peers.len() as i64;
            before = upto;
        }
        vec![vec![
            v.len().to_string(),
            n.to_string(),
            r.to_string(),
            run.to_string(),
        ]]
    };
    let running =
        format!("SELECT count(*), sum(k * n), sum(k * r), sum(k * (run % {M})) FROM running");
    // The partition's sum and count at every row, sevenths of the rows in
    // k order (the first count % 7 one row larger), the sum of v from the
    // row to the last and relative ranks over k / 10, (rank - 1) /
    // (count - 1), and the share of rows up to the last peer, of the rows
    // with v <= max, recomputed apart; sevenths and sums (modulo a prime)
    // weighted by k, ranks and shares (times the count) summed.
    let relative = |max: i64| -> Vec<Vec<String>> {
        let v: Vec<(i64, i64)> = (1..=ROWS)
            .map(|k| (k, k * 7919 % P))
            .filter(|(_, v)| *v <= max)
            .collect();
        let count = v.len() as i64;
        let total: i64 = v.iter().map(|(_, v)| v).sum();
        let mut sizes: Vec<i64> = (0..7)
            .map(|s| count / 7 + i64::from(s < count % 7))
            .collect();
        let (mut seventh, mut weighted) = (0usize, 0i64);
        for (k, _) in &v {
            while sizes[seventh] == 0 {
                seventh += 1;
            }
            sizes[seventh] -= 1;
            weighted += k * (seventh as i64 + 1);
        }
        let mut rest = 0i64;
        let mut tail = 0i64;
        for (k, v) in v.iter().rev() {
            tail += v;
            rest += k * (tail % M);
        }
        let (mut below, mut ranks, mut shares) = (0i64, 0i64, 0i64);
        for peers in v.chunk_by(|(a, _), (b, _)| a / 10 == b / 10) {
            let n = peers.len() as i64;
            ranks += below * n;
            shares += (below + n) * n;
            below += n;
        }
        vec![vec![
            count.to_string(),
            total.to_string(),
            count.to_string(),
            count.to_string(),
            weighted.to_string(),
            rest.to_string(),
            ranks.to_string(),
            shares.to_string(),
        ]]
    };
    let relatives = format!(
        "SELECT count(*), min(total), min(c), max(c), sum(k * t), sum(k * (rest % {M})), \
         sum(round(pr * (c - 1))::bigint), sum(round(cd * c)::bigint) FROM relative"
    );
    c.batch_execute("FLUSH").await.unwrap();
    assert_eq!(rows(&c, top).await, expected(P));
    assert_eq!(rows(&c, agg).await, extremes(P));
    assert_eq!(rows(&c, paired).await, neighbours(P));
    assert_eq!(rows(&c, &running).await, numbered(P));
    assert_eq!(rows(&c, &relatives).await, relative(P));
    let sum = ROWS * (ROWS + 1) / 2;
    assert_eq!(
        rows(&c, "SELECT name, c, s FROM joined").await,
        vec![vec!["NULL".to_string(), ROWS.to_string(), sum.to_string()]]
    );

    // The top rows go: the next ones come up from the store.
    c.batch_execute("DELETE FROM t WHERE v > 199000; FLUSH")
        .await
        .unwrap();
    assert_eq!(rows(&c, top).await, expected(199_000));
    assert_eq!(rows(&c, agg).await, extremes(199_000));
    assert_eq!(rows(&c, paired).await, neighbours(199_000));
    assert_eq!(rows(&c, &running).await, numbered(199_000));
    assert_eq!(rows(&c, &relatives).await, relative(199_000));
    let left = one(&c, "SELECT count(*) FROM t").await;
    assert!(
        left.parse::<i64>().unwrap() < ROWS - 900,
        "{left} rows left"
    );

    // The hot key meets a row of the other side, after a kill -9.
    eventually(
        &c,
        "SELECT count(*) > 0 FROM weir_catalog.checkpoints WHERE view = 'joined' AND state = 'COMPLETED'",
        "t",
        &server,
    )
    .await;
    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute("INSERT INTO d VALUES (0, 'x'); DELETE FROM t WHERE v > 198000; FLUSH")
        .await
        .unwrap();
    assert_eq!(rows(&c, top).await, expected(198_000));
    assert_eq!(rows(&c, agg).await, extremes(198_000));
    assert_eq!(rows(&c, paired).await, neighbours(198_000));
    assert_eq!(rows(&c, &running).await, numbered(198_000));
    assert_eq!(rows(&c, &relatives).await, relative(198_000));
    let (n, s) = (
        one(&c, "SELECT count(*) FROM t").await,
        one(&c, "SELECT sum(k) FROM t").await,
    );
    assert_eq!(
        rows(&c, "SELECT name, c, s FROM joined").await,
        vec![vec!["x".to_string(), n, s]]
    );

    // Each key is in memory, a page of it (the whole key would be tens of
    // MiB), and never evicted: cut back instead.
    c.batch_execute("CHECKPOINT").await.unwrap();
    let state = rows(
        &c,
        "SELECT name, operator, sum(keys), sum(bytes_in_memory), sum(evictions) \
         FROM weir_catalog.state \
         WHERE operator IN ('TopN', 'HashJoin', 'HashAgg (value sets)', 'OverWindow') \
         GROUP BY 1, 2 ORDER BY 1",
    )
    .await;
    let keys: Vec<(&str, &str)> = state
        .iter()
        .map(|r| (r[0].as_str(), r[2].as_str()))
        .collect();
    assert_eq!(
        keys,
        vec![
            // min's, max's and count's sets
            ("extremes", "3"),
            // one key on each side of the join
            ("joined", "2"),
            // one window partition
            ("neighbours", "1"),
            // one partition for each ORDER BY (none, k, k / 10), streamed
            // in two passes (k's from its end); k / 10's functions read
            // both ways, so two OverWindows, each with the partition
            ("relative", "4"),
            // one partition for each ORDER BY, streamed
            ("running", "2"),
            ("top5", "1"),
        ],
        "{state:?}"
    );
    for r in &state {
        let bytes: i64 = r[3].parse().unwrap();
        assert!(
            bytes > 0 && bytes < 1 << 20,
            "a page of the key in memory: {r:?}"
        );
        assert_eq!(r[4], "0", "{r:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn window_and_ttl_timers_live_in_rocksdb_and_survive_kill_9() {
    // 100,000 rows 100 ms apart (about 2.8 hours), a watermark an hour
    // behind: tens of thousands of open windows' groups at any time.
    const ROWS: i64 = 100_000;
    let mut server = small_server();
    let c = server.client().await;
    c.batch_execute(
        "CREATE STREAM ev (k bigint, ts timestamp, WATERMARK FOR ts AS ts - INTERVAL '1' HOUR); \
         SET streaming_parallelism = 2; SET state_backend = 'rocksdb'; \
         CREATE MATERIALIZED VIEW w AS SELECT window_end, k % 1000 AS g, count(*) AS c, \
         sum(k) AS s FROM TUMBLE(ev, ts, INTERVAL '1' MINUTE) GROUP BY 1, 2 \
         EMIT ON WINDOW CLOSE; \
         SET streaming_state_ttl = '30s'; \
         CREATE MATERIALIZED VIEW t AS SELECT k % 50000 AS g, count(*) AS c FROM ev GROUP BY 1",
    )
    .await
    .unwrap();
    let insert = |from: i64, to: i64| {
        format!(
            "INSERT INTO ev SELECT v, TIMESTAMP '2026-01-01 00:00:00' + v * INTERVAL '100 milliseconds' \
             FROM generate_series({from}, {to}) AS s(v)"
        )
    };
    c.batch_execute(&insert(1, ROWS / 2)).await.unwrap();
    c.batch_execute("FLUSH; CHECKPOINT").await.unwrap();
    // The TTL's groups are still there, each with its timer (30 s leaves
    // room for a slow machine between the insert and this read).
    assert_ne!(one(&c, "SELECT count(*) FROM t").await, "0");
    let ttl = rows(
        &c,
        "SELECT backend FROM weir_catalog.state WHERE name = 't' AND operator = 'HashAgg (state TTL)'",
    )
    .await;
    assert_eq!(ttl, vec![vec!["rocksdb".to_string()]; 2], "two subtasks");

    server.crash_and_restart();
    let c = server.client().await;
    c.batch_execute(&insert(ROWS / 2 + 1, ROWS)).await.unwrap();
    c.batch_execute("FLUSH").await.unwrap();

    // The watermark ends at 10,000 s - 1 h = 6,400 s: windows ending by
    // 6,360 s are closed, rows k < 63,600, each its own group.
    let closed = 63_599i64;
    assert_eq!(
        rows(
            &c,
            "SELECT count(*), sum(c), sum(s), max(window_end) FROM w"
        )
        .await,
        vec![vec![
            closed.to_string(),
            closed.to_string(),
            (closed * (closed + 1) / 2).to_string(),
            "2026-01-01 01:46:00".to_string(),
        ]]
    );
    // Every group of `t` expires, those restored from the checkpoint too.
    eventually(&c, "SELECT count(*) FROM t", "0", &server).await;
    assert!(
        !server
            .log_text()
            .contains("indexing the groups of an earlier checkpoint"),
        "the timers came back with the checkpoint"
    );
}

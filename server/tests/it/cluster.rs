//! A real cluster on loopback: one `weir jobmanager` and several
//! `weir taskmanager` processes talking gRPC.
//!
//! - Views whose subtasks are spread over TaskManagers (network shuffle
//!   between them, state gathered from all of them by `SELECT`) equal their
//!   queries recomputed from the tables.
//! - `kill -9` of a TaskManager while rows stream in: it is declared lost,
//!   its jobs restart on the slots that are left (and later on a
//!   TaskManager started afterwards), and the views are still exact.
//! - A JobManager killed and restarted: the TaskManagers register again and
//!   the views go on.
//! - Checkpoints in an S3-compatible object store: after everything is
//!   killed, new TaskManagers with empty disks restore the views from it.
//! - A TaskManager that cannot reach a JobManager gives up after its
//!   registration timeout, with a message that says so.
//!
//! Detection and recovery times are printed (`--nocapture`); the figures in
//! docs/cluster.md come from here.

use crate::common;

use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use common::s3::S3Server;
use common::{connect, free_port, rows, spawn_weir, spawn_weir_with, wait_for_port};

/// Settings that make failure detection quick enough for a test.
fn cluster_args(slot_timeout_ms: u64, restart_strategy: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--checkpoint-interval-ms",
        "200",
        "--heartbeat-interval-ms",
        "300",
        "--heartbeat-timeout-ms",
        "3000",
        "--restart-attempts",
        "20",
        "--restart-delay-ms",
        "300",
        "--managed-memory-mb",
        "64",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.push("--slot-request-timeout-ms".into());
    args.push(slot_timeout_ms.to_string());
    args.push("--restart-strategy".into());
    args.push(restart_strategy.into());
    args
}

struct TaskManager {
    child: Option<Child>,
    rpc: u16,
}

/// A JobManager and its TaskManagers, each with its own port and directory.
struct TestCluster {
    dir: tempfile::TempDir,
    jm: Option<Child>,
    pg: u16,
    rpc: u16,
    tms: Vec<TaskManager>,
    slot_timeout_ms: u64,
    restart_strategy: &'static str,
    /// Environment of every process (for example an object store's).
    env: Vec<(String, String)>,
    /// Extra arguments of the JobManager.
    jm_args: Vec<String>,
}

impl TestCluster {
    fn start(task_managers: usize, slots: usize, parallelism: usize) -> Self {
        Self::start_with(task_managers, slots, parallelism, 20_000)
    }

    fn start_with(
        task_managers: usize,
        slots: usize,
        parallelism: usize,
        slot_timeout_ms: u64,
    ) -> Self {
        Self::start_full(
            task_managers,
            slots,
            parallelism,
            slot_timeout_ms,
            "fixed-delay",
        )
    }

    fn start_full(
        task_managers: usize,
        slots: usize,
        parallelism: usize,
        slot_timeout_ms: u64,
        restart_strategy: &'static str,
    ) -> Self {
        let mut c = TestCluster {
            dir: tempfile::tempdir().expect("temp dir"),
            jm: None,
            pg: free_port(),
            rpc: free_port(),
            tms: Vec::new(),
            slot_timeout_ms,
            restart_strategy,
            env: Vec::new(),
            jm_args: Vec::new(),
        };
        c.start_processes(task_managers, slots, parallelism);
        c
    }

    /// A cluster whose checkpoints go to `checkpoint_dir` in `s3`.
    fn start_on_s3(
        task_managers: usize,
        slots: usize,
        parallelism: usize,
        s3: &S3Server,
        checkpoint_dir: &str,
    ) -> Self {
        let mut c = TestCluster {
            dir: tempfile::tempdir().expect("temp dir"),
            jm: None,
            pg: free_port(),
            rpc: free_port(),
            tms: Vec::new(),
            slot_timeout_ms: 20_000,
            restart_strategy: "fixed-delay",
            env: s3.env(),
            jm_args: vec!["--checkpoint-dir".into(), checkpoint_dir.into()],
        };
        c.start_processes(task_managers, slots, parallelism);
        c
    }

    fn start_processes(&mut self, task_managers: usize, slots: usize, parallelism: usize) {
        self.start_job_manager(parallelism);
        for _ in 0..task_managers {
            self.add_task_manager(slots);
        }
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    fn start_job_manager(&mut self, parallelism: usize) {
        let mut args: Vec<String> = vec![
            "jobmanager".into(),
            "--listen".into(),
            format!("127.0.0.1:{}", self.pg),
            "--rpc-listen".into(),
            format!("127.0.0.1:{}", self.rpc),
            "--data-dir".into(),
            self.dir.path().join("jobmanager").display().to_string(),
            "--default-parallelism".into(),
            parallelism.to_string(),
        ];
        args.extend(cluster_args(self.slot_timeout_ms, self.restart_strategy));
        args.extend(self.jm_args.iter().cloned());
        let log = self.log("jobmanager");
        self.jm = Some(spawn_weir_with(&args, &self.env, &log));
        wait_for_port(self.pg, "jobmanager", &log);
    }

    fn add_task_manager(&mut self, slots: usize) -> usize {
        let i = self.tms.len();
        let rpc = free_port();
        let mut args: Vec<String> = vec![
            "taskmanager".into(),
            "--jobmanager".into(),
            format!("127.0.0.1:{}", self.rpc),
            "--rpc-listen".into(),
            format!("127.0.0.1:{rpc}"),
            "--slots".into(),
            slots.to_string(),
            "--data-dir".into(),
            self.dir.path().join(format!("tm{i}")).display().to_string(),
        ];
        args.extend(cluster_args(self.slot_timeout_ms, self.restart_strategy));
        let log = self.log(&format!("tm{i}"));
        self.tms.push(TaskManager {
            child: Some(spawn_weir_with(&args, &self.env, &log)),
            rpc,
        });
        wait_for_port(rpc, "taskmanager", &log);
        i
    }

    fn kill9(child: &mut Option<Child>) {
        if let Some(mut c) = child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn logs(&self) -> String {
        let mut out = String::new();
        let mut names = vec!["jobmanager".to_string()];
        names.extend((0..self.tms.len()).map(|i| format!("tm{i}")));
        for n in names {
            let text = std::fs::read_to_string(self.log(&n)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out.push_str(&format!("--- {n} (last lines)\n"));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }

    async fn client(&self) -> tokio_postgres::Client {
        connect(self.pg).await
    }

    /// Waits until the TaskManager `resource_id` is in `state`.
    async fn wait_state(&self, resource_id: &str, state: &str) {
        self.wait_for(
            &format!(
                "SELECT state FROM weir_catalog.task_managers WHERE resource_id = '{resource_id}'"
            ),
            Duration::from_secs(30),
            |r| r.first().is_some_and(|r| r[0] == state),
        )
        .await;
    }

    /// Waits until every subtask runs again, none on `resource_id`.
    async fn wait_moved_off(&self, resource_id: &str) {
        self.wait_for(
            &format!(
                "SELECT count(*) FROM weir_catalog.subtasks WHERE task_manager = '{resource_id}' OR state <> 'RUNNING'"
            ),
            Duration::from_secs(60),
            |r| r[0][0] == "0",
        )
        .await;
    }

    /// Waits until `n` TaskManagers are registered.
    async fn wait_registered(&self, n: usize) {
        self.wait_for(
            "SELECT count(*) FROM weir_catalog.task_managers WHERE state = 'REGISTERED'",
            Duration::from_secs(60),
            |r| r[0][0] == n.to_string(),
        )
        .await;
    }

    /// Waits until `sql` returns rows that satisfy `ok`.
    async fn wait_for(
        &self,
        sql: &str,
        timeout: Duration,
        ok: impl Fn(&[Vec<String>]) -> bool,
    ) -> Vec<Vec<String>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok((client, conn)) = tokio_postgres::connect(
                &format!(
                    "host=127.0.0.1 port={} user=weir dbname=weir password={}",
                    self.pg,
                    common::PASSWORD
                ),
                tokio_postgres::NoTls,
            )
            .await
            {
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                if let Ok(msgs) = client.simple_query(sql).await {
                    let mut got = Vec::new();
                    for m in msgs {
                        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                            got.push(
                                (0..r.len())
                                    .map(|i| r.get(i).unwrap_or("NULL").to_string())
                                    .collect(),
                            );
                        }
                    }
                    if ok(&got) {
                        return got;
                    }
                }
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {sql}\n{}", self.logs());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for tm in &mut self.tms {
            Self::kill9(&mut tm.child);
        }
        Self::kill9(&mut self.jm);
    }
}

const VIEWS: &[(&str, &str)] = &[
    (
        "per_kind",
        "SELECT kind, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi FROM events GROUP BY kind",
    ),
    (
        "joined",
        "SELECT e.id, e.v, k.label FROM events e JOIN kinds k ON e.kind = k.kind",
    ),
    (
        "label_totals",
        "SELECT label, count(*) AS n, sum(v) AS s FROM joined GROUP BY label",
    ),
];

async fn create_schema(client: &tokio_postgres::Client) {
    client
        .batch_execute(
            "CREATE TABLE events (id BIGINT PRIMARY KEY, kind TEXT, v BIGINT);
             CREATE TABLE kinds (kind TEXT PRIMARY KEY, label TEXT);
             INSERT INTO kinds VALUES ('k0', 'zero'), ('k1', 'one'), ('k2', 'two'), ('k3', 'three'), ('k4', 'four');",
        )
        .await
        .expect("schema");
    for (name, sql) in VIEWS {
        client
            .batch_execute(&format!("CREATE MATERIALIZED VIEW {name} AS {sql}"))
            .await
            .unwrap_or_else(|e| panic!("create {name}: {e}"));
    }
}

/// Inserts events `ids`, `v` = id, spread over the five kinds.
async fn insert_events(client: &tokio_postgres::Client, ids: std::ops::Range<i64>) {
    for id in ids {
        client
            .batch_execute(&format!(
                "INSERT INTO events VALUES ({id}, 'k{}', {id})",
                id % 5
            ))
            .await
            .unwrap();
    }
}

/// Every view equals its query over the tables, after a FLUSH.
async fn assert_views_exact(cluster: &TestCluster) {
    let client = cluster.client().await;
    client.batch_execute("FLUSH").await.expect("flush");
    for (name, sql) in VIEWS {
        let mut view = rows(&client, &format!("SELECT * FROM {name}")).await;
        let mut recomputed = rows(&client, sql).await;
        view.sort();
        recomputed.sort();
        assert_eq!(
            view,
            recomputed,
            "view {name} differs from its query\n{}",
            cluster.logs()
        );
    }
}

/// Inserts and deletes until stopped; returns how many inserts were
/// acknowledged.
async fn writer(port: u16, next: Arc<AtomicI64>, stop: Arc<AtomicBool>) -> usize {
    let client = connect(port).await;
    let mut n = 0;
    while !stop.load(Ordering::SeqCst) {
        let id = next.fetch_add(1, Ordering::SeqCst);
        let sql = format!(
            "INSERT INTO events VALUES ({id}, 'k{}', {})",
            id % 5,
            id % 97
        );
        if client.simple_query(&sql).await.is_ok() {
            n += 1;
        }
        if id % 7 == 0 {
            let _ = client
                .simple_query(&format!(
                    "UPDATE events SET v = v + 1 WHERE id = {}",
                    id - 5
                ))
                .await;
        }
        if id % 10 == 0 {
            let _ = client
                .simple_query(&format!("DELETE FROM events WHERE id = {}", id - 3))
                .await;
        }
    }
    n
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_spread_over_task_managers_are_exact() {
    // Parallelism 4 over two TaskManagers of two slots: every hash exchange
    // crosses the network.
    let cluster = TestCluster::start(2, 2, 4);
    cluster.wait_registered(2).await;
    // The same statements on a playground, for comparison.
    let playground = common::Server::start();
    let reference = playground.client().await;
    let client = cluster.client().await;
    for c in [&client, &reference] {
        create_schema(c).await;
        for id in 0..400 {
            c.batch_execute(&format!(
                "INSERT INTO events VALUES ({id}, 'k{}', {})",
                id % 5,
                id % 13
            ))
            .await
            .unwrap();
        }
        c.batch_execute("UPDATE events SET v = v * 2 WHERE id % 3 = 0; DELETE FROM events WHERE id % 11 = 0; UPDATE kinds SET label = 'ONE' WHERE kind = 'k1'; FLUSH")
            .await
            .unwrap();
    }
    assert_views_exact(&cluster).await;
    for (name, _) in VIEWS {
        let sql = format!("SELECT * FROM {name} ORDER BY 1, 2, 3");
        assert_eq!(
            rows(&client, &sql).await,
            rows(&reference, &sql).await,
            "{name}: cluster and playground differ"
        );
    }

    // A view's whole history, read from both TaskManagers' changelogs
    // (ScanChanges over gRPC), folds into the view.
    let (name, _) = VIEWS[0];
    history_folds_into_view(&client, name, "h").await;

    // The subtasks of each view run on both TaskManagers.
    let spread = rows(
        &client,
        "SELECT view, count(DISTINCT task_manager) FROM weir_catalog.subtasks GROUP BY view ORDER BY view",
    )
    .await;
    assert_eq!(spread.len(), VIEWS.len(), "{spread:?}");
    for r in &spread {
        assert_eq!(r[1], "2", "{r:?} runs on one task manager only");
    }
    let running = rows(
        &client,
        "SELECT count(*) FROM weir_catalog.subtasks WHERE state <> 'RUNNING'",
    )
    .await;
    assert_eq!(running[0][0], "0");
    let slots = rows(
        &client,
        "SELECT count(*) FROM weir_catalog.slots WHERE state = 'ALLOCATED'",
    )
    .await;
    assert!(slots[0][0].parse::<i64>().unwrap() >= 4, "{slots:?}");
    let jobs = rows(&client, "SHOW JOBS").await;
    assert_eq!(jobs.len(), VIEWS.len());
    // Each slot owns an equal share of its TaskManager's managed memory.
    let memory = rows(
        &client,
        "SELECT DISTINCT managed_memory_bytes FROM weir_catalog.slots",
    )
    .await;
    assert_eq!(memory, vec![vec![(32 << 20).to_string()]]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_waits_for_the_slots_a_late_task_manager_brings() {
    let mut cluster = TestCluster::start_with(1, 2, 4, 4000);
    cluster.wait_registered(1).await;
    let client = cluster.client().await;
    client
        .batch_execute("CREATE TABLE t (k INT, v INT); INSERT INTO t VALUES (1, 10), (2, 20)")
        .await
        .unwrap();
    // Four subtasks, two slots: the request waits for a TaskManager.
    let pending = tokio::spawn({
        let port = cluster.pg;
        async move {
            let client = connect(port).await;
            client
                .batch_execute(
                    "CREATE MATERIALIZED VIEW s AS SELECT k, sum(v) AS s FROM t GROUP BY k",
                )
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    cluster.add_task_manager(2);
    pending
        .await
        .unwrap()
        .expect("the view gets the late slots");
    assert_eq!(
        rows(&client, "SELECT k, s FROM s ORDER BY k").await,
        vec![vec!["1", "10"], vec!["2", "20"]]
    );
    // More subtasks than the cluster has slots: 53000 once the wait is over.
    client
        .batch_execute("SET streaming_parallelism = 8")
        .await
        .unwrap();
    let err = client
        .batch_execute("CREATE MATERIALIZED VIEW big AS SELECT k, count(*) FROM t GROUP BY k")
        .await
        .unwrap_err();
    let db = err.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "53000");
    assert!(
        db.message().contains("needs 8 slots") && db.message().contains("has 4"),
        "{}",
        db.message()
    );
    let gone = client.simple_query("SELECT * FROM big").await.unwrap_err();
    assert_eq!(
        gone.as_db_error().map(|e| e.code().code()),
        Some("42P01"),
        "a view that could not start is not in the catalog"
    );
    // A table that reads a connector: its job's subtasks, on the
    // TaskManagers, write into the table on the JobManager over RPC.
    client
        .batch_execute(
            "SET streaming_parallelism = 2;
             CREATE TABLE g (id INT PRIMARY KEY, v INT) WITH (connector = 'datagen',
               datagen.split.num = '2', datagen.rows.per.second = '0',
               fields.id.kind = 'sequence', fields.id.start = '1', fields.id.end = '1000',
               fields.v.min = '0', fields.v.max = '9');
             FLUSH",
        )
        .await
        .unwrap();
    assert_eq!(
        rows(&client, "SELECT count(*), min(id), max(id) FROM g").await,
        vec![vec!["1000", "1", "1000"]]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_task_manager_fails_its_jobs_over() {
    // Six slots on three TaskManagers, jobs of parallelism 4: losing one
    // TaskManager leaves four.
    let mut cluster = TestCluster::start(3, 2, 4);
    cluster.wait_registered(3).await;
    let client = cluster.client().await;
    create_schema(&client).await;

    for round in 0..2 {
        let next = Arc::new(AtomicI64::new(100_000 * (round + 1)));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..2)
            .map(|_| tokio::spawn(writer(cluster.pg, next.clone(), stop.clone())))
            .collect();
        tokio::time::sleep(Duration::from_millis(1500)).await;

        // A TaskManager that runs subtasks of the views.
        let victims = rows(
            &client,
            "SELECT DISTINCT task_manager FROM weir_catalog.subtasks ORDER BY task_manager",
        )
        .await;
        let victim_id = victims.last().expect("subtasks")[0].clone();
        let victim = cluster
            .tms
            .iter()
            .position(|tm| victim_id.ends_with(&format!(":{}", tm.rpc)))
            .unwrap_or_else(|| panic!("no task manager {victim_id}"));
        let killed = Instant::now();
        TestCluster::kill9(&mut cluster.tms[victim].child);

        cluster.wait_state(&victim_id, "LOST").await;
        let detected = killed.elapsed();
        cluster
            .wait_for(
                "SELECT count(*) FROM weir_catalog.jobs WHERE state = 'RUNNING' AND restarts > 0",
                Duration::from_secs(60),
                |r| r[0][0] == VIEWS.len().to_string(),
            )
            .await;
        cluster.wait_moved_off(&victim_id).await;
        let recovered = killed.elapsed();
        tokio::time::sleep(Duration::from_millis(1000)).await;
        stop.store(true, Ordering::SeqCst);
        let mut acknowledged = 0;
        for w in writers {
            acknowledged += w.await.unwrap();
        }
        assert!(acknowledged > 0, "no write went through");
        assert_views_exact(&cluster).await;
        if round == 1 {
            // The TaskManager that joined after round 0 had the least
            // loaded slots: the restarted jobs run on it.
            let newcomer = format!("taskmanager-127.0.0.1:{}", cluster.tms[3].rpc);
            let on_it = rows(
                &client,
                &format!(
                    "SELECT count(*) FROM weir_catalog.subtasks WHERE task_manager = '{newcomer}'"
                ),
            )
            .await;
            assert_ne!(on_it[0][0], "0", "nothing runs on {newcomer}");
        }
        println!(
            "round {round}: task manager {victim_id} killed; declared lost after {:?}, views running again after {:?} ({acknowledged} inserts meanwhile)",
            detected, recovered
        );
        // A fresh TaskManager joins; the next round may land on it.
        let added = cluster.add_task_manager(2);
        let rpc = cluster.tms[added].rpc;
        cluster
            .wait_for(
                &format!(
                    "SELECT count(*) FROM weir_catalog.task_managers WHERE state = 'REGISTERED' AND address = '127.0.0.1:{rpc}'"
                ),
                Duration::from_secs(30),
                |r| r[0][0] == "1",
            )
            .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_managers_register_again_after_a_job_manager_restart() {
    let mut cluster = TestCluster::start(2, 2, 2);
    cluster.wait_registered(2).await;
    let client = cluster.client().await;
    create_schema(&client).await;
    insert_events(&client, 0..100).await;
    assert_views_exact(&cluster).await;

    TestCluster::kill9(&mut cluster.jm);
    let restarted = Instant::now();
    cluster.start_job_manager(2);
    cluster.wait_registered(2).await;
    let registered = restarted.elapsed();
    cluster
        .wait_for(
            "SELECT count(*) FROM weir_catalog.jobs WHERE state = 'RUNNING'",
            Duration::from_secs(60),
            |r| r[0][0] == VIEWS.len().to_string(),
        )
        .await;
    let running = restarted.elapsed();
    println!(
        "job manager restarted: task managers registered again after {registered:?}, views running after {running:?}"
    );
    let client = cluster.client().await;
    insert_events(&client, 100..200).await;
    assert_views_exact(&cluster).await;
    let count = rows(&client, "SELECT sum(n) FROM per_kind").await;
    assert_eq!(count[0][0], "200");
}

#[test]
fn a_task_manager_without_a_job_manager_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("tm.log");
    let args: Vec<String> = [
        "taskmanager",
        "--jobmanager",
        &format!("127.0.0.1:{}", free_port()),
        "--rpc-listen",
        &format!("127.0.0.1:{}", free_port()),
        "--data-dir",
        &dir.path().join("tm").display().to_string(),
        "--registration-timeout-ms",
        "1500",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let started = Instant::now();
    let status = spawn_weir(&args, &log).wait().unwrap();
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!status.success());
    assert!(
        text.contains("could not register with the job manager"),
        "{text}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

fn signal(child: &Option<Child>, sig: &str) {
    let pid = child.as_ref().expect("running").id().to_string();
    let status = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .expect("kill");
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_task_manager_is_lost_after_the_heartbeat_timeout() {
    // Jobs restart with exponential back-off here.
    let cluster = TestCluster::start_full(3, 2, 4, 20_000, "exponential-delay");
    cluster.wait_registered(3).await;
    let client = cluster.client().await;
    create_schema(&client).await;
    insert_events(&client, 0..200).await;
    assert_views_exact(&cluster).await;
    let victims = rows(
        &client,
        "SELECT DISTINCT task_manager FROM weir_catalog.subtasks ORDER BY task_manager",
    )
    .await;
    let victim_id = victims[0][0].clone();
    let victim = cluster
        .tms
        .iter()
        .position(|tm| victim_id.ends_with(&format!(":{}", tm.rpc)))
        .expect("victim");
    // Stopped, not killed: its connections stay open, only its heartbeats
    // stop.
    signal(&cluster.tms[victim].child, "-STOP");
    let stopped = Instant::now();
    cluster.wait_state(&victim_id, "LOST").await;
    let detected = stopped.elapsed();
    assert!(
        detected >= Duration::from_secs(2),
        "lost before its heartbeat timeout: {detected:?}"
    );
    cluster.wait_moved_off(&victim_id).await;
    let recovered = stopped.elapsed();
    let restarts = rows(&client, "SELECT max(restarts) FROM weir_catalog.jobs").await;
    assert_eq!(restarts[0][0], "1", "the jobs on it restarted once");
    insert_events(&client, 200..300).await;
    assert_views_exact(&cluster).await;
    if std::env::var_os("WEIR_DUMP_LOGS").is_some() {
        println!(
            "{}",
            std::fs::read_to_string(cluster.log("jobmanager")).unwrap_or_default()
        );
    }
    // Woken up, it learns it was lost, drops what it ran and registers again.
    signal(&cluster.tms[victim].child, "-CONT");
    let woken = stopped.elapsed();
    cluster.wait_state(&victim_id, "REGISTERED").await;
    let registered = stopped.elapsed();
    assert_views_exact(&cluster).await;
    println!(
        "silent task manager {victim_id}: declared lost after {detected:?} (heartbeat timeout 3 s), views running again after {recovered:?}, registered again {:?} after being woken",
        registered - woken
    );
}

/// `SUBSCRIBE name SINCE 0` (through cursor `cursor`), folded, equals the
/// view: its changelog holds every change since it was created.
async fn history_folds_into_view(client: &tokio_postgres::Client, name: &str, cursor: &str) {
    rows(
        client,
        &format!("DECLARE {cursor} CURSOR FOR SUBSCRIBE {name} SINCE 0"),
    )
    .await;
    let history = rows(client, &format!("FETCH ALL {cursor} WITH (timeout = '0s')")).await;
    let mut folded: std::collections::BTreeMap<Vec<String>, i64> = Default::default();
    for r in history {
        *folded.entry(r[2..].to_vec()).or_default() += if r[1] == "insert" { 1 } else { -1 };
    }
    folded.retain(|_, n| *n != 0);
    let mut view: std::collections::BTreeMap<Vec<String>, i64> = Default::default();
    for r in rows(client, &format!("SELECT * FROM {name}")).await {
        *view.entry(r).or_default() += 1;
    }
    assert!(!view.is_empty());
    assert_eq!(folded, view, "{name}: its changelog does not fold into it");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn views_wait_for_task_managers_after_a_full_restart() {
    let mut cluster = TestCluster::start_with(2, 2, 2, 2000);
    cluster.wait_registered(2).await;
    let client = cluster.client().await;
    create_schema(&client).await;
    insert_events(&client, 0..50).await;
    assert_views_exact(&cluster).await;
    // Everything goes down; the JobManager comes back alone, for longer
    // than the slot request timeout.
    for tm in &mut cluster.tms {
        TestCluster::kill9(&mut tm.child);
    }
    TestCluster::kill9(&mut cluster.jm);
    cluster.start_job_manager(2);
    let client = cluster.client().await;
    // Meanwhile the views answer from the checkpoint storage, and so do
    // their changelogs (each subtask's snapshot opened where it lies).
    let n = rows(&client, "SELECT sum(n) FROM per_kind").await;
    assert_eq!(n[0][0], "50");
    history_folds_into_view(&client, "per_kind", "h").await;
    tokio::time::sleep(Duration::from_millis(5000)).await;
    let jobs = rows(&client, "SELECT state FROM weir_catalog.jobs").await;
    assert!(
        jobs.iter().all(|r| r[0] == "CREATED"),
        "jobs still waiting for slots: {jobs:?}"
    );
    cluster.add_task_manager(2);
    cluster.add_task_manager(2);
    cluster
        .wait_for(
            "SELECT count(*) FROM weir_catalog.jobs WHERE state = 'RUNNING'",
            Duration::from_secs(60),
            |r| r[0][0] == VIEWS.len().to_string(),
        )
        .await;
    insert_events(&client, 50..80).await;
    assert_views_exact(&cluster).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_across_task_managers_see_whole_statements() {
    // Four subtasks on two TaskManagers: a SELECT gathers each part from
    // its TaskManager, all at one completed checkpoint.
    let cluster = TestCluster::start(2, 2, 4);
    cluster.wait_registered(2).await;
    common::transfers_never_show_half_done(cluster.pg).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn checkpoints_in_s3_restore_on_new_task_managers() {
    let s3 = S3Server::start("weir");
    let mut cluster = TestCluster::start_on_s3(2, 2, 2, &s3, "s3://weir/prod/checkpoints");
    cluster.wait_registered(2).await;
    let client = cluster.client().await;
    create_schema(&client).await;
    insert_events(&client, 0..50).await;
    client
        .batch_execute("CHECKPOINT")
        .await
        .expect("checkpoint");
    assert_views_exact(&cluster).await;
    // Every view's job wrote its checkpoints to the bucket, none locally.
    let root = s3.dir("weir/prod/checkpoints");
    let jobs: Vec<_> = std::fs::read_dir(&root)
        .expect("checkpoints in the bucket")
        .flatten()
        .filter(|j| {
            std::fs::read_dir(j.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|c| c.path().join("_metadata").is_file())
        })
        .collect();
    assert_eq!(jobs.len(), VIEWS.len(), "{:?}", root);
    assert!(!cluster.dir.path().join("jobmanager/checkpoints").exists());

    // Everything goes down; a JobManager and two TaskManagers with empty
    // state directories come back.
    for tm in &mut cluster.tms {
        TestCluster::kill9(&mut tm.child);
    }
    TestCluster::kill9(&mut cluster.jm);
    cluster.start_job_manager(2);
    let client = cluster.client().await;
    // Before any TaskManager is back the views answer from the bucket.
    let n = rows(&client, "SELECT sum(n) FROM per_kind").await;
    assert_eq!(n[0][0], "50");
    cluster.add_task_manager(2);
    cluster.add_task_manager(2);
    cluster
        .wait_for(
            "SELECT count(*) FROM weir_catalog.jobs WHERE state = 'RUNNING' AND restored_checkpoint IS NOT NULL",
            Duration::from_secs(60),
            |r| r[0][0] == VIEWS.len().to_string(),
        )
        .await;
    insert_events(&client, 50..80).await;
    assert_views_exact(&cluster).await;
    // A savepoint goes to the bucket too, and a view goes back to it.
    client
        .batch_execute(
            "CREATE SAVEPOINT before_more FOR MATERIALIZED VIEW per_kind;
             DELETE FROM events WHERE id < 10;",
        )
        .await
        .expect("savepoint");
    assert!(root.join("savepoints/before_more/_metadata").is_file());
    client
        .batch_execute("RESTORE MATERIALIZED VIEW per_kind FROM SAVEPOINT before_more")
        .await
        .expect("restore");
    cluster
        .wait_for(
            "SELECT count(*) FROM weir_catalog.jobs WHERE state = 'RUNNING'",
            Duration::from_secs(60),
            |r| r[0][0] == VIEWS.len().to_string(),
        )
        .await;
    assert_views_exact(&cluster).await;
}

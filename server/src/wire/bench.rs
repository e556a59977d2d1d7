//! `weir bench`: throughput of the write path into views, measured in
//! process (no pgwire), from the first `INSERT` until `FLUSH` has made every
//! row visible in the view. With `--task-managers N` the view runs on N
//! TaskManagers reached over gRPC on loopback (network shuffle, remote
//! table reads, checkpoint acks over RPC) instead of the playground's
//! in-process one.

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use cluster::{ClusterConfig, TaskManagerOptions, run_task_manager};

use crate::engine::Database;
use crate::engine::session::Session;
use crate::sql::stmt;

/// Which pipeline to measure.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Workload {
    /// INSERT → view with GROUP BY and count/sum/min/max.
    Agg,
    /// INSERT into two tables → view joining them.
    Join,
    /// A Nexmark query (`--query qN`) over bounded Nexmark sources of
    /// `--events` events, from CREATE until the view holds every event.
    Nexmark,
}

/// Options of `weir bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    #[arg(value_enum)]
    workload: Workload,
    /// Rows to insert in all.
    #[arg(long, default_value_t = 200_000)]
    rows: usize,
    /// Rows per INSERT statement.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// streaming_parallelism of the view.
    #[arg(long, default_value_t = 2)]
    parallelism: usize,
    /// Run the view on this many TaskManagers over gRPC (0: playground).
    #[arg(long, default_value_t = 0)]
    task_managers: usize,
    /// nexmark: the query, q0 … q22 as in sql-tests/nexmark.slt.
    #[arg(long, default_value = "q0")]
    query: String,
    /// nexmark: events in all (persons, auctions and bids).
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// nexmark: the view's `retain_history` ('off' keeps no changelog;
    /// default: the server's).
    #[arg(long)]
    retain_history: Option<String>,
    /// The view's `state_backend` (rocksdb, heap; default: the server's
    /// choice).
    #[arg(long)]
    state_backend: Option<String>,
    /// Managed memory of the (each) TaskManager, in MiB (default: the
    /// server's).
    #[arg(long)]
    managed_memory_mb: Option<usize>,
}

/// The Nexmark queries and sources, as tested: the bench runs exactly
/// what sql-tests/nexmark.slt checks.
const NEXMARK_SLT: &str = include_str!("../../../sql-tests/nexmark.slt");

/// The statements of `nexmark.slt` (`statement ok` records).
fn nexmark_statements() -> Vec<String> {
    NEXMARK_SLT
        .split("\n\n")
        .map(|record| {
            // A record may begin with comment lines.
            record
                .trim()
                .lines()
                .skip_while(|l| l.starts_with('#'))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter_map(|record| record.strip_prefix("statement ok\n").map(str::to_string))
        .collect()
}

/// The statements that set up and create Nexmark query `query` over
/// `events` events in `splits` splits per source, generated as fast as
/// they can be (the benchmark's own event rate, 10,000 per second of
/// event time).
fn nexmark_setup(
    query: &str,
    events: u64,
    splits: usize,
    retain_history: Option<&str>,
) -> Result<Vec<String>, String> {
    let statements = nexmark_statements();
    let view = format!("CREATE VIEW {query}_batch AS\n");
    let sql = statements
        .iter()
        .find_map(|s| s.strip_prefix(view.as_str()))
        .ok_or_else(|| format!("no Nexmark query {query} (q0 … q22, not q12)"))?;
    let mut out = Vec::new();
    for s in &statements {
        if s.starts_with("CREATE SOURCE") {
            let lines: Vec<String> = s
                .lines()
                .filter(|l| !l.contains(".event.rate"))
                .map(|l| {
                    l.replace(
                        "nexmark.event.num = '10000'",
                        &format!("nexmark.event.num = '{events}'"),
                    )
                    .replace(
                        "nexmark.split.num = '4'",
                        &format!("nexmark.split.num = '{splits}'"),
                    )
                })
                .collect();
            out.push(lines.join("\n"));
        } else if s.contains("side_input") && query == "q13" {
            out.push(s.clone());
        }
    }
    let with = retain_history
        .map(|r| format!(" WITH (retain_history = '{}')", r.replace('\'', "''")))
        .unwrap_or_default();
    out.push(format!("CREATE MATERIALIZED VIEW {query}{with} AS {sql}"));
    Ok(out)
}

/// `weir bench nexmark`: events per second from CREATE until every
/// event is in the view.
async fn run_nexmark(
    db: &std::sync::Arc<Database>,
    session: &mut Session,
    args: &BenchArgs,
) -> Result<(), String> {
    let mut setup = nexmark_setup(
        &args.query,
        args.events,
        args.parallelism,
        args.retain_history.as_deref(),
    )?;
    let create = setup.pop().unwrap_or_default();
    for s in &setup {
        run_sql(db, session, s).await?;
    }
    let start = Instant::now();
    run_sql(db, session, &create).await?;
    db.flush().await.map_err(|e| e.to_string())?;
    let total = start.elapsed().as_secs_f64();
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Only the event types the query reads are generated: count those (of
    // every 50 events, 1 is a person, 3 auctions, 46 bids).
    let depends = db
        .catalog
        .by_name(&crate::sql::stmt::QualifiedName::public(&args.query))
        .map(|e| e.depends_on().to_vec())
        .unwrap_or_default();
    let share: u64 = depends
        .iter()
        .filter_map(|id| db.catalog.get(*id))
        .map(|e| match e.name() {
            "person" => 1,
            "auction" => 3,
            "bid" => 46,
            _ => 0,
        })
        .sum();
    let read = args.events * share / 50;
    println!(
        "nexmark {}: {} events in the stream, {} of them of the types it reads; parallelism {}, {} cores",
        args.query, args.events, read, args.parallelism, cores
    );
    println!("all events in the view after {total:.2} s");
    println!(
        "throughput: {:.0} events/s read, {:.0} events/s per core",
        read as f64 / total,
        read as f64 / total / cores as f64
    );
    if let Some(peak) = peak_rss_mib() {
        println!("peak RSS of the process: {peak} MiB");
    }
    Ok(())
}

/// This process's peak resident memory (`VmHWM`), in MiB.
fn peak_rss_mib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kib| kib >> 10)
}

/// A JobManager with `n` TaskManagers of `slots` slots, all in this
/// process but talking gRPC over loopback.
async fn open_cluster(
    dir: &std::path::Path,
    n: usize,
    slots: usize,
    config: &ClusterConfig,
) -> Result<std::sync::Arc<Database>, String> {
    let rpc = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| e.to_string())?;
    let config = ClusterConfig {
        slots_per_task_manager: slots,
        ..config.clone()
    };
    let db = Database::open_job_manager(&dir.join("jobmanager"), config.clone(), rpc, slots)
        .await
        .map_err(|e| e.to_string())?;
    for i in 0..n {
        let opts = TaskManagerOptions {
            job_manager: rpc.to_string(),
            rpc_listen: "127.0.0.1:0".parse().map_err(|e| format!("{e}"))?,
            advertise: None,
            resource_id: Some(format!("taskmanager-{i}")),
            data_dir: dir.join(format!("taskmanager-{i}")),
            config: config.clone(),
        };
        tokio::spawn(async move {
            if let Err(e) = run_task_manager(opts).await {
                eprintln!("weir bench: task manager {i} stopped: {e}");
            }
        });
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while cluster::gateway::ResourceManagerGateway::task_managers(
        db.cluster.resource_manager.as_ref(),
    )
    .len()
        < n
    {
        if Instant::now() > deadline {
            return Err("task managers did not register".into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(db)
}

async fn run_sql(
    db: &std::sync::Arc<Database>,
    session: &mut Session,
    sql: &str,
) -> Result<(), String> {
    for s in stmt::parse(sql).map_err(|e| e.to_string())? {
        db.execute(session, s)
            .await
            .map_err(|e| format!("{sql}: {e}"))?;
    }
    Ok(())
}

/// Runs a benchmark and prints its figures.
pub async fn run(args: BenchArgs) -> Result<(), String> {
    let dir = std::env::temp_dir().join(format!("weir-bench-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let config = ClusterConfig {
        managed_memory_bytes: match args.managed_memory_mb {
            Some(mb) => mb.max(1) << 20,
            None => cluster::config::default_managed_memory(),
        },
        ..ClusterConfig::default()
    };
    let db = if args.task_managers > 0 {
        let slots = args.parallelism.div_ceil(args.task_managers).max(1);
        open_cluster(&dir, args.task_managers, slots, &config).await?
    } else {
        Database::open(&dir, config)
            .await
            .map_err(|e| e.to_string())?
    };
    let mut session = Session::new(args.parallelism);
    session
        .set("streaming_parallelism", &args.parallelism.to_string())
        .map_err(|e| e.to_string())?;
    if let Some(backend) = &args.state_backend {
        session
            .set("state_backend", backend)
            .map_err(|e| e.to_string())?;
    }
    match args.workload {
        Workload::Nexmark => {
            let result = run_nexmark(&db, &mut session, &args).await;
            db.shutdown().await;
            let _ = std::fs::remove_dir_all(&dir);
            return result;
        }
        Workload::Agg => {
            run_sql(
                &db,
                &mut session,
                "CREATE TABLE events (id bigint, k int, v double precision)",
            )
            .await?;
            run_sql(
                &db,
                &mut session,
                "CREATE MATERIALIZED VIEW agg AS SELECT k, count(*) AS n, sum(v) AS s, min(v) AS lo, max(v) AS hi \
                 FROM events GROUP BY k",
            )
            .await?;
        }
        Workload::Join => {
            run_sql(
                &db,
                &mut session,
                "CREATE TABLE l (id bigint, k int, v int)",
            )
            .await?;
            run_sql(
                &db,
                &mut session,
                "CREATE TABLE r (id bigint, k int, w int)",
            )
            .await?;
            run_sql(
                &db,
                &mut session,
                "CREATE MATERIALIZED VIEW j AS SELECT l.k, v, w FROM l JOIN r ON l.id = r.id",
            )
            .await?;
        }
    }
    let start = Instant::now();
    let mut inserted = 0usize;
    let mut batch_times = Vec::new();
    while inserted < args.rows {
        let n = args.batch.min(args.rows - inserted);
        let values = |table: &str| {
            let rows: Vec<String> = (inserted..inserted + n)
                .map(|i| match table {
                    "events" => format!("({i}, {}, {}.5)", i % 1000, i % 97),
                    _ => format!("({i}, {}, {})", i % 1000, i % 97),
                })
                .collect();
            format!("INSERT INTO {table} VALUES {}", rows.join(", "))
        };
        let t = Instant::now();
        match args.workload {
            Workload::Agg | Workload::Nexmark => {
                run_sql(&db, &mut session, &values("events")).await?
            }
            Workload::Join => {
                run_sql(&db, &mut session, &values("l")).await?;
                run_sql(&db, &mut session, &values("r")).await?;
            }
        }
        batch_times.push(t.elapsed());
        inserted += n;
    }
    let insert_done = start.elapsed();
    db.flush().await.map_err(|e| e.to_string())?;
    let total = start.elapsed();
    let rows = match args.workload {
        Workload::Agg | Workload::Nexmark => args.rows,
        Workload::Join => args.rows * 2,
    };
    batch_times.sort();
    let p50 = batch_times
        .get(batch_times.len() / 2)
        .copied()
        .unwrap_or(Duration::ZERO);
    println!(
        "workload: {:?}, parallelism {}, {} rows in batches of {}, {}",
        args.workload,
        args.parallelism,
        rows,
        args.batch,
        match args.task_managers {
            0 => "playground".to_string(),
            n => format!("{n} task managers over gRPC"),
        }
    );
    println!(
        "inserts acknowledged after {:.2} s; visible in the view after {:.2} s",
        insert_done.as_secs_f64(),
        total.as_secs_f64()
    );
    println!(
        "throughput: {:.0} rows/s (insert to visible)",
        rows as f64 / total.as_secs_f64()
    );
    println!(
        "median INSERT statement latency: {:.1} ms",
        p50.as_secs_f64() * 1000.0
    );
    db.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_nexmark_query_sets_up_with_its_side_inputs() {
        let q13 = nexmark_setup("q13", 1000, 1, None).unwrap();
        assert!(
            q13.iter().any(|s| s.starts_with("CREATE TABLE side_input")),
            "{q13:?}"
        );
        assert!(q13.iter().any(|s| s.starts_with("INSERT INTO side_input")));
        assert!(
            q13.last()
                .unwrap()
                .starts_with("CREATE MATERIALIZED VIEW q13")
        );
        for q in 0..=22 {
            if q == 12 {
                continue;
            }
            nexmark_setup(&format!("q{q}"), 1000, 1, None).unwrap();
        }
    }
}

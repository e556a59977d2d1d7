//! `weir bench`: throughput of the write path into views, measured in
//! process (no network), from the first `INSERT` until `FLUSH` has made every
//! row visible in the view.

use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use cluster::ClusterConfig;

use crate::engine::Database;
use crate::session::Session;
use crate::stmt;

/// Which pipeline to measure.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Workload {
    /// INSERT → view with GROUP BY and count/sum/min/max.
    Agg,
    /// INSERT into two tables → view joining them.
    Join,
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
    let db = Database::open(&dir, ClusterConfig::default())
        .await
        .map_err(|e| e.to_string())?;
    let mut session = Session::new(args.parallelism);
    session
        .set("streaming_parallelism", &args.parallelism.to_string())
        .map_err(|e| e.to_string())?;
    match args.workload {
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
            Workload::Agg => run_sql(&db, &mut session, &values("events")).await?,
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
        Workload::Agg => args.rows,
        Workload::Join => args.rows * 2,
    };
    batch_times.sort();
    let p50 = batch_times
        .get(batch_times.len() / 2)
        .copied()
        .unwrap_or(Duration::ZERO);
    println!(
        "workload: {:?}, parallelism {}, {} rows in batches of {}",
        args.workload, args.parallelism, rows, args.batch
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

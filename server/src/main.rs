//! The `weir` binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cluster::ClusterConfig;
use server::Database;

#[derive(Debug, Parser)]
#[command(name = "weir", version, about = "Weir: a SQL-first streaming database")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run everything in one process: a JobManager and one TaskManager.
    Playground {
        /// Where clients connect with the Postgres protocol.
        #[arg(long, default_value = "127.0.0.1:6566")]
        listen: SocketAddr,
        /// Where tables, views, state and the catalog are kept.
        #[arg(long, default_value = "./weir-data")]
        data_dir: PathBuf,
        /// Slots of the TaskManager.
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Milliseconds between checkpoints.
        #[arg(long, default_value_t = 1000)]
        checkpoint_interval_ms: u64,
        /// Milliseconds a new view waits for slots before it fails (53000).
        #[arg(long, default_value_t = 10_000)]
        slot_request_timeout_ms: u64,
    },
    /// Measure throughput (see docs/benchmarks.md).
    Bench(server::bench::BenchArgs),
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weir: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async move {
        match cli.command {
            Command::Playground {
                listen,
                data_dir,
                slots,
                checkpoint_interval_ms,
                slot_request_timeout_ms,
            } => {
                let config = ClusterConfig {
                    slots_per_task_manager: slots.max(1),
                    checkpoint_interval: Duration::from_millis(checkpoint_interval_ms.max(10)),
                    slot_request_timeout: Duration::from_millis(slot_request_timeout_ms),
                    ..ClusterConfig::default()
                };
                playground(listen, data_dir, config).await
            }
            Command::Bench(args) => server::bench::run(args).await,
        }
    });
    if let Err(e) = result {
        eprintln!("weir: {e}");
        std::process::exit(1);
    }
}

async fn playground(
    listen: SocketAddr,
    data_dir: PathBuf,
    config: ClusterConfig,
) -> Result<(), String> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    let db = Database::open(&data_dir, config)
        .await
        .map_err(|e| format!("cannot open {}: {e}", data_dir.display()))?;
    tracing::info!(%listen, data_dir = %data_dir.display(), "weir playground ready: psql -h {} -p {} -U weir -d weir", listen.ip(), listen.port());
    let shutdown = async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(t) => t,
                Err(_) => return std::future::pending().await,
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    };
    server::pg::serve(db.clone(), listener, shutdown).await;
    tracing::info!("shutting down");
    db.shutdown().await;
    Ok(())
}

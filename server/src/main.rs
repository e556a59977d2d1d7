//! The `weir` binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use cluster::{ClusterConfig, RestartStrategy, TaskManagerOptions, run_task_manager};
use server::Database;

/// jemalloc rather than glibc's malloc: a dropped view's state, freed by
/// many task threads, goes back to the OS (jemalloc's background threads
/// purge freed pages after its decay time, 10 s) instead of staying in
/// the threads' arenas (an idle playground grew from 113 MiB to about
/// 1 GiB over ten rounds of creating and dropping views). RocksDB's C++
/// still allocates with malloc.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
        #[command(flatten)]
        frontend: FrontendArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Run a JobManager: the SQL front end, catalog, tables, checkpoint
    /// storage, and the cluster RPC that TaskManagers register with.
    Jobmanager {
        /// Where clients connect with the Postgres protocol.
        #[arg(long, default_value = "127.0.0.1:6566")]
        listen: SocketAddr,
        /// Where TaskManagers reach the JobManager (gRPC).
        #[arg(long, default_value = "127.0.0.1:6570")]
        rpc_listen: SocketAddr,
        /// Where the catalog, tables and checkpoint storage are kept.
        #[arg(long, default_value = "./weir-data")]
        data_dir: PathBuf,
        /// Subtasks per stateful operator of a new view (SET
        /// streaming_parallelism overrides it per session).
        #[arg(long, default_value_t = 2)]
        default_parallelism: usize,
        #[command(flatten)]
        frontend: FrontendArgs,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Run a TaskManager that registers with a JobManager and runs subtasks
    /// in its slots.
    Taskmanager {
        /// The JobManager's cluster RPC address (its --rpc-listen).
        #[arg(long)]
        jobmanager: String,
        /// Where this TaskManager serves its RPC and shuffle.
        #[arg(long, default_value = "127.0.0.1:6571")]
        rpc_listen: SocketAddr,
        /// The address others reach this TaskManager at, if not --rpc-listen.
        #[arg(long)]
        advertise: Option<String>,
        /// Its ResourceID; by default derived from its address.
        #[arg(long)]
        resource_id: Option<String>,
        /// Slots (taskmanager.numberOfTaskSlots).
        #[arg(long, default_value_t = 4)]
        slots: usize,
        /// Where its local state is kept.
        #[arg(long)]
        data_dir: PathBuf,
        /// Give up when registration has not succeeded for this long.
        #[arg(long, default_value_t = 300_000)]
        registration_timeout_ms: u64,
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Measure throughput (see docs/benchmarks.md).
    Bench(server::wire::bench::BenchArgs),
}

/// How the Postgres front end treats its clients (docs/clients.md).
#[derive(Debug, clap::Args)]
struct FrontendArgs {
    /// A PEM certificate chain: clients may then connect with TLS.
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Clients connected at once; one more is refused with SQLSTATE 53300.
    #[arg(long, default_value_t = 100)]
    max_connections: usize,
    /// The longest message a client may send after its startup packet, in
    /// bytes; a longer one closes the connection with SQLSTATE 08P01.
    #[arg(long, default_value_t = 256 << 20)]
    max_message_bytes: usize,
    /// Milliseconds a client may take to finish TLS, startup and
    /// authentication (Postgres's authentication_timeout).
    #[arg(long, default_value_t = 60_000)]
    handshake_timeout_ms: u64,
    /// How clients authenticate: trust, or scram-sha-256 (a role's
    /// password). The playground trusts; a JobManager asks for passwords.
    /// The superuser weir's password is WEIR_PASSWORD's, when it is set.
    #[arg(long, value_enum)]
    auth: Option<server::wire::auth::AuthMethod>,
}

impl FrontendArgs {
    fn wire(
        &self,
        default_auth: server::wire::auth::AuthMethod,
    ) -> Result<server::wire::WireConfig, String> {
        let tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(server::wire::tls_acceptor(cert, key)?),
            _ => None,
        };
        Ok(server::wire::WireConfig {
            tls,
            max_message_bytes: self.max_message_bytes.max(64),
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms.max(1)),
            max_connections: self.max_connections.max(1),
            auth: self.auth.unwrap_or(default_auth),
        })
    }
}

/// Settings every process of a cluster understands (docs/cluster.md).
#[derive(Debug, clap::Args)]
struct ClusterArgs {
    /// Milliseconds between checkpoints.
    #[arg(long, default_value_t = 1000)]
    checkpoint_interval_ms: u64,
    /// Milliseconds a job waits for slots before it fails (53000).
    #[arg(long, default_value_t = 10_000)]
    slot_request_timeout_ms: u64,
    /// Milliseconds between a TaskManager's heartbeats.
    #[arg(long, default_value_t = 10_000)]
    heartbeat_interval_ms: u64,
    /// A TaskManager silent this many milliseconds is lost.
    #[arg(long, default_value_t = 50_000)]
    heartbeat_timeout_ms: u64,
    /// fixed-delay or exponential-delay.
    #[arg(long, default_value = "fixed-delay")]
    restart_strategy: String,
    /// fixed-delay: restarts before a job stays failed.
    #[arg(long, default_value_t = 3)]
    restart_attempts: u32,
    /// Milliseconds before a restart (the first one, for exponential-delay).
    #[arg(long, default_value_t = 1000)]
    restart_delay_ms: u64,
    /// exponential-delay: the longest delay, in milliseconds.
    #[arg(long, default_value_t = 60_000)]
    restart_max_delay_ms: u64,
    /// Managed memory of a TaskManager for state, in MiB, split equally
    /// among its slots (default: an eighth of the machine's memory, at
    /// least 128).
    #[arg(long)]
    managed_memory_mb: Option<usize>,
    /// Where completed checkpoints are kept (a directory every TaskManager
    /// can reach); default `<data-dir>/checkpoints`.
    #[arg(long)]
    checkpoint_dir: Option<String>,
    /// Completed checkpoints kept per job.
    #[arg(long, default_value_t = 3)]
    checkpoints_retained: usize,
    /// Milliseconds after which a checkpoint not yet complete is aborted.
    #[arg(long, default_value_t = 600_000)]
    checkpoint_timeout_ms: u64,
    /// Least milliseconds from the end of a checkpoint to the next one.
    #[arg(long, default_value_t = 0)]
    min_pause_between_checkpoints_ms: u64,
    /// Failed checkpoints in a row a job tolerates before it fails over.
    #[arg(long, default_value_t = 3)]
    tolerable_checkpoint_failures: u32,
}

impl ClusterArgs {
    fn config(&self, slots: usize) -> Result<ClusterConfig, String> {
        let ms = Duration::from_millis;
        Ok(ClusterConfig {
            slots_per_task_manager: slots.max(1),
            checkpoint_interval: ms(self.checkpoint_interval_ms.max(10)),
            slot_request_timeout: ms(self.slot_request_timeout_ms),
            heartbeat_interval: ms(self.heartbeat_interval_ms.max(10)),
            heartbeat_timeout: ms(self.heartbeat_timeout_ms.max(self.heartbeat_interval_ms)),
            restart_strategy: RestartStrategy::parse(
                &self.restart_strategy,
                self.restart_attempts,
                ms(self.restart_delay_ms),
                ms(self.restart_max_delay_ms),
            )?,
            managed_memory_bytes: match self.managed_memory_mb {
                Some(mb) => mb.max(1) << 20,
                None => cluster::config::default_managed_memory(),
            },
            checkpoint_dir: self.checkpoint_dir.clone(),
            checkpoints_retained: self.checkpoints_retained.max(1),
            checkpoint_timeout: ms(self.checkpoint_timeout_ms.max(10)),
            min_pause_between_checkpoints: ms(self.min_pause_between_checkpoints_ms),
            tolerable_checkpoint_failures: self.tolerable_checkpoint_failures,
            ..ClusterConfig::default()
        })
    }
}

fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        tracing::warn!(error = %e, "jemalloc's background threads did not start; freed memory goes back to the OS more slowly");
    }
    let cli = Cli::parse();
    // Large stacks (reserved, not committed): statements and dataflow
    // tasks walk expression trees recursively (server::sql::depth).
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(server::engine::control::STACK_BYTES)
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
                frontend,
                cluster,
            } => {
                let wire = frontend.wire(server::wire::auth::AuthMethod::Trust)?;
                let config = cluster.config(slots)?;
                let db = Database::open(&data_dir, config)
                    .await
                    .map_err(|e| format!("cannot open {}: {e}", data_dir.display()))?;
                tracing::info!(%listen, data_dir = %data_dir.display(), "weir playground ready: psql -h {} -p {} -U weir -d weir", listen.ip(), listen.port());
                serve(db, listen, wire).await
            }
            Command::Jobmanager {
                listen,
                rpc_listen,
                data_dir,
                default_parallelism,
                frontend,
                cluster,
            } => {
                let wire = frontend.wire(server::wire::auth::AuthMethod::ScramSha256)?;
                let config = cluster.config(1)?;
                let db =
                    Database::open_job_manager(&data_dir, config, rpc_listen, default_parallelism)
                        .await
                        .map_err(|e| format!("cannot open {}: {e}", data_dir.display()))?;
                tracing::info!(%listen, %rpc_listen, data_dir = %data_dir.display(), "weir jobmanager ready: psql -h {} -p {} -U weir -d weir", listen.ip(), listen.port());
                serve(db, listen, wire).await
            }
            Command::Taskmanager {
                jobmanager,
                rpc_listen,
                advertise,
                resource_id,
                slots,
                data_dir,
                registration_timeout_ms,
                cluster,
            } => {
                let mut config = cluster.config(slots)?;
                config.registration_timeout = Duration::from_millis(registration_timeout_ms);
                let opts = TaskManagerOptions {
                    job_manager: jobmanager,
                    rpc_listen,
                    advertise,
                    resource_id,
                    data_dir,
                    config,
                };
                tokio::select! {
                    r = run_task_manager(opts) => r.map_err(|e| format!("task manager stopped: {e}")),
                    _ = shutdown_signal() => Ok(()),
                }
            }
            Command::Bench(args) => server::wire::bench::run(args).await,
        }
    });
    if let Err(e) = result {
        eprintln!("weir: {e}");
        std::process::exit(1);
    }
}

async fn shutdown_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(t) => t,
        Err(_) => return std::future::pending().await,
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Serves pgwire on `listen` until SIGINT or SIGTERM, then stops the jobs.
async fn serve(
    db: std::sync::Arc<Database>,
    listen: SocketAddr,
    wire: server::wire::WireConfig,
) -> Result<(), String> {
    if let Ok(password) = std::env::var("WEIR_PASSWORD") {
        db.roles
            .set_superuser_password(&password)
            .map_err(|e| format!("cannot set the superuser's password: {e}"))?;
    } else if wire.auth == server::wire::auth::AuthMethod::ScramSha256
        && db
            .roles
            .get(server::catalog::roles::SUPERUSER)
            .is_some_and(|r| r.secret.is_none())
    {
        tracing::warn!(
            "the superuser {} has no password, so no one can log in as {0}: set WEIR_PASSWORD",
            server::catalog::roles::SUPERUSER
        );
    }
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    server::wire::pg::serve(db.clone(), listener, wire, shutdown_signal()).await;
    tracing::info!("shutting down");
    db.shutdown().await;
    Ok(())
}

//! The processes of a cluster, put together: a JobManager with the
//! catalog's stores ([`Cluster`]; in a playground it also holds one
//! TaskManager, in-process), and a standalone TaskManager
//! ([`run_task_manager`], Flink's `TaskManagerRunner`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use executor::exchange::ChannelId;
use executor::message::Message;
use executor::task::RemoteChannels;
use storage::checkpoint_storage::CheckpointStorage;
use storage::meta::MetaStore;
use storage::table::TableStore;
use storage::{KvStore, SlotMemory};
use tokio::sync::mpsc;

use crate::config::ClusterConfig;
use crate::gateway::ResourceManagerGateway;
use crate::rpc::client::{RemoteJobMaster, RemoteResourceManager, RemoteTableLog, RemoteViewLog};
use crate::rpc::server::{JobManagerServices, TaskManagerServices, bind};
use crate::rpc::shuffle::NetworkChannels;
use crate::taskmanager::TaskExecutorServices;
use crate::{ClusterError, JobManager, ResourceManager, Result, TaskExecutor};

/// Shuffle address of the playground's in-process TaskManager.
const IN_PROCESS: &str = "in-process";

/// The JobManager side, as the SQL front end uses it.
#[derive(Debug)]
pub struct Cluster {
    pub job_manager: Arc<JobManager>,
    pub resource_manager: Arc<ResourceManager>,
    /// Catalog and id counters.
    pub meta: Arc<MetaStore>,
    /// User tables.
    pub tables: Arc<TableStore>,
    /// The playground's TaskManager; `None` for a standalone JobManager.
    pub local_task_manager: Option<Arc<TaskExecutor>>,
}

/// A playground has no other TaskManager to reach.
struct NoRemoteChannels;

impl RemoteChannels for NoRemoteChannels {
    fn connect(&self, address: &str, _: ChannelId) -> executor::Result<mpsc::Receiver<Message>> {
        Err(executor::ExecError::Service(format!(
            "no network shuffle in a playground (asked for {address})"
        )))
    }
}

fn io(path: &Path, e: std::io::Error) -> ClusterError {
    ClusterError::Internal(format!("{}: {e}", path.display()))
}

impl Cluster {
    /// Opens the JobManager's stores under `data_dir`: `meta` (catalog and
    /// tables), and checkpoint storage (`checkpoints`, unless configured
    /// elsewhere).
    async fn open(data_dir: &Path, config: &ClusterConfig) -> Result<Self> {
        std::fs::create_dir_all(data_dir).map_err(|e| io(data_dir, e))?;
        let meta_kv = Arc::new(KvStore::open(&data_dir.join("meta"), 32 << 20)?);
        let meta = Arc::new(MetaStore::new(meta_kv.clone()));
        let tables = Arc::new(TableStore::new(meta_kv)?);
        let location = match &config.checkpoint_dir {
            Some(dir) => dir.clone(),
            None => data_dir.join("checkpoints").display().to_string(),
        };
        let storage = Arc::new(CheckpointStorage::open(&location)?);
        storage.check().await?;
        let scratch = data_dir.join("scratch");
        fresh_dir(&scratch)?;
        let resource_manager =
            ResourceManager::start(config.slot_request_timeout, config.heartbeat_timeout);
        let job_manager = JobManager::start(
            resource_manager.clone(),
            storage,
            scratch,
            config.clone(),
            tables.clone(),
        );
        job_manager.load_savepoints().await?;
        Ok(Self {
            job_manager,
            resource_manager,
            meta,
            tables,
            local_task_manager: None,
        })
    }

    /// Everything in one process: a JobManager and one TaskManager
    /// (`weir playground`, Flink's MiniCluster).
    pub async fn playground(data_dir: &Path, config: ClusterConfig) -> Result<Self> {
        let mut cluster = Self::open(data_dir, &config).await?;
        let state_dir = data_dir.join("taskmanager-0");
        fresh_dir(&state_dir)?;
        let rm: Arc<dyn ResourceManagerGateway> = cluster.resource_manager.clone();
        let te = TaskExecutor::start(
            TaskExecutorServices {
                resource_id: "taskmanager-0".into(),
                address: IN_PROCESS.into(),
                state_dir,
                slot_memory: slot_memory(&config),
                tables: cluster.tables.clone(),
                views: Arc::new(crate::view_log::LocalViewLog(Arc::downgrade(
                    &cluster.job_manager,
                ))),
                remote: Arc::new(NoRemoteChannels),
            },
            &config,
            rm,
        )
        .await?;
        cluster.local_task_manager = Some(te);
        Ok(cluster)
    }

    /// A standalone JobManager: serves the cluster RPC on `rpc_listen` for
    /// TaskManagers to register (`weir jobmanager`).
    pub async fn job_manager(
        data_dir: &Path,
        config: ClusterConfig,
        rpc_listen: SocketAddr,
    ) -> Result<Self> {
        let listener = bind(rpc_listen).await?;
        let cluster = Self::open(data_dir, &config).await?;
        JobManagerServices {
            rm: cluster.resource_manager.clone(),
            jm: cluster.job_manager.clone(),
            tables: cluster.tables.clone(),
        }
        .serve(listener);
        tracing::info!(%rpc_listen, "job manager serving cluster rpc");
        Ok(cluster)
    }
}

/// Each slot's share of the managed memory.
fn slot_memory(config: &ClusterConfig) -> Vec<SlotMemory> {
    (0..config.slots_per_task_manager.max(1))
        .map(|_| SlotMemory::new(config.managed_memory_per_slot()))
        .collect()
}

/// Empties (or creates) `dir`: local state left by an earlier run is never
/// used again — every deployment restores from checkpoint storage.
fn fresh_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir).map_err(|e| io(dir, e))?;
    }
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))
}

/// How to start a standalone TaskManager.
#[derive(Debug, Clone)]
pub struct TaskManagerOptions {
    /// `host:port` of the JobManager's cluster RPC.
    pub job_manager: String,
    /// Where this TaskManager serves TaskExecutor and shuffle RPC.
    pub rpc_listen: SocketAddr,
    /// The address the JobManager and other TaskManagers reach it at, when
    /// not `rpc_listen` (for example behind NAT, or listening on 0.0.0.0).
    pub advertise: Option<String>,
    /// Its ResourceID; by default its advertised address.
    pub resource_id: Option<String>,
    /// Its local state.
    pub data_dir: PathBuf,
    pub config: ClusterConfig,
}

/// Runs a TaskManager until its registration times out (the only way it
/// ends by itself), Flink's `TaskManagerRunner`.
pub async fn run_task_manager(opts: TaskManagerOptions) -> Result<()> {
    let listener = bind(opts.rpc_listen).await?;
    let local = listener
        .local_addr()
        .map_err(|e| ClusterError::Rpc(e.to_string()))?;
    let address = match &opts.advertise {
        Some(a) => a.clone(),
        None if local.ip().is_unspecified() => {
            return Err(ClusterError::Internal(format!(
                "listening on {local}: give --advertise HOST:PORT, the address others reach this task manager at"
            )));
        }
        None => local.to_string(),
    };
    let resource_id = opts
        .resource_id
        .clone()
        .unwrap_or_else(|| format!("taskmanager-{address}"));
    let state_dir = opts.data_dir.join("state");
    fresh_dir(&state_dir)?;
    let te = TaskExecutor::new(
        TaskExecutorServices {
            resource_id: resource_id.clone(),
            address: address.clone(),
            state_dir,
            slot_memory: slot_memory(&opts.config),
            tables: Arc::new(RemoteTableLog::new(&opts.job_manager)?),
            views: Arc::new(RemoteViewLog::new(&opts.job_manager)?),
            remote: Arc::new(NetworkChannels),
        },
        &opts.config,
    );
    let services = TaskManagerServices {
        te: te.clone(),
        job_master: Arc::new(RemoteJobMaster::new(&opts.job_manager)?),
    };
    let server = tokio::spawn(services.serve(listener));
    tracing::info!(%resource_id, %address, job_manager = %opts.job_manager, slots = opts.config.slots_per_task_manager, "task manager starting");
    let rm: Arc<dyn ResourceManagerGateway> =
        Arc::new(RemoteResourceManager::new(&opts.job_manager)?);
    let result = te.connect(rm, opts.config).await;
    server.abort();
    result
}

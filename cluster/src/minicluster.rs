//! Everything in one process: a JobManager (Dispatcher, ResourceManager) and
//! one TaskManager, talking through the gateway traits. Flink calls this a
//! MiniCluster; `weir playground` runs one.

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use storage::KvStore;
use storage::meta::MetaStore;
use storage::state::StateStore;
use storage::table::TableStore;

use crate::config::ClusterConfig;
use crate::gateway::{ResourceManagerGateway, TaskExecutorGateway};
use crate::{JobManager, ResourceManager, Result, TaskExecutor};

/// A JobManager and one TaskManager in one process.
#[derive(Debug)]
pub struct MiniCluster {
    pub job_manager: Arc<JobManager>,
    pub resource_manager: Arc<ResourceManager>,
    pub task_executor: Arc<TaskExecutor>,
    /// Catalog and id counters (JobManager side).
    pub meta: Arc<MetaStore>,
    /// User tables (JobManager side).
    pub tables: Arc<TableStore>,
}

impl MiniCluster {
    /// Opens the stores under `data_dir` and starts the cluster.
    pub async fn start(data_dir: &Path, config: ClusterConfig) -> Result<Self> {
        std::fs::create_dir_all(data_dir)
            .map_err(|e| crate::ClusterError::Internal(e.to_string()))?;
        let meta_kv = Arc::new(KvStore::open(&data_dir.join("meta"), 32 << 20)?);
        let meta = Arc::new(MetaStore::new(meta_kv.clone()));
        let tables = Arc::new(TableStore::new(meta_kv));
        let state_kv = Arc::new(KvStore::open(
            &data_dir.join("taskmanager-0"),
            config.managed_memory_bytes,
        )?);
        let state = Arc::new(StateStore::new(state_kv));
        let resource_manager = Arc::new(ResourceManager::new(config.slot_request_timeout));
        let rm: Arc<dyn ResourceManagerGateway> = resource_manager.clone();
        let task_executor = TaskExecutor::start(
            "taskmanager-0".into(),
            &config,
            rm.clone(),
            state,
            tables.clone(),
        )
        .await?;
        let job_manager = Arc::new(JobManager::new(rm, config));
        Ok(Self {
            job_manager,
            resource_manager,
            task_executor,
            meta,
            tables,
        })
    }

    /// A view's rows at its latest committed checkpoint, from every
    /// TaskManager.
    pub async fn read_view(&self, state_table: u64, schema: SchemaRef) -> Result<Vec<RecordBatch>> {
        let mut out = Vec::new();
        for tm in [self.task_executor.clone() as Arc<dyn TaskExecutorGateway>] {
            out.extend(tm.scan_view(state_table, schema.clone()).await?);
        }
        Ok(out)
    }
}

//! Gateways to the far side of the cluster over gRPC: what a TaskManager
//! holds of its JobManager ([`RemoteResourceManager`], [`RemoteJobMaster`],
//! [`RemoteTableLog`]) and what the JobManager holds of each TaskManager
//! ([`RemoteTaskExecutor`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::datatypes::SchemaRef;
use executor::message::Barrier;
use executor::task::{CheckpointAck, TableLog, TaskDeployment, TaskId, ViewChanges, ViewLog};
use planner::execution_graph::{ExecutionState, SlotId};
use storage::chunk::Chunk;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, Endpoint};

use super::pb;
use super::pb::job_master_client::JobMasterClient;
use super::pb::resource_manager_client::ResourceManagerClient;
use super::pb::table_log_client::TableLogClient;
use super::pb::task_executor_client::TaskExecutorClient;
use super::pb::view_log_client::ViewLogClient;
use super::{CALL_TIMEOUT, CONNECT_TIMEOUT, MAX_MESSAGE, from_status, uri};
use crate::gateway::{
    ChangeStream, JobMasterGateway, ResourceId, ResourceManagerGateway, SlotReport,
    TaskExecutorGateway, TaskExecutorRegistration, ViewStream,
};
use crate::{ClusterError, Result};

/// A channel to `address` that connects on first use and reconnects after
/// failures.
pub(crate) fn lazy_channel(address: &str) -> Result<Channel> {
    Ok(Endpoint::from_shared(uri(address))
        .map_err(|e| ClusterError::Rpc(format!("bad address {address}: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(CALL_TIMEOUT)
        .tcp_nodelay(true)
        .connect_lazy())
}

fn rpc(e: tonic::Status) -> ClusterError {
    super::from_status(e, "")
}

fn report_to_pb(r: &SlotReport) -> pb::SlotReport {
    pb::SlotReport {
        slots: r
            .slots
            .iter()
            .map(|s| pb::SlotStatus {
                slot: Some((&s.slot).into()),
                jobs: s.jobs.clone(),
                operator_memory_used: s.memory_used.operators,
                rocksdb_memory_used: s.memory_used.rocksdb,
            })
            .collect(),
    }
}

type HeartbeatStream = (
    mpsc::Sender<pb::Heartbeat>,
    tonic::Streaming<pb::HeartbeatResponse>,
);

/// The JobManager's ResourceManager, as a TaskManager calls it.
pub(crate) struct RemoteResourceManager {
    client: ResourceManagerClient<Channel>,
    heartbeats: tokio::sync::Mutex<Option<HeartbeatStream>>,
}

impl RemoteResourceManager {
    pub(crate) fn new(address: &str) -> Result<Self> {
        Ok(Self {
            client: ResourceManagerClient::new(lazy_channel(address)?),
            heartbeats: tokio::sync::Mutex::new(None),
        })
    }
}

#[async_trait]
impl ResourceManagerGateway for RemoteResourceManager {
    async fn register_task_executor(
        &self,
        registration: TaskExecutorRegistration,
        _gateway: Arc<dyn TaskExecutorGateway>,
    ) -> Result<String> {
        // A new registration gets a new heartbeat stream.
        *self.heartbeats.lock().await = None;
        let request = pb::Registration {
            resource_id: registration.resource_id,
            address: registration.address,
            hardware: Some(pb::HardwareDescription {
                cpu_cores: registration.hardware.cpu_cores as u32,
                managed_memory_bytes: registration.hardware.managed_memory_bytes as u64,
            }),
            slots: Some(report_to_pb(&registration.slots)),
        };
        let response = self
            .client
            .clone()
            .register_task_executor(request)
            .await
            .map_err(rpc)?;
        Ok(response.into_inner().job_manager_id)
    }

    async fn heartbeat_from_task_executor(
        &self,
        resource_id: &ResourceId,
        slots: SlotReport,
    ) -> Result<()> {
        let mut guard = self.heartbeats.lock().await;
        if guard.is_none() {
            let (tx, rx) = mpsc::channel(4);
            let responses = self
                .client
                .clone()
                .heartbeats(ReceiverStream::new(rx))
                .await
                .map_err(rpc)?
                .into_inner();
            *guard = Some((tx, responses));
        }
        let Some((tx, responses)) = guard.as_mut() else {
            return Err(ClusterError::Internal("no heartbeat stream".into()));
        };
        let beat = pb::Heartbeat {
            resource_id: resource_id.clone(),
            slots: Some(report_to_pb(&slots)),
        };
        let result = async {
            tx.send(beat)
                .await
                .map_err(|_| ClusterError::Rpc("heartbeat stream closed".into()))?;
            match tokio::time::timeout(CALL_TIMEOUT, responses.message()).await {
                Ok(Ok(Some(_))) => Ok(()),
                Ok(Ok(None)) => Err(ClusterError::Rpc("heartbeat stream ended".into())),
                Ok(Err(status)) => Err(from_status(status, resource_id)),
                Err(_) => Err(ClusterError::Rpc("heartbeat not answered".into())),
            }
        }
        .await;
        if result.is_err() {
            *guard = None;
        }
        result
    }

    fn disconnect_task_executor(&self, _resource_id: &ResourceId, _cause: &str) {}

    async fn request_slots(
        &self,
        _job: u64,
        _count: usize,
        _job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<Vec<SlotId>> {
        Err(ClusterError::Internal(
            "slots are requested inside the JobManager".into(),
        ))
    }

    fn preview_slots(&self, _count: usize) -> Result<Vec<SlotId>> {
        Err(ClusterError::Internal(
            "slots are previewed inside the JobManager".into(),
        ))
    }

    async fn release_slots(&self, _job: u64) -> Result<()> {
        Err(ClusterError::Internal(
            "slots are released inside the JobManager".into(),
        ))
    }

    fn task_executor(&self, slot: &SlotId) -> Result<Arc<dyn TaskExecutorGateway>> {
        Err(ClusterError::UnknownTaskManager(slot.task_manager.clone()))
    }

    fn task_managers(&self) -> Vec<crate::gateway::TaskManagerInfo> {
        Vec::new()
    }
}

/// A TaskManager, as the JobManager calls it.
pub(crate) struct RemoteTaskExecutor {
    resource_id: ResourceId,
    address: String,
    client: TaskExecutorClient<Channel>,
}

impl RemoteTaskExecutor {
    pub(crate) fn new(resource_id: ResourceId, address: String) -> Result<Self> {
        let client = TaskExecutorClient::new(lazy_channel(&address)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(Self {
            resource_id,
            address,
            client,
        })
    }

    fn client(&self) -> TaskExecutorClient<Channel> {
        self.client.clone()
    }

    /// A failed call: a TaskManager that cannot be connected to at all is
    /// unreachable (and is declared lost by the caller).
    fn rpc(&self, e: tonic::Status) -> ClusterError {
        Self::failed(&self.resource_id, e)
    }

    fn failed(resource_id: &ResourceId, e: tonic::Status) -> ClusterError {
        if e.code() == tonic::Code::Unavailable {
            return ClusterError::TaskManagerUnreachable {
                resource_id: resource_id.clone(),
                error: e.message().to_string(),
            };
        }
        super::from_status(e, "")
    }
}

#[async_trait]
impl TaskExecutorGateway for RemoteTaskExecutor {
    fn resource_id(&self) -> ResourceId {
        self.resource_id.clone()
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    /// The TaskManager offers the slot to the JobMaster it knows, over RPC.
    async fn request_slot(
        &self,
        slot: SlotId,
        job: u64,
        _job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()> {
        self.client()
            .request_slot(pb::SlotRequest {
                slot: Some((&slot).into()),
                job,
            })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn free_slots(&self, job: u64) -> Result<()> {
        self.client()
            .free_slots(pb::JobRequest { job })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn submit_task(
        &self,
        deployment: TaskDeployment,
        _job_master: Arc<dyn JobMasterGateway>,
    ) -> Result<()> {
        let request = pb::TaskDeployment {
            id: Some((&deployment.id).into()),
            slot: deployment.slot as u32,
            job_graph: planner::wire::encode_job_graph(&deployment.graph)?,
            locations: deployment
                .locations
                .iter()
                .map(|v| pb::VertexLocations {
                    addresses: v.clone(),
                })
                .collect(),
            restore: super::to_json(&deployment.restore),
            checkpoint_storage: deployment.checkpoint_storage.clone(),
        };
        self.client()
            .submit_task(request)
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn cancel_job(&self, job: u64) -> Result<()> {
        self.client()
            .cancel_job(pb::JobRequest { job })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn trigger_checkpoint(&self, task: TaskId, barrier: Barrier) -> Result<()> {
        self.client()
            .trigger_checkpoint(pb::TriggerRequest {
                task: Some((&task).into()),
                barrier: Some(barrier.into()),
            })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn notify_checkpoint_complete(&self, job: u64, checkpoint_id: u64) -> Result<()> {
        self.client()
            .notify_checkpoint_complete(pb::CheckpointRequest { job, checkpoint_id })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn abort_checkpoint(&self, job: u64, checkpoint_id: u64) -> Result<()> {
        self.client()
            .abort_checkpoint(pb::CheckpointRequest { job, checkpoint_id })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn drop_job_state(&self, job: u64, tables: Vec<u64>) -> Result<()> {
        self.client()
            .drop_job_state(pb::DropStateRequest { job, tables })
            .await
            .map_err(|e| self.rpc(e))?;
        Ok(())
    }

    async fn scan_view(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<Vec<RecordBatch>> {
        let request = pb::ScanRequest {
            state_table,
            schema: super::batch_to_ipc(RecordBatch::new_empty(schema))?,
            key_group_start: key_groups.start as u32,
            key_group_end: key_groups.end as u32,
            since: 0,
        };
        let mut parts = self
            .client()
            .scan_view(request)
            .await
            .map_err(|e| self.rpc(e))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(part) = parts.message().await.map_err(|e| self.rpc(e))? {
            out.push(super::batch_from_ipc(&part.batch)?);
        }
        Ok(out)
    }

    async fn scan_view_stream(
        &self,
        state_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
    ) -> Result<ViewStream> {
        use futures::StreamExt;
        let request = pb::ScanRequest {
            state_table,
            schema: super::batch_to_ipc(RecordBatch::new_empty(schema))?,
            key_group_start: key_groups.start as u32,
            key_group_end: key_groups.end as u32,
            since: 0,
        };
        // The TaskManager pins its checkpoint before it answers.
        let parts = self
            .client()
            .scan_view(request)
            .await
            .map_err(|e| self.rpc(e))?
            .into_inner();
        let peer = self.resource_id.clone();
        Ok(parts
            .map(move |part| {
                let part = part.map_err(|e| Self::failed(&peer, e))?;
                super::batch_from_ipc(&part.batch)
            })
            .boxed())
    }

    async fn scan_changes(
        &self,
        changelog_table: u64,
        schema: SchemaRef,
        key_groups: std::ops::Range<u16>,
        since: u64,
    ) -> Result<ChangeStream> {
        use futures::StreamExt;
        let request = pb::ScanRequest {
            state_table: changelog_table,
            schema: super::batch_to_ipc(RecordBatch::new_empty(schema))?,
            key_group_start: key_groups.start as u32,
            key_group_end: key_groups.end as u32,
            since,
        };
        let mut parts = self
            .client()
            .scan_changes(request)
            .await
            .map_err(|e| self.rpc(e))?
            .into_inner();
        // The first part carries the horizon, and no batch.
        let horizon = parts
            .message()
            .await
            .map_err(|e| self.rpc(e))?
            .map_or(0, |p| p.horizon);
        let peer = self.resource_id.clone();
        Ok(ChangeStream {
            horizon,
            batches: parts
                .map(move |part| {
                    let part = part.map_err(|e| Self::failed(&peer, e))?;
                    super::batch_from_ipc(&part.batch)
                })
                .boxed(),
        })
    }
}

/// A one-way message to the JobMaster, sent in order.
enum Report {
    Ack(pb::CheckpointAck),
    State(pb::TaskExecutionState),
}

/// The JobManager's JobMaster service, as a TaskManager's tasks report to
/// it. Reports go out in order through one queue.
pub(crate) struct RemoteJobMaster {
    client: JobMasterClient<Channel>,
    reports: mpsc::UnboundedSender<Report>,
}

impl RemoteJobMaster {
    pub(crate) fn new(address: &str) -> Result<Self> {
        let client = JobMasterClient::new(lazy_channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        let (reports, mut rx) = mpsc::unbounded_channel::<Report>();
        let mut sender = client.clone();
        tokio::spawn(async move {
            while let Some(report) = rx.recv().await {
                let result = match report {
                    Report::Ack(ack) => sender.acknowledge_checkpoint(ack).await,
                    Report::State(state) => sender.update_task_execution_state(state).await,
                };
                // Lost reports are covered: an unacknowledged checkpoint
                // expires; a lost JobManager makes the TaskManager register
                // again and cancel its tasks.
                if let Err(e) = result {
                    tracing::warn!(error = %e, "report to the job master failed");
                }
            }
        });
        Ok(Self { client, reports })
    }
}

#[async_trait]
impl JobMasterGateway for RemoteJobMaster {
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck) {
        let _ = self.reports.send(Report::Ack(pb::CheckpointAck {
            task: Some(task.into()),
            checkpoint_id: ack.checkpoint_id,
            positions: ack.positions.into_iter().map(Into::into).collect(),
            alignment_micros: ack.alignment.as_micros() as u64,
            state: super::to_json(&ack.state),
            declined_kind: ack.declined.as_ref().map(|f| f.kind.name().to_string()),
            declined: ack.declined.map(|f| f.message),
            behind: ack.behind,
            decode_errors: ack.decode_errors.map(Into::into),
            state_stats: super::to_json(&Some(ack.state_stats)),
        }));
    }

    fn update_task_execution_state(
        &self,
        task: &TaskId,
        state: ExecutionState,
        error: Option<executor::Failure>,
    ) {
        let _ = self.reports.send(Report::State(pb::TaskExecutionState {
            task: Some(task.into()),
            state: super::state_name(state),
            error_kind: error.as_ref().map(|f| f.kind.name().to_string()),
            error: error.map(|f| f.message),
        }));
    }

    async fn offer_slots(&self, job: u64, slots: Vec<SlotId>) -> Result<Vec<SlotId>> {
        let response = self
            .client
            .clone()
            .offer_slots(pb::SlotOffer {
                job,
                slots: slots.iter().map(Into::into).collect(),
            })
            .await
            .map_err(rpc)?;
        Ok(response
            .into_inner()
            .accepted
            .into_iter()
            .map(Into::into)
            .collect())
    }
}

/// The JobManager's tables, as source tasks in another process read them.
pub(crate) struct RemoteTableLog {
    client: TableLogClient<Channel>,
    /// One subscription per table, shared by the TaskManager's sources.
    subscriptions: Mutex<std::collections::HashMap<u64, watch::Receiver<u64>>>,
}

impl RemoteTableLog {
    pub(crate) fn new(address: &str) -> Result<Self> {
        let client = TableLogClient::new(lazy_channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(Self {
            client,
            subscriptions: Mutex::new(Default::default()),
        })
    }

    fn exec(e: ClusterError) -> executor::ExecError {
        executor::ExecError::Service(e.to_string())
    }
}

#[async_trait]
impl TableLog for RemoteTableLog {
    async fn subscribe(&self, table: u64) -> executor::Result<watch::Receiver<u64>> {
        if let Some(rx) = self
            .subscriptions
            .lock()
            .ok()
            .and_then(|s| s.get(&table).cloned())
            .filter(|rx| rx.has_changed().is_ok())
        {
            return Ok(rx);
        }
        let mut stream = self
            .client
            .clone()
            .subscribe(pb::TableRequest { table })
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .into_inner();
        let first = stream
            .message()
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .map(|p| p.seq)
            .unwrap_or(0);
        let (tx, rx) = watch::channel(first);
        let client = self.client.clone();
        tokio::spawn(async move {
            // Follow the table; if the stream breaks, subscribe again for
            // as long as someone listens.
            loop {
                while let Ok(Some(p)) = stream.message().await {
                    tx.send_if_modified(|s| {
                        let grew = p.seq > *s;
                        *s = (*s).max(p.seq);
                        grew
                    });
                }
                if tx.is_closed() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                match client.clone().subscribe(pb::TableRequest { table }).await {
                    Ok(s) => stream = s.into_inner(),
                    Err(e) if e.code() == tonic::Code::NotFound => return,
                    Err(_) => continue,
                }
            }
        });
        if let Ok(mut s) = self.subscriptions.lock() {
            s.insert(table, rx.clone());
        }
        Ok(rx)
    }

    async fn snapshot(&self, table: u64) -> executor::Result<(Vec<RecordBatch>, u64)> {
        let mut parts = self
            .client
            .clone()
            .snapshot(pb::TableRequest { table })
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .into_inner();
        let mut batches = Vec::new();
        let mut seq = 0;
        while let Some(part) = parts.message().await.map_err(|e| Self::exec(rpc(e)))? {
            seq = part.seq;
            if !part.batch.is_empty() {
                batches.push(super::batch_from_ipc(&part.batch).map_err(Self::exec)?);
            }
        }
        Ok((batches, seq))
    }

    async fn snapshot_stream(
        self: Arc<Self>,
        table: u64,
    ) -> executor::Result<(u64, executor::task::RowStream)> {
        use futures::StreamExt;
        let mut parts = self
            .client
            .clone()
            .snapshot(pb::TableRequest { table })
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .into_inner();
        // The first part carries the sequence number and no rows.
        let seq = match parts.message().await.map_err(|e| Self::exec(rpc(e)))? {
            Some(first) => first.seq,
            None => 0,
        };
        let rows = parts.filter_map(|part| async move {
            match part {
                Err(e) => Some(Err(Self::exec(rpc(e)))),
                Ok(part) if part.batch.is_empty() => None,
                Ok(part) => Some(super::batch_from_ipc(&part.batch).map_err(Self::exec)),
            }
        });
        Ok((seq, rows.boxed()))
    }

    async fn read_log(
        &self,
        table: u64,
        after: u64,
        max: usize,
    ) -> executor::Result<Vec<storage::table::LogEntry>> {
        let entries = self
            .client
            .clone()
            .read_log(pb::ReadLogRequest {
                table,
                after,
                max: max as u32,
            })
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .into_inner();
        entries
            .entries
            .into_iter()
            .map(|e| {
                Ok(storage::table::LogEntry {
                    seq: e.seq,
                    commit: (e.commit > 0).then_some(e.commit),
                    changes: Chunk::from_ipc(&e.chunk)?,
                })
            })
            .collect()
    }

    async fn ingest(
        &self,
        table: u64,
        writer: storage::table::WriterId,
        checkpoint: u64,
        changes: &Chunk,
    ) -> executor::Result<storage::table::Ingested> {
        let r = self
            .client
            .clone()
            .ingest(pb::IngestRequest {
                table,
                writer: writer.subtask,
                job: writer.job,
                checkpoint,
                chunk: changes.to_ipc()?,
            })
            .await
            .map_err(|e| Self::exec(rpc(e)))?
            .into_inner();
        Ok(storage::table::Ingested {
            seq: (r.seq > 0).then_some(r.seq),
            duplicate: r.duplicate,
            null_rows: r.null_rows as usize,
        })
    }
}

/// The JobManager's materialized views, as view sources in another
/// process read them.
pub(crate) struct RemoteViewLog {
    client: ViewLogClient<Channel>,
}

impl RemoteViewLog {
    pub(crate) fn new(address: &str) -> Result<Self> {
        let client = ViewLogClient::new(lazy_channel(address)?)
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE);
        Ok(Self { client })
    }

    fn exec(e: tonic::Status) -> executor::ExecError {
        executor::ExecError::Service(rpc(e).to_string())
    }

    fn request(view: u64, schema: SchemaRef) -> executor::Result<pb::ViewRequest> {
        Ok(pb::ViewRequest {
            view,
            schema: super::batch_to_ipc(RecordBatch::new_empty(schema))
                .map_err(|e| executor::ExecError::Service(e.to_string()))?,
            ..Default::default()
        })
    }

    /// The first part's (at, horizon), then the pages.
    async fn parts(
        mut parts: tonic::Streaming<pb::ViewPart>,
    ) -> executor::Result<(u64, u64, executor::task::RowStream)> {
        use futures::StreamExt;
        let first = parts
            .message()
            .await
            .map_err(Self::exec)?
            .unwrap_or_default();
        let pages = parts.filter_map(|part| async move {
            match part {
                Err(e) => Some(Err(Self::exec(e))),
                Ok(part) if part.batch.is_empty() => None,
                Ok(part) => Some(
                    super::batch_from_ipc(&part.batch)
                        .map_err(|e| executor::ExecError::Service(e.to_string())),
                ),
            }
        });
        Ok((first.at, first.horizon, pages.boxed()))
    }
}

#[async_trait]
impl ViewLog for RemoteViewLog {
    async fn snapshot(
        &self,
        view: u64,
        schema: SchemaRef,
        reader: u64,
    ) -> executor::Result<(u64, executor::task::RowStream)> {
        let request = pb::ViewRequest {
            reader,
            ..Self::request(view, schema)?
        };
        let parts = self
            .client
            .clone()
            .snapshot(request)
            .await
            .map_err(Self::exec)?
            .into_inner();
        let (at, _, pages) = Self::parts(parts).await?;
        Ok((at, pages))
    }

    async fn changes(
        &self,
        view: u64,
        schema: SchemaRef,
        since: u64,
    ) -> executor::Result<ViewChanges> {
        let request = pb::ViewRequest {
            since,
            ..Self::request(view, schema)?
        };
        let parts = self
            .client
            .clone()
            .changes(request)
            .await
            .map_err(Self::exec)?
            .into_inner();
        let (at, horizon, pages) = Self::parts(parts).await?;
        Ok(ViewChanges { at, horizon, pages })
    }

    async fn completed_after(&self, view: u64, after: u64) -> executor::Result<u64> {
        let request = pb::ViewRequest {
            view,
            since: after,
            ..Default::default()
        };
        Ok(self
            .client
            .clone()
            .completed_after(request)
            .await
            .map_err(Self::exec)?
            .into_inner()
            .epoch)
    }
}

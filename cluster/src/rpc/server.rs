//! The gRPC services: the JobManager's (ResourceManager, JobMaster,
//! TableLog) and a TaskManager's (TaskExecutor, Shuffle), each a thin
//! translation onto the gateway it serves.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use executor::task::{CheckpointAck, TaskDeployment, TaskId};
use futures::Stream;
use storage::chunk::Chunk;
use storage::table::TableStore;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::client::{RemoteJobMaster, RemoteTaskExecutor};
use super::pb;
use super::pb::job_master_server::{JobMaster as JobMasterService, JobMasterServer};
use super::pb::resource_manager_server::{
    ResourceManager as ResourceManagerService, ResourceManagerServer,
};
use super::pb::shuffle_server::ShuffleServer;
use super::pb::table_log_server::{TableLog as TableLogService, TableLogServer};
use super::pb::task_executor_server::{TaskExecutor as TaskExecutorService, TaskExecutorServer};
use super::pb::view_log_server::{ViewLog as ViewLogService, ViewLogServer};
use super::{MAX_MESSAGE, missing, status};
use crate::gateway::{
    HardwareDescription, JobMasterGateway, ResourceManagerGateway, SlotReport, SlotStatus,
    TaskExecutorGateway, TaskExecutorRegistration,
};
use crate::{ClusterError, JobManager, ResourceManager, TaskExecutor};

type RpcStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

fn stream_of<T: Send + 'static>(rx: mpsc::Receiver<Result<T, Status>>) -> RpcStream<T> {
    Box::pin(ReceiverStream::new(rx))
}

fn report_from_pb(r: Option<pb::SlotReport>) -> SlotReport {
    SlotReport {
        slots: r
            .map(|r| r.slots)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|s| {
                Some(SlotStatus {
                    slot: s.slot?.into(),
                    jobs: s.jobs,
                    memory_used: crate::gateway::SlotMemoryUsed {
                        operators: s.operator_memory_used,
                        rocksdb: s.rocksdb_memory_used,
                    },
                })
            })
            .collect(),
    }
}

/// The JobManager's services.
#[derive(Clone)]
pub(crate) struct JobManagerServices {
    pub(crate) rm: Arc<ResourceManager>,
    pub(crate) jm: Arc<JobManager>,
    pub(crate) tables: Arc<TableStore>,
}

impl JobManagerServices {
    /// Serves on `listener` until the process ends.
    pub(crate) fn serve(self, listener: tokio::net::TcpListener) {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let router = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(
                ResourceManagerServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                JobMasterServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                TableLogServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                ViewLogServer::new(self)
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            );
        tokio::spawn(async move {
            if let Err(e) = router.serve_with_incoming(incoming).await {
                tracing::error!(error = %e, "cluster rpc server stopped");
            }
        });
    }
}

#[tonic::async_trait]
impl ResourceManagerService for JobManagerServices {
    async fn register_task_executor(
        &self,
        request: Request<pb::Registration>,
    ) -> Result<Response<pb::RegistrationResponse>, Status> {
        let r = request.into_inner();
        let hardware = r.hardware.unwrap_or_default();
        let gateway = Arc::new(
            RemoteTaskExecutor::new(r.resource_id.clone(), r.address.clone()).map_err(status)?,
        );
        let registration = TaskExecutorRegistration {
            resource_id: r.resource_id,
            address: r.address,
            hardware: HardwareDescription {
                cpu_cores: hardware.cpu_cores as usize,
                managed_memory_bytes: hardware.managed_memory_bytes as usize,
            },
            slots: report_from_pb(r.slots),
        };
        let id = self
            .rm
            .register_task_executor(registration, gateway)
            .await
            .map_err(status)?;
        Ok(Response::new(pb::RegistrationResponse {
            job_manager_id: id,
        }))
    }

    type HeartbeatsStream = RpcStream<pb::HeartbeatResponse>;

    async fn heartbeats(
        &self,
        request: Request<Streaming<pb::Heartbeat>>,
    ) -> Result<Response<Self::HeartbeatsStream>, Status> {
        let mut beats = request.into_inner();
        let rm = self.rm.clone();
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            // The registration this stream belongs to, from its first beat.
            let mut watched: Option<(String, u64)> = None;
            let cause = loop {
                let beat = match beats.message().await {
                    Ok(Some(beat)) => beat,
                    Ok(None) => break "heartbeat connection closed".to_string(),
                    Err(e) => break format!("heartbeat connection dropped: {e}"),
                };
                if watched.is_none() {
                    watched = rm
                        .registration_instance(&beat.resource_id)
                        .map(|i| (beat.resource_id.clone(), i));
                }
                let reply = match rm
                    .heartbeat_from_task_executor(&beat.resource_id, report_from_pb(beat.slots))
                    .await
                {
                    Ok(()) => Ok(pb::HeartbeatResponse {
                        job_manager_id: rm.id().to_string(),
                    }),
                    Err(e) => {
                        // Unknown: it must register again; this stream is done.
                        let _ = tx.send(Err(status(e))).await;
                        return;
                    }
                };
                if tx.send(reply).await.is_err() {
                    break "heartbeat connection closed".to_string();
                }
            };
            if let Some((id, instance)) = watched {
                rm.disconnect_instance(&id, instance, &cause);
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}

#[tonic::async_trait]
impl JobMasterService for JobManagerServices {
    async fn acknowledge_checkpoint(
        &self,
        request: Request<pb::CheckpointAck>,
    ) -> Result<Response<pb::Empty>, Status> {
        let ack = request.into_inner();
        let task: TaskId = ack.task.ok_or_else(|| missing("task"))?.into();
        if let Some(jm) = self.jm.job_master(task.job) {
            jm.acknowledge_checkpoint(
                &task,
                CheckpointAck {
                    checkpoint_id: ack.checkpoint_id,
                    writes: Vec::new(),
                    positions: ack.positions.into_iter().map(Into::into).collect(),
                    alignment: std::time::Duration::from_micros(ack.alignment_micros),
                    state: super::json_field(&ack.state, "state")?,
                    declined: ack.declined.map(|message| {
                        executor::Failure::new(
                            executor::ErrorKind::from_name(
                                ack.declined_kind.as_deref().unwrap_or(""),
                            ),
                            message,
                        )
                    }),
                    behind: ack.behind,
                    decode_errors: ack.decode_errors.map(Into::into),
                    state_stats: super::json_field(&ack.state_stats, "state_stats")?
                        .unwrap_or_default(),
                },
            );
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn update_task_execution_state(
        &self,
        request: Request<pb::TaskExecutionState>,
    ) -> Result<Response<pb::Empty>, Status> {
        let s = request.into_inner();
        let task: TaskId = s.task.ok_or_else(|| missing("task"))?.into();
        let state = super::parse_state(&s.state)?;
        if let Some(jm) = self.jm.job_master(task.job) {
            let error = s.error.map(|message| {
                executor::Failure::new(
                    executor::ErrorKind::from_name(s.error_kind.as_deref().unwrap_or("")),
                    message,
                )
            });
            jm.update_task_execution_state(&task, state, error);
        }
        Ok(Response::new(pb::Empty {}))
    }

    async fn offer_slots(
        &self,
        request: Request<pb::SlotOffer>,
    ) -> Result<Response<pb::SlotOfferResponse>, Status> {
        let offer = request.into_inner();
        let slots = offer.slots.into_iter().map(Into::into).collect();
        let accepted = match self.jm.job_master(offer.job) {
            Some(jm) => jm.offer_slots(offer.job, slots).await.map_err(status)?,
            None => Vec::new(),
        };
        Ok(Response::new(pb::SlotOfferResponse {
            accepted: accepted.iter().map(Into::into).collect(),
        }))
    }
}

fn exec_status(e: executor::ExecError) -> Status {
    match e {
        executor::ExecError::Storage(e) => storage_status(e),
        other => Status::internal(other.to_string()),
    }
}

fn storage_status(e: storage::StorageError) -> Status {
    match e {
        storage::StorageError::UnknownTable(id) => Status::not_found(format!("table {id}")),
        other => Status::internal(other.to_string()),
    }
}

/// Sends `first` (no batch), then `pages` as parts, from a task of its own.
fn view_parts(
    first: pb::ViewPart,
    mut pages: executor::task::RowStream,
) -> RpcStream<pb::ViewPart> {
    use futures::StreamExt;
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        if tx.send(Ok(first)).await.is_err() {
            return;
        }
        while let Some(b) = pages.next().await {
            let part = b
                .map_err(exec_status)
                .and_then(|b| super::batch_to_ipc(b).map_err(status))
                .map(|batch| pb::ViewPart {
                    batch,
                    ..Default::default()
                });
            if tx.send(part).await.is_err() {
                return;
            }
        }
    });
    stream_of(rx)
}

#[tonic::async_trait]
impl ViewLogService for JobManagerServices {
    type SnapshotStream = RpcStream<pb::ViewPart>;

    async fn snapshot(
        &self,
        request: Request<pb::ViewRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        use executor::task::ViewLog;
        let r = request.into_inner();
        let schema = super::batch_from_ipc(&r.schema).map_err(status)?.schema();
        let (at, pages) = self
            .jm
            .snapshot(r.view, schema, r.reader)
            .await
            .map_err(exec_status)?;
        let first = pb::ViewPart {
            at,
            ..Default::default()
        };
        Ok(Response::new(view_parts(first, pages)))
    }

    type ChangesStream = RpcStream<pb::ViewPart>;

    async fn changes(
        &self,
        request: Request<pb::ViewRequest>,
    ) -> Result<Response<Self::ChangesStream>, Status> {
        use executor::task::ViewLog;
        let r = request.into_inner();
        let schema = super::batch_from_ipc(&r.schema).map_err(status)?.schema();
        let changes = self
            .jm
            .changes(r.view, schema, r.since)
            .await
            .map_err(exec_status)?;
        let first = pb::ViewPart {
            batch: Vec::new(),
            at: changes.at,
            horizon: changes.horizon,
        };
        Ok(Response::new(view_parts(first, changes.pages)))
    }

    async fn completed_after(
        &self,
        request: Request<pb::ViewRequest>,
    ) -> Result<Response<pb::Epoch>, Status> {
        use executor::task::ViewLog;
        let r = request.into_inner();
        let epoch = self
            .jm
            .completed_after(r.view, r.since)
            .await
            .map_err(exec_status)?;
        Ok(Response::new(pb::Epoch { epoch }))
    }
}

#[tonic::async_trait]
impl TableLogService for JobManagerServices {
    type SubscribeStream = RpcStream<pb::LogPosition>;

    async fn subscribe(
        &self,
        request: Request<pb::TableRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let mut seq = self
            .tables
            .subscribe(request.into_inner().table)
            .map_err(storage_status)?;
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            loop {
                let now = *seq.borrow_and_update();
                if tx.send(Ok(pb::LogPosition { seq: now })).await.is_err() {
                    return;
                }
                if seq.changed().await.is_err() {
                    // The table was dropped.
                    return;
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    type SnapshotStream = RpcStream<pb::SnapshotPart>;

    async fn snapshot(
        &self,
        request: Request<pb::TableRequest>,
    ) -> Result<Response<Self::SnapshotStream>, Status> {
        use executor::task::TableLog;
        use futures::StreamExt;
        let table = request.into_inner().table;
        // Pages as the TaskManager reads them, from one snapshot.
        let (seq, mut batches) = self
            .tables
            .clone()
            .snapshot_stream(table)
            .await
            .map_err(exec_status)?;
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            // At least one part, so the sequence number always arrives.
            let _ = tx
                .send(Ok(pb::SnapshotPart {
                    batch: Vec::new(),
                    seq,
                }))
                .await;
            while let Some(b) = batches.next().await {
                let part = b
                    .map_err(exec_status)
                    .and_then(|b| super::batch_to_ipc(b).map_err(status))
                    .map(|batch| pb::SnapshotPart { batch, seq });
                if tx.send(part).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    async fn read_log(
        &self,
        request: Request<pb::ReadLogRequest>,
    ) -> Result<Response<pb::LogEntries>, Status> {
        let r = request.into_inner();
        let entries = self
            .tables
            .read_log(r.table, r.after, r.max as usize)
            .map_err(storage_status)?;
        let entries = entries
            .into_iter()
            .map(|e| {
                Ok(pb::LogEntry {
                    seq: e.seq,
                    chunk: e.changes.to_ipc().map_err(storage_status)?,
                    commit: e.commit.unwrap_or(0),
                })
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(pb::LogEntries { entries }))
    }

    async fn ingest(
        &self,
        request: Request<pb::IngestRequest>,
    ) -> Result<Response<pb::IngestReply>, Status> {
        let r = request.into_inner();
        let chunk = Chunk::from_ipc(&r.chunk).map_err(storage_status)?;
        let tables = self.tables.clone();
        let done = tokio::task::spawn_blocking(move || {
            let writer = storage::table::WriterId {
                job: r.job,
                subtask: r.writer,
            };
            tables.ingest(r.table, writer, r.checkpoint, &chunk)
        })
        .await
        .map_err(|e| Status::internal(e.to_string()))?
        .map_err(storage_status)?;
        Ok(Response::new(pb::IngestReply {
            seq: done.seq.unwrap_or(0),
            duplicate: done.duplicate,
            null_rows: done.null_rows as u64,
        }))
    }
}

/// A TaskManager's services.
#[derive(Clone)]
pub(crate) struct TaskManagerServices {
    pub(crate) te: Arc<TaskExecutor>,
    pub(crate) job_master: Arc<RemoteJobMaster>,
}

impl TaskManagerServices {
    /// Serves on `listener`; the returned future ends with the server.
    pub(crate) async fn serve(self, listener: tokio::net::TcpListener) -> Result<(), ClusterError> {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(
                TaskExecutorServer::new(self.clone())
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .add_service(
                ShuffleServer::new(super::shuffle::ShuffleService(self.te.shuffle().clone()))
                    .max_decoding_message_size(MAX_MESSAGE)
                    .max_encoding_message_size(MAX_MESSAGE),
            )
            .serve_with_incoming(incoming)
            .await
            .map_err(|e| ClusterError::Rpc(e.to_string()))
    }
}

fn empty<E: Into<ClusterError>>(r: Result<(), E>) -> Result<Response<pb::Empty>, Status> {
    r.map_err(|e| status(e.into()))?;
    Ok(Response::new(pb::Empty {}))
}

#[tonic::async_trait]
impl TaskExecutorService for TaskManagerServices {
    async fn request_slot(
        &self,
        request: Request<pb::SlotRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        let slot = r.slot.ok_or_else(|| missing("slot"))?.into();
        let master: Arc<dyn JobMasterGateway> = self.job_master.clone();
        empty(self.te.request_slot(slot, r.job, master).await)
    }

    async fn free_slots(
        &self,
        request: Request<pb::JobRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        empty(self.te.free_slots(request.into_inner().job).await)
    }

    async fn submit_task(
        &self,
        request: Request<pb::TaskDeployment>,
    ) -> Result<Response<pb::Empty>, Status> {
        let d = request.into_inner();
        let graph = planner::wire::decode_job_graph(&d.job_graph)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let deployment = TaskDeployment {
            id: d.id.ok_or_else(|| missing("id"))?.into(),
            slot: d.slot as usize,
            graph: Arc::new(graph),
            locations: Arc::new(d.locations.into_iter().map(|l| l.addresses).collect()),
            restore: super::json_field(&d.restore, "restore")?,
            checkpoint_storage: d.checkpoint_storage,
        };
        let master: Arc<dyn JobMasterGateway> = self.job_master.clone();
        empty(self.te.submit_task(deployment, master).await)
    }

    async fn cancel_job(
        &self,
        request: Request<pb::JobRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        empty(self.te.cancel_job(request.into_inner().job).await)
    }

    async fn trigger_checkpoint(
        &self,
        request: Request<pb::TriggerRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        let task = r.task.ok_or_else(|| missing("task"))?.into();
        let barrier = r.barrier.ok_or_else(|| missing("barrier"))?.into();
        empty(self.te.trigger_checkpoint(task, barrier).await)
    }

    async fn notify_checkpoint_complete(
        &self,
        request: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        empty(
            self.te
                .notify_checkpoint_complete(r.job, r.checkpoint_id)
                .await,
        )
    }

    async fn abort_checkpoint(
        &self,
        request: Request<pb::CheckpointRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        empty(self.te.abort_checkpoint(r.job, r.checkpoint_id).await)
    }

    async fn drop_job_state(
        &self,
        request: Request<pb::DropStateRequest>,
    ) -> Result<Response<pb::Empty>, Status> {
        let r = request.into_inner();
        empty(self.te.drop_job_state(r.job, r.tables).await)
    }

    type ScanViewStream = RpcStream<pb::ScanPart>;

    async fn scan_view(
        &self,
        request: Request<pb::ScanRequest>,
    ) -> Result<Response<Self::ScanViewStream>, Status> {
        let r = request.into_inner();
        let schema = super::batch_from_ipc(&r.schema).map_err(status)?.schema();
        // Pages as the client reads them: the checkpoint is pinned now.
        let mut batches = self
            .te
            .scan_view_stream(
                r.state_table,
                schema,
                r.key_group_start as u16..r.key_group_end as u16,
            )
            .await
            .map_err(status)?;
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            use futures::StreamExt;
            while let Some(b) = batches.next().await {
                let part = b
                    .and_then(super::batch_to_ipc)
                    .map(|batch| pb::ScanPart { batch, horizon: 0 })
                    .map_err(status);
                if tx.send(part).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }

    type ScanChangesStream = RpcStream<pb::ScanPart>;

    async fn scan_changes(
        &self,
        request: Request<pb::ScanRequest>,
    ) -> Result<Response<Self::ScanChangesStream>, Status> {
        let r = request.into_inner();
        let schema = super::batch_from_ipc(&r.schema).map_err(status)?.schema();
        let changes = self
            .te
            .scan_changes(
                r.state_table,
                schema,
                r.key_group_start as u16..r.key_group_end as u16,
                r.since,
            )
            .await
            .map_err(status)?;
        let (tx, rx) = mpsc::channel(2);
        tokio::spawn(async move {
            use futures::StreamExt;
            let first = pb::ScanPart {
                batch: Vec::new(),
                horizon: changes.horizon,
            };
            if tx.send(Ok(first)).await.is_err() {
                return;
            }
            let mut batches = changes.batches;
            while let Some(b) = batches.next().await {
                let part = b
                    .and_then(super::batch_to_ipc)
                    .map(|batch| pb::ScanPart { batch, horizon: 0 })
                    .map_err(status);
                if tx.send(part).await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(stream_of(rx)))
    }
}

/// Binds `addr` for a cluster RPC server.
pub(crate) async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, ClusterError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| ClusterError::Rpc(format!("cannot listen on {addr}: {e}")))
}

//! The cluster's gRPC: the services of `proto/cluster.proto`, each serving
//! one gateway trait, and clients that implement those traits for the far
//! side. A multi-process cluster is the same JobManager and TaskExecutor
//! code as the playground with these in between.
//!
//! - [`server`]: JobManager side (ResourceManager, JobMaster, TableLog) and
//!   TaskManager side (TaskExecutor, Shuffle) services.
//! - [`client`]: `Remote*` gateways calling those services.
//! - [`shuffle`]: network channels with credit-based flow control.

pub(crate) mod client;
pub(crate) mod server;
pub(crate) mod shuffle;

use std::time::Duration;

use executor::message::{Barrier, BarrierKind, Message, Mutation, Watermark};
use executor::task::{DecodeErrors, SourcePosition, TaskId};
use planner::execution_graph::{ExecutionState, SlotId};
use storage::chunk::Chunk;

use crate::ClusterError;

/// Generated from `proto/cluster.proto`.
#[allow(clippy::all, unreachable_pub, missing_debug_implementations)]
pub(crate) mod pb {
    tonic::include_proto!("weir.cluster");
}

/// How long a unary call may take before the peer counts as unreachable.
pub(crate) const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long connecting to a peer may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest message either side accepts (chunks, snapshots, state).
pub(crate) const MAX_MESSAGE: usize = 256 << 20;

/// `host:port` → `http://host:port`.
pub(crate) fn uri(address: &str) -> String {
    if address.starts_with("http://") || address.starts_with("https://") {
        address.to_string()
    } else {
        format!("http://{address}")
    }
}

/// An optional JSON-encoded field: empty bytes are `None`.
pub(crate) fn json_field<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    field: &str,
) -> Result<Option<T>, tonic::Status> {
    if bytes.is_empty() {
        return Ok(None);
    }
    serde_json::from_slice(bytes)
        .map(Some)
        .map_err(|e| tonic::Status::invalid_argument(format!("bad {field}: {e}")))
}

pub(crate) fn to_json<T: serde::Serialize>(value: &Option<T>) -> Vec<u8> {
    value
        .as_ref()
        .and_then(|v| serde_json::to_vec(v).ok())
        .unwrap_or_default()
}

pub(crate) fn status(e: ClusterError) -> tonic::Status {
    match e {
        ClusterError::CorruptCheckpoint(why) => tonic::Status::data_loss(why),
        ClusterError::UnknownTaskManager(id) => tonic::Status::not_found(id),
        ClusterError::UnknownJob(job) => tonic::Status::not_found(format!("job {job} not found")),
        other => tonic::Status::internal(other.to_string()),
    }
}

pub(crate) fn from_status(s: tonic::Status, resource: &str) -> ClusterError {
    match s.code() {
        tonic::Code::NotFound if s.message() == resource => {
            ClusterError::UnknownTaskManager(resource.to_string())
        }
        tonic::Code::DataLoss => ClusterError::CorruptCheckpoint(s.message().to_string()),
        _ => ClusterError::Rpc(format!("{}: {}", s.code(), s.message())),
    }
}

pub(crate) fn missing(field: &str) -> tonic::Status {
    tonic::Status::invalid_argument(format!("missing {field}"))
}

impl From<&TaskId> for pb::TaskId {
    fn from(t: &TaskId) -> Self {
        pb::TaskId {
            job: t.job,
            vertex: t.vertex as u32,
            subtask: t.subtask as u32,
            attempt: t.attempt,
        }
    }
}

impl From<pb::TaskId> for TaskId {
    fn from(t: pb::TaskId) -> Self {
        TaskId {
            job: t.job,
            vertex: t.vertex as usize,
            subtask: t.subtask as usize,
            attempt: t.attempt,
        }
    }
}

impl From<&SlotId> for pb::SlotId {
    fn from(s: &SlotId) -> Self {
        pb::SlotId {
            task_manager: s.task_manager.clone(),
            index: s.index as u32,
        }
    }
}

impl From<pb::SlotId> for SlotId {
    fn from(s: pb::SlotId) -> Self {
        SlotId {
            task_manager: s.task_manager,
            index: s.index as usize,
        }
    }
}

impl From<SourcePosition> for pb::SourcePosition {
    fn from(p: SourcePosition) -> Self {
        pb::SourcePosition {
            table: p.table,
            seq: p.seq,
        }
    }
}

impl From<pb::SourcePosition> for SourcePosition {
    fn from(p: pb::SourcePosition) -> Self {
        SourcePosition {
            table: p.table,
            seq: p.seq,
        }
    }
}

impl From<DecodeErrors> for pb::DecodeErrors {
    fn from(e: DecodeErrors) -> Self {
        let (last_at_micros, last_error) = match e.last {
            Some((at, message)) => (at, Some(message)),
            None => (0, None),
        };
        pb::DecodeErrors {
            source: e.source,
            records: e.records,
            last_error,
            last_at_micros,
        }
    }
}

impl From<pb::DecodeErrors> for DecodeErrors {
    fn from(e: pb::DecodeErrors) -> Self {
        DecodeErrors {
            source: e.source,
            records: e.records,
            last: e.last_error.map(|m| (e.last_at_micros, m)),
        }
    }
}

pub(crate) fn state_name(s: ExecutionState) -> String {
    s.to_string()
}

pub(crate) fn parse_state(s: &str) -> Result<ExecutionState, tonic::Status> {
    Ok(match s {
        "CREATED" => ExecutionState::Created,
        "SCHEDULED" => ExecutionState::Scheduled,
        "DEPLOYING" => ExecutionState::Deploying,
        "RUNNING" => ExecutionState::Running,
        "FINISHED" => ExecutionState::Finished,
        "CANCELING" => ExecutionState::Canceling,
        "CANCELED" => ExecutionState::Canceled,
        "FAILED" => ExecutionState::Failed,
        other => {
            return Err(tonic::Status::invalid_argument(format!(
                "unknown execution state {other}"
            )));
        }
    })
}

impl From<Barrier> for pb::Barrier {
    fn from(b: Barrier) -> Self {
        pb::Barrier {
            checkpoint_id: b.checkpoint_id,
            kind: match b.kind {
                BarrierKind::Checkpoint => 0,
                BarrierKind::Savepoint => 1,
            },
            mutation: match b.mutation {
                Mutation::None => 0,
                Mutation::Stop => 1,
                Mutation::Pause => 2,
                Mutation::Resume => 3,
            },
            timestamp_ms: b.timestamp_ms,
            commit: b.commit,
            keep_after: b.keep_after,
        }
    }
}

impl From<pb::Barrier> for Barrier {
    fn from(b: pb::Barrier) -> Self {
        Barrier {
            checkpoint_id: b.checkpoint_id,
            kind: if b.kind == 1 {
                BarrierKind::Savepoint
            } else {
                BarrierKind::Checkpoint
            },
            mutation: match b.mutation {
                1 => Mutation::Stop,
                2 => Mutation::Pause,
                3 => Mutation::Resume,
                _ => Mutation::None,
            },
            timestamp_ms: b.timestamp_ms,
            commit: b.commit,
            keep_after: b.keep_after,
        }
    }
}

/// A channel message as a frame; `None` for what never crosses the network.
pub(crate) fn frame(msg: Message) -> Result<Option<pb::Frame>, ClusterError> {
    use pb::frame::Kind;
    let kind = match msg {
        Message::Chunk(c) => Kind::Chunk(c.to_ipc()?),
        Message::Barrier(b) => Kind::Barrier(b.into()),
        Message::Watermark(w) => Kind::Watermark(pb::Watermark {
            column: w.column as u32,
            timestamp: w.timestamp,
        }),
        Message::Broken(_) => return Ok(None),
    };
    Ok(Some(pb::Frame { kind: Some(kind) }))
}

pub(crate) fn message(frame: pb::Frame) -> Result<Message, ClusterError> {
    use pb::frame::Kind;
    match frame.kind {
        Some(Kind::Chunk(bytes)) => Ok(Message::Chunk(Chunk::from_ipc(&bytes)?)),
        Some(Kind::Barrier(b)) => Ok(Message::Barrier(b.into())),
        Some(Kind::Watermark(w)) => Ok(Message::Watermark(Watermark {
            column: w.column as usize,
            timestamp: w.timestamp,
        })),
        None => Err(ClusterError::Rpc("empty frame".into())),
    }
}

/// A record batch as Arrow IPC (through a chunk of inserts).
pub(crate) fn batch_to_ipc(
    batch: datafusion::arrow::array::RecordBatch,
) -> Result<Vec<u8>, ClusterError> {
    Ok(Chunk::inserts(batch).to_ipc()?)
}

pub(crate) fn batch_from_ipc(
    bytes: &[u8],
) -> Result<datafusion::arrow::array::RecordBatch, ClusterError> {
    Ok(Chunk::from_ipc(bytes)?.data().clone())
}

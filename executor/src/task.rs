//! The StreamTask: one subtask of one JobVertex, running its operator chain.
//!
//! Kinds as in Flink: a *source task* is headed by a [`TableSource`] and
//! takes checkpoint triggers from the JobMaster; a *one-input* or *two-input
//! task* is headed by an [`InputGate`] whose aligned barriers trigger the
//! checkpoint. Either way the checkpoint runs here, once: snapshot every
//! operator of the chain, forward the barrier on every output, acknowledge
//! with the state writes.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use planner::execution_graph::ExecutionState;
use planner::job_graph::JobGraph;
use planner::spec::{OperatorSpec, Partitioner};
use storage::checkpoint_storage::StateHandle;
use storage::chunk::Chunk;
use storage::keys::key_group_range;
use storage::state::StateWrite;
use storage::table::LogEntry;
use tokio::sync::{mpsc, watch};

use crate::exchange::{ChannelId, GateEvent, InputGate, LocalShuffle, OutputWriter};
use crate::message::{Barrier, Message, Watermark};
use crate::operator::{Operator, OperatorContext};
use crate::operators::{
    self, connector_source::ConnectorSource, table_source::TableSource,
    values_source::ValuesSource, view_source::ViewSource,
};
use crate::sinks::CommittingSink;
use crate::state::StateStore;
use crate::{ExecError, Result};

/// Which subtask, in which deployment attempt of its job (Flink's
/// `ExecutionAttemptID`): reports from a cancelled attempt are told apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TaskId {
    pub job: u64,
    pub vertex: usize,
    pub subtask: usize,
    pub attempt: u64,
}

impl std::fmt::Display for TaskId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "job {} vertex {} subtask {} attempt {}",
            self.job, self.vertex, self.subtask, self.attempt
        )
    }
}

/// A source's read position at a checkpoint: table id and log sequence number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourcePosition {
    pub table: u64,
    pub seq: u64,
}

/// A task's part of a checkpoint.
#[derive(Debug, Clone, Default)]
pub struct CheckpointAck {
    pub checkpoint_id: u64,
    /// State changed since the previous checkpoint.
    pub writes: Vec<StateWrite>,
    /// Source tasks: where they read up to.
    pub positions: Vec<SourcePosition>,
    /// How long the task's input gate held channels back to align the
    /// barrier (zero for source tasks).
    pub alignment: std::time::Duration,
    /// Where the TaskManager put the subtask's snapshot (stateful subtasks,
    /// from the TaskManager to the JobMaster; `writes` is then empty).
    pub state: Option<StateHandle>,
    /// Set when the subtask could not take its part (Flink's decline).
    pub declined: Option<crate::Failure>,
    /// Connector sources: more was available to read than the rows before
    /// the barrier (`FLUSH` waits for a checkpoint where none is behind).
    pub behind: bool,
    /// Connector sources: the records they could not decode, up to the
    /// barrier.
    pub decode_errors: Option<DecodeErrors>,
    /// What the operators' keyed state holds (`weir_catalog.state`).
    pub state_stats: Vec<crate::state::OperatorStateStats>,
}

/// The records of a source that one subtask (or, summed, a job) skipped
/// because they could not be decoded, as of a checkpoint: state, so that
/// a restart neither loses nor counts one twice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DecodeErrors {
    /// The source (or connector table) id.
    pub source: u64,
    pub records: u64,
    /// The latest error: when (microseconds since the epoch) and what.
    pub last: Option<(i64, String)>,
}

impl DecodeErrors {
    /// Adds another subtask's (or split's) count; the later error wins.
    pub fn add(&mut self, other: &DecodeErrors) {
        self.records += other.records;
        if other.last.as_ref().map(|l| l.0) > self.last.as_ref().map(|l| l.0) {
            self.last = other.last.clone();
        }
    }
}

/// The state a (re)deployed subtask starts from (Flink's
/// `JobManagerTaskRestore`): a completed checkpoint's handles that hold
/// the subtask's tables in its key groups.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TaskRestore {
    pub checkpoint: u64,
    pub handles: Vec<StateHandle>,
}

/// Commands from the TaskManager to a running task.
#[derive(Debug, Clone)]
pub enum TaskCommand {
    /// Sources only: emit this barrier after the data read so far.
    TriggerCheckpoint(Barrier),
    /// The checkpoint is complete and committed.
    NotifyCheckpointComplete(u64),
    Cancel,
}

/// How a task reports to its TaskManager (implemented in `cluster/`).
pub trait TaskReporter: Send + Sync {
    /// The task has taken its part of checkpoint `checkpoint_id`.
    fn acknowledge_checkpoint(&self, task: &TaskId, ack: CheckpointAck);

    /// The task's execution state changed.
    fn state_changed(&self, task: &TaskId, state: ExecutionState, error: Option<crate::Failure>);
}

/// Rows as they are read.
pub type RowStream = futures::stream::BoxStream<'static, Result<RecordBatch>>;

/// How a source task reads a table's rows and change log, and how the job
/// of a table that reads a connector writes into it. The tables live with
/// the catalog on the JobManager; a TaskManager in the same process reaches
/// them directly, one elsewhere over RPC.
#[async_trait]
pub trait TableLog: Send + Sync {
    /// The table's last log sequence number, now and whenever it grows.
    async fn subscribe(&self, table: u64) -> Result<watch::Receiver<u64>>;
    /// Every row of the table and the sequence number they are at.
    async fn snapshot(&self, table: u64) -> Result<(Vec<RecordBatch>, u64)>;
    /// [`TableLog::snapshot`] as a stream read a page at a time as it is
    /// polled, from one snapshot taken before this returns, so that a
    /// reader's memory does not grow with the table. By default the whole
    /// read, as one.
    async fn snapshot_stream(self: Arc<Self>, table: u64) -> Result<(u64, RowStream)> {
        use futures::StreamExt;
        let (batches, seq) = self.snapshot(table).await?;
        Ok((
            seq,
            futures::stream::iter(batches.into_iter().map(Ok)).boxed(),
        ))
    }
    /// Up to `max` log entries after sequence number `after`.
    async fn read_log(&self, table: u64, after: u64, max: usize) -> Result<Vec<LogEntry>>;
    /// Applies what a connector read, as writer `writer`'s commit of
    /// `checkpoint`: once, however often it is asked (see
    /// `storage::table::TableStore::ingest`).
    async fn ingest(
        &self,
        table: u64,
        writer: storage::table::WriterId,
        checkpoint: u64,
        changes: &Chunk,
    ) -> Result<storage::table::Ingested>;
}

/// A materialized view's committed output, as a [`ViewSource`] reads it
/// (implemented by the JobManager, in-process or over gRPC): only what its
/// job's completed checkpoints hold.
#[async_trait]
pub trait ViewLog: Send + Sync {
    /// The view's rows at its job's latest completed checkpoint, a page at a
    /// time, and that checkpoint's id (0 before the first). From then on
    /// the view keeps its changes after that epoch for job `reader`.
    async fn snapshot(
        &self,
        view: u64,
        schema: datafusion::arrow::datatypes::SchemaRef,
        reader: u64,
    ) -> Result<(u64, RowStream)>;
    /// The changes of the epochs after `since`, up to the latest completed
    /// checkpoint.
    async fn changes(
        &self,
        view: u64,
        schema: datafusion::arrow::datatypes::SchemaRef,
        since: u64,
    ) -> Result<ViewChanges>;
    /// The id of the view's latest completed checkpoint, once it is after
    /// `after` or a second has passed.
    async fn completed_after(&self, view: u64, after: u64) -> Result<u64>;
}

/// What [`ViewLog::changes`] reads.
pub struct ViewChanges {
    /// The checkpoint read: the changes go up to its epoch.
    pub at: u64,
    /// Every epoch after this one is whole; a `since` before it has lost
    /// changes (and `pages` is empty).
    pub horizon: u64,
    /// `epoch bigint, diff bigint, <the view's columns>`, in epoch order,
    /// an epoch's deletes before its inserts, one kind per page.
    pub pages: RowStream,
}

/// Opens the consuming end of a channel whose producer runs in another
/// TaskManager (implemented by the cluster's network shuffle).
pub trait RemoteChannels: Send + Sync {
    /// Messages of `channel` from the TaskManager serving shuffle at `address`.
    fn connect(&self, address: &str, channel: ChannelId) -> Result<mpsc::Receiver<Message>>;
}

/// What a TaskManager provides to the tasks it runs.
#[derive(Clone)]
pub struct TaskEnvironment {
    pub tables: Arc<dyn TableLog>,
    pub views: Arc<dyn ViewLog>,
    /// The task's keyed state store.
    pub state: Arc<dyn StateStore>,
    /// The operator share of the task's slot's managed memory.
    pub memory: Arc<storage::memory::MemoryPool>,
    /// In-memory channels, and the producing ends of remote ones.
    pub shuffle: Arc<LocalShuffle>,
    pub remote: Arc<dyn RemoteChannels>,
    /// This TaskManager's shuffle address, as in [`TaskDeployment::locations`].
    pub address: String,
    pub reporter: Arc<dyn TaskReporter>,
}

/// Everything needed to start one subtask (Flink's
/// `TaskDeploymentDescriptor`).
#[derive(Debug, Clone)]
pub struct TaskDeployment {
    pub id: TaskId,
    /// Index of the slot of this TaskManager the task runs in.
    pub slot: usize,
    pub graph: Arc<JobGraph>,
    /// Shuffle address of the TaskManager of every subtask, by vertex: where
    /// each input channel comes from.
    pub locations: Arc<Vec<Vec<String>>>,
    /// `None` for a fresh start.
    pub restore: Option<TaskRestore>,
    /// Where the subtask's snapshots go (see `storage::checkpoint_storage`).
    pub checkpoint_storage: String,
}

enum Head {
    Source(TableSource),
    View(Box<ViewSource>),
    Connector(Box<ConnectorSource>),
    Values(ValuesSource),
    Gate(InputGate),
}

/// A running subtask.
pub struct StreamTask {
    id: TaskId,
    head: Head,
    chain: Vec<Box<dyn Operator>>,
    /// A sink's subtask ends in its writer rather than in outputs.
    sink: Option<CommittingSink>,
    outputs: Vec<OutputWriter>,
    commands: mpsc::UnboundedReceiver<TaskCommand>,
    reporter: Arc<dyn TaskReporter>,
    ctx: OperatorContext,
}

impl std::fmt::Debug for StreamTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamTask").field("id", &self.id).finish()
    }
}

/// Builds a subtask: its head, its chain, its channels.
pub fn build_task(
    dep: &TaskDeployment,
    env: &TaskEnvironment,
) -> Result<(StreamTask, mpsc::UnboundedSender<TaskCommand>)> {
    let graph = &dep.graph;
    let vertex = graph
        .vertices
        .get(dep.id.vertex)
        .ok_or_else(|| ExecError::Protocol(format!("no vertex {}", dep.id.vertex)))?;
    let subtask = dep.id.subtask;
    let channel = |edge: usize, from: usize, to: usize| ChannelId {
        job: dep.id.job,
        attempt: dep.id.attempt,
        edge,
        from,
        to,
    };
    let head_node = &graph.stream.nodes[vertex.nodes[0]];
    let (head, chain_nodes) = match &head_node.spec {
        OperatorSpec::TableSource {
            table_id,
            projection,
            state_table,
            watermark,
            ..
        } => {
            let mut source = TableSource::new(
                *table_id,
                projection.clone(),
                *state_table,
                &head_node.schema,
                env.tables.clone(),
            );
            if let Some(w) = watermark {
                source = source.with_watermark(w)?;
            }
            (Head::Source(source), &vertex.nodes[1..])
        }
        OperatorSpec::ViewSource {
            view_id,
            view_name,
            view_schema,
            projection,
            state_table,
        } => (
            Head::View(Box::new(ViewSource::new(
                *view_id,
                view_name.clone(),
                dep.id.job,
                projection.clone(),
                *state_table,
                view_schema,
                &head_node.schema,
                env.views.clone(),
            ))),
            &vertex.nodes[1..],
        ),
        OperatorSpec::Values {
            rows,
            cells,
            state_table,
        } => (
            Head::Values(ValuesSource::new(
                *rows,
                cells.clone(),
                *state_table,
                &head_node.schema,
            )),
            &vertex.nodes[1..],
        ),
        OperatorSpec::ConnectorSource { .. } => (
            Head::Connector(Box::new(ConnectorSource::new(
                &head_node.spec,
                &head_node.schema,
                dep.id.job,
                subtask,
                &env.tables,
            )?)),
            &vertex.nodes[1..],
        ),
        _ => {
            let mut inputs = Vec::new();
            for (e, edge) in graph
                .edges
                .iter()
                .enumerate()
                .filter(|(_, e)| e.to == vertex.id)
            {
                let upstream = graph.vertices[edge.from].parallelism;
                let froms: Vec<usize> = if matches!(edge.partitioner, Partitioner::Forward) {
                    vec![subtask]
                } else {
                    (0..upstream).collect()
                };
                for from in froms {
                    let id = channel(e, from, subtask);
                    let rx = match dep.locations.get(edge.from).and_then(|v| v.get(from)) {
                        Some(addr) if *addr != env.address => env.remote.connect(addr, id)?,
                        _ => env.shuffle.receiver(id)?,
                    };
                    inputs.push((edge.input, rx));
                }
            }
            let gate = InputGate::new(inputs).with_mode(graph.stream.checkpoint_mode);
            (Head::Gate(gate), &vertex.nodes[..])
        }
    };
    let (chain_nodes, sink) = match chain_nodes.split_last() {
        Some((last, rest))
            if matches!(graph.stream.nodes[*last].spec, OperatorSpec::Sink { .. }) =>
        {
            let node = &graph.stream.nodes[*last];
            let schema = Arc::new(node.schema.as_arrow().clone());
            (
                rest,
                Some(CommittingSink::new(
                    &node.spec,
                    schema,
                    subtask,
                    &env.tables,
                )?),
            )
        }
        _ => (chain_nodes, None),
    };
    let chain = chain_nodes
        .iter()
        .map(|n| operators::build(&graph.stream.nodes[*n]))
        .collect::<Result<Vec<_>>>()?;
    let mut outputs = Vec::new();
    for (e, edge) in graph
        .edges
        .iter()
        .enumerate()
        .filter(|(_, e)| e.from == vertex.id)
    {
        let downstream = graph.vertices[edge.to].parallelism;
        let senders = if matches!(edge.partitioner, Partitioner::Forward) {
            vec![env.shuffle.sender(channel(e, subtask, subtask))?]
        } else {
            (0..downstream)
                .map(|to| env.shuffle.sender(channel(e, subtask, to)))
                .collect::<Result<_>>()?
        };
        outputs.push(OutputWriter::new(&edge.partitioner, senders)?);
    }
    let (tx, commands) = mpsc::unbounded_channel();
    let ctx = OperatorContext {
        job_id: dep.id.job,
        subtask,
        parallelism: vertex.parallelism,
        key_groups: key_group_range(subtask, vertex.parallelism),
        state: env.state.clone(),
        restored_from: dep.restore.as_ref().map(|r| r.checkpoint),
        backend: graph.stream.state_backend,
        memory: env.memory.clone(),
    };
    Ok((
        StreamTask {
            id: dep.id.clone(),
            head,
            chain,
            sink,
            outputs,
            commands,
            reporter: env.reporter.clone(),
            ctx,
        },
        tx,
    ))
}

/// What a connector source adds to its acknowledgement.
#[derive(Debug, Default)]
struct SourceReport {
    behind: bool,
    decode_errors: Option<DecodeErrors>,
}

/// Why the main loop ended.
enum Exit {
    Cancelled,
    InputsClosed,
}

impl StreamTask {
    pub fn id(&self) -> &TaskId {
        &self.id
    }

    /// Runs until cancelled or failed, reporting state changes.
    pub async fn run(mut self) {
        self.reporter
            .state_changed(&self.id, ExecutionState::Running, None);
        let result = self.run_inner().await;
        for op in &mut self.chain {
            let _ = op.on_close();
        }
        let (state, error) = match result {
            Ok(Exit::Cancelled) => (ExecutionState::Canceled, None),
            Ok(Exit::InputsClosed) => (ExecutionState::Finished, None),
            // Downstream went away: the job is being torn down.
            Err(ExecError::ChannelClosed) => (ExecutionState::Canceled, None),
            Err(e) => {
                tracing::error!(task = %self.id, error = %e, "task failed");
                (ExecutionState::Failed, Some(e.failure()))
            }
        };
        self.reporter.state_changed(&self.id, state, error);
    }

    async fn run_inner(&mut self) -> Result<Exit> {
        if let Some(sink) = &mut self.sink {
            sink.open(&self.ctx).await?;
        }
        for i in 0..self.chain.len() {
            let mut initial = Vec::new();
            self.chain[i].on_start(&self.ctx, &mut initial)?;
            for chunk in initial {
                self.push(i + 1, 0, chunk).await?;
            }
        }
        let mut head = std::mem::replace(&mut self.head, Head::Gate(InputGate::new(vec![])));
        let result = match &mut head {
            Head::Source(source) => self.run_source(source).await,
            Head::View(source) => self.run_view(source).await,
            Head::Connector(source) => self.run_connector(source).await,
            Head::Values(source) => self.run_values(source).await,
            Head::Gate(gate) => self.run_gate(gate).await,
        };
        self.head = head;
        result
    }

    async fn run_source(&mut self, source: &mut TableSource) -> Result<Exit> {
        source.restore(&self.ctx)?;
        source.open().await?;
        if let Some(mut rows) = source.backfill_stream().await? {
            use futures::StreamExt;
            while let Some(page) = rows.next().await {
                for chunk in source.backfill_chunks(page?)? {
                    self.push(0, 0, chunk).await?;
                }
            }
        }
        self.source_watermark(source.take_watermark()).await?;
        loop {
            let has_more = source.has_more();
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(TaskCommand::TriggerCheckpoint(barrier)) => {
                        // Everything written before the trigger belongs to this
                        // checkpoint; what comes meanwhile waits for the next one,
                        // so a busy table cannot hold the barrier back for ever.
                        for chunk in source.before_barrier(barrier.commit).await? {
                            self.push(0, 0, chunk).await?;
                        }
                        self.source_watermark(source.take_watermark()).await?;
                        let mut writes = Vec::new();
                        source.snapshot(&mut writes);
                        let position = SourcePosition { table: source.table_id(), seq: source.position() };
                        self.checkpoint(barrier, writes, vec![position], Default::default(), SourceReport::default()).await?;
                    }
                    Some(TaskCommand::NotifyCheckpointComplete(id)) => self.commit(id).await?,
                    Some(TaskCommand::Cancel) | None => return Ok(Exit::Cancelled),
                },
                _ = std::future::ready(()), if has_more => {
                    for chunk in source.poll().await? {
                        self.push(0, 0, chunk).await?;
                    }
                    self.source_watermark(source.take_watermark()).await?;
                }
                _ = source.changed(), if !has_more => {}
            }
        }
    }

    /// Another view's output: its rows at one of its checkpoints, then
    /// each run of its completed epochs, read whole between two barriers.
    async fn run_view(&mut self, source: &mut ViewSource) -> Result<Exit> {
        use futures::StreamExt;
        source.restore(&self.ctx)?;
        if let Some(mut rows) = source.backfill_stream().await? {
            while let Some(page) = rows.next().await {
                for chunk in source.backfill_chunks(page?)? {
                    self.push(0, 0, chunk).await?;
                }
            }
        }
        loop {
            let has_more = source.has_more();
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(TaskCommand::TriggerCheckpoint(barrier)) => {
                        let mut writes = Vec::new();
                        source.snapshot(&mut writes);
                        let position = SourcePosition { table: source.view_id(), seq: source.position() };
                        self.checkpoint(barrier, writes, vec![position], Default::default(), SourceReport::default()).await?;
                    }
                    Some(TaskCommand::NotifyCheckpointComplete(id)) => self.commit(id).await?,
                    Some(TaskCommand::Cancel) | None => return Ok(Exit::Cancelled),
                },
                _ = std::future::ready(()), if has_more => {
                    if let Some(mut read) = source.read().await? {
                        while let Some(page) = read.pages.next().await {
                            for chunk in source.change_chunks(page?)? {
                                self.push(0, 0, chunk).await?;
                            }
                        }
                        source.advance(read.at);
                    }
                }
                changed = source.changed(), if !has_more => changed?,
            }
        }
    }

    /// Constant rows: sent before the first barrier, then only barriers.
    async fn run_values(&mut self, source: &mut ValuesSource) -> Result<Exit> {
        source.restore(&self.ctx)?;
        if let Some(chunk) = source.backfill()? {
            self.push(0, 0, chunk).await?;
        }
        loop {
            match self.commands.recv().await {
                Some(TaskCommand::TriggerCheckpoint(barrier)) => {
                    let mut writes = Vec::new();
                    source.snapshot(&mut writes);
                    self.checkpoint(
                        barrier,
                        writes,
                        Vec::new(),
                        Default::default(),
                        SourceReport::default(),
                    )
                    .await?;
                }
                Some(TaskCommand::NotifyCheckpointComplete(id)) => self.commit(id).await?,
                Some(TaskCommand::Cancel) | None => return Ok(Exit::Cancelled),
            }
        }
    }

    /// A connector source emits a barrier as soon as it is triggered,
    /// between two batches (Flink's sources do the same): the positions it
    /// snapshots are those of the rows before it.
    async fn run_connector(&mut self, source: &mut ConnectorSource) -> Result<Exit> {
        source.open(&self.ctx).await?;
        loop {
            self.source_watermark(source.take_watermark()).await?;
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(TaskCommand::TriggerCheckpoint(barrier)) => {
                        let mut writes = Vec::new();
                        source.snapshot(barrier.checkpoint_id, &mut writes).await?;
                        let behind = !source.caught_up(barrier.checkpoint_id);
                        source.barrier_emitted(barrier.checkpoint_id);
                        let source = SourceReport { behind, decode_errors: Some(source.decode_errors()) };
                        self.checkpoint(barrier, writes, Vec::new(), Default::default(), source).await?;
                    }
                    Some(TaskCommand::NotifyCheckpointComplete(id)) => {
                        source.committed(id).await?;
                        self.commit(id).await?
                    }
                    Some(TaskCommand::Cancel) | None => return Ok(Exit::Cancelled),
                },
                fetched = source.next() => {
                    if let Some(chunk) = fetched? {
                        self.push(0, 0, chunk).await?;
                    }
                }
            }
        }
    }

    async fn run_gate(&mut self, gate: &mut InputGate) -> Result<Exit> {
        loop {
            let timer = self.chain.iter().filter_map(|op| op.next_timer()).min();
            let sleep = timer_sleep(timer);
            tokio::select! {
                biased;
                cmd = self.commands.recv() => match cmd {
                    Some(TaskCommand::NotifyCheckpointComplete(id)) => self.commit(id).await?,
                    Some(TaskCommand::TriggerCheckpoint(b)) => {
                        return Err(ExecError::Protocol(format!(
                            "checkpoint {} triggered on a non-source task", b.checkpoint_id
                        )));
                    }
                    Some(TaskCommand::Cancel) | None => return Ok(Exit::Cancelled),
                },
                _ = sleep, if timer.is_some() => self.timers().await?,
                event = gate.next() => match event? {
                    GateEvent::Chunk(input, chunk) => self.push(0, input, chunk).await?,
                    GateEvent::Barrier(barrier, alignment) => self.checkpoint(barrier, Vec::new(), Vec::new(), alignment, SourceReport::default()).await?,
                    GateEvent::Watermark(wm) => self.watermark(wm).await?,
                    GateEvent::End => return Ok(Exit::InputsClosed),
                },
            }
        }
    }

    /// Sends a source's watermark down the chain, if it advanced.
    async fn source_watermark(&mut self, advanced: Option<Watermark>) -> Result<()> {
        match advanced {
            Some(wm) => self.watermark(wm).await,
            None => Ok(()),
        }
    }

    /// Event time advanced: each operator of the chain may emit what it
    /// closes (its output goes on down the chain) and passes the watermark
    /// on, or holds it back.
    async fn watermark(&mut self, mut wm: Watermark) -> Result<()> {
        for i in 0..self.chain.len() {
            let mut out = Vec::new();
            let next = self.chain[i].handle_watermark(wm, &mut out)?;
            for chunk in out {
                self.push(i + 1, 0, chunk).await?;
            }
            match next {
                Some(next) => wm = next,
                None => return Ok(()),
            }
        }
        for o in &mut self.outputs {
            o.broadcast(Message::Watermark(wm)).await?;
        }
        Ok(())
    }

    /// Processing time passed an operator's timer: each operator whose
    /// timer is due runs it, its output going on down the chain.
    async fn timers(&mut self) -> Result<()> {
        let now = crate::operator::processing_time_us();
        for i in 0..self.chain.len() {
            if self.chain[i].next_timer().is_some_and(|t| t <= now) {
                let mut out = Vec::new();
                self.chain[i].on_timer(now, &mut out)?;
                for chunk in out {
                    self.push(i + 1, 0, chunk).await?;
                }
            }
        }
        Ok(())
    }

    /// Sends `chunk` through the chain from operator `from` on, then out.
    async fn push(&mut self, from: usize, input: usize, chunk: Chunk) -> Result<()> {
        let mut pending = vec![chunk];
        for (i, op) in self.chain.iter_mut().enumerate().skip(from) {
            let port = if i == from { input } else { 0 };
            let mut out = Vec::new();
            for c in pending {
                op.process_batch(port, c, &mut out)?;
            }
            pending = out;
            if pending.is_empty() {
                return Ok(());
            }
        }
        if let Some(sink) = &mut self.sink {
            for c in &pending {
                sink.write(c).await?;
            }
            return Ok(());
        }
        for c in pending {
            if c.is_empty() {
                continue;
            }
            let n = self.outputs.len();
            for (i, o) in self.outputs.iter_mut().enumerate() {
                if i + 1 == n {
                    o.send_chunk(c).await?;
                    break;
                }
                o.send_chunk(c.clone()).await?;
            }
        }
        Ok(())
    }

    /// The barrier is aligned: snapshot the chain, forward, acknowledge.
    async fn checkpoint(
        &mut self,
        barrier: Barrier,
        mut writes: Vec<StateWrite>,
        positions: Vec<SourcePosition>,
        alignment: std::time::Duration,
        source: SourceReport,
    ) -> Result<()> {
        for i in 0..self.chain.len() {
            let mut out = Vec::new();
            self.chain[i].before_checkpoint(&barrier, &mut out)?;
            for chunk in out {
                self.push(i + 1, 0, chunk).await?;
            }
        }
        for op in &mut self.chain {
            op.handle_checkpoint(&barrier, &mut writes)?;
        }
        if let Some(sink) = &mut self.sink {
            sink.checkpoint(barrier.checkpoint_id, &mut writes).await?;
        }
        for o in &mut self.outputs {
            o.broadcast(Message::Barrier(barrier)).await?;
        }
        let mut state_stats = Vec::new();
        for op in &self.chain {
            op.state_stats(&mut state_stats);
        }
        tracing::trace!(task = %self.id, checkpoint = barrier.checkpoint_id, writes = writes.len(), "acknowledge");
        self.reporter.acknowledge_checkpoint(
            &self.id,
            CheckpointAck {
                checkpoint_id: barrier.checkpoint_id,
                writes,
                positions,
                alignment,
                state: None,
                declined: None,
                behind: source.behind,
                decode_errors: source.decode_errors,
                state_stats,
            },
        );
        Ok(())
    }

    async fn commit(&mut self, checkpoint_id: u64) -> Result<()> {
        for op in &mut self.chain {
            op.handle_commit(checkpoint_id)?;
        }
        if let Some(sink) = &mut self.sink {
            sink.commit(checkpoint_id).await?;
        }
        Ok(())
    }
}

/// Sleeps until processing time `at_us` (never, without one).
async fn timer_sleep(at_us: Option<i64>) {
    match at_us {
        Some(at) => {
            let wait = (at - crate::operator::processing_time_us()).max(0) as u64;
            tokio::time::sleep(std::time::Duration::from_micros(wait)).await
        }
        None => std::future::pending().await,
    }
}

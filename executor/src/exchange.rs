//! Exchanges between subtasks: Flink's ResultPartition (here
//! [`OutputWriter`]) and InputGate ([`InputGate`]).
//!
//! Inside one TaskManager a channel is a bounded in-memory queue: a full queue
//! makes the sender wait, so a slow consumer slows its producers and memory
//! stays bounded (the same effect credit-based flow control has across the
//! network). The [`LocalShuffle`] pairs the two ends of each channel however
//! the subtasks are deployed.
//!
//! The InputGate is also where barriers are **aligned** (Flink's
//! BarrierBuffer, exactly-once): once a channel delivers barrier *n* it is not
//! read again until every open channel has delivered *n*; then the gate
//! yields the barrier once. Watermarks are combined as the minimum over
//! channels.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use datafusion::arrow::array::UInt32Array;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::Partitioner;
use storage::chunk::Chunk;
use storage::keys::subtask_for_key_group;
use tokio::sync::mpsc;

use crate::message::{Barrier, Message, Watermark};
use crate::{ExecError, Result, expr};

/// Messages a channel buffers before its sender waits.
pub const CHANNEL_CAPACITY: usize = 16;

/// Identifies one channel of one deployment of a job.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChannelId {
    pub job: u64,
    /// Deployment attempt of the job; a restarted job gets new channels.
    pub attempt: u64,
    /// Index of the JobGraph edge.
    pub edge: usize,
    pub from: usize,
    pub to: usize,
}

type Ends = (
    Option<mpsc::Sender<Message>>,
    Option<mpsc::Receiver<Message>>,
);

/// Pairs the ends of in-memory channels, whichever side asks first.
#[derive(Debug, Default)]
pub struct LocalShuffle {
    channels: Mutex<HashMap<ChannelId, Ends>>,
}

impl LocalShuffle {
    fn take<T>(&self, id: ChannelId, pick: impl FnOnce(&mut Ends) -> Option<T>) -> Result<T> {
        let mut map = self
            .channels
            .lock()
            .map_err(|_| ExecError::Protocol("shuffle lock poisoned".into()))?;
        let ends = map.entry(id.clone()).or_insert_with(|| {
            let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
            (Some(tx), Some(rx))
        });
        let end =
            pick(ends).ok_or_else(|| ExecError::Protocol(format!("channel {id:?} taken twice")))?;
        if ends.0.is_none() && ends.1.is_none() {
            map.remove(&id);
        }
        Ok(end)
    }

    pub fn sender(&self, id: ChannelId) -> Result<mpsc::Sender<Message>> {
        self.take(id, |e| e.0.take())
    }

    pub fn receiver(&self, id: ChannelId) -> Result<mpsc::Receiver<Message>> {
        self.take(id, |e| e.1.take())
    }

    /// Forgets half-connected channels of a job attempt (after a failed deploy).
    pub fn release(&self, job: u64, attempt: u64) {
        if let Ok(mut map) = self.channels.lock() {
            map.retain(|id, _| !(id.job == job && id.attempt == attempt));
        }
    }
}

enum Route {
    Forward,
    Hash(Vec<Arc<dyn PhysicalExpr>>),
    Global,
    Rebalance,
}

/// Writes a subtask's output to the channels of one outgoing edge.
pub struct OutputWriter {
    route: Route,
    channels: Vec<mpsc::Sender<Message>>,
    next: usize,
}

impl std::fmt::Debug for OutputWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutputWriter")
            .field("channels", &self.channels.len())
            .finish()
    }
}

impl OutputWriter {
    /// `channels[i]` leads to downstream subtask `i` (one channel for forward).
    pub fn new(partitioner: &Partitioner, channels: Vec<mpsc::Sender<Message>>) -> Result<Self> {
        let route = match partitioner {
            Partitioner::Forward => Route::Forward,
            Partitioner::Hash { exprs, schema } => Route::Hash(expr::compile(exprs, schema)?),
            Partitioner::Global => Route::Global,
            Partitioner::Rebalance => Route::Rebalance,
        };
        Ok(Self {
            route,
            channels,
            next: 0,
        })
    }

    async fn send(&self, channel: usize, msg: Message) -> Result<()> {
        self.channels[channel]
            .send(msg)
            .await
            .map_err(|_| ExecError::ChannelClosed)
    }

    pub async fn send_chunk(&mut self, chunk: Chunk) -> Result<()> {
        match &self.route {
            Route::Forward | Route::Global => self.send(0, Message::Chunk(chunk)).await,
            Route::Rebalance => {
                let i = self.next % self.channels.len();
                self.next += 1;
                self.send(i, Message::Chunk(chunk)).await
            }
            Route::Hash(exprs) => {
                let p = self.channels.len();
                if p == 1 {
                    return self.send(0, Message::Chunk(chunk)).await;
                }
                let key_groups = |c: &Chunk| {
                    expr::evaluate(exprs, c.data())
                        .and_then(|keys| expr::key_groups(&keys, c.num_rows()))
                };
                let groups = match key_groups(&chunk) {
                    Ok(groups) => groups,
                    // A row whose key fails (a division by zero) goes to
                    // the first subtask, always the same one, whose operator
                    // fails the same way and keeps the error as data
                    // (`crate::errors`) or fails the job.
                    Err(_) => (0..chunk.num_rows())
                        .map(|row| key_groups(&chunk.slice(row, 1)).map_or(0, |g| g[0]))
                        .collect(),
                };
                let mut per_target: Vec<Vec<u32>> = vec![Vec::new(); p];
                for (row, kg) in groups.into_iter().enumerate() {
                    per_target[subtask_for_key_group(kg, p)].push(row as u32);
                }
                for (target, rows) in per_target.into_iter().enumerate() {
                    if !rows.is_empty() {
                        let part = chunk.take(&UInt32Array::from(rows))?;
                        self.send(target, Message::Chunk(part)).await?;
                    }
                }
                Ok(())
            }
        }
    }

    /// Sends a control message to every channel.
    pub async fn broadcast(&mut self, msg: Message) -> Result<()> {
        for i in 0..self.channels.len() {
            self.send(i, msg.clone()).await?;
        }
        Ok(())
    }
}

struct InputChannel {
    input: usize,
    rx: mpsc::Receiver<Message>,
    blocked: bool,
    closed: bool,
    watermark: Option<i64>,
    /// The checkpoint id of the last barrier it delivered (0: none).
    last_barrier: u64,
}

/// What an InputGate yields.
#[derive(Debug)]
pub enum GateEvent {
    /// Data from input `0` or `1`.
    Chunk(usize, Chunk),
    /// A barrier that every open channel has delivered, and how long the
    /// first channel to deliver it was blocked (the alignment time).
    Barrier(Barrier, std::time::Duration),
    /// The minimum watermark over all channels advanced.
    Watermark(Watermark),
    /// Every channel is closed.
    End,
}

/// All input channels of a subtask, with barrier alignment (exactly-once)
/// or barrier tracking (at-least-once).
///
/// Alignment (Flink's BarrierBuffer) blocks a channel once it delivered
/// barrier *n* until every open channel has, so no record after *n* is
/// processed before *n*'s snapshot. Tracking (Flink's BarrierTracker)
/// blocks nothing: channels may run ahead, so barriers of several
/// checkpoints can be open at once; a checkpoint completes when every
/// open channel has delivered its barrier (or a later one), and then the
/// older open ones complete with it, oldest first. A channel that closes
/// no longer counts, whether or not it delivered the barrier.
pub struct InputGate {
    channels: Vec<InputChannel>,
    /// Exactly-once holds a channel back after its barrier; at-least-once
    /// only counts barriers.
    align: bool,
    next: usize,
    /// Exactly-once: the barrier being aligned.
    aligning: Option<Barrier>,
    /// When the barrier being aligned first arrived.
    aligning_since: Option<std::time::Instant>,
    /// At-least-once: the barriers some channel delivered and not every
    /// channel yet, by checkpoint id, with when each first arrived.
    tracking: std::collections::BTreeMap<u64, (Barrier, std::time::Instant)>,
    /// At-least-once: the newest checkpoint completed.
    tracked: u64,
    /// Events decided and not yet returned (barriers completing together).
    ready: std::collections::VecDeque<GateEvent>,
    watermark: Option<i64>,
}

impl std::fmt::Debug for InputGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputGate")
            .field("channels", &self.channels.len())
            .finish()
    }
}

impl InputGate {
    /// `channels`: (input index, receiver).
    pub fn new(channels: Vec<(usize, mpsc::Receiver<Message>)>) -> Self {
        Self {
            align: true,
            channels: channels
                .into_iter()
                .map(|(input, rx)| InputChannel {
                    input,
                    rx,
                    blocked: false,
                    closed: false,
                    watermark: None,
                    last_barrier: 0,
                })
                .collect(),
            next: 0,
            aligning: None,
            aligning_since: None,
            tracking: Default::default(),
            tracked: 0,
            ready: Default::default(),
            watermark: None,
        }
    }

    /// Tracks barriers instead of aligning them (at-least-once).
    pub fn with_mode(mut self, mode: planner::spec::CheckpointMode) -> Self {
        self.align = mode == planner::spec::CheckpointMode::ExactlyOnce;
        self
    }

    /// Whether every open channel has delivered checkpoint `id`'s barrier.
    fn all_delivered(&self, id: u64) -> bool {
        self.channels
            .iter()
            .filter(|c| !c.closed)
            .all(|c| c.last_barrier >= id)
    }

    /// Completes what can be completed: the aligned barrier, or the
    /// tracked ones every open channel has passed.
    fn try_complete(&mut self) -> Option<GateEvent> {
        if self.align {
            let barrier = self.aligning?;
            if !self.all_delivered(barrier.checkpoint_id) {
                return None;
            }
            self.aligning = None;
            for c in &mut self.channels {
                c.blocked = false;
            }
            let alignment = self
                .aligning_since
                .take()
                .map(|t| t.elapsed())
                .unwrap_or_default();
            return Some(GateEvent::Barrier(barrier, alignment));
        }
        let newest = self
            .tracking
            .keys()
            .rev()
            .copied()
            .find(|id| self.all_delivered(*id))?;
        let rest = self.tracking.split_off(&(newest + 1));
        for (_, (barrier, since)) in std::mem::replace(&mut self.tracking, rest) {
            self.ready
                .push_back(GateEvent::Barrier(barrier, since.elapsed()));
        }
        self.tracked = newest;
        self.ready.pop_front()
    }

    fn on_message(&mut self, i: usize, msg: Message) -> Result<Option<GateEvent>> {
        match msg {
            Message::Chunk(chunk) => Ok(Some(GateEvent::Chunk(self.channels[i].input, chunk))),
            Message::Barrier(b) => {
                let id = b.checkpoint_id;
                if self.align {
                    match self.aligning {
                        None => {
                            self.aligning = Some(b);
                            self.aligning_since = Some(std::time::Instant::now());
                        }
                        Some(a) if a.checkpoint_id != id => {
                            return Err(ExecError::Protocol(format!(
                                "barrier {id} arrived while aligning {}",
                                a.checkpoint_id
                            )));
                        }
                        Some(_) => {}
                    }
                    self.channels[i].blocked = true;
                } else if id > self.tracked {
                    self.tracking
                        .entry(id)
                        .or_insert_with(|| (b, std::time::Instant::now()));
                }
                self.channels[i].last_barrier = self.channels[i].last_barrier.max(id);
                Ok(self.try_complete())
            }
            Message::Broken(why) => Err(ExecError::ChannelBroken(why)),
            Message::Watermark(w) => {
                self.channels[i].watermark = Some(w.timestamp);
                let min = self
                    .channels
                    .iter()
                    .filter(|c| !c.closed)
                    .map(|c| c.watermark)
                    .min()
                    .flatten();
                match min {
                    Some(m) if self.watermark.is_none_or(|cur| m > cur) => {
                        self.watermark = Some(m);
                        Ok(Some(GateEvent::Watermark(Watermark {
                            column: w.column,
                            timestamp: m,
                        })))
                    }
                    _ => Ok(None),
                }
            }
        }
    }

    /// The next event. Cancel-safe: no message is lost if the future is dropped.
    pub async fn next(&mut self) -> Result<GateEvent> {
        if let Some(ev) = self.ready.pop_front() {
            return Ok(ev);
        }
        std::future::poll_fn(|cx| {
            let n = self.channels.len();
            loop {
                let mut progressed = false;
                let mut any_open = false;
                for k in 0..n {
                    let i = (self.next + k) % n;
                    let ch = &mut self.channels[i];
                    if ch.closed {
                        continue;
                    }
                    any_open = true;
                    if ch.blocked {
                        continue;
                    }
                    match ch.rx.poll_recv(cx) {
                        Poll::Ready(Some(msg)) => {
                            self.next = (i + 1) % n;
                            progressed = true;
                            match self.on_message(i, msg) {
                                Ok(Some(ev)) => return Poll::Ready(Ok(ev)),
                                Ok(None) => break,
                                Err(e) => return Poll::Ready(Err(e)),
                            }
                        }
                        Poll::Ready(None) => {
                            ch.closed = true;
                            progressed = true;
                            if let Some(ev) = self.try_complete() {
                                return Poll::Ready(Ok(ev));
                            }
                            break;
                        }
                        Poll::Pending => {}
                    }
                }
                if !any_open {
                    return Poll::Ready(Ok(GateEvent::End));
                }
                if !progressed {
                    return Poll::Pending;
                }
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, ints};
    use storage::chunk::Op;

    fn data(v: i64) -> Message {
        Message::Chunk(chunk(&[Op::Insert], vec![ints(&[Some(v)])]).0)
    }

    #[tokio::test]
    async fn barrier_blocks_a_channel_until_all_have_it() {
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (1, rx1)]);
        tx0.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        tx0.send(data(2)).await.unwrap(); // after the barrier: must wait
        tx1.send(data(1)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Chunk(1, _) => {}
            other => panic!("expected pre-barrier data of input 1, got {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier(b, alignment) => {
                assert_eq!(b.checkpoint_id, 1);
                assert!(alignment > std::time::Duration::ZERO);
            }
            other => panic!("expected barrier, got {other:?}"),
        }
        match gate.next().await.unwrap() {
            GateEvent::Chunk(0, _) => {}
            other => panic!("expected post-barrier data of input 0, got {other:?}"),
        }
        drop(tx0);
        drop(tx1);
        assert!(matches!(gate.next().await.unwrap(), GateEvent::End));
    }

    #[tokio::test]
    async fn at_least_once_tracks_barriers_without_holding_channels_back() {
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (1, rx1)])
            .with_mode(planner::spec::CheckpointMode::AtLeastOnce);
        tx0.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        tx0.send(data(2)).await.unwrap(); // after the barrier: flows at once
        match gate.next().await.unwrap() {
            GateEvent::Chunk(0, _) => {}
            other => panic!("expected post-barrier data of input 0, got {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, 1),
            other => panic!("expected barrier, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn at_least_once_closed_channel_counts_no_more() {
        // A channel that delivered barrier 1 and then closed: the other
        // channel's barrier is still needed.
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (1, rx1)])
            .with_mode(planner::spec::CheckpointMode::AtLeastOnce);
        tx0.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        drop(tx0);
        tx1.send(data(1)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Chunk(1, _) => {}
            other => panic!("the barrier completed early: {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, 1),
            other => panic!("expected barrier 1, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn at_least_once_takes_overlapping_barriers() {
        // Channel 0 runs two checkpoints ahead of channel 1.
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (1, rx1)])
            .with_mode(planner::spec::CheckpointMode::AtLeastOnce);
        for id in [1, 2] {
            tx0.send(Message::Barrier(Barrier::checkpoint(id)))
                .await
                .unwrap();
        }
        tx0.send(data(3)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Chunk(0, _) => {}
            other => panic!("expected data, got {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, 1),
            other => panic!("expected barrier 1, got {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(2)))
            .await
            .unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Barrier(b, _) => assert_eq!(b.checkpoint_id, 2),
            other => panic!("expected barrier 2, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn exactly_once_closed_channel_after_its_barrier() {
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (1, rx1)]);
        tx0.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        drop(tx0);
        tx1.send(data(1)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Chunk(1, _) => {}
            other => panic!("the barrier completed early: {other:?}"),
        }
        tx1.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        assert!(matches!(gate.next().await.unwrap(), GateEvent::Barrier(..)));
    }

    #[tokio::test]
    async fn mismatched_barriers_are_a_protocol_error() {
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (0, rx1)]);
        tx0.send(Message::Barrier(Barrier::checkpoint(1)))
            .await
            .unwrap();
        tx1.send(Message::Barrier(Barrier::checkpoint(2)))
            .await
            .unwrap();
        assert!(gate.next().await.is_err());
    }

    #[tokio::test]
    async fn watermark_is_the_minimum_over_channels() {
        let (tx0, rx0) = mpsc::channel(8);
        let (tx1, rx1) = mpsc::channel(8);
        let mut gate = InputGate::new(vec![(0, rx0), (0, rx1)]);
        let wm = |t| {
            Message::Watermark(Watermark {
                column: 0,
                timestamp: t,
            })
        };
        tx0.send(wm(10)).await.unwrap();
        tx1.send(wm(5)).await.unwrap();
        tx1.send(wm(20)).await.unwrap();
        match gate.next().await.unwrap() {
            GateEvent::Watermark(w) => assert_eq!(w.timestamp, 5),
            other => panic!("{other:?}"),
        }
        match gate.next().await.unwrap() {
            GateEvent::Watermark(w) => assert_eq!(w.timestamp, 10),
            other => panic!("{other:?}"),
        }
    }
}

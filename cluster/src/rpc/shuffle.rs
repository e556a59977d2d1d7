//! Network channels between TaskManagers, with Flink's credit-based flow
//! control.
//!
//! The consumer opens one `OpenChannel` stream per remote input channel at
//! the producer's TaskManager and grants credits: first as many as its
//! input buffer holds (`CHANNEL_CAPACITY`), then one for every frame that
//! has moved into that buffer. The producer sends a frame only against a
//! credit, so at most one buffer's worth is on the wire and one in the
//! buffer; when the consumer's task falls behind, its buffer stays full, no
//! credit comes back, the producer's in-memory result partition fills and
//! the producing task waits — backpressure, with memory bounded on both
//! sides.
//!
//! The producing task writes into the same [`LocalShuffle`] as for a local
//! consumer; the stream handler takes the other end of that queue.

use std::sync::Arc;

use executor::exchange::{CHANNEL_CAPACITY, ChannelId, LocalShuffle};
use executor::message::Message;
use executor::task::RemoteChannels;
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use super::pb::shuffle_client::ShuffleClient;
use super::{CONNECT_TIMEOUT, MAX_MESSAGE, frame, message, pb, uri};

fn channel_to_pb(c: &ChannelId) -> pb::ChannelId {
    pb::ChannelId {
        job: c.job,
        attempt: c.attempt,
        edge: c.edge as u32,
        from: c.from as u32,
        to: c.to as u32,
    }
}

fn channel_from_pb(c: pb::ChannelId) -> ChannelId {
    ChannelId {
        job: c.job,
        attempt: c.attempt,
        edge: c.edge as usize,
        from: c.from as usize,
        to: c.to as usize,
    }
}

/// The Shuffle service of a TaskManager: the producing ends of its
/// channels.
pub(crate) struct ShuffleService(pub(crate) Arc<LocalShuffle>);

#[tonic::async_trait]
impl pb::shuffle_server::Shuffle for ShuffleService {
    type OpenChannelStream = ReceiverStream<Result<pb::Frame, tonic::Status>>;

    async fn open_channel(
        &self,
        request: tonic::Request<tonic::Streaming<pb::Credit>>,
    ) -> Result<tonic::Response<Self::OpenChannelStream>, tonic::Status> {
        let stream = serve_channel(self.0.clone(), request.into_inner()).await?;
        Ok(tonic::Response::new(stream))
    }
}

/// Producer side: streams the channel's messages to the consumer, one per
/// credit.
async fn serve_channel(
    shuffle: Arc<LocalShuffle>,
    mut credits: tonic::Streaming<pb::Credit>,
) -> Result<ReceiverStream<Result<pb::Frame, tonic::Status>>, tonic::Status> {
    let first = credits
        .message()
        .await?
        .ok_or_else(|| tonic::Status::invalid_argument("no channel named"))?;
    let id = channel_from_pb(first.channel.ok_or_else(|| super::missing("channel"))?);
    let mut local = shuffle
        .receiver(id.clone())
        .map_err(|e| tonic::Status::failed_precondition(e.to_string()))?;
    let available = Arc::new(Semaphore::new(first.credits as usize));
    let granted = available.clone();
    tokio::spawn(async move {
        while let Ok(Some(c)) = credits.message().await {
            granted.add_permits(c.credits as usize);
        }
        // The consumer is gone: stop sending.
        granted.close();
    });
    let (tx, rx) = mpsc::channel(1);
    tokio::spawn(async move {
        loop {
            let Ok(permit) = available.acquire().await else {
                return;
            };
            permit.forget();
            let Some(msg) = local.recv().await else {
                // The producing task ended; the stream ends with it.
                return;
            };
            match frame(msg) {
                Ok(Some(f)) => {
                    if tx.send(Ok(f)).await.is_err() {
                        return;
                    }
                }
                Ok(None) => available.add_permits(1),
                Err(e) => {
                    let _ = tx.send(Err(tonic::Status::internal(e.to_string()))).await;
                    return;
                }
            }
        }
        // Dropping `local` here makes the producing task's next send fail:
        // a consumer that went away cancels its producers.
    });
    tracing::debug!(channel = ?id, "remote consumer connected");
    Ok(ReceiverStream::new(rx))
}

/// Consumer side: opens remote channels over gRPC.
#[derive(Debug, Default)]
pub(crate) struct NetworkChannels;

impl RemoteChannels for NetworkChannels {
    fn connect(
        &self,
        address: &str,
        channel: ChannelId,
    ) -> executor::Result<mpsc::Receiver<Message>> {
        let (tx, rx) = mpsc::channel(CHANNEL_CAPACITY);
        let address = uri(address);
        tokio::spawn(async move {
            let why = match consume(&address, &channel, &tx).await {
                Ok(()) => return,
                // The consuming task is gone too: a cancellation, not a failure.
                Err(_) if tx.is_closed() => return,
                Err(why) => why,
            };
            tracing::warn!(channel = ?channel, address = %address, error = %why, "input channel broken");
            let _ = tx.send(Message::Broken(why)).await;
        });
        Ok(rx)
    }
}

/// Reads frames into `tx`, returning a credit for each one it delivers.
/// `Ok` when the consuming task went away; an error when the producer did.
async fn consume(
    address: &str,
    channel: &ChannelId,
    tx: &mpsc::Sender<Message>,
) -> Result<(), String> {
    let endpoint = tonic::transport::Endpoint::from_shared(address.to_string())
        .map_err(|e| e.to_string())?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true);
    let conn = endpoint.connect().await.map_err(|e| e.to_string())?;
    let mut client = ShuffleClient::new(conn)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE);
    let (credit_tx, credit_rx) = mpsc::channel(CHANNEL_CAPACITY + 1);
    credit_tx
        .send(pb::Credit {
            channel: Some(channel_to_pb(channel)),
            credits: CHANNEL_CAPACITY as u32,
        })
        .await
        .map_err(|e| e.to_string())?;
    let mut frames = client
        .open_channel(ReceiverStream::new(credit_rx))
        .await
        .map_err(|e| e.to_string())?
        .into_inner();
    loop {
        let frame = frames
            .message()
            .await
            .map_err(|e| e.to_string())?
            .ok_or_else(|| "the producing task manager closed the channel".to_string())?;
        let msg = message(frame).map_err(|e| e.to_string())?;
        if tx.send(msg).await.is_err() {
            return Ok(());
        }
        let _ = credit_tx
            .send(pb::Credit {
                channel: None,
                credits: 1,
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use executor::message::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;
    use storage::chunk::Chunk;

    fn chunk(v: i64) -> Message {
        let schema = Arc::new(Schema::new(vec![Field::new("v", DataType::Int64, true)]));
        let batch =
            RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![v]))]).unwrap();
        Message::Chunk(Chunk::inserts(batch))
    }

    fn value(m: &Message) -> i64 {
        match m {
            Message::Chunk(c) => c
                .data()
                .column(0)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap()
                .value(0),
            other => panic!("expected a chunk, got {other:?}"),
        }
    }

    /// A consumer that does not read holds its producer back: the producer
    /// gets only as far as the buffers on both sides and the credits allow.
    /// Then everything arrives, in order, the barrier in its place.
    #[tokio::test]
    async fn a_slow_consumer_holds_its_producer_back() {
        let shuffle = Arc::new(LocalShuffle::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(pb::shuffle_server::ShuffleServer::new(ShuffleService(
                    shuffle.clone(),
                )))
                .serve_with_incoming(incoming),
        );
        let id = ChannelId {
            job: 1,
            attempt: 0,
            edge: 0,
            from: 0,
            to: 0,
        };
        let producer = shuffle.sender(id.clone()).unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let counter = sent.clone();
        let total = 500usize;
        tokio::spawn(async move {
            for v in 0..total {
                if v == 250 {
                    producer
                        .send(Message::Barrier(Barrier::checkpoint(7)))
                        .await
                        .unwrap();
                }
                producer.send(chunk(v as i64)).await.unwrap();
                counter.fetch_add(1, Ordering::SeqCst);
            }
        });
        let mut rx = NetworkChannels.connect(&addr.to_string(), id).unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let held = sent.load(Ordering::SeqCst);
        // Producer queue + frames sent against credits + consumer buffer,
        // and the message each forwarding task holds in hand.
        assert!(
            held <= 3 * CHANNEL_CAPACITY + 4,
            "producer ran ahead to {held} messages"
        );
        assert!(held >= CHANNEL_CAPACITY, "nothing flowed: {held}");
        let mut next = 0;
        let mut barriers = 0;
        while next < total as i64 {
            let m = rx.recv().await.expect("channel open");
            if let Message::Barrier(b) = m {
                assert_eq!(b.checkpoint_id, 7);
                assert_eq!(next, 250, "barrier in its place");
                barriers += 1;
                continue;
            }
            assert_eq!(value(&m), next);
            next += 1;
        }
        assert_eq!(barriers, 1);
    }
}

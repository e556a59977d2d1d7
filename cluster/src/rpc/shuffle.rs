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

/// Producer side: streams the channel's messages to the consumer, one per
/// credit.
pub(crate) async fn serve_channel(
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

//! Weir's side of a client socket, around pgwire's message decoder.
//!
//! pgwire decodes messages and dispatches them to the handlers in
//! [`crate::wire::pg`]; this module owns what a server must decide before and
//! between messages, as Postgres's postmaster and `pq_getmessage` do:
//!
//! - which transport: TLS (rustls) when a certificate is configured;
//! - how long a client may take over the handshake (TLS, startup packet,
//!   authentication) before it is dropped (`authentication_timeout`);
//! - how many clients may be connected: one more is told `53300`;
//! - how long a message may be: the startup packet at most 10,000 bytes,
//!   any later message at most the configured maximum, checked when its
//!   length word arrives and before its body is read into memory;
//! - that a malformed or over-long message is answered `FATAL 08P01` and
//!   closes that connection only;
//! - that SQL text which is not UTF-8 is refused with `22021`, where pgwire
//!   would replace the bad bytes and run a statement the client never sent.
//!
//! The last two need to see the raw bytes, which pgwire's decoder does not
//! give back: [`Framer`] reads the byte stream beside it, frame by frame,
//! and leaves a [`Verdict`] per frame for the loop to read with the
//! decoded message.

pub mod auth;
pub mod bench;
pub mod pg;

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use futures::{FutureExt, SinkExt, StreamExt};
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{negotiate_tls, process_error, process_message};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::{Framed, FramedParts};

mod framer;

pub use framer::{Frame, FrameError, Framer, MAX_STARTUP_PACKET, Verdict};

/// How a server treats its client sockets.
#[derive(Clone)]
pub struct WireConfig {
    /// Offered to clients that ask for TLS; `None` refuses them.
    pub tls: Option<pgwire::tokio::TlsAcceptor>,
    /// The longest message after the startup packet, length word included.
    pub max_message_bytes: usize,
    /// How long the TLS handshake, startup and authentication may take.
    pub handshake_timeout: Duration,
    /// Clients connected at once; one more is refused with `53300`.
    pub max_connections: usize,
    /// How clients prove who they are.
    pub auth: crate::wire::auth::AuthMethod,
}

impl std::fmt::Debug for WireConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WireConfig")
            .field("tls", &self.tls.is_some())
            .field("max_message_bytes", &self.max_message_bytes)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("max_connections", &self.max_connections)
            .field("auth", &self.auth)
            .finish()
    }
}

impl Default for WireConfig {
    fn default() -> Self {
        Self {
            tls: None,
            max_message_bytes: 256 << 20,
            handshake_timeout: Duration::from_secs(60),
            max_connections: 100,
            auth: crate::wire::auth::AuthMethod::Trust,
        }
    }
}

/// The TLS acceptor for a PEM certificate chain and private key, with
/// rustls's safe defaults (TLS 1.2 and 1.3) and the `postgresql` ALPN
/// protocol that direct TLS connections (libpq 17's `sslnegotiation=direct`)
/// must name.
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> Result<pgwire::tokio::TlsAcceptor, String> {
    use pgwire::tokio::tokio_rustls::rustls;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("cannot read the certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        return Err(format!("no certificate in {}", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("cannot read the private key {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_no_client_auth()
    .with_single_cert(certs, key)
    .map_err(|e| format!("the certificate and key do not make a TLS identity: {e}"))?;
    config.alpn_protocols = vec![b"postgresql".to_vec()];
    Ok(pgwire::tokio::TlsAcceptor::from(Arc::new(config)))
}

/// A client's stream with a [`Framer`] reading beside pgwire's decoder.
/// `prefix` holds what pgwire had read ahead during SSL negotiation.
struct Guarded<S> {
    inner: S,
    prefix: BytesMut,
    framer: Arc<Mutex<Framer>>,
}

impl<S> Guarded<S> {
    fn follow(&self, bytes: &[u8]) -> std::io::Result<()> {
        self.framer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .feed(bytes)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Guarded<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if !this.prefix.is_empty() {
            let n = this.prefix.len().min(buf.remaining());
            let head = this.prefix.split_to(n);
            this.follow(&head)?;
            buf.put_slice(&head);
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                this.follow(&buf.filled()[before..])?;
                Poll::Ready(Ok(()))
            }
            other => other,
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Guarded<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The clients connected now, shared by the server's connections.
#[derive(Debug, Default)]
pub struct ConnectionCount(AtomicUsize);

/// One place in the count, given back when the connection ends.
struct Place(Arc<ConnectionCount>);

impl Drop for Place {
    fn drop(&mut self) {
        self.0.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl ConnectionCount {
    fn enter(self: &Arc<Self>, max: usize) -> Option<Place> {
        let mut now = self.0.load(Ordering::SeqCst);
        loop {
            if now >= max {
                return None;
            }
            match self
                .0
                .compare_exchange(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(Place(self.clone())),
                Err(actual) => now = actual,
            }
        }
    }
}

fn fatal(code: &str, message: String) -> PgWireBackendMessage {
    PgWireBackendMessage::ErrorResponse(
        ErrorInfo::new("FATAL".to_owned(), code.to_owned(), message).into(),
    )
}

/// Serves one client socket with `handlers` until it closes, or until
/// `terminate` is notified after the handshake (`pg_terminate_backend`:
/// FATAL 57P01, as Postgres).
pub async fn serve_socket<H: PgWireServerHandlers>(
    socket: TcpStream,
    handlers: H,
    config: &WireConfig,
    count: &Arc<ConnectionCount>,
    terminate: Arc<tokio::sync::Notify>,
) -> std::io::Result<()> {
    let deadline = tokio::time::sleep(config.handshake_timeout);
    tokio::pin!(deadline);
    let negotiated = tokio::select! {
        _ = &mut deadline => return Ok(()),
        negotiated = negotiate_tls(socket, config.tls.clone()) => negotiated?,
    };
    // A direct TLS connection without a certificate configured.
    let Some(negotiated) = negotiated else {
        return Ok(());
    };
    let parts = negotiated.into_parts();
    let framer = Arc::new(Mutex::new(Framer::new(config.max_message_bytes)));
    let mut rebuilt = FramedParts::new(
        Guarded {
            inner: parts.io,
            prefix: parts.read_buf,
            framer: framer.clone(),
        },
        parts.codec,
    );
    rebuilt.write_buf = parts.write_buf;
    let mut socket = Framed::from_parts(rebuilt);

    let startup_handler = handlers.startup_handler();
    let simple_query_handler = handlers.simple_query_handler();
    let extended_query_handler = handlers.extended_query_handler();
    let copy_handler = handlers.copy_handler();
    let cancel_handler = handlers.cancel_handler();
    let error_handler = handlers.error_handler();
    let mut place = None;
    loop {
        let handshaking = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        // pgwire's decoder can panic on some malformed messages (it reads
        // past the end of a Bind whose counts lie); that is a malformed
        // message like any other.
        let decoded = std::panic::AssertUnwindSafe(socket.next()).catch_unwind();
        let next = if handshaking {
            tokio::select! {
                _ = &mut deadline => {
                    tracing::debug!("client did not finish the handshake in time");
                    let _ = socket.send(fatal("08006", "the handshake took too long".into())).await;
                    break;
                }
                next = decoded => next,
            }
        } else {
            tokio::select! {
                biased;
                () = terminate.notified() => {
                    let _ = socket
                        .send(fatal("57P01", "terminating connection due to administrator command".into()))
                        .await;
                    break;
                }
                next = decoded => next,
            }
        };
        let message = match next {
            Err(_) => {
                let _ = socket
                    .send(fatal("08P01", "invalid frontend message".into()))
                    .await;
                break;
            }
            Ok(None) => break,
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(e))) => {
                let reason = match &e {
                    PgWireError::IoError(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                        io.to_string()
                    }
                    PgWireError::IoError(_) => break,
                    other => format!("invalid frontend message: {other}"),
                };
                tracing::debug!(%reason, "malformed message; closing the connection");
                let _ = socket.send(fatal("08P01", reason)).await;
                break;
            }
        };
        let verdict = framer
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_verdict();
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            break;
        }
        if matches!(message, PgWireFrontendMessage::Startup(_)) {
            match count.enter(config.max_connections) {
                Some(p) => place = Some(p),
                None => {
                    let _ = socket
                        .send(fatal("53300", "sorry, too many clients already".into()))
                        .await;
                    break;
                }
            }
        }
        let extended = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        let result = if verdict == Some(Verdict::InvalidUtf8) && !handshaking {
            Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                "ERROR".to_owned(),
                "22021".to_owned(),
                "invalid byte sequence for encoding \"UTF8\"".to_owned(),
            ))))
        } else {
            let handled = std::panic::AssertUnwindSafe(process_message(
                message,
                &mut socket,
                startup_handler.clone(),
                simple_query_handler.clone(),
                extended_query_handler.clone(),
                copy_handler.clone(),
                cancel_handler.clone(),
            ))
            .catch_unwind()
            .await;
            match handled {
                Ok(result) => result,
                // The connection's state is unknown after a panic: tell
                // the client and close it; the server goes on.
                Err(_) => {
                    tracing::error!("a statement's handler panicked; closing its connection");
                    let _ = socket
                        .send(fatal(
                            "XX000",
                            "internal error; the connection is closed".into(),
                        ))
                        .await;
                    break;
                }
            }
        };
        if let Err(mut e) = result {
            error_handler.on_error(&socket, &mut e);
            process_error(&mut socket, e, extended).await?;
        }
    }
    drop(place);
    Ok(())
}

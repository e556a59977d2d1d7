//! Weir's side of a client socket, around pgwire's message decoder.
//!
//! pgwire decodes messages and dispatches them to the handlers in
//! [`crate::pg`]; this module owns what a server must decide before and
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

use std::collections::VecDeque;
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

/// The longest startup packet, as in Postgres (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET: usize = 10_000;

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
    pub auth: crate::auth::AuthMethod,
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
            auth: crate::auth::AuthMethod::Trust,
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

/// What the framer saw in one whole frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// The SQL text or a name in it is not UTF-8.
    InvalidUtf8,
}

/// Why the byte stream cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("invalid message length {0}")]
    BadLength(u32),
    #[error("invalid length of startup packet: {0} bytes, at most {MAX_STARTUP_PACKET}")]
    StartupTooLong(usize),
    #[error("message of {len} bytes is longer than the server's maximum of {max}")]
    TooLong { len: usize, max: usize },
}

/// Follows the frames of a client's byte stream after SSL negotiation:
/// the startup packet (a length word, no type byte), then typed messages.
#[derive(Debug)]
pub struct Framer {
    max: usize,
    startup: bool,
    header: [u8; 5],
    have: usize,
    /// Body bytes of the current frame still to come; `None` between frames.
    remaining: Option<usize>,
    /// NUL-terminated strings at the head of the body still to check.
    strings: u8,
    /// An unfinished UTF-8 sequence carried over from the last chunk.
    carry: Vec<u8>,
    valid: bool,
    verdicts: VecDeque<Verdict>,
}

impl Framer {
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            max: max_message_bytes,
            startup: true,
            header: [0; 5],
            have: 0,
            remaining: None,
            strings: 0,
            carry: Vec::new(),
            valid: true,
            verdicts: VecDeque::new(),
        }
    }

    /// The verdict of the oldest whole frame not yet taken.
    pub fn take_verdict(&mut self) -> Option<Verdict> {
        self.verdicts.pop_front()
    }

    /// Follows `bytes`, the next bytes of the stream.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), FrameError> {
        while !bytes.is_empty() {
            match self.remaining {
                None => {
                    let need = if self.startup { 4 } else { 5 };
                    let take = (need - self.have).min(bytes.len());
                    self.header[self.have..self.have + take].copy_from_slice(&bytes[..take]);
                    self.have += take;
                    bytes = &bytes[take..];
                    if self.have == need {
                        self.begin_frame(need)?;
                    }
                }
                Some(n) => {
                    let take = n.min(bytes.len());
                    self.check(&bytes[..take]);
                    bytes = &bytes[take..];
                    self.remaining = Some(n - take);
                    if n == take {
                        self.end_frame();
                    }
                }
            }
        }
        Ok(())
    }

    fn begin_frame(&mut self, header_len: usize) -> Result<(), FrameError> {
        let word: [u8; 4] = self.header[header_len - 4..header_len]
            .try_into()
            .unwrap_or_default();
        let len = u32::from_be_bytes(word);
        if len < 4 || len > i32::MAX as u32 {
            return Err(FrameError::BadLength(len));
        }
        let len = len as usize;
        if self.startup && len > MAX_STARTUP_PACKET {
            return Err(FrameError::StartupTooLong(len));
        }
        if !self.startup && len > self.max {
            return Err(FrameError::TooLong { len, max: self.max });
        }
        // The SQL text of a Query; the statement's name and text of a
        // Parse; the portal's and statement's names of a Bind.
        self.strings = match (self.startup, self.header[0]) {
            (false, b'Q') => 1,
            (false, b'P' | b'B') => 2,
            _ => 0,
        };
        self.startup = false;
        self.have = 0;
        self.valid = true;
        self.carry.clear();
        self.remaining = Some(len - 4);
        if len == 4 {
            self.end_frame();
        }
        Ok(())
    }

    fn end_frame(&mut self) {
        if !self.carry.is_empty() {
            self.valid = false;
        }
        self.verdicts.push_back(if self.valid {
            Verdict::Ok
        } else {
            Verdict::InvalidUtf8
        });
        self.remaining = None;
        self.strings = 0;
        self.carry.clear();
    }

    /// Checks the part of `chunk` that belongs to the leading strings.
    fn check(&mut self, mut chunk: &[u8]) {
        while self.strings > 0 && !chunk.is_empty() {
            let (text, rest, ended) = match chunk.iter().position(|&b| b == 0) {
                Some(i) => (&chunk[..i], &chunk[i + 1..], true),
                None => (chunk, &[][..], false),
            };
            chunk = rest;
            let mut pending = std::mem::take(&mut self.carry);
            pending.extend_from_slice(text);
            match std::str::from_utf8(&pending) {
                Ok(_) => {}
                // Cut off at the chunk's end: the rest may come next.
                Err(e) if e.error_len().is_none() && !ended => {
                    self.carry = pending[e.valid_up_to()..].to_vec();
                }
                Err(_) => self.valid = false,
            }
            if ended {
                if !self.carry.is_empty() {
                    self.valid = false;
                    self.carry.clear();
                }
                self.strings -= 1;
            }
        }
    }
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

/// Serves one client socket with `handlers` until it closes.
pub async fn serve_socket<H: PgWireServerHandlers>(
    socket: TcpStream,
    handlers: H,
    config: &WireConfig,
    count: &Arc<ConnectionCount>,
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
            decoded.await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(kind: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![kind];
        m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    fn startup() -> Vec<u8> {
        let body = b"\x00\x03\x00\x00user\x00weir\x00\x00";
        let mut m = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        m.extend_from_slice(body);
        m
    }

    fn verdicts(stream: &[u8], step: usize) -> Result<Vec<Verdict>, FrameError> {
        let mut f = Framer::new(1 << 20);
        for chunk in stream.chunks(step) {
            f.feed(chunk)?;
        }
        Ok(std::iter::from_fn(|| f.take_verdict()).collect())
    }

    #[test]
    fn sees_each_frame_whatever_the_chunking() {
        let mut s = startup();
        s.extend(message(b'Q', b"SELECT 'caf\xc3\xa9'\0"));
        s.extend(message(b'Q', b"SELECT '\xff'\0"));
        // A Parse whose text is fine and whose parameter types are binary.
        s.extend(message(b'P', b"\0SELECT $1\0\x00\x01\xff\xff\xff\xff"));
        s.extend(message(b'S', b""));
        for step in [1, 2, 3, 7, 1000] {
            assert_eq!(
                verdicts(&s, step).unwrap(),
                vec![
                    Verdict::Ok,
                    Verdict::Ok,
                    Verdict::InvalidUtf8,
                    Verdict::Ok,
                    Verdict::Ok
                ],
                "chunks of {step}"
            );
        }
    }

    #[test]
    fn a_sequence_cut_at_the_string_end_is_invalid() {
        let mut s = startup();
        s.extend(message(b'Q', b"SELECT 'caf\xc3'\0"));
        assert_eq!(
            verdicts(&s, 1).unwrap(),
            vec![Verdict::Ok, Verdict::InvalidUtf8]
        );
    }

    #[test]
    fn refuses_long_and_impossible_lengths_at_the_length_word() {
        let mut long_startup = 20_000u32.to_be_bytes().to_vec();
        long_startup.extend_from_slice(&[0; 4]);
        assert_eq!(
            verdicts(&long_startup, 1000),
            Err(FrameError::StartupTooLong(20_000))
        );
        let mut s = startup();
        s.extend_from_slice(b"Q\x7f\xff\xff\xf0");
        assert!(matches!(
            verdicts(&s, 1000),
            Err(FrameError::TooLong { .. })
        ));
        let mut s = startup();
        s.extend_from_slice(b"Q\x00\x00\x00\x02");
        assert_eq!(verdicts(&s, 1000), Err(FrameError::BadLength(2)));
    }
}

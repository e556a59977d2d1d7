//! The frames of a client's byte stream, checked before pgwire decodes
//! them.
//!
//! This file needs nothing but `std` and `thiserror`, so that the fuzz
//! target (`fuzz/fuzz_targets/frontend.rs`) includes it as it is and
//! checks, against pgwire's own decoder, that what it lets through decodes
//! without a panic, one message per frame.

use std::collections::VecDeque;

/// The longest startup packet, as in Postgres (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET: usize = 10_000;

/// What the framer saw in one whole frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Ok,
    /// The SQL text or a name in it is not UTF-8.
    InvalidUtf8,
}

/// One whole frame the framer let through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    pub verdict: Verdict,
    /// Its bytes, type byte and length word included.
    pub len: usize,
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
    #[error("invalid {kind} message: {why}")]
    Malformed {
        kind: &'static str,
        why: &'static str,
    },
}

/// Follows the frames of a client's byte stream after SSL negotiation —
/// the startup packet (a length word, no type byte), then typed messages —
/// and checks each whole frame's layout before pgwire decodes it.
///
/// pgwire's decoder trusts the counts and lengths inside a message: it
/// panics when they run past the buffer, and when they stop short it
/// leaves the rest to be read as the next message. So every frame whose
/// fields pgwire reads is checked here to hold exactly those fields, and a
/// frame that does not is refused before pgwire sees its last byte.
#[derive(Debug)]
pub struct Framer {
    max: usize,
    startup: bool,
    header: [u8; 5],
    have: usize,
    /// The current frame: its type (`None` for the startup packet), the
    /// body so far, and how much of it is still to come (`None` between
    /// frames).
    kind: Option<u8>,
    body: Vec<u8>,
    /// The frame's length as its header gives it.
    len: usize,
    remaining: Option<usize>,
    frames: VecDeque<Frame>,
}

impl Framer {
    pub fn new(max_message_bytes: usize) -> Self {
        Self {
            max: max_message_bytes,
            startup: true,
            header: [0; 5],
            have: 0,
            kind: None,
            body: Vec::new(),
            len: 0,
            remaining: None,
            frames: VecDeque::new(),
        }
    }

    /// The oldest whole frame not yet taken.
    pub fn take_frame(&mut self) -> Option<Frame> {
        self.frames.pop_front()
    }

    /// The verdict of the oldest whole frame not yet taken.
    pub fn take_verdict(&mut self) -> Option<Verdict> {
        self.take_frame().map(|f| f.verdict)
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
                    // Copy data is passed on unread: it is COPY's to parse.
                    if self.kind != Some(b'd') {
                        self.body.extend_from_slice(&bytes[..take]);
                    }
                    bytes = &bytes[take..];
                    self.remaining = Some(n - take);
                    if n == take {
                        self.end_frame()?;
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
        self.kind = (!self.startup).then_some(self.header[0]);
        self.len = len + usize::from(!self.startup);
        self.startup = false;
        self.have = 0;
        self.body.clear();
        self.remaining = Some(len - 4);
        if len == 4 {
            self.end_frame()?;
        }
        Ok(())
    }

    fn end_frame(&mut self) -> Result<(), FrameError> {
        let verdict = match self.kind {
            None => check_startup(&self.body)?,
            Some(kind) => check_message(kind, &self.body)?,
        };
        self.frames.push_back(Frame {
            verdict,
            len: self.len,
        });
        self.remaining = None;
        self.body.clear();
        Ok(())
    }
}

/// Reads the fields of one message's body, refusing to read past its end.
struct Fields<'a> {
    kind: &'static str,
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    fn bad(&self, why: &'static str) -> FrameError {
        FrameError::Malformed {
            kind: self.kind,
            why,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(self.bad("a field runs past the end of the message"));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn cstring(&mut self) -> Result<&'a [u8], FrameError> {
        let end = self
            .rest
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| self.bad("a string has no terminating zero byte"))?;
        let s = &self.rest[..end];
        self.rest = &self.rest[end + 1..];
        Ok(s)
    }

    fn int16(&mut self) -> Result<i16, FrameError> {
        let b = self.take(2)?;
        Ok(i16::from_be_bytes([b[0], b[1]]))
    }

    fn int32(&mut self) -> Result<i32, FrameError> {
        let b = self.take(4)?;
        Ok(i32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    /// A count of the fields that follow (an Int16 that is not negative).
    fn count(&mut self) -> Result<usize, FrameError> {
        usize::try_from(self.int16()?).map_err(|_| self.bad("a count is negative"))
    }

    fn end(&self) -> Result<(), FrameError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(self.bad("bytes are left over after its last field"))
        }
    }
}

const CANCEL_REQUEST_CODE: i32 = 80877102;
const SSL_REQUEST_CODE: i32 = 80877103;
const GSSENC_REQUEST_CODE: i32 = 80877104;

/// The startup packet: a protocol version and `name\0value\0` pairs ended
/// by a zero byte, or a cancel request.
fn check_startup(body: &[u8]) -> Result<Verdict, FrameError> {
    let mut f = Fields {
        kind: "startup",
        rest: body,
    };
    let code = f.int32()?;
    match code {
        // The backend's pid and its 4-byte key (protocol 3.0's, the only
        // length pgwire reads a cancel request's key with).
        CANCEL_REQUEST_CODE if f.rest.len() != 8 => {
            return Err(f.bad("a cancel request holds a pid and a 4-byte key"));
        }
        CANCEL_REQUEST_CODE => {}
        SSL_REQUEST_CODE | GSSENC_REQUEST_CODE => {
            return Err(f.bad("encryption is negotiated once, before the startup packet"));
        }
        // Protocol 3.x; pgwire refuses other versions itself.
        _ if code >> 16 == 3 => {
            loop {
                let name = f.cstring()?;
                if name.is_empty() {
                    break;
                }
                f.cstring()?;
            }
            f.end()?;
        }
        _ => {}
    }
    Ok(Verdict::Ok)
}

/// A typed message whose fields pgwire reads: they must fill it exactly.
/// Copy data, password messages (read by the authentication step, which
/// checks them), and types pgwire refuses itself pass unchecked.
fn check_message(kind: u8, body: &[u8]) -> Result<Verdict, FrameError> {
    let name = match kind {
        b'Q' => "Query",
        b'P' => "Parse",
        b'B' => "Bind",
        b'E' => "Execute",
        b'D' => "Describe",
        b'C' => "Close",
        b'S' => "Sync",
        b'H' => "Flush",
        b'X' => "Terminate",
        b'c' => "CopyDone",
        b'f' => "CopyFail",
        _ => return Ok(Verdict::Ok),
    };
    let mut f = Fields {
        kind: name,
        rest: body,
    };
    let mut texts = Vec::new();
    match kind {
        b'Q' => texts.push(f.cstring()?),
        b'P' => {
            texts.push(f.cstring()?);
            texts.push(f.cstring()?);
            for _ in 0..f.count()? {
                f.int32()?;
            }
        }
        b'B' => {
            texts.push(f.cstring()?);
            texts.push(f.cstring()?);
            for _ in 0..f.count()? {
                f.int16()?;
            }
            for _ in 0..f.count()? {
                match f.int32()? {
                    -1 => {}
                    n if n >= 0 => {
                        f.take(n as usize)?;
                    }
                    _ => return Err(f.bad("a parameter's length is negative")),
                }
            }
            for _ in 0..f.count()? {
                f.int16()?;
            }
        }
        b'E' => {
            texts.push(f.cstring()?);
            f.int32()?;
        }
        b'D' | b'C' => {
            if !matches!(f.take(1)?, [b'S' | b'P']) {
                return Err(f.bad("it names neither a statement nor a portal"));
            }
            texts.push(f.cstring()?);
        }
        b'f' => texts.push(f.cstring()?),
        _ => {}
    }
    f.end()?;
    Ok(if texts.iter().all(|t| std::str::from_utf8(t).is_ok()) {
        Verdict::Ok
    } else {
        Verdict::InvalidUtf8
    })
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

    #[test]
    fn refuses_fields_that_do_not_fill_their_message() {
        let bad: &[(u8, &[u8])] = &[
            // A Bind promising 32767 parameters.
            (b'B', b"\0\0\x00\x00\x7f\xff"),
            // A Bind whose parameter is longer than the message.
            (b'B', b"\0\0\x00\x00\x00\x01\x00\x00\x00\x09ab\x00\x00"),
            // A Query without its terminating zero, or with more after it.
            (b'Q', b"SELECT 1"),
            (b'Q', b"SELECT 1\0X\0\0\0\x04"),
            (b'E', b"\0\0\0"),
            (b'D', b"Xname\0"),
            (b'S', b"\0"),
        ];
        for (kind, body) in bad {
            let mut s = startup();
            s.extend(message(*kind, body));
            assert!(
                matches!(verdicts(&s, 1000), Err(FrameError::Malformed { .. })),
                "{} {body:?}",
                *kind as char
            );
        }
        let mut trailing = startup();
        trailing.truncate(trailing.len() - 1);
        trailing.extend_from_slice(b"x\0");
        let len = (trailing.len() as u32).to_be_bytes();
        trailing[..4].copy_from_slice(&len);
        assert!(matches!(
            verdicts(&trailing, 1000),
            Err(FrameError::Malformed { .. })
        ));
    }
}

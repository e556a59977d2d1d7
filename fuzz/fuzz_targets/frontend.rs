//! The front end's decoder against arbitrary client bytes, as the server
//! runs it (`server/src/wire.rs`): Weir's `Framer` reads the stream first
//! and refuses what it must; what it lets through, pgwire decodes.
//!
//! Properties, on every input:
//! - neither the framer nor pgwire's decoder panics;
//! - pgwire decodes no more messages than the framer saw whole frames,
//!   and each message it decodes consumed exactly its frame (nothing of
//!   the next one), so no message's bytes can be read as another's.
//!
//! The first input byte picks the size of the reads the bytes arrive in.

#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use pgwire::messages::{DecodeContext, PgWireFrontendMessage, ProtocolVersion};

#[path = "../../server/src/wire/framer.rs"]
#[allow(dead_code)]
mod framer;

fuzz_target!(|data: &[u8]| {
    let Some((&step, stream)) = data.split_first() else {
        return;
    };
    let mut framer = framer::Framer::new(1 << 16);
    // What reached pgwire's buffer: a read the framer refuses does not.
    let mut buffer = BytesMut::new();
    for read in stream.chunks(usize::from(step).max(1)) {
        if framer.feed(read).is_err() {
            break;
        }
        buffer.extend_from_slice(read);
    }
    let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
    ctx.awaiting_frontend_ssl = false;
    ctx.awaiting_frontend_startup = true;
    loop {
        let before = buffer.len();
        match PgWireFrontendMessage::decode(&mut buffer, &ctx) {
            Ok(Some(_)) => {
                let frame = framer
                    .take_frame()
                    .expect("pgwire decoded a message the framer has not seen whole");
                assert_eq!(
                    before - buffer.len(),
                    frame.len,
                    "a message consumed other than its frame"
                );
                ctx.awaiting_frontend_startup = false;
            }
            // Not whole yet, or refused by pgwire (the server answers 08P01).
            Ok(None) | Err(_) => break,
        }
    }
});

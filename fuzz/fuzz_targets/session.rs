//! The session state machine against arbitrary sequences of well-formed
//! messages, through a running `weir` server (`WEIR_FUZZ_ADDR`, which
//! `scripts/fuzz` starts): the extended protocol's statements and portals,
//! errors inside a pipeline, transaction blocks, cursors, COPY in and out,
//! interleaved in any order and with any parameters.
//!
//! The input is read as a program: each byte picks a message, the bytes
//! after it its names, SQL, parameters and formats. The program is sent
//! on a fresh connection, then `CopyFail`, `Sync`, `ROLLBACK` and a marker
//! query. Properties, on every input:
//! - the server answers the marker (it did not hang, and the connection is
//!   not stuck in a state it cannot leave); or it ends the connection with
//!   a FATAL that names a protocol violation (08P01);
//! - no handler panicked (which the server reports as FATAL XX000);
//! - the server is still up for the next input.
//!
//! The decoder's own target (`frontend.rs`) covers malformed bytes; this
//! one sends only what pgwire encodes. Coverage feedback comes from this
//! process only, so the search is mostly blind; the server is a separate
//! process because it needs RocksDB, which a fuzz build should not compile.

#![no_main]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use pgwire::messages::Message;
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::extendedquery::{Bind, Close, Describe, Execute, Flush, Parse, Sync};
use pgwire::messages::simplequery::Query;
use pgwire::messages::startup::Startup;

/// Statements a session may run, some with parameters, some failing, none
/// that runs for long (no SUBSCRIBE): `fz (id int PRIMARY KEY, v text)` is
/// made by the first input.
const SQL: &[&str] = &[
    "SELECT 1",
    "SELECT $1",
    "SELECT $1::int + $2::int",
    "SELECT id, v FROM fz ORDER BY id",
    "SELECT * FROM fz WHERE id = $1",
    "INSERT INTO fz VALUES ($1, $2)",
    "INSERT INTO fz VALUES (1, 'one')",
    "UPDATE fz SET v = $2 WHERE id = $1",
    "DELETE FROM fz WHERE id = $1",
    "BEGIN",
    "COMMIT",
    "ROLLBACK",
    "SAVEPOINT s",
    "ROLLBACK TO s",
    "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM fz",
    "DECLARE d CURSOR FOR SELECT * FROM generate_series(1, 5)",
    "FETCH 2 FROM c",
    "FETCH ALL FROM d",
    "MOVE 1 IN c",
    "CLOSE c",
    "CLOSE ALL",
    "COPY fz FROM STDIN",
    "COPY fz FROM STDIN WITH (FORMAT csv)",
    "COPY fz TO STDOUT",
    "COPY (SELECT $1) TO STDOUT",
    "SET statement_timeout = 5000",
    "SET search_path = public",
    "SHOW TRANSACTION ISOLATION LEVEL",
    "SELECT '\\xdead'::bytea, interval '1 day 02:00', '{1,NULL}'::int[]",
    "SELECT nope",
    "SELECT * FROM nowhere",
    "this is not sql",
    "",
    "SELECT 1; SELECT 2",
    "SELECT count(*) FROM pg_class",
    "FLUSH",
];

/// Parameter types a Parse may declare: unspecified, int4, text, bytea,
/// interval, int4[].
const TYPES: &[u32] = &[0, 23, 25, 17, 1186, 1007];

const NAMES: &[&str] = &["", "a", "b"];

struct Program<'a> {
    data: &'a [u8],
}

impl Program<'_> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((b, rest)) => {
                self.data = rest;
                *b
            }
            None => 0,
        }
    }

    fn bytes(&mut self) -> Bytes {
        let n = usize::from(self.byte() % 16).min(self.data.len());
        let (head, rest) = self.data.split_at(n);
        self.data = rest;
        Bytes::copy_from_slice(head)
    }

    fn name(&mut self) -> Option<String> {
        let n = NAMES[usize::from(self.byte()) % NAMES.len()];
        (!n.is_empty()).then(|| n.to_string())
    }

    fn sql(&mut self) -> String {
        SQL[usize::from(self.byte()) % SQL.len()].to_string()
    }

    /// A parameter: NULL, a small number, a word, or raw bytes.
    fn value(&mut self) -> Option<Bytes> {
        match self.byte() % 5 {
            0 => None,
            1 => Some(Bytes::from((i32::from(self.byte()) - 64).to_string())),
            2 => Some(Bytes::from_static(b"w")),
            3 => Some(Bytes::copy_from_slice(
                &i32::from(self.byte()).to_be_bytes(),
            )),
            _ => Some(self.bytes()),
        }
    }

    fn formats(&mut self) -> Vec<i16> {
        (0..self.byte() % 3)
            .map(|_| i16::from(self.byte() % 2))
            .collect()
    }

    fn encode_next(&mut self, out: &mut BytesMut) {
        let kind = self.byte() % 12;
        let _ = match kind {
            0 => Query::new(self.sql()).encode(out),
            1 => {
                let name = self.name();
                let sql = self.sql();
                let types = (0..self.byte() % 3)
                    .map(|_| TYPES[usize::from(self.byte()) % TYPES.len()])
                    .collect();
                Parse::new(name, sql, types).encode(out)
            }
            2 => {
                let portal = self.name();
                let statement = self.name();
                let formats = self.formats();
                let params = (0..self.byte() % 3).map(|_| self.value()).collect();
                let results = self.formats();
                Bind::new(portal, statement, formats, params, results).encode(out)
            }
            3 => {
                let target = if self.byte() % 2 == 0 { b'S' } else { b'P' };
                Describe::new(target, self.name()).encode(out)
            }
            4 => Execute::new(self.name(), i32::from(self.byte() % 4)).encode(out),
            5 => {
                let target = if self.byte() % 2 == 0 { b'S' } else { b'P' };
                Close::new(target, self.name()).encode(out)
            }
            6 => Sync::new().encode(out),
            7 => Flush::new().encode(out),
            8 => {
                let line = match self.byte() % 3 {
                    0 => Bytes::from(format!("{}\tcopied\n", self.byte())),
                    1 => Bytes::from(format!("{},\"c,sv\"\n", self.byte())),
                    _ => self.bytes(),
                };
                CopyData::new(line).encode(out)
            }
            9 => CopyDone::new().encode(out),
            10 => CopyFail::new("fuzz".into()).encode(out),
            _ => Execute::new(None, 0).encode(out),
        };
    }
}

/// One backend message: its type and body.
fn read_message(socket: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    socket.read_exact(&mut head)?;
    let len = i32::from_be_bytes([head[1], head[2], head[3], head[4]]);
    let mut body = vec![0u8; usize::try_from(len - 4).expect("a backend length of at least 4")];
    socket.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// An ErrorResponse's severity and SQLSTATE.
fn error_fields(body: &[u8]) -> (String, String) {
    let (mut severity, mut code) = (String::new(), String::new());
    for field in body.split(|b| *b == 0) {
        if let Some((&tag, value)) = field.split_first() {
            let value = String::from_utf8_lossy(value).into_owned();
            match tag {
                b'V' => severity = value,
                b'C' => code = value,
                _ => {}
            }
        }
    }
    (severity, code)
}

const MARKER: &str = "weir-fuzz-done";

fn connect(addr: &str) -> TcpStream {
    let mut socket =
        TcpStream::connect(addr).unwrap_or_else(|e| panic!("the server at {addr} is gone: {e}"));
    socket
        .set_read_timeout(Some(Duration::from_secs(30)))
        .expect("a read timeout");
    let mut out = BytesMut::new();
    let mut startup = Startup::new();
    for (k, v) in [("user", "weir"), ("database", "weir")] {
        startup.parameters.insert(k.to_string(), v.to_string());
    }
    startup.encode(&mut out).expect("a startup packet");
    socket.write_all(&out).expect("send the startup packet");
    loop {
        let (kind, body) = read_message(&mut socket).expect("the server answers the startup");
        match kind {
            b'Z' => return socket,
            b'E' => panic!("the startup was refused: {:?}", error_fields(&body)),
            _ => {}
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let addr = std::env::var("WEIR_FUZZ_ADDR")
        .expect("WEIR_FUZZ_ADDR names the weir server to fuzz (scripts/fuzz starts one)");
    let mut socket = connect(&addr);
    let mut out = BytesMut::new();
    Query::new("CREATE TABLE IF NOT EXISTS fz (id int PRIMARY KEY, v text)".into())
        .encode(&mut out)
        .expect("encode");
    let mut program = Program { data };
    let mut sent = 0;
    while !program.data.is_empty() && sent < 64 {
        program.encode_next(&mut out);
        sent += 1;
    }
    // Leave COPY, end the pipeline and any transaction block, then ask
    // for the marker.
    let _ = CopyFail::new("end of program".into()).encode(&mut out);
    let _ = Sync::new().encode(&mut out);
    let _ = Query::new("ROLLBACK".into()).encode(&mut out);
    let _ = Query::new(format!("SELECT '{MARKER}'")).encode(&mut out);
    if socket.write_all(&out).is_err() {
        // The server closed the connection while the program was being
        // sent; what it said is read below.
    }
    let mut marked = false;
    loop {
        let (kind, body) = match read_message(&mut socket) {
            Ok(m) => m,
            Err(e)
                if e.kind() == std::io::ErrorKind::WouldBlock
                    || e.kind() == std::io::ErrorKind::TimedOut =>
            {
                panic!("the server did not answer the marker within 30 s");
            }
            Err(e) => panic!("the connection closed without a FATAL error: {e}"),
        };
        match kind {
            b'E' => {
                let (severity, code) = error_fields(&body);
                if severity == "FATAL" || severity == "PANIC" {
                    assert_eq!(
                        code, "08P01",
                        "the server ended the session with {severity} {code}"
                    );
                    break;
                }
            }
            b'D' if body.windows(MARKER.len()).any(|w| w == MARKER.as_bytes()) => marked = true,
            b'Z' if marked => break,
            _ => {}
        }
    }
    drop(socket);
    // The server is still there for the next input.
    drop(connect(&addr));
});

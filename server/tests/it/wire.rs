//! The transport and its hardening, against a real server: raw protocol
//! bytes (over-long, malformed and non-UTF-8 messages, a stalled
//! handshake), the connection limit, and TLS (with SCRAM) through Debian's
//! `psql`.

use crate::common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

/// A backend message: its type byte and body.
struct Message {
    kind: u8,
    body: Vec<u8>,
}

impl Message {
    /// The value of an ErrorResponse field (`C` is the SQLSTATE).
    fn field(&self, code: u8) -> Option<String> {
        let mut rest = &self.body[..];
        while let Some((&c, tail)) = rest.split_first() {
            if c == 0 {
                break;
            }
            let end = tail.iter().position(|&b| b == 0)?;
            if c == code {
                return Some(String::from_utf8_lossy(&tail[..end]).into_owned());
            }
            rest = &tail[end + 1..];
        }
        None
    }
}

fn raw(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s
}

fn startup_packet(user: &str) -> Vec<u8> {
    let mut body = vec![0, 3, 0, 0];
    for (k, v) in [("user", user), ("database", "weir")] {
        body.extend_from_slice(k.as_bytes());
        body.push(0);
        body.extend_from_slice(v.as_bytes());
        body.push(0);
    }
    body.push(0);
    let mut packet = ((body.len() + 4) as u32).to_be_bytes().to_vec();
    packet.extend(body);
    packet
}

fn message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

/// The next message, or `None` when the server closed the connection.
fn read_message(s: &mut TcpStream) -> Option<Message> {
    let mut header = [0u8; 5];
    s.read_exact(&mut header).ok()?;
    let len = u32::from_be_bytes(header[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0; len - 4];
    s.read_exact(&mut body).ok()?;
    Some(Message {
        kind: header[0],
        body,
    })
}

/// Reads until ReadyForQuery; returns what came before it.
fn until_ready(s: &mut TcpStream) -> Vec<Message> {
    let mut seen = Vec::new();
    loop {
        let m = read_message(s).expect("the server answers");
        if m.kind == b'Z' {
            return seen;
        }
        seen.push(m);
    }
}

/// A connection past its startup, ready for a query.
fn ready(port: u16) -> TcpStream {
    let mut s = raw(port);
    s.write_all(&startup_packet("weir")).unwrap();
    let before = until_ready(&mut s);
    assert!(before.iter().all(|m| m.kind != b'E'), "startup is accepted");
    s
}

/// Expects a FATAL error with `code`, and then the end of the connection.
#[track_caller]
fn expect_fatal_then_close(s: &mut TcpStream, code: &str) -> String {
    let m = read_message(s).expect("an error before the close");
    assert_eq!(m.kind, b'E', "an ErrorResponse");
    assert_eq!(m.field(b'C').as_deref(), Some(code), "{:?}", m.field(b'M'));
    assert_eq!(m.field(b'S').as_deref(), Some("FATAL"));
    assert!(read_message(s).is_none(), "the connection is closed");
    m.field(b'M').unwrap_or_default()
}

fn select_one_works(port: u16) {
    let mut s = ready(port);
    s.write_all(&message(b'Q', b"SELECT 41 + 1\0")).unwrap();
    let answer = until_ready(&mut s);
    let row = answer.iter().find(|m| m.kind == b'D').expect("a row");
    assert!(row.body.ends_with(b"42"));
}

#[test]
fn bad_messages_close_only_their_connection() {
    let server = common::Server::start_with(&["--max-message-bytes", "4096"]);
    let port = server.port;
    // A connection that stays open through everything below.
    let mut bystander = ready(port);

    // A startup packet longer than Postgres's 10,000 bytes.
    let mut s = raw(port);
    s.write_all(&20_000u32.to_be_bytes()).unwrap();
    s.write_all(&[0, 3, 0, 0]).unwrap();
    let why = expect_fatal_then_close(&mut s, "08P01");
    assert!(why.contains("startup packet"), "{why}");

    // A message longer than --max-message-bytes: refused at its length
    // word, before the megabyte it announces is sent.
    let mut s = ready(port);
    s.write_all(b"Q\x00\x10\x00\x00").unwrap();
    let why = expect_fatal_then_close(&mut s, "08P01");
    assert!(why.contains("4096"), "{why}");

    // A length word shorter than itself.
    let mut s = ready(port);
    s.write_all(b"Q\x00\x00\x00\x02").unwrap();
    expect_fatal_then_close(&mut s, "08P01");

    // A Bind whose parameter count promises more than the message holds.
    let mut s = ready(port);
    s.write_all(&message(b'B', b"\0\0\x00\x00\x7f\xff"))
        .unwrap();
    expect_fatal_then_close(&mut s, "08P01");

    // A message of a type the protocol does not have.
    let mut s = ready(port);
    s.write_all(&message(b'!', b"")).unwrap();
    expect_fatal_then_close(&mut s, "08P01");

    // SQL text that is not UTF-8 is an error, and the connection goes on.
    let mut s = ready(port);
    s.write_all(&message(b'Q', b"SELECT '\xff\xfe'\0")).unwrap();
    let answer = until_ready(&mut s);
    let error = answer.iter().find(|m| m.kind == b'E').expect("an error");
    assert_eq!(error.field(b'C').as_deref(), Some("22021"));
    // The same in a Parse of the extended protocol, answered at the Sync.
    let mut parse = b"\0SELECT '\xc3'\0".to_vec();
    parse.extend_from_slice(&[0, 0]);
    s.write_all(&message(b'P', &parse)).unwrap();
    s.write_all(&message(b'S', b"")).unwrap();
    let answer = until_ready(&mut s);
    let error = answer.iter().find(|m| m.kind == b'E').expect("an error");
    assert_eq!(error.field(b'C').as_deref(), Some("22021"));
    // And in a parameter's text.
    s.write_all(&message(b'P', b"\0SELECT $1::text\0\0\0"))
        .unwrap();
    s.write_all(&message(b'B', b"\0\0\0\0\0\x01\0\0\0\x01\xff\0\0"))
        .unwrap();
    s.write_all(&message(b'E', b"\0\0\0\0\0")).unwrap();
    s.write_all(&message(b'S', b"")).unwrap();
    let answer = until_ready(&mut s);
    let error = answer.iter().find(|m| m.kind == b'E').expect("an error");
    assert_eq!(error.field(b'C').as_deref(), Some("22021"));
    s.write_all(&message(b'Q', b"SELECT 'caf\xc3\xa9'\0"))
        .unwrap();
    let answer = until_ready(&mut s);
    let row = answer.iter().find(|m| m.kind == b'D').expect("a row");
    assert!(row.body.ends_with("café".as_bytes()));

    // The bystander never noticed.
    bystander.write_all(&message(b'Q', b"SELECT 1\0")).unwrap();
    assert!(until_ready(&mut bystander).iter().any(|m| m.kind == b'D'));
    select_one_works(port);
}

#[test]
fn a_stalled_handshake_is_dropped() {
    let server = common::Server::start_with(&["--handshake-timeout-ms", "300"]);
    // Connected, and never a startup packet.
    let mut silent = raw(server.port);
    let mut buf = [0u8; 1];
    assert_eq!(silent.read(&mut buf).unwrap_or(0), 0, "the server hangs up");
    // Half a startup packet.
    let mut half = raw(server.port);
    half.write_all(&startup_packet("weir")[..6]).unwrap();
    assert_eq!(half.read(&mut buf).unwrap_or(0), 0, "the server hangs up");
    // A client that finishes its handshake may stay as long as it likes.
    let mut s = ready(server.port);
    std::thread::sleep(Duration::from_millis(600));
    s.write_all(&message(b'Q', b"SELECT 1\0")).unwrap();
    assert!(until_ready(&mut s).iter().any(|m| m.kind == b'D'));
}

#[test]
fn one_client_too_many_is_told_53300() {
    let server = common::Server::start_with(&["--max-connections", "2"]);
    let first = ready(server.port);
    let _second = ready(server.port);
    let mut third = raw(server.port);
    third.write_all(&startup_packet("weir")).unwrap();
    let why = expect_fatal_then_close(&mut third, "53300");
    assert!(why.contains("too many clients"), "{why}");
    // A place frees when a client leaves.
    drop(first);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let mut s = raw(server.port);
        s.write_all(&startup_packet("weir")).unwrap();
        let answer = until_ready_or_close(&mut s);
        if answer.iter().all(|m| m.kind != b'E') {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the place is given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn until_ready_or_close(s: &mut TcpStream) -> Vec<Message> {
    let mut seen = Vec::new();
    while let Some(m) = read_message(s) {
        if m.kind == b'Z' {
            break;
        }
        seen.push(m);
    }
    seen
}

#[test]
fn psql_connects_over_tls_and_verifies_the_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("server.crt");
    let key = dir.path().join("server.key");
    let openssl = common::installed("openssl", "apt-get install openssl");
    let made = Command::new(openssl)
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
        ])
        .args([
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    // TLS and SCRAM together, as a JobManager would be run.
    let server = common::Server::start_with(&[
        "--tls-cert",
        cert.to_str().unwrap(),
        "--tls-key",
        key.to_str().unwrap(),
        "--auth",
        "scram-sha-256",
    ]);
    let psql = common::installed("psql", "apt-get install postgresql-client");
    let conninfo = |mode: &str| {
        format!(
            "host=localhost port={} user=weir dbname=weir sslmode={mode} sslrootcert={}",
            server.port,
            cert.display()
        )
    };
    let out = Command::new(&psql)
        .env("PGPASSWORD", common::PASSWORD)
        .arg(conninfo("verify-full"))
        .args(["-X", "-A", "-t", "-c", "SELECT 1", "-c", "\\conninfo"])
        .output()
        .expect("psql");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.starts_with("1\n"), "{stdout}");
    assert!(
        stdout.contains("SSL connection (protocol: TLSv1."),
        "{stdout}"
    );

    // Without a certificate configured, a client that insists on TLS is
    // refused, and one that does not insist connects in the clear.
    let plain = common::Server::start();
    let out = Command::new(&psql)
        .arg(format!(
            "host=127.0.0.1 port={} user=weir dbname=weir sslmode=require",
            plain.port
        ))
        .args(["-X", "-c", "SELECT 1"])
        .output()
        .expect("psql");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not support SSL"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(&psql)
        .arg(format!(
            "host=127.0.0.1 port={} user=weir dbname=weir sslmode=prefer",
            plain.port
        ))
        .args(["-X", "-A", "-t", "-c", "SELECT 1"])
        .output()
        .expect("psql");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "1\n");
}

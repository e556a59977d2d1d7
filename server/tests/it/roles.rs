//! Users, passwords and privileges through the client's door: roles made
//! with SQL, SCRAM-SHA-256 (the JobManager's default and `--auth
//! scram-sha-256`) with tokio-postgres and psql, and GRANT/REVOKE SELECT
//! enforced on every path a role reads by.

use crate::common;

use std::process::Command;

use common::{PASSWORD, Server, expect_error, one, rows};

/// Connects as `user`, or says why not: (SQLSTATE, message).
async fn login(
    port: u16,
    user: &str,
    password: Option<&str>,
) -> Result<tokio_postgres::Client, (String, String)> {
    let mut url = format!("host=127.0.0.1 port={port} user={user} dbname=weir");
    if let Some(p) = password {
        url.push_str(&format!(" password='{p}'"));
    }
    match tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(async move {
                let _ = conn.await;
            });
            Ok(client)
        }
        Err(e) => Err(match e.as_db_error() {
            Some(d) => (d.code().code().to_string(), d.message().to_string()),
            None => (String::new(), e.to_string()),
        }),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_asks_every_role_for_its_password() {
    let server = Server::start_with(&["--auth", "scram-sha-256"]);
    let port = server.port;
    // The superuser's password is WEIR_PASSWORD's (the tests set it).
    let weir = login(port, "weir", Some(PASSWORD)).await.expect("weir");
    let wrong = login(port, "weir", Some("guess")).await.err().unwrap();
    assert_eq!(wrong.0, "28P01", "{wrong:?}");
    // Without a password the client cannot answer (tokio-postgres says
    // so itself).
    assert!(login(port, "weir", None).await.is_err());
    // A role that does not exist fails as a wrong password does.
    let ghost = login(port, "ghost", Some("x")).await.err().unwrap();
    assert_eq!(ghost.0, "28P01", "{ghost:?}");

    weir.batch_execute("CREATE USER alice PASSWORD 'wonder land'; CREATE ROLE bob PASSWORD 'b'")
        .await
        .unwrap();
    let alice = login(port, "alice", Some("wonder land"))
        .await
        .expect("alice");
    assert_eq!(one(&alice, "SELECT current_user").await, "alice");
    assert_eq!(one(&alice, "SHOW is_superuser").await, "off");
    let bob = login(port, "bob", Some("b")).await.err().unwrap();
    assert_eq!(bob.0, "28000", "a role without LOGIN: {bob:?}");

    // A role may change its own password, and the old one stops working.
    alice
        .batch_execute("ALTER USER alice WITH PASSWORD 'looking glass'")
        .await
        .unwrap();
    assert_eq!(
        login(port, "alice", Some("wonder land"))
            .await
            .err()
            .unwrap()
            .0,
        "28P01"
    );
    login(port, "alice", Some("looking glass"))
        .await
        .expect("new password");
    // But not anything else of itself, nor anyone else's password.
    expect_error(&alice, "ALTER USER alice SUPERUSER", "42501", "superuser").await;
    expect_error(
        &alice,
        "ALTER USER weir PASSWORD 'mine'",
        "42501",
        "superuser",
    )
    .await;
    // A verifier hashed elsewhere (psql's \password) is not taken.
    expect_error(
        &weir,
        "ALTER USER alice PASSWORD 'SCRAM-SHA-256$4096:c2FsdA==$a2V5:c2VydmVy'",
        "0A000",
        "hashed",
    )
    .await;
    // PASSWORD NULL: no password, so no login.
    weir.batch_execute("ALTER ROLE alice PASSWORD NULL")
        .await
        .unwrap();
    assert_eq!(
        login(port, "alice", Some("looking glass"))
            .await
            .err()
            .unwrap()
            .0,
        "28P01"
    );

    // psql, with its password from PGPASSWORD.
    let psql = common::installed("psql", "apt-get install postgresql-client");
    let out = Command::new(psql)
        .env("PGPASSWORD", PASSWORD)
        .arg(format!("host=127.0.0.1 port={port} user=weir dbname=weir"))
        .args([
            "-X",
            "-A",
            "-t",
            "-c",
            "SELECT rolname FROM pg_roles ORDER BY 1",
        ])
        .output()
        .expect("psql");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "alice\nbob\nweir\n",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_reads_what_it_was_granted_and_changes_nothing() {
    let mut server = Server::start();
    let port = server.port;
    let weir = server.client().await;
    weir.batch_execute(
        "CREATE TABLE shared (id int PRIMARY KEY, v text);
         CREATE TABLE secret (id int PRIMARY KEY, v text);
         INSERT INTO shared VALUES (1, 'a'), (2, 'b');
         INSERT INTO secret VALUES (1, 'x');
         CREATE MATERIALIZED VIEW counts AS SELECT count(*) AS n FROM secret;
         CREATE USER reader;
         GRANT SELECT ON shared TO reader;",
    )
    .await
    .unwrap();
    // Playground trust: no password, but the role must exist and log in.
    let nobody = login(port, "nobody", None).await.err().unwrap();
    assert_eq!(nobody.0, "28000", "{nobody:?}");
    let reader = login(port, "reader", None).await.expect("reader");

    assert_eq!(
        rows(&reader, "SELECT id, v FROM shared ORDER BY id").await,
        vec![vec!["1", "a"], vec!["2", "b"]]
    );
    for sql in [
        "SELECT * FROM secret",
        "SELECT * FROM counts",
        "SELECT s.v FROM shared s JOIN secret t ON s.id = t.id",
        "SELECT * FROM shared WHERE id IN (SELECT id FROM secret)",
        "WITH x AS (SELECT * FROM secret) SELECT * FROM x",
        "COPY secret TO STDOUT",
        "COPY (SELECT * FROM secret) TO STDOUT",
        "SUBSCRIBE TO counts",
        "DECLARE c CURSOR FOR SELECT * FROM secret",
        "EXPLAIN SELECT * FROM public.secret",
    ] {
        expect_error(&reader, sql, "42501", "permission denied").await;
    }
    for sql in [
        "INSERT INTO shared VALUES (3, 'c')",
        "DELETE FROM shared",
        "CREATE TABLE mine (a int)",
        "DROP TABLE shared",
        "CREATE USER other",
        "GRANT SELECT ON secret TO reader",
        "CHECKPOINT",
    ] {
        expect_error(&reader, sql, "42501", "superuser").await;
    }
    // The catalogs are anyone's, and tell the truth about the grants.
    assert_eq!(
        one(
            &reader,
            "SELECT count(*) FROM pg_class WHERE relname IN ('shared', 'secret')"
        )
        .await,
        "2"
    );
    assert_eq!(
        rows(
            &reader,
            "SELECT has_table_privilege('shared', 'SELECT'), has_table_privilege('secret', 'SELECT'),
                    has_table_privilege('shared', 'INSERT'), has_table_privilege('weir', 'secret', 'SELECT'),
                    has_table_privilege('pg_class', 'SELECT')"
        )
        .await,
        vec![vec!["t", "f", "f", "t", "t"]]
    );
    assert_eq!(
        rows(&reader, "SELECT usename, usesuper FROM pg_user ORDER BY 1").await,
        vec![vec!["reader", "f"], vec!["weir", "t"]]
    );
    reader
        .batch_execute("SET application_name = 'dash'; BEGIN; COMMIT")
        .await
        .unwrap();

    // Grants take effect on the next statement, and last across a restart.
    weir.batch_execute("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader")
        .await
        .unwrap();
    assert_eq!(one(&reader, "SELECT n FROM counts").await, "1");
    weir.batch_execute("REVOKE SELECT ON shared, counts FROM reader")
        .await
        .unwrap();
    expect_error(&reader, "SELECT * FROM shared", "42501", "shared").await;
    drop((reader, weir));
    server.crash_and_restart();
    let reader = login(port, "reader", None)
        .await
        .expect("reader after a restart");
    assert_eq!(one(&reader, "SELECT v FROM secret").await, "x");
    expect_error(&reader, "SELECT * FROM counts", "42501", "counts").await;

    // What GRANT cannot say is refused, not half done.
    let weir = server.client().await;
    for (sql, code) in [
        ("GRANT INSERT ON shared TO reader", "0A000"),
        ("GRANT ALL ON shared TO reader", "0A000"),
        ("GRANT SELECT (v) ON shared TO reader", "0A000"),
        ("GRANT SELECT ON shared TO PUBLIC", "0A000"),
        (
            "GRANT SELECT ON shared TO reader WITH GRANT OPTION",
            "0A000",
        ),
        ("GRANT SELECT ON nowhere TO reader", "42P01"),
        ("GRANT SELECT ON shared TO ghost", "42704"),
        ("CREATE USER reader", "42710"),
        ("DROP USER ghost", "42704"),
        ("DROP USER weir", "2BP01"),
        ("CREATE ROLE r IN ROLE reader", "0A000"),
    ] {
        let (got, message) = common::error_of(&weir, sql).await;
        assert_eq!(got, code, "{sql}: {message}");
    }
    weir.batch_execute("DROP USER IF EXISTS ghost; ALTER ROLE reader RENAME TO viewer")
        .await
        .unwrap();
    assert_eq!(
        one(
            &weir,
            "SELECT string_agg(rolname, ',' ORDER BY rolname) FROM pg_roles"
        )
        .await,
        "viewer,weir"
    );
    // The renamed role keeps its grants.
    let viewer = login(port, "viewer", None).await.expect("viewer");
    assert_eq!(one(&viewer, "SELECT v FROM secret").await, "x");
    weir.batch_execute("DROP USER viewer").await.unwrap();
    assert_eq!(login(port, "viewer", None).await.err().unwrap().0, "28000");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_connection_limit_is_answered_53300() {
    let server = Server::start();
    let weir = server.client().await;
    weir.batch_execute("CREATE USER one CONNECTION LIMIT 1")
        .await
        .unwrap();
    let first = login(server.port, "one", None).await.expect("the first");
    let second = login(server.port, "one", None).await.err().unwrap();
    assert_eq!(second.0, "53300", "{second:?}");
    assert_eq!(
        one(
            &weir,
            "SELECT rolconnlimit FROM pg_roles WHERE rolname = 'one'"
        )
        .await,
        "1"
    );
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while login(server.port, "one", None).await.is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the place is given back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// `pg_cancel_backend` and `pg_terminate_backend`: a superuser signals any
/// backend, another role only its own; the cancelled statement ends with
/// 57014, the terminated connection is told 57P01 and closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backends_are_cancelled_and_terminated_by_pid() {
    let server = Server::start();
    let admin = server.client().await;
    admin
        .batch_execute("CREATE ROLE analyst LOGIN PASSWORD 'pw'")
        .await
        .unwrap();
    let admin_pid = one(&admin, "SELECT pg_backend_pid()").await;

    // A long query, cancelled from another connection: the cancel is sent
    // again until the query has seen it, since the query may not have
    // begun listening when its row first says `active`.
    let busy = server.client().await;
    let busy_pid = one(&busy, "SELECT pg_backend_pid()").await;
    let mut running = tokio::spawn(async move {
        busy.simple_query("SELECT count(*) FROM generate_series(1, 100000000000) a")
            .await
            .map(|_| ())
            .map_err(|e| e.code().map(|c| c.code().to_string()))
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let outcome = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the query is cancelled"
        );
        let state = one(
            &admin,
            &format!("SELECT state FROM pg_stat_activity WHERE pid = {busy_pid}"),
        )
        .await;
        if state == "active" {
            assert_eq!(
                one(&admin, &format!("SELECT pg_cancel_backend({busy_pid})")).await,
                "t"
            );
        }
        if let Ok(done) =
            tokio::time::timeout(std::time::Duration::from_millis(500), &mut running).await
        {
            break done.unwrap();
        }
    };
    assert_eq!(outcome, Err(Some("57014".to_string())));
    // No such backend: false, as Postgres answers (with a warning).
    assert_eq!(one(&admin, "SELECT pg_cancel_backend(1)").await, "f");

    // Another role may not signal the superuser's backend, but may its own.
    let analyst = login(server.port, "analyst", Some("pw")).await.unwrap();
    expect_error(
        &analyst,
        &format!("SELECT pg_terminate_backend({admin_pid})"),
        "42501",
        "permission denied to terminate process",
    )
    .await;
    expect_error(
        &analyst,
        &format!("SELECT pg_cancel_backend({admin_pid})"),
        "42501",
        "permission denied to cancel query",
    )
    .await;
    let url = format!(
        "host=127.0.0.1 port={} user=analyst dbname=weir password=pw",
        server.port
    );
    let (victim, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
        .await
        .unwrap();
    let connection = tokio::spawn(conn);
    let victim_pid = one(&victim, "SELECT pg_backend_pid()").await;
    assert_eq!(
        one(
            &analyst,
            &format!("SELECT pg_terminate_backend({victim_pid})")
        )
        .await,
        "t"
    );
    let ended = tokio::time::timeout(std::time::Duration::from_secs(30), connection)
        .await
        .expect("the terminated connection closes")
        .unwrap();
    let err = ended.expect_err("the server ends the connection with an error");
    assert_eq!(err.code().map(|c| c.code()), Some("57P01"), "{err}");
    assert!(victim.is_closed());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while one(
        &admin,
        &format!("SELECT count(*) FROM pg_stat_activity WHERE pid = {victim_pid}"),
    )
    .await
        != "0"
    {
        assert!(std::time::Instant::now() < deadline, "its row goes");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // The superuser's own connection is untouched.
    assert_eq!(one(&admin, "SELECT 1").await, "1");
}

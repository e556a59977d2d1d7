//! The protocol's other doors, as drivers use them: `COPY … FROM STDIN`
//! and `COPY … TO STDOUT` (text and CSV), cancel requests, and cursors
//! over queries (`DECLARE`, `FETCH`, `MOVE`, `CLOSE`, `WITH HOLD`).

use crate::common;

use bytes::Bytes;
use common::{Server, expect_error, one, rows};
use futures::{SinkExt, TryStreamExt};

async fn copy_in(c: &tokio_postgres::Client, sql: &str, data: &str) -> u64 {
    let sink = c.copy_in(sql).await.expect(sql);
    futures::pin_mut!(sink);
    sink.send(Bytes::from(data.to_string()))
        .await
        .expect("send");
    sink.finish().await.expect(sql)
}

async fn copy_out(c: &tokio_postgres::Client, sql: &str) -> String {
    let stream = c.copy_out(sql).await.expect(sql);
    let chunks: Vec<Bytes> = stream.try_collect().await.expect(sql);
    chunks
        .iter()
        .map(|b| String::from_utf8(b.to_vec()).expect("utf8"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_and_out_in_text_and_csv() {
    let server = Server::start();
    let c = server.client().await;
    rows(
        &c,
        "CREATE TABLE people (id bigint PRIMARY KEY, name text NOT NULL, note text, score int DEFAULT 7)",
    )
    .await;
    // Text: tabs, \N for NULL, backslash escapes; a column list leaves the
    // rest to their defaults.
    let n = copy_in(
        &c,
        "COPY people (id, name, note) FROM STDIN",
        "1\tada\t\\N\n2\tbob\ttab\\there\n",
    )
    .await;
    assert_eq!(n, 2);
    // CSV with a header: a quoted empty field is an empty string, an
    // unquoted one NULL.
    let n = copy_in(
        &c,
        "COPY people FROM STDIN WITH (FORMAT csv, HEADER true)",
        "id,name,note,score\n3,\"cy, d\",\"\",1\n4,dan,,\n",
    )
    .await;
    assert_eq!(n, 2);
    assert_eq!(
        rows(
            &c,
            "SELECT id, name, coalesce(note, '<null>'), coalesce(score, -1) FROM people ORDER BY id"
        )
        .await,
        vec![
            vec!["1", "ada", "<null>", "7"],
            vec!["2", "bob", "tab\there", "7"],
            vec!["3", "cy, d", "", "1"],
            vec!["4", "dan", "<null>", "-1"],
        ]
    );
    assert_eq!(
        copy_out(&c, "COPY people (id, note) TO STDOUT").await,
        "1\t\\N\n2\ttab\\there\n3\t\n4\t\\N\n"
    );
    assert_eq!(
        copy_out(
            &c,
            "COPY (SELECT id, name FROM people WHERE id > 2 ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)"
        )
        .await,
        "id,name\n3,\"cy, d\"\n4,dan\n"
    );

    // A bad line rejects the whole COPY, and nothing of it is written.
    let sink = c
        .copy_in("COPY people FROM STDIN WITH (FORMAT csv)")
        .await
        .expect("copy");
    futures::pin_mut!(sink);
    sink.send(Bytes::from_static(b"5,eve,,1\n6,fay,,not-a-number\n"))
        .await
        .expect("send");
    let e = sink.finish().await.expect_err("a bad number");
    let db = e.as_db_error().expect("a server error");
    assert_eq!(db.code().code(), "22P02", "{e}");
    // Where it is, as Postgres's context says.
    assert!(
        db.message()
            .contains("COPY people, line 2, column score: \"not-a-number\""),
        "{e}"
    );
    let sink = c.copy_in("COPY people FROM STDIN").await.expect("copy");
    futures::pin_mut!(sink);
    sink.send(Bytes::from_static(b"7\tgus\n"))
        .await
        .expect("send");
    let e = sink.finish().await.expect_err("a short line");
    assert_eq!(
        e.as_db_error().map(|d| d.code().code()),
        Some("22P04"),
        "{e}"
    );
    assert_eq!(one(&c, "SELECT count(*) FROM people").await, "4");

    // What COPY cannot do is refused before any data is sent.
    expect_error(&c, "COPY people FROM '/etc/passwd'", "0A000", "file").await;
    expect_error(
        &c,
        "COPY people TO STDOUT WITH (FORMAT binary)",
        "0A000",
        "binary",
    )
    .await;
    expect_error(&c, "COPY nowhere FROM STDIN", "42P01", "nowhere").await;
    rows(
        &c,
        "CREATE MATERIALIZED VIEW named AS SELECT name FROM people",
    )
    .await;
    expect_error(&c, "COPY named FROM STDIN", "42809", "named").await;
    assert_eq!(one(&c, "SELECT 1").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_request_stops_the_running_query_only() {
    let server = Server::start();
    let c = server.client().await;
    let token = c.cancel_token();
    let canceller = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        token
            .cancel_query(tokio_postgres::NoTls)
            .await
            .expect("cancel");
    });
    let e = c
        .simple_query("SELECT count(*) FROM generate_series(1, 10000000000)")
        .await
        .expect_err("cancelled");
    canceller.await.expect("canceller");
    let db = e.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "57014");
    assert!(db.message().contains("user request"), "{}", db.message());
    // The connection goes on, and a cancel with no query running is a
    // no-op. (A cancel request is answered by nothing, so the client
    // cannot know when the server has seen it; pg_cancel_backend has
    // signalled when it returns.)
    assert_eq!(one(&c, "SELECT 1").await, "1");
    let pid = one(&c, "SELECT pg_backend_pid()").await;
    let other = server.client().await;
    assert_eq!(
        one(&other, &format!("SELECT pg_cancel_backend({pid})")).await,
        "t"
    );
    assert_eq!(one(&c, "SELECT 2").await, "2");
    // pg_backend_pid() is the pid of the key a cancel names.
    let pid: i32 = one(&c, "SELECT pg_backend_pid()").await.parse().unwrap();
    assert!(pid > 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_over_queries_fetch_move_and_hold() {
    let server = Server::start();
    let c = server.client().await;
    rows(&c, "CREATE TABLE n (x int)").await;
    rows(&c, "INSERT INTO n SELECT * FROM generate_series(1, 10)").await;
    rows(&c, "BEGIN").await;
    rows(&c, "DECLARE c CURSOR FOR SELECT x FROM n ORDER BY x").await;
    // The cursor reads the snapshot of its DECLARE.
    rows(&c, "INSERT INTO n VALUES (11)").await;
    let got = |r: Vec<Vec<String>>| r.into_iter().map(|mut r| r.remove(0)).collect::<Vec<_>>();
    assert_eq!(got(rows(&c, "FETCH 3 FROM c").await), vec!["1", "2", "3"]);
    let moved = c.simple_query("MOVE FORWARD 2 IN c").await.expect("move");
    assert!(matches!(
        moved.last(),
        Some(tokio_postgres::SimpleQueryMessage::CommandComplete(2))
    ));
    assert_eq!(got(rows(&c, "FETCH NEXT FROM c").await), vec!["6"]);
    assert_eq!(
        got(rows(&c, "FETCH ALL FROM c").await),
        vec!["7", "8", "9", "10"]
    );
    assert!(rows(&c, "FETCH c").await.is_empty());
    rows(&c, "DECLARE h CURSOR WITH HOLD FOR SELECT count(*) FROM n").await;
    rows(&c, "COMMIT").await;
    // COMMIT closed the cursor without HOLD, not the one with it.
    expect_error(&c, "FETCH c", "34000", "\"c\"").await;
    assert_eq!(got(rows(&c, "FETCH h").await), vec!["11"]);
    rows(&c, "CLOSE h").await;
    expect_error(&c, "CLOSE h", "34000", "\"h\"").await;
    expect_error(
        &c,
        "DECLARE s SCROLL CURSOR FOR SELECT 1",
        "0A000",
        "SCROLL",
    )
    .await;

    // Through the extended protocol, as drivers fetch: FETCH is described
    // by its cursor.
    rows(
        &c,
        "DECLARE e CURSOR WITH HOLD FOR SELECT x, x + x AS y FROM n ORDER BY x",
    )
    .await;
    let fetched = c.query("FETCH 2 FROM e", &[]).await.expect("fetch");
    let pairs: Vec<(i32, i32)> = fetched.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert_eq!(pairs, vec![(1, 2), (2, 4)]);
    assert_eq!(fetched[0].columns()[1].name(), "y");
}

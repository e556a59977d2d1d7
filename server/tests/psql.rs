//! The user's door: Debian's `psql` (installed by `scripts/test`) against a
//! real server, in a session like the README's.

mod common;

use std::process::Command;

#[test]
fn psql_session_as_in_the_readme() {
    let server = common::Server::start();
    let script = "
CREATE TABLE orders (id int PRIMARY KEY, customer text, amount numeric(10,2));
INSERT INTO orders VALUES (1, 'ann', 10.50), (2, 'bob', 4.00), (3, 'ann', 7.25);
CREATE MATERIALIZED VIEW spend AS
  SELECT customer, count(*) AS orders, sum(amount) AS total FROM orders GROUP BY customer;
SELECT * FROM spend ORDER BY customer;
DELETE FROM orders WHERE id = 1;
FLUSH;
SELECT * FROM spend ORDER BY customer;
SELECT * FROM nowhere;
SHOW MATERIALIZED VIEWS;
";
    let out = Command::new("psql")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &server.port.to_string(),
            "-U",
            "weir",
            "-d",
            "weir",
            "-X",
            "-A",
            "-F",
            "|",
        ])
        .arg("-c")
        .arg("\\set ON_ERROR_STOP off")
        .args(
            script
                .split(';')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .flat_map(|s| ["-c".to_string(), format!("{s};")]),
        )
        .output()
        .expect("psql is installed by scripts/test (postgresql-client)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = "CREATE TABLE
INSERT 0 3
CREATE MATERIALIZED VIEW
customer|orders|total
ann|2|17.75
bob|1|4.00
(2 rows)
DELETE 1
FLUSH
customer|orders|total
ann|1|7.25
bob|1|4.00
(2 rows)
Name
spend
(1 row)
";
    assert_eq!(stdout, expected, "stderr: {stderr}");
    assert!(
        stderr.contains("ERROR:  relation \"nowhere\" does not exist"),
        "the error reaches psql: {stderr}"
    );
}

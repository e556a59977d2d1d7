//! Runs every `.slt` file in `sql-tests/` against a fresh `weir playground`
//! over pgwire, with the `sqllogictest` crate.

use crate::common;

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType, Runner};

/// An error with its SQLSTATE, as `statement error (42P01)` expects.
#[derive(Debug)]
struct PgError {
    code: Option<String>,
    message: String,
}

impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {}",
            self.code.as_deref().unwrap_or("?????"),
            self.message
        )
    }
}

impl std::error::Error for PgError {}

struct Weir {
    client: tokio_postgres::Client,
}

#[async_trait]
impl AsyncDB for Weir {
    type Error = PgError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, PgError> {
        let messages = self.client.simple_query(sql).await.map_err(|e| PgError {
            code: e.code().map(|c| c.code().to_string()),
            message: e
                .as_db_error()
                .map(|d| d.message().to_string())
                .unwrap_or_else(|| e.to_string()),
        })?;
        let mut rows = Vec::new();
        let mut columns = None;
        let mut count = 0;
        for m in messages {
            match m {
                tokio_postgres::SimpleQueryMessage::Row(r) => {
                    columns = Some(r.len());
                    rows.push(
                        (0..r.len())
                            .map(|i| match r.get(i) {
                                None => "NULL".to_string(),
                                Some("") => "(empty)".to_string(),
                                Some(v) => v.to_string(),
                            })
                            .collect(),
                    );
                }
                tokio_postgres::SimpleQueryMessage::RowDescription(d) => columns = Some(d.len()),
                tokio_postgres::SimpleQueryMessage::CommandComplete(n) => count = n,
                _ => {}
            }
        }
        match columns {
            Some(n) => Ok(DBOutput::Rows {
                types: vec![DefaultColumnType::Any; n],
                rows,
            }),
            None => Ok(DBOutput::StatementComplete(count)),
        }
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "weir"
    }

    fn error_sql_state(err: &PgError) -> Option<String> {
        err.code.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_logic_tests() {
    let files = common::slt_files();
    let mut failures = Vec::new();
    for file in &files {
        let server = common::Server::start();
        let url = server.url();
        let mut runner = Runner::new(move || {
            let url = url.clone();
            async move {
                let (client, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls)
                    .await
                    .map_err(|e| PgError {
                        code: None,
                        message: e.to_string(),
                    })?;
                tokio::spawn(async move {
                    let _ = conn.await;
                });
                Ok(Weir { client })
            }
        });
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        match runner.run_file_async(file).await {
            Ok(()) => println!("ok   {name}"),
            Err(e) => {
                println!("FAIL {name}\n{e}");
                println!("server log (last lines):\n{}", server.log_tail(20));
                failures.push(format!("{name}: {e}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} .slt files failed:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n\n")
    );
}

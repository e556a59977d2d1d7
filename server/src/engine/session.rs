//! Per-connection settings.

use std::collections::{BTreeMap, HashMap};

use crate::engine::cursor::Cursor;
use crate::engine::transaction::Transaction;
use crate::error::{Result, ServerError};
use crate::sql::settings::{WEIR_SETTINGS, parse_bool, parse_duration_us};

/// What `SET` changes for one connection, and its cursors.
#[derive(Debug)]
pub struct Session {
    /// Parallelism of the stateful operators of views created later.
    pub streaming_parallelism: usize,
    /// What `RESET streaming_parallelism` returns to: the server's default.
    default_parallelism: usize,
    /// Whether views created later may chain operators.
    pub streaming_chaining: bool,
    /// `checkpoint_mode` of views created from now on.
    pub checkpoint_mode: planner::spec::CheckpointMode,
    /// `streaming_state_ttl` of views created from now on (microseconds;
    /// `None`: state is kept as long as the results need it).
    pub state_ttl_us: Option<i64>,
    /// `state_backend` of views created from now on (`None`: `heap` for a
    /// view whose state is provably small, else `rocksdb`).
    pub state_backend: Option<planner::spec::StateBackend>,
    /// Other settings, kept so that `SHOW` answers what `SET` said.
    pub vars: BTreeMap<String, String>,
    /// The open cursors (see [`crate::engine::cursor`]).
    pub cursors: HashMap<String, Cursor>,
    /// The user the connection logged in as.
    pub user: String,
    /// The number `pg_backend_pid()` answers, unique per connection.
    pub backend_pid: i32,
    /// The open transaction block, between `BEGIN` and its end.
    pub tx: Option<Transaction>,
}

/// Backend ids, one per connection since the server started.
static NEXT_BACKEND_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

impl Session {
    /// What the catalog functions of a statement know of this session.
    pub fn catalog_info(&self) -> crate::catalog::pg_catalog::SessionInfo {
        crate::catalog::pg_catalog::SessionInfo::new(&self.user, self.settings(), self.backend_pid)
    }

    /// The schemas of this session's `search_path` that exist in `catalog`.
    pub fn search_path(
        &self,
        catalog: &crate::catalog::Catalog,
    ) -> crate::catalog::search_path::SearchPath {
        let text = self.get("search_path").unwrap_or_default();
        crate::catalog::search_path::SearchPath::new(&text, &self.user, catalog)
    }

    pub fn new(default_parallelism: usize) -> Self {
        let vars = crate::sql::settings::defaults()
            .map(|(k, v)| (k, v.to_string()))
            .collect();
        Self {
            streaming_parallelism: default_parallelism,
            default_parallelism,
            streaming_chaining: true,
            checkpoint_mode: Default::default(),
            state_ttl_us: None,
            state_backend: None,
            vars,
            cursors: HashMap::new(),
            user: crate::SUPERUSER.to_string(),
            backend_pid: NEXT_BACKEND_PID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            tx: None,
        }
    }

    /// `RESET name`: the value the session started with.
    pub fn reset(&mut self, name: &str) -> Result<()> {
        let name = crate::sql::settings::canonical_name(name);
        match name.as_str() {
            "streaming_parallelism" => self.streaming_parallelism = self.default_parallelism,
            "streaming_chaining" => self.streaming_chaining = true,
            "checkpoint_mode" => self.checkpoint_mode = Default::default(),
            "streaming_state_ttl" => self.state_ttl_us = None,
            "state_backend" => self.state_backend = None,
            _ => match crate::sql::settings::default_of(&name) {
                Some(default) => {
                    self.vars.insert(name, default.to_string());
                }
                None if name.contains('.') => {
                    self.vars.remove(&name);
                }
                None => {
                    return Err(ServerError::UndefinedObject(format!(
                        "unrecognized configuration parameter \"{name}\""
                    )));
                }
            },
        }
        Ok(())
    }

    /// The columns cursor `name` returns, if it is open.
    pub fn cursor_schema(&self, name: &str) -> Option<datafusion::arrow::datatypes::SchemaRef> {
        self.cursors.get(name).map(Cursor::schema)
    }

    /// `RESET ALL`.
    pub fn reset_all(&mut self) {
        let fresh = Session::new(self.default_parallelism);
        self.streaming_parallelism = fresh.streaming_parallelism;
        self.streaming_chaining = fresh.streaming_chaining;
        self.checkpoint_mode = fresh.checkpoint_mode;
        self.state_ttl_us = fresh.state_ttl_us;
        self.state_backend = fresh.state_backend;
        self.vars = fresh.vars;
    }

    /// Whether a transaction block is open.
    pub fn in_transaction_block(&self) -> bool {
        self.tx.is_some()
    }

    /// The client saw an error inside the open transaction block (one the
    /// front end reported, before the statement reached the engine).
    pub fn transaction_failed(&mut self) {
        crate::engine::transaction::failed(self);
    }

    /// `statement_timeout`, if one is set.
    pub fn statement_timeout(&self) -> Option<std::time::Duration> {
        let ms = crate::sql::settings::millis(self.vars.get("statement_timeout")?)?;
        (ms > 0).then(|| std::time::Duration::from_millis(ms as u64))
    }

    /// Every setting with its value, as `SHOW ALL` and `pg_settings` list
    /// them.
    pub fn settings(&self) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .vars
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for name in WEIR_SETTINGS {
            if let Ok(v) = self.get(name) {
                all.push((name.to_string(), v));
            }
        }
        all.sort();
        all
    }

    /// `SET name = value`.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        let name = crate::sql::settings::canonical_name(name);
        match name.as_str() {
            "streaming_parallelism" => {
                let p: usize = value.parse().ok().filter(|p| (1..=128).contains(p)).ok_or_else(|| {
                    ServerError::InvalidParameter(format!(
                        "invalid value for parameter \"streaming_parallelism\": \"{value}\" (an integer from 1 to 128)"
                    ))
                })?;
                self.streaming_parallelism = p;
            }
            "streaming_chaining" => {
                self.streaming_chaining = parse_bool(value).ok_or_else(|| {
                    ServerError::InvalidParameter(format!(
                        "parameter \"streaming_chaining\" requires a Boolean value, not \"{value}\""
                    ))
                })?;
            }
            "checkpoint_mode" => {
                self.checkpoint_mode =
                    planner::spec::CheckpointMode::parse(value).ok_or_else(|| {
                        ServerError::InvalidParameter(format!(
                            "invalid value for parameter \"checkpoint_mode\": \"{value}\" (exactly_once or at_least_once)"
                        ))
                    })?;
            }
            "streaming_state_ttl" => {
                self.state_ttl_us = parse_duration_us(value).ok_or_else(|| {
                    ServerError::InvalidParameter(format!(
                        "invalid value for parameter \"streaming_state_ttl\": \"{value}\" (off, or a time such as '1 hour', '30 min', '90 s')"
                    ))
                })?;
            }
            "state_backend" => {
                self.state_backend = match value.trim().to_ascii_lowercase().as_str() {
                    "default" => None,
                    v => Some(planner::spec::StateBackend::parse(v).ok_or_else(|| {
                        ServerError::InvalidParameter(format!(
                            "invalid value for parameter \"state_backend\": \"{value}\" (rocksdb, heap or default)"
                        ))
                    })?),
                };
            }
            _ => {
                let value = crate::sql::settings::check(&name, value)?;
                self.vars.insert(name, value);
            }
        }
        Ok(())
    }

    /// `SHOW name`.
    pub fn get(&self, name: &str) -> Result<String> {
        let name = crate::sql::settings::canonical_name(name);
        match name.as_str() {
            "streaming_parallelism" => Ok(self.streaming_parallelism.to_string()),
            "streaming_chaining" => Ok(if self.streaming_chaining { "on" } else { "off" }.into()),
            "checkpoint_mode" => Ok(self.checkpoint_mode.name().into()),
            "streaming_state_ttl" => Ok(match self.state_ttl_us {
                Some(us) => format!("{}s", us / 1_000_000),
                None => "off".into(),
            }),
            "state_backend" => Ok(self
                .state_backend
                .map_or("default", planner::spec::StateBackend::name)
                .into()),
            _ => self.vars.get(&name).cloned().ok_or_else(|| {
                ServerError::UndefinedObject(format!(
                    "unrecognized configuration parameter \"{name}\""
                ))
            }),
        }
    }
}

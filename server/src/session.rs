//! Per-connection settings.

use std::collections::{BTreeMap, HashMap};

use crate::cursor::Cursor;
use crate::error::{Result, ServerError};

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
    /// The open cursors (see [`crate::cursor`]).
    pub cursors: HashMap<String, Cursor>,
    /// The user the connection logged in as.
    pub user: String,
    /// The number `pg_backend_pid()` answers, unique per connection.
    pub backend_pid: i32,
}

/// Weir's own settings, kept in fields of their own.
pub const WEIR_SETTINGS: &[&str] = &[
    "streaming_parallelism",
    "streaming_chaining",
    "checkpoint_mode",
    "streaming_state_ttl",
    "state_backend",
];

/// Backend ids, one per connection since the server started.
static NEXT_BACKEND_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(1);

impl Session {
    pub fn new(default_parallelism: usize) -> Self {
        let vars = crate::settings::defaults()
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
            user: crate::pg::USER.to_string(),
            backend_pid: NEXT_BACKEND_PID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// `RESET name`: the value the session started with.
    pub fn reset(&mut self, name: &str) -> Result<()> {
        let name = crate::settings::canonical_name(name);
        match name.as_str() {
            "streaming_parallelism" => self.streaming_parallelism = self.default_parallelism,
            "streaming_chaining" => self.streaming_chaining = true,
            "checkpoint_mode" => self.checkpoint_mode = Default::default(),
            "streaming_state_ttl" => self.state_ttl_us = None,
            "state_backend" => self.state_backend = None,
            _ => match crate::settings::default_of(&name) {
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

    /// `statement_timeout`, if one is set.
    pub fn statement_timeout(&self) -> Option<std::time::Duration> {
        let ms = crate::settings::millis(self.vars.get("statement_timeout")?)?;
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
        let name = crate::settings::canonical_name(name);
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
                let value = crate::settings::check(&name, value)?;
                self.vars.insert(name, value);
            }
        }
        Ok(())
    }

    /// `SHOW name`.
    pub fn get(&self, name: &str) -> Result<String> {
        let name = crate::settings::canonical_name(name);
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

/// `off` or `0` (no TTL), or a number and a unit (`90 s`, `30 min`, `1 hour`,
/// `2 days`; seconds without one): `Some(None)` or `Some(Some(µs))`.
pub(crate) fn parse_duration_us(v: &str) -> Option<Option<i64>> {
    let v = v.trim().to_lowercase();
    if v == "off" || v == "0" {
        return Some(None);
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: i64 = v[..split].trim().parse().ok().filter(|n| *n > 0)?;
    let unit_s = match v[split..].trim() {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3_600,
        "d" | "day" | "days" => 86_400,
        _ => return None,
    };
    n.checked_mul(unit_s)?.checked_mul(1_000_000).map(Some)
}

pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v.to_lowercase().as_str() {
        "on" | "true" | "yes" | "1" | "t" => Some(true),
        "off" | "false" | "no" | "0" | "f" => Some(false),
        _ => None,
    }
}

//! What `pg_stat_activity` shows: one row per logged-in connection, which
//! the front end keeps up to date as its statements start and end.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// One connection, as `pg_stat_activity` describes it.
#[derive(Debug, Clone)]
pub struct Backend {
    pub pid: i32,
    pub user: String,
    pub user_oid: i32,
    pub application_name: String,
    pub client: SocketAddr,
    pub backend_start: SystemTime,
    /// When the running (or last) statement started.
    pub query_start: Option<SystemTime>,
    pub state_change: SystemTime,
    /// `active` while a statement runs, `idle` between statements.
    pub state: &'static str,
    /// The running statement's text, or the last one's.
    pub query: String,
}

/// Every logged-in connection, by backend pid.
#[derive(Debug, Default)]
pub struct Activity(Mutex<BTreeMap<i32, Backend>>);

impl Activity {
    fn with(&self, pid: i32, f: impl FnOnce(&mut Backend)) {
        if let Some(b) = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(&pid)
        {
            f(b);
        }
    }

    /// Every connection now, by pid.
    pub fn all(&self) -> Vec<Backend> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }
}

/// A connection's row, taken out when the connection ends.
#[derive(Debug)]
pub struct Entry {
    db: Arc<crate::engine::Database>,
    pid: i32,
}

impl Entry {
    /// Adds `backend`'s row.
    pub fn register(db: &Arc<crate::engine::Database>, backend: Backend) -> Entry {
        let pid = backend.pid;
        db.activity
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, backend);
        Entry {
            db: db.clone(),
            pid,
        }
    }

    /// A statement starts.
    pub fn active(&self, query: &str) {
        let now = SystemTime::now();
        self.db.activity.with(self.pid, |b| {
            b.state = "active";
            b.query = query.to_string();
            b.query_start = Some(now);
            b.state_change = now;
        });
    }

    /// The statement has ended.
    pub fn idle(&self) {
        self.db.activity.with(self.pid, |b| {
            b.state = "idle";
            b.state_change = SystemTime::now();
        });
    }

    pub fn set_application_name(&self, name: &str) {
        self.db.activity.with(self.pid, |b| {
            if b.application_name != name {
                b.application_name = name.to_string();
            }
        });
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.db
            .activity
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.pid);
    }
}

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
    /// How `pg_cancel_backend` and `pg_terminate_backend` reach it.
    pub signals: Signals,
}

/// A connection's two signals, as Postgres's SIGINT and SIGTERM: cancel the
/// running statement; end the connection.
#[derive(Debug, Clone)]
pub struct Signals {
    /// The cancel a `CancelRequest` fires too.
    pub cancel: Arc<pgwire::api::ConnectionHandle>,
    /// The connection loop closes the connection when this is notified.
    pub terminate: Arc<tokio::sync::Notify>,
}

/// What a signal did (`pg_cancel_backend` answers `true` for `Sent`).
#[derive(Debug, PartialEq, Eq)]
pub enum Signalled {
    Sent,
    NoSuchBackend,
    /// The role may not signal that backend; the message says why.
    NotAllowed(String),
}

/// Every logged-in connection, by backend pid.
#[derive(Debug, Default)]
pub struct Activity(Arc<Mutex<BTreeMap<i32, Backend>>>);

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

    /// Signals backend `pid` for `role` (a superuser may signal any
    /// backend; anyone else only backends of their own role that are not
    /// a superuser's, as in Postgres), cancelling its statement and, with
    /// `terminate`, ending its connection.
    pub fn signal(
        &self,
        pid: i32,
        role: &crate::catalog::roles::Role,
        roles: &[crate::catalog::roles::Role],
        terminate: bool,
    ) -> Signalled {
        let Some(target) = self
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pid)
            .cloned()
        else {
            return Signalled::NoSuchBackend;
        };
        if !role.superuser {
            let target_super = roles.iter().any(|r| r.name == target.user && r.superuser);
            let denied = if terminate {
                "permission denied to terminate process"
            } else {
                "permission denied to cancel query"
            };
            if target_super {
                return Signalled::NotAllowed(format!(
                    "{denied}: only superusers may signal a superuser's backend"
                ));
            }
            if target.user != role.name {
                return Signalled::NotAllowed(format!(
                    "{denied}: only superusers and the backend's own role may signal it"
                ));
            }
        }
        let signals = target.signals;
        // Fired before this returns, so that a backend signalled while
        // idle is not cancelled in its next statement instead: the handle
        // holds the sender of the statement running (or of the last one,
        // whose receiver is gone). Its lock is held only to swap senders.
        futures::executor::block_on(signals.cancel.cancel());
        if terminate {
            signals.terminate.notify_one();
        }
        Signalled::Sent
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
    activity: Activity,
    pid: i32,
}

impl Entry {
    /// Adds `backend`'s row.
    pub fn register(activity: &Activity, backend: Backend) -> Entry {
        let pid = backend.pid;
        activity
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(pid, backend);
        Entry {
            activity: Activity(activity.0.clone()),
            pid,
        }
    }

    /// A statement starts.
    pub fn active(&self, query: &str) {
        let now = SystemTime::now();
        self.activity.with(self.pid, |b| {
            b.state = "active";
            b.query = query.to_string();
            b.query_start = Some(now);
            b.state_change = now;
        });
    }

    /// The statement has ended.
    pub fn idle(&self) {
        self.activity.with(self.pid, |b| {
            b.state = "idle";
            b.state_change = SystemTime::now();
        });
    }

    pub fn set_application_name(&self, name: &str) {
        self.activity.with(self.pid, |b| {
            if b.application_name != name {
                b.application_name = name.to_string();
            }
        });
    }
}

impl Drop for Entry {
    fn drop(&mut self) {
        self.activity
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.pid);
    }
}

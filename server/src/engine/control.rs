//! A running statement: the thread it runs on, and how it is stopped.
//!
//! Every statement runs on a thread of its own (one of tokio's blocking
//! threads, driving the statement's future with the runtime's handle), not
//! on the runtime's worker threads. Planning a large statement is long,
//! synchronous work; on a worker it would hold up every task queued behind
//! it — other clients' statements, the in-process TaskManager's heartbeats
//! and the dataflow itself. The threads have large stacks (see
//! [`STACK_BYTES`] and `crate::sql::depth`).
//!
//! A statement can be stopped — by a cancel request, `pg_cancel_backend`,
//! `pg_terminate_backend`, `statement_timeout` or its client going away —
//! until it reaches its **commit point** ([`Control::commit`]), where it
//! starts to change what others see (a table write, a catalog entry).
//! Before that point stopping it drops it at its next `await`, which leaves
//! nothing behind; from that point on it runs to its end, so that nothing
//! is left half done, and the stop is ignored as Postgres ignores a cancel
//! that arrives after the commit.

use std::future::Future;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Result, ServerError};

/// The stack of every thread that runs statements (the dataflow's threads
/// have the same, `cluster::TASK_STACK_BYTES`). Only the pages a deep
/// statement touches are ever committed.
pub const STACK_BYTES: usize = cluster::TASK_STACK_BYTES;

const RUNNING: u8 = 0;
const COMMITTING: u8 = 1;
const STOPPED: u8 = 2;

/// The stop switch of one statement.
#[derive(Debug)]
pub struct Control {
    state: AtomicU8,
    /// Why it was stopped.
    reason: Mutex<Option<ServerError>>,
    stopped: tokio::sync::Notify,
}

impl Default for Control {
    fn default() -> Self {
        Self {
            state: AtomicU8::new(RUNNING),
            reason: Mutex::new(None),
            stopped: tokio::sync::Notify::new(),
        }
    }
}

impl Control {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The statement's commit point: from here on it cannot be stopped.
    /// Fails with the reason if it was stopped already.
    pub fn commit(&self) -> Result<()> {
        match self
            .state
            .compare_exchange(RUNNING, COMMITTING, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) | Err(COMMITTING) => Ok(()),
            Err(_) => Err(self.reason()),
        }
    }

    /// Stops the statement unless it has reached its commit point; says
    /// whether it did.
    pub fn stop(&self, reason: ServerError) -> bool {
        let mut why = self.reason.lock().unwrap_or_else(|e| e.into_inner());
        match self
            .state
            .compare_exchange(RUNNING, STOPPED, Ordering::SeqCst, Ordering::SeqCst)
        {
            Ok(_) => {
                *why = Some(reason);
                drop(why);
                self.stopped.notify_waiters();
                true
            }
            Err(_) => false,
        }
    }

    fn is_stopped(&self) -> bool {
        self.state.load(Ordering::SeqCst) == STOPPED
    }

    fn reason(&self) -> ServerError {
        self.reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .unwrap_or_else(|| {
                ServerError::QueryCanceled("canceling statement due to user request".into())
            })
    }

    /// Resolves once the statement has been stopped.
    async fn wait_stopped(&self) {
        loop {
            let notified = self.stopped.notified();
            if self.is_stopped() {
                return;
            }
            notified.await;
        }
    }
}

/// Stops a statement when whoever waits for it goes away — the
/// connection's task ends when its client closes the socket, dropping the
/// wait, while the statement's thread would run on. Once the statement
/// has ended, stopping it changes nothing.
pub struct StopOnDrop(pub Arc<Control>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.stop(ServerError::QueryCanceled(
            "canceling statement: the client closed the connection".into(),
        ));
    }
}

tokio::task_local! {
    /// The control of the statement running in this task.
    static CONTROL: Arc<Control>;
}

/// The running statement's commit point (see [`Control::commit`]); a no-op
/// outside a statement (start-up, background work).
pub fn commit_point() -> Result<()> {
    CONTROL.try_with(|c| c.commit()).unwrap_or(Ok(()))
}

/// Runs `statement` on a thread of its own until it ends or `control`
/// stops it. A panic becomes an internal error.
pub async fn run<F, T>(control: Arc<Control>, statement: F) -> Result<T>
where
    F: Future<Output = Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let handle = tokio::runtime::Handle::current();
    let thread = tokio::task::spawn_blocking(move || {
        handle.block_on(async move {
            use futures::FutureExt;
            let statement = std::panic::AssertUnwindSafe(CONTROL.scope(control.clone(), statement))
                .catch_unwind();
            tokio::select! {
                biased;
                outcome = statement => match outcome {
                    Ok(r) => r,
                    Err(panic) => {
                        let msg = crate::error::panic_message(&panic);
                        tracing::error!(panic = %msg, "statement panicked");
                        Err(ServerError::Internal(format!("internal error: {msg}")))
                    }
                },
                () = control.wait_stopped() => Err(control.reason()),
            }
        })
    });
    match thread.await {
        Ok(r) => r,
        Err(e) => Err(ServerError::Internal(format!(
            "statement thread failed: {e}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stops_before_the_commit_point_only() {
        let c = Control::new();
        assert!(c.stop(ServerError::QueryCanceled("x".into())));
        assert!(c.commit().is_err());

        let c = Control::new();
        c.commit().unwrap();
        assert!(!c.stop(ServerError::QueryCanceled("x".into())));
        c.commit().unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stopped_statement_ends_at_its_next_await() {
        let c = Control::new();
        let run = tokio::spawn(run(c.clone(), async {
            tokio::time::sleep(std::time::Duration::from_secs(3600)).await;
            Ok(())
        }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        c.stop(ServerError::QueryCanceled("stopped".into()));
        let e = run.await.unwrap().unwrap_err();
        assert_eq!(e.to_string(), "stopped");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_committing_statement_runs_to_its_end() {
        let c = Control::new();
        let inner = c.clone();
        let run = tokio::spawn(run(c.clone(), async move {
            inner.commit()?;
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            Ok(7)
        }));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!c.stop(ServerError::QueryCanceled("late".into())));
        assert_eq!(run.await.unwrap().unwrap(), 7);
    }
}

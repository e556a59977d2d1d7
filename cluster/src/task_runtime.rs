//! The threads StreamTasks run on.
//!
//! Flink runs each task on a thread of its own, apart from the RPC and
//! heartbeat threads of its TaskManager. Weir's tasks are tokio tasks on a
//! runtime of their own, with a worker thread per core: a task busy with a
//! large chunk holds up other tasks of its TaskManager only, never the
//! heartbeats, the cluster RPC or — in a playground, where the TaskManager
//! shares the process with the SQL front end — the clients' connections,
//! which run on the process's main runtime. The operating system shares
//! the cores among all of them.
//!
//! The runtime lives as long as the process (a runtime cannot be dropped
//! from within async code). Its threads have large stacks: operators
//! evaluate expression trees recursively, as deep as a statement may nest.

use std::sync::OnceLock;

/// The stack of a task thread. Only the pages used are ever committed.
pub const STACK_BYTES: usize = 64 << 20;

/// The runtime tasks are spawned on.
pub(crate) fn handle() -> tokio::runtime::Handle {
    static RUNTIME: OnceLock<Option<tokio::runtime::Runtime>> = OnceLock::new();
    let runtime = RUNTIME.get_or_init(|| {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        match tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("weir-task")
            .thread_stack_size(STACK_BYTES)
            .enable_all()
            .build()
        {
            Ok(rt) => Some(rt),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the task runtime; tasks share the main one");
                None
            }
        }
    });
    match runtime {
        Some(rt) => rt.handle().clone(),
        None => tokio::runtime::Handle::current(),
    }
}

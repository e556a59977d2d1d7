//! Consistency: a reader never sees half of one statement's effect on a
//! view, even when the view's rows live in several parallel subtasks.

use crate::common;

use common::Server;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transfers_never_show_half_done() {
    let server = Server::start();
    common::transfers_never_show_half_done(server.port).await;
}

//! [`CatalogView`]: what the catalog layer reads of the running database.
//!
//! `pg_catalog`, `information_schema` and `weir_catalog` answer from Weir's
//! catalog, its roles, the connections logged in, the cluster's jobs and
//! the objects set aside at start-up. They read those through this trait,
//! which the engine's `Database` implements, so that nothing here reaches
//! into statement dispatch, sessions or the wire.

use std::sync::Arc;
use std::time::SystemTime;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;

use crate::catalog::Catalog;
use crate::catalog::activity::Activity;
use crate::catalog::restore_errors::RestoreErrors;
use crate::catalog::roles::Roles;
use crate::error::Result;

/// The database as the catalog tables see it: read-only, except for the
/// signals `pg_cancel_backend` sends through [`Activity`].
#[async_trait]
pub trait CatalogView: Send + Sync + std::fmt::Debug {
    fn catalog(&self) -> &Catalog;
    fn roles(&self) -> &Roles;
    /// The connections logged in now.
    fn activity(&self) -> &Activity;
    /// The jobs, TaskManagers and checkpoints `weir_catalog` shows.
    fn cluster(&self) -> &cluster::Cluster;
    fn restore_errors(&self) -> &RestoreErrors;
    /// When this server started (`pg_postmaster_start_time()`).
    fn started_at(&self) -> SystemTime;
    /// The columns of the view `id` defined by `sql`, as planning it gives
    /// them.
    async fn view_schema(self: Arc<Self>, id: u64, sql: &str) -> Result<SchemaRef>;
}

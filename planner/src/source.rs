//! The table provider that stands for a user table (or a materialized view
//! read through its changelog) while a streaming query is planned. It only carries the table's identity and schema; the lowering
//! finds it behind each `TableScan` and turns it into a source operator.

use std::any::Any;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::logical_expr::{Expr, TableSource};
use datafusion::physical_plan::ExecutionPlan;

/// A table as the streaming planner sees it.
#[derive(Debug, Clone)]
pub struct StreamSourceTable {
    pub table_id: u64,
    pub name: String,
    /// The user-visible columns (a prefix of the stored columns).
    pub schema: SchemaRef,
    /// INSERT only: a stream or an `APPEND ONLY` table.
    pub append_only: bool,
    /// `WATERMARK FOR … AS expr`.
    pub watermark: Option<crate::spec::SourceWatermark>,
    /// Read at its current version (`FOR SYSTEM_TIME AS OF PROCTIME()`):
    /// the versioned side of a temporal join.
    pub versioned: bool,
    /// A source (`CREATE SOURCE`) read through this connector rather than a
    /// stored table.
    pub connector: Option<crate::spec::ConnectorSpec>,
    /// A materialized view read through its changelog (`table_id` is the
    /// view's id, `schema` its columns).
    pub view: bool,
}

#[async_trait]
impl TableProvider for StreamSourceTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    fn table_type(&self) -> TableType {
        TableType::Base
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        _projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Err(DataFusionError::Internal(format!(
            "stream source {} cannot be scanned as a batch table",
            self.name
        )))
    }
}

/// The [`StreamSourceTable`] behind a scan's source, if it is one.
pub fn as_stream_source(source: &Arc<dyn TableSource>) -> Option<StreamSourceTable> {
    let provider = datafusion::datasource::source_as_provider(source).ok()?;
    let any: &dyn Any = provider.as_ref();
    any.downcast_ref::<StreamSourceTable>().cloned()
}

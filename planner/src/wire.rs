//! The JobGraph on the wire: what a JobMaster ships to TaskManagers in
//! every task deployment (Flink serializes its `StreamConfig`s the same
//! way, operators and all).
//!
//! The graph's own shape is serde; the DataFusion parts inside it —
//! expressions, schemas, types — travel as DataFusion's own protobuf
//! (`datafusion-proto`), so that every expression DataFusion can plan can be
//! shipped, functions included.

use std::sync::{Arc, OnceLock};

use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DFSchema, DFSchemaRef};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::Expr;
use datafusion::prelude::SessionContext;
use datafusion_proto::logical_plan::DefaultLogicalExtensionCodec;
use datafusion_proto::logical_plan::from_proto::parse_expr;
use datafusion_proto::logical_plan::to_proto::serialize_expr;
use datafusion_proto::protobuf;
use prost::Message;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _, ser::Error as _};

use crate::job_graph::JobGraph;
use crate::{PlanError, Result};

/// Encodes a JobGraph for a task deployment.
pub fn encode_job_graph(graph: &JobGraph) -> Result<Vec<u8>> {
    serde_json::to_vec(graph).map_err(|e| PlanError::Internal(format!("encode job graph: {e}")))
}

/// Decodes what [`encode_job_graph`] wrote.
pub fn decode_job_graph(bytes: &[u8]) -> Result<JobGraph> {
    serde_json::from_slice(bytes).map_err(|e| PlanError::Internal(format!("decode job graph: {e}")))
}

/// Functions are resolved by name on the receiving side, against the same
/// built-in registry the SQL front end plans with.
fn functions() -> &'static Arc<TaskContext> {
    static CTX: OnceLock<Arc<TaskContext>> = OnceLock::new();
    CTX.get_or_init(|| {
        let ctx = SessionContext::new();
        for f in crate::functions::udfs() {
            ctx.register_udf(f.as_ref().clone());
        }
        ctx.task_ctx()
    })
}

fn to_bytes(expr: &Expr) -> std::result::Result<Vec<u8>, String> {
    serialize_expr(expr, &DefaultLogicalExtensionCodec {})
        .map(|p| p.encode_to_vec())
        .map_err(|e| e.to_string())
}

fn from_bytes(bytes: &[u8]) -> std::result::Result<Expr, String> {
    let proto = protobuf::LogicalExprNode::decode(bytes).map_err(|e| e.to_string())?;
    parse_expr(&proto, functions(), &DefaultLogicalExtensionCodec {}).map_err(|e| e.to_string())
}

/// `#[serde(with = "wire::expr")]`
pub(crate) mod expr {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(e: &Expr, s: S) -> std::result::Result<S::Ok, S::Error> {
        to_bytes(e).map_err(S::Error::custom)?.serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Expr, D::Error> {
        from_bytes(&Vec::<u8>::deserialize(d)?).map_err(D::Error::custom)
    }
}

/// `#[serde(with = "wire::exprs")]`
pub(crate) mod exprs {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        e: &[Expr],
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        e.iter()
            .map(to_bytes)
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(S::Error::custom)?
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Vec<Expr>, D::Error> {
        Vec::<Vec<u8>>::deserialize(d)?
            .iter()
            .map(|b| from_bytes(b))
            .collect::<std::result::Result<_, _>>()
            .map_err(D::Error::custom)
    }
}

/// `#[serde(with = "wire::opt_expr")]`
pub(crate) mod opt_expr {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        e: &Option<Expr>,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        e.as_ref()
            .map(to_bytes)
            .transpose()
            .map_err(S::Error::custom)?
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<Option<Expr>, D::Error> {
        Option::<Vec<u8>>::deserialize(d)?
            .map(|b| from_bytes(&b))
            .transpose()
            .map_err(D::Error::custom)
    }
}

/// `#[serde(with = "wire::schema")]`
pub(crate) mod schema {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        schema: &DFSchemaRef,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        protobuf::DfSchema::try_from(schema)
            .map_err(S::Error::custom)?
            .encode_to_vec()
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<DFSchemaRef, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        let proto = protobuf::DfSchema::decode(bytes.as_slice()).map_err(D::Error::custom)?;
        let schema = DFSchema::try_from(&proto).map_err(D::Error::custom)?;
        Ok(Arc::new(schema))
    }
}

/// `#[serde(with = "wire::data_type")]`
pub(crate) mod data_type {
    use super::*;

    pub(crate) fn serialize<S: Serializer>(
        t: &DataType,
        s: S,
    ) -> std::result::Result<S::Ok, S::Error> {
        protobuf::ArrowType::try_from(t)
            .map_err(S::Error::custom)?
            .encode_to_vec()
            .serialize(s)
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> std::result::Result<DataType, D::Error> {
        let bytes = Vec::<u8>::deserialize(d)?;
        let proto = protobuf::ArrowType::decode(bytes.as_slice()).map_err(D::Error::custom)?;
        DataType::try_from(&proto).map_err(D::Error::custom)
    }
}

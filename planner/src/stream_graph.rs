//! The StreamGraph: one node per operator, edges carrying partitioners —
//! Flink's `StreamGraph`, before any chaining.

use std::fmt::Write;

use datafusion::common::DFSchemaRef;

use crate::spec::{OperatorSpec, Partitioner};

/// One operator.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StreamNode {
    pub id: usize,
    pub spec: OperatorSpec,
    pub parallelism: usize,
    /// The schema of what the node emits.
    #[serde(with = "crate::wire::schema")]
    pub schema: DFSchemaRef,
}

/// A connection from one node's output to one input of another.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StreamEdge {
    pub from: usize,
    pub to: usize,
    /// Which input of `to` (0, or 1 for the right side of a join).
    pub input: usize,
    pub partitioner: Partitioner,
}

/// The operators of one job and how they connect.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct StreamGraph {
    pub nodes: Vec<StreamNode>,
    pub edges: Vec<StreamEdge>,
    /// Whether operator chaining is allowed (`SET streaming_chaining`).
    pub chaining: bool,
    /// How the job's input gates treat barriers (`SET checkpoint_mode`).
    #[serde(default)]
    pub checkpoint_mode: crate::spec::CheckpointMode,
    /// Where the job's operators keep their state (`SET state_backend`).
    #[serde(default)]
    pub state_backend: crate::spec::StateBackend,
}

impl StreamGraph {
    pub fn add_node(
        &mut self,
        spec: OperatorSpec,
        parallelism: usize,
        schema: DFSchemaRef,
    ) -> usize {
        let id = self.nodes.len();
        self.nodes.push(StreamNode {
            id,
            spec,
            parallelism,
            schema,
        });
        id
    }

    pub fn connect(&mut self, from: usize, to: usize, input: usize, partitioner: Partitioner) {
        self.edges.push(StreamEdge {
            from,
            to,
            input,
            partitioner,
        });
    }

    pub fn in_edges(&self, node: usize) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.to == node)
    }

    pub fn out_edges(&self, node: usize) -> impl Iterator<Item = &StreamEdge> {
        self.edges.iter().filter(move |e| e.from == node)
    }

    /// Every state table of every operator.
    pub fn state_tables(&self) -> Vec<u64> {
        self.nodes
            .iter()
            .flat_map(|n| n.spec.state_tables())
            .collect()
    }

    /// Whether the job's state is provably small, whatever its input: every
    /// stateful operator is an aggregate without `GROUP BY` whose values
    /// have a fixed size (one row, a few numbers), or the view's
    /// `Materialize` fed only through such aggregates.
    pub fn state_is_small(&self) -> bool {
        use crate::spec::{AggKind, OperatorSpec as S};
        // Whether each node's output has a bounded number of rows.
        let mut bounded = vec![false; self.nodes.len()];
        // Nodes are added after their inputs.
        for n in &self.nodes {
            let inputs_bounded = self.in_edges(n.id).all(|e| bounded[e.from]);
            bounded[n.id] = match &n.spec {
                S::HashAgg {
                    group_exprs, aggs, ..
                } => {
                    let fixed = aggs.iter().all(|a| {
                        !a.distinct
                            && a.order_by.is_empty()
                            && matches!(
                                a.kind,
                                AggKind::Count
                                    | AggKind::Sum
                                    | AggKind::Avg
                                    | AggKind::BoolAnd
                                    | AggKind::BoolOr
                                    | AggKind::StddevSamp
                                    | AggKind::StddevPop
                                    | AggKind::VarSamp
                                    | AggKind::VarPop
                            )
                    });
                    if !group_exprs.is_empty() || !fixed {
                        return false;
                    }
                    true
                }
                S::Materialize { .. } if inputs_bounded => true,
                S::Materialize { .. } => return false,
                S::Filter { .. } | S::Project { .. } | S::Union { .. } => inputs_bounded,
                S::TableSource { .. }
                | S::ViewSource { .. }
                | S::ConnectorSource { .. }
                | S::Values { .. } => false,
                S::Expand { .. } | S::Unnest { .. } => false,
                S::HashJoin { .. }
                | S::Sink { .. }
                | S::TopN { .. }
                | S::OverWindow { .. }
                | S::TemporalFilter { .. } => return false,
            };
        }
        true
    }

    /// The largest parallelism: the number of slots the job needs.
    pub fn max_parallelism(&self) -> usize {
        self.nodes.iter().map(|n| n.parallelism).max().unwrap_or(1)
    }

    /// EXPLAIN text.
    pub fn explain(&self) -> String {
        let mut out = format!(
            "StreamGraph (state backend: {}):\n",
            self.state_backend.name()
        );
        for n in &self.nodes {
            let _ = write!(
                out,
                "  [{}] {} (parallelism {})",
                n.id, n.spec, n.parallelism
            );
            let inputs: Vec<String> = self
                .in_edges(n.id)
                .map(|e| format!("[{}] {}", e.from, e.partitioner))
                .collect();
            if !inputs.is_empty() {
                let _ = write!(out, " <- {}", inputs.join(", "));
            }
            out.push('\n');
        }
        out
    }
}

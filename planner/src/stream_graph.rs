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

    /// The largest parallelism: the number of slots the job needs.
    pub fn max_parallelism(&self) -> usize {
        self.nodes.iter().map(|n| n.parallelism).max().unwrap_or(1)
    }

    /// EXPLAIN text.
    pub fn explain(&self) -> String {
        let mut out = String::from("StreamGraph:\n");
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

//! The JobGraph: StreamGraph nodes chained into vertices the way Flink's
//! `StreamingJobGraphGenerator` does. An edge is chained when chaining is on,
//! the target has exactly one input, the partitioner is forward and both ends
//! have the same parallelism. Each vertex runs as one StreamTask per subtask,
//! with its operators called directly, no queue in between.

use std::fmt::Write;

use crate::spec::Partitioner;
use crate::stream_graph::{StreamEdge, StreamGraph};

/// One chain of operators.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobVertex {
    pub id: usize,
    /// StreamGraph node ids, head first.
    pub nodes: Vec<usize>,
    pub parallelism: usize,
}

/// A non-chained edge between vertices (an intermediate data set).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobEdge {
    pub from: usize,
    pub to: usize,
    /// Which input of the target vertex's head operator.
    pub input: usize,
    pub partitioner: Partitioner,
}

/// The job as vertices and edges.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct JobGraph {
    pub stream: StreamGraph,
    pub vertices: Vec<JobVertex>,
    pub edges: Vec<JobEdge>,
}

impl JobGraph {
    /// The tables in which the job's operators count rows whose
    /// expressions fail (`executor::errors`).
    pub fn error_tables(&self) -> Vec<u64> {
        self.stream
            .nodes
            .iter()
            .filter_map(|n| match &n.spec {
                crate::spec::OperatorSpec::Filter { errors, .. }
                | crate::spec::OperatorSpec::Project { errors, .. }
                | crate::spec::OperatorSpec::HashAgg { errors, .. }
                | crate::spec::OperatorSpec::HashJoin { errors, .. } => *errors,
                _ => None,
            })
            .collect()
    }
}

/// Flink's `isChainable`.
pub fn is_chainable(graph: &StreamGraph, edge: &StreamEdge) -> bool {
    graph.chaining
        && matches!(edge.partitioner, Partitioner::Forward)
        && graph.in_edges(edge.to).count() == 1
        && graph.nodes[edge.from].parallelism == graph.nodes[edge.to].parallelism
}

impl JobGraph {
    /// Chains `stream` into vertices.
    pub fn from_stream_graph(stream: StreamGraph) -> Self {
        let n = stream.nodes.len();
        // A node heads a chain unless its single input edge is chainable.
        let heads: Vec<usize> = (0..n)
            .filter(|id| !stream.in_edges(*id).any(|e| is_chainable(&stream, e)))
            .collect();
        let mut vertex_of = vec![usize::MAX; n];
        let mut vertices = Vec::with_capacity(heads.len());
        for head in heads {
            let id = vertices.len();
            let mut nodes = vec![head];
            let mut cur = head;
            while let Some(next) = stream
                .out_edges(cur)
                .find(|e| is_chainable(&stream, e))
                .map(|e| e.to)
            {
                nodes.push(next);
                cur = next;
            }
            for node in &nodes {
                vertex_of[*node] = id;
            }
            vertices.push(JobVertex {
                id,
                parallelism: stream.nodes[head].parallelism,
                nodes,
            });
        }
        let edges = stream
            .edges
            .iter()
            .filter(|e| !is_chainable(&stream, e))
            .map(|e| JobEdge {
                from: vertex_of[e.from],
                to: vertex_of[e.to],
                input: e.input,
                partitioner: e.partitioner.clone(),
            })
            .collect();
        Self {
            stream,
            vertices,
            edges,
        }
    }

    /// A vertex's display name: its operators joined by arrows.
    pub fn vertex_name(&self, vertex: usize) -> String {
        self.vertices[vertex]
            .nodes
            .iter()
            .map(|n| self.stream.nodes[*n].spec.name())
            .collect::<Vec<_>>()
            .join(" -> ")
    }

    /// Input edges of a vertex.
    pub fn in_edges(&self, vertex: usize) -> impl Iterator<Item = &JobEdge> {
        self.edges.iter().filter(move |e| e.to == vertex)
    }

    /// Output edges of a vertex.
    pub fn out_edges(&self, vertex: usize) -> impl Iterator<Item = &JobEdge> {
        self.edges.iter().filter(move |e| e.from == vertex)
    }

    /// EXPLAIN text.
    pub fn explain(&self) -> String {
        let mut out = String::from("JobGraph:\n");
        for v in &self.vertices {
            let _ = write!(
                out,
                "  Vertex {} (parallelism {}): {}",
                v.id,
                v.parallelism,
                self.vertex_name(v.id)
            );
            let nodes: Vec<String> = v.nodes.iter().map(|n| format!("[{n}]")).collect();
            let _ = writeln!(out, "  nodes {}", nodes.join(","));
        }
        for e in &self.edges {
            let _ = writeln!(
                out,
                "  Edge: Vertex {} -> Vertex {} input {} {}",
                e.from, e.to, e.input, e.partitioner
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::OperatorSpec;
    use datafusion::common::DFSchema;
    use datafusion::logical_expr::lit;
    use std::sync::Arc;

    fn schema() -> Arc<DFSchema> {
        Arc::new(DFSchema::empty())
    }

    fn source(g: &mut StreamGraph) -> usize {
        g.add_node(
            OperatorSpec::TableSource {
                table_id: 1,
                table_name: "t".into(),
                projection: vec![],
                state_table: 1,
                append_only: false,
                watermark: None,
                versioned: false,
            },
            1,
            schema(),
        )
    }

    fn filter() -> OperatorSpec {
        OperatorSpec::Filter {
            predicate: lit(true),
            input_schema: schema(),
            errors: None,
        }
    }

    fn agg() -> OperatorSpec {
        OperatorSpec::HashAgg {
            group_exprs: vec![lit(1)],
            aggs: vec![],
            input_schema: schema(),
            state_table: 2,
            empty_set: None,
            emit_on_window_close: None,
            late_rows_table: None,
            close_after_key: false,
            state_ttl_us: None,
            errors: None,
        }
    }

    fn hash() -> Partitioner {
        Partitioner::Hash {
            exprs: vec![lit(1)],
            schema: schema(),
        }
    }

    /// source -> filter -> (hash) agg -> materialize
    fn pipeline(chaining: bool, agg_parallelism: usize) -> StreamGraph {
        let mut g = StreamGraph {
            chaining,
            ..Default::default()
        };
        let s = source(&mut g);
        let f = g.add_node(filter(), 1, schema());
        g.connect(s, f, 0, Partitioner::Forward);
        let a = g.add_node(agg(), agg_parallelism, schema());
        g.connect(f, a, 0, hash());
        let m = g.add_node(
            OperatorSpec::Materialize {
                view_id: 1,
                state_table: 3,
                changelog: None,
            },
            agg_parallelism,
            schema(),
        );
        g.connect(a, m, 0, Partitioner::Forward);
        g
    }

    #[test]
    fn forward_edges_of_equal_parallelism_chain() {
        let jg = JobGraph::from_stream_graph(pipeline(true, 4));
        assert_eq!(jg.vertices.len(), 2);
        assert_eq!(jg.vertices[0].nodes, vec![0, 1]);
        assert_eq!(jg.vertices[1].nodes, vec![2, 3]);
        assert_eq!(jg.vertices[1].parallelism, 4);
        assert_eq!(jg.edges.len(), 1);
        assert!(matches!(jg.edges[0].partitioner, Partitioner::Hash { .. }));
        assert_eq!(jg.vertex_name(0), "TableSource -> Filter");
    }

    #[test]
    fn hash_edge_never_chains_even_at_equal_parallelism() {
        let jg = JobGraph::from_stream_graph(pipeline(true, 1));
        assert_eq!(jg.vertices.len(), 2);
    }

    #[test]
    fn chaining_off_gives_one_vertex_per_operator() {
        let jg = JobGraph::from_stream_graph(pipeline(false, 4));
        assert_eq!(jg.vertices.len(), 4);
        assert_eq!(jg.edges.len(), 3);
    }

    #[test]
    fn two_input_operator_heads_its_chain() {
        let mut g = StreamGraph {
            chaining: true,
            ..Default::default()
        };
        let l = source(&mut g);
        let r = source(&mut g);
        let j = g.add_node(
            OperatorSpec::HashJoin {
                join_type: Default::default(),
                left_keys: vec![lit(1)],
                right_keys: vec![lit(1)],
                filter: None,
                errors: None,
                left_schema: schema(),
                right_schema: schema(),
                null_equals_null: false,
                state_table: 9,
                interval: None,
                temporal: false,
                state_ttl_us: None,
            },
            1,
            schema(),
        );
        // Even forward edges of equal parallelism do not chain into a join.
        g.connect(l, j, 0, Partitioner::Forward);
        g.connect(r, j, 1, Partitioner::Forward);
        let m = g.add_node(
            OperatorSpec::Materialize {
                view_id: 1,
                state_table: 3,
                changelog: None,
            },
            1,
            schema(),
        );
        g.connect(j, m, 0, Partitioner::Forward);
        let jg = JobGraph::from_stream_graph(g);
        assert_eq!(jg.vertices.len(), 3);
        assert_eq!(jg.vertices[2].nodes, vec![2, 3]);
    }
}

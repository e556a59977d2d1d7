//! One operator per file. [`build`] turns a planner spec into a running
//! operator for one subtask.

mod accumulator;
pub mod changelog;
pub mod connector_source;
mod event_time;
mod expand;
mod filter;
mod hash_agg;
mod hash_join;
pub mod materialize;
mod over_window;
mod project;
mod sorted_partitions;
pub mod table_source;
mod temporal_filter;
mod top_n;
mod ttl;
mod union;
mod unnest;
mod value_sets;
pub mod values_source;
pub mod view_source;
mod window_passes;
mod window_run;

use planner::spec::OperatorSpec;
use planner::stream_graph::StreamNode;

pub use expand::Expand;
pub use filter::Filter;
pub use hash_agg::{HashAgg, late_rows_type};
pub use hash_join::HashJoin;
pub use materialize::Materialize;
pub use over_window::OverWindow;
pub use project::Project;
pub use temporal_filter::TemporalFilter;
pub use top_n::TopN;
pub use union::Union;
pub use unnest::Unnest;

use crate::operator::Operator;
use crate::{ExecError, Result};

/// Builds the operator for a (non-source) StreamGraph node.
pub fn build(node: &StreamNode) -> Result<Box<dyn Operator>> {
    Ok(match &node.spec {
        OperatorSpec::Filter {
            predicate,
            input_schema,
            errors,
        } => Box::new(Filter::new(predicate, input_schema)?.collecting_errors(*errors)?),
        OperatorSpec::Project {
            exprs,
            input_schema,
            errors,
        } => Box::new(Project::new(exprs, input_schema, &node.schema)?.collecting_errors(*errors)?),
        OperatorSpec::HashAgg {
            group_exprs,
            aggs,
            input_schema,
            state_table,
            empty_set,
            emit_on_window_close,
            late_rows_table,
            close_after_key,
            state_ttl_us,
            errors,
        } => {
            let mut agg =
                HashAgg::new(group_exprs, aggs, input_schema, &node.schema, *state_table)?
                    .with_state_ttl(*state_ttl_us)
                    .collecting_errors(*errors)?;
            if let Some(id) = empty_set {
                agg = agg.with_empty_set(*id)?;
            }
            if let Some(key) = emit_on_window_close {
                agg = agg.emit_on_window_close(*key, *late_rows_table, *close_after_key);
            }
            Box::new(agg)
        }
        OperatorSpec::HashJoin { errors, .. } => {
            Box::new(HashJoin::new(&node.spec, &node.schema)?.collecting_errors(*errors)?)
        }
        OperatorSpec::Union { .. } => Box::new(Union::new(&node.schema)),
        OperatorSpec::TopN { .. } => Box::new(TopN::new(&node.spec, &node.schema)?),
        OperatorSpec::OverWindow { .. } => Box::new(OverWindow::new(&node.spec, &node.schema)?),
        OperatorSpec::TemporalFilter { .. } => {
            Box::new(TemporalFilter::new(&node.spec, &node.schema)?)
        }
        OperatorSpec::Expand {
            group_exprs,
            sets,
            input_schema,
        } => Box::new(Expand::new(group_exprs, sets, input_schema, &node.schema)?),
        OperatorSpec::Unnest {
            lists,
            outputs,
            nulls,
        } => Box::new(Unnest::new(lists, outputs, *nulls, &node.schema)?),
        OperatorSpec::Materialize {
            state_table,
            changelog,
            ..
        } => Box::new(Materialize::new(
            &node.schema,
            *state_table,
            changelog
                .as_ref()
                .map(|c| changelog::Changelog::new(c.table, c.retain_ms)),
        )?),
        OperatorSpec::TableSource { .. }
        | OperatorSpec::ViewSource { .. }
        | OperatorSpec::ConnectorSource { .. }
        | OperatorSpec::Values { .. } => {
            return Err(ExecError::Protocol(
                "a source is a task head, not a chained operator".into(),
            ));
        }
        OperatorSpec::Sink { .. } => {
            return Err(ExecError::Protocol(
                "a sink ends its task (sinks::CommittingSink), it is not a chained operator".into(),
            ));
        }
    })
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Readable batches for operator tests.

    use std::sync::{Arc, Mutex};

    use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
    use datafusion::common::DFSchema;
    use storage::chunk::{Chunk, Op};
    use storage::state::{StateEntry, StateWrite};

    use crate::operator::OperatorContext;
    use crate::state::{StateBackend, StateStore};

    pub(crate) fn ints(v: &[Option<i64>]) -> ArrayRef {
        Arc::new(Int64Array::from(v.to_vec()))
    }

    /// A chunk with columns a, b, c, … and its logical schema.
    pub(crate) fn chunk(ops: &[Op], cols: Vec<ArrayRef>) -> (Chunk, DFSchema) {
        let names = ["a", "b", "c", "d", "e"];
        let fields: Vec<Field> = cols
            .iter()
            .enumerate()
            .map(|(i, c)| Field::new(names[i], c.data_type().clone(), true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(schema.clone(), cols).unwrap();
        (
            Chunk::with_ops(ops, batch),
            DFSchema::try_from(schema.as_ref().clone()).unwrap(),
        )
    }

    /// Int64 schema with the given column names.
    pub(crate) fn int_schema(names: &[&str]) -> DFSchema {
        let fields: Vec<Field> = names
            .iter()
            .map(|n| Field::new(*n, DataType::Int64, true))
            .collect();
        DFSchema::try_from(Schema::new(fields)).unwrap()
    }

    /// "+I 1 2" per row.
    pub(crate) fn pretty(chunks: &[Chunk]) -> Vec<String> {
        let mut out = vec![];
        for c in chunks {
            for r in 0..c.num_rows() {
                let vals: Vec<String> = c
                    .data()
                    .columns()
                    .iter()
                    .map(|col| {
                        let opts = FormatOptions::default().with_null("NULL");
                        ArrayFormatter::try_new(col.as_ref(), &opts)
                            .unwrap()
                            .value(r)
                            .to_string()
                    })
                    .collect();
                out.push(format!("{} {}", c.op(r).symbol(), vals.join(" ")));
            }
        }
        out
    }

    /// Committed state held in memory.
    #[derive(Default)]
    pub(crate) struct MemState(pub(crate) Mutex<Vec<StateWrite>>);

    impl StateStore for MemState {
        fn get(&self, table: u64, key_group: u16, key: &[u8]) -> crate::Result<Option<Vec<u8>>> {
            Ok(self
                .0
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|w| w.table == table && w.key_group == key_group && w.key == key)
                .and_then(|w| w.value.clone()))
        }

        fn put(&self, writes: Vec<StateWrite>) -> crate::Result<()> {
            self.0.lock().unwrap().extend(writes);
            Ok(())
        }

        fn scan(&self, table: u64, kgs: std::ops::Range<u16>) -> crate::Result<Vec<StateEntry>> {
            let mut map = std::collections::BTreeMap::new();
            for w in self.0.lock().unwrap().iter() {
                if w.table == table && kgs.contains(&w.key_group) {
                    map.insert((w.key_group, w.key.clone()), w.value.clone());
                }
            }
            Ok(map
                .into_iter()
                .filter_map(|((key_group, key), v)| {
                    v.map(|value| StateEntry {
                        key_group,
                        key,
                        value,
                    })
                })
                .collect())
        }

        fn scan_from(
            &self,
            table: u64,
            key_group: u16,
            from: &[u8],
            limit: usize,
        ) -> crate::Result<Vec<StateEntry>> {
            let mut all = self.scan(table, key_group..key_group + 1)?;
            all.retain(|e| e.key.as_slice() >= from);
            all.truncate(limit);
            Ok(all)
        }

        fn scan_prefix(
            &self,
            table: u64,
            key_group: u16,
            prefix: &[u8],
        ) -> crate::Result<Vec<StateEntry>> {
            let mut all = self.scan(table, key_group..key_group + 1)?;
            all.retain(|e| e.key.starts_with(prefix));
            Ok(all)
        }
    }

    pub(crate) fn ctx(state: Arc<MemState>) -> OperatorContext {
        OperatorContext {
            job_id: 1,
            subtask: 0,
            parallelism: 1,
            key_groups: 0..128,
            state,
            restored_from: None,
            backend: StateBackend::Heap,
            memory: Arc::new(storage::memory::MemoryPool::new(usize::MAX)),
        }
    }

    /// [`ctx`] with the rocksdb backend and `pool` as the slot's memory;
    /// `restored`: as after a restore from checkpoint 1 (the store read
    /// on demand).
    /// A seeded generator of numbers below its argument, for tests that
    /// drive an operator with random changes (the same ones every run).
    pub(crate) fn random_below(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |n| {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (seed >> 33) % n
        }
    }

    pub(crate) fn rocksdb_ctx(
        state: Arc<MemState>,
        pool: &Arc<storage::memory::MemoryPool>,
        restored: bool,
    ) -> OperatorContext {
        OperatorContext {
            backend: StateBackend::RocksDb,
            memory: pool.clone(),
            restored_from: restored.then_some(1),
            ..ctx(state)
        }
    }
}

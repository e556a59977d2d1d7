//! OverWindow: window functions over partitions (`lag`, `lead`,
//! `first_value`, `sum(x) OVER (…)`, `row_number()` without a filter on it,
//! any frame DataFusion supports), every input row going out with the
//! functions' values and kept current under inserts, updates and deletes.
//!
//! Input arrives hash-partitioned on `PARTITION BY`. Each partition keeps
//! its rows in `ORDER BY` order (see [`SortedPartitions`]). For every chunk
//! the operator evaluates the rows a change can reach before and after
//! applying the chunk's changes and emits the difference: a new row can
//! change its neighbours' `lag`, a running sum, every row's
//! `count(*) OVER ()`, so only rows whose output actually changed go out
//! (`-D` old, `+I` new).
//!
//! How far a change reaches depends on the functions
//! ([`planner::frames`]):
//!
//! * **bounded** (`lag`, `lead`, `ROWS BETWEEN n PRECEDING AND m
//!   FOLLOWING`): a row's value reads at most `p` rows before it and `f`
//!   after. A change can alter only the rows from `f` rows before it to
//!   `p` after it, and their values need `p` more rows before and `f` more
//!   after. So the operator walks out from each change that far (counting
//!   the rows the chunk leaves alone, which are there before and after
//!   it), merges overlapping runs into segments, and evaluates only those.
//!   Partitions are paged map state: a partition of a hundred million rows
//!   (any window without `PARTITION BY` is one) costs memory for a page
//!   of it, and a change costs reads of the rows around it;
//! * **whole** (`row_number`, `rank`, running sums, aggregates over the
//!   whole partition): any change can change every row's value, so a
//!   change costs a pass over its partition: cheap for the usual small
//!   partitions, linear for one huge one. A partition that fits a page is
//!   evaluated in memory before and after the chunk. A larger one, when
//!   every function can be computed in bounded memory (DataFusion's
//!   `uses_bounded_memory`: each row's value reads the rows before it and
//!   a bounded number after, as `row_number`, `rank` and running sums
//!   do), is streamed instead: paged map state, read a page at a time
//!   through two runs of DataFusion's `BoundedWindowAggExec`, over the
//!   partition as it was and as it is, whose outputs are compared as they
//!   come ([`super::window_run`]). Memory holds about a page however
//!   large the partition; the output, the rows whose values changed, can
//!   still be the whole partition (an insert at the front of a
//!   `row_number` changes every row after it). Functions that need the
//!   partition's count or total first (`ntile`, `percent_rank`,
//!   aggregates over the whole partition) stream too, after a first pass
//!   that counts it and computes those aggregates
//!   ([`super::window_passes`]). Functions that read the rows after each
//!   row (`cume_dist`, frames to `UNBOUNDED FOLLOWING`) stream from the
//!   partition's last row back, as their reverse (a set needing both
//!   directions is planned as two OverWindows). Only functions that do
//!   not stream at all (a whole-partition aggregate with `FILTER`) read a
//!   partition whole.
//!
//! The functions run as DataFusion evaluates them in batch (its physical
//! `WindowExpr` on one sorted run of a partition), so their meaning is
//! DataFusion's, frames and all. State grows with the input, as it must:
//! any retraction can change a row's value.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::DFSchema;
use datafusion::execution::TaskContext;
use datafusion::execution::context::ExecutionProps;
use datafusion::logical_expr::physical_planning_context::PhysicalPlanningContext;
use datafusion::physical_expr::window::WindowExpr;
use datafusion::physical_planner::create_window_expr;
use planner::spec::OperatorSpec;
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;

use indexmap::IndexMap;
use planner::frames::{Reach, Reads};

use super::sorted_partitions::{Keyed, SortedPartitions, diff, entry_key, split_entry};
use super::window_passes::StreamPlan;
use super::window_run::{self, OutputDiff};
use crate::message::Barrier;
use crate::operator::{Collector, Operator, OperatorContext};
use crate::{ExecError, Result, expr};

/// Entries of a partition read at a time when the functions' reach is
/// bounded.
const PAGE: usize = 1024;

/// One run of changes in a partition, in entry keys (`None`: the
/// partition's end on that side): the functions are evaluated over
/// `from..=to`, and the values of the rows in `first..=last` (past
/// `after`, which an earlier segment compared) are compared.
struct Segment {
    from: EntryBound,
    to: EntryBound,
    first: EntryBound,
    last: EntryBound,
    after: EntryBound,
}

impl Segment {
    fn compares(&self, key: &[u8]) -> bool {
        self.first.as_deref().is_none_or(|first| first <= key)
            && self.last.as_deref().is_none_or(|last| key <= last)
            && self.after.as_deref().is_none_or(|after| after < key)
    }
}

/// An entry key, or `None` for a partition's end.
type EntryBound = Option<Vec<u8>>;

fn bound(key: &EntryBound) -> Bound<&[u8]> {
    key.as_deref().map_or(Bound::Unbounded, Bound::Included)
}

pub struct OverWindow {
    rows: SortedPartitions,
    functions: Vec<Arc<dyn WindowExpr>>,
    /// How a touched partition is read: the rows around each change, or
    /// whole (streamed a page at a time, in one or two passes, or at once).
    reads: Reads,
    /// What a streamed partition's runs compute (`Streamed`, `TwoPasses`).
    stream: Option<StreamPlan>,
    /// Decodes stored rows for a streamed partition.
    row_codec: RowCodec,
    /// What DataFusion runs a streamed partition's functions in.
    task: Arc<TaskContext>,
    /// Arrow schema of the input rows a partition is decoded into.
    input_schema: SchemaRef,
    /// Encodes output rows (input columns, then one per function).
    output_codec: RowCodec,
    schema: SchemaRef,
}

impl OverWindow {
    pub fn new(spec: &OperatorSpec, output: &DFSchema) -> Result<Self> {
        let OperatorSpec::OverWindow {
            partition_by,
            order_by,
            directions,
            functions,
            input_schema,
            state_table,
        } = spec
        else {
            return Err(ExecError::Protocol(
                "OverWindow built from another spec".into(),
            ));
        };
        let reads = planner::frames::reads(functions, input_schema);
        let stream = match reads {
            Reads::Streamed | Reads::TwoPasses => {
                Some(StreamPlan::new(functions, input_schema, false)?)
            }
            Reads::Backward { .. } => Some(StreamPlan::new(functions, input_schema, true)?),
            Reads::Around(_) | Reads::Whole => None,
        };
        let props = ExecutionProps::new();
        let ctx = PhysicalPlanningContext::default();
        let functions = functions
            .iter()
            .map(|f| Ok(create_window_expr(f, input_schema, &props, &ctx)?))
            .collect::<Result<Vec<_>>>()?;
        if output.fields().len() != input_schema.fields().len() + functions.len() {
            return Err(ExecError::Protocol(
                "OverWindow output is not its input plus one column per function".into(),
            ));
        }
        Ok(Self {
            rows: SortedPartitions::new(
                "OverWindow",
                (reads != Reads::Whole).then_some(PAGE),
                partition_by,
                order_by,
                directions,
                input_schema,
                *state_table,
            )?,
            functions,
            reads,
            stream,
            row_codec: RowCodec::new(expr::types(input_schema))?,
            task: Arc::new(TaskContext::default()),
            input_schema: expr::output_schema(input_schema),
            output_codec: RowCodec::new(expr::types(output))?,
            schema: expr::output_schema(output),
        })
    }

    /// The partition's output rows, encoded, in the partition's order.
    fn evaluate(&mut self, partition: &[u8], key_group: u16) -> Result<Vec<Vec<u8>>> {
        let (_, n, columns) =
            self.rows
                .range_columns(partition, key_group, Bound::Unbounded, Bound::Unbounded)?;
        self.outputs(n, columns)
    }

    /// The output rows, encoded, of `n` sorted rows of one partition.
    fn outputs(&self, n: usize, mut columns: Vec<ArrayRef>) -> Result<Vec<Vec<u8>>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let batch = expr::batch(&self.input_schema, columns.clone(), n)?;
        for f in &self.functions {
            let values: ArrayRef = f.evaluate(&batch)?;
            let t = self.schema.field(columns.len()).data_type();
            columns.push(if values.data_type() == t {
                values
            } else {
                planner::functions::numeric_special::cast_keeping_specials(&values, t)?
            });
        }
        Ok(self.output_codec.encode(&columns)?)
    }

    /// Applies the chunk with whole partitions evaluated before and
    /// after: the changes of their output. A partition larger than a
    /// page, when the functions allow it (`streamed`), is instead streamed
    /// a page at a time through both evaluations after the chunk is
    /// applied ([`Self::stream_partition`]).
    fn whole_partitions(&mut self, keys: &Keyed, chunk: &Chunk) -> Result<Vec<(Op, Vec<u8>)>> {
        let touched = keys.touched();
        self.rows.load(&touched)?;
        let mut before = Vec::with_capacity(touched.len());
        for (p, kg) in &touched {
            before.push(if self.stream.is_some() && self.rows.is_partial(p, *kg)? {
                None
            } else {
                Some(self.evaluate(p, *kg)?)
            });
        }
        // Each streamed partition's changed entries: entry key → copies
        // added (removed when negative).
        let mut deltas: IndexMap<&[u8], BTreeMap<Vec<u8>, i64>> = touched
            .iter()
            .zip(&before)
            .filter(|(_, old)| old.is_none())
            .map(|((p, _), _)| (p.as_slice(), BTreeMap::new()))
            .collect();
        if !deltas.is_empty() {
            for r in 0..keys.rows.len() {
                if let Some(entries) = deltas.get_mut(keys.partitions[r].as_slice()) {
                    *entries
                        .entry(entry_key(&keys.sort_keys[r], &keys.rows[r]))
                        .or_default() += chunk.op(r).sign();
                }
            }
        }
        self.rows.apply_chunk(keys, chunk)?;
        let mut changes = Vec::new();
        for ((p, key_group), old) in touched.iter().zip(before) {
            match old {
                Some(old) => changes.extend(diff(old, self.evaluate(p, *key_group)?)),
                None => {
                    let entries = deltas.swap_remove(p.as_slice()).unwrap_or_default();
                    self.stream_partition(p, *key_group, &entries, &mut changes)?;
                }
            }
        }
        Ok(changes)
    }

    /// Streams one partition, as it is now, through two runs of the
    /// functions: one over it as it was before the chunk (`deltas`, the
    /// copies the chunk added to each entry, taken back) and one over it
    /// as it is; appends to `changes` where their outputs differ. When a
    /// function needs the partition's count or total first, a first pass
    /// over both goes before ([`super::window_passes`]). Memory holds a
    /// page of rows and what DataFusion keeps of them.
    fn stream_partition(
        &mut self,
        partition: &[u8],
        key_group: u16,
        deltas: &BTreeMap<Vec<u8>, i64>,
        changes: &mut Vec<(Op, Vec<u8>)>,
    ) -> Result<()> {
        let plan = self
            .stream
            .as_ref()
            .ok_or_else(|| ExecError::Protocol("a partition streamed with no plan".into()))?;
        let (codec, schema) = (&self.row_codec, &self.input_schema);
        let backward = matches!(self.reads, Reads::Backward { .. });
        let decode = |keys: &[Arc<[u8]>]| -> Result<RecordBatch> {
            let columns = codec.decode(keys.iter().map(|k| split_entry(k).1))?;
            expr::batch(schema, columns, keys.len())
        };
        let facts = match plan.two_passes() {
            true => {
                let mut first = [plan.first_pass()?, plan.first_pass()?];
                walk_both(
                    &mut self.rows,
                    partition,
                    key_group,
                    deltas,
                    backward,
                    |page| {
                        for (keys, pass) in page.iter_mut().zip(first.iter_mut()) {
                            if !keys.is_empty() {
                                pass.update(&decode(&std::mem::take(keys))?)?;
                            }
                        }
                        Ok(())
                    },
                )?;
                let [before, after] = first;
                Some([before.finish()?, after.finish()?])
            }
            false => None,
        };
        let inputs = schema.fields().len();
        let encode = |side: usize, batch: RecordBatch| -> Result<Vec<Vec<u8>>> {
            let columns = plan.columns(&batch, inputs, facts.as_ref().map(|f| &f[side]))?;
            Ok(self
                .output_codec
                .encode(&window_run::output_columns(&columns, &self.schema)?)?)
        };
        let mut runs = OutputDiff::new(&plan.runs, schema, &self.task, backward)?;
        walk_both(
            &mut self.rows,
            partition,
            key_group,
            deltas,
            backward,
            |page| {
                runs.feed(page, codec, schema)?;
                runs.compare(false, &encode, changes)
            },
        )?;
        runs.end();
        runs.compare(true, &encode, changes)
    }

    /// Applies the chunk with only the rows around its changes evaluated
    /// before and after (see the module docs): the changes of their
    /// output.
    fn around_changes(
        &mut self,
        reach: Reach,
        keys: &Keyed,
        chunk: &Chunk,
    ) -> Result<Vec<(Op, Vec<u8>)>> {
        let mut changed: IndexMap<&[u8], (u16, BTreeSet<Vec<u8>>)> = IndexMap::new();
        for r in 0..keys.rows.len() {
            changed
                .entry(&keys.partitions[r])
                .or_insert_with(|| (keys.key_groups[r], BTreeSet::new()))
                .1
                .insert(entry_key(&keys.sort_keys[r], &keys.rows[r]));
        }
        let touched: Vec<(Vec<u8>, u16)> = changed
            .iter()
            .map(|(p, (kg, _))| (p.to_vec(), *kg))
            .collect();
        self.rows.load(&touched)?;
        let mut plans = Vec::new();
        for (partition, (key_group, entries)) in &changed {
            for segment in self.segments(partition, *key_group, entries, reach)? {
                plans.push((*partition, *key_group, segment));
            }
        }
        let before = plans
            .iter()
            .map(|(p, kg, segment)| self.evaluate_segment(p, *kg, segment))
            .collect::<Result<Vec<_>>>()?;
        self.rows.apply_chunk(keys, chunk)?;
        let mut changes = Vec::new();
        for ((p, kg, segment), old) in plans.iter().zip(before) {
            changes.extend(diff(old, self.evaluate_segment(p, *kg, segment)?));
        }
        Ok(changes)
    }

    /// The segments of one partition's changed entries (`changed`, in
    /// order), as the partition is before the changes.
    fn segments(
        &mut self,
        partition: &[u8],
        key_group: u16,
        changed: &BTreeSet<Vec<u8>>,
        reach: Reach,
    ) -> Result<Vec<Segment>> {
        let (p, f) = (reach.preceding, reach.following);
        let mut segments: Vec<Segment> = Vec::new();
        for c in changed {
            if let Some(s) = segments.last_mut() {
                if s.last.is_none() {
                    // The segment compares up to the partition's end.
                    continue;
                }
                if s.to.as_ref().is_none_or(|to| c <= to) {
                    (s.last, s.to) =
                        self.walk_out(partition, key_group, c, false, p, f, changed)?;
                    continue;
                }
            }
            // Rows up to `f` before `c` read it; their values read `p`
            // more before them. Likewise after.
            let (first, from) = self.walk_out(partition, key_group, c, true, f, p, changed)?;
            let (last, to) = self.walk_out(partition, key_group, c, false, p, f, changed)?;
            let after = segments.last().and_then(|s| s.last.clone());
            segments.push(Segment {
                from,
                to,
                first,
                last,
                after,
            });
        }
        Ok(segments)
    }

    /// Walks from `c` (downwards when `backward`) over the entries the
    /// chunk does not change: the entry where `near` rows were passed,
    /// then the one `far` rows past that (`c` itself for none; `None`
    /// when the partition ends first).
    #[allow(clippy::too_many_arguments)]
    fn walk_out(
        &mut self,
        partition: &[u8],
        key_group: u16,
        c: &[u8],
        backward: bool,
        near: u64,
        far: u64,
        changed: &BTreeSet<Vec<u8>>,
    ) -> Result<(EntryBound, EntryBound)> {
        // `Some(bound)` once reached.
        let mut near_at = (near == 0).then(|| c.to_vec());
        let mut far_at = (near == 0 && far == 0).then(|| c.to_vec());
        if far_at.is_some() {
            return Ok((near_at, far_at));
        }
        let mut passed = 0u64;
        let page = usize::try_from(near.saturating_add(far)).unwrap_or(usize::MAX);
        self.rows.walk(
            partition,
            key_group,
            Bound::Excluded(c),
            backward,
            page.saturating_add(2),
            |k, copies| {
                if changed.contains(k) {
                    return Ok(true);
                }
                passed += copies.max(0) as u64;
                if near_at.is_none() {
                    if passed < near {
                        return Ok(true);
                    }
                    near_at = Some(k.to_vec());
                    passed = 0;
                    if far > 0 {
                        return Ok(true);
                    }
                } else if passed < far {
                    return Ok(true);
                }
                far_at = Some(k.to_vec());
                Ok(false)
            },
        )?;
        Ok((near_at, far_at))
    }

    /// The output rows of a segment's compared rows, encoded.
    fn evaluate_segment(
        &mut self,
        partition: &[u8],
        key_group: u16,
        segment: &Segment,
    ) -> Result<Vec<Vec<u8>>> {
        let (keys, n, columns) = self.rows.range_columns(
            partition,
            key_group,
            bound(&segment.from),
            bound(&segment.to),
        )?;
        let outputs = self.outputs(n, columns)?;
        Ok(keys
            .iter()
            .zip(outputs)
            .filter(|(k, _)| segment.compares(k))
            .map(|(_, row)| row)
            .collect())
    }
}

/// Walks one partition as it is now and as it was before a chunk
/// (`deltas`, the copies the chunk added to each entry, taken back),
/// handing `on_page` about a page of rows at a time, one entry key per
/// copy, in order (from the last, `backward`): before, after. `on_page`
/// takes the rows it is given.
fn walk_both(
    rows: &mut SortedPartitions,
    partition: &[u8],
    key_group: u16,
    deltas: &BTreeMap<Vec<u8>, i64>,
    backward: bool,
    mut on_page: impl FnMut(&mut [Vec<Arc<[u8]>>; 2]) -> Result<()>,
) -> Result<()> {
    let mut page: [Vec<Arc<[u8]>>; 2] = Default::default();
    let push = |rows: &mut Vec<Arc<[u8]>>, key: &Arc<[u8]>, copies: i64| {
        rows.extend(std::iter::repeat_n(key, copies.max(0) as usize).cloned());
    };
    let mut pending: Box<dyn Iterator<Item = (&Vec<u8>, &i64)>> = match backward {
        true => Box::new(deltas.iter().rev()),
        false => Box::new(deltas.iter()),
    };
    let mut pending = pending.by_ref().peekable();
    // Whether entry `d` comes before entry `k` in the walk's order.
    let before = |d: &[u8], k: &[u8]| (d < k) != backward && d != k;
    rows.walk(
        partition,
        key_group,
        Bound::Unbounded,
        backward,
        PAGE,
        |k, copies| {
            // Entries the chunk took away altogether.
            while let Some((gone, delta)) = pending.next_if(|(d, _)| before(d, k)) {
                push(&mut page[0], &Arc::from(gone.as_slice()), -delta);
            }
            let delta = pending
                .next_if(|(d, _)| d.as_slice() == k)
                .map_or(0, |(_, d)| *d);
            let key: Arc<[u8]> = Arc::from(k);
            push(&mut page[0], &key, copies - delta);
            push(&mut page[1], &key, copies);
            if page[0].len().max(page[1].len()) >= PAGE {
                on_page(&mut page)?;
            }
            Ok(true)
        },
    )?;
    for (gone, delta) in pending {
        push(&mut page[0], &Arc::from(gone.as_slice()), -delta);
    }
    on_page(&mut page)
}

impl Operator for OverWindow {
    fn name(&self) -> &'static str {
        "OverWindow"
    }

    fn tables(&self) -> Vec<u64> {
        vec![self.rows.state_table()]
    }

    fn on_start(&mut self, ctx: &OperatorContext, _out: &mut Collector) -> Result<()> {
        self.rows.restore(ctx)
    }

    fn state_stats(&self, out: &mut Vec<crate::state::OperatorStateStats>) {
        out.push(self.rows.report());
    }

    fn process_batch(&mut self, _input: usize, chunk: Chunk, out: &mut Collector) -> Result<()> {
        let keys = self.rows.keys(chunk.data())?;
        let changes = match self.reads {
            Reads::Around(reach) => self.around_changes(reach, &keys, &chunk)?,
            Reads::Streamed | Reads::TwoPasses | Reads::Backward { .. } | Reads::Whole => {
                self.whole_partitions(&keys, &chunk)?
            }
        };
        self.rows.settle()?;
        if changes.is_empty() {
            return Ok(());
        }
        let (n, ops): (usize, Vec<_>) =
            (changes.len(), changes.iter().map(|(op, _)| *op).collect());
        let columns = self
            .output_codec
            .decode(changes.iter().map(|(_, row)| row.as_slice()))?;
        out.push(Chunk::with_ops(
            &ops,
            expr::batch(&self.schema, columns, n)?,
        ));
        Ok(())
    }

    fn handle_checkpoint(
        &mut self,
        _barrier: &Barrier,
        writes: &mut Vec<StateWrite>,
    ) -> Result<()> {
        self.rows.checkpoint(writes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::*;
    use datafusion::functions_aggregate::sum::sum_udaf;
    use datafusion::functions_window::expr_fn::{lag, row_number};
    use datafusion::logical_expr::expr::WindowFunction;
    use datafusion::logical_expr::{ExprFunctionExt, col};
    use datafusion::prelude::Expr;
    use std::collections::BTreeMap;
    use storage::chunk::Op;

    const I: Op = Op::Insert;
    const D: Op = Op::Delete;

    /// OverWindow of `functions` over `(a, b)` partitioned by `a`, ordered
    /// by `b`; outputs named `names`, bigint but for `pct…`, a double.
    fn over(functions: Vec<Expr>, names: &[&str]) -> OverWindow {
        use datafusion::arrow::datatypes::{DataType, Field, Schema};
        let input = Arc::new(int_schema(&["a", "b"]));
        let mut all = vec!["a", "b"];
        all.extend_from_slice(names);
        let output = Schema::new(
            all.iter()
                .map(|n| match n.starts_with("pct") {
                    true => Field::new(*n, DataType::Float64, true),
                    false => Field::new(*n, DataType::Int64, true),
                })
                .collect::<Vec<_>>(),
        );
        let spec = OperatorSpec::OverWindow {
            partition_by: vec![col("a")],
            order_by: vec![col("b")],
            directions: vec![(false, false)],
            functions,
            input_schema: input,
            state_table: 7,
        };
        OverWindow::new(&spec, &DFSchema::try_from(output).unwrap()).unwrap()
    }

    fn feed(w: &mut OverWindow, ops: &[Op], a: &[i64], b: &[i64]) -> Vec<String> {
        let a: Vec<Option<i64>> = a.iter().copied().map(Some).collect();
        let b: Vec<Option<i64>> = b.iter().copied().map(Some).collect();
        let (c, _) = chunk(ops, vec![ints(&a), ints(&b)]);
        let mut out = vec![];
        w.process_batch(0, c, &mut out).unwrap();
        pretty(&out)
    }

    fn lag_b() -> Expr {
        lag(col("b"), Some(1), None)
            .partition_by(vec![col("a")])
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap()
    }

    #[test]
    fn lag_follows_inserts_and_deletes_in_the_middle() {
        let mut w = over(vec![lag_b()], &["prev"]);
        assert_eq!(
            feed(&mut w, &[I, I, I], &[1, 1, 2], &[10, 30, 5]),
            vec!["+I 1 10 NULL", "+I 1 30 10", "+I 2 5 NULL"]
        );
        // 20 lands between 10 and 30: 30's previous row changes.
        assert_eq!(
            feed(&mut w, &[I], &[1], &[20]),
            vec!["-D 1 30 10", "+I 1 20 10", "+I 1 30 20"]
        );
        let mut writes = vec![];
        w.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
            .unwrap();
        let mut v = over(vec![lag_b()], &["prev"]);
        v.on_start(
            &ctx(Arc::new(MemState(std::sync::Mutex::new(writes)))),
            &mut vec![],
        )
        .unwrap();
        assert_eq!(
            feed(&mut v, &[D], &[1], &[20]),
            vec!["-D 1 20 10", "-D 1 30 20", "+I 1 30 10"]
        );
    }

    fn bounded_functions() -> Vec<Expr> {
        use datafusion::functions_window::expr_fn::lead;
        use datafusion::logical_expr::{WindowFrame, WindowFrameBound, WindowFrameUnits};
        let by_b = |e: Expr| {
            e.partition_by(vec![col("a")])
                .order_by(vec![col("b").sort(true, false)])
        };
        let n = |v| datafusion::common::ScalarValue::UInt64(Some(v));
        vec![
            by_b(lag(col("b"), Some(2), None)).build().unwrap(),
            by_b(lead(col("b"), Some(1), None)).build().unwrap(),
            by_b(Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")])))
                .window_frame(WindowFrame::new_bounds(
                    WindowFrameUnits::Rows,
                    WindowFrameBound::Preceding(n(1)),
                    WindowFrameBound::Following(n(2)),
                ))
                .build()
                .unwrap(),
        ]
    }

    /// What `bounded_functions` give, by a separate recomputation: each
    /// partition's `b`s in order, one per copy, with the value two rows
    /// back, the next one, and the sum from one back to two ahead.
    fn expected_bounded(rows: &BTreeMap<(i64, i64), i64>) -> Vec<String> {
        let mut out = Vec::new();
        for a in [1, 2] {
            let bs: Vec<i64> = rows
                .range((a, i64::MIN)..=(a, i64::MAX))
                .flat_map(|((_, b), n)| std::iter::repeat_n(*b, *n as usize))
                .collect();
            let show = |v: Option<&i64>| v.map_or("NULL".to_string(), i64::to_string);
            for (i, b) in bs.iter().enumerate() {
                let sum: i64 = bs[i.saturating_sub(1)..(i + 3).min(bs.len())].iter().sum();
                let prev = i.checked_sub(2).and_then(|j| bs.get(j));
                out.push(format!(
                    "{a} {b} {} {} {sum}",
                    show(prev),
                    show(bs.get(i + 1))
                ));
            }
        }
        out.sort();
        out
    }

    /// The rows of two partitions, `(a, b)` → copies, as a recomputation
    /// expects them: each output row, sorted.
    type Expected = fn(&BTreeMap<(i64, i64), i64>) -> Vec<String>;

    /// Random inserts and deletes, duplicates among them, into two
    /// partitions: the view the operator's changes add up to equals the
    /// recomputation (`expected`) after every chunk. With `pool`, the
    /// rocksdb backend over that much memory, restored from a checkpoint
    /// half way.
    fn follows_random_changes(
        functions: fn() -> Vec<Expr>,
        names: &[&str],
        expected: Expected,
        pool: Option<usize>,
    ) -> OverWindow {
        use crate::state::StateStore;
        let state = Arc::new(MemState::default());
        let pool = pool.map(|bytes| Arc::new(storage::memory::MemoryPool::new(bytes)));
        let start = |restored: bool| {
            let mut w = over(functions(), names);
            let ctx = match &pool {
                Some(pool) => rocksdb_ctx(state.clone(), pool, restored),
                None => ctx(state.clone()),
            };
            w.on_start(&ctx, &mut vec![]).unwrap();
            w
        };
        let mut w = start(false);
        let mut rows = BTreeMap::<(i64, i64), i64>::new();
        let mut shown = BTreeMap::<String, i64>::new();
        let mut next = random_below(11);
        for step in 0..240 {
            let (mut ops, mut a_s, mut bs) = (vec![], vec![], vec![]);
            // Bursts of appends at the end now and then, as time-ordered
            // input makes them.
            let size = if step % 7 == 0 { 40 } else { 1 + next(8) };
            for _ in 0..size {
                let a = 1 + next(2) as i64;
                if !rows.is_empty() && next(4) == 0 {
                    let at = next(rows.len() as u64) as usize;
                    let key = *rows.keys().nth(at).unwrap();
                    *rows.get_mut(&key).unwrap() -= 1;
                    if rows[&key] == 0 {
                        rows.remove(&key);
                    }
                    ops.push(D);
                    a_s.push(key.0);
                    bs.push(key.1);
                } else {
                    let b = if step % 7 == 0 {
                        10_000 + step as i64 * 100 + next(100) as i64
                    } else {
                        next(3_000) as i64
                    };
                    *rows.entry((a, b)).or_default() += 1;
                    ops.push(I);
                    a_s.push(a);
                    bs.push(b);
                }
            }
            for line in feed(&mut w, &ops, &a_s, &bs) {
                let (op, row) = line.split_at(3);
                *shown.entry(row.to_string()).or_default() += if op == "+I " { 1 } else { -1 };
            }
            assert!(shown.values().all(|n| *n >= 0), "step {step}: {shown:?}");
            shown.retain(|_, n| *n != 0);
            let got: Vec<String> = shown
                .iter()
                .flat_map(|(row, n)| std::iter::repeat_n(row.clone(), *n as usize))
                .collect();
            assert_eq!(got, expected(&rows), "step {step}");
            if let Some(pool) = &pool {
                assert!(
                    w.rows.report().bytes_in_memory as usize <= pool.capacity(),
                    "step {step}: {:?}",
                    w.rows.report()
                );
            }
            if step == 120 {
                let mut writes = vec![];
                w.handle_checkpoint(&Barrier::checkpoint(1), &mut writes)
                    .unwrap();
                state.put(writes).unwrap();
                drop(w);
                w = start(true);
            }
        }
        assert!(rows.values().sum::<i64>() > 600);
        w
    }

    fn bounded_reach_follows_random_changes(pool: Option<usize>) -> OverWindow {
        let w = follows_random_changes(
            bounded_functions,
            &["prev2", "next", "total"],
            expected_bounded,
            pool,
        );
        assert!(matches!(w.reads, Reads::Around(_)));
        w
    }

    #[test]
    fn bounded_reach_follows_random_changes_in_memory() {
        bounded_reach_follows_random_changes(None);
    }

    #[test]
    fn bounded_reach_keeps_a_page_of_a_partition_far_past_memory() {
        let mut w = bounded_reach_follows_random_changes(Some(48 << 10));
        assert!(first_partition_is_partial(&mut w), "a page of it in memory");
    }

    /// Memory holds only part of partition `a = 1`.
    fn first_partition_is_partial(w: &mut OverWindow) -> bool {
        let (c, _) = chunk(&[I], vec![ints(&[Some(1)]), ints(&[Some(0)])]);
        let keys = w.rows.keys(c.data()).unwrap();
        w.rows
            .is_partial(&keys.partitions[0], keys.key_groups[0])
            .unwrap()
    }

    fn running_functions() -> Vec<Expr> {
        use datafusion::functions_window::expr_fn::rank;
        let by_b = |e: Expr| {
            e.partition_by(vec![col("a")])
                .order_by(vec![col("b").sort(true, false)])
        };
        // SQL's default frame with ORDER BY: RANGE UNBOUNDED PRECEDING to
        // CURRENT ROW, peers included (the builder's default is ROWS).
        let running = by_b(Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")])))
            .window_frame(datafusion::logical_expr::WindowFrame::new(Some(false)));
        [by_b(row_number()), by_b(rank()), running]
            .into_iter()
            .map(|f| f.build().unwrap())
            .collect()
    }

    /// What `running_functions` give, by a separate recomputation: each
    /// partition's `b`s in order, one per copy, with the row's number, the
    /// rank (one more than the rows with a smaller `b`) and the sum of
    /// every `b` up to its own, ties included.
    fn expected_running(rows: &BTreeMap<(i64, i64), i64>) -> Vec<String> {
        let mut out = Vec::new();
        for a in [1, 2] {
            let mut number = 0;
            let (mut below, mut sum) = (0, 0);
            for ((_, b), n) in rows.range((a, i64::MIN)..=(a, i64::MAX)) {
                let rank = below + 1;
                sum += b * n;
                for _ in 0..*n {
                    number += 1;
                    out.push(format!("{a} {b} {number} {rank} {sum}"));
                }
                below += n;
            }
        }
        out.sort();
        out
    }

    fn running_functions_follow_random_changes(pool: Option<usize>) -> OverWindow {
        let w = follows_random_changes(
            running_functions,
            &["n", "r", "total"],
            expected_running,
            pool,
        );
        assert_eq!(w.reads, Reads::Streamed);
        w
    }

    #[test]
    fn running_functions_follow_random_changes_in_memory() {
        running_functions_follow_random_changes(None);
    }

    #[test]
    fn running_functions_stream_a_partition_far_past_memory() {
        let mut w = running_functions_follow_random_changes(Some(48 << 10));
        assert!(
            first_partition_is_partial(&mut w),
            "the partition is streamed, not read whole"
        );
    }

    fn two_pass_functions() -> Vec<Expr> {
        use datafusion::functions_aggregate::count::count_udaf;
        use datafusion::functions_window::expr_fn::{ntile, percent_rank};
        use datafusion::logical_expr::{WindowFrame, WindowFrameBound, WindowFrameUnits};
        let by_b = |e: Expr| {
            e.partition_by(vec![col("a")])
                .order_by(vec![col("b").sort(true, false)])
        };
        let whole = WindowFrame::new_bounds(
            WindowFrameUnits::Rows,
            WindowFrameBound::Preceding(datafusion::common::ScalarValue::UInt64(None)),
            WindowFrameBound::Following(datafusion::common::ScalarValue::UInt64(None)),
        );
        vec![
            // The partition's sum: no ORDER BY, every row's frame is all.
            Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
                .partition_by(vec![col("a")])
                .build()
                .unwrap(),
            by_b(ntile(datafusion::prelude::lit(3i64))).build().unwrap(),
            by_b(percent_rank()).build().unwrap(),
            by_b(row_number()).build().unwrap(),
            by_b(Expr::from(WindowFunction::new(
                count_udaf(),
                vec![col("b")],
            )))
            .window_frame(whole)
            .build()
            .unwrap(),
        ]
    }

    /// A double as Arrow prints it in `pretty` (only the formatting is
    /// shared with the operator, not the value).
    fn show_f64(v: f64) -> String {
        use datafusion::arrow::array::Float64Array;
        use datafusion::arrow::util::display::{ArrayFormatter, FormatOptions};
        let a = Float64Array::from(vec![v]);
        ArrayFormatter::try_new(&a, &FormatOptions::default())
            .unwrap()
            .value(0)
            .to_string()
    }

    /// Each of `count` rows' third, in order: the first `count % 3`
    /// thirds one row larger.
    fn thirds(count: usize) -> Vec<usize> {
        (0..3)
            .flat_map(|t| std::iter::repeat_n(t + 1, count / 3 + usize::from(t < count % 3)))
            .collect()
    }

    /// What `two_pass_functions` give, by a separate recomputation: each
    /// partition's `b`s in order, one per copy, with the partition's
    /// sum, the row's third (the first `n % 3` thirds one row larger),
    /// its relative rank `(rank - 1) / (n - 1)` (0 alone), its number
    /// and the partition's count.
    fn expected_two_passes(rows: &BTreeMap<(i64, i64), i64>) -> Vec<String> {
        let mut out = Vec::new();
        for a in [1, 2] {
            let part: Vec<(i64, i64)> = rows
                .range((a, i64::MIN)..=(a, i64::MAX))
                .map(|((_, b), n)| (*b, *n))
                .collect();
            let count: i64 = part.iter().map(|(_, n)| n).sum();
            let sum: i64 = part.iter().map(|(b, n)| b * n).sum();
            let mut thirds = thirds(count as usize).into_iter();
            let (mut number, mut below) = (0, 0);
            for (b, n) in part {
                let pct = if count > 1 {
                    below as f64 / (count - 1) as f64
                } else {
                    0.0
                };
                for _ in 0..n {
                    let third = thirds.next().unwrap();
                    number += 1;
                    out.push(format!(
                        "{a} {b} {sum} {third} {} {number} {count}",
                        show_f64(pct)
                    ));
                }
                below += n;
            }
        }
        out.sort();
        out
    }

    fn two_passes_follow_random_changes(pool: Option<usize>) -> OverWindow {
        let w = follows_random_changes(
            two_pass_functions,
            &["total", "third", "pct", "n", "count"],
            expected_two_passes,
            pool,
        );
        assert_eq!(w.reads, Reads::TwoPasses);
        w
    }

    #[test]
    fn two_pass_functions_follow_random_changes_in_memory() {
        two_passes_follow_random_changes(None);
    }

    #[test]
    fn two_pass_functions_stream_a_partition_far_past_memory() {
        let mut w = two_passes_follow_random_changes(Some(48 << 10));
        assert!(
            first_partition_is_partial(&mut w),
            "the partition is streamed, not read whole"
        );
    }

    fn backward_functions() -> Vec<Expr> {
        use datafusion::functions_aggregate::count::count_udaf;
        use datafusion::functions_window::expr_fn::{cume_dist, ntile};
        use datafusion::logical_expr::{WindowFrame, WindowFrameBound, WindowFrameUnits};
        let by_b = |e: Expr| {
            e.partition_by(vec![col("a")])
                .order_by(vec![col("b").sort(true, false)])
        };
        let rest = WindowFrame::new_bounds(
            WindowFrameUnits::Rows,
            WindowFrameBound::CurrentRow,
            WindowFrameBound::Following(datafusion::common::ScalarValue::UInt64(None)),
        );
        vec![
            // The sum from the row to the partition's end.
            by_b(Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")])))
                .window_frame(rest)
                .build()
                .unwrap(),
            by_b(cume_dist()).build().unwrap(),
            by_b(ntile(datafusion::prelude::lit(3i64))).build().unwrap(),
            Expr::from(WindowFunction::new(count_udaf(), vec![col("b")]))
                .partition_by(vec![col("a")])
                .build()
                .unwrap(),
        ]
    }

    /// What `backward_functions` give, by a separate recomputation: each
    /// partition's `b`s in order, one per copy, with the sum of the `b`s
    /// from it to the end, the share of rows with a `b` up to its own,
    /// its third and the partition's count.
    fn expected_backward(rows: &BTreeMap<(i64, i64), i64>) -> Vec<String> {
        let mut out = Vec::new();
        for a in [1, 2] {
            let bs: Vec<i64> = rows
                .range((a, i64::MIN)..=(a, i64::MAX))
                .flat_map(|((_, b), n)| std::iter::repeat_n(*b, *n as usize))
                .collect();
            let count = bs.len();
            for ((i, b), third) in bs.iter().enumerate().zip(thirds(count)) {
                let rest: i64 = bs[i..].iter().sum();
                let upto = bs.iter().filter(|x| *x <= b).count();
                out.push(format!(
                    "{a} {b} {rest} {} {third} {count}",
                    show_f64(upto as f64 / count as f64)
                ));
            }
        }
        out.sort();
        out
    }

    fn backward_follow_random_changes(pool: Option<usize>) -> OverWindow {
        let w = follows_random_changes(
            backward_functions,
            &["rest", "pct", "third", "count"],
            expected_backward,
            pool,
        );
        assert_eq!(w.reads, Reads::Backward { two_passes: true });
        w
    }

    #[test]
    fn backward_functions_follow_random_changes_in_memory() {
        backward_follow_random_changes(None);
    }

    #[test]
    fn backward_functions_stream_a_partition_far_past_memory() {
        let mut w = backward_follow_random_changes(Some(48 << 10));
        assert!(
            first_partition_is_partial(&mut w),
            "the partition is streamed, not read whole"
        );
    }

    #[test]
    fn row_number_renumbers_the_rows_after_an_insert() {
        let numbered = row_number()
            .partition_by(vec![col("a")])
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap();
        let mut w = over(vec![numbered], &["n"]);
        assert_eq!(w.reads, Reads::Streamed);
        assert_eq!(
            feed(&mut w, &[I, I], &[1, 1], &[5, 7]),
            vec!["+I 1 5 1", "+I 1 7 2"]
        );
        assert_eq!(
            feed(&mut w, &[I], &[1], &[1]),
            vec!["-D 1 5 1", "-D 1 7 2", "+I 1 1 1", "+I 1 5 2", "+I 1 7 3"]
        );
    }

    #[test]
    fn running_sum_changes_only_the_rows_after_the_change() {
        let running = Expr::from(WindowFunction::new(sum_udaf(), vec![col("b")]))
            .partition_by(vec![col("a")])
            .order_by(vec![col("b").sort(true, false)])
            .build()
            .unwrap();
        let mut w = over(vec![running], &["total"]);
        assert_eq!(
            feed(&mut w, &[I, I], &[1, 1], &[1, 2]),
            vec!["+I 1 1 1", "+I 1 2 3"]
        );
        assert_eq!(
            feed(&mut w, &[I], &[1], &[5]),
            vec!["+I 1 5 8"],
            "rows before 5 keep their sums"
        );
    }
}

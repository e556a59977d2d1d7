//! Rows kept per partition in `ORDER BY` order: the state that TopN and
//! OverWindow share.
//!
//! Each partition is an ordered multiset keyed by (sort key, row), the sort
//! key encoded so that bytes compare as the `ORDER BY` does and the row
//! breaking ties, so that a partition's order is the same in every run and
//! after every restore. Changed entries are written at the next barrier, one
//! state key per (partition, sort key, row) holding its copy count.

use std::collections::{BTreeMap, HashMap};

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::logical_expr::{Expr, ExprSchemable};
use datafusion::physical_expr::PhysicalExpr;
use std::sync::Arc;
use storage::chunk::{Chunk, Op};
use storage::codec::RowCodec;
use storage::state::StateWrite;

use crate::operator::OperatorContext;
use crate::{Result, expr};

/// (sort key, row) → copies.
pub(super) type Ranked = BTreeMap<(Vec<u8>, Vec<u8>), i64>;

/// (partition, sort key, row): one stored entry.
type EntryKey = (Vec<u8>, Vec<u8>, Vec<u8>);

/// A chunk's rows, encoded.
pub(super) struct Keyed {
    pub(super) partitions: Vec<Vec<u8>>,
    pub(super) key_groups: Vec<u16>,
    pub(super) sort_keys: Vec<Vec<u8>>,
    pub(super) rows: Vec<Vec<u8>>,
}

impl Keyed {
    /// The partitions the rows fall in, each once, in first-touch order,
    /// with their key groups.
    pub(super) fn touched(&self) -> Vec<(Vec<u8>, u16)> {
        let mut seen = std::collections::HashSet::new();
        self.partitions
            .iter()
            .zip(&self.key_groups)
            .filter(|(p, _)| seen.insert(p.as_slice()))
            .map(|(p, kg)| (p.clone(), *kg))
            .collect()
    }
}

pub(super) struct SortedPartitions {
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    partition_types: Vec<DataType>,
    partition_codec: RowCodec,
    order_by: Vec<Arc<dyn PhysicalExpr>>,
    sort_codec: RowCodec,
    /// Encodes whole input rows.
    pub(super) row_codec: RowCodec,
    state_table: u64,
    partitions: HashMap<Vec<u8>, Ranked>,
    /// Entries changed since the last barrier → key group.
    dirty: HashMap<EntryKey, u16>,
}

/// State key: partition length, partition, sort key length, sort key, row.
fn state_key(partition: &[u8], sort: &[u8], row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + partition.len() + sort.len() + row.len());
    k.extend_from_slice(&(partition.len() as u32).to_be_bytes());
    k.extend_from_slice(partition);
    k.extend_from_slice(&(sort.len() as u32).to_be_bytes());
    k.extend_from_slice(sort);
    k.extend_from_slice(row);
    k
}

fn split_state_key(k: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    let len = |at: usize| -> Option<usize> {
        Some(u32::from_be_bytes(k.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let p = len(0)?;
    let partition = k.get(4..4 + p)?;
    let s = len(4 + p)?;
    let sort = k.get(8 + p..8 + p + s)?;
    Some((partition, sort, k.get(8 + p + s..)?))
}

impl SortedPartitions {
    /// `directions`: per `order_by` expression, (descending, nulls first).
    pub(super) fn new(
        partition_by: &[Expr],
        order_by: &[Expr],
        directions: &[(bool, bool)],
        input_schema: &DFSchema,
        state_table: u64,
    ) -> Result<Self> {
        let partition_types: Vec<DataType> = partition_by
            .iter()
            .map(|e| Ok(e.get_type(input_schema)?))
            .collect::<Result<_>>()?;
        let sort_fields = order_by
            .iter()
            .zip(directions)
            .map(|(e, (desc, nulls_first))| Ok((e.get_type(input_schema)?, *desc, *nulls_first)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            partition_by: expr::compile(partition_by, input_schema)?,
            partition_codec: RowCodec::new(partition_types.clone())?,
            partition_types,
            order_by: expr::compile(order_by, input_schema)?,
            sort_codec: RowCodec::sorted(sort_fields)?,
            row_codec: RowCodec::new(expr::types(input_schema))?,
            state_table,
            partitions: HashMap::new(),
            dirty: HashMap::new(),
        })
    }

    pub(super) fn state_table(&self) -> u64 {
        self.state_table
    }

    /// Every row's partition, key group, sort key and encoding.
    pub(super) fn keys(&self, data: &RecordBatch) -> Result<Keyed> {
        let n = data.num_rows();
        let mut partition_keys = expr::evaluate(&self.partition_by, data)?;
        for (k, t) in partition_keys.iter_mut().zip(&self.partition_types) {
            if k.data_type() != t {
                *k = cast(k, t)?;
            }
        }
        let key_groups = expr::key_groups(&partition_keys, n)?;
        let partitions = if self.partition_by.is_empty() {
            vec![Vec::new(); n]
        } else {
            self.partition_codec.encode(&partition_keys)?
        };
        let sort_keys = if self.order_by.is_empty() {
            vec![Vec::new(); n]
        } else {
            self.sort_codec
                .encode(&expr::evaluate(&self.order_by, data)?)?
        };
        let rows = self.row_codec.encode_rows(data.columns(), n)?;
        Ok(Keyed {
            partitions,
            key_groups,
            sort_keys,
            rows,
        })
    }

    /// The partition's rows in order, if it has any.
    pub(super) fn get(&self, partition: &[u8]) -> Option<&Ranked> {
        self.partitions.get(partition)
    }

    /// The partition's rows in order, one entry per copy.
    pub(super) fn rows(&self, partition: &[u8]) -> Vec<&[u8]> {
        let mut out = Vec::new();
        for ((_, row), copies) in self.get(partition).into_iter().flatten() {
            for _ in 0..(*copies).max(0) {
                out.push(row.as_slice());
            }
        }
        out
    }

    /// Applies every row of `chunk` (encoded as `keys`).
    pub(super) fn apply_chunk(&mut self, keys: &Keyed, chunk: &Chunk) {
        for r in 0..chunk.num_rows() {
            self.apply(keys, r, chunk.op(r).sign());
        }
    }

    /// Adds (`sign` 1) or retracts (-1) one copy of row `r` of `keys`.
    fn apply(&mut self, keys: &Keyed, r: usize, sign: i64) {
        let p = &keys.partitions[r];
        let ranked = self.partitions.entry(p.clone()).or_default();
        let key = (keys.sort_keys[r].clone(), keys.rows[r].clone());
        let copies = ranked.entry(key.clone()).or_insert(0);
        *copies += sign;
        if *copies <= 0 {
            if *copies < 0 {
                tracing::error!(
                    state_table = self.state_table,
                    "sorted partition row retracted below zero"
                );
            }
            ranked.remove(&key);
        }
        self.dirty
            .insert((p.clone(), key.0, key.1), keys.key_groups[r]);
    }

    /// Keeps only the first `keep` rows of the partition (in `key_group`).
    pub(super) fn truncate(&mut self, partition: &[u8], key_group: u16, keep: i64) {
        let Some(ranked) = self.partitions.get_mut(partition) else {
            return;
        };
        let mut seen = 0i64;
        let mut forgotten = Vec::new();
        for (key, copies) in ranked.iter_mut() {
            let room = (keep - seen).max(0);
            if *copies > room {
                *copies = room;
                forgotten.push(key.clone());
            }
            seen += *copies;
        }
        ranked.retain(|_, copies| *copies > 0);
        for (sort, row) in forgotten {
            self.dirty
                .insert((partition.to_vec(), sort, row), key_group);
        }
    }

    /// Forgets the partition's map once it holds no row.
    pub(super) fn drop_if_empty(&mut self, partition: &[u8]) {
        if self.partitions.get(partition).is_some_and(|r| r.is_empty()) {
            self.partitions.remove(partition);
        }
    }

    /// Loads the committed rows of the subtask's key groups.
    pub(super) fn restore(&mut self, ctx: &OperatorContext) -> Result<()> {
        for e in ctx.state.scan(self.state_table, ctx.key_groups.clone())? {
            let corrupt =
                |what: &str| storage::StorageError::Corrupt(format!("sorted rows {what}"));
            let (partition, sort, row) = split_state_key(&e.key).ok_or_else(|| corrupt("key"))?;
            let copies = i64::from_be_bytes(
                e.value
                    .as_slice()
                    .try_into()
                    .map_err(|_| corrupt("count"))?,
            );
            self.partitions
                .entry(partition.to_vec())
                .or_default()
                .insert((sort.to_vec(), row.to_vec()), copies);
        }
        Ok(())
    }

    /// Writes every entry changed since the previous barrier.
    pub(super) fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) {
        for ((partition, sort, row), key_group) in self.dirty.drain() {
            let copies = self
                .partitions
                .get(&partition)
                .and_then(|r| r.get(&(sort.clone(), row.clone())))
                .copied();
            writes.push(StateWrite {
                table: self.state_table,
                key_group,
                key: state_key(&partition, &sort, &row),
                value: copies.map(|c| c.to_be_bytes().to_vec()),
            });
        }
    }
}

/// What changed between two multisets of output rows: the rows that left
/// (as deletes), then the rows that entered (as inserts).
pub(super) fn diff<K: Ord + Clone>(
    before: impl IntoIterator<Item = K>,
    after: impl IntoIterator<Item = K>,
) -> Vec<(Op, K)> {
    let mut counts: BTreeMap<K, i64> = BTreeMap::new();
    for k in before {
        *counts.entry(k).or_default() -= 1;
    }
    for k in after {
        *counts.entry(k).or_default() += 1;
    }
    let mut out = Vec::new();
    for (k, c) in &counts {
        for _ in 0..(-c).max(0) {
            out.push((Op::Delete, k.clone()));
        }
    }
    for (k, c) in counts {
        for _ in 0..c.max(0) {
            out.push((Op::Insert, k.clone()));
        }
    }
    out
}

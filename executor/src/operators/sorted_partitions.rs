//! Rows kept per partition in `ORDER BY` order: the state that TopN and
//! OverWindow share.
//!
//! Each partition is sorted-map state ([`MapLayout`]): a map from entry
//! key to copy count, the entry key being the sort key, encoded so that
//! bytes compare as the `ORDER BY` does, then the row, which breaks ties,
//! then the sort key's length (to split them again). Sort keys and rows
//! are Arrow's row format, in which no encoding is a prefix of another, so
//! entry keys compare as (sort key, row): a partition's order is the same
//! in every run and after every restore, in memory and on disk.
//!
//! A changed entry is written alone; partitions leave the cache as the
//! slot's managed memory requires. Partitions are paged
//! ([`MapLayout::paged`]) wherever the operator can work a page at a time:
//! TopN reads a partition's first entries, and more only when its range
//! reaches past them; OverWindow walks the rows around each change, or
//! streams a large partition through its functions. A partition of
//! millions of rows (any `ORDER BY … LIMIT`, or window, without
//! `PARTITION BY` is one) then costs memory for about a page of them.
//! OverWindow's functions that need a whole partition at once (`ntile`,
//! `cume_dist`, frames to `UNBOUNDED FOLLOWING`) keep it whole.

use std::collections::BTreeMap;
use std::ops::Bound;

use datafusion::arrow::array::{ArrayRef, RecordBatch};
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
use crate::state::{
    MapCodec, MapLayout, MapValue, OperatorStateStats, PREFETCH_ROWS, StateCache, StateCodec,
};
use crate::{Result, expr};

/// A partition's entries: entry key → copies.
pub(super) type Ranked = MapValue<i64>;

/// A chunk's rows, encoded.
pub(super) struct Keyed {
    /// Each row's partition as a state key (its length, then it).
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

/// Copy counts, under partitions.
struct Copies;

impl StateCodec for Copies {
    type Value = i64;

    fn encode(&self, copies: &i64) -> Vec<u8> {
        copies.to_be_bytes().to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<i64> {
        Ok(i64::from_be_bytes(bytes.try_into().map_err(|_| {
            storage::StorageError::Corrupt("sorted rows count".into())
        })?))
    }

    fn heap_size(&self, _: &i64) -> usize {
        0
    }
}

impl MapCodec for Copies {
    fn key_len(&self, stored: &[u8]) -> Result<usize> {
        let len = stored
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .filter(|len| stored.len() >= 4 + *len as usize)
            .ok_or_else(|| storage::StorageError::Corrupt("sorted rows key".into()))?;
        Ok(4 + len as usize)
    }
}

/// Entry key: sort key, row, sort key length.
pub(super) fn entry_key(sort: &[u8], row: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(sort.len() + row.len() + 4);
    k.extend_from_slice(sort);
    k.extend_from_slice(row);
    k.extend_from_slice(&(sort.len() as u32).to_be_bytes());
    k
}

/// An entry key's sort key and row.
pub(super) fn split_entry(k: &[u8]) -> (&[u8], &[u8]) {
    let (rest, len) = k.split_at(k.len().saturating_sub(4));
    let len = len.try_into().map(u32::from_be_bytes).unwrap_or(0) as usize;
    rest.split_at(len.min(rest.len()))
}

pub(super) struct SortedPartitions {
    partition_by: Vec<Arc<dyn PhysicalExpr>>,
    partition_types: Vec<DataType>,
    partition_codec: RowCodec,
    order_by: Vec<Arc<dyn PhysicalExpr>>,
    sort_codec: RowCodec,
    /// Encodes whole input rows.
    pub(super) row_codec: RowCodec,
    partitions: StateCache<MapLayout<Copies>>,
}

impl SortedPartitions {
    /// `directions`: per `order_by` expression, (descending, nulls first);
    /// `page`: entries of a partition read at a time (`None`: whole).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        operator: &'static str,
        page: Option<usize>,
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
            partitions: StateCache::new(
                state_table,
                operator,
                match page {
                    Some(page) => MapLayout::paged(Copies, page),
                    None => MapLayout::new(Copies),
                },
            ),
        })
    }

    pub(super) fn state_table(&self) -> u64 {
        self.partitions.table()
    }

    pub(super) fn report(&self) -> OperatorStateStats {
        self.partitions.report()
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
        let encoded = if self.partition_by.is_empty() {
            vec![Vec::new(); n]
        } else {
            self.partition_codec.encode(&partition_keys)?
        };
        let partitions = encoded
            .into_iter()
            .map(|p| {
                let mut k = (p.len() as u32).to_be_bytes().to_vec();
                k.extend_from_slice(&p);
                k
            })
            .collect();
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

    /// Reads the partitions the cache lacks, in one go.
    pub(super) fn load(&mut self, partitions: &[(Vec<u8>, u16)]) -> Result<()> {
        self.partitions
            .load(partitions.iter().map(|(p, kg)| (p.as_slice(), *kg)))
    }

    /// The partition's entries in order, if it has any: of a paged
    /// partition, those known so far (see [`SortedPartitions::read_more`]).
    pub(super) fn get(&mut self, partition: &[u8], key_group: u16) -> Result<Option<&Ranked>> {
        self.partitions.get(partition, key_group)
    }

    /// The partition is paged and memory holds only part of it.
    pub(super) fn is_partial(&mut self, partition: &[u8], key_group: u16) -> Result<bool> {
        Ok(self
            .partitions
            .get(partition, key_group)?
            .is_some_and(|ranked| ranked.is_partial()))
    }

    /// Reads the next page of a paged partition's entries.
    pub(super) fn read_more(&mut self, partition: &[u8], key_group: u16) -> Result<()> {
        self.partitions
            .get_at(partition, key_group, false, |layout, at, ranked| {
                match (at, ranked) {
                    (Some(at), Some(ranked)) => layout.extend(at, ranked),
                    _ => Ok(()),
                }
            })
    }

    /// Visits the partition's entries (entry key, copies) as they are
    /// now from `start` on, upwards or (`backward`) downwards, until
    /// `visit` returns false: of a paged partition, reading the store
    /// where memory lacks entries, a few at a time
    /// ([`MapLayout::walk`]).
    pub(super) fn walk(
        &mut self,
        partition: &[u8],
        key_group: u16,
        start: Bound<&[u8]>,
        backward: bool,
        first_page: usize,
        mut visit: impl FnMut(&[u8], i64) -> Result<bool>,
    ) -> Result<()> {
        self.partitions.get_at(
            partition,
            key_group,
            false,
            |layout, at, ranked| match ranked {
                Some(ranked) => {
                    layout.walk(at, ranked, start, backward, first_page, |k, c| visit(k, *c))
                }
                None => Ok(()),
            },
        )
    }

    /// The partition's rows with entry keys from `from` to `to`, one per
    /// copy, in order: each row's entry key, and the rows decoded (their
    /// number and columns).
    pub(super) fn range_columns(
        &mut self,
        partition: &[u8],
        key_group: u16,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
    ) -> Result<(Vec<Vec<u8>>, usize, Vec<ArrayRef>)> {
        let mut entries: Vec<(Vec<u8>, i64)> = Vec::new();
        self.walk(partition, key_group, from, false, 64, |k, copies| {
            let inside = match to {
                Bound::Included(to) => k <= to,
                Bound::Excluded(to) => k < to,
                Bound::Unbounded => true,
            };
            if inside {
                entries.push((k.to_vec(), copies));
            }
            Ok(inside)
        })?;
        let mut keys = Vec::new();
        let mut rows = Vec::new();
        for (entry, copies) in &entries {
            for _ in 0..(*copies).max(0) {
                keys.push(entry.clone());
                rows.push(split_entry(entry).1);
            }
        }
        let n = rows.len();
        Ok((keys, n, self.row_codec.decode(rows)?))
    }

    /// Applies every row of `chunk` (encoded as `keys`).
    pub(super) fn apply_chunk(&mut self, keys: &Keyed, chunk: &Chunk) -> Result<()> {
        let prefetch = self.partitions.codec().is_paged();
        let n = chunk.num_rows();
        for r in 0..n {
            if prefetch && r % PREFETCH_ROWS == 0 {
                self.prefetch(keys, r..(r + PREFETCH_ROWS).min(n))?;
            }
            self.apply(keys, r, chunk.op(r).sign())?;
        }
        Ok(())
    }

    /// Reads the entries of rows `slice` that memory may lack, in one
    /// batched read per partition, rather than a point read per row.
    fn prefetch(&mut self, keys: &Keyed, slice: std::ops::Range<usize>) -> Result<()> {
        self.partitions.fetch_entries(slice.map(|r| {
            (
                &keys.partitions[r],
                keys.key_groups[r],
                entry_key(&keys.sort_keys[r], &keys.rows[r]),
            )
        }))
    }

    /// Adds (`sign` 1) or retracts (-1) one copy of row `r` of `keys`.
    fn apply(&mut self, keys: &Keyed, r: usize, sign: i64) -> Result<()> {
        let table = self.partitions.table();
        let key = entry_key(&keys.sort_keys[r], &keys.rows[r]);
        self.partitions.get_at(
            &keys.partitions[r],
            keys.key_groups[r],
            true,
            |layout, at, ranked| {
                let ranked = ranked.get_or_insert_with(MapValue::default);
                if let Some(at) = at {
                    // Its copies so far, wherever they are.
                    layout.fetch(at, ranked, &key)?;
                }
                let copies = ranked.get_or_insert_with(&key, || 0);
                *copies += sign;
                if *copies <= 0 {
                    if *copies < 0 {
                        tracing::error!(
                            state_table = table,
                            "sorted partition row retracted below zero"
                        );
                    }
                    ranked.remove(&key);
                }
                Ok(())
            },
        )
    }

    /// Keeps only the first `keep` rows of the partition (in `key_group`).
    pub(super) fn truncate(&mut self, partition: &[u8], key_group: u16, keep: i64) -> Result<()> {
        let Some(ranked) = self.partitions.get_mut(partition, key_group)? else {
            return Ok(());
        };
        let mut seen = 0i64;
        let mut cut = Vec::new();
        for (key, copies) in ranked.iter() {
            let room = (keep - seen).max(0);
            if *copies > room {
                cut.push((key.to_vec(), room));
            }
            seen += (*copies).min(room);
        }
        for (key, room) in cut {
            match ranked.get_mut(&key) {
                Some(copies) if room > 0 => *copies = room,
                _ => {
                    ranked.remove(&key);
                }
            }
        }
        Ok(())
    }

    /// Binds the partitions to the subtask's store and slot.
    pub(super) fn restore(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.partitions.start(ctx)
    }

    /// Keeps the partitions in memory within the slot's share: after each
    /// chunk.
    pub(super) fn settle(&mut self) -> Result<()> {
        self.partitions.settle()
    }

    /// Writes every entry changed since the previous barrier.
    pub(super) fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) -> Result<()> {
        self.partitions.checkpoint(writes)
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

//! HashAgg's value sets: the multisets of the aggregates that keep every
//! value (`DISTINCT`, retractable min and max, string_agg, array_agg,
//! first_value, last_value, the bit aggregates; see
//! [`super::accumulator`]), kept apart from the groups' accumulators as
//! paged sorted-map state, as Flink keeps a retractable `MAX` in a
//! `MapView` backed by `MapState` and RisingWave a materialized input per
//! min and max.
//!
//! Each aggregate of each group has its own map, encoded value → copies,
//! in the order of the value's encoding; the group keeps only the number
//! of distinct values. So a group of a hundred million values costs a
//! page of them in memory, not all of them:
//!
//! * a row added or taken back fetches its value's entry alone (one point
//!   read when the set is not in memory whole);
//! * `count(DISTINCT …)` is the group's count, read from no set;
//! * min, max, first_value and last_value are the set's first entry
//!   (`max` and `last_value` encode in reverse), which the first page
//!   holds;
//! * the others (`sum(DISTINCT …)`, string_agg, array_agg, the bit
//!   aggregates) range over every value: they read their set whole, as
//!   their output holds all of it anyway, and the next settle cuts it back.

use datafusion::common::ScalarValue;
use storage::state::StateWrite;

use super::accumulator::{AccState, Aggregate, Prepared};
use crate::Result;
use crate::operator::OperatorContext;
use crate::state::{MapCodec, MapLayout, MapValue, OperatorStateStats, StateCache, StateCodec};

/// Store key tag of value sets in HashAgg's table (group keys start below
/// 0x10; timers and expiries use 0x20–0x22).
pub(super) const VALUE_SETS: u8 = 0x30;

/// Entries of a value set read from the store at a time.
const PAGE: usize = 1024;

/// Copies of each value, under `VALUE_SETS ‖ length ‖ aggregate index ‖
/// group key`.
struct SetCodec;

impl StateCodec for SetCodec {
    type Value = i64;

    fn encode(&self, copies: &i64) -> Vec<u8> {
        copies.to_be_bytes().to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<i64> {
        crate::operator::stored_count(bytes, "value set copies")
    }

    fn heap_size(&self, _: &i64) -> usize {
        0
    }
}

impl MapCodec for SetCodec {
    fn key_len(&self, stored: &[u8]) -> Result<usize> {
        let len = stored
            .get(1..5)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_be_bytes)
            .filter(|len| stored.len() >= 5 + *len as usize)
            .ok_or_else(|| storage::StorageError::Corrupt("value set key".into()))?;
        Ok(5 + len as usize)
    }
}

/// The state key of aggregate `index`'s set in group `group`.
fn set_key(index: usize, group: &[u8]) -> Vec<u8> {
    let mut key = Vec::with_capacity(7 + group.len());
    key.push(VALUE_SETS);
    key.extend_from_slice(&((group.len() + 2) as u32).to_be_bytes());
    key.extend_from_slice(&(index as u16).to_be_bytes());
    key.extend_from_slice(group);
    key
}

/// The value sets of one HashAgg (see the module docs).
pub(super) struct ValueSets {
    sets: StateCache<MapLayout<SetCodec>>,
}

impl ValueSets {
    pub(super) fn new(table: u64) -> Self {
        Self {
            sets: StateCache::new(
                table,
                "HashAgg (value sets)",
                MapLayout::paged(SetCodec, PAGE),
            )
            .under(VALUE_SETS..=VALUE_SETS),
        }
    }

    pub(super) fn start(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.sets.start(ctx)
    }

    pub(super) fn settle(&mut self) -> Result<()> {
        self.sets.settle()
    }

    pub(super) fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) -> Result<()> {
        self.sets.checkpoint(writes)
    }

    pub(super) fn report(&self) -> OperatorStateStats {
        self.sets.report()
    }

    /// Reads the entries that rows `slice` of a chunk are about to change,
    /// of the sets memory holds only part of, in one batched read per set
    /// (rather than a point read per row): `groups` and `key_groups` are
    /// the rows' group keys and key groups, `args` the aggregates'
    /// arguments.
    pub(super) fn prefetch(
        &mut self,
        aggs: &[Aggregate],
        slice: std::ops::Range<usize>,
        groups: &[Vec<u8>],
        key_groups: &[u16],
        args: &[Prepared],
    ) -> Result<()> {
        for (i, agg) in aggs.iter().enumerate() {
            if !agg.set_backed() {
                continue;
            }
            self.sets.fetch_entries(slice.clone().filter_map(|row| {
                let value = agg.encoded(&args[i], row)?;
                Some((set_key(i, &groups[row]), key_groups[row], value))
            }))?;
        }
        Ok(())
    }

    /// Adds (`sign` 1) or takes back (-1) `copies` of `value` in aggregate
    /// `index`'s set of group `group`, keeping the group's count of
    /// distinct values.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn update(
        &mut self,
        index: usize,
        group: &[u8],
        key_group: u16,
        distinct: &mut i64,
        value: &[u8],
        copies: i64,
    ) -> Result<()> {
        let key = set_key(index, group);
        self.sets.get_at(&key, key_group, true, |layout, at, slot| {
            let map = slot.get_or_insert_with(MapValue::default);
            if let Some(at) = at {
                layout.fetch(at, map, value)?;
            }
            let before = map.get(value).copied().unwrap_or(0);
            let after = before + copies;
            if after > 0 {
                *map.get_or_insert_with(value, || 0) = after;
            } else if before != 0 {
                map.remove(value);
            }
            *distinct += i64::from(after > 0) - i64::from(before > 0);
            Ok(())
        })
    }

    /// Aggregate `index`'s value in group `group` whose state is `acc`,
    /// reading as much of its set as it needs.
    pub(super) fn output(
        &mut self,
        agg: &Aggregate,
        index: usize,
        group: &[u8],
        key_group: u16,
        acc: &AccState,
    ) -> Result<ScalarValue> {
        let AccState::Distinct(n) = acc else {
            // A multiset written inline by an earlier version.
            return agg.output(acc);
        };
        if agg.counts_distinct() {
            return Ok(ScalarValue::Int64(Some(*n)));
        }
        if *n <= 0 {
            return agg.values_output(&[]);
        }
        let first_only = agg.first_entry_only();
        let key = set_key(index, group);
        self.sets
            .get_at(&key, key_group, false, |layout, at, slot| {
                let Some(map) = slot else {
                    return agg.values_output(&[]);
                };
                if first_only {
                    loop {
                        if let Some((value, copies)) = map.iter().next() {
                            return agg.values_output(&[(value, *copies)]);
                        }
                        match at {
                            // Every known entry went: the next page.
                            Some(at) if map.is_partial() => layout.extend(at, map)?,
                            _ => return agg.values_output(&[]),
                        }
                    }
                }
                if let Some(at) = at {
                    layout.read_whole(at, map)?;
                }
                let entries: Vec<(&[u8], i64)> = map.iter().map(|(v, c)| (v, *c)).collect();
                agg.values_output(&entries)
            })
    }

    /// Moves a multiset that an earlier version kept inline in the group
    /// into aggregate `index`'s value set.
    pub(super) fn migrate(
        &mut self,
        agg: &Aggregate,
        index: usize,
        group: &[u8],
        key_group: u16,
        acc: &mut AccState,
    ) -> Result<()> {
        let AccState::Values(set) = acc else {
            return Ok(());
        };
        let entries = agg.reencode(std::mem::take(set))?;
        let mut distinct = 0;
        for (value, copies) in entries {
            if copies > 0 {
                self.update(index, group, key_group, &mut distinct, &value, copies)?;
            }
        }
        *acc = AccState::Distinct(distinct);
        Ok(())
    }

    /// Deletes aggregate `index`'s set of a group forgotten with values in
    /// it (a closed window, an expired TTL).
    pub(super) fn forget(&mut self, index: usize, group: &[u8], key_group: u16) -> Result<()> {
        let key = set_key(index, group);
        self.sets.get_at(&key, key_group, true, |layout, at, slot| {
            if let Some(map) = slot {
                if let Some(at) = at {
                    layout.read_whole(at, map)?;
                }
                map.clear();
            }
            Ok(())
        })
    }
}

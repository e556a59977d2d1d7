//! Map state (Flink's `MapState`): a key's value is a map, stored as one
//! entry per map key under the key as a prefix. A change to one map entry
//! writes that entry alone at the next barrier or eviction, however large
//! the map; a key's map is read back with one prefix scan.
//!
//! The map is sorted by its keys' bytes, as the store is, so it serves as
//! sorted-map state too: a map key encoded to compare as an `ORDER BY`
//! keeps the map, and the key's entries on disk, in that order.
//!
//! A **paged** layout ([`MapLayout::paged`]) does not hold a large map
//! whole (RisingWave's top-N cache, Flink's RocksDB `MapState` iterators):
//! a map read from the store brings its first page of entries only, and a
//! map that outgrows its share of the cache is cut back to its first
//! entries, the changed entries past the cut written to the store. Memory
//! then holds every entry up to a bound (the *known* entries, in order)
//! and, past it, only entries fetched or changed one by one; an operator
//! reads further pages when it needs entries past the bound
//! ([`MapLayout::extend`]), and fetches an entry before changing it
//! ([`MapLayout::fetch`]). A view's top 10 of a hundred million rows keeps
//! about a page of them in memory.

use std::collections::BTreeMap;
use std::ops::Bound;

use storage::state::{StateEntry, StateWrite};

use super::layout::KeyedValue;
use super::{StateCodec, StateLayout, StateStore};
use crate::Result;

/// A map-state codec: encodes map values, and finds where the key ends in
/// a stored key (the rest is the map key).
pub trait MapCodec: StateCodec {
    /// The length of the key that a stored key `key ‖ map key` starts with.
    fn key_len(&self, stored: &[u8]) -> Result<usize>;
}

/// Entries a walk reads at a time at most, of maps that are not paged.
const WALK_PAGE: usize = 1024;

fn as_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

/// The layout of map state whose map values `C` encodes.
pub struct MapLayout<C> {
    codec: C,
    /// Paged: entries read at a time, and the most a map may be cut back
    /// to; `None`: maps are read and kept whole.
    page: Option<usize>,
}

impl<C> MapLayout<C> {
    /// Maps read and kept whole.
    pub fn new(codec: C) -> Self {
        Self { codec, page: None }
    }

    /// Maps read `page` entries at a time and cut back when they outgrow
    /// their share (see the module docs).
    pub fn paged(codec: C, page: usize) -> Self {
        Self {
            codec,
            page: Some(page.max(1)),
        }
    }

    /// Maps are read a page at a time.
    pub fn is_paged(&self) -> bool {
        self.page.is_some()
    }
}

/// Where one key's map lies in the store: what [`MapLayout::fetch`] and
/// [`MapLayout::extend`] read.
pub struct MapAt<'a> {
    pub store: &'a dyn StateStore,
    pub table: u64,
    pub key_group: u16,
    pub key: &'a [u8],
}

impl MapAt<'_> {
    fn stored_key(&self, map_key: &[u8]) -> Vec<u8> {
        stored_key(self.key, map_key)
    }
}

/// The store key of a map entry: the key, then the map key.
fn stored_key(key: &[u8], map_key: &[u8]) -> Vec<u8> {
    let mut stored = Vec::with_capacity(key.len() + map_key.len());
    stored.extend_from_slice(key);
    stored.extend_from_slice(map_key);
    stored
}

/// Which of a map's entries memory holds.
#[derive(Clone, PartialEq, Eq, Debug)]
enum Known {
    /// Every entry.
    All,
    /// Every entry with a map key up to this one, and past it only
    /// entries fetched or changed one by one.
    UpTo(Vec<u8>),
    /// Only entries fetched or changed one by one.
    Nothing,
}

struct Entry<V> {
    /// `None`: deleted, the deletion not yet written.
    value: Option<V>,
    /// Changed since the map was last written.
    changed: bool,
}

/// One key's map. Map values are accounted at their inline size: use it
/// for fixed-size values (counts, degrees), the map keys holding the data.
///
/// A map of a paged layout may be partial (see the module docs): then
/// [`MapValue::iter`] yields the known entries only, and an entry past
/// them must be fetched before it is read or changed.
pub struct MapValue<V> {
    entries: BTreeMap<Vec<u8>, Entry<V>>,
    /// Entries in memory with a value.
    live: usize,
    /// Heap bytes of `entries` (and of the bound).
    bytes: usize,
    known: Known,
}

impl<V> Default for MapValue<V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            live: 0,
            bytes: 0,
            known: Known::All,
        }
    }
}

impl<V> MapValue<V> {
    /// What one entry costs: its key, the slot the map keeps for it and
    /// the spare room of the map's nodes.
    fn entry_bytes(key: &[u8]) -> usize {
        key.len() + std::mem::size_of::<(Vec<u8>, Entry<V>)>() * 3 / 2
    }

    /// Adds an entry read from the store (clean).
    fn load(&mut self, key: Vec<u8>, value: V) {
        self.bytes += Self::entry_bytes(&key);
        self.live += 1;
        self.entries.insert(
            key,
            Entry {
                value: Some(value),
                changed: false,
            },
        );
    }

    /// Remembers that the store has no entry for `key`, so that it is
    /// read once.
    fn absent(&mut self, key: &[u8]) {
        self.bytes += Self::entry_bytes(key);
        self.entries.insert(
            key.to_vec(),
            Entry {
                value: None,
                changed: false,
            },
        );
    }

    /// Map keys in memory with a value (all of them unless partial).
    pub fn len(&self) -> usize {
        self.live
    }

    /// The map has no entry (a partial map is never known to be empty).
    pub fn is_empty(&self) -> bool {
        self.live == 0 && !self.is_partial()
    }

    /// Memory holds only part of the map: entries past
    /// [`MapValue::iter`]'s may be in the store.
    pub fn is_partial(&self) -> bool {
        self.known != Known::All
    }

    /// `key` is among the known entries, or was fetched.
    fn knows(&self, key: &[u8]) -> bool {
        match &self.known {
            Known::All => true,
            Known::UpTo(bound) => key <= bound.as_slice() || self.entries.contains_key(key),
            Known::Nothing => self.entries.contains_key(key),
        }
    }

    fn set_known(&mut self, known: Known) {
        let size = |k: &Known| match k {
            Known::UpTo(b) => b.len(),
            _ => 0,
        };
        self.bytes = self.bytes + size(&known) - size(&self.known);
        self.known = known;
    }

    pub fn get(&self, key: &[u8]) -> Option<&V> {
        self.entries.get(key)?.value.as_ref()
    }

    pub fn contains(&self, key: &[u8]) -> bool {
        self.get(key).is_some()
    }

    /// The value of `key`, to change.
    pub fn get_mut(&mut self, key: &[u8]) -> Option<&mut V> {
        let entry = self.entries.get_mut(key)?;
        if entry.value.is_some() {
            entry.changed = true;
        }
        entry.value.as_mut()
    }

    /// The value of `key`, made with `make` if it has none.
    pub fn get_or_insert_with(&mut self, key: &[u8], make: impl FnOnce() -> V) -> &mut V {
        if !self.entries.contains_key(key) {
            self.absent(key);
        }
        let entry = self.entries.get_mut(key).expect("inserted");
        entry.changed = true;
        if entry.value.is_none() {
            self.live += 1;
        }
        entry.value.get_or_insert_with(make)
    }

    /// Deletes `key`, returning its value.
    pub fn remove(&mut self, key: &[u8]) -> Option<V> {
        let entry = self.entries.get_mut(key)?;
        let value = entry.value.take()?;
        entry.changed = true;
        self.live -= 1;
        Some(value)
    }

    /// Deletes every key.
    pub fn clear(&mut self) {
        for entry in self.entries.values_mut() {
            if entry.value.take().is_some() {
                entry.changed = true;
            }
        }
        self.live = 0;
    }

    /// The entries in memory with a value past `from` up to `to` (in
    /// the walk's direction: downwards when `backward`).
    fn live_range<'a>(
        &'a self,
        from: Bound<&[u8]>,
        to: Bound<&[u8]>,
        backward: bool,
    ) -> Box<dyn Iterator<Item = (&'a [u8], &'a V)> + 'a> {
        let live = |(k, e): (&'a Vec<u8>, &'a Entry<V>)| Some((k.as_slice(), e.value.as_ref()?));
        if backward {
            Box::new(
                self.entries
                    .range::<[u8], _>((to, from))
                    .rev()
                    .filter_map(live),
            )
        } else {
            Box::new(self.entries.range::<[u8], _>((from, to)).filter_map(live))
        }
    }

    /// The map keys with a value, and their values, in key order: of a
    /// partial map, the known entries only.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> {
        let end = match &self.known {
            Known::All => std::ops::Bound::Unbounded,
            Known::UpTo(bound) => std::ops::Bound::Included(bound.as_slice()),
            // Nothing is below the empty key.
            Known::Nothing => std::ops::Bound::Excluded(&[][..]),
        };
        self.entries
            .range::<[u8], _>((std::ops::Bound::Unbounded, end))
            .filter_map(|(k, e)| Some((k.as_slice(), e.value.as_ref()?)))
    }
}

impl<C: MapCodec> MapLayout<C> {
    /// Reads `map_key`'s entry of a partial map from the store, unless
    /// memory has it: call it before reading or changing an entry that
    /// may be past the known ones.
    pub fn fetch(&self, at: &MapAt, map: &mut MapValue<C::Value>, map_key: &[u8]) -> Result<()> {
        if map.knows(map_key) {
            return Ok(());
        }
        let value = at
            .store
            .get(at.table, at.key_group, &at.stored_key(map_key))?;
        match value {
            Some(v) => map.load(map_key.to_vec(), self.codec.decode(&v)?),
            None => map.absent(map_key),
        }
        Ok(())
    }

    /// [`MapLayout::fetch`] of several entries, in one batched read
    /// (RocksDB's `MultiGet`): before a chunk's rows change them one by
    /// one.
    pub fn fetch_many(
        &self,
        at: &MapAt,
        map: &mut MapValue<C::Value>,
        map_keys: &[&[u8]],
    ) -> Result<()> {
        let mut missing: Vec<&[u8]> = map_keys.iter().copied().filter(|k| !map.knows(k)).collect();
        if missing.is_empty() {
            return Ok(());
        }
        missing.sort_unstable();
        missing.dedup();
        let stored: Vec<Vec<u8>> = missing.iter().map(|k| at.stored_key(k)).collect();
        let keys: Vec<(u16, &[u8])> = stored
            .iter()
            .map(|k| (at.key_group, k.as_slice()))
            .collect();
        let values = at.store.get_many(at.table, &keys)?;
        for (map_key, value) in missing.into_iter().zip(values) {
            match value {
                Some(v) => map.load(map_key.to_vec(), self.codec.decode(&v)?),
                None => map.absent(map_key),
            }
        }
        Ok(())
    }

    /// Reads the next page of a partial map's entries past the known
    /// ones (entries memory has already are kept as they are); the map
    /// is whole once the store has no more.
    pub fn extend(&self, at: &MapAt, map: &mut MapValue<C::Value>) -> Result<()> {
        let page = self.page.unwrap_or(usize::MAX);
        let from = match &map.known {
            Known::All => return Ok(()),
            Known::Nothing => at.key.to_vec(),
            Known::UpTo(bound) => {
                let mut from = at.stored_key(bound);
                from.push(0);
                from
            }
        };
        let entries = at
            .store
            .scan_prefix_from(at.table, at.key_group, at.key, &from, page)?;
        let full = entries.len() == page;
        let mut last = None;
        for e in entries {
            if self.codec.key_len(&e.key)? != at.key.len() {
                // Another key that starts with this one's bytes.
                continue;
            }
            let map_key = &e.key[at.key.len()..];
            if !map.entries.contains_key(map_key) {
                map.load(map_key.to_vec(), self.codec.decode(&e.value)?);
            }
            last = Some(map_key.to_vec());
        }
        match last {
            Some(bound) if full => map.set_known(Known::UpTo(bound)),
            // A short page: the key's entries ended.
            _ if !full => map.set_known(Known::All),
            // A full page of other keys' entries only: cannot happen with
            // prefix-free keys, and reading on would not end.
            _ => {
                return Err(storage::StorageError::Corrupt(
                    "map state key is a prefix of another".into(),
                )
                .into());
            }
        }
        Ok(())
    }

    /// The write of one map entry as memory has it.
    fn entry_write(
        &self,
        table: u64,
        key_group: u16,
        key: &[u8],
        map_key: &[u8],
        entry: &Entry<C::Value>,
    ) -> StateWrite {
        StateWrite {
            table,
            key_group,
            key: stored_key(key, map_key),
            value: entry.value.as_ref().map(|v| self.codec.encode(v)),
        }
    }

    /// Visits the map's entries as they are now, memory over the store,
    /// from `start` on (`backward`: down from it), until `visit` returns
    /// false. The store is read only while memory may lack entries, a
    /// page at a time: `first_page` entries first, twice as many each
    /// time after (up to the layout's page), so that a walk of a few
    /// entries reads few.
    pub fn walk(
        &self,
        at: Option<&MapAt>,
        map: &MapValue<C::Value>,
        start: Bound<&[u8]>,
        backward: bool,
        first_page: usize,
        mut visit: impl FnMut(&[u8], &C::Value) -> Result<bool>,
    ) -> Result<()> {
        let mut cursor: Bound<Vec<u8>> = start.map(<[u8]>::to_vec);
        let most = self.page.unwrap_or(WALK_PAGE).max(1);
        let mut page = first_page.clamp(1, most);
        loop {
            let at = match at {
                Some(at) if map.is_partial() => at,
                // Memory holds every entry.
                _ => {
                    for (k, v) in map.live_range(as_ref(&cursor), Bound::Unbounded, backward) {
                        if !visit(k, v)? {
                            break;
                        }
                    }
                    return Ok(());
                }
            };
            let stored = if backward {
                let before = match &cursor {
                    Bound::Unbounded => None,
                    Bound::Excluded(k) => Some(at.stored_key(k)),
                    Bound::Included(k) => Some(at.stored_key(&[k.as_slice(), &[0]].concat())),
                };
                at.store.scan_prefix_back(
                    at.table,
                    at.key_group,
                    at.key,
                    before.as_deref(),
                    page,
                )?
            } else {
                let from = match &cursor {
                    Bound::Unbounded => at.key.to_vec(),
                    Bound::Excluded(k) => at.stored_key(&[k.as_slice(), &[0]].concat()),
                    Bound::Included(k) => at.stored_key(k),
                };
                at.store
                    .scan_prefix_from(at.table, at.key_group, at.key, &from, page)?
            };
            let full = stored.len() == page;
            // What this round covers: up to the page's last entry, or to
            // the end when the store has no more.
            let frontier = match stored.last() {
                Some(e) if full => Bound::Included(e.key[at.key.len()..].to_vec()),
                _ => Bound::Unbounded,
            };
            let mut from_store = Vec::with_capacity(stored.len());
            for e in &stored {
                if self.codec.key_len(&e.key)? != at.key.len() {
                    // Another key that starts with this one's bytes.
                    continue;
                }
                let map_key = &e.key[at.key.len()..];
                // Memory's entry wins; in the known range, memory has all.
                if !map.entries.contains_key(map_key) && !map.knows(map_key) {
                    from_store.push((map_key, self.codec.decode(&e.value)?));
                }
            }
            let mut memory = map
                .live_range(as_ref(&cursor), as_ref(&frontier), backward)
                .peekable();
            let mut store = from_store.into_iter().peekable();
            loop {
                let take_memory = match (memory.peek(), store.peek()) {
                    (None, None) => break,
                    (Some(_), None) => true,
                    (None, Some(_)) => false,
                    (Some((m, _)), Some((s, _))) => (*m < *s) != backward,
                };
                let go_on = if take_memory {
                    let (k, v) = memory.next().expect("peeked");
                    visit(k, v)?
                } else {
                    let (k, v) = store.next().expect("peeked");
                    visit(k, &v)?
                };
                if !go_on {
                    return Ok(());
                }
            }
            if !full {
                return Ok(());
            }
            cursor = match frontier {
                Bound::Included(k) => Bound::Excluded(k),
                other => other,
            };
            page = (page * 2).min(most);
        }
    }

    /// Makes a partial map whole: every page read.
    pub fn read_whole(&self, at: &MapAt, map: &mut MapValue<C::Value>) -> Result<()> {
        while map.is_partial() {
            self.extend(at, map)?;
        }
        Ok(())
    }
}

impl<C: MapCodec> StateLayout for MapLayout<C> {
    type Value = MapValue<C::Value>;

    fn heap_size(&self, value: &Self::Value) -> usize {
        value.bytes
    }

    fn read(
        &self,
        store: &dyn StateStore,
        table: u64,
        keys: &[(u16, &[u8])],
    ) -> Result<Vec<Option<Self::Value>>> {
        keys.iter()
            .map(|(key_group, key)| {
                let mut map = MapValue {
                    known: Known::Nothing,
                    ..MapValue::default()
                };
                let at = MapAt {
                    store,
                    table,
                    key_group: *key_group,
                    key,
                };
                if self.page.is_some() {
                    self.extend(&at, &mut map)?;
                } else {
                    let entries = store.scan_prefix(table, *key_group, key)?;
                    for e in entries {
                        let value = self.codec.decode(&e.value)?;
                        map.load(e.key[key.len()..].to_vec(), value);
                    }
                    map.known = Known::All;
                }
                Ok((!map.is_empty()).then_some(map))
            })
            .collect()
    }

    fn shrink(
        &self,
        table: u64,
        key: &[u8],
        key_group: u16,
        value: &mut Option<Self::Value>,
        target: usize,
        out: &mut Vec<StateWrite>,
    ) -> bool {
        let (Some(page), Some(map)) = (self.page, value.as_mut()) else {
            return false;
        };
        // Keep the first entries within `target` bytes (a page at most),
        // then cut: what was changed past the cut is written.
        let mut kept_bytes = 0;
        let mut cut = None;
        for (kept, k) in map.entries.keys().enumerate() {
            let bytes = MapValue::<C::Value>::entry_bytes(k);
            if kept_bytes + bytes > target || kept == page {
                cut = Some(k.clone());
                break;
            }
            kept_bytes += bytes;
        }
        let Some(cut) = cut else {
            return false;
        };
        for (map_key, entry) in map.entries.split_off(&cut) {
            map.bytes -= MapValue::<C::Value>::entry_bytes(&map_key);
            if entry.value.is_some() {
                map.live -= 1;
            }
            if entry.changed {
                out.push(self.entry_write(table, key_group, key, &map_key, &entry));
            }
        }
        // Known up to the last entry kept, if they were known that far.
        let last = map.entries.keys().next_back().cloned();
        let known = match (&map.known, last) {
            (_, None) => Known::Nothing,
            (Known::All, Some(last)) => Known::UpTo(last),
            (Known::UpTo(bound), Some(last)) => Known::UpTo(bound.clone().min(last)),
            (Known::Nothing, Some(_)) => Known::Nothing,
        };
        map.set_known(known);
        true
    }

    fn read_all(&self, entries: Vec<StateEntry>) -> Result<Vec<KeyedValue<Self::Value>>> {
        // A key's entries are adjacent: one map for each run.
        let mut out: Vec<KeyedValue<Self::Value>> = Vec::new();
        for mut e in entries {
            let len = self.codec.key_len(&e.key)?;
            let value = self.codec.decode(&e.value)?;
            let map_key = e.key.split_off(len);
            match out.last_mut() {
                Some((key, key_group, map)) if *key == e.key && *key_group == e.key_group => {
                    map.load(map_key, value)
                }
                _ => {
                    let mut map = MapValue::default();
                    map.load(map_key, value);
                    out.push((e.key, e.key_group, map));
                }
            }
        }
        Ok(out)
    }

    fn write(
        &self,
        table: u64,
        key: &[u8],
        key_group: u16,
        value: &mut Option<Self::Value>,
        out: &mut Vec<StateWrite>,
    ) {
        let Some(map) = value else {
            return;
        };
        let mut freed = 0;
        map.entries.retain(|map_key, entry| {
            if entry.changed {
                entry.changed = false;
                out.push(self.entry_write(table, key_group, key, map_key, entry));
            }
            if entry.value.is_none() {
                freed += MapValue::<C::Value>::entry_bytes(map_key);
            }
            entry.value.is_some()
        });
        map.bytes -= freed;
        if map.is_empty() {
            *value = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::MemState;

    /// Keys are one length byte then the key; values are u32s.
    struct Counts;

    impl StateCodec for Counts {
        type Value = u32;
        fn encode(&self, v: &u32) -> Vec<u8> {
            v.to_be_bytes().to_vec()
        }
        fn decode(&self, b: &[u8]) -> Result<u32> {
            Ok(u32::from_be_bytes(b.try_into().unwrap()))
        }
        fn heap_size(&self, _: &u32) -> usize {
            0
        }
    }

    impl MapCodec for Counts {
        fn key_len(&self, stored: &[u8]) -> Result<usize> {
            Ok(1 + stored[0] as usize)
        }
    }

    #[test]
    fn a_walk_sees_memory_over_the_store_both_ways() {
        // The store holds entries 00..40 (even numbers) of key "k"; a
        // paged read keeps the first page (00..06), then memory changes
        // 02, deletes 10, adds 11 and fetches 20.
        let layout = MapLayout::paged(Counts, 4);
        let state = MemState::default();
        let entry = |n: u32| format!("{n:02}").into_bytes();
        state
            .put(
                (0..20)
                    .map(|i| StateWrite {
                        table: 7,
                        key_group: 3,
                        key: [&b"\x01k"[..], &entry(2 * i)].concat(),
                        value: Some((2 * i).to_be_bytes().to_vec()),
                    })
                    .collect(),
            )
            .unwrap();
        let mut map = layout.read(&state, 7, &[(3, b"\x01k")]).unwrap()[0]
            .take()
            .unwrap();
        assert!(map.is_partial());
        let at = MapAt {
            store: &state,
            table: 7,
            key_group: 3,
            key: b"\x01k",
        };
        *map.get_mut(&entry(2)).unwrap() = 200;
        layout.fetch(&at, &mut map, &entry(10)).unwrap();
        assert_eq!(map.remove(&entry(10)), Some(10));
        *map.get_or_insert_with(&entry(11), || 0) = 11;
        layout.fetch(&at, &mut map, &entry(20)).unwrap();
        let walk = |start: Bound<&[u8]>, backward: bool, take: usize| {
            let mut seen = vec![];
            layout
                .walk(Some(&at), &map, start, backward, 1, |_, v| {
                    seen.push(*v);
                    Ok(seen.len() < take)
                })
                .unwrap();
            seen
        };
        let all: Vec<u32> = (0..20)
            .map(|i| 2 * i)
            .filter(|v| *v != 10)
            .chain([11])
            .map(|v| if v == 2 { 200 } else { v })
            .collect();
        let mut sorted = all.clone();
        sorted.sort_by_key(|v| if *v == 200 { 2 } else { *v });
        assert_eq!(walk(Bound::Unbounded, false, 100), sorted);
        let mut reversed = sorted.clone();
        reversed.reverse();
        assert_eq!(walk(Bound::Unbounded, true, 100), reversed);
        assert_eq!(walk(Bound::Excluded(&entry(12)), true, 3), [11, 8, 6]);
        assert_eq!(walk(Bound::Included(&entry(12)), true, 2), [12, 11]);
        assert_eq!(walk(Bound::Excluded(&entry(4)), false, 4), [6, 8, 11, 12]);
        assert_eq!(walk(Bound::Included(&entry(38)), false, 5), [38]);
        assert_eq!(walk(Bound::Excluded(&entry(1)), true, 5), [0]);
    }

    #[test]
    fn only_changed_map_entries_are_written_and_a_key_reads_back_whole() {
        let layout = MapLayout::new(Counts);
        let mut value = Some(MapValue::default());
        let map = value.as_mut().unwrap();
        *map.get_or_insert_with(b"x", || 0) += 1;
        *map.get_or_insert_with(b"y", || 0) += 2;
        let mut writes = vec![];
        layout.write(7, b"\x01k", 3, &mut value, &mut writes);
        assert_eq!(writes.len(), 2);
        assert_eq!(writes[0].key[..2], *b"\x01k");
        let state = MemState::default();
        state.put(writes).unwrap();

        // One entry changes, one goes: two writes, not the whole map.
        let map = value.as_mut().unwrap();
        *map.get_mut(b"x").unwrap() += 10;
        assert_eq!(map.remove(b"y"), Some(2));
        assert_eq!(map.len(), 1);
        let mut writes = vec![];
        layout.write(7, b"\x01k", 3, &mut value, &mut writes);
        writes.sort_by(|a, b| a.key.cmp(&b.key));
        assert_eq!(writes[0].value, Some(11u32.to_be_bytes().to_vec()));
        assert_eq!(writes[1].value, None);
        state.put(writes).unwrap();

        let read = layout
            .read(&state, 7, &[(3, b"\x01k"), (3, b"\x01z")])
            .unwrap();
        let map = read[0].as_ref().unwrap();
        assert_eq!(map.iter().collect::<Vec<_>>(), vec![(&b"x"[..], &11)]);
        assert!(read[1].is_none(), "a key without entries has no map");

        // Emptied, the map is gone once its deletions are written.
        value.as_mut().unwrap().clear();
        let mut writes = vec![];
        layout.write(7, b"\x01k", 3, &mut value, &mut writes);
        assert_eq!(writes.len(), 1);
        assert!(value.is_none());
    }

    #[test]
    fn a_paged_map_reads_a_page_fetches_past_it_and_is_cut_back() {
        let layout = MapLayout::paged(Counts, 10);
        let state = MemState::default();
        let key = b"\x01k";
        let map_key = |i: u32| format!("{i:03}").into_bytes();
        let mut value = Some(MapValue::default());
        for i in 0..100 {
            *value
                .as_mut()
                .unwrap()
                .get_or_insert_with(&map_key(i), || 0) = i;
        }
        let mut writes = vec![];
        layout.write(7, key, 3, &mut value, &mut writes);
        // Another key, after it in the store: not read as its.
        writes.push(StateWrite {
            table: 7,
            key_group: 3,
            key: b"\x02kk000".to_vec(),
            value: Some(1u32.to_be_bytes().to_vec()),
        });
        state.put(writes).unwrap();
        let at = MapAt {
            store: &state,
            table: 7,
            key_group: 3,
            key,
        };

        // The first page only.
        let mut map = layout
            .read(&state, 7, &[(3, key)])
            .unwrap()
            .remove(0)
            .unwrap();
        assert!(map.is_partial());
        assert_eq!(map.iter().count(), 10);
        assert_eq!(map.get(&map_key(50)), None, "not known yet");
        layout.fetch(&at, &mut map, &map_key(50)).unwrap();
        assert_eq!(map.get(&map_key(50)), Some(&50));
        assert_eq!(
            map.iter().count(),
            10,
            "a fetched entry is not known in order"
        );
        *map.get_mut(&map_key(50)).unwrap() = 500;
        layout.fetch(&at, &mut map, &map_key(200)).unwrap();
        *map.get_or_insert_with(&map_key(200), || 0) = 2;
        // The next page; the changed entry stays as memory has it.
        layout.extend(&at, &mut map).unwrap();
        assert_eq!(map.iter().count(), 20);

        // Cut back to about five entries: the changed ones past the cut
        // are written, and read back when the map is read whole.
        let mut value = Some(map);
        let target = 5 * MapValue::<u32>::entry_bytes(&map_key(0));
        let mut spilled = vec![];
        assert!(layout.shrink(7, key, 3, &mut value, target, &mut spilled));
        assert_eq!(spilled.len(), 2, "50 and 200 changed");
        state.put(spilled).unwrap();
        let map = value.as_mut().unwrap();
        assert_eq!(map.len(), 5);
        assert!(map.bytes < 2 * target);
        layout.read_whole(&at, map).unwrap();
        assert!(!map.is_partial());
        let all: Vec<(Vec<u8>, u32)> = map.iter().map(|(k, v)| (k.to_vec(), *v)).collect();
        assert_eq!(all.len(), 101);
        assert_eq!(all[50], (map_key(50), 500));
        assert_eq!(all[100], (map_key(200), 2));
    }

    #[test]
    fn read_all_groups_a_tables_entries_by_key() {
        let layout = MapLayout::new(Counts);
        let entry = |kg: u16, key: &[u8], v: u32| StateEntry {
            key_group: kg,
            key: key.to_vec(),
            value: v.to_be_bytes().to_vec(),
        };
        let all = layout
            .read_all(vec![
                entry(1, b"\x01aX", 1),
                entry(1, b"\x01aY", 2),
                entry(1, b"\x02abZ", 3),
                entry(2, b"\x02abZ", 4),
            ])
            .unwrap();
        let shape: Vec<_> = all
            .iter()
            .map(|(k, kg, m)| (k.clone(), *kg, m.len()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (b"\x01a".to_vec(), 1, 2),
                (b"\x02ab".to_vec(), 1, 1),
                (b"\x02ab".to_vec(), 2, 1)
            ]
        );
        assert!(all[0].2.bytes > 0);
    }
}

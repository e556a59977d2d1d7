//! Map state (Flink's `MapState`): a key's value is a map, stored as one
//! entry per map key under the key as a prefix. A change to one map entry
//! writes that entry alone at the next barrier or eviction, however large
//! the map; a key's map is read back with one prefix scan.
//!
//! The map is sorted by its keys' bytes, as the store is, so it serves as
//! sorted-map state too: a map key encoded to compare as an `ORDER BY`
//! keeps the map, and the key's entries on disk, in that order.

use std::collections::BTreeMap;

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

/// The layout of map state whose map values `C` encodes.
pub struct MapLayout<C>(pub C);

struct Entry<V> {
    /// `None`: deleted, the deletion not yet written.
    value: Option<V>,
    /// Changed since the map was last written.
    changed: bool,
}

/// One key's map. Map values are accounted at their inline size: use it
/// for fixed-size values (counts, degrees), the map keys holding the data.
pub struct MapValue<V> {
    entries: BTreeMap<Vec<u8>, Entry<V>>,
    /// Entries with a value.
    live: usize,
    /// Heap bytes of `entries`.
    bytes: usize,
}

impl<V> Default for MapValue<V> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            live: 0,
            bytes: 0,
        }
    }
}

impl<V> MapValue<V> {
    /// What one entry costs: its key, the slot the map keeps for it and
    /// the spare room of the map's nodes.
    fn entry_bytes(key: &[u8]) -> usize {
        key.len() + std::mem::size_of::<(Vec<u8>, Entry<V>)>() * 3 / 2
    }

    fn from_entries(entries: impl IntoIterator<Item = (Vec<u8>, V)>) -> Self {
        let mut map = Self::default();
        for (key, value) in entries {
            map.load(key, value);
        }
        map
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

    /// Map keys with a value.
    pub fn len(&self) -> usize {
        self.live
    }

    pub fn is_empty(&self) -> bool {
        self.live == 0
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
            self.bytes += Self::entry_bytes(key);
            self.entries.insert(
                key.to_vec(),
                Entry {
                    value: None,
                    changed: false,
                },
            );
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

    /// The map keys with a value, and their values, in key order.
    pub fn iter(&self) -> impl Iterator<Item = (&[u8], &V)> {
        self.entries
            .iter()
            .filter_map(|(k, e)| Some((k.as_slice(), e.value.as_ref()?)))
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
                let entries = store.scan_prefix(table, *key_group, key)?;
                if entries.is_empty() {
                    return Ok(None);
                }
                let values = entries
                    .into_iter()
                    .map(|e| Ok((e.key[key.len()..].to_vec(), self.0.decode(&e.value)?)))
                    .collect::<Result<Vec<_>>>()?;
                Ok(Some(MapValue::from_entries(values)))
            })
            .collect()
    }

    fn read_all(&self, entries: Vec<StateEntry>) -> Result<Vec<KeyedValue<Self::Value>>> {
        // A key's entries are adjacent: one map for each run.
        let mut out: Vec<KeyedValue<Self::Value>> = Vec::new();
        for mut e in entries {
            let len = self.0.key_len(&e.key)?;
            let value = self.0.decode(&e.value)?;
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
                let mut stored = Vec::with_capacity(key.len() + map_key.len());
                stored.extend_from_slice(key);
                stored.extend_from_slice(map_key);
                out.push(StateWrite {
                    table,
                    key_group,
                    key: stored,
                    value: entry.value.as_ref().map(|v| self.0.encode(v)),
                });
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
    fn only_changed_map_entries_are_written_and_a_key_reads_back_whole() {
        let layout = MapLayout(Counts);
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
    fn read_all_groups_a_tables_entries_by_key() {
        let layout = MapLayout(Counts);
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

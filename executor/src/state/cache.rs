//! [`StateCache`]: an operator's keyed state, cached over its subtask's
//! [`StateStore`] and accounted to its slot's managed memory (see the
//! module docs of [`crate::state`]).
//!
//! Eviction is CLOCK, the approximation of least-recently-used that
//! buffer pools use: every touch sets a key's reference bit; the hand
//! sweeps the keys in insertion order, clearing set bits and evicting the
//! first key whose bit is already clear. It costs one bit per key and no
//! list to keep in order on every touch.

use std::ops::{Range, RangeInclusive};
use std::sync::Arc;

use indexmap::IndexMap;
use storage::memory::MemoryPool;
use storage::state::{StateEntry, StateWrite};

use super::{KeyedValue, MapAt, MapCodec, MapLayout, StateBackend, StateLayout, StateStore};
use crate::operator::OperatorContext;
use crate::{ExecError, Result};

struct Slot<V> {
    /// `None`: the key has no value (deleted here, or absent from the
    /// store).
    value: Option<V>,
    key_group: u16,
    /// What the entry is accounted as.
    bytes: usize,
    /// Changed since the last barrier (or since it was last written to
    /// the store).
    dirty: bool,
    /// CLOCK's reference bit.
    referenced: bool,
    /// In `touched`: its size is due to be measured again.
    touched: bool,
    /// The store holds a value for the key (as far as the cache wrote or
    /// read it): what its key count has counted.
    stored: bool,
}

/// Store key tag of the key counts: each cache keeps, in each key group
/// of its table, `COUNT_TAG ‖ its first byte` → its number of keys there
/// (an i64), so that `weir_catalog.state` can say how many keys an
/// operator holds without reading them. No state key starts with it.
pub const COUNT_TAG: u8 = 0xFE;

/// The number of keys a cache has in each of its subtask's key groups.
struct KeyCounts {
    /// As of the last barrier, from `key_groups.start`.
    committed: Vec<i64>,
    /// Changes since.
    delta: Vec<i64>,
    key_groups: Range<u16>,
    /// Every key group's count is known (a state from before key counts
    /// has none; it shows no count until it is rebuilt).
    known: bool,
    /// Every key group's count is in the store.
    written: bool,
}

impl KeyCounts {
    fn add(&mut self, key_group: u16, n: i64) {
        if self.key_groups.contains(&key_group) {
            self.delta[usize::from(key_group - self.key_groups.start)] += n;
        }
    }
}

/// What a cache holds and how well it serves; `weir_catalog` shows it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    pub keys: usize,
    pub bytes: usize,
    /// Touches answered from memory.
    pub hits: u64,
    /// Touches that read the store.
    pub misses: u64,
    /// Keys the cache let go of for memory.
    pub evictions: u64,
}

/// One operator's keyed state; see the module docs.
pub struct StateCache<C: StateLayout> {
    table: u64,
    codec: C,
    /// Names the operator in errors.
    operator: &'static str,
    /// The first bytes its keys may have, when the table holds other state
    /// too (an empty key counts as below every byte).
    first_bytes: RangeInclusive<u8>,
    backend: StateBackend,
    store: Option<Arc<dyn StateStore>>,
    /// `None` before [`StateCache::start`] (unit tests): unbounded.
    pool: Option<Arc<MemoryPool>>,
    map: IndexMap<Vec<u8>, Slot<C::Value>>,
    /// Indexes of entries touched since the last [`StateCache::settle`];
    /// stable until then, as only settling and checkpoints remove entries.
    touched: Vec<usize>,
    hand: usize,
    bytes: usize,
    /// Heap: the bytes reserved from the pool; rocksdb: the bytes the pool
    /// was last told the cache holds.
    reserved: usize,
    /// The cache holds every key of the store (a fresh start, nothing
    /// evicted yet): a key it lacks has no value, without a read.
    complete: bool,
    stats: CacheStats,
    /// `None` before start, and for state that lives one epoch.
    counts: Option<KeyCounts>,
    counted: bool,
    /// A value was cut back ([`StateLayout::shrink`]) since the start.
    cut_back: bool,
}

impl<C: StateLayout> StateCache<C> {
    pub fn new(table: u64, operator: &'static str, codec: C) -> Self {
        Self {
            table,
            codec,
            operator,
            first_bytes: 0..=u8::MAX,
            backend: StateBackend::Heap,
            store: None,
            pool: None,
            map: IndexMap::new(),
            touched: Vec::new(),
            hand: 0,
            bytes: 0,
            reserved: 0,
            complete: true,
            stats: CacheStats::default(),
            counts: None,
            counted: true,
            cut_back: false,
        }
    }

    /// State that lives for one epoch ([`StateCache::drain`]): no key
    /// counts.
    pub fn uncounted(mut self) -> Self {
        self.counted = false;
        self
    }

    fn count_key(&self) -> [u8; 2] {
        [COUNT_TAG, *self.first_bytes.start()]
    }

    /// The cache's keys all start with a byte in `first_bytes` (or are
    /// empty, when the range starts at 0): the rest of its table is other
    /// state (such as a [`super::TimerQueue`]'s), not read at start.
    pub fn under(mut self, first_bytes: RangeInclusive<u8>) -> Self {
        self.first_bytes = first_bytes;
        self
    }

    fn owns(&self, key: &[u8]) -> bool {
        match key.first() {
            Some(&COUNT_TAG) => false,
            Some(b) => self.first_bytes.contains(b),
            None => *self.first_bytes.start() == 0,
        }
    }

    pub fn table(&self) -> u64 {
        self.table
    }

    pub fn codec(&self) -> &C {
        &self.codec
    }

    pub fn backend(&self) -> StateBackend {
        self.backend
    }

    /// The cache as `weir_catalog.state` shows it (without the disk,
    /// which the TaskManager adds).
    pub fn report(&self) -> super::OperatorStateStats {
        super::OperatorStateStats {
            operator: self.operator.to_string(),
            table: self.table,
            backend: self.backend.name().to_string(),
            keys: self.counts.as_ref().filter(|c| c.known).map(|c| {
                let n: i64 = c.committed.iter().chain(&c.delta).sum();
                n.max(0) as u64
            }),
            keys_in_memory: self.map.len() as u64,
            bytes_in_memory: self.bytes as u64,
            bytes_on_disk: 0,
            cache_hits: self.stats.hits,
            cache_misses: self.stats.misses,
            evictions: self.stats.evictions,
        }
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            keys: self.map.len(),
            bytes: self.bytes,
            ..self.stats
        }
    }

    /// Binds the cache to its subtask's store and slot. The heap backend
    /// loads every committed key of the subtask's key groups now.
    pub fn start(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.backend = ctx.backend;
        self.store = Some(ctx.state.clone());
        self.pool = Some(ctx.memory.clone());
        match self.backend {
            StateBackend::Heap => {
                let mut entries = if self.first_bytes.start() == self.first_bytes.end() {
                    // One tag: a prefix scan per key group.
                    let tag = [*self.first_bytes.start()];
                    let mut all = Vec::new();
                    for kg in ctx.key_groups.clone() {
                        all.extend(ctx.state.scan_prefix(self.table, kg, &tag)?);
                    }
                    all
                } else {
                    ctx.state.scan(self.table, ctx.key_groups.clone())?
                };
                entries.retain(|e| self.owns(&e.key));
                let mut counts = self.new_counts(ctx, true);
                for (key, key_group, value) in self.codec.read_all(entries)? {
                    counts.add(key_group, 1);
                    self.insert_slot(key, key_group, Some(value), false);
                }
                // What was loaded is what the store holds.
                std::mem::swap(&mut counts.committed, &mut counts.delta);
                counts.written = false;
                self.counts = self.counted.then_some(counts);
                self.complete = true;
                self.settle()
            }
            StateBackend::RocksDb => {
                // A fresh subtask's store is empty; a restored one holds
                // the checkpoint, read on demand.
                self.complete = ctx.restored_from.is_none();
                let mut counts = self.new_counts(ctx, self.complete);
                if !self.complete && self.counted {
                    let key = self.count_key();
                    let at: Vec<(u16, &[u8])> = ctx
                        .key_groups
                        .clone()
                        .map(|kg| (kg, key.as_slice()))
                        .collect();
                    let stored = ctx.state.get_many(self.table, &at)?;
                    counts.known = stored.iter().all(Option::is_some);
                    counts.written = counts.known;
                    for (n, bytes) in counts.committed.iter_mut().zip(stored) {
                        if let Some(bytes) = bytes {
                            *n = crate::operator::stored_count(&bytes, "state key count")?;
                        }
                    }
                }
                self.counts = self.counted.then_some(counts);
                ctx.memory.register_cache();
                Ok(())
            }
        }
    }

    fn new_counts(&self, ctx: &OperatorContext, known: bool) -> KeyCounts {
        let n = ctx.key_groups.len();
        KeyCounts {
            committed: vec![0; n],
            delta: vec![0; n],
            key_groups: ctx.key_groups.clone(),
            known,
            written: false,
        }
    }

    /// A written-back key's value is `present` in the store now.
    fn count(counts: &mut Option<KeyCounts>, slot: &mut Slot<C::Value>, present: bool) {
        if present != slot.stored {
            if let Some(c) = counts {
                c.add(slot.key_group, if present { 1 } else { -1 });
            }
            slot.stored = present;
        }
    }

    /// A new entry for `key`, with its value in the store.
    fn insert_slot(&mut self, key: Vec<u8>, key_group: u16, value: Option<C::Value>, dirty: bool) {
        let index = self.map.len();
        let value_stored = value.is_some();
        self.map.insert(
            key,
            Slot {
                value,
                key_group,
                bytes: 0,
                dirty,
                referenced: true,
                touched: true,
                stored: value_stored,
            },
        );
        self.touched.push(index);
    }

    /// Whether a value in the cache may be partial, its layout holding
    /// only part of it: one was read from the store, or cut back.
    fn may_hold_partial_values(&self) -> bool {
        self.reads_store() || self.cut_back
    }

    /// Whether a key the cache lacks may have a value in the store (else
    /// [`StateCache::load`] has nothing to read).
    pub fn reads_store(&self) -> bool {
        !self.complete && self.store.is_some()
    }

    /// Reads the keys of `keys` the cache lacks from the store, in one
    /// batch: call it with a chunk's keys before touching them one by one.
    pub fn load<'a>(&mut self, keys: impl IntoIterator<Item = (&'a [u8], u16)>) -> Result<()> {
        if self.complete {
            return Ok(());
        }
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        let mut missing: Vec<(u16, &[u8])> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (key, key_group) in keys {
            if !self.map.contains_key(key) && seen.insert(key) {
                missing.push((key_group, key));
            }
        }
        if missing.is_empty() {
            return Ok(());
        }
        let values = self.codec.read(store.as_ref(), self.table, &missing)?;
        for ((key_group, key), value) in missing.into_iter().zip(values) {
            self.stats.misses += 1;
            self.insert_slot(key.to_vec(), key_group, value, false);
        }
        Ok(())
    }

    /// The index of `key`'s entry, read from the store if need be; `None`
    /// for a key known to have no value, which gets an entry only with
    /// `create`.
    fn find(&mut self, key: &[u8], key_group: u16, create: bool) -> Result<Option<usize>> {
        if let Some(i) = self.map.get_index_of(key) {
            self.stats.hits += 1;
            self.map[i].referenced = true;
            return Ok(Some(i));
        }
        let value = match (&self.store, self.complete) {
            (Some(store), false) => {
                self.stats.misses += 1;
                self.codec
                    .read(store.as_ref(), self.table, &[(key_group, key)])?
                    .pop()
                    .flatten()
            }
            // Absent, and nothing to remember while the cache is complete.
            _ if !create => return Ok(None),
            _ => None,
        };
        // An absent key is remembered too, so it is read once.
        self.insert_slot(key.to_vec(), key_group, value, false);
        Ok(Some(self.map.len() - 1))
    }

    /// The keys in memory with a value, and their values (in no order).
    #[cfg(test)]
    pub fn cached(&self) -> impl Iterator<Item = (&[u8], &C::Value)> {
        self.map
            .iter()
            .filter_map(|(k, s)| Some((k.as_slice(), s.value.as_ref()?)))
    }

    /// The value of `key`, if it has one.
    pub fn get(&mut self, key: &[u8], key_group: u16) -> Result<Option<&C::Value>> {
        Ok(match self.find(key, key_group, false)? {
            Some(i) => self.map[i].value.as_ref(),
            None => None,
        })
    }

    /// The value of `key` to change (set it to `None` to delete the key).
    /// The change is written at the next barrier, or when the key leaves
    /// the cache.
    pub fn get_mut(&mut self, key: &[u8], key_group: u16) -> Result<&mut Option<C::Value>> {
        let i = self.find(key, key_group, true)?.expect("created");
        let slot = &mut self.map[i];
        slot.dirty = true;
        if !slot.touched {
            slot.touched = true;
            self.touched.push(i);
        }
        Ok(&mut self.map[i].value)
    }

    /// The value of `key`, with the layout and where the key lies in the
    /// store (`None` before [`StateCache::start`]), for layouts that read
    /// a value part by part ([`super::MapLayout::extend`]). `change`: as
    /// [`StateCache::get_mut`], else as [`StateCache::get`] (what `f`
    /// reads is measured at the next settle either way). A key in memory
    /// counts no hit: this is a second look at a key the operator touched.
    pub fn get_at<R>(
        &mut self,
        key: &[u8],
        key_group: u16,
        change: bool,
        f: impl FnOnce(&C, Option<&MapAt>, &mut Option<C::Value>) -> Result<R>,
    ) -> Result<R> {
        let found = match self.map.get_index_of(key) {
            Some(i) => {
                self.map[i].referenced = true;
                Some(i)
            }
            None => self.find(key, key_group, change)?,
        };
        let Some(i) = found else {
            // Absent, and not to be changed.
            return f(&self.codec, None, &mut None);
        };
        let slot = &mut self.map[i];
        slot.dirty |= change;
        if !slot.touched {
            slot.touched = true;
            self.touched.push(i);
        }
        let at = self.store.as_deref().map(|store| MapAt {
            store,
            table: self.table,
            key_group,
            key,
        });
        f(&self.codec, at.as_ref(), &mut self.map[i].value)
    }

    /// Sets the value of `key`.
    pub fn insert(&mut self, key: &[u8], key_group: u16, value: C::Value) -> Result<()> {
        *self.get_mut(key, key_group)? = Some(value);
        Ok(())
    }

    /// Deletes `key`, returning its value.
    pub fn remove(&mut self, key: &[u8], key_group: u16) -> Result<Option<C::Value>> {
        Ok(self.get_mut(key, key_group)?.take())
    }

    /// The bytes an entry is accounted as: its key, its value and what the
    /// map spends on it.
    fn measure(codec: &C, key: &[u8], value: &Option<C::Value>) -> usize {
        const MAP: usize = 16;
        let value = value.as_ref().map_or(0, |v| codec.heap_size(v));
        key.len() + value + std::mem::size_of::<(Vec<u8>, Slot<C::Value>)>() + MAP
    }

    /// Measures what changed and keeps the cache within its share of the
    /// slot's managed memory: call it after each chunk. The rocksdb
    /// backend evicts cold keys; the heap backend fails when the slot has
    /// no memory left.
    pub fn settle(&mut self) -> Result<()> {
        // With rocksdb, one key may hold a quarter of the cache's share; a
        // larger one is cut back to an eighth, if its layout can.
        let most = match (&self.pool, self.backend) {
            (Some(pool), StateBackend::RocksDb) => Some(pool.cache_share() / 4),
            _ => None,
        };
        let mut spill = Vec::new();
        for i in std::mem::take(&mut self.touched) {
            let (key, slot) = self.map.get_index_mut(i).expect("touched index");
            let mut bytes = Self::measure(&self.codec, key, &slot.value);
            if let Some(most) = most
                && bytes > most
                && self.codec.shrink(
                    self.table,
                    key,
                    slot.key_group,
                    &mut slot.value,
                    most / 2,
                    &mut spill,
                )
            {
                bytes = Self::measure(&self.codec, key, &slot.value);
                self.cut_back = true;
            }
            slot.touched = false;
            self.bytes = self.bytes - slot.bytes + bytes;
            slot.bytes = bytes;
        }
        if !spill.is_empty() {
            self.store()?.put(spill)?;
        }
        let Some(pool) = self.pool.clone() else {
            return Ok(());
        };
        match self.backend {
            StateBackend::Heap => {
                let what = format!("the state of {}", self.operator);
                super::reserve_heap(&pool, &mut self.reserved, self.bytes, &what)?;
            }
            StateBackend::RocksDb => {
                let share = pool.cache_share();
                if self.bytes > share {
                    // Below the share, so that the next chunks do not
                    // evict again at once.
                    self.evict(share - share / 8)?;
                }
                pool.cache_resized(self.reserved, self.bytes);
                self.reserved = self.bytes;
            }
        }
        Ok(())
    }

    /// Evicts keys until the cache holds at most `target` bytes, writing
    /// the changed ones to the store.
    fn evict(&mut self, target: usize) -> Result<()> {
        let mut spill = Vec::new();
        while self.bytes > target && !self.map.is_empty() {
            if self.hand >= self.map.len() {
                self.hand = 0;
            }
            let slot = &mut self.map[self.hand];
            if slot.referenced {
                slot.referenced = false;
                self.hand += 1;
                continue;
            }
            // The last entry moves into the hand's place: look at it next.
            let (key, mut slot) = self.map.swap_remove_index(self.hand).expect("in range");
            self.bytes -= slot.bytes;
            self.stats.evictions += 1;
            if slot.dirty {
                let (table, key_group) = (self.table, slot.key_group);
                self.codec
                    .write(table, &key, key_group, &mut slot.value, &mut spill);
                let present = slot.value.is_some();
                Self::count(&mut self.counts, &mut slot, present);
            }
        }
        self.complete = false;
        if !spill.is_empty() {
            self.store()?.put(spill)?;
        }
        Ok(())
    }

    fn store(&self) -> Result<&Arc<dyn StateStore>> {
        self.store
            .as_ref()
            .ok_or_else(|| ExecError::Service("a state cache spilled before it started".into()))
    }

    /// The barrier has aligned: every key changed since the last one goes
    /// into `writes`; deleted keys leave the cache.
    pub fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) -> Result<()> {
        self.settle()?;
        let mut gone = false;
        for (key, slot) in self.map.iter_mut().filter(|(_, s)| s.dirty) {
            slot.dirty = false;
            self.codec
                .write(self.table, key, slot.key_group, &mut slot.value, writes);
            let present = slot.value.is_some();
            Self::count(&mut self.counts, slot, present);
            gone |= !present;
            // Written, a map drops the deletions it kept.
            let bytes = Self::measure(&self.codec, key, &slot.value);
            self.bytes = self.bytes - slot.bytes + bytes;
            slot.bytes = bytes;
        }
        if gone && self.complete {
            // Nothing in the store needs remembering as absent.
            let mut freed = 0;
            self.map.retain(|_, s| {
                if s.value.is_none() {
                    freed += s.bytes;
                }
                s.value.is_some()
            });
            self.bytes -= freed;
            self.hand = 0;
        }
        let key = self.count_key();
        if let Some(c) = &mut self.counts
            && c.known
        {
            for (i, kg) in c.key_groups.clone().enumerate() {
                if c.delta[i] == 0 && c.written {
                    continue;
                }
                c.committed[i] += std::mem::take(&mut c.delta[i]);
                writes.push(StateWrite {
                    table: self.table,
                    key_group: kg,
                    key: key.to_vec(),
                    value: Some(c.committed[i].to_be_bytes().to_vec()),
                });
            }
            c.written = true;
        }
        Ok(())
    }
}

/// Entries [`StateCache::drain`] hands over at a time.
const DRAIN_PAGE: usize = 4096;

impl<C: StateLayout> StateCache<C> {
    /// Empties state that lives for one epoch: hands every key with a
    /// value to `each`, a page at a time — those in memory, then those
    /// evicted to the store under `tag` (deleted there) — and leaves the
    /// cache empty. Memory stays within a page beyond the cache.
    pub fn drain(
        &mut self,
        key_groups: Range<u16>,
        tag: u8,
        mut each: impl FnMut(Vec<KeyedValue<C::Value>>) -> Result<()>,
    ) -> Result<()> {
        let evicted = !self.complete;
        let mut cached = std::collections::HashSet::new();
        let mut page = Vec::new();
        for (key, slot) in self.map.drain(..) {
            if evicted {
                cached.insert(key.clone());
            }
            if let Some(value) = slot.value {
                page.push((key, slot.key_group, value));
                if page.len() == DRAIN_PAGE {
                    each(std::mem::take(&mut page))?;
                }
            }
        }
        self.touched.clear();
        self.hand = 0;
        self.bytes = 0;
        self.complete = true;
        if let Some(c) = &mut self.counts {
            // Nothing is left, in memory or in the store.
            for (d, n) in c.delta.iter_mut().zip(&c.committed) {
                *d = -n;
            }
        }
        if evicted && let Some(store) = self.store.clone() {
            for kg in key_groups {
                let mut from = vec![tag];
                loop {
                    let entries: Vec<StateEntry> = store
                        .scan_from(self.table, kg, &from, DRAIN_PAGE)?
                        .into_iter()
                        .take_while(|e| e.key.first() == Some(&tag))
                        .collect();
                    let Some(last) = entries.last() else {
                        break;
                    };
                    from = last.key.clone();
                    from.push(0);
                    // A short page: the store or the tag ended.
                    let done = entries.len() < DRAIN_PAGE;
                    store.put(
                        entries
                            .iter()
                            .map(|e| StateWrite {
                                table: self.table,
                                key_group: kg,
                                key: e.key.clone(),
                                value: None,
                            })
                            .collect(),
                    )?;
                    let fresh: Vec<StateEntry> = entries
                        .into_iter()
                        .filter(|e| !cached.contains(&e.key))
                        .collect();
                    page.extend(self.codec.read_all(fresh)?);
                    if page.len() >= DRAIN_PAGE {
                        each(std::mem::take(&mut page))?;
                    }
                    if done {
                        break;
                    }
                }
            }
        }
        if !page.is_empty() {
            each(page)?;
        }
        self.settle()
    }
}

impl<C: StateLayout> Drop for StateCache<C> {
    fn drop(&mut self) {
        match (&self.pool, self.backend) {
            (Some(pool), StateBackend::Heap) => pool.release(self.reserved),
            (Some(pool), StateBackend::RocksDb) => pool.unregister_cache(self.reserved),
            (None, _) => {}
        }
    }
}

impl<C: MapCodec> StateCache<MapLayout<C>> {
    /// Reads the map entries that `rows` (key, key group, map key) are
    /// about to read or change, under keys memory holds part of: one
    /// batched read ([`MapLayout::fetch_many`]) per key rather than a
    /// point read per row. Nothing to do while no value may be partial.
    pub fn fetch_entries<K: AsRef<[u8]>, M: AsRef<[u8]>>(
        &mut self,
        rows: impl IntoIterator<Item = (K, u16, M)>,
    ) -> Result<()> {
        if !self.may_hold_partial_values() {
            return Ok(());
        }
        let mut wanted: IndexMap<Vec<u8>, (u16, Vec<M>)> = IndexMap::new();
        for (key, key_group, map_key) in rows {
            match wanted.get_mut(key.as_ref()) {
                Some((_, map_keys)) => map_keys.push(map_key),
                None => {
                    wanted.insert(key.as_ref().to_vec(), (key_group, vec![map_key]));
                }
            }
        }
        for (key, (key_group, map_keys)) in wanted {
            let map_keys: Vec<&[u8]> = map_keys.iter().map(AsRef::as_ref).collect();
            self.get_at(&key, key_group, false, |layout, at, map| match (at, map) {
                (Some(at), Some(map)) => layout.fetch_many(at, map, &map_keys),
                _ => Ok(()),
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx};
    use crate::state::{OUT_OF_MANAGED_MEMORY, STEP, StateCodec};

    /// Values are strings; a string's heap bytes are its length.
    struct Text;

    impl StateCodec for Text {
        type Value = String;
        fn encode(&self, v: &String) -> Vec<u8> {
            v.as_bytes().to_vec()
        }
        fn decode(&self, b: &[u8]) -> Result<String> {
            Ok(String::from_utf8_lossy(b).into_owned())
        }
        fn heap_size(&self, v: &String) -> usize {
            v.len()
        }
    }

    fn started(
        backend: StateBackend,
        pool_bytes: usize,
        state: Arc<MemState>,
        restored: bool,
    ) -> (StateCache<Text>, Arc<MemoryPool>) {
        let pool = Arc::new(MemoryPool::new(pool_bytes));
        let mut c = ctx(state);
        c.backend = backend;
        c.memory = pool.clone();
        c.restored_from = restored.then_some(1);
        let mut cache = StateCache::new(7, "Test", Text);
        cache.start(&c).unwrap();
        (cache, pool)
    }

    fn key(i: usize) -> Vec<u8> {
        format!("key-{i:06}").into_bytes()
    }

    /// The store's value of key `i` (the last write wins).
    fn stored(state: &MemState, i: usize) -> Option<Option<String>> {
        let k = key(i);
        state
            .0
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|w| w.table == 7 && w.key == k)
            .map(|w| w.value.as_ref().map(|v| String::from_utf8_lossy(v).into()))
    }

    #[test]
    fn rocksdb_evicts_cold_keys_within_the_pool_and_reads_them_back() {
        let state = Arc::new(MemState::default());
        let (mut cache, pool) = started(StateBackend::RocksDb, 2 * STEP, state.clone(), false);
        let value = "v".repeat(1000);
        for i in 0..10_000 {
            cache.insert(&key(i), 0, format!("{i}{value}")).unwrap();
            cache.settle().unwrap();
            assert!(pool.used() <= pool.capacity());
        }
        let stats = cache.stats();
        assert!(
            stats.evictions > 5_000,
            "10 MB of values in 2 MB: {stats:?}"
        );
        assert!(stats.bytes <= 2 * STEP);
        // Dirty keys went to the store as they left; every key reads back.
        assert_eq!(stored(&state, 0), Some(Some(format!("0{value}"))));
        for i in (0..10_000).step_by(997) {
            assert_eq!(cache.get(&key(i), 0).unwrap(), Some(&format!("{i}{value}")));
        }
        assert!(cache.stats().misses > 0);
        drop(cache);
        assert_eq!(pool.used(), 0, "a dropped cache gives its memory back");
    }

    #[test]
    fn hot_keys_stay_while_cold_ones_go() {
        let state = Arc::new(MemState::default());
        let (mut cache, _pool) = started(StateBackend::RocksDb, STEP, state, false);
        let value = "v".repeat(500);
        for i in 0..20_000 {
            // Key 0 is touched between every two others.
            cache.insert(&key(0), 0, value.clone()).unwrap();
            cache.insert(&key(i + 1), 0, value.clone()).unwrap();
            cache.settle().unwrap();
        }
        let misses = cache.stats().misses;
        cache.get(&key(0), 0).unwrap();
        assert_eq!(cache.stats().misses, misses, "the hot key is still cached");
    }

    #[test]
    fn checkpoint_writes_dirty_keys_once_even_after_a_spill() {
        let state = Arc::new(MemState::default());
        let (mut cache, _pool) = started(StateBackend::RocksDb, STEP, state.clone(), false);
        cache.insert(b"a", 3, "1".into()).unwrap();
        cache.insert(b"b", 3, "2".into()).unwrap();
        let mut writes = vec![];
        cache.checkpoint(&mut writes).unwrap();
        // The first checkpoint writes every key group's key count.
        let counts = writes.iter().filter(|w| w.key[0] == COUNT_TAG).count();
        assert_eq!(counts, 128);
        state.put(writes.clone()).unwrap();
        writes.retain(|w| w.key[0] != COUNT_TAG);
        assert_eq!(writes.len(), 2);
        assert_eq!(cache.report().keys, Some(2));
        // Clean now: the next checkpoint writes only what changes (and
        // key group 3's count, 2 then 1).
        *cache.get_mut(b"a", 3).unwrap() = Some("10".into());
        cache.remove(b"b", 3).unwrap();
        let mut writes = vec![];
        cache.checkpoint(&mut writes).unwrap();
        state.put(writes.clone()).unwrap();
        writes.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(writes.len(), 3);
        assert_eq!(writes[0].value.as_deref(), Some(&b"10"[..]));
        assert_eq!(writes[1].value, None, "b deleted");
        assert_eq!(writes[2].key, vec![COUNT_TAG, 0]);
        assert_eq!(writes[2].value, Some(1i64.to_be_bytes().to_vec()));
        assert_eq!(cache.stats().keys, 1, "a deleted key leaves the cache");
        assert_eq!(cache.report().keys, Some(1));

        // Dirty while the barrier comes, after part of it was spilled: the
        // store plus the checkpoint's writes hold every change.
        let value = "x".repeat(2000);
        for i in 0..2_000 {
            cache.insert(&key(i), 0, value.clone()).unwrap();
            cache.settle().unwrap();
        }
        let mut writes = vec![];
        cache.checkpoint(&mut writes).unwrap();
        state.0.lock().unwrap().extend(writes);
        for i in 0..2_000 {
            assert_eq!(stored(&state, i), Some(Some(value.clone())), "key {i}");
        }
        // Counted whether spilled or written at the barrier; a restored
        // cache reads the counts, and counts on from them.
        assert!(cache.stats().evictions > 0);
        assert_eq!(cache.report().keys, Some(2_001));
        let (mut restored, _p) = started(StateBackend::RocksDb, STEP, state.clone(), true);
        assert_eq!(restored.report().keys, Some(2_001));
        restored.remove(&key(7), 0).unwrap();
        restored.insert(b"new", 5, "n".into()).unwrap();
        restored.checkpoint(&mut vec![]).unwrap();
        assert_eq!(restored.report().keys, Some(2_001));
        restored.remove(&key(8), 0).unwrap();
        restored.checkpoint(&mut vec![]).unwrap();
        assert_eq!(restored.report().keys, Some(2_000));
        // The heap backend counts what it loads.
        let (heap, _p) = started(StateBackend::Heap, 1 << 30, state, true);
        assert_eq!(heap.report().keys, Some(2_001));
    }

    #[test]
    fn a_restored_cache_reads_the_store_and_a_fresh_one_does_not() {
        let state = Arc::new(MemState::default());
        state.0.lock().unwrap().push(StateWrite {
            table: 7,
            key_group: 1,
            key: b"k".to_vec(),
            value: Some(b"old".to_vec()),
        });
        let (mut restored, _p) = started(StateBackend::RocksDb, STEP, state.clone(), true);
        restored.load([(&b"k"[..], 1), (&b"z"[..], 1)]).unwrap();
        assert_eq!(
            restored.get(b"k", 1).unwrap().map(String::as_str),
            Some("old")
        );
        assert_eq!(restored.get(b"z", 1).unwrap(), None);
        assert_eq!(restored.stats().misses, 2, "one read each, then cached");
        assert_eq!(
            restored.report().keys,
            None,
            "a state from before key counts"
        );
        let (mut fresh, _p) = started(StateBackend::RocksDb, STEP, state.clone(), false);
        assert_eq!(fresh.get(b"k", 1).unwrap(), None, "a fresh store is empty");
        assert_eq!(fresh.stats().misses, 0);
        // The heap backend loads everything at start.
        let (mut heap, _p) = started(StateBackend::Heap, STEP, state, true);
        assert_eq!(heap.stats().keys, 1);
        assert_eq!(heap.get(b"k", 1).unwrap().map(String::as_str), Some("old"));
    }

    #[test]
    fn caches_over_rocksdb_share_the_slot_and_yield_to_heap_state() {
        let state = Arc::new(MemState::default());
        let pool = Arc::new(MemoryPool::new(4 * STEP));
        let start = |backend| {
            let mut c = ctx(state.clone());
            c.backend = backend;
            c.memory = pool.clone();
            // The heap operator's table is not the caches' (which they
            // spilled into the store).
            let table = if backend == StateBackend::Heap { 8 } else { 7 };
            let mut cache = StateCache::new(table, "Test", Text);
            cache.start(&c).unwrap();
            cache
        };
        let value = "v".repeat(1000);
        let fill = |cache: &mut StateCache<Text>, from: usize, n: usize| -> Result<()> {
            for i in from..from + n {
                cache.insert(&key(i), 0, value.clone())?;
                cache.settle()?;
            }
            Ok(())
        };
        let (mut a, mut b) = (start(StateBackend::RocksDb), start(StateBackend::RocksDb));
        fill(&mut a, 0, 10_000).unwrap();
        fill(&mut b, 10_000, 10_000).unwrap();
        // Neither starves the other: each holds about half.
        assert!(a.stats().bytes > STEP && a.stats().bytes <= 2 * STEP);
        assert!(b.stats().bytes > STEP && b.stats().bytes <= 2 * STEP);
        // Heap state in the same slot gets its memory all the same …
        let mut heap = start(StateBackend::Heap);
        fill(&mut heap, 20_000, 2_000).unwrap();
        // … and the caches give it back at their next chunk.
        fill(&mut a, 0, 1).unwrap();
        fill(&mut b, 10_000, 1).unwrap();
        assert!(pool.used() <= pool.capacity(), "{} bytes used", pool.used());
    }

    #[test]
    fn heap_fails_past_its_share_and_keeps_the_pool_for_others() {
        let state = Arc::new(MemState::default());
        let (mut cache, pool) = started(StateBackend::Heap, 2 * STEP, state, false);
        let value = "v".repeat(1000);
        let mut failed = None;
        for i in 0..10_000 {
            cache.insert(&key(i), 0, value.clone()).unwrap();
            if let Err(e) = cache.settle() {
                failed = Some((i, e.to_string()));
                break;
            }
        }
        let (at, message) = failed.expect("2 MB cannot hold 10 MB");
        assert!(at > 1000, "it used its share first: failed at {at}");
        assert!(message.starts_with(OUT_OF_MANAGED_MEMORY), "{message}");
        assert!(message.contains("state_backend"), "{message}");
        assert!(pool.used() <= pool.capacity());
    }
}

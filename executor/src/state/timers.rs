//! [`TimerQueue`]: timers in keyed state, as Flink's RocksDB timer service
//! keeps them: every timer is a store entry `tag ‖ time ‖ key` in its key's
//! key group, so the store holds them in time order; memory holds only the
//! earliest few of each key group (the *head*), read again from the store
//! when a head runs dry.
//!
//! Invariant, per key group: the head holds exactly the key group's timers
//! up to its own last one (or all of them, when `complete`), so the
//! smallest head entry is the key group's next timer.
//!
//! With the rocksdb backend, adds and removes are written to the live store
//! as they happen (batched until the next [`TimerQueue::settle`]), which is
//! consistent for the same reason evictions are (see the module docs of
//! [`crate::state`]). With the heap backend every timer is in memory,
//! accounted to the slot like heap state, and the store gets each epoch's
//! net changes at the barrier: a timer set and fired within one epoch never
//! reaches it.

use std::collections::{BTreeSet, HashMap};
use std::ops::Range;
use std::sync::Arc;

use storage::memory::MemoryPool;
use storage::state::StateWrite;

use super::{StateBackend, StateStore};
use crate::Result;
use crate::operator::OperatorContext;

/// Timers a head holds at most.
const HEAD: usize = 64;

struct Head {
    timers: BTreeSet<(i64, Vec<u8>)>,
    /// The head holds every timer of its key group.
    complete: bool,
}

/// One operator's timers; see the module docs.
pub struct TimerQueue {
    table: u64,
    tag: u8,
    store: Option<Arc<dyn StateStore>>,
    key_groups: Range<u16>,
    /// By key group, from `key_groups.start`.
    heads: Vec<Head>,
    /// Changes not yet in the store.
    writes: Vec<StateWrite>,
    backend: StateBackend,
    /// Heap: store key → (key group, set now, set in the store) for the
    /// timers changed since the last barrier.
    changed: HashMap<Vec<u8>, (u16, bool, bool)>,
    /// Heap: the timers' bytes, and those reserved from the slot's pool.
    bytes: usize,
    reserved: usize,
    pool: Option<Arc<MemoryPool>>,
}

/// What a timer in memory is accounted as.
fn timer_bytes(key: &[u8]) -> usize {
    key.len() + 64
}

/// Time as bytes that sort as the time does.
fn time_bytes(time: i64) -> [u8; 8] {
    ((time as u64) ^ (1 << 63)).to_be_bytes()
}

fn time_of(bytes: &[u8]) -> Option<i64> {
    Some((u64::from_be_bytes(bytes.try_into().ok()?) ^ (1 << 63)) as i64)
}

/// A stored timer's time and key.
fn parse(stored: &[u8]) -> Result<(i64, Vec<u8>)> {
    let time = stored
        .get(1..9)
        .and_then(time_of)
        .ok_or_else(|| storage::StorageError::Corrupt("timer key".into()))?;
    Ok((time, stored[9..].to_vec()))
}

impl Drop for TimerQueue {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.release(self.reserved);
        }
    }
}

impl TimerQueue {
    /// Timers under store keys starting with `tag` in `table` (which the
    /// operator's other state must not use as a first byte).
    pub fn new(table: u64, tag: u8) -> Self {
        Self {
            table,
            tag,
            store: None,
            key_groups: 0..0,
            heads: Vec::new(),
            writes: Vec::new(),
            backend: StateBackend::RocksDb,
            changed: HashMap::new(),
            bytes: 0,
            reserved: 0,
            pool: None,
        }
    }

    /// Binds the queue to its subtask's store: a fresh subtask has no
    /// timers; a restored one reads each key group's head when first asked.
    pub fn start(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.store = Some(ctx.state.clone());
        self.key_groups = ctx.key_groups.clone();
        self.backend = ctx.backend;
        let complete = ctx.restored_from.is_none() || self.backend == StateBackend::Heap;
        self.heads = ctx
            .key_groups
            .clone()
            .map(|_| Head {
                timers: BTreeSet::new(),
                complete,
            })
            .collect();
        if self.backend == StateBackend::Heap {
            self.pool = Some(ctx.memory.clone());
            if ctx.restored_from.is_some() {
                // Every timer, in memory.
                for (i, kg) in ctx.key_groups.clone().enumerate() {
                    for e in ctx.state.scan_prefix(self.table, kg, &[self.tag])? {
                        let timer = parse(&e.key)?;
                        self.bytes += timer_bytes(&timer.1);
                        self.heads[i].timers.insert(timer);
                    }
                }
            }
            return self.account();
        }
        self.refill()
    }

    fn heap(&self) -> bool {
        self.backend == StateBackend::Heap && self.store.is_some()
    }

    /// Heap: keeps the reservation up with the timers' bytes.
    fn account(&mut self) -> Result<()> {
        match &self.pool {
            Some(pool) => {
                super::reserve_heap(pool, &mut self.reserved, self.bytes, "an operator's timers")
            }
            None => Ok(()),
        }
    }

    fn store_key(&self, time: i64, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(9 + key.len());
        k.push(self.tag);
        k.extend_from_slice(&time_bytes(time));
        k.extend_from_slice(key);
        k
    }

    /// The head of `key_group`; before `start` (unit tests) heads are
    /// made as keys come, all complete.
    fn head(&mut self, key_group: u16) -> &mut Head {
        if self.store.is_none() && !self.key_groups.contains(&key_group) {
            let start = self.key_groups.start.min(key_group);
            let end = self.key_groups.end.max(key_group + 1);
            let mut heads: Vec<Head> = (start..end)
                .map(|_| Head {
                    timers: BTreeSet::new(),
                    complete: true,
                })
                .collect();
            for (kg, head) in self.key_groups.clone().zip(self.heads.drain(..)) {
                heads[usize::from(kg - start)] = head;
            }
            self.heads = heads;
            self.key_groups = start..end;
        }
        &mut self.heads[usize::from(key_group - self.key_groups.start)]
    }

    /// Called before the head changes.
    fn write(&mut self, time: i64, key: &[u8], key_group: u16, set: bool) {
        let held = self.heap()
            && self.heads[usize::from(key_group - self.key_groups.start)]
                .timers
                .contains(&(time, key.to_vec()));
        self.write_held(time, key, key_group, set, held);
    }

    /// `held`: the heap holds the timer (heap only), which is whether the
    /// store does if nothing changed it this epoch.
    fn write_held(&mut self, time: i64, key: &[u8], key_group: u16, set: bool, held: bool) {
        if self.heap() {
            let entry = self
                .changed
                .entry(self.store_key(time, key))
                .or_insert((key_group, held, held));
            entry.1 = set;
            if set != held {
                if set {
                    self.bytes += timer_bytes(key);
                } else {
                    self.bytes = self.bytes.saturating_sub(timer_bytes(key));
                }
            }
            return;
        }
        self.writes.push(StateWrite {
            table: self.table,
            key_group,
            key: self.store_key(time, key),
            value: set.then(Vec::new),
        });
    }

    /// Sets a timer for `key` (in `key_group`) at `time`.
    pub fn add(&mut self, time: i64, key: &[u8], key_group: u16) {
        self.write(time, key, key_group, true);
        let heap = self.heap();
        let head = self.head(key_group);
        let entry = (time, key.to_vec());
        let within = head.complete || head.timers.last().is_some_and(|last| entry < *last);
        if within {
            head.timers.insert(entry);
            if head.timers.len() > HEAD && !heap {
                head.timers.pop_last();
                head.complete = false;
            }
        }
    }

    /// Removes the timer of `key` at `time`, if there is one.
    pub fn remove(&mut self, time: i64, key: &[u8], key_group: u16) {
        self.write(time, key, key_group, false);
        self.head(key_group).timers.remove(&(time, key.to_vec()));
    }

    /// The earliest timer.
    pub fn next(&self) -> Option<i64> {
        self.heads
            .iter()
            .filter_map(|h| h.timers.first().map(|(t, _)| *t))
            .min()
    }

    /// Removes and returns the timers due at `now`, in time order: (time,
    /// key, key group).
    pub fn expired(&mut self, now: i64) -> Result<Vec<(i64, Vec<u8>, u16)>> {
        let mut out = Vec::new();
        let start = self.key_groups.start;
        loop {
            let mut due = Vec::new();
            for (i, head) in self.heads.iter_mut().enumerate() {
                while let Some((time, _)) = head.timers.first()
                    && *time <= now
                {
                    let (time, key) = head.timers.pop_first().expect("first");
                    due.push((time, key, start + i as u16));
                }
            }
            if due.is_empty() {
                out.sort();
                return Ok(out);
            }
            for (time, key, key_group) in &due {
                // Popped already: it was held.
                self.write_held(*time, key, *key_group, false, true);
            }
            out.extend(due);
            // Emptied heads read their next timers, which may be due too.
            self.refill()?;
        }
    }

    /// Writes the changes to the store and reads again the heads that ran
    /// dry: after each chunk, and before anything reads the heads.
    pub fn settle(&mut self) -> Result<()> {
        self.refill()
    }

    fn refill(&mut self) -> Result<()> {
        let Some(store) = self.store.clone() else {
            return Ok(());
        };
        if self.heap() {
            return self.account();
        }
        if !self.writes.is_empty() {
            store.put(std::mem::take(&mut self.writes))?;
        }
        let start = self.key_groups.start;
        for (i, head) in self.heads.iter_mut().enumerate() {
            if head.complete || !head.timers.is_empty() {
                continue;
            }
            let key_group = start + i as u16;
            let page = store.scan_from(self.table, key_group, &[self.tag], HEAD + 1)?;
            let mut found = 0;
            for e in page
                .into_iter()
                .filter(|e| e.key.first() == Some(&self.tag))
            {
                found += 1;
                if found > HEAD {
                    break;
                }
                head.timers.insert(parse(&e.key)?);
            }
            head.complete = found <= HEAD;
        }
        Ok(())
    }

    /// The barrier has aligned: changes not yet in the store go into
    /// `writes`.
    pub fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) {
        writes.append(&mut self.writes);
        for (key, (key_group, set, stored)) in self.changed.drain() {
            if set != stored {
                writes.push(StateWrite {
                    table: self.table,
                    key_group,
                    key,
                    value: set.then(Vec::new),
                });
            }
        }
    }

    /// Timers held in memory.
    pub fn in_memory(&self) -> usize {
        self.heads.iter().map(|h| h.timers.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx};

    fn started(state: Arc<MemState>, restored: bool) -> TimerQueue {
        started_with(state, restored, StateBackend::RocksDb)
    }

    fn started_with(state: Arc<MemState>, restored: bool, backend: StateBackend) -> TimerQueue {
        let mut c = ctx(state);
        c.key_groups = 4..8;
        c.restored_from = restored.then_some(1);
        c.backend = backend;
        let mut q = TimerQueue::new(3, b't');
        q.start(&c).unwrap();
        q
    }

    #[test]
    fn timers_fire_in_time_order_across_key_groups_with_bounded_heads() {
        let state = Arc::new(MemState::default());
        let mut q = started(state.clone(), false);
        // 1,000 timers over four key groups, in an order that is not time's.
        for i in 0..1000i64 {
            let time = (i * 7919) % 1000 - 500;
            q.add(time, format!("k{i}").as_bytes(), 4 + (i % 4) as u16);
        }
        q.settle().unwrap();
        assert!(q.in_memory() <= 4 * HEAD, "{} in memory", q.in_memory());
        assert_eq!(q.next(), Some(-500));
        // A removed timer does not fire.
        let gone = (0..1000i64)
            .find(|i| (i * 7919) % 1000 - 500 == -499)
            .unwrap();
        q.remove(-499, format!("k{gone}").as_bytes(), 4 + (gone % 4) as u16);
        let fired = q.expired(0).unwrap();
        let times: Vec<i64> = fired.iter().map(|(t, _, _)| *t).collect();
        assert_eq!(times.len(), 500, "-500 ..= 0 but -499");
        assert!(times.windows(2).all(|w| w[0] <= w[1]), "in time order");
        assert!(!times.contains(&-499));
        q.settle().unwrap();
        assert_eq!(q.next(), Some(1));

        // A restored queue reads its heads from the store.
        let mut writes = vec![];
        q.checkpoint(&mut writes);
        state.put(writes).unwrap();
        let mut r = started(state, true);
        assert_eq!(r.next(), Some(1));
        let rest = r.expired(i64::MAX).unwrap();
        assert_eq!(rest.len(), 499);
        assert_eq!(rest[0].0, 1);
        r.settle().unwrap();
        assert_eq!(r.next(), None);
    }

    #[test]
    fn heap_timers_stay_in_memory_and_reach_the_store_as_each_epochs_net_change() {
        let state = Arc::new(MemState::default());
        let mut q = started_with(state.clone(), false, StateBackend::Heap);
        for i in 0..1000i64 {
            q.add(i, format!("k{i}").as_bytes(), 4 + (i % 4) as u16);
        }
        q.settle().unwrap();
        assert_eq!(q.in_memory(), 1000, "all of them");
        assert!(state.0.lock().unwrap().is_empty(), "nothing written yet");
        // Fired or removed within the epoch: never written.
        assert_eq!(q.expired(99).unwrap().len(), 100);
        q.remove(500, b"k500", 4);
        q.settle().unwrap();
        let mut writes = vec![];
        q.checkpoint(&mut writes);
        assert_eq!(writes.len(), 899);
        assert!(writes.iter().all(|w| w.value.is_some()));
        state.put(writes).unwrap();
        // The next epoch fires some of those: their deletes.
        assert_eq!(q.expired(199).unwrap().len(), 100);
        let mut writes = vec![];
        q.checkpoint(&mut writes);
        assert_eq!(writes.len(), 100);
        assert!(writes.iter().all(|w| w.value.is_none()));
        state.put(writes).unwrap();
        // A restored heap queue holds them all again.
        let mut r = started_with(state, true, StateBackend::Heap);
        assert_eq!(r.in_memory(), 799);
        assert_eq!(r.next(), Some(200));
        let rest = r.expired(i64::MAX).unwrap();
        assert_eq!(rest.len(), 799);
        assert!(!rest.iter().any(|(t, _, _)| *t == 500));
    }
}

//! State TTL (Flink's idle state retention): when each piece of keyed
//! state was last written, so that what no row has written for the TTL can
//! be forgotten on a processing-time timer. HashAgg forgets groups, HashJoin
//! the rows of a join key on one side.

use std::collections::{BTreeSet, HashMap};
use std::hash::Hash;

pub(crate) struct Ttl<K> {
    ttl_us: i64,
    /// Key → (expiry, key group).
    expires: HashMap<K, (i64, u16)>,
    /// (expiry, key), in expiry order.
    queue: BTreeSet<(i64, K)>,
}

impl<K: Hash + Eq + Ord + Clone> Ttl<K> {
    pub(crate) fn new(ttl_us: i64) -> Self {
        Self {
            ttl_us,
            expires: HashMap::new(),
            queue: BTreeSet::new(),
        }
    }

    /// `key` (in `key_group`) was written at `now`.
    pub(crate) fn touch(&mut self, key: K, key_group: u16, now: i64) {
        let at = now.saturating_add(self.ttl_us);
        if let Some((old, _)) = self.expires.insert(key.clone(), (at, key_group)) {
            self.queue.remove(&(old, key.clone()));
        }
        self.queue.insert((at, key));
    }

    /// The next expiry, if any.
    pub(crate) fn next(&self) -> Option<i64> {
        self.queue.first().map(|(at, _)| *at)
    }

    /// Keys whose time is up at `now`, with their key groups; forgotten.
    pub(crate) fn expired(&mut self, now: i64) -> Vec<(K, u16)> {
        let mut out = Vec::new();
        while let Some((at, _)) = self.queue.first()
            && *at <= now
        {
            let Some((_, key)) = self.queue.pop_first() else {
                break;
            };
            if let Some((_, kg)) = self.expires.remove(&key) {
                out.push((key, kg));
            }
        }
        out
    }
}

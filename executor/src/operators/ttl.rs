//! State TTL (Flink's idle state retention): when each piece of keyed
//! state was last written, so that what no row has written for the TTL can
//! be forgotten on a processing-time timer. HashAgg forgets groups, HashJoin
//! the rows of a join key on one side.
//!
//! The clock is keyed state too, in the operator's own table: each key's
//! expiry is value state under [`EXPIRY`] ‖ key, and its timer is in a
//! [`TimerQueue`] under [`TIMERS`]. Memory holds only the hot keys'
//! expiries and each key group's next few timers, as with any state, and
//! a restored job's keys keep the expiries they had (Flink's TTL stores the
//! last-write time with the value, too).
//!
//! Expiries are rounded up to a step of 1 % of the TTL (at most a second),
//! so that a key written again and again within a step changes nothing: a
//! key is forgotten at most one step later than its TTL says, never sooner.

use storage::state::StateWrite;

use crate::Result;
use crate::operator::OperatorContext;
use crate::state::{I64Codec, OperatorStateStats, StateCache, TimerQueue};

/// Store key tag of the expiries. The operator's own keys must not start
/// with it: Arrow's row format, in which operators encode keys, starts
/// every key with a byte below 3.
pub(crate) const EXPIRY: u8 = 0x20;
/// Store key tag of the timers.
pub(crate) const TIMERS: u8 = 0x21;

pub(crate) struct Ttl {
    ttl_us: i64,
    step_us: i64,
    /// [`EXPIRY`] ‖ key → when the key expires.
    expiries: StateCache<I64Codec>,
    /// A timer per key at its expiry.
    timers: TimerQueue,
}

fn tagged(key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key.len());
    k.push(EXPIRY);
    k.extend_from_slice(key);
    k
}

impl Ttl {
    /// A TTL of `ttl_us` over the keys of `operator`'s state `table`.
    pub(crate) fn new(table: u64, operator: &'static str, ttl_us: i64) -> Self {
        let ttl_us = ttl_us.max(1);
        Self {
            ttl_us,
            step_us: (ttl_us / 100).clamp(1, 1_000_000),
            expiries: StateCache::new(table, operator, I64Codec("state TTL expiry"))
                .under(EXPIRY..=EXPIRY),
            timers: TimerQueue::new(table, TIMERS),
        }
    }

    pub(crate) fn start(&mut self, ctx: &OperatorContext) -> Result<()> {
        self.expiries.start(ctx)?;
        self.timers.start(ctx)
    }

    /// Reads the expiries of `keys` the cache lacks, in one batch.
    pub(crate) fn load<'a>(
        &mut self,
        keys: impl IntoIterator<Item = (&'a [u8], u16)>,
    ) -> Result<()> {
        if !self.expiries.reads_store() {
            return Ok(());
        }
        let keys: Vec<(Vec<u8>, u16)> = keys.into_iter().map(|(k, kg)| (tagged(k), kg)).collect();
        self.expiries
            .load(keys.iter().map(|(k, kg)| (k.as_slice(), *kg)))
    }

    /// `key` (in `key_group`) was written at `now`.
    pub(crate) fn touch(&mut self, key: &[u8], key_group: u16, now: i64) -> Result<()> {
        let due = now.saturating_add(self.ttl_us);
        let at = due.saturating_add(self.step_us - 1) / self.step_us * self.step_us;
        let expiry = self.expiries.get_mut(&tagged(key), key_group)?;
        match *expiry {
            Some(old) if old >= at => return Ok(()),
            Some(old) => self.timers.remove(old, key, key_group),
            None => {}
        }
        *expiry = Some(at);
        self.timers.add(at, key, key_group);
        Ok(())
    }

    /// The next expiry, if any.
    pub(crate) fn next(&self) -> Option<i64> {
        self.timers.next()
    }

    /// Keys whose time is up at `now`, with their key groups; forgotten.
    pub(crate) fn expired(&mut self, now: i64) -> Result<Vec<(Vec<u8>, u16)>> {
        let due = self.timers.expired(now)?;
        let mut out = Vec::with_capacity(due.len());
        for (_, key, key_group) in due {
            self.expiries.remove(&tagged(&key), key_group)?;
            out.push((key, key_group));
        }
        Ok(out)
    }

    /// Keeps memory within bounds and writes the timers' changes: after
    /// each chunk or timer.
    pub(crate) fn settle(&mut self) -> Result<()> {
        self.expiries.settle()?;
        self.timers.settle()
    }

    pub(crate) fn checkpoint(&mut self, writes: &mut Vec<StateWrite>) -> Result<()> {
        self.expiries.checkpoint(writes)?;
        self.timers.checkpoint(writes);
        Ok(())
    }

    pub(crate) fn report(&self) -> OperatorStateStats {
        let mut stats = self.expiries.report();
        stats.operator = format!("{} (state TTL)", stats.operator);
        stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{MemState, ctx};
    use crate::state::StateStore;
    use std::sync::Arc;

    #[test]
    fn a_key_expires_a_ttl_after_its_last_write_and_keeps_its_expiry_across_a_restore() {
        let state = Arc::new(MemState::default());
        let mut ttl = Ttl::new(5, "Test", 1_000_000);
        ttl.start(&ctx(state.clone())).unwrap();
        ttl.touch(b"a", 1, 0).unwrap();
        ttl.touch(b"b", 2, 0).unwrap();
        // Written again later: its first timer goes.
        ttl.touch(b"a", 1, 500_000).unwrap();
        // Within the same step: nothing changes.
        ttl.touch(b"a", 1, 505_000).unwrap();
        ttl.settle().unwrap();
        assert_eq!(ttl.next(), Some(1_000_000));
        assert_eq!(ttl.expired(999_999).unwrap(), vec![]);
        assert_eq!(ttl.expired(1_000_000).unwrap(), vec![(b"b".to_vec(), 2)]);
        ttl.settle().unwrap();
        assert_eq!(ttl.next(), Some(1_510_000), "rounded up to a 10 ms step");

        let mut writes = vec![];
        ttl.checkpoint(&mut writes).unwrap();
        state.put(writes).unwrap();
        let mut again = Ttl::new(5, "Test", 1_000_000);
        let mut c = ctx(state);
        c.restored_from = Some(1);
        again.start(&c).unwrap();
        assert_eq!(again.next(), Some(1_510_000));
        assert_eq!(again.expired(i64::MAX).unwrap(), vec![(b"a".to_vec(), 1)]);
        again.settle().unwrap();
        assert_eq!(again.next(), None);
    }
}

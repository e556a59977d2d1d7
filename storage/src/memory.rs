//! Managed memory, as Flink defines it: a TaskManager's memory for state,
//! split equally among its slots, each share split again between RocksDB
//! (block cache and write buffers, [`crate::SlotMemory`]) and the caches of
//! the operators running in the slot ([`MemoryPool`]).
//!
//! Two kinds of cache draw on a slot's operator pool:
//!
//! * a heap-backed operator's state *is* its cache: it **reserves** bytes
//!   before it grows ([`MemoryPool::try_reserve`]), and when the heap
//!   reservations of the slot would pass the pool, it fails its job
//!   instead of growing the process without bound;
//! * a cache over RocksDB holds only hot keys and can always shrink: it
//!   **registers** ([`MemoryPool::register_cache`]) and keeps itself within
//!   an equal share of what the heap reservations leave
//!   ([`MemoryPool::cache_share`]), evicting cold keys to stay there. A
//!   heap operator that grows thus takes memory from the caches, which
//!   give it back at their next chunk, and no cache starves another.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The operator share of one slot's managed memory; see the module docs.
#[derive(Debug)]
pub struct MemoryPool {
    capacity: usize,
    /// Bytes reserved by heap-backed operators.
    reserved: AtomicUsize,
    /// Bytes held by the caches over RocksDB (for reporting).
    cached: AtomicUsize,
    /// Caches over RocksDB registered now.
    caches: AtomicUsize,
}

impl MemoryPool {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            reserved: AtomicUsize::new(0),
            cached: AtomicUsize::new(0),
            caches: AtomicUsize::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes the slot's operators hold now: reserved and cached.
    pub fn used(&self) -> usize {
        self.reserved.load(Ordering::Relaxed) + self.cached.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` for a heap-backed operator if the heap
    /// reservations stay within the pool.
    pub fn try_reserve(&self, bytes: usize) -> bool {
        update(&self.reserved, |used| {
            used.checked_add(bytes).filter(|n| *n <= self.capacity)
        })
    }

    /// Gives back `bytes` reserved before.
    pub fn release(&self, bytes: usize) {
        update(&self.reserved, |used| Some(used.saturating_sub(bytes)));
    }

    /// A cache over RocksDB starts drawing on the pool.
    pub fn register_cache(&self) {
        self.caches.fetch_add(1, Ordering::Relaxed);
    }

    /// A cache that held `bytes` stops drawing on the pool.
    pub fn unregister_cache(&self, bytes: usize) {
        update(&self.caches, |n| Some(n.saturating_sub(1)));
        self.cache_resized(bytes, 0);
    }

    /// A registered cache went from `before` to `after` bytes.
    pub fn cache_resized(&self, before: usize, after: usize) {
        update(&self.cached, |n| Some(n.saturating_sub(before) + after));
    }

    /// The bytes each registered cache may hold: an equal share of what
    /// the heap reservations leave.
    pub fn cache_share(&self) -> usize {
        let free = self
            .capacity
            .saturating_sub(self.reserved.load(Ordering::Relaxed));
        free / self.caches.load(Ordering::Relaxed).max(1)
    }
}

/// Applies `f` to `counter` atomically; `false` if `f` refused.
fn update(counter: &AtomicUsize, f: impl Fn(usize) -> Option<usize>) -> bool {
    counter
        .fetch_update(Ordering::AcqRel, Ordering::Relaxed, f)
        .is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stay_within_capacity() {
        let pool = MemoryPool::new(100);
        assert!(pool.try_reserve(60));
        assert!(!pool.try_reserve(41), "60 + 41 > 100");
        assert!(pool.try_reserve(40));
        assert_eq!(pool.used(), 100);
        pool.release(70);
        assert_eq!(pool.used(), 30);
        assert!(pool.try_reserve(70));
        pool.release(1000);
        assert_eq!(pool.used(), 0, "never below zero");
    }

    #[test]
    fn caches_share_what_reservations_leave() {
        let pool = MemoryPool::new(100);
        pool.register_cache();
        pool.register_cache();
        assert_eq!(pool.cache_share(), 50);
        pool.cache_resized(0, 50);
        // A heap operator may reserve past what the caches hold now: they
        // shrink to their new share.
        assert!(pool.try_reserve(60));
        assert_eq!(pool.cache_share(), 20);
        pool.unregister_cache(50);
        assert_eq!(pool.cache_share(), 40);
        assert_eq!(pool.used(), 60);
    }
}

//! How a [`StateCache`](super::StateCache)'s values lie in the store.
//!
//! Two shapes, as in Flink's `ValueState` and `MapState`:
//!
//! * **value state**: one store entry per key, its value encoded whole
//!   (any [`StateCodec`]): a group's accumulators, a row's count;
//! * **map state** ([`MapLayout`]): one store entry per key *and* map key,
//!   under the key as a prefix, so that a change to one map entry writes
//!   that entry only and a key's whole map is read with one prefix scan: a
//!   join key's rows.

use storage::state::{StateEntry, StateWrite};

use super::StateStore;
use crate::Result;

/// How one operator's values become bytes and back, and what a value
/// costs in memory.
pub trait StateCodec {
    type Value;
    fn encode(&self, value: &Self::Value) -> Vec<u8>;
    fn decode(&self, bytes: &[u8]) -> Result<Self::Value>;
    /// Heap bytes a value owns beyond its own `size_of`.
    fn heap_size(&self, value: &Self::Value) -> usize;
}

/// An i64 as 8 big-endian bytes (a count, a time); the name says what it
/// is when stored bytes are not 8.
pub struct I64Codec(pub &'static str);

impl StateCodec for I64Codec {
    type Value = i64;

    fn encode(&self, value: &i64) -> Vec<u8> {
        value.to_be_bytes().to_vec()
    }

    fn decode(&self, bytes: &[u8]) -> Result<i64> {
        crate::operator::stored_count(bytes, self.0)
    }

    fn heap_size(&self, _: &i64) -> usize {
        0
    }
}

/// A key, its key group and its value, as a table scan yields them.
pub type KeyedValue<V> = (Vec<u8>, u16, V);

/// How a cached value is read from and written to the store.
pub trait StateLayout {
    type Value;

    /// Heap bytes a value owns beyond its own `size_of`.
    fn heap_size(&self, value: &Self::Value) -> usize;

    /// The values of `keys` (key group, key) in the store, in order.
    fn read(
        &self,
        store: &dyn StateStore,
        table: u64,
        keys: &[(u16, &[u8])],
    ) -> Result<Vec<Option<Self::Value>>>;

    /// Every key's value from a scan of the table (in key order).
    fn read_all(&self, entries: Vec<StateEntry>) -> Result<Vec<KeyedValue<Self::Value>>>;

    /// Cuts a value that outgrew its share of the cache down to about
    /// `target` bytes, pushing the writes of what it lets go of; `false`
    /// when the layout keeps values whole (the default).
    fn shrink(
        &self,
        _table: u64,
        _key: &[u8],
        _key_group: u16,
        _value: &mut Option<Self::Value>,
        _target: usize,
        _out: &mut Vec<StateWrite>,
    ) -> bool {
        false
    }

    /// The writes that bring the store up to date with a changed key's
    /// value; the value is clean after them. A value that turns out to
    /// hold nothing becomes `None`.
    fn write(
        &self,
        table: u64,
        key: &[u8],
        key_group: u16,
        value: &mut Option<Self::Value>,
        out: &mut Vec<StateWrite>,
    );
}

/// Value state: a key's value is one store entry.
impl<C: StateCodec> StateLayout for C {
    type Value = C::Value;

    fn heap_size(&self, value: &C::Value) -> usize {
        StateCodec::heap_size(self, value)
    }

    fn read(
        &self,
        store: &dyn StateStore,
        table: u64,
        keys: &[(u16, &[u8])],
    ) -> Result<Vec<Option<C::Value>>> {
        store
            .get_many(table, keys)?
            .into_iter()
            .map(|v| v.map(|v| self.decode(&v)).transpose())
            .collect()
    }

    fn read_all(&self, entries: Vec<StateEntry>) -> Result<Vec<KeyedValue<C::Value>>> {
        entries
            .into_iter()
            .map(|e| Ok((e.key, e.key_group, self.decode(&e.value)?)))
            .collect()
    }

    fn write(
        &self,
        table: u64,
        key: &[u8],
        key_group: u16,
        value: &mut Option<C::Value>,
        out: &mut Vec<StateWrite>,
    ) {
        out.push(StateWrite {
            table,
            key_group,
            key: key.to_vec(),
            value: value.as_ref().map(|v| self.encode(v)),
        });
    }
}

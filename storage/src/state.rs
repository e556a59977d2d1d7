//! Operator state as keys: what operators write at a checkpoint barrier
//! ([`StateWrite`]) and read back when they start ([`StateEntry`]), laid
//! out in RocksDB by table and key group (see [`crate::keys`]) so a
//! subtask's key groups are one range scan.

use crate::keys;
use crate::{KvStore, Result};

/// One key written by an operator at a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateWrite {
    pub table: u64,
    pub key_group: u16,
    pub key: Vec<u8>,
    /// `None` deletes the key.
    pub value: Option<Vec<u8>>,
}

/// A committed state entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateEntry {
    pub key_group: u16,
    pub key: Vec<u8>,
    pub value: Vec<u8>,
}

/// Reads committed state entries.
pub trait StateScan {
    /// The entries of `table` in `key_groups`, in key order.
    fn scan_state(&self, table: u64, key_groups: std::ops::Range<u16>) -> Result<Vec<StateEntry>>;

    /// At most `limit` entries of `table` in one key group, in key order,
    /// from key `from` on: a page of a range that may be large.
    fn scan_state_from(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>>;

    /// The entries of `table` in `key_group` whose keys start with
    /// `prefix`, in key order: one key's map state.
    fn scan_state_prefix(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
    ) -> Result<Vec<StateEntry>>;

    /// At most `limit` of the entries [`StateScan::scan_state_prefix`]
    /// yields, from key `from` on: a page of one key's map state.
    fn scan_state_prefix_from(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>>;

    /// At most `limit` of the entries [`StateScan::scan_state_prefix`]
    /// yields, below key `before` (`None`: from the last), last first: a
    /// page of one key's map state read backwards.
    fn scan_state_prefix_back(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<StateEntry>>;
}

impl KvStore {
    /// Writes operator state, atomically.
    pub fn write_state(&self, writes: Vec<StateWrite>) -> Result<()> {
        self.write(
            writes
                .into_iter()
                .map(|w| (keys::state_key(w.table, w.key_group, &w.key), w.value)),
            false,
        )
    }

    /// Deletes the keys of `table` in `key_group` from `from` up to, not
    /// including, `to`: one range tombstone, however many keys.
    pub fn delete_state_range(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        to: &[u8],
    ) -> Result<()> {
        self.delete_range(
            &keys::state_key(table, key_group, from),
            &keys::state_key(table, key_group, to),
            false,
        )
    }

    /// The value of one state key.
    pub fn get_state(&self, table: u64, key_group: u16, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.get(&keys::state_key(table, key_group, key))
    }

    /// The values of several keys of `table`, in order.
    pub fn get_states(&self, table: u64, keys: &[(u16, &[u8])]) -> Result<Vec<Option<Vec<u8>>>> {
        let raw: Vec<Vec<u8>> = keys
            .iter()
            .map(|(kg, k)| keys::state_key(table, *kg, k))
            .collect();
        self.multi_get(&raw)
    }

    /// Writes entries of `table` restored from elsewhere.
    pub fn import_state(&self, table: u64, entries: Vec<StateEntry>) -> Result<()> {
        self.write(
            entries
                .into_iter()
                .map(|e| (keys::state_key(table, e.key_group, &e.key), Some(e.value))),
            false,
        )
    }
}

/// Raw state keys and values as entries.
fn entries(pairs: Vec<(Vec<u8>, Vec<u8>)>) -> Vec<StateEntry> {
    pairs
        .into_iter()
        .map(|(k, v)| {
            let (key_group, key) = keys::split_state_key(&k);
            StateEntry {
                key_group,
                key: key.to_vec(),
                value: v,
            }
        })
        .collect()
}

impl StateScan for KvStore {
    fn scan_state(&self, table: u64, key_groups: std::ops::Range<u16>) -> Result<Vec<StateEntry>> {
        let (from, to) = keys::state_range(table, key_groups);
        Ok(entries(self.scan(&from, &to, usize::MAX)?))
    }

    fn scan_state_from(
        &self,
        table: u64,
        key_group: u16,
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let start = keys::state_key(table, key_group, from);
        let (_, end) = keys::state_range(table, key_group..key_group + 1);
        Ok(entries(self.scan(&start, &end, limit)?))
    }

    fn scan_state_prefix(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
    ) -> Result<Vec<StateEntry>> {
        self.scan_state_prefix_from(table, key_group, prefix, prefix, usize::MAX)
    }

    fn scan_state_prefix_from(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        from: &[u8],
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let end = keys::prefix_end(&keys::state_key(table, key_group, prefix))
            .unwrap_or_else(|| keys::state_range(table, key_group..key_group + 1).1);
        let start = keys::state_key(table, key_group, from.max(prefix));
        Ok(entries(self.scan(&start, &end, limit)?))
    }

    fn scan_state_prefix_back(
        &self,
        table: u64,
        key_group: u16,
        prefix: &[u8],
        before: Option<&[u8]>,
        limit: usize,
    ) -> Result<Vec<StateEntry>> {
        let start = keys::state_key(table, key_group, prefix);
        let end = keys::prefix_end(&start)
            .unwrap_or_else(|| keys::state_range(table, key_group..key_group + 1).1);
        let end = match before {
            Some(before) => end.min(keys::state_key(table, key_group, before)),
            None => end,
        };
        Ok(entries(self.scan_back(&start, &end, limit)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(table: u64, kg: u16, key: &str, value: Option<&str>) -> StateWrite {
        StateWrite {
            table,
            key_group: kg,
            key: key.into(),
            value: value.map(|v| v.into()),
        }
    }

    #[test]
    fn writes_scan_by_table_and_key_group() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), 1 << 20).unwrap();
        kv.write_state(vec![
            w(7, 3, "a", Some("1")),
            w(7, 90, "b", Some("x")),
            w(8, 3, "a", Some("other table")),
        ])
        .unwrap();
        assert_eq!(kv.scan_state(7, 0..128).unwrap().len(), 2);
        assert_eq!(kv.scan_state(7, 64..128).unwrap()[0].key, b"b");
        kv.write_state(vec![w(7, 3, "c", Some("2")), w(7, 4, "d", Some("3"))])
            .unwrap();
        let prefixed = kv.scan_state_prefix(7, 3, b"").unwrap();
        assert_eq!(prefixed.len(), 2, "all of key group 3");
        assert_eq!(kv.scan_state_prefix(7, 3, b"c").unwrap()[0].value, b"2");
        assert!(kv.scan_state_prefix(7, 4, b"a").unwrap().is_empty());
        let page = kv.scan_state_prefix_from(7, 3, b"", b"b", 1).unwrap();
        assert_eq!(page.len(), 1);
        assert_eq!(page[0].key, b"c");
        assert!(
            kv.scan_state_prefix_from(7, 3, b"a", b"a\0", 5)
                .unwrap()
                .is_empty()
        );
        let page = kv.scan_state_from(7, 3, b"b", 10).unwrap();
        assert_eq!(page.len(), 1, "from b in key group 3: only c");
        assert_eq!(page[0].key, b"c");
        assert_eq!(kv.scan_state_from(7, 3, b"", 1).unwrap()[0].key, b"a");
        kv.write_state(vec![
            w(7, 3, "a", None),
            w(7, 3, "c", None),
            w(7, 4, "d", None),
        ])
        .unwrap();
        assert_eq!(kv.scan_state(7, 0..64).unwrap().len(), 0);
    }

    #[test]
    fn a_prefix_scans_backwards_in_pages() {
        let dir = tempfile::tempdir().unwrap();
        let kv = KvStore::open(dir.path(), 1 << 20).unwrap();
        kv.write_state(vec![
            w(7, 3, "a", Some("before the prefix")),
            w(7, 3, "p1", Some("1")),
            w(7, 3, "p2", Some("2")),
            w(7, 3, "p3", Some("3")),
            w(7, 3, "q", Some("after the prefix")),
            w(7, 4, "p0", Some("another key group")),
        ])
        .unwrap();
        let keys = |entries: Vec<StateEntry>| {
            entries
                .into_iter()
                .map(|e| String::from_utf8(e.key).unwrap())
                .collect::<Vec<_>>()
        };
        let all = kv.scan_state_prefix_back(7, 3, b"p", None, 10).unwrap();
        assert_eq!(keys(all), ["p3", "p2", "p1"]);
        let below = kv.scan_state_prefix_back(7, 3, b"p", Some(b"p3"), 1);
        assert_eq!(keys(below.unwrap()), ["p2"], "below p3, one entry");
        let rest = kv.scan_state_prefix_back(7, 3, b"p", Some(b"p1"), 10);
        assert!(rest.unwrap().is_empty(), "nothing of the prefix below p1");
        let whole = kv.scan_state_prefix_back(7, 4, b"", None, 10).unwrap();
        assert_eq!(keys(whole), ["p0"]);
    }
}

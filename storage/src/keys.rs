//! Key layout. Every key starts with a one-byte space tag, then big-endian
//! ids so that related keys sort together and ranges can be scanned and
//! deleted.
//!
//! Meta store:
//! * `C id` → catalog entry (JSON)
//! * `I name` → id counters
//! * `A name` → a role: its attributes, password secret and grants (JSON)
//! * `N name` → a schema users created (JSON)
//! * `R table row-key` → a table row
//! * `L table seq` → a table change-log entry (Arrow IPC)
//! * `S table` → the table's last log sequence number and next hidden row id
//! * `W table job subtask` → the last checkpoint an ingesting writer applied
//!   (before writers were named by job: `W table subtask`, read still)
//! * `T table seq` → the commit number of a log entry written together with
//!   other tables' (a transaction's); `T` alone → the last commit number
//!
//! A subtask's state backend:
//! * `s table key-group key` → operator state

pub const CATALOG: u8 = b'C';
pub const COUNTER: u8 = b'I';
pub const ROLE: u8 = b'A';
pub const SCHEMA: u8 = b'N';
pub const TABLE_ROW: u8 = b'R';
pub const TABLE_LOG: u8 = b'L';
pub const TABLE_ROW_ID: u8 = b'S';
pub const TABLE_INGEST: u8 = b'W';
pub const TABLE_COMMIT: u8 = b'T';
pub const STATE: u8 = b's';

/// Flink's default maximum parallelism: the number of key groups.
pub const MAX_PARALLELISM: u16 = 128;

/// `tag id`.
pub fn with_id(tag: u8, id: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(9);
    k.push(tag);
    k.extend_from_slice(&id.to_be_bytes());
    k
}

/// `tag id suffix`.
pub fn with_id_and(tag: u8, id: u64, suffix: &[u8]) -> Vec<u8> {
    let mut k = with_id(tag, id);
    k.extend_from_slice(suffix);
    k
}

/// The half-open range of all keys `tag id …`.
pub fn id_range(tag: u8, id: u64) -> (Vec<u8>, Vec<u8>) {
    (with_id(tag, id), with_id(tag, id + 1))
}

/// State key: `s table key-group key`.
pub fn state_key(table: u64, key_group: u16, key: &[u8]) -> Vec<u8> {
    let mut k = with_id(STATE, table);
    k.extend_from_slice(&key_group.to_be_bytes());
    k.extend_from_slice(key);
    k
}

/// The range of a state table's keys in key groups `[from, to)`.
pub fn state_range(table: u64, key_groups: std::ops::Range<u16>) -> (Vec<u8>, Vec<u8>) {
    let mut from = with_id(STATE, table);
    from.extend_from_slice(&key_groups.start.to_be_bytes());
    let to = if key_groups.end >= MAX_PARALLELISM {
        with_id(STATE, table + 1)
    } else {
        let mut to = with_id(STATE, table);
        to.extend_from_slice(&key_groups.end.to_be_bytes());
        to
    };
    (from, to)
}

/// The first key after every key that starts with `prefix` (`None` if
/// there is none: the prefix is all `0xff`).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

/// Splits a state key back into (key group, user key).
pub fn split_state_key(key: &[u8]) -> (u16, &[u8]) {
    let kg = u16::from_be_bytes([key[9], key[10]]);
    (kg, &key[11..])
}

/// The key groups `[start, end)` that subtask `index` of `parallelism` owns,
/// as Flink's `KeyGroupRangeAssignment` computes them.
pub fn key_group_range(index: usize, parallelism: usize) -> std::ops::Range<u16> {
    let max = MAX_PARALLELISM as usize;
    let start = (index * max).div_ceil(parallelism);
    let end = ((index + 1) * max).div_ceil(parallelism);
    start as u16..end as u16
}

/// The subtask that owns `key_group`.
pub fn subtask_for_key_group(key_group: u16, parallelism: usize) -> usize {
    key_group as usize * parallelism / MAX_PARALLELISM as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_group_ranges_cover_all_and_match_owner() {
        for p in 1..=9 {
            let mut next = 0u16;
            for i in 0..p {
                let r = key_group_range(i, p);
                assert_eq!(r.start, next);
                for kg in r.clone() {
                    assert_eq!(subtask_for_key_group(kg, p), i, "p={p} kg={kg}");
                }
                next = r.end;
            }
            assert_eq!(next, MAX_PARALLELISM);
        }
    }

    #[test]
    fn prefix_end_is_the_first_key_past_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(&[1, 0xff, 0xff]), Some(vec![2]));
        assert_eq!(prefix_end(&[0xff]), None);
        assert_eq!(prefix_end(b""), None);
    }
}

//! The meta store: catalog entries and id counters, on the JobManager side.

use std::sync::Arc;
use std::sync::Mutex;

use crate::keys::{self, CATALOG, COUNTER, ROLE, SCHEMA};
use crate::{KvStore, Result, StorageError};

/// Durable catalog entries (opaque bytes to this crate) and id counters.
#[derive(Debug)]
pub struct MetaStore {
    kv: Arc<KvStore>,
    counter_lock: Mutex<()>,
}

impl MetaStore {
    pub fn new(kv: Arc<KvStore>) -> Self {
        Self {
            kv,
            counter_lock: Mutex::new(()),
        }
    }

    pub fn kv(&self) -> &Arc<KvStore> {
        &self.kv
    }

    /// Every catalog entry, in id order.
    pub fn load_catalog(&self) -> Result<Vec<(u64, Vec<u8>)>> {
        let from = vec![CATALOG];
        let to = vec![CATALOG + 1];
        self.kv
            .scan(&from, &to, usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let id = k
                    .get(1..9)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_be_bytes)
                    .ok_or_else(|| StorageError::Corrupt("short catalog key".into()))?;
                Ok((id, v))
            })
            .collect()
    }

    /// Writes catalog entries and deletes others, atomically and durably.
    pub fn update_catalog(&self, put: Vec<(u64, Vec<u8>)>, delete: Vec<u64>) -> Result<()> {
        let writes = put
            .into_iter()
            .map(|(id, v)| (keys::with_id(CATALOG, id), Some(v)))
            .chain(
                delete
                    .into_iter()
                    .map(|id| (keys::with_id(CATALOG, id), None)),
            );
        self.kv.write(writes, true)
    }

    /// Every role, by name (opaque bytes to this crate).
    pub fn load_roles(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.load_named(ROLE, "role")
    }

    /// Writes a role, or with `None` deletes it, durably.
    pub fn put_role(&self, name: &str, role: Option<Vec<u8>>) -> Result<()> {
        self.put_named(ROLE, name, role)
    }

    /// Every schema that users created, by name (opaque bytes to this crate).
    pub fn load_schemas(&self) -> Result<Vec<(String, Vec<u8>)>> {
        self.load_named(SCHEMA, "schema")
    }

    /// Writes a schema, or with `None` deletes it, durably.
    pub fn put_schema(&self, name: &str, schema: Option<Vec<u8>>) -> Result<()> {
        self.put_named(SCHEMA, name, schema)
    }

    /// Every `tag name` key's name and value.
    fn load_named(&self, tag: u8, what: &str) -> Result<Vec<(String, Vec<u8>)>> {
        self.kv
            .scan(&[tag], &[tag + 1], usize::MAX)?
            .into_iter()
            .map(|(k, v)| {
                let name = String::from_utf8(k[1..].to_vec())
                    .map_err(|_| StorageError::Corrupt(format!("{what} name is not UTF-8")))?;
                Ok((name, v))
            })
            .collect()
    }

    fn put_named(&self, tag: u8, name: &str, value: Option<Vec<u8>>) -> Result<()> {
        let mut key = vec![tag];
        key.extend_from_slice(name.as_bytes());
        self.kv.write([(key, value)], true)
    }

    /// Allocates `n` consecutive ids from the counter `name`; returns the first.
    pub fn allocate_ids(&self, name: &str, n: u64) -> Result<u64> {
        let _guard = self
            .counter_lock
            .lock()
            .map_err(|_| StorageError::Internal("poisoned".into()))?;
        let mut key = vec![COUNTER];
        key.extend_from_slice(name.as_bytes());
        let next = match self.kv.get(&key)? {
            Some(v) => u64::from_be_bytes(
                v.as_slice()
                    .try_into()
                    .map_err(|_| StorageError::Corrupt("counter".into()))?,
            ),
            None => 1,
        };
        self.kv
            .write([(key, Some((next + n).to_be_bytes().to_vec()))], true)?;
        Ok(next)
    }
}

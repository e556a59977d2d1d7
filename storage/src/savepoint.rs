//! Savepoints: snapshots of jobs that a user takes, keeps until dropping
//! them, and restarts jobs from — also with a later Weir (Flink's
//! savepoints in canonical format).
//!
//! A savepoint is made from a completed checkpoint of each job it covers,
//! rewritten in Weir's own **canonical format**, independent of RocksDB and
//! of how checkpoints are stored:
//!
//! ```text
//! savepoints/<name>/_metadata                 versioned, checksummed JSON
//! savepoints/<name>/job-<j>/<v>-<s>.state     "weir-state 1\n" then records
//! ```
//!
//! Each record is `table u64 | key group u16 | key length u32 | key |
//! value length u32 | value`, big-endian — the operators' state keys and
//! values exactly as they write them at a barrier. Every file is named in
//! the metadata with its size and SHA-256, like a checkpoint's. To restart
//! a job from a savepoint, its files are copied into a new checkpoint of the
//! job, which restores like any other (restores read both formats).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::backend::open_handle;
use crate::checkpoint_storage::{
    CheckpointMetadata, CheckpointStorage, FORMAT_VERSION, HandleFormat, SnapshotKind, StateHandle,
};
use crate::state::{StateEntry, StateScan};
use crate::{Result, StorageError};

const STATE_MAGIC: &[u8] = b"weir-state 1\n";

/// The `_metadata` of a savepoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavepointMetadata {
    pub version: u32,
    pub name: String,
    pub created_at_ms: u64,
    /// One entry per job, its handles in the canonical format.
    pub jobs: Vec<CheckpointMetadata>,
}

impl SavepointMetadata {
    pub fn size(&self) -> u64 {
        self.jobs.iter().map(CheckpointMetadata::full_size).sum()
    }
}

fn prefix(name: &str) -> String {
    format!("savepoints/{name}")
}

/// Encodes `(table, entry)` records in the canonical format.
pub fn encode(records: &[(u64, StateEntry)]) -> Vec<u8> {
    let mut out = STATE_MAGIC.to_vec();
    for (table, e) in records {
        out.extend_from_slice(&table.to_be_bytes());
        out.extend_from_slice(&e.key_group.to_be_bytes());
        out.extend_from_slice(&(e.key.len() as u32).to_be_bytes());
        out.extend_from_slice(&e.key);
        out.extend_from_slice(&(e.value.len() as u32).to_be_bytes());
        out.extend_from_slice(&e.value);
    }
    out
}

/// Decodes what [`encode`] wrote.
pub fn decode(bytes: &[u8]) -> Result<Vec<(u64, StateEntry)>> {
    let body = bytes
        .strip_prefix(STATE_MAGIC)
        .ok_or_else(|| StorageError::Corrupt("canonical state: unknown format".into()))?;
    fn take<'a>(body: &'a [u8], at: &mut usize, n: usize) -> Result<&'a [u8]> {
        let part = body
            .get(*at..*at + n)
            .ok_or_else(|| StorageError::Corrupt("canonical state: truncated".into()))?;
        *at += n;
        Ok(part)
    }
    let int = |b: &[u8]| b.iter().fold(0u64, |acc, x| (acc << 8) | *x as u64);
    let mut at = 0;
    let mut out = Vec::new();
    while at < body.len() {
        let table = int(take(body, &mut at, 8)?);
        let key_group = int(take(body, &mut at, 2)?) as u16;
        let len = int(take(body, &mut at, 4)?) as usize;
        let key = take(body, &mut at, len)?.to_vec();
        let len = int(take(body, &mut at, 4)?) as usize;
        let value = take(body, &mut at, len)?.to_vec();
        out.push((
            table,
            StateEntry {
                key_group,
                key,
                value,
            },
        ));
    }
    Ok(out)
}

/// The entries of a canonical handle for `table` in `key_groups`.
pub async fn read_canonical(
    storage: &CheckpointStorage,
    handle: &StateHandle,
    table: u64,
    key_groups: &std::ops::Range<u16>,
) -> Result<Vec<StateEntry>> {
    let mut out = Vec::new();
    for f in &handle.files {
        for (t, e) in decode(&storage.get(f).await?)? {
            if t == table && key_groups.contains(&e.key_group) {
                out.push(e);
            }
        }
    }
    Ok(out)
}

impl CheckpointStorage {
    /// Writes `checkpoint` (completed, in checkpoint storage) as job
    /// `checkpoint.job`'s part of savepoint `name`, in the canonical format.
    pub async fn savepoint_job(
        &self,
        name: &str,
        checkpoint: &CheckpointMetadata,
        scratch: &Path,
    ) -> Result<CheckpointMetadata> {
        let mut handles = Vec::new();
        for (i, h) in checkpoint.handles.iter().enumerate() {
            let mut records = Vec::new();
            match h.format {
                HandleFormat::RocksDb => {
                    let dir = scratch.join(format!("savepoint-{i}"));
                    let kv = open_handle(self, h, &dir).await?;
                    for t in &h.tables {
                        for e in kv.scan_state(t.table, t.key_groups.clone())? {
                            records.push((t.table, e));
                        }
                    }
                    drop(kv);
                    let _ = std::fs::remove_dir_all(&dir);
                }
                HandleFormat::Canonical => {
                    for t in &h.tables {
                        for e in read_canonical(self, h, t.table, &t.key_groups).await? {
                            records.push((t.table, e));
                        }
                    }
                }
            }
            let file_name = format!("{}-{}.state", h.vertex, h.subtask);
            let path = format!("{}/job-{}/{file_name}", prefix(name), checkpoint.job);
            let file = self.put(&file_name, path, encode(&records)).await?;
            handles.push(StateHandle {
                vertex: h.vertex,
                subtask: h.subtask,
                tables: h.tables.clone(),
                files: vec![file],
                format: HandleFormat::Canonical,
            });
        }
        Ok(CheckpointMetadata {
            kind: SnapshotKind::Savepoint,
            handles,
            ..checkpoint.clone()
        })
    }

    /// Writes a savepoint's metadata, last.
    pub async fn write_savepoint(&self, meta: &SavepointMetadata) -> Result<()> {
        let path = format!("{}/_metadata", prefix(&meta.name));
        self.write_checked(&path, meta.version, meta).await?;
        Ok(())
    }

    pub async fn read_savepoint(&self, name: &str) -> Result<SavepointMetadata> {
        self.read_checked(&format!("{}/_metadata", prefix(name)))
            .await
    }

    /// Names of the savepoints in storage (complete or not).
    pub async fn savepoint_names(&self) -> Result<Vec<String>> {
        self.children("savepoints").await
    }

    pub async fn drop_savepoint(&self, name: &str) -> Result<()> {
        self.delete_prefix(&prefix(name)).await
    }

    /// Makes job `part.job`'s part of a savepoint checkpoint `id` of the job:
    /// its files copied under `chk-<id>/`, its metadata written last.
    pub async fn checkpoint_from_savepoint(
        &self,
        part: &CheckpointMetadata,
        id: u64,
        now_ms: u64,
    ) -> Result<CheckpointMetadata> {
        let mut handles = Vec::new();
        for h in &part.handles {
            let mut files = Vec::new();
            for f in &h.files {
                let bytes = self.get(f).await?;
                let path = format!(
                    "job-{}/chk-{id}/{}-{}/{}",
                    part.job, h.vertex, h.subtask, f.name
                );
                files.push(self.put(&f.name, path, bytes).await?);
            }
            handles.push(StateHandle { files, ..h.clone() });
        }
        let meta = CheckpointMetadata {
            version: FORMAT_VERSION,
            id,
            kind: SnapshotKind::Checkpoint,
            triggered_at_ms: now_ms,
            completed_at_ms: now_ms,
            handles,
            ..part.clone()
        };
        self.write_metadata(&meta).await?;
        Ok(meta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_records_round_trip_and_truncation_is_caught() {
        let records = vec![
            (
                7,
                StateEntry {
                    key_group: 3,
                    key: b"k".to_vec(),
                    value: b"value".to_vec(),
                },
            ),
            (
                9,
                StateEntry {
                    key_group: 127,
                    key: Vec::new(),
                    value: vec![0; 300],
                },
            ),
        ];
        let bytes = encode(&records);
        assert_eq!(decode(&bytes).unwrap(), records);
        assert!(decode(&bytes[..bytes.len() - 1]).is_err());
        assert!(decode(b"something else").is_err());
    }
}

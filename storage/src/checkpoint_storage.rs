//! Checkpoint storage: where completed checkpoints live (Flink's
//! `state.checkpoints.dir`), reached through the `object_store` crate so a
//! local directory and an object store look the same to Weir.
//!
//! Layout under the storage root, per job:
//!
//! ```text
//! job-<j>/shared/<instance>-<sst>      SST files, shared by checkpoints
//! job-<j>/chk-<n>/<v>-<s>/<file>       a subtask's private files (MANIFEST, …)
//! job-<j>/chk-<n>/_metadata            written last: the checkpoint exists once it does
//! ```
//!
//! Snapshots are **incremental**: a subtask uploads only the SST files that
//! the last checkpoint it was told is complete did not already hold; the
//! rest are referenced. SST files never change once written, so a shared
//! file is safe to reference until no retained checkpoint names it — the
//! JobMaster counts references and deletes it then.
//!
//! Every file is named in the metadata with its size and SHA-256, and the
//! metadata carries its own checksum, so a truncated or bit-flipped file is
//! found when it is read back ([`StorageError::Corrupt`]) rather than
//! restoring wrong state.
//!
//! Files move in pieces: an upload reads a file larger than [`PIECE`] a
//! piece at a time into a multipart upload, and a download writes each
//! piece as it arrives, hashing as it goes, so a checkpoint of any size
//! costs a few pieces of memory, not its largest file.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ops::Range;
use std::path::{Path as FsPath, PathBuf};
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::{Result, StorageError};

/// The format of checkpoint metadata this Weir writes; it reads this and
/// every older version.
pub const FORMAT_VERSION: u32 = 1;

const METADATA: &str = "_metadata";
const CORRUPT: &str = "_metadata.corrupt";
const MAGIC: &str = "weir-checkpoint";

/// One file of a subtask's RocksDB snapshot in checkpoint storage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHandle {
    /// Its name in the RocksDB directory.
    pub name: String,
    /// Where it is, relative to the storage root.
    pub path: String,
    pub size: u64,
    /// Hex SHA-256 of its content.
    pub sha256: String,
    /// An SST file under `shared/`, possibly referenced by later checkpoints.
    pub shared: bool,
}

/// Which key groups of a state table a snapshot holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableRange {
    pub table: u64,
    pub key_groups: Range<u16>,
}

/// How a handle's files hold its state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HandleFormat {
    /// A RocksDB checkpoint directory: SST files, MANIFEST, CURRENT, …
    #[default]
    RocksDb,
    /// Weir's own record format ([`crate::savepoint`]), independent of
    /// RocksDB: what savepoints are written in.
    Canonical,
}

/// One subtask's part of a checkpoint (Flink's `IncrementalRemoteKeyedStateHandle`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHandle {
    pub vertex: usize,
    pub subtask: usize,
    pub tables: Vec<TableRange>,
    pub files: Vec<FileHandle>,
    #[serde(default)]
    pub format: HandleFormat,
}

impl StateHandle {
    /// Whether it holds any of `table`'s key groups in `key_groups`.
    pub fn overlaps(&self, table: u64, key_groups: &Range<u16>) -> bool {
        self.tables.iter().any(|t| {
            t.table == table
                && t.key_groups.start < key_groups.end
                && key_groups.start < t.key_groups.end
        })
    }

    /// Bytes of all its files.
    pub fn size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Checkpoint or savepoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SnapshotKind {
    Checkpoint,
    Savepoint,
}

impl SnapshotKind {
    pub fn as_str(&self) -> &'static str {
        match self {
            SnapshotKind::Checkpoint => "checkpoint",
            SnapshotKind::Savepoint => "savepoint",
        }
    }
}

/// The `_metadata` file of a completed checkpoint (Flink's
/// `CheckpointMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointMetadata {
    pub version: u32,
    pub job: u64,
    pub id: u64,
    pub kind: SnapshotKind,
    pub triggered_at_ms: u64,
    pub completed_at_ms: u64,
    /// Table id → log sequence number every source had passed.
    pub positions: BTreeMap<u64, u64>,
    pub handles: Vec<StateHandle>,
}

impl CheckpointMetadata {
    /// Paths of the shared files it references.
    pub fn shared_files(&self) -> impl Iterator<Item = &str> {
        self.handles
            .iter()
            .flat_map(|h| h.files.iter())
            .filter(|f| f.shared)
            .map(|f| f.path.as_str())
    }

    /// Bytes of state it references.
    pub fn full_size(&self) -> u64 {
        self.handles.iter().map(StateHandle::size).sum()
    }
}

/// A RocksDB checkpoint on local disk, before upload.
#[derive(Debug, Clone)]
pub struct LocalSnapshot {
    pub dir: PathBuf,
    /// File name → size.
    pub files: Vec<(String, u64)>,
}

fn is_sst(name: &str) -> bool {
    name.ends_with(".sst")
}

fn object_err(e: object_store::Error) -> StorageError {
    StorageError::CheckpointStorage(e.to_string())
}

fn io_err(e: std::io::Error) -> StorageError {
    StorageError::from_io(e, "checkpoint storage")
}

fn sha256(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

fn hex(digest: &[u8]) -> String {
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

/// The size of the pieces files move in (see the module docs): files up to
/// it are put whole; larger ones go as a multipart upload of such parts
/// (at least S3's 5 MiB).
pub const PIECE: usize = 8 << 20;

/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;

fn job_prefix(job: u64) -> String {
    format!("job-{job}")
}

fn checkpoint_prefix(job: u64, id: u64) -> String {
    format!("job-{job}/chk-{id}")
}

/// Checkpoint storage of a cluster; see the module docs.
#[derive(Debug, Clone)]
pub struct CheckpointStorage {
    store: Arc<dyn ObjectStore>,
    location: String,
}

impl CheckpointStorage {
    /// Opens the storage at `location`: a local directory (created if
    /// missing), a `file://` URL, or an S3-compatible object store as
    /// `s3://bucket/prefix`. The object store's endpoint, region and
    /// credentials come from the standard `AWS_*` environment variables
    /// (`AWS_ENDPOINT`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`,
    /// `AWS_SECRET_ACCESS_KEY`, `AWS_ALLOW_HTTP`, …) of each process that
    /// opens it, JobManager and TaskManagers alike.
    pub fn open(location: &str) -> Result<Self> {
        match location.split_once("://") {
            Some(("s3" | "s3a", rest)) => Self::open_s3(location, rest),
            Some(("file", dir)) => Self::open_local(dir),
            None => Self::open_local(location),
            Some(_) => Err(StorageError::Unsupported(format!(
                "checkpoint storage at \"{location}\" (use a local directory, a file:// URL or an s3:// URL)"
            ))),
        }
    }

    fn open_local(dir: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(io_err)?;
        let dir = std::fs::canonicalize(dir).map_err(io_err)?;
        let store = object_store::local::LocalFileSystem::new_with_prefix(&dir)
            .map_err(object_err)?
            .with_automatic_cleanup(true);
        Ok(Self {
            store: Arc::new(store),
            location: dir.display().to_string(),
        })
    }

    /// `rest` is `bucket/prefix` of an `s3://` URL. The bucket must exist;
    /// Weir writes under the prefix only.
    fn open_s3(location: &str, rest: &str) -> Result<Self> {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(StorageError::CheckpointStorage(format!(
                "\"{location}\" names no bucket (s3://bucket/prefix)"
            )));
        }
        let s3 = object_store::aws::AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .build()
            .map_err(|e| StorageError::CheckpointStorage(format!("{location}: {e}")))?;
        let prefix = prefix.trim_matches('/');
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
        };
        let location = if prefix.is_empty() {
            format!("s3://{bucket}")
        } else {
            format!("s3://{bucket}/{prefix}")
        };
        Ok(Self { store, location })
    }

    /// Fails unless the storage answers: a listing of its root. Called when
    /// a JobManager starts, so a wrong endpoint, bucket or credential is
    /// an error at startup rather than at the first checkpoint.
    pub async fn check(&self) -> Result<()> {
        self.store
            .list_with_delimiter(None)
            .await
            .map(|_| ())
            .map_err(|e| StorageError::CheckpointStorage(format!("{}: {e}", self.location)))
    }

    /// Where it is, as given to TaskManagers.
    pub fn location(&self) -> &str {
        &self.location
    }

    /// Uploads a subtask's local snapshot for checkpoint `id`: private
    /// files always, SST files only when `reuse` (the files of the last
    /// confirmed checkpoint, by name) does not already hold them.
    pub async fn upload(
        &self,
        job: u64,
        id: u64,
        handle: (usize, usize),
        instance: &str,
        snapshot: &LocalSnapshot,
        reuse: &HashMap<String, FileHandle>,
    ) -> Result<Vec<FileHandle>> {
        let (vertex, subtask) = handle;
        let mut out = Vec::with_capacity(snapshot.files.len());
        for (name, size) in &snapshot.files {
            if is_sst(name)
                && let Some(f) = reuse.get(name)
                && f.size == *size
            {
                out.push(f.clone());
                continue;
            }
            let shared = is_sst(name);
            let path = if shared {
                format!("{}/shared/{instance}-{name}", job_prefix(job))
            } else {
                format!("{}/{vertex}-{subtask}/{name}", checkpoint_prefix(job, id))
            };
            let (size, sha256) = self.put_file(&snapshot.dir.join(name), &path).await?;
            let file = FileHandle {
                name: name.clone(),
                size,
                sha256,
                path,
                shared,
            };
            out.push(file);
        }
        Ok(out)
    }

    /// Copies the local file `local` to `path`, a piece at a time when it
    /// is larger than [`PIECE`]. Returns its size and SHA-256.
    async fn put_file(&self, local: &FsPath, path: &str) -> Result<(u64, String)> {
        use tokio::io::AsyncReadExt;
        let mut file = tokio::fs::File::open(local).await.map_err(io_err)?;
        let len = file.metadata().await.map_err(io_err)?.len();
        let location = Path::from(path);
        if len <= PIECE as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes).await.map_err(io_err)?;
            let sha = sha256(&bytes);
            let size = bytes.len() as u64;
            self.store
                .put(&location, PutPayload::from(bytes))
                .await
                .map_err(object_err)?;
            return Ok((size, sha));
        }
        let upload = self
            .store
            .put_multipart(&location)
            .await
            .map_err(object_err)?;
        let mut writer = object_store::WriteMultipart::new_with_chunk_size(upload, PIECE);
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        let copied: Result<()> = async {
            loop {
                let n = file.read(&mut buf).await.map_err(io_err)?;
                if n == 0 {
                    return Ok(());
                }
                hasher.update(&buf[..n]);
                size += n as u64;
                writer
                    .wait_for_capacity(PARTS_IN_FLIGHT)
                    .await
                    .map_err(object_err)?;
                writer.write(&buf[..n]);
            }
        }
        .await;
        if let Err(e) = copied {
            let _ = writer.abort().await;
            return Err(e);
        }
        writer.finish().await.map_err(object_err)?;
        Ok((size, hex(&hasher.finalize())))
    }

    /// Writes the metadata of a completed checkpoint, atomically (the store
    /// writes a temporary file and renames it). Returns its size.
    pub async fn write_metadata(&self, meta: &CheckpointMetadata) -> Result<u64> {
        let path = format!("{}/{METADATA}", checkpoint_prefix(meta.job, meta.id));
        self.write_checked(&path, meta.version, meta).await
    }

    /// Reads and checks the metadata of checkpoint `id` of `job`.
    pub async fn read_metadata(&self, job: u64, id: u64) -> Result<CheckpointMetadata> {
        let path = format!("{}/{METADATA}", checkpoint_prefix(job, id));
        self.read_checked(&path).await
    }

    /// Writes `value` as JSON behind a header with its format version and
    /// checksum, atomically.
    pub(crate) async fn write_checked<T: Serialize>(
        &self,
        path: &str,
        version: u32,
        value: &T,
    ) -> Result<u64> {
        let body = serde_json::to_vec(value)
            .map_err(|e| StorageError::Internal(format!("{path}: {e}")))?;
        let mut file = format!("{MAGIC} {version} {}\n", sha256(&body)).into_bytes();
        file.extend_from_slice(&body);
        let len = file.len() as u64;
        self.store
            .put(&Path::from(path), PutPayload::from(file))
            .await
            .map_err(object_err)?;
        Ok(len)
    }

    /// Reads what [`Self::write_checked`] wrote, checking version and checksum.
    pub(crate) async fn read_checked<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
    ) -> Result<T> {
        let path = Path::from(path);
        let bytes = self
            .store
            .get(&path)
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => {
                    StorageError::Corrupt(format!("{path} is missing"))
                }
                e => object_err(e),
            })?
            .bytes()
            .await
            .map_err(object_err)?;
        let corrupt = |why: &str| StorageError::Corrupt(format!("{path}: {why}"));
        let split = bytes
            .iter()
            .position(|b| *b == b'\n')
            .ok_or_else(|| corrupt("no header"))?;
        let header = std::str::from_utf8(&bytes[..split]).map_err(|_| corrupt("bad header"))?;
        let body = &bytes[split + 1..];
        let mut words = header.split(' ');
        if words.next() != Some(MAGIC) {
            return Err(corrupt("not Weir metadata"));
        }
        let version: u32 = words
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| corrupt("bad version"))?;
        if version > FORMAT_VERSION {
            return Err(StorageError::Unsupported(format!(
                "{path}: format version {version} (this Weir reads up to {FORMAT_VERSION})"
            )));
        }
        if words.next() != Some(sha256(body).as_str()) {
            return Err(corrupt("checksum mismatch"));
        }
        serde_json::from_slice(body).map_err(|e| corrupt(&e.to_string()))
    }

    /// Ids of `job`'s checkpoint directories, ascending, and which of them
    /// have metadata (completed; not marked corrupt).
    pub async fn checkpoint_dirs(&self, job: u64) -> Result<Vec<(u64, bool)>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&Path::from(job_prefix(job))))
            .await
            .map_err(object_err)?;
        let mut ids = Vec::new();
        for p in listed.common_prefixes {
            let Some(id) = p
                .filename()
                .and_then(|f| f.strip_prefix("chk-"))
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            let meta = Path::from(format!("{}/{METADATA}", checkpoint_prefix(job, id)));
            let completed = match self.store.head(&meta).await {
                Ok(_) => true,
                Err(object_store::Error::NotFound { .. }) => false,
                Err(e) => return Err(object_err(e)),
            };
            ids.push((id, completed));
        }
        ids.sort();
        Ok(ids)
    }

    /// Paths of every file under `job`'s `shared/`.
    pub async fn shared_files(&self, job: u64) -> Result<Vec<String>> {
        let prefix = Path::from(format!("{}/shared", job_prefix(job)));
        self.store
            .list(Some(&prefix))
            .map_ok(|m| m.location.to_string())
            .try_collect()
            .await
            .map_err(object_err)
    }

    /// Downloads a subtask's snapshot into `dir`, checking every file's size
    /// and checksum.
    pub async fn fetch(&self, handle: &StateHandle, dir: &FsPath) -> Result<()> {
        tokio::fs::create_dir_all(dir).await.map_err(io_err)?;
        for f in &handle.files {
            self.get_file(f, &dir.join(&f.name)).await?;
        }
        Ok(())
    }

    /// Downloads one file to `local` a piece at a time, checked against its
    /// size and checksum (a file that fails is removed).
    async fn get_file(&self, f: &FileHandle, local: &FsPath) -> Result<()> {
        use futures::StreamExt;
        use tokio::io::AsyncWriteExt;
        let mut pieces = self.object(f).await?.into_stream();
        let mut out = tokio::fs::File::create(local).await.map_err(io_err)?;
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        while let Some(piece) = pieces.next().await {
            let piece = piece.map_err(object_err)?;
            hasher.update(&piece);
            size += piece.len() as u64;
            out.write_all(&piece).await.map_err(io_err)?;
        }
        out.flush().await.map_err(io_err)?;
        drop(out);
        let wrong = if size != f.size {
            Some(format!("{} has {size} bytes, expected {}", f.path, f.size))
        } else if hex(&hasher.finalize()) != f.sha256 {
            Some(format!("{} fails its checksum", f.path))
        } else {
            None
        };
        match wrong {
            Some(why) => {
                let _ = tokio::fs::remove_file(local).await;
                Err(StorageError::Corrupt(why))
            }
            None => Ok(()),
        }
    }

    /// The object of `f`; a missing one is a damaged checkpoint.
    async fn object(&self, f: &FileHandle) -> Result<object_store::GetResult> {
        self.store
            .get(&Path::from(f.path.as_str()))
            .await
            .map_err(|e| match e {
                object_store::Error::NotFound { .. } => {
                    StorageError::Corrupt(format!("{} is missing", f.path))
                }
                e => object_err(e),
            })
    }

    /// One file's content, checked against its size and checksum.
    pub async fn get(&self, f: &FileHandle) -> Result<Vec<u8>> {
        let bytes = self.object(f).await?.bytes().await.map_err(object_err)?;
        if bytes.len() as u64 != f.size {
            return Err(StorageError::Corrupt(format!(
                "{} has {} bytes, expected {}",
                f.path,
                bytes.len(),
                f.size
            )));
        }
        if sha256(&bytes) != f.sha256 {
            return Err(StorageError::Corrupt(format!(
                "{} fails its checksum",
                f.path
            )));
        }
        Ok(bytes.to_vec())
    }

    /// Writes a private file at `path` (relative to the root).
    pub async fn put(&self, name: &str, path: String, bytes: Vec<u8>) -> Result<FileHandle> {
        let file = FileHandle {
            name: name.to_string(),
            size: bytes.len() as u64,
            sha256: sha256(&bytes),
            path,
            shared: false,
        };
        self.store
            .put(&Path::from(file.path.as_str()), PutPayload::from(bytes))
            .await
            .map_err(object_err)?;
        Ok(file)
    }

    /// Names of the directories right under `prefix`.
    pub(crate) async fn children(&self, prefix: &str) -> Result<Vec<String>> {
        let listed = self
            .store
            .list_with_delimiter(Some(&Path::from(prefix)))
            .await
            .map_err(object_err)?;
        Ok(listed
            .common_prefixes
            .iter()
            .filter_map(|p| p.filename().map(str::to_string))
            .collect())
    }

    /// Deletes checkpoint `id`'s directory and `orphans`: shared files that
    /// no retained checkpoint references any more.
    pub async fn discard(
        &self,
        job: u64,
        id: u64,
        orphans: impl IntoIterator<Item = String>,
    ) -> Result<()> {
        for path in orphans {
            self.delete(&path).await?;
        }
        self.delete_prefix(&checkpoint_prefix(job, id)).await
    }

    /// Deletes one file; a missing file is not an error.
    pub async fn delete(&self, path: &str) -> Result<()> {
        match self.store.delete(&Path::from(path)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(object_err(e)),
        }
    }

    pub(crate) async fn delete_prefix(&self, prefix: &str) -> Result<()> {
        let files: Vec<Path> = self
            .store
            .list(Some(&Path::from(prefix)))
            .map_ok(|m| m.location)
            .try_collect()
            .await
            .map_err(object_err)?;
        for f in files {
            self.delete(f.as_ref()).await?;
        }
        Ok(())
    }

    /// Marks checkpoint `id` corrupt: its metadata is renamed so it is
    /// never chosen again, and kept for inspection.
    pub async fn mark_corrupt(&self, job: u64, id: u64) -> Result<()> {
        let prefix = checkpoint_prefix(job, id);
        self.store
            .rename(
                &Path::from(format!("{prefix}/{METADATA}")),
                &Path::from(format!("{prefix}/{CORRUPT}")),
            )
            .await
            .map_err(object_err)
    }

    /// Deletes everything of a dropped job.
    pub async fn drop_job(&self, job: u64) -> Result<()> {
        self.delete_prefix(&job_prefix(job)).await
    }
}

/// Shared-file reference counts over a job's retained checkpoints.
#[derive(Debug, Default)]
pub struct SharedFiles {
    counts: HashMap<String, usize>,
}

impl SharedFiles {
    pub fn add(&mut self, meta: &CheckpointMetadata) {
        // A checkpoint references a file once however many handles name it.
        let unique: HashSet<&str> = meta.shared_files().collect();
        for p in unique {
            *self.counts.entry(p.to_string()).or_default() += 1;
        }
    }

    /// Drops `meta`'s references; returns the files no longer referenced.
    pub fn release(&mut self, meta: &CheckpointMetadata) -> Vec<String> {
        let unique: HashSet<&str> = meta.shared_files().collect();
        let mut free = Vec::new();
        for p in unique {
            if let Some(c) = self.counts.get_mut(p) {
                *c -= 1;
                if *c == 0 {
                    self.counts.remove(p);
                    free.push(p.to_string());
                }
            }
        }
        free
    }

    pub fn contains(&self, path: &str) -> bool {
        self.counts.contains_key(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: u64, files: &[&str]) -> CheckpointMetadata {
        CheckpointMetadata {
            version: FORMAT_VERSION,
            job: 1,
            id,
            kind: SnapshotKind::Checkpoint,
            triggered_at_ms: 0,
            completed_at_ms: 0,
            positions: BTreeMap::new(),
            handles: vec![StateHandle {
                vertex: 0,
                subtask: 0,
                tables: vec![],
                format: HandleFormat::RocksDb,
                files: files
                    .iter()
                    .map(|p| FileHandle {
                        name: p.to_string(),
                        path: p.to_string(),
                        size: 1,
                        sha256: String::new(),
                        shared: true,
                    })
                    .collect(),
            }],
        }
    }

    #[test]
    fn shared_files_are_freed_with_their_last_reference() {
        let mut s = SharedFiles::default();
        let (a, b) = (meta(1, &["x", "y"]), meta(2, &["y", "z"]));
        s.add(&a);
        s.add(&b);
        assert_eq!(s.release(&a), vec!["x".to_string()]);
        let mut freed = s.release(&b);
        freed.sort();
        assert_eq!(freed, vec!["y".to_string(), "z".to_string()]);
    }

    #[test]
    fn storage_urls_are_checked() {
        assert!(matches!(
            CheckpointStorage::open("gs://bucket/x"),
            Err(StorageError::Unsupported(m)) if m.contains("gs://bucket/x")
        ));
        assert!(matches!(
            CheckpointStorage::open("s3:///x"),
            Err(StorageError::CheckpointStorage(m)) if m.contains("names no bucket")
        ));
        let s3 = CheckpointStorage::open("s3://bucket/a/b/").unwrap();
        assert_eq!(s3.location(), "s3://bucket/a/b");
    }

    #[tokio::test]
    async fn metadata_round_trips_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap()).unwrap();
        let m = meta(7, &["job-1/shared/a.sst"]);
        storage.write_metadata(&m).await.unwrap();
        assert_eq!(storage.read_metadata(1, 7).await.unwrap(), m);
        assert_eq!(storage.checkpoint_dirs(1).await.unwrap(), vec![(7, true)]);
        let path = dir.path().join("job-1/chk-7/_metadata");
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x01;
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            storage.read_metadata(1, 7).await,
            Err(StorageError::Corrupt(_))
        ));
    }

    #[tokio::test]
    async fn fetch_checks_sizes_and_checksums() {
        let dir = tempfile::tempdir().unwrap();
        let local = tempfile::tempdir().unwrap();
        std::fs::write(local.path().join("000001.sst"), b"sst bytes").unwrap();
        std::fs::write(local.path().join("CURRENT"), b"MANIFEST-1\n").unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap()).unwrap();
        let snapshot = LocalSnapshot {
            dir: local.path().to_path_buf(),
            files: vec![("000001.sst".into(), 9), ("CURRENT".into(), 11)],
        };
        let files = storage
            .upload(1, 1, (0, 0), "i", &snapshot, &HashMap::new())
            .await
            .unwrap();
        assert!(files[0].shared && !files[1].shared);
        // Incremental: the next checkpoint reuses the SST it already has.
        let reuse: HashMap<String, FileHandle> = [(files[0].name.clone(), files[0].clone())].into();
        let again = storage
            .upload(1, 2, (0, 0), "i", &snapshot, &reuse)
            .await
            .unwrap();
        assert_eq!(again[0], files[0]);
        assert_ne!(again[1].path, files[1].path);
        let handle = StateHandle {
            vertex: 0,
            subtask: 0,
            tables: vec![],
            files,
            format: HandleFormat::RocksDb,
        };
        let out = tempfile::tempdir().unwrap();
        storage.fetch(&handle, out.path()).await.unwrap();
        assert_eq!(
            std::fs::read(out.path().join("000001.sst")).unwrap(),
            b"sst bytes"
        );
        std::fs::write(dir.path().join("job-1/shared/i-000001.sst"), b"sst bytez").unwrap();
        let err = storage.fetch(&handle, out.path()).await.unwrap_err();
        assert!(err.to_string().contains("checksum"), "{err}");
        std::fs::write(dir.path().join("job-1/shared/i-000001.sst"), b"sst").unwrap();
        let err = storage.fetch(&handle, out.path()).await.unwrap_err();
        assert!(err.to_string().contains("expected 9"), "{err}");
        assert!(!out.path().join("000001.sst").exists());
    }

    #[tokio::test]
    async fn files_larger_than_a_piece_go_in_parts() {
        let dir = tempfile::tempdir().unwrap();
        let local = tempfile::tempdir().unwrap();
        // Two and a half pieces of bytes that are not all alike.
        let len = PIECE * 5 / 2 + 123;
        let mut x: u32 = 1;
        let bytes: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as u8
            })
            .collect();
        std::fs::write(local.path().join("000007.sst"), &bytes).unwrap();
        let storage = CheckpointStorage::open(dir.path().to_str().unwrap()).unwrap();
        let snapshot = LocalSnapshot {
            dir: local.path().to_path_buf(),
            files: vec![("000007.sst".into(), len as u64)],
        };
        let files = storage
            .upload(1, 1, (0, 0), "i", &snapshot, &HashMap::new())
            .await
            .unwrap();
        assert_eq!(files[0].size, len as u64);
        assert_eq!(files[0].sha256, sha256(&bytes));
        assert_eq!(
            std::fs::read(dir.path().join("job-1/shared/i-000007.sst")).unwrap(),
            bytes
        );
        let handle = StateHandle {
            vertex: 0,
            subtask: 0,
            tables: vec![],
            files,
            format: HandleFormat::RocksDb,
        };
        let out = tempfile::tempdir().unwrap();
        storage.fetch(&handle, out.path()).await.unwrap();
        assert_eq!(std::fs::read(out.path().join("000007.sst")).unwrap(), bytes);
    }
}

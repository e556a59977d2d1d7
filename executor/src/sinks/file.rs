//! `connector = 'file'` as a sink: the rows become files in a directory,
//! CSV, JSON lines or Parquet, a file appearing only when the checkpoint
//! that covers its rows completes (Flink's `FileSink`).
//!
//! A subtask writes into a hidden *in-progress* file under
//! `path/.weir-staging/`. At a barrier it closes and syncs the file and
//! renames it, still hidden, to a *prepared* name carrying the
//! checkpoint's id; the committable is that name and the final one. The
//! commit renames it into `path` as
//! `part-<checkpoint>-<subtask>-<attempt>.<ext>`, so the files sort in the
//! order they were committed; a rename that already happened is not an
//! error. Every name carries a token drawn when the subtask starts, so a
//! restarted attempt never reuses a name. The file source skips hidden
//! files, so a directory a file sink writes can be read as it grows.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::{csv, json};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use planner::spec::ConnectorSpec;
use storage::chunk::Chunk;

use super::{Encoder, SinkConnector, SinkContext, SinkWriter, inserts, plain_needs_append_only};
use crate::connectors::Options;
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &["path (a directory)", "force_append_only"];
const STAGING: &str = ".weir-staging";

pub(super) struct FileSink {
    dir: PathBuf,
    encoder: Encoder,
}

fn io(what: &str, path: &Path) -> impl FnOnce(std::io::Error) -> ExecError {
    let what = format!("file sink: cannot {what} {}", path.display());
    move |e| ExecError::Connector(format!("{what}: {e}"))
}

impl FileSink {
    pub(super) fn new(spec: &ConnectorSpec, ctx: &SinkContext) -> Result<Self> {
        let mut o = Options::new("file", &spec.options);
        let path = o.take("path").ok_or_else(|| {
            ExecError::InvalidOption("sink connector file needs option path (a directory)".into())
        })?;
        let force = o.flag("force_append_only")?.unwrap_or(false);
        o.finish(OPTIONS)?;
        if spec.format.as_deref() != Some("PLAIN") {
            return Err(ExecError::InvalidOption(
                "sink connector file needs FORMAT PLAIN ENCODE CSV | JSON | PARQUET".into(),
            ));
        }
        let encoder = Encoder::new(spec, &["CSV", "JSON", "PARQUET"])?;
        plain_needs_append_only(spec, ctx, force)?;
        Ok(Self {
            dir: PathBuf::from(path),
            encoder,
        })
    }
}

#[async_trait]
impl SinkConnector for FileSink {
    async fn check(&self) -> Result<()> {
        let staging = self.dir.join(STAGING);
        std::fs::create_dir_all(&staging).map_err(io("create", &staging))
    }

    fn writer(&self, ctx: &SinkContext) -> Result<Box<dyn SinkWriter>> {
        Ok(Box::new(FileWriter {
            dir: self.dir.clone(),
            staging: self.dir.join(STAGING),
            encoder: self.encoder,
            schema: ctx.schema.clone(),
            prefix: format!("sink{}-w{}-", ctx.sink_id, ctx.subtask),
            subtask: ctx.subtask,
            token: format!("{:08x}", rand::random::<u32>()),
            current: None,
            files: 0,
        }))
    }
}

/// One subtask's files.
struct FileWriter {
    dir: PathBuf,
    staging: PathBuf,
    encoder: Encoder,
    schema: SchemaRef,
    /// How this sink's writer's staged files start: `sink<id>-w<subtask>-`.
    prefix: String,
    subtask: usize,
    token: String,
    current: Option<(PathBuf, Open)>,
    /// Files begun by this writer, for in-progress names.
    files: u64,
}

/// The file being written.
enum Open {
    Csv(Box<csv::Writer<BufWriter<File>>>),
    Json(json::LineDelimitedWriter<BufWriter<File>>),
    Parquet(Box<ArrowWriter<File>>),
}

impl FileWriter {
    fn open(&mut self) -> Result<(PathBuf, Open)> {
        self.files += 1;
        let path = self.staging.join(format!(
            "{}{}-{}.inprogress",
            self.prefix, self.token, self.files
        ));
        if !self.staging.exists() {
            std::fs::create_dir_all(&self.staging).map_err(io("create", &self.staging))?;
        }
        let file = File::create(&path).map_err(io("create", &path))?;
        let open = match self.encoder {
            Encoder::Csv { delimiter, header } => Open::Csv(Box::new(
                csv::WriterBuilder::new()
                    .with_header(header)
                    .with_delimiter(delimiter)
                    .build(BufWriter::new(file)),
            )),
            Encoder::Json => Open::Json(json::LineDelimitedWriter::new(BufWriter::new(file))),
            Encoder::Parquet => {
                let props = WriterProperties::builder()
                    .set_compression(Compression::SNAPPY)
                    .build();
                Open::Parquet(Box::new(
                    ArrowWriter::try_new(file, self.schema.clone(), Some(props))
                        .map_err(|e| ExecError::Connector(format!("file sink: parquet: {e}")))?,
                ))
            }
        };
        Ok((path, open))
    }
}

fn close(open: Open, path: &Path) -> Result<()> {
    let flushed = |w: BufWriter<File>| -> Result<File> {
        w.into_inner()
            .map_err(|e| ExecError::Connector(format!("file sink: write {}: {e}", path.display())))
    };
    let file = match open {
        Open::Csv(w) => flushed(w.into_inner())?,
        Open::Json(mut w) => {
            w.finish()?;
            flushed(w.into_inner())?
        }
        // Writes the footer.
        Open::Parquet(w) => w
            .into_inner()
            .map_err(|e| ExecError::Connector(format!("file sink: parquet: {e}")))?,
    };
    file.sync_all().map_err(io("sync", path))
}

/// Makes the renames in `dir` durable.
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("sync", dir))
}

#[async_trait]
impl SinkWriter for FileWriter {
    async fn clean_up(&mut self, writers: &[usize], restored: Option<u64>) -> Result<()> {
        let entries = match std::fs::read_dir(&self.staging) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(io("list", &self.staging)(e)),
        };
        let sink = self
            .prefix
            .split('-')
            .next()
            .unwrap_or_default()
            .to_string();
        for entry in entries {
            let entry = entry.map_err(io("list", &self.staging))?;
            let name = entry.file_name().to_string_lossy().to_string();
            // sink<id>-w<writer>-…
            let mut parts = name.splitn(3, '-');
            let (Some(s), Some(w), Some(rest)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            let writer = w.strip_prefix('w').and_then(|w| w.parse::<usize>().ok());
            if s != sink || !writer.is_some_and(|w| writers.contains(&w)) {
                continue;
            }
            // Prepared files are c<checkpoint>-<token>.
            let prepared_for = rest
                .strip_prefix('c')
                .filter(|_| !rest.ends_with(".inprogress"))
                .and_then(|r| r.split('-').next())
                .and_then(|c| c.parse::<u64>().ok());
            let stale = match (prepared_for, restored) {
                (Some(c), Some(r)) => c > r,
                _ => true,
            };
            if stale {
                tracing::info!(file = %name, "file sink: discarding a file no completed checkpoint covers");
                std::fs::remove_file(entry.path()).map_err(io("remove", &entry.path()))?;
            }
        }
        Ok(())
    }

    async fn write(&mut self, chunk: &Chunk) -> Result<()> {
        let Some(batch) = inserts(chunk)? else {
            return Ok(());
        };
        super::encode::only_finite_numerics(&batch, "JSON, CSV or Parquet")?;
        if self.current.is_none() {
            self.current = Some(self.open()?);
        }
        let Some((path, open)) = &mut self.current else {
            unreachable!()
        };
        let failed =
            |e: String| ExecError::Connector(format!("file sink: write {}: {e}", path.display()));
        match open {
            Open::Csv(w) => w.write(&batch).map_err(|e| failed(e.to_string())),
            Open::Json(w) => w.write(&batch).map_err(|e| failed(e.to_string())),
            Open::Parquet(w) => w.write(&batch).map_err(|e| failed(e.to_string())),
        }
    }

    async fn prepare(&mut self, checkpoint: u64) -> Result<Option<Vec<u8>>> {
        let Some((path, open)) = self.current.take() else {
            return Ok(None);
        };
        close(open, &path)?;
        let prepared = format!("{}c{checkpoint}-{}", self.prefix, self.token);
        std::fs::rename(&path, self.staging.join(&prepared)).map_err(io("rename", &path))?;
        sync_dir(&self.staging)?;
        let target = format!(
            "part-{checkpoint:010}-{:04}-{}.{}",
            self.subtask,
            self.token,
            self.encoder.extension()
        );
        Ok(Some(format!("{prepared}/{target}").into_bytes()))
    }

    async fn commit(&mut self, _checkpoint: u64, committable: &[u8]) -> Result<()> {
        let text = String::from_utf8_lossy(committable);
        let Some((prepared, target)) = text.split_once('/') else {
            return Err(ExecError::Protocol(format!(
                "file sink: bad committable {text}"
            )));
        };
        let from = self.staging.join(prepared);
        let to = self.dir.join(target);
        match std::fs::rename(&from, &to) {
            Ok(()) => sync_dir(&self.dir),
            // Committed before (the notice of completion was not the first).
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && to.exists() => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::error!(file = %from.display(), "file sink: a prepared file is gone; its rows are lost");
                Ok(())
            }
            Err(e) => Err(io("rename", &from)(e)),
        }
    }
}

//! `connector = 'file'`: the lines of a file, or of every file in a
//! directory, as CSV or JSON lines; or the rows of Parquet files.
//!
//! Each file is a split (in name order); its position is the byte offset
//! after the last line read (for Parquet, the rows read), with the file's
//! name, so a restore resumes in
//! the same file where the committed views stop. The files are listed when
//! a view's job starts and each is read to its end: a file source is
//! bounded. A file added to the directory later is read after the job next
//! restarts (name it to sort after the others); a file whose split now
//! names another file fails the job rather than read the wrong rows.

use std::path::{Path, PathBuf};

use async_trait::async_trait;
use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::SchemaRef;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use planner::spec::ConnectorSpec;

use super::{Options, Pace, ReadBatch, Rejected, SourceConnector, SplitReader};
use crate::formats::Decoder;
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &["path (a file or a directory)"];
/// Bytes read a batch.
const CHUNK: usize = 1 << 20;

pub(super) struct Files {
    path: PathBuf,
    content: Content,
}

/// What the files hold.
#[derive(Clone)]
enum Content {
    /// Lines, each a record.
    Lines(Decoder),
    /// Parquet: the columns named as the source's, cast to their types.
    Parquet(SchemaRef),
}

impl Files {
    pub(super) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("file", &spec.options);
        let path = o
            .take("path")
            .ok_or_else(|| ExecError::InvalidOption("connector file needs option path".into()))?;
        o.finish(OPTIONS)?;
        let content = match spec.encode.as_deref() {
            Some("BYTES") => {
                return Err(ExecError::InvalidOption(
                    "connector file takes ENCODE JSON, CSV or PARQUET".into(),
                ));
            }
            Some("PARQUET") => {
                if spec.format.as_deref().is_some_and(|f| f != "PLAIN") {
                    return Err(ExecError::InvalidOption(
                        "ENCODE PARQUET takes FORMAT PLAIN".into(),
                    ));
                }
                if let Some(name) = spec.encode_options.keys().next() {
                    return Err(ExecError::InvalidOption(format!(
                        "unknown option {name} for ENCODE PARQUET; it takes none"
                    )));
                }
                Content::Parquet(schema.clone())
            }
            _ => Content::Lines(Decoder::new(spec, schema, true)?),
        };
        Ok(Self {
            path: PathBuf::from(path),
            content,
        })
    }

    /// The files, in name order: the path itself, or the regular files in
    /// the directory whose names do not start with a dot.
    fn list(&self) -> Result<Vec<PathBuf>> {
        let failed = |e: std::io::Error| match e.kind() {
            std::io::ErrorKind::NotFound => ExecError::InvalidOption(format!(
                "option path of connector file: {} does not exist",
                self.path.display()
            )),
            _ => ExecError::Connector(format!("file source {}: {e}", self.path.display())),
        };
        let meta = std::fs::metadata(&self.path).map_err(failed)?;
        if !meta.is_dir() {
            return Ok(vec![self.path.clone()]);
        }
        let mut files = Vec::new();
        for entry in std::fs::read_dir(&self.path).map_err(failed)? {
            let entry = entry.map_err(failed)?;
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && entry.file_type().map_err(failed)?.is_file() {
                files.push(entry.path());
            }
        }
        files.sort();
        Ok(files)
    }
}

#[async_trait]
impl SourceConnector for Files {
    async fn splits(&self) -> Result<usize> {
        Ok(self.list()?.len())
    }

    fn reader(
        &self,
        split: usize,
        position: Option<&[u8]>,
        _pace: Pace,
    ) -> Result<Box<dyn SplitReader>> {
        let files = self.list()?;
        let path = files.get(split).cloned().ok_or_else(|| {
            ExecError::Connector(format!(
                "file source {}: file {split} of {} is gone",
                self.path.display(),
                files.len()
            ))
        })?;
        let offset = match position {
            None => 0,
            Some(p) => decode_position(p, &path)?,
        };
        Ok(match &self.content {
            Content::Lines(decoder) => Box::new(FileReader {
                decoder: decoder.clone(),
                path,
                offset,
                data: None,
            }),
            Content::Parquet(schema) => Box::new(ParquetReader {
                schema: schema.clone(),
                path,
                rows: offset,
                total: 0,
                reader: None,
            }),
        })
    }

    fn bounded(&self) -> bool {
        true
    }

    fn changelog(&self) -> bool {
        matches!(&self.content, Content::Lines(d) if d.changelog())
    }
}

/// A position: the offset (8 bytes) and the file's name.
fn encode_position(offset: u64, path: &Path) -> Vec<u8> {
    let mut p = offset.to_be_bytes().to_vec();
    p.extend_from_slice(path.as_os_str().as_encoded_bytes());
    p
}

fn decode_position(p: &[u8], path: &Path) -> Result<u64> {
    let corrupt = || ExecError::Storage(storage::StorageError::Corrupt("file position".into()));
    let (offset, name) = p.split_at_checked(8).ok_or_else(corrupt)?;
    if name != path.as_os_str().as_encoded_bytes() {
        return Err(ExecError::Connector(format!(
            "the files of the source changed: a checkpoint was reading {}, which is now {}",
            String::from_utf8_lossy(name),
            path.display()
        )));
    }
    Ok(u64::from_be_bytes(
        offset.try_into().map_err(|_| corrupt())?,
    ))
}

struct FileReader {
    decoder: Decoder,
    path: PathBuf,
    /// Where the next line starts.
    offset: u64,
    /// The file, read on first use.
    data: Option<Vec<u8>>,
}

#[async_trait]
impl SplitReader for FileReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        if self.data.is_none() {
            let data = tokio::fs::read(&self.path).await.map_err(|e| {
                ExecError::Connector(format!("file source {}: {e}", self.path.display()))
            })?;
            if self.offset == 0 && self.decoder.header() {
                // The header line is no row.
                self.offset = line_end(&data, 0) as u64;
            }
            self.data = Some(data);
        }
        let data = self.data.as_deref().unwrap_or_default();
        let start = (self.offset as usize).min(data.len());
        if start == data.len() {
            return Ok(None);
        }
        // Whole lines, about CHUNK bytes of them; a last line without a
        // line end is a line too.
        let end = line_end(data, (start + CHUNK).min(data.len()).max(start + 1) - 1);
        // Each line, and its byte offset in the file to name it by.
        let mut starts = Vec::new();
        let mut at = start;
        let lines: Vec<&[u8]> = data[start..end]
            .split(|b| *b == b'\n')
            .map(|l| {
                starts.push(at);
                at += l.len() + 1;
                l.strip_suffix(b"\r").unwrap_or(l)
            })
            .collect();
        let decoded = self.decoder.decode(&lines)?;
        let name = |i: usize| format!("{} byte {}", self.path.display(), starts[i]);
        self.decoder
            .check(&decoded, |i| format!("file {}", name(i)))?;
        let rejected = decoded
            .errors
            .iter()
            .map(|e| {
                tracing::warn!(
                    file = %self.path.display(),
                    byte = starts[e.index],
                    error = %e.message,
                    "file record skipped: it cannot be decoded"
                );
                Rejected {
                    position: name(e.index),
                    record: lines[e.index].to_vec(),
                    error: e.message.clone(),
                }
            })
            .collect();
        self.offset = end as u64;
        Ok(Some(ReadBatch {
            data: decoded.rows,
            ops: decoded.ops,
            position: encode_position(self.offset, &self.path),
            // FLUSH waits for the file's last line.
            caught_up: end == data.len(),
            as_of: std::time::Instant::now(),
            rejected,
        }))
    }
}

/// Reads a Parquet file's row groups in order, a batch at a time.
struct ParquetReader {
    schema: SchemaRef,
    path: PathBuf,
    /// Rows read so far.
    rows: u64,
    /// Rows in the file, once it is open.
    total: u64,
    reader: Option<ParquetRecordBatchReader>,
}

fn parquet_failed(path: &Path, e: impl std::fmt::Display) -> ExecError {
    ExecError::Connector(format!("parquet file {}: {e}", path.display()))
}

/// Opens the Parquet file at `path` after `rows` rows, reading only the
/// columns of `schema` (by name).
async fn open_parquet(
    path: &Path,
    schema: &SchemaRef,
    rows: u64,
) -> Result<(ParquetRecordBatchReader, u64)> {
    let failed = |e: &dyn std::fmt::Display| parquet_failed(path, e);
    let data = tokio::fs::read(path).await.map_err(|e| failed(&e))?;
    let builder = ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(data))
        .map_err(|e| failed(&e))?;
    let total = builder.metadata().file_metadata().num_rows().max(0) as u64;
    let file_schema = builder.schema().clone();
    let mut roots = Vec::new();
    for field in schema.fields() {
        let Some((i, _)) = file_schema.column_with_name(field.name()) else {
            return Err(failed(&format!(
                "it has no column \"{}\"; it has: {}",
                field.name(),
                file_schema
                    .fields()
                    .iter()
                    .map(|f| f.name().as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        };
        roots.push(i);
    }
    let mask = ProjectionMask::roots(builder.parquet_schema(), roots);
    let reader = builder
        .with_projection(mask)
        .with_offset(rows as usize)
        .with_batch_size(1024)
        .build()
        .map_err(|e| failed(&e))?;
    Ok((reader, total))
}

#[async_trait]
impl SplitReader for ParquetReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        if self.reader.is_none() {
            let (reader, total) = open_parquet(&self.path, &self.schema, self.rows).await?;
            self.reader = Some(reader);
            self.total = total;
        }
        let Some(batch) = self.reader.as_mut().and_then(Iterator::next) else {
            return Ok(None);
        };
        let batch = batch.map_err(|e| parquet_failed(&self.path, e))?;
        let columns = self
            .schema
            .fields()
            .iter()
            .map(|f| {
                let column = batch.column_by_name(f.name()).ok_or_else(|| {
                    parquet_failed(&self.path, format!("no column \"{}\"", f.name()))
                })?;
                cast(column, f.data_type()).map_err(|e| {
                    parquet_failed(
                        &self.path,
                        format!("column \"{}\" is not {}: {e}", f.name(), f.data_type()),
                    )
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let data = RecordBatch::try_new(self.schema.clone(), columns)?;
        self.rows += data.num_rows() as u64;
        Ok(Some(ReadBatch {
            data,
            ops: None,
            position: encode_position(self.rows, &self.path),
            caught_up: self.rows >= self.total,
            as_of: std::time::Instant::now(),
            rejected: Vec::new(),
        }))
    }
}

/// The offset just after the line end at or after `from` (the end of
/// `data` if there is none).
fn line_end(data: &[u8], from: usize) -> usize {
    data[from.min(data.len())..]
        .iter()
        .position(|b| *b == b'\n')
        .map_or(data.len(), |i| from + i + 1)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};

    use super::*;

    fn files(path: &Path, encode: &str, encode_options: &[(&str, &str)]) -> Result<Files> {
        let spec = ConnectorSpec {
            connector: "file".into(),
            options: [("path".to_string(), path.display().to_string())].into(),
            format: Some("PLAIN".into()),
            encode: Some(encode.into()),
            encode_options: encode_options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]));
        Files::new(&spec, &schema)
    }

    async fn read_all(f: &Files, split: usize, position: Option<&[u8]>) -> (Vec<i64>, Vec<u8>) {
        let mut r = f.reader(split, position, Pace::Rated).unwrap();
        let mut ids = Vec::new();
        let mut last = position.map(<[u8]>::to_vec).unwrap_or_default();
        while let Some(b) = r.next().await.unwrap() {
            ids.extend(b.data.column(0).as_primitive::<Int64Type>().values());
            last = b.position;
        }
        (ids, last)
    }

    #[tokio::test]
    async fn a_directory_of_csv_and_json_lines() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.csv"),
            "id,name\r\n1,x\r\n2,y\n\nbad,z\n3,w",
        )
        .unwrap();
        std::fs::write(dir.path().join("b.csv"), "id,name\n4,v\n").unwrap();
        std::fs::write(dir.path().join(".hidden"), "junk").unwrap();
        let f = files(dir.path(), "CSV", &[]).unwrap();
        assert_eq!(f.splits().await.unwrap(), 2);
        let (ids, end) = read_all(&f, 0, None).await;
        assert_eq!(ids, vec![1, 2, 3]);
        // A batch short of the file's end is not caught up.
        let big = dir.path().join("big");
        std::fs::create_dir(&big).unwrap();
        let lines: String = (0..300_000).map(|i| format!("{i},n{i}\n")).collect();
        std::fs::write(big.join("big.csv"), format!("id,name\n{lines}")).unwrap();
        let f_big = files(&big, "CSV", &[]).unwrap();
        let mut r = f_big.reader(0, None, Pace::Rated).unwrap();
        let mut seen = Vec::new();
        while let Some(b) = r.next().await.unwrap() {
            seen.push(b.caught_up);
        }
        assert!(seen.len() > 1 && seen[..seen.len() - 1].iter().all(|c| !c));
        assert_eq!(seen.last(), Some(&true));
        assert_eq!(read_all(&f, 0, Some(&end)).await.0, Vec::<i64>::new());
        assert_eq!(read_all(&f, 1, None).await.0, vec![4]);

        // Without a header, "id,name" is a record, and not an id.
        let f = files(
            &dir.path().join("b.csv"),
            "CSV",
            &[("without_header", "true")],
        )
        .unwrap();
        assert_eq!(read_all(&f, 0, None).await.0, vec![4]);

        let json = dir.path().join("c.jsonl");
        std::fs::write(&json, "{\"id\": 5}\n{\"id\": 6, \"name\": \"q\"}\n").unwrap();
        let f = files(&json, "JSON", &[]).unwrap();
        assert_eq!(read_all(&f, 0, None).await.0, vec![5, 6]);
        // A position names its file.
        let other = encode_position(0, Path::new("/elsewhere"));
        assert!(f.reader(0, Some(&other), Pace::Rated).is_err());
    }

    #[tokio::test]
    async fn parquet_columns_by_name_resume_after_the_rows_read() {
        use datafusion::arrow::array::{Int32Array, StringArray};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.parquet");
        // Columns in another order and type (int32 for the bigint id).
        let batch = RecordBatch::try_from_iter([
            (
                "name",
                Arc::new(StringArray::from_iter_values(
                    (0..3000).map(|i| format!("n{i}")),
                )) as datafusion::arrow::array::ArrayRef,
            ),
            ("id", Arc::new(Int32Array::from_iter_values(0..3000)) as _),
        ])
        .unwrap();
        let mut w = parquet::arrow::ArrowWriter::try_new(
            std::fs::File::create(&path).unwrap(),
            batch.schema(),
            None,
        )
        .unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
        let f = files(&path, "PARQUET", &[]).unwrap();
        let mut r = f.reader(0, None, Pace::Rated).unwrap();
        let first = r.next().await.unwrap().unwrap();
        assert_eq!(first.data.num_rows(), 1024);
        // Not caught up until the last row: FLUSH waits for it.
        assert!(!first.caught_up);
        let mut last = first.clone();
        while let Some(b) = r.next().await.unwrap() {
            last = b;
        }
        assert!(last.caught_up);
        assert_eq!(first.data.column(1).as_string::<i32>().value(5), "n5");
        let (ids, _) = read_all(&f, 0, Some(&first.position)).await;
        assert_eq!(ids, (1024..3000).collect::<Vec<i64>>());
    }
}

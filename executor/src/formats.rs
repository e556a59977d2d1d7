//! Formats: how a connector's records (a Kafka message's value, a line of
//! a file) become rows of the source's declared columns.
//!
//! `FORMAT PLAIN ENCODE JSON | CSV | BYTES | AVRO` (RisingWave's clause;
//! Avro datums are read through JSON, see `avro`). Arrow's
//! own JSON and CSV decoders do the work, a whole fetch at a time; only
//! when that fails are the records decoded one by one, so that a record
//! that cannot be decoded is skipped (and reported) without losing its
//! neighbours.
//!
//! `FORMAT DEBEZIUM ENCODE JSON` reads a changelog: each record is a
//! Debezium change event (`op`, `before`, `after`, alone or inside a
//! `payload`), which becomes an insert, an update (its before and after
//! images) or a delete of a row.
//!
//! `FORMAT UPSERT ENCODE JSON` (Kafka, into a table whose primary key is
//! the message key, `INCLUDE KEY AS …`): a record is the row of its key,
//! replacing the one before; an empty record (a tombstone) deletes its
//! key's row. The decoder gives each tombstone a row of NULLs, marked as a
//! delete; the connector adds the key.

use std::sync::Arc;

use datafusion::arrow::array::{AsArray, BinaryArray, RecordBatch};
use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::{DataType, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::{csv, json};
use planner::functions::jsonb::is_jsonb;
use planner::functions::jsonb::value::Json;
use planner::spec::ConnectorSpec;
use storage::chunk::Op;

use crate::{ExecError, Result};

mod avro;

/// `ENCODE … (dead_letter_table = 'name')`: the Weir table that keeps the
/// records that cannot be decoded.
pub const DEAD_LETTER_TABLE: &str = "dead_letter_table";

/// The encodings a source's records may have.
pub const ENCODINGS: &[&str] = &["JSON", "CSV", "BYTES", "AVRO"];

/// How records are encoded.
#[derive(Debug, Clone)]
enum Encode {
    /// One JSON object a record; keys name columns, others are ignored.
    Json,
    /// One CSV line a record, its fields the columns in order; in a file,
    /// the first line is a header unless `without_header`.
    Csv { delimiter: u8, header: bool },
    /// The record's bytes as they are, in the one `bytea` column.
    Bytes,
    /// One Avro binary datum a record, read as the JSON object of its
    /// fields.
    Avro(std::sync::Arc<avro::Avro>),
}

/// A `true`/`false` ENCODE option, taken from `options`.
pub(crate) fn encode_flag(
    options: &mut std::collections::BTreeMap<String, String>,
    name: &str,
) -> Result<Option<bool>> {
    match options.remove(name) {
        None => Ok(None),
        Some(v) => match v.trim().to_ascii_lowercase().as_str() {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            _ => Err(ExecError::InvalidOption(format!(
                "ENCODE option {name} must be true or false, not '{v}'"
            ))),
        },
    }
}

/// `ENCODE CSV (delimiter = '…')`, taken from `options`: one character,
/// a comma if not given.
pub(crate) fn csv_delimiter(
    options: &mut std::collections::BTreeMap<String, String>,
) -> Result<u8> {
    match options.remove("delimiter").as_deref() {
        None => Ok(b','),
        Some(d) if d.len() == 1 => Ok(d.as_bytes()[0]),
        Some(d) => Err(ExecError::InvalidOption(format!(
            "ENCODE CSV option delimiter must be one character, not '{d}'"
        ))),
    }
}

/// A record that could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodeError {
    /// Its index among the records given.
    pub index: usize,
    pub message: String,
}

/// What a batch of records decoded into.
#[derive(Debug, Clone)]
pub struct Decoded {
    pub rows: RecordBatch,
    /// The change each row is; `None`: every row is an insert.
    pub ops: Option<Vec<Op>>,
    /// The index of the record each row came from.
    pub origin: Vec<usize>,
    pub errors: Vec<DecodeError>,
}

/// Decodes records into rows of a source's columns.
#[derive(Debug, Clone)]
pub struct Decoder {
    schema: SchemaRef,
    encode: Encode,
    /// `FORMAT DEBEZIUM`: the records are change events.
    debezium: bool,
    /// `FORMAT UPSERT`: a record upserts its key's row, a tombstone
    /// deletes it.
    upsert: bool,
    /// `ignore_parse_errors = 'false'`: a record that cannot be decoded
    /// fails the job rather than being skipped.
    fail_fast: bool,
}

impl Decoder {
    /// The decoder `spec`'s `FORMAT … ENCODE …` clause asks for, for
    /// `connector`, whose records need one. `files`: the records are the
    /// lines of files (which may start with a CSV header).
    pub fn new(spec: &ConnectorSpec, schema: &SchemaRef, files: bool) -> Result<Self> {
        let connector = &spec.connector;
        let (debezium, upsert) = match spec.format.as_deref() {
            None | Some("PLAIN") => (false, false),
            Some("DEBEZIUM") if spec.encode.as_deref() != Some("JSON") => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes FORMAT DEBEZIUM with ENCODE JSON only"
                )));
            }
            Some("UPSERT") if !matches!(spec.encode.as_deref(), Some("JSON" | "AVRO")) => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes FORMAT UPSERT with ENCODE JSON or AVRO only"
                )));
            }
            Some("DEBEZIUM") => (true, false),
            Some("UPSERT") if files => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes no FORMAT UPSERT: its records have no key"
                )));
            }
            Some("UPSERT") => (false, true),
            Some(other) => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes FORMAT PLAIN, UPSERT or DEBEZIUM, not FORMAT {other}"
                )));
            }
        };
        let Some(encode) = spec.encode.as_deref() else {
            return Err(ExecError::InvalidOption(format!(
                "connector {connector} needs FORMAT PLAIN ENCODE {}",
                ENCODINGS.join(" | ")
            )));
        };
        let mut options = spec.encode_options.clone();
        let fail_fast = encode_flag(&mut options, "ignore_parse_errors")? == Some(false);
        // The server resolves it into `spec.dead_letter_table`.
        if options.remove(DEAD_LETTER_TABLE).is_some() && fail_fast {
            return Err(ExecError::InvalidOption(format!(
                "ENCODE option {DEAD_LETTER_TABLE} keeps the records that cannot be decoded, \
                 but ignore_parse_errors = 'false' fails the job on the first; choose one"
            )));
        }
        let encode = match encode {
            "JSON" => Encode::Json,
            "CSV" => {
                let delimiter = csv_delimiter(&mut options)?;
                if !files && options.contains_key("without_header") {
                    return Err(ExecError::InvalidOption(format!(
                        "ENCODE CSV option without_header is for files; {connector} records have no header"
                    )));
                }
                let header = files && encode_flag(&mut options, "without_header")? != Some(true);
                Encode::Csv { delimiter, header }
            }
            "BYTES" => {
                let one_bytea = schema.fields().len() == 1
                    && matches!(
                        schema.field(0).data_type(),
                        DataType::Binary | DataType::LargeBinary | DataType::BinaryView
                    );
                if !one_bytea {
                    return Err(ExecError::InvalidOption(
                        "ENCODE BYTES needs exactly one column, of type bytea".into(),
                    ));
                }
                Encode::Bytes
            }
            "AVRO" if files => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes no ENCODE AVRO (Avro container files are not \
                     read yet); Kafka records are"
                )));
            }
            "AVRO" => Encode::Avro(std::sync::Arc::new(avro::Avro::new(&mut options, schema)?)),
            other => {
                return Err(ExecError::InvalidOption(format!(
                    "connector {connector} takes ENCODE {}, not ENCODE {other}",
                    ENCODINGS.join(", ")
                )));
            }
        };
        if let Some(name) = options.keys().next() {
            return Err(unknown_option(encode_name(&encode), name));
        }
        Ok(Self {
            schema: schema.clone(),
            encode,
            debezium,
            upsert,
            fail_fast,
        })
    }

    /// Checks a decoded batch: with `ignore_parse_errors = 'false'`, its
    /// first bad record (at `where_`, which names it) fails the job.
    pub fn check(&self, decoded: &Decoded, where_: impl Fn(usize) -> String) -> Result<()> {
        match decoded.errors.first() {
            Some(e) if self.fail_fast => Err(ExecError::Decode(format!(
                "{} cannot be decoded ({}), and ignore_parse_errors is false",
                where_(e.index),
                e.message
            ))),
            _ => Ok(()),
        }
    }

    /// Whether the records are changes (inserts, updates, deletes) rather
    /// than rows.
    pub fn changelog(&self) -> bool {
        self.debezium || self.upsert
    }

    /// Whether the records upsert rows by the message key (`FORMAT
    /// UPSERT`).
    pub fn upsert(&self) -> bool {
        self.upsert
    }

    /// The rows (or changes) of `records`, in order, and the records that
    /// could not be decoded.
    pub fn decode(&self, records: &[&[u8]]) -> Result<Decoded> {
        if let Encode::Avro(avro) = &self.encode {
            // Each datum becomes its JSON object, read as ENCODE JSON reads
            // records; one that is no datum of the schema stands in as a
            // record no JSON decoder takes, and gets its own error back.
            let mut failed = std::collections::BTreeMap::new();
            let json: Vec<Vec<u8>> = avro
                .to_json(records)
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    r.unwrap_or_else(|message| {
                        failed.insert(i, message);
                        b"!".to_vec()
                    })
                })
                .collect();
            let as_json = Self {
                encode: Encode::Json,
                ..self.clone()
            };
            let refs: Vec<&[u8]> = json.iter().map(Vec::as_slice).collect();
            let mut decoded = as_json.decode(&refs)?;
            for e in &mut decoded.errors {
                if let Some(message) = failed.remove(&e.index) {
                    e.message = message;
                }
            }
            return Ok(decoded);
        }
        if self.upsert {
            return self.decode_upserts(records);
        }
        if !self.debezium {
            let (rows, errors) = self.decode_rows(records)?;
            let bad: std::collections::BTreeSet<usize> = errors.iter().map(|e| e.index).collect();
            let origin = (0..records.len())
                .filter(|i| !records[*i].is_empty() && !bad.contains(i))
                .collect();
            return Ok(Decoded {
                rows,
                ops: None,
                origin,
                errors,
            });
        }
        let mut images = Vec::new();
        let mut ops = Vec::new();
        let mut origin = Vec::new();
        let mut errors = Vec::new();
        for (index, record) in records.iter().enumerate() {
            if record.is_empty() {
                continue;
            }
            match debezium_images(record) {
                Ok(list) => {
                    for (op, image) in list {
                        images.push(image);
                        ops.push(op);
                        origin.push(index);
                    }
                }
                Err(message) => errors.push(DecodeError { index, message }),
            }
        }
        let refs: Vec<&[u8]> = images.iter().map(Vec::as_slice).collect();
        let (rows, bad) = self.decode_rows(&refs)?;
        // An update whose before image decodes but whose after image does
        // not is dropped whole.
        let bad_records: std::collections::BTreeSet<usize> =
            bad.iter().map(|e| origin[e.index]).collect();
        let bad_images: std::collections::BTreeSet<usize> = bad.iter().map(|e| e.index).collect();
        let decoded: Vec<usize> = (0..images.len())
            .filter(|i| !bad_images.contains(i))
            .collect();
        let keep: datafusion::arrow::array::BooleanArray = decoded
            .iter()
            .map(|i| Some(!bad_records.contains(&origin[*i])))
            .collect();
        let rows = datafusion::arrow::compute::filter_record_batch(&rows, &keep)?;
        let kept: Vec<usize> = decoded
            .iter()
            .copied()
            .filter(|i| !bad_records.contains(&origin[*i]))
            .collect();
        let ops = kept.iter().map(|i| ops[*i]).collect();
        let rows_origin = kept.iter().map(|i| origin[*i]).collect();
        let mut seen = std::collections::BTreeSet::new();
        for e in bad {
            let index = origin[e.index];
            if seen.insert(index) {
                errors.push(DecodeError {
                    index,
                    message: e.message,
                });
            }
        }
        errors.sort_by_key(|e| e.index);
        Ok(Decoded {
            rows,
            ops: Some(ops),
            origin: rows_origin,
            errors,
        })
    }

    /// `FORMAT UPSERT`: a row (an insert, which the table applies as an
    /// upsert) per record, and per tombstone a row of NULLs that deletes.
    fn decode_upserts(&self, records: &[&[u8]]) -> Result<Decoded> {
        let (rows, errors) = self.decode_rows(records)?;
        let bad: std::collections::BTreeSet<usize> = errors.iter().map(|e| e.index).collect();
        let tombstones = records.iter().filter(|r| r.is_empty()).count();
        // (A connector table's job reads its columns as nullable.)
        let nulls = RecordBatch::try_new_with_options(
            self.schema.clone(),
            self.schema
                .fields()
                .iter()
                .map(|f| datafusion::arrow::array::new_null_array(f.data_type(), tombstones))
                .collect(),
            &datafusion::arrow::array::RecordBatchOptions::new().with_row_count(Some(tombstones)),
        )?;
        let decoded_rows = rows.num_rows() as u32;
        let both = concat_batches(&self.schema, &[rows, nulls])?;
        // Rows in record order: decoded rows are numbered first, then the
        // tombstones'.
        let (mut next_row, mut next_null) = (0u32, decoded_rows);
        let mut take = Vec::new();
        let mut ops = Vec::new();
        let mut origin = Vec::new();
        for (i, record) in records.iter().enumerate() {
            if record.is_empty() {
                take.push(next_null);
                next_null += 1;
                ops.push(Op::Delete);
            } else if bad.contains(&i) {
                continue;
            } else {
                take.push(next_row);
                next_row += 1;
                ops.push(Op::Insert);
            }
            origin.push(i);
        }
        let indices = datafusion::arrow::array::UInt32Array::from(take);
        let rows = datafusion::arrow::compute::take_record_batch(&both, &indices)?;
        Ok(Decoded {
            rows,
            ops: Some(ops),
            origin,
            errors,
        })
    }

    /// Whether the first line of a file is a header (not a row).
    pub fn header(&self) -> bool {
        matches!(self.encode, Encode::Csv { header: true, .. })
    }

    /// The rows of `records`, in order, and the records that could not be
    /// decoded. An empty record (a Kafka tombstone) is no row and no error.
    fn decode_rows(&self, records: &[&[u8]]) -> Result<(RecordBatch, Vec<DecodeError>)> {
        let records: Vec<(usize, &[u8])> = records
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(i, r)| (i, *r))
            .collect();
        if let Encode::Bytes = self.encode {
            let values = BinaryArray::from_iter_values(records.iter().map(|(_, r)| *r));
            let column =
                datafusion::arrow::compute::cast(&values, self.schema.field(0).data_type())?;
            return Ok((
                RecordBatch::try_new(self.schema.clone(), vec![column])?,
                Vec::new(),
            ));
        }
        if let Ok(batch) = self.decode_all(records.iter().map(|(_, r)| *r))
            && batch.num_rows() == records.len()
        {
            return Ok((batch, Vec::new()));
        }
        // Some record is bad: decode them one by one to keep the others.
        let mut batches = Vec::new();
        let mut errors = Vec::new();
        for (index, record) in records {
            match self.decode_all(std::iter::once(record)) {
                Ok(b) if b.num_rows() == 1 => batches.push(b),
                Ok(b) => errors.push(DecodeError {
                    index,
                    message: format!("the record holds {} rows, not one", b.num_rows()),
                }),
                Err(e) => errors.push(DecodeError {
                    index,
                    message: describe(&e),
                }),
            }
        }
        Ok((concat_batches(&self.schema, &batches)?, errors))
    }

    fn decode_all<'a>(
        &self,
        records: impl Iterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch, ArrowError> {
        let batch = match self.encode {
            Encode::Json if self.has_jsonb() => {
                let records = records
                    .map(|r| self.jsonb_as_text(r))
                    .collect::<Result<Vec<_>, _>>()?;
                let decoder = json::ReaderBuilder::new(self.schema.clone())
                    .with_coerce_primitive(true)
                    .build_decoder()?;
                self.run(decoder, records.iter().map(Vec::as_slice))?
            }
            Encode::Json => {
                let decoder = json::ReaderBuilder::new(self.schema.clone())
                    .with_coerce_primitive(true)
                    .build_decoder()?;
                self.run(decoder, records)?
            }
            Encode::Csv { delimiter, .. } => {
                // Arrow's CSV decoder reads text into `Utf8` only.
                let as_text = Arc::new(Schema::new(
                    self.schema
                        .fields()
                        .iter()
                        .map(|f| match is_jsonb(f.data_type()) {
                            true => Arc::new(f.as_ref().clone().with_data_type(DataType::Utf8)),
                            false => f.clone(),
                        })
                        .collect::<Vec<_>>(),
                ));
                let decoder = csv::ReaderBuilder::new(as_text.clone())
                    .with_header(false)
                    .with_delimiter(delimiter)
                    .build_decoder();
                let batch = self.run(decoder, records)?;
                let columns = batch
                    .columns()
                    .iter()
                    .zip(self.schema.fields())
                    .map(|(c, f)| datafusion::arrow::compute::cast(c, f.data_type()))
                    .collect::<Result<Vec<_>, _>>()?;
                RecordBatch::try_new(self.schema.clone(), columns)?
            }
            Encode::Bytes | Encode::Avro(_) => unreachable!("decoded before"),
        };
        canonical_jsonb(batch)
    }

    /// Whether a column is `jsonb` (see `planner::functions::jsonb`).
    fn has_jsonb(&self) -> bool {
        self.schema.fields().iter().any(|f| is_jsonb(f.data_type()))
    }

    /// A JSON record whose `jsonb` columns' values (objects, arrays, any
    /// JSON) are replaced by their text, which Arrow's JSON decoder reads
    /// into the column as it reads a string. A JSON `null` is SQL NULL, as
    /// a missing field is.
    fn jsonb_as_text(&self, record: &[u8]) -> Result<Vec<u8>, ArrowError> {
        let text = std::str::from_utf8(record).map_err(|e| ArrowError::JsonError(e.to_string()))?;
        let json = Json::parse(text).map_err(|e| ArrowError::JsonError(format!("{e:?}")))?;
        let Json::Object(pairs) = json else {
            return Ok(record.to_vec());
        };
        let pairs = pairs
            .into_iter()
            .map(|(k, v)| {
                let jsonb = self
                    .schema
                    .field_with_name(&k)
                    .is_ok_and(|f| is_jsonb(f.data_type()));
                match v {
                    v if jsonb && v != Json::Null => (k, Json::String(v.to_string())),
                    v => (k, v),
                }
            })
            .collect();
        Ok(Json::Object(pairs).to_string().into_bytes())
    }

    /// Feeds each record, and a line end after it, to `decoder`, which
    /// takes as much as fits its batch and is flushed whenever it is full.
    fn run<'a>(
        &self,
        mut decoder: impl Incremental,
        records: impl Iterator<Item = &'a [u8]>,
    ) -> Result<RecordBatch, ArrowError> {
        let mut batches = Vec::new();
        for record in records {
            let end: &[u8] = if record.ends_with(b"\n") { b"" } else { b"\n" };
            for mut bytes in [record, end] {
                while !bytes.is_empty() {
                    let n = decoder.decode(bytes)?;
                    if n == 0 {
                        batches.extend(decoder.flush()?);
                    }
                    bytes = &bytes[n..];
                }
            }
        }
        batches.extend(decoder.flush()?);
        // The decoder's schema (a CSV decoder's reads `jsonb` as text).
        let schema = batches
            .first()
            .map(|b| b.schema())
            .unwrap_or_else(|| self.schema.clone());
        concat_batches(&schema, &batches)
    }
}

/// `jsonb` columns as Weir stores them, canonical (a CSV field is the
/// document's text as written); text that is no JSON fails the batch,
/// whose records are then decoded one by one.
fn canonical_jsonb(batch: RecordBatch) -> Result<RecordBatch, ArrowError> {
    if !batch
        .schema()
        .fields()
        .iter()
        .any(|f| is_jsonb(f.data_type()))
    {
        return Ok(batch);
    }
    let columns = batch
        .columns()
        .iter()
        .map(|c| {
            if !is_jsonb(c.data_type()) {
                return Ok(c.clone());
            }
            let texts = c.as_string::<i64>();
            let mut out = datafusion::arrow::array::LargeStringBuilder::new();
            for t in texts.iter() {
                match t {
                    Some(t) => out.append_value(
                        Json::parse(t)
                            .map_err(|_| {
                                ArrowError::JsonError(format!(
                                    "invalid input syntax for type json: {t}"
                                ))
                            })?
                            .to_string(),
                    ),
                    None => out.append_null(),
                }
            }
            Ok(std::sync::Arc::new(out.finish()) as datafusion::arrow::array::ArrayRef)
        })
        .collect::<Result<Vec<_>, ArrowError>>()?;
    RecordBatch::try_new(batch.schema(), columns)
}

/// Arrow's push decoders.
trait Incremental {
    fn decode(&mut self, bytes: &[u8]) -> Result<usize, ArrowError>;
    fn flush(&mut self) -> Result<Option<RecordBatch>, ArrowError>;
}

impl Incremental for json::reader::Decoder {
    fn decode(&mut self, bytes: &[u8]) -> Result<usize, ArrowError> {
        json::reader::Decoder::decode(self, bytes)
    }
    fn flush(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        json::reader::Decoder::flush(self)
    }
}

impl Incremental for csv::reader::Decoder {
    fn decode(&mut self, bytes: &[u8]) -> Result<usize, ArrowError> {
        csv::reader::Decoder::decode(self, bytes)
    }
    fn flush(&mut self) -> Result<Option<RecordBatch>, ArrowError> {
        csv::reader::Decoder::flush(self)
    }
}

/// A Debezium change event's row images, as JSON objects, with the change
/// each is: `c` and `r` (snapshot) insert `after`, `u` retracts `before`
/// and adds `after`, `d` deletes `before`. The event may be wrapped in a
/// `payload` (with a `schema`, as Kafka Connect's JSON converter writes).
fn debezium_images(record: &[u8]) -> std::result::Result<Vec<(Op, Vec<u8>)>, String> {
    let v: serde_json::Value = serde_json::from_slice(record).map_err(|e| e.to_string())?;
    let event = match v.get("payload") {
        Some(p) if p.is_object() && v.get("op").is_none() => p,
        _ => &v,
    };
    let op = event
        .get("op")
        .and_then(|o| o.as_str())
        .ok_or_else(|| "no \"op\": not a Debezium change event".to_string())?;
    let image = |name: &str| match event.get(name) {
        Some(row) if row.is_object() => Ok(row.to_string().into_bytes()),
        _ => Err(format!(
            "a Debezium \"{op}\" event without \"{name}\"{}",
            if name == "before" {
                " (the table needs REPLICA IDENTITY FULL)"
            } else {
                ""
            }
        )),
    };
    Ok(match op {
        "c" | "r" => vec![(Op::Insert, image("after")?)],
        "u" => vec![
            (Op::UpdateDelete, image("before")?),
            (Op::UpdateInsert, image("after")?),
        ],
        "d" => vec![(Op::Delete, image("before")?)],
        other => return Err(format!("Debezium op \"{other}\" is not a row change")),
    })
}

/// An arrow decoding error without its "Json error: " prefixes.
fn describe(e: &ArrowError) -> String {
    match e {
        ArrowError::JsonError(m) | ArrowError::CsvError(m) | ArrowError::ParseError(m) => m.clone(),
        other => other.to_string(),
    }
}

fn encode_name(encode: &Encode) -> &'static str {
    match encode {
        Encode::Json => "JSON",
        Encode::Csv { .. } => "CSV",
        Encode::Bytes => "BYTES",
        Encode::Avro(_) => "AVRO",
    }
}

fn unknown_option(encode: &str, name: &str) -> ExecError {
    let takes = match encode {
        "CSV" => "delimiter, without_header (files)",
        _ => "no options",
    };
    ExecError::InvalidOption(format!(
        "unknown option {name} for ENCODE {encode}; it takes: {takes}"
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Array, AsArray};
    use datafusion::arrow::datatypes::{Field, Int64Type, Schema};

    use super::*;

    fn schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
        ]))
    }

    fn spec(encode: &str) -> ConnectorSpec {
        ConnectorSpec {
            connector: "kafka".into(),
            format: Some("PLAIN".into()),
            encode: Some(encode.into()),
            ..Default::default()
        }
    }

    #[test]
    fn jsonb_columns_take_any_json_canonical() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("doc", DataType::LargeUtf8, true),
        ]));
        let d = Decoder::new(&spec("JSON"), &schema, false).unwrap();
        let Decoded { rows, errors, .. } = d
            .decode(&[
                br#"{"id": 1, "doc": {"b": 10.50, "a": [1, "x"]}}"#,
                br#"{"id": 2, "doc": "text"}"#,
                br#"{"id": 3, "doc": null}"#,
                br#"{"id": 4}"#,
                b"{not json",
                br#"{"id": 6, "doc": 1e2}"#,
            ])
            .unwrap();
        let docs = rows.column(1).as_string::<i64>();
        let docs: Vec<Option<&str>> = docs.iter().collect();
        // Postgres prints these jsonb values so.
        assert_eq!(
            docs,
            vec![
                Some(r#"{"a": [1, "x"], "b": 10.50}"#),
                Some(r#""text""#),
                None,
                None,
                Some("100")
            ]
        );
        assert_eq!(errors.iter().map(|e| e.index).collect::<Vec<_>>(), vec![4]);
        // In CSV the field is the document's text.
        let d = Decoder::new(&spec("CSV"), &schema, false).unwrap();
        let Decoded { rows, errors, .. } = d.decode(&[br#"1,"{""a"":1}""#, b"2,{oops"]).unwrap();
        assert_eq!(rows.num_rows(), 1, "{errors:?}");
        assert_eq!(rows.column(1).as_string::<i64>().value(0), r#"{"a": 1}"#);
        assert_eq!(errors.iter().map(|e| e.index).collect::<Vec<_>>(), vec![1]);
    }

    #[test]
    fn json_records_become_rows_and_bad_ones_are_reported() {
        let d = Decoder::new(&spec("JSON"), &schema(), false).unwrap();
        let Decoded {
            rows: batch,
            errors,
            ..
        } = d
            .decode(&[
                br#"{"id": 1, "name": "a", "extra": true}"#,
                b"",
                br#"{"id": "x"}"#,
                b"{not json",
                br#"{"id": 4, "name": 5}"#,
            ])
            .unwrap();
        assert_eq!(batch.num_rows(), 2);
        let ids = batch.column(0).as_primitive::<Int64Type>();
        assert_eq!((ids.value(0), ids.value(1)), (1, 4));
        assert_eq!(batch.column(1).as_string::<i32>().value(1), "5");
        assert_eq!(
            errors.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![2, 3]
        );
    }

    #[test]
    fn csv_records_are_lines() {
        let mut s = spec("CSV");
        s.encode_options.insert("delimiter".into(), "|".into());
        let d = Decoder::new(&s, &schema(), false).unwrap();
        let Decoded {
            rows: batch,
            errors,
            ..
        } = d.decode(&[b"1|a", b"2|b\n", b"x|c"]).unwrap();
        assert_eq!(batch.num_rows(), 2);
        assert_eq!(batch.column(1).as_string::<i32>().value(1), "b");
        assert_eq!(errors.len(), 1);
        assert_eq!(errors[0].index, 2);
    }

    #[test]
    fn bytes_need_one_bytea_column() {
        assert!(Decoder::new(&spec("BYTES"), &schema(), false).is_err());
        let one = Arc::new(Schema::new(vec![Field::new("v", DataType::Binary, true)]));
        let d = Decoder::new(&spec("BYTES"), &one, false).unwrap();
        let batch = d.decode(&[b"ab", b"", b"c"]).unwrap().rows;
        assert_eq!(batch.num_rows(), 2);
        assert!(!batch.column(0).is_null(1));
    }

    #[test]
    fn upsert_records_insert_and_tombstones_delete_in_record_order() {
        let mut s = spec("JSON");
        s.format = Some("UPSERT".into());
        let d = Decoder::new(&s, &schema(), false).unwrap();
        assert!(d.changelog() && d.upsert());
        let records: Vec<&[u8]> = vec![
            br#"{"id": 1, "name": "a"}"#,
            b"",
            b"{bad",
            br#"{"id": 2, "name": "b"}"#,
            b"",
        ];
        let out = d.decode(&records).unwrap();
        use Op::*;
        assert_eq!(out.ops, Some(vec![Insert, Delete, Insert, Delete]));
        assert_eq!(out.origin, vec![0, 1, 3, 4]);
        assert_eq!(out.errors.len(), 1);
        assert_eq!(out.errors[0].index, 2);
        let ids = out.rows.column(0).as_primitive::<Int64Type>();
        assert_eq!(
            (0..4)
                .map(|i| ids.is_valid(i).then(|| ids.value(i)))
                .collect::<Vec<_>>(),
            vec![Some(1), None, Some(2), None]
        );
        // Files have no keys; UPSERT is JSON only.
        assert!(Decoder::new(&s, &schema(), true).is_err());
        s.encode = Some("CSV".into());
        assert!(Decoder::new(&s, &schema(), false).is_err());
    }

    #[test]
    fn debezium_events_become_changes() {
        let mut s = spec("JSON");
        s.format = Some("DEBEZIUM".into());
        let d = Decoder::new(&s, &schema(), false).unwrap();
        assert!(d.changelog());
        let got = d
            .decode(&[
                br#"{"op": "r", "before": null, "after": {"id": 1, "name": "a"}}"#,
                br#"{"schema": {}, "payload": {"op": "u", "before": {"id": 1, "name": "a"}, "after": {"id": 1, "name": "b"}}}"#,
                br#"{"op": "u", "before": null, "after": {"id": 2, "name": "c"}}"#,
                br#"{"op": "u", "before": {"id": 1}, "after": {"id": "x"}}"#,
                b"",
                br#"{"op": "d", "before": {"id": 1, "name": "b"}, "after": null}"#,
                br#"{"id": 7}"#,
            ])
            .unwrap();
        assert_eq!(
            got.ops.unwrap(),
            vec![Op::Insert, Op::UpdateDelete, Op::UpdateInsert, Op::Delete]
        );
        assert_eq!(got.rows.num_rows(), 4);
        assert_eq!(got.rows.column(1).as_string::<i32>().value(2), "b");
        assert_eq!(
            got.errors.iter().map(|e| e.index).collect::<Vec<_>>(),
            vec![2, 3, 6]
        );
        assert!(got.errors[0].message.contains("REPLICA IDENTITY FULL"));
        s.encode = Some("CSV".into());
        assert!(Decoder::new(&s, &schema(), false).is_err());
    }

    #[test]
    fn avro_datums_of_the_columns_schema_become_rows() {
        use apache_avro::types::Value;
        let columns = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, true),
            Field::new("name", DataType::Utf8, true),
            Field::new("price", DataType::Decimal128(10, 2), true),
            Field::new(
                "at",
                DataType::Timestamp(datafusion::arrow::datatypes::TimeUnit::Microsecond, None),
                true,
            ),
        ]));
        let d = Decoder::new(&spec("AVRO"), &columns, false).unwrap();
        let Encode::Avro(avro) = &d.encode else {
            panic!("not avro")
        };
        let datum = |id: i64, name: Option<&str>| {
            let record = Value::Record(vec![
                ("id".into(), Value::Union(1, Box::new(Value::Long(id)))),
                (
                    "name".into(),
                    match name {
                        Some(n) => Value::Union(1, Box::new(Value::String(n.into()))),
                        None => Value::Union(0, Box::new(Value::Null)),
                    },
                ),
                (
                    "price".into(),
                    Value::Union(1, Box::new(Value::Decimal(vec![0x04u8, 0xd2].into()))),
                ),
                (
                    "at".into(),
                    Value::Union(1, Box::new(Value::TimestampMicros(1_000_000))),
                ),
            ]);
            apache_avro::writer::datum::GenericDatumWriter::builder(&avro.schema)
                .build()
                .unwrap()
                .write_value_to_vec(record)
                .unwrap()
        };
        let (a, b) = (datum(1, Some("x")), datum(2, None));
        let records: Vec<&[u8]> = vec![&a, b"\x02garbage", &b];
        let out = d.decode(&records).unwrap();
        assert_eq!(out.rows.num_rows(), 2);
        assert_eq!(out.origin, vec![0, 2]);
        assert_eq!(out.errors.len(), 1);
        assert!(out.errors[0].message.contains("Avro"), "{:?}", out.errors);
        let prices = datafusion::arrow::util::display::ArrayFormatter::try_new(
            out.rows.column(2),
            &Default::default(),
        )
        .unwrap();
        assert_eq!(prices.value(0).to_string(), "12.34");
        assert!(out.rows.column(1).is_null(1));
        let at = out
            .rows
            .column(3)
            .as_primitive::<datafusion::arrow::datatypes::TimestampMicrosecondType>();
        assert_eq!(at.value(0), 1_000_000);
    }

    #[test]
    fn options_are_checked() {
        let mut s = spec("CSV");
        s.encode_options.insert("delimiter".into(), "||".into());
        assert!(Decoder::new(&s, &schema(), false).is_err());
        let mut s = spec("JSON");
        s.encode_options.insert("schema".into(), "x".into());
        let e = Decoder::new(&s, &schema(), false).unwrap_err().to_string();
        assert!(e.contains("unknown option schema for ENCODE JSON"), "{e}");
        let mut s = spec("AVRO");
        s.encode_options
            .insert("schema.location".into(), "http://registry/x".into());
        let e = Decoder::new(&s, &schema(), false).unwrap_err().to_string();
        assert!(e.contains("must be a file"), "{e}");
        assert!(Decoder::new(&spec("AVRO"), &schema(), true).is_err());
    }
}

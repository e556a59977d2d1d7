//! How a sink's rows become records: `FORMAT … ENCODE JSON | CSV |
//! PARQUET`, the sink side of [`crate::formats`]. Arrow's own writers do
//! the work, a whole batch at a time.

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::{csv, json};
use planner::functions::jsonb::is_jsonb;
use planner::functions::jsonb::value::Json;
use planner::spec::ConnectorSpec;

use crate::formats::{csv_delimiter, encode_flag};
use crate::{ExecError, Result};

/// How a sink encodes its rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoder {
    /// One JSON object a row, keyed by column name.
    Json,
    /// One CSV line a row; a file starts with a header line unless
    /// `without_header`.
    Csv { delimiter: u8, header: bool },
    /// Parquet files (files only).
    Parquet,
}

impl Encoder {
    /// The encoder `spec`'s `ENCODE …` asks for, among `allowed`.
    pub fn new(spec: &ConnectorSpec, allowed: &[&str]) -> Result<Self> {
        let connector = &spec.connector;
        let encode = spec.encode.as_deref().unwrap_or_default();
        if !allowed.contains(&encode) {
            return Err(ExecError::InvalidOption(format!(
                "sink connector {connector} needs ENCODE {}{}",
                allowed.join(" | "),
                if encode.is_empty() {
                    String::new()
                } else {
                    format!(", not ENCODE {encode}")
                }
            )));
        }
        let mut options = spec.encode_options.clone();
        let encoder = match encode {
            "JSON" => Encoder::Json,
            "PARQUET" => Encoder::Parquet,
            _ => {
                let delimiter = csv_delimiter(&mut options)?;
                let header = encode_flag(&mut options, "without_header")? != Some(true);
                Encoder::Csv { delimiter, header }
            }
        };
        if let Some(name) = options.keys().next() {
            return Err(ExecError::InvalidOption(format!(
                "unknown option {name} for ENCODE {encode}"
            )));
        }
        Ok(encoder)
    }

    /// The extension of a file of records so encoded.
    pub fn extension(&self) -> &'static str {
        match self {
            Encoder::Json => "jsonl",
            Encoder::Csv { .. } => "csv",
            Encoder::Parquet => "parquet",
        }
    }

    /// Each row of `batch` as one record (a JSON object, a CSV line
    /// without its newline).
    pub fn records(&self, batch: &RecordBatch) -> Result<Vec<Vec<u8>>> {
        only_finite_numerics(batch, "JSON, CSV or Parquet")?;
        let mut out = Vec::new();
        match self {
            Encoder::Json => {
                let mut w = json::WriterBuilder::new()
                    .with_explicit_nulls(true)
                    .build::<_, json::writer::LineDelimited>(&mut out);
                w.write(batch)?;
                w.finish()?;
            }
            Encoder::Csv { delimiter, .. } => {
                let mut w = csv::WriterBuilder::new()
                    .with_header(false)
                    .with_delimiter(*delimiter)
                    .build(&mut out);
                w.write(batch)?;
            }
            Encoder::Parquet => {
                return Err(ExecError::Unsupported(
                    "ENCODE PARQUET records outside files".into(),
                ));
            }
        }
        let mut records: Vec<Vec<u8>> = out
            .split(|b| *b == b'\n')
            .map(|r| r.strip_suffix(b"\r").unwrap_or(r).to_vec())
            .collect();
        // The writer ends every record with a newline.
        records.pop();
        if *self == Encoder::Json {
            jsonb_as_json(batch, &mut records)?;
        }
        if records.len() != batch.num_rows() {
            return Err(ExecError::Connector(format!(
                "{} rows encoded as {} records (a value with a line break?)",
                batch.num_rows(),
                records.len()
            )));
        }
        Ok(records)
    }
}

/// Refuses a `numeric` `NaN` or `±Infinity` in `batch`: Arrow's writers
/// (`what`) would write the value that stands for it as a number
/// (`planner::functions::numeric_special`).
pub(crate) fn only_finite_numerics(batch: &RecordBatch, what: &str) -> Result<()> {
    use datafusion::arrow::array::AsArray;
    use datafusion::arrow::datatypes::{DataType, Decimal128Type};
    use planner::functions::numeric_special::Special;
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if !matches!(column.data_type(), DataType::Decimal128(..)) {
            continue;
        }
        let values = column.as_primitive::<Decimal128Type>();
        if let Some(s) = values.iter().flatten().find_map(Special::of) {
            return Err(ExecError::Unsupported(format!(
                "numeric {} (column {}) in a sink that writes {what}; cast the column to text or float8",
                s.text(),
                field.name()
            )));
        }
    }
    Ok(())
}

/// A `jsonb` column's value in a JSON record is its document, not the
/// string of its text (which Arrow's writer makes of it). Such records are
/// written again, keys in Postgres's order.
fn jsonb_as_json(batch: &RecordBatch, records: &mut [Vec<u8>]) -> Result<()> {
    let schema = batch.schema();
    let jsonb: Vec<&str> = schema
        .fields()
        .iter()
        .filter(|f| is_jsonb(f.data_type()))
        .map(|f| f.name().as_str())
        .collect();
    if jsonb.is_empty() {
        return Ok(());
    }
    let bad = |e| {
        ExecError::Connector(format!(
            "a JSON record Weir wrote does not read back: {e:?}"
        ))
    };
    for record in records.iter_mut() {
        let text = std::str::from_utf8(record).map_err(|e| ExecError::Connector(e.to_string()))?;
        let Json::Object(pairs) = Json::parse(text).map_err(bad)? else {
            continue;
        };
        let pairs = pairs
            .into_iter()
            .map(|(k, v)| match v {
                Json::String(doc) if jsonb.contains(&k.as_str()) => {
                    Ok((k, Json::parse(&doc).map_err(bad)?))
                }
                v => Ok((k, v)),
            })
            .collect::<Result<Vec<_>>>()?;
        *record = Json::Object(pairs).to_string().into_bytes();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{Int64Array, StringArray};
    use datafusion::arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    fn spec(encode: &str, options: &[(&str, &str)]) -> ConnectorSpec {
        ConnectorSpec {
            connector: "file".into(),
            format: Some("PLAIN".into()),
            encode: Some(encode.into()),
            encode_options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    fn batch() -> RecordBatch {
        RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(StringArray::from(vec![Some("a;b"), None])),
            ],
        )
        .unwrap()
    }

    #[test]
    fn one_record_per_row() {
        let all = &["JSON", "CSV"];
        let json = Encoder::new(&spec("JSON", &[]), all).unwrap();
        assert_eq!(
            json.records(&batch()).unwrap(),
            vec![
                br#"{"id":1,"name":"a;b"}"#.to_vec(),
                br#"{"id":2,"name":null}"#.to_vec()
            ]
        );
        let csv = Encoder::new(&spec("CSV", &[("delimiter", ";")]), all).unwrap();
        assert_eq!(
            csv.records(&batch()).unwrap(),
            vec![br#"1;"a;b""#.to_vec(), b"2;".to_vec()]
        );
    }

    #[test]
    fn jsonb_columns_are_documents_in_json() {
        let batch = RecordBatch::try_new(
            Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("doc", DataType::LargeUtf8, true),
            ])),
            vec![
                Arc::new(Int64Array::from(vec![1, 2])),
                Arc::new(datafusion::arrow::array::LargeStringArray::from(vec![
                    Some(r#"{"a": [1, 2.50]}"#),
                    None,
                ])),
            ],
        )
        .unwrap();
        let json = Encoder::new(&spec("JSON", &[]), &["JSON"]).unwrap();
        assert_eq!(
            json.records(&batch).unwrap(),
            vec![
                br#"{"id": 1, "doc": {"a": [1, 2.50]}}"#.to_vec(),
                br#"{"id": 2, "doc": null}"#.to_vec()
            ]
        );
    }

    #[test]
    fn options_are_checked() {
        let e = Encoder::new(&spec("AVRO", &[]), &["JSON"]).unwrap_err();
        assert!(
            e.to_string().contains("ENCODE JSON, not ENCODE AVRO"),
            "{e}"
        );
        let e = Encoder::new(&spec("CSV", &[("quote", "'")]), &["CSV"]).unwrap_err();
        assert!(e.to_string().contains("unknown option quote"), "{e}");
    }
}

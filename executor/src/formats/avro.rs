//! `ENCODE AVRO`: a record is one Avro binary datum of a record schema,
//! the writer's schema, which Weir must know: from a schema file
//! (`ENCODE AVRO (schema.location = 'file:///…/x.avsc')`) or, without one,
//! derived from the declared columns (each a nullable field of the type
//! the column maps to; see `docs/connectors.md`).
//!
//! `apache-avro` decodes the datum; its fields become a JSON object that
//! Arrow's JSON decoder reads into the columns, as for `ENCODE JSON`, so
//! both formats share one path from a value to a column. Logical types are
//! written as the column needs them: timestamps in the column's unit, dates
//! as days, decimals as exact decimal text.

use std::collections::{BTreeMap, HashMap};

use apache_avro::Schema as AvroSchema;
use apache_avro::types::Value;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use serde_json::{Map, Value as Json};

use crate::{ExecError, Result};

/// A writer schema and what the columns need of its fields.
#[derive(Debug)]
pub(super) struct Avro {
    pub(super) schema: AvroSchema,
    /// The Arrow type of each declared column, by name.
    columns: HashMap<String, DataType>,
    /// The scale of each decimal field, by name.
    scales: HashMap<String, usize>,
}

impl Avro {
    /// The schema `options` name (taken from them), or the one the columns
    /// imply.
    pub(super) fn new(options: &mut BTreeMap<String, String>, columns: &SchemaRef) -> Result<Self> {
        let text = match options.remove("schema.location") {
            Some(location) => {
                let path = location.strip_prefix("file://").unwrap_or(&location);
                if path.contains("://") {
                    return Err(ExecError::InvalidOption(format!(
                        "ENCODE AVRO option schema.location must be a file (file:///path or a \
                         path), not '{location}'"
                    )));
                }
                std::fs::read_to_string(path).map_err(|e| {
                    ExecError::InvalidOption(format!(
                        "ENCODE AVRO schema.location '{location}' cannot be read: {e}"
                    ))
                })?
            }
            None => derived_schema(columns)?.to_string(),
        };
        let schema = AvroSchema::parse_str(&text)
            .map_err(|e| ExecError::InvalidOption(format!("invalid Avro schema: {e}")))?;
        let AvroSchema::Record(record) = &schema else {
            return Err(ExecError::InvalidOption(
                "ENCODE AVRO needs a record schema: its fields are the columns".into(),
            ));
        };
        let mut scales = HashMap::new();
        for field in &record.fields {
            let inner = match &field.schema {
                AvroSchema::Union(u) => u.variants().iter().find(|s| **s != AvroSchema::Null),
                other => Some(other),
            };
            if let Some(AvroSchema::Decimal(d)) = inner {
                scales.insert(field.name.clone(), d.scale);
            }
        }
        Ok(Self {
            schema,
            columns: columns
                .fields()
                .iter()
                .map(|f| (f.name().clone(), f.data_type().clone()))
                .collect(),
            scales,
        })
    }

    /// Each datum as a JSON object of the declared columns' fields, or why
    /// it is none. (An empty record stays empty: a tombstone.)
    pub(super) fn to_json(&self, records: &[&[u8]]) -> Vec<std::result::Result<Vec<u8>, String>> {
        let reader =
            match apache_avro::reader::datum::GenericDatumReader::builder(&self.schema).build() {
                Ok(r) => r,
                Err(e) => return records.iter().map(|_| Err(e.to_string())).collect(),
            };
        records
            .iter()
            .map(|record| {
                if record.is_empty() {
                    return Ok(Vec::new());
                }
                let mut bytes = *record;
                let value = reader
                    .read_value(&mut bytes)
                    .map_err(|e| format!("not an Avro datum of the schema: {e}"))?;
                if !bytes.is_empty() {
                    return Err(format!(
                        "{} bytes after the Avro datum: not a datum of the schema",
                        bytes.len()
                    ));
                }
                self.object(value)
            })
            .collect()
    }

    fn object(&self, value: Value) -> std::result::Result<Vec<u8>, String> {
        let Value::Record(fields) = value else {
            return Err("the Avro datum is not a record".into());
        };
        let mut object = Map::new();
        for (name, value) in fields {
            let Some(data_type) = self.columns.get(&name) else {
                continue;
            };
            let json = field_json(value, data_type, self.scales.get(&name).copied())?;
            object.insert(name, json);
        }
        serde_json::to_vec(&object).map_err(|e| e.to_string())
    }
}

/// An Avro value as the JSON that Arrow's decoder reads into `data_type`.
fn field_json(
    value: Value,
    data_type: &DataType,
    scale: Option<usize>,
) -> std::result::Result<Json, String> {
    let in_unit = |v: i64, per_second: i64| -> Json {
        let unit = match data_type {
            DataType::Timestamp(TimeUnit::Second, _) => 1,
            DataType::Timestamp(TimeUnit::Millisecond, _) => 1_000,
            DataType::Timestamp(TimeUnit::Microsecond, _) => 1_000_000,
            DataType::Timestamp(TimeUnit::Nanosecond, _) => 1_000_000_000,
            _ => per_second,
        };
        Json::from(if unit >= per_second {
            v.saturating_mul(unit / per_second)
        } else {
            v.div_euclid(per_second / unit)
        })
    };
    Ok(match value {
        Value::Union(_, v) => field_json(*v, data_type, scale)?,
        Value::Null => Json::Null,
        Value::Boolean(b) => Json::Bool(b),
        Value::Int(v) | Value::Date(v) | Value::TimeMillis(v) => Json::from(v),
        Value::Long(v) | Value::TimeMicros(v) => Json::from(v),
        Value::Float(v) => float(f64::from(v)),
        Value::Double(v) => float(v),
        Value::String(s) | Value::Enum(_, s) => Json::String(s),
        Value::Uuid(u) => Json::String(u.to_string()),
        Value::Bytes(b) | Value::Fixed(_, b) => Json::String(hex(&b)),
        Value::TimestampMillis(v) | Value::LocalTimestampMillis(v) => in_unit(v, 1_000),
        Value::TimestampMicros(v) | Value::LocalTimestampMicros(v) => in_unit(v, 1_000_000),
        Value::TimestampNanos(v) | Value::LocalTimestampNanos(v) => in_unit(v, 1_000_000_000),
        Value::Decimal(d) => {
            let bytes = Vec::<u8>::try_from(&d).map_err(|e| e.to_string())?;
            Json::String(decimal_text(&bytes, scale.unwrap_or(0))?)
        }
        Value::BigDecimal(d) => Json::String(d.to_string()),
        Value::Duration(_) => return Err("Avro duration values are not supported".into()),
        nested @ (Value::Array(_) | Value::Map(_) | Value::Record(_)) => {
            Json::try_from(nested).map_err(|e| e.to_string())?
        }
    })
}

fn float(v: f64) -> Json {
    serde_json::Number::from_f64(v).map_or_else(|| Json::String(v.to_string()), Json::Number)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A decimal's unscaled value (big-endian two's complement) as text.
fn decimal_text(bytes: &[u8], scale: usize) -> std::result::Result<String, String> {
    if bytes.len() > 16 {
        return Err(format!(
            "an Avro decimal of {} bytes is too wide",
            bytes.len()
        ));
    }
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut full = [if negative { 0xff } else { 0 }; 16];
    full[16 - bytes.len()..].copy_from_slice(bytes);
    let n = i128::from_be_bytes(full);
    let digits = n.unsigned_abs().to_string();
    let digits = format!("{digits:0>width$}", width = scale + 1);
    let (int, frac) = digits.split_at(digits.len() - scale);
    let sign = if n < 0 { "-" } else { "" };
    Ok(if scale == 0 {
        format!("{sign}{int}")
    } else {
        format!("{sign}{int}.{frac}")
    })
}

/// The Avro schema the declared columns imply: a record `weir_row` with a
/// field per column, each a union of `null` and the column's type.
fn derived_schema(columns: &SchemaRef) -> Result<Json> {
    let fields = columns
        .fields()
        .iter()
        .map(|f| {
            let t = avro_type(f.data_type()).ok_or_else(|| {
                ExecError::InvalidOption(format!(
                    "ENCODE AVRO without schema.location cannot derive an Avro type for column \
                     \"{}\" of type {}; give a schema file",
                    f.name(),
                    f.data_type()
                ))
            })?;
            Ok(serde_json::json!({"name": f.name(), "type": ["null", t], "default": null}))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(serde_json::json!({"type": "record", "name": "weir_row", "fields": fields}))
}

fn avro_type(data_type: &DataType) -> Option<Json> {
    use serde_json::json;
    Some(match data_type {
        DataType::Boolean => json!("boolean"),
        DataType::Int8 | DataType::Int16 | DataType::Int32 => json!("int"),
        DataType::Int64 => json!("long"),
        DataType::Float32 => json!("float"),
        DataType::Float64 => json!("double"),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => json!("string"),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => json!("bytes"),
        DataType::Date32 => json!({"type": "int", "logicalType": "date"}),
        DataType::Timestamp(TimeUnit::Millisecond, _) => {
            json!({"type": "long", "logicalType": "timestamp-millis"})
        }
        DataType::Timestamp(_, _) => json!({"type": "long", "logicalType": "timestamp-micros"}),
        DataType::Decimal128(p, s) => {
            json!({"type": "bytes", "logicalType": "decimal", "precision": p, "scale": s})
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_keep_their_scale_and_sign() {
        assert_eq!(decimal_text(&[0x04, 0xd2], 2).unwrap(), "12.34");
        assert_eq!(decimal_text(&[0xfb, 0x2e], 2).unwrap(), "-12.34");
        assert_eq!(decimal_text(&[0x05], 3).unwrap(), "0.005");
        assert_eq!(decimal_text(&[0x7f], 0).unwrap(), "127");
    }
}

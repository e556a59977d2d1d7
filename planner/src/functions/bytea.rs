//! `encode(bytea, format)` and `decode(text, format)` with Postgres's
//! `escape` format besides DataFusion's `base64` and `hex`:
//! `encode('\x610062'::bytea, 'escape')` is `a\000b` — bytes that are not
//! printable ASCII as a backslash and three octal digits, a backslash
//! doubled. (`docs/connectors.md` reads dead letters with it.)

use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BinaryBuilder, StringArray, StringBuilder};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::{DataFusionError, Result, ScalarValue};
use datafusion::logical_expr::{
    ColumnarValue, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![
        Arc::new(ScalarUDF::new_from_impl(Codec::new(true))),
        Arc::new(ScalarUDF::new_from_impl(Codec::new(false))),
    ]
}

#[derive(Debug, PartialEq, Eq, Hash)]
struct Codec {
    /// `encode` (bytes to text), or `decode`.
    encode: bool,
    signature: Signature,
}

impl Codec {
    fn new(encode: bool) -> Self {
        Self {
            encode,
            signature: Signature::any(2, Volatility::Immutable),
        }
    }

    /// DataFusion's own function of the same name.
    fn builtin(&self) -> Arc<ScalarUDF> {
        if self.encode {
            datafusion::functions::encoding::encode()
        } else {
            datafusion::functions::encoding::decode()
        }
    }
}

/// The format argument, when it is one value for every row.
fn format_of(arg: &ColumnarValue) -> Option<String> {
    match arg {
        ColumnarValue::Scalar(
            ScalarValue::Utf8(Some(f))
            | ScalarValue::LargeUtf8(Some(f))
            | ScalarValue::Utf8View(Some(f)),
        ) => Some(f.to_lowercase()),
        _ => None,
    }
}

fn escape(bytes: &[u8], out: &mut String) {
    for &b in bytes {
        match b {
            b'\\' => out.push_str("\\\\"),
            0x20..=0x7e => out.push(b as char),
            other => out.push_str(&format!("\\{other:03o}")),
        }
    }
}

fn unescape(text: &str) -> Result<Vec<u8>> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'\\' {
            out.push(bytes[i]);
            i += 1;
        } else if bytes.get(i + 1) == Some(&b'\\') {
            out.push(b'\\');
            i += 2;
        } else {
            let octal = bytes
                .get(i + 1..i + 4)
                .filter(|d| d.iter().all(|c| (b'0'..=b'7').contains(c)))
                .and_then(|d| u8::from_str_radix(std::str::from_utf8(d).ok()?, 8).ok())
                .ok_or_else(|| {
                    DataFusionError::Execution("invalid input syntax for type bytea".to_string())
                })?;
            out.push(octal);
            i += 4;
        }
    }
    Ok(out)
}

impl ScalarUDFImpl for Codec {
    fn name(&self) -> &str {
        if self.encode { "encode" } else { "decode" }
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(if self.encode {
            DataType::Utf8
        } else {
            DataType::Binary
        })
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        if format_of(&args.args[1]).as_deref() != Some("escape") {
            // base64 and hex, and per-row formats: DataFusion's (whose
            // result types match: text from encode, bytes from decode).
            let builtin = self.builtin();
            // Its arguments as its own signature would have coerced them:
            // bytes, and a text format.
            let mut args = args;
            args.args[0] = match &args.args[0] {
                ColumnarValue::Array(a) => ColumnarValue::Array(cast(a, &DataType::Binary)?),
                ColumnarValue::Scalar(s) => ColumnarValue::Scalar(s.cast_to(&DataType::Binary)?),
            };
            args.args[1] = match &args.args[1] {
                ColumnarValue::Array(a) => ColumnarValue::Array(cast(a, &DataType::Utf8)?),
                ColumnarValue::Scalar(s) => ColumnarValue::Scalar(s.cast_to(&DataType::Utf8)?),
            };
            let result = builtin.invoke_with_args(args)?;
            let want = self.return_type(&[])?;
            return Ok(match result {
                ColumnarValue::Array(a) if a.data_type() != &want => {
                    ColumnarValue::Array(cast(&a, &want)?)
                }
                ColumnarValue::Scalar(s) if s.data_type() != want => {
                    ColumnarValue::Scalar(s.cast_to(&want)?)
                }
                other => other,
            });
        }
        let rows = args.number_rows;
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        let input = args.args[0].to_array(if scalar { 1 } else { rows })?;
        let out: ArrayRef = if self.encode {
            let bytes = cast(&input, &DataType::Binary)?;
            let bytes = bytes
                .as_any()
                .downcast_ref::<datafusion::arrow::array::BinaryArray>()
                .ok_or_else(|| DataFusionError::Internal("encode input".into()))?;
            let mut b = StringBuilder::with_capacity(bytes.len(), 0);
            let mut text = String::new();
            for v in bytes.iter() {
                match v {
                    Some(v) => {
                        text.clear();
                        escape(v, &mut text);
                        b.append_value(&text);
                    }
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        } else {
            let text = cast(&input, &DataType::Utf8)?;
            let text = text
                .as_any()
                .downcast_ref::<StringArray>()
                .ok_or_else(|| DataFusionError::Internal("decode input".into()))?;
            let mut b = BinaryBuilder::with_capacity(text.len(), 0);
            for v in text.iter() {
                match v {
                    Some(v) => b.append_value(unescape(v)?),
                    None => b.append_null(),
                }
            }
            Arc::new(b.finish())
        };
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_as_postgres() {
        let mut s = String::new();
        escape(b"a\0b\\c\xff", &mut s);
        assert_eq!(s, "a\\000b\\\\c\\377");
        assert_eq!(unescape(&s).unwrap(), b"a\0b\\c\xff");
        assert!(unescape("\\9").is_err());
    }
}

//! Retractable aggregate state: each aggregate of a group keeps what it needs
//! to take a row back out. count, sum and avg keep running totals; min and
//! max keep every value with its multiplicity (an ordered multiset), because a
//! deleted minimum must give way to the next one.

use std::collections::BTreeMap;

use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type};
use datafusion::common::ScalarValue;
use datafusion::physical_expr::PhysicalExpr;
use planner::spec::{AggCall, AggKind};
use std::sync::Arc;
use storage::codec::RowCodec;

use crate::{ExecError, Result, expr};

/// How a sum is accumulated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum SumKind {
    I64,
    F64,
    /// Decimal at this scale.
    I128,
}

/// State of one aggregate in one group.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum AccState {
    Count(i64),
    SumI64 {
        sum: i64,
        n: i64,
    },
    SumF64 {
        sum: f64,
        n: i64,
    },
    SumI128 {
        sum: i128,
        n: i64,
    },
    /// Encoded value → multiplicity.
    MinMax(BTreeMap<Vec<u8>, i64>),
}

/// An aggregate call, compiled.
pub(crate) struct Aggregate {
    kind: AggKind,
    arg: Arc<dyn PhysicalExpr>,
    output_type: DataType,
    /// Type the argument is cast to before accumulating.
    input_type: DataType,
    sum: Option<SumKind>,
    codec: Option<RowCodec>,
}

/// An aggregate's argument for one batch, ready to accumulate.
pub(crate) enum Prepared {
    Array(ArrayRef),
    Encoded(Vec<Option<Vec<u8>>>),
}

impl Aggregate {
    pub(crate) fn new(call: &AggCall, input_schema: &datafusion::common::DFSchema) -> Result<Self> {
        let arg = expr::compile(std::slice::from_ref(&call.arg), input_schema)?.remove(0);
        let unsupported = || {
            ExecError::Unsupported(
                format!("{:?} returning {}", call.kind, call.output_type).to_lowercase(),
            )
        };
        let (input_type, sum, codec) = match call.kind {
            AggKind::Count => (DataType::Null, None, None),
            AggKind::Sum | AggKind::Avg => {
                let (t, k) = match &call.output_type {
                    DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 => {
                        (DataType::Int64, SumKind::I64)
                    }
                    DataType::UInt64 | DataType::UInt32 => (DataType::Int64, SumKind::I64),
                    DataType::Float64 | DataType::Float32 => (DataType::Float64, SumKind::F64),
                    DataType::Decimal128(_, s) => (DataType::Decimal128(38, *s), SumKind::I128),
                    _ => return Err(unsupported()),
                };
                (t, Some(k), None)
            }
            AggKind::Min | AggKind::Max => (
                call.output_type.clone(),
                None,
                Some(RowCodec::new(vec![call.output_type.clone()])?),
            ),
        };
        Ok(Self {
            kind: call.kind,
            arg,
            output_type: call.output_type.clone(),
            input_type,
            sum,
            codec,
        })
    }

    pub(crate) fn init(&self) -> AccState {
        match (self.kind, self.sum) {
            (AggKind::Count, _) => AccState::Count(0),
            (_, Some(SumKind::I64)) => AccState::SumI64 { sum: 0, n: 0 },
            (_, Some(SumKind::F64)) => AccState::SumF64 { sum: 0.0, n: 0 },
            (_, Some(SumKind::I128)) => AccState::SumI128 { sum: 0, n: 0 },
            _ => AccState::MinMax(BTreeMap::new()),
        }
    }

    /// Evaluates and casts the argument for a whole batch.
    pub(crate) fn prepare(&self, batch: &RecordBatch) -> Result<Prepared> {
        let values = self.arg.evaluate(batch)?.into_array(batch.num_rows())?;
        if let Some(codec) = &self.codec {
            let values = cast(&values, &self.input_type)?;
            let encoded = codec.encode(std::slice::from_ref(&values))?;
            return Ok(Prepared::Encoded(
                encoded
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| values.is_valid(i).then_some(e))
                    .collect(),
            ));
        }
        if self.kind == AggKind::Count {
            return Ok(Prepared::Array(values));
        }
        Ok(Prepared::Array(cast(&values, &self.input_type)?))
    }

    /// Adds (`sign` = 1) or retracts (`sign` = -1) row `row`.
    pub(crate) fn update(&self, state: &mut AccState, values: &Prepared, row: usize, sign: i64) {
        match (state, values) {
            (AccState::MinMax(set), Prepared::Encoded(enc)) => {
                if let Some(Some(v)) = enc.get(row) {
                    let c = set.entry(v.clone()).or_insert(0);
                    *c += sign;
                    if *c <= 0 {
                        set.remove(v);
                    }
                }
            }
            (state, Prepared::Array(a)) if a.is_valid(row) => match state {
                AccState::Count(c) => *c += sign,
                AccState::SumI64 { sum, n } => {
                    let v = a.as_primitive::<Int64Type>().value(row);
                    *sum = sum.wrapping_add(v.wrapping_mul(sign));
                    *n += sign;
                }
                AccState::SumF64 { sum, n } => {
                    *sum += a.as_primitive::<Float64Type>().value(row) * sign as f64;
                    *n += sign;
                }
                AccState::SumI128 { sum, n } => {
                    *sum = sum
                        .wrapping_add(a.as_primitive::<Decimal128Type>().value(row) * sign as i128);
                    *n += sign;
                }
                AccState::MinMax(_) => {}
            },
            _ => {}
        }
    }

    /// The aggregate's current value.
    pub(crate) fn output(&self, state: &AccState) -> Result<ScalarValue> {
        let null = || ScalarValue::try_from(&self.output_type);
        let value = match state {
            AccState::Count(c) => ScalarValue::Int64(Some(*c)),
            AccState::SumI64 { n: 0, .. }
            | AccState::SumF64 { n: 0, .. }
            | AccState::SumI128 { n: 0, .. } => {
                return Ok(null()?);
            }
            AccState::SumI64 { sum, n } => match self.kind {
                AggKind::Avg => ScalarValue::Float64(Some(*sum as f64 / *n as f64)),
                _ => ScalarValue::Int64(Some(*sum)),
            },
            AccState::SumF64 { sum, n } => match self.kind {
                AggKind::Avg => ScalarValue::Float64(Some(sum / *n as f64)),
                _ => ScalarValue::Float64(Some(*sum)),
            },
            AccState::SumI128 { sum, n } => {
                let DataType::Decimal128(p, s) = self.output_type else {
                    return Err(ExecError::Protocol(
                        "decimal sum without decimal type".into(),
                    ));
                };
                let v = match self.kind {
                    AggKind::Avg => {
                        // Round half away from zero, as Postgres does.
                        let n = *n as i128;
                        let q = sum / n;
                        let r = sum % n;
                        if r.abs() * 2 >= n.abs() {
                            q + sum.signum() * n.signum()
                        } else {
                            q
                        }
                    }
                    _ => *sum,
                };
                ScalarValue::Decimal128(Some(v), p, s)
            }
            AccState::MinMax(set) => {
                let entry = match self.kind {
                    AggKind::Min => set.keys().next(),
                    _ => set.keys().next_back(),
                };
                let (Some(bytes), Some(codec)) = (entry, &self.codec) else {
                    return Ok(null()?);
                };
                let arr = codec.decode([bytes.as_slice()])?.remove(0);
                ScalarValue::try_from_array(&arr, 0)?
            }
        };
        if value.data_type() == self.output_type {
            Ok(value)
        } else {
            Ok(value.cast_to(&self.output_type)?)
        }
    }
}

/// Binary encoding of accumulator states, versioned.
pub(crate) mod encoding {
    use super::*;

    pub(crate) fn put(out: &mut Vec<u8>, s: &AccState) {
        match s {
            AccState::Count(c) => {
                out.push(0);
                out.extend_from_slice(&c.to_be_bytes());
            }
            AccState::SumI64 { sum, n } => {
                out.push(1);
                out.extend_from_slice(&sum.to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
            }
            AccState::SumF64 { sum, n } => {
                out.push(2);
                out.extend_from_slice(&sum.to_bits().to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
            }
            AccState::SumI128 { sum, n } => {
                out.push(3);
                out.extend_from_slice(&sum.to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
            }
            AccState::MinMax(set) => {
                out.push(4);
                out.extend_from_slice(&(set.len() as u32).to_be_bytes());
                for (v, c) in set {
                    out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(&c.to_be_bytes());
                }
            }
        }
    }

    /// A cursor over encoded bytes.
    pub(crate) struct Reader<'a>(pub(crate) &'a [u8]);

    impl Reader<'_> {
        fn take(&mut self, n: usize) -> Result<&[u8]> {
            if self.0.len() < n {
                return Err(ExecError::Storage(storage::StorageError::Corrupt(
                    "short aggregate state".into(),
                )));
            }
            let (a, b) = self.0.split_at(n);
            self.0 = b;
            Ok(a)
        }
        pub(crate) fn u8(&mut self) -> Result<u8> {
            Ok(self.take(1)?[0])
        }
        pub(crate) fn u32(&mut self) -> Result<u32> {
            Ok(u32::from_be_bytes(
                self.take(4)?.try_into().unwrap_or_default(),
            ))
        }
        pub(crate) fn i64(&mut self) -> Result<i64> {
            Ok(i64::from_be_bytes(
                self.take(8)?.try_into().unwrap_or_default(),
            ))
        }
        pub(crate) fn i128(&mut self) -> Result<i128> {
            Ok(i128::from_be_bytes(
                self.take(16)?.try_into().unwrap_or_default(),
            ))
        }
        pub(crate) fn bytes(&mut self, n: usize) -> Result<Vec<u8>> {
            Ok(self.take(n)?.to_vec())
        }
    }

    pub(crate) fn get(r: &mut Reader<'_>) -> Result<AccState> {
        Ok(match r.u8()? {
            0 => AccState::Count(r.i64()?),
            1 => AccState::SumI64 {
                sum: r.i64()?,
                n: r.i64()?,
            },
            2 => AccState::SumF64 {
                sum: f64::from_bits(r.i64()? as u64),
                n: r.i64()?,
            },
            3 => AccState::SumI128 {
                sum: r.i128()?,
                n: r.i64()?,
            },
            4 => {
                let len = r.u32()?;
                let mut set = BTreeMap::new();
                for _ in 0..len {
                    let n = r.u32()? as usize;
                    let v = r.bytes(n)?;
                    set.insert(v, r.i64()?);
                }
                AccState::MinMax(set)
            }
            t => {
                return Err(ExecError::Storage(storage::StorageError::Corrupt(format!(
                    "unknown aggregate state tag {t}"
                ))));
            }
        })
    }
}

//! Retractable aggregate state: each aggregate of a group keeps what it needs
//! to take a row back out. count, sum and avg keep running totals; variance
//! and standard deviation keep n, Σx and Σx²; bool_and and bool_or count
//! trues and falses; min, max, bit_and, bit_or, bit_xor, every `DISTINCT`
//! aggregate, string_agg, array_agg, first_value and last_value keep every
//! value with its multiplicity (an ordered multiset), because a deleted
//! minimum must give way to the next one, and a value counts for
//! `DISTINCT` until its last copy goes. An aggregate with `ORDER BY` keeps
//! each value under its sort keys (and, for a `string_agg` whose delimiter
//! is not a constant, with its row's delimiter), so the multiset's order
//! is the call's.
//!
//! The multiset is not part of the group's state: it is map state of its
//! own ([`super::value_sets`]), paged, so that a group of a hundred million
//! values does not sit in memory whole. The group keeps only the number of
//! distinct values ([`AccState::Distinct`]). `max` and `last_value` encode
//! their values in reverse order, so that the value they answer with is
//! the set's first entry, which a page read finds. Only min or max over an
//! append-only input keeps its one value in the group ([`AccState::Values`]).

use std::collections::BTreeMap;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::compute::{cast, take};
use datafusion::arrow::datatypes::{DataType, Decimal128Type, Float64Type, Int64Type, i256};
use datafusion::common::ScalarValue;
use datafusion::common::utils::SingleRowListArrayBuilder;
use datafusion::logical_expr::ExprSchemable;
use datafusion::physical_expr::PhysicalExpr;
use planner::functions::numeric_special::Special;
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
    /// A decimal's unscaled values, summed in 256 bits: a running total
    /// of retractions may pass 38 digits on its way, and a true total that
    /// does is an overflow to report, not a value to wrap.
    SumDecimal {
        sum: i256,
        n: i64,
        /// How many of the values are `NaN`, `Infinity` and `-Infinity`
        /// (`planner::functions::numeric_special`): they decide the
        /// total while any is in, and leave `sum` alone.
        specials: [i64; 3],
    },
    /// Encoded value → multiplicity: min or max over an append-only
    /// input (one value), or a multiset of a state written before value
    /// sets were kept apart (moved out when its group is next touched).
    Values(BTreeMap<Vec<u8>, i64>),
    /// The number of distinct values in the group's value set, which
    /// [`super::value_sets::ValueSets`] keeps.
    Distinct(i64),
    /// n, Σx, Σx² of the non-NULL values.
    Moments {
        n: i64,
        sum: f64,
        sum_sq: f64,
    },
    Bools {
        trues: i64,
        falses: i64,
    },
}

impl AccState {
    /// Heap bytes the state owns (for managed memory).
    pub(crate) fn heap_size(&self) -> usize {
        match self {
            // A B-tree entry: the value's bytes, its count, and about as
            // much again for the tree's nodes.
            AccState::Values(set) => set.keys().map(|k| k.capacity() + 48).sum(),
            _ => 0,
        }
    }
}

/// An aggregate call, compiled.
pub(crate) struct Aggregate {
    kind: AggKind,
    arg: Arc<dyn PhysicalExpr>,
    filter: Option<Arc<dyn PhysicalExpr>>,
    distinct: bool,
    delimiter: String,
    output_type: DataType,
    /// Type the argument is cast to before accumulating.
    input_type: DataType,
    sum: Option<SumKind>,
    /// Encodes values kept in a multiset.
    codec: Option<RowCodec>,
    /// `max` or `last_value` with a value set: `codec` sorts the values in
    /// reverse, so the answer is the first entry. `legacy` encodes them as
    /// a state written before did.
    reversed: bool,
    legacy: Option<RowCodec>,
    /// min or max over an append-only input: only the current extreme is
    /// kept, as nothing is ever retracted.
    keep_extreme_only: bool,
    /// `ORDER BY` inside the call: its keys come first in each encoded
    /// value, then the value, then (with `delimiter_expr`) the delimiter.
    order_by: Vec<Arc<dyn PhysicalExpr>>,
    delimiter_expr: Option<Arc<dyn PhysicalExpr>>,
    /// Whether values are kept under sort keys (see `order_by`).
    ordered: bool,
}

/// An aggregate's argument for one batch, ready to accumulate.
pub(crate) struct Prepared {
    values: Values,
    /// Rows `FILTER (WHERE …)` keeps.
    keep: Option<BooleanArray>,
}

enum Values {
    Array(ArrayRef),
    /// Encoded values; None for NULLs that are not kept.
    Encoded(Vec<Option<Vec<u8>>>),
}

/// `values` as `t`, failing where a value does not fit (a decimal scaled
/// up for `avg` past 38 digits) rather than turning it into NULL, which
/// would leave it out of the aggregate unseen.
/// `values` as `t`: an error where one does not fit, and a numeric `NaN`
/// or infinity kept as what stands for it in `t`.
fn cast_checked(values: &ArrayRef, t: &DataType) -> Result<ArrayRef> {
    Ok(planner::functions::numeric_special::cast_keeping_specials(
        values, t,
    )?)
}

fn sum_kind(t: &DataType) -> Option<(DataType, SumKind)> {
    Some(match t {
        DataType::Int64 | DataType::Int32 | DataType::Int16 | DataType::Int8 => {
            (DataType::Int64, SumKind::I64)
        }
        DataType::UInt64 | DataType::UInt32 | DataType::UInt16 | DataType::UInt8 => {
            (DataType::Int64, SumKind::I64)
        }
        DataType::Float64 | DataType::Float32 => (DataType::Float64, SumKind::F64),
        DataType::Decimal128(_, s) => (DataType::Decimal128(38, *s), SumKind::I128),
        _ => return None,
    })
}

impl Aggregate {
    pub(crate) fn new(call: &AggCall, input_schema: &datafusion::common::DFSchema) -> Result<Self> {
        let arg = expr::compile(std::slice::from_ref(&call.arg), input_schema)?.remove(0);
        let filter = match &call.filter {
            Some(f) => Some(expr::compile(std::slice::from_ref(f), input_schema)?.remove(0)),
            None => None,
        };
        let unsupported = || {
            ExecError::Unsupported(format!(
                "{} returning {}",
                call.kind.name(),
                call.output_type
            ))
        };
        let arg_type = call.arg.get_type(input_schema)?;
        let multiset = |t: &DataType| -> Result<Option<RowCodec>> {
            Ok(Some(RowCodec::new(vec![t.clone()])?))
        };
        let (input_type, sum, codec) = match call.kind {
            AggKind::Count if call.distinct => (arg_type.clone(), None, multiset(&arg_type)?),
            AggKind::Count => (DataType::Null, None, None),
            AggKind::Sum | AggKind::Avg => {
                let (t, k) = sum_kind(&call.output_type).ok_or_else(unsupported)?;
                let codec = if call.distinct { multiset(&t)? } else { None };
                (t, Some(k), codec)
            }
            AggKind::Min | AggKind::Max => {
                (call.output_type.clone(), None, multiset(&call.output_type)?)
            }
            AggKind::BoolAnd | AggKind::BoolOr => (DataType::Boolean, None, None),
            AggKind::StddevSamp | AggKind::StddevPop | AggKind::VarSamp | AggKind::VarPop => {
                (DataType::Float64, None, None)
            }
            AggKind::StringAgg => (DataType::Utf8, None, multiset(&DataType::Utf8)?),
            AggKind::ArrayAgg => {
                let element = match &call.output_type {
                    DataType::List(f) | DataType::LargeList(f) => f.data_type().clone(),
                    _ => return Err(unsupported()),
                };
                (element.clone(), None, multiset(&element)?)
            }
            AggKind::FirstValue | AggKind::LastValue => {
                (call.output_type.clone(), None, multiset(&call.output_type)?)
            }
            AggKind::BitAnd | AggKind::BitOr | AggKind::BitXor => {
                if !call.output_type.is_integer() {
                    return Err(unsupported());
                }
                (DataType::Int64, None, multiset(&DataType::Int64)?)
            }
        };
        let order_by = expr::compile(&call.order_by, input_schema)?;
        let delimiter_expr = match &call.delimiter_expr {
            Some(d) => Some(expr::compile(std::slice::from_ref(d), input_schema)?.remove(0)),
            None => None,
        };
        let ordered = !order_by.is_empty()
            || delimiter_expr.is_some()
            || matches!(call.kind, AggKind::FirstValue | AggKind::LastValue);
        // What the multiset's encoding sorts by: (type, descending, NULLs
        // first) per field.
        let sort_fields = if ordered {
            // Sort keys, then the value ascending (NULLs last), then the
            // delimiter: the multiset's order is the call's.
            let mut fields = Vec::new();
            for (e, (descending, nulls_first)) in call.order_by.iter().zip(
                call.order_options
                    .iter()
                    .copied()
                    .chain(std::iter::repeat((false, false))),
            ) {
                fields.push((e.get_type(input_schema)?, descending, nulls_first));
            }
            fields.push((input_type.clone(), false, false));
            if delimiter_expr.is_some() {
                fields.push((DataType::Utf8, false, false));
            }
            fields
        } else {
            // `RowCodec::new`: ascending, NULLs first.
            vec![(input_type.clone(), false, true)]
        };
        let codec = if ordered {
            Some(RowCodec::sorted(sort_fields.clone())?)
        } else {
            codec
        };
        let keep_extreme_only = call.append_only_input
            && !call.distinct
            && matches!(call.kind, AggKind::Min | AggKind::Max);
        // The value of max and last_value first: every field's order
        // turned around (NULLs too, so that the order is the exact
        // reverse).
        let reversed = codec.is_some()
            && !keep_extreme_only
            && matches!(call.kind, AggKind::Max | AggKind::LastValue);
        let (codec, legacy) = if reversed {
            let flipped = sort_fields
                .into_iter()
                .map(|(t, descending, nulls_first)| (t, !descending, !nulls_first))
                .collect();
            (Some(RowCodec::sorted(flipped)?), codec)
        } else {
            (codec, None)
        };
        Ok(Self {
            kind: call.kind,
            arg,
            filter,
            distinct: call.distinct,
            delimiter: call.delimiter.clone().unwrap_or_default(),
            output_type: call.output_type.clone(),
            input_type,
            sum,
            codec,
            reversed,
            legacy,
            keep_extreme_only,
            order_by,
            delimiter_expr,
            ordered,
        })
    }

    /// The aggregate keeps its values in a value set apart from the group
    /// (see the module docs).
    pub(crate) fn set_backed(&self) -> bool {
        self.codec.is_some() && !self.keep_extreme_only
    }

    /// `count(DISTINCT …)`: answered by the number of distinct values.
    pub(crate) fn counts_distinct(&self) -> bool {
        self.kind == AggKind::Count
    }

    /// The aggregate's value is its value set's first entry, or NULL.
    pub(crate) fn first_entry_only(&self) -> bool {
        matches!(
            self.kind,
            AggKind::Min | AggKind::Max | AggKind::FirstValue | AggKind::LastValue
        )
    }

    /// Re-encodes the values of a multiset written before value sets were
    /// kept apart, as `codec` encodes them now.
    pub(crate) fn reencode(&self, set: BTreeMap<Vec<u8>, i64>) -> Result<Vec<(Vec<u8>, i64)>> {
        let (Some(legacy), Some(codec)) = (&self.legacy, &self.codec) else {
            return Ok(set.into_iter().collect());
        };
        if set.is_empty() {
            return Ok(Vec::new());
        }
        let columns = legacy.decode(set.keys().map(|k| k.as_slice()))?;
        let keys = codec.encode(&columns)?;
        Ok(keys.into_iter().zip(set.into_values()).collect())
    }

    /// Row `row`'s encoded value, if it enters the value set (kept by
    /// the filter, and not a NULL that is left out).
    pub(crate) fn encoded<'a>(&self, prepared: &'a Prepared, row: usize) -> Option<&'a [u8]> {
        if let Some(keep) = &prepared.keep
            && !keep.value(row)
        {
            return None;
        }
        match &prepared.values {
            Values::Encoded(enc) => enc.get(row)?.as_deref(),
            Values::Array(_) => None,
        }
    }

    pub(crate) fn init(&self) -> AccState {
        if self.set_backed() {
            return AccState::Distinct(0);
        }
        if self.codec.is_some() {
            return AccState::Values(BTreeMap::new());
        }
        match (self.kind, self.sum) {
            (AggKind::Count, _) => AccState::Count(0),
            (_, Some(SumKind::I64)) => AccState::SumI64 { sum: 0, n: 0 },
            (_, Some(SumKind::F64)) => AccState::SumF64 { sum: 0.0, n: 0 },
            (_, Some(SumKind::I128)) => AccState::SumDecimal {
                sum: i256::ZERO,
                n: 0,
                specials: [0; 3],
            },
            (AggKind::BoolAnd | AggKind::BoolOr, _) => AccState::Bools {
                trues: 0,
                falses: 0,
            },
            _ => AccState::Moments {
                n: 0,
                sum: 0.0,
                sum_sq: 0.0,
            },
        }
    }

    /// Evaluates and casts the argument (and the filter) for a whole batch.
    pub(crate) fn prepare(&self, batch: &RecordBatch) -> Result<Prepared> {
        let keep = match &self.filter {
            Some(f) => Some(expr::predicate_mask(f, batch)?),
            None => None,
        };
        let values = self.arg.evaluate(batch)?.into_array(batch.num_rows())?;
        let values = if let Some(codec) = &self.codec {
            let values = cast_checked(&values, &self.input_type)?;
            let encoded = if self.ordered {
                let mut columns = Vec::with_capacity(self.order_by.len() + 2);
                for key in &self.order_by {
                    columns.push(key.evaluate(batch)?.into_array(batch.num_rows())?);
                }
                columns.push(values.clone());
                if let Some(d) = &self.delimiter_expr {
                    let d = d.evaluate(batch)?.into_array(batch.num_rows())?;
                    columns.push(cast(&d, &DataType::Utf8)?);
                }
                codec.encode(&columns)?
            } else {
                codec.encode(std::slice::from_ref(&values))?
            };
            // array_agg keeps NULL elements, as in Postgres, and the first
            // or last value may be NULL.
            let keep_nulls = matches!(
                self.kind,
                AggKind::ArrayAgg | AggKind::FirstValue | AggKind::LastValue
            );
            Values::Encoded(
                encoded
                    .into_iter()
                    .enumerate()
                    .map(|(i, e)| (keep_nulls || values.is_valid(i)).then_some(e))
                    .collect(),
            )
        } else if self.kind == AggKind::Count {
            Values::Array(values)
        } else {
            Values::Array(cast_checked(&values, &self.input_type)?)
        };
        Ok(Prepared { values, keep })
    }

    /// Adds (`sign` = 1) or retracts (`sign` = -1) row `row`.
    pub(crate) fn update(&self, state: &mut AccState, prepared: &Prepared, row: usize, sign: i64) {
        if let Some(keep) = &prepared.keep
            && !keep.value(row)
        {
            return;
        }
        match (state, &prepared.values) {
            (AccState::Values(set), Values::Encoded(enc)) => {
                if let Some(Some(v)) = enc.get(row) {
                    let c = set.entry(v.clone()).or_insert(0);
                    *c += sign;
                    if *c <= 0 {
                        set.remove(v);
                    }
                }
                if self.keep_extreme_only && set.len() > 1 {
                    let keep = if self.kind == AggKind::Min {
                        set.pop_first()
                    } else {
                        set.pop_last()
                    };
                    set.clear();
                    set.extend(keep);
                }
            }
            (state, Values::Array(a)) if a.is_valid(row) => match state {
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
                AccState::SumDecimal { sum, n, specials } => {
                    let v = a.as_primitive::<Decimal128Type>().value(row);
                    *n += sign;
                    if let Some(s) = Special::of(v) {
                        specials[s as usize] += sign;
                        return;
                    }
                    let v = i256::from_i128(v);
                    *sum = if sign < 0 {
                        sum.wrapping_sub(v)
                    } else {
                        sum.wrapping_add(v)
                    };
                }
                AccState::Moments { n, sum, sum_sq } => {
                    let v = a.as_primitive::<Float64Type>().value(row);
                    *n += sign;
                    *sum += v * sign as f64;
                    *sum_sq += v * v * sign as f64;
                }
                AccState::Bools { trues, falses } => {
                    if a.as_boolean().value(row) {
                        *trues += sign;
                    } else {
                        *falses += sign;
                    }
                }
                AccState::Values(_) | AccState::Distinct(_) => {}
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
            | AccState::SumDecimal { n: 0, .. }
            | AccState::Moments { n: 0, .. } => {
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
            AccState::SumDecimal { sum, n, specials } => {
                let DataType::Decimal128(p, s) = self.output_type else {
                    return Err(ExecError::Protocol(
                        "decimal sum without decimal type".into(),
                    ));
                };
                if let Some(special) = Special::of_counts(*specials) {
                    return Ok(ScalarValue::Decimal128(Some(special.value()), p, s));
                }
                let v = match self.kind {
                    // Rounded half away from zero, as Postgres does.
                    AggKind::Avg => planner::functions::numeric_special::divide_rounded(*sum, *n),
                    _ => *sum,
                };
                // Postgres's numeric has no limit; Weir's holds 38 digits.
                match v.to_i128() {
                    Some(v) if v.unsigned_abs() < 10u128.pow(38) => {
                        ScalarValue::Decimal128(Some(v), p, s)
                    }
                    _ => {
                        return Err(ExecError::Arrow(
                            datafusion::arrow::error::ArrowError::ArithmeticOverflow(format!(
                                "numeric field overflow: the {} is more than 38 digits",
                                self.kind.name()
                            )),
                        ));
                    }
                }
            }
            AccState::Moments { n, sum, sum_sq } => {
                let n = *n as f64;
                let sample = matches!(self.kind, AggKind::StddevSamp | AggKind::VarSamp);
                if sample && n < 2.0 {
                    return Ok(null()?);
                }
                // Rounding can take a zero spread just below zero.
                let squares = (sum_sq - sum * sum / n).max(0.0);
                let variance = squares / if sample { n - 1.0 } else { n };
                let v = match self.kind {
                    AggKind::StddevSamp | AggKind::StddevPop => variance.sqrt(),
                    _ => variance,
                };
                ScalarValue::Float64(Some(v))
            }
            AccState::Bools { trues, falses } => {
                if trues + falses == 0 {
                    return Ok(null()?);
                }
                ScalarValue::Boolean(Some(match self.kind {
                    AggKind::BoolAnd => *falses == 0,
                    _ => *trues > 0,
                }))
            }
            AccState::Values(set) if self.legacy.is_some() => {
                // Written by an earlier version, in the order not reversed.
                let mut set = self.reencode(set.clone())?;
                set.sort();
                let entries: Vec<(&[u8], i64)> =
                    set.iter().map(|(k, c)| (k.as_slice(), *c)).collect();
                return self.values_output(&entries);
            }
            AccState::Values(set) => {
                let entries: Vec<(&[u8], i64)> =
                    set.iter().map(|(k, c)| (k.as_slice(), *c)).collect();
                return self.values_output(&entries);
            }
            AccState::Distinct(_) => {
                return Err(ExecError::Protocol(format!(
                    "{} answered without its value set",
                    self.kind.name()
                )));
            }
        };
        if value.data_type() == self.output_type {
            Ok(value)
        } else {
            Ok(value.cast_to(&self.output_type)?)
        }
    }

    /// The value of an aggregate kept as a multiset: its entries (encoded
    /// value, copies) in the codec's order, or, for an aggregate whose
    /// value is the first entry, that entry alone.
    pub(crate) fn values_output(&self, set: &[(&[u8], i64)]) -> Result<ScalarValue> {
        let null = || -> Result<ScalarValue> { Ok(ScalarValue::try_from(&self.output_type)?) };
        let Some(codec) = &self.codec else {
            return Err(ExecError::Protocol("multiset without a codec".into()));
        };
        let decode = |set: &[(&[u8], i64)]| -> Result<ArrayRef> {
            Ok(codec.decode(set.iter().map(|(k, _)| *k))?.remove(0))
        };
        let cast_out = |v: ScalarValue| -> Result<ScalarValue> {
            if v.data_type() == self.output_type {
                Ok(v)
            } else {
                Ok(v.cast_to(&self.output_type)?)
            }
        };
        if set.is_empty() {
            return match self.kind {
                AggKind::Count => Ok(ScalarValue::Int64(Some(0))),
                _ => null(),
            };
        }
        if self.ordered {
            return self.ordered_output(codec, set);
        }
        match self.kind {
            AggKind::BitAnd | AggKind::BitOr | AggKind::BitXor => {
                let values = decode(set)?;
                let values = values.as_primitive::<Int64Type>();
                let mut acc: Option<i64> = None;
                for (i, (_, copies)) in set.iter().enumerate() {
                    let v = values.value(i);
                    acc = Some(match (self.kind, acc) {
                        (_, None) if self.kind != AggKind::BitXor => v,
                        (AggKind::BitAnd, Some(a)) => a & v,
                        (AggKind::BitOr, Some(a)) => a | v,
                        // Each copy flips the bits again: an even number
                        // of copies cancels out.
                        (_, a) => a.unwrap_or(0) ^ if copies % 2 == 1 { v } else { 0 },
                    });
                }
                cast_out(ScalarValue::Int64(acc))
            }
            AggKind::Min | AggKind::Max => {
                // A reversed max's first entry, else its last.
                let extreme = if self.kind == AggKind::Min || self.reversed {
                    &set[..1]
                } else {
                    &set[set.len() - 1..]
                };
                let arr = decode(extreme)?;
                cast_out(ScalarValue::try_from_array(&arr, 0)?)
            }
            AggKind::Count => Ok(ScalarValue::Int64(Some(set.len() as i64))),
            AggKind::Sum | AggKind::Avg => {
                // DISTINCT: each value once.
                let values = decode(set)?;
                let mut acc = match self.sum {
                    Some(SumKind::I64) => AccState::SumI64 { sum: 0, n: 0 },
                    Some(SumKind::F64) => AccState::SumF64 { sum: 0.0, n: 0 },
                    _ => AccState::SumDecimal {
                        sum: i256::ZERO,
                        n: 0,
                        specials: [0; 3],
                    },
                };
                let prepared = Prepared {
                    values: Values::Array(values),
                    keep: None,
                };
                for row in 0..set.len() {
                    self.update(&mut acc, &prepared, row, 1);
                }
                self.output(&acc)
            }
            AggKind::StringAgg | AggKind::ArrayAgg => {
                let distinct = decode(set)?;
                // Ascending with NULLs last, as Postgres orders by default
                // (the encoding sorts NULL first).
                let order = (0..distinct.len())
                    .filter(|i| distinct.is_valid(*i))
                    .chain((0..distinct.len()).filter(|i| distinct.is_null(*i)));
                let counts: Vec<i64> = set.iter().map(|(_, c)| *c).collect();
                let indices: UInt32Array = order
                    .flat_map(|i| {
                        let copies = if self.distinct {
                            1
                        } else {
                            counts[i].max(0) as usize
                        };
                        std::iter::repeat_n(i as u32, copies)
                    })
                    .collect();
                let all = take(distinct.as_ref(), &indices, None)?;
                if self.kind == AggKind::ArrayAgg {
                    return Ok(SingleRowListArrayBuilder::new(all).build_list_scalar());
                }
                let strings = all
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .ok_or_else(|| ExecError::Protocol("string_agg over non-strings".into()))?;
                let joined = strings
                    .iter()
                    .flatten()
                    .collect::<Vec<_>>()
                    .join(&self.delimiter);
                cast_out(ScalarValue::Utf8(Some(joined)))
            }
            _ => Err(ExecError::Protocol(format!(
                "{} kept as a multiset",
                self.kind.name()
            ))),
        }
    }
}

impl Aggregate {
    /// The value of an aggregate with `ORDER BY` (or a delimiter per row),
    /// whose multiset is in the call's order.
    fn ordered_output(&self, codec: &RowCodec, set: &[(&[u8], i64)]) -> Result<ScalarValue> {
        let columns = codec.decode(set.iter().map(|(k, _)| *k))?;
        let n_keys = self.order_by.len();
        let values = &columns[n_keys];
        let delimiters = columns.get(n_keys + 1).map(|d| d.as_string::<i32>());
        let copies = |count: i64| {
            if self.distinct {
                1
            } else {
                count.max(0) as usize
            }
        };
        let cast_out = |v: ScalarValue| -> Result<ScalarValue> {
            if v.data_type() == self.output_type {
                Ok(v)
            } else {
                Ok(v.cast_to(&self.output_type)?)
            }
        };
        match self.kind {
            AggKind::FirstValue => cast_out(ScalarValue::try_from_array(values, 0)?),
            // Reversed, the last value comes first.
            AggKind::LastValue if self.reversed => {
                cast_out(ScalarValue::try_from_array(values, 0)?)
            }
            AggKind::LastValue => cast_out(ScalarValue::try_from_array(values, values.len() - 1)?),
            AggKind::ArrayAgg => {
                let indices: UInt32Array = set
                    .iter()
                    .enumerate()
                    .flat_map(|(i, (_, c))| std::iter::repeat_n(i as u32, copies(*c)))
                    .collect();
                let all = take(values.as_ref(), &indices, None)?;
                Ok(SingleRowListArrayBuilder::new(all).build_list_scalar())
            }
            AggKind::StringAgg => {
                let strings = values.as_string::<i32>();
                let mut joined = String::new();
                let mut first = true;
                for (i, (_, c)) in set.iter().enumerate() {
                    if strings.is_null(i) {
                        continue;
                    }
                    for _ in 0..copies(*c) {
                        if !first {
                            match delimiters {
                                Some(d) if d.is_valid(i) => joined.push_str(d.value(i)),
                                Some(_) => {}
                                None => joined.push_str(&self.delimiter),
                            }
                        }
                        first = false;
                        joined.push_str(strings.value(i));
                    }
                }
                if first {
                    return Ok(ScalarValue::try_from(&self.output_type)?);
                }
                cast_out(ScalarValue::Utf8(Some(joined)))
            }
            other => Err(ExecError::Protocol(format!(
                "{} kept in its call's order",
                other.name()
            ))),
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
            AccState::SumDecimal {
                sum,
                n,
                specials: [0, 0, 0],
            } => {
                out.push(7);
                out.extend_from_slice(&sum.to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
            }
            AccState::SumDecimal { sum, n, specials } => {
                out.push(8);
                out.extend_from_slice(&sum.to_be_bytes());
                out.extend_from_slice(&n.to_be_bytes());
                for c in specials {
                    out.extend_from_slice(&c.to_be_bytes());
                }
            }
            AccState::Values(set) => {
                out.push(4);
                out.extend_from_slice(&(set.len() as u32).to_be_bytes());
                for (v, c) in set {
                    out.extend_from_slice(&(v.len() as u32).to_be_bytes());
                    out.extend_from_slice(v);
                    out.extend_from_slice(&c.to_be_bytes());
                }
            }
            AccState::Distinct(n) => {
                out.push(9);
                out.extend_from_slice(&n.to_be_bytes());
            }
            AccState::Moments { n, sum, sum_sq } => {
                out.push(5);
                out.extend_from_slice(&n.to_be_bytes());
                out.extend_from_slice(&sum.to_bits().to_be_bytes());
                out.extend_from_slice(&sum_sq.to_bits().to_be_bytes());
            }
            AccState::Bools { trues, falses } => {
                out.push(6);
                out.extend_from_slice(&trues.to_be_bytes());
                out.extend_from_slice(&falses.to_be_bytes());
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
            // Before 256-bit sums.
            3 => AccState::SumDecimal {
                sum: i256::from_i128(r.i128()?),
                n: r.i64()?,
                specials: [0; 3],
            },
            7 => AccState::SumDecimal {
                sum: i256::from_be_bytes(r.take(32)?.try_into().unwrap_or([0; 32])),
                n: r.i64()?,
                specials: [0; 3],
            },
            // With numeric NaN or infinities among the values.
            8 => AccState::SumDecimal {
                sum: i256::from_be_bytes(r.take(32)?.try_into().unwrap_or([0; 32])),
                n: r.i64()?,
                specials: [r.i64()?, r.i64()?, r.i64()?],
            },
            4 => {
                let len = r.u32()?;
                let mut set = BTreeMap::new();
                for _ in 0..len {
                    let n = r.u32()? as usize;
                    let v = r.bytes(n)?;
                    set.insert(v, r.i64()?);
                }
                AccState::Values(set)
            }
            5 => AccState::Moments {
                n: r.i64()?,
                sum: f64::from_bits(r.i64()? as u64),
                sum_sq: f64::from_bits(r.i64()? as u64),
            },
            6 => AccState::Bools {
                trues: r.i64()?,
                falses: r.i64()?,
            },
            9 => AccState::Distinct(r.i64()?),
            t => {
                return Err(ExecError::Storage(storage::StorageError::Corrupt(format!(
                    "unknown aggregate state tag {t}"
                ))));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operators::test_util::{chunk, ints};
    use datafusion::logical_expr::col;
    use storage::chunk::Op;

    fn call(kind: AggKind, append_only_input: bool) -> AggCall {
        AggCall {
            kind,
            arg: col("a"),
            output_type: DataType::Int64,
            distinct: false,
            filter: None,
            delimiter: None,
            delimiter_expr: None,
            order_by: Vec::new(),
            order_options: Vec::new(),
            append_only_input,
        }
    }

    #[test]
    fn min_over_an_append_only_input_keeps_one_value() {
        let (c, schema) = chunk(
            &[Op::Insert; 4],
            vec![ints(&[Some(5), Some(3), None, Some(7)])],
        );
        let agg = Aggregate::new(&call(AggKind::Min, true), &schema).unwrap();
        assert!(!agg.set_backed());
        let mut state = agg.init();
        let prepared = agg.prepare(c.data()).unwrap();
        for row in 0..4 {
            agg.update(&mut state, &prepared, row, 1);
        }
        assert_eq!(agg.output(&state).unwrap(), ScalarValue::Int64(Some(3)));
        let AccState::Values(set) = &state else {
            panic!("{state:?}");
        };
        assert_eq!(set.len(), 1);
        // Over an input with retractions, every value is kept, in a
        // value set apart from the group.
        let agg = Aggregate::new(&call(AggKind::Min, false), &schema).unwrap();
        assert!(agg.set_backed());
        assert_eq!(agg.init(), AccState::Distinct(0));
    }

    #[test]
    fn a_decimal_sum_past_38_digits_is_an_overflow_and_comes_back() {
        use datafusion::arrow::array::Decimal128Array;
        use datafusion::arrow::datatypes::{Field, Schema};
        let big = 9 * 10i128.pow(37);
        let values = Decimal128Array::from(vec![big, big, -big])
            .with_precision_and_scale(38, 0)
            .unwrap();
        let schema = Schema::new(vec![Field::new("a", DataType::Decimal128(38, 0), true)]);
        let batch = RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::new(values)]).unwrap();
        let df_schema = datafusion::common::DFSchema::try_from(schema).unwrap();
        let mut sum = call(AggKind::Sum, false);
        sum.output_type = DataType::Decimal128(38, 0);
        let agg = Aggregate::new(&sum, &df_schema).unwrap();
        let prepared = agg.prepare(&batch).unwrap();
        let mut state = agg.init();
        agg.update(&mut state, &prepared, 0, 1);
        agg.update(&mut state, &prepared, 1, 1);
        let e = agg.output(&state).unwrap_err();
        assert!(e.to_string().contains("numeric field overflow"), "{e}");
        // The state survives a checkpoint as it is, past 128 bits' range
        // of digits.
        let mut bytes = Vec::new();
        encoding::put(&mut bytes, &state);
        let mut state = encoding::get(&mut encoding::Reader(&bytes)).unwrap();
        agg.update(&mut state, &prepared, 2, 1);
        assert_eq!(
            agg.output(&state).unwrap(),
            ScalarValue::Decimal128(Some(big), 38, 0)
        );
        // A state written before 256-bit sums reads back.
        let mut old = vec![3u8];
        old.extend_from_slice(&5i128.to_be_bytes());
        old.extend_from_slice(&1i64.to_be_bytes());
        assert_eq!(
            encoding::get(&mut encoding::Reader(&old)).unwrap(),
            AccState::SumDecimal {
                sum: i256::from_i128(5),
                n: 1,
                specials: [0; 3],
            }
        );
    }

    #[test]
    fn numeric_nan_and_infinities_are_counted_and_taken_back() {
        use datafusion::arrow::array::Decimal128Array;
        use datafusion::arrow::datatypes::{Field, Schema};
        let values = [Special::Infinity.value(), 7, Special::NegInfinity.value()];
        let values = Decimal128Array::from(values.to_vec())
            .with_precision_and_scale(38, 0)
            .unwrap();
        let schema = Schema::new(vec![Field::new("a", DataType::Decimal128(38, 0), true)]);
        let batch = RecordBatch::try_new(Arc::new(schema.clone()), vec![Arc::new(values)]).unwrap();
        let df_schema = datafusion::common::DFSchema::try_from(schema).unwrap();
        let mut call = call(AggKind::Sum, false);
        call.output_type = DataType::Decimal128(38, 0);
        let sum = Aggregate::new(&call, &df_schema).unwrap();
        let prepared = sum.prepare(&batch).unwrap();
        let mut state = sum.init();
        let out = |sum: &Aggregate, state: &AccState| match sum.output(state).unwrap() {
            ScalarValue::Decimal128(v, ..) => v,
            other => panic!("{other:?}"),
        };
        for row in 0..2 {
            sum.update(&mut state, &prepared, row, 1);
        }
        assert_eq!(out(&sum, &state), Some(Special::Infinity.value()));
        sum.update(&mut state, &prepared, 2, 1);
        assert_eq!(out(&sum, &state), Some(Special::NaN.value()));
        // Through a checkpoint and back.
        let mut bytes = Vec::new();
        encoding::put(&mut bytes, &state);
        let mut state = encoding::get(&mut encoding::Reader(&bytes)).unwrap();
        sum.update(&mut state, &prepared, 0, -1);
        assert_eq!(out(&sum, &state), Some(Special::NegInfinity.value()));
        sum.update(&mut state, &prepared, 2, -1);
        assert_eq!(out(&sum, &state), Some(7));
    }
}

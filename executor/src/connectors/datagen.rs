//! `connector = 'datagen'`: rows made up from a per-column spec, as in
//! RisingWave and Flink.
//!
//! Row `i` is a function of `i` alone: a `sequence` column holds
//! `start + i`, a `random` column a value drawn from a generator seeded by
//! the column's seed and `i`. Split `s` of `n` makes rows `s`, `s + n`, …,
//! so a replay after a restart makes the same rows. A sequence with an
//! `end` bounds the source; `datagen.rows.per.second` paces it (over all
//! splits together).

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray,
    TimestampMicrosecondArray,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use planner::spec::ConnectorSpec;
use rand::distributions::{Alphanumeric, DistString};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{
    Options, Pace, Pacer, ReadBatch, SourceConnector, SplitReader, count_position, count_start,
};
use crate::{ExecError, Result};

const OPTIONS: &[&str] = &[
    "datagen.rows.per.second",
    "datagen.split.num",
    "fields.<column>.kind (random or sequence)",
    "fields.<column>.start",
    "fields.<column>.end",
    "fields.<column>.min",
    "fields.<column>.max",
    "fields.<column>.length",
    "fields.<column>.seed",
    "fields.<column>.max_past",
];

/// Rows per chunk.
const CHUNK: u64 = 1024;

/// How one column is made.
#[derive(Debug, Clone)]
enum Gen {
    /// `start + i`.
    Sequence { start: i64 },
    /// A number in `min..=max`, a string of `length` letters and digits, a
    /// boolean, or a timestamp up to `max_past_us` before now.
    Random {
        seed: u64,
        min: f64,
        max: f64,
        length: usize,
        max_past_us: i64,
    },
}

#[derive(Debug, Clone)]
pub(super) struct Datagen {
    columns: Vec<Gen>,
    schema: SchemaRef,
    splits: usize,
    /// Rows in all, when a sequence has an end.
    rows: Option<u64>,
    rows_per_second: u64,
}

/// `2h 30min`, `90s`, `1 day`: a duration in microseconds.
fn parse_duration(s: &str) -> Option<i64> {
    let mut total = 0i64;
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        let n: i64 = rest[..digits].parse().ok()?;
        rest = rest[digits..].trim_start();
        let unit_len = rest
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(rest.len());
        let unit = match &rest[..unit_len] {
            "" | "s" | "sec" | "secs" | "second" | "seconds" => 1_000_000,
            "m" | "min" | "mins" | "minute" | "minutes" => 60_000_000,
            "h" | "hr" | "hour" | "hours" => 3_600_000_000,
            "d" | "day" | "days" => 86_400_000_000,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
        rest = rest[unit_len..].trim_start();
    }
    Some(total)
}

impl Datagen {
    pub(super) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("datagen", &spec.options);
        let rows_per_second = o
            .parse::<u64>("datagen.rows.per.second", "a number of rows (0: no limit)")?
            .unwrap_or(10);
        let splits = o
            .parse::<usize>("datagen.split.num", "a number of splits from 1")?
            .unwrap_or(1);
        if splits == 0 {
            return Err(o.invalid("datagen.split.num", "0", "a number of splits from 1"));
        }
        let mut columns = Vec::new();
        let mut rows: Option<u64> = None;
        for f in schema.fields() {
            let name = f.name();
            let opt = |p: &str| format!("fields.{name}.{p}");
            let numeric = f.data_type().is_numeric();
            let kind = o.take(&opt("kind")).unwrap_or_else(|| "random".into());
            let column = match kind.to_ascii_lowercase().as_str() {
                "sequence" => {
                    if !(f.data_type().is_integer() || matches!(f.data_type(), DataType::Utf8)) {
                        return Err(ExecError::InvalidOption(format!(
                            "datagen makes sequences of integers and text, not of {} (column \"{name}\")",
                            f.data_type()
                        )));
                    }
                    let start = o.parse::<i64>(&opt("start"), "an integer")?.unwrap_or(0);
                    if let Some(end) = o.parse::<i64>(&opt("end"), "an integer")? {
                        if end < start {
                            return Err(ExecError::InvalidOption(format!(
                                "fields.{name}.end ({end}) is before fields.{name}.start ({start})"
                            )));
                        }
                        let n = (end - start) as u64 + 1;
                        rows = Some(rows.map_or(n, |r| r.min(n)));
                    }
                    Gen::Sequence { start }
                }
                "random" => {
                    let supported = numeric
                        || matches!(
                            f.data_type(),
                            DataType::Utf8 | DataType::Boolean | DataType::Timestamp(_, _)
                        );
                    if !supported {
                        return Err(ExecError::Unsupported(format!(
                            "datagen cannot make values of {} (column \"{name}\")",
                            f.data_type()
                        )));
                    }
                    let max_past_us = match o.take(&opt("max_past")) {
                        None => 86_400_000_000,
                        Some(v) => parse_duration(&v).ok_or_else(|| {
                            o.invalid(&opt("max_past"), &v, "a duration such as '1h 30min'")
                        })?,
                    };
                    Gen::Random {
                        seed: o.parse::<u64>(&opt("seed"), "an integer")?.unwrap_or(0),
                        min: o.parse::<f64>(&opt("min"), "a number")?.unwrap_or(0.0),
                        max: o.parse::<f64>(&opt("max"), "a number")?.unwrap_or(32767.0),
                        length: o.parse::<usize>(&opt("length"), "a length")?.unwrap_or(10),
                        max_past_us,
                    }
                }
                _ => return Err(o.invalid(&opt("kind"), &kind, "random or sequence")),
            };
            if let Gen::Random { min, max, .. } = column
                && min > max
            {
                return Err(ExecError::InvalidOption(format!(
                    "fields.{name}.min ({min}) is above fields.{name}.max ({max})"
                )));
            }
            columns.push(column);
        }
        o.finish(OPTIONS)?;
        Ok(Self {
            columns,
            schema: schema.clone(),
            splits,
            rows,
            rows_per_second,
        })
    }

    /// Rows `indices` (of the whole source).
    fn batch(&self, indices: &[u64]) -> Result<RecordBatch> {
        let now = crate::operator::processing_time_us();
        let columns = self
            .columns
            .iter()
            .zip(self.schema.fields())
            .enumerate()
            .map(|(c, (column, f))| {
                let array: ArrayRef = match column {
                    Gen::Sequence { start } => {
                        let values = indices.iter().map(|i| start + *i as i64);
                        if matches!(f.data_type(), DataType::Utf8) {
                            Arc::new(StringArray::from_iter_values(values.map(|v| v.to_string())))
                        } else {
                            Arc::new(Int64Array::from_iter_values(values))
                        }
                    }
                    Gen::Random {
                        seed,
                        min,
                        max,
                        length,
                        max_past_us,
                    } => {
                        let mut rngs = indices.iter().map(|i| {
                            // One generator per value: row i's value does
                            // not depend on which rows came before it.
                            let key = seed
                                ^ (*i).wrapping_mul(0x9E37_79B9_7F4A_7C15)
                                ^ (c as u64).rotate_left(32);
                            SmallRng::seed_from_u64(key)
                        });
                        match f.data_type() {
                            DataType::Utf8 => Arc::new(StringArray::from_iter_values(
                                rngs.by_ref()
                                    .map(|mut r| Alphanumeric.sample_string(&mut r, *length)),
                            )),
                            DataType::Boolean => Arc::new(BooleanArray::from_iter(
                                rngs.by_ref().map(|mut r| Some(r.r#gen::<bool>())),
                            )),
                            DataType::Timestamp(_, _) => {
                                let past = (*max_past_us).max(1);
                                Arc::new(TimestampMicrosecondArray::from_iter_values(
                                    rngs.by_ref().map(|mut r| now - r.gen_range(0..past)),
                                ))
                            }
                            t if t.is_integer() => {
                                let (lo, hi) = (min.ceil() as i64, max.floor() as i64);
                                Arc::new(Int64Array::from_iter_values(
                                    rngs.by_ref().map(|mut r| r.gen_range(lo..=hi.max(lo))),
                                ))
                            }
                            _ => Arc::new(Float64Array::from_iter_values(rngs.by_ref().map(
                                |mut r| {
                                    if max > min {
                                        r.gen_range(*min..=*max)
                                    } else {
                                        *min
                                    }
                                },
                            ))),
                        }
                    }
                };
                let target = match f.data_type() {
                    DataType::Timestamp(_, tz) => {
                        DataType::Timestamp(TimeUnit::Microsecond, tz.clone())
                    }
                    t => t.clone(),
                };
                Ok(cast(&array, &target)?)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

#[async_trait]
impl SourceConnector for Datagen {
    async fn splits(&self) -> Result<usize> {
        Ok(self.splits)
    }

    fn reader(
        &self,
        split: usize,
        position: Option<&[u8]>,
        pace: Pace,
    ) -> Result<Box<dyn SplitReader>> {
        let next = count_start(position, split)?;
        let gap_ns = match (pace, self.rows_per_second) {
            (Pace::Unlimited, _) | (_, 0) => 0,
            (Pace::Rated, r) => (1_000_000_000 / r).max(1),
        };
        Ok(Box::new(DatagenReader {
            source: self.clone(),
            next,
            pacer: Pacer::new(next, gap_ns),
            paced: gap_ns > 0,
        }))
    }

    fn bounded(&self) -> bool {
        self.rows.is_some()
    }
}

struct DatagenReader {
    source: Datagen,
    /// The next row this split makes.
    next: u64,
    pacer: Pacer,
    paced: bool,
}

impl DatagenReader {
    fn ended(&self) -> bool {
        self.source.rows.is_some_and(|n| self.next >= n)
    }
}

#[async_trait]
impl SplitReader for DatagenReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        if self.ended() {
            return Ok(None);
        }
        self.pacer.wait(self.next).await;
        let step = self.source.splits as u64;
        let mut indices = Vec::new();
        while (indices.len() as u64) < CHUNK && !self.ended() && self.pacer.is_due(self.next) {
            indices.push(self.next);
            self.next += step;
        }
        let caught_up = self.ended()
            || self.paced && !self.pacer.is_due(self.next)
            || !self.paced && !self.source.bounded();
        Ok(Some(ReadBatch {
            ops: None,
            data: self.source.batch(&indices)?,
            position: count_position(self.next),
            caught_up,
            as_of: std::time::Instant::now(),
            rejected: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field, Schema};

    fn spec(options: &[(&str, &str)]) -> ConnectorSpec {
        ConnectorSpec {
            connector: "datagen".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn rows_depend_only_on_their_number() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("v", DataType::Float64, true),
            Field::new("s", DataType::Utf8, true),
        ]));
        let opts = [
            ("fields.id.kind", "sequence"),
            ("fields.id.start", "1"),
            ("fields.id.end", "100"),
            ("fields.v.min", "1"),
            ("fields.v.max", "2"),
            ("fields.s.length", "4"),
        ];
        let read = |splits: &'static str| {
            let mut o = opts.to_vec();
            o.push(("datagen.split.num", splits));
            let d = Datagen::new(&spec(&o), &schema).unwrap();
            async move {
                let mut rows = Vec::new();
                for s in 0..d.splits {
                    let mut r = d.reader(s, None, Pace::Unlimited).unwrap();
                    while let Some(b) = r.next().await.unwrap() {
                        let fmt = datafusion::arrow::util::pretty::pretty_format_batches(&[b.data])
                            .unwrap()
                            .to_string();
                        rows.extend(
                            fmt.lines()
                                .filter(|l| l.starts_with("| ") && !l.contains(" id "))
                                .map(|l| l.split('|').map(str::trim).collect::<Vec<_>>().join("|")),
                        );
                    }
                }
                rows.sort();
                rows
            }
        };
        let one = read("1").await;
        assert_eq!(one.len(), 100);
        assert_eq!(one, read("3").await);
    }

    #[test]
    fn bad_options_name_the_option() {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let e = Datagen::new(&spec(&[("fields.id.kind", "counter")]), &schema)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("fields.id.kind") && e.contains("sequence"),
            "{e}"
        );
        let e = Datagen::new(&spec(&[("fields.x.kind", "random")]), &schema)
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown option fields.x.kind"), "{e}");
        assert_eq!(parse_duration("1h 30min"), Some(5_400_000_000));
        assert_eq!(parse_duration("soon"), None);
    }
}

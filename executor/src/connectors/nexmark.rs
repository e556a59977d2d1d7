//! `connector = 'nexmark'`: the Nexmark benchmark's auction events, from
//! RisingWave's generator (the `nexmark` crate), with RisingWave's option
//! names.
//!
//! A source is one event type (`nexmark.table.type` = `Person`, `Auction`
//! or `Bid`). Split `s` of `n` generates that type's events `s`, `s + n`,
//! `s + 2n`, …; its position is how far it got. Events are a function of
//! their number and the generator's base time, which is fixed when the
//! source is created, so every job and every restart sees the same events.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{
    ArrayRef, Int64Builder, RecordBatch, StringBuilder, TimestampMicrosecondBuilder,
};
use datafusion::arrow::compute::{can_cast_types, cast};
use datafusion::arrow::datatypes::{DataType, SchemaRef, TimeUnit};
use nexmark::EventGenerator;
use nexmark::config::NexmarkConfig;
use nexmark::event::{Event, EventType};
use planner::spec::ConnectorSpec;

use super::{
    Options, Pace, Pacer, ReadBatch, SourceConnector, SplitReader, count_position, count_start,
};
use crate::{ExecError, Result};

const BASE_TIME: &str = "nexmark.base.time";

/// The generator settings a user may change, by option name.
const CONFIG: &[&str] = &[
    "nexmark.active.people",
    "nexmark.in.flight.auctions",
    "nexmark.out.of.order.group.size",
    "nexmark.avg.person.byte.size",
    "nexmark.avg.auction.byte.size",
    "nexmark.avg.bid.byte.size",
    "nexmark.hot.seller.ratio",
    "nexmark.hot.auction.ratio",
    "nexmark.hot.bidder.ratio",
    "nexmark.hot.channel.ratio",
    "nexmark.first.event.id",
    "nexmark.first.event.number",
    "nexmark.num.categories",
    "nexmark.auction.id.lead",
    "nexmark.person.proportion",
    "nexmark.auction.proportion",
    "nexmark.bid.proportion",
    "nexmark.first.auction.id",
    "nexmark.first.person.id",
    "nexmark.first.category.id",
    "nexmark.person.id.lead",
    "nexmark.first.event.rate",
    "nexmark.next.event.rate",
];

const OPTIONS: &[&str] = &[
    "nexmark.table.type",
    "nexmark.split.num",
    "nexmark.event.num",
    "nexmark.min.event.gap.in.ns",
    "nexmark.max.chunk.size",
    "nexmark.use.real.time",
    BASE_TIME,
    "nexmark.<generator setting> (nexmark.active.people, nexmark.in.flight.auctions, nexmark.bid.proportion, …)",
];

/// Fixes the base time of the events at the source's creation.
pub(super) fn complete(spec: &mut ConnectorSpec) {
    spec.options.entry(BASE_TIME.into()).or_insert_with(|| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        now.to_string()
    });
}

/// One column of an event, as the generator has it.
#[derive(Debug, Clone, Copy)]
enum Field {
    Int(fn(&Event) -> i64),
    Text(fn(&Event) -> &str),
    /// Milliseconds since the epoch.
    Time(fn(&Event) -> u64),
}

fn person(e: &Event) -> &nexmark::event::Person {
    match e {
        Event::Person(p) => p,
        _ => unreachable!("a person source generates persons"),
    }
}

fn auction(e: &Event) -> &nexmark::event::Auction {
    match e {
        Event::Auction(a) => a,
        _ => unreachable!("an auction source generates auctions"),
    }
}

fn bid(e: &Event) -> &nexmark::event::Bid {
    match e {
        Event::Bid(b) => b,
        _ => unreachable!("a bid source generates bids"),
    }
}

/// The columns each event type has.
fn fields(t: EventType) -> Vec<(&'static str, Field)> {
    match t {
        EventType::Person => vec![
            ("id", Field::Int(|e| person(e).id as i64)),
            ("name", Field::Text(|e| &person(e).name)),
            ("email_address", Field::Text(|e| &person(e).email_address)),
            ("credit_card", Field::Text(|e| &person(e).credit_card)),
            ("city", Field::Text(|e| &person(e).city)),
            ("state", Field::Text(|e| &person(e).state)),
            ("date_time", Field::Time(|e| person(e).date_time)),
            ("extra", Field::Text(|e| &person(e).extra)),
        ],
        EventType::Auction => vec![
            ("id", Field::Int(|e| auction(e).id as i64)),
            ("item_name", Field::Text(|e| &auction(e).item_name)),
            ("description", Field::Text(|e| &auction(e).description)),
            ("initial_bid", Field::Int(|e| auction(e).initial_bid as i64)),
            ("reserve", Field::Int(|e| auction(e).reserve as i64)),
            ("date_time", Field::Time(|e| auction(e).date_time)),
            ("expires", Field::Time(|e| auction(e).expires)),
            ("seller", Field::Int(|e| auction(e).seller as i64)),
            ("category", Field::Int(|e| auction(e).category as i64)),
            ("extra", Field::Text(|e| &auction(e).extra)),
        ],
        EventType::Bid => vec![
            ("auction", Field::Int(|e| bid(e).auction as i64)),
            ("bidder", Field::Int(|e| bid(e).bidder as i64)),
            ("price", Field::Int(|e| bid(e).price as i64)),
            ("channel", Field::Text(|e| &bid(e).channel)),
            ("url", Field::Text(|e| &bid(e).url)),
            ("date_time", Field::Time(|e| bid(e).date_time)),
            ("extra", Field::Text(|e| &bid(e).extra)),
        ],
    }
}

impl Field {
    fn data_type(&self) -> DataType {
        match self {
            Field::Int(_) => DataType::Int64,
            Field::Text(_) => DataType::Utf8,
            Field::Time(_) => DataType::Timestamp(TimeUnit::Microsecond, None),
        }
    }

    fn column(&self, events: &[Event]) -> ArrayRef {
        match self {
            Field::Int(f) => {
                let mut b = Int64Builder::with_capacity(events.len());
                events.iter().for_each(|e| b.append_value(f(e)));
                Arc::new(b.finish())
            }
            Field::Text(f) => {
                let mut b = StringBuilder::with_capacity(events.len(), events.len() * 16);
                events.iter().for_each(|e| b.append_value(f(e)));
                Arc::new(b.finish())
            }
            Field::Time(f) => {
                let mut b = TimestampMicrosecondBuilder::with_capacity(events.len());
                events
                    .iter()
                    .for_each(|e| b.append_value(f(e) as i64 * 1000));
                Arc::new(b.finish())
            }
        }
    }
}

/// A Nexmark source's settings.
#[derive(Debug, Clone)]
pub(super) struct Nexmark {
    config: NexmarkConfig,
    event_type: EventType,
    splits: usize,
    /// Events of all types after which the source ends (RisingWave's
    /// `nexmark.event.num`).
    event_num: Option<u64>,
    gap_ns: u64,
    chunk: usize,
    /// Pace by the events' own timestamps rather than by the gap.
    real_time: bool,
    /// The declared columns: the generator's field, then the declared type.
    columns: Vec<Field>,
    schema: SchemaRef,
}

impl Nexmark {
    pub(super) fn new(spec: &ConnectorSpec, schema: &SchemaRef) -> Result<Self> {
        let mut o = Options::new("nexmark", &spec.options);
        let event_type = match o.take("nexmark.table.type") {
            Some(t) => match t.to_ascii_lowercase().as_str() {
                "person" => EventType::Person,
                "auction" => EventType::Auction,
                "bid" => EventType::Bid,
                _ => return Err(o.invalid("nexmark.table.type", &t, "Person, Auction or Bid")),
            },
            None => {
                return Err(ExecError::InvalidOption(
                    "connector nexmark needs nexmark.table.type (Person, Auction or Bid)".into(),
                ));
            }
        };
        let splits = o
            .parse::<usize>("nexmark.split.num", "a number of splits from 1")?
            .unwrap_or(1);
        if splits == 0 {
            return Err(o.invalid("nexmark.split.num", "0", "a number of splits from 1"));
        }
        let event_num = o.parse::<u64>("nexmark.event.num", "a number of events")?;
        let gap_ns = o
            .parse::<u64>("nexmark.min.event.gap.in.ns", "a number of nanoseconds")?
            .unwrap_or(100_000);
        let chunk = o
            .parse::<usize>("nexmark.max.chunk.size", "a number of rows from 1")?
            .unwrap_or(1024)
            .max(1);
        let real_time = o.flag("nexmark.use.real.time")?.unwrap_or(false);
        let mut config = NexmarkConfig::default();
        config.base_time = o
            .parse::<u64>(BASE_TIME, "milliseconds since 1970-01-01")?
            .unwrap_or(config.base_time);
        let mut setting = |name: &str, field: &mut usize| -> Result<()> {
            if let Some(v) = o.parse::<usize>(name, "a whole number")? {
                *field = v;
            }
            Ok(())
        };
        setting(CONFIG[0], &mut config.active_people)?;
        setting(CONFIG[1], &mut config.in_flight_auctions)?;
        setting(CONFIG[2], &mut config.out_of_order_group_size)?;
        setting(CONFIG[3], &mut config.avg_person_byte_size)?;
        setting(CONFIG[4], &mut config.avg_auction_byte_size)?;
        setting(CONFIG[5], &mut config.avg_bid_byte_size)?;
        setting(CONFIG[6], &mut config.hot_seller_ratio)?;
        setting(CONFIG[7], &mut config.hot_auction_ratio)?;
        setting(CONFIG[8], &mut config.hot_bidder_ratio)?;
        setting(CONFIG[9], &mut config.hot_channel_ratio)?;
        setting(CONFIG[10], &mut config.first_event_id)?;
        setting(CONFIG[11], &mut config.first_event_number)?;
        setting(CONFIG[12], &mut config.num_categories)?;
        setting(CONFIG[13], &mut config.auction_id_lead)?;
        setting(CONFIG[14], &mut config.person_proportion)?;
        setting(CONFIG[15], &mut config.auction_proportion)?;
        setting(CONFIG[16], &mut config.bid_proportion)?;
        setting(CONFIG[17], &mut config.first_auction_id)?;
        setting(CONFIG[18], &mut config.first_person_id)?;
        setting(CONFIG[19], &mut config.first_category_id)?;
        setting(CONFIG[20], &mut config.person_id_lead)?;
        setting(CONFIG[21], &mut config.first_rate)?;
        setting(CONFIG[22], &mut config.next_rate)?;
        o.finish(OPTIONS)?;
        if config.out_of_order_group_size == 0
            || config.person_proportion + config.auction_proportion + config.bid_proportion == 0
            || config.first_rate == 0
            || config.next_rate == 0
            || [
                config.hot_seller_ratio,
                config.hot_auction_ratio,
                config.hot_bidder_ratio,
                config.hot_channel_ratio,
                config.num_categories,
                config.active_people,
                config.in_flight_auctions,
            ]
            .contains(&0)
        {
            return Err(ExecError::InvalidOption(
                "nexmark generator settings (ratios, proportions, rates, group sizes, counts) must be at least 1".into(),
            ));
        }
        let available = fields(event_type);
        let columns = schema
            .fields()
            .iter()
            .map(|f| {
                let Some((_, field)) = available.iter().find(|(n, _)| *n == f.name()) else {
                    return Err(ExecError::InvalidOption(format!(
                        "a nexmark {event_type:?} has no column \"{}\"; it has: {}",
                        f.name(),
                        available
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                };
                if !can_cast_types(&field.data_type(), f.data_type()) {
                    return Err(ExecError::InvalidOption(format!(
                        "nexmark column \"{}\" cannot be {}",
                        f.name(),
                        f.data_type()
                    )));
                }
                Ok(*field)
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            config,
            event_type,
            splits,
            event_num,
            gap_ns,
            chunk,
            real_time,
            columns,
            schema: schema.clone(),
        })
    }

    fn batch(&self, events: &[Event]) -> Result<RecordBatch> {
        let columns = self
            .columns
            .iter()
            .zip(self.schema.fields())
            .map(|(c, f)| Ok(cast(&c.column(events), f.data_type())?))
            .collect::<Result<Vec<_>>>()?;
        Ok(RecordBatch::try_new(self.schema.clone(), columns)?)
    }
}

#[async_trait]
impl SourceConnector for Nexmark {
    async fn splits(&self) -> Result<usize> {
        Ok(self.splits)
    }

    fn reader(
        &self,
        split: usize,
        position: Option<&[u8]>,
        pace: Pace,
    ) -> Result<Box<dyn SplitReader>> {
        let offset = count_start(position, split)?;
        let generator = EventGenerator::new(self.config.clone())
            .with_offset(offset)
            .with_step(self.splits as u64)
            .with_type_filter(self.event_type);
        // A batch read (Unlimited) ignores both ways of pacing.
        let rated = pace == Pace::Rated;
        let real_time =
            (rated && self.real_time).then(|| (std::time::Instant::now(), generator.timestamp()));
        let pace = (rated && !self.real_time && self.gap_ns > 0)
            .then(|| Pacer::new(generator.global_offset(), self.gap_ns));
        Ok(Box::new(NexmarkReader {
            source: self.clone(),
            generator,
            pace,
            real_time,
        }))
    }

    fn bounded(&self) -> bool {
        self.event_num.is_some()
    }
}

struct NexmarkReader {
    source: Nexmark,
    generator: EventGenerator,
    pace: Option<Pacer>,
    /// `nexmark.use.real.time`: when the reader started, and the event
    /// time it started at.
    real_time: Option<(std::time::Instant, u64)>,
}

impl NexmarkReader {
    fn ended(&self) -> bool {
        self.source
            .event_num
            .is_some_and(|n| self.generator.global_offset() >= n)
    }

    /// Whether the next event is due.
    fn due(&self) -> bool {
        if let Some((start, t0)) = self.real_time {
            let ms = self.generator.timestamp().saturating_sub(t0);
            return start + std::time::Duration::from_millis(ms) <= std::time::Instant::now();
        }
        self.pace
            .as_ref()
            .is_none_or(|p| p.is_due(self.generator.global_offset()))
    }

    async fn wait(&self) {
        if let Some((start, t0)) = self.real_time {
            let ms = self.generator.timestamp().saturating_sub(t0);
            tokio::time::sleep_until((start + std::time::Duration::from_millis(ms)).into()).await;
        } else if let Some(p) = &self.pace {
            p.wait(self.generator.global_offset()).await;
        }
    }
}

#[async_trait]
impl SplitReader for NexmarkReader {
    async fn next(&mut self) -> Result<Option<ReadBatch>> {
        if self.ended() {
            return Ok(None);
        }
        self.wait().await;
        let mut events = Vec::with_capacity(self.source.chunk);
        while events.len() < self.source.chunk && !self.ended() && self.due() {
            events.extend(self.generator.next());
        }
        let paced = self.pace.is_some() || self.real_time.is_some();
        // Unpaced and endless, everything is always available: there is
        // nothing to catch up with.
        let caught_up = self.ended() || paced && !self.due() || !paced && !self.source.bounded();
        Ok(Some(ReadBatch {
            ops: None,
            data: self.source.batch(&events)?,
            position: count_position(self.generator.offset()),
            caught_up,
            as_of: std::time::Instant::now(),
            rejected: Vec::new(),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{Field as ArrowField, Schema};
    use std::collections::BTreeMap;

    fn spec(options: &[(&str, &str)]) -> ConnectorSpec {
        ConnectorSpec {
            connector: "nexmark".into(),
            options: options
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>(),
            ..Default::default()
        }
    }

    fn bid_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            ArrowField::new("auction", DataType::Int64, true),
            ArrowField::new("price", DataType::Int32, true),
            ArrowField::new(
                "date_time",
                DataType::Timestamp(TimeUnit::Microsecond, None),
                true,
            ),
        ]))
    }

    async fn read_all(n: &Nexmark, split: usize) -> Vec<RecordBatch> {
        let mut r = n.reader(split, None, Pace::Unlimited).unwrap();
        let mut out = vec![];
        while let Some(b) = r.next().await.unwrap() {
            out.push(b.data);
        }
        out
    }

    #[tokio::test]
    async fn splits_partition_the_events_and_positions_resume() {
        let opts = [
            ("nexmark.table.type", "Bid"),
            ("nexmark.event.num", "1000"),
            ("nexmark.base.time", "1700000000000"),
            ("nexmark.max.chunk.size", "64"),
        ];
        let one = Nexmark::new(&spec(&opts), &bid_schema()).unwrap();
        let rows = |bs: &[RecordBatch]| bs.iter().map(|b| b.num_rows()).sum::<usize>();
        let all = read_all(&one, 0).await;
        // 46 of every 50 events are bids.
        assert_eq!(rows(&all), 920);
        let mut opts3 = opts.to_vec();
        opts3.push(("nexmark.split.num", "3"));
        let three = Nexmark::new(&spec(&opts3), &bid_schema()).unwrap();
        let mut total = 0;
        for s in 0..3 {
            total += rows(&read_all(&three, s).await);
        }
        assert_eq!(total, 920);
        // Resuming from a position gives the rest of the split.
        let mut r = one.reader(0, None, Pace::Unlimited).unwrap();
        let first = r.next().await.unwrap().unwrap();
        let mut rest = one
            .reader(0, Some(&first.position), Pace::Unlimited)
            .unwrap();
        let mut n = first.data.num_rows();
        while let Some(b) = rest.next().await.unwrap() {
            n += b.data.num_rows();
        }
        assert_eq!(n, 920);
    }

    #[tokio::test]
    async fn unpaced_endless_reads_are_always_caught_up_and_batch_reads_never_wait() {
        let endless = Nexmark::new(
            &spec(&[
                ("nexmark.table.type", "Bid"),
                ("nexmark.min.event.gap.in.ns", "0"),
            ]),
            &bid_schema(),
        )
        .unwrap();
        let b = endless
            .reader(0, None, Pace::Rated)
            .unwrap()
            .next()
            .await
            .unwrap()
            .unwrap();
        assert!(b.caught_up, "nothing to catch up with: FLUSH must not wait");
        // Real-time pacing would take ~100 s of event time here.
        let real_time = Nexmark::new(
            &spec(&[
                ("nexmark.table.type", "Bid"),
                ("nexmark.event.num", "1000000"),
                ("nexmark.use.real.time", "true"),
            ]),
            &bid_schema(),
        )
        .unwrap();
        let mut r = real_time.reader(0, None, Pace::Unlimited).unwrap();
        let b = tokio::time::timeout(std::time::Duration::from_secs(5), r.next())
            .await
            .expect("a batch read does not pace")
            .unwrap()
            .unwrap();
        assert_eq!(b.data.num_rows(), 1024);
    }

    #[test]
    fn bad_options_name_the_option() {
        let e = Nexmark::new(&spec(&[("nexmark.table.type", "Bids")]), &bid_schema())
            .unwrap_err()
            .to_string();
        assert!(e.contains("nexmark.table.type") && e.contains("Bid"), "{e}");
        let e = Nexmark::new(
            &spec(&[("nexmark.table.type", "Bid"), ("nexmark.splits", "2")]),
            &bid_schema(),
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("unknown option nexmark.splits"), "{e}");
        let schema = Arc::new(Schema::new(vec![ArrowField::new(
            "seller",
            DataType::Int64,
            true,
        )]));
        let e = Nexmark::new(&spec(&[("nexmark.table.type", "Bid")]), &schema)
            .unwrap_err()
            .to_string();
        assert!(e.contains("no column \"seller\""), "{e}");
    }
}

//! Postgres's run-time parameters, as Weir keeps them per session.
//!
//! Clients set these on connect (JDBC sends `extra_float_digits`,
//! `DateStyle`, `TimeZone` and `application_name`; psycopg and BI tools
//! `SET` a few more) and read them back with `SHOW`, `current_setting()` and
//! `pg_settings`. A value Weir honours is kept as Postgres would print it;
//! a value that would make Weir's answers differ from what the client then
//! expects (a time zone other than UTC, another date style, an encoding
//! other than UTF-8, `standard_conforming_strings = off`) is refused with
//! `0A000` rather than accepted and ignored. Parameters that only tune
//! Postgres's own planner or storage are accepted and kept, as they change
//! no answer. Any other name is unknown (`42704`), as in Postgres, unless it
//! has a dot (a custom `extension.name` setting, which Postgres keeps too).

use crate::error::{Result, ServerError};

/// Weir's own settings, kept in fields of their own.
pub const WEIR_SETTINGS: &[&str] = &[
    "streaming_parallelism",
    "streaming_chaining",
    "checkpoint_mode",
    "streaming_state_ttl",
    "state_backend",
];

/// A parameter: its name, its default and how a value is checked.
struct Param {
    name: &'static str,
    default: &'static str,
    check: Check,
    /// Sent to the client as a ParameterStatus when it changes, as
    /// Postgres's `GUC_REPORT` parameters are.
    reported: bool,
}

enum Check {
    /// Any text.
    Any,
    /// Fixed when the server starts.
    ReadOnly,
    Bool,
    /// One of these (case-insensitively), printed as written here.
    OneOf(&'static [&'static str]),
    /// A duration in milliseconds: a number, or a number with a unit.
    Millis,
    Integer(i64, i64),
    /// Checked by a function that gives the value as it is kept.
    With(fn(&str) -> Result<String>),
}

const fn p(name: &'static str, default: &'static str, check: Check) -> Param {
    Param {
        name,
        default,
        check,
        reported: false,
    }
}

const fn reported(name: &'static str, default: &'static str, check: Check) -> Param {
    Param {
        name,
        default,
        check,
        reported: true,
    }
}

/// `server_version_num` of [`crate::SERVER_VERSION`].
pub const SERVER_VERSION_NUM: &str = "160000";

const ISOLATION: &[&str] = &[
    "serializable",
    "repeatable read",
    "read committed",
    "read uncommitted",
];

static PARAMS: &[Param] = &[
    reported("application_name", "", Check::Any),
    reported("client_encoding", "UTF8", Check::With(client_encoding)),
    reported("DateStyle", "ISO, MDY", Check::With(date_style)),
    reported("IntervalStyle", "postgres", Check::OneOf(&["postgres"])),
    reported("TimeZone", "UTC", Check::With(time_zone)),
    reported("standard_conforming_strings", "on", Check::OneOf(&["on"])),
    reported("integer_datetimes", "on", Check::ReadOnly),
    reported("is_superuser", "on", Check::ReadOnly),
    reported("session_authorization", crate::SUPERUSER, Check::ReadOnly),
    reported("server_encoding", "UTF8", Check::ReadOnly),
    reported("server_version", crate::SERVER_VERSION, Check::ReadOnly),
    p("server_version_num", SERVER_VERSION_NUM, Check::ReadOnly),
    p("search_path", "\"$user\", public", Check::Any),
    p("extra_float_digits", "1", Check::With(extra_float_digits)),
    p("statement_timeout", "0", Check::Millis),
    p("lock_timeout", "0", Check::Millis),
    p("idle_in_transaction_session_timeout", "0", Check::Millis),
    p(
        "transaction_isolation",
        "serializable",
        Check::OneOf(ISOLATION),
    ),
    p(
        "default_transaction_isolation",
        "serializable",
        Check::OneOf(ISOLATION),
    ),
    // Each INSERT, UPDATE, DELETE and COPY returns once its rows are in
    // every view, as if FLUSH followed it (RisingWave's `implicit_flush`).
    p("implicit_flush", "off", Check::Bool),
    p("transaction_read_only", "off", Check::Bool),
    p("default_transaction_read_only", "off", Check::Bool),
    p("bytea_output", "hex", Check::OneOf(&["hex"])),
    p(
        "client_min_messages",
        "notice",
        Check::OneOf(&[
            "debug5", "debug4", "debug3", "debug2", "debug1", "log", "notice", "warning", "error",
        ]),
    ),
    p("escape_string_warning", "on", Check::Bool),
    p("row_security", "on", Check::Bool),
    p(
        "synchronous_commit",
        "on",
        Check::OneOf(&["on", "off", "local", "remote_write", "remote_apply"]),
    ),
    p("lc_messages", "C", Check::Any),
    p("lc_monetary", "C", Check::Any),
    p("lc_numeric", "C", Check::Any),
    p("lc_time", "C", Check::Any),
    p("lc_collate", "C", Check::ReadOnly),
    p("lc_ctype", "C", Check::ReadOnly),
    p("max_identifier_length", "63", Check::ReadOnly),
    p("block_size", "8192", Check::ReadOnly),
    p("work_mem", "4MB", Check::Any),
    p("maintenance_work_mem", "64MB", Check::Any),
    p("jit", "off", Check::Bool),
    p(
        "max_parallel_workers_per_gather",
        "2",
        Check::Integer(0, 1024),
    ),
    p(
        "join_collapse_limit",
        "8",
        Check::Integer(1, i32::MAX as i64),
    ),
    p(
        "from_collapse_limit",
        "8",
        Check::Integer(1, i32::MAX as i64),
    ),
    p("geqo", "on", Check::Bool),
    p(
        "xmloption",
        "content",
        Check::OneOf(&["content", "document"]),
    ),
];

/// A parameter's name as Weir keeps it: lower case, and RisingWave's
/// spelling `rw_implicit_flush` taken as `implicit_flush`.
pub fn canonical_name(name: &str) -> String {
    let name = name.to_lowercase();
    match name.as_str() {
        "rw_implicit_flush" => "implicit_flush".to_string(),
        _ => name,
    }
}

fn find(name: &str) -> Option<&'static Param> {
    PARAMS.iter().find(|p| p.name.eq_ignore_ascii_case(name))
}

/// Every parameter with its default, by lower-case name.
pub fn defaults() -> impl Iterator<Item = (String, &'static str)> {
    PARAMS.iter().map(|p| (p.name.to_lowercase(), p.default))
}

/// The default of `name`, or `None` if it is not one of Postgres's.
pub fn default_of(name: &str) -> Option<&'static str> {
    find(name).map(|p| p.default)
}

/// The name a client is told of `name` by in a ParameterStatus, if it is
/// told at all.
pub fn reported_name(name: &str) -> Option<&'static str> {
    find(name).filter(|p| p.reported).map(|p| p.name)
}

/// `value` of `name` as it is kept, or why it cannot be set.
pub fn check(name: &str, value: &str) -> Result<String> {
    let Some(param) = find(name) else {
        if name.contains('.') {
            return Ok(value.to_string());
        }
        return Err(ServerError::UndefinedObject(format!(
            "unrecognized configuration parameter \"{name}\""
        )));
    };
    let invalid = |what: &str| {
        ServerError::InvalidParameter(format!(
            "invalid value for parameter \"{}\": \"{value}\"{what}",
            param.name
        ))
    };
    match &param.check {
        Check::Any => Ok(value.to_string()),
        Check::ReadOnly => Err(ServerError::CantChangeParameter(format!(
            "parameter \"{}\" cannot be changed",
            param.name
        ))),
        Check::Bool => match parse_bool(value) {
            Some(b) => Ok(if b { "on" } else { "off" }.to_string()),
            None => Err(ServerError::InvalidParameter(format!(
                "parameter \"{}\" requires a Boolean value",
                param.name
            ))),
        },
        Check::OneOf(allowed) => {
            let v = value.trim().to_lowercase();
            if let Some(a) = allowed.iter().find(|a| **a == v) {
                return Ok(a.to_string());
            }
            // A value Postgres has but Weir would not honour.
            let postgres_has = match param.name {
                "IntervalStyle" => &["postgres_verbose", "sql_standard", "iso_8601"][..],
                "standard_conforming_strings" => &["off", "false", "0", "no"][..],
                "bytea_output" => &["escape"][..],
                _ => &[][..],
            };
            if postgres_has.contains(&v.as_str()) {
                return Err(ServerError::unsupported(format!(
                    "{} = {value} (Weir keeps {})",
                    param.name, param.default
                )));
            }
            Err(invalid(&format!(" (one of: {})", allowed.join(", "))))
        }
        Check::Millis => match millis(value) {
            Some(ms) => Ok(if ms == 0 {
                "0".to_string()
            } else if ms % 1000 == 0 {
                format!("{}s", ms / 1000)
            } else {
                format!("{ms}ms")
            }),
            None => Err(invalid(" (a time such as 0, 500, '500ms', '5s', '1min')")),
        },
        Check::Integer(lo, hi) => match value.trim().parse::<i64>() {
            Ok(n) if (*lo..=*hi).contains(&n) => Ok(n.to_string()),
            _ => Err(invalid(&format!(" (an integer from {lo} to {hi})"))),
        },
        Check::With(f) => f(value),
    }
}

/// A duration in milliseconds: `500` (milliseconds, as Postgres reads a
/// bare number for these), `'500ms'`, `'5s'`, `'2min'`, `'1h'`, `'1d'`.
pub fn millis(value: &str) -> Option<i64> {
    let v = value.trim().to_lowercase();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: i64 = v[..split].parse().ok()?;
    let unit = match v[split..].trim() {
        "" | "ms" => 1,
        "s" | "sec" | "secs" | "second" | "seconds" => 1_000,
        "min" | "mins" | "minute" | "minutes" => 60_000,
        "h" | "hour" | "hours" => 3_600_000,
        "d" | "day" | "days" => 86_400_000,
        _ => return None,
    };
    n.checked_mul(unit)
}

fn client_encoding(v: &str) -> Result<String> {
    match v.trim().to_uppercase().replace(['-', '_'], "").as_str() {
        "UTF8" | "UNICODE" => Ok("UTF8".into()),
        _ => Err(ServerError::unsupported(format!(
            "client_encoding {v} (Weir speaks UTF8 only)"
        ))),
    }
}

/// `ISO` with any of Postgres's orders of day, month and year (which only
/// say how ambiguous input is read); the other output styles are not
/// Weir's.
fn date_style(v: &str) -> Result<String> {
    let mut order = "MDY";
    for part in v.split(',').map(|p| p.trim().to_lowercase()) {
        match part.as_str() {
            "iso" | "" => {}
            "mdy" | "us" | "noneuropean" | "non-european" => order = "MDY",
            "dmy" | "european" | "euro" => order = "DMY",
            "ymd" => order = "YMD",
            "sql" | "postgres" | "german" => {
                return Err(ServerError::unsupported(format!(
                    "DateStyle {v} (Weir writes dates as ISO)"
                )));
            }
            _ => {
                return Err(ServerError::InvalidParameter(format!(
                    "invalid value for parameter \"DateStyle\": \"{v}\""
                )));
            }
        }
    }
    Ok(format!("ISO, {order}"))
}

/// The names of UTC; Weir computes and prints times in UTC, so another zone
/// would change answers.
fn time_zone(v: &str) -> Result<String> {
    let t = v.trim();
    let utc = matches!(
        t.to_lowercase().as_str(),
        "utc"
            | "etc/utc"
            | "gmt"
            | "etc/gmt"
            | "uct"
            | "etc/uct"
            | "universal"
            | "etc/universal"
            | "zulu"
            | "etc/zulu"
            | "z"
            | "gmt0"
            | "etc/gmt0"
            | "0"
            | "+0"
            | "-0"
            | "00:00"
            | "+00:00"
            | "-00:00"
            | "+00"
            | "-00"
    );
    if utc {
        Ok(t.to_string())
    } else {
        Err(ServerError::unsupported(format!(
            "TimeZone {t} (Weir works in UTC; set TimeZone to 'UTC')"
        )))
    }
}

/// Weir prints floats in their shortest exact form, which is what Postgres
/// does for any value above 0; 0 and below round, which Weir does not.
fn extra_float_digits(v: &str) -> Result<String> {
    match v.trim().parse::<i32>() {
        Ok(n @ 1..=3) => Ok(n.to_string()),
        Ok(n @ -15..=0) => Err(ServerError::unsupported(format!(
            "extra_float_digits = {n} (Weir writes floats exactly, as for 1 to 3)"
        ))),
        _ => Err(ServerError::InvalidParameter(format!(
            "invalid value for parameter \"extra_float_digits\": \"{v}\" (an integer from -15 to 3)"
        ))),
    }
}

/// `off` or `0` (no TTL), or a number and a unit (`90 s`, `30 min`, `1 hour`,
/// `2 days`; seconds without one): `Some(None)` or `Some(Some(µs))`.
pub fn parse_duration_us(v: &str) -> Option<Option<i64>> {
    let v = v.trim().to_lowercase();
    if v == "off" || v == "0" {
        return Some(None);
    }
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let n: i64 = v[..split].trim().parse().ok().filter(|n| *n > 0)?;
    let unit_s = match v[split..].trim() {
        "" | "s" | "sec" | "secs" | "second" | "seconds" => 1,
        "min" | "mins" | "minute" | "minutes" => 60,
        "h" | "hour" | "hours" => 3_600,
        "d" | "day" | "days" => 86_400,
        _ => return None,
    };
    n.checked_mul(unit_s)?.checked_mul(1_000_000).map(Some)
}

/// A boolean setting's value, as Postgres spells them (`on`, `true`, `1`, …).
pub fn parse_bool(v: &str) -> Option<bool> {
    match v.to_lowercase().as_str() {
        "on" | "true" | "yes" | "1" | "t" => Some(true),
        "off" | "false" | "no" | "0" | "f" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_kept_as_postgres_prints_them_or_refused() {
        assert_eq!(check("datestyle", "iso, dmy").unwrap(), "ISO, DMY");
        assert_eq!(check("DateStyle", "ISO").unwrap(), "ISO, MDY");
        assert_eq!(check("statement_timeout", "1500").unwrap(), "1500ms");
        assert_eq!(check("statement_timeout", "2min").unwrap(), "120s");
        assert_eq!(check("client_encoding", "utf-8").unwrap(), "UTF8");
        assert_eq!(check("timezone", "Etc/UTC").unwrap(), "Etc/UTC");
        assert_eq!(check("jit", "false").unwrap(), "off");
        assert_eq!(check("myext.knob", "7").unwrap(), "7");
        let state = |name: &str, value: &str| check(name, value).unwrap_err().sqlstate();
        assert_eq!(state("timezone", "Europe/Berlin"), "0A000");
        assert_eq!(state("datestyle", "German"), "0A000");
        assert_eq!(state("datestyle", "nonsense"), "22023");
        assert_eq!(state("client_encoding", "LATIN1"), "0A000");
        assert_eq!(state("standard_conforming_strings", "off"), "0A000");
        assert_eq!(state("extra_float_digits", "0"), "0A000");
        assert_eq!(state("extra_float_digits", "9"), "22023");
        assert_eq!(state("server_version_num", "1"), "55P02");
        assert_eq!(state("no_such_setting", "1"), "42704");
    }
}

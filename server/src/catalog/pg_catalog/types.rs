//! The types of `pg_type`, with Postgres's oids, and the mapping from a
//! Weir column's type to its oid and modifier (`atttypmod`).

use datafusion::arrow::datatypes::DataType;
use datafusion::sql::sqlparser::ast::{
    CharacterLength, DataType as SqlType, ExactNumberInfo, TimezoneInfo,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

/// One row of `pg_type` for a base or pseudo type; its array type is
/// derived.
pub(super) struct PgType {
    pub oid: i32,
    pub name: &'static str,
    /// As `format_type` writes it.
    pub sql_name: &'static str,
    pub len: i16,
    pub byval: bool,
    pub category: &'static str,
    pub align: &'static str,
    /// The prefix of its I/O functions (`bool` → `boolin`, `date_` →
    /// `date_in`).
    pub io: &'static str,
    /// Its array type's oid (0: none).
    pub array: i32,
    /// Pseudo type (`p`) rather than base (`b`).
    pub pseudo: bool,
    /// Collatable: `text` and its kin take the default collation.
    pub collatable: bool,
    /// An array of this type of elements (int2vector, oidvector).
    pub elem: i32,
}

/// One row of [`TYPES`], its fields in `pg_type`'s order.
#[allow(clippy::too_many_arguments)]
const fn t(
    oid: i32,
    name: &'static str,
    sql_name: &'static str,
    len: i16,
    byval: bool,
    category: &'static str,
    align: &'static str,
    io: &'static str,
    array: i32,
) -> PgType {
    PgType {
        oid,
        name,
        sql_name,
        len,
        byval,
        category,
        align,
        io,
        array,
        pseudo: false,
        collatable: false,
        elem: 0,
    }
}

const fn collatable(mut ty: PgType) -> PgType {
    ty.collatable = true;
    ty
}

const fn pseudo(mut ty: PgType) -> PgType {
    ty.pseudo = true;
    ty
}

const fn vector(mut ty: PgType, elem: i32) -> PgType {
    ty.elem = elem;
    ty
}

pub(super) const BOOL: i32 = 16;
pub(super) const BYTEA: i32 = 17;
pub(super) const NAME: i32 = 19;
pub(super) const INT8: i32 = 20;
pub(super) const INT2: i32 = 21;
pub(super) const INT4: i32 = 23;
pub(super) const TEXT: i32 = 25;
pub(super) const OID: i32 = 26;
pub(super) const FLOAT4: i32 = 700;
pub(super) const FLOAT8: i32 = 701;
pub(super) const BPCHAR: i32 = 1042;
pub(super) const VARCHAR: i32 = 1043;
pub(super) const DATE: i32 = 1082;
pub(super) const TIME: i32 = 1083;
pub(super) const TIMESTAMP: i32 = 1114;
pub(super) const TIMESTAMPTZ: i32 = 1184;
pub(super) const INTERVAL: i32 = 1186;
pub(super) const NUMERIC: i32 = 1700;
pub(super) const JSON: i32 = 114;
pub(super) const JSONB: i32 = 3802;

/// The types Weir's columns have, and those its catalogs use.
pub(super) const TYPES: &[PgType] = &[
    t(BOOL, "bool", "boolean", 1, true, "B", "c", "bool", 1000),
    t(BYTEA, "bytea", "bytea", -1, false, "U", "i", "bytea", 1001),
    collatable(t(18, "char", "\"char\"", 1, true, "Z", "c", "char", 1002)),
    collatable(t(NAME, "name", "name", 64, false, "S", "c", "name", 1003)),
    t(INT8, "int8", "bigint", 8, true, "N", "d", "int8", 1016),
    t(INT2, "int2", "smallint", 2, true, "N", "s", "int2", 1005),
    vector(
        t(
            22,
            "int2vector",
            "int2vector",
            -1,
            false,
            "A",
            "i",
            "int2vector",
            1006,
        ),
        INT2,
    ),
    t(INT4, "int4", "integer", 4, true, "N", "i", "int4", 1007),
    t(24, "regproc", "regproc", 4, true, "N", "i", "regproc", 1008),
    collatable(t(TEXT, "text", "text", -1, false, "S", "i", "text", 1009)),
    t(OID, "oid", "oid", 4, true, "N", "i", "oid", 1028),
    vector(
        t(
            30,
            "oidvector",
            "oidvector",
            -1,
            false,
            "A",
            "i",
            "oidvector",
            1013,
        ),
        OID,
    ),
    t(JSON, "json", "json", -1, false, "U", "i", "json_", 199),
    t(FLOAT4, "float4", "real", 4, true, "N", "i", "float4", 1021),
    t(
        FLOAT8,
        "float8",
        "double precision",
        8,
        true,
        "N",
        "d",
        "float8",
        1022,
    ),
    pseudo(t(
        705, "unknown", "unknown", -2, false, "X", "c", "unknown", 0,
    )),
    collatable(t(
        BPCHAR,
        "bpchar",
        "character",
        -1,
        false,
        "S",
        "i",
        "bpchar",
        1014,
    )),
    collatable(t(
        VARCHAR,
        "varchar",
        "character varying",
        -1,
        false,
        "S",
        "i",
        "varchar",
        1015,
    )),
    t(DATE, "date", "date", 4, true, "D", "i", "date_", 1182),
    t(
        TIME,
        "time",
        "time without time zone",
        8,
        true,
        "D",
        "d",
        "time_",
        1183,
    ),
    t(
        TIMESTAMP,
        "timestamp",
        "timestamp without time zone",
        8,
        true,
        "D",
        "d",
        "timestamp_",
        1115,
    ),
    t(
        TIMESTAMPTZ,
        "timestamptz",
        "timestamp with time zone",
        8,
        true,
        "D",
        "d",
        "timestamptz_",
        1185,
    ),
    t(
        INTERVAL,
        "interval",
        "interval",
        16,
        false,
        "T",
        "d",
        "interval_",
        1187,
    ),
    t(
        NUMERIC, "numeric", "numeric", -1, false, "N", "i", "numeric_", 1231,
    ),
    t(
        2205, "regclass", "regclass", 4, true, "N", "i", "regclass", 2210,
    ),
    t(
        2206, "regtype", "regtype", 4, true, "N", "i", "regtype", 2211,
    ),
    t(2950, "uuid", "uuid", 16, false, "U", "c", "uuid_", 2951),
    t(JSONB, "jsonb", "jsonb", -1, false, "U", "i", "jsonb_", 3807),
    t(
        4089,
        "regnamespace",
        "regnamespace",
        4,
        true,
        "N",
        "i",
        "regnamespace",
        4090,
    ),
    t(
        4096, "regrole", "regrole", 4, true, "N", "i", "regrole", 4097,
    ),
    pseudo(t(
        2249, "record", "record", -1, false, "P", "d", "record_", 2287,
    )),
    pseudo(t(2278, "void", "void", 4, true, "P", "i", "void_", 0)),
];

/// The base type with this oid.
pub(super) fn by_oid(oid: i32) -> Option<&'static PgType> {
    TYPES.iter().find(|t| t.oid == oid)
}

/// The base type whose array type has this oid.
pub(super) fn by_array_oid(oid: i32) -> Option<&'static PgType> {
    TYPES.iter().find(|t| t.array == oid && oid != 0)
}

/// `format_type(oid, typmod)`: the type's SQL name with its modifier.
pub(super) fn format_type(oid: i32, typmod: i32) -> Option<String> {
    if let Some(elem) = by_array_oid(oid) {
        return format_type(elem.oid, typmod).map(|s| format!("{s}[]"));
    }
    let ty = by_oid(oid)?;
    let modifier = match oid {
        NUMERIC if typmod >= 4 => {
            let m = typmod - 4;
            format!("({},{})", m >> 16, m & 0xffff)
        }
        VARCHAR | BPCHAR if typmod >= 4 => format!("({})", typmod - 4),
        _ => String::new(),
    };
    Some(format!("{}{modifier}", ty.sql_name))
}

/// The oid and `atttypmod` of a column of this Arrow type.
pub(super) fn of_arrow(t: &DataType) -> (i32, i32) {
    match t {
        DataType::Boolean => (BOOL, -1),
        DataType::Int8 | DataType::Int16 | DataType::UInt8 => (INT2, -1),
        DataType::Int32 | DataType::UInt16 => (INT4, -1),
        DataType::Int64 | DataType::UInt32 => (INT8, -1),
        DataType::UInt64 => (NUMERIC, -1),
        DataType::Float16 | DataType::Float32 => (FLOAT4, -1),
        DataType::Float64 => (FLOAT8, -1),
        DataType::Decimal128(p, s) => (NUMERIC, numeric_typmod(*p as i32, *s as i32)),
        DataType::LargeUtf8 => (JSONB, -1),
        DataType::Utf8 | DataType::Utf8View => (TEXT, -1),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => (BYTEA, -1),
        DataType::Date32 | DataType::Date64 => (DATE, -1),
        DataType::Time32(_) | DataType::Time64(_) => (TIME, -1),
        DataType::Timestamp(_, None) => (TIMESTAMP, -1),
        DataType::Timestamp(_, Some(_)) => (TIMESTAMPTZ, -1),
        DataType::Interval(_) | DataType::Duration(_) => (INTERVAL, -1),
        DataType::List(f) | DataType::LargeList(f) => {
            let (elem, typmod) = of_arrow(f.data_type());
            (by_oid(elem).map_or(1009, |t| t.array), typmod)
        }
        _ => (TEXT, -1),
    }
}

fn numeric_typmod(p: i32, s: i32) -> i32 {
    ((p << 16) | s) + 4
}

/// The oid and `atttypmod` of a column declared with this type (as the
/// catalog stores it): `varchar(20)` keeps its length, which the Arrow
/// type does not.
pub(super) fn of_declared(sql_type: &str) -> Option<(i32, i32)> {
    let ty = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql_type)
        .ok()?
        .parse_data_type()
        .ok()?;
    let length = |l: &Option<CharacterLength>| match l {
        Some(CharacterLength::IntegerLength { length, .. }) => *length as i32 + 4,
        _ => -1,
    };
    Some(match &ty {
        SqlType::Varchar(l) | SqlType::CharacterVarying(l) | SqlType::CharVarying(l) => {
            (VARCHAR, length(l))
        }
        SqlType::Char(l) | SqlType::Character(l) => (BPCHAR, length(l).max(5)),
        SqlType::Numeric(info) | SqlType::Decimal(info) | SqlType::Dec(info) => match info {
            ExactNumberInfo::None => (NUMERIC, -1),
            ExactNumberInfo::Precision(p) => (NUMERIC, numeric_typmod(*p as i32, 0)),
            ExactNumberInfo::PrecisionAndScale(p, s) => {
                (NUMERIC, numeric_typmod(*p as i32, *s as i32))
            }
        },
        SqlType::Timestamp(_, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => (TIMESTAMPTZ, -1),
        _ => of_arrow(&crate::sql::types::arrow_type(&ty).ok()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_types_keep_their_modifiers() {
        let f = |s: &str| {
            let (oid, m) = of_declared(s).unwrap();
            format_type(oid, m).unwrap()
        };
        assert_eq!(f("numeric(10,2)"), "numeric(10,2)");
        assert_eq!(f("varchar(20)"), "character varying(20)");
        assert_eq!(f("char"), "character(1)");
        assert_eq!(f("int"), "integer");
        assert_eq!(f("bigint"), "bigint");
        assert_eq!(f("text"), "text");
        assert_eq!(f("timestamptz"), "timestamp with time zone");
        assert_eq!(f("timestamp"), "timestamp without time zone");
        assert_eq!(f("double precision"), "double precision");
        assert_eq!(format_type(1007, -1).unwrap(), "integer[]");
    }
}

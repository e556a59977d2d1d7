//! `jsonb`, Postgres's JSON type, with its operators and functions.
//!
//! Arrow has no JSON type, so Weir gives `jsonb` one Arrow type of its own,
//! `LargeUtf8`, which nothing else in Weir produces: a column's type says
//! it is `jsonb` through every layer (catalog, state, exchange, pgwire)
//! without metadata that expressions could drop. The value is stored as its
//! canonical text ([`value`]), so equality, grouping and joins are those of
//! the text.
//!
//! - `'…'::jsonb`, and every text DataFusion coerces to `jsonb` (an
//!   `INSERT`, `j = '{"a": 1}'`, `COALESCE(j, '{}')`), is read and
//!   canonicalized by `weir_jsonb_in` ([`JsonbInput`], an analyzer rule);
//!   a cast of another type to `jsonb` is refused, as in Postgres.
//! - `->`, `->>`, `#>`, `#>>`, `@>`, `<@`, `?`, `?|`, `?&`, `||` and `-` on
//!   a `jsonb` become calls of this module's functions ([`JsonbOperators`],
//!   consulted by DataFusion's SQL planner before its own planners);
//!   `<`, `<=`, `>`, `>=` and `ORDER BY` ([`JsonbOrder`]) compare
//!   `weir_jsonb_sort_key`s, bytes in Postgres's order of jsonb values.
//! - `to_jsonb`, `jsonb_build_object`, `jsonb_build_array`,
//!   `jsonb_typeof`, `jsonb_array_length`, `jsonb_extract_path[_text]`,
//!   `jsonb_strip_nulls`, `jsonb_pretty` and `jsonb_set` are functions here.
//!   The aggregates `jsonb_agg` and `jsonb_object_agg` and the
//!   set-returning `jsonb_array_elements[_text]` and `jsonb_object_keys` are
//!   spelled by the server's query rewrite with `array_agg` and `unnest`
//!   around the `weir_jsonb_…` helpers here, so that views maintain them
//!   with the operators they already have.

use std::sync::Arc;

use crate::PlanError;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, BinaryBuilder, BooleanBuilder, Int32Builder, LargeStringBuilder,
    ListBuilder, StringBuilder,
};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, FieldRef};
use datafusion::arrow::error::ArrowError;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, ExprSchema, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::planner::{ExprPlanner, PlannerResult, RawBinaryExpr, TypePlanner};
use datafusion::logical_expr::{
    Cast, ColumnarValue, Expr, ExprSchemable, LogicalPlan, ScalarFunctionArgs, ScalarUDF,
    ScalarUDFImpl, Signature, SortExpr, TryCast, Volatility,
};
use datafusion::optimizer::AnalyzerRule;
use datafusion::sql::sqlparser::ast::{BinaryOperator, DataType as SqlType};

mod to_json;
pub mod value;

use value::{Json, ReadError};

/// The Arrow type Weir stores `jsonb` as.
pub const JSONB: DataType = DataType::LargeUtf8;

/// Whether values of `t` are `jsonb`.
pub fn is_jsonb(t: &DataType) -> bool {
    *t == JSONB
}

/// The functions of this module, by the names SQL calls them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum F {
    /// `weir_jsonb_in(text)`: text read as `jsonb`.
    In,
    /// `j -> key | position`.
    Get,
    /// `j ->> key | position`.
    GetText,
    /// `j #> path` (one `text[]`).
    PathOp,
    /// `j #>> path`.
    PathTextOp,
    /// `jsonb_extract_path(j, VARIADIC keys)`.
    Path,
    /// `jsonb_extract_path_text`.
    PathText,
    /// `a @> b` (`b <@ a`).
    Contains,
    /// `j ? key`, `j ?| keys`, `j ?& keys`.
    Exists,
    ExistsAny,
    ExistsAll,
    /// `a || b`.
    Concat,
    /// `j - key | position | keys`.
    Delete,
    ToJsonb,
    BuildObject,
    BuildArray,
    TypeOf,
    ArrayLength,
    StripNulls,
    Pretty,
    Set,
    /// `jsonb_insert(j, path, new [, insert_after])`.
    Insert,
    /// `j #- path` (`jsonb_delete_path`).
    DeletePath,
    /// The elements of an array, as a list `unnest` makes rows of.
    ArrayElements,
    ArrayElementsText,
    ObjectKeys,
    /// `jsonb_each[_text]`'s keys and values, as lists.
    EachKeys,
    EachValues,
    EachValuesText,
    /// `jsonb_agg`'s result from `array_agg(to_jsonb(x))`.
    AggFinish,
    /// `jsonb_object_agg`'s from `array_agg(jsonb_build_array(k, v))`.
    ObjectAggFinish,
    /// Bytes in Postgres's order of `jsonb` values, for `ORDER BY` and
    /// `<` (see [`value::Json::sort_key`]).
    SortKey,
}

const ALL: &[F] = &[
    F::In,
    F::Get,
    F::GetText,
    F::PathOp,
    F::PathTextOp,
    F::Path,
    F::PathText,
    F::Contains,
    F::Exists,
    F::ExistsAny,
    F::ExistsAll,
    F::Concat,
    F::Delete,
    F::ToJsonb,
    F::BuildObject,
    F::BuildArray,
    F::TypeOf,
    F::ArrayLength,
    F::StripNulls,
    F::Pretty,
    F::Set,
    F::Insert,
    F::DeletePath,
    F::ArrayElements,
    F::ArrayElementsText,
    F::ObjectKeys,
    F::EachKeys,
    F::EachValues,
    F::EachValuesText,
    F::AggFinish,
    F::ObjectAggFinish,
    F::SortKey,
];

impl F {
    fn name(self) -> &'static str {
        match self {
            F::In => "weir_jsonb_in",
            F::Get => "weir_jsonb_get",
            F::GetText => "weir_jsonb_get_text",
            F::PathOp => "weir_jsonb_path",
            F::PathTextOp => "weir_jsonb_path_text",
            F::Path => "jsonb_extract_path",
            F::PathText => "jsonb_extract_path_text",
            F::Contains => "jsonb_contains",
            F::Exists => "jsonb_exists",
            F::ExistsAny => "jsonb_exists_any",
            F::ExistsAll => "jsonb_exists_all",
            F::Concat => "jsonb_concat",
            F::Delete => "weir_jsonb_delete",
            F::ToJsonb => "to_jsonb",
            F::BuildObject => "jsonb_build_object",
            F::BuildArray => "jsonb_build_array",
            F::TypeOf => "jsonb_typeof",
            F::ArrayLength => "jsonb_array_length",
            F::StripNulls => "jsonb_strip_nulls",
            F::Pretty => "jsonb_pretty",
            F::Set => "jsonb_set",
            F::Insert => "jsonb_insert",
            F::DeletePath => "jsonb_delete_path",
            F::ArrayElements => "weir_jsonb_array_elements",
            F::ArrayElementsText => "weir_jsonb_array_elements_text",
            F::ObjectKeys => "weir_jsonb_object_keys",
            F::EachKeys => "weir_jsonb_each_keys",
            F::EachValues => "weir_jsonb_each_values",
            F::EachValuesText => "weir_jsonb_each_values_text",
            F::AggFinish => "weir_jsonb_agg_finish",
            F::ObjectAggFinish => "weir_jsonb_object_agg_finish",
            F::SortKey => "weir_jsonb_sort_key",
        }
    }

    fn return_type(self) -> DataType {
        let list = |t: DataType| DataType::List(Arc::new(Field::new("item", t, true)));
        match self {
            F::GetText | F::PathText | F::PathTextOp | F::TypeOf | F::Pretty => DataType::Utf8,
            F::Contains | F::Exists | F::ExistsAny | F::ExistsAll => DataType::Boolean,
            F::ArrayLength => DataType::Int32,
            F::SortKey => DataType::Binary,
            F::ArrayElements | F::EachValues => list(JSONB),
            F::ArrayElementsText | F::ObjectKeys | F::EachKeys | F::EachValuesText => {
                list(DataType::Utf8)
            }
            _ => JSONB,
        }
    }

    /// How many arguments it takes.
    fn arity(self) -> std::ops::RangeInclusive<usize> {
        match self {
            F::In
            | F::ToJsonb
            | F::TypeOf
            | F::ArrayLength
            | F::StripNulls
            | F::Pretty
            | F::ArrayElements
            | F::ArrayElementsText
            | F::ObjectKeys
            | F::EachKeys
            | F::EachValues
            | F::EachValuesText
            | F::AggFinish
            | F::ObjectAggFinish
            | F::SortKey => 1..=1,
            F::Path | F::PathText => 1..=usize::MAX,
            F::BuildObject | F::BuildArray => 0..=usize::MAX,
            F::Set | F::Insert => 3..=4,
            _ => 2..=2,
        }
    }
}

/// The UDFs of this module.
pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    ALL.iter().map(|f| udf(*f)).collect()
}

fn udf(f: F) -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(JsonbFn {
        f,
        signature: Signature::variadic_any(Volatility::Immutable),
    }))
}

fn call(f: F, args: Vec<Expr>) -> Expr {
    Expr::ScalarFunction(ScalarFunction::new_udf(udf(f), args))
}

/// `jsonb` in a cast (`'{}'::jsonb`, `CAST(x AS jsonb)`) and in `CREATE
/// TABLE` column types, for DataFusion's SQL planner.
#[derive(Debug, Default)]
pub struct JsonbType;

impl TypePlanner for JsonbType {
    fn plan_type_field(&self, sql_type: &SqlType) -> Result<Option<FieldRef>> {
        Ok(match sql_type {
            SqlType::JSONB => Some(Arc::new(Field::new("jsonb", JSONB, true))),
            _ => None,
        })
    }
}

/// The analyzer rule that reads text cast to `jsonb` (see the module's
/// docs); it runs after DataFusion's type coercion, which adds such casts.
#[derive(Debug, Default)]
pub(crate) struct JsonbInput;

impl AnalyzerRule for JsonbInput {
    fn name(&self) -> &str {
        "weir_jsonb_input"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite_cast)
    }
}

fn rewrite_cast(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    let inner = match &e {
        Expr::Cast(Cast { expr, field }) | Expr::TryCast(TryCast { expr, field })
            if is_jsonb(field.data_type()) =>
        {
            expr
        }
        _ => return Ok(Transformed::no(e)),
    };
    match inner.get_type(schema as &dyn ExprSchema)? {
        DataType::Utf8 | DataType::Utf8View => {
            Ok(Transformed::yes(call(F::In, vec![inner.as_ref().clone()])))
        }
        DataType::LargeUtf8 | DataType::Null => Ok(Transformed::no(e)),
        other => Err(DataFusionError::Plan(format!(
            "cannot cast type {} to jsonb",
            type_name(&other)
        ))),
    }
}

/// `ORDER BY` a `jsonb` (of a query, a window, an aggregate's own) sorts
/// in Postgres's order of `jsonb` values: by [`F::SortKey`] of it.
#[derive(Debug, Default)]
pub(crate) struct JsonbOrder;

impl AnalyzerRule for JsonbOrder {
    fn name(&self) -> &str {
        "weir_jsonb_order"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan_and_sorts(plan, sort_key_of, order_in_calls)
    }
}

/// The sort key of a `jsonb` expression; `None` for another type.
fn sort_key_of(e: &Expr, schema: &DFSchema) -> Option<Expr> {
    e.get_type(schema as &dyn ExprSchema)
        .is_ok_and(|t| is_jsonb(&t))
        .then(|| call(F::SortKey, vec![e.clone()]))
}

/// Sorts `s` by the sort key of its `jsonb` expression; whether it did.
fn by_sort_key(s: &mut SortExpr, schema: &DFSchema) -> bool {
    match sort_key_of(&s.expr, schema) {
        Some(e) => {
            s.expr = e;
            true
        }
        None => false,
    }
}

/// The `ORDER BY` of a window function or an aggregate call.
fn order_in_calls(e: Expr, schema: &DFSchema) -> Result<Transformed<Expr>> {
    Ok(match e {
        Expr::WindowFunction(mut w) => {
            let mut changed = false;
            for s in w.params.order_by.iter_mut() {
                changed |= by_sort_key(s, schema);
            }
            if changed {
                Transformed::yes(Expr::WindowFunction(w))
            } else {
                Transformed::no(Expr::WindowFunction(w))
            }
        }
        Expr::AggregateFunction(mut a) => {
            let mut changed = false;
            for s in a.params.order_by.iter_mut() {
                changed |= by_sort_key(s, schema);
            }
            if changed {
                Transformed::yes(Expr::AggregateFunction(a))
            } else {
                Transformed::no(Expr::AggregateFunction(a))
            }
        }
        other => Transformed::no(other),
    })
}

/// `->`, `->>` and the other operators on `jsonb` (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct JsonbOperators;

impl ExprPlanner for JsonbOperators {
    fn plan_binary_op(
        &self,
        expr: RawBinaryExpr,
        schema: &DFSchema,
    ) -> Result<PlannerResult<RawBinaryExpr>> {
        let jsonb = |e: &Expr| {
            e.get_type(schema as &dyn ExprSchema)
                .is_ok_and(|t| is_jsonb(&t))
        };
        let literal_text = |e: &Expr| {
            matches!(
                e,
                Expr::Literal(ScalarValue::Utf8(_) | ScalarValue::Utf8View(_), _)
            )
        };
        let (l, r) = (expr.left.clone(), expr.right.clone());
        let comparable = |a: &Expr, b: &Expr| jsonb(a) && (jsonb(b) || literal_text(b));
        if matches!(
            expr.op,
            BinaryOperator::Lt | BinaryOperator::LtEq | BinaryOperator::Gt | BinaryOperator::GtEq
        ) && (comparable(&l, &r) || comparable(&r, &l))
        {
            // Postgres's order of jsonb values, not their texts'.
            return Ok(PlannerResult::Original(RawBinaryExpr {
                op: expr.op,
                left: call(F::SortKey, vec![l]),
                right: call(F::SortKey, vec![r]),
            }));
        }
        let planned = match expr.op {
            BinaryOperator::ArrowAt if jsonb(&r) => call(F::Contains, vec![r, l]),
            BinaryOperator::StringConcat
                if (jsonb(&l) && (jsonb(&r) || literal_text(&r)))
                    || (jsonb(&r) && literal_text(&l)) =>
            {
                call(F::Concat, vec![l, r])
            }
            _ if !jsonb(&l) => return Ok(PlannerResult::Original(expr)),
            BinaryOperator::Arrow => call(F::Get, vec![l, r]),
            BinaryOperator::LongArrow => call(F::GetText, vec![l, r]),
            BinaryOperator::HashArrow => call(F::PathOp, vec![l, r]),
            BinaryOperator::HashLongArrow => call(F::PathTextOp, vec![l, r]),
            BinaryOperator::AtArrow => call(F::Contains, vec![l, r]),
            BinaryOperator::Question => call(F::Exists, vec![l, r]),
            BinaryOperator::QuestionPipe => call(F::ExistsAny, vec![l, r]),
            BinaryOperator::QuestionAnd => call(F::ExistsAll, vec![l, r]),
            BinaryOperator::Minus => call(F::Delete, vec![l, r]),
            BinaryOperator::HashMinus => call(F::DeletePath, vec![l, r]),
            _ => return Ok(PlannerResult::Original(expr)),
        };
        Ok(PlannerResult::Planned(planned))
    }
}

/// A `jsonb` function.
#[derive(Debug, PartialEq, Eq, Hash)]
struct JsonbFn {
    f: F,
    signature: Signature,
}

impl ScalarUDFImpl for JsonbFn {
    fn name(&self) -> &str {
        self.f.name()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, args: &[DataType]) -> Result<DataType> {
        if !self.f.arity().contains(&args.len()) {
            return Err(DataFusionError::Plan(format!(
                "no function matches {}({})",
                self.f.name(),
                args.iter().map(type_name).collect::<Vec<_>>().join(", ")
            )));
        }
        Ok(self.f.return_type())
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let rows = args.number_rows;
        let scalar = args
            .args
            .iter()
            .all(|a| matches!(a, ColumnarValue::Scalar(_)));
        let n = if scalar { 1 } else { rows };
        let arrays: Vec<ArrayRef> = args
            .args
            .iter()
            .map(|a| a.to_array(n))
            .collect::<Result<_>>()?;
        let out = eval(self.f, &arrays, n)?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(out)
        })
    }
}

/// One row's result.
enum Out {
    Null,
    Json(Json),
    Text(String),
    Bool(bool),
    Int(i32),
    Jsons(Vec<Json>),
    Texts(Vec<Option<String>>),
    Bytes(Vec<u8>),
}

fn eval(f: F, args: &[ArrayRef], rows: usize) -> Result<ArrayRef> {
    let mut results = Vec::with_capacity(rows);
    for i in 0..rows {
        results.push(row(f, args, i)?);
    }
    Ok(match f.return_type() {
        DataType::Utf8 => {
            let mut b = StringBuilder::with_capacity(rows, rows * 8);
            for r in results {
                match r {
                    Out::Text(s) => b.append_value(s),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Boolean => {
            let mut b = BooleanBuilder::with_capacity(rows);
            for r in results {
                match r {
                    Out::Bool(v) => b.append_value(v),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Binary => {
            let mut b = BinaryBuilder::with_capacity(rows, rows * 16);
            for r in results {
                match r {
                    Out::Bytes(v) => b.append_value(v),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        DataType::Int32 => {
            let mut b = Int32Builder::with_capacity(rows);
            for r in results {
                match r {
                    Out::Int(v) => b.append_value(v),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
        DataType::List(item) if is_jsonb(item.data_type()) => {
            let mut b = ListBuilder::new(LargeStringBuilder::new());
            for r in results {
                match r {
                    Out::Jsons(items) => {
                        for item in items {
                            b.values().append_value(item.to_string());
                        }
                        b.append(true);
                    }
                    _ => b.append(false),
                }
            }
            Arc::new(b.finish())
        }
        DataType::List(_) => {
            let mut b = ListBuilder::new(StringBuilder::new());
            for r in results {
                match r {
                    Out::Texts(items) => {
                        for item in items {
                            b.values().append_option(item);
                        }
                        b.append(true);
                    }
                    _ => b.append(false),
                }
            }
            Arc::new(b.finish())
        }
        _ => {
            let mut b = LargeStringBuilder::with_capacity(rows, rows * 16);
            for r in results {
                match r {
                    Out::Json(j) => b.append_value(j.to_string()),
                    _ => b.append_null(),
                }
            }
            Arc::new(b.finish())
        }
    })
}

/// Postgres's error for text that is no `jsonb`.
pub(crate) fn read_error(e: ReadError) -> DataFusionError {
    match e {
        ReadError::Syntax(_) => DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(
                "invalid input syntax for type json".into(),
            )),
            None,
        ),
        ReadError::NulCharacter => DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(
                "unsupported Unicode escape sequence: \\u0000 cannot be converted to text".into(),
            )),
            None,
        ),
        ReadError::NumberOutOfRange => DataFusionError::ArrowError(
            Box::new(ArrowError::ArithmeticOverflow(
                "value overflows numeric format".into(),
            )),
            None,
        ),
        ReadError::TooDeep => PlanError::StatementTooComplex(format!(
            "stack depth limit exceeded: jsonb nested deeper than {} levels",
            value::MAX_DEPTH
        ))
        .into_datafusion(),
    }
}

/// A `jsonb` function given a value it does not take: Postgres's `22023`
/// (invalid parameter value), told by its type.
fn invalid(message: impl Into<String>) -> DataFusionError {
    PlanError::InvalidParameter(message.into()).into_datafusion()
}

/// Whether row `i` of `a` is NULL (every row of a `NULL` literal's array
/// is, which `Array::is_null` does not say).
pub(crate) fn null_at(a: &ArrayRef, i: usize) -> bool {
    a.logical_nulls().is_some_and(|n| n.is_null(i))
}

/// Row `i` of `a` as text, however it is stored.
pub(crate) fn text_of(a: &ArrayRef, i: usize) -> Result<String> {
    let one = a.slice(i, 1);
    let t = cast(&one, &DataType::Utf8)?;
    Ok(t.as_string::<i32>().value(0).to_owned())
}

/// Row `i` of a `jsonb` argument (text is read as `jsonb`, as Postgres
/// reads an untyped literal); `None` for NULL.
fn json_arg(a: &ArrayRef, i: usize) -> Result<Option<Json>> {
    if null_at(a, i) {
        return Ok(None);
    }
    let text = match a.data_type() {
        DataType::LargeUtf8 => a.as_string::<i64>().value(i),
        DataType::Utf8 => a.as_string::<i32>().value(i),
        DataType::Utf8View => a.as_string_view().value(i),
        other => {
            return Err(DataFusionError::Plan(format!(
                "no operator or function takes jsonb and {}",
                type_name(other)
            )));
        }
    };
    Json::parse(text).map(Some).map_err(read_error)
}

/// A key or position argument.
enum Step {
    Key(String),
    Position(i64),
}

fn step_arg(a: &ArrayRef, i: usize) -> Result<Option<Step>> {
    if null_at(a, i) {
        return Ok(None);
    }
    Ok(Some(if a.data_type().is_integer() {
        Step::Position(text_of(a, i)?.parse().map_err(|_| {
            DataFusionError::Internal("integer argument of a jsonb operator".into())
        })?)
    } else {
        Step::Key(text_of(a, i)?)
    }))
}

/// A `text[]` argument: an array, or the text of one (`'{a,b}'`).
/// An optional boolean argument at row `i` (`jsonb_set`'s
/// `create_if_missing`, `jsonb_insert`'s `insert_after`): `default` when
/// it is not given, `None` when it is NULL (the call is NULL).
fn flag_arg(a: Option<&ArrayRef>, i: usize, default: bool) -> Result<Option<bool>> {
    match a {
        Some(c) if null_at(c, i) => Ok(None),
        Some(c) => Ok(Some(text_of(c, i)? == "true")),
        None => Ok(Some(default)),
    }
}

fn texts_arg(a: &ArrayRef, i: usize) -> Result<Option<Vec<String>>> {
    if null_at(a, i) {
        return Ok(None);
    }
    match a.data_type() {
        DataType::List(_) | DataType::LargeList(_) => {
            let items = match a.data_type() {
                DataType::List(_) => a.as_list::<i32>().value(i),
                _ => a.as_list::<i64>().value(i),
            };
            let items = cast(&items, &DataType::Utf8)?;
            let items = items.as_string::<i32>();
            // A NULL element matches nothing.
            Ok(Some(
                items
                    .iter()
                    .map(|s| s.map(str::to_owned).unwrap_or_default())
                    .collect(),
            ))
        }
        _ => parse_text_array(&text_of(a, i)?).map(Some),
    }
}

/// Postgres's text of a one-dimensional `text[]`: `{a,"b c",\"}`.
fn parse_text_array(s: &str) -> Result<Vec<String>> {
    let bad = || {
        DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(format!(
                "malformed array literal: \"{s}\""
            ))),
            None,
        )
    };
    let inner = s
        .trim()
        .strip_prefix('{')
        .and_then(|r| r.strip_suffix('}'))
        .ok_or_else(bad)?;
    let mut out = Vec::new();
    if inner.trim().is_empty() {
        return Ok(out);
    }
    let mut chars = inner.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let mut item = String::new();
        if chars.peek() == Some(&'"') {
            chars.next();
            loop {
                match chars.next().ok_or_else(bad)? {
                    '"' => break,
                    '\\' => item.push(chars.next().ok_or_else(bad)?),
                    c => item.push(c),
                }
            }
            while chars.peek().is_some_and(|c| c.is_whitespace()) {
                chars.next();
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ',' {
                    break;
                }
                chars.next();
                if c == '\\' {
                    item.push(chars.next().ok_or_else(bad)?);
                } else {
                    item.push(c);
                }
            }
            item = item.trim_end().to_owned();
            if item.is_empty() || item.contains(['{', '}', '"']) {
                return Err(bad());
            }
        }
        out.push(item);
        match chars.next() {
            None => return Ok(out),
            Some(',') => {}
            Some(_) => return Err(bad()),
        }
    }
}

/// The path of `jsonb_extract_path`: each key an argument.
fn keys_of(keys: &[ArrayRef], i: usize) -> Result<Option<Vec<String>>> {
    keys.iter()
        .map(|k| {
            if null_at(k, i) {
                Ok(None)
            } else {
                text_of(k, i).map(Some)
            }
        })
        .collect()
}

/// An Arrow type by Postgres's name for it, in messages.
fn type_name(t: &DataType) -> String {
    match t {
        DataType::Boolean => "boolean".into(),
        DataType::Int16 => "smallint".into(),
        DataType::Int32 => "integer".into(),
        DataType::Int64 => "bigint".into(),
        DataType::Float32 => "real".into(),
        DataType::Float64 => "double precision".into(),
        DataType::Decimal128(..) | DataType::Decimal256(..) => "numeric".into(),
        DataType::Utf8 | DataType::Utf8View => "text".into(),
        DataType::LargeUtf8 => "jsonb".into(),
        DataType::Date32 => "date".into(),
        DataType::Timestamp(_, None) => "timestamp without time zone".into(),
        DataType::Timestamp(_, Some(_)) => "timestamp with time zone".into(),
        DataType::Time64(_) => "time without time zone".into(),
        DataType::Interval(_) => "interval".into(),
        DataType::Binary => "bytea".into(),
        other => other.to_string(),
    }
}

fn row(f: F, a: &[ArrayRef], i: usize) -> Result<Out> {
    macro_rules! json {
        ($k:expr) => {
            match json_arg(&a[$k], i)? {
                Some(j) => j,
                None => return Ok(Out::Null),
            }
        };
    }
    let jsonb = |j: Option<&Json>| j.map_or(Out::Null, |j| Out::Json(j.clone()));
    let text = |j: Option<&Json>| j.and_then(Json::as_text).map_or(Out::Null, Out::Text);
    Ok(match f {
        F::In => Out::Json(json!(0)),
        F::Get | F::GetText => {
            let j = json!(0);
            let found = match step_arg(&a[1], i)? {
                None => return Ok(Out::Null),
                Some(Step::Key(k)) => j.field(&k),
                Some(Step::Position(p)) => j.element(p),
            };
            if f == F::Get {
                jsonb(found)
            } else {
                text(found)
            }
        }
        F::Path | F::PathText | F::PathOp | F::PathTextOp => {
            let j = json!(0);
            let path = if matches!(f, F::PathOp | F::PathTextOp) {
                texts_arg(&a[1], i)?
            } else {
                keys_of(&a[1..], i)?
            };
            let Some(path) = path else {
                return Ok(Out::Null);
            };
            let found = j.path(&path);
            if matches!(f, F::Path | F::PathOp) {
                jsonb(found)
            } else {
                text(found)
            }
        }
        F::Contains => {
            let (x, y) = (json!(0), json!(1));
            Out::Bool(x.contains(&y))
        }
        F::Exists => {
            let j = json!(0);
            match step_arg(&a[1], i)? {
                Some(Step::Key(k)) => Out::Bool(j.has_key(&k)),
                Some(Step::Position(p)) => Out::Bool(j.has_key(&p.to_string())),
                None => Out::Null,
            }
        }
        F::ExistsAny | F::ExistsAll => {
            let j = json!(0);
            let Some(keys) = texts_arg(&a[1], i)? else {
                return Ok(Out::Null);
            };
            Out::Bool(if f == F::ExistsAny {
                keys.iter().any(|k| j.has_key(k))
            } else {
                keys.iter().all(|k| j.has_key(k))
            })
        }
        F::Concat => {
            let (x, y) = (json!(0), json!(1));
            Out::Json(concat(x, y))
        }
        F::Delete => {
            let j = json!(0);
            let keys = match a[1].data_type() {
                DataType::List(_) | DataType::LargeList(_) => match texts_arg(&a[1], i)? {
                    Some(keys) => keys.into_iter().map(Step::Key).collect(),
                    None => return Ok(Out::Null),
                },
                _ => match step_arg(&a[1], i)? {
                    Some(s) => vec![s],
                    None => return Ok(Out::Null),
                },
            };
            let mut j = j;
            for k in keys {
                j = delete(j, k)?;
            }
            Out::Json(j)
        }
        F::ToJsonb => {
            if null_at(&a[0], i) {
                Out::Null
            } else {
                Out::Json(to_json::to_json(&a[0], i)?)
            }
        }
        F::BuildObject => {
            if !a.len().is_multiple_of(2) {
                return Err(invalid(
                    "argument list must have even number of elements: the arguments of \
                     jsonb_build_object() must consist of alternating keys and values",
                ));
            }
            let mut pairs = Vec::with_capacity(a.len() / 2);
            for (n, kv) in a.chunks(2).enumerate() {
                if null_at(&kv[0], i) {
                    return Err(invalid(format!(
                        "argument {}: key must not be null",
                        2 * n + 1
                    )));
                }
                let key = match to_json::to_json(&kv[0], i)? {
                    Json::Array(_) | Json::Object(_) => {
                        return Err(invalid(
                            "key value must be scalar, not array, composite, or json",
                        ));
                    }
                    Json::String(s) => s,
                    other => other.to_string(),
                };
                pairs.push((key, to_json::to_json(&kv[1], i)?));
            }
            Out::Json(Json::object(pairs))
        }
        F::BuildArray => Out::Json(Json::Array(
            a.iter()
                .map(|c| to_json::to_json(c, i))
                .collect::<Result<_>>()?,
        )),
        F::TypeOf => Out::Text(json!(0).type_name().into()),
        F::ArrayLength => match json!(0) {
            Json::Array(items) => Out::Int(items.len() as i32),
            Json::Object(_) => return Err(invalid("cannot get array length of a non-array")),
            _ => return Err(invalid("cannot get array length of a scalar")),
        },
        F::StripNulls => Out::Json(json!(0).strip_nulls()),
        F::SortKey => Out::Bytes(json!(0).sort_key()),
        F::Pretty => Out::Text(json!(0).pretty()),
        F::Set => {
            let j = json!(0);
            let Some(path) = texts_arg(&a[1], i)? else {
                return Ok(Out::Null);
            };
            let new = json!(2);
            let Some(create) = flag_arg(a.get(3), i, true)? else {
                return Ok(Out::Null);
            };
            Out::Json(set(j, &path, new, create)?)
        }
        F::Insert => {
            let j = json!(0);
            let Some(path) = texts_arg(&a[1], i)? else {
                return Ok(Out::Null);
            };
            let new = json!(2);
            let Some(after) = flag_arg(a.get(3), i, false)? else {
                return Ok(Out::Null);
            };
            Out::Json(insert(j, &path, new, after)?)
        }
        F::DeletePath => {
            let j = json!(0);
            let Some(path) = texts_arg(&a[1], i)? else {
                return Ok(Out::Null);
            };
            Out::Json(delete_path(j, &path)?)
        }
        F::ArrayElements | F::ArrayElementsText => match json!(0) {
            Json::Array(items) if f == F::ArrayElements => Out::Jsons(items),
            Json::Array(items) => Out::Texts(items.iter().map(Json::as_text).collect()),
            Json::Object(_) => return Err(invalid("cannot extract elements from an object")),
            _ => return Err(invalid("cannot extract elements from a scalar")),
        },
        F::ObjectKeys => match json!(0) {
            Json::Object(pairs) => Out::Texts(pairs.into_iter().map(|(k, _)| Some(k)).collect()),
            Json::Array(_) => return Err(invalid("cannot call jsonb_object_keys on an array")),
            _ => return Err(invalid("cannot call jsonb_object_keys on a scalar")),
        },
        F::EachKeys | F::EachValues | F::EachValuesText => match json!(0) {
            Json::Object(pairs) if f == F::EachKeys => {
                Out::Texts(pairs.into_iter().map(|(k, _)| Some(k)).collect())
            }
            Json::Object(pairs) if f == F::EachValues => {
                Out::Jsons(pairs.into_iter().map(|(_, v)| v).collect())
            }
            Json::Object(pairs) => Out::Texts(pairs.iter().map(|(_, v)| v.as_text()).collect()),
            _ => {
                let name = if f == F::EachValuesText {
                    "jsonb_each_text"
                } else {
                    "jsonb_each"
                };
                return Err(invalid(format!("cannot call {name} on a non-object")));
            }
        },
        F::AggFinish => {
            if null_at(&a[0], i) {
                return Ok(Out::Null);
            }
            let items = a[0].as_list::<i32>().value(i);
            Out::Json(Json::Array(
                (0..items.len())
                    .map(|j| json_arg(&items, j).map(|v| v.unwrap_or(Json::Null)))
                    .collect::<Result<_>>()?,
            ))
        }
        F::ObjectAggFinish => {
            if null_at(&a[0], i) {
                return Ok(Out::Null);
            }
            let items = a[0].as_list::<i32>().value(i);
            let mut pairs = Vec::with_capacity(items.len());
            for j in 0..items.len() {
                let Some(Json::Array(kv)) = json_arg(&items, j)? else {
                    return Err(DataFusionError::Internal("jsonb_object_agg's pairs".into()));
                };
                let mut kv = kv.into_iter();
                let key = match kv.next() {
                    Some(Json::Null) | None => {
                        return Err(invalid("field name must not be null"));
                    }
                    Some(Json::String(s)) => s,
                    Some(Json::Array(_) | Json::Object(_)) => {
                        return Err(invalid(
                            "key value must be scalar, not array, composite, or json",
                        ));
                    }
                    Some(other) => other.to_string(),
                };
                pairs.push((key, kv.next().unwrap_or(Json::Null)));
            }
            Out::Json(Json::object(pairs))
        }
    })
}

/// `a || b`: objects merge (`b`'s keys win), arrays concatenate, and a
/// scalar or object beside an array is one element of it.
fn concat(a: Json, b: Json) -> Json {
    match (a, b) {
        (Json::Object(mut x), Json::Object(y)) => {
            x.extend(y);
            Json::object(x)
        }
        (Json::Array(mut x), Json::Array(y)) => {
            x.extend(y);
            Json::Array(x)
        }
        (Json::Array(mut x), y) => {
            x.push(y);
            Json::Array(x)
        }
        (x, Json::Array(y)) => {
            let mut items = vec![x];
            items.extend(y);
            Json::Array(items)
        }
        (x, y) => Json::Array(vec![x, y]),
    }
}

/// `j - key` (an object's field, an array's equal strings) and
/// `j - position`.
fn delete(j: Json, step: Step) -> Result<Json> {
    Ok(match (j, step) {
        (Json::Object(pairs), Step::Key(k)) => {
            Json::Object(pairs.into_iter().filter(|(key, _)| *key != k).collect())
        }
        (Json::Array(items), Step::Key(k)) => Json::Array(
            items
                .into_iter()
                .filter(|i| !matches!(i, Json::String(s) if *s == k))
                .collect(),
        ),
        (Json::Array(mut items), Step::Position(p)) => {
            let at = if p < 0 { items.len() as i64 + p } else { p };
            if (0..items.len() as i64).contains(&at) {
                items.remove(at as usize);
            }
            Json::Array(items)
        }
        (Json::Object(_), Step::Position(_)) => {
            return Err(invalid("cannot delete from object using integer index"));
        }
        _ => return Err(invalid("cannot delete from scalar")),
    })
}

/// `jsonb_set(j, path, new, create_missing)`.
fn set(j: Json, path: &[String], new: Json, create: bool) -> Result<Json> {
    if path.is_empty() {
        return Ok(j);
    }
    if !matches!(j, Json::Array(_) | Json::Object(_)) {
        return Err(invalid("cannot set path in scalar"));
    }
    set_at(j, path, 0, new, create)
}

fn set_at(j: Json, path: &[String], at: usize, new: Json, create: bool) -> Result<Json> {
    let last = at + 1 == path.len();
    let step = &path[at];
    Ok(match j {
        Json::Object(mut pairs) => {
            match pairs.iter().position(|(k, _)| k == step) {
                Some(p) => {
                    let old = std::mem::replace(&mut pairs[p].1, Json::Null);
                    pairs[p].1 = if last {
                        new
                    } else {
                        set_at(old, path, at + 1, new, create)?
                    };
                }
                None if last && create => {
                    pairs.push((step.clone(), new));
                    return Ok(Json::object(pairs));
                }
                None => {}
            }
            Json::Object(pairs)
        }
        Json::Array(mut items) => {
            let p = position(step, at)?;
            let n = items.len() as i64;
            let idx = if p < 0 { n + p } else { p };
            if (0..n).contains(&idx) {
                let old = std::mem::replace(&mut items[idx as usize], Json::Null);
                items[idx as usize] = if last {
                    new
                } else {
                    set_at(old, path, at + 1, new, create)?
                };
            } else if last && create {
                // Past either end: added at that end.
                if idx < 0 {
                    items.insert(0, new);
                } else {
                    items.push(new);
                }
            }
            Json::Array(items)
        }
        scalar => scalar,
    })
}

/// A path's step into an array: an integer (`22P02` otherwise).
fn position(step: &str, at: usize) -> Result<i64> {
    step.trim().parse().map_err(|_| {
        DataFusionError::ArrowError(
            Box::new(ArrowError::ParseError(format!(
                "path element at position {} is not an integer: \"{step}\"",
                at + 1
            ))),
            None,
        )
    })
}

/// `jsonb_insert`: `new` put at `path`, before the array element there
/// (after, with `after`) or as a new key; an existing key is an error.
fn insert(j: Json, path: &[String], new: Json, after: bool) -> Result<Json> {
    if !matches!(j, Json::Array(_) | Json::Object(_)) {
        return Err(invalid("cannot set path in scalar"));
    }
    if path.is_empty() {
        return Ok(j);
    }
    insert_at(j, path, 0, new, after)
}

fn insert_at(j: Json, path: &[String], at: usize, new: Json, after: bool) -> Result<Json> {
    let last = at + 1 == path.len();
    let step = &path[at];
    Ok(match j {
        Json::Object(mut pairs) => {
            match pairs.iter().position(|(k, _)| k == step) {
                Some(_) if last => {
                    return Err(invalid(
                        "cannot replace existing key: try using the function jsonb_set to \
                         replace key value",
                    ));
                }
                Some(p) => {
                    let old = std::mem::replace(&mut pairs[p].1, Json::Null);
                    pairs[p].1 = insert_at(old, path, at + 1, new, after)?;
                }
                None if last => {
                    pairs.push((step.clone(), new));
                    return Ok(Json::object(pairs));
                }
                None => {}
            }
            Json::Object(pairs)
        }
        Json::Array(mut items) => {
            let p = position(step, at)?;
            let n = items.len() as i64;
            let idx = if p < 0 { n + p } else { p };
            if last {
                let to = if idx < 0 {
                    0
                } else if idx >= n {
                    n
                } else {
                    idx + i64::from(after)
                };
                items.insert(to as usize, new);
            } else if (0..n).contains(&idx) {
                let old = std::mem::replace(&mut items[idx as usize], Json::Null);
                items[idx as usize] = insert_at(old, path, at + 1, new, after)?;
            }
            Json::Array(items)
        }
        scalar => scalar,
    })
}

/// `j #- path`: without the field or element at `path`, if there is one.
fn delete_path(j: Json, path: &[String]) -> Result<Json> {
    if !matches!(j, Json::Array(_) | Json::Object(_)) {
        return Err(invalid("cannot delete path in scalar"));
    }
    if path.is_empty() {
        return Ok(j);
    }
    delete_at(j, path, 0)
}

fn delete_at(j: Json, path: &[String], at: usize) -> Result<Json> {
    let last = at + 1 == path.len();
    let step = &path[at];
    Ok(match j {
        Json::Object(mut pairs) => {
            if let Some(p) = pairs.iter().position(|(k, _)| k == step) {
                if last {
                    pairs.remove(p);
                } else {
                    let old = std::mem::replace(&mut pairs[p].1, Json::Null);
                    pairs[p].1 = delete_at(old, path, at + 1)?;
                }
            }
            Json::Object(pairs)
        }
        Json::Array(mut items) => {
            let p = position(step, at)?;
            let n = items.len() as i64;
            let idx = if p < 0 { n + p } else { p };
            if (0..n).contains(&idx) {
                if last {
                    items.remove(idx as usize);
                } else {
                    let old = std::mem::replace(&mut items[idx as usize], Json::Null);
                    items[idx as usize] = delete_at(old, path, at + 1)?;
                }
            }
            Json::Array(items)
        }
        scalar => scalar,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn j(s: &str) -> Json {
        Json::parse(s).unwrap()
    }

    #[test]
    fn operators_answer_as_postgres() {
        // Postgres 15's answers.
        assert_eq!(
            concat(j(r#"{"a":1}"#), j("2")).to_string(),
            r#"[{"a": 1}, 2]"#
        );
        assert_eq!(
            concat(j("[1]"), j(r#"{"b":2}"#)).to_string(),
            r#"[1, {"b": 2}]"#
        );
        assert_eq!(concat(j("1"), j("2")).to_string(), "[1, 2]");
        assert_eq!(
            concat(j(r#"{"a":1,"b":2}"#), j(r#"{"b":3}"#)).to_string(),
            r#"{"a": 1, "b": 3}"#
        );
        let del = |x: &str, s: Step| delete(j(x), s).map(|v| v.to_string());
        assert_eq!(
            del(r#"["a","b",1]"#, Step::Key("a".into())).unwrap(),
            r#"["b", 1]"#
        );
        assert_eq!(del("[1,2,3]", Step::Position(-1)).unwrap(), "[1, 2]");
        assert_eq!(del(r#"{"a":1}"#, Step::Key("a".into())).unwrap(), "{}");
        assert!(del("1", Step::Key("a".into())).is_err());
        assert!(del("{}", Step::Position(1)).is_err());
        let set = |x: &str, p: &[&str], v: &str| {
            let p: Vec<String> = p.iter().map(|s| s.to_string()).collect();
            set(j(x), &p, j(v), true).unwrap().to_string()
        };
        assert_eq!(set(r#"{"a":1}"#, &["b"], "2"), r#"{"a": 1, "b": 2}"#);
        assert_eq!(set("[1,2]", &["5"], "9"), "[1, 2, 9]");
        assert_eq!(set(r#"{"a":{}}"#, &["a", "b", "c"], "1"), r#"{"a": {}}"#);
        assert_eq!(set("[1,2]", &["-1"], "9"), "[1, 9]");
        let path = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let ins = |x: &str, p: &[&str], v: &str, after: bool| {
            insert(j(x), &path(p), j(v), after).map(|v| v.to_string())
        };
        let a = r#"{"a": [0,1,2]}"#;
        assert_eq!(
            ins(a, &["a", "1"], r#""new""#, false).unwrap(),
            r#"{"a": [0, "new", 1, 2]}"#
        );
        assert_eq!(
            ins(a, &["a", "1"], r#""new""#, true).unwrap(),
            r#"{"a": [0, 1, "new", 2]}"#
        );
        assert_eq!(
            ins(a, &["a", "9"], "9", false).unwrap(),
            r#"{"a": [0, 1, 2, 9]}"#
        );
        assert_eq!(
            ins(a, &["a", "-9"], "9", false).unwrap(),
            r#"{"a": [9, 0, 1, 2]}"#
        );
        assert_eq!(
            ins(a, &["a", "-1"], "9", true).unwrap(),
            r#"{"a": [0, 1, 2, 9]}"#
        );
        assert_eq!(
            ins(r#"{"a":1}"#, &["b"], "2", false).unwrap(),
            r#"{"a": 1, "b": 2}"#
        );
        assert_eq!(
            ins(r#"{"a":1}"#, &["x", "y"], "2", false).unwrap(),
            r#"{"a": 1}"#
        );
        assert!(ins(r#"{"a":1}"#, &["a"], "2", false).is_err());
        assert!(ins("1", &["a"], "2", false).is_err());
        let del = |x: &str, p: &[&str]| delete_path(j(x), &path(p)).map(|v| v.to_string());
        assert_eq!(
            del(r#"{"a":{"b":[1,2,3]}}"#, &["a", "b", "-1"]).unwrap(),
            r#"{"a": {"b": [1, 2]}}"#
        );
        assert_eq!(del("[1,2]", &["5"]).unwrap(), "[1, 2]");
        assert_eq!(del(r#"{"a":1}"#, &["x", "y"]).unwrap(), r#"{"a": 1}"#);
        assert!(del("1", &["a"]).is_err());
        assert!(del("[1]", &["a"]).is_err());
    }

    #[test]
    fn text_arrays_read_as_postgres() {
        assert_eq!(parse_text_array("{a,b}").unwrap(), vec!["a", "b"]);
        assert_eq!(
            parse_text_array(r#"{ "a b" , c\,d,"e\"f"}"#).unwrap(),
            vec!["a b", "c,d", "e\"f"]
        );
        assert!(parse_text_array("{}").unwrap().is_empty());
        assert!(parse_text_array("a,b").is_err());
        assert!(parse_text_array("{a,}").is_err());
    }
}

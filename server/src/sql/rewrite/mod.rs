//! Postgres spellings in the queries clients send about the catalogs,
//! rewritten into SQL that DataFusion plans with the same answer:
//!
//! - `OPERATOR(pg_catalog.~)` is `~`; `pg_catalog.f(…)` is `f(…)`;
//! - `COLLATE "C"` (or `default`, `POSIX`) is how Weir compares text
//!   anyway, so it is dropped; another collation is refused;
//! - `x::regclass` (and `regtype`, `regnamespace`, `regproc`, `regrole`)
//!   becomes a lookup: from a name, the object's oid; from an oid, its
//!   name, as Postgres prints such a value; `::oid`, `::name`, `::"char"`
//!   and `pg_catalog.`-qualified types become the types Weir stores them as;
//! - an unqualified `pg_*` catalog table is `pg_catalog`'s, as Postgres
//!   searches `pg_catalog` first;
//! - `ARRAY(SELECT x …)` is `(SELECT array_agg(x) …)`;
//! - in a `FROM`, `generate_series(a, b)` names its column as Postgres
//!   does and takes any integers, and a function of one value (Grafana's
//!   `string_to_array(…) s`) is a table of one row; a set-returning
//!   function over another item's columns is a select-list `unnest` over
//!   that item (`lateral.rs`);
//! - a correlated subquery whose outer columns DataFusion cannot pull up
//!   is given a table of the outer values to refer to (`outer_refs.rs`);
//! - `x IN (SELECT …)` in a select list, and a subquery in `ORDER BY`, are
//!   given shapes DataFusion plans (Grafana's table list); a plain column
//!   beside `t.*` gets a unique name the client never sees (DBeaver's
//!   `SELECT c.oid, c.*`); bare `user` is `current_user`;
//!   `generate_subscripts` is the positions `unnest` zips with (SQLAlchemy);
//! - a `SELECT` without aggregation that inner-joins a catalog table Weir
//!   never fills (policies, publications, inheritance, …) returns no rows,
//!   so its expressions (which use SQL DataFusion does not plan, such as
//!   `generate_series` over a correlated array) are never evaluated and are
//!   replaced by NULLs, and its condition by `false`.

mod decorrelate;
mod lateral;
pub mod outer_refs;

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    AccessExpr, ArrayElemTypeDef, BinaryOperator, CastKind, DataType as SqlType, Expr, Function,
    FunctionArg, FunctionArgExpr, FunctionArgumentList, FunctionArguments, GroupByExpr, Ident,
    ObjectName, ObjectNamePart, OrderByKind, Query, Select, SelectItem, SetExpr, TableAlias,
    TableAliasColumnDef, TableFactor, Value, VisitMut, VisitorMut,
};

use crate::error::{Result, ServerError};
use crate::sql::pg_tables::{EMPTY_TABLES, TABLE_NAMES};

/// Rewrites `query` in place.
pub fn rewrite(query: &mut Query) -> Result<()> {
    let printed = printed_reg_literals(query);
    rewrite_with(query, false)?;
    if let SetExpr::Select(select) = query.body.as_mut() {
        for (i, back) in printed {
            if let Some(SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) =
                select.projection.get_mut(i)
            {
                *e = call(back, vec![e.clone()]);
            }
        }
    }
    Ok(())
}

/// `SELECT 't'::regclass` prints `t` in Postgres: a reg* value is an oid
/// that prints as its object's name. Weir's lookup from a name gives the
/// oid, which is what a comparison or join needs; in the outermost select
/// list, where such a value is only printed, it is turned back into the
/// name. Returns those items' positions, with the function that names.
fn printed_reg_literals(query: &Query) -> Vec<(usize, &'static str)> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return Vec::new();
    };
    let is_text =
        |e: &Expr| matches!(e, Expr::Value(v) if matches!(v.value, Value::SingleQuotedString(_)));
    select
        .projection
        .iter()
        .enumerate()
        .filter_map(|(i, item)| {
            let (SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }) = item
            else {
                return None;
            };
            let back = match e {
                Expr::Cast {
                    expr, data_type, ..
                } if is_text(expr) => match data_type {
                    SqlType::Regclass => "weir_regclass",
                    SqlType::Custom(name, m) if m.is_empty() => match unqualified(name)?.as_str() {
                        "regclass" => "weir_regclass",
                        "regtype" => "weir_regtype",
                        "regnamespace" => "weir_regnamespace",
                        "regrole" => "weir_regrole",
                        _ => return None,
                    },
                    _ => return None,
                },
                Expr::Function(f) if last_name(&f.name).as_deref() == Some("to_regclass") => {
                    "weir_regclass"
                }
                Expr::Function(f) if last_name(&f.name).as_deref() == Some("to_regtype") => {
                    "weir_regtype"
                }
                _ => return None,
            };
            Some((i, back))
        })
        .collect()
}

/// Rewrites a view's query in place: as [`rewrite`], but its result's
/// column names stay the view's (no names are made unique for a client to
/// take back, and no `reg*` value is printed).
pub fn rewrite_view(query: &mut Query) -> Result<()> {
    rewrite_with(query, true)
}

/// The rewriting both of the above do.
fn rewrite_with(query: &mut Query, view: bool) -> Result<()> {
    let mut v = Rewriter { error: None, view };
    let _ = query.visit(&mut v);
    v.error.map_or(Ok(()), Err)?;
    // After the catalogs' own lookups are reshaped (`decorrelate.rs`).
    outer_refs::rewrite(query);
    no_series_of_columns(query)
}

/// `0A000` for a `generate_series` in `FROM` over another `FROM` item's
/// columns that is still there after the rewrite (catalog queries whose
/// such parts are never evaluated have lost them by then).
fn no_series_of_columns(query: &Query) -> Result<()> {
    struct Find;
    impl datafusion::sql::sqlparser::ast::Visitor for Find {
        type Break = String;
        fn pre_visit_table_factor(&mut self, factor: &TableFactor) -> ControlFlow<String> {
            match series_of_columns(factor) {
                Some(name) => ControlFlow::Break(name),
                None if lateral::is_over_columns(factor) => {
                    ControlFlow::Break("a set-returning function".into())
                }
                None => ControlFlow::Continue(()),
            }
        }
    }
    if let ControlFlow::Break(name) =
        datafusion::sql::sqlparser::ast::Visit::visit(query, &mut Find)
    {
        return Err(ServerError::unsupported(format!(
            "{name} in FROM over the columns of a join or as the inner side of an outer join \
             (LATERAL); call it in the select list instead"
        )));
    }
    Ok(())
}

struct Rewriter {
    error: Option<ServerError>,
    /// A view's query: see [`rewrite_view`].
    view: bool,
}

impl VisitorMut for Rewriter {
    type Break = ();

    fn post_visit_relation(&mut self, name: &mut ObjectName) -> ControlFlow<()> {
        if let [ObjectNamePart::Identifier(i)] = name.0.as_slice() {
            let n = crate::sql::stmt::ident(i);
            if TABLE_NAMES.contains(&n.as_str()) {
                name.0
                    .insert(0, ObjectNamePart::Identifier(Ident::new("pg_catalog")));
            }
        }
        // `pg_catalog.unnest(…)`, `pg_catalog.generate_series(…)`: functions.
        if let [ObjectNamePart::Identifier(s), ObjectNamePart::Identifier(i)] = name.0.as_slice()
            && crate::sql::stmt::ident(s) == "pg_catalog"
            && !TABLE_NAMES.contains(&crate::sql::stmt::ident(i).as_str())
        {
            name.0.remove(0);
        }
        ControlFlow::Continue(())
    }

    /// `FROM unnest(a) x`: in Postgres, a function of one column so named
    /// names its column `x` too.
    fn post_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        series_in_from(factor, self.view);
        jsonb_rows_in_from(factor);
        scalar_in_from(factor);
        if let TableFactor::Table {
            name,
            args: Some(_),
            alias: Some(alias),
            ..
        } = factor
            && alias.columns.is_empty()
            && last_name(name).is_some_and(|n| matches!(n.as_str(), "unnest" | "generate_series"))
        {
            alias.columns = vec![
                datafusion::sql::sqlparser::ast::TableAliasColumnDef::from_name(
                    alias.name.value.clone(),
                ),
            ];
        }
        // `pg_catalog.unnest(a)` parses as a table function; DataFusion
        // plans `unnest(a)` only as the UNNEST it is.
        if let TableFactor::Table {
            name,
            args: Some(args),
            alias,
            with_ordinality,
            ..
        } = factor
            && last_name(name).as_deref() == Some("unnest")
            && name.0.len() == 1
        {
            let exprs: Option<Vec<Expr>> = args
                .args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
                    _ => None,
                })
                .collect();
            if let Some(mut array_exprs) = exprs {
                let mut alias = alias.clone();
                // `WITH ORDINALITY`: one more list, of positions.
                if *with_ordinality && array_exprs.len() == 1 {
                    let mut named = alias.take().unwrap_or_else(|| TableAlias {
                        at: None,
                        explicit: true,
                        name: Ident::new("unnest"),
                        columns: vec![TableAliasColumnDef::from_name("unnest")],
                    });
                    add_ordinality(&mut array_exprs, &mut named);
                    alias = Some(named);
                }
                let ordinality = *with_ordinality && alias.is_none();
                *factor = TableFactor::UNNEST {
                    alias,
                    array_exprs,
                    with_offset: false,
                    with_offset_alias: None,
                    with_ordinality: ordinality,
                };
            }
        }
        // `FROM unnest(a) WITH ORDINALITY`, parsed as an UNNEST already.
        if let TableFactor::UNNEST {
            alias,
            array_exprs,
            with_ordinality: with_ordinality @ true,
            with_offset: false,
            ..
        } = factor
            && array_exprs.len() == 1
        {
            let mut named = alias.take().unwrap_or_else(|| TableAlias {
                at: None,
                explicit: true,
                name: Ident::new("unnest"),
                columns: vec![],
            });
            if named.columns.is_empty() {
                named.columns = vec![TableAliasColumnDef::from_name(named.name.value.clone())];
            }
            add_ordinality(array_exprs, &mut named);
            *alias = Some(named);
            *with_ordinality = false;
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        match rewrite_expr(expr) {
            Ok(Some(new)) => *expr = new,
            Ok(None) => {}
            Err(e) => {
                self.error = Some(e);
                return ControlFlow::Break(());
            }
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        prune_set_expr(&mut query.body);
        lateral::rewrite(query);
        if let SetExpr::Select(select) = query.body.as_mut()
            && !self.view
        {
            beside_wildcards(select);
        }
        sort_by_subqueries(query);
        if let SetExpr::Select(select) = query.body.as_mut() {
            in_subqueries_in_projection(select);
        }
        ControlFlow::Continue(())
    }
}

/// `e` without the parentheses around it.
fn unnested(mut e: &Expr) -> &Expr {
    while let Expr::Nested(inner) = e {
        e = inner;
    }
    e
}

/// Whether the argument of a reg* lookup is a name (a literal, or text
/// made by a text function or `||`, as Metabase's
/// `format('%I.%I', …)::regclass`), which is looked up; anything else is
/// an oid already.
fn names_an_object(arg: &Expr) -> bool {
    match arg {
        Expr::Value(v) => matches!(v.value, Value::SingleQuotedString(_)),
        Expr::Function(f) => last_name(&f.name).is_some_and(|n| {
            matches!(
                n.as_str(),
                "format"
                    | "concat"
                    | "concat_ws"
                    | "quote_ident"
                    | "lower"
                    | "upper"
                    | "btrim"
                    | "trim"
                    | "replace"
            )
        }),
        Expr::BinaryOp {
            op: BinaryOperator::StringConcat,
            ..
        } => true,
        _ => false,
    }
}

/// The type `localtimestamp` or `localtime` (as a name, or as the
/// argument-less function sqlparser may read) stands for.
fn local_time(expr: &Expr) -> Option<&'static str> {
    let name = match expr {
        Expr::Identifier(i) if i.quote_style.is_none() => i.value.to_lowercase(),
        Expr::Function(f) if matches!(f.args, FunctionArguments::None) => unqualified(&f.name)?,
        _ => return None,
    };
    match name.as_str() {
        "localtimestamp" => Some("TIMESTAMP"),
        "localtime" => Some("TIME"),
        _ => None,
    }
}

/// SQL's `current_user`, spelled as it parses back (without parentheses).
fn current_user() -> Expr {
    match call("current_user", vec![]) {
        Expr::Function(mut f) => {
            f.args = FunctionArguments::None;
            Expr::Function(f)
        }
        other => other,
    }
}

/// SQL this file writes, parsed back (Postgres's dialect) by `f`.
pub(super) fn parse<T>(
    sql: &str,
    f: impl FnOnce(
        &mut datafusion::sql::sqlparser::parser::Parser<'_>,
    ) -> std::result::Result<T, datafusion::sql::sqlparser::parser::ParserError>,
) -> Option<T> {
    let dialect = datafusion::sql::sqlparser::dialect::PostgreSqlDialect {};
    let mut parser = datafusion::sql::sqlparser::parser::Parser::new(&dialect)
        .try_with_sql(sql)
        .ok()?;
    f(&mut parser).ok()
}

/// The prefix of a column's name made unique for DataFusion, up to a `:`
/// after which the name the client is to see follows.
pub const SAME_NAME: &str = "weir_same_name_";

/// `SELECT c.oid, c.* FROM pg_class c` (DBeaver's way): Postgres returns
/// two columns named `oid`; DataFusion wants the names of a select list
/// unique. Beside a wildcard, a plain column gets a unique name that
/// carries the client's one, which the result's schema takes back.
fn beside_wildcards(select: &mut Select) {
    if !select.projection.iter().any(|i| {
        matches!(
            i,
            SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
        )
    }) {
        return;
    }
    for (n, item) in select.projection.iter_mut().enumerate() {
        let name = match item {
            SelectItem::UnnamedExpr(Expr::Identifier(i)) => crate::sql::stmt::ident(i),
            SelectItem::UnnamedExpr(Expr::CompoundIdentifier(parts)) => match parts.last() {
                Some(i) => crate::sql::stmt::ident(i),
                None => continue,
            },
            _ => continue,
        };
        if let SelectItem::UnnamedExpr(expr) = item {
            *item = SelectItem::ExprWithAlias {
                expr: expr.clone(),
                alias: Ident::with_quote('"', format!("{SAME_NAME}{n}:{name}")),
            };
        }
    }
}

/// Whether `expr` holds a subquery.
fn has_subquery(expr: &Expr) -> bool {
    let mut found = false;
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(expr, |e| {
        if matches!(
            e,
            Expr::Subquery(_) | Expr::InSubquery { .. } | Expr::Exists { .. }
        ) {
            found = true;
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    });
    found
}

/// `ORDER BY x IN (SELECT …)`, as Grafana's table list sorts: DataFusion
/// plans a subquery in a select list or a condition but not in a sort. So
/// the sort keys become hidden columns of the query, which an outer query
/// sorts by and leaves out:
/// `SELECT a, b FROM (SELECT a AS c1, b AS c2, <key> AS k1 …) ORDER BY k1`.
/// (The client still sees `a` and `b` by their names: those are taken
/// from the query as written.) Left alone: `SELECT *`, `DISTINCT` (where
/// a hidden column would change the rows) and set operations.
fn sort_by_subqueries(query: &mut Query) {
    let Some(order_by) = &query.order_by else {
        return;
    };
    let OrderByKind::Expressions(keys) = &order_by.kind else {
        return;
    };
    if !keys.iter().any(|k| has_subquery(&k.expr)) {
        return;
    }
    let SetExpr::Select(select) = query.body.as_ref() else {
        return;
    };
    if select.distinct.is_some()
        || select.projection.iter().any(|i| {
            matches!(
                i,
                SelectItem::Wildcard(_) | SelectItem::QualifiedWildcard(..)
            )
        })
    {
        return;
    }
    let mut inner = select.as_ref().clone();
    let width = inner.projection.len();
    for (i, item) in inner.projection.iter_mut().enumerate() {
        let expr = match item {
            SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e.clone(),
            _ => return,
        };
        *item = SelectItem::ExprWithAlias {
            expr,
            alias: Ident::new(format!("weir_column_{i}")),
        };
    }
    let mut outer_keys = Vec::with_capacity(keys.len());
    for (k, key) in keys.iter().enumerate() {
        let mut key = key.clone();
        // `ORDER BY 2`: the second column, which the outer query has too.
        let positional = matches!(&key.expr, Expr::Value(v)
            if matches!(&v.value, Value::Number(n, _) if n.parse::<usize>().is_ok_and(|n| (1..=width).contains(&n))));
        if !positional {
            let name = format!("weir_sort_{k}");
            inner.projection.push(SelectItem::ExprWithAlias {
                expr: key.expr.clone(),
                alias: Ident::new(name.clone()),
            });
            key.expr = Expr::Identifier(Ident::new(name));
        }
        outer_keys.push(key);
    }
    let columns = (0..width)
        .map(|i| format!("weir_column_{i}"))
        .collect::<Vec<_>>()
        .join(", ");
    let Some(mut outer) = parse(
        &format!("SELECT {columns} FROM (SELECT 1) AS weir_sorted"),
        |p| p.parse_query(),
    ) else {
        return;
    };
    let SetExpr::Select(outer_select) = outer.body.as_mut() else {
        return;
    };
    let Some(TableFactor::Derived { subquery, .. }) =
        outer_select.from.first_mut().map(|t| &mut t.relation)
    else {
        return;
    };
    in_subqueries_in_projection(&mut inner);
    *subquery.body = SetExpr::Select(Box::new(inner));
    subquery.with = query.with.take();
    query.body = outer.body;
    if let Some(order_by) = &mut query.order_by {
        order_by.kind = OrderByKind::Expressions(outer_keys);
    }
}

/// `x IN (SELECT …)` in a select list, which DataFusion plans only in a
/// condition, becomes scalar subqueries, which it plans anywhere: the
/// subquery's values as an array, and whether it has none, NULLs or no
/// NULLs, from which `CASE` tells Postgres's true, false or NULL. A
/// correlated one is left for DataFusion's error.
fn in_subqueries_in_projection(select: &mut Select) {
    for item in select.projection.iter_mut() {
        if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
            // Not those of the subqueries within (conditions there).
            outer_refs::visit_shallow(e, false, in_subquery_as_scalars);
        }
    }
}

fn in_subquery_as_scalars(e: &mut Expr) {
    if let Expr::InSubquery {
        expr,
        subquery,
        negated,
    } = e
        && !outer_refs::names_outside(subquery)
    {
        let values = format!("FROM ({subquery}) AS weir_in(c)");
        // 0: no rows; 1: a NULL among them; 2: no NULL.
        let rows = format!(
            "(SELECT CASE WHEN count(*) = 0 THEN 0 WHEN count(*) > count(weir_in.c) THEN 1 \
             ELSE 2 END {values})"
        );
        let sql = format!(
            "{}(CASE WHEN array_has((SELECT array_agg(weir_in.c) {values}), {expr}) THEN true \
             WHEN {rows} = 0 THEN false WHEN ({expr}) IS NULL OR {rows} = 1 THEN NULL \
             ELSE false END)",
            if *negated { "NOT " } else { "" }
        );
        if let Some(new) = parse(&sql, |p| p.parse_expr()) {
            *e = new;
        }
    }
}

/// Functions of one value that clients put in a `FROM` (Grafana's
/// `string_to_array(…) s`). Only these are turned into a table of one row:
/// a set-returning function Weir lacks (`pg_options_to_table`, …) must
/// stay as it is, for the rewrites that prune what it is in.
const SCALARS_IN_FROM: &[&str] = &[
    "string_to_array",
    "regexp_split_to_array",
    "current_schemas",
    "current_schema",
    "current_setting",
    "current_database",
    "parse_ident",
    "version",
];

/// The set-returning functions of `jsonb` (see [`jsonb_call`]).
pub(super) const JSONB_ROWS: &[&str] = &[
    "jsonb_array_elements",
    "jsonb_array_elements_text",
    "jsonb_object_keys",
    "jsonb_each",
    "jsonb_each_text",
];

/// `FROM t, generate_series(1, t.n)`: a set-returning function over
/// another item's columns, which DataFusion's table functions cannot take.
/// Its name, if so.
pub(super) fn series_of_columns(factor: &TableFactor) -> Option<String> {
    let TableFactor::Table {
        name,
        args: Some(args),
        ..
    } = factor
    else {
        return None;
    };
    let name = last_name(name)?;
    if name != "generate_series" && !JSONB_ROWS.contains(&name.as_str()) {
        return None;
    }
    let columns = datafusion::sql::sqlparser::ast::visit_expressions(&args.args, |e| {
        if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    columns.is_break().then_some(name)
}

/// `FROM jsonb_array_elements('[1, 2]') [AS] e`: the `UNNEST` of the list
/// of its rows (see [`jsonb_rows`]). Over another item's columns it is
/// left for `lateral` to plan.
fn jsonb_rows_in_from(factor: &mut TableFactor) {
    if series_of_columns(factor).is_some() {
        return;
    }
    let TableFactor::Table {
        name,
        args: Some(args),
        alias,
        with_ordinality,
        ..
    } = factor
    else {
        return;
    };
    let Some(function) = last_name(name).filter(|n| JSONB_ROWS.contains(&n.as_str())) else {
        return;
    };
    let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = args.args.as_slice() else {
        return;
    };
    let (mut array_exprs, mut named) = jsonb_rows(&function, arg, alias.take());
    if *with_ordinality {
        add_ordinality(&mut array_exprs, &mut named);
    }
    *factor = TableFactor::UNNEST {
        alias: Some(named),
        array_exprs,
        with_offset: false,
        with_offset_alias: None,
        with_ordinality: false,
    };
}

/// The rows of a `jsonb` set-returning `function` of `arg` as lists to
/// unnest side by side, and the alias naming their columns as Postgres
/// names them (`value`, or for `jsonb_object_keys`, after the alias or the
/// function; `jsonb_each`'s are `key` and `value`).
pub(super) fn jsonb_rows(
    function: &str,
    arg: &Expr,
    alias: Option<TableAlias>,
) -> (Vec<Expr>, TableAlias) {
    let mut named = alias.unwrap_or_else(|| TableAlias {
        at: None,
        explicit: true,
        name: Ident::new(function),
        columns: vec![],
    });
    // `jsonb_each[_text]`: a key and a value column, two lists in step.
    let array_exprs = match function {
        "jsonb_each" | "jsonb_each_text" => vec![
            call("weir_jsonb_each_keys", vec![arg.clone()]),
            call(
                if function == "jsonb_each" {
                    "weir_jsonb_each_values"
                } else {
                    "weir_jsonb_each_values_text"
                },
                vec![arg.clone()],
            ),
        ],
        _ => vec![call(&format!("weir_{function}"), vec![arg.clone()])],
    };
    if named.columns.is_empty() {
        named.columns = match function {
            "jsonb_object_keys" => vec![TableAliasColumnDef::from_name(named.name.value.clone())],
            "jsonb_each" | "jsonb_each_text" => vec![
                TableAliasColumnDef::from_name("key"),
                TableAliasColumnDef::from_name("value"),
            ],
            _ => vec![TableAliasColumnDef::from_name("value")],
        };
    }
    (array_exprs, named)
}

/// `WITH ORDINALITY` over `arrays` unnested in step: one more list, the
/// positions `1..n` of the longest, named `ordinality` unless `alias`
/// names it.
pub(super) fn add_ordinality(arrays: &mut Vec<Expr>, alias: &mut TableAlias) {
    let n = arrays.len();
    arrays.push(ordinality_list(arrays));
    if alias.columns.len() == n {
        alias
            .columns
            .push(TableAliasColumnDef::from_name("ordinality"));
    }
}

/// The positions `1..n` of the longest of `arrays`, as a list.
pub(super) fn ordinality_list(arrays: &[Expr]) -> Expr {
    let lengths: Vec<Expr> = arrays
        .iter()
        .map(|a| call("cardinality", vec![a.clone()]))
        .collect();
    let longest = match lengths.as_slice() {
        [one] => one.clone(),
        _ => call("greatest", lengths),
    };
    call(
        "generate_series",
        vec![
            cast(
                Expr::value(Value::Number("1".into(), false)),
                SqlType::BigInt(None),
            ),
            cast(longest, SqlType::BigInt(None)),
        ],
    )
}

/// `FROM generate_series(a, b)` in Postgres: a column named
/// `generate_series` (or the alias), of the arguments' integer type.
/// DataFusion's takes 64-bit integers only, and names its column `value`.
/// Two arguments are always integers (a series of timestamps needs its
/// step), so they are cast; three are left as they are. A series of
/// `integer`s (see `int4_args`) is cast back, in a subquery.
///
/// In a view's query, a series of constants is the `UNNEST` of the list
/// `generate_series` gives as a scalar function: a view cannot read a table
/// function, but maintains an `UNNEST` over the one row of no table.
fn series_in_from(factor: &mut TableFactor, view: bool) {
    let constant = series_of_columns(factor).is_none();
    let TableFactor::Table {
        name,
        args: Some(args),
        alias,
        with_ordinality,
        ..
    } = factor
    else {
        return;
    };
    if last_name(name).as_deref() != Some("generate_series") {
        return;
    }
    // DataFusion evaluates a table function's arguments before Weir's
    // analyzer rules see them: `timestamp '2024-01-01 00:00'` is read here.
    for a in args.args.iter_mut() {
        if let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = a
            && let Some(read) = timestamp_text(e)
        {
            *e = read;
        }
    }
    let ordinality = *with_ordinality;
    let int4 = constant && !ordinality && int4_args(&args.args);
    if args.args.len() == 2 || int4 {
        for a in args.args.iter_mut() {
            if let FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) = a {
                *e = cast(e.clone(), SqlType::BigInt(None));
            }
        }
    }
    let mut named = alias.take().unwrap_or_else(|| TableAlias {
        at: None,
        explicit: true,
        name: Ident::new("generate_series"),
        columns: vec![TableAliasColumnDef::from_name("generate_series")],
    });
    // `FROM generate_series(1, 3) g`: the column is `g`, as a function's
    // one column is named after its alias.
    if named.columns.is_empty() {
        named.columns = vec![TableAliasColumnDef::from_name(named.name.value.clone())];
    }
    let as_list = |factor: &TableFactor, alias: TableAlias| {
        let TableFactor::Table {
            args: Some(args), ..
        } = factor
        else {
            return None;
        };
        let args = args.args.iter().map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        });
        let mut alias = alias;
        let mut array_exprs = vec![call("generate_series", args.collect::<Option<_>>()?)];
        if ordinality {
            add_ordinality(&mut array_exprs, &mut alias);
        }
        Some(TableFactor::UNNEST {
            alias: Some(alias),
            array_exprs,
            with_offset: false,
            with_offset_alias: None,
            with_ordinality: false,
        })
    };
    // A table function has no `WITH ORDINALITY` in DataFusion: the list
    // form has.
    let listed = (view || ordinality) && constant;
    if !int4 {
        *alias = Some(named.clone());
        if let Some(unnest) = as_list(factor, named).filter(|_| listed) {
            *factor = unnest;
        }
        return;
    }
    // The factor, its alias taken, is DataFusion's `generate_series` with
    // its column `value`.
    let value = TableAlias {
        at: None,
        explicit: true,
        name: Ident::new("generate_series"),
        columns: vec![TableAliasColumnDef::from_name("value")],
    };
    let inner = match as_list(factor, value) {
        Some(unnest) if listed => unnest.to_string(),
        _ => factor.to_string(),
    };
    let select = format!("SELECT CAST(value AS integer) AS generate_series FROM {inner}");
    let Some(subquery) = parse(&select, |p| p.parse_query()) else {
        return;
    };
    *factor = TableFactor::Derived {
        lateral: false,
        sample: None,
        subquery,
        alias: Some(named),
    };
}

/// A `timestamp[tz]` written as text (`timestamp '…'`, `'…'::timestamp`),
/// as Weir's reading of the text (`weir_text_input`), which takes what
/// Postgres takes (no seconds, `T`, a zone).
fn timestamp_text(e: &Expr) -> Option<Expr> {
    use datafusion::arrow::datatypes::{DataType, TimeUnit};
    use datafusion::sql::sqlparser::ast::TimezoneInfo;
    let (data_type, text) = match e {
        Expr::TypedString(t) => (&t.data_type, &t.value.value),
        Expr::Cast {
            expr, data_type, ..
        } => match expr.as_ref() {
            Expr::Value(v) => (data_type, &v.value),
            _ => return None,
        },
        _ => return None,
    };
    let Value::SingleQuotedString(text) = text else {
        return None;
    };
    let zone = match data_type {
        SqlType::Timestamp(_, TimezoneInfo::None | TimezoneInfo::WithoutTimeZone) => None,
        SqlType::Timestamp(_, TimezoneInfo::WithTimeZone | TimezoneInfo::Tz) => {
            Some("+00:00".into())
        }
        _ => return None,
    };
    let arrow = DataType::Timestamp(TimeUnit::Nanosecond, zone).to_string();
    Some(call(
        "weir_text_input",
        vec![
            Expr::value(Value::SingleQuotedString(text.clone())),
            Expr::value(Value::SingleQuotedString(arrow)),
        ],
    ))
}

/// Whether Postgres would type all of `args` `integer` (or `smallint`):
/// numbers that fit in 32 bits, and casts to those types. Anything else
/// (a bigint, a column, an expression, a named argument) keeps the
/// series `bigint`.
fn int4_args(args: &[FunctionArg]) -> bool {
    fn int4(e: &Expr) -> bool {
        match e {
            Expr::Value(v) => match &v.value {
                Value::Number(n, _) => n.parse::<i32>().is_ok(),
                _ => false,
            },
            Expr::UnaryOp { expr, .. } | Expr::Nested(expr) => int4(expr),
            Expr::Cast { data_type, .. } => matches!(
                data_type,
                SqlType::Int(_)
                    | SqlType::Integer(_)
                    | SqlType::Int4(_)
                    | SqlType::SmallInt(_)
                    | SqlType::Int2(_)
            ),
            _ => false,
        }
    }
    !args.is_empty()
        && args
            .iter()
            .all(|a| matches!(a, FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) if int4(e)))
}

/// `CAST(expr AS data_type)`.
pub(crate) fn cast(expr: Expr, data_type: SqlType) -> Expr {
    Expr::Cast {
        kind: CastKind::Cast,
        expr: Box::new(expr),
        data_type,
        array: false,
        format: None,
    }
}

/// `FROM string_to_array(…) s`: a function that returns one value is, in
/// a Postgres `FROM`, a table of one row whose one column is named after
/// the alias (or the function). DataFusion takes only table functions
/// there, so it becomes `(SELECT f(…) AS s) AS s`.
fn scalar_in_from(factor: &mut TableFactor) {
    let TableFactor::Table {
        name,
        args: Some(args),
        alias,
        with_ordinality: false,
        ..
    } = factor
    else {
        return;
    };
    let Some(function) = last_name(name) else {
        return;
    };
    if !SCALARS_IN_FROM.contains(&function.as_str()) {
        return;
    }
    let alias = alias.clone().unwrap_or_else(|| TableAlias {
        at: None,
        explicit: true,
        name: Ident::new(function.clone()),
        columns: vec![],
    });
    let column = alias
        .columns
        .first()
        .map_or_else(|| alias.name.clone(), |c| c.name.clone());
    let call = Expr::Function(Function {
        name: name.clone(),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args.args.clone(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    });
    let select = format!(
        "SELECT {call} AS {}",
        crate::sql::stmt::quote_ident(&column.value)
    );
    let Some(mut parsed) = parse(&select, |p| p.parse_query()) else {
        return;
    };
    // The argument may itself need this file's rewrites.
    let _ = rewrite(&mut parsed);
    *factor = TableFactor::Derived {
        lateral: false,
        sample: None,
        subquery: parsed,
        alias: Some(TableAlias {
            columns: vec![],
            ..alias
        }),
    };
}

pub(super) fn last_name(name: &ObjectName) -> Option<String> {
    match name.0.last()? {
        ObjectNamePart::Identifier(i) => Some(crate::sql::stmt::ident(i)),
        _ => None,
    }
}

/// A name that is `x` or `pg_catalog.x`: `x`.
fn unqualified(name: &ObjectName) -> Option<String> {
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(i)] => Some(crate::sql::stmt::ident(i)),
        [ObjectNamePart::Identifier(s), ObjectNamePart::Identifier(i)]
            if crate::sql::stmt::ident(s) == "pg_catalog" =>
        {
            Some(crate::sql::stmt::ident(i))
        }
        _ => None,
    }
}

pub(crate) fn call(name: &str, args: Vec<Expr>) -> Expr {
    Expr::Function(Function {
        name: ObjectName::from(vec![Ident::new(name)]),
        uses_odbc_syntax: false,
        parameters: FunctionArguments::None,
        args: FunctionArguments::List(FunctionArgumentList {
            duplicate_treatment: None,
            args: args
                .into_iter()
                .map(|e| FunctionArg::Unnamed(FunctionArgExpr::Expr(e)))
                .collect(),
            clauses: vec![],
        }),
        filter: None,
        null_treatment: None,
        over: None,
        within_group: vec![],
    })
}

/// `jsonb`'s aggregates and set-returning functions, spelled with what
/// views maintain (see `planner::functions::jsonb`):
///
/// - `jsonb_agg(x …)` is `weir_jsonb_agg_finish(array_agg(to_jsonb(x) …))`,
///   its `DISTINCT`, `ORDER BY`, `FILTER` and `OVER` kept;
/// - `jsonb_object_agg(k, v …)` collects `jsonb_build_array(k, v)` pairs
///   the same way, which `weir_jsonb_object_agg_finish` makes an object;
/// - `jsonb_array_elements(j)`, `jsonb_array_elements_text(j)` and
///   `jsonb_object_keys(j)` are the `unnest` of a list of their rows.
fn jsonb_call(expr: &Expr) -> Option<Expr> {
    let Expr::Function(f) = expr else {
        return None;
    };
    let name = unqualified(&f.name)?;
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let args: Vec<Expr> = list
        .args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    let aggregate = |finish: &str, value: Expr| {
        let mut inner = f.clone();
        inner.name = ObjectName::from(vec![Ident::new("array_agg")]);
        if let FunctionArguments::List(l) = &mut inner.args {
            l.args = vec![FunctionArg::Unnamed(FunctionArgExpr::Expr(value))];
        }
        call(finish, vec![Expr::Function(inner)])
    };
    match (name.as_str(), args.as_slice()) {
        ("jsonb_agg", [x]) => Some(aggregate(
            "weir_jsonb_agg_finish",
            call("to_jsonb", vec![x.clone()]),
        )),
        ("jsonb_object_agg", [k, v]) => Some(aggregate(
            "weir_jsonb_object_agg_finish",
            call("jsonb_build_array", vec![k.clone(), v.clone()]),
        )),
        ("jsonb_array_elements" | "jsonb_array_elements_text" | "jsonb_object_keys", [j])
            if f.over.is_none() =>
        {
            Some(call(
                "unnest",
                vec![call(&format!("weir_{name}"), vec![j.clone()])],
            ))
        }
        _ => None,
    }
}

const REG_TYPES: &[&str] = &["regclass", "regtype", "regnamespace", "regproc", "regrole"];

/// The type Weir stores a Postgres type spelled with a schema, or as one of
/// the catalog's own types, as.
fn plain_type(t: &SqlType) -> Option<SqlType> {
    match t {
        SqlType::Custom(name, modifiers) if modifiers.is_empty() => {
            Some(match unqualified(name)?.as_str() {
                "text" | "name" | "char" | "bpchar" | "varchar" | "pg_node_tree" => SqlType::Text,
                "oid" | "int4" | "xid" | "cid" => SqlType::Int(None),
                "int2" => SqlType::SmallInt(None),
                "int8" => SqlType::BigInt(None),
                "bool" => SqlType::Boolean,
                "float4" => SqlType::Real,
                "float8" => SqlType::DoublePrecision,
                "int2vector" => array_of(SqlType::SmallInt(None)),
                "oidvector" => array_of(SqlType::Int(None)),
                _ => return None,
            })
        }
        SqlType::Array(ArrayElemTypeDef::SquareBracket(inner, size)) => plain_type(inner)
            .map(|i| SqlType::Array(ArrayElemTypeDef::SquareBracket(Box::new(i), *size))),
        _ => None,
    }
}

fn array_of(t: SqlType) -> SqlType {
    SqlType::Array(ArrayElemTypeDef::SquareBracket(Box::new(t), None))
}

fn rewrite_expr(expr: &Expr) -> Result<Option<Expr>> {
    if let Some(e) = jsonb_call(expr) {
        return Ok(Some(e));
    }
    // SQL's `localtimestamp` and `localtime`: the statement's time without
    // a time zone (Weir's zone is UTC).
    if let Some(to) = local_time(expr) {
        return Ok(parse(&format!("CAST(now() AS {to})"), |p| p.parse_expr()));
    }
    Ok(Some(match expr {
        // A bare `user` is SQL's `current_user` (a column of that name
        // must be quoted).
        Expr::Identifier(i) if i.quote_style.is_none() && i.value.eq_ignore_ascii_case("user") => {
            current_user()
        }
        Expr::Function(f)
            if matches!(f.args, FunctionArguments::None)
                && unqualified(&f.name).as_deref() == Some("user") =>
        {
            current_user()
        }
        // `j->-1`: Postgres reads `->` and `-1` (an operator ending in `-`
        // must hold one of `~!@#%^&|\`?`); sqlparser reads `->-`.
        Expr::BinaryOp {
            left,
            op: BinaryOperator::Custom(op),
            right,
        } if matches!(op.as_str(), "->-" | "->>-") => Expr::BinaryOp {
            left: left.clone(),
            op: if op == "->-" {
                BinaryOperator::Arrow
            } else {
                BinaryOperator::LongArrow
            },
            right: Box::new(Expr::UnaryOp {
                op: datafusion::sql::sqlparser::ast::UnaryOperator::Minus,
                expr: right.clone(),
            }),
        },
        Expr::BinaryOp {
            left,
            op: BinaryOperator::PGCustomBinaryOperator(parts),
            right,
        } => {
            let op = match parts.as_slice() {
                [schema, op] if schema.eq_ignore_ascii_case("pg_catalog") => op.as_str(),
                _ => return Ok(None),
            };
            let op = match op {
                "~" => BinaryOperator::PGRegexMatch,
                "~*" => BinaryOperator::PGRegexIMatch,
                "!~" => BinaryOperator::PGRegexNotMatch,
                "!~*" => BinaryOperator::PGRegexNotIMatch,
                "~~" => BinaryOperator::PGLikeMatch,
                "!~~" => BinaryOperator::PGNotLikeMatch,
                "~~*" => BinaryOperator::PGILikeMatch,
                "!~~*" => BinaryOperator::PGNotILikeMatch,
                "=" => BinaryOperator::Eq,
                "<>" | "!=" => BinaryOperator::NotEq,
                "<" => BinaryOperator::Lt,
                "<=" => BinaryOperator::LtEq,
                ">" => BinaryOperator::Gt,
                ">=" => BinaryOperator::GtEq,
                "||" => BinaryOperator::StringConcat,
                "+" => BinaryOperator::Plus,
                "-" => BinaryOperator::Minus,
                "*" => BinaryOperator::Multiply,
                "/" => BinaryOperator::Divide,
                other => {
                    return Err(ServerError::unsupported(format!(
                        "the operator pg_catalog.{other}"
                    )));
                }
            };
            Expr::BinaryOp {
                left: left.clone(),
                op,
                right: right.clone(),
            }
        }
        Expr::Collate { expr, collation } => {
            let name = unqualified(collation).unwrap_or_default();
            if !matches!(
                name.as_str(),
                "default" | "c" | "C" | "posix" | "POSIX" | "ucs_basic"
            ) {
                return Err(ServerError::unsupported(format!(
                    "the collation {collation}"
                )));
            }
            (**expr).clone()
        }
        Expr::Function(f) if f.name.0.len() == 2 => {
            let schema = match &f.name.0[0] {
                ObjectNamePart::Identifier(i) => crate::sql::stmt::ident(i),
                _ => return Ok(None),
            };
            // `information_schema._pg_expandarray(a)`: a set of (x, n)
            // records, which DataFusion has as the unnest of a list.
            if schema == "information_schema"
                && last_name(&f.name).as_deref() == Some("_pg_expandarray")
                && let FunctionArguments::List(list) = &f.args
                && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = list.args.as_slice()
            {
                return Ok(Some(call(
                    "unnest",
                    vec![call("weir_pg_expandarray", vec![arg.clone()])],
                )));
            }
            if schema != "pg_catalog" {
                return Ok(None);
            }
            let mut f = f.clone();
            f.name.0.remove(0);
            Expr::Function(f)
        }
        // `(record).field`, as Postgres reads a composite's field (JDBC's
        // `(information_schema._pg_expandarray(i.indkey)).n`).
        Expr::CompoundFieldAccess { root, access_chain }
            if access_chain
                .iter()
                .all(|a| matches!(a, AccessExpr::Dot(Expr::Identifier(_)))) =>
        {
            let mut e = match root.as_ref() {
                Expr::Nested(inner) => (**inner).clone(),
                other => other.clone(),
            };
            for a in access_chain {
                if let AccessExpr::Dot(Expr::Identifier(field)) = a {
                    let name = Expr::Value(
                        Value::SingleQuotedString(crate::sql::stmt::ident(field)).into(),
                    );
                    e = call("get_field", vec![e, name]);
                }
            }
            e
        }
        // `generate_subscripts(a, d)` in a select list (SQLAlchemy's key
        // columns, beside `unnest(a)`): the positions 1..n as rows, which
        // DataFusion zips with the other `unnest` as Postgres does.
        Expr::Function(f)
            if f.name.0.len() == 1
                && last_name(&f.name).as_deref() == Some("generate_subscripts")
                && let FunctionArguments::List(list) = &f.args
                && let [
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(array)),
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(dim)),
                ] = list.args.as_slice() =>
        {
            let bigint = |e: Expr| Expr::Cast {
                kind: CastKind::Cast,
                expr: Box::new(e),
                data_type: SqlType::BigInt(None),
                array: false,
                format: None,
            };
            call(
                "unnest",
                vec![call(
                    "generate_series",
                    vec![
                        bigint(Expr::value(Value::Number("1".into(), false))),
                        bigint(call("array_length", vec![array.clone(), dim.clone()])),
                    ],
                )],
            )
        }
        // `to_regclass('t')`, `to_regtype('int4')`: the oid, or NULL where
        // `::regclass` (`::regtype`) fails.
        Expr::Function(f)
            if f.name.0.len() == 1
                && last_name(&f.name).is_some_and(|n| n == "to_regclass" || n == "to_regtype") =>
        {
            let mut f = f.clone();
            let name = format!("weir_{}", last_name(&f.name).unwrap_or_default());
            f.name = ObjectName::from(vec![Ident::new(name)]);
            Expr::Function(f)
        }
        // `ARRAY(SELECT x FROM …)`: the rows' x as an array.
        Expr::Function(f)
            if last_name(&f.name).as_deref() == Some("array")
                && matches!(f.args, FunctionArguments::Subquery(_)) =>
        {
            let FunctionArguments::Subquery(q) = &f.args else {
                return Ok(None);
            };
            array_subquery(q).unwrap_or_else(|| expr.clone())
        }
        Expr::Exists { subquery, negated } => match decorrelate::exists(subquery, *negated) {
            Some(e) => e,
            None => return Ok(None),
        },
        Expr::Subquery(q) => match decorrelate::scalar_subquery(q) {
            Some(e) => e,
            None => return Ok(None),
        },
        Expr::Cast {
            kind,
            expr: inner,
            data_type,
            array,
            format,
        } => {
            let type_name = match data_type {
                SqlType::Custom(name, m) if m.is_empty() => unqualified(name),
                SqlType::Regclass => Some("regclass".to_string()),
                _ => None,
            };
            if let Some(reg) = type_name.as_deref().filter(|t| REG_TYPES.contains(t)) {
                return Ok(Some(call(&format!("weir_{reg}"), vec![(**inner).clone()])));
            }
            // `'t'::regclass::text` is the name again, as Postgres prints
            // a reg* value: looked up, then named.
            if matches!(
                data_type,
                SqlType::Text | SqlType::Varchar(_) | SqlType::CharacterVarying(_)
            ) && let Expr::Function(f) = unnested(inner)
                && let Some(reg) = last_name(&f.name).filter(|n| n.starts_with("weir_reg"))
                && let FunctionArguments::List(list) = &f.args
                && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = list.args.as_slice()
                && names_an_object(arg)
            {
                return Ok(Some(Expr::Cast {
                    kind: kind.clone(),
                    expr: Box::new(call(&reg, vec![unnested(inner).clone()])),
                    data_type: data_type.clone(),
                    array: *array,
                    format: format.clone(),
                }));
            }
            // `'t'::regclass::oid` is the oid already; `c.oid::regclass::oid`
            // is `c.oid`.
            if type_name.as_deref() == Some("oid")
                && let Expr::Function(f) = inner.as_ref()
                && last_name(&f.name).is_some_and(|n| n.starts_with("weir_reg"))
                && let FunctionArguments::List(list) = &f.args
                && let [FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))] = list.args.as_slice()
            {
                return Ok(Some(if names_an_object(arg) {
                    (**inner).clone()
                } else {
                    Expr::Cast {
                        kind: CastKind::Cast,
                        expr: Box::new(arg.clone()),
                        data_type: SqlType::Int(None),
                        array: false,
                        format: None,
                    }
                }));
            }
            let Some(plain) = plain_type(data_type) else {
                return Ok(None);
            };
            Expr::Cast {
                kind: kind.clone(),
                expr: inner.clone(),
                data_type: plain,
                array: *array,
                format: format.clone(),
            }
        }
        _ => return Ok(None),
    }))
}

/// `ARRAY(SELECT e FROM … [ORDER BY …])` as `(SELECT array_agg(e [ORDER BY
/// …]) FROM …)`, when the subquery is a plain `SELECT` of one column.
fn array_subquery(q: &Query) -> Option<Expr> {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    if let Some(e) = array_over_unnest(select) {
        return Some(e);
    }
    if reads_unfilled_options(select) {
        return Some(Expr::Cast {
            kind: CastKind::Cast,
            expr: Box::new(call("make_array", vec![])),
            data_type: array_of(SqlType::Text),
            array: false,
            format: None,
        });
    }
    if select.projection.len() != 1
        || select.distinct.is_some()
        || !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
        || select.having.is_some()
        || q.limit_clause.is_some()
    {
        return None;
    }
    let item = match &select.projection[0] {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e.clone(),
        _ => return None,
    };
    let mut agg = call("array_agg", vec![item.clone()]);
    if let (Expr::Function(f), Some(order)) = (&mut agg, &q.order_by)
        && let datafusion::sql::sqlparser::ast::OrderByKind::Expressions(exprs) = &order.kind
        && let FunctionArguments::List(list) = &mut f.args
    {
        let exprs = exprs
            .iter()
            .map(|o| {
                let mut o = o.clone();
                // `ORDER BY 1` names the one column.
                if matches!(&o.expr, Expr::Value(v) if v.value == Value::Number("1".into(), false))
                {
                    o.expr = item.clone();
                }
                o
            })
            .collect();
        list.clauses
            .push(datafusion::sql::sqlparser::ast::FunctionArgumentClause::OrderBy(exprs));
    }
    let mut inner = (**select).clone();
    inner.projection = vec![SelectItem::UnnamedExpr(agg)];
    // Over no rows, `ARRAY(…)` is an empty array where `array_agg` is NULL.
    Some(call(
        "coalesce",
        vec![
            Expr::Subquery(Box::new(Query {
                body: Box::new(SetExpr::Select(Box::new(inner))),
                order_by: None,
                ..q.clone()
            })),
            call("make_array", vec![]),
        ],
    ))
}

/// The options columns of the catalogs, which Weir never fills (they are
/// always NULL).
const OPTIONS_COLUMNS: &[&str] = &[
    "attfdwoptions",
    "attoptions",
    "reloptions",
    "ftoptions",
    "srvoptions",
    "fdwoptions",
    "umoptions",
];

/// `SELECT … FROM pg_options_to_table(c.reloptions)`: no rows, as the
/// options are NULL.
fn reads_unfilled_options(select: &Select) -> bool {
    let [from] = select.from.as_slice() else {
        return false;
    };
    let TableFactor::Table {
        name,
        args: Some(args),
        ..
    } = &from.relation
    else {
        return false;
    };
    let column = match args.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Identifier(i)))] => Some(i),
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::CompoundIdentifier(parts)))] => {
            parts.last()
        }
        _ => None,
    };
    from.joins.is_empty()
        && last_name(name).as_deref() == Some("pg_options_to_table")
        && column.is_some_and(|c| OPTIONS_COLUMNS.contains(&crate::sql::stmt::ident(c).as_str()))
}

/// `ARRAY(SELECT 'p' || x FROM unnest(a) x)`: the elements of `a`, each
/// between two texts. DataFusion does not plan an `unnest` of the outer
/// query's column, which is where psql's `\d+` uses this.
fn array_over_unnest(select: &Select) -> Option<Expr> {
    let [from] = select.from.as_slice() else {
        return None;
    };
    let TableFactor::UNNEST {
        alias: Some(alias),
        array_exprs,
        with_offset: false,
        with_ordinality: false,
        ..
    } = &from.relation
    else {
        return None;
    };
    let [array] = array_exprs.as_slice() else {
        return None;
    };
    if !from.joins.is_empty() || select.selection.is_some() || select.projection.len() != 1 {
        return None;
    }
    let column = alias.columns.first().map_or(&alias.name, |c| &c.name);
    let is_element = |e: &Expr| matches!(e, Expr::Identifier(i) if i.value == column.value);
    let text = |e: &Expr| match e {
        Expr::Value(v) if matches!(v.value, Value::SingleQuotedString(_)) => Some(e.clone()),
        _ => None,
    };
    let empty = || Expr::Value(Value::SingleQuotedString(String::new()).into());
    let item = match &select.projection[0] {
        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } => e,
        _ => return None,
    };
    let concat = |e: &Expr| match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::StringConcat,
            right,
        } => Some((left.as_ref().clone(), right.as_ref().clone())),
        _ => None,
    };
    let (prefix, suffix) = if is_element(item) {
        (empty(), empty())
    } else {
        let (l, r) = concat(item)?;
        if is_element(&r) {
            (text(&l)?, empty())
        } else if is_element(&l) {
            (empty(), text(&r)?)
        } else {
            let (ll, lr) = concat(&l)?;
            if !is_element(&lr) {
                return None;
            }
            (text(&ll)?, text(&r)?)
        }
    };
    Some(call(
        "weir_array_concat_each",
        vec![prefix, array.clone(), suffix],
    ))
}

/// `SELECT generate_series(1, 3)` is three rows in Postgres; DataFusion's
/// `generate_series` is one array, which `unnest` makes the rows.
fn series_as_rows(select: &mut Select) {
    let is_series = |e: &Expr| {
        matches!(e, Expr::Function(f)
            if last_name(&f.name).as_deref() == Some("generate_series")
                && matches!(f.args, FunctionArguments::List(_)))
    };
    for item in select.projection.iter_mut() {
        match item {
            SelectItem::UnnamedExpr(e) if is_series(e) => {
                *item = SelectItem::ExprWithAlias {
                    expr: series_rows(e),
                    alias: Ident::with_quote('"', "generate_series"),
                };
            }
            SelectItem::ExprWithAlias { expr, .. } if is_series(expr) => {
                *expr = series_rows(expr);
            }
            _ => {}
        }
    }
}

/// `unnest(generate_series(…))`, cast back to `integer` when Postgres
/// would type the arguments so (see `int4_args`).
fn series_rows(series: &Expr) -> Expr {
    let rows = call("unnest", vec![series.clone()]);
    let Expr::Function(f) = series else {
        return rows;
    };
    match &f.args {
        FunctionArguments::List(list) if int4_args(&list.args) => {
            cast(rows, SqlType::Integer(None))
        }
        _ => rows,
    }
}

fn prune_set_expr(body: &mut SetExpr) {
    if let SetExpr::Select(select) = body {
        series_as_rows(select);
    }
    match body {
        SetExpr::Select(select) => prune_select(select),
        SetExpr::SetOperation { left, right, .. } => {
            prune_set_expr(left);
            prune_set_expr(right);
        }
        _ => {}
    }
}

/// Whether `factor` is a catalog table Weir never fills.
fn is_empty_table(factor: &TableFactor) -> bool {
    let TableFactor::Table { name, .. } = factor else {
        return false;
    };
    match name.0.as_slice() {
        [ObjectNamePart::Identifier(s), ObjectNamePart::Identifier(t)] => {
            crate::sql::stmt::ident(s) == "pg_catalog"
                && EMPTY_TABLES.contains(&crate::sql::stmt::ident(t).as_str())
        }
        _ => false,
    }
}

const AGGREGATES: &[&str] = &[
    "count",
    "sum",
    "min",
    "max",
    "avg",
    "string_agg",
    "array_agg",
    "bool_and",
    "bool_or",
    "every",
    "json_agg",
    "jsonb_agg",
];

/// Whether `select`'s own projection aggregates (an aggregate inside a
/// subquery there is the subquery's).
pub(super) fn has_aggregate(select: &Select) -> bool {
    let mut found = false;
    let mut items = select.projection.clone();
    let _ = datafusion::sql::sqlparser::ast::visit_expressions_mut(&mut items, |e| {
        if matches!(
            e,
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. }
        ) {
            *e = Expr::Value(Value::Null.into());
        }
        ControlFlow::<()>::Continue(())
    });
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(&items, |e| {
        found |= is_aggregate(e);
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Whether `e` is a call of an aggregate function (not as a window).
pub(super) fn is_aggregate(e: &Expr) -> bool {
    matches!(e, Expr::Function(f) if f.over.is_none()
        && last_name(&f.name).is_some_and(|n| AGGREGATES.contains(&n.as_str())))
}

fn prune_select(select: &mut Select) {
    use datafusion::sql::sqlparser::ast::JoinOperator as J;
    let reads_empty = select.from.iter().any(|twj| {
        is_empty_table(&twj.relation)
            || twj.joins.iter().any(|j| {
                matches!(
                    j.join_operator,
                    J::Join(_) | J::Inner(_) | J::CrossJoin(_) | J::LeftSemi(_) | J::RightSemi(_)
                ) && is_empty_table(&j.relation)
            })
    });
    let grouped = !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
        || select.having.is_some();
    if !reads_empty || grouped || has_aggregate(select) {
        return;
    }
    select.selection = Some(Expr::Value(Value::Boolean(false).into()));
    // DataFusion wants the columns' names distinct, which Postgres does
    // not: a repeated one gets a suffix.
    let mut names = std::collections::HashSet::new();
    for (i, item) in select.projection.iter_mut().enumerate() {
        let (expr, alias) = match item {
            SelectItem::UnnamedExpr(e) => (e.clone(), None),
            SelectItem::ExprWithAlias { expr, alias } => (expr.clone(), Some(alias.clone())),
            _ => continue,
        };
        if matches!(
            expr,
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Value(_)
        ) {
            continue;
        }
        let mut alias = alias.unwrap_or_else(|| {
            Ident::with_quote(
                '"',
                crate::sql::stmt::pg_name(&expr).unwrap_or_else(|| format!("?column{i}?")),
            )
        });
        if !names.insert(alias.value.clone()) {
            alias = Ident::with_quote('"', format!("{}_{}", alias.value, i + 1));
        }
        *item = SelectItem::ExprWithAlias {
            expr: Expr::Value(Value::Null.into()),
            alias,
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::ast::Statement;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn rw(sql: &str) -> String {
        let mut stmts = Parser::parse_sql(&PostgreSqlDialect {}, sql).unwrap();
        let Statement::Query(mut q) = stmts.remove(0) else {
            panic!()
        };
        rewrite(&mut q).unwrap();
        q.to_string()
    }

    #[test]
    fn psql_spellings() {
        assert_eq!(
            rw(
                "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname OPERATOR(pg_catalog.~) '^(t)$' COLLATE pg_catalog.default AND pg_catalog.pg_table_is_visible(c.oid)"
            ),
            "SELECT c.oid FROM pg_catalog.pg_class c WHERE c.relname ~ '^(t)$' AND pg_table_is_visible(c.oid)"
        );
        assert_eq!(
            rw(
                "SELECT c.oid::pg_catalog.regclass::pg_catalog.text, 'x'::regclass::oid, a::oid FROM pg_class"
            ),
            "SELECT weir_regclass(c.oid)::TEXT, weir_regclass('x'), a::INT FROM pg_catalog.pg_class"
        );
        // A name looked up and printed is the name again.
        assert_eq!(
            rw("SELECT 't'::regclass::text"),
            "SELECT weir_regclass(weir_regclass('t'))::TEXT"
        );
    }

    #[test]
    fn selects_over_empty_catalogs_read_nothing() {
        assert_eq!(
            rw(
                "SELECT pol.polname, array_to_string(array(select 1), ',') AS r FROM pg_catalog.pg_policy pol WHERE pol.polrelid = 1 ORDER BY 1"
            ),
            "SELECT pol.polname, NULL AS r FROM pg_catalog.pg_policy pol WHERE false ORDER BY 1"
        );
        // An aggregate has a row even over no rows; an outer join keeps its
        // left side.
        let kept = "SELECT count(*) FROM pg_catalog.pg_policy";
        assert_eq!(rw(kept), kept);
        let kept = "SELECT c.relname FROM pg_catalog.pg_class AS c LEFT JOIN pg_catalog.pg_inherits AS i ON i.inhrelid = c.oid";
        assert_eq!(rw(kept), kept);
    }

    #[test]
    fn printed_reg_values_are_names_and_compared_ones_oids() {
        assert_eq!(
            rw("SELECT 't'::regclass, x FROM a WHERE oid = 't'::regclass"),
            "SELECT weir_regclass(weir_regclass('t')), x FROM a WHERE oid = weir_regclass('t')"
        );
        assert_eq!(
            rw("SELECT information_schema._pg_expandarray(i.indkey) AS keys FROM pg_index i"),
            "SELECT unnest(weir_pg_expandarray(i.indkey)) AS keys FROM pg_catalog.pg_index i"
        );
    }

    #[test]
    fn correlated_lookups_aggregate_and_lift_outer_conditions() {
        assert_eq!(
            rw(
                "SELECT (SELECT pg_catalog.pg_get_expr(d.adbin, d.adrelid, true) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef) FROM pg_catalog.pg_attribute a"
            ),
            "SELECT CASE WHEN a.atthasdef THEN (SELECT max(pg_get_expr(d.adbin, d.adrelid, true)) FROM pg_catalog.pg_attrdef d WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum) END FROM pg_catalog.pg_attribute a"
        );
        assert_eq!(
            rw(
                "SELECT (SELECT c.collname FROM pg_catalog.pg_collation c, pg_catalog.pg_type t WHERE c.oid = a.attcollation AND t.oid = a.atttypid AND a.attcollation <> t.typcollation) AS attcollation FROM pg_catalog.pg_attribute a"
            ),
            "SELECT CASE WHEN a.attcollation <> (SELECT max(t.typcollation) FROM pg_catalog.pg_type t WHERE t.oid = a.atttypid) THEN (SELECT max(c.collname) FROM pg_catalog.pg_collation c WHERE c.oid = a.attcollation) END AS attcollation FROM pg_catalog.pg_attribute a"
        );
        assert_eq!(
            rw(
                "SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_constraint WHERE conrelid = i.indrelid AND condeferrable) FROM pg_catalog.pg_index i"
            ),
            "SELECT coalesce((SELECT max(true) FROM pg_catalog.pg_constraint WHERE conrelid = i.indrelid AND condeferrable), false) FROM pg_catalog.pg_index i"
        );
        // A user's own tables keep Postgres's semantics: a second row is an
        // error (`outer_refs.rs`), not the larger of the two.
        assert_eq!(
            rw("SELECT (SELECT o.amount FROM orders o WHERE o.id = c.id) FROM customers c"),
            "SELECT weir_one_row((SELECT count(*) FROM orders o WHERE o.id = c.id), \
             (SELECT max(o.amount) FROM orders o WHERE o.id = c.id)) FROM customers c"
        );
    }

    #[test]
    fn arrays_of_subqueries() {
        assert_eq!(
            rw("SELECT ARRAY(SELECT 'toast.' || x FROM pg_catalog.unnest(tc.reloptions) x)"),
            "SELECT weir_array_concat_each('toast.', tc.reloptions, '')"
        );
        assert_eq!(
            rw("SELECT ARRAY(SELECT relname FROM pg_class ORDER BY 1)"),
            "SELECT coalesce((SELECT array_agg(relname ORDER BY relname) FROM pg_catalog.pg_class), make_array())"
        );
    }

    #[test]
    fn other_collations_are_refused() {
        let mut stmts =
            Parser::parse_sql(&PostgreSqlDialect {}, "SELECT 'a' COLLATE \"de_DE\"").unwrap();
        let Statement::Query(q) = &mut stmts[0] else {
            panic!()
        };
        assert!(rewrite(q).is_err());
    }
}

//! `FROM t, generate_series(1, t.n) AS g`: a set-returning function in
//! `FROM` over another item's columns (implicitly `LATERAL` in Postgres,
//! and the usual way to take a `jsonb` array apart: `FROM orders o,
//! jsonb_array_elements(o.doc -> 'items') AS item`).
//!
//! DataFusion plans neither a table function nor an `UNNEST` over outer
//! columns, but it plans `unnest` in a select list, and a view maintains
//! that as its `Unnest` operator. So the item before the function, `t`,
//! becomes `(SELECT t.*, unnest(generate_series(1, t.n)) AS g FROM t) AS
//! t`: one row per element, under `t`'s own name, so that `t.a` still
//! means what it meant. What named the function's columns is renamed to
//! match: `g.g` is `t.g`, `t.*` leaves the function's columns out and
//! `g.*` is just them. Several functions side by side nest, one level each,
//! which is Postgres's cross product of them.
//!
//! `LEFT JOIN f(t.x) ON true` adds, by `UNION ALL`, the rows of `t` whose
//! lists are all empty or NULL, once each with the function's columns NULL.
//!
//! Only a function after a single item, by a comma, `CROSS JOIN`, `JOIN …
//! ON true` or `LEFT JOIN … ON true`, is rewritten; anything else over
//! columns stays `0A000`.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    ExcludeSelectItem, Expr, FunctionArg, FunctionArgExpr, Ident, JoinConstraint, JoinOperator,
    ObjectName, Query, Select, SelectItem, SelectItemQualifiedWildcardKind, SetExpr, TableAlias,
    TableFactor, TableWithJoins, Value, VisitMut, VisitorMut, WildcardAdditionalOptions,
};

use super::{JSONB_ROWS, call, cast, jsonb_rows, last_name, ordinality_list, parse};

/// A set-returning function over columns, as the lists to unnest in step.
struct Rows {
    arrays: Vec<Expr>,
    /// The names of its columns, one per list.
    columns: Vec<Ident>,
    /// What qualifies them: its alias, or the function's name.
    qualifier: Ident,
    /// `FROM t, jsonb_array_elements(t.doc) AS e`: Postgres's column is
    /// `value`, and `e` alone (the row of a function of one column) is that
    /// value too. The alias, when it so names the one column.
    whole_row: Option<Ident>,
}

/// Rewrites every `SELECT` of `query`'s body (not its subqueries, which
/// the visitor reaches on its own).
pub(super) fn rewrite(query: &mut Query) {
    let top = matches!(query.body.as_ref(), SetExpr::Select(_));
    let mut renames = Vec::new();
    rewrite_set_expr(&mut query.body, &mut renames);
    // `ORDER BY g.g` of a query whose body is the select.
    if top {
        for (rename, whole_row) in renames {
            if let Some(rename) = rename {
                let _ = query.order_by.visit(&mut Renamer(&[rename]));
            }
            if let Some(mut w) = whole_row {
                let _ = query.order_by.visit(&mut w);
            }
        }
    }
}

/// Per rewrite: the qualifier renamed (if any), the whole-row reference.
type Renames = Vec<(Option<(Ident, Ident)>, Option<WholeRow>)>;

fn rewrite_set_expr(body: &mut SetExpr, renames: &mut Renames) {
    match body {
        SetExpr::Select(select) => {
            while let Some(rename) = rewrite_one(select) {
                renames.push((Some(rename.0), rename.1));
            }
            if let Some(mut w) = sole_whole_row(select) {
                let _ = select.visit(&mut w);
                renames.push((None, Some(w)));
            }
        }
        SetExpr::SetOperation { left, right, .. } => {
            rewrite_set_expr(left, &mut Vec::new());
            rewrite_set_expr(right, &mut Vec::new());
        }
        _ => {}
    }
}

/// Rewrites the first function over columns that follows a single item;
/// returns the rename of its qualifier to that item's name, and of its
/// whole-row reference.
fn rewrite_one(select: &mut Select) -> Option<((Ident, Ident), Option<WholeRow>)> {
    let (rows, position) = find(select)?;
    let item = &mut select.from[0].relation;
    let name = item_name(item)?;
    let list = rows
        .arrays
        .iter()
        .zip(&rows.columns)
        .map(|(a, c)| format!("{} AS {c}", call("unnest", vec![a.clone()])))
        .collect::<Vec<_>>()
        .join(", ");
    // A column of the item named as the whole-row reference makes the
    // reference ambiguous: a duplicate name here, an error, as it should.
    let guard = rows
        .whole_row
        .as_ref()
        .map(|w| format!(", NULL AS {w}"))
        .unwrap_or_default();
    let mut sql = format!("SELECT {name}.*, {list}{guard} FROM {item}");
    if let Position::Joined { outer: true } = position {
        // The rows whose lists are all empty or NULL, once each, padded.
        let lengths = rows
            .arrays
            .iter()
            .map(|a| call("cardinality", vec![a.clone()]).to_string())
            .collect::<Vec<_>>()
            .join(", ");
        let nulls = rows
            .columns
            .iter()
            .map(|c| format!("NULL AS {c}"))
            .collect::<Vec<_>>()
            .join(", ");
        sql.push_str(&format!(
            " UNION ALL SELECT {name}.*, {nulls}{guard} FROM {item} \
             WHERE coalesce(greatest({lengths}), 0) = 0"
        ));
    }
    let subquery = parse(&sql, |p| p.parse_query())?;
    *item = TableFactor::Derived {
        lateral: false,
        subquery,
        alias: Some(TableAlias {
            explicit: true,
            at: None,
            name: name.clone(),
            columns: vec![],
        }),
        sample: None,
    };
    match position {
        Position::Listed => {
            select.from.remove(1);
        }
        Position::Joined { .. } => {
            select.from[0].joins.remove(0);
        }
    }
    wildcards(select, &name, &rows);
    let rename = (rows.qualifier.clone(), name.clone());
    let _ = select.visit(&mut Renamer(std::slice::from_ref(&rename)));
    let whole_row = rows.whole_row.map(|alias| WholeRow {
        alias,
        to: [name, rows.columns[0].clone()],
    });
    if let Some(mut w) = whole_row.clone() {
        let _ = select.visit(&mut w);
    }
    Some((rename, whole_row))
}

enum Position {
    /// `FROM t, f(t.x)`.
    Listed,
    /// `FROM t CROSS JOIN f(t.x)`, `FROM t JOIN f(t.x) ON true`; with
    /// `outer`, `FROM t LEFT JOIN f(t.x) ON true`: a row of `t` whose
    /// function gives no rows goes out once, the function's columns NULL.
    Joined { outer: bool },
}

/// The function over columns right after the first `FROM` item, if that
/// item stands alone.
fn find(select: &Select) -> Option<(Rows, Position)> {
    let first = select.from.first()?;
    if let Some(join) = first.joins.first() {
        let on_true = |on: &Expr| matches!(on, Expr::Value(v) if v.value == Value::Boolean(true));
        let outer = match &join.join_operator {
            JoinOperator::CrossJoin(JoinConstraint::None) => false,
            JoinOperator::Join(JoinConstraint::On(on))
            | JoinOperator::Inner(JoinConstraint::On(on))
                if on_true(on) =>
            {
                false
            }
            JoinOperator::Left(JoinConstraint::On(on))
            | JoinOperator::LeftOuter(JoinConstraint::On(on))
                if on_true(on) =>
            {
                true
            }
            _ => return None,
        };
        return rows_of(&join.relation).map(|r| (r, Position::Joined { outer }));
    }
    let second: &TableWithJoins = select.from.get(1)?;
    rows_of(&second.relation).map(|r| (r, Position::Listed))
}

/// Whether `factor` is a set-returning function over columns (one left
/// where this module does not rewrite it is `0A000`).
pub(super) fn is_over_columns(factor: &TableFactor) -> bool {
    rows_of(factor).is_some()
}

/// `factor` as the lists of a set-returning function over columns.
fn rows_of(factor: &TableFactor) -> Option<Rows> {
    let (name, args, alias, ordinality) = match factor {
        TableFactor::Table {
            name,
            args: Some(args),
            alias,
            with_ordinality,
            ..
        } => (name, args.args.as_slice(), alias, *with_ordinality),
        TableFactor::Function {
            name,
            args,
            alias,
            with_ordinality,
            ..
        } => (name, args.as_slice(), alias, *with_ordinality),
        TableFactor::UNNEST {
            alias,
            array_exprs,
            with_ordinality,
            with_offset: false,
            ..
        } if over_columns(array_exprs.iter()) => {
            return named(
                array_exprs.clone(),
                alias.clone(),
                "unnest",
                *with_ordinality,
            );
        }
        _ => return None,
    };
    let args: Vec<Expr> = args
        .iter()
        .map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Some(e.clone()),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if !over_columns(args.iter()) {
        return None;
    }
    let function = last_name(name)?;
    match function.as_str() {
        "generate_series" => {
            // Two arguments are integers (see `series_in_from`).
            let args = if args.len() == 2 {
                args.into_iter()
                    .map(|a| match a {
                        Expr::Cast { .. } => a,
                        a => cast(a, datafusion::sql::sqlparser::ast::DataType::BigInt(None)),
                    })
                    .collect()
            } else {
                args
            };
            named(
                vec![call("generate_series", args)],
                alias.clone(),
                "generate_series",
                ordinality,
            )
        }
        "unnest" => named(args, alias.clone(), "unnest", ordinality),
        f if JSONB_ROWS.contains(&f) => {
            let [arg] = args.as_slice() else {
                return None;
            };
            let (mut arrays, alias) = jsonb_rows(f, arg, alias.clone());
            let mut columns: Vec<Ident> = alias.columns.iter().map(|c| c.name.clone()).collect();
            if ordinality {
                ordinal(&mut arrays, &mut columns);
            }
            if columns.len() != arrays.len() {
                return None;
            }
            let whole_row = (columns.len() == 1
                && crate::sql::stmt::ident(&columns[0]) != crate::sql::stmt::ident(&alias.name))
            .then(|| alias.name.clone());
            Some(Rows {
                arrays,
                columns,
                qualifier: alias.name,
                whole_row,
            })
        }
        _ => None,
    }
}

/// A function of one column per list, named as Postgres names them: after
/// the alias's column list, else (one list) after the alias, else after the
/// function.
fn named(
    mut arrays: Vec<Expr>,
    alias: Option<TableAlias>,
    function: &str,
    ordinality: bool,
) -> Option<Rows> {
    let qualifier = alias
        .as_ref()
        .map(|a| a.name.clone())
        .unwrap_or_else(|| Ident::new(function));
    let mut columns: Vec<Ident> = match alias {
        Some(a) if !a.columns.is_empty() => a.columns.into_iter().map(|c| c.name).collect(),
        _ if arrays.len() == 1 => vec![qualifier.clone()],
        // `unnest(a, b)` without names: Postgres calls both `unnest`,
        // which no query can tell apart; refused.
        _ => return None,
    };
    if ordinality {
        ordinal(&mut arrays, &mut columns);
    }
    (columns.len() == arrays.len()).then_some(Rows {
        arrays,
        columns,
        qualifier,
        whole_row: None,
    })
}

/// `WITH ORDINALITY`: the positions as one more list, named `ordinality`
/// unless the alias named it.
fn ordinal(arrays: &mut Vec<Expr>, columns: &mut Vec<Ident>) {
    let n = arrays.len();
    arrays.push(ordinality_list(arrays));
    if columns.len() == n {
        columns.push(Ident::new("ordinality"));
    }
}

/// Whether any of `exprs` reads a column.
fn over_columns<'a>(exprs: impl Iterator<Item = &'a Expr>) -> bool {
    exprs.into_iter().any(|e| {
        datafusion::sql::sqlparser::ast::visit_expressions(e, |e| {
            if matches!(e, Expr::Identifier(_) | Expr::CompoundIdentifier(_)) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .is_break()
    })
}

/// The name that qualifies `item`'s columns: its alias, or its table's
/// name; `None` for an item that has neither.
fn item_name(item: &TableFactor) -> Option<Ident> {
    match item {
        TableFactor::Table { alias: Some(a), .. } | TableFactor::Derived { alias: Some(a), .. } => {
            Some(a.name.clone())
        }
        TableFactor::Table {
            name, args: None, ..
        } => match name.0.last()? {
            datafusion::sql::sqlparser::ast::ObjectNamePart::Identifier(i) => Some(i.clone()),
            _ => None,
        },
        _ => None,
    }
}

/// `t.*` leaves the function's columns out; `g.*` is just them; `*` leaves
/// out the guard of a whole-row reference.
fn wildcards(select: &mut Select, name: &Ident, rows: &Rows) {
    let same = |a: &Ident, b: &Ident| crate::sql::stmt::ident(a) == crate::sql::stmt::ident(b);
    let exclude = |opts: &mut WildcardAdditionalOptions,
                   names: &mut dyn Iterator<Item = &Ident>| {
        let mut out: Vec<ObjectName> = match opts.opt_exclude.take() {
            Some(ExcludeSelectItem::Single(i)) => vec![i],
            Some(ExcludeSelectItem::Multiple(v)) => v,
            None => vec![],
        };
        out.extend(names.map(|c| ObjectName::from(vec![c.clone()])));
        if !out.is_empty() {
            opts.opt_exclude = Some(ExcludeSelectItem::Multiple(out));
        }
    };
    let mut items = Vec::with_capacity(select.projection.len());
    for item in std::mem::take(&mut select.projection) {
        match item {
            SelectItem::QualifiedWildcard(SelectItemQualifiedWildcardKind::ObjectName(q), _)
                if single(&q).is_some_and(|q| same(q, &rows.qualifier)) =>
            {
                items.extend(rows.columns.iter().map(|c| {
                    SelectItem::UnnamedExpr(Expr::CompoundIdentifier(vec![name.clone(), c.clone()]))
                }));
            }
            SelectItem::QualifiedWildcard(
                SelectItemQualifiedWildcardKind::ObjectName(q),
                mut opts,
            ) if single(&q).is_some_and(|q| same(q, name)) => {
                exclude(&mut opts, &mut rows.columns.iter().chain(&rows.whole_row));
                items.push(SelectItem::QualifiedWildcard(
                    SelectItemQualifiedWildcardKind::ObjectName(q),
                    opts,
                ));
            }
            SelectItem::Wildcard(mut opts) => {
                exclude(&mut opts, &mut rows.whole_row.iter());
                items.push(SelectItem::Wildcard(opts));
            }
            other => items.push(other),
        }
    }
    select.projection = items;
}

fn single(name: &ObjectName) -> Option<&Ident> {
    match name.0.as_slice() {
        [datafusion::sql::sqlparser::ast::ObjectNamePart::Identifier(i)] => Some(i),
        _ => None,
    }
}

/// `SELECT e FROM jsonb_array_elements('[…]') AS e`: the function alone
/// in `FROM` (so no other item can have a column `e`), its one column
/// `value` named by the alias as a whole row.
fn sole_whole_row(select: &Select) -> Option<WholeRow> {
    let [item] = select.from.as_slice() else {
        return None;
    };
    if !item.joins.is_empty() {
        return None;
    }
    let TableFactor::UNNEST {
        alias: Some(alias),
        array_exprs,
        ..
    } = &item.relation
    else {
        return None;
    };
    let one_value = matches!(array_exprs.first(), Some(Expr::Function(f))
        if matches!(last_name(&f.name).as_deref(),
            Some("weir_jsonb_array_elements" | "weir_jsonb_array_elements_text")));
    // With `WITH ORDINALITY`, `e` is a row of two columns.
    let [value] = alias.columns.as_slice() else {
        return None;
    };
    let value = value.name.clone();
    (one_value
        && crate::sql::stmt::ident(&value) == "value"
        && crate::sql::stmt::ident(&alias.name) != "value")
        .then(|| WholeRow {
            alias: alias.name.clone(),
            to: [alias.name.clone(), value],
        })
}

/// `e` alone, the row of a function of one column, is `t.value`.
#[derive(Clone)]
struct WholeRow {
    alias: Ident,
    to: [Ident; 2],
}

impl VisitorMut for WholeRow {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::Identifier(i) = expr
            && crate::sql::stmt::ident(i) == crate::sql::stmt::ident(&self.alias)
        {
            *expr = Expr::CompoundIdentifier(self.to.to_vec());
        }
        ControlFlow::Continue(())
    }
}

/// `g.x` is `t.x`, for each `(g, t)`.
struct Renamer<'a>(&'a [(Ident, Ident)]);

impl VisitorMut for Renamer<'_> {
    type Break = ();

    fn pre_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        if let Expr::CompoundIdentifier(parts) = expr
            && parts.len() == 2
            && let Some((_, to)) = self.0.iter().find(|(from, _)| {
                crate::sql::stmt::ident(from) == crate::sql::stmt::ident(&parts[0])
            })
        {
            parts[0] = to.clone();
        }
        ControlFlow::Continue(())
    }
}

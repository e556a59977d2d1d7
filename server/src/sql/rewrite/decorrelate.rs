//! Correlated scalar subqueries over the catalogs, reshaped into the form
//! DataFusion decorrelates.
//!
//! Clients look up one value per row with a subquery such as psql's
//!
//! ```sql
//! (SELECT pg_get_expr(d.adbin, d.adrelid, true) FROM pg_attrdef d
//!  WHERE d.adrelid = a.attrelid AND d.adnum = a.attnum AND a.atthasdef)
//! ```
//!
//! Postgres runs it once per outer row and fails if it yields two rows.
//! DataFusion turns a correlated subquery into a join, which it can only do
//! when the subquery aggregates and when every condition that names the
//! outer query is an equality between an inner and an outer expression. So
//! the subquery, when it reads only catalog tables and does not aggregate,
//! is rewritten:
//!
//! - its one column becomes `max(column)`: the same value when there is at
//!   most one row, which is what Postgres requires of it anyway;
//! - a condition on the outer row alone (`a.atthasdef`) moves outside, as
//!   `CASE WHEN a.atthasdef THEN (SELECT …) END`;
//! - a comparison of the outer row with one inner table that is otherwise
//!   tied only to the outer row (`a.attcollation <> t.typcollation`, with
//!   `t.oid = a.atttypid`) moves outside as well, comparing with a subquery
//!   of its own over that table (`a.attcollation <> (SELECT max(t.typcollation)
//!   FROM pg_type t WHERE t.oid = a.atttypid)`), and the table leaves the
//!   first subquery.
//!
//! A subquery of any other shape is left as it is, and DataFusion's own
//! error says what it cannot plan.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, GroupByExpr, ObjectNamePart, Query, Select, SelectItem, SetExpr,
    TableFactor, TableWithJoins, visit_expressions,
};

use super::{call, has_aggregate};

/// What an expression refers to: the inner query's tables by alias, and
/// whether anything outside the subquery.
#[derive(Default)]
struct Refs {
    inner: BTreeSet<String>,
    outer: bool,
}

fn refs(expr: &Expr, aliases: &BTreeSet<String>) -> Refs {
    let mut r = Refs::default();
    let _ = visit_expressions(expr, |e| {
        match e {
            Expr::CompoundIdentifier(parts) if parts.len() >= 2 => {
                let q = crate::sql::stmt::ident(&parts[parts.len() - 2]);
                if aliases.contains(&q) {
                    r.inner.insert(q);
                } else {
                    r.outer = true;
                }
            }
            // An unqualified column is taken to be the inner query's, as
            // SQL resolves it there first: its one table's, or of a table
            // not known.
            Expr::Identifier(_) => {
                r.inner
                    .insert(match aliases.iter().collect::<Vec<_>>().as_slice() {
                        [only] => only.to_string(),
                        _ => String::new(),
                    });
            }
            // A nested subquery could refer to anything.
            Expr::Subquery(_) | Expr::Exists { .. } | Expr::InSubquery { .. } => {
                r.outer = true;
                r.inner.insert(String::new());
            }
            _ => {}
        }
        ControlFlow::<()>::Continue(())
    });
    r
}

fn conjuncts(expr: Expr, out: &mut Vec<Expr>) {
    match expr {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(*left, out);
            conjuncts(*right, out);
        }
        Expr::Nested(inner)
            if matches!(
                *inner,
                Expr::BinaryOp {
                    op: BinaryOperator::And,
                    ..
                }
            ) =>
        {
            conjuncts(*inner, out)
        }
        e => out.push(e),
    }
}

fn and_all(exprs: Vec<Expr>) -> Option<Expr> {
    exprs.into_iter().reduce(|l, r| Expr::BinaryOp {
        left: Box::new(l),
        op: BinaryOperator::And,
        right: Box::new(r),
    })
}

/// The name a table of the `FROM` list is referred to by.
fn alias_of(factor: &TableFactor) -> Option<String> {
    match factor {
        TableFactor::Table { alias: Some(a), .. } => Some(crate::sql::stmt::ident(&a.name)),
        TableFactor::Table {
            name, args: None, ..
        } => match name.0.last()? {
            ObjectNamePart::Identifier(i) => Some(crate::sql::stmt::ident(i)),
            _ => None,
        },
        _ => None,
    }
}

fn is_catalog_table(factor: &TableFactor) -> bool {
    let TableFactor::Table {
        name, args: None, ..
    } = factor
    else {
        return false;
    };
    matches!(name.0.first(), Some(ObjectNamePart::Identifier(s))
        if matches!(crate::sql::stmt::ident(s).as_str(), "pg_catalog" | "information_schema"))
        && name.0.len() == 2
}

fn subquery(select: Select, of: &Query) -> Expr {
    Expr::Subquery(Box::new(Query {
        body: Box::new(SetExpr::Select(Box::new(select))),
        ..of.clone()
    }))
}

/// `q`, a scalar subquery, as an expression DataFusion decorrelates; `None`
/// when it is not a subquery over the catalogs of the shape described in
/// the module's documentation, or needs no change.
pub(super) fn scalar_subquery(q: &Query) -> Option<Expr> {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    let plain = select.projection.len() == 1
        && select.distinct.is_none()
        && matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
        && select.having.is_none()
        && q.limit_clause.is_none()
        && q.with.is_none()
        && !select.from.is_empty()
        && select.from.iter().all(|t| {
            is_catalog_table(&t.relation) && t.joins.iter().all(|j| is_catalog_table(&j.relation))
        });
    if !plain {
        return None;
    }
    let aliases: BTreeSet<String> = select
        .from
        .iter()
        .flat_map(|t| std::iter::once(&t.relation).chain(t.joins.iter().map(|j| &j.relation)))
        .filter_map(alias_of)
        .collect();
    let (item, alias) = match &select.projection[0] {
        SelectItem::UnnamedExpr(e) => (e.clone(), None),
        SelectItem::ExprWithAlias { expr, alias } => (expr.clone(), Some(alias.clone())),
        _ => return None,
    };
    let item_refs = refs(&item, &aliases);
    if item_refs.outer {
        return None;
    }
    let aggregated = has_aggregate(select);
    let mut conds = Vec::new();
    if let Some(w) = select.selection.clone() {
        conjuncts(w, &mut conds);
    }

    let mut lifted = Vec::new();
    let mut kept = Vec::new();
    let mut mixed = Vec::new();
    if !conds.iter().any(|c| refs(c, &aliases).outer) {
        return None;
    }
    for c in conds {
        let r = refs(&c, &aliases);
        if !r.outer {
            kept.push(c);
        } else if r.inner.is_empty() {
            lifted.push(c);
        } else if is_correlated_equality(&c, &aliases) {
            kept.push(c);
        } else {
            mixed.push(c);
        }
    }
    if lifted.is_empty() && mixed.is_empty() && aggregated {
        return None;
    }
    if !mixed.is_empty() && aggregated {
        return None;
    }

    let mut from = select.from.clone();
    for m in mixed {
        let (outer_side, inner_side, op) = split_comparison(&m, &aliases)?;
        let table = refs(&inner_side, &aliases).inner.into_iter().next()?;
        // The table stands alone in the FROM list, the column does not read
        // it, and every other condition on it names only it and the outer
        // row.
        let pos = from
            .iter()
            .position(|t| t.joins.is_empty() && alias_of(&t.relation).as_deref() == Some(&table))?;
        if item_refs.inner.contains(&table) || item_refs.inner.contains("") {
            return None;
        }
        let mut own = Vec::new();
        let mut rest = Vec::new();
        for c in kept {
            let r = refs(&c, &aliases);
            if r.inner.contains(&table) {
                if r.inner.len() != 1 {
                    return None;
                }
                own.push(c);
            } else {
                rest.push(c);
            }
        }
        kept = rest;
        let table_from: TableWithJoins = from.remove(pos);
        let mut lookup = (**select).clone();
        lookup.from = vec![table_from];
        lookup.projection = vec![SelectItem::UnnamedExpr(call("max", vec![inner_side]))];
        lookup.selection = and_all(own);
        lifted.push(Expr::BinaryOp {
            left: Box::new(outer_side),
            op,
            right: Box::new(subquery(lookup, q)),
        });
    }
    if from.is_empty() {
        return None;
    }

    let mut inner = (**select).clone();
    inner.from = from;
    inner.selection = and_all(kept);
    let item = if aggregated {
        item
    } else {
        call("max", vec![item])
    };
    inner.projection = vec![match alias {
        Some(alias) => SelectItem::ExprWithAlias { expr: item, alias },
        None => SelectItem::UnnamedExpr(item),
    }];
    let value = subquery(inner, q);
    Some(match and_all(lifted) {
        None => value,
        Some(cond) => Expr::Case {
            case_token:
                datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken::empty(),
            end_token:
                datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken::empty(),
            operand: None,
            conditions: vec![datafusion::sql::sqlparser::ast::CaseWhen {
                condition: cond,
                result: value,
            }],
            else_result: None,
        },
    })
}

/// `EXISTS (q)` over the catalogs, as `coalesce((SELECT max(true) …),
/// false)`: DataFusion decorrelates `EXISTS` only in a `WHERE`, and psql
/// asks it in a column.
pub(super) fn exists(q: &Query, negated: bool) -> Option<Expr> {
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    if select.from.is_empty()
        || !select.from.iter().all(|t| {
            is_catalog_table(&t.relation) && t.joins.iter().all(|j| is_catalog_table(&j.relation))
        })
        || has_aggregate(select)
        || !matches!(&select.group_by, GroupByExpr::Expressions(e, _) if e.is_empty())
    {
        return None;
    }
    let mut any = (**select).clone();
    any.projection = vec![SelectItem::UnnamedExpr(call(
        "max",
        vec![Expr::Value(
            datafusion::sql::sqlparser::ast::Value::Boolean(true).into(),
        )],
    ))];
    let any = Query {
        body: Box::new(SetExpr::Select(Box::new(any))),
        order_by: None,
        ..q.clone()
    };
    let value = scalar_subquery(&any).unwrap_or_else(|| Expr::Subquery(Box::new(any)));
    let found = call(
        "coalesce",
        vec![
            value,
            Expr::Value(datafusion::sql::sqlparser::ast::Value::Boolean(false).into()),
        ],
    );
    Some(if negated {
        Expr::UnaryOp {
            op: datafusion::sql::sqlparser::ast::UnaryOperator::Not,
            expr: Box::new(Expr::Nested(Box::new(found))),
        }
    } else {
        found
    })
}

/// `inner = outer` (or the other way round), which DataFusion decorrelates.
fn is_correlated_equality(c: &Expr, aliases: &BTreeSet<String>) -> bool {
    matches!(
        split_comparison(c, aliases),
        Some((_, _, BinaryOperator::Eq))
    )
}

/// A comparison of an expression of the outer row alone with one of the
/// inner query alone: (outer, inner, the operator as `outer op inner`).
fn split_comparison(c: &Expr, aliases: &BTreeSet<String>) -> Option<(Expr, Expr, BinaryOperator)> {
    let Expr::BinaryOp { left, op, right } = c else {
        return None;
    };
    let flipped = match op {
        BinaryOperator::Eq => BinaryOperator::Eq,
        BinaryOperator::NotEq => BinaryOperator::NotEq,
        BinaryOperator::Lt => BinaryOperator::Gt,
        BinaryOperator::LtEq => BinaryOperator::GtEq,
        BinaryOperator::Gt => BinaryOperator::Lt,
        BinaryOperator::GtEq => BinaryOperator::LtEq,
        _ => return None,
    };
    let (l, r) = (refs(left, aliases), refs(right, aliases));
    let outer_only = |x: &Refs| x.outer && x.inner.is_empty();
    let inner_only = |x: &Refs| !x.outer && x.inner.len() == 1 && !x.inner.contains("");
    if outer_only(&l) && inner_only(&r) {
        Some(((**left).clone(), (**right).clone(), op.clone()))
    } else if inner_only(&l) && outer_only(&r) {
        Some(((**right).clone(), (**left).clone(), flipped))
    } else {
        None
    }
}

//! `FETCH FIRST n ROWS ONLY`, the SQL standard's spelling of `LIMIT n`,
//! which Postgres accepts and ORMs and BI tools write (Hibernate, jOOQ,
//! SQL Server-minded users). DataFusion's SQL planner refuses the clause,
//! so every query's `FETCH` becomes the `LIMIT` it means, before planning.
//! `WITH TIES` keeps the rows that tie with the last one: the query
//! filters on a `rank()` over its `ORDER BY` (see [`with_ties`]), which
//! views maintain as a top-N.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, LimitClause, OrderByKind, Query, SelectItem, SetExpr, Statement, Value,
    VisitMut, VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;

use crate::error::{Result, ServerError};

/// Rewrites every `FETCH FIRST` in `stmt` as a `LIMIT`.
pub fn rewrite(stmt: &mut Statement) -> Result<()> {
    match stmt.visit(&mut FetchToLimit) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

/// Rewrites the `FETCH FIRST` of `query` and its subqueries.
pub fn rewrite_query(query: &mut Query) -> Result<()> {
    match query.visit(&mut FetchToLimit) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

struct FetchToLimit;

impl VisitorMut for FetchToLimit {
    type Break = ServerError;

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<ServerError> {
        match to_limit(query) {
            Ok(()) => ControlFlow::Continue(()),
            Err(e) => ControlFlow::Break(e),
        }
    }
}

fn to_limit(query: &mut Query) -> Result<()> {
    let Some(fetch) = query.fetch.take() else {
        return Ok(());
    };
    if fetch.percent {
        return Err(ServerError::unsupported("FETCH FIRST … PERCENT"));
    }
    // `FETCH FIRST ROW ONLY` is one row.
    let count = fetch
        .quantity
        .unwrap_or_else(|| Expr::value(Value::Number("1".into(), false)));
    if fetch.with_ties {
        return with_ties(query, count);
    }
    match &mut query.limit_clause {
        None => {
            query.limit_clause = Some(LimitClause::LimitOffset {
                limit: Some(count),
                offset: None,
                limit_by: vec![],
            });
        }
        Some(LimitClause::LimitOffset {
            limit: limit @ None,
            ..
        }) => *limit = Some(count),
        Some(_) => {
            return Err(ServerError::Syntax(
                "multiple LIMIT clauses not allowed".into(),
            ));
        }
    }
    Ok(())
}

/// `SELECT … ORDER BY k FETCH FIRST n ROWS WITH TIES` is
/// `SELECT … QUALIFY rank() OVER (ORDER BY k) <= n ORDER BY k`: a row's
/// rank is one more than the number of rows before it, so the rows of rank
/// n or less are the first n and those that tie with the n-th. The sort
/// keys may name the select list's columns (by alias or position), which a
/// window's `ORDER BY` cannot, so there they are the expressions they name.
fn with_ties(query: &mut Query, count: Expr) -> Result<()> {
    let Some(order_by) = &query.order_by else {
        return Err(ServerError::Syntax(
            "WITH TIES cannot be specified without ORDER BY clause".into(),
        ));
    };
    let OrderByKind::Expressions(keys) = &order_by.kind else {
        return Err(ServerError::unsupported("ORDER BY ALL … WITH TIES"));
    };
    let mut keys = keys.clone();
    if query.limit_clause.is_some() {
        return Err(ServerError::unsupported(
            "OFFSET with FETCH FIRST … WITH TIES",
        ));
    }
    let SetExpr::Select(select) = query.body.as_mut() else {
        return Err(ServerError::unsupported(
            "FETCH FIRST … WITH TIES over UNION, INTERSECT or EXCEPT",
        ));
    };
    if select.distinct.is_some() {
        return Err(ServerError::unsupported(
            "SELECT DISTINCT … FETCH FIRST … WITH TIES",
        ));
    }
    for key in keys.iter_mut() {
        key.expr = named_item(&select.projection, &key.expr)?;
    }
    let filter = format!(
        "rank() OVER (ORDER BY {}) <= {count}",
        keys.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let filter = parse_expr(&filter)?;
    select.qualify = Some(match select.qualify.take() {
        Some(q) => Expr::BinaryOp {
            left: Box::new(q),
            op: BinaryOperator::And,
            right: Box::new(filter),
        },
        None => filter,
    });
    Ok(())
}

/// What an `ORDER BY` key means in a window's `ORDER BY`: the expression
/// of the select item it names by alias or by position, else itself.
fn named_item(items: &[SelectItem], key: &Expr) -> Result<Expr> {
    match key {
        Expr::Value(v) => {
            if let Value::Number(n, _) = &v.value {
                let at: usize = n.parse().unwrap_or(0);
                return match at.checked_sub(1).and_then(|i| items.get(i)) {
                    Some(
                        SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. },
                    ) if items[..at].iter().all(|i| {
                        matches!(
                            i,
                            SelectItem::UnnamedExpr(_) | SelectItem::ExprWithAlias { .. }
                        )
                    }) =>
                    {
                        Ok(e.clone())
                    }
                    _ => Err(ServerError::unsupported(format!(
                        "ORDER BY position {n} of a select list with * … WITH TIES"
                    ))),
                };
            }
            Ok(key.clone())
        }
        Expr::Identifier(name) => Ok(items
            .iter()
            .find_map(|i| match i {
                SelectItem::ExprWithAlias { expr, alias }
                    if crate::sql::stmt::ident(alias) == crate::sql::stmt::ident(name) =>
                {
                    Some(expr.clone())
                }
                _ => None,
            })
            .unwrap_or_else(|| key.clone())),
        _ => Ok(key.clone()),
    }
}

/// An expression of SQL this file writes.
fn parse_expr(sql: &str) -> Result<Expr> {
    Parser::new(&PostgreSqlDialect {})
        .try_with_sql(sql)
        .and_then(|mut p| p.parse_expr())
        .map_err(|e| ServerError::Internal(format!("{sql}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> Result<String> {
        let mut stmt = Parser::parse_sql(&PostgreSqlDialect {}, sql)
            .unwrap()
            .remove(0);
        rewrite(&mut stmt)?;
        Ok(stmt.to_string())
    }

    #[test]
    fn fetch_first_is_a_limit() {
        assert_eq!(
            rewritten("SELECT a FROM t ORDER BY a FETCH FIRST 3 ROWS ONLY").unwrap(),
            "SELECT a FROM t ORDER BY a LIMIT 3"
        );
        assert_eq!(
            rewritten("SELECT a FROM t ORDER BY a OFFSET 2 ROWS FETCH NEXT ROW ONLY").unwrap(),
            "SELECT a FROM t ORDER BY a LIMIT 1 OFFSET 2 ROWS"
        );
        assert_eq!(
            rewritten("SELECT * FROM (SELECT a FROM t FETCH FIRST 2 ROWS ONLY) AS s").unwrap(),
            "SELECT * FROM (SELECT a FROM t LIMIT 2) AS s"
        );
        let e = rewritten("SELECT a FROM t FETCH FIRST 2 ROWS WITH TIES").unwrap_err();
        assert_eq!(e.sqlstate(), "42601");
        let e = rewritten("SELECT a FROM t LIMIT 1 FETCH FIRST 2 ROWS ONLY");
        assert!(e.is_err_and(|e| e.sqlstate() == "42601"));
    }

    #[test]
    fn with_ties_is_a_rank_filter() {
        assert_eq!(
            rewritten("SELECT a AS x, b FROM t ORDER BY x DESC, 2 FETCH FIRST 2 ROWS WITH TIES")
                .unwrap(),
            "SELECT a AS x, b FROM t QUALIFY rank() OVER (ORDER BY a DESC, b) <= 2 \
             ORDER BY x DESC, 2"
        );
        let e =
            rewritten("SELECT a FROM t UNION SELECT b FROM u ORDER BY 1 FETCH FIRST ROW WITH TIES");
        assert!(e.is_err_and(|e| e.sqlstate() == "0A000"));
    }
}

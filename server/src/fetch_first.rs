//! `FETCH FIRST n ROWS ONLY`, the SQL standard's spelling of `LIMIT n`,
//! which Postgres accepts and ORMs and BI tools write (Hibernate, jOOQ,
//! SQL Server-minded users). DataFusion's SQL planner refuses the clause,
//! so every query's `FETCH` becomes the `LIMIT` it means, before planning.
//! `WITH TIES` keeps rows that tie with the last one; Weir does not plan
//! it, and says so (`0A000`) rather than dropping the ties.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, LimitClause, Query, Statement, Value, VisitMut, VisitorMut,
};

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
    if fetch.with_ties {
        return Err(ServerError::unsupported("FETCH FIRST … WITH TIES"));
    }
    if fetch.percent {
        return Err(ServerError::unsupported("FETCH FIRST … PERCENT"));
    }
    // `FETCH FIRST ROW ONLY` is one row.
    let count = fetch
        .quantity
        .unwrap_or_else(|| Expr::value(Value::Number("1".into(), false)));
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

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

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
        let e = rewritten("SELECT a FROM t ORDER BY a FETCH FIRST 2 ROWS WITH TIES").unwrap_err();
        assert_eq!(e.sqlstate(), "0A000");
        let e = rewritten("SELECT a FROM t LIMIT 1 FETCH FIRST 2 ROWS ONLY");
        assert!(e.is_err_and(|e| e.sqlstate() == "42601"));
    }
}

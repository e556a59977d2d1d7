//! How deep a statement may nest before it is refused with `54001`
//! (Postgres's "stack depth limit exceeded").
//!
//! sqlparser parses a left-deep chain — `1 + 1 + … + 1`, `a = 0 OR a = 1 OR
//! …`, `… UNION ALL … UNION ALL …` — in a loop, so a statement of a few
//! kilobytes can hold a tree thousands of levels deep; everything after the
//! parser (rewrites, DataFusion's planner and optimizer, the physical
//! expressions, `Clone` and `Drop`) walks that tree recursively. DataFusion
//! and sqlparser grow their stacks on the heap where they recurse (the
//! `recursive_protection` feature), and statements run on threads with
//! large stacks (`crate::statement_thread`), so trees up to
//! [`MAX_DEPTH`] levels plan and run. A deeper one is refused here, right
//! after parsing, and taken apart without recursion so that dropping it
//! cannot overflow the stack either.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr, Query, SetExpr, Statement, Value, Values, Visit, VisitMut, Visitor, VisitorMut,
};

use crate::error::{Result, ServerError};

/// The deepest expression or query tree Weir plans. Postgres, with its
/// default `max_stack_depth` of 2 MB, refuses a chain of a few thousand
/// operators; this is above that.
pub const MAX_DEPTH: usize = 10_000;

/// Measures the nesting of expressions and set operations.
#[derive(Default)]
struct Depth {
    /// Levels open now: expressions, and for each query the length of its
    /// chain of set operations plus one.
    current: usize,
    /// What each open query added to `current`.
    queries: Vec<usize>,
    deepest: usize,
}

/// The number of set operations down the left side of `body`, counted
/// without recursion (a long `UNION ALL` is a left-deep chain).
fn set_operation_chain(body: &SetExpr) -> usize {
    let mut n = 0;
    let mut cur = body;
    while let SetExpr::SetOperation { left, .. } = cur {
        n += 1;
        cur = left;
    }
    n
}

impl Visitor for Depth {
    type Break = ();

    fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
        let levels = 1 + set_operation_chain(&q.body);
        self.queries.push(levels);
        self.current += levels;
        self.deepest = self.deepest.max(self.current);
        if self.deepest > MAX_DEPTH {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &Query) -> ControlFlow<()> {
        self.current -= self.queries.pop().unwrap_or(0);
        ControlFlow::Continue(())
    }

    fn pre_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.current += 1;
        self.deepest = self.deepest.max(self.current);
        if self.deepest > MAX_DEPTH {
            return ControlFlow::Break(());
        }
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, _: &Expr) -> ControlFlow<()> {
        self.current -= 1;
        ControlFlow::Continue(())
    }
}

/// Empties every expression and set-operation chain after its children,
/// so that what is left drops without deep recursion.
struct Dismantle;

impl VisitorMut for Dismantle {
    type Break = ();

    fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        *e = Expr::Value(Value::Null.into());
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
        let empty = SetExpr::Values(Values {
            explicit_row: false,
            value_keyword: false,
            rows: Vec::new(),
        });
        let mut body = std::mem::replace(&mut q.body, Box::new(empty));
        while let SetExpr::SetOperation { left, right, .. } = *body {
            drop(right);
            body = left;
        }
        ControlFlow::Continue(())
    }
}

/// Refuses `node` with `54001` when it nests deeper than [`MAX_DEPTH`].
pub fn check<T: Visit>(node: &T) -> Result<()> {
    let mut d = Depth::default();
    match node.visit(&mut d) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(()) => Err(too_deep()),
    }
}

fn too_deep() -> ServerError {
    ServerError::StatementTooComplex(format!(
        "statement is too complex: its expressions or set operations nest more than {MAX_DEPTH} levels deep"
    ))
}

/// Drops a statement of any depth without overflowing the stack.
pub fn discard(mut s: Statement) {
    let _ = VisitMut::visit(&mut s, &mut Dismantle);
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn parse(sql: &str) -> Statement {
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .unwrap()
            .parse_statement()
            .unwrap()
    }

    fn chain(op: &str, n: usize) -> String {
        let terms: Vec<String> = (0..n).map(|i| format!("x = {i}")).collect();
        format!("SELECT * FROM t WHERE {}", terms.join(op))
    }

    #[test]
    fn counts_chains_of_operators_and_set_operations() {
        assert!(check(&parse(&chain(" OR ", 800))).is_ok());
        assert!(check(&parse(&chain(" OR ", MAX_DEPTH + 10))).is_err());
        let union = vec!["SELECT 1"; MAX_DEPTH + 10].join(" UNION ALL ");
        assert!(check(&parse(&union)).is_err());
        let union = vec!["SELECT 1"; 400].join(" UNION ALL ");
        assert!(check(&parse(&union)).is_ok());
    }

    #[test]
    fn a_very_deep_statement_is_dropped_without_overflow() {
        // 200,000 levels: far past what recursive drop glue survives on a
        // test thread's 2 MB stack.
        let s = parse(&chain(" OR ", 200_000));
        assert!(check(&s).is_err());
        discard(s);
    }
}

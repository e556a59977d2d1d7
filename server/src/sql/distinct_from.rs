//! `a IS [NOT] DISTINCT FROM b AND c` as Postgres reads it: `(a IS [NOT]
//! DISTINCT FROM b) AND c`. The parser takes everything after `FROM` as
//! the right operand, `a IS NOT DISTINCT FROM (b AND c)`: a type error
//! when `b` is not boolean, and a wrong answer when it is. `IS` binds
//! tighter than `AND` and `OR` in Postgres, so after parsing each such
//! operand is taken apart again, the comparison wrapped in parentheses so
//! that the statement prints as it now reads.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{BinaryOperator, Expr, VisitMut, VisitorMut};

struct Regroup;

impl VisitorMut for Regroup {
    type Break = ();

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let (left, right, negated) = match expr {
            Expr::IsDistinctFrom(l, r) => (l, r, false),
            Expr::IsNotDistinctFrom(l, r) => (l, r, true),
            _ => return ControlFlow::Continue(()),
        };
        if is_logical(right) {
            let left = std::mem::replace(
                left.as_mut(),
                Expr::value(datafusion::sql::sqlparser::ast::Value::Null),
            );
            let right = std::mem::replace(
                right.as_mut(),
                Expr::value(datafusion::sql::sqlparser::ast::Value::Null),
            );
            *expr = attach(left, right, negated);
        }
        ControlFlow::Continue(())
    }
}

fn is_logical(e: &Expr) -> bool {
    matches!(
        e,
        Expr::BinaryOp {
            op: BinaryOperator::And | BinaryOperator::Or | BinaryOperator::Xor,
            ..
        }
    )
}

/// `left IS [NOT] DISTINCT FROM` the first operand of `right`'s chain of
/// `AND`s and `OR`s, the rest of the chain as it was.
fn attach(left: Expr, right: Expr, negated: bool) -> Expr {
    match right {
        Expr::BinaryOp {
            left: first,
            op: op @ (BinaryOperator::And | BinaryOperator::Or | BinaryOperator::Xor),
            right: rest,
        } => Expr::BinaryOp {
            left: Box::new(attach(left, *first, negated)),
            op,
            right: rest,
        },
        operand => {
            let (l, r) = (Box::new(left), Box::new(operand));
            Expr::Nested(Box::new(if negated {
                Expr::IsNotDistinctFrom(l, r)
            } else {
                Expr::IsDistinctFrom(l, r)
            }))
        }
    }
}

/// Regroups every `IS [NOT] DISTINCT FROM` of `node`.
pub fn rewrite(node: &mut impl VisitMut) {
    let _ = node.visit(&mut Regroup);
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;

    fn regrouped(sql: &str) -> String {
        let mut e = Parser::new(&PostgreSqlDialect {})
            .try_with_sql(sql)
            .unwrap()
            .parse_expr()
            .unwrap();
        rewrite(&mut e);
        e.to_string()
    }

    #[test]
    fn distinct_from_binds_tighter_than_and_and_or() {
        assert_eq!(
            regrouped("a IS NOT DISTINCT FROM b AND c IS DISTINCT FROM d OR e"),
            "(a IS NOT DISTINCT FROM b) AND (c IS DISTINCT FROM d) OR e"
        );
        assert_eq!(
            regrouped("a IS DISTINCT FROM (b AND c)"),
            "a IS DISTINCT FROM (b AND c)"
        );
        assert_eq!(
            regrouped("a IS DISTINCT FROM b = c"),
            "a IS DISTINCT FROM b = c"
        );
    }
}

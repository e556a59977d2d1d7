//! `x [NOT] BETWEEN SYMMETRIC a AND b`, which the parser does not know, in
//! Postgres's meaning: `x BETWEEN a AND b OR x BETWEEN b AND a` (so a NULL
//! bound gives what the two comparisons give, not what `least` and
//! `greatest`, which skip NULLs, would).
//!
//! Before parsing, [`mark`] takes `SYMMETRIC` out and wraps the lower bound
//! in a marker call, `BETWEEN weir_symmetric(a) AND b`; after parsing,
//! [`rewrite`] turns each marked `BETWEEN` into the disjunction.
//! `ASYMMETRIC`, the default meaning, is taken out.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, UnaryOperator, VisitMut,
    VisitorMut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Whitespace, Word};

use crate::error::{Result, ServerError};

/// The marker call around a symmetric `BETWEEN`'s first bound.
const MARKER: &str = "weir_symmetric";

fn keyword(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.quote_style.is_none() && w.value.eq_ignore_ascii_case(word))
}

/// `sql` with its `BETWEEN [A]SYMMETRIC`s marked, or `None` if it has none.
pub fn mark(sql: &str) -> Result<Option<String>> {
    if !crate::sql::stmt::mentions(sql, "symmetric") {
        return Ok(None);
    }
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        // The parser reports it.
        return Ok(None);
    };
    let mut out: Vec<Token> = Vec::with_capacity(tokens.len() + 4);
    let mut changed = false;
    let mut i = 0;
    while i < tokens.len() {
        out.push(tokens[i].clone());
        if !keyword(&tokens[i], "between") {
            i += 1;
            continue;
        }
        let next = (i + 1..tokens.len())
            .find(|&j| !matches!(tokens[j], Token::Whitespace(_)))
            .unwrap_or(tokens.len());
        let symmetric = tokens.get(next).is_some_and(|t| keyword(t, "symmetric"));
        if !symmetric && !tokens.get(next).is_some_and(|t| keyword(t, "asymmetric")) {
            i += 1;
            continue;
        }
        changed = true;
        i = next + 1;
        if symmetric {
            let end = bound_end(&tokens, i)?;
            out.push(Token::Whitespace(Whitespace::Space));
            out.push(Token::Word(Word {
                value: MARKER.to_string(),
                quote_style: None,
                keyword: datafusion::sql::sqlparser::keywords::Keyword::NoKeyword,
            }));
            out.push(Token::LParen);
            out.extend(tokens[i..end].iter().cloned());
            out.push(Token::RParen);
            out.push(Token::Whitespace(Whitespace::Space));
            i = end;
        }
    }
    Ok(changed.then(|| out.iter().map(ToString::to_string).collect()))
}

/// The position of the `AND` that ends the first bound starting at `from`:
/// the first one outside parentheses, brackets and `CASE … END`.
fn bound_end(tokens: &[Token], from: usize) -> Result<usize> {
    let mut depth = 0i32;
    for (k, t) in tokens.iter().enumerate().skip(from) {
        match t {
            Token::LParen | Token::LBracket => depth += 1,
            Token::RParen | Token::RBracket => depth -= 1,
            _ if keyword(t, "case") => depth += 1,
            _ if keyword(t, "end") => depth -= 1,
            _ if depth == 0 && keyword(t, "and") => return Ok(k),
            _ => {}
        }
        if depth < 0 {
            break;
        }
    }
    Err(ServerError::Syntax(
        "syntax error: BETWEEN SYMMETRIC needs AND after its first bound".into(),
    ))
}

/// The first bound a marker call holds.
fn marked(low: &Expr) -> Option<&Expr> {
    let Expr::Function(f) = low else {
        return None;
    };
    if !f.name.to_string().eq_ignore_ascii_case(MARKER) {
        return None;
    }
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    match list.args.as_slice() {
        [FunctionArg::Unnamed(FunctionArgExpr::Expr(e))] => Some(e),
        _ => None,
    }
}

struct Symmetric;

impl VisitorMut for Symmetric {
    type Break = ();

    fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
        if let Expr::Between {
            expr,
            negated,
            low,
            high,
        } = e
            && let Some(a) = marked(low)
        {
            let between = |low: &Expr, high: &Expr| Expr::Between {
                expr: expr.clone(),
                negated: false,
                low: Box::new(low.clone()),
                high: Box::new(high.clone()),
            };
            let either = Expr::Nested(Box::new(Expr::BinaryOp {
                left: Box::new(between(a, high)),
                op: BinaryOperator::Or,
                right: Box::new(between(high, a)),
            }));
            *e = if *negated {
                Expr::UnaryOp {
                    op: UnaryOperator::Not,
                    expr: Box::new(either),
                }
            } else {
                either
            };
        }
        ControlFlow::Continue(())
    }
}

/// Turns each marked `BETWEEN` of `node` into its disjunction.
pub fn rewrite(node: &mut impl VisitMut) {
    let _ = node.visit(&mut Symmetric);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symmetric_bounds_are_marked_up_to_their_and() {
        let marked =
            mark("SELECT x BETWEEN SYMMETRIC CASE WHEN a AND b THEN 1 END AND f(c, d) AND e")
                .unwrap()
                .unwrap();
        assert_eq!(
            marked,
            "SELECT x BETWEEN weir_symmetric( CASE WHEN a AND b THEN 1 END ) AND f(c, d) AND e"
        );
        assert_eq!(
            mark("SELECT x BETWEEN ASYMMETRIC 1 AND 2")
                .unwrap()
                .unwrap(),
            "SELECT x BETWEEN 1 AND 2"
        );
        assert!(mark("SELECT 'symmetric'").unwrap().is_none());
    }
}

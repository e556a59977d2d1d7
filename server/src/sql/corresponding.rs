//! `UNION | INTERSECT | EXCEPT [ALL | DISTINCT] CORRESPONDING [BY (…)]`,
//! the SQL standard's set operations by column name (RisingWave has them;
//! the parser and DataFusion do not). Each side keeps only the columns
//! that both sides name (in the left side's order), or those `BY` lists
//! (in its order), and the operation then pairs them by position:
//! `a UNION CORRESPONDING b` is
//! `SELECT c… FROM (a) AS _ UNION SELECT c… FROM (b) AS _`.
//!
//! It takes three steps, because the parser does not know the clause and
//! only planning knows a side's column names:
//! 1. before parsing, [`mark`] writes each `CORRESPONDING [BY (…)]` as the
//!    `BY NAME` that the parser takes (a `BY NAME` the user wrote is
//!    refused: its meaning elsewhere is DuckDB's, not this), and puts a
//!    marker first in the right side's `SELECT` list that carries the `BY`
//!    list: `weir_corresponding_by('a', 'b') AS __weir_corresponding` (or
//!    `weir_corresponding()` without one);
//! 2. after parsing, [`apply_lists`] takes the markers out and rewrites
//!    every operation with a `BY` list, which needs no names;
//! 3. when planning, [`resolve`] plans each side of what is left, the
//!    plain `CORRESPONDING`s, innermost first, and rewrites them with the
//!    names both sides share. A view stores its query after this step, so
//!    what it stores is plain SQL.

use std::ops::ControlFlow;

use datafusion::prelude::SessionContext;
use datafusion::sql::sqlparser::ast::{
    Cte, Expr as SqlExpr, FunctionArg, FunctionArgExpr, FunctionArguments, Query, Select,
    SelectItem, SetExpr, SetQuantifier, Statement, Visit, VisitMut, Visitor, VisitorMut, With,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::{Token, Tokenizer, Whitespace};

use crate::error::{Result, ServerError};

/// The marker call that says an operation has a `BY` list, and the one
/// that says it has none; the marker column's name.
const MARKER_BY: &str = "weir_corresponding_by";
const MARKER: &str = "weir_corresponding";
const MARKER_COLUMN: &str = "__weir_corresponding";

fn word(t: &Token, w: &str) -> bool {
    matches!(t, Token::Word(x) if x.quote_style.is_none() && x.value.eq_ignore_ascii_case(w))
}

fn set_op(t: &Token) -> bool {
    word(t, "union") || word(t, "intersect") || word(t, "except")
}

/// Whether `words[k]` follows a set operator, with `ALL` or `DISTINCT`
/// between them or not.
fn follows_set_op(words: &[&Token], k: usize) -> bool {
    let before = |n: usize| k.checked_sub(n).map(|j| words[j]);
    before(1).is_some_and(set_op)
        || (before(1).is_some_and(|t| word(t, "all") || word(t, "distinct"))
            && before(2).is_some_and(set_op))
}

/// `sql` with each `CORRESPONDING [BY (…)]` written as `BY NAME` and its
/// right side marked (see the module's docs); `None` if `sql` has none.
pub fn mark(sql: &str) -> Result<Option<String>> {
    if !crate::sql::stmt::mentions(sql, "corresponding") {
        return Ok(None);
    }
    let Ok(tokens) = Tokenizer::new(&PostgreSqlDialect {}, sql).tokenize() else {
        // The parser reports it.
        return Ok(None);
    };
    let significant: Vec<usize> = (0..tokens.len())
        .filter(|&i| !matches!(tokens[i], Token::Whitespace(_)))
        .collect();
    let words: Vec<&Token> = significant.iter().map(|&i| &tokens[i]).collect();
    // Replacements of `tokens[from..to]`, in order.
    let mut edits: Vec<(usize, usize, Vec<Token>)> = Vec::new();
    for k in 0..words.len() {
        if !(word(words[k], "corresponding") && follows_set_op(&words, k)) {
            continue;
        }
        let (list, end) = if words.get(k + 1).is_some_and(|t| word(t, "by")) {
            let (names, end) = by_list(&words, k + 2)?;
            (Some(names), end)
        } else {
            (None, k + 1)
        };
        let clause_end = significant.get(end).copied().unwrap_or(tokens.len());
        edits.push((
            significant[k],
            clause_end,
            vec![
                Token::make_keyword("BY"),
                Token::Whitespace(Whitespace::Space),
                Token::make_keyword("NAME"),
                Token::Whitespace(Whitespace::Space),
            ],
        ));
        let at = select_list_start(&words, end).ok_or_else(|| {
            ServerError::unsupported(
                "UNION | INTERSECT | EXCEPT … CORRESPONDING whose right side is not a SELECT",
            )
        })?;
        let insert_at = significant.get(at).copied().unwrap_or(tokens.len());
        edits.push((insert_at, insert_at, marker_tokens(list.as_deref())));
    }
    if edits.is_empty() {
        return Ok(None);
    }
    let mut out = String::with_capacity(sql.len() + 64);
    let mut next = 0;
    for (from, to, with) in edits {
        out.extend(tokens[next..from].iter().map(ToString::to_string));
        out.extend(with.iter().map(ToString::to_string));
        next = to;
    }
    out.extend(tokens[next..].iter().map(ToString::to_string));
    Ok(Some(out))
}

/// Where the select list of the `SELECT` that begins at `words[k]`
/// (perhaps in parentheses) starts: after `SELECT [ALL | DISTINCT [ON
/// (…)]]`.
fn select_list_start(words: &[&Token], mut k: usize) -> Option<usize> {
    while words.get(k) == Some(&&Token::LParen) {
        k += 1;
    }
    if !word(words.get(k)?, "select") {
        return None;
    }
    k += 1;
    if words.get(k).is_some_and(|t| word(t, "all")) {
        return Some(k + 1);
    }
    if !words.get(k).is_some_and(|t| word(t, "distinct")) {
        return Some(k);
    }
    k += 1;
    if !(words.get(k).is_some_and(|t| word(t, "on")) && words.get(k + 1) == Some(&&Token::LParen)) {
        return Some(k);
    }
    let mut depth = 0;
    for (j, t) in words.iter().enumerate().skip(k + 1) {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => {
                depth -= 1;
                if depth == 0 {
                    return Some(j + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// `weir_corresponding_by('a', …) AS __weir_corresponding, `.
fn marker_tokens(list: Option<&[String]>) -> Vec<Token> {
    let call = match list {
        Some(names) => {
            let args: Vec<String> = names
                .iter()
                .map(|n| format!("'{}'", n.replace('\'', "''")))
                .collect();
            format!("{MARKER_BY}({})", args.join(", "))
        }
        None => format!("{MARKER}()"),
    };
    let text = format!(" {call} AS {MARKER_COLUMN}, ");
    Tokenizer::new(&PostgreSqlDialect {}, &text)
        .tokenize()
        .unwrap_or_default()
}

/// The names of `BY (a, "B", …)` whose `(` is `words[k]`, and the index
/// of the word after its `)`.
fn by_list(words: &[&Token], k: usize) -> Result<(Vec<String>, usize)> {
    let err = || ServerError::Syntax("syntax error: CORRESPONDING BY needs (column, …)".into());
    if words.get(k) != Some(&&Token::LParen) {
        return Err(err());
    }
    let mut names = Vec::new();
    let mut k = k + 1;
    loop {
        match words.get(k) {
            Some(Token::Word(w)) => names.push(match w.quote_style {
                Some(_) => w.value.clone(),
                None => w.value.to_lowercase(),
            }),
            _ => return Err(err()),
        }
        match words.get(k + 1) {
            Some(Token::Comma) => k += 2,
            Some(Token::RParen) => {
                unique(&names, "CORRESPONDING BY")?;
                return Ok((names, k + 2));
            }
            _ => return Err(err()),
        }
    }
}

fn by_name(q: &SetQuantifier) -> bool {
    matches!(
        q,
        SetQuantifier::ByName | SetQuantifier::AllByName | SetQuantifier::DistinctByName
    )
}

/// The quantifier a `BY NAME` quantifier stands for once the sides are
/// paired by position.
fn positional(q: &SetQuantifier) -> SetQuantifier {
    match q {
        SetQuantifier::AllByName => SetQuantifier::All,
        SetQuantifier::DistinctByName => SetQuantifier::Distinct,
        _ => SetQuantifier::None,
    }
}

/// The leftmost `SELECT` of `set`.
fn leftmost_select(set: &mut SetExpr) -> Option<&mut Select> {
    match set {
        SetExpr::Select(s) => Some(s),
        SetExpr::Query(q) => leftmost_select(&mut q.body),
        SetExpr::SetOperation { left, .. } => leftmost_select(left),
        _ => None,
    }
}

/// Takes the marker out of `select`'s list: `Some(None)` for a plain
/// `CORRESPONDING`, `Some(Some(names))` for one with a `BY` list, `None`
/// if there is no marker.
fn take_marker(select: &mut Select) -> Option<Option<Vec<String>>> {
    let Some(SelectItem::ExprWithAlias {
        expr: SqlExpr::Function(f),
        alias,
    }) = select.projection.first()
    else {
        return None;
    };
    if alias.value != MARKER_COLUMN {
        return None;
    }
    let name = f.name.to_string();
    let FunctionArguments::List(args) = &f.args else {
        return None;
    };
    let list = if name == MARKER {
        None
    } else if name == MARKER_BY {
        let mut names = Vec::new();
        for a in &args.args {
            let FunctionArg::Unnamed(FunctionArgExpr::Expr(SqlExpr::Value(v))) = a else {
                return None;
            };
            names.push(v.value.clone().into_string()?);
        }
        Some(names)
    } else {
        return None;
    };
    select.projection.remove(0);
    Some(list)
}

/// Calls `f` on each `BY NAME` operation of `set`'s own tree (not of the
/// queries nested in it), children before parents.
fn each_by_name(set: &mut SetExpr, f: &mut dyn FnMut(&mut SetExpr) -> Result<()>) -> Result<()> {
    if let SetExpr::SetOperation {
        left,
        right,
        set_quantifier,
        ..
    } = set
    {
        each_by_name(left, f)?;
        each_by_name(right, f)?;
        if by_name(set_quantifier) {
            f(set)?;
        }
    }
    Ok(())
}

/// Runs `f` on each query of `node`, inner queries first, with the common
/// table expressions in scope there (outer ones first).
fn each_query<N: VisitMut>(
    node: &mut N,
    f: &mut dyn FnMut(&mut Query, &[Cte]) -> Result<()>,
) -> Result<()> {
    struct Queries<'a> {
        scope: Vec<Option<With>>,
        f: &'a mut dyn FnMut(&mut Query, &[Cte]) -> Result<()>,
    }
    impl VisitorMut for Queries<'_> {
        type Break = ServerError;
        fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<ServerError> {
            self.scope.push(q.with.clone());
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, q: &mut Query) -> ControlFlow<ServerError> {
            let ctes = in_scope(&self.scope);
            self.scope.pop();
            match (self.f)(q, &ctes) {
                Ok(()) => ControlFlow::Continue(()),
                Err(e) => ControlFlow::Break(e),
            }
        }
    }
    match node.visit(&mut Queries {
        scope: Vec::new(),
        f,
    }) {
        ControlFlow::Continue(()) => Ok(()),
        ControlFlow::Break(e) => Err(e),
    }
}

/// The common table expressions visible under `scope`: an inner one
/// hides an outer one of the same name.
fn in_scope(scope: &[Option<With>]) -> Vec<Cte> {
    let mut ctes: Vec<Cte> = Vec::new();
    for with in scope.iter().flatten() {
        for cte in &with.cte_tables {
            ctes.retain(|c| c.alias.name.value != cte.alias.name.value);
            ctes.push(cte.clone());
        }
    }
    ctes
}

/// Takes the markers out of `node` and rewrites every operation with a
/// `BY` list; refuses a `BY NAME` that [`mark`] did not write.
pub fn apply_lists<N: Visit + VisitMut>(node: &mut N) -> Result<()> {
    if !has_by_name(node) {
        return Ok(());
    }
    // Each operation's marker, in the order the second pass meets them,
    // taken out before anything is rewritten (a rewritten side's first
    // `SELECT` is no longer the one that holds the marker).
    let mut found: Vec<Option<Vec<String>>> = Vec::new();
    each_query(node, &mut |q, _| {
        each_by_name(&mut q.body, &mut |op| {
            let SetExpr::SetOperation { right, .. } = op else {
                return Ok(());
            };
            let list = leftmost_select(right)
                .and_then(take_marker)
                .ok_or_else(|| {
                    ServerError::unsupported(
                        "UNION | INTERSECT | EXCEPT … BY NAME (write CORRESPONDING)",
                    )
                })?;
            found.push(list);
            Ok(())
        })
    })?;
    let mut found = found.into_iter();
    each_query(node, &mut |q, _| {
        each_by_name(&mut q.body, &mut |op| {
            if let Some(Some(list)) = found.next() {
                pair(op, &list)?;
            }
            Ok(())
        })
    })
}

/// Turns the operation `op` into the positional one over `names`.
fn pair(op: &mut SetExpr, names: &[String]) -> Result<()> {
    let SetExpr::SetOperation {
        left,
        right,
        set_quantifier,
        ..
    } = op
    else {
        return Ok(());
    };
    **left = keep(left, names)?;
    **right = keep(right, names)?;
    *set_quantifier = positional(set_quantifier);
    Ok(())
}

/// `SELECT "n"… FROM (side) AS __corresponding`.
fn keep(side: &SetExpr, names: &[String]) -> Result<SetExpr> {
    let columns: Vec<String> = names
        .iter()
        .map(|n| format!("\"{}\"", n.replace('"', "\"\"")))
        .collect();
    let sql = format!(
        "SELECT {} FROM ({side}) AS __corresponding",
        columns.join(", ")
    );
    let q = Parser::new(&PostgreSqlDialect {})
        .try_with_sql(&sql)?
        .parse_query()?;
    Ok(*q.body)
}

/// A side as a query of its own, with the common table expressions in
/// scope where it stands.
fn side_query(side: &SetExpr, ctes: &[Cte]) -> Result<Query> {
    let mut q = *Parser::new(&PostgreSqlDialect {})
        .try_with_sql("SELECT 1")?
        .parse_query()?;
    q.body = Box::new(side.clone());
    if !ctes.is_empty() {
        q.with = Some(With {
            with_token:
                datafusion::sql::sqlparser::ast::helpers::attached_token::AttachedToken::empty(),
            recursive: false,
            cte_tables: ctes.to_vec(),
        });
    }
    Ok(q)
}

/// Refuses a side that names two of its columns alike, as the standard
/// does: which of them would be kept?
fn no_duplicates(side: &SetExpr) -> Result<()> {
    let mut side = side.clone();
    let Some(select) = leftmost_select(&mut side) else {
        return Ok(());
    };
    let mut q = side_query(&SetExpr::Select(Box::new(select.clone())), &[])?;
    crate::sql::stmt::apply_pg_names(&mut q);
    unique(
        &crate::sql::stmt::output_names(&q).unwrap_or_default(),
        "a side of CORRESPONDING",
    )
}

/// Refuses `names` if one repeats: `42701` naming it and `place`.
fn unique(names: &[String], place: &str) -> Result<()> {
    let mut seen = std::collections::HashSet::new();
    match names.iter().find(|n| !seen.insert(*n)) {
        Some(d) => Err(ServerError::DuplicateColumn(format!(
            "column \"{d}\" appears twice in {place}"
        ))),
        None => Ok(()),
    }
}

/// Gives the leftmost `SELECT` of `side` Postgres's column names, which
/// are the names the side's columns are matched by.
fn name_side(side: &mut SetExpr) {
    match side {
        SetExpr::Select(_) => {
            let Ok(mut q) = side_query(side, &[]) else {
                return;
            };
            crate::sql::stmt::apply_pg_names(&mut q);
            std::mem::swap(side, &mut q.body);
        }
        SetExpr::Query(q) => crate::sql::stmt::apply_pg_names(q),
        SetExpr::SetOperation { left, .. } => name_side(left),
        _ => {}
    }
}

/// The first plain `CORRESPONDING` of `stmt` (inner first): its two
/// sides, each as a query of its own.
fn first_plain<N: VisitMut>(stmt: &mut N) -> Result<Option<(Query, Query)>> {
    let mut first = None;
    each_query(stmt, &mut |q, ctes| {
        each_by_name(&mut q.body, &mut |op| {
            if first.is_some() {
                return Ok(());
            }
            if let SetExpr::SetOperation { left, right, .. } = op {
                no_duplicates(left)?;
                no_duplicates(right)?;
                name_side(left);
                name_side(right);
                first = Some((side_query(left, ctes)?, side_query(right, ctes)?));
            }
            Ok(())
        })
    })?;
    Ok(first)
}

/// The names of the columns of `q`, as planned in `ctx`.
async fn names(ctx: &SessionContext, q: Query) -> Result<Vec<String>> {
    let plan = ctx
        .state()
        .statement_to_plan(datafusion::sql::parser::Statement::Statement(Box::new(
            Statement::Query(Box::new(q)),
        )))
        .await?;
    Ok(plan
        .schema()
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect())
}

/// The columns a plain `CORRESPONDING` keeps: those of `left` that
/// `right` also names, in `left`'s order.
fn shared(left: &[String], right: &[String]) -> Result<Vec<String>> {
    unique(left, "a side of CORRESPONDING")?;
    unique(right, "a side of CORRESPONDING")?;
    let names: Vec<String> = left.iter().filter(|n| right.contains(n)).cloned().collect();
    if names.is_empty() {
        return Err(ServerError::Syntax(format!(
            "the sides of CORRESPONDING share no column name (left: {}; right: {})",
            left.join(", "),
            right.join(", ")
        )));
    }
    Ok(names)
}

/// Whether `node` has a `BY NAME` operation anywhere (most statements
/// have none, and are not cloned or walked again).
pub fn has_by_name<N: Visit>(node: &N) -> bool {
    struct Find;
    impl Visitor for Find {
        type Break = ();
        fn pre_visit_query(&mut self, q: &Query) -> ControlFlow<()> {
            fn any(set: &SetExpr) -> bool {
                match set {
                    SetExpr::SetOperation {
                        left,
                        right,
                        set_quantifier,
                        ..
                    } => by_name(set_quantifier) || any(left) || any(right),
                    _ => false,
                }
            }
            if any(&q.body) {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        }
    }
    node.visit(&mut Find).is_break()
}

/// Rewrites every plain `CORRESPONDING` of `stmt` (a `BY NAME` left after
/// [`apply_lists`]) into the positional operation over the columns its
/// sides share, planning the sides in `ctx`.
pub async fn resolve<N: Visit + VisitMut>(ctx: &SessionContext, stmt: &mut N) -> Result<()> {
    if !has_by_name(stmt) {
        return Ok(());
    }
    while let Some((left, right)) = first_plain(stmt)? {
        // Boxed: planning's futures are large, and every statement's
        // future would otherwise carry room for them.
        let left = Box::pin(names(ctx, left)).await?;
        let right = Box::pin(names(ctx, right)).await?;
        let names = shared(&left, &right)?;
        let mut done = false;
        each_query(stmt, &mut |q, _| {
            each_by_name(&mut q.body, &mut |op| {
                if !done {
                    done = true;
                    pair(op, &names)?;
                }
                Ok(())
            })
        })?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(sql: &str) -> Result<String> {
        let marked = mark(sql)?.expect("marked");
        let mut stmt = Parser::parse_sql(&PostgreSqlDialect {}, &marked)?
            .pop()
            .unwrap();
        apply_lists(&mut stmt)?;
        Ok(stmt.to_string())
    }

    #[test]
    fn by_lists_keep_their_columns_on_both_sides() {
        assert_eq!(
            parsed("SELECT a, b FROM t UNION ALL CORRESPONDING BY (b, \"A\") SELECT b, a FROM u")
                .unwrap(),
            "SELECT \"b\", \"A\" FROM (SELECT a, b FROM t) AS __corresponding UNION ALL \
             SELECT \"b\", \"A\" FROM (SELECT b, a FROM u) AS __corresponding"
        );
    }

    #[test]
    fn nested_operations_find_their_own_lists() {
        let sql = parsed(
            "SELECT a FROM t UNION CORRESPONDING BY (a) (SELECT a, b FROM u \
             INTERSECT CORRESPONDING BY (b) SELECT b FROM v) EXCEPT CORRESPONDING SELECT a FROM w",
        )
        .unwrap();
        assert!(
            sql.contains("SELECT \"b\" FROM (SELECT a, b FROM u)"),
            "{sql}"
        );
        assert!(sql.contains("SELECT \"a\" FROM (SELECT a FROM t)"), "{sql}");
        // The plain one waits for planning.
        assert!(sql.contains("EXCEPT BY NAME SELECT a FROM w"), "{sql}");
    }

    #[test]
    fn by_name_written_by_hand_and_other_right_sides_are_refused() {
        assert!(crate::sql::stmt::parse("SELECT 1 AS a UNION BY NAME SELECT 2 AS a").is_err());
        assert!(mark("SELECT 1 AS a UNION CORRESPONDING VALUES (1)").is_err());
        assert!(
            parsed("SELECT 1 AS a UNION CORRESPONDING (SELECT DISTINCT ON (b, c) 1 AS a, 2 AS b)")
                .is_ok()
        );
        assert!(mark("SELECT name FROM t").unwrap().is_none());
        assert!(mark("SELECT 1 AS corresponding").unwrap().is_none());
    }

    #[test]
    fn shared_columns_follow_the_left_side() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        assert_eq!(
            shared(&s(&["c", "a", "b"]), &s(&["b", "x", "c"])).unwrap(),
            s(&["c", "b"])
        );
        assert!(shared(&s(&["a"]), &s(&["b"])).is_err());
        assert!(shared(&s(&["a", "a"]), &s(&["a"])).is_err());
    }
}

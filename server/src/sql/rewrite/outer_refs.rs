//! Correlated subqueries whose outer references DataFusion cannot pull up,
//! given a copy of the outer values to refer to instead.
//!
//! DataFusion decorrelates a subquery by turning the conditions that name
//! the outer query into the condition of a join. It does so only for
//! conditions in the subquery's own `WHERE` (or an inner join's `ON`); it
//! fails on an outer column in the `ON` of an outer join inside the
//! subquery, and on one two or more levels out:
//!
//! ```sql
//! SELECT id FROM o WHERE EXISTS (
//!   SELECT 1 FROM b LEFT JOIN c ON b.x = c.x AND c.y = o.y WHERE c.x IS NULL)
//! SELECT id FROM o WHERE EXISTS (SELECT 1 FROM b WHERE b.x = o.id
//!   AND EXISTS (SELECT 1 FROM c WHERE c.x = b.x AND c.y = o.y))
//! ```
//!
//! Such a subquery is given the outer values it needs as a table of its
//! own, the way "Unnesting Arbitrary Queries" (Neumann and Kemper) joins a
//! dependent subquery with the domain of its outer columns:
//!
//! ```sql
//! SELECT 1 FROM (SELECT DISTINCT o.y AS y, … FROM o) AS weir_outer_1
//!   CROSS JOIN b LEFT JOIN c ON b.x = c.x AND c.y = weir_outer_1.y
//! WHERE weir_outer_1.weir_key_1 = coalesce(CAST(o.y AS TEXT), '')
//!   AND weir_outer_1.weir_null_1 = (o.y IS NULL) AND c.x IS NULL
//! ```
//!
//! Every outer row matches exactly one row of the domain (the text of its
//! value, and whether it is NULL, so that a NULL finds its own row as it
//! does in Postgres), so the subquery sees what it saw before, and what
//! is left correlated is equalities in its `WHERE`, which DataFusion turns
//! into a join, also through an aggregate. A view maintains the domain as
//! the `DISTINCT` it is.
//!
//! Only qualified references (`o.y`) to a table of the enclosing `FROM`
//! are recognised, and only subqueries whose joins may be read left to
//! right (inner, left, cross, semi, anti): the domain goes first. A
//! subquery of any other shape is left alone, for DataFusion's own error.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    BinaryOperator, Expr, Ident, Join, JoinConstraint, JoinOperator, Query, Select, SelectItem,
    SetExpr, TableFactor, TableWithJoins, VisitMut, VisitorMut,
};

use super::parse;

/// Rewrites, in place, every subquery of `query` (at any depth) that
/// needs it.
pub(super) fn rewrite(query: &mut Query) {
    let _ = query.visit(&mut Outermost { next: 1 });
}

/// Walks every query, outermost first, and fixes the subqueries directly
/// in its `SELECT`.
struct Outermost {
    /// The number of the next domain's alias.
    next: usize,
}

impl VisitorMut for Outermost {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            let outer = bound(&select.from);
            if !outer.is_empty() {
                if let Some(w) = select.selection.as_mut() {
                    not_in_as_not_exists(w, false, &outer);
                }
                for e in own_exprs(select) {
                    // Each subquery before its own subqueries (a hoisted
                    // or split one's are visited next).
                    visit_shallow(e, true, |e| fix_subquery(e, &outer, &mut self.next));
                }
            }
        }
        ControlFlow::Continue(())
    }
}

/// Fixes `expr` if it is a subquery directly in a `SELECT` whose `FROM`
/// binds `outer`.
fn fix_subquery(expr: &mut Expr, outer: &BTreeMap<String, TableFactor>, next: &mut usize) {
    match expr {
        Expr::Exists { subquery, .. } => give_domain(subquery, Kind::Exists, outer, next),
        Expr::InSubquery { subquery, .. } => give_domain(subquery, Kind::In, outer, next),
        Expr::Subquery(q) => {
            if let Some(hoisted) = hoist_outer_refs(q, outer) {
                *expr = hoisted;
                return;
            }
            give_domain(q, Kind::Scalar, outer, next);
            if let Some(split) = split_one_row(q) {
                *expr = split;
            }
        }
        _ => {}
    }
}

/// Calls `f` on each expression of `e` outside the subqueries within it:
/// before the expression's children when `before`, after them otherwise.
pub(super) fn visit_shallow(e: &mut Expr, before: bool, f: impl FnMut(&mut Expr)) {
    struct Shallow<F> {
        depth: usize,
        before: bool,
        f: F,
    }
    impl<F: FnMut(&mut Expr)> VisitorMut for Shallow<F> {
        type Break = ();
        fn pre_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.depth += 1;
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.depth -= 1;
            ControlFlow::Continue(())
        }
        fn pre_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if self.depth == 0 && self.before {
                (self.f)(e);
            }
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, e: &mut Expr) -> ControlFlow<()> {
            if self.depth == 0 && !self.before {
                (self.f)(e);
            }
            ControlFlow::Continue(())
        }
    }
    let _ = e.visit(&mut Shallow {
        depth: 0,
        before,
        f,
    });
}

/// Whether `query` names, qualified, a table it does not bind itself:
/// whether it is correlated with a query around it.
pub(super) fn names_outside(query: &Query) -> bool {
    struct Free {
        scopes: Vec<BTreeSet<String>>,
        found: bool,
    }
    impl VisitorMut for Free {
        type Break = ();
        fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
            let mut names = BTreeSet::new();
            selects(&query.body, &mut |s| {
                names.extend(bound(&s.from).into_keys())
            });
            // A CTE's name is bound too.
            if let Some(with) = &query.with {
                names.extend(
                    with.cte_tables
                        .iter()
                        .map(|c| crate::sql::stmt::ident(&c.alias.name)),
                );
            }
            self.scopes.push(names);
            ControlFlow::Continue(())
        }
        fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
            self.scopes.pop();
            ControlFlow::Continue(())
        }
        fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
            if let Expr::CompoundIdentifier(p) = expr
                && let [q, _] = p.as_slice()
            {
                let q = crate::sql::stmt::ident(q);
                self.found |= !self.scopes.iter().any(|s| s.contains(&q));
            }
            ControlFlow::Continue(())
        }
    }
    let mut free = Free {
        scopes: Vec::new(),
        found: false,
    };
    let _ = query.clone().visit(&mut free);
    free.found
}

/// Whether `query` names a table of `outer` (at any depth).
fn correlated(query: &Query, outer: &BTreeMap<String, TableFactor>) -> bool {
    let mut copy = query.clone();
    let mut next = 0;
    let mut refs = Refs {
        scopes: Vec::new(),
        outer,
        position: Position::Condition,
        wanted: BTreeMap::new(),
        aliases: BTreeMap::new(),
        next: &mut next,
        stranded: false,
        needed: false,
    };
    refs.visit(Position::Condition, &mut copy);
    !refs.wanted.is_empty()
}

/// `x NOT IN (SELECT v FROM … WHERE w)` in a `WHERE`, where it is a
/// condition of its own or under `OR`, is `NOT EXISTS (SELECT 1 FROM …
/// WHERE w AND (v = x OR v IS NULL OR x IS NULL))`: true exactly where
/// Postgres's is, and false where Postgres's is false or NULL, which a
/// `WHERE` treats alike there. DataFusion plans a `NOT IN` as a join on `x`
/// alone, which a correlated one is not, and under `OR` as a join that
/// forgets the NULLs (a wrong answer). A `NOT IN` of its own that is not
/// correlated is left to that join, which keeps SQL's NULL rules.
fn not_in_as_not_exists(
    condition: &mut Expr,
    under_or: bool,
    outer: &BTreeMap<String, TableFactor>,
) {
    match condition {
        Expr::BinaryOp {
            left,
            op: op @ (BinaryOperator::And | BinaryOperator::Or),
            right,
        } => {
            let under_or = under_or || *op == BinaryOperator::Or;
            not_in_as_not_exists(left, under_or, outer);
            not_in_as_not_exists(right, under_or, outer);
        }
        Expr::Nested(e) => not_in_as_not_exists(e, under_or, outer),
        Expr::InSubquery {
            expr,
            subquery,
            negated: true,
        } => {
            let SetExpr::Select(select) = subquery.body.as_ref() else {
                return;
            };
            let local: BTreeSet<String> = bound(&select.from).into_keys().collect();
            // `x` must mean in the subquery what it means outside it.
            let mut plain = true;
            let _ = datafusion::sql::sqlparser::ast::visit_expressions(expr.as_ref(), |e| {
                plain &= match e {
                    Expr::Identifier(_) | Expr::Subquery(_) | Expr::Exists { .. } => false,
                    Expr::CompoundIdentifier(p) => {
                        !local.contains(&crate::sql::stmt::ident(&p[0]))
                            && outer.contains_key(&crate::sql::stmt::ident(&p[0]))
                    }
                    _ => true,
                };
                ControlFlow::<()>::Continue(())
            });
            let is_correlated = correlated(subquery, outer);
            if !is_correlated {
                if under_or {
                    // The subquery as it is, under a name `x` cannot mean.
                    let sql = format!(
                        "NOT EXISTS (SELECT 1 FROM ({subquery}) AS weir_not_in(weir_value) WHERE \
                         weir_not_in.weir_value = ({expr}) OR weir_not_in.weir_value IS NULL \
                         OR ({expr}) IS NULL)"
                    );
                    if let Some(e) = parse(&sql, |p| p.parse_expr()) {
                        *condition = e;
                    }
                }
                return;
            }
            if !plain
                || aggregates(select)
                || subquery.limit_clause.is_some()
                || subquery.fetch.is_some()
            {
                return;
            }
            let mut select = select.clone();
            let Some(v) = only_item(&mut select).cloned() else {
                return;
            };
            let match_or_null = format!("({v}) = ({expr}) OR ({v}) IS NULL OR ({expr}) IS NULL");
            let Some(match_or_null) = parse(&match_or_null, |p| p.parse_expr()) else {
                return;
            };
            select.selection = Some(match select.selection.take() {
                Some(w) => Expr::BinaryOp {
                    left: Box::new(Expr::Nested(Box::new(w))),
                    op: BinaryOperator::And,
                    right: Box::new(Expr::Nested(Box::new(match_or_null))),
                },
                None => match_or_null,
            });
            select.projection = vec![SelectItem::UnnamedExpr(Expr::value(
                datafusion::sql::sqlparser::ast::Value::Number("1".into(), false),
            ))];
            let mut query = subquery.as_ref().clone();
            *query.body = SetExpr::Select(select);
            query.order_by = None;
            *condition = Expr::Exists {
                subquery: Box::new(query),
                negated: true,
            };
        }
        _ => {}
    }
}

/// `(SELECT count(*) + o.y FROM b WHERE …)`, a subquery that aggregates
/// into one row and names the outer query outside its aggregates, is
/// `(SELECT count(*) FROM b WHERE …) + o.y`: DataFusion decorrelates a
/// subquery only when its select list does not name the outer query.
fn hoist_outer_refs(query: &Query, outer: &BTreeMap<String, TableFactor>) -> Option<Expr> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    if !aggregates(select)
        || grouped(select)
        || select.having.is_some()
        || query.limit_clause.is_some()
        || query.fetch.is_some()
    {
        return None;
    }
    let mut select = select.clone();
    let value = only_item(&mut select)?.clone();
    let local: BTreeSet<String> = bound(&select.from).into_keys().collect();
    // The value without its aggregates: what is left of it names only the
    // outer query.
    let mut rest = value.clone();
    visit_shallow(&mut rest, false, |e| {
        if super::is_aggregate(e) {
            *e = Expr::value(datafusion::sql::sqlparser::ast::Value::Null);
        }
    });
    if !names_outer(&rest, &local, outer) || names_local(&rest, &local) {
        return None;
    }
    let mut hoisted = value;
    visit_shallow(&mut hoisted, false, |e| {
        if super::is_aggregate(e) {
            let mut q = query.clone();
            let mut s = select.clone();
            s.projection = vec![SelectItem::UnnamedExpr(e.clone())];
            *q.body = SetExpr::Select(s);
            *e = Expr::Subquery(Box::new(q));
        }
    });
    Some(hoisted)
}

/// `(SELECT weir_one_row(count(*), max(v)) FROM …)`, as [`give_domain`]
/// writes a scalar subquery that does not aggregate, becomes
/// `weir_one_row((SELECT count(*) FROM …), (SELECT max(v) FROM …))`, so
/// that two rows are an error only for an outer row the query keeps, as
/// in Postgres (which runs the subquery only for those).
fn split_one_row(query: &Query) -> Option<Expr> {
    let SetExpr::Select(select) = query.body.as_ref() else {
        return None;
    };
    let mut select = select.clone();
    let Expr::Function(f) = only_item(&mut select)?.clone() else {
        return None;
    };
    if super::last_name(&f.name).as_deref() != Some("weir_one_row") {
        return None;
    }
    let datafusion::sql::sqlparser::ast::FunctionArguments::List(list) = &f.args else {
        return None;
    };
    let parts: Vec<String> = list
        .args
        .iter()
        .map(|a| {
            let mut q = query.clone();
            let mut s = select.clone();
            s.projection = vec![SelectItem::UnnamedExpr(parse(&a.to_string(), |p| {
                p.parse_expr()
            })?)];
            *q.body = SetExpr::Select(s);
            Some(format!("({q})"))
        })
        .collect::<Option<_>>()?;
    parse(&format!("weir_one_row({})", parts.join(", ")), |p| {
        p.parse_expr()
    })
}

/// The expressions a `SELECT` evaluates itself: its list, conditions and
/// groups, and its joins' `ON`s.
fn own_exprs(select: &mut Select) -> Vec<&mut Expr> {
    let Select {
        selection,
        from,
        projection,
        having,
        qualify,
        group_by,
        ..
    } = select;
    let mut out = list_of(projection, having, qualify, group_by);
    out.extend(selection.as_mut());
    for twj in from.iter_mut() {
        for join in twj.joins.iter_mut() {
            if let Some(JoinConstraint::On(e)) = constraint_mut(&mut join.join_operator) {
                out.push(e);
            }
        }
    }
    out
}

fn constraint_mut(op: &mut JoinOperator) -> Option<&mut JoinConstraint> {
    match op {
        JoinOperator::Join(c)
        | JoinOperator::Inner(c)
        | JoinOperator::Left(c)
        | JoinOperator::LeftOuter(c)
        | JoinOperator::Right(c)
        | JoinOperator::RightOuter(c)
        | JoinOperator::FullOuter(c)
        | JoinOperator::CrossJoin(c)
        | JoinOperator::Semi(c)
        | JoinOperator::LeftSemi(c)
        | JoinOperator::RightSemi(c)
        | JoinOperator::Anti(c)
        | JoinOperator::LeftAnti(c)
        | JoinOperator::RightAnti(c)
        | JoinOperator::StraightJoin(c) => Some(c),
        _ => None,
    }
}

/// How a join of the subquery's `FROM` is treated.
enum JoinKind {
    /// DataFusion takes an outer column in its `ON` as a condition.
    Inner,
    /// An outer column in its `ON` must come from the domain.
    Outer,
}

fn join_kind(op: &JoinOperator) -> Option<JoinKind> {
    match op {
        JoinOperator::Join(_) | JoinOperator::Inner(_) | JoinOperator::CrossJoin(_) => {
            Some(JoinKind::Inner)
        }
        JoinOperator::Left(_)
        | JoinOperator::LeftOuter(_)
        | JoinOperator::Semi(_)
        | JoinOperator::LeftSemi(_)
        | JoinOperator::Anti(_)
        | JoinOperator::LeftAnti(_) => Some(JoinKind::Outer),
        // A right or full join read after the domain would drop the
        // domain's values from its unmatched rows.
        _ => None,
    }
}

/// The names a `FROM` list binds, each with the table it names.
fn bound(from: &[TableWithJoins]) -> BTreeMap<String, TableFactor> {
    let mut out = BTreeMap::new();
    for twj in from {
        bind(&twj.relation, &mut out);
        for join in &twj.joins {
            bind(&join.relation, &mut out);
        }
    }
    out
}

fn bind(factor: &TableFactor, out: &mut BTreeMap<String, TableFactor>) {
    let name = match factor {
        TableFactor::Table { alias: Some(a), .. }
        | TableFactor::Derived { alias: Some(a), .. }
        | TableFactor::Function { alias: Some(a), .. }
        | TableFactor::UNNEST { alias: Some(a), .. } => Some(crate::sql::stmt::ident(&a.name)),
        TableFactor::Table { name, .. } => super::last_name(name),
        TableFactor::NestedJoin {
            table_with_joins, ..
        } => {
            out.extend(bound(std::slice::from_ref(table_with_joins)));
            None
        }
        _ => None,
    };
    if let Some(name) = name {
        out.insert(name, factor.clone());
    }
}

/// Whether a copy of `factor`, alone, means what it meant in its `FROM`:
/// a table, or a subquery that is not `LATERAL`.
fn stands_alone(factor: &TableFactor) -> bool {
    match factor {
        TableFactor::Table { args, .. } => args.is_none(),
        TableFactor::Derived { lateral, .. } => !lateral,
        _ => false,
    }
}

/// Where in the subquery an expression is.
#[derive(Clone, Copy, PartialEq)]
enum Position {
    /// A table of its `FROM` list: no outer reference can be served there.
    Table,
    /// Its `WHERE`, or an inner join's `ON`: a condition DataFusion can
    /// pull up (unless the subquery aggregates, see [`pullable`]).
    Condition,
    /// Anywhere else: an outer join's `ON`, the select list, `GROUP BY`,
    /// `HAVING`.
    Elsewhere,
}

/// The outer references of one subquery: what it names of the enclosing
/// `FROM`, each replaced by the domain's column.
struct Refs<'a> {
    /// The names bound by the queries between the subquery and the
    /// expression being visited, innermost last.
    scopes: Vec<BTreeSet<String>>,
    outer: &'a BTreeMap<String, TableFactor>,
    position: Position,
    /// By outer name: the name as written and the columns it is asked for.
    wanted: BTreeMap<String, (Ident, Vec<Ident>)>,
    /// The domain's alias for each outer name.
    aliases: BTreeMap<String, Ident>,
    next: &'a mut usize,
    /// Set when a reference is where no domain can reach it.
    stranded: bool,
    /// Set when a reference is where DataFusion cannot take it.
    needed: bool,
}

impl Refs<'_> {
    /// The domain alias of `outer`, numbered on first use.
    fn alias(&mut self, name: &str) -> Ident {
        if let Some(a) = self.aliases.get(name) {
            return a.clone();
        }
        let a = Ident::new(format!("weir_outer_{}", self.next));
        *self.next += 1;
        self.aliases.insert(name.to_string(), a.clone());
        a
    }

    fn visit(&mut self, position: Position, node: &mut impl VisitMut) {
        self.position = position;
        let _ = node.visit(self);
    }
}

impl VisitorMut for Refs<'_> {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        let mut names = BTreeSet::new();
        selects(&query.body, &mut |s| {
            names.extend(bound(&s.from).into_keys())
        });
        self.scopes.push(names);
        ControlFlow::Continue(())
    }

    fn post_visit_query(&mut self, _: &mut Query) -> ControlFlow<()> {
        self.scopes.pop();
        ControlFlow::Continue(())
    }

    fn post_visit_expr(&mut self, expr: &mut Expr) -> ControlFlow<()> {
        let Expr::CompoundIdentifier(parts) = expr else {
            return ControlFlow::Continue(());
        };
        let [q, column] = parts.as_slice() else {
            return ControlFlow::Continue(());
        };
        let name = crate::sql::stmt::ident(q);
        if self.scopes.iter().any(|s| s.contains(&name)) || !self.outer.contains_key(&name) {
            return ControlFlow::Continue(());
        }
        match self.position {
            Position::Table => self.stranded = true,
            _ if self.scopes.len() > 1 => self.needed = true,
            Position::Elsewhere => self.needed = true,
            Position::Condition => {}
        }
        let (q, column) = (q.clone(), column.clone());
        let columns = &mut self.wanted.entry(name.clone()).or_insert((q, vec![])).1;
        if !columns
            .iter()
            .any(|c| crate::sql::stmt::ident(c) == crate::sql::stmt::ident(&column))
        {
            columns.push(column.clone());
        }
        let alias = self.alias(&name);
        *expr = Expr::CompoundIdentifier(vec![alias, column]);
        ControlFlow::Continue(())
    }
}

/// Calls `f` with every `SELECT` of a query body (the branches of a set
/// operation too).
fn selects(body: &SetExpr, f: &mut impl FnMut(&Select)) {
    match body {
        SetExpr::Select(s) => f(s),
        SetExpr::SetOperation { left, right, .. } => {
            selects(left, f);
            selects(right, f);
        }
        _ => {}
    }
}

/// Whether DataFusion can pull a condition naming the outer query up
/// through an aggregate: `inner_column = outer expression`, either way
/// round.
fn pullable(condition: &Expr, local: &BTreeSet<String>) -> bool {
    let Expr::BinaryOp {
        left,
        op: BinaryOperator::Eq,
        right,
    } = condition
    else {
        return false;
    };
    let column = |e: &Expr| match e {
        Expr::Cast { expr, .. } => is_local_column(expr, local),
        e => is_local_column(e, local),
    };
    (column(left) && !names_local(right, local)) || (column(right) && !names_local(left, local))
}

fn is_local_column(e: &Expr, local: &BTreeSet<String>) -> bool {
    match e {
        Expr::Identifier(_) => true,
        Expr::CompoundIdentifier(p) => {
            p.len() == 2 && local.contains(&crate::sql::stmt::ident(&p[0]))
        }
        Expr::Nested(e) => is_local_column(e, local),
        _ => false,
    }
}

/// Whether `e` names a column of the subquery's own tables (an
/// unqualified name is taken to be one).
fn names_local(e: &Expr, local: &BTreeSet<String>) -> bool {
    let mut found = false;
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(e, |e| {
        found |= match e {
            Expr::Identifier(_) => true,
            Expr::CompoundIdentifier(p) => {
                p.len() != 2 || local.contains(&crate::sql::stmt::ident(&p[0]))
            }
            _ => false,
        };
        ControlFlow::<()>::Continue(())
    });
    found
}

/// Whether `e` names the outer query (at any depth).
fn names_outer(e: &Expr, local: &BTreeSet<String>, outer: &BTreeMap<String, TableFactor>) -> bool {
    let mut found = false;
    let _ = datafusion::sql::sqlparser::ast::visit_expressions(e, |e| {
        if let Expr::CompoundIdentifier(p) = e
            && let [q, _] = p.as_slice()
        {
            let q = crate::sql::stmt::ident(q);
            found |= !local.contains(&q) && outer.contains_key(&q);
        }
        ControlFlow::<()>::Continue(())
    });
    found
}

fn conjuncts<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match e {
        Expr::BinaryOp {
            left,
            op: BinaryOperator::And,
            right,
        } => {
            conjuncts(left, out);
            conjuncts(right, out);
        }
        Expr::Nested(e) => conjuncts(e, out),
        e => out.push(e),
    }
}

/// Whether the subquery aggregates and has a condition on the outer query
/// that DataFusion cannot pull up through the aggregate.
fn unpullable_under_aggregate(select: &Select, outer: &BTreeMap<String, TableFactor>) -> bool {
    if !aggregates(select) {
        return false;
    }
    let local: BTreeSet<String> = bound(&select.from).into_keys().collect();
    let mut conditions = Vec::new();
    if let Some(w) = &select.selection {
        conjuncts(w, &mut conditions);
    }
    for join in select.from.iter().flat_map(|t| &t.joins) {
        if let JoinOperator::Join(JoinConstraint::On(e))
        | JoinOperator::Inner(JoinConstraint::On(e)) = &join.join_operator
        {
            conjuncts(e, &mut conditions);
        }
    }
    conditions
        .into_iter()
        .any(|c| names_outer(c, &local, outer) && !pullable(c, &local))
}

/// Whether a column the subquery's conditions on the outer query name
/// has the name of another such column, or of one the subquery returns.
/// DataFusion adds those columns to what the subquery returns, and then
/// takes one for the other (`x IN (SELECT b.y FROM b JOIN c … WHERE c.y =
/// o.id)` compares with `b.y` where `c.y` was meant); the domain's columns
/// are named uniquely.
fn names_collide(select: &Select, exists: bool, outer: &BTreeMap<String, TableFactor>) -> bool {
    let local: BTreeSet<String> = bound(&select.from).into_keys().collect();
    // Each column by its name and, for a column, what it is.
    let mut seen: Vec<(String, Option<String>)> = Vec::new();
    let column = |e: &Expr| match e {
        Expr::Identifier(i) => Some((crate::sql::stmt::ident(i), Some(crate::sql::stmt::ident(i)))),
        Expr::CompoundIdentifier(p) => match p.as_slice() {
            [q, c] if local.contains(&crate::sql::stmt::ident(q)) => Some((
                crate::sql::stmt::ident(c),
                Some(format!(
                    "{}.{}",
                    crate::sql::stmt::ident(q),
                    crate::sql::stmt::ident(c)
                )),
            )),
            _ => None,
        },
        _ => None,
    };
    if !exists {
        for item in &select.projection {
            match item {
                SelectItem::ExprWithAlias { alias, .. } => {
                    seen.push((crate::sql::stmt::ident(alias), None))
                }
                SelectItem::UnnamedExpr(e) => seen.extend(column(e)),
                _ => {}
            }
        }
    }
    let mut conditions = Vec::new();
    if let Some(w) = &select.selection {
        conjuncts(w, &mut conditions);
    }
    for c in conditions {
        if !names_outer(c, &local, outer) {
            continue;
        }
        let _ = datafusion::sql::sqlparser::ast::visit_expressions(c, |e| {
            if let Some(c) = column(e)
                && !seen.contains(&c)
            {
                seen.push(c);
            }
            ControlFlow::<()>::Continue(())
        });
    }
    seen.iter()
        .enumerate()
        .any(|(i, (name, _))| seen[i + 1..].iter().any(|(n, _)| n == name))
}

/// What a subquery is for.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Exists,
    In,
    /// A value: at most one row, of one column.
    Scalar,
}

/// `LIMIT n [OFFSET m]` (or `FETCH FIRST n ROWS ONLY`) with literal
/// numbers: the first row kept, from 1, and how many.
fn literal_limit(query: &Query) -> Option<(u64, u64)> {
    use datafusion::sql::sqlparser::ast::{LimitClause, Value};
    let number = |e: &Expr| match e {
        Expr::Value(v) => match &v.value {
            Value::Number(n, _) => n.parse::<u64>().ok(),
            _ => None,
        },
        _ => None,
    };
    let (count, offset) = match (&query.limit_clause, &query.fetch) {
        (
            Some(LimitClause::LimitOffset {
                limit,
                offset,
                limit_by,
            }),
            None,
        ) if limit_by.is_empty() => (
            match limit {
                Some(l) => number(l)?,
                None => u64::MAX,
            },
            match offset {
                Some(o) => number(&o.value)?,
                None => 0,
            },
        ),
        (None, Some(fetch)) if !fetch.with_ties && !fetch.percent => {
            (fetch.quantity.as_ref().map_or(Some(1), number)?, 0)
        }
        _ => return None,
    };
    Some((offset, count))
}

fn aggregates(select: &Select) -> bool {
    let grouped = match &select.group_by {
        datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(e, _) => !e.is_empty(),
        datafusion::sql::sqlparser::ast::GroupByExpr::All(_) => true,
    };
    grouped || select.having.is_some() || super::has_aggregate(select)
}

fn grouped(select: &Select) -> bool {
    !matches!(&select.group_by,
        datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(e, _) if e.is_empty())
}

/// A scalar subquery's one value, with its alias if it has one.
fn only_item(select: &mut Select) -> Option<&mut Expr> {
    match select.projection.as_mut_slice() {
        [SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. }] => Some(e),
        _ => None,
    }
}

/// `weir_one_row(count(*), max(e))`: `e` of the one row, or the error.
fn one_row(e: &Expr) -> Option<Expr> {
    parse(&format!("weir_one_row(count(*), max({e}))"), |p| {
        p.parse_expr()
    })
}

/// Rewrites `subquery` (directly in a query whose `FROM` binds `outer`)
/// into a shape DataFusion decorrelates, if it names the outer query where
/// DataFusion cannot take it and its shape allows.
fn give_domain(
    subquery: &mut Query,
    kind: Kind,
    outer: &BTreeMap<String, TableFactor>,
    next: &mut usize,
) {
    let SetExpr::Select(original) = subquery.body.as_ref() else {
        return;
    };
    if original
        .from
        .iter()
        .flat_map(|t| &t.joins)
        .any(|j| join_kind(&j.join_operator).is_none())
    {
        return;
    }
    let limited = subquery.limit_clause.is_some() || subquery.fetch.is_some();
    let limit = literal_limit(subquery);
    let mut select = original.clone();
    // A scalar subquery that does not aggregate is given an aggregate
    // (see `weir_one_row`); one with `LIMIT` a row number per outer row.
    let mut per_row_limit = None;
    let mut drop_limit = false;
    if kind == Kind::Scalar {
        if aggregates(&select) {
            // One row anyway: `LIMIT 1` changes nothing.
            if limited {
                match limit {
                    Some((0, n)) if n >= 1 && !grouped(&select) => drop_limit = true,
                    _ => return,
                }
            }
        } else if select.distinct.is_some() {
            return;
        } else if limited {
            per_row_limit = Some(match limit {
                Some(l) => l,
                None => return,
            });
        } else {
            let Some(e) = only_item(&mut select) else {
                return;
            };
            let Some(wrapped) = one_row(e) else {
                return;
            };
            *e = wrapped;
        }
    } else if limited && kind == Kind::In {
        // A correlated `LIMIT` is a limit per outer row, which a join
        // would not keep (any rows at all are enough for EXISTS).
        return;
    }
    let needed = per_row_limit.is_some()
        || unpullable_under_aggregate(&select, outer)
        || names_collide(&select, kind == Kind::Exists, outer);
    let as_written = select.clone();
    let mut refs = Refs {
        scopes: vec![bound(&select.from).into_keys().collect()],
        outer,
        position: Position::Table,
        wanted: BTreeMap::new(),
        aliases: BTreeMap::new(),
        next,
        stranded: false,
        needed,
    };
    for twj in select.from.iter_mut() {
        refs.visit(Position::Table, &mut twj.relation);
        for join in twj.joins.iter_mut() {
            refs.visit(Position::Table, &mut join.relation);
            let position = match join_kind(&join.join_operator) {
                Some(JoinKind::Inner) => Position::Condition,
                _ => Position::Elsewhere,
            };
            if let Some(JoinConstraint::On(e)) = constraint_mut(&mut join.join_operator) {
                refs.visit(position, e);
            }
        }
    }
    if let Some(w) = select.selection.as_mut() {
        refs.visit(Position::Condition, w);
    }
    for e in list_exprs(&mut select) {
        refs.visit(Position::Elsewhere, e);
    }
    let mut order_by = subquery.order_by.clone();
    if let Some(order_by) = order_by.as_mut() {
        refs.visit(Position::Elsewhere, order_by);
    }
    if refs.stranded || refs.wanted.is_empty() {
        // Not correlated (DataFusion plans it as it is), or not in a way
        // a domain can serve.
        return;
    }
    if drop_limit {
        subquery.limit_clause = None;
        subquery.fetch = None;
    }
    if !refs.needed {
        // DataFusion takes the outer references where they are.
        *subquery.body = SetExpr::Select(as_written);
        return;
    }
    // The domain's columns must not show in what the subquery returns.
    if select
        .projection
        .iter()
        .any(|i| matches!(i, SelectItem::Wildcard(_)))
    {
        if kind != Kind::Exists {
            return;
        }
        select.projection = vec![SelectItem::UnnamedExpr(Expr::value(
            datafusion::sql::sqlparser::ast::Value::Number("1".into(), false),
        ))];
    }
    let mut domains = Vec::new();
    // Each domain column that pairs an outer row with its domain row:
    // (domain alias, number, the outer column as written).
    let mut keys = Vec::new();
    for (name, (q, columns)) in &refs.wanted {
        let alias = &refs.aliases[name];
        let factor = &outer[name];
        if !stands_alone(factor) {
            return;
        }
        let mut list = Vec::new();
        for (i, c) in columns.iter().enumerate() {
            let i = i + 1;
            list.push(format!(
                "{q}.{c} AS {c}, coalesce(CAST({q}.{c} AS TEXT), '') AS {alias}_key_{i}, \
                 {q}.{c} IS NULL AS {alias}_null_{i}"
            ));
            keys.push((alias.clone(), i, format!("{q}.{c}")));
        }
        let sql = format!(
            "(SELECT DISTINCT {} FROM {factor}) AS {alias}",
            list.join(", ")
        );
        let Some(domain) = parse(&sql, |p| p.parse_table_factor()) else {
            return;
        };
        domains.push(domain);
    }
    // The domain first, then the list read left to right, so that every
    // `ON` sees the domain's columns.
    let mut tables = domains.into_iter();
    let Some(first) = tables.next() else {
        return;
    };
    let mut joins: Vec<Join> = tables.map(cross).collect();
    for twj in std::mem::take(&mut select.from) {
        joins.push(cross(twj.relation));
        joins.extend(twj.joins);
    }
    select.from = vec![TableWithJoins {
        relation: first,
        joins,
    }];
    // The conditions that tie an outer row to its domain row, with the
    // domain's columns under `qualifier` (the domain's own alias when
    // `None`).
    let pairing = |qualifier: Option<&str>| {
        keys.iter()
            .map(|(alias, i, outer)| {
                let q = qualifier.map_or_else(|| alias.to_string(), str::to_string);
                format!(
                    "{q}.{alias}_key_{i} = coalesce(CAST({outer} AS TEXT), '') AND \
                     {q}.{alias}_null_{i} = ({outer} IS NULL)"
                )
            })
            .collect::<Vec<_>>()
            .join(" AND ")
    };
    if let Some((offset, count)) = per_row_limit {
        let Some(rows) = numbered_rows(select, order_by, &keys) else {
            return;
        };
        let last = offset.saturating_add(count);
        let sql = format!(
            "SELECT weir_one_row(count(*), max(weir_rows.weir_value)) FROM ({rows}) AS weir_rows \
             WHERE weir_rows.weir_row > {offset} AND weir_rows.weir_row <= {last} AND {}",
            pairing(Some("weir_rows"))
        );
        let Some(q) = parse(&sql, |p| p.parse_query()) else {
            return;
        };
        *subquery = *q;
        return;
    }
    let Some(mut condition) = parse(&pairing(None), |p| p.parse_expr()) else {
        return;
    };
    if let Some(old) = select.selection.take() {
        condition = Expr::BinaryOp {
            left: Box::new(condition),
            op: BinaryOperator::And,
            right: Box::new(Expr::Nested(Box::new(old))),
        };
    }
    select.selection = Some(condition);
    *subquery.body = SetExpr::Select(select);
    subquery.order_by = order_by;
}

/// `SELECT e AS weir_value, <keys>, row_number() OVER (PARTITION BY <keys>
/// ORDER BY …) AS weir_row FROM …`: the rows of a scalar subquery with a
/// `LIMIT`, numbered per outer row in the subquery's order.
fn numbered_rows(
    mut select: Box<Select>,
    order_by: Option<datafusion::sql::sqlparser::ast::OrderBy>,
    keys: &[(Ident, usize, String)],
) -> Option<String> {
    use datafusion::sql::sqlparser::ast::{OrderByKind, Value};
    let value = only_item(&mut select)?.clone();
    let alias = match &select.projection[0] {
        SelectItem::ExprWithAlias { alias, .. } => Some(crate::sql::stmt::ident(alias)),
        _ => None,
    };
    let mut order = Vec::new();
    if let Some(order_by) = order_by {
        let OrderByKind::Expressions(exprs) = order_by.kind else {
            return None;
        };
        for mut o in exprs {
            // `ORDER BY 1` or by the value's alias: the value.
            let is_value = match &o.expr {
                Expr::Value(v) => matches!(&v.value, Value::Number(n, _) if n == "1"),
                Expr::Identifier(i) => alias.as_deref() == Some(&crate::sql::stmt::ident(i)),
                _ => false,
            };
            if is_value {
                o.expr = value.clone();
            }
            order.push(o.to_string());
        }
    }
    let key_columns: Vec<String> = keys
        .iter()
        .flat_map(|(alias, i, _)| {
            [
                format!("{alias}.{alias}_key_{i}"),
                format!("{alias}.{alias}_null_{i}"),
            ]
        })
        .collect();
    let over = if order.is_empty() {
        format!("PARTITION BY {}", key_columns.join(", "))
    } else {
        format!(
            "PARTITION BY {} ORDER BY {}",
            key_columns.join(", "),
            order.join(", ")
        )
    };
    let mut list = vec![format!("{value} AS weir_value")];
    list.extend(key_columns.iter().cloned());
    list.push(format!("row_number() OVER ({over}) AS weir_row"));
    let items = parse(&format!("SELECT {}", list.join(", ")), |p| p.parse_select())?;
    select.projection = items.projection;
    Some(select.to_string())
}

fn cross(relation: TableFactor) -> Join {
    Join {
        relation,
        global: false,
        join_operator: JoinOperator::CrossJoin(JoinConstraint::None),
    }
}

/// The expressions of a `SELECT`'s list, groups and conditions on them.
fn list_exprs(select: &mut Select) -> Vec<&mut Expr> {
    let Select {
        projection,
        having,
        qualify,
        group_by,
        ..
    } = select;
    list_of(projection, having, qualify, group_by)
}

fn list_of<'s>(
    projection: &'s mut [SelectItem],
    having: &'s mut Option<Expr>,
    qualify: &'s mut Option<Expr>,
    group_by: &'s mut datafusion::sql::sqlparser::ast::GroupByExpr,
) -> Vec<&'s mut Expr> {
    let mut out = Vec::new();
    for item in projection.iter_mut() {
        if let SelectItem::UnnamedExpr(e) | SelectItem::ExprWithAlias { expr: e, .. } = item {
            out.push(e);
        }
    }
    out.extend(having.as_mut());
    out.extend(qualify.as_mut());
    if let datafusion::sql::sqlparser::ast::GroupByExpr::Expressions(exprs, _) = group_by {
        out.extend(exprs.iter_mut());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rewritten(sql: &str) -> String {
        let mut q = parse(sql, |p| p.parse_query()).unwrap();
        rewrite(&mut q);
        q.to_string()
    }

    #[test]
    fn what_datafusion_decorrelates_is_left_alone() {
        for sql in [
            "SELECT id FROM o WHERE EXISTS (SELECT 1 FROM b WHERE b.x = o.id)",
            "SELECT id FROM o WHERE EXISTS (SELECT 1 FROM b JOIN c ON b.x = c.x AND c.y = o.y)",
            "SELECT id, (SELECT max(b.y) FROM b WHERE b.x = o.id) FROM o",
            "SELECT id FROM o WHERE o.y IN (SELECT b.y FROM b WHERE b.x = o.id)",
            "SELECT id, (SELECT max(b.y) FROM b) FROM o",
            "SELECT id FROM o WHERE o.y NOT IN (SELECT b.y FROM b)",
        ] {
            assert_eq!(rewritten(sql), sql);
        }
    }

    #[test]
    fn an_outer_column_in_an_outer_join_gets_a_domain() {
        let out = rewritten(
            "SELECT id FROM o WHERE EXISTS (SELECT 1 FROM b LEFT JOIN c ON b.x = c.x AND c.y = o.y)",
        );
        assert_eq!(
            out,
            "SELECT id FROM o WHERE EXISTS (SELECT 1 FROM (SELECT DISTINCT o.y AS y, \
             coalesce(CAST(o.y AS TEXT), '') AS weir_outer_1_key_1, o.y IS NULL AS \
             weir_outer_1_null_1 FROM o) AS weir_outer_1 CROSS JOIN b LEFT JOIN c ON b.x = c.x \
             AND c.y = weir_outer_1.y WHERE weir_outer_1.weir_outer_1_key_1 = \
             coalesce(CAST(o.y AS TEXT), '') AND weir_outer_1.weir_outer_1_null_1 = (o.y IS NULL))"
        );
    }

    #[test]
    fn a_scalar_subquery_without_aggregate_counts_its_rows() {
        assert_eq!(
            rewritten("SELECT (SELECT b.t FROM b WHERE b.x = o.id) FROM o"),
            "SELECT weir_one_row((SELECT count(*) FROM b WHERE b.x = o.id), \
             (SELECT max(b.t) FROM b WHERE b.x = o.id)) FROM o"
        );
        assert_eq!(
            rewritten("SELECT (SELECT count(*) + o.y FROM b WHERE b.x < o.id) FROM o"),
            "SELECT (SELECT count(*) FROM (SELECT DISTINCT o.id AS id, coalesce(CAST(o.id AS \
             TEXT), '') AS weir_outer_1_key_1, o.id IS NULL AS weir_outer_1_null_1 FROM o) AS \
             weir_outer_1 CROSS JOIN b WHERE weir_outer_1.weir_outer_1_key_1 = \
             coalesce(CAST(o.id AS TEXT), '') AND weir_outer_1.weir_outer_1_null_1 = (o.id IS \
             NULL) AND (b.x < weir_outer_1.id)) + o.y FROM o"
        );
    }

    #[test]
    fn not_in_under_or_keeps_its_nulls() {
        assert_eq!(
            rewritten("SELECT id FROM o WHERE id = 1 OR y NOT IN (SELECT b.y FROM b)"),
            "SELECT id FROM o WHERE id = 1 OR NOT EXISTS (SELECT 1 FROM (SELECT b.y FROM b) AS \
             weir_not_in (weir_value) WHERE weir_not_in.weir_value = (y) OR \
             weir_not_in.weir_value IS NULL OR (y) IS NULL)"
        );
    }
}

//! What the front end knows of the window table functions (`TUMBLE`,
//! `HOP`, `CUMULATE`, `SESSION`): their names, and the rewrite of an
//! `EMIT ON WINDOW CLOSE` aggregate that groups by `window_start` alone.
//! Planning them is `planner::windows`.

use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, GroupByExpr, Ident, Query, Select, SetExpr, Statement, TableFactor, VisitMut,
    VisitorMut,
};

/// The window table functions, by their lower-case names.
pub const FUNCTIONS: &[&str] = &["tumble", "hop", "cumulate", "session"];

/// `EMIT ON WINDOW CLOSE` grouped by `window_start` alone. A window closes
/// at its `window_end`, which the aggregate must have among its keys; for
/// TUMBLE and HOP every window of a `window_start` has the same end, so
/// grouping by it as well groups the same rows, and the query's output,
/// which does not select it, is unchanged. (A CUMULATE period's windows
/// share their start and differ in their end, so it stays refused.)
pub fn group_by_window_end(stmt: &mut Statement) {
    let _ = stmt.visit(&mut AddWindowEnd);
}

struct AddWindowEnd;

impl VisitorMut for AddWindowEnd {
    type Break = ();

    fn pre_visit_query(&mut self, query: &mut Query) -> ControlFlow<()> {
        if let SetExpr::Select(select) = query.body.as_mut() {
            add_window_end(select);
        }
        ControlFlow::Continue(())
    }
}

fn add_window_end(select: &mut Select) {
    let fixed_end = select.from.iter().any(|t| {
        matches!(&t.relation, TableFactor::Table { name, args: Some(_), .. }
            if crate::sql::stmt::object_name(name)
                .is_ok_and(|n| n.name == "tumble" || n.name == "hop"))
    });
    let GroupByExpr::Expressions(keys, _) = &mut select.group_by else {
        return;
    };
    let named = |e: &SqlExpr, column: &str| match e {
        SqlExpr::Identifier(i) => crate::sql::stmt::ident(i) == column,
        SqlExpr::CompoundIdentifier(parts) => parts
            .last()
            .is_some_and(|i| crate::sql::stmt::ident(i) == column),
        _ => false,
    };
    if !fixed_end || keys.iter().any(|k| named(k, "window_end")) {
        return;
    }
    let Some(start) = keys.iter().find(|k| named(k, "window_start")).cloned() else {
        return;
    };
    let end = match start {
        SqlExpr::CompoundIdentifier(mut parts) => {
            if let Some(last) = parts.last_mut() {
                *last = Ident::new("window_end");
            }
            SqlExpr::CompoundIdentifier(parts)
        }
        _ => SqlExpr::Identifier(Ident::new("window_end")),
    };
    keys.push(end);
}

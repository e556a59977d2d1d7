//! Unqualified names, resolved by the session's `search_path` as Postgres
//! resolves them.
//!
//! A statement's unqualified relation names are qualified here, before
//! anything else reads the statement: a name that exists in a schema of
//! the path becomes `schema.name` (the first such schema), and the name of
//! an object being created gets the path's first schema. Everything after
//! this (permissions, DDL, DataFusion's planning) sees qualified names, and
//! a view's stored query keeps them, so re-planning it at a restart means
//! what it meant when it was created, whatever the path is then (Postgres
//! keeps a view's relations by oid for the same reason).
//!
//! Names found in no schema of the path are left as they are: DataFusion
//! then looks for them in `public` and `pg_catalog`'s tables where Weir
//! keeps them, so the system catalogs stay reachable by their bare names.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    CopySource, Expr as SqlExpr, FunctionArg, FunctionArgExpr, Grant, GrantObjects, Ident,
    ObjectName, ObjectNamePart, ObjectType, Query, Revoke, Statement, TableFactor, TableObject,
    VisitMut, VisitorMut,
};

use crate::catalog::Catalog;
use crate::error::{Result, ServerError};
use crate::sql::stmt::{self, DEFAULT_SCHEMA, QualifiedName, Stmt};

/// The schemas of a session's `search_path` that exist, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchPath {
    schemas: Vec<String>,
}

impl SearchPath {
    /// The path `text` of a session of `user`: `"$user"` is the role's
    /// name, and schemas that do not exist (or are the system's) are left
    /// out.
    pub fn new(text: &str, user: &str, catalog: &Catalog) -> Self {
        let schemas = split(text)
            .into_iter()
            .map(|s| if s == "$user" { user.to_string() } else { s })
            .filter(|s| catalog.has_schema(s))
            .collect::<Vec<_>>();
        let mut seen = BTreeSet::new();
        SearchPath {
            schemas: schemas
                .into_iter()
                .filter(|s| seen.insert(s.clone()))
                .collect(),
        }
    }

    /// `public` alone: unqualified names already mean what they must.
    pub fn is_default(&self) -> bool {
        self.schemas == [DEFAULT_SCHEMA]
    }

    /// Where an unqualified name is created: the path's first schema.
    fn creation_schema(&self) -> Result<&str> {
        self.schemas.first().map(String::as_str).ok_or_else(|| {
            ServerError::InvalidSchemaName(
                "no schema has been selected to create in (search_path names no schema that \
                 exists)"
                    .into(),
            )
        })
    }

    /// The first schema of the path that holds `name`.
    fn schema_of(&self, catalog: &Catalog, name: &str) -> Option<&str> {
        // A temporal join's `t@current` reads the table `t`.
        let name = name.strip_suffix(stmt::CURRENT_VERSION).unwrap_or(name);
        self.schemas
            .iter()
            .find(|s| {
                catalog
                    .by_name(&QualifiedName {
                        schema: s.to_string(),
                        name: name.to_string(),
                    })
                    .is_some()
            })
            .map(String::as_str)
    }

    /// Qualifies the unqualified names of `stmt` (see the module's doc).
    pub fn qualify(&self, catalog: &Catalog, stmt: &mut Stmt) -> Result<()> {
        let mut q = Qualifier {
            path: self,
            catalog,
            ctes: BTreeSet::new(),
        };
        match stmt {
            Stmt::Sql(s) | Stmt::EmitOnWindowClose(s) | Stmt::CreateTable { table: s, .. } => {
                q.statement(s)
            }
            Stmt::CreateSink { name, query, .. } => {
                q.create(name)?;
                q.query(query);
                Ok(())
            }
            Stmt::SetParallelism { view, .. }
            | Stmt::CreateSavepoint {
                view: Some(view), ..
            }
            | Stmt::RestoreSavepoint {
                view: Some(view), ..
            }
            | Stmt::DropSource { name: view, .. }
            | Stmt::ShowCreateView { name: view, .. }
            | Stmt::DropSink { name: view, .. }
            | Stmt::Subscribe {
                subscribe: stmt::Subscribe { view, .. },
                ..
            }
            | Stmt::DeclareSubscribe {
                subscribe: stmt::Subscribe { view, .. },
                ..
            } => {
                q.existing(view);
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

/// The schema names of a `search_path` value, as Postgres splits it.
pub(crate) fn split(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(
            |p| match p.strip_prefix('"').and_then(|p| p.strip_suffix('"')) {
                Some(quoted) => quoted.replace("\"\"", "\""),
                None => p.to_lowercase(),
            },
        )
        .collect()
}

struct Qualifier<'a> {
    path: &'a SearchPath,
    catalog: &'a Catalog,
    /// The names of the statement's `WITH` queries, which are not
    /// relations of the catalog.
    ctes: BTreeSet<String>,
}

impl Qualifier<'_> {
    fn statement(&mut self, s: &mut Statement) -> Result<()> {
        self.collect_ctes(s);
        match s {
            Statement::CreateTable(ct) => self.create(&mut ct.name)?,
            Statement::CreateView(cv) => self.create(&mut cv.name)?,
            Statement::Drop {
                names, object_type, ..
            } if !matches!(object_type, ObjectType::Schema | ObjectType::Role) => {
                names.iter_mut().for_each(|n| self.existing(n));
            }
            Statement::Insert(insert) => {
                if let TableObject::TableName(name) = &mut insert.table {
                    self.existing(name);
                }
            }
            Statement::Copy {
                source: CopySource::Table { table_name, .. },
                ..
            } => self.existing(table_name),
            Statement::Truncate(t) => t
                .table_names
                .iter_mut()
                .for_each(|t| self.existing(&mut t.name)),
            Statement::Grant(Grant {
                objects: Some(GrantObjects::Tables(names) | GrantObjects::Views(names)),
                ..
            })
            | Statement::Revoke(Revoke {
                objects: Some(GrantObjects::Tables(names) | GrantObjects::Views(names)),
                ..
            }) => names.iter_mut().for_each(|n| self.existing(n)),
            _ => {}
        }
        let _ = s.visit(self);
        Ok(())
    }

    fn query(&mut self, q: &mut Query) {
        self.collect_ctes(q);
        let _ = q.visit(self);
    }

    fn collect_ctes(&mut self, s: &mut impl VisitMut) {
        struct Ctes<'a>(&'a mut BTreeSet<String>);
        impl VisitorMut for Ctes<'_> {
            type Break = ();
            fn pre_visit_query(&mut self, q: &mut Query) -> ControlFlow<()> {
                if let Some(with) = &q.with {
                    self.0
                        .extend(with.cte_tables.iter().map(|c| stmt::ident(&c.alias.name)));
                }
                ControlFlow::Continue(())
            }
        }
        let _ = s.visit(&mut Ctes(&mut self.ctes));
    }

    /// The one identifier of an unqualified name.
    fn bare(name: &ObjectName) -> Option<&Ident> {
        match name.0.as_slice() {
            [ObjectNamePart::Identifier(i)] => Some(i),
            _ => None,
        }
    }

    /// An unqualified name of an object that is to exist: qualified with
    /// the first schema of the path that holds it.
    fn existing(&self, name: &mut ObjectName) {
        let Some(ident) = Self::bare(name) else {
            return;
        };
        let bare = stmt::ident(ident);
        if self.ctes.contains(&bare) {
            return;
        }
        if let Some(schema) = self.path.schema_of(self.catalog, &bare) {
            *name = ObjectName::from(vec![Ident::with_quote('"', schema), ident.clone()]);
        }
    }

    /// An unqualified name of an object being created: in the path's
    /// first schema.
    fn create(&self, name: &mut ObjectName) -> Result<()> {
        if let Some(ident) = Self::bare(name) {
            let schema = self.path.creation_schema()?;
            *name = ObjectName::from(vec![Ident::with_quote('"', schema), ident.clone()]);
        }
        Ok(())
    }
}

impl VisitorMut for Qualifier<'_> {
    type Break = ();

    fn pre_visit_table_factor(&mut self, factor: &mut TableFactor) -> ControlFlow<()> {
        match factor {
            TableFactor::Table {
                name, args: None, ..
            } => self.existing(name),
            // `TUMBLE(t, …)` and the other window functions name their
            // table as the first argument.
            TableFactor::Table {
                name,
                args: Some(args),
                ..
            } if stmt::object_name(name)
                .is_ok_and(|n| crate::sql::window_tvf::FUNCTIONS.contains(&n.name.as_str())) =>
            {
                if let Some(FunctionArg::Unnamed(FunctionArgExpr::Expr(arg))) =
                    args.args.first_mut()
                    && let SqlExpr::Identifier(table) = arg
                    && let Some(schema) = self.path.schema_of(self.catalog, &stmt::ident(table))
                {
                    *arg = SqlExpr::CompoundIdentifier(vec![
                        Ident::with_quote('"', schema),
                        table.clone(),
                    ]);
                }
            }
            _ => {}
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_splits_as_postgres_reads_it() {
        assert_eq!(
            split("\"$user\", Public, \"My\"\"S\" ,"),
            vec!["$user", "public", "My\"S"]
        );
        assert!(split("").is_empty());
    }
}

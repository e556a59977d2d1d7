//! The server's layers, and the test that keeps them in order.
//!
//! Each directory of `server/src` is one layer; a layer may use the layers
//! below it and never one above, so a change to how a pgwire message is
//! decoded cannot reach the catalog's tables, and the SQL front end can be
//! read without knowing the database:
//!
//! | rank | layer       | owns |
//! |------|-------------|------|
//! | 0    | `error`     | `ServerError` and the map of every crate's errors to SQLSTATEs |
//! | 1    | `sql/`      | parsing and classifying statements, literals, parameters, types, settings, the COPY codec, the rewrites of what clients send |
//! | 2    | `catalog/`  | Weir's catalog, roles, connections, `pg_catalog`, `information_schema`, `weir_catalog`, over [`crate::catalog::view::CatalogView`] |
//! | 3    | `engine/`   | the shared database state and statement dispatch: the catalog as DataFusion sees it in each kind of statement, DDL, DML, ingest, sinks, savepoints, subscriptions, cursors, sessions |
//! | 4    | `wire/`     | pgwire handlers, framing, authentication, `weir bench` |
//!
//! `lib.rs` and `main.rs` sit on top. Below `server/` are the crates
//! `planner`, `executor`, `cluster` and `storage`, whose order Cargo keeps;
//! the DataFusion context, window table functions, exact decimal division,
//! `proctime()` and the lowering of a view into its job are `planner`'s,
//! which reads tables only through the traits it defines
//! (`planner::windows::WindowTables`).
//!
//! [`UPWARD`] would list a use that must point up, with why; the test fails
//! on any other, and on a listed one that is gone. It is empty.
//!
//! Within the wire, the connection code reaches the engine through one
//! trait, `engine::api::Engine`; a second test keeps it to that
//! ([`WIRE_DOOR`]). Within the engine, each statement family (DDL, DML,
//! ingest, jobs, sinks, savepoints, subscriptions, cursors, queries, roles,
//! dead letters) is one module whose interface is listed in
//! [`ENGINE_INTERFACES`]; a third test keeps each module to its list.

/// The layers, lowest first.
pub const LAYERS: &[&str] = &["error", "sql", "catalog", "engine", "wire"];

/// `(file, layer it uses)` pairs that point upward, and why they still do.
pub const UPWARD: &[(&str, &str, &str)] = &[];

/// All the wire's connection code may name of the engine: its one door,
/// the trait `engine::api::Engine`, and the data that passes through it
/// (a session, a statement's result, a subscription's stream of changes,
/// and `engine::control`, how a running statement is stopped).
pub const WIRE_DOOR: &[&str] = &["api", "session", "QueryResult", "subscribe", "control"];

/// The engine's statement families, each a module of `engine/`, and its
/// interface: all the module makes visible outside itself. Everything else
/// in it is private, and every name listed is used from outside, so the
/// list is the whole of what the rest of the server may call (a test
/// keeps both true). `dispatch.rs` calls the statements' entry points;
/// the families call each other only as this shows (DDL starts a table's
/// ingest job and its dead-letter table; sinks and ingest plan their jobs
/// through `jobs`; DML writes through `transaction`; the wire's door,
/// `api.rs`, takes `COPY FROM STDIN`'s data to `dml`).
pub const ENGINE_INTERFACES: &[(&str, &[&str])] = &[
    (
        "ddl",
        &[
            "create_table",
            "create_view",
            "explain_view",
            "create_schema",
            "drop_schema",
            "drop",
            "drop_objects",
        ],
    ),
    (
        "dml",
        &[
            "insert",
            "update",
            "delete",
            "truncate",
            "copy_target",
            "copy_in",
        ],
    ),
    (
        "ingest",
        &[
            "include_columns",
            "check",
            "start",
            "recover",
            "flush",
            "wait_applied",
            "stop",
        ],
    ),
    (
        "jobs",
        &[
            "JobOptions",
            "write_out_corresponding",
            "check_query",
            "dependencies",
            "changelogs_read",
            "job_graph",
            "plan_job",
            "start",
            "recover",
            "set_parallelism",
        ],
    ),
    ("sinks", &["create", "show"]),
    ("savepoint", &["create", "drop", "show", "restore"]),
    ("subscribe", &["Subscription"]),
    ("cursor", &["Cursor"]),
    (
        "query",
        &[
            "select",
            "prepare",
            "renamed",
            "query_context",
            "explain",
            "show_tables",
            "show_create_view",
            "show_schemas",
            "show_objects",
            "show_sources",
            "show_jobs",
        ],
    ),
    (
        "dcl",
        &[
            "check",
            "create_role",
            "alter_role",
            "drop_roles",
            "grant",
            "is_role_type",
        ],
    ),
    ("dead_letters", &["resolve", "undo", "flush"]),
    (
        "transaction",
        &[
            "Transaction",
            "admit",
            "failed",
            "begin",
            "commit",
            "rollback",
            "savepoint",
            "release",
            "rollback_to",
            "write",
        ],
    ),
];

/// Files of the wire layer that open a database of their own instead of
/// serving one, as `main.rs` does: `weir bench` drives an engine in its
/// process.
pub const WIRE_DRIVERS: &[&str] = &["wire/bench.rs"];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    use super::{ENGINE_INTERFACES, LAYERS, UPWARD, WIRE_DOOR, WIRE_DRIVERS};

    /// The first name after each `path` (`crate::`, `engine::`) in a
    /// file's code, not its comments; in a group (`crate::{a, b::c}`), the
    /// first name of each item.
    fn names_after(code: &str, path: &str) -> BTreeSet<String> {
        let first = |s: &str| -> String {
            s.trim()
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect()
        };
        let mut out = BTreeSet::new();
        for line in code.lines() {
            let mut rest = line.split("//").next().unwrap_or_default();
            while let Some(at) = rest.find(path) {
                let after = &rest[at + path.len()..];
                match after.strip_prefix('{') {
                    Some(group) => {
                        let inside = group.split('}').next().unwrap_or_default();
                        out.extend(inside.split(',').map(first));
                    }
                    None => {
                        out.insert(first(after));
                    }
                }
                rest = after;
            }
        }
        out
    }

    /// Every `crate::<name>` a file's code uses.
    fn crate_uses(code: &str) -> BTreeSet<String> {
        names_after(code, "crate::")
    }

    /// `path` as its place under `root`, with `/` between its parts.
    fn relative(root: &Path, path: &Path) -> String {
        path.strip_prefix(root)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/")
    }

    fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                files(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }

    /// The files under `root` placed in a layer, and the `(file, layer)`
    /// uses that point up.
    fn upward_uses(root: &Path) -> (usize, BTreeSet<(String, String)>) {
        let rank = |name: &str| LAYERS.iter().position(|l| *l == name);
        let mut all = Vec::new();
        files(root, &mut all);
        let mut upward = BTreeSet::new();
        let mut placed = 0;
        for path in all {
            let rel = relative(root, &path);
            let top = rel.split('/').next().unwrap().trim_end_matches(".rs");
            let Some(own) = rank(top) else {
                assert!(
                    ["lib", "main", "layers"].contains(&top),
                    "{rel} is in no layer: put it in one of {LAYERS:?}"
                );
                continue;
            };
            placed += 1;
            let code = std::fs::read_to_string(&path).unwrap();
            for used in crate_uses(&code) {
                if let Some(r) = rank(&used)
                    && r > own
                {
                    upward.insert((rel.clone(), used));
                }
            }
        }
        (placed, upward)
    }

    #[test]
    fn no_layer_uses_one_above_it() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let (placed, upward) = upward_uses(&root);
        assert!(placed > 40, "the layers hold the server's files ({placed})");
        let listed: BTreeSet<(String, String)> = UPWARD
            .iter()
            .map(|(f, l, _)| (f.to_string(), l.to_string()))
            .collect();
        let new: Vec<_> = upward.difference(&listed).collect();
        assert!(
            new.is_empty(),
            "these files use a layer above their own: {new:?}; move the code down, or \
             pass what it needs in through a trait of the lower layer"
        );
        let gone: Vec<_> = listed.difference(&upward).collect();
        assert!(
            gone.is_empty(),
            "these upward uses are gone: take them out of UPWARD: {gone:?}"
        );
    }

    #[test]
    fn the_wire_reaches_the_engine_only_through_its_door() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&root.join("wire"), &mut all);
        assert!(all.len() >= 4, "the wire's files ({})", all.len());
        for path in all {
            let rel = relative(&root, &path);
            if WIRE_DRIVERS.contains(&rel.as_str()) {
                continue;
            }
            let code = std::fs::read_to_string(&path).unwrap();
            let past: Vec<_> = names_after(&code, "engine::")
                .into_iter()
                .filter(|n| !WIRE_DOOR.contains(&n.as_str()))
                .collect();
            assert!(
                past.is_empty(),
                "{rel} reaches past the engine's door (engine::api::Engine): {past:?}"
            );
        }
        let found = names_after(
            "use crate::engine::{Database, api::Engine};\nx(crate::engine::dml::copy_in)",
            "engine::",
        );
        assert_eq!(
            found,
            ["Database", "api", "dml"]
                .into_iter()
                .map(String::from)
                .collect()
        );
    }

    /// The names of a file's items that are visible outside it: `pub`,
    /// `pub(crate)` or `pub(super)` at the top level (not an impl's
    /// methods, which go with their type).
    fn visible_items(code: &str) -> BTreeSet<String> {
        const KINDS: &[&str] = &["fn", "struct", "enum", "const", "static", "type", "trait"];
        let mut out = BTreeSet::new();
        for line in code.lines() {
            let Some(rest) = line.strip_prefix("pub") else {
                continue;
            };
            let rest = match rest.strip_prefix('(') {
                Some(r) => r.split_once(')').map_or("", |(_, r)| r),
                None => rest,
            };
            let mut words = rest.split_whitespace().skip_while(|w| *w == "async");
            if let (Some(kind), Some(name)) = (words.next(), words.next())
                && KINDS.contains(&kind)
            {
                let name: String = name
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                out.insert(name);
            }
        }
        out
    }

    /// The names a file's code uses from the engine's module `family`:
    /// `family::name` where `family` is the engine's (after `engine::` or
    /// `super::`, or alone), not another crate's module of that name
    /// (`executor::sinks::…`).
    fn family_uses(code: &str, family: &str) -> BTreeSet<String> {
        let path = format!("{family}::");
        let mut own = String::new();
        for line in code.lines() {
            let code = line.split("//").next().unwrap_or_default();
            let mut rest = code;
            while let Some(at) = rest.find(&path) {
                let before = &rest[..at];
                let alone = !before.ends_with("::")
                    && !before.ends_with(|c: char| c.is_alphanumeric() || c == '_');
                if alone || before.ends_with("engine::") || before.ends_with("super::") {
                    own.push_str(&rest[at..]);
                    own.push('\n');
                }
                rest = &rest[at + path.len()..];
            }
        }
        names_after(&own, &path)
    }

    #[test]
    fn each_engine_family_shows_only_its_interface() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut all = Vec::new();
        files(&root, &mut all);
        let code: Vec<(String, String)> = all
            .iter()
            .map(|p| (relative(&root, p), std::fs::read_to_string(p).unwrap()))
            .collect();
        for (family, interface) in ENGINE_INTERFACES {
            let file = format!("engine/{family}.rs");
            let own = &code.iter().find(|(rel, _)| *rel == file).unwrap().1;
            let listed: BTreeSet<String> = interface.iter().map(|s| s.to_string()).collect();
            let visible = visible_items(own);
            let unlisted: Vec<_> = visible.difference(&listed).collect();
            assert!(
                unlisted.is_empty(),
                "{file} makes {unlisted:?} visible: make them private, or add them to its \
                 interface in ENGINE_INTERFACES"
            );
            let missing: Vec<_> = listed.difference(&visible).collect();
            assert!(missing.is_empty(), "{file} has no {missing:?}");
            let mut used = BTreeSet::new();
            for (rel, other) in &code {
                if *rel != file && rel != "layers.rs" {
                    used.extend(family_uses(other, family));
                }
            }
            let unused: Vec<_> = listed.difference(&used).collect();
            assert!(
                unused.is_empty(),
                "no file outside {file} uses {unused:?}: make them private and take them \
                 out of ENGINE_INTERFACES"
            );
        }
    }

    #[test]
    fn visible_items_and_family_uses_are_found() {
        let code = "pub async fn a() {}\npub(crate) struct B;\n    pub fn method() {}\n\
                    fn private() {}\npub(super) const C: u8 = 0;\npub mod d;";
        let found: Vec<_> = visible_items(code).into_iter().collect();
        assert_eq!(found, ["B", "C", "a"]);
        let code = "use crate::engine::sinks::{create, show};\nexecutor::sinks::TABLE_SINK;\n\
                    super::sinks::drop(x); sinks::list(); // sinks::comment";
        let found: Vec<_> = family_uses(code, "sinks").into_iter().collect();
        assert_eq!(found, ["create", "drop", "list", "show"]);
    }

    #[test]
    fn an_upward_use_is_found() {
        let root = std::env::temp_dir().join(format!("weir-layers-{}", std::process::id()));
        std::fs::create_dir_all(root.join("sql")).unwrap();
        std::fs::create_dir_all(root.join("engine")).unwrap();
        std::fs::write(root.join("sql/a.rs"), "fn f(_: crate::engine::Database) {}").unwrap();
        std::fs::write(root.join("engine/b.rs"), "use crate::sql::a;").unwrap();
        let (placed, upward) = upward_uses(&root);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(placed, 2);
        assert_eq!(
            upward.into_iter().collect::<Vec<_>>(),
            vec![("sql/a.rs".to_string(), "engine".to_string())]
        );
    }

    #[test]
    fn uses_are_found_in_groups_and_not_in_comments() {
        let code =
            "use crate::{engine::Database, sql};\n// crate::wire\nlet x = crate::catalog::Entry;";
        let found = crate_uses(code);
        assert_eq!(
            found,
            ["catalog", "engine", "sql"]
                .into_iter()
                .map(String::from)
                .collect()
        );
    }
}

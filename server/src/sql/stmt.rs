//! Statements as the server sees them: SQL parsed by DataFusion's
//! sqlparser (PostgreSQL dialect), plus the few statements of Weir's own
//! (`FLUSH`, `SHOW MATERIALIZED VIEWS`, `SHOW JOBS`).

use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;

use datafusion::sql::sqlparser::ast::{
    Expr as SqlExpr, Ident, ObjectName, Query, SelectItem, SetExpr, Statement, Value,
    visit_expressions, visit_expressions_mut,
};
use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
use datafusion::sql::sqlparser::keywords::Keyword;
use datafusion::sql::sqlparser::parser::Parser;
use datafusion::sql::sqlparser::tokenizer::Token;

use crate::error::{Result, ServerError};

/// One statement.
#[derive(Debug, Clone)]
pub enum Stmt {
    Sql(Box<Statement>),
    /// Wait until every write so far is visible in every view.
    Flush,
    /// `CHECKPOINT` (as in Postgres): every view's job takes a checkpoint;
    /// returns when they have completed.
    Checkpoint,
    ShowMaterializedViews,
    ShowViews,
    /// `SHOW CREATE [MATERIALIZED] VIEW name`: the statement that would
    /// create the view again.
    ShowCreateView {
        name: ObjectName,
        materialized: bool,
    },
    ShowJobs,
    /// `ALTER MATERIALIZED VIEW | SINK name SET PARALLELISM [=|TO] n`:
    /// rescale the view's or the sink's job.
    SetParallelism {
        view: ObjectName,
        parallelism: u64,
    },
    /// `CREATE SAVEPOINT name [FOR MATERIALIZED VIEW v]`.
    CreateSavepoint {
        name: String,
        view: Option<ObjectName>,
    },
    /// `DROP SAVEPOINT [IF EXISTS] name`.
    DropSavepoint {
        name: String,
        if_exists: bool,
    },
    ShowSavepoints,
    /// `RESTORE MATERIALIZED VIEW v FROM SAVEPOINT name`, or with `view`
    /// `None`, `RESTORE DATABASE FROM SAVEPOINT name`.
    RestoreSavepoint {
        name: String,
        view: Option<ObjectName>,
    },
    /// `CREATE MATERIALIZED VIEW … EMIT ON WINDOW CLOSE` (or its EXPLAIN),
    /// the clause taken off: the view's windows are emitted once, final,
    /// when the watermark passes their end.
    EmitOnWindowClose(Box<Statement>),
    /// `SHOW SOURCES`.
    ShowSources,
    /// `DROP SOURCE [IF EXISTS] name [CASCADE | RESTRICT]`.
    DropSource {
        name: ObjectName,
        if_exists: bool,
        cascade: bool,
    },
    /// `CREATE SINK [IF NOT EXISTS] name FROM relation | AS query WITH (…)
    /// [FORMAT … ENCODE …]` (RisingWave's syntax).
    CreateSink {
        name: ObjectName,
        if_not_exists: bool,
        /// The query whose changes the sink writes (`FROM v`: `SELECT *
        /// FROM v`).
        query: Box<Query>,
        connector: planner::spec::ConnectorSpec,
    },
    /// `SHOW SINKS`.
    ShowSinks,
    /// `DROP SINK [IF EXISTS] name [CASCADE | RESTRICT]`.
    DropSink {
        name: ObjectName,
        if_exists: bool,
        cascade: bool,
    },
    /// `CREATE TABLE` or `CREATE STREAM`, with Weir's own clauses
    /// (`APPEND ONLY`, `WATERMARK FOR`) taken out of the statement.
    CreateTable {
        table: Box<Statement>,
        options: TableOptions,
    },
    /// `SUBSCRIBE …`: the view's changes, streamed until the client goes;
    /// with `copy`, written as `COPY (SUBSCRIBE …) TO STDOUT` (text rows of
    /// the COPY protocol, which psql prints as they come).
    Subscribe {
        subscribe: Subscribe,
        copy: bool,
    },
    /// `DECLARE name [NO SCROLL] CURSOR [WITH[OUT] HOLD] FOR SUBSCRIBE …`.
    DeclareSubscribe {
        name: String,
        subscribe: Subscribe,
    },
    /// `FETCH [FORWARD] [n | NEXT | ALL] [FROM | IN] cursor [WITH (timeout
    /// = '…')]` (Materialize's timeout).
    Fetch {
        cursor: String,
        /// `None`: ALL.
        count: Option<u64>,
        timeout: Option<std::time::Duration>,
        /// `MOVE`: the rows are skipped, not returned.
        skip: bool,
    },
    /// `CLOSE name | ALL`.
    Close {
        cursor: Option<String>,
    },
}

/// `SUBSCRIBE [TO] view [SINCE epoch] [WITH (progress [= true])]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subscribe {
    pub view: ObjectName,
    /// Resume: the changes of the epochs after this one, without a
    /// snapshot. `None`: the view's rows first, then its changes.
    pub since: Option<u64>,
    /// Also a row for every epoch that completes, changes or not.
    pub progress: bool,
}

/// What `CREATE STREAM` and the clauses Postgres lacks add to a table.
#[derive(Debug, Clone, Default)]
pub struct TableOptions {
    /// `CREATE STREAM`: an append-only table by another name.
    pub stream: bool,
    /// `APPEND ONLY` (implied by a stream): INSERT only.
    pub append_only: bool,
    /// `WATERMARK FOR column AS expr`.
    pub watermark: Option<WatermarkClause>,
    /// `CREATE SOURCE … WITH (connector = '…', …) [FORMAT … ENCODE …]`.
    pub source: Option<planner::spec::ConnectorSpec>,
    /// `CREATE TABLE | STREAM … WITH (connector = '…', …) [FORMAT …
    /// ENCODE …]`: a table the connector's rows are written into.
    pub connector: Option<planner::spec::ConnectorSpec>,
}

/// `WATERMARK FOR column AS expr`: event time on `column` is complete up to
/// the largest `expr` seen (Flink's and RisingWave's syntax).
#[derive(Debug, Clone)]
pub struct WatermarkClause {
    pub column: String,
    pub expr: Box<SqlExpr>,
}

fn is_word(t: &Token, word: &str) -> bool {
    matches!(t, Token::Word(w) if w.value.eq_ignore_ascii_case(word))
}

/// Whether `sql` holds `word` in any case: a cheap test, without a copy of
/// the statement, that lets most statements skip a rewrite that would
/// tokenize them again.
pub(crate) fn mentions(sql: &str, word: &str) -> bool {
    sql.as_bytes()
        .windows(word.len())
        .any(|w| w.eq_ignore_ascii_case(word.as_bytes()))
}

/// Parses a query string into its statements.
pub fn parse(sql: &str) -> Result<Vec<Stmt>> {
    let dialect = PostgreSqlDialect {};
    let marked = crate::sql::between_symmetric::mark(sql)?;
    let sql = marked.as_deref().unwrap_or(sql);
    let corresponding = crate::sql::corresponding::mark(sql)?;
    let sql = corresponding.as_deref().unwrap_or(sql);
    // A `BY NAME` that no `CORRESPONDING` wrote is refused after parsing.
    let by_name_possible = corresponding.is_some()
        || (mentions(sql, "name")
            && ["union", "intersect", "except"]
                .iter()
                .any(|w| mentions(sql, w)));
    let mut parser = Parser::new(&dialect).try_with_sql(sql)?;
    let mut out = Vec::new();
    loop {
        while parser.consume_token(&Token::SemiColon) {}
        if parser.peek_token().token == Token::EOF {
            break;
        }
        let [a, b, c] = parser.peek_tokens::<3>();
        let stmt = if is_word(&a, "flush") && matches!(b, Token::SemiColon | Token::EOF) {
            parser.next_token();
            Stmt::Flush
        } else if is_word(&a, "checkpoint") && matches!(b, Token::SemiColon | Token::EOF) {
            parser.next_token();
            Stmt::Checkpoint
        } else if is_word(&a, "show")
            && is_word(&b, "create")
            && (is_word(&c, "view") || is_word(&c, "materialized"))
        {
            parser.next_token();
            parser.next_token();
            let materialized = is_word(&c, "materialized");
            if materialized {
                parser.next_token();
            }
            expect_words(&mut parser, &["view"])?;
            let name = relation_name(parser.parse_object_name(false)?)?;
            Stmt::ShowCreateView { name, materialized }
        } else if is_word(&a, "show") && is_word(&b, "materialized") && is_word(&c, "views") {
            for _ in 0..3 {
                parser.next_token();
            }
            Stmt::ShowMaterializedViews
        } else if is_word(&a, "show")
            && is_word(&b, "views")
            && matches!(c, Token::SemiColon | Token::EOF)
        {
            parser.next_token();
            parser.next_token();
            Stmt::ShowViews
        } else if is_word(&a, "show") && is_word(&b, "jobs") {
            parser.next_token();
            parser.next_token();
            Stmt::ShowJobs
        } else if is_word(&a, "create") && is_word(&b, "savepoint") {
            parser.next_token();
            parser.next_token();
            let name = simple_name(&parser.parse_object_name(false)?)?;
            let view = if is_word(&parser.peek_token().token, "for") {
                parser.next_token();
                expect_words(&mut parser, &["materialized", "view"])?;
                Some(relation_name(parser.parse_object_name(false)?)?)
            } else {
                None
            };
            Stmt::CreateSavepoint { name, view }
        } else if is_word(&a, "drop") && is_word(&b, "savepoint") {
            parser.next_token();
            parser.next_token();
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = simple_name(&parser.parse_object_name(false)?)?;
            Stmt::DropSavepoint { name, if_exists }
        } else if is_word(&a, "show") && is_word(&b, "savepoints") {
            parser.next_token();
            parser.next_token();
            Stmt::ShowSavepoints
        } else if is_word(&a, "restore") {
            parser.next_token();
            let view = if is_word(&b, "database") {
                parser.next_token();
                None
            } else {
                expect_words(&mut parser, &["materialized", "view"])?;
                Some(relation_name(parser.parse_object_name(false)?)?)
            };
            expect_words(&mut parser, &["from", "savepoint"])?;
            let name = simple_name(&parser.parse_object_name(false)?)?;
            Stmt::RestoreSavepoint { name, view }
        } else if is_word(&a, "create")
            && (is_word(&b, "table") || is_word(&b, "stream") || is_word(&b, "source"))
        {
            create_table(&mut parser)?
        } else if is_word(&a, "create") && is_word(&b, "sink") {
            create_sink(&mut parser)?
        } else if is_word(&a, "show") && is_word(&b, "sources") {
            parser.next_token();
            parser.next_token();
            Stmt::ShowSources
        } else if is_word(&a, "show") && is_word(&b, "sinks") {
            parser.next_token();
            parser.next_token();
            Stmt::ShowSinks
        } else if is_word(&a, "drop") && (is_word(&b, "source") || is_word(&b, "sink")) {
            parser.next_token();
            parser.next_token();
            let if_exists = parser.parse_keywords(&[Keyword::IF, Keyword::EXISTS]);
            let name = relation_name(parser.parse_object_name(false)?)?;
            let cascade = parser.parse_keyword(Keyword::CASCADE);
            if !cascade {
                let _ = parser.parse_keyword(Keyword::RESTRICT);
            }
            if is_word(&b, "sink") {
                Stmt::DropSink {
                    name,
                    if_exists,
                    cascade,
                }
            } else {
                Stmt::DropSource {
                    name,
                    if_exists,
                    cascade,
                }
            }
        } else if is_word(&a, "alter") && is_word(&b, "materialized") && is_word(&c, "view") {
            for _ in 0..3 {
                parser.next_token();
            }
            set_parallelism(&mut parser, "ALTER MATERIALIZED VIEW")?
        } else if is_word(&a, "alter") && is_word(&b, "sink") {
            parser.next_token();
            parser.next_token();
            set_parallelism(&mut parser, "ALTER SINK")?
        } else if is_word(&a, "subscribe") {
            parser.next_token();
            Stmt::Subscribe {
                subscribe: subscribe(&mut parser)?,
                copy: false,
            }
        } else if is_word(&a, "copy") && b == Token::LParen && is_word(&c, "subscribe") {
            for _ in 0..3 {
                parser.next_token();
            }
            let subscribe = subscribe(&mut parser)?;
            parser.expect_token(&Token::RParen)?;
            expect_words(&mut parser, &["to", "stdout"])?;
            let next = parser.peek_token().token;
            if !matches!(next, Token::SemiColon | Token::EOF) {
                return Err(ServerError::unsupported(format!(
                    "COPY (SUBSCRIBE …) TO STDOUT {next} … (options: the rows are COPY's text format)"
                )));
            }
            Stmt::Subscribe {
                subscribe,
                copy: true,
            }
        } else if is_word(&a, "create") && is_word(&b, "user") {
            // Postgres's CREATE USER is CREATE ROLE that may log in.
            parser.next_token();
            parser.next_token();
            let mut role = parser.parse_create_role()?;
            role.login.get_or_insert(true);
            Stmt::Sql(Box::new(Statement::CreateRole(role)))
        } else if is_word(&a, "alter") && is_word(&b, "user") {
            parser.next_token();
            parser.next_token();
            Stmt::Sql(Box::new(parser.parse_alter_role()?))
        } else if is_word(&a, "declare") {
            declare(&mut parser)?
        } else if is_word(&a, "fetch") || is_word(&a, "move") {
            parser.next_token();
            let mut f = fetch(&mut parser)?;
            if let Stmt::Fetch { skip, .. } = &mut f {
                *skip = is_word(&a, "move");
            }
            f
        } else if is_word(&a, "close") {
            parser.next_token();
            let cursor = if parser.parse_keyword(Keyword::ALL) {
                None
            } else {
                Some(ident(&parser.parse_identifier()?))
            };
            Stmt::Close { cursor }
        } else if is_word(&a, "create") || is_word(&a, "explain") {
            emit_on_window_close(&mut parser)?
        } else if is_word(&a, "select") || is_word(&a, "with") || a == Token::LParen {
            let mut tokens = statement_tokens(&mut parser);
            for_system_time(&mut tokens)?;
            Stmt::Sql(Box::new(parse_tokens(tokens)?))
        } else {
            Stmt::Sql(Box::new(parser.parse_statement()?))
        };
        let mut stmt = stmt;
        if let Err(e) = too_deep(&stmt) {
            if let Stmt::Sql(s) | Stmt::EmitOnWindowClose(s) | Stmt::CreateTable { table: s, .. } =
                stmt
            {
                crate::sql::depth::discard(*s);
            }
            return Err(e);
        }
        if by_name_possible {
            match &mut stmt {
                Stmt::Sql(s) | Stmt::EmitOnWindowClose(s) | Stmt::CreateTable { table: s, .. } => {
                    crate::sql::corresponding::apply_lists(s.as_mut())?
                }
                Stmt::CreateSink { query, .. } => {
                    crate::sql::corresponding::apply_lists(query.as_mut())?
                }
                _ => {}
            }
        }
        match &mut stmt {
            Stmt::Sql(s) | Stmt::EmitOnWindowClose(s) | Stmt::CreateTable { table: s, .. } => {
                crate::sql::between_symmetric::rewrite(s.as_mut());
                crate::sql::distinct_from::rewrite(s.as_mut());
                crate::sql::literals::normalize(s)?;
                crate::sql::fetch_first::rewrite(s)?;
            }
            Stmt::CreateSink { query, .. } => {
                crate::sql::between_symmetric::rewrite(query.as_mut());
                crate::sql::distinct_from::rewrite(query.as_mut());
                crate::sql::fetch_first::rewrite_query(query)?
            }
            _ => {}
        }
        out.push(stmt);
        if parser.peek_token().token != Token::EOF && !parser.consume_token(&Token::SemiColon) {
            let t = parser.peek_token();
            return Err(ServerError::Syntax(format!(
                "syntax error at or near \"{}\"",
                t.token
            )));
        }
    }
    Ok(out)
}

/// Refuses a statement nested deeper than Weir plans (`54001`).
fn too_deep(stmt: &Stmt) -> Result<()> {
    match stmt {
        Stmt::Sql(s) | Stmt::EmitOnWindowClose(s) | Stmt::CreateTable { table: s, .. } => {
            crate::sql::depth::check(s.as_ref())
        }
        Stmt::CreateSink { query, .. } => crate::sql::depth::check(query.as_ref()),
        _ => Ok(()),
    }
}

/// One statement from `tokens` (a statement's, rewritten), all of them.
fn parse_tokens(tokens: Vec<Token>) -> Result<Statement> {
    let mut parser = Parser::new(&PostgreSqlDialect {}).with_tokens(tokens);
    let stmt = parser.parse_statement()?;
    let next = parser.peek_token().token;
    if next != Token::EOF {
        return Err(ServerError::Syntax(format!(
            "syntax error at or near \"{next}\""
        )));
    }
    Ok(stmt)
}

/// This statement's tokens, up to its semicolon.
fn statement_tokens(parser: &mut Parser<'_>) -> Vec<Token> {
    let mut tokens = Vec::new();
    let mut depth = 0i32;
    loop {
        let t = parser.peek_token().token;
        match t {
            Token::EOF => break,
            Token::SemiColon if depth == 0 => break,
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            _ => {}
        }
        tokens.push(parser.next_token().token);
    }
    tokens
}

/// A `CREATE` or `EXPLAIN` statement, without a trailing `EMIT ON WINDOW
/// CLOSE` (RisingWave's syntax), which sqlparser does not know.
fn emit_on_window_close(parser: &mut Parser<'_>) -> Result<Stmt> {
    let mut tokens = statement_tokens(parser);
    for_system_time(&mut tokens)?;
    let n = tokens.len();
    let eowc = n >= 4
        && ["emit", "on", "window", "close"]
            .iter()
            .zip(&tokens[n - 4..])
            .all(|(w, t)| is_word(t, w));
    if eowc {
        tokens.truncate(n - 4);
    }
    let mut stmt = Box::new(parse_tokens(tokens)?);
    Ok(if eowc {
        crate::sql::window_tvf::group_by_window_end(&mut stmt);
        Stmt::EmitOnWindowClose(stmt)
    } else {
        Stmt::Sql(stmt)
    })
}

/// The suffix that names a table's current version in a temporal join.
pub const CURRENT_VERSION: &str = "@current";

/// `t FOR SYSTEM_TIME AS OF PROCTIME() [AS a]` (Flink's and RisingWave's
/// temporal join, which sqlparser's PostgreSQL dialect does not know)
/// becomes `"t@current" AS a`: the catalog resolves that name to the table
/// marked as read at its current version.
fn for_system_time(tokens: &mut Vec<Token>) -> Result<()> {
    let mut i = 0;
    while i + 4 < tokens.len() {
        let clause = ["for", "system_time", "as", "of"]
            .iter()
            .zip(&tokens[i..])
            .all(|(w, t)| is_word(t, w));
        if !clause {
            i += 1;
            continue;
        }
        let proctime = is_word(&tokens[i + 4], "proctime")
            && tokens.get(i + 5) == Some(&Token::LParen)
            && tokens.get(i + 6) == Some(&Token::RParen);
        if !proctime {
            return Err(ServerError::unsupported(
                "FOR SYSTEM_TIME AS OF other than PROCTIME() (event-time temporal joins)",
            ));
        }
        let Some(Token::Word(table)) = i.checked_sub(1).and_then(|t| tokens.get(t)).cloned() else {
            return Err(ServerError::Syntax(
                "FOR SYSTEM_TIME AS OF must follow a table name".into(),
            ));
        };
        tokens.drain(i..i + 7);
        let alias_follows = match tokens.get(i) {
            Some(Token::Word(w)) => w.keyword == Keyword::AS || w.keyword == Keyword::NoKeyword,
            _ => false,
        };
        let name = if table.quote_style.is_some() {
            table.value.clone()
        } else {
            table.value.to_lowercase()
        };
        tokens[i - 1] = Token::Word(datafusion::sql::sqlparser::tokenizer::Word {
            value: format!("{name}{CURRENT_VERSION}"),
            quote_style: Some('"'),
            keyword: Keyword::NoKeyword,
        });
        if !alias_follows {
            tokens.insert(i, Token::make_keyword("AS"));
            tokens.insert(
                i + 1,
                Token::Word(datafusion::sql::sqlparser::tokenizer::Word {
                    value: name,
                    quote_style: Some('"'),
                    keyword: Keyword::NoKeyword,
                }),
            );
        }
        i += 1;
    }
    Ok(())
}

/// `(name = value, …)` from `tokens[start]` (an opening parenthesis), and
/// the index after the closing one. Names may be dotted and hyphenated
/// (`nexmark.table.type`, `sink.delivery-guarantee`) or quoted as Flink
/// writes them (`'sink.delivery-guarantee'`), and are lower-cased;
/// values are strings, numbers or words.
fn option_list(tokens: &[Token], start: usize) -> Result<(BTreeMap<String, String>, usize)> {
    let bad = |t: Option<&Token>| {
        ServerError::Syntax(format!(
            "syntax error at or near \"{}\" in an option list: expected name = 'value'",
            t.map(|t| t.to_string()).unwrap_or_default()
        ))
    };
    if tokens.get(start) != Some(&Token::LParen) {
        return Err(bad(tokens.get(start)));
    }
    let mut out = BTreeMap::new();
    let mut i = start + 1;
    if tokens.get(i) == Some(&Token::RParen) {
        return Ok((out, i + 1));
    }
    loop {
        let mut name = String::new();
        loop {
            match tokens.get(i) {
                Some(Token::Word(w)) => name.push_str(&w.value.to_lowercase()),
                Some(Token::SingleQuotedString(s)) => name.push_str(s),
                t => return Err(bad(t)),
            }
            i += 1;
            match tokens.get(i) {
                Some(Token::Period) => name.push('.'),
                Some(Token::Minus) => name.push('-'),
                _ => break,
            }
            i += 1;
        }
        if tokens.get(i) != Some(&Token::Eq) {
            return Err(bad(tokens.get(i)));
        }
        i += 1;
        let value = match tokens.get(i) {
            Some(Token::SingleQuotedString(s)) => s.clone(),
            Some(Token::Number(n, _)) => n.clone(),
            Some(Token::Word(w)) => w.value.clone(),
            t => return Err(bad(t)),
        };
        i += 1;
        if out.insert(name.clone(), value).is_some() {
            return Err(ServerError::Syntax(format!(
                "option {name} given more than once"
            )));
        }
        match tokens.get(i) {
            Some(Token::Comma) => i += 1,
            Some(Token::RParen) => return Ok((out, i + 1)),
            t => return Err(bad(t)),
        }
    }
}

/// The start of the last `WITH (` outside parentheses: the options of a
/// source, a sink, a table; a sink's query may start with `WITH x AS`.
fn last_with(tokens: &[Token]) -> Option<usize> {
    let mut depth = 0;
    let mut found = None;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0 && is_word(t, "with") && tokens.get(i + 1) == Some(&Token::LParen) => {
                found = Some(i)
            }
            _ => {}
        }
    }
    found
}

/// Takes a source's `WITH (…)` and `FORMAT … ENCODE … (…)` (or the older
/// `ROW FORMAT …`) out of `tokens` (RisingWave's syntax, which sqlparser
/// does not know: option names are dotted).
fn source_clauses(tokens: &mut Vec<Token>, what: &str) -> Result<planner::spec::ConnectorSpec> {
    let mut spec = planner::spec::ConnectorSpec::default();
    let Some(with) = last_with(tokens) else {
        return Err(ServerError::InvalidParameter(format!(
            "{what} needs WITH (connector = '…', …)"
        )));
    };
    let (mut options, end) = option_list(tokens, with + 1)?;
    let tail: Vec<Token> = tokens.drain(with..).skip(end - with).collect();
    let word = |i: usize| match tail.get(i) {
        Some(Token::Word(w)) => Ok(w.value.to_uppercase()),
        t => Err(ServerError::Syntax(format!(
            "syntax error at or near \"{}\": expected FORMAT … ENCODE …",
            t.map(|t| t.to_string()).unwrap_or_default()
        ))),
    };
    let mut i = 0;
    if tail.first().is_some_and(|t| is_word(t, "row")) {
        if !tail.get(1).is_some_and(|t| is_word(t, "format")) {
            return Err(ServerError::Syntax("expected ROW FORMAT".into()));
        }
        spec.format = Some("PLAIN".into());
        spec.encode = Some(word(2)?);
        i = 3;
    } else if tail.first().is_some_and(|t| is_word(t, "format")) {
        spec.format = Some(word(1)?);
        if !tail.get(2).is_some_and(|t| is_word(t, "encode")) {
            return Err(ServerError::Syntax("expected ENCODE after FORMAT …".into()));
        }
        spec.encode = Some(word(3)?);
        i = 4;
        if tail.get(i) == Some(&Token::LParen) {
            let (encode_options, end) = option_list(&tail, i)?;
            spec.encode_options = encode_options;
            i = end;
        }
    }
    if let Some(t) = tail.get(i) {
        return Err(ServerError::Syntax(format!(
            "syntax error at or near \"{t}\""
        )));
    }
    spec.connector = options
        .remove("connector")
        .map(|c| c.to_lowercase())
        .ok_or_else(|| {
            ServerError::InvalidParameter(format!("{what} needs WITH (connector = '…')"))
        })?;
    spec.options = options;
    Ok(spec)
}

/// Takes a source's `INCLUDE what [AS column]` clauses (RisingWave's,
/// after the column list) out of `tokens`.
fn include_clauses(tokens: &mut Vec<Token>) -> Result<Vec<planner::spec::IncludeColumn>> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 0 && is_word(t, "include") => {
                let what = match tokens.get(i + 1) {
                    Some(Token::Word(w)) => w.value.to_lowercase(),
                    t => {
                        return Err(ServerError::Syntax(format!(
                            "syntax error at or near \"{}\": expected INCLUDE key | partition | offset | timestamp [AS name]",
                            t.map(|t| t.to_string()).unwrap_or_default()
                        )));
                    }
                };
                let (column, end) = match (tokens.get(i + 2), tokens.get(i + 3)) {
                    (Some(a), Some(Token::Word(name))) if is_word(a, "as") => (
                        if name.quote_style.is_some() {
                            name.value.clone()
                        } else {
                            name.value.to_lowercase()
                        },
                        i + 4,
                    ),
                    _ => (format!("_weir_{what}"), i + 2),
                };
                tokens.drain(i..end);
                out.push(planner::spec::IncludeColumn { what, column });
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    Ok(out)
}

/// `CREATE SINK …`.
fn create_sink(parser: &mut Parser<'_>) -> Result<Stmt> {
    parser.next_token();
    parser.next_token();
    let if_not_exists = parser.parse_keywords(&[Keyword::IF, Keyword::NOT, Keyword::EXISTS]);
    let name = relation_name(parser.parse_object_name(false)?)?;
    let from = parser.next_token().token;
    let mut tokens = statement_tokens(parser);
    let connector = source_clauses(&mut tokens, "CREATE SINK")?;
    let query = if is_word(&from, "from") {
        let mut p = Parser::new(&PostgreSqlDialect {}).with_tokens(tokens);
        let relation = p.parse_object_name(false)?;
        let next = p.peek_token().token;
        if next != Token::EOF {
            return Err(ServerError::Syntax(format!(
                "syntax error at or near \"{next}\": expected WITH (…) after CREATE SINK … FROM name"
            )));
        }
        Parser::new(&PostgreSqlDialect {})
            .try_with_sql(&format!("SELECT * FROM {relation}"))?
            .parse_query()?
    } else if is_word(&from, "as") {
        for_system_time(&mut tokens)?;
        let mut p = Parser::new(&PostgreSqlDialect {}).with_tokens(tokens);
        let query = p.parse_query()?;
        let next = p.peek_token().token;
        if next != Token::EOF {
            return Err(ServerError::Syntax(format!(
                "syntax error at or near \"{next}\""
            )));
        }
        query
    } else {
        return Err(ServerError::Syntax(format!(
            "syntax error at or near \"{from}\": expected CREATE SINK name FROM relation | AS query"
        )));
    };
    Ok(Stmt::CreateSink {
        name,
        if_not_exists,
        query,
        connector,
    })
}

/// `CREATE TABLE | STREAM …`: takes the statement's tokens, removes the
/// clauses sqlparser does not know, and parses the rest as `CREATE TABLE`.
fn create_table(parser: &mut Parser<'_>) -> Result<Stmt> {
    let mut tokens = statement_tokens(parser);
    let mut options = TableOptions::default();
    if tokens.get(1).is_some_and(|t| is_word(t, "stream")) {
        tokens[1] = Token::make_keyword("TABLE");
        options.stream = true;
        options.append_only = true;
    } else if tokens.get(1).is_some_and(|t| is_word(t, "source")) {
        tokens[1] = Token::make_keyword("TABLE");
        options.append_only = true;
        let mut spec = source_clauses(&mut tokens, "CREATE SOURCE")?;
        spec.include = include_clauses(&mut tokens)?;
        options.source = Some(spec);
    } else if last_with(&tokens)
        .and_then(|with| option_list(&tokens, with + 1).ok())
        .is_some_and(|(o, _)| o.contains_key("connector"))
    {
        let what = if options.stream {
            "CREATE STREAM"
        } else {
            "CREATE TABLE"
        };
        let mut spec = source_clauses(&mut tokens, what)?;
        spec.include = include_clauses(&mut tokens)?;
        options.connector = Some(spec);
    }
    // WATERMARK FOR … inside the column list.
    let mut depth = 0;
    let mut clause = None;
    for (i, t) in tokens.iter().enumerate() {
        match t {
            Token::LParen => depth += 1,
            Token::RParen => depth -= 1,
            t if depth == 1 && is_word(t, "watermark") => {
                if tokens.get(i + 1).is_some_and(|t| is_word(t, "for")) {
                    clause = Some(i);
                }
                break;
            }
            _ => {}
        }
    }
    if let Some(start) = clause {
        let mut end = start;
        let mut d = 0;
        while end < tokens.len() {
            match tokens[end] {
                Token::LParen => d += 1,
                Token::RParen if d == 0 => break,
                Token::RParen => d -= 1,
                Token::Comma if d == 0 => break,
                _ => {}
            }
            end += 1;
        }
        let body: Vec<Token> = tokens[start + 2..end].to_vec();
        // Remove the clause and the comma that separates it.
        let (from, to) = if start > 0 && tokens[start - 1] == Token::Comma {
            (start - 1, end)
        } else if tokens.get(end) == Some(&Token::Comma) {
            (start, end + 1)
        } else {
            (start, end)
        };
        tokens.drain(from..to);
        let [Token::Word(column), as_word, expr @ ..] = body.as_slice() else {
            return Err(ServerError::Syntax(
                "syntax error in WATERMARK FOR: expected WATERMARK FOR column AS expression".into(),
            ));
        };
        if !is_word(as_word, "as") || expr.is_empty() {
            return Err(ServerError::Syntax(
                "syntax error in WATERMARK FOR: expected WATERMARK FOR column AS expression".into(),
            ));
        }
        let expr = Box::new(
            Parser::new(&PostgreSqlDialect {})
                .with_tokens(expr.to_vec())
                .parse_expr()?,
        );
        options.watermark = Some(WatermarkClause {
            column: if column.quote_style.is_some() {
                column.value.clone()
            } else {
                column.value.to_lowercase()
            },
            expr,
        });
    }
    // APPEND ONLY after the column list.
    let n = tokens.len();
    if n >= 2 && is_word(&tokens[n - 2], "append") && is_word(&tokens[n - 1], "only") {
        tokens.truncate(n - 2);
        options.append_only = true;
    }
    let table = parse_tokens(tokens)?;
    if !matches!(table, Statement::CreateTable(_)) {
        return Err(ServerError::Syntax("expected CREATE TABLE".into()));
    }
    Ok(Stmt::CreateTable {
        table: Box::new(table),
        options,
    })
}

/// Consumes `words`, or fails with a syntax error at the first other token.
/// After `SUBSCRIBE`: `[TO] view [SINCE epoch] [WITH (…)]`.
fn subscribe(parser: &mut Parser<'_>) -> Result<Subscribe> {
    if is_word(&parser.peek_token().token, "to") {
        parser.next_token();
    }
    if parser.peek_token().token == Token::LParen {
        return Err(ServerError::unsupported(
            "SUBSCRIBE to a query (subscribe to a materialized view)",
        ));
    }
    let view = relation_name(parser.parse_object_name(false)?)?;
    let mut since = None;
    if is_word(&parser.peek_token().token, "since") {
        parser.next_token();
        since = Some(parser.parse_literal_uint()?);
    }
    let mut progress = false;
    if parser.parse_keyword(Keyword::WITH) {
        for (name, value) in paren_options(parser)? {
            match name.as_str() {
                "progress" => {
                    progress = match value.as_deref().map(str::to_lowercase).as_deref() {
                        None | Some("true") | Some("on") => true,
                        Some("false") | Some("off") => false,
                        Some(v) => {
                            return Err(ServerError::InvalidParameter(format!(
                                "progress takes true or false, not {v}"
                            )));
                        }
                    }
                }
                other => {
                    return Err(ServerError::InvalidParameter(format!(
                        "unrecognized SUBSCRIBE option \"{other}\" (SUBSCRIBE takes progress)"
                    )));
                }
            }
        }
    }
    Ok(Subscribe {
        view,
        since,
        progress,
    })
}

/// `(name [= value], …)`: the values as written (quotes taken off).
fn paren_options(parser: &mut Parser<'_>) -> Result<Vec<(String, Option<String>)>> {
    parser.expect_token(&Token::LParen)?;
    let mut out = Vec::new();
    loop {
        let name = ident(&parser.parse_identifier()?);
        let value = if parser.consume_token(&Token::Eq) {
            Some(match parser.next_token().token {
                Token::SingleQuotedString(v) => v,
                Token::Number(v, _) => v,
                Token::Word(w) => w.value,
                t => {
                    return Err(ServerError::Syntax(format!(
                        "syntax error at or near \"{t}\": expected a value for {name}"
                    )));
                }
            })
        } else {
            None
        };
        out.push((name, value));
        if !parser.consume_token(&Token::Comma) {
            break;
        }
    }
    parser.expect_token(&Token::RParen)?;
    Ok(out)
}

/// `DECLARE name … CURSOR … FOR SUBSCRIBE …`; any other `DECLARE` goes to
/// sqlparser.
fn declare(parser: &mut Parser<'_>) -> Result<Stmt> {
    let tokens = statement_tokens(parser);
    let words: Vec<&Token> = tokens
        .iter()
        .filter(|t| !matches!(t, Token::Whitespace(_)))
        .collect();
    let for_subscribe = words
        .windows(2)
        .position(|w| is_word(w[0], "for") && is_word(w[1], "subscribe"));
    let Some(at) = for_subscribe else {
        return Ok(Stmt::Sql(Box::new(parse_tokens(tokens)?)));
    };
    let head = &words[..at];
    let name = match head.get(1) {
        Some(Token::Word(w)) => {
            if w.quote_style.is_some() {
                w.value.clone()
            } else {
                w.value.to_lowercase()
            }
        }
        _ => return Err(ServerError::Syntax("DECLARE needs a cursor name".into())),
    };
    if !head.iter().any(|t| is_word(t, "cursor")) {
        return Err(ServerError::Syntax(
            "syntax error in DECLARE: expected CURSOR".into(),
        ));
    }
    if head.iter().any(|t| is_word(t, "binary")) {
        return Err(ServerError::unsupported("BINARY cursors"));
    }
    if head.iter().any(|t| is_word(t, "scroll"))
        && !head
            .windows(2)
            .any(|w| is_word(w[0], "no") && is_word(w[1], "scroll"))
    {
        return Err(ServerError::unsupported(
            "SCROLL cursors over SUBSCRIBE (a subscription only moves forward)",
        ));
    }
    let tail: Vec<Token> = words[at + 2..].iter().map(|t| (*t).clone()).collect();
    let mut sub = Parser::new(&PostgreSqlDialect {}).with_tokens(tail);
    let subscribe = subscribe(&mut sub)?;
    let next = sub.peek_token().token;
    if next != Token::EOF {
        return Err(ServerError::Syntax(format!(
            "syntax error at or near \"{next}\""
        )));
    }
    Ok(Stmt::DeclareSubscribe { name, subscribe })
}

/// After `FETCH`: `[FORWARD] [n | NEXT | ALL] [FROM | IN] cursor [WITH
/// (timeout = '…')]`.
fn fetch(parser: &mut Parser<'_>) -> Result<Stmt> {
    if is_word(&parser.peek_token().token, "forward") {
        parser.next_token();
    }
    let mut count = Some(1);
    match parser.peek_token().token {
        Token::Number(n, _) => {
            parser.next_token();
            count =
                Some(n.parse::<u64>().map_err(|_| {
                    ServerError::Syntax(format!("FETCH takes a row count, not {n}"))
                })?);
        }
        ref t if is_word(t, "all") => {
            parser.next_token();
            count = None;
        }
        ref t if is_word(t, "next") => {
            parser.next_token();
        }
        ref t
            if ["prior", "first", "last", "absolute", "relative", "backward"]
                .iter()
                .any(|w| is_word(t, w)) =>
        {
            return Err(ServerError::unsupported(format!(
                "FETCH {t} (cursors here only move forward)"
            )));
        }
        _ => {}
    }
    let t = parser.peek_token().token;
    if is_word(&t, "from") || is_word(&t, "in") {
        parser.next_token();
    }
    let cursor = ident(&parser.parse_identifier()?);
    let mut timeout = None;
    if parser.parse_keyword(Keyword::WITH) {
        for (name, value) in paren_options(parser)? {
            if name != "timeout" {
                return Err(ServerError::InvalidParameter(format!(
                    "unrecognized FETCH option \"{name}\" (FETCH takes timeout)"
                )));
            }
            let us = value.as_deref().and_then(parse_timeout_us).ok_or_else(|| {
                ServerError::InvalidParameter(format!(
                    "timeout takes a duration ('1s', '500ms', '0'), not {}",
                    value.unwrap_or_default()
                ))
            })?;
            timeout = Some(std::time::Duration::from_micros(us));
        }
    }
    Ok(Stmt::Fetch {
        cursor,
        count,
        timeout,
        skip: false,
    })
}

/// `0`, `500ms`, `2s`, `1 minute`: microseconds.
fn parse_timeout_us(v: &str) -> Option<u64> {
    let v = v.trim().to_lowercase();
    if let Some(ms) = v.strip_suffix("ms") {
        return ms.trim().parse::<u64>().ok()?.checked_mul(1000);
    }
    let digits = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    if digits > 0 && v[..digits].bytes().all(|b| b == b'0') {
        // `0`, `0s`, `0 seconds`: do not wait (the unit must still be one).
        return crate::sql::settings::parse_duration_us(&format!("1{}", &v[digits..]))
            .flatten()
            .map(|_| 0);
    }
    crate::sql::settings::parse_duration_us(&v)
        .flatten()
        .map(|us| us as u64)
}

fn expect_words(parser: &mut Parser<'_>, words: &[&str]) -> Result<()> {
    for w in words {
        let t = parser.next_token().token;
        if !is_word(&t, w) {
            return Err(ServerError::Syntax(format!(
                "syntax error at or near \"{t}\": expected {}",
                w.to_uppercase()
            )));
        }
    }
    Ok(())
}

/// The rest of `ALTER MATERIALIZED VIEW`: `name SET PARALLELISM [=|TO] n`.
fn set_parallelism(parser: &mut Parser<'_>, statement: &str) -> Result<Stmt> {
    let view = relation_name(parser.parse_object_name(false)?)?;
    let set = parser.next_token().token;
    let what = parser.next_token().token;
    if !is_word(&set, "set") || !is_word(&what, "parallelism") {
        return Err(ServerError::unsupported(format!(
            "{statement} … {set} {what} (only SET PARALLELISM = n)"
        )));
    }
    if !parser.consume_token(&Token::Eq) {
        let to = parser.peek_token().token;
        if is_word(&to, "to") {
            parser.next_token();
        }
    }
    let n = match parser.next_token().token {
        Token::Number(n, _) => n.parse::<u64>().ok(),
        _ => None,
    };
    let parallelism =
        n.ok_or_else(|| ServerError::Syntax("SET PARALLELISM takes a positive integer".into()))?;
    Ok(Stmt::SetParallelism { view, parallelism })
}

/// Names of the placeholders (`$1`, …) in a statement, in order of number.
pub fn placeholders(stmt: &Statement) -> Vec<String> {
    let mut found = Vec::new();
    let _ = visit_expressions(stmt, |e| {
        if let SqlExpr::Value(v) = e
            && let Value::Placeholder(p) = &v.value
            && !found.contains(p)
        {
            found.push(p.clone());
        }
        ControlFlow::<()>::Continue(())
    });
    found.sort_by_key(|p| {
        p.trim_start_matches('$')
            .parse::<usize>()
            .unwrap_or(usize::MAX)
    });
    found
}

/// Replaces `$n` with the given SQL expressions (literals).
pub fn bind(stmt: &mut Statement, values: &HashMap<String, SqlExpr>) -> Result<()> {
    let mut missing = None;
    let _ = visit_expressions_mut(stmt, |e| {
        if let SqlExpr::Value(v) = e
            && let Value::Placeholder(p) = &v.value
        {
            match values.get(p) {
                Some(lit) => *e = lit.clone(),
                None => missing = Some(p.clone()),
            }
        }
        ControlFlow::<()>::Continue(())
    });
    match missing {
        Some(p) => Err(ServerError::InvalidParameter(format!(
            "there is no parameter {p}"
        ))),
        None => Ok(()),
    }
}

/// The column name Postgres gives an unnamed select item, when it differs
/// from DataFusion's: the function's name for a call, the column's name
/// through a cast, `?column?` for other expressions.
pub(crate) fn pg_name(e: &SqlExpr) -> Option<String> {
    match e {
        SqlExpr::Identifier(_) | SqlExpr::CompoundIdentifier(_) => None,
        SqlExpr::Function(f) => f
            .name
            .0
            .last()
            .and_then(|p| p.as_ident())
            .map(|i| i.value.to_lowercase()),
        // A cast is named after its operand when that has a name, else
        // after the type, as Postgres calls it (`1::int` is `int4`).
        SqlExpr::Cast {
            expr, data_type, ..
        } => match expr.as_ref() {
            SqlExpr::Identifier(i) => Some(i.value.clone()),
            SqlExpr::CompoundIdentifier(parts) => parts.last().map(|i| i.value.clone()),
            inner => match pg_name(inner) {
                Some(n) if n == "?column?" => Some(pg_type_name(data_type)),
                other => other,
            },
        },
        SqlExpr::TypedString(t) => Some(pg_type_name(&t.data_type)),
        SqlExpr::Nested(inner) => pg_name(inner),
        SqlExpr::Case { .. } => Some("case".into()),
        SqlExpr::Exists { .. } => Some("exists".into()),
        _ => Some("?column?".into()),
    }
}

/// The name Postgres knows a type by (`pg_type.typname`), which it names
/// an unnamed cast's column after: `int4` for `int`, `varchar` for
/// `character varying(3)`, `int4` for `int[]`.
fn pg_type_name(t: &datafusion::sql::sqlparser::ast::DataType) -> String {
    let written = t.to_string().to_lowercase();
    let base = written.split(['(', '[']).next().unwrap_or_default().trim();
    match base {
        "int" | "integer" | "int4" => "int4",
        "bigint" | "int8" => "int8",
        "smallint" | "int2" => "int2",
        "real" | "float4" => "float4",
        "double precision" | "double" | "float" | "float8" => "float8",
        "numeric" | "decimal" | "dec" => "numeric",
        "varchar" | "character varying" => "varchar",
        "char" | "character" | "bpchar" => "bpchar",
        "boolean" | "bool" => "bool",
        "timestamp" | "timestamp without time zone" => "timestamp",
        "timestamptz" | "timestamp with time zone" => "timestamptz",
        "time" | "time without time zone" => "time",
        "timetz" | "time with time zone" => "timetz",
        other => other,
    }
    .to_string()
}

/// Gives the top-level select items the names Postgres would, wherever that
/// keeps the names unique.
pub fn apply_pg_names(query: &mut Query) {
    let SetExpr::Select(select) = query.body.as_mut() else {
        return;
    };
    let mut candidates: Vec<Option<String>> = select
        .projection
        .iter()
        .map(|item| match item {
            // `c.oid::regclass` is named `oid`, which DataFusion would take
            // for the column wherever the query names `c.oid` again; the
            // name is given after planning (see `output_names`).
            SelectItem::UnnamedExpr(SqlExpr::Cast { expr, .. })
                if matches!(
                    expr.as_ref(),
                    SqlExpr::Identifier(_) | SqlExpr::CompoundIdentifier(_)
                ) =>
            {
                None
            }
            SelectItem::UnnamedExpr(e) => pg_name(e),
            _ => None,
        })
        .collect();
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (item, cand) in select.projection.iter().zip(&candidates) {
        let name = match (item, cand) {
            (_, Some(n)) => Some(n.clone()),
            (SelectItem::ExprWithAlias { alias, .. }, _) => Some(alias.value.clone()),
            (SelectItem::UnnamedExpr(SqlExpr::Identifier(i)), _) => Some(i.value.clone()),
            _ => None,
        };
        if let Some(n) = name {
            *counts.entry(n).or_default() += 1;
        }
    }
    for cand in candidates.iter_mut() {
        if cand
            .as_ref()
            .is_some_and(|n| counts.get(n).copied().unwrap_or(0) > 1)
        {
            *cand = None;
        }
    }
    for (item, cand) in select.projection.iter_mut().zip(candidates) {
        if let (SelectItem::UnnamedExpr(e), Some(name)) = (&*item, cand) {
            *item = SelectItem::ExprWithAlias {
                expr: e.clone(),
                alias: Ident::with_quote('"', name),
            };
        }
    }
}

/// Postgres lets a query's columns share a name (`SELECT NULL, NULL`, or
/// two `pg_get_expr(…)`); DataFusion does not. Gives each top-level item
/// whose name repeats a distinct alias, and returns the names the client is
/// to see; `None` when they are distinct already (or a `*` leaves them to
/// DataFusion).
pub fn distinct_output_names(query: &mut Query) -> Option<Vec<String>> {
    distinct_names(query.body.as_mut())
}

/// The names Postgres gives a query's columns; `None` when a `*` leaves
/// them to the tables.
pub fn output_names(query: &Query) -> Option<Vec<String>> {
    let mut body = query.body.as_ref();
    while let SetExpr::SetOperation { left, .. } = body {
        body = left;
    }
    let SetExpr::Select(select) = body else {
        return None;
    };
    select.projection.iter().map(item_name).collect()
}

fn item_name(item: &SelectItem) -> Option<String> {
    match item {
        SelectItem::ExprWithAlias { alias, .. } => Some(ident(alias)),
        SelectItem::UnnamedExpr(SqlExpr::Identifier(i)) => Some(ident(i)),
        SelectItem::UnnamedExpr(SqlExpr::CompoundIdentifier(parts)) => parts.last().map(ident),
        SelectItem::UnnamedExpr(e) => pg_name(e),
        _ => None,
    }
}

/// For a `UNION` (and the like), each side's names are made distinct, and
/// the first side's are the result's.
fn distinct_names(body: &mut SetExpr) -> Option<Vec<String>> {
    let select = match body {
        SetExpr::Select(select) => select,
        SetExpr::SetOperation { left, right, .. } => {
            distinct_names(right);
            return distinct_names(left);
        }
        _ => return None,
    };
    let names = select
        .projection
        .iter()
        .map(item_name)
        .collect::<Option<Vec<String>>>()?;
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for n in &names {
        *counts.entry(n).or_default() += 1;
    }
    if counts.values().all(|c| *c == 1) {
        return None;
    }
    for (i, item) in select.projection.iter_mut().enumerate() {
        if counts[names[i].as_str()] == 1 {
            continue;
        }
        let expr = match item {
            SelectItem::ExprWithAlias { expr, .. } | SelectItem::UnnamedExpr(expr) => expr.clone(),
            _ => continue,
        };
        *item = SelectItem::ExprWithAlias {
            expr,
            alias: Ident::with_quote('"', format!("{} {}", names[i], i + 1)),
        };
    }
    Some(names)
}

/// The schema an unqualified name means once `search_path` has qualified
/// the names it finds (`crate::catalog::search_path`): the default path's, and
/// where DataFusion looks for any name left unqualified.
pub const DEFAULT_SCHEMA: &str = planner::context::DEFAULT_SCHEMA;

/// A catalog object's name: its schema and its name there.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    pub schema: String,
    pub name: String,
}

impl QualifiedName {
    /// `name` in the default schema.
    pub fn public(name: impl Into<String>) -> Self {
        QualifiedName {
            schema: DEFAULT_SCHEMA.to_string(),
            name: name.into(),
        }
    }

    /// As SQL: both parts quoted, for statements Weir writes itself.
    pub fn to_sql(&self) -> String {
        let quote = |s: &str| format!("\"{}\"", s.replace('"', "\"\""));
        format!("{}.{}", quote(&self.schema), quote(&self.name))
    }
}

/// As Postgres's messages write a name: `s.t`, or `t` in `public`.
impl std::fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.schema == DEFAULT_SCHEMA {
            f.write_str(&self.name)
        } else {
            write!(f, "{}.{}", self.schema, self.name)
        }
    }
}

/// An identifier as Postgres folds it: lower-cased unless quoted.
fn fold(i: &Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_lowercase()
    }
}

/// A catalog object's name, `name`, `schema.name` or `weir.schema.name`;
/// unqualified names are in [`DEFAULT_SCHEMA`].
pub fn object_name(name: &datafusion::sql::sqlparser::ast::ObjectName) -> Result<QualifiedName> {
    let parts: Vec<&Ident> = name.0.iter().filter_map(|p| p.as_ident()).collect();
    match parts.as_slice() {
        [n] => Ok(QualifiedName::public(fold(n))),
        [schema, n] => Ok(QualifiedName {
            schema: fold(schema),
            name: fold(n),
        }),
        [database, schema, n] if fold(database) == "weir" => Ok(QualifiedName {
            schema: fold(schema),
            name: fold(n),
        }),
        [_, _, _] => Err(ServerError::unsupported(format!(
            "cross-database references ({name}; the one database is weir)"
        ))),
        _ => Err(ServerError::Syntax(format!(
            "improper qualified name (too many dotted names): {name}"
        ))),
    }
}

/// A parsed object name, checked for its form (see [`object_name`]) and
/// kept as written, for `search_path` to qualify when the statement runs.
fn relation_name(name: ObjectName) -> Result<ObjectName> {
    object_name(&name)?;
    Ok(name)
}

/// The name of something that lives outside schemas (a schema itself, a
/// savepoint): one identifier.
pub fn simple_name(name: &datafusion::sql::sqlparser::ast::ObjectName) -> Result<String> {
    match name.0.as_slice() {
        [part] => part
            .as_ident()
            .map(fold)
            .ok_or_else(|| ServerError::Syntax(format!("improper name: {name}"))),
        _ => Err(ServerError::Syntax(format!(
            "improper name: {name} (it takes no schema)"
        ))),
    }
}

/// An identifier as Postgres's `quote_ident` writes it: quoted unless it
/// is lower-case letters, digits and underscores, not starting with a
/// digit, and not a keyword.
pub fn quote_ident(name: &str) -> String {
    let plain = name
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && !is_reserved(name);
    if plain {
        name.to_string()
    } else {
        format!("\"{}\"", name.replace('"', "\"\""))
    }
}

/// Whether Postgres reserves this word (so `quote_ident` quotes it).
fn is_reserved(word: &str) -> bool {
    const RESERVED: &[&str] = &[
        "all",
        "analyse",
        "analyze",
        "and",
        "any",
        "array",
        "as",
        "asc",
        "asymmetric",
        "both",
        "case",
        "cast",
        "check",
        "collate",
        "column",
        "constraint",
        "create",
        "current_catalog",
        "current_date",
        "current_role",
        "current_time",
        "current_timestamp",
        "current_user",
        "default",
        "deferrable",
        "desc",
        "distinct",
        "do",
        "else",
        "end",
        "except",
        "false",
        "fetch",
        "for",
        "foreign",
        "from",
        "grant",
        "group",
        "having",
        "in",
        "initially",
        "intersect",
        "into",
        "lateral",
        "leading",
        "limit",
        "localtime",
        "localtimestamp",
        "not",
        "null",
        "offset",
        "on",
        "only",
        "or",
        "order",
        "placing",
        "primary",
        "references",
        "returning",
        "select",
        "session_user",
        "some",
        "symmetric",
        "system_user",
        "table",
        "then",
        "to",
        "trailing",
        "true",
        "union",
        "unique",
        "user",
        "using",
        "variadic",
        "when",
        "where",
        "window",
        "with",
    ];
    RESERVED.contains(&word)
}

/// Normalises an identifier as Postgres does.
pub fn ident(i: &Ident) -> String {
    if i.quote_style.is_some() {
        i.value.clone()
    } else {
        i.value.to_lowercase()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_names_are_qualified_as_postgres_folds_them() {
        let name = |sql: &str| {
            let parsed = Parser::new(&PostgreSqlDialect {})
                .try_with_sql(sql)
                .and_then(|mut p| p.parse_object_name(false))
                .expect("a name");
            object_name(&parsed)
        };
        let q = |schema: &str, name: &str| QualifiedName {
            schema: schema.into(),
            name: name.into(),
        };
        assert_eq!(name("T").unwrap(), q("public", "t"));
        assert_eq!(name("S.\"T\"").unwrap(), q("s", "T"));
        assert_eq!(name("weir.s.t").unwrap(), q("s", "t"));
        assert!(matches!(
            name("other.s.t"),
            Err(ServerError::Unsupported(_))
        ));
        assert!(matches!(name("a.b.c.d"), Err(ServerError::Syntax(_))));
        assert_eq!(q("public", "t").to_string(), "t");
        assert_eq!(q("s", "t").to_string(), "s.t");
        assert_eq!(q("s", "a\"b").to_sql(), "\"s\".\"a\"\"b\"");
    }

    #[test]
    fn streams_watermarks_and_append_only_tables() {
        let stmts = parse(
            "CREATE STREAM s (ts timestamp, v int, WATERMARK FOR ts AS ts - INTERVAL '5' SECOND); \
             create table t (a int, watermark for \"A\" as \"A\") append only; \
             CREATE TABLE u (a int PRIMARY KEY)",
        )
        .unwrap();
        let Stmt::CreateTable { table, options } = &stmts[0] else {
            panic!("{:?}", stmts[0]);
        };
        assert!(options.stream && options.append_only);
        let w = options.watermark.as_ref().unwrap();
        assert_eq!(w.column, "ts");
        assert_eq!(w.expr.to_string(), "ts - INTERVAL '5' SECOND");
        assert_eq!(table.to_string(), "CREATE TABLE s (ts TIMESTAMP, v INT)");
        let Stmt::CreateTable { table, options } = &stmts[1] else {
            panic!();
        };
        assert!(!options.stream && options.append_only);
        assert_eq!(options.watermark.as_ref().unwrap().column, "A");
        assert_eq!(table.to_string(), "CREATE TABLE t (a INT)");
        let Stmt::CreateTable { options, .. } = &stmts[2] else {
            panic!();
        };
        assert!(!options.append_only && options.watermark.is_none());
        assert!(parse("CREATE STREAM s (ts timestamp, WATERMARK FOR ts)").is_err());
    }

    #[test]
    fn splits_and_recognises_weir_statements() {
        let stmts =
            parse("insert into t values (1); FLUSH; show materialized views; SHOW JOBS;;select 1")
                .unwrap();
        assert_eq!(stmts.len(), 5);
        assert!(matches!(stmts[1], Stmt::Flush));
        assert!(matches!(stmts[2], Stmt::ShowMaterializedViews));
        assert!(matches!(stmts[3], Stmt::ShowJobs));
        let stmts = parse("ALTER MATERIALIZED VIEW v SET PARALLELISM = 4; alter materialized view public.W set parallelism to 1").unwrap();
        assert!(
            matches!(&stmts[0], Stmt::SetParallelism { view, parallelism: 4 } if object_name(view).unwrap() == QualifiedName::public("v"))
        );
        assert!(
            matches!(&stmts[1], Stmt::SetParallelism { view, parallelism: 1 } if object_name(view).unwrap() == QualifiedName::public("w"))
        );
        assert!(parse("ALTER MATERIALIZED VIEW v RENAME TO w").is_err());
        let stmts = parse(
            "CREATE SAVEPOINT s1; CREATE SAVEPOINT s2 FOR MATERIALIZED VIEW v; \
             DROP SAVEPOINT IF EXISTS s1; SHOW SAVEPOINTS; \
             RESTORE MATERIALIZED VIEW v FROM SAVEPOINT s2; RESTORE DATABASE FROM SAVEPOINT s1",
        )
        .unwrap();
        assert!(matches!(&stmts[0], Stmt::CreateSavepoint { name, view: None } if name == "s1"));
        assert!(
            matches!(&stmts[1], Stmt::CreateSavepoint { view: Some(v), .. } if object_name(v).unwrap() == QualifiedName::public("v"))
        );
        assert!(matches!(
            &stmts[2],
            Stmt::DropSavepoint {
                if_exists: true,
                ..
            }
        ));
        assert!(matches!(&stmts[3], Stmt::ShowSavepoints));
        assert!(
            matches!(&stmts[4], Stmt::RestoreSavepoint { name, view: Some(v) } if name == "s2" && object_name(v).unwrap() == QualifiedName::public("v"))
        );
        assert!(matches!(
            &stmts[5],
            Stmt::RestoreSavepoint { view: None, .. }
        ));
        assert!(parse("RESTORE TABLE t FROM SAVEPOINT s").is_err());
        assert!(parse("ALTER MATERIALIZED VIEW v SET PARALLELISM = x").is_err());
        assert!(parse("selec 1").is_err());
        assert!(parse("select 1 select 2").is_err());
    }

    #[test]
    fn postgres_names_for_unnamed_items() {
        let Stmt::Sql(s) = parse("select a, count(*), a::int, b + 1, sum(x) as s from t")
            .unwrap()
            .remove(0)
        else {
            panic!()
        };
        let Statement::Query(mut q) = *s else {
            panic!()
        };
        apply_pg_names(&mut q);
        let text = q.to_string();
        assert!(text.contains("count(*) AS \"count\""), "{text}");
        assert!(
            text.contains("(b + 1) AS \"?column?\"") || text.contains("b + 1 AS \"?column?\""),
            "{text}"
        );
        assert!(text.contains("sum(x) AS s"), "{text}");
    }

    #[test]
    fn unnamed_casts_are_named_after_their_types() {
        let Stmt::Sql(s) = parse(
            "select 1::int, (1 + 2)::bigint, 'x'::character varying(3), 2.5::double precision, \
             now()::date, a::text, timestamp '2020-01-01', '{1}'::smallint[]",
        )
        .unwrap()
        .remove(0) else {
            panic!()
        };
        let Statement::Query(mut q) = *s else {
            panic!()
        };
        apply_pg_names(&mut q);
        let text = q.to_string();
        for name in [
            "\"int4\"",
            "\"int8\"",
            "\"varchar\"",
            "\"float8\"",
            "\"now\"",
            "\"timestamp\"",
        ] {
            assert!(text.contains(&format!("AS {name}")), "{name} in {text}");
        }
        assert!(text.contains("AS SMALLINT[]) AS \"int2\""), "{text}");
        assert!(!text.contains("AS \"text\""), "{text}");
    }

    #[test]
    fn binds_placeholders() {
        let Stmt::Sql(mut s) = parse("select * from t where a = $2 and b = $1")
            .unwrap()
            .remove(0)
        else {
            panic!()
        };
        assert_eq!(placeholders(&s), vec!["$1", "$2"]);
        let mut values = HashMap::new();
        values.insert(
            "$1".to_string(),
            SqlExpr::value(Value::Number("1".into(), false)),
        );
        values.insert(
            "$2".to_string(),
            SqlExpr::value(Value::SingleQuotedString("x".into())),
        );
        bind(&mut s, &values).unwrap();
        assert_eq!(s.to_string(), "SELECT * FROM t WHERE a = 'x' AND b = 1");
    }

    #[test]
    fn subscribe_declare_fetch_and_close() {
        let s = parse(
            "SUBSCRIBE TO v; COPY (SUBSCRIBE v SINCE 7) TO STDOUT; \
             DECLARE \"C\" NO SCROLL CURSOR WITH HOLD FOR SUBSCRIBE v WITH (progress = true); \
             FETCH FORWARD 10 FROM \"C\" WITH (timeout = '250ms'); FETCH c WITH (timeout = '0s'); FETCH ALL IN c; CLOSE ALL",
        )
        .unwrap();
        let v = |since, progress| Subscribe {
            view: ObjectName::from(vec![Ident::new("v")]),
            since,
            progress,
        };
        assert!(
            matches!(&s[0], Stmt::Subscribe { subscribe, copy: false } if *subscribe == v(None, false))
        );
        assert!(
            matches!(&s[1], Stmt::Subscribe { subscribe, copy: true } if *subscribe == v(Some(7), false))
        );
        assert!(
            matches!(&s[2], Stmt::DeclareSubscribe { name, subscribe } if name == "C" && *subscribe == v(None, true))
        );
        assert!(matches!(
            &s[3],
            Stmt::Fetch { cursor, count: Some(10), timeout: Some(t), skip: false }
                if cursor == "C" && *t == std::time::Duration::from_millis(250)
        ));
        assert!(matches!(
            &s[4],
            Stmt::Fetch {
                count: Some(1),
                timeout: Some(t),
                ..
            } if t.is_zero()
        ));
        assert!(matches!(&s[5], Stmt::Fetch { count: None, .. }));
        assert!(matches!(&s[6], Stmt::Close { cursor: None }));
    }
}

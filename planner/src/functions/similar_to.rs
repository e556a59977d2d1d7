//! `SIMILAR TO` as Postgres matches it.
//!
//! DataFusion plans `x SIMILAR TO p` as a regular-expression search for
//! `p` itself: unanchored, `%` and `_` literal, `.` any character — so
//! `'abc' SIMILAR TO 'b'` is true and `'abc' SIMILAR TO 'a%'` false, the
//! opposite of Postgres. [`SimilarTo`] rewrites it into
//! `regexp_like(x, weir_similar_to_regex(p, escape))`, where the function
//! translates the SQL pattern into the regular expression Postgres's own
//! `similar_escape` makes of it: anchored at both ends, `%` is `.*`, `_`
//! is `.`, a `.`, `^`, `$` or `\` stands for itself, bracket expressions and
//! `| * + ? {m,n} ( )` keep their meaning, and the escape character (`\`
//! unless `ESCAPE` says otherwise; none for `ESCAPE ''`) makes the next
//! character literal.

use std::sync::Arc;

use datafusion::arrow::array::{Array, StringArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, DataFusionError, Result, ScalarValue};
use datafusion::config::ConfigOptions;
use datafusion::logical_expr::expr::{Like, ScalarFunction};
use datafusion::logical_expr::{
    ColumnarValue, Expr, LogicalPlan, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature,
    Volatility,
};
use datafusion::optimizer::AnalyzerRule;

pub(crate) fn udfs() -> Vec<Arc<ScalarUDF>> {
    vec![udf()]
}

fn udf() -> Arc<ScalarUDF> {
    Arc::new(ScalarUDF::new_from_impl(SimilarToRegex {
        signature: Signature::any(2, Volatility::Immutable),
    }))
}

/// The analyzer rule (see the module's docs).
#[derive(Debug, Default)]
pub(crate) struct SimilarTo;

impl AnalyzerRule for SimilarTo {
    fn name(&self) -> &str {
        "weir_similar_to"
    }

    fn analyze(&self, plan: LogicalPlan, _: &ConfigOptions) -> Result<LogicalPlan> {
        super::rewrite_plan(plan, rewrite)
    }
}

fn rewrite(e: Expr, _: &DFSchema) -> Result<Transformed<Expr>> {
    let Expr::SimilarTo(Like {
        negated,
        expr,
        pattern,
        escape_char,
        case_insensitive: false,
    }) = e
    else {
        return Ok(Transformed::no(e));
    };
    let escape = escape_char.map(String::from).unwrap_or_else(|| "\\".into());
    let regex = Expr::ScalarFunction(ScalarFunction::new_udf(
        udf(),
        vec![
            *pattern,
            Expr::Literal(ScalarValue::Utf8(Some(escape)), None),
        ],
    ));
    let matches = datafusion::functions::regex::expr_fn::regexp_like(*expr, regex, None);
    Ok(Transformed::yes(if negated {
        Expr::Not(Box::new(matches))
    } else {
        matches
    }))
}

/// Postgres's `similar_escape`: the regular expression of a `SIMILAR TO`
/// pattern, with `escape` (at most one character) as its escape.
pub(crate) fn similar_to_regex(pattern: &str, escape: Option<char>) -> Result<String> {
    // `.` matches a newline too, as in Postgres's expressions.
    let mut out = String::from("(?s)^(?:");
    let mut after_escape = false;
    let mut in_bracket = false;
    let mut bracket_start = false;
    for c in pattern.chars() {
        if after_escape {
            if c == '"' {
                return Err(DataFusionError::NotImplemented(
                    "the escape-double-quote of SUBSTRING … SIMILAR in SIMILAR TO".into(),
                ));
            }
            out.push_str(&regex_literal(c));
            after_escape = false;
        } else if Some(c) == escape {
            after_escape = true;
        } else if in_bracket {
            // `]` first in the brackets (or after `^`) is a member.
            if c == ']' && !bracket_start {
                in_bracket = false;
            }
            bracket_start = bracket_start && c == '^';
            if c == '\\' {
                out.push('\\');
            }
            out.push(c);
        } else {
            match c {
                '[' => {
                    in_bracket = true;
                    bracket_start = true;
                    out.push('[');
                }
                '%' => out.push_str(".*"),
                '_' => out.push('.'),
                '(' => out.push_str("(?:"),
                '.' | '^' | '$' | '\\' => {
                    out.push('\\');
                    out.push(c);
                }
                c => out.push(c),
            }
        }
    }
    if after_escape {
        return Err(DataFusionError::Execution(
            "invalid escape string: a SIMILAR TO pattern must not end with the escape character"
                .into(),
        ));
    }
    out.push_str(")$");
    Ok(out)
}

/// `c` as a regular expression that matches it alone.
fn regex_literal(c: char) -> String {
    if c.is_ascii_alphanumeric() || c == '_' || !c.is_ascii() {
        c.to_string()
    } else {
        format!("\\{c}")
    }
}

/// `weir_similar_to_regex(pattern, escape)`.
#[derive(Debug, PartialEq, Eq, Hash)]
struct SimilarToRegex {
    signature: Signature,
}

impl ScalarUDFImpl for SimilarToRegex {
    fn name(&self) -> &str {
        "weir_similar_to_regex"
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, _: &[DataType]) -> Result<DataType> {
        Ok(DataType::Utf8)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> Result<ColumnarValue> {
        let escape = match &args.args[1] {
            ColumnarValue::Scalar(s) => match s.cast_to(&DataType::Utf8)? {
                ScalarValue::Utf8(Some(e)) => {
                    let mut chars = e.chars();
                    match (chars.next(), chars.next()) {
                        (first, None) => first,
                        _ => {
                            return Err(DataFusionError::Execution(
                                "invalid escape string: must be empty or one character".into(),
                            ));
                        }
                    }
                }
                _ => None,
            },
            ColumnarValue::Array(_) => {
                return Err(DataFusionError::NotImplemented(
                    "an ESCAPE of SIMILAR TO that is not a constant".into(),
                ));
            }
        };
        let scalar = matches!(args.args[0], ColumnarValue::Scalar(_));
        let patterns = args.args[0].to_array(if scalar { 1 } else { args.number_rows })?;
        let patterns = cast(&patterns, &DataType::Utf8)?;
        let patterns = patterns
            .as_any()
            .downcast_ref::<StringArray>()
            .ok_or_else(|| DataFusionError::Internal("SIMILAR TO pattern".into()))?;
        let out = patterns
            .iter()
            .map(|p| p.map(|p| similar_to_regex(p, escape)).transpose())
            .collect::<Result<StringArray>>()?;
        Ok(if scalar {
            ColumnarValue::Scalar(ScalarValue::try_from_array(&out, 0)?)
        } else {
            ColumnarValue::Array(Arc::new(out) as Arc<dyn Array>)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(s: &str, pattern: &str) -> bool {
        let r = regex::Regex::new(&similar_to_regex(pattern, Some('\\')).unwrap()).unwrap();
        r.is_match(s)
    }

    /// Expectations are PostgreSQL 15's answers.
    #[test]
    fn patterns_match_as_in_postgres() {
        assert!(!matches("abc", "a.*"));
        assert!(matches("abc", "a%"));
        assert!(!matches("abc", "b"));
        assert!(matches("abc", "(a|x)bc"));
        assert!(matches("a.c", "a.c"));
        assert!(!matches("abc", "a.c"));
        assert!(matches("abc", "a_c"));
        assert!(matches("abc", "%(b|d)%"));
        assert!(matches("aaa", "a{2,3}"));
        assert!(matches("a%", "a\\%"));
        assert!(!matches("ab", "a\\%"));
        assert!(matches("x]", "[]x]%"));
        assert!(matches("b", "[^a]"));
        assert!(matches("a\nb", "a%b"));
    }
}

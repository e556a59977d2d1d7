//! The DataFusion context every statement is planned in, and the planning
//! of a view's query into its job's StreamGraph.
//!
//! The context carries Weir's SQL: Postgres's dialect, `numeric` literals,
//! UTC timestamps, Weir's functions and analyzer rules (`crate::functions`,
//! exact decimal division, `proctime()`). Which tables a statement sees is
//! the server's business: it registers its catalog in the context this
//! gives it.

use datafusion::execution::context::SessionContext;
use datafusion::logical_expr::LogicalPlan;
use datafusion::prelude::SessionConfig;

use crate::stream_graph::StreamGraph;
use crate::{Result, StreamPlanOptions, check_deterministic, lower};

/// The one catalog, named as the one database is.
pub const CATALOG: &str = "weir";
/// The schema unqualified names are in unless `search_path` says otherwise.
pub const DEFAULT_SCHEMA: &str = "public";
/// The zone of `timestamptz` values: stored as UTC instants.
pub const UTC: &str = "+00:00";

/// A fresh DataFusion context.
pub fn new_context() -> SessionContext {
    let mut config = SessionConfig::new()
        .with_default_catalog_and_schema(CATALOG, DEFAULT_SCHEMA)
        .with_create_default_catalog_and_schema(true)
        .with_target_partitions(2)
        .with_information_schema(false);
    config.options_mut().sql_parser.dialect = datafusion::config::Dialect::PostgreSQL;
    // `timestamptz` and `now()` are instants in UTC, as Weir stores them
    // ([`UTC`]); without a zone DataFusion makes them `timestamp`.
    config.options_mut().execution.time_zone = Some(UTC.to_string());
    // `1.5` is numeric, as in Postgres, not a double: `0.1 + 0.2` is `0.3`.
    config.options_mut().sql_parser.parse_float_as_decimal = true;
    // Weir's analyzer rules around DataFusion's own (planner::functions).
    let mut rules = crate::functions::early_analyzer_rules();
    rules.extend(datafusion::optimizer::Analyzer::new().rules);
    let mut planners = crate::functions::first_expr_planners();
    planners.extend(datafusion::execution::SessionStateDefaults::default_expr_planners());
    planners.extend(crate::functions::expr_planners());
    let state = datafusion::execution::SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_analyzer_rules(rules)
        .with_expr_planners(planners)
        .with_type_planner(crate::functions::type_planner())
        .build();
    let ctx = SessionContext::new_with_state(state);
    crate::decimal_division::register(&ctx);
    ctx.register_udf(crate::proctime::udf());
    for f in crate::functions::udfs() {
        ctx.register_udf(f.as_ref().clone());
    }
    // Postgres's names for DataFusion's functions.
    ctx.register_udf(
        datafusion::functions::math::signum()
            .as_ref()
            .clone()
            .with_aliases(["sign"]),
    );
    ctx.register_udaf(
        datafusion::functions_aggregate::bool_and_or::bool_and_udaf()
            .as_ref()
            .clone()
            .with_aliases(["every"]),
    );
    ctx.register_udaf(
        datafusion::functions_aggregate::variance::var_samp_udaf()
            .as_ref()
            .clone()
            .with_aliases(["variance"]),
    );
    for rule in crate::functions::analyzer_rules() {
        ctx.add_analyzer_rule(rule);
    }
    ctx
}

/// Optimizes a view's logical plan for a dataflow and lowers it into the
/// StreamGraph of its job.
pub fn plan_stream(plan: &LogicalPlan, options: &StreamPlanOptions) -> Result<StreamGraph> {
    check_deterministic(plan)?;
    let mut state = new_context().state();
    // A dataflow cannot run a subquery once up front: every scalar subquery,
    // correlated or not, becomes a join that keeps its value current.
    state
        .config_mut()
        .options_mut()
        .optimizer
        .enable_physical_uncorrelated_scalar_subquery = false;
    let plan = state.optimize(plan)?;
    lower(&plan, options)
}

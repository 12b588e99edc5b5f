//! Dual-pool token-budget routing (DESIGN.md §8): estimate a request's total token
//! budget from its size in bytes, without a tokenizer, and send it to a short pool
//! (small context, many sequences per instance) or a long pool. Here: the byte
//! classifier ([`category`]), the calibrated estimator ([`estimator`]), the dispatch
//! rule and its outcomes ([`dispatch`]), the closed-form cost model ([`cost`]),
//! request streams ([`trace`]) and the discrete-event simulator that checks the cost
//! model ([`sim`]). The server's dispatcher over pools lives in `src/pools`.

pub mod category;
pub mod cost;
pub mod dispatch;
pub mod estimator;
pub mod sim;
pub mod trace;

pub use category::{classify, Category};
pub use cost::{savings, ClassStats, CostPlan, InstanceProfile, PoolContexts};
pub use dispatch::{Dispatcher, PoolChoice, RouteOutcome, RouteTally};
pub use estimator::{BudgetEstimator, Calibration, CategoryRatios, ErrorTally, EstimatorConfig, Feedback};
pub use trace::{parse_azure_csv, poisson_stream, Arrival, QuantileTable, TraceError};

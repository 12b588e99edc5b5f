//! tokenrouter-load: a load generator for the OpenAI API of tokenrouter (or any
//! compatible server on this machine). Closed-loop clients or open-loop arrivals
//! (Poisson, or a trace's timestamps), streamed requests timed to the first token
//! and to the end, the benchmark workloads (low-effort, high-effort, agentic, Azure
//! trace replay), soaks with churn (client hang-ups, injected faults, a leak check
//! and the server's memory), a summary, and JSON/CSV results. The binary is a thin shell over
//! [`cli::execute`], which other tools and tests call the same way.

pub mod bench;
pub mod churn;
pub mod cli;
pub mod client;
pub mod dispatch;
pub mod prompt;
pub mod record;
pub mod report;
pub mod runner;
pub mod soak;
pub mod spec;
pub mod sse;
pub mod stats;
pub mod target;
pub mod trace;
pub mod turns;
pub mod workload;

pub use cli::{execute, LoadArgs};
pub use report::Report;

//! The tokenrouter runtime: the actors and threads that own the core state machines.
//! One subserver per model (a compute thread that owns the model, its KV and its
//! scheduler, reached through one ordered inbox), a KV ledger for joint admission, and
//! one actor per request. `Engine` is the library API.

mod compute;
pub mod config;
pub mod engine;
pub mod error;
pub mod events;
mod grammar;
mod handles;
pub mod health;
pub mod kv_manager;
mod kv_sharing;
mod launch;
mod messages;
mod registry;
pub mod remote;
mod replan;
pub mod request;
mod shadow_verifier;
pub mod tls;
pub mod tokenizer;

// Test hooks that widen race windows; only in builds with the `test-hooks` feature
// (this crate's own tests turn it on).
#[cfg(feature = "test-hooks")]
pub use compute::set_handoff_delay_for_tests;
pub use config::{AdmissionConfig, EngineConfig, ModelSpec, StepLimits, SupervisionConfig};
pub use engine::{Engine, GenerationStream};
pub use error::EngineError;
pub use events::{GenerateRequest, GenerationEvent, Usage};
pub use health::{ModelReadiness, Readiness};
#[cfg(feature = "test-hooks")]
pub use launch::set_launch_delay_for_tests;
pub use messages::{Fault, PrefixFlush, SubserverSnapshot};
pub use tokenrouter_core as core;

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
pub mod health;
pub mod kv_manager;
mod kv_sharing;
mod launch;
mod registry;
pub mod remote;
mod replan;
pub mod request;
mod shadow_verifier;
pub mod tls;
pub mod tokenizer;

pub use compute::{set_handoff_delay_for_tests, Fault, SubserverSnapshot};
pub use config::{AdmissionConfig, EngineConfig, ModelSpec, StepLimits, SupervisionConfig};
pub use engine::{Engine, GenerationStream};
pub use error::EngineError;
pub use events::{GenerateRequest, GenerationEvent, Usage};
pub use health::{ModelReadiness, Readiness};
pub use launch::set_launch_delay_for_tests;
pub use tokenrouter_core as core;

//! The tokenrouter runtime: ractor actors that own the core state machines. One
//! subserver per model (a control actor plus a compute thread that owns the model,
//! its KV and its scheduler), a KV manager for joint admission, and one actor per
//! request. `Engine` is the library API.

mod compute;
pub mod config;
pub mod engine;
pub mod error;
pub mod events;
pub mod kv_manager;
mod registry;
pub mod remote;
mod replan;
pub mod request;
mod shadow_verifier;
pub mod subserver;
pub mod tokenizer;

pub use compute::SubserverSnapshot;
pub use config::{EngineConfig, ModelSpec, StepLimits};
pub use engine::{Engine, GenerationStream};
pub use error::EngineError;
pub use events::{GenerateRequest, GenerationEvent, Usage};
pub use tokenrouter_core as core;

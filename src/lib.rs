//! tokenrouter: a serving engine for token-level LLM routing. This crate holds the
//! edges (CLI, config, HTTP); the runtime is in `tokenrouter-actors`, pure logic in
//! `tokenrouter-core`.

pub mod cli;
pub mod config;
pub mod dashboard;
pub mod http;
pub mod pools;
pub mod sweep;

pub use tokenrouter_actors as actors;
pub use tokenrouter_core as core;

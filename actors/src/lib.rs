//! The runtime: ractor actors that own the core state machines (engine issue).
pub use tokenrouter_core as core;

//! The live dashboard: one static page, built into the binary, that polls
//! `GET /v1/stats` and draws the actor tree, per-model queues, batch sizes, step
//! latency, KV use, routing flows and throughput.

/// The page served at `GET /dashboard`.
pub const DASHBOARD_HTML: &str = include_str!("index.html");

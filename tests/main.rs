//! The server's integration tests, one module per area, in a single test binary: each
//! binary links the whole server, and linking seventeen of them cost CI about as much
//! as running them. nextest still runs every test in its own process.
//!
//! Run one area with `cargo nextest run --release -p tokenrouter --test integration -E
//! 'test(/^http::/)'`.

mod cluster_support;
mod http_support;
mod hub_support;
mod tls_support;

mod anthropic;
mod chat;
mod cli;
mod clients;
mod cluster;
mod config;
mod examples;
mod fuzz_api;
mod http;
mod hub;
mod imports;
mod limits;
mod model_import;
mod openai_surface;
mod plan;
mod pools;
mod prefix_cache;
mod reliability;
mod responses;
mod smollm2;
mod speculation;
mod sweep;

//! One error type for the engine, which the HTTP layer maps to statuses in one place.

use std::time::Duration;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum EngineError {
    #[error("model {model}: {message}")]
    ModelLoad { model: String, message: String },
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The request's grammar or schema (structured outputs) cannot be compiled.
    #[error("invalid response_format: {0}")]
    InvalidGrammar(String),
    #[error("the prompt needs {needed} tokens of KV but model {model} holds at most {capacity}")]
    TooLarge { needed: usize, capacity: usize, model: String },
    /// The admission queue is full (429).
    #[error("{limit} requests are already waiting for KV; retry later")]
    QueueFull { limit: usize },
    /// The request waited too long for KV (503 with `Retry-After`).
    #[error("no KV became free within {:.1}s; retry later", waited.as_secs_f64())]
    Overloaded { waited: Duration, retry_after: Duration },
    /// The request ran out of time (504).
    #[error("deadline exceeded: the request's time limit of {:.1}s ran out", limit.as_secs_f64())]
    DeadlineExceeded { limit: Duration },
    /// An upstream server (a pool member) did not answer in time (504).
    #[error("{0}")]
    UpstreamTimeout(String),
    /// A model the request needs is out of service (503).
    #[error("{0}")]
    ModelUnavailable(String),
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
}

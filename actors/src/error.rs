//! One error type for the engine, which the HTTP layer maps to statuses in one place.

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum EngineError {
    #[error("model {model}: {message}")]
    ModelLoad { model: String, message: String },
    #[error("invalid engine configuration: {0}")]
    Config(String),
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the request needs {needed} tokens of KV but model {model} holds at most {capacity}")]
    TooLarge { needed: usize, capacity: usize, model: String },
    #[error("the engine is shutting down")]
    ShuttingDown,
    #[error("internal error: {0}")]
    Internal(String),
}

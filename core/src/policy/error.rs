//! What building a policy can refuse or fail at. Routing itself never fails: a policy
//! that cannot judge a row keeps it where it is.

use std::path::PathBuf;

use crate::model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    #[error("unknown policy `{name}`; known policies: {known}")]
    UnknownPolicy { name: String, known: String },
    /// Unknown keys, wrong types and out-of-range values; the message names the key.
    #[error("policy `{policy}`: {message}")]
    InvalidParams { policy: String, message: String },
    #[error("policy `{policy}`: unknown model `{model}`; the engine's models are: {known}")]
    UnknownModel { policy: String, model: String, known: String },
    #[error("router weights {path}: {message}")]
    Weights { path: PathBuf, message: String },
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error("router computation failed: {0}")]
    Compute(#[from] candle_core::Error),
}

impl PolicyError {
    pub(crate) fn params(policy: &str, message: impl Into<String>) -> Self {
        PolicyError::InvalidParams { policy: policy.to_string(), message: message.into() }
    }
}

//! One error type for everything the model runtime can refuse or fail at.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model folder {0} does not exist or is not a directory")]
    MissingFolder(PathBuf),
    #[error("required file {0} is missing")]
    MissingFile(PathBuf),
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("invalid config {path}: {message}")]
    InvalidConfig { path: PathBuf, message: String },
    #[error("tensor {name} is missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor {name} has shape {found:?}, but the config implies {expected:?}")]
    ShapeMismatch { name: String, expected: Vec<usize>, found: Vec<usize> },
    #[error("tensor {name} has unsupported dtype {dtype}")]
    UnsupportedDtype { name: String, dtype: String },
    #[error("out of KV blocks: {needed} needed, {free} free (block size {block_size} tokens)")]
    OutOfBlocks { needed: usize, free: usize, block_size: usize },
    #[error("bad batch: {0}")]
    BadBatch(String),
    #[error("token id {token} is outside the vocabulary (size {vocab})")]
    TokenOutOfVocab { token: u32, vocab: usize },
    #[error("position {position} exceeds the model's maximum context {max}")]
    ContextOverflow { position: usize, max: usize },
    #[error("{0}")]
    Unsupported(String),
    /// A grammar-constrained output cannot go on.
    #[error("{0}")]
    Constraint(String),
    #[error("llama.cpp: {0}")]
    LlamaCpp(String),
    /// The CUDA driver, a device, its memory or a kernel refused (with what to do).
    #[error("CUDA: {0}")]
    Cuda(String),
    #[error("tensor computation failed: {0}")]
    Compute(#[from] candle_core::Error),
}

pub type Result<T> = std::result::Result<T, ModelError>;

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io { path: path.into(), source }
    }
}

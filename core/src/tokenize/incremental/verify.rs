//! The shadow verifier's pure parts: which spliced results to check (a sampled fraction), the
//! check itself (full tokenization must give the same ids) and a self-contained reproducer for
//! a mismatch. The tokenizer actor runs checks on a thread of their own, off the request path.

use serde_json::{json, Value};

use crate::rng::SplitMix64;
use crate::tokenize::{TextTokenizer, TokenizeError};

/// Draws which spliced results are verified.
#[derive(Debug, Clone)]
pub struct VerifySampler {
    fraction: f64,
    rng: SplitMix64,
}

impl VerifySampler {
    pub fn new(fraction: f64, seed: u64) -> Self {
        VerifySampler { fraction, rng: SplitMix64(seed) }
    }

    pub fn sample(&mut self) -> bool {
        self.fraction >= 1.0 || (self.fraction > 0.0 && self.rng.open_unit() < self.fraction)
    }
}

/// One spliced result to check.
#[derive(Debug, Clone)]
pub struct VerifyJob {
    pub text: String,
    pub ids: Vec<u32>,
    pub add_special_tokens: bool,
    /// The byte offset the session was cut at.
    pub cut: usize,
}

/// Where spliced ids differ from full tokenization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mismatch {
    pub first_difference: usize,
    pub full: Vec<u32>,
}

/// Ids shown on each side of the first difference in a reproducer.
const CONTEXT_IDS: usize = 16;
/// Characters of text shown on each side of the cut.
const CONTEXT_CHARS: usize = 80;

impl VerifyJob {
    /// `Ok(None)` when the spliced ids equal full tokenization.
    pub fn check(&self, tokenizer: &TextTokenizer) -> Result<Option<Mismatch>, TokenizeError> {
        let full = tokenizer.encode(&self.text, self.add_special_tokens)?;
        if full == self.ids {
            return Ok(None);
        }
        let first_difference =
            full.iter().zip(&self.ids).position(|(a, b)| a != b).unwrap_or(full.len().min(self.ids.len()));
        Ok(Some(Mismatch { first_difference, full }))
    }

    /// Everything needed to replay the failure: `encode(text)` vs `encode(text[..cut])` followed
    /// by `encode(text[cut..])` (the cached prefix is the former by construction).
    pub fn reproducer(&self, tokenizer_name: &str, mismatch: &Mismatch) -> Value {
        let around = |ids: &[u32]| {
            let from = mismatch.first_difference.saturating_sub(CONTEXT_IDS);
            ids[from.min(ids.len())..(mismatch.first_difference + CONTEXT_IDS).min(ids.len())].to_vec()
        };
        json!({
            "tokenizer": tokenizer_name,
            "add_special_tokens": self.add_special_tokens,
            "cut": self.cut,
            "before_cut": tail_chars(&self.text[..self.cut], CONTEXT_CHARS),
            "after_cut": head_chars(&self.text[self.cut..], CONTEXT_CHARS),
            "first_difference": mismatch.first_difference,
            "full_ids_around": around(&mismatch.full),
            "spliced_ids_around": around(&self.ids),
            "full_len": mismatch.full.len(),
            "spliced_len": self.ids.len(),
            "text": self.text,
        })
    }
}

fn head_chars(s: &str, n: usize) -> &str {
    s.char_indices().nth(n).map_or(s, |(i, _)| &s[..i])
}

fn tail_chars(s: &str, n: usize) -> &str {
    s.char_indices().rev().nth(n.saturating_sub(1)).map_or(s, |(i, _)| &s[i..])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::test_support::metaspace_tokenizer;

    #[test]
    fn sampler_honours_its_fraction() {
        let mut never = VerifySampler::new(0.0, 1);
        let mut always = VerifySampler::new(1.0, 1);
        let mut tenth = VerifySampler::new(0.1, 1);
        let hits = (0..10_000).filter(|_| tenth.sample()).count();
        assert!((800..1200).contains(&hits), "{hits}");
        assert!((0..100).all(|_| !never.sample() && always.sample()));
    }

    #[test]
    fn a_wrong_splice_is_reported_with_a_reproducer() {
        let tok = metaspace_tokenizer();
        let text = "hello world".to_string();
        let ids = tok.encode(&text, false).unwrap();
        let good = VerifyJob { text: text.clone(), ids: ids.clone(), add_special_tokens: false, cut: 5 };
        assert_eq!(good.check(&tok).unwrap(), None);
        let mut wrong = ids.clone();
        wrong.insert(1, 7);
        let bad = VerifyJob { text, ids: wrong, add_special_tokens: false, cut: 5 };
        let mismatch = bad.check(&tok).unwrap().unwrap();
        assert_eq!(mismatch.first_difference, 1);
        let repro = bad.reproducer("synthetic", &mismatch);
        assert_eq!(repro["before_cut"], "hello");
        assert_eq!(repro["after_cut"], " world");
        assert_eq!(repro["spliced_len"], ids.len() + 1);
    }
}

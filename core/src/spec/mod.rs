//! Speculative decoding's drafts: where a request's next tokens may be guessed from
//! (the client's predicted output, or text the request has already seen), and how
//! many to guess. Verification is the scheduler's (see `sched::verify`): the target
//! model decides every token, so a draft changes speed, never the output.

mod cost;
mod ngram;
mod suffix;

pub use cost::{best_draft_length, StepCost};
pub use ngram::longest_match;
pub use suffix::{SuffixCache, SuffixDraft, SuffixTrie, SUFFIX_DEPTH};

use serde::{Deserialize, Serialize};

/// Where drafts come from when the client supplies no prediction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpeculationMethod {
    /// Prompt lookup: the continuation of the longest earlier occurrence of the
    /// sequence's last tokens in its own prompt and output (vLLM's `ngram`).
    Ngram,
    /// SuffixDecoding: the continuation that most often followed the sequence's tail,
    /// in its own prompt and output or in this model's recent outputs.
    Suffix,
    /// A draft model: the engine's first (smallest) model samples the next tokens for
    /// a larger one, which verifies them in one step (Leviathan et al. 2023).
    Draft,
}

impl SpeculationMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SpeculationMethod::Ngram => "ngram",
            SpeculationMethod::Suffix => "suffix",
            SpeculationMethod::Draft => "draft",
        }
    }
}

impl std::str::FromStr for SpeculationMethod {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "ngram" => Ok(SpeculationMethod::Ngram),
            "suffix" => Ok(SpeculationMethod::Suffix),
            "draft" => Ok(SpeculationMethod::Draft),
            other => Err(format!("speculative method {other:?} is not known: use \"suffix\", \"ngram\" or \"draft\"")),
        }
    }
}

/// Most tokens one verify step may draft for a row.
pub const MAX_DRAFT_TOKENS: usize = 32;
/// Tokens a verify step may draft when neither the request nor the server says.
pub const DEFAULT_DRAFT_TOKENS: usize = 8;

/// Nodes the suffix cache over one model's recent outputs holds by default: about 40 MB.
pub const DEFAULT_SUFFIX_CACHE_NODES: usize = 1 << 20;

/// A model's speculation settings (the server's, not a request's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DraftingConfig {
    /// Draft lengths are chosen against this step cost instead of the measured one.
    pub step_cost: Option<StepCost>,
    /// Most nodes of the suffix cache over recent outputs (0: suffix drafts look at
    /// the request's own text only).
    pub suffix_cache_nodes: usize,
}

impl Default for DraftingConfig {
    fn default() -> Self {
        DraftingConfig { step_cost: None, suffix_cache_nodes: DEFAULT_SUFFIX_CACHE_NODES }
    }
}

/// A request's speculation: its own drafts (`method`), the client's predicted output, or both.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Speculation {
    pub method: Option<SpeculationMethod>,
    /// Most tokens drafted per step (1..=[`MAX_DRAFT_TOKENS`]).
    pub max_tokens: usize,
    /// OpenAI's Predicted Outputs: the output the client expects, tokenized.
    pub prediction: Vec<u32>,
}

/// Which source a draft came from (usage reports predicted tokens apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DraftSource {
    Prediction,
    Ngram,
    Suffix,
    /// Sampled by the draft model (see [`SpeculationMethod::Draft`]).
    Draft,
}

impl DraftSource {
    pub fn as_str(self) -> &'static str {
        match self {
            DraftSource::Prediction => "prediction",
            DraftSource::Ngram => "ngram",
            DraftSource::Suffix => "suffix",
            DraftSource::Draft => "draft",
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Draft {
    pub tokens: Vec<u32>,
    pub source: DraftSource,
    /// How long the match it continues is (the longest followed, for a prediction's start):
    /// the longer, the likelier its guesses are kept (see [`KeepTable`]).
    pub match_len: usize,
}

/// Match-length classes of [`KeepTable`]: 1, 2–3, 4–7, …, 64 and more.
const MATCH_CLASSES: usize = 7;

/// How often guesses were kept, by the length of the match they continued: one model's
/// record over every request, so a new request drafts as far as drafts like its own
/// have paid. A class starts at 7 kept in 10.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeepTable {
    drafted: [u64; MATCH_CLASSES],
    kept: [u64; MATCH_CLASSES],
}

impl KeepTable {
    fn class(match_len: usize) -> usize {
        (match_len.max(1).ilog2() as usize).min(MATCH_CLASSES - 1)
    }

    /// The chance a guess is kept when the guesses before it were and it continues a
    /// match this long (a draft's `i`-th guess continues its match plus `i - 1` kept ones:
    /// copied text, once it agrees, tends to go on agreeing).
    pub fn chance(&self, match_len: usize) -> f64 {
        let c = Self::class(match_len);
        (self.kept[c] as f64 + 7.0) / (self.drafted[c] as f64 + 10.0)
    }

    /// A draft continuing a match of `match_len` kept its first `kept` of `drafted`
    /// guesses: each guess up to the first rejected one is counted at its own length.
    pub fn record(&mut self, match_len: usize, drafted: usize, kept: usize) {
        for i in 0..drafted.min(kept + 1) {
            let c = Self::class(match_len + i);
            self.drafted[c] += 1;
            self.kept[c] += u64::from(i < kept);
        }
    }
}

/// Shortest earlier occurrence of the sequence's tail that a self-lookup drafts from:
/// two-token repeats are common in any text and rarely continue.
const MIN_SELF_MATCH: usize = 3;
/// How far a match is followed back; longer matches draft no more.
const MAX_MATCH: usize = 64;

/// One request's drafting state: how well its drafts have fared so far, which sets
/// how much the next one may guess.
#[derive(Debug, Clone)]
pub struct Drafter {
    speculation: Speculation,
    /// Suffix drafts: the request's own prompt and output, indexed as far as `indexed`.
    own: Option<SuffixTrie>,
    indexed: usize,
    /// Verify steps in a row that accepted nothing; each one asks a longer match of
    /// the next draft, so text that does not repeat stops paying for guesses.
    misses: usize,
    /// Where in the prediction the output is believed to be.
    prediction_cursor: usize,
    /// Tokens the draft model's next round samples (method `draft`).
    round: usize,
    /// Draft-model rounds in a row that kept nothing; each doubles the tokens decoded
    /// plainly before the next round, so a draft model that does not agree with the
    /// target soon costs next to nothing.
    round_misses: u32,
    plain_left: usize,
}

/// At most this many tokens are decoded plainly between two draft-model rounds.
const MAX_PLAIN_RUN: usize = 63;
/// Misses past this lengthen the plain run no further.
pub const MAX_ROUND_MISSES: u32 = 6;

/// Tokens decoded plainly after `misses` rounds in a row that kept nothing.
fn plain_run(misses: u32) -> usize {
    ((1usize << misses.min(MAX_ROUND_MISSES)) - 1).min(MAX_PLAIN_RUN)
}

/// Tokens a draft model's first round samples, before any verdict.
const FIRST_ROUND: usize = 4;

impl Drafter {
    pub fn new(speculation: Speculation) -> Self {
        let round = FIRST_ROUND.min(speculation.max_tokens).max(1);
        Drafter {
            speculation,
            own: None,
            indexed: 0,
            misses: 0,
            prediction_cursor: 0,
            round,
            round_misses: 0,
            plain_left: 0,
        }
    }

    /// Whether the request's drafts come from a draft model (method `draft`).
    pub fn uses_draft_model(&self) -> bool {
        self.speculation.method == Some(SpeculationMethod::Draft)
    }

    /// How many tokens the draft model samples next, when the request drafts with one
    /// and its next token is not one to decode plainly (after rounds that kept nothing).
    pub fn next_round(&mut self) -> Option<usize> {
        if !self.uses_draft_model() {
            return None;
        }
        if self.plain_left > 0 {
            self.plain_left -= 1;
            return None;
        }
        Some(self.round)
    }

    /// A draft model's round of `drafted` tokens kept `accepted`: a round kept whole
    /// asks two more next time, one that was cut short one fewer (as Hugging Face's
    /// assisted generation schedules it), within the request's `max_tokens`.
    /// Starts as if its first rounds had already kept nothing `misses` times in a row:
    /// the draft model's record on other requests, so that a draft model that does not
    /// agree with its target costs a new request no more than an old one.
    pub fn start_backed_off(&mut self, misses: u32) {
        self.round_misses = misses.min(MAX_ROUND_MISSES);
        self.plain_left = plain_run(self.round_misses);
    }

    /// A round that kept nothing also doubles the plain run before the next (1, 3, 7,
    /// … up to [`MAX_PLAIN_RUN`] tokens); one that kept something ends the backoff.
    pub fn record_round(&mut self, drafted: usize, accepted: usize) {
        let limit = self.speculation.max_tokens.clamp(1, MAX_DRAFT_TOKENS);
        self.round = if accepted >= drafted { self.round + 2 } else { self.round.saturating_sub(1) };
        self.round = self.round.clamp(1, limit);
        if accepted == 0 {
            self.round_misses = (self.round_misses + 1).min(MAX_ROUND_MISSES);
            self.plain_left = plain_run(self.round_misses);
        } else {
            self.round_misses = 0;
        }
    }

    /// The sequence now holds only its first `len` tokens (what follows may come back
    /// different): the request's own index starts over if it went further.
    pub fn rewind(&mut self, len: usize) {
        if len < self.indexed {
            self.own = None;
            self.indexed = 0;
        }
    }

    /// A draft of at most `limit` tokens to follow `sequence` (prompt then output;
    /// the output starts at `prompt_len`), or none. `recent`: this model's recent
    /// outputs, for suffix drafts.
    pub fn propose(
        &mut self,
        sequence: &[u32],
        prompt_len: usize,
        limit: usize,
        recent: Option<&SuffixCache>,
    ) -> Option<Draft> {
        let limit = limit.min(self.speculation.max_tokens).min(MAX_DRAFT_TOKENS);
        if limit == 0 {
            return None;
        }
        let output = &sequence[prompt_len.min(sequence.len())..];
        let from_prediction = self.from_prediction(output, limit);
        if from_prediction.is_some() {
            return from_prediction;
        }
        match self.speculation.method? {
            SpeculationMethod::Ngram => self.from_own_text(sequence, limit),
            SpeculationMethod::Suffix => self.from_suffixes(sequence, limit, recent),
            // Its drafts arrive with the request, sampled on the draft model.
            SpeculationMethod::Draft => None,
        }
    }

    fn from_suffixes(&mut self, sequence: &[u32], limit: usize, recent: Option<&SuffixCache>) -> Option<Draft> {
        let own = self.own.get_or_insert_with(SuffixTrie::new);
        for &t in &sequence[self.indexed.min(sequence.len())..] {
            own.push(t);
        }
        self.indexed = sequence.len();
        let min_match = MIN_SELF_MATCH + self.misses;
        let mine = own.draft(sequence, min_match, limit, true);
        let others = recent.and_then(|cache| cache.draft(sequence, min_match, limit));
        let best = match (mine, others) {
            (Some(a), Some(b)) => Some(if b.expected_kept > a.expected_kept { b } else { a }),
            (a, b) => a.or(b),
        }?;
        Some(Draft { tokens: best.tokens, source: DraftSource::Suffix, match_len: best.match_len })
    }

    /// The verdict of a verify step on a draft from `source`.
    pub fn record(&mut self, source: DraftSource, accepted: usize) {
        if accepted == 0 {
            self.misses += 1;
        } else {
            self.misses = 0;
        }
        if source == DraftSource::Prediction {
            self.prediction_cursor += accepted;
        }
    }

    fn from_prediction(&self, output: &[u32], limit: usize) -> Option<Draft> {
        let prediction = &self.speculation.prediction;
        if prediction.is_empty() {
            return None;
        }
        let (start, match_len) = if output.is_empty() {
            (0, MAX_MATCH)
        } else {
            // The prediction's continuation after the output's tail, nearest the cursor.
            let (start, length) = longest_match(prediction, output, 1, MAX_MATCH, Some(self.prediction_cursor))?;
            if length < (self.misses + 1).min(output.len()) {
                return None;
            }
            (start, length)
        };
        let tokens: Vec<u32> = prediction[start..].iter().take(limit).copied().collect();
        (!tokens.is_empty()).then_some(Draft { tokens, source: DraftSource::Prediction, match_len })
    }

    fn from_own_text(&self, sequence: &[u32], limit: usize) -> Option<Draft> {
        let min_match = MIN_SELF_MATCH + self.misses;
        // Matches end before the sequence does: the tail's own continuation is what is guessed.
        let (start, length) = longest_match(sequence, sequence, min_match, MAX_MATCH, None)?;
        // As SuffixDecoding does: a longer match earns a longer guess.
        let take = length.min(limit);
        let tokens: Vec<u32> = sequence[start..].iter().take(take).copied().collect();
        (!tokens.is_empty()).then_some(Draft { tokens, source: DraftSource::Ngram, match_len: length })
    }
}

#[cfg(test)]
mod tests;

//! One request's constraint: the compiled grammar and where its parse stands.

use std::sync::{Mutex, MutexGuard};

use llguidance::toktrie::SimpleVob;
use llguidance::Matcher;

/// What may come next in a constrained output.
#[derive(Debug)]
pub enum Next {
    /// Sample among these tokens.
    Allowed(TokenMask),
    /// The grammar is complete: the output ends here (`finish_reason: stop`).
    Complete,
    /// The grammar cannot go on (a limit of the parser, or an output it rejects).
    Failed(String),
}

/// The tokens a grammar allows next, with its end-of-sequence mapped to the
/// request's stop tokens.
#[derive(Debug, Clone)]
pub struct TokenMask {
    allowed: SimpleVob,
}

impl TokenMask {
    fn new(mut allowed: SimpleVob, eos: u32, stop_ids: &[u32]) -> Self {
        if allowed.is_allowed(eos) {
            allowed.disallow_token(eos);
            let len = allowed.len();
            for &id in stop_ids.iter().filter(|&&id| (id as usize) < len) {
                allowed.allow_token(id);
            }
        }
        Self { allowed }
    }

    pub fn allows(&self, token: u32) -> bool {
        (token as usize) < self.allowed.len() && self.allowed.is_allowed(token)
    }

    pub fn allowed_count(&self) -> usize {
        self.allowed.num_set()
    }

    /// Sets every disallowed token's logit to -inf, 32 at a time: most words of a
    /// mask are all-allowed or all-disallowed.
    pub fn apply(&self, logits: &mut [f32]) {
        let words = self.allowed.as_slice();
        let mut chunks = logits.chunks_mut(32);
        for (&word, chunk) in words.iter().zip(&mut chunks) {
            match word {
                u32::MAX => {}
                0 => chunk.fill(f32::NEG_INFINITY),
                _ => chunk.iter_mut().enumerate().filter(|(bit, _)| word >> bit & 1 == 0).for_each(|(_, x)| {
                    *x = f32::NEG_INFINITY;
                }),
            }
        }
        // Logits past the mask's vocabulary name no token the grammar knows.
        chunks.for_each(|chunk| chunk.fill(f32::NEG_INFINITY));
    }
}

/// A request's grammar and parse state. Shared by every model the request visits (it
/// is on one at a time), so the state needs no transfer on a handoff.
pub struct TokenConstraint {
    initial: Matcher,
    cursor: Mutex<Cursor>,
    eos: u32,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint").field("eos", &self.eos).field("stop_ids", &self.stop_ids).finish()
    }
}

struct Cursor {
    matcher: Matcher,
    /// The output tokens the matcher has consumed.
    consumed: Vec<u32>,
}

impl Cursor {
    fn fresh(initial: &Matcher) -> Self {
        Self { matcher: initial.clone(), consumed: Vec::new() }
    }

    /// Brings the parse to the end of `output`: rolls back what the output no longer
    /// holds (a rewind, or commits a crashed step lost), then consumes what is new.
    fn sync(&mut self, initial: &Matcher, output: &[u32]) -> Result<(), String> {
        let common = self.consumed.iter().zip(output).take_while(|(a, b)| a == b).count();
        if common < self.consumed.len() {
            let back = self.consumed.len() - common;
            if self.matcher.rollback(back).is_ok() {
                self.consumed.truncate(common);
            } else {
                *self = Self::fresh(initial);
            }
        }
        let new = &output[self.consumed.len()..];
        if !new.is_empty() {
            self.matcher.consume_tokens(new).map_err(|e| format!("the output left the grammar: {e}"))?;
            self.consumed.extend_from_slice(new);
        }
        Ok(())
    }
}

impl TokenConstraint {
    pub(super) fn new(initial: Matcher, eos: u32, stop_ids: Vec<u32>) -> Self {
        let cursor = Mutex::new(Cursor::fresh(&initial));
        Self { initial, cursor, eos, stop_ids }
    }

    /// The same grammar with its parse at the start, for another request: a copy of
    /// the compiled parser, not a second compile.
    pub fn fresh(&self) -> Self {
        Self::new(self.initial.clone(), self.eos, self.stop_ids.clone())
    }

    /// What may follow `output` (the request's committed output tokens).
    pub fn next(&self, output: &[u32]) -> Next {
        let mut cursor = self.lock();
        if let Err(message) = cursor.sync(&self.initial, output) {
            // Start over next time: the state past a rejected token is undefined.
            *cursor = Cursor::fresh(&self.initial);
            return Next::Failed(message);
        }
        if let Some(error) = cursor.matcher.get_error() {
            return Next::Failed(error);
        }
        if cursor.matcher.is_stopped() {
            return Next::Complete;
        }
        match cursor.matcher.compute_mask() {
            Ok(allowed) if allowed.is_zero() => Next::Complete,
            Ok(allowed) => Next::Allowed(TokenMask::new(allowed, self.eos, &self.stop_ids)),
            Err(e) => Next::Failed(e.to_string()),
        }
    }

    /// How many of `draft`'s tokens the grammar accepts after `output` (a speculative
    /// draft is cut there: a guess the mask would forbid can never be kept).
    pub fn valid_prefix(&self, output: &[u32], draft: &[u32]) -> usize {
        let mut cursor = self.lock();
        if cursor.sync(&self.initial, output).is_err() {
            *cursor = Cursor::fresh(&self.initial);
            return 0;
        }
        if cursor.matcher.is_stopped() {
            return 0;
        }
        // The request's stop tokens stand for the grammar's end-of-sequence in its mask.
        let eos = self.eos;
        let mapped: Vec<u32> = draft.iter().map(|t| if self.stop_ids.contains(t) { eos } else { *t }).collect();
        cursor.matcher.validate_tokens(&mapped).unwrap_or(0)
    }

    /// A thread that panicked while holding the lock (an injected fault, a parser
    /// bug) may have left the state half-updated: start over from the grammar.
    fn lock(&self) -> MutexGuard<'_, Cursor> {
        self.cursor.lock().unwrap_or_else(|poisoned| {
            self.cursor.clear_poison();
            let mut cursor = poisoned.into_inner();
            *cursor = Cursor::fresh(&self.initial);
            cursor
        })
    }
}

//! The safe-cut rule: byte positions `p` of a text where full tokenization provably equals
//! tokenizing `text[..p]` and `text[p..]` separately and concatenating. Three facts make that
//! hold, and each rule below is chosen so that all three do:
//!
//! 1. The split regex ends a pre-token at `p` and no match before `p` looks past it (no
//!    alternative crosses, no lookahead reaches `p`); the regexes have no lookbehind, so the
//!    matches from `p` on are those of `text[p..]` alone.
//! 2. NFC cannot merge across `p`: the character at `p` is ASCII, and no canonical composition
//!    has an ASCII second element (nor can marks reorder across a starter).
//! 3. No added token's occurrence straddles `p` (added tokens are cut out of the raw text first).
//!
//! The rules (for the regex families of `eligibility.rs`):
//! - a space after a non-whitespace character;
//! - ASCII punctuation other than `'` after an ASCII letter or digit (`'` could start `'s`);
//! - a printable ASCII character other than `/` after a newline; for GPT-2's regex the newline
//!   must not follow whitespace (`\s+(?!\S)` keeps a text-final run like ` \n` whole).

use std::collections::HashMap;

use super::eligibility::RegexFamily;

/// Decides safe cuts for one tokenizer.
#[derive(Debug, Clone)]
pub struct CutRule {
    family: RegexFamily,
    guard: AddedTokenGuard,
}

impl CutRule {
    pub fn new(family: RegexFamily, guard: AddedTokenGuard) -> Self {
        CutRule { family, guard }
    }

    pub fn family(&self) -> RegexFamily {
        self.family
    }

    /// True when `p` is a safe cut of `text` (never at either end).
    pub fn is_safe_cut(&self, text: &str, p: usize) -> bool {
        let bytes = text.as_bytes();
        if p == 0 || p >= bytes.len() || !bytes[p].is_ascii() {
            return false;
        }
        // An ASCII byte at `p` is a character boundary, so `..p` slices cleanly.
        let Some(prev) = text[..p].chars().next_back() else { return false };
        self.regex_boundary_is_fixed(bytes, p, prev) && !self.guard.straddles(bytes, p)
    }

    fn regex_boundary_is_fixed(&self, bytes: &[u8], p: usize, prev: char) -> bool {
        let next = bytes[p];
        match next {
            b' ' => !prev.is_whitespace(),
            b'\'' => false,
            _ if next.is_ascii_punctuation() && prev.is_ascii_alphanumeric() => true,
            _ if prev == '\n' && next.is_ascii_graphic() && next != b'/' => self.newline_run_ends_cleanly(bytes, p),
            _ => false,
        }
    }

    /// `bytes[p - 1]` is a newline followed by a non-space.
    fn newline_run_ends_cleanly(&self, bytes: &[u8], p: usize) -> bool {
        match self.family {
            // `\s*[\r\n]+` takes the whole run through its last newline, text-final or not.
            RegexFamily::Cl100k | RegexFamily::Qwen2 => true,
            RegexFamily::Gpt2 => p < 2 || !is_whitespace_before(bytes, p - 1),
        }
    }
}

/// Whether the character ending at byte `end` is whitespace.
fn is_whitespace_before(bytes: &[u8], end: usize) -> bool {
    let start = (0..end).rev().find(|&i| (bytes[i] as i8) >= -0x40).unwrap_or(0);
    std::str::from_utf8(&bytes[start..end]).ok().and_then(|s| s.chars().next()).is_some_and(char::is_whitespace)
}

/// Finds added-token occurrences across a position in O(1) expected time: each adjacent byte
/// pair of each token's content is indexed with the offset it sits at, so a cut between
/// `bytes[p - 1]` and `bytes[p]` is checked only against the tokens that have that pair.
#[derive(Debug, Clone, Default)]
pub struct AddedTokenGuard {
    contents: Vec<Box<[u8]>>,
    /// (byte before the cut, byte after) → (content index, bytes of the content before the cut).
    by_pair: HashMap<[u8; 2], Vec<(usize, usize)>>,
}

impl AddedTokenGuard {
    pub fn new(contents: impl IntoIterator<Item = String>) -> Self {
        let mut guard = AddedTokenGuard::default();
        for content in contents {
            let bytes: Box<[u8]> = content.into_bytes().into_boxed_slice();
            let index = guard.contents.len();
            for split in 1..bytes.len() {
                guard.by_pair.entry([bytes[split - 1], bytes[split]]).or_default().push((index, split));
            }
            guard.contents.push(bytes);
        }
        guard
    }

    /// True when some added token's text occurs in `bytes` covering both `p - 1` and `p`.
    pub fn straddles(&self, bytes: &[u8], p: usize) -> bool {
        let Some(candidates) = self.by_pair.get(&[bytes[p - 1], bytes[p]]) else { return false };
        candidates.iter().any(|&(index, split)| {
            let content = &self.contents[index];
            p >= split && bytes.get(p - split..p - split + content.len()) == Some(&content[..])
        })
    }
}

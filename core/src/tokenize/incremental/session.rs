//! One session's cached state: the last text, its token ids (without the post-processor's
//! special tokens) and the byte offset where each token starts. Continuations truncate and
//! extend these buffers in place.

/// The cached tokenization of a session's latest text.
#[derive(Debug, Clone, Default)]
pub struct Session {
    text: String,
    ids: Vec<u32>,
    /// `starts[i]`: byte offset in `text` where token `i` begins (non-decreasing; tokens that
    /// split one character share its start).
    starts: Vec<u32>,
}

impl Session {
    pub fn text(&self) -> &str {
        &self.text
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// Memory held, for the store's byte limit.
    pub fn bytes(&self) -> usize {
        self.text.capacity() + 4 * (self.ids.capacity() + self.starts.capacity())
    }

    /// The index of the token that starts exactly at byte `p`, if one does.
    pub fn token_starting_at(&self, p: usize) -> Option<usize> {
        let k = self.starts.partition_point(|&s| (s as usize) < p);
        (self.starts.get(k).is_some_and(|&s| s as usize == p)).then_some(k)
    }

    /// Keeps text and tokens before byte `cut` (token `kept` starts there) and appends
    /// `tail`, whose tokens the caller then pushes with [`Self::push_token`].
    pub fn truncate_to(&mut self, cut: usize, kept: usize, tail: &str) {
        self.text.truncate(cut);
        self.text.push_str(tail);
        self.ids.truncate(kept);
        self.starts.truncate(kept);
    }

    /// Starts over with `text` (full tokenization); buffers keep their capacity.
    pub fn reset(&mut self, text: &str) {
        self.truncate_to(0, 0, text);
    }

    pub fn push_token(&mut self, id: u32, start: usize) {
        self.ids.push(id);
        self.starts.push(start as u32);
    }

    pub fn reserve_tokens(&mut self, additional: usize) {
        self.ids.reserve(additional);
        self.starts.reserve(additional);
    }
}

/// Length in bytes of the longest common prefix of `a` and `b`, at a character boundary of
/// both. Compares in blocks first: sessions are long and differ only near their end.
pub fn common_prefix_len(a: &str, b: &str) -> usize {
    const BLOCK: usize = 4096;
    let (x, y) = (a.as_bytes(), b.as_bytes());
    let limit = x.len().min(y.len());
    let mut i = 0;
    while i + BLOCK <= limit && x[i..i + BLOCK] == y[i..i + BLOCK] {
        i += BLOCK;
    }
    while i < limit && x[i] == y[i] {
        i += 1;
    }
    // Equal bytes up to `i`; a character boundary in one is one in the other.
    while !a.is_char_boundary(i) {
        i -= 1;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_stops_at_a_character_boundary() {
        assert_eq!(common_prefix_len("abc", "abd"), 2);
        assert_eq!(common_prefix_len("abc", "abc"), 3);
        assert_eq!(common_prefix_len("ab", "abc"), 2);
        // é (C3 A9) vs è (C3 A8): the shared lead byte is not a boundary.
        assert_eq!(common_prefix_len("xé", "xè"), 1);
        let long = "a".repeat(10_000);
        assert_eq!(common_prefix_len(&format!("{long}x"), &format!("{long}y")), 10_000);
    }

    #[test]
    fn token_lookup_needs_an_exact_start() {
        let mut s = Session::default();
        s.reset("ab cd");
        for (id, start) in [(1, 0), (2, 2), (3, 2), (4, 3)] {
            s.push_token(id, start);
        }
        assert_eq!(s.token_starting_at(2), Some(1));
        assert_eq!(s.token_starting_at(3), Some(3));
        assert_eq!(s.token_starting_at(1), None);
        assert_eq!(s.token_starting_at(9), None);
        s.truncate_to(2, 1, "!");
        assert_eq!((s.text(), s.ids()), ("ab!", &[1][..]));
    }
}

//! Finding where the text being generated has been seen before.

/// The longest earlier occurrence in `corpus` of a tail of `pattern`, at least
/// `min_len` and at most `max_len` tokens long, that `corpus` continues past: returns
/// where the continuation starts in `corpus` and the match's length. Among matches of
/// one length the one ending nearest at or after `near` wins, else the latest (recent
/// text is the likelier to repeat). `corpus` may be `pattern` itself: a match then
/// never is the tail itself, since that has no continuation.
pub fn longest_match(
    corpus: &[u32],
    pattern: &[u32],
    min_len: usize,
    max_len: usize,
    near: Option<usize>,
) -> Option<(usize, usize)> {
    let &last = pattern.last()?;
    let min_len = min_len.max(1);
    let mut best: Option<(usize, usize)> = None;
    // `end` is one past the match: the continuation's first token.
    for end in 1..corpus.len() {
        if corpus[end - 1] != last {
            continue;
        }
        let reach = max_len.min(end).min(pattern.len());
        let length = 1 + (1..reach).take_while(|&k| corpus[end - 1 - k] == pattern[pattern.len() - 1 - k]).count();
        if length < min_len {
            continue;
        }
        best = match best {
            Some((b_end, b_len)) if b_len > length || (b_len == length && !closer(end, b_end, near)) => best,
            _ => Some((end, length)),
        };
    }
    best
}

/// Whether `a` beats `b` as a continuation start: at or after `near` and nearer it, else later.
fn closer(a: usize, b: usize, near: Option<usize>) -> bool {
    match near {
        None => a > b,
        Some(n) => match (a >= n, b >= n) {
            (true, true) => a < b,
            (true, false) => true,
            (false, true) => false,
            (false, false) => a > b,
        },
    }
}

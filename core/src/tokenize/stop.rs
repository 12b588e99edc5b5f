//! `StopMatcher`: OpenAI `stop` strings on streamed text. A stop string can arrive split over several
//! deltas, so the matcher holds back the longest tail that could still begin one, and emits the rest.
//! On a match it emits the text before the stop string (which is itself not returned) and reports it.
//!
//! When several stop strings match, the one that is complete first as the text flows wins (earliest
//! end; at equal ends the longer one), so the outcome does not depend on how the text was chunked.

/// Which stop string ended the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StopMatch {
    /// Position in the list given to [`StopMatcher::new`].
    pub index: usize,
    pub stop: String,
}

/// The result of one [`StopMatcher::push`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that is safe to send to the client now.
    pub text: String,
    /// Set once a stop string matched: generation should end, `text` is the last of the output.
    pub stop: Option<StopMatch>,
}

#[derive(Debug, Clone)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// Empty stop strings are ignored (they would match before any text).
    pub fn new<S: Into<String>>(stops: impl IntoIterator<Item = S>) -> Self {
        let stops = stops.into_iter().map(Into::into).filter(|s: &String| !s.is_empty()).collect();
        Self { stops, held: String::new(), stopped: false }
    }

    /// Adds a delta of streamed text. After a match every further push returns nothing.
    pub fn push(&mut self, delta: &str) -> StopStep {
        if self.stopped {
            return StopStep::default();
        }
        self.held.push_str(delta);
        if let Some((start, index)) = self.first_complete_stop() {
            self.stopped = true;
            let mut text = std::mem::take(&mut self.held);
            text.truncate(start);
            return StopStep { text, stop: Some(StopMatch { index, stop: self.stops[index].clone() }) };
        }
        let keep = self.possible_stop_start_len();
        let text = self.held.drain(..self.held.len() - keep).collect();
        StopStep { text, stop: None }
    }

    /// The held-back text, at the end of generation (no stop string can complete any more).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// Bytes currently held back.
    pub fn held_len(&self) -> usize {
        self.held.len()
    }

    /// (start byte, stop index) of the match that ends first, the longer one on ties.
    fn first_complete_stop(&self) -> Option<(usize, usize)> {
        self.stops
            .iter()
            .enumerate()
            .filter_map(|(index, stop)| self.held.find(stop.as_str()).map(|start| (start + stop.len(), start, index)))
            .min()
            .map(|(_, start, index)| (start, index))
    }

    /// Length of the longest tail of the held text that is a proper prefix of some stop string.
    fn possible_stop_start_len(&self) -> usize {
        held_prefix_len(&self.held, &self.stops)
    }
}

/// Length of the longest tail of `text` that is a proper prefix of one of `patterns`:
/// the text to hold back, since the next piece may complete that pattern. Never splits
/// a character.
pub fn held_prefix_len<S: AsRef<str>>(text: &str, patterns: &[S]) -> usize {
    let longest = patterns.iter().map(|p| p.as_ref().len()).max().unwrap_or(0);
    let max_tail = longest.saturating_sub(1).min(text.len());
    (1..=max_tail)
        .rev()
        .filter(|&tail| text.is_char_boundary(text.len() - tail))
        .find(|&tail| {
            let suffix = &text[text.len() - tail..];
            patterns.iter().any(|p| p.as_ref().starts_with(suffix))
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes all deltas, then finishes; returns the emitted text and the stop.
    fn run(stops: &[&str], deltas: &[&str]) -> (String, Option<StopMatch>) {
        let mut matcher = StopMatcher::new(stops.iter().copied());
        let mut out = String::new();
        for delta in deltas {
            let step = matcher.push(delta);
            out.push_str(&step.text);
            if step.stop.is_some() {
                return (out, step.stop);
            }
        }
        out.push_str(&matcher.finish());
        (out, None)
    }

    fn matched(index: usize, stop: &str) -> Option<StopMatch> {
        Some(StopMatch { index, stop: stop.into() })
    }

    #[test]
    fn stop_split_across_two_and_three_deltas() {
        assert_eq!(run(&["STOP"], &["Hello ST", "OP world"]), ("Hello ".into(), matched(0, "STOP")));
        assert_eq!(run(&["</answer>"], &["x</an", "sw", "er>tail"]), ("x".into(), matched(0, "</answer>")));
    }

    #[test]
    fn only_a_possible_stop_start_is_held_back() {
        let mut matcher = StopMatcher::new(["STOP"]);
        assert_eq!(matcher.push("Hello S").text, "Hello ");
        assert_eq!(matcher.held_len(), 1);
        assert_eq!(matcher.push("Tx").text, "STx");
        assert_eq!(matcher.held_len(), 0);
        assert_eq!(matcher.push("plain").text, "plain");
    }

    #[test]
    fn a_false_start_followed_by_the_real_one() {
        assert_eq!(run(&["abc"], &["xab", "abc", "z"]), ("xab".into(), matched(0, "abc")));
        assert_eq!(run(&["aab"], &["a", "a", "a", "b"]), ("a".into(), matched(0, "aab")));
    }

    #[test]
    fn overlapping_candidates_pick_the_first_complete() {
        // "y" completes before "xyz" could, whatever the chunking.
        assert_eq!(run(&["xyz", "y"], &["axyz"]), ("ax".into(), matched(1, "y")));
        assert_eq!(run(&["xyz", "y"], &["ax", "y", "z"]), ("ax".into(), matched(1, "y")));
        // Equal ends: the longer stop, which started earlier.
        assert_eq!(run(&["b", "ab"], &["cab"]), ("c".into(), matched(1, "ab")));
        assert_eq!(run(&["b", "ab"], &["ca", "b"]), ("c".into(), matched(1, "ab")));
    }

    #[test]
    fn multiple_stop_strings_report_which_one() {
        assert_eq!(run(&["\n\n", "END"], &["one\n", "two E", "ND"]), ("one\ntwo ".into(), matched(1, "END")));
        assert_eq!(run(&["\n\n", "END"], &["one\n", "\ntwo"]), ("one".into(), matched(0, "\n\n")));
    }

    #[test]
    fn empty_list_and_empty_strings_never_stop_or_hold() {
        let mut matcher = StopMatcher::new(Vec::<String>::new());
        assert_eq!(matcher.push("anything").text, "anything");
        assert_eq!(run(&[""], &["a", "b"]), ("ab".into(), None));
    }

    #[test]
    fn unicode_is_never_split_and_matches_across_deltas() {
        assert_eq!(run(&["世界"], &["你好世", "界!"]), ("你好".into(), matched(0, "世界")));
        let mut matcher = StopMatcher::new(["éa"]);
        assert_eq!(matcher.push("café").text, "caf");
        assert_eq!(matcher.push("b").text, "éb");
        assert_eq!(run(&["🙂!"], &["x🙂", "🙂", "!"]), ("x🙂".into(), matched(0, "🙂!")));
    }

    #[test]
    fn finish_flushes_and_pushes_after_a_stop_return_nothing() {
        assert_eq!(run(&["STOP"], &["end ST"]), ("end ST".into(), None));
        let mut matcher = StopMatcher::new(["x"]);
        assert!(matcher.push("axb").stop.is_some());
        assert!(matcher.is_stopped());
        assert_eq!(matcher.push("more"), StopStep::default());
        assert_eq!(matcher.finish(), "");
    }

    #[test]
    fn chunking_never_changes_the_outcome() {
        let text = "the answer is 42</s> and then aab more";
        let stops = ["</s>", "aab", "42<"];
        let whole = run(&stops, &[text]);
        for size in 1..8 {
            let chars: Vec<char> = text.chars().collect();
            let deltas: Vec<String> = chars.chunks(size).map(|c| c.iter().collect()).collect();
            let refs: Vec<&str> = deltas.iter().map(String::as_str).collect();
            assert_eq!(run(&stops, &refs), whole, "chunk size {size}");
        }
        // "42<" is complete before "</s>" is, though "</s>" is listed first.
        assert_eq!(whole, ("the answer is ".into(), matched(2, "42<")));
    }
}

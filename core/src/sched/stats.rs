//! One subserver's cumulative counters: what it served, and what its steps cost against
//! their rows and against the tokens they fed (the planner's latency model reads both).

use std::ops::{Add, Sub};
use std::time::Duration;

#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct SubserverStats {
    pub steps: u64,
    pub rows: u64,
    pub tokens_fed: u64,
    pub tokens_committed: u64,
    pub handoffs_out: u64,
    pub handoffs_in: u64,
    pub evictions: u64,
    /// Tokens that requests with no K/V here could have reused from the prefix cache
    /// (whole blocks before their last token), and the tokens they did reuse.
    pub prefix_lookup_tokens: u64,
    pub prefix_hit_tokens: u64,
    /// Speculative decoding: rows that verified a draft, the tokens drafted for them
    /// and the drafted tokens kept.
    pub verify_rows: u64,
    pub drafted_tokens: u64,
    pub accepted_draft_tokens: u64,
    /// Draft-model speculation: rounds this model asked of its draft model, and (on a
    /// draft model) the guesses it sampled for others.
    pub draft_rounds: u64,
    pub drafts_sampled: u64,
    pub busy: Duration,
    /// Requests handed to each peer, by destination model.
    pub handoffs_to: Vec<u64>,
    /// Steps and their total seconds by the rows they ran (index = rows).
    pub steps_by_rows: Vec<u64>,
    pub seconds_by_rows: Vec<f64>,
    /// Steps, their seconds and the tokens they fed, by half-octave of tokens fed
    /// (index = [`token_bucket`]): a step's cost against its tokens, which is what a
    /// large model's extends (ten tokens a row, not one) make differ from its rows.
    pub steps_by_tokens: Vec<u64>,
    pub seconds_by_tokens: Vec<f64>,
    pub tokens_by_bucket: Vec<u64>,
}

/// Half-octave buckets: 1, 2, 3, 4–5, 6–7, 8–11, 12–15, 16–23, … tokens.
pub fn token_bucket(tokens: usize) -> usize {
    let tokens = tokens.max(1);
    let octave = tokens.ilog2() as usize;
    let upper_half = octave > 0 && 2 * tokens >= 3 << octave;
    2 * octave + usize::from(upper_half)
}

fn elementwise<T: Copy + Default>(a: &[T], b: &[T], f: impl Fn(T, T) -> T) -> Vec<T> {
    (0..a.len().max(b.len()))
        .map(|i| f(a.get(i).copied().unwrap_or_default(), b.get(i).copied().unwrap_or_default()))
        .collect()
}

fn minus<T: Copy + Default + PartialOrd + Sub<Output = T>>(a: &[T], b: &[T]) -> Vec<T> {
    elementwise(a, b, |x, y| if x > y { x - y } else { T::default() })
}

fn plus<T: Copy + Default + Add<Output = T>>(a: &[T], b: &[T]) -> Vec<T> {
    elementwise(a, b, |x, y| x + y)
}

fn bump<T: Copy + Default + Add<Output = T>>(v: &mut Vec<T>, index: usize, by: T) {
    if v.len() <= index {
        v.resize(index + 1, T::default());
    }
    v[index] = v[index] + by;
}

impl SubserverStats {
    /// What happened between `earlier` and this snapshot of the same subserver.
    pub fn since(&self, earlier: &SubserverStats) -> SubserverStats {
        SubserverStats {
            steps: self.steps.saturating_sub(earlier.steps),
            rows: self.rows.saturating_sub(earlier.rows),
            tokens_fed: self.tokens_fed.saturating_sub(earlier.tokens_fed),
            tokens_committed: self.tokens_committed.saturating_sub(earlier.tokens_committed),
            handoffs_out: self.handoffs_out.saturating_sub(earlier.handoffs_out),
            handoffs_in: self.handoffs_in.saturating_sub(earlier.handoffs_in),
            evictions: self.evictions.saturating_sub(earlier.evictions),
            prefix_lookup_tokens: self.prefix_lookup_tokens.saturating_sub(earlier.prefix_lookup_tokens),
            prefix_hit_tokens: self.prefix_hit_tokens.saturating_sub(earlier.prefix_hit_tokens),
            verify_rows: self.verify_rows.saturating_sub(earlier.verify_rows),
            drafted_tokens: self.drafted_tokens.saturating_sub(earlier.drafted_tokens),
            accepted_draft_tokens: self.accepted_draft_tokens.saturating_sub(earlier.accepted_draft_tokens),
            draft_rounds: self.draft_rounds.saturating_sub(earlier.draft_rounds),
            drafts_sampled: self.drafts_sampled.saturating_sub(earlier.drafts_sampled),
            busy: self.busy.saturating_sub(earlier.busy),
            handoffs_to: minus(&self.handoffs_to, &earlier.handoffs_to),
            steps_by_rows: minus(&self.steps_by_rows, &earlier.steps_by_rows),
            seconds_by_rows: minus(&self.seconds_by_rows, &earlier.seconds_by_rows),
            steps_by_tokens: minus(&self.steps_by_tokens, &earlier.steps_by_tokens),
            seconds_by_tokens: minus(&self.seconds_by_tokens, &earlier.seconds_by_tokens),
            tokens_by_bucket: minus(&self.tokens_by_bucket, &earlier.tokens_by_bucket),
        }
    }

    /// The counters of two windows together.
    pub fn plus(&self, other: &SubserverStats) -> SubserverStats {
        SubserverStats {
            steps: self.steps + other.steps,
            rows: self.rows + other.rows,
            tokens_fed: self.tokens_fed + other.tokens_fed,
            tokens_committed: self.tokens_committed + other.tokens_committed,
            handoffs_out: self.handoffs_out + other.handoffs_out,
            handoffs_in: self.handoffs_in + other.handoffs_in,
            evictions: self.evictions + other.evictions,
            prefix_lookup_tokens: self.prefix_lookup_tokens + other.prefix_lookup_tokens,
            prefix_hit_tokens: self.prefix_hit_tokens + other.prefix_hit_tokens,
            verify_rows: self.verify_rows + other.verify_rows,
            drafted_tokens: self.drafted_tokens + other.drafted_tokens,
            accepted_draft_tokens: self.accepted_draft_tokens + other.accepted_draft_tokens,
            draft_rounds: self.draft_rounds + other.draft_rounds,
            drafts_sampled: self.drafts_sampled + other.drafts_sampled,
            busy: self.busy + other.busy,
            handoffs_to: plus(&self.handoffs_to, &other.handoffs_to),
            steps_by_rows: plus(&self.steps_by_rows, &other.steps_by_rows),
            seconds_by_rows: plus(&self.seconds_by_rows, &other.seconds_by_rows),
            steps_by_tokens: plus(&self.steps_by_tokens, &other.steps_by_tokens),
            seconds_by_tokens: plus(&self.seconds_by_tokens, &other.seconds_by_tokens),
            tokens_by_bucket: plus(&self.tokens_by_bucket, &other.tokens_by_bucket),
        }
    }

    /// Counts one step of `rows` rows feeding `tokens` tokens (totals are kept by the caller).
    pub fn record_step(&mut self, rows: usize, tokens: usize, elapsed: Duration) {
        if rows == 0 {
            return;
        }
        let seconds = elapsed.as_secs_f64();
        bump(&mut self.steps_by_rows, rows, 1);
        bump(&mut self.seconds_by_rows, rows, seconds);
        let bucket = token_bucket(tokens);
        bump(&mut self.steps_by_tokens, bucket, 1);
        bump(&mut self.seconds_by_tokens, bucket, seconds);
        bump(&mut self.tokens_by_bucket, bucket, tokens as u64);
    }

    /// Counts one verified draft.
    pub fn record_verify(&mut self, drafted: usize, accepted: usize) {
        self.verify_rows += 1;
        self.drafted_tokens += drafted as u64;
        self.accepted_draft_tokens += accepted as u64;
    }

    /// Mean tokens a row fed here (1 for plain decodes; a large model's extends after
    /// delegations feed the tokens its peer wrote meanwhile).
    pub fn tokens_per_row(&self) -> Option<f64> {
        (self.rows > 0 && self.tokens_fed > 0).then(|| self.tokens_fed as f64 / self.rows as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_half_octaves() {
        let buckets: Vec<usize> = [1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 16, 24, 1024].map(token_bucket).to_vec();
        assert_eq!(buckets, vec![0, 2, 3, 4, 4, 5, 5, 6, 6, 7, 8, 9, 20]);
        assert_eq!(token_bucket(0), 0);
    }

    #[test]
    fn a_window_is_the_difference_and_two_windows_add_back() {
        let mut earlier = SubserverStats::default();
        earlier.record_step(2, 2, Duration::from_millis(10));
        let mut later = earlier.clone();
        later.record_step(4, 40, Duration::from_millis(30));
        later.record_step(2, 2, Duration::from_millis(12));
        let window = later.since(&earlier);
        assert_eq!(window.steps_by_rows, vec![0, 0, 1, 0, 1]);
        assert_eq!(window.steps_by_tokens[token_bucket(40)], 1);
        assert_eq!(window.tokens_by_bucket[token_bucket(40)], 40);
        assert!((window.seconds_by_tokens[token_bucket(2)] - 0.012).abs() < 1e-9);
        let back = earlier.plus(&window);
        assert_eq!((&back.steps_by_rows, &back.steps_by_tokens), (&later.steps_by_rows, &later.steps_by_tokens));
        assert_eq!(back.tokens_by_bucket, later.tokens_by_bucket);
        for (a, b) in back.seconds_by_tokens.iter().zip(&later.seconds_by_tokens) {
            assert!((a - b).abs() < 1e-12);
        }
    }
}

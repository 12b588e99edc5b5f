//! Churn for soak tests: which streamed requests the client hangs up on, and at
//! which point, and how every request ended. A server that leaks shows it under
//! churn: each hang-up must free the request's KV and reservations as a finish does.

use serde::{Deserialize, Serialize};
use tokenrouter_core::rng::{mix64, unit_f64, SplitMix64};

/// Keeps the hang-up draws apart from the other uses of `--seed`.
const HANGUP_SALT: u64 = 0x6861_6e67_7570;

/// Errors of requests the run itself abandoned (the time limit, an interrupt) begin so.
pub const CUT_PREFIX: &str = "cut:";

/// Whether the client hangs up on request `index`, and after how many received
/// tokens: `Some(k)` with k uniform in 0..max_tokens (0: as soon as the response
/// head arrives), so every point before the last token is as likely. `fraction` of
/// requests are chosen; the same seed chooses the same ones.
pub fn hangup_after(fraction: f64, max_tokens: usize, seed: u64, index: usize) -> Option<u64> {
    if fraction <= 0.0 {
        return None;
    }
    let mut rng = SplitMix64(mix64(seed ^ HANGUP_SALT) ^ index as u64);
    let (chosen, point) = (unit_f64(rng.next_u64()), unit_f64(rng.next_u64()));
    (chosen < fraction).then(|| (point * max_tokens.max(1) as f64) as u64)
}

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fate {
    /// Its final event arrived, without an error.
    Completed,
    /// The client dropped it on purpose (`--hangup-fraction`).
    HungUp,
    /// The run abandoned it at its time limit or an interrupt.
    Cut,
    /// Anything else: an error event, a stream that ended before its final event,
    /// a non-2xx answer, a broken connection. A healthy server loses none.
    Lost,
}

impl Fate {
    pub fn of(ok: bool, hung_up: bool, error: Option<&str>) -> Fate {
        if hung_up {
            Fate::HungUp
        } else if ok {
            Fate::Completed
        } else if error.is_some_and(|e| e.starts_with(CUT_PREFIX)) {
            Fate::Cut
        } else {
            Fate::Lost
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hangups_take_the_asked_fraction_at_uniform_points() {
        let max_tokens = 10;
        let points: Vec<u64> = (0..20_000).filter_map(|i| hangup_after(0.3, max_tokens, 7, i)).collect();
        let fraction = points.len() as f64 / 20_000.0;
        assert!((fraction - 0.3).abs() < 0.015, "{fraction}");
        let mut counts = [0usize; 10];
        for &k in &points {
            counts[k as usize] += 1;
        }
        let expected = points.len() as f64 / 10.0;
        for (k, &n) in counts.iter().enumerate() {
            assert!((n as f64 - expected).abs() < 0.12 * expected, "point {k}: {n} vs {expected}");
        }
    }

    #[test]
    fn hangups_are_reproducible_and_off_at_zero() {
        let a: Vec<_> = (0..100).map(|i| hangup_after(0.5, 32, 1, i)).collect();
        let b: Vec<_> = (0..100).map(|i| hangup_after(0.5, 32, 1, i)).collect();
        let other: Vec<_> = (0..100).map(|i| hangup_after(0.5, 32, 2, i)).collect();
        assert_eq!(a, b);
        assert_ne!(a, other, "another seed, other requests");
        assert!((0..1000).all(|i| hangup_after(0.0, 32, 1, i).is_none()));
        assert!((0..1000).all(|i| hangup_after(1.0, 32, 1, i).is_some()));
        assert!((0..1000).all(|i| hangup_after(1.0, 1, 1, i) == Some(0)), "one token: hang up at the head");
    }

    #[test]
    fn fates_put_the_blame_where_it_belongs() {
        assert_eq!(Fate::of(true, false, None), Fate::Completed);
        assert_eq!(Fate::of(false, true, Some("hung up")), Fate::HungUp);
        assert_eq!(Fate::of(false, false, Some("cut: still running at the time limit")), Fate::Cut);
        for lost in
            ["HTTP 500: internal error", "the stream ended before [DONE]", "engine failed", "reading the stream"]
        {
            assert_eq!(Fate::of(false, false, Some(lost)), Fate::Lost, "{lost}");
        }
    }
}

//! Measures by turn for multi-turn workloads (`agentic`): each session resends its
//! whole conversation, so turn k's prompt holds turn k-1's. With a prefix cache the
//! server computes only what is new, and TTFT from the second turn on shows it. The
//! turns of every session are pooled by index: turn 1 of all sessions, turn 2, ...

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::record::RequestRecord;
use crate::stats::Distribution;

/// The completed requests of one turn index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TurnStats {
    /// 1-based: a session's first request is turn 1.
    pub turn: usize,
    /// Completed requests of this turn (TTFT and the means are over these).
    pub requests: usize,
    /// Time to first token, seconds; absent when none came.
    pub ttft_s: Option<Distribution>,
    /// The server's `usage.prompt_tokens`.
    pub mean_prompt_tokens: f64,
    /// `usage.prompt_tokens_details.cached_tokens` (absent counts as 0).
    pub mean_cached_tokens: f64,
}

/// One entry per turn index, in order; empty unless some session has a second turn.
pub fn by_turn(records: &[RequestRecord]) -> Vec<TurnStats> {
    if records.iter().all(|r| r.turn == 0) {
        return Vec::new();
    }
    let mut turns: BTreeMap<usize, Vec<&RequestRecord>> = BTreeMap::new();
    for r in records {
        let done = turns.entry(r.turn).or_default();
        if r.ok {
            done.push(r);
        }
    }
    turns.into_iter().map(|(turn, done)| turn_stats(turn + 1, &done)).collect()
}

fn turn_stats(turn: usize, done: &[&RequestRecord]) -> TurnStats {
    let mean = |f: fn(&RequestRecord) -> u64| match done.len() {
        0 => 0.0,
        n => done.iter().map(|r| f(r) as f64).sum::<f64>() / n as f64,
    };
    TurnStats {
        turn,
        requests: done.len(),
        ttft_s: Distribution::of(done.iter().filter_map(|r| r.ttft_s)),
        mean_prompt_tokens: mean(|r| r.prompt_tokens),
        mean_cached_tokens: mean(|r| r.cached_tokens),
    }
}

/// The table printed under the summary (nothing for single-turn runs).
pub fn render(turns: &[TurnStats]) -> String {
    if turns.is_empty() {
        return String::new();
    }
    let mut out = String::from("TTFT by turn:\n  turn  done    p50 (ms)    p99 (ms)  prompt tok  cached tok\n");
    for t in turns {
        let (p50, p99) = match &t.ttft_s {
            Some(d) => (format!("{:.1}", d.p50 * 1e3), format!("{:.1}", d.p99 * 1e3)),
            None => ("n/a".to_string(), "n/a".to_string()),
        };
        out.push_str(&format!(
            "  {:>4}  {:>4}  {:>10}  {:>10}  {:>10.1}  {:>10.1}\n",
            t.turn, t.requests, p50, p99, t.mean_prompt_tokens, t.mean_cached_tokens
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(job: u64, turn: usize, ok: bool, ttft: f64, prompt: u64, cached: u64) -> RequestRecord {
        RequestRecord {
            index: 0,
            job,
            turn,
            start_s: 0.0,
            ok,
            ttft_s: Some(ttft),
            latency_s: ttft * 2.0,
            prompt_tokens: prompt,
            cached_tokens: cached,
            turn_tokens: 10,
            output_tokens: 4,
            streamed_tokens: None,
            max_tokens: 4,
            tokens_per_s: 1.0,
            tokens_per_model: BTreeMap::new(),
            finish_reason: None,
            error: (!ok).then(|| "HTTP 500: boom".to_string()),
            hung_up: false,
        }
    }

    #[test]
    fn turns_are_pooled_by_index_across_sessions_and_numbered_from_one() {
        let records = [
            record(0, 0, true, 1.0, 100, 0),
            record(1, 0, true, 3.0, 100, 0),
            record(0, 1, true, 0.2, 150, 96),
            record(1, 1, true, 0.4, 150, 112),
            record(0, 2, true, 0.5, 200, 144),
        ];
        let turns = by_turn(&records);
        assert_eq!(turns.iter().map(|t| (t.turn, t.requests)).collect::<Vec<_>>(), [(1, 2), (2, 2), (3, 1)]);
        let first = turns[0].ttft_s.unwrap();
        assert!(first.p50 == 2.0 && (first.p99 - 2.98).abs() < 1e-12, "{first:?}");
        let second = turns[1].ttft_s.unwrap();
        assert!((second.p50 - 0.3).abs() < 1e-12 && (second.p99 - 0.398).abs() < 1e-12, "{second:?}");
        assert_eq!((turns[0].mean_cached_tokens, turns[1].mean_cached_tokens), (0.0, 104.0));
        assert_eq!((turns[1].mean_prompt_tokens, turns[2].mean_cached_tokens), (150.0, 144.0));
        assert_eq!(turns[2].ttft_s.unwrap().p99, 0.5);
    }

    #[test]
    fn failed_requests_are_left_out_but_their_turn_is_listed() {
        let records = [record(0, 0, true, 1.0, 100, 0), record(1, 0, false, 9.0, 0, 0), record(0, 1, false, 9.0, 0, 0)];
        let turns = by_turn(&records);
        assert_eq!(turns.len(), 2);
        assert_eq!((turns[0].requests, turns[0].ttft_s.unwrap().p99), (1, 1.0));
        assert_eq!((turns[1].turn, turns[1].requests, turns[1].ttft_s), (2, 0, None));
        assert_eq!(turns[1].mean_cached_tokens, 0.0);
        let text = render(&turns);
        assert!(text.lines().nth(3).unwrap().contains("n/a"), "{text}");
    }

    #[test]
    fn single_turn_runs_have_no_table() {
        let records = [record(0, 0, true, 1.0, 100, 0), record(1, 0, true, 2.0, 100, 0)];
        assert!(by_turn(&records).is_empty());
        assert_eq!(render(&[]), "");
    }

    #[test]
    fn the_table_shows_milliseconds_and_token_means() {
        let records = [record(0, 0, true, 1.5, 100, 0), record(0, 1, true, 0.25, 150, 128)];
        let text = render(&by_turn(&records));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        let row: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(row, ["2", "1", "250.0", "250.0", "150.0", "128.0"]);
        assert!(lines[2].split_whitespace().eq(["1", "1", "1500.0", "1500.0", "100.0", "0.0"]), "{text}");
    }
}

//! The run's summary: throughput as the published benchmarks define it (total
//! output tokens / elapsed time), latency and TTFT percentiles, per-user speed,
//! tokens per model and failures by message.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use tokenrouter_core::stats::{quantile_of_sorted, Samples};

use crate::churn::Fate;
use crate::record::RequestRecord;
use crate::turns::{self, TurnStats};

/// The `q`-quantile (0..=1) of sorted values, interpolating linearly between
/// ranks (NumPy's default), so p50 of an even count is the middle pair's mean.
pub fn quantile(sorted: &[f64], q: f64) -> Option<f64> {
    quantile_of_sorted(sorted, q)
}

/// p50/p90/p99 and mean of one measure, in seconds (or tokens/s).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Distribution {
    pub fn of(values: impl IntoIterator<Item = f64>) -> Option<Distribution> {
        let mut samples: Samples = values.into_iter().collect();
        Some(Distribution {
            mean: samples.mean()?,
            p50: samples.quantile(0.50)?,
            p90: samples.quantile(0.90)?,
            p99: samples.quantile(0.99)?,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// From the first send to the end of the last request.
    pub elapsed_s: f64,
    pub requests_done: usize,
    /// Lost and cut requests (hang-ups are not failures).
    pub requests_failed: usize,
    /// Requests the client dropped mid-stream on purpose (`--hangup-fraction`).
    #[serde(default)]
    pub requests_hung_up: usize,
    /// Requests the run abandoned at its time limit or an interrupt.
    #[serde(default)]
    pub requests_cut: usize,
    /// Requests that were not dropped by the client and still did not complete: an
    /// error event, no final event, a non-2xx answer, a broken connection.
    #[serde(default)]
    pub requests_lost: usize,
    /// Failed requests by error message.
    pub failures: BTreeMap<String, usize>,
    /// Output tokens of completed requests.
    pub output_tokens: u64,
    pub prompt_tokens: u64,
    /// output_tokens / elapsed_s.
    pub throughput_tok_s: f64,
    /// Completed requests / elapsed_s.
    pub request_rate: f64,
    /// Over completed requests; absent when none completed.
    pub ttft_s: Option<Distribution>,
    pub latency_s: Option<Distribution>,
    /// Per-user speed (a request's output tokens / its latency).
    pub user_tok_s: Option<Distribution>,
    /// Output tokens of completed requests by model (when the server reports them).
    pub tokens_per_model: BTreeMap<String, u64>,
    /// Multi-turn workloads: TTFT and cached prompt tokens by turn index (empty for
    /// single-turn runs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub by_turn: Vec<TurnStats>,
}

impl Summary {
    pub fn new(records: &[RequestRecord], elapsed_s: f64) -> Summary {
        let done: Vec<&RequestRecord> = records.iter().filter(|r| r.ok).collect();
        let count = |fate: Fate| records.iter().filter(|r| r.fate() == fate).count();
        let mut failures = BTreeMap::new();
        for error in records.iter().filter(|r| !r.hung_up).filter_map(|r| r.error.as_ref()) {
            *failures.entry(error.clone()).or_insert(0) += 1;
        }
        let mut tokens_per_model = BTreeMap::new();
        for (model, n) in done.iter().flat_map(|r| &r.tokens_per_model) {
            *tokens_per_model.entry(model.clone()).or_insert(0) += n;
        }
        let output_tokens = done.iter().map(|r| r.output_tokens).sum();
        let per_s = |x: f64| if elapsed_s > 0.0 { x / elapsed_s } else { 0.0 };
        Summary {
            elapsed_s,
            requests_done: done.len(),
            requests_failed: count(Fate::Lost) + count(Fate::Cut),
            requests_hung_up: count(Fate::HungUp),
            requests_cut: count(Fate::Cut),
            requests_lost: count(Fate::Lost),
            failures,
            output_tokens,
            prompt_tokens: done.iter().map(|r| r.prompt_tokens).sum(),
            throughput_tok_s: per_s(output_tokens as f64),
            request_rate: per_s(done.len() as f64),
            ttft_s: Distribution::of(done.iter().filter_map(|r| r.ttft_s)),
            latency_s: Distribution::of(done.iter().map(|r| r.latency_s)),
            user_tok_s: Distribution::of(done.iter().map(|r| r.tokens_per_s)),
            tokens_per_model,
            by_turn: turns::by_turn(records),
        }
    }

    /// The summary as printed at the end of a run.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut line = |s: String| {
            out.push_str(&s);
            out.push('\n');
        };
        line(format!(
            "requests: {} done, {} failed in {:.2} s ({:.2} req/s)",
            self.requests_done, self.requests_failed, self.elapsed_s, self.request_rate
        ));
        if self.requests_lost > 0 {
            line(format!(
                "LOST: {} request(s) ended with an error, without their final event or with a non-2xx status",
                self.requests_lost
            ));
        }
        if self.requests_hung_up + self.requests_cut > 0 {
            line(format!(
                "dropped by the client: {} hung up mid-stream, {} cut at the time limit",
                self.requests_hung_up, self.requests_cut
            ));
        }
        line(format!(
            "throughput: {:.1} output tok/s ({} output tokens, {} prompt tokens)",
            self.throughput_tok_s, self.output_tokens, self.prompt_tokens
        ));
        let ms = |d: &Option<Distribution>| match d {
            Some(d) => format!(
                "p50 {:.1} ms  p90 {:.1} ms  p99 {:.1} ms  (mean {:.1} ms)",
                d.p50 * 1e3,
                d.p90 * 1e3,
                d.p99 * 1e3,
                d.mean * 1e3
            ),
            None => "n/a".to_string(),
        };
        line(format!("TTFT:       {}", ms(&self.ttft_s)));
        line(format!("latency:    {}", ms(&self.latency_s)));
        if let Some(u) = &self.user_tok_s {
            line(format!("per user:   mean {:.1} tok/s  (p50 {:.1}, p90 {:.1})", u.mean, u.p50, u.p90));
        }
        if !self.tokens_per_model.is_empty() {
            let total = self.tokens_per_model.values().sum::<u64>().max(1) as f64;
            let parts: Vec<String> = self
                .tokens_per_model
                .iter()
                .map(|(m, n)| format!("{m} {n} ({:.1}%)", 100.0 * *n as f64 / total))
                .collect();
            line(format!("per model:  {}", parts.join(", ")));
        }
        for (error, n) in &self.failures {
            line(format!("failed ×{n}: {error}"));
        }
        out.push_str(&turns::render(&self.by_turn));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_interpolate_between_ranks() {
        let v: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(quantile(&v, 0.5), Some(5.5));
        assert!((quantile(&v, 0.9).unwrap() - 9.1).abs() < 1e-12);
        assert!((quantile(&v, 0.99).unwrap() - 9.91).abs() < 1e-12);
        assert_eq!((quantile(&v, 0.0), quantile(&v, 1.0)), (Some(1.0), Some(10.0)));
        assert_eq!(quantile(&[4.0], 0.99), Some(4.0));
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn distributions_sort_first() {
        let d = Distribution::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((d.mean, d.p50), (2.0, 2.0));
        assert!(Distribution::of([]).is_none());
    }

    fn record(index: usize, ok: bool, output: u64, latency: f64, models: &[(&str, u64)]) -> RequestRecord {
        RequestRecord {
            index,
            job: index as u64,
            turn: 0,
            start_s: 0.0,
            ok,
            ttft_s: ok.then_some(latency / 4.0),
            latency_s: latency,
            prompt_tokens: 10,
            cached_tokens: 0,
            turn_tokens: 10,
            output_tokens: output,
            streamed_tokens: None,
            max_tokens: 8,
            tokens_per_s: output as f64 / latency,
            tokens_per_model: models.iter().map(|(m, n)| (m.to_string(), *n)).collect(),
            finish_reason: None,
            error: (!ok).then(|| "HTTP 503: busy".to_string()),
            hung_up: false,
        }
    }

    #[test]
    fn the_summary_counts_completed_requests_only() {
        let records = [
            record(0, true, 8, 1.0, &[("small", 6), ("large", 2)]),
            record(1, true, 8, 2.0, &[("small", 4), ("large", 4)]),
            record(2, false, 0, 0.5, &[]),
        ];
        let s = Summary::new(&records, 4.0);
        assert_eq!((s.requests_done, s.requests_failed, s.output_tokens, s.prompt_tokens), (2, 1, 16, 20));
        assert_eq!((s.throughput_tok_s, s.request_rate), (4.0, 0.5));
        assert_eq!(s.failures, BTreeMap::from([("HTTP 503: busy".to_string(), 1)]));
        assert_eq!(s.tokens_per_model, BTreeMap::from([("large".into(), 6), ("small".into(), 10)]));
        assert_eq!(s.latency_s.unwrap().p50, 1.5);
        assert_eq!(s.user_tok_s.unwrap().mean, 6.0);
        let text = s.render();
        assert!(text.contains("2 done, 1 failed") && text.contains("4.0 output tok/s"), "{text}");
        assert!(text.contains("large 6 (37.5%)") && text.contains("failed ×1: HTTP 503: busy"), "{text}");
    }

    #[test]
    fn hangups_are_not_failures_and_lost_requests_are_shown_first() {
        let mut hung = record(1, false, 0, 0.5, &[]);
        (hung.hung_up, hung.error) = (true, Some("hung up by the client after 2 token(s)".into()));
        let mut cut = record(2, false, 0, 0.5, &[]);
        cut.error = Some("cut: the run was interrupted".into());
        let records = [record(0, true, 8, 1.0, &[]), hung, cut, record(3, false, 0, 0.5, &[])];
        let s = Summary::new(&records, 1.0);
        assert_eq!((s.requests_done, s.requests_hung_up, s.requests_cut, s.requests_lost), (1, 1, 1, 1));
        assert_eq!(s.requests_failed, 2);
        assert!(!s.failures.keys().any(|e| e.contains("hung up")), "{:?}", s.failures);
        let text = s.render();
        let lost = text.lines().position(|l| l.starts_with("LOST: 1 request(s)")).expect(&text);
        assert!(lost <= 1, "right under the request counts: {text}");
        assert!(text.contains("dropped by the client: 1 hung up mid-stream, 1 cut at the time limit"), "{text}");
        assert!(!Summary::new(&records[..1], 1.0).render().contains("LOST"));
    }

    #[test]
    fn multi_turn_runs_summarize_by_turn() {
        let mut second = record(1, true, 8, 0.4, &[]);
        (second.job, second.turn, second.cached_tokens) = (0, 1, 16);
        let s = Summary::new(&[record(0, true, 8, 2.0, &[]), second], 1.0);
        assert_eq!(s.by_turn.iter().map(|t| (t.turn, t.requests)).collect::<Vec<_>>(), [(1, 1), (2, 1)]);
        assert_eq!((s.by_turn[0].ttft_s.unwrap().p50, s.by_turn[1].ttft_s.unwrap().p99), (0.5, 0.1));
        assert_eq!(s.by_turn[1].mean_cached_tokens, 16.0);
        assert!(s.render().contains("TTFT by turn:"), "{}", s.render());
        let single = Summary::new(&[record(0, true, 8, 2.0, &[])], 1.0);
        assert!(single.by_turn.is_empty() && !single.render().contains("by turn"));
        let json = serde_json::to_value(&single).unwrap();
        assert!(json.get("by_turn").is_none(), "left out of single-turn reports");
    }

    #[test]
    fn an_empty_run_summarizes_without_dividing_by_zero() {
        let s = Summary::new(&[], 0.0);
        assert_eq!((s.throughput_tok_s, s.ttft_s), (0.0, None));
        assert!(s.render().contains("TTFT:       n/a"));
    }
}

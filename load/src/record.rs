//! What is kept of each request: the row of the CSV and an entry of the JSON.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::churn::Fate;
use crate::client::Outcome;

/// One request's measurements; times in seconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// Order in which requests were sent (0-based).
    pub index: usize,
    /// The job (session) and the turn within it.
    pub job: u64,
    pub turn: usize,
    /// Send time since the run began.
    pub start_s: f64,
    pub ok: bool,
    /// Time to first token (absent when no token came).
    pub ttft_s: Option<f64>,
    /// Send to `[DONE]`.
    pub latency_s: f64,
    /// The server's count of prompt tokens (0 when it reported none).
    pub prompt_tokens: u64,
    /// Of those, the tokens the server took from its prefix cache
    /// (`usage.prompt_tokens_details.cached_tokens`; 0 when it reported none).
    #[serde(default)]
    pub cached_tokens: u64,
    /// Tokens of the newest user turn as the load generator counted them.
    pub turn_tokens: usize,
    pub output_tokens: u64,
    /// Tokens the routing trace showed while streaming (only with `--routing-trace`).
    pub streamed_tokens: Option<u64>,
    pub max_tokens: usize,
    /// Output tokens / latency: the speed one user sees.
    pub tokens_per_s: f64,
    pub tokens_per_model: BTreeMap<String, u64>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    /// The client hung up on purpose (`--hangup-fraction`); not a failure.
    #[serde(default)]
    pub hung_up: bool,
}

/// Where a request sat in the run, for its record.
#[derive(Debug, Clone, Copy)]
pub struct Slot {
    pub index: usize,
    pub job: u64,
    pub turn: usize,
    pub start_s: f64,
    pub turn_tokens: usize,
    pub max_tokens: usize,
}

impl RequestRecord {
    pub fn new(slot: Slot, outcome: &Outcome) -> RequestRecord {
        let t = &outcome.tally;
        let latency_s = outcome.latency.as_secs_f64();
        let output_tokens = t.output_tokens();
        RequestRecord {
            index: slot.index,
            job: slot.job,
            turn: slot.turn,
            start_s: slot.start_s,
            ok: outcome.error.is_none(),
            ttft_s: t.first_token.map(|d| d.as_secs_f64()),
            latency_s,
            prompt_tokens: t.usage.as_ref().map_or(0, |u| u.prompt_tokens),
            cached_tokens: t.usage.as_ref().map_or(0, |u| u.cached_tokens),
            turn_tokens: slot.turn_tokens,
            output_tokens,
            streamed_tokens: t.streamed_tokens(),
            max_tokens: slot.max_tokens,
            tokens_per_s: if latency_s > 0.0 { output_tokens as f64 / latency_s } else { 0.0 },
            tokens_per_model: t.tokens_per_model(),
            finish_reason: t.finish_reason.clone(),
            error: outcome.error.clone(),
            hung_up: outcome.hung_up,
        }
    }

    pub fn fate(&self) -> Fate {
        Fate::of(self.ok, self.hung_up, self.error.as_deref())
    }
}

pub const CSV_HEADER: &str = "index,job,turn,start_s,ok,ttft_s,latency_s,prompt_tokens,cached_tokens,turn_tokens,\
output_tokens,streamed_tokens,max_tokens,tokens_per_s,tokens_per_model,finish_reason,error,fate";

impl RequestRecord {
    /// The CSV row (columns of `CSV_HEADER`); tokens per model as `name=n;name=n`.
    pub fn csv_row(&self) -> String {
        let opt = |v: Option<String>| v.unwrap_or_default();
        let per_model: Vec<String> = self.tokens_per_model.iter().map(|(m, n)| format!("{m}={n}")).collect();
        let fields = [
            self.index.to_string(),
            self.job.to_string(),
            self.turn.to_string(),
            format!("{:.6}", self.start_s),
            self.ok.to_string(),
            opt(self.ttft_s.map(|t| format!("{t:.6}"))),
            format!("{:.6}", self.latency_s),
            self.prompt_tokens.to_string(),
            self.cached_tokens.to_string(),
            self.turn_tokens.to_string(),
            self.output_tokens.to_string(),
            opt(self.streamed_tokens.map(|n| n.to_string())),
            self.max_tokens.to_string(),
            format!("{:.3}", self.tokens_per_s),
            per_model.join(";"),
            opt(self.finish_reason.clone()),
            opt(self.error.clone()),
            value_name(&self.fate()),
        ];
        fields.iter().map(|f| csv_field(f)).collect::<Vec<_>>().join(",")
    }
}

/// An enum as serde names it (`hung-up`).
fn value_name<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v).ok().and_then(|v| v.as_str().map(str::to_string)).unwrap_or_default()
}

/// RFC 4180 quoting: error messages may hold commas, quotes and newlines.
fn csv_field(f: &str) -> String {
    if f.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", f.replace('"', "\"\""))
    } else {
        f.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::sse::StreamTally;

    fn slot() -> Slot {
        Slot { index: 3, job: 1, turn: 2, start_s: 0.5, turn_tokens: 10, max_tokens: 4 }
    }

    #[test]
    fn a_record_takes_its_numbers_from_the_stream() {
        let mut tally = StreamTally::default();
        tally.on_data(Duration::from_millis(100), r#"{"choices":[{"text":"ab"}],"routing":{"models":["s","l"]}}"#);
        tally.on_data(
            Duration::from_millis(150),
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":8}}}"#,
        );
        tally.on_event(Duration::from_millis(150), crate::sse::SseEvent::Done);
        let outcome = Outcome::new(Duration::from_millis(200), tally, None);
        let r = RequestRecord::new(slot(), &outcome);
        assert!(r.ok);
        assert_eq!((r.ttft_s, r.latency_s, r.output_tokens, r.prompt_tokens), (Some(0.1), 0.2, 2, 12));
        assert_eq!((r.streamed_tokens, r.cached_tokens), (Some(2), 8));
        assert!((r.tokens_per_s - 10.0).abs() < 1e-9);
        assert_eq!(r.tokens_per_model, BTreeMap::from([("l".into(), 1), ("s".into(), 1)]));
    }

    #[test]
    fn csv_rows_quote_what_needs_quoting() {
        let outcome = Outcome::cut(std::time::Instant::now(), "HTTP 400: bad \"x\", really");
        let r = RequestRecord::new(slot(), &outcome);
        let row = r.csv_row();
        assert!(row.ends_with(",\"HTTP 400: bad \"\"x\"\", really\",lost"), "{row}");
        assert!(row.starts_with("3,1,2,0.500000,false,,"), "{row}");
        assert_eq!(CSV_HEADER.split(',').count(), 18);
        assert_eq!(row.split(',').nth(8), Some("0"), "cached_tokens after prompt_tokens: {row}");
    }
}

//! `admission:` (KV reservations, the admission queue, time limits) and `debug:`
//! (opt-in fault injection for soak tests).

use std::time::Duration;

use serde::Deserialize;
use tokenrouter_actors::AdmissionConfig;

/// How requests are admitted and how long they may take.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmissionSection {
    /// Output tokens reserved at admission beyond the prompt (at most `max_tokens`);
    /// outputs grow past it on demand, and under pressure requests are preempted and
    /// recomputed.
    #[serde(default = "defaults::output_headroom")]
    pub output_headroom: usize,
    /// Requests that may wait for KV; more get 429.
    #[serde(default = "defaults::max_waiting")]
    pub max_waiting: usize,
    /// Longest wait for KV, in seconds; then 503 with `Retry-After` (or an error
    /// event, when the stream has started).
    #[serde(default = "defaults::kv_wait_timeout_s")]
    pub kv_wait_timeout_s: f64,
    /// Longest a request may run from submission, in seconds (absent: no limit).
    #[serde(default)]
    pub request_timeout_s: Option<f64>,
    /// The candle models served in this process share one K/V budget, the sum of
    /// their `kv_budget_mib`, split by demand; `false`: each keeps its own.
    #[serde(default = "defaults::share_kv")]
    pub share_kv: bool,
}

impl Default for AdmissionSection {
    fn default() -> Self {
        AdmissionSection {
            output_headroom: defaults::output_headroom(),
            max_waiting: defaults::max_waiting(),
            kv_wait_timeout_s: defaults::kv_wait_timeout_s(),
            request_timeout_s: None,
            share_kv: defaults::share_kv(),
        }
    }
}

impl AdmissionSection {
    pub fn to_engine(&self) -> AdmissionConfig {
        AdmissionConfig {
            output_headroom: self.output_headroom,
            max_waiting: self.max_waiting,
            kv_wait_timeout: Duration::from_secs_f64(self.kv_wait_timeout_s.max(0.0)),
            request_timeout: self.request_timeout_s.map(|s| Duration::from_secs_f64(s.max(0.0))),
            share_kv: self.share_kv,
        }
    }

    /// Problems, as (key, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !(self.kv_wait_timeout_s.is_finite() && self.kv_wait_timeout_s > 0.0) {
            out.push(("admission.kv_wait_timeout_s", "must be a positive number of seconds".to_string()));
        }
        if self.request_timeout_s.is_some_and(|s| !(s.is_finite() && s > 0.0)) {
            out.push(("admission.request_timeout_s", "must be a positive number of seconds".to_string()));
        }
        if self.max_waiting == 0 {
            out.push(("admission.max_waiting", "must be at least 1".to_string()));
        }
        out
    }
}

/// Test-only switches; off unless the file turns them on.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DebugSection {
    /// Serve `POST /debug/fault`, which makes a model panic at a chosen point (to
    /// check that requests survive it). Never turn on in production.
    #[serde(default)]
    pub fault_injection: bool,
}

mod defaults {
    use tokenrouter_actors::AdmissionConfig;

    pub fn output_headroom() -> usize {
        AdmissionConfig::default().output_headroom
    }

    pub fn max_waiting() -> usize {
        AdmissionConfig::default().max_waiting
    }

    pub fn kv_wait_timeout_s() -> f64 {
        AdmissionConfig::default().kv_wait_timeout.as_secs_f64()
    }

    pub fn share_kv() -> bool {
        AdmissionConfig::default().share_kv
    }
}

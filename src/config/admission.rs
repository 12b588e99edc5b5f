//! `admission:` (KV reservations, the admission queue, time limits), `supervision:`
//! (how a model out of service comes back) and `debug:` (opt-in fault injection for
//! soak tests).

use std::time::Duration;

use serde::Deserialize;
use tokenrouter_actors::{AdmissionConfig, SupervisionConfig};

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
    /// Longest a request may run from submission, waiting included, in seconds; then
    /// 504 (or an error event, when the stream has started). `null`: no limit besides
    /// the one a request brings.
    #[serde(default = "defaults::request_timeout_s")]
    pub request_timeout_s: Option<f64>,
    /// The candle models served in this process share one K/V budget, the sum of
    /// their `kv_budget_mib`, split by demand; `false`: each keeps its own.
    #[serde(default = "defaults::share_kv")]
    pub share_kv: bool,
    /// Longest a request waits for its grammar (structured outputs) to compile,
    /// queueing included, in seconds; then 400 naming this key.
    #[serde(default = "defaults::grammar_compile_timeout_s")]
    pub grammar_compile_timeout_s: f64,
}

impl Default for AdmissionSection {
    fn default() -> Self {
        AdmissionSection {
            output_headroom: defaults::output_headroom(),
            max_waiting: defaults::max_waiting(),
            kv_wait_timeout_s: defaults::kv_wait_timeout_s(),
            request_timeout_s: defaults::request_timeout_s(),
            share_kv: defaults::share_kv(),
            grammar_compile_timeout_s: defaults::grammar_compile_timeout_s(),
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
            grammar_compile_timeout: Duration::from_secs_f64(self.grammar_compile_timeout_s.max(0.0)),
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
        if !(self.grammar_compile_timeout_s.is_finite() && self.grammar_compile_timeout_s > 0.0) {
            out.push(("admission.grammar_compile_timeout_s", "must be a positive number of seconds".to_string()));
        }
        if self.max_waiting == 0 {
            out.push(("admission.max_waiting", "must be at least 1".to_string()));
        }
        out
    }
}

/// A model that panicked repeatedly is out of service (its requests get 503): it
/// reloads from its weights after `restart_backoff_s`, and the wait doubles while
/// reloads fail or soon fail again, up to `max_restart_backoff_s`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SupervisionSection {
    #[serde(default = "defaults::restart_backoff_s")]
    pub restart_backoff_s: f64,
    #[serde(default = "defaults::max_restart_backoff_s")]
    pub max_restart_backoff_s: f64,
}

impl Default for SupervisionSection {
    fn default() -> Self {
        SupervisionSection {
            restart_backoff_s: defaults::restart_backoff_s(),
            max_restart_backoff_s: defaults::max_restart_backoff_s(),
        }
    }
}

impl SupervisionSection {
    pub fn to_engine(&self) -> SupervisionConfig {
        SupervisionConfig {
            restart_backoff: Duration::from_secs_f64(self.restart_backoff_s.max(0.0)),
            max_restart_backoff: Duration::from_secs_f64(self.max_restart_backoff_s.max(0.0)),
        }
    }

    /// Problems, as (key, message).
    pub fn problems(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if !(self.restart_backoff_s.is_finite() && self.restart_backoff_s > 0.0) {
            out.push(("supervision.restart_backoff_s", "must be a positive number of seconds".to_string()));
        }
        if !(self.max_restart_backoff_s.is_finite() && self.max_restart_backoff_s >= self.restart_backoff_s) {
            out.push(("supervision.max_restart_backoff_s", "must be at least restart_backoff_s".to_string()));
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
    use tokenrouter_actors::{AdmissionConfig, SupervisionConfig};

    pub fn request_timeout_s() -> Option<f64> {
        AdmissionConfig::default().request_timeout.map(|d| d.as_secs_f64())
    }

    pub fn restart_backoff_s() -> f64 {
        SupervisionConfig::default().restart_backoff.as_secs_f64()
    }

    pub fn max_restart_backoff_s() -> f64 {
        SupervisionConfig::default().max_restart_backoff.as_secs_f64()
    }

    pub fn output_headroom() -> usize {
        AdmissionConfig::default().output_headroom
    }

    pub fn max_waiting() -> usize {
        AdmissionConfig::default().max_waiting
    }

    pub fn kv_wait_timeout_s() -> f64 {
        AdmissionConfig::default().kv_wait_timeout.as_secs_f64()
    }

    pub fn grammar_compile_timeout_s() -> f64 {
        AdmissionConfig::default().grammar_compile_timeout.as_secs_f64()
    }

    pub fn share_kv() -> bool {
        AdmissionConfig::default().share_kv
    }
}

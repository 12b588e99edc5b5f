//! The leak check after a soak: wait until the server is idle, then read
//! `GET /v1/stats` and report what is still held. After every request has ended
//! (finished, hung up or failed) nothing should be: no KV blocks in use, no
//! pending or ready requests on any model, no KV reservations, no active requests.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::time::Instant;

use crate::client::Client;

pub const STATS_PATH: &str = "/v1/stats";
const POLL_EVERY: Duration = Duration::from_millis(250);

/// What one model still holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelLeftovers {
    pub model: String,
    /// KV blocks not free (total − free).
    pub blocks_used: u64,
    /// Requests whose KV stays here while they are on another model.
    pub pending: u64,
    /// Requests waiting for or in a step here.
    pub ready: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LeakCheck {
    /// The server had no active request and nothing ready within the wait.
    pub idle: bool,
    pub waited_s: f64,
    pub active_requests: u64,
    /// KV reservations held (the KV manager's admitted requests) and their tokens.
    pub reservations: u64,
    pub reserved_tokens: u64,
    /// Requests waiting for KV admission.
    pub waiting: u64,
    pub models: Vec<ModelLeftovers>,
    /// Nothing at all is held.
    pub clean: bool,
    /// Why the stats could not be read.
    pub error: Option<String>,
}

fn count(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

impl LeakCheck {
    /// Reads a `/v1/stats` document (tokenrouter's shape; absent fields count as 0).
    pub fn from_stats(stats: &Value, waited_s: f64) -> LeakCheck {
        let models: Vec<ModelLeftovers> =
            stats["models"].as_array().map(|models| models.iter().map(model_leftovers).collect()).unwrap_or_default();
        let kv = &stats["kv"];
        let mut check = LeakCheck {
            idle: is_idle(stats),
            waited_s,
            active_requests: count(&stats["active_requests"]),
            reservations: count(&kv["admitted"]),
            reserved_tokens: count(&kv["reserved_tokens"]),
            waiting: count(&kv["waiting"]),
            models,
            clean: false,
            error: None,
        };
        check.clean = check.held() == 0;
        check
    }

    pub fn failed(error: String, waited_s: f64) -> LeakCheck {
        LeakCheck {
            idle: false,
            waited_s,
            active_requests: 0,
            reservations: 0,
            reserved_tokens: 0,
            waiting: 0,
            models: Vec::new(),
            clean: false,
            error: Some(error),
        }
    }

    /// Everything still held, added up (0 when clean).
    fn held(&self) -> u64 {
        let per_model: u64 = self.models.iter().map(|m| m.blocks_used + m.pending + m.ready).sum();
        per_model + self.active_requests + self.reservations + self.reserved_tokens + self.waiting
    }
}

fn model_leftovers(m: &Value) -> ModelLeftovers {
    let kv = &m["kv"];
    ModelLeftovers {
        model: m["model"].as_str().unwrap_or("?").to_string(),
        blocks_used: count(&kv["total_blocks"]).saturating_sub(count(&kv["free_blocks"])),
        pending: count(&m["pending"]),
        ready: count(&m["ready"]),
    }
}

/// No request in flight and nothing ready to run: whatever is still held now is
/// left over, not in use.
pub fn is_idle(stats: &Value) -> bool {
    let ready: u64 = stats["models"].as_array().map_or(0, |ms| ms.iter().map(|m| count(&m["ready"])).sum());
    count(&stats["active_requests"]) == 0 && ready == 0
}

/// Polls the stats until the server is idle and holds nothing, or `wait` has passed,
/// and reports the last reading: what is still held after the whole wait is left over.
pub async fn check_leaks(client: &Client, wait: Duration) -> LeakCheck {
    let start = Instant::now();
    loop {
        let waited_s = start.elapsed().as_secs_f64();
        let stats = match client.get_json(STATS_PATH).await {
            Ok(stats) => stats,
            Err(e) => return LeakCheck::failed(e, waited_s),
        };
        let check = LeakCheck::from_stats(&stats, waited_s);
        if (check.idle && check.clean) || start.elapsed() >= wait {
            return check;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn stats(active: u64, small: (u64, u64, u64), admitted: u64) -> Value {
        let (used, pending, ready) = small;
        json!({
            "model_names": ["small", "large"],
            "models": [
                {"model": "small", "ready": ready, "pending": pending, "threshold": 1,
                 "kv": {"block_size": 16, "total_blocks": 64, "free_blocks": 64 - used}, "restarts": 0},
                {"model": "large", "ready": 0, "pending": 0, "threshold": 1,
                 "kv": {"block_size": 16, "total_blocks": 32, "free_blocks": 32}, "restarts": 0},
            ],
            "kv": {"capacity_tokens": [1024, 512], "reserved_tokens": admitted * 40, "admitted": admitted, "waiting": 0},
            "active_requests": active,
            "http_in_flight": 1,
        })
    }

    #[test]
    fn a_server_that_freed_everything_is_clean() {
        let check = LeakCheck::from_stats(&stats(0, (0, 0, 0), 0), 0.5);
        assert!(check.idle && check.clean, "{check:?}");
        assert_eq!(check.models.len(), 2);
        assert_eq!((check.models[0].model.as_str(), check.models[0].blocks_used), ("small", 0));
    }

    #[test]
    fn leftovers_are_reported_per_model() {
        let check = LeakCheck::from_stats(&stats(0, (3, 1, 0), 1), 2.0);
        assert!(check.idle && !check.clean, "idle, yet holding: {check:?}");
        let small = &check.models[0];
        assert_eq!((small.blocks_used, small.pending, small.ready), (3, 1, 0));
        assert_eq!((check.reservations, check.reserved_tokens, check.active_requests), (1, 40, 0));
    }

    #[test]
    fn active_or_ready_requests_are_not_idle() {
        assert!(!is_idle(&stats(1, (0, 0, 0), 0)));
        assert!(!is_idle(&stats(0, (2, 0, 1), 1)));
        assert!(is_idle(&stats(0, (2, 1, 0), 1)), "pending alone is a leftover, not work");
        let pools = json!({"models": [], "kv": null, "active_requests": 0});
        assert!(LeakCheck::from_stats(&pools, 0.0).clean, "a pools server reports no KV: nothing to hold");
    }
}

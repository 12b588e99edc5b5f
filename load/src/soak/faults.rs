//! Fault injection during a soak: on a fixed period the load generator asks the
//! server to fail one model (`POST /debug/fault {"model", "point"}`), taking the
//! models in turn and, for each model, the point `step` then `message`. The server
//! answers 200 when fault injection is on in its config, 404 when it is off.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;
use tokio::sync::watch;

use crate::client::Client;

pub const FAULT_PATH: &str = "/debug/fault";

/// Where the server fails a request: in a model's step, or in a message between actors.
pub const POINTS: [&str; 2] = ["step", "message"];

/// The fault of the `k`-th injection (0-based): model k mod n, and for each model
/// the points in turn, so with models a, b: a/step, b/step, a/message, b/message.
pub fn fault_at(k: usize, models: &[String]) -> Option<(&str, &'static str)> {
    let n = models.len();
    (n > 0).then(|| (models[k % n].as_str(), POINTS[(k / n) % POINTS.len()]))
}

/// What the fault requests came to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultTally {
    pub attempts: usize,
    /// Answered 200: the server injected the fault.
    pub injected: usize,
    /// Answered 404: fault injection is off in the server's config (or no such endpoint).
    pub refused: usize,
    /// Any other answer, or no answer.
    pub errors: usize,
    /// Injected faults by `model/point`.
    pub injected_by: BTreeMap<String, usize>,
    pub last_error: Option<String>,
}

impl FaultTally {
    /// Counts one fault request's result: its HTTP status, or why there was none.
    pub fn record(&mut self, model: &str, point: &str, result: Result<u16, String>) {
        self.attempts += 1;
        match result {
            Ok(200) => {
                self.injected += 1;
                *self.injected_by.entry(format!("{model}/{point}")).or_default() += 1;
            }
            Ok(404) => self.refused += 1,
            Ok(status) => self.fail(format!("{model}/{point}: HTTP {status}")),
            Err(e) => self.fail(format!("{model}/{point}: {e}")),
        }
    }

    fn fail(&mut self, error: String) {
        self.errors += 1;
        self.last_error = Some(error);
    }
}

/// Injects a fault every `every` until `stop` turns true; the first one after one period.
pub async fn inject_faults(
    client: Arc<Client>,
    every: Duration,
    models: Vec<String>,
    mut stop: watch::Receiver<bool>,
) -> FaultTally {
    let mut tally = FaultTally::default();
    for k in 0.. {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.wait_for(|stopped| *stopped) => break,
        }
        let Some((model, point)) = fault_at(k, &models) else { break };
        let result = client.post_status(FAULT_PATH, &json!({ "model": model, "point": point })).await;
        tally.record(model, point, result);
    }
    tally
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_take_models_in_turn_and_alternate_points_per_model() {
        let models = vec!["a".to_string(), "b".to_string()];
        let plan: Vec<_> = (0..6).map(|k| fault_at(k, &models).unwrap()).collect();
        assert_eq!(
            plan,
            [("a", "step"), ("b", "step"), ("a", "message"), ("b", "message"), ("a", "step"), ("b", "step")]
        );
        let one = vec!["m".to_string()];
        assert_eq!((fault_at(0, &one), fault_at(1, &one)), (Some(("m", "step")), Some(("m", "message"))));
        assert_eq!(fault_at(0, &[]), None);
    }

    #[test]
    fn only_200s_count_as_injected() {
        let mut t = FaultTally::default();
        t.record("a", "step", Ok(200));
        t.record("a", "message", Ok(200));
        t.record("a", "step", Ok(200));
        t.record("b", "step", Ok(404));
        t.record("b", "step", Ok(500));
        t.record("b", "message", Err("connection refused".into()));
        assert_eq!((t.attempts, t.injected, t.refused, t.errors), (6, 3, 1, 2));
        assert_eq!(t.injected_by, BTreeMap::from([("a/message".into(), 1), ("a/step".into(), 2)]));
        assert_eq!(t.last_error.as_deref(), Some("b/message: connection refused"));
    }
}

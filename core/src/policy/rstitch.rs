//! `rstitch` (R-Stitch): entropy-gated switching. On the small model an uncertain token
//! (normalized entropy above τ) is discarded and the large model takes over from that
//! position; the large model keeps decoding until it is confident (entropy ≤ τ), then
//! hands back with that token committed.

use super::delegate::ModelPair;
use super::logits::normalized_entropy;
use super::{Decision, EntryRequest, ModelIndex, Policy, RouteRow};

/// Parameters: `tau` (normalized-entropy threshold used both ways; default 0.03),
/// `small`, `large`.
#[derive(Debug, Clone)]
pub struct RStitch {
    tau: f64,
    pair: ModelPair,
}

impl RStitch {
    pub const DEFAULT_TAU: f64 = 0.03;

    pub fn new(tau: f64, pair: ModelPair) -> Self {
        RStitch { tau, pair }
    }

    fn decide(&self, row: &RouteRow<'_>) -> Decision {
        if row.model == self.pair.small {
            if normalized_entropy(row.logits) > self.tau {
                return Decision::Move { to: self.pair.large, commit: false };
            }
        } else if row.model == self.pair.large && normalized_entropy(row.logits) <= self.tau {
            return Decision::Move { to: self.pair.small, commit: true };
        }
        Decision::Stay
    }
}

impl Policy for RStitch {
    fn name(&self) -> &str {
        "rstitch"
    }

    fn entry_model(&self, _request: &mut EntryRequest<'_>) -> ModelIndex {
        self.pair.small
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        rows.iter().map(|row| self.decide(row)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};

    fn peaked(model: ModelIndex) -> RowData {
        let mut logits = vec![0.0f32; 1000];
        logits[5] = 40.0;
        RowData::new(model, logits)
    }

    fn flat(model: ModelIndex) -> RowData {
        RowData::new(model, vec![1.0; 1000])
    }

    #[test]
    fn small_model_leaves_only_when_uncertain() {
        let policy = RStitch::new(0.03, ModelPair::default());
        let decisions = route_all(&policy, &mut [peaked(0), flat(0)]);
        assert_eq!(decisions, vec![Decision::Stay, Decision::Move { to: 1, commit: false }]);
    }

    #[test]
    fn large_model_returns_only_when_confident() {
        let policy = RStitch::new(0.03, ModelPair::default());
        let decisions = route_all(&policy, &mut [peaked(1), flat(1)]);
        assert_eq!(decisions, vec![Decision::Move { to: 0, commit: true }, Decision::Stay]);
    }

    #[test]
    fn threshold_is_exclusive_on_small_and_inclusive_on_large() {
        // Two equal candidates among 1000 masked logits: H = ln 2 / ln 1000 ≈ 0.1003.
        let mut two = vec![f32::NEG_INFINITY; 1000];
        two[1] = 0.0;
        two[2] = 0.0;
        let h = normalized_entropy(&two);
        let policy = RStitch::new(h, ModelPair::default());
        let decisions = route_all(&policy, &mut [RowData::new(0, two.clone()), RowData::new(1, two)]);
        assert_eq!(decisions, vec![Decision::Stay, Decision::Move { to: 0, commit: true }]);
    }

    #[test]
    fn other_models_stay_and_entry_is_small() {
        let policy = RStitch::new(0.03, ModelPair { small: 1, large: 2 });
        assert_eq!(route_all(&policy, &mut [flat(0)]), vec![Decision::Stay]);
        let mut state = Default::default();
        let mut request = EntryRequest { request_id: 0, prompt: &[1], max_tokens: 4, state: &mut state };
        assert_eq!(policy.entry_model(&mut request), 1);
        assert!(!policy.needs_hidden(1));
    }
}

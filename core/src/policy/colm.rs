//! `colm` (Co-LLM): the small model's LM head carries one extra output, a `<|defer|>`
//! slot; P(defer) = σ(that logit) > η sends the position to the large model.
//!
//! Our checkpoints have no extra slot, so the defer logit is a configurable index of the
//! row (default: the last logit of the shared vocabulary, a padding id in Qwen vocabularies).
//! That index is not a token: the engine must keep the sampler from drawing it, which
//! [`Policy::reserved_logit`](super::Policy::reserved_logit) reports for the small model.

use super::delegate::DelegatePolicy;
use super::logits::sigmoid;
use super::RouteRow;

/// Parameters: `eta` (defer when σ(defer logit) > eta; default 0.15), `defer_index`
/// (index of the defer logit in the row; default `vocab_size − 1`).
#[derive(Debug, Clone)]
pub struct ColmDelegate {
    eta: f64,
    defer_index: usize,
}

impl ColmDelegate {
    pub const DEFAULT_ETA: f64 = 0.15;

    pub fn new(eta: f64, defer_index: usize) -> Self {
        ColmDelegate { eta, defer_index }
    }

    /// The logit that is P(defer), which sampling must exclude.
    pub fn defer_slot(&self) -> Option<usize> {
        Some(self.defer_index)
    }

    /// P(defer) of a row, or `None` when the row is too short to hold the slot.
    pub fn defer_probability(&self, logits: &[f32]) -> Option<f64> {
        logits.get(self.defer_index).map(|&l| sigmoid(l as f64))
    }
}

impl DelegatePolicy for ColmDelegate {
    fn name(&self) -> &str {
        "colm"
    }

    fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool> {
        rows.iter().map(|row| self.defer_probability(row.logits).is_some_and(|p| p > self.eta)).collect()
    }

    fn reserved_logit(&self) -> Option<usize> {
        self.defer_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};
    use crate::policy::{BinaryAdapter, Decision, ModelPair, Policy};

    /// A row whose last logit (the default slot) gives P(defer) = `p`.
    fn row_with_defer_probability(p: f64) -> RowData {
        let mut logits = vec![0.5f32; 10];
        logits[9] = (p / (1.0 - p)).ln() as f32;
        RowData::new(0, logits)
    }

    #[test]
    fn defers_above_eta_only() {
        let policy = BinaryAdapter::new(ColmDelegate::new(0.15, 9), ModelPair::default());
        let mut rows =
            vec![row_with_defer_probability(0.2), row_with_defer_probability(0.1), row_with_defer_probability(0.9)];
        let decisions = route_all(&policy, &mut rows);
        let to_large = Decision::Move { to: 1, commit: false };
        assert_eq!(decisions, vec![to_large, Decision::Stay, to_large]);
    }

    #[test]
    fn the_defer_slot_is_reserved_on_the_small_model_only() {
        let policy = BinaryAdapter::new(ColmDelegate::new(0.15, 9), ModelPair::default());
        assert_eq!(policy.inner().defer_slot(), Some(9));
        assert_eq!(policy.reserved_logit(0), Some(9));
        assert_eq!(policy.reserved_logit(1), None);
    }

    #[test]
    fn a_row_without_the_slot_stays() {
        let policy = BinaryAdapter::new(ColmDelegate::new(0.0, 50), ModelPair::default());
        assert_eq!(route_all(&policy, &mut [row_with_defer_probability(0.9)]), vec![Decision::Stay]);
    }
}

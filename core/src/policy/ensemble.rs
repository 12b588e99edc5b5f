//! `me` (multi-model ensemble): after every token the model for the next position is
//! drawn from Categorical(w) over 2+ models. Only one model runs per token, so the output
//! follows the mixture Σ w_j p_j without averaging distributions.

use super::{policy_uniform, Decision, EntryRequest, ModelIndex, Policy, RouteRow};

/// Distinct salts keep the entry draw and the per-token draws independent.
const ENTRY_SALT: u64 = 0x6d65_656e; // "meen"
const NEXT_SALT: u64 = 0x6d65_6e78; // "menx"

/// Parameters: `weights` (one per model, in model order, or an object keyed by model
/// name; positive, normalized here — models left out of an object are never drawn).
#[derive(Debug, Clone)]
pub struct Ensemble {
    /// Cumulative normalized weights; the last is exactly 1.
    cumulative: Vec<f64>,
}

impl Ensemble {
    /// `weights[j]` is model j's share; they must be finite, non-negative and not all
    /// zero (the registry additionally refuses zero entries in a weight list).
    pub fn new(weights: &[f64]) -> Result<Self, String> {
        if weights.len() < 2 {
            return Err(format!("`weights` needs at least two models, got {}", weights.len()));
        }
        if let Some(bad) = weights.iter().find(|w| !w.is_finite() || **w < 0.0) {
            return Err(format!("`weights` must be finite and non-negative, got {bad}"));
        }
        let total: f64 = weights.iter().sum();
        if total <= 0.0 {
            return Err("`weights` must not all be zero".into());
        }
        let mut running = 0.0;
        let mut cumulative: Vec<f64> = weights
            .iter()
            .map(|w| {
                running += w / total;
                running
            })
            .collect();
        *cumulative.last_mut().expect("two or more weights") = 1.0;
        Ok(Ensemble { cumulative })
    }

    /// Normalized weights, in model order.
    pub fn weights(&self) -> Vec<f64> {
        let mut previous = 0.0;
        self.cumulative
            .iter()
            .map(|&c| {
                let w = c - previous;
                previous = c;
                w
            })
            .collect()
    }

    fn draw(&self, u: f64) -> ModelIndex {
        // First model whose cumulative weight exceeds u; zero-weight models are skipped
        // because their cumulative value equals the previous one.
        self.cumulative.partition_point(|&c| c <= u).min(self.cumulative.len() - 1)
    }

    fn decide(&self, row: &RouteRow<'_>) -> Decision {
        let next_position = row.position() + 1;
        let next = self.draw(policy_uniform(row.state.seed, next_position, NEXT_SALT));
        if next == row.model {
            Decision::Stay
        } else {
            Decision::Move { to: next, commit: true }
        }
    }
}

impl Policy for Ensemble {
    fn name(&self) -> &str {
        "me"
    }

    fn entry_model(&self, request: &mut EntryRequest<'_>) -> ModelIndex {
        self.draw(policy_uniform(request.state.seed, 0, ENTRY_SALT))
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        rows.iter().map(|row| self.decide(row)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};
    use crate::policy::PolicyState;

    /// The model producing each position 1..=n of one request, starting on `model`.
    fn next_models(policy: &Ensemble, seed: u64, model: ModelIndex, n: usize) -> Vec<ModelIndex> {
        let mut data = RowData::new(model, vec![0.0; 4]);
        data.state.seed = seed;
        (0..n)
            .map(|_| {
                let decision = route_all(policy, std::slice::from_mut(&mut data))[0];
                data.output.push(1);
                if let Decision::Move { to, commit } = decision {
                    assert!(commit, "the ensemble always keeps the token");
                    data.model = to;
                }
                data.model
            })
            .collect()
    }

    #[test]
    fn model_frequencies_follow_the_weights() {
        let policy = Ensemble::new(&[5.0, 3.0, 2.0]).unwrap();
        let mut counts = [0usize; 3];
        for seed in 0..10 {
            for m in next_models(&policy, seed, 0, 3000) {
                counts[m] += 1;
            }
        }
        for (count, expected) in counts.iter().zip([0.5, 0.3, 0.2]) {
            let share = *count as f64 / 30_000.0;
            assert!((share - expected).abs() < 0.015, "{counts:?}");
        }
    }

    #[test]
    fn entry_model_follows_the_weights_and_the_seed() {
        let policy = Ensemble::new(&[0.2, 0.8]).unwrap();
        let entry = |seed| {
            let mut state = PolicyState { seed, ..Default::default() };
            policy.entry_model(&mut EntryRequest { request_id: 0, prompt: &[], max_tokens: 1, state: &mut state })
        };
        let large = (0..10_000u64).filter(|&s| entry(s) == 1).count();
        assert!((large as f64 / 10_000.0 - 0.8).abs() < 0.02, "{large}");
        assert_eq!(entry(99), entry(99));
    }

    #[test]
    fn the_draw_ignores_the_current_model_so_staying_is_just_a_repeat() {
        let policy = Ensemble::new(&[1.0, 1.0]).unwrap();
        assert_eq!(next_models(&policy, 3, 0, 200), next_models(&policy, 3, 1, 200));
    }

    #[test]
    fn weights_are_validated_and_normalized() {
        assert!(Ensemble::new(&[1.0]).is_err());
        assert!(Ensemble::new(&[1.0, -1.0]).is_err());
        assert!(Ensemble::new(&[0.0, 0.0]).is_err());
        assert!(Ensemble::new(&[1.0, f64::NAN]).is_err());
        let w = Ensemble::new(&[2.0, 6.0]).unwrap().weights();
        assert!((w[0] - 0.25).abs() < 1e-12 && (w[1] - 0.75).abs() < 1e-12);
        let skip = Ensemble::new(&[1.0, 0.0, 1.0]).unwrap();
        assert!(next_models(&skip, 1, 0, 500).iter().all(|&m| m != 1));
    }
}

//! `random`: the baseline router. On the small model each position goes to the large
//! model with probability `p`, for one token. Draws are keyed by (policy seed, position),
//! so a request's routing is reproducible whatever the batching.

use super::delegate::DelegatePolicy;
use super::{policy_uniform, RouteRow};

/// Keeps this policy's draws independent of other policies' draws at the same position.
const SALT: u64 = 0x7261_6e64; // "rand"

/// Parameters: `p` (probability of delegating a position, in [0, 1]; default 0.5, R2R's
/// published random baseline — load tests commonly use 0.1).
#[derive(Debug, Clone)]
pub struct RandomDelegate {
    p: f64,
}

impl RandomDelegate {
    pub const DEFAULT_P: f64 = 0.5;

    /// `p` outside [0, 1] is the registry's to refuse; here it is clamped.
    pub fn new(p: f64) -> Self {
        RandomDelegate { p: p.clamp(0.0, 1.0) }
    }

    pub fn p(&self) -> f64 {
        self.p
    }
}

impl DelegatePolicy for RandomDelegate {
    fn name(&self) -> &str {
        "random"
    }

    fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool> {
        rows.iter().map(|row| policy_uniform(row.state.seed, row.position(), SALT) < self.p).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};
    use crate::policy::{BinaryAdapter, Decision, ModelPair};

    fn row_at(position: usize, seed: u64) -> RowData {
        let mut data = RowData::new(0, vec![0.0; 4]);
        data.output = vec![1; position];
        data.state.seed = seed;
        data
    }

    #[test]
    fn delegation_rate_matches_p() {
        let policy = BinaryAdapter::new(RandomDelegate::new(0.1), ModelPair::default());
        let mut rows: Vec<RowData> = (0..20_000).map(|i| row_at(i % 2000, i as u64 / 2000)).collect();
        let moved = route_all(&policy, &mut rows).iter().filter(|d| **d != Decision::Stay).count();
        let rate = moved as f64 / rows.len() as f64;
        assert!((rate - 0.1).abs() < 0.01, "rate {rate}");
    }

    #[test]
    fn same_seed_and_position_give_the_same_decision_in_any_batch() {
        let policy = BinaryAdapter::new(RandomDelegate::new(0.5), ModelPair::default());
        let mut batch: Vec<RowData> = (0..64).map(|i| row_at(i, 42)).collect();
        let together = route_all(&policy, &mut batch);
        for (i, expected) in together.iter().enumerate() {
            assert_eq!(route_all(&policy, &mut [row_at(i, 42)])[0], *expected);
        }
        let other_seed: Vec<Decision> = (0..64).flat_map(|i| route_all(&policy, &mut [row_at(i, 43)])).collect();
        assert_ne!(together, other_seed);
    }

    #[test]
    fn extremes_always_or_never_delegate() {
        let always = BinaryAdapter::new(RandomDelegate::new(1.0), ModelPair::default());
        let never = BinaryAdapter::new(RandomDelegate::new(0.0), ModelPair::default());
        let mut rows: Vec<RowData> = (0..100).map(|i| row_at(i, 7)).collect();
        assert!(route_all(&always, &mut rows).iter().all(|d| *d == Decision::Move { to: 1, commit: false }));
        assert!(route_all(&never, &mut rows).iter().all(|d| *d == Decision::Stay));
    }
}

//! Delayed batching: a subserver launches a step only when at least `B_i` requests
//! are ready on it. Thresholds may depend on N, the number of active requests in the
//! whole engine; an optional max wait bounds the tail latency a threshold can add.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Thresholds of one model: `B` for every N, or a table by N (the last entry at or
/// below N applies).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Threshold {
    Fixed(usize),
    ByActive(Vec<(usize, usize)>),
}

impl Threshold {
    fn at(&self, active: usize) -> usize {
        match self {
            Threshold::Fixed(b) => *b,
            Threshold::ByActive(table) => table
                .iter()
                .filter(|(n, _)| *n <= active)
                .max_by_key(|(n, _)| *n)
                .or_else(|| table.iter().min_by_key(|(n, _)| *n))
                .map(|(_, b)| *b)
                .unwrap_or(1),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct BatchingRule {
    /// One threshold per model, in the engine's model order.
    pub thresholds: Vec<Threshold>,
    /// Launch anyway once the oldest ready request has waited this long.
    pub max_wait: Option<Duration>,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BatchingError {
    #[error("threshold of model {model} is 0; thresholds start at 1")]
    Zero { model: usize },
    #[error("thresholds {thresholds:?} at N = {active} break Σ(B_i − 1) < N: the engine could deadlock with every request waiting")]
    Deadlock { thresholds: Vec<usize>, active: usize },
    #[error("{given} thresholds for {models} models")]
    WrongCount { given: usize, models: usize },
}

impl BatchingRule {
    /// Launch as soon as anything is ready (B_i = 1 everywhere).
    pub fn eager(models: usize) -> Self {
        BatchingRule { thresholds: vec![Threshold::Fixed(1); models], max_wait: None }
    }

    pub fn fixed(thresholds: &[usize]) -> Self {
        BatchingRule { thresholds: thresholds.iter().map(|&b| Threshold::Fixed(b)).collect(), max_wait: None }
    }

    /// Checks the rule for `models` models at every N in `1..=max_active` where a
    /// table gives explicit values. Fixed thresholds are clamped at small N instead.
    pub fn validate(&self, models: usize) -> Result<(), BatchingError> {
        if self.thresholds.len() != models {
            return Err(BatchingError::WrongCount { given: self.thresholds.len(), models });
        }
        for (model, t) in self.thresholds.iter().enumerate() {
            let zero = match t {
                Threshold::Fixed(b) => *b == 0,
                Threshold::ByActive(table) => table.iter().any(|(_, b)| *b == 0),
            };
            if zero {
                return Err(BatchingError::Zero { model });
            }
        }
        // A table entry is an explicit promise for that N: it must be deadlock-free.
        let explicit: Vec<usize> = self
            .thresholds
            .iter()
            .filter_map(|t| match t {
                Threshold::ByActive(table) => Some(table.iter().map(|(n, _)| *n)),
                Threshold::Fixed(_) => None,
            })
            .flatten()
            .collect();
        for active in explicit {
            let raw = self.raw(active);
            if raw.iter().map(|b| b - 1).sum::<usize>() >= active.max(1) {
                return Err(BatchingError::Deadlock { thresholds: raw, active });
            }
        }
        Ok(())
    }

    fn raw(&self, active: usize) -> Vec<usize> {
        self.thresholds.iter().map(|t| t.at(active).max(1)).collect()
    }

    /// The thresholds in force at N active requests. When the configured ones would
    /// break Σ(B_i − 1) < N (fixed thresholds as the last requests drain), the excess
    /// over 1 is scaled down so that the sum fits: some model always can launch.
    pub fn effective(&self, active: usize) -> Vec<usize> {
        let raw = self.raw(active);
        let excess: usize = raw.iter().map(|b| b - 1).sum();
        let room = active.saturating_sub(1);
        if excess <= room {
            return raw;
        }
        raw.iter().map(|b| 1 + (b - 1) * room / excess).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_thresholds_hold_while_n_is_large() {
        assert_eq!(BatchingRule::fixed(&[3, 2]).effective(16), vec![3, 2]);
    }

    #[test]
    fn thresholds_shrink_so_that_some_model_can_always_launch() {
        let rule = BatchingRule::fixed(&[4, 4]);
        for n in 1..10 {
            let b = rule.effective(n);
            assert!(b.iter().map(|x| x - 1).sum::<usize>() < n, "N={n}: {b:?}");
            assert!(b.iter().all(|&x| x >= 1));
        }
        assert_eq!(rule.effective(1), vec![1, 1]);
    }

    #[test]
    fn tables_pick_the_entry_at_or_below_n() {
        let rule = BatchingRule {
            thresholds: vec![Threshold::ByActive(vec![(1, 1), (8, 3), (16, 6)]), Threshold::Fixed(1)],
            max_wait: None,
        };
        assert_eq!(rule.effective(5)[0], 1);
        assert_eq!(rule.effective(8)[0], 3);
        assert_eq!(rule.effective(40)[0], 6);
        assert!(rule.validate(2).is_ok());
    }

    #[test]
    fn deadlocking_tables_and_zero_thresholds_are_refused() {
        let rule = BatchingRule {
            thresholds: vec![Threshold::ByActive(vec![(4, 3)]), Threshold::ByActive(vec![(4, 3)])],
            max_wait: None,
        };
        assert!(matches!(rule.validate(2), Err(BatchingError::Deadlock { active: 4, .. })));
        assert_eq!(BatchingRule::fixed(&[0, 1]).validate(2), Err(BatchingError::Zero { model: 0 }));
        assert!(matches!(BatchingRule::fixed(&[1]).validate(2), Err(BatchingError::WrongCount { .. })));
    }
}

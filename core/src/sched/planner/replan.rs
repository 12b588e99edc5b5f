//! Online re-planning: from the engine's own counters over a recent window, re-estimate
//! routing and step latency, predict the throughput of the thresholds in force and of
//! the best ones at the current N, and switch when the gain clears a margin.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{input_from_stats, predict, search, PlanError};
use crate::sched::{BatchingRule, SubserverStats, Threshold};

#[derive(Debug, Clone, PartialEq)]
pub struct ReplanConfig {
    /// How often the engine looks again.
    pub interval: Duration,
    /// Switch only when the best thresholds are predicted this much faster (0.05 = 5%):
    /// estimates from a few seconds of steps are noisy, and flapping costs batching.
    pub margin: f64,
    /// Steps (all models together) a window needs before it is trusted.
    pub min_steps: u64,
    /// The engine's max batch rows.
    pub max_batch: usize,
    /// Where requests start (the small model of a delegating policy).
    pub entry_model: usize,
}

impl Default for ReplanConfig {
    fn default() -> Self {
        ReplanConfig { interval: Duration::from_secs(5), margin: 0.05, min_steps: 50, max_batch: 64, entry_model: 0 }
    }
}

/// A switch the re-planner made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replan {
    pub active: usize,
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub predicted_from: f64,
    pub predicted_to: f64,
}

/// Owns the thresholds the engine runs with and what it learned per N.
#[derive(Debug, Clone)]
pub struct Replanner {
    config: ReplanConfig,
    rule: BatchingRule,
    planned: BTreeMap<usize, Vec<usize>>,
    previous: Option<Vec<SubserverStats>>,
}

impl Replanner {
    pub fn new(config: ReplanConfig, rule: BatchingRule) -> Self {
        Replanner { config, rule, planned: BTreeMap::new(), previous: None }
    }

    pub fn config(&self) -> &ReplanConfig {
        &self.config
    }

    pub fn rule(&self) -> &BatchingRule {
        &self.rule
    }

    /// Someone set the thresholds by hand: they win, and what was learned is dropped.
    pub fn set_rule(&mut self, rule: BatchingRule) {
        self.rule = rule;
        self.planned.clear();
    }

    /// Takes cumulative per-model stats (engine order) and the active count; returns
    /// the switch when one is made (`rule()` is then the new rule).
    pub fn observe(&mut self, stats: &[SubserverStats], active: usize) -> Result<Option<Replan>, PlanError> {
        let Some(previous) = self.previous.as_ref().filter(|p| p.len() == stats.len()) else {
            self.previous = Some(stats.to_vec());
            return Ok(None);
        };
        let window: Vec<SubserverStats> = stats.iter().zip(previous).map(|(now, then)| now.since(then)).collect();
        if window.iter().map(|s| s.steps).sum::<u64>() < self.config.min_steps || active == 0 {
            return Ok(None); // keep accumulating from the same start
        }
        self.previous = Some(stats.to_vec());
        let input = input_from_stats(&window, self.config.entry_model, self.config.max_batch)?;
        let current = self.rule.effective(active);
        let now = predict(&input, active, &current)?;
        let plan = search(&input, active)?;
        let best = plan.best;
        if best.thresholds == current
            || best.prediction.tokens_per_sec <= now.tokens_per_sec * (1.0 + self.config.margin)
        {
            return Ok(None);
        }
        self.planned.insert(active, best.thresholds.clone());
        self.rule = self.expanded_rule();
        Ok(Some(Replan {
            active,
            from: current,
            to: best.thresholds,
            predicted_from: now.tokens_per_sec,
            predicted_to: best.prediction.tokens_per_sec,
        }))
    }

    /// A table per model with an entry for every N up to past the last planned or
    /// explicit one: planned N take their plan, every other N keeps what the rule gave.
    fn expanded_rule(&self) -> BatchingRule {
        let explicit_max = self
            .rule
            .thresholds
            .iter()
            .filter_map(|t| match t {
                Threshold::ByActive(table) => table.iter().map(|(n, _)| *n).max(),
                Threshold::Fixed(_) => None,
            })
            .max()
            .unwrap_or(1);
        let last = explicit_max.max(self.planned.keys().copied().max().unwrap_or(1)) + 1;
        let rows: Vec<(usize, Vec<usize>)> =
            (1..=last).map(|n| (n, self.planned.get(&n).cloned().unwrap_or_else(|| self.rule.effective(n)))).collect();
        let models = self.rule.thresholds.len();
        BatchingRule {
            thresholds: (0..models)
                .map(|i| Threshold::ByActive(rows.iter().map(|(n, b)| (*n, b[i])).collect()))
                .collect(),
            max_wait: self.rule.max_wait,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cumulative stats after `windows` windows of a small/large pair where the large
    /// model's step costs about the same at any batch (so batching it pays).
    fn served(windows: u64) -> Vec<SubserverStats> {
        let mut small = SubserverStats { rows: 1000 * windows, tokens_committed: 650 * windows, ..Default::default() };
        small.handoffs_to = vec![0, 350 * windows];
        small.steps_by_rows = vec![0, 100 * windows, 100 * windows, 0, 100 * windows];
        small.seconds_by_rows = vec![0.0, 0.5 * windows as f64, 0.55 * windows as f64, 0.0, 0.65 * windows as f64];
        let mut large = SubserverStats { rows: 350 * windows, tokens_committed: 350 * windows, ..Default::default() };
        large.handoffs_to = vec![350 * windows, 0];
        large.steps_by_rows = vec![0, 50 * windows, 50 * windows, 0, 50 * windows];
        large.seconds_by_rows = vec![0.0, 1.5 * windows as f64, 1.52 * windows as f64, 0.0, 1.56 * windows as f64];
        for s in [&mut small, &mut large] {
            s.steps = s.steps_by_rows.iter().sum();
        }
        vec![small, large]
    }

    #[test]
    fn switches_when_the_gain_clears_the_margin_and_keeps_other_n() {
        let mut replanner = Replanner::new(ReplanConfig::default(), BatchingRule::fixed(&[1, 1]));
        assert_eq!(replanner.observe(&served(1), 6).unwrap(), None, "the first look only sets the window start");
        let replan = replanner.observe(&served(2), 6).unwrap().expect("batching the large model pays");
        assert_eq!(replan.from, vec![1, 1]);
        assert!(replan.to[1] > 1, "{replan:?}");
        assert!(replan.predicted_to > replan.predicted_from * 1.05);
        assert_eq!(replanner.rule().effective(6), replan.to);
        assert_eq!(replanner.rule().effective(5), vec![1, 1]);
        assert_eq!(replanner.rule().effective(40), vec![1, 1]);
        replanner.rule().validate(2).unwrap();
        // The same traffic again: nothing better to switch to.
        assert_eq!(replanner.observe(&served(3), 6).unwrap(), None);
    }

    #[test]
    fn thin_windows_and_idle_engines_change_nothing() {
        let mut replanner =
            Replanner::new(ReplanConfig { min_steps: 10_000, ..Default::default() }, BatchingRule::eager(2));
        replanner.observe(&served(1), 6).unwrap();
        assert_eq!(replanner.observe(&served(2), 6).unwrap(), None);
        let mut idle = Replanner::new(ReplanConfig::default(), BatchingRule::eager(2));
        idle.observe(&served(1), 0).unwrap();
        assert_eq!(idle.observe(&served(2), 0).unwrap(), None);
        assert_eq!(idle.rule(), &BatchingRule::eager(2));
    }

    #[test]
    fn a_rule_set_by_hand_replaces_what_was_learned() {
        let mut replanner = Replanner::new(ReplanConfig::default(), BatchingRule::fixed(&[1, 1]));
        replanner.observe(&served(1), 6).unwrap();
        replanner.observe(&served(2), 6).unwrap().unwrap();
        replanner.set_rule(BatchingRule::fixed(&[2, 1]));
        assert_eq!(replanner.rule().effective(6), vec![2, 1]);
    }
}

//! Online re-planning: from the engine's own counters over a recent window, re-estimate
//! routing and step latency, predict the throughput of the thresholds in force and of
//! the best ones at the current N, and switch when the gain clears a margin.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{input_from_stats, predict, search, table_rule, LatencyTable, PlanError, StartupPlan, WorkloadPrior};
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
    /// Consecutive windows that must predict the same better thresholds a gain before a
    /// switch: one window's estimate can be far off (a burst of prefills, a client's
    /// pause), and a switch on it alone flaps between windows.
    pub confirmations: u32,
    /// The engine's max batch rows.
    pub max_batch: usize,
    /// Where requests start (the small model of a delegating policy).
    pub entry_model: usize,
    /// Plan a table of thresholds per N at start-up from the models' start-up costs
    /// (two models, each with a cost), before any window was served.
    pub plan_at_start: bool,
    /// The models take turns on shared compute (the engine's `exclusive_compute`).
    pub exclusive_compute: bool,
    /// The prompt and output lengths the start-up plan assumes.
    pub workload: WorkloadPrior,
}

impl Default for ReplanConfig {
    fn default() -> Self {
        ReplanConfig {
            interval: Duration::from_secs(5),
            margin: 0.05,
            min_steps: 50,
            confirmations: 2,
            max_batch: 64,
            entry_model: 0,
            plan_at_start: true,
            exclusive_compute: false,
            workload: WorkloadPrior::default(),
        }
    }
}

/// A switch the re-planner made, and what it measured in the window behind it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Replan {
    pub active: usize,
    pub from: Vec<usize>,
    pub to: Vec<usize>,
    pub predicted_from: f64,
    pub predicted_to: f64,
    /// `route[i][j]`: the share of model i's rows that went on to model j.
    pub route: Vec<Vec<f64>>,
    /// Mean tokens a row fed on each model (1 for decodes; more for catch-up extends).
    pub tokens_per_row: Vec<f64>,
}

/// Where the thresholds in force came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RuleSource {
    /// The configured rule, nothing planned yet.
    Configured,
    /// Set by hand (config thresholds or `Engine::set_batching`): re-planning stops.
    Hand,
    /// Planned at start-up from profiles and the policy's expected routing.
    Startup,
    /// Switched by the re-planner from served counters.
    Replanned,
}

/// What the last trusted window predicted at the N it served: the thresholds in force
/// against the best, from the window's own counters. Beside the measured throughput it
/// shows how far the planner's model is off.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowEstimate {
    pub active: usize,
    pub thresholds: Vec<usize>,
    pub predicted_tokens_per_sec: f64,
    pub best_thresholds: Vec<usize>,
    pub best_predicted_tokens_per_sec: f64,
    /// Mean tokens a row fed on each model in the window.
    pub tokens_per_row: Vec<f64>,
}

/// A switch the last windows called for at N = `active`, not yet made.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PendingSwitch {
    pub active: usize,
    pub to: Vec<usize>,
    pub windows: u32,
}

/// What the planner did and why, for `/v1/stats` and the dashboard.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannerStatus {
    pub source: RuleSource,
    pub replanning: bool,
    pub startup: Option<StartupPlan>,
    pub last_replan: Option<Replan>,
    pub last_window: Option<WindowEstimate>,
    /// Better thresholds the last windows predicted a gain, waiting for `confirmations`
    /// windows in a row.
    pub pending: Option<PendingSwitch>,
    /// Thresholds planned per N (start-up and re-planned).
    pub planned: BTreeMap<usize, Vec<usize>>,
}

/// Owns the thresholds the engine runs with and what it learned per N.
#[derive(Debug, Clone)]
pub struct Replanner {
    config: ReplanConfig,
    rule: BatchingRule,
    planned: BTreeMap<usize, Vec<usize>>,
    previous: Option<Vec<SubserverStats>>,
    /// Each model's profiled cost by tokens, where one was measured or saved.
    priors: Vec<Option<LatencyTable>>,
    source: RuleSource,
    startup: Option<StartupPlan>,
    last: Option<Replan>,
    last_window: Option<WindowEstimate>,
    /// The better thresholds the last windows predicted a gain at N = `active`, and how
    /// many windows did.
    pending: Option<PendingSwitch>,
}

impl Replanner {
    pub fn new(config: ReplanConfig, rule: BatchingRule) -> Self {
        Replanner {
            config,
            rule,
            planned: BTreeMap::new(),
            previous: None,
            priors: Vec::new(),
            source: RuleSource::Configured,
            startup: None,
            last: None,
            last_window: None,
            pending: None,
        }
    }

    /// Profiled step costs by tokens fed, per model (engine order).
    pub fn set_priors(&mut self, priors: Vec<Option<LatencyTable>>) {
        self.priors = priors;
    }

    pub fn priors(&self) -> &[Option<LatencyTable>] {
        &self.priors
    }

    /// Starts from a start-up plan, unless thresholds were set by hand meanwhile.
    pub fn adopt_startup(&mut self, plan: StartupPlan) -> bool {
        if self.source == RuleSource::Hand {
            return false;
        }
        self.planned = plan.table.iter().map(|(n, b, _)| (*n, b.clone())).collect();
        self.rule = BatchingRule { max_wait: self.rule.max_wait, ..plan.rule.clone() };
        self.startup = Some(plan);
        self.source = RuleSource::Startup;
        true
    }

    pub fn status(&self) -> PlannerStatus {
        PlannerStatus {
            source: self.source,
            replanning: self.source != RuleSource::Hand,
            startup: self.startup.clone(),
            last_replan: self.last.clone(),
            last_window: self.last_window.clone(),
            pending: self.pending.clone(),
            planned: self.planned.clone(),
        }
    }

    pub fn config(&self) -> &ReplanConfig {
        &self.config
    }

    pub fn rule(&self) -> &BatchingRule {
        &self.rule
    }

    /// Someone set the thresholds by hand: they win, what was learned is dropped, and
    /// re-planning stops.
    pub fn set_rule(&mut self, rule: BatchingRule) {
        self.rule = rule;
        self.planned.clear();
        self.pending = None;
        self.source = RuleSource::Hand;
    }

    /// Takes cumulative per-model stats (engine order) and the active count; returns
    /// the switch when one is made (`rule()` is then the new rule).
    pub fn observe(&mut self, stats: &[SubserverStats], active: usize) -> Result<Option<Replan>, PlanError> {
        if self.source == RuleSource::Hand {
            return Ok(None);
        }
        let Some(previous) = self.previous.as_ref().filter(|p| p.len() == stats.len()) else {
            self.previous = Some(stats.to_vec());
            return Ok(None);
        };
        let window: Vec<SubserverStats> = stats.iter().zip(previous).map(|(now, then)| now.since(then)).collect();
        if window.iter().map(|s| s.steps).sum::<u64>() < self.config.min_steps || active == 0 {
            return Ok(None); // keep accumulating from the same start
        }
        self.previous = Some(stats.to_vec());
        let mut input = input_from_stats(&window, &self.priors, self.config.entry_model, self.config.max_batch)?
            .with_online_delta();
        input.exclusive = self.config.exclusive_compute;
        let current = self.rule.effective(active);
        let now = predict(&input, active, &current)?;
        let plan = search(&input, active)?;
        let best = plan.best;
        let tokens_per_row: Vec<f64> = window.iter().map(|s| s.tokens_per_row().unwrap_or(0.0)).collect();
        self.last_window = Some(WindowEstimate {
            active,
            thresholds: current.clone(),
            predicted_tokens_per_sec: now.tokens_per_sec,
            best_thresholds: best.thresholds.clone(),
            best_predicted_tokens_per_sec: best.prediction.tokens_per_sec,
            tokens_per_row: tokens_per_row.clone(),
        });
        let pays = |tokens_per_sec: f64| tokens_per_sec > now.tokens_per_sec * (1.0 + self.config.margin);
        // A pending switch stands while each new window still predicts it a gain. Where
        // the optimum is flat, windows seldom agree on the very best vector ([1, 22],
        // then [1, 24]), but they do agree that the candidate pays.
        let held = match &self.pending {
            Some(p) if p.active == active && p.to != current => {
                let predicted = predict(&input, active, &p.to)?.tokens_per_sec;
                pays(predicted).then(|| (p.to.clone(), predicted))
            }
            _ => None,
        };
        let fresh = (best.thresholds != current && pays(best.prediction.tokens_per_sec))
            .then(|| (best.thresholds.clone(), best.prediction.tokens_per_sec));
        let Some((to, predicted_to)) = held.or(fresh) else {
            self.pending = None;
            return Ok(None);
        };
        if !self.confirmed(active, &to) {
            return Ok(None);
        }
        self.planned.insert(active, to.clone());
        self.rule = self.expanded_rule();
        self.source = RuleSource::Replanned;
        let replan = Replan {
            active,
            from: current,
            to,
            predicted_from: now.tokens_per_sec,
            predicted_to,
            route: input.route.clone(),
            tokens_per_row,
        };
        self.last = Some(replan.clone());
        Ok(Some(replan))
    }

    /// Counts this window's vote for `thresholds` at N = `active`; true once enough
    /// windows in a row voted for them (the count then starts over).
    fn confirmed(&mut self, active: usize, thresholds: &[usize]) -> bool {
        let windows = match &self.pending {
            Some(p) if p.active == active && p.to == thresholds => p.windows + 1,
            _ => 1,
        };
        if windows >= self.config.confirmations.max(1) {
            self.pending = None;
            return true;
        }
        self.pending = Some(PendingSwitch { active, to: thresholds.to_vec(), windows });
        false
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
        table_rule(&rows, self.rule.thresholds.len(), self.rule.max_wait)
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
        assert_eq!(replanner.observe(&served(2), 6).unwrap(), None, "one window calls for a switch, none is made");
        let pending = replanner.status().pending.expect("the switch waits for a second window");
        assert_eq!((pending.windows, replanner.rule().effective(6)), (1, vec![1, 1]));
        let window = replanner.status().last_window.expect("a trusted window says what it predicted");
        assert_eq!((window.active, &window.thresholds, &window.best_thresholds), (6, &vec![1, 1], &pending.to));
        assert!(window.best_predicted_tokens_per_sec > window.predicted_tokens_per_sec);
        let replan = replanner.observe(&served(3), 6).unwrap().expect("batching the large model pays");
        assert_eq!(replan.from, vec![1, 1]);
        assert_eq!(replan.to, pending.to);
        assert!(replan.to[1] > 1, "{replan:?}");
        assert!(replan.predicted_to > replan.predicted_from * 1.05);
        assert_eq!(replanner.rule().effective(6), replan.to);
        assert_eq!(replanner.rule().effective(5), vec![1, 1]);
        assert_eq!(replanner.rule().effective(40), vec![1, 1]);
        assert_eq!(replanner.status().pending, None);
        replanner.rule().validate(2).unwrap();
        // The same traffic again: nothing better to switch to.
        assert_eq!(replanner.observe(&served(4), 6).unwrap(), None);
        let window = replanner.status().last_window.unwrap();
        assert_eq!((&window.thresholds, &window.best_thresholds), (&replan.to, &replan.to));
    }

    #[test]
    fn windows_that_disagree_switch_nothing() {
        let costs = card_costs();
        let n = 8;
        let (one, other) = (0.05, 0.5);
        assert_ne!(best_at(one, &costs, n), best_at(other, &costs, n));
        // In force: the best thresholds at the one rate.
        let start = BatchingRule::fixed(&best_at(one, &costs, n));
        let mut replanner = Replanner::new(ReplanConfig { margin: 0.0, ..Default::default() }, start.clone());
        let mut served = vec![SubserverStats::default(), SubserverStats::default()];
        replanner.observe(&served, n).unwrap();
        // Windows alternate between the two rates: each window at the other rate calls
        // for a switch that the next window, at the one rate, predicts no gain for.
        for i in 0..6 {
            let p = if i % 2 == 0 { other } else { one };
            served = served.iter().zip(window_at(p, &costs)).map(|(total, w)| total.plus(&w)).collect();
            assert_eq!(replanner.observe(&served, n).unwrap(), None, "window {i}");
            let pending = replanner.status().pending.map(|p| p.windows);
            assert_eq!(pending, if p == other { Some(1) } else { None }, "window {i}");
        }
        assert_eq!(replanner.rule(), &start);
        // Two windows in a row at the other rate agree, and it switches.
        let mut look = |replanner: &mut Replanner| {
            served = served.iter().zip(window_at(other, &costs)).map(|(total, w)| total.plus(&w)).collect();
            replanner.observe(&served, n).unwrap()
        };
        assert_eq!(look(&mut replanner), None, "one window is not enough");
        let replan = look(&mut replanner).expect("two agreeing windows");
        assert_eq!(replan.to, best_at(other, &costs, n));
    }

    #[test]
    fn a_flat_optimum_switches_though_windows_name_different_best_thresholds() {
        let costs = card_costs();
        let n = 16;
        let start = BatchingRule::eager(2);
        let predicted = |p: f64, thresholds: &[usize]| {
            let input = input_from_stats(&window_at(p, &costs), &[], 0, 64).unwrap().with_online_delta();
            predict(&input, n, thresholds).unwrap().tokens_per_sec
        };
        let pays = |p: f64, thresholds: &[usize]| predicted(p, thresholds) > predicted(p, &[1, 1]) * 1.05;
        // Two nearby routing rates whose best thresholds differ, each of which the other
        // window still predicts a gain over [1, 1]: a flat optimum seen through noise.
        let rates = [0.1, 0.12, 0.14, 0.16, 0.18, 0.2, 0.25, 0.3];
        let (first, second) = rates
            .windows(2)
            .map(|w| (w[0], w[1]))
            .find(|&(a, b)| {
                let (x, y) = (best_at(a, &costs, n), best_at(b, &costs, n));
                x != y && pays(a, &x) && pays(b, &x) && pays(b, &y)
            })
            .expect("two nearby rates with different best thresholds that both pay");
        let mut replanner = Replanner::new(ReplanConfig::default(), start);
        let mut served = vec![SubserverStats::default(), SubserverStats::default()];
        replanner.observe(&served, n).unwrap();
        served = served.iter().zip(window_at(first, &costs)).map(|(total, w)| total.plus(&w)).collect();
        assert_eq!(replanner.observe(&served, n).unwrap(), None, "one window is not enough");
        served = served.iter().zip(window_at(second, &costs)).map(|(total, w)| total.plus(&w)).collect();
        let replan = replanner.observe(&served, n).unwrap().expect("the second window confirms the first's pick");
        assert_eq!(replan.to, best_at(first, &costs, n), "it switches to the thresholds both windows predicted to pay");
        assert_ne!(replan.to, best_at(second, &costs, n));
        assert!(replan.predicted_to > replan.predicted_from * 1.05, "{replan:?}");
        replanner.rule().validate(2).unwrap();
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
        replanner.observe(&served(2), 6).unwrap();
        replanner.observe(&served(3), 6).unwrap().unwrap();
        replanner.set_rule(BatchingRule::fixed(&[2, 1]));
        assert_eq!(replanner.rule().effective(6), vec![2, 1]);
        // Hand thresholds win: the same traffic that moved them before moves nothing now.
        replanner.observe(&served(4), 6).unwrap();
        assert_eq!(replanner.observe(&served(5), 6).unwrap(), None);
        assert_eq!(replanner.status().source, RuleSource::Hand);
        assert!(!replanner.status().replanning);
    }

    /// One window of a two-model deployment at delegation rate `p`: the small model's
    /// 1,000 rows in 4-row decode steps, the large one's p·1,000 rows each catching up
    /// 1/p tokens, in 1- and 2-row steps, all costed from card-like tables.
    fn window_at(p: f64, costs: &[LatencyTable; 2]) -> Vec<SubserverStats> {
        let rows = 1000u64;
        let moved = (p * rows as f64).round() as u64;
        let per_row = (1.0 / p).round() as usize;
        let mut small = SubserverStats { rows, tokens_committed: rows - moved, ..Default::default() };
        small.handoffs_to = vec![0, moved];
        for _ in 0..rows / 4 {
            small.record_step(4, 4, Duration::from_secs_f64(costs[0].at(4) / 1e3));
        }
        let large_rows = moved / 3 * 3;
        let mut large = SubserverStats { rows: large_rows, tokens_committed: large_rows, ..Default::default() };
        large.handoffs_to = vec![large_rows, 0];
        for step_rows in [1usize, 2] {
            for _ in 0..moved / 3 {
                let tokens = step_rows * per_row;
                large.record_step(step_rows, tokens, Duration::from_secs_f64(costs[1].at(tokens) / 1e3));
            }
        }
        for s in [&mut small, &mut large] {
            s.steps = s.steps_by_tokens.iter().sum();
            s.tokens_fed = s.tokens_by_bucket.iter().sum();
        }
        vec![small, large]
    }

    /// Step costs of a card, where a step's cost barely grows with its rows.
    fn card_costs() -> [LatencyTable; 2] {
        [
            LatencyTable::from_points([(1, 2.0), (64, 2.5), (512, 8.0)]).unwrap(),
            LatencyTable::from_points([(1, 20.0), (64, 22.0), (512, 60.0)]).unwrap(),
        ]
    }

    /// The best thresholds at N = `n` from one window at routing rate `p`.
    fn best_at(p: f64, costs: &[LatencyTable; 2], n: usize) -> Vec<usize> {
        let input = input_from_stats(&window_at(p, costs), &[], 0, 64).unwrap().with_online_delta();
        search(&input, n).unwrap().best.thresholds
    }

    #[test]
    fn a_change_in_the_routing_rate_moves_the_thresholds_to_the_new_best() {
        let costs = card_costs();
        let n = 8;
        let (before, after) = (0.05, 0.5);
        let best = |p: f64| best_at(p, &costs, n);
        assert_ne!(best(before), best(after), "the two rates must call for different thresholds");
        let mut replanner = Replanner::new(ReplanConfig { margin: 0.0, ..Default::default() }, BatchingRule::eager(2));
        let mut served = vec![SubserverStats::default(), SubserverStats::default()];
        let mut look = |replanner: &mut Replanner, p: f64| {
            served = served.iter().zip(window_at(p, &costs)).map(|(total, w)| total.plus(&w)).collect();
            replanner.observe(&served, n).unwrap()
        };
        look(&mut replanner, before);
        for _ in 0..3 {
            look(&mut replanner, before);
        }
        assert_eq!(replanner.rule().effective(n), best(before));
        // The policy now delegates ten times as often: the second window at the new rate
        // moves the rule.
        assert_eq!(look(&mut replanner, after), None, "one window is not enough");
        let replan = look(&mut replanner, after).expect("a switch after the rate changed");
        assert_eq!((replan.from.clone(), replan.to.clone()), (best(before), best(after)));
        assert!((replan.route[0][1] - after).abs() < 1e-9, "{replan:?}");
        assert!((replan.tokens_per_row[1] - 1.0 / after).abs() < 1e-9, "{replan:?}");
        assert_eq!(replanner.rule().effective(n), best(after));
        replanner.rule().validate(2).unwrap();
        assert_eq!(replanner.status().source, RuleSource::Replanned);
    }
}

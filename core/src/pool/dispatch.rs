//! The dispatch rule and how each decision turned out. A request goes to the short
//! pool when its estimated budget fits the short pool's context, else to the long
//! pool. The exact size is known only later (from the pool's tokenizer), which
//! classifies the decision: right, spilled (sent short, too long: the short pool
//! refuses it and the long pool serves it) or cautious (sent long, would have fit).

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolChoice {
    Short,
    Long,
}

impl PoolChoice {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolChoice::Short => "short",
            PoolChoice::Long => "long",
        }
    }
}

/// The context limit that splits traffic: a budget up to it goes short.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dispatcher {
    pub short_max_context: usize,
}

impl Dispatcher {
    pub fn choose(&self, budget: usize) -> PoolChoice {
        match budget <= self.short_max_context {
            true => PoolChoice::Short,
            false => PoolChoice::Long,
        }
    }

    /// How a decision turned out once the exact total (prompt + max_tokens) is known.
    pub fn outcome(&self, choice: PoolChoice, exact_total: usize) -> RouteOutcome {
        let fits_short = exact_total <= self.short_max_context;
        match (choice, fits_short) {
            (PoolChoice::Short, true) | (PoolChoice::Long, false) => RouteOutcome::Right,
            (PoolChoice::Short, false) => RouteOutcome::Spilled,
            (PoolChoice::Long, true) => RouteOutcome::Cautious,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RouteOutcome {
    Right,
    /// Under-estimated: the short pool refused it for length; retried on the long pool.
    Spilled,
    /// Over-estimated: served by the long pool although it fit the short one.
    Cautious,
}

impl RouteOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RouteOutcome::Right => "right",
            RouteOutcome::Spilled => "spilled",
            RouteOutcome::Cautious => "cautious",
        }
    }

    /// The pool that finally serves the request.
    pub fn served_by(self, choice: PoolChoice) -> PoolChoice {
        match self {
            RouteOutcome::Spilled => PoolChoice::Long,
            _ => choice,
        }
    }
}

/// Counts of decisions and outcomes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct RouteTally {
    pub short: u64,
    pub long: u64,
    pub spilled: u64,
    pub cautious: u64,
}

impl RouteTally {
    pub fn add(&mut self, choice: PoolChoice, outcome: RouteOutcome) {
        match choice {
            PoolChoice::Short => self.short += 1,
            PoolChoice::Long => self.long += 1,
        }
        match outcome {
            RouteOutcome::Spilled => self.spilled += 1,
            RouteOutcome::Cautious => self.cautious += 1,
            RouteOutcome::Right => {}
        }
    }

    pub fn total(&self) -> u64 {
        self.short + self.long
    }

    /// Share of decisions that sent a request to the wrong pool, either way.
    pub fn misroute_rate(&self) -> f64 {
        (self.spilled + self.cautious) as f64 / self.total().max(1) as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_budget_at_the_boundary_goes_short_and_one_above_goes_long() {
        let d = Dispatcher { short_max_context: 2048 };
        assert_eq!(d.choose(2047), PoolChoice::Short);
        assert_eq!(d.choose(2048), PoolChoice::Short);
        assert_eq!(d.choose(2049), PoolChoice::Long);
        assert_eq!(d.choose(0), PoolChoice::Short);
    }

    #[test]
    fn outcomes_classify_each_wrong_side() {
        let d = Dispatcher { short_max_context: 2048 };
        assert_eq!(d.outcome(PoolChoice::Short, 2048), RouteOutcome::Right);
        assert_eq!(d.outcome(PoolChoice::Short, 2049), RouteOutcome::Spilled);
        assert_eq!(d.outcome(PoolChoice::Long, 2048), RouteOutcome::Cautious);
        assert_eq!(d.outcome(PoolChoice::Long, 2049), RouteOutcome::Right);
        assert_eq!(RouteOutcome::Spilled.served_by(PoolChoice::Short), PoolChoice::Long);
        assert_eq!(RouteOutcome::Cautious.served_by(PoolChoice::Long), PoolChoice::Long);
    }

    #[test]
    fn the_tally_counts_misroutes_both_ways() {
        let mut t = RouteTally::default();
        t.add(PoolChoice::Short, RouteOutcome::Right);
        t.add(PoolChoice::Short, RouteOutcome::Spilled);
        t.add(PoolChoice::Long, RouteOutcome::Cautious);
        t.add(PoolChoice::Long, RouteOutcome::Right);
        assert_eq!((t.short, t.long, t.spilled, t.cautious), (2, 2, 1, 1));
        assert_eq!(t.misroute_rate(), 0.5);
    }
}

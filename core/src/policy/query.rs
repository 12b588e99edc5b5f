//! Whole-request policies: the model is chosen once, at admission, and never changes.
//! `query-level` picks by a rule (RouteLLM-style, without a learned scorer); `always`
//! pins every request to one model (the "small only" / "large only" baselines).

use super::delegate::ModelPair;
use super::{policy_uniform, Decision, EntryRequest, ModelIndex, Policy, RouteRow};

const RANDOM_SALT: u64 = 0x7175_6572; // "quer"

/// How `query-level` picks the model of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum QueryRule {
    /// Large when the prompt has more than this many tokens.
    PromptLenAbove(usize),
    /// Large with this probability, drawn from the request's policy seed.
    Random(f64),
}

/// Parameters: exactly one rule — `prompt_len_above: N` or `random: p` — plus `small`,
/// `large`.
#[derive(Debug, Clone)]
pub struct QueryLevel {
    rule: QueryRule,
    pair: ModelPair,
}

impl QueryLevel {
    pub fn new(rule: QueryRule, pair: ModelPair) -> Self {
        QueryLevel { rule, pair }
    }

    fn wants_large(&self, request: &EntryRequest<'_>) -> bool {
        match self.rule {
            QueryRule::PromptLenAbove(n) => request.prompt.len() > n,
            QueryRule::Random(p) => policy_uniform(request.state.seed, 0, RANDOM_SALT) < p,
        }
    }
}

impl Policy for QueryLevel {
    fn name(&self) -> &str {
        "query-level"
    }

    fn stays_on_entry_model(&self) -> bool {
        true
    }

    fn entry_model(&self, request: &mut EntryRequest<'_>) -> ModelIndex {
        if self.wants_large(request) {
            self.pair.large
        } else {
            self.pair.small
        }
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        vec![Decision::Stay; rows.len()]
    }
}

/// Parameters: `model` (name or index; default 0).
#[derive(Debug, Clone)]
pub struct Always {
    model: ModelIndex,
}

impl Always {
    pub fn new(model: ModelIndex) -> Self {
        Always { model }
    }
}

impl Policy for Always {
    fn name(&self) -> &str {
        "always"
    }

    fn stays_on_entry_model(&self) -> bool {
        true
    }

    fn entry_model(&self, _request: &mut EntryRequest<'_>) -> ModelIndex {
        self.model
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        vec![Decision::Stay; rows.len()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::delegate::tests::{route_all, RowData};
    use crate::policy::PolicyState;

    fn entry(policy: &dyn Policy, prompt_len: usize, seed: u64) -> ModelIndex {
        let prompt = vec![1u32; prompt_len];
        let mut state = PolicyState { seed, ..Default::default() };
        policy.entry_model(&mut EntryRequest { request_id: 0, prompt: &prompt, max_tokens: 16, state: &mut state })
    }

    #[test]
    fn long_prompts_go_large() {
        let policy = QueryLevel::new(QueryRule::PromptLenAbove(10), ModelPair::default());
        assert_eq!(entry(&policy, 10, 0), 0);
        assert_eq!(entry(&policy, 11, 0), 1);
    }

    #[test]
    fn random_rule_sends_a_share_p_to_large_reproducibly() {
        let policy = QueryLevel::new(QueryRule::Random(0.3), ModelPair { small: 1, large: 0 });
        let large = (0..10_000).filter(|&s| entry(&policy, 5, s) == 0).count();
        assert!((large as f64 / 10_000.0 - 0.3).abs() < 0.02, "{large}");
        assert!((0..50).all(|s| entry(&policy, 5, s) == entry(&policy, 99, s)));
    }

    #[test]
    fn whole_request_policies_never_move_a_request() {
        let query = QueryLevel::new(QueryRule::Random(0.5), ModelPair::default());
        let always = Always::new(2);
        let mut rows = vec![RowData::new(0, vec![1.0; 4]), RowData::new(1, vec![0.0; 4])];
        assert_eq!(route_all(&query, &mut rows), vec![Decision::Stay; 2]);
        assert_eq!(route_all(&always, &mut rows), vec![Decision::Stay; 2]);
        assert_eq!(entry(&always, 1000, 3), 2);
    }
}

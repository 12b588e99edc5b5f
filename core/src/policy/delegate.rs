//! Boolean two-model policies: on the small model, per row, "should the large model
//! produce this position instead?" The [`BinaryAdapter`] turns that answer into
//! decisions and owns the mechanics every such policy shares: the small model's token
//! is discarded when delegating, the large model produces exactly one token and hands
//! back with it committed, and rows on any third model are left alone.

use super::{Decision, EntryRequest, ModelIndex, Policy, RouteRow};

/// The two models of a small/large policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelPair {
    pub small: ModelIndex,
    pub large: ModelIndex,
}

impl Default for ModelPair {
    /// The first two models of the config: small first, as the configs list them.
    fn default() -> Self {
        ModelPair { small: 0, large: 1 }
    }
}

/// A policy that only decides, on the small model, whether to delegate a position.
pub trait DelegatePolicy: Send + Sync {
    /// The name configs use (e.g. "r2r").
    fn name(&self) -> &str;

    /// One flag per row; every row ran on the small model in the same step.
    /// `true`: discard the small model's token, the large model produces this position.
    fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool>;

    /// Whether rows on the small model must carry their last hidden state.
    fn needs_hidden(&self) -> bool {
        false
    }

    /// A logit of the small model that is not a token (Co-LLM's defer slot).
    fn reserved_logit(&self) -> Option<usize> {
        None
    }
}

/// Runs a [`DelegatePolicy`] on a small/large pair. Requests start on the small model.
pub struct BinaryAdapter<P> {
    inner: P,
    pair: ModelPair,
}

impl<P: DelegatePolicy> BinaryAdapter<P> {
    pub fn new(inner: P, pair: ModelPair) -> Self {
        BinaryAdapter { inner, pair }
    }

    pub fn inner(&self) -> &P {
        &self.inner
    }

    pub fn pair(&self) -> ModelPair {
        self.pair
    }

    fn decide_small(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        let flags = self.inner.delegate(rows);
        debug_assert_eq!(
            flags.len(),
            rows.len(),
            "{} returned a flag count that differs from the rows",
            self.inner.name()
        );
        // A missing flag (a buggy policy) keeps the row on the small model.
        (0..rows.len())
            .map(|i| match flags.get(i) {
                Some(true) => Decision::Move { to: self.pair.large, commit: false },
                _ => Decision::Stay,
            })
            .collect()
    }

    fn decide_run(&self, run: &mut [RouteRow<'_>]) -> Vec<Decision> {
        let model = run[0].model;
        if model == self.pair.small {
            self.decide_small(run)
        } else if model == self.pair.large {
            // The large model produced its one token: keep it and hand back.
            vec![Decision::Move { to: self.pair.small, commit: true }; run.len()]
        } else {
            vec![Decision::Stay; run.len()]
        }
    }
}

impl<P: DelegatePolicy> Policy for BinaryAdapter<P> {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn entry_model(&self, _request: &mut EntryRequest<'_>) -> ModelIndex {
        self.pair.small
    }

    fn needs_hidden(&self, model: ModelIndex) -> bool {
        model == self.pair.small && self.inner.needs_hidden()
    }

    fn reserved_logit(&self, model: ModelIndex) -> Option<usize> {
        if model == self.pair.small {
            self.inner.reserved_logit()
        } else {
            None
        }
    }

    fn route(&self, rows: &mut [RouteRow<'_>]) -> Vec<Decision> {
        // The engine passes one model's rows per call; splitting into same-model runs
        // keeps a mixed batch correct too, and is free when there is one run.
        let mut decisions = Vec::with_capacity(rows.len());
        for run in rows.chunk_by_mut(|a, b| a.model == b.model) {
            decisions.extend(self.decide_run(run));
        }
        decisions
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::policy::PolicyState;

    /// Owned data behind a [`RouteRow`], for tests of every policy.
    pub(crate) struct RowData {
        pub model: ModelIndex,
        pub logits: Vec<f32>,
        pub hidden: Option<Vec<f32>>,
        pub sampled: u32,
        pub output: Vec<u32>,
        pub state: PolicyState,
    }

    impl RowData {
        pub fn new(model: ModelIndex, logits: Vec<f32>) -> Self {
            RowData { model, logits, hidden: None, sampled: 0, output: Vec::new(), state: PolicyState::default() }
        }

        pub fn row(&mut self) -> RouteRow<'_> {
            RouteRow {
                request_id: 0,
                model: self.model,
                logits: &self.logits,
                hidden: self.hidden.as_deref(),
                sampled: self.sampled,
                output: &self.output,
                state: &mut self.state,
            }
        }
    }

    /// Routes `data` in one call, as the engine would for one step.
    pub(crate) fn route_all(policy: &dyn Policy, data: &mut [RowData]) -> Vec<Decision> {
        let mut rows: Vec<RouteRow<'_>> = data.iter_mut().map(RowData::row).collect();
        policy.route(&mut rows)
    }

    /// Delegates rows whose first logit is positive.
    struct FirstLogitPositive;

    impl DelegatePolicy for FirstLogitPositive {
        fn name(&self) -> &str {
            "first-logit"
        }
        fn delegate(&self, rows: &mut [RouteRow<'_>]) -> Vec<bool> {
            rows.iter().map(|r| r.logits[0] > 0.0).collect()
        }
        fn needs_hidden(&self) -> bool {
            true
        }
    }

    fn adapter() -> BinaryAdapter<FirstLogitPositive> {
        BinaryAdapter::new(FirstLogitPositive, ModelPair { small: 2, large: 0 })
    }

    #[test]
    fn small_rows_delegate_by_flag_and_discard_the_token() {
        let mut data = vec![RowData::new(2, vec![1.0]), RowData::new(2, vec![-1.0])];
        let decisions = route_all(&adapter(), &mut data);
        assert_eq!(decisions, vec![Decision::Move { to: 0, commit: false }, Decision::Stay]);
    }

    #[test]
    fn large_rows_return_with_their_token_and_others_stay() {
        let mut data = vec![RowData::new(0, vec![1.0]), RowData::new(1, vec![1.0])];
        let decisions = route_all(&adapter(), &mut data);
        assert_eq!(decisions, vec![Decision::Move { to: 2, commit: true }, Decision::Stay]);
    }

    #[test]
    fn mixed_batches_are_routed_per_model() {
        let mut data = vec![RowData::new(2, vec![1.0]), RowData::new(0, vec![1.0]), RowData::new(2, vec![-1.0])];
        let decisions = route_all(&adapter(), &mut data);
        assert_eq!(
            decisions,
            vec![Decision::Move { to: 0, commit: false }, Decision::Move { to: 2, commit: true }, Decision::Stay]
        );
    }

    #[test]
    fn entry_and_hidden_follow_the_pair() {
        let policy = adapter();
        let mut state = PolicyState::default();
        let mut request = EntryRequest { request_id: 1, prompt: &[1, 2], max_tokens: 8, state: &mut state };
        assert_eq!(policy.entry_model(&mut request), 2);
        assert!(policy.needs_hidden(2));
        assert!(!policy.needs_hidden(0));
        assert_eq!(policy.name(), "first-logit");
        assert!(route_all(&policy, &mut []).is_empty());
    }
}

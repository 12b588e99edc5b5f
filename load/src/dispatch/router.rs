//! The routing policy as an external dispatcher runs it: the engine's own policy
//! objects (core/policy), asked after every one-token call which model writes next.
//! The dispatcher sees only what a server's API returns — the token and, when asked,
//! the log-probabilities of the top alternatives — so policies that read hidden
//! states (R2R, CITER) or a logit that is not a token (Co-LLM) cannot run here.

use std::sync::Arc;

use serde_json::Value;
use tokenrouter_core::policy::{self, Decision, EntryRequest, ModelIndex, ModelInfo, Policy, PolicyContext};
use tokenrouter_core::policy::{PolicyState, RouteRow};
use tokenrouter_core::sched::request::policy_seed;

/// The most alternatives our server reports per token (the sampler's limit).
pub const TOP_LOGPROBS: usize = 20;

/// What a policy reads from a step besides the sampled token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// Nothing (random, ensembles, query-level, always).
    None,
    /// The next-token distribution, through its entropy (R-Stitch, GlimpRouter).
    Distribution,
}

pub struct Router {
    policy: Arc<dyn Policy>,
    signal: Signal,
    vocab_size: usize,
}

impl Router {
    /// The policy `name` with `params` over the models (server names, in order).
    pub fn build(name: &str, params: &Value, models: &[String], vocab_size: usize) -> anyhow::Result<Router> {
        let signal = signal_of(name)?;
        let infos: Vec<ModelInfo> =
            models.iter().map(|m| ModelInfo { name: m.clone(), hidden_size: 0, vocab_size }).collect();
        let policy =
            policy::build(name, params, &infos, &PolicyContext::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
        Ok(Router { policy, signal, vocab_size })
    }

    pub fn name(&self) -> &str {
        self.policy.name()
    }

    /// Alternatives each call must report for this policy.
    pub fn top_logprobs(&self) -> usize {
        match self.signal {
            Signal::None => 0,
            Signal::Distribution => TOP_LOGPROBS,
        }
    }

    /// A new request: its policy state (seeded as the engine seeds it, so the same
    /// request routes the same way) and its entry model.
    pub fn admit(&self, sampling_seed: u64, prompt: &[u32], max_tokens: usize) -> (PolicyState, ModelIndex) {
        let mut state = self.policy.new_state(policy_seed(sampling_seed));
        let entry = self.policy.entry_model(&mut EntryRequest { request_id: 0, prompt, max_tokens, state: &mut state });
        (state, entry)
    }

    /// The decision after `model` wrote `sampled` at position `output.len()`.
    pub fn decide(
        &self,
        model: ModelIndex,
        sampled: u32,
        top_logprobs: &[f32],
        output: &[u32],
        state: &mut PolicyState,
    ) -> Decision {
        let logits = match self.signal {
            Signal::None => Vec::new(),
            Signal::Distribution => logits_from_top(top_logprobs, self.vocab_size),
        };
        let row = RouteRow { request_id: 0, model, logits: &logits, hidden: None, sampled, output, state };
        self.policy.route(&mut [row]).first().copied().unwrap_or(Decision::Stay)
    }
}

fn signal_of(name: &str) -> anyhow::Result<Signal> {
    match name {
        "random" | "me" | "query-level" | "always" => Ok(Signal::None),
        "rstitch" | "glimprouter" => Ok(Signal::Distribution),
        "r2r" | "citer" => anyhow::bail!(
            "policy `{name}` reads the small model's last hidden state, which no server API returns: \
             it runs only inside the engine"
        ),
        "colm" => anyhow::bail!(
            "policy `colm` reads the small model's extra defer logit, which no server API returns: \
             it runs only inside the engine"
        ),
        other => anyhow::bail!("unknown policy `{other}`; known: {}", policy::POLICY_NAMES.join(", ")),
    }
}

/// Logits whose softmax has the reported top log-probabilities and spreads the
/// remaining mass evenly over the rest of the vocabulary: of all distributions the
/// API's answer allows, the one of largest entropy. For the flat distributions of
/// random-weight models this is the true entropy to within rounding; for peaked
/// ones the top 20 carry nearly all the mass and the tail hardly counts.
pub fn logits_from_top(top_logprobs: &[f32], vocab_size: usize) -> Vec<f32> {
    let k = top_logprobs.len().min(vocab_size);
    let mut logits = Vec::with_capacity(vocab_size);
    logits.extend_from_slice(&top_logprobs[..k]);
    let rest = vocab_size - k;
    if rest > 0 {
        let covered: f64 = top_logprobs[..k].iter().map(|&lp| f64::from(lp).exp()).sum();
        let remaining = (1.0 - covered).max(0.0);
        let each = if remaining > 0.0 { (remaining / rest as f64).ln() as f32 } else { f32::NEG_INFINITY };
        logits.resize(vocab_size, each);
    }
    logits
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use tokenrouter_core::policy::logits::normalized_entropy;

    fn models() -> Vec<String> {
        vec!["small".into(), "large".into()]
    }

    #[test]
    fn the_tail_gets_the_remaining_mass_evenly() {
        let logits = logits_from_top(&[(0.5f32).ln(), (0.25f32).ln()], 6);
        let probs: Vec<f64> = logits.iter().map(|&l| f64::from(l).exp()).collect();
        assert!((probs.iter().sum::<f64>() - 1.0).abs() < 1e-6);
        assert!(probs[2..].iter().all(|p| (p - 0.0625).abs() < 1e-6), "{probs:?}");
        // A fully covered distribution leaves nothing for the tail.
        let all = logits_from_top(&[0.0], 3);
        assert_eq!(all[1], f32::NEG_INFINITY);
    }

    #[test]
    fn a_flat_distribution_reads_as_flat_and_a_peaked_one_as_peaked() {
        let vocab = 1000;
        let uniform = vec![-(vocab as f32).ln(); TOP_LOGPROBS];
        assert!(normalized_entropy(&logits_from_top(&uniform, vocab)) > 0.999);
        let peaked = [-1e-4f32, -12.0, -13.0];
        assert!(normalized_entropy(&logits_from_top(&peaked, vocab)) < 0.03);
    }

    #[test]
    fn random_routes_as_the_engine_does_and_needs_no_logprobs() {
        let router = Router::build("random", &json!({"p": 0.3}), &models(), 100).unwrap();
        assert_eq!(router.top_logprobs(), 0);
        let (mut state, entry) = router.admit(7, &[1, 2], 50);
        assert_eq!(entry, 0);
        assert_eq!(state.seed, policy_seed(7));
        let (mut delegated, mut output) = (0, Vec::new());
        for _ in 0..400 {
            match router.decide(0, 9, &[], &output, &mut state) {
                Decision::Move { to: 1, commit: false } => delegated += 1,
                d => assert_eq!(d, Decision::Stay),
            }
            // The large model's one token is committed and control returns.
            assert_eq!(router.decide(1, 9, &[], &output, &mut state), Decision::Move { to: 0, commit: true });
            output.push(9);
        }
        assert!((80..160).contains(&delegated), "{delegated} of 400 at p = 0.3");
    }

    #[test]
    fn rstitch_reads_the_entropy_from_the_top_logprobs() {
        let router = Router::build("rstitch", &json!({"tau": 0.03}), &models(), 1000).unwrap();
        assert_eq!(router.top_logprobs(), TOP_LOGPROBS);
        let (mut state, _) = router.admit(1, &[1], 8);
        let flat = vec![-(1000f32).ln(); TOP_LOGPROBS];
        let sure = [-1e-5f32, -13.0];
        assert_eq!(router.decide(0, 3, &flat, &[], &mut state), Decision::Move { to: 1, commit: false });
        assert_eq!(router.decide(0, 3, &sure, &[], &mut state), Decision::Stay);
        assert_eq!(router.decide(1, 3, &flat, &[], &mut state), Decision::Stay);
        assert_eq!(router.decide(1, 3, &sure, &[], &mut state), Decision::Move { to: 0, commit: true });
    }

    #[test]
    fn policies_that_need_what_an_api_hides_are_refused_with_the_reason() {
        for name in ["r2r", "citer", "colm"] {
            let e = Router::build(name, &Value::Null, &models(), 100).err().unwrap().to_string();
            assert!(e.contains("runs only inside the engine"), "{e}");
        }
        let e = Router::build("nope", &Value::Null, &models(), 100).err().unwrap().to_string();
        assert!(e.contains("unknown policy `nope`"), "{e}");
        let e = Router::build("random", &json!({"p": 2}), &models(), 100).err().unwrap().to_string();
        assert!(e.contains("`p` must be in [0, 1]"), "{e}");
    }
}

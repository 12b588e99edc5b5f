//! The closed-form cost model: savings = α(1 − 1/ρ). A fleet provisioned for the
//! worst-case context admits few sequences per instance (its KV must hold each one at
//! full context); a short pool admits more. ρ is that throughput gain on short traffic,
//! α the share of the homogeneous fleet's work that is short traffic. Both come from an
//! instance profile (KV capacity, batch cap, step time against batch size) and the
//! request stream.

use serde::{Deserialize, Serialize};

use super::trace::Arrival;

/// How one serving instance performs: its KV capacity and a linear step-time model
/// (decode step = base + per_seq × batch; a prompt adds per prompt token).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InstanceProfile {
    /// Tokens of KV cache per instance.
    pub kv_tokens: usize,
    /// Sequences in one batch at most (vLLM's max_num_seqs).
    pub max_batch: usize,
    pub step_base_s: f64,
    pub step_per_seq_s: f64,
    pub prefill_per_token_s: f64,
    /// Prompt tokens prefilled in one step at most (vLLM's max_num_batched_tokens);
    /// one prompt is always admitted, however long.
    pub step_token_budget: usize,
}

impl Default for InstanceProfile {
    /// A 70B-class model on one 8-GPU node (KV for ~500K tokens), in the range vLLM
    /// reports: ~25 ms per decode step plus 0.1 ms per sequence, prefill ~12K tok/s.
    fn default() -> Self {
        InstanceProfile {
            kv_tokens: 524_288,
            max_batch: 256,
            step_base_s: 0.025,
            step_per_seq_s: 0.0001,
            prefill_per_token_s: 0.000_08,
            step_token_budget: 8192,
        }
    }
}

impl InstanceProfile {
    /// Sequences an instance admits when provisioned for `max_context`: as many as its
    /// KV holds at full context, within the batch cap.
    pub fn concurrency(&self, max_context: usize) -> usize {
        (self.kv_tokens / max_context.max(1)).clamp(1, self.max_batch)
    }

    pub fn step_seconds(&self, batch: usize, prefill_tokens: usize) -> f64 {
        self.step_base_s + self.step_per_seq_s * batch as f64 + self.prefill_per_token_s * prefill_tokens as f64
    }

    /// The step-time model fitted to measured decode steps `(batch, seconds)` by least
    /// squares, with a measured prefill rate; KV and batch cap are the deployment's.
    pub fn fitted(decode: &[(usize, f64)], prefill_tokens_per_s: f64, kv_tokens: usize, max_batch: usize) -> Self {
        let n = decode.len().max(1) as f64;
        let mean_b = decode.iter().map(|p| p.0 as f64).sum::<f64>() / n;
        let mean_t = decode.iter().map(|p| p.1).sum::<f64>() / n;
        let var: f64 = decode.iter().map(|p| (p.0 as f64 - mean_b).powi(2)).sum();
        let cov: f64 = decode.iter().map(|p| (p.0 as f64 - mean_b) * (p.1 - mean_t)).sum();
        let per_seq = if var > 0.0 { (cov / var).max(0.0) } else { 0.0 };
        InstanceProfile {
            kv_tokens,
            max_batch,
            step_base_s: (mean_t - per_seq * mean_b).max(0.0),
            step_per_seq_s: per_seq,
            prefill_per_token_s: 1.0 / prefill_tokens_per_s.max(f64::MIN_POSITIVE),
            step_token_budget: InstanceProfile::default().step_token_budget,
        }
    }

    /// Instance-seconds one request of these sizes costs in a full batch of `batch`:
    /// its share of every decode step, plus its prefill.
    pub fn request_seconds(&self, batch: usize, prompt: f64, output: f64) -> f64 {
        output * self.step_seconds(batch, 0) / batch as f64 + prompt * self.prefill_per_token_s
    }
}

/// Sizes of a class of traffic.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ClassStats {
    pub requests: usize,
    pub mean_prompt: f64,
    pub mean_output: f64,
}

impl ClassStats {
    pub fn of<'a>(arrivals: impl Iterator<Item = &'a Arrival>) -> Self {
        let (mut n, mut prompt, mut output) = (0usize, 0.0, 0.0);
        for a in arrivals {
            n += 1;
            prompt += a.prompt_tokens as f64;
            output += a.output_tokens as f64;
        }
        let d = n.max(1) as f64;
        ClassStats { requests: n, mean_prompt: prompt / d, mean_output: output / d }
    }

    /// Instance-seconds the whole class costs on instances admitting `batch` sequences.
    fn work(&self, profile: &InstanceProfile, batch: usize) -> f64 {
        self.requests as f64 * profile.request_seconds(batch, self.mean_prompt, self.mean_output)
    }
}

/// The two pools' context limits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PoolContexts {
    pub short: usize,
    pub long: usize,
}

/// The closed form on a request stream, with instance counts at a target utilization.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct CostPlan {
    pub short: ClassStats,
    pub long: ClassStats,
    /// Share of requests that fit the short pool.
    pub alpha_requests: f64,
    /// Share of the homogeneous fleet's work that is short traffic (the α of the formula).
    pub alpha: f64,
    pub rho: f64,
    /// α(1 − 1/ρ).
    pub savings: f64,
    pub short_concurrency: usize,
    pub long_concurrency: usize,
    pub homogeneous_instances: f64,
    pub short_instances: f64,
    pub long_instances: f64,
}

impl CostPlan {
    /// `utilization` is the busy share each instance is planned at (< 1 leaves headroom).
    pub fn new(arrivals: &[Arrival], profile: &InstanceProfile, pools: PoolContexts, utilization: f64) -> Self {
        let fits = |a: &&Arrival| a.total_tokens() <= pools.short;
        let short = ClassStats::of(arrivals.iter().filter(fits));
        let long = ClassStats::of(arrivals.iter().filter(|a| !fits(a)));
        let (bs, bl) = (profile.concurrency(pools.short), profile.concurrency(pools.long));
        let duration = arrivals.last().map_or(1.0, |a| a.at_s).max(1e-9);
        let (short_on_long, long_work) = (short.work(profile, bl), long.work(profile, bl));
        let short_on_short = short.work(profile, bs);
        let instances = |work: f64| work / duration / utilization;
        let alpha = short_on_long / (short_on_long + long_work).max(f64::MIN_POSITIVE);
        let rho = short_on_long / short_on_short.max(f64::MIN_POSITIVE);
        CostPlan {
            short,
            long,
            alpha_requests: short.requests as f64 / arrivals.len().max(1) as f64,
            alpha,
            rho,
            savings: savings(alpha, rho),
            short_concurrency: bs,
            long_concurrency: bl,
            homogeneous_instances: instances(short_on_long + long_work),
            short_instances: instances(short_on_short),
            long_instances: instances(long_work),
        }
    }
}

impl CostPlan {
    /// The plan with a measured ρ (e.g. from benchmarks of both pool configurations)
    /// in place of the profile's: the short pool's instances scale with it.
    pub fn with_measured_rho(mut self, rho: f64) -> Self {
        let short_on_long = self.alpha * self.homogeneous_instances;
        self.rho = rho;
        self.savings = savings(self.alpha, rho);
        self.short_instances = short_on_long / rho;
        self
    }
}

/// The closed form: the share of instances a dual-pool fleet saves.
pub fn savings(alpha: f64, rho: f64) -> f64 {
    if rho <= 0.0 {
        return 0.0;
    }
    alpha * (1.0 - 1.0 / rho)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arrival(at_s: f64, prompt: u32, output: u32) -> Arrival {
        Arrival { at_s, prompt_tokens: prompt, output_tokens: output }
    }

    #[test]
    fn concurrency_follows_kv_at_full_context_within_the_batch_cap() {
        let p = InstanceProfile { kv_tokens: 65_536, max_batch: 64, ..InstanceProfile::default() };
        assert_eq!(p.concurrency(8192), 8);
        assert_eq!(p.concurrency(2048), 32);
        assert_eq!(p.concurrency(512), 64);
        assert_eq!(p.concurrency(1 << 20), 1);
    }

    #[test]
    fn the_plan_splits_traffic_and_its_instances_match_the_closed_form() {
        let profile = InstanceProfile { kv_tokens: 65_536, max_batch: 64, ..InstanceProfile::default() };
        let mut arrivals: Vec<Arrival> = (0..80).map(|i| arrival(i as f64, 500, 100)).collect();
        arrivals.extend((0..20).map(|i| arrival(80.0 + i as f64, 5000, 300)));
        let plan = CostPlan::new(&arrivals, &profile, PoolContexts { short: 2048, long: 8192 }, 0.8);
        assert_eq!((plan.short.requests, plan.long.requests), (80, 20));
        assert_eq!(plan.alpha_requests, 0.8);
        assert!(plan.rho > 1.0 && plan.alpha > 0.0 && plan.alpha < 0.8);
        let dual = plan.short_instances + plan.long_instances;
        let measured = 1.0 - dual / plan.homogeneous_instances;
        assert!((measured - plan.savings).abs() < 1e-12, "{measured} vs {}", plan.savings);
        assert_eq!(savings(0.5, 2.0), 0.25);
        let fitted = InstanceProfile::fitted(&[(1, 0.021), (8, 0.028), (32, 0.052)], 1000.0, 1024, 64);
        assert!((fitted.step_base_s - 0.02).abs() < 1e-9 && (fitted.step_per_seq_s - 0.001).abs() < 1e-9);
        assert_eq!(fitted.prefill_per_token_s, 0.001);
        assert_eq!(savings(0.5, 0.0), 0.0);
        let measured = plan.with_measured_rho(2.0);
        let dual = measured.short_instances + measured.long_instances;
        assert!((1.0 - dual / measured.homogeneous_instances - measured.alpha * 0.5).abs() < 1e-12);
    }
}

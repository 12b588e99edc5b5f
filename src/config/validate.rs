//! Checks that serde's types cannot express: names that must refer to models, sizes
//! that must not be zero, a threshold table that must not deadlock. Every problem is
//! reported (not only the first), each with its key path.

use std::collections::HashSet;
use std::time::Duration;
use tokenrouter_core::model::{cuda::kv_dtype_on_cuda, BackendKind, DeviceSpec, KvDtype, WeightDtype};
use tokenrouter_core::sched::planner::{ReplanConfig, WorkloadPrior};

use serde_json::Value;
use tokenrouter_core::model::attention::MAX_BLOCK_SIZE;
use tokenrouter_core::policy::POLICY_NAMES;
use tokenrouter_core::sched::batching::BatchingError;
use tokenrouter_core::sched::{BatchingRule, Threshold};
use tokenrouter_core::spec::{SpeculationMethod, MAX_DRAFT_TOKENS};

use super::error::{ConfigError, Problems};
use super::hub::HubModel;
use super::scheduler::{ExclusiveCompute, ReplanSetting, ThresholdSpec};
use super::ServerConfig;

impl ServerConfig {
    /// Every semantic check that needs no file system (`from_yaml_str` runs it).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Problems::default();
        self.check_models(&mut problems);
        self.check_policy(&mut problems);
        self.check_scheduler(&mut problems);
        self.check_server(&mut problems);
        self.check_pools(&mut problems);
        self.tokenization.check(&mut problems);
        for (key, message) in self.admission.problems() {
            problems.push(key, message);
        }
        for (key, message) in self.supervision.problems() {
            problems.push(key, message);
        }
        if let Some(cluster) = &self.cluster {
            for (key, message) in cluster.problems(&self.model_names()) {
                problems.push(key, message);
            }
        }
        problems.finish()
    }

    fn check_models(&self, p: &mut Problems) {
        if self.models.is_empty() {
            p.push("models", "give at least one model");
        }
        let mut seen = HashSet::new();
        for (i, m) in self.models.iter().enumerate() {
            let at = |key: &str| format!("models[{i}].{key}");
            if m.name.trim().is_empty() {
                p.push(at("name"), "must not be empty");
            } else if !seen.insert(m.name.as_str()) {
                p.push(at("name"), format!("`{}` names two models; names must be unique", m.name));
            }
            let given: Vec<&str> = [
                ("`path`", m.path.is_some()),
                ("`preset`", m.preset.is_some()),
                ("`source`", m.source.is_some()),
                ("`hub`", m.hub.is_some()),
            ]
            .iter()
            .filter(|(_, set)| *set)
            .map(|(key, _)| *key)
            .collect();
            match given.len() {
                0 => p.push(
                    format!("models[{i}]"),
                    "give `path` (a Hugging Face model folder or a .gguf file), `preset` (tiny, small or medium), \
                     `source` (smollm2) or `hub` (a Hugging Face Hub id, ORG/NAME or ORG/NAME:FILE)",
                ),
                1 => {}
                _ => p.push(format!("models[{i}]"), format!("give one of {}, not several", given.join(", "))),
            }
            if let Some(id) = &m.hub {
                if HubModel::parse(id).is_none() {
                    p.push(
                        at("hub"),
                        format!("{id:?} is not a Hub id: give ORG/NAME, or ORG/NAME:FILE for one GGUF file"),
                    );
                }
            }
            if m.seed.is_some() && m.preset.is_none() {
                p.push(at("seed"), "only preset models have a seed");
            }
            if m.tokenizer.is_some() && m.preset.is_none() {
                p.push(at("tokenizer"), "only preset models take a tokenizer; other models bring their own");
            }
            if let Some(cap) = m.max_context {
                if cap < 2 {
                    p.push(
                        at("max_context"),
                        format!("must be at least 2 (a prompt token and an output token), got {cap}"),
                    );
                }
            }
            p.positive(at("kv_budget_mib"), m.kv_budget_mib);
            if m.kv_budget_mib.checked_mul(1 << 20).and_then(|b| usize::try_from(b).ok()).is_none() {
                p.push(
                    at("kv_budget_mib"),
                    format!("{} MiB does not fit this machine's address space", m.kv_budget_mib),
                );
            }
            if !(1..=MAX_BLOCK_SIZE).contains(&m.block_size) {
                p.push(at("block_size"), format!("must be in 1..={MAX_BLOCK_SIZE}, got {}", m.block_size));
            }
            if let Some(threads) = m.threads {
                p.positive(at("threads"), threads as u64);
            }
            if m.device.is_cuda() {
                check_cuda_model(p, i, m);
            } else if m.backend == BackendKind::Candle {
                if let Err(e) = m.dtype.candle() {
                    p.push(at("dtype"), e.to_string());
                }
                if m.kv_dtype == KvDtype::Bf16 {
                    p.push(at("kv_dtype"), "bf16 K/V run on a CUDA device only (device: cuda:N); use f32 or f16");
                }
            }
        }
    }

    fn check_policy(&self, p: &mut Problems) {
        let policy = &self.policy;
        check_policy_name(p, "policy.name", &policy.name);
        check_params(p, "policy.params", &policy.params);
        let mut seen = HashSet::new();
        for (i, allowed) in policy.allowed.iter().enumerate() {
            check_policy_name(p, &format!("policy.allowed[{i}].name"), &allowed.name);
            check_params(p, &format!("policy.allowed[{i}].params"), &allowed.params);
            if !seen.insert(allowed.name.as_str()) {
                p.push(format!("policy.allowed[{i}].name"), format!("`{}` is listed twice", allowed.name));
            }
        }
    }

    fn check_scheduler(&self, p: &mut Problems) {
        let s = &self.scheduler;
        p.positive("scheduler.max_batch_rows", s.max_batch_rows as u64);
        p.positive("scheduler.prefill_chunk", s.prefill_chunk as u64);
        p.positive("scheduler.step_token_budget", s.step_token_budget as u64);
        let names = self.model_names();
        for name in s.thresholds.keys() {
            if !names.contains(name) {
                p.push(
                    format!("scheduler.thresholds.{name}"),
                    format!("no model is named `{name}`; models: {}", names.join(", ")),
                );
            }
        }
        if let Err(e) = self.batching_rule() {
            p.absorb(e);
        }
        if let Some(spec) = &s.speculative {
            if spec.method == Some(SpeculationMethod::Draft) && names.len() < 2 {
                p.push("scheduler.speculative.method", "\"draft\" needs a draft model: the config has one model");
            }
            if !(1..=MAX_DRAFT_TOKENS).contains(&spec.max_tokens) {
                p.push(
                    "scheduler.speculative.max_tokens",
                    format!("must be in 1..={MAX_DRAFT_TOKENS}, got {}", spec.max_tokens),
                );
            }
            if let Some(cost) = spec.step_cost {
                for (field, ms) in [("fixed_ms", cost.fixed_ms), ("per_token_ms", cost.per_token_ms)] {
                    if !(ms >= 0.0 && ms.is_finite()) {
                        p.push(
                            &format!("scheduler.speculative.step_cost.{field}"),
                            format!("must be 0 or more, got {ms}"),
                        );
                    }
                }
                if cost.fixed_ms + cost.per_token_ms <= 0.0 {
                    p.push(
                        "scheduler.speculative.step_cost",
                        "a step must cost something: fixed_ms or per_token_ms above 0",
                    );
                }
            }
        }
        if let ReplanSetting::On(replan) = &s.replan {
            if !(replan.interval_s >= 0.1 && replan.interval_s.is_finite()) {
                p.push(
                    "scheduler.replan.interval_s",
                    format!("must be at least 0.1 seconds, got {}", replan.interval_s),
                );
            }
            if !(replan.margin >= 0.0 && replan.margin.is_finite()) {
                p.push("scheduler.replan.margin", format!("must be a non-negative fraction, got {}", replan.margin));
            }
            if replan.confirmations == 0 {
                p.push("scheduler.replan.confirmations", "must be at least 1 (windows in a row before a switch)");
            }
            if !(replan.expected_prompt_tokens >= 0.0 && replan.expected_prompt_tokens.is_finite()) {
                let got = replan.expected_prompt_tokens;
                p.push("scheduler.replan.expected_prompt_tokens", format!("must be a non-negative number, got {got}"));
            }
            if !(replan.expected_output_tokens >= 1.0 && replan.expected_output_tokens.is_finite()) {
                let got = replan.expected_output_tokens;
                p.push("scheduler.replan.expected_output_tokens", format!("must be at least 1, got {got}"));
            }
        }
    }

    /// The planner's settings: on by default, off with `replan: false`, and off where
    /// thresholds are written by hand unless `replan` is set too (then it starts from them).
    pub fn replan_config(&self) -> Option<ReplanConfig> {
        let section = match &self.scheduler.replan {
            ReplanSetting::Off => return None,
            ReplanSetting::Auto if !self.scheduler.thresholds.is_empty() => return None,
            ReplanSetting::Auto => Default::default(),
            ReplanSetting::On(section) => section.clone(),
        };
        Some(ReplanConfig {
            interval: Duration::from_secs_f64(section.interval_s.max(0.1)),
            margin: section.margin,
            min_steps: section.min_steps,
            confirmations: section.confirmations,
            max_batch: self.scheduler.max_batch_rows,
            entry_model: 0,
            plan_at_start: section.plan_at_start && self.scheduler.thresholds.is_empty(),
            exclusive_compute: self.exclusive_compute(),
            workload: WorkloadPrior {
                prompt_tokens: section.expected_prompt_tokens,
                output_tokens: section.expected_output_tokens,
            },
        })
    }

    /// Whether models take turns on the compute: `auto` where two or more models run on
    /// this host's CPU cores (their steps would only time-slice each other); models on
    /// cards or on other hosts overlap.
    pub fn exclusive_compute(&self) -> bool {
        match self.scheduler.exclusive_compute {
            ExclusiveCompute::On => true,
            ExclusiveCompute::Off => false,
            ExclusiveCompute::Auto => {
                let remote =
                    |name: &str| self.cluster.as_ref().is_some_and(|c| c.remote.iter().any(|r| r.model == name));
                let on_cpu = self.models.iter().filter(|m| m.device == DeviceSpec::Cpu && !remote(&m.name)).count();
                on_cpu >= 2
            }
        }
    }

    fn check_server(&self, p: &mut Problems) {
        let s = &self.server;
        if s.host.trim().is_empty() {
            p.push("server.host", "must not be empty");
        }
        p.positive("server.port", s.port as u64);
        p.positive("server.max_body_bytes", s.max_body_bytes as u64);
        p.positive("server.max_queued_requests", s.max_queued_requests as u64);
        if let Some(limit) = s.max_tokens_limit {
            p.positive("server.max_tokens_limit", limit as u64);
        }
        for (i, key) in s.api_keys.iter().enumerate() {
            if key.is_empty() || key.chars().any(char::is_whitespace) {
                p.push(format!("server.api_keys[{i}]"), "a key must be non-empty, without whitespace");
            }
        }
    }

    /// The delayed-batching rule in engine model order: models without a threshold get 1.
    /// Thresholds naming no model are ignored here (`validate` reports them).
    pub fn batching_rule(&self) -> Result<BatchingRule, ConfigError> {
        let thresholds = self
            .models
            .iter()
            .map(|m| match self.scheduler.thresholds.get(&m.name) {
                None => Threshold::Fixed(1),
                Some(ThresholdSpec::Fixed(b)) => Threshold::Fixed(*b),
                Some(ThresholdSpec::ByActive(table)) => {
                    Threshold::ByActive(table.iter().map(|(&n, &b)| (n, b)).collect())
                }
            })
            .collect();
        let rule = BatchingRule { thresholds, max_wait: self.scheduler.max_wait_ms.map(Duration::from_millis) };
        rule.validate(self.models.len()).map_err(|e| match e {
            BatchingError::Zero { model } => ConfigError::new(
                format!("scheduler.thresholds.{}", self.models[model].name),
                "a threshold is 0; thresholds start at 1",
            ),
            other => ConfigError::new("scheduler.thresholds", other.to_string()),
        })?;
        Ok(rule)
    }
}

fn check_policy_name(p: &mut Problems, path: &str, name: &str) {
    if !POLICY_NAMES.contains(&name) {
        p.push(path, format!("unknown policy `{name}`; known: {}", POLICY_NAMES.join(", ")));
    }
}

fn check_params(p: &mut Problems, path: &str, params: &Value) {
    if !matches!(params, Value::Null | Value::Object(_)) {
        p.push(path, format!("must be a mapping of parameters, got {params}"));
    }
}

/// A model on a card: the CUDA backend's types, an HF folder or preset, no CPU backend.
fn check_cuda_model(p: &mut Problems, i: usize, m: &super::schema::ModelEntry) {
    let at = |key: &str| format!("models[{i}].{key}");
    if m.backend != BackendKind::Candle {
        p.push(
            at("backend"),
            format!("{} runs on the CPU; leave `backend` unset for {}", m.backend.as_str(), m.device),
        );
    }
    if !matches!(m.dtype, WeightDtype::Bf16 | WeightDtype::F16) {
        p.push(at("dtype"), format!("{} runs bf16 or f16 weights, got {}", m.device, m.dtype.as_str()));
    } else if let Err(e) = kv_dtype_on_cuda(m.dtype, m.kv_dtype) {
        p.push(at("kv_dtype"), e.to_string());
    }
    if m.threads.is_some() {
        p.push(at("threads"), format!("CPU threads do not apply to a model on {}", m.device));
    }
}

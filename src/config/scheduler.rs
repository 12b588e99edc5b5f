//! `scheduler`: delayed batching, step sizes, and who picks the thresholds. Out of the
//! box the planner does (a start-up profile, a table per N, re-planning from served
//! counters); thresholds written by hand win over it.

use std::collections::BTreeMap;
use std::fmt;

use serde::de::{self, value::MapAccessDeserializer, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use tokenrouter_actors::StepLimits;
use tokenrouter_core::spec::{DraftingConfig, Speculation, SpeculationMethod, StepCost};

/// Delayed batching and step sizes, for every subserver.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SchedulerSection {
    /// Per model name: launch a step only when this many requests are ready on it.
    /// Absent: the planner chooses (see `replan`).
    #[serde(default)]
    pub thresholds: BTreeMap<String, ThresholdSpec>,
    /// Launch anyway once the oldest ready request has waited this long.
    #[serde(default)]
    pub max_wait_ms: Option<u64>,
    #[serde(default = "defaults::max_batch_rows")]
    pub max_batch_rows: usize,
    #[serde(default = "defaults::prefill_chunk")]
    pub prefill_chunk: usize,
    #[serde(default = "defaults::step_token_budget")]
    pub step_token_budget: usize,
    /// One model steps at a time, taking fair turns: `auto` (the default) turns it on
    /// where two or more models compute on this host's CPU cores.
    #[serde(default)]
    pub exclusive_compute: ExclusiveCompute,
    /// The planner: `auto` (absent; on unless `thresholds` are given), `false`, `true`,
    /// or a mapping of its settings.
    #[serde(default)]
    pub replan: ReplanSetting,
    /// Time a short profile of each model at start-up for the planner's first table
    /// (models with a saved `profile` skip it).
    #[serde(default = "defaults::startup_profile")]
    pub startup_profile: bool,
    /// Speculative decoding for every request that does not say otherwise (absent: off).
    #[serde(default)]
    pub speculative: Option<SpeculativeSection>,
}

/// `scheduler.speculative`: `{method: suffix, max_tokens: 8}`; without `method`, only
/// the settings for requests that ask for speculation themselves.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeSection {
    #[serde(default, deserialize_with = "speculation_method")]
    pub method: Option<SpeculationMethod>,
    #[serde(default = "defaults::draft_tokens")]
    pub max_tokens: usize,
    /// Draft lengths are chosen against this step cost, not the one each model measures.
    #[serde(default)]
    pub step_cost: Option<StepCostSection>,
    /// Most nodes of each model's suffix cache over recent outputs.
    #[serde(default = "defaults::suffix_cache_nodes")]
    pub suffix_cache_nodes: usize,
}

/// `step_cost: {fixed_ms: 10, per_token_ms: 0.05}`: a step's time as a fixed part and one per token fed.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepCostSection {
    pub fixed_ms: f64,
    pub per_token_ms: f64,
}

impl SpeculativeSection {
    /// What requests that say nothing get, if anything.
    pub fn speculation(&self) -> Option<Speculation> {
        let method = Some(self.method?);
        Some(Speculation { method, max_tokens: self.max_tokens, prediction: Vec::new() })
    }

    pub fn drafting(&self) -> DraftingConfig {
        DraftingConfig {
            step_cost: self
                .step_cost
                .map(|c| StepCost { intercept: c.fixed_ms / 1000.0, per_token: c.per_token_ms / 1000.0 }),
            suffix_cache_nodes: self.suffix_cache_nodes,
        }
    }
}

fn speculation_method<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SpeculationMethod>, D::Error> {
    String::deserialize(d)?.parse().map(Some).map_err(de::Error::custom)
}

/// `scheduler.replan`: every `interval_s` the engine re-estimates routing and step
/// cost over the last window and switches thresholds at the current N when the
/// planner predicts more than `margin` gain.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplanSection {
    #[serde(default = "defaults::replan_interval_s")]
    pub interval_s: f64,
    #[serde(default = "defaults::replan_margin")]
    pub margin: f64,
    #[serde(default = "defaults::replan_min_steps")]
    pub min_steps: u64,
    /// Windows in a row that must call for the same thresholds before a switch.
    #[serde(default = "defaults::replan_confirmations")]
    pub confirmations: u32,
    /// Plan a table per N at start-up from the models' costs.
    #[serde(default = "defaults::startup_profile")]
    pub plan_at_start: bool,
    /// The mean prompt and output lengths the start-up plan assumes (re-planning then
    /// reads what rows really feed).
    #[serde(default = "defaults::expected_prompt_tokens")]
    pub expected_prompt_tokens: f64,
    #[serde(default = "defaults::expected_output_tokens")]
    pub expected_output_tokens: f64,
}

impl Default for ReplanSection {
    fn default() -> Self {
        ReplanSection {
            interval_s: defaults::replan_interval_s(),
            margin: defaults::replan_margin(),
            min_steps: defaults::replan_min_steps(),
            confirmations: defaults::replan_confirmations(),
            plan_at_start: true,
            expected_prompt_tokens: defaults::expected_prompt_tokens(),
            expected_output_tokens: defaults::expected_output_tokens(),
        }
    }
}

/// Whether the planner runs.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum ReplanSetting {
    /// On with default settings, unless thresholds are written by hand.
    #[default]
    Auto,
    Off,
    On(ReplanSection),
}

impl<'de> Deserialize<'de> for ReplanSetting {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SettingVisitor;

        impl<'de> Visitor<'de> for SettingVisitor {
            type Value = ReplanSetting;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false, or a mapping of re-planning settings")
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<ReplanSetting, E> {
                Ok(if on { ReplanSetting::On(ReplanSection::default()) } else { ReplanSetting::Off })
            }

            fn visit_unit<E: de::Error>(self) -> Result<ReplanSetting, E> {
                Ok(ReplanSetting::Auto)
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ReplanSetting, A::Error> {
                ReplanSection::deserialize(MapAccessDeserializer::new(map)).map(ReplanSetting::On)
            }
        }

        deserializer.deserialize_any(SettingVisitor)
    }
}

/// `scheduler.exclusive_compute`: `auto`, `true` or `false`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ExclusiveCompute {
    #[default]
    Auto,
    On,
    Off,
}

impl<'de> Deserialize<'de> for ExclusiveCompute {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ExclusiveVisitor;

        impl<'de> Visitor<'de> for ExclusiveVisitor {
            type Value = ExclusiveCompute;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("true, false or auto")
            }

            fn visit_bool<E: de::Error>(self, on: bool) -> Result<ExclusiveCompute, E> {
                Ok(if on { ExclusiveCompute::On } else { ExclusiveCompute::Off })
            }

            fn visit_str<E: de::Error>(self, v: &str) -> Result<ExclusiveCompute, E> {
                match v {
                    "auto" => Ok(ExclusiveCompute::Auto),
                    _ => Err(E::invalid_value(de::Unexpected::Str(v), &self)),
                }
            }
        }

        deserializer.deserialize_any(ExclusiveVisitor)
    }
}

impl Default for SchedulerSection {
    fn default() -> Self {
        SchedulerSection {
            thresholds: BTreeMap::new(),
            max_wait_ms: None,
            max_batch_rows: defaults::max_batch_rows(),
            prefill_chunk: defaults::prefill_chunk(),
            step_token_budget: defaults::step_token_budget(),
            exclusive_compute: ExclusiveCompute::Auto,
            replan: ReplanSetting::Auto,
            startup_profile: true,
            speculative: None,
        }
    }
}

mod defaults {
    use super::StepLimits;
    use tokenrouter_core::sched::planner::ReplanConfig;

    pub fn replan_interval_s() -> f64 {
        ReplanConfig::default().interval.as_secs_f64()
    }

    pub fn replan_margin() -> f64 {
        ReplanConfig::default().margin
    }

    pub fn replan_min_steps() -> u64 {
        ReplanConfig::default().min_steps
    }

    pub fn replan_confirmations() -> u32 {
        ReplanConfig::default().confirmations
    }

    pub fn expected_prompt_tokens() -> f64 {
        ReplanConfig::default().workload.prompt_tokens
    }

    pub fn expected_output_tokens() -> f64 {
        ReplanConfig::default().workload.output_tokens
    }

    pub fn draft_tokens() -> usize {
        tokenrouter_core::spec::DEFAULT_DRAFT_TOKENS
    }

    pub fn suffix_cache_nodes() -> usize {
        tokenrouter_core::spec::DEFAULT_SUFFIX_CACHE_NODES
    }

    pub fn startup_profile() -> bool {
        true
    }

    pub fn max_batch_rows() -> usize {
        StepLimits::default().max_batch_rows
    }

    pub fn prefill_chunk() -> usize {
        StepLimits::default().prefill_chunk
    }

    pub fn step_token_budget() -> usize {
        StepLimits::default().step_token_budget
    }
}

/// A model's batching threshold: one number, or a table by the number of active
/// requests N (the entry at the largest N' ≤ N applies).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ThresholdSpec {
    Fixed(usize),
    ByActive(BTreeMap<usize, usize>),
}

impl<'de> Deserialize<'de> for ThresholdSpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ThresholdVisitor;

        impl<'de> Visitor<'de> for ThresholdVisitor {
            type Value = ThresholdSpec;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a threshold (an integer) or a table {active requests: threshold}")
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<ThresholdSpec, E> {
                usize::try_from(v).map(ThresholdSpec::Fixed).map_err(|_| E::custom("threshold too large"))
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<ThresholdSpec, E> {
                match u64::try_from(v) {
                    Ok(v) => self.visit_u64(v),
                    Err(_) => Err(E::invalid_value(de::Unexpected::Signed(v), &self)),
                }
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<ThresholdSpec, A::Error> {
                let mut table = BTreeMap::new();
                while let Some((active, threshold)) = map.next_entry::<usize, usize>()? {
                    if table.insert(active, threshold).is_some() {
                        return Err(de::Error::custom(format!("N = {active} appears twice")));
                    }
                }
                if table.is_empty() {
                    return Err(de::Error::custom("an empty table; give at least one {N: threshold}"));
                }
                Ok(ThresholdSpec::ByActive(table))
            }
        }

        deserializer.deserialize_any(ThresholdVisitor)
    }
}

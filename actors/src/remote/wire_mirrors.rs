//! The wire shapes of core types that are not serde, or not in a form postcard can
//! read: serde "remote" mirrors (`#[serde(remote = ..)]`), which name every field, so a
//! field added in core fails to compile here instead of silently not crossing.
//! Field and variant order is the encoding: changing it means bumping `WIRE_VERSION`.

use serde::de::Error as _;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{ModelIndex, PolicyDescriptor, PolicyState};
use tokenrouter_core::sched::batching::Threshold;
use tokenrouter_core::sched::{FinishReason, RequestEvent, RequestId, Travel};
use tokenrouter_core::spec::{DraftSource, Speculation, SpeculationMethod};

#[derive(Serialize, Deserialize)]
#[serde(remote = "SamplingParams")]
pub(super) struct SamplingParamsDef {
    temperature: f32,
    top_k: usize,
    top_p: f32,
    min_p: f32,
    repetition_penalty: f32,
    presence_penalty: f32,
    frequency_penalty: f32,
    seed: u64,
    logprobs: Option<usize>,
    logit_bias: Vec<(u32, f32)>,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "PolicyDescriptor")]
pub(super) struct PolicyDescriptorDef {
    name: String,
    #[serde(with = "json_text")]
    params: Value,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "Speculation")]
struct SpeculationDef {
    method: Option<SpeculationMethod>,
    max_tokens: usize,
    prediction: Vec<u32>,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "Travel")]
struct TravelDef {
    policy_state: PolicyState,
    seen: Vec<usize>,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "FinishReason")]
enum FinishReasonDef {
    Stop,
    Length,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "DraftSource")]
enum DraftSourceDef {
    Prediction,
    Ngram,
    Suffix,
    Draft,
}

#[derive(Serialize, Deserialize)]
#[serde(remote = "RequestEvent")]
pub(super) enum RequestEventDef {
    Token {
        id: RequestId,
        index: usize,
        token: u32,
        model: ModelIndex,
        logprob: Option<f32>,
        top_logprobs: Vec<(u32, f32)>,
    },
    Moved {
        id: RequestId,
        from: ModelIndex,
        to: ModelIndex,
    },
    Finished {
        id: RequestId,
        #[serde(with = "FinishReasonDef")]
        reason: FinishReason,
    },
    Failed {
        id: RequestId,
        message: String,
    },
    OutOfService {
        id: RequestId,
        message: String,
    },
    Verified {
        id: RequestId,
        model: ModelIndex,
        first_index: usize,
        drafted: usize,
        accepted: usize,
        #[serde(with = "DraftSourceDef")]
        source: DraftSource,
    },
    CachedPrefix {
        id: RequestId,
        model: ModelIndex,
        tokens: usize,
    },
    Resume {
        id: RequestId,
        model: ModelIndex,
        output_len: usize,
        #[serde(with = "TravelDef")]
        travel: Travel,
    },
}

/// Tagged on the wire: core's `Threshold` is untagged (configs write `2` or
/// `[[1, 1], [8, 4]]`), and untagged enums need a self-describing format.
#[derive(Serialize, Deserialize)]
#[serde(remote = "Threshold")]
enum ThresholdDef {
    Fixed(usize),
    ByActive(Vec<(usize, usize)>),
}

/// Policy parameters are free-form JSON (`serde_json::Value`), which only a
/// self-describing format can read back: they cross as JSON text.
mod json_text {
    use super::*;

    pub fn serialize<S: Serializer>(value: &Value, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Value, D::Error> {
        serde_json::from_str(&String::deserialize(d)?).map_err(D::Error::custom)
    }
}

// serde's `with` does not reach inside an `Option` or a `Vec`: these wrap the element.

pub(super) mod optional_speculation {
    use super::*;

    #[derive(Serialize)]
    struct Borrowed<'a>(#[serde(with = "SpeculationDef")] &'a Speculation);

    #[derive(Deserialize)]
    struct Owned(#[serde(with = "SpeculationDef")] Speculation);

    pub fn serialize<S: Serializer>(value: &Option<Speculation>, s: S) -> Result<S::Ok, S::Error> {
        value.as_ref().map(Borrowed).serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Speculation>, D::Error> {
        Ok(Option::<Owned>::deserialize(d)?.map(|owned| owned.0))
    }
}

pub(super) mod threshold_list {
    use super::*;

    #[derive(Serialize)]
    struct Borrowed<'a>(#[serde(with = "ThresholdDef")] &'a Threshold);

    #[derive(Deserialize)]
    struct Owned(#[serde(with = "ThresholdDef")] Threshold);

    pub fn serialize<S: Serializer>(value: &[Threshold], s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(value.iter().map(Borrowed))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Threshold>, D::Error> {
        Ok(Vec::<Owned>::deserialize(d)?.into_iter().map(|owned| owned.0).collect())
    }
}

//! The messages that cross hosts, and their versioned binary encoding.
//!
//! Only small things travel: request ids, the token suffix a model has not seen,
//! positions, sampling parameters and the policy's per-request state. KV never does.
//! A frame is `"TR" version` then the `Frame` in postcard (serde; integers as varints,
//! floats as 4 bytes), whose first byte is the frame's kind (its variant index). A peer
//! speaking another version is refused with a clear error instead of being misread.
//! Postcard is not self-describing: the order of fields and variants of every type
//! below, core types they carry included, is the format, so changing one bumps
//! `WIRE_VERSION`. Core types that are not serde cross through `wire_mirrors`.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{PolicyDescriptor, PolicyState};
use tokenrouter_core::sched::{BatchingRule, DraftLeg, RequestEvent, RequestId, SubserverConfig};
use tokenrouter_core::spec::Speculation;

#[path = "wire_mirrors.rs"]
mod mirrors;

/// Bumped on any change of the encoding; both ends must agree.
pub const WIRE_VERSION: u8 = 6;
const MAGIC: [u8; 2] = *b"TR";
/// Magic and version; the frame's kind is the first byte after it.
const HEADER_LEN: usize = MAGIC.len() + 1;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WireError {
    #[error("not a tokenrouter frame")]
    NotOurs,
    #[error("wire version {got}, this build speaks {WIRE_VERSION}: run the same tokenrouter version on every host")]
    Version { got: u8 },
    #[error("frame ends early")]
    Truncated,
    #[error("malformed frame: {0}")]
    Malformed(&'static str),
}

/// What a request is, sent the first time it reaches a host (the prompt is the
/// first `prompt_len` tokens of the arrival's suffix, which then starts at 0).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireSpec {
    pub prompt_len: usize,
    pub max_tokens: usize,
    #[serde(with = "mirrors::SamplingParamsDef")]
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    #[serde(with = "mirrors::PolicyDescriptorDef")]
    pub policy: PolicyDescriptor,
    #[serde(with = "mirrors::optional_speculation")]
    pub speculation: Option<Speculation>,
}

/// A request moving to (or back from) a host: `scheduler::Arrival` without the shared
/// spec, which only its first arrival on a host carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireArrival {
    pub id: RequestId,
    pub start: usize,
    pub suffix: Vec<u32>,
    pub output_len: usize,
    pub policy_state: PolicyState,
    pub seen: Vec<usize>,
    pub spec: Option<WireSpec>,
    pub draft: Option<DraftLeg>,
}

/// The front's greeting: who it is and what it asks the node to serve.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The process group of the front's link actor, where the node sends its frames.
    pub reply_group: String,
    /// Every model of the front's engine, in engine order.
    pub models: Vec<ModelInfoWire>,
    /// The model (index) the node must serve for this link.
    pub model: usize,
    /// Seed of random router weights, so learned policies match the front's.
    pub policy_seed: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfoWire {
    pub name: String,
    pub hidden_size: usize,
    pub vocab_size: usize,
}

/// The node's answer once the model is loaded.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    pub model: usize,
    pub block_size: usize,
    pub total_blocks: usize,
    pub free_blocks: usize,
    /// For a consistency check against the front's config.json.
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_layers: usize,
}

/// Engine-wide subserver settings and the batching rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartWire {
    pub subserver: SubserverConfig,
    pub rule: RuleWire,
}

/// `scheduler::BatchingRule` (which is not serde).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RuleWire {
    #[serde(with = "mirrors::threshold_list")]
    pub thresholds: Vec<tokenrouter_core::sched::batching::Threshold>,
    pub max_wait_us: Option<u64>,
}

impl RuleWire {
    pub fn from_engine(rule: &BatchingRule) -> Self {
        RuleWire { thresholds: rule.thresholds.clone(), max_wait_us: rule.max_wait.map(|d| d.as_micros() as u64) }
    }

    pub fn to_engine(&self) -> BatchingRule {
        BatchingRule { thresholds: self.thresholds.clone(), max_wait: self.max_wait_us.map(Duration::from_micros) }
    }
}

impl StartWire {
    pub fn from_engine(subserver: &SubserverConfig, rule: &BatchingRule) -> Self {
        StartWire { subserver: subserver.clone(), rule: RuleWire::from_engine(rule) }
    }

    pub fn to_engine(&self) -> (SubserverConfig, BatchingRule) {
        (self.subserver.clone(), self.rule.to_engine())
    }
}

/// The variant order is the kind byte of the format: append, and bump `WIRE_VERSION`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Frame {
    Hello(Hello),
    Welcome(Welcome),
    /// The node will not serve this front (wrong model, busy with another front...).
    Refused(String),
    Start(StartWire),
    /// Front → node: a request arrives at the node's model `model`.
    Arrive {
        model: usize,
        arrival: WireArrival,
    },
    /// Node → front: a request leaves the node's model for model `to`.
    Handoff {
        to: usize,
        arrival: WireArrival,
    },
    Event(#[serde(with = "mirrors::RequestEventDef")] RequestEvent),
    Release(RequestId),
    SetActive(usize),
    SetRule(RuleWire),
    StatsRequest {
        model: usize,
        nonce: u64,
    },
    /// The node subserver's snapshot, as JSON (`SubserverSnapshot`'s fields).
    StatsReply {
        nonce: u64,
        json: Vec<u8>,
    },
    Ping {
        model: usize,
        nonce: u64,
    },
    Pong(u64),
    InjectPanic(usize),
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let header = vec![MAGIC[0], MAGIC[1], WIRE_VERSION];
        // Into a Vec, postcard fails only on sequences of unknown length, which no wire
        // type has; an empty frame would be refused by the peer as not ours.
        postcard::to_extend(self, header).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Result<Frame, WireError> {
        if bytes.len() <= HEADER_LEN || bytes[..MAGIC.len()] != MAGIC {
            return Err(WireError::NotOurs);
        }
        if bytes[MAGIC.len()] != WIRE_VERSION {
            return Err(WireError::Version { got: bytes[MAGIC.len()] });
        }
        let (frame, rest) = postcard::take_from_bytes(&bytes[HEADER_LEN..]).map_err(wire_error)?;
        if !rest.is_empty() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(frame)
    }
}

fn wire_error(e: postcard::Error) -> WireError {
    use postcard::Error as E;
    match e {
        E::DeserializeUnexpectedEnd => WireError::Truncated,
        E::DeserializeBadVarint => WireError::Malformed("integer too large"),
        E::DeserializeBadBool => WireError::Malformed("boolean out of range"),
        E::DeserializeBadUtf8 | E::DeserializeBadChar => WireError::Malformed("string is not UTF-8"),
        E::DeserializeBadOption => WireError::Malformed("option tag out of range"),
        // serde's own errors: an unknown frame, event or enum kind, bad policy JSON.
        E::DeserializeBadEnum | E::SerdeDeCustom => WireError::Malformed("unknown kind or bad value"),
        _ => WireError::Malformed("undecodable payload"),
    }
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

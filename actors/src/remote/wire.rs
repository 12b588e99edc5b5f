//! The messages that cross hosts, and their versioned binary encoding.
//!
//! Only small things travel: request ids, the token suffix a model has not seen,
//! positions, sampling parameters and the policy's per-request state. KV never does.
//! A frame is `"TR" version kind payload`; a peer speaking another version is refused
//! with a clear error instead of being misread. The hot frames (arrivals, events,
//! handoffs) are hand-packed with varints; rare control frames carry JSON.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::policy::{PolicyDescriptor, PolicyState};
use tokenrouter_core::sched::{BatchingRule, FinishReason, RequestEvent, RequestId, SubserverConfig, Travel};
use tokenrouter_core::spec::{DraftSource, Speculation, SpeculationMethod};

use super::codec::{Reader, Writer};

/// Bumped on any change of the encoding; both ends must agree.
pub const WIRE_VERSION: u8 = 4;
const MAGIC: [u8; 2] = *b"TR";

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
    #[error("malformed control frame: {0}")]
    Json(String),
}

/// What a request is, sent the first time it reaches a host (the prompt is the
/// first `prompt_len` tokens of the arrival's suffix, which then starts at 0).
#[derive(Debug, Clone, PartialEq)]
pub struct WireSpec {
    pub prompt_len: usize,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop_ids: Vec<u32>,
    pub policy: PolicyDescriptor,
    pub speculation: Option<Speculation>,
}

/// A request moving to (or back from) a host: `scheduler::Arrival` without the shared spec.
#[derive(Debug, Clone, PartialEq)]
pub struct WireArrival {
    pub id: RequestId,
    pub spec: Option<WireSpec>,
    pub start: usize,
    pub suffix: Vec<u32>,
    pub output_len: usize,
    pub policy_state: PolicyState,
    pub seen: Vec<usize>,
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

#[derive(Debug, Clone, PartialEq)]
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
    Event(RequestEvent),
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

mod kind {
    pub const HELLO: u8 = 1;
    pub const WELCOME: u8 = 2;
    pub const REFUSED: u8 = 3;
    pub const START: u8 = 4;
    pub const ARRIVE: u8 = 5;
    pub const HANDOFF: u8 = 6;
    pub const EVENT: u8 = 7;
    pub const RELEASE: u8 = 8;
    pub const SET_ACTIVE: u8 = 9;
    pub const SET_RULE: u8 = 10;
    pub const STATS_REQUEST: u8 = 11;
    pub const STATS_REPLY: u8 = 12;
    pub const PING: u8 = 13;
    pub const PONG: u8 = 14;
    pub const INJECT_PANIC: u8 = 15;
}

mod event_kind {
    pub const TOKEN: u8 = 0;
    pub const MOVED: u8 = 1;
    pub const FINISHED_STOP: u8 = 2;
    pub const FINISHED_LENGTH: u8 = 3;
    pub const FAILED: u8 = 4;
    pub const RESUME: u8 = 5;
    pub const CACHED_PREFIX: u8 = 6;
    pub const OUT_OF_SERVICE: u8 = 7;
    pub const VERIFIED: u8 = 8;
}

impl Frame {
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::default();
        w.bytes.extend_from_slice(&MAGIC);
        w.u8(WIRE_VERSION);
        match self {
            Frame::Hello(h) => json_frame(&mut w, kind::HELLO, h),
            Frame::Welcome(m) => json_frame(&mut w, kind::WELCOME, m),
            Frame::Refused(reason) => {
                w.u8(kind::REFUSED);
                w.str(reason);
            }
            Frame::Start(s) => json_frame(&mut w, kind::START, s),
            Frame::Arrive { model, arrival } => {
                w.u8(kind::ARRIVE);
                w.usize(*model);
                put_arrival(&mut w, arrival);
            }
            Frame::Handoff { to, arrival } => {
                w.u8(kind::HANDOFF);
                w.usize(*to);
                put_arrival(&mut w, arrival);
            }
            Frame::Event(e) => {
                w.u8(kind::EVENT);
                put_event(&mut w, e);
            }
            Frame::Release(id) => u64_frame(&mut w, kind::RELEASE, *id),
            Frame::SetActive(n) => u64_frame(&mut w, kind::SET_ACTIVE, *n as u64),
            Frame::SetRule(r) => json_frame(&mut w, kind::SET_RULE, r),
            Frame::StatsRequest { model, nonce } => model_nonce_frame(&mut w, kind::STATS_REQUEST, *model, *nonce),
            Frame::StatsReply { nonce, json } => {
                w.u8(kind::STATS_REPLY);
                w.varint(*nonce);
                w.bytes(json);
            }
            Frame::Ping { model, nonce } => model_nonce_frame(&mut w, kind::PING, *model, *nonce),
            Frame::Pong(n) => u64_frame(&mut w, kind::PONG, *n),
            Frame::InjectPanic(model) => u64_frame(&mut w, kind::INJECT_PANIC, *model as u64),
        }
        w.bytes
    }

    pub fn decode(bytes: &[u8]) -> Result<Frame, WireError> {
        if bytes.len() < 4 || bytes[..2] != MAGIC {
            return Err(WireError::NotOurs);
        }
        if bytes[2] != WIRE_VERSION {
            return Err(WireError::Version { got: bytes[2] });
        }
        let mut r = Reader::new(&bytes[4..]);
        let frame = match bytes[3] {
            kind::HELLO => Frame::Hello(json(&mut r)?),
            kind::WELCOME => Frame::Welcome(json(&mut r)?),
            kind::REFUSED => Frame::Refused(r.string()?),
            kind::START => Frame::Start(json(&mut r)?),
            kind::ARRIVE => Frame::Arrive { model: r.usize()?, arrival: get_arrival(&mut r)? },
            kind::HANDOFF => Frame::Handoff { to: r.usize()?, arrival: get_arrival(&mut r)? },
            kind::EVENT => Frame::Event(get_event(&mut r)?),
            kind::RELEASE => Frame::Release(r.varint()?),
            kind::SET_ACTIVE => Frame::SetActive(r.usize()?),
            kind::SET_RULE => Frame::SetRule(json(&mut r)?),
            kind::STATS_REQUEST => Frame::StatsRequest { model: r.usize()?, nonce: r.varint()? },
            kind::STATS_REPLY => Frame::StatsReply { nonce: r.varint()?, json: r.bytes()?.to_vec() },
            kind::PING => Frame::Ping { model: r.usize()?, nonce: r.varint()? },
            kind::PONG => Frame::Pong(r.varint()?),
            kind::INJECT_PANIC => Frame::InjectPanic(r.usize()?),
            _ => return Err(WireError::Malformed("unknown frame kind")),
        };
        if !r.is_done() {
            return Err(WireError::Malformed("trailing bytes"));
        }
        Ok(frame)
    }
}

fn u64_frame(w: &mut Writer, kind: u8, v: u64) {
    w.u8(kind);
    w.varint(v);
}

fn model_nonce_frame(w: &mut Writer, kind: u8, model: usize, nonce: u64) {
    u64_frame(w, kind, model as u64);
    w.varint(nonce);
}

fn json_frame<T: Serialize>(w: &mut Writer, kind: u8, value: &T) {
    w.u8(kind);
    // Serializing plain data structs to JSON cannot fail.
    w.bytes(&serde_json::to_vec(value).unwrap_or_default());
}

fn json<T: for<'de> Deserialize<'de>>(r: &mut Reader<'_>) -> Result<T, WireError> {
    serde_json::from_slice(r.bytes()?).map_err(|e| WireError::Json(e.to_string()))
}

fn put_arrival(w: &mut Writer, a: &WireArrival) {
    w.varint(a.id);
    w.usize(a.start);
    w.tokens(&a.suffix);
    w.usize(a.output_len);
    put_policy_state(w, &a.policy_state);
    w.usizes(&a.seen);
    w.bool(a.spec.is_some());
    if let Some(spec) = &a.spec {
        put_spec(w, spec);
    }
}

fn get_arrival(r: &mut Reader<'_>) -> Result<WireArrival, WireError> {
    let id = r.varint()?;
    let start = r.usize()?;
    let suffix = r.tokens()?;
    let output_len = r.usize()?;
    let policy_state = get_policy_state(r)?;
    let seen = r.usizes()?;
    let spec = if r.bool()? { Some(get_spec(r)?) } else { None };
    Ok(WireArrival { id, spec, start, suffix, output_len, policy_state, seen })
}

fn put_policy_state(w: &mut Writer, p: &PolicyState) {
    w.varint(p.seed);
    w.usize(p.counters.len());
    for &c in &p.counters {
        w.varint(c);
    }
    w.usize(p.values.len());
    for &v in &p.values {
        w.f32(v);
    }
}

fn get_policy_state(r: &mut Reader<'_>) -> Result<PolicyState, WireError> {
    let seed = r.varint()?;
    let counters = (0..r.usize()?).map(|_| r.varint()).collect::<Result<_, _>>()?;
    let values = (0..r.usize()?).map(|_| r.f32()).collect::<Result<_, _>>()?;
    Ok(PolicyState { seed, counters, values })
}

fn put_spec(w: &mut Writer, s: &WireSpec) {
    w.usize(s.prompt_len);
    w.usize(s.max_tokens);
    let p = &s.sampling;
    for v in [p.temperature, p.top_p, p.min_p, p.repetition_penalty, p.presence_penalty, p.frequency_penalty] {
        w.f32(v);
    }
    w.usize(p.top_k);
    w.varint(p.seed);
    w.opt_usize(p.logprobs);
    w.usize(p.logit_bias.len());
    for &(token, bias) in &p.logit_bias {
        w.varint(token as u64);
        w.f32(bias);
    }
    w.tokens(&s.stop_ids);
    w.str(&s.policy.name);
    w.str(&s.policy.params.to_string());
    w.bool(s.speculation.is_some());
    if let Some(spec) = &s.speculation {
        w.u8(match spec.method {
            None => 0,
            Some(SpeculationMethod::Ngram) => 1,
            Some(SpeculationMethod::Suffix) => 2,
        });
        w.usize(spec.max_tokens);
        w.tokens(&spec.prediction);
    }
}

fn get_speculation(r: &mut Reader<'_>) -> Result<Option<Speculation>, WireError> {
    if !r.bool()? {
        return Ok(None);
    }
    let method = match r.u8()? {
        0 => None,
        1 => Some(SpeculationMethod::Ngram),
        2 => Some(SpeculationMethod::Suffix),
        _ => return Err(WireError::Malformed("unknown speculative method")),
    };
    Ok(Some(Speculation { method, max_tokens: r.usize()?, prediction: r.tokens()? }))
}

fn get_spec(r: &mut Reader<'_>) -> Result<WireSpec, WireError> {
    let prompt_len = r.usize()?;
    let max_tokens = r.usize()?;
    let mut f = [0f32; 6];
    for v in &mut f {
        *v = r.f32()?;
    }
    let sampling = SamplingParams {
        temperature: f[0],
        top_p: f[1],
        min_p: f[2],
        repetition_penalty: f[3],
        presence_penalty: f[4],
        frequency_penalty: f[5],
        top_k: r.usize()?,
        seed: r.varint()?,
        logprobs: r.opt_usize()?,
        logit_bias: (0..r.usize()?).map(|_| Ok((r.varint()? as u32, r.f32()?))).collect::<Result<_, WireError>>()?,
    };
    let stop_ids = r.tokens()?;
    let name = r.string()?;
    let params = serde_json::from_str(&r.string()?).map_err(|e| WireError::Json(e.to_string()))?;
    let speculation = get_speculation(r)?;
    Ok(WireSpec { prompt_len, max_tokens, sampling, stop_ids, policy: PolicyDescriptor { name, params }, speculation })
}

fn put_event(w: &mut Writer, e: &RequestEvent) {
    match e {
        RequestEvent::Token { id, index, token, model, logprob, top_logprobs } => {
            w.u8(event_kind::TOKEN);
            w.varint(*id);
            w.usize(*index);
            w.varint(*token as u64);
            w.usize(*model);
            w.bool(logprob.is_some());
            if let Some(lp) = logprob {
                w.f32(*lp);
            }
            w.usize(top_logprobs.len());
            for &(t, lp) in top_logprobs {
                w.varint(t as u64);
                w.f32(lp);
            }
        }
        RequestEvent::Moved { id, from, to } => {
            w.u8(event_kind::MOVED);
            w.varint(*id);
            w.usize(*from);
            w.usize(*to);
        }
        RequestEvent::Finished { id, reason } => {
            w.u8(match reason {
                FinishReason::Stop => event_kind::FINISHED_STOP,
                FinishReason::Length => event_kind::FINISHED_LENGTH,
            });
            w.varint(*id);
        }
        RequestEvent::Failed { id, message } => {
            w.u8(event_kind::FAILED);
            w.varint(*id);
            w.str(message);
        }
        RequestEvent::OutOfService { id, message } => {
            w.u8(event_kind::OUT_OF_SERVICE);
            w.varint(*id);
            w.str(message);
        }
        RequestEvent::Resume { id, model, output_len, travel } => {
            w.u8(event_kind::RESUME);
            w.varint(*id);
            w.usize(*model);
            w.usize(*output_len);
            put_policy_state(w, &travel.policy_state);
            w.usizes(&travel.seen);
        }
        RequestEvent::Verified { id, model, first_index, drafted, accepted, source } => {
            w.u8(event_kind::VERIFIED);
            w.varint(*id);
            w.usize(*model);
            w.usize(*first_index);
            w.usize(*drafted);
            w.usize(*accepted);
            w.u8(match source {
                DraftSource::Prediction => 0,
                DraftSource::Ngram => 1,
                DraftSource::Suffix => 2,
            });
        }
        RequestEvent::CachedPrefix { id, model, tokens } => {
            w.u8(event_kind::CACHED_PREFIX);
            w.varint(*id);
            w.usize(*model);
            w.usize(*tokens);
        }
    }
}

fn get_event(r: &mut Reader<'_>) -> Result<RequestEvent, WireError> {
    let kind = r.u8()?;
    let id = r.varint()?;
    Ok(match kind {
        event_kind::TOKEN => {
            let index = r.usize()?;
            let token = r.u32()?;
            let model = r.usize()?;
            let logprob = if r.bool()? { Some(r.f32()?) } else { None };
            let top = (0..r.usize()?).map(|_| Ok((r.u32()?, r.f32()?))).collect::<Result<_, WireError>>()?;
            RequestEvent::Token { id, index, token, model, logprob, top_logprobs: top }
        }
        event_kind::MOVED => RequestEvent::Moved { id, from: r.usize()?, to: r.usize()? },
        event_kind::FINISHED_STOP => RequestEvent::Finished { id, reason: FinishReason::Stop },
        event_kind::FINISHED_LENGTH => RequestEvent::Finished { id, reason: FinishReason::Length },
        event_kind::FAILED => RequestEvent::Failed { id, message: r.string()? },
        event_kind::OUT_OF_SERVICE => RequestEvent::OutOfService { id, message: r.string()? },
        event_kind::RESUME => {
            let model = r.usize()?;
            let output_len = r.usize()?;
            let travel = Travel { policy_state: get_policy_state(r)?, seen: r.usizes()? };
            RequestEvent::Resume { id, model, output_len, travel }
        }
        event_kind::CACHED_PREFIX => RequestEvent::CachedPrefix { id, model: r.usize()?, tokens: r.usize()? },
        event_kind::VERIFIED => RequestEvent::Verified {
            id,
            model: r.usize()?,
            first_index: r.usize()?,
            drafted: r.usize()?,
            accepted: r.usize()?,
            source: match r.u8()? {
                0 => DraftSource::Prediction,
                1 => DraftSource::Ngram,
                2 => DraftSource::Suffix,
                _ => return Err(WireError::Malformed("unknown draft source")),
            },
        },
        _ => return Err(WireError::Malformed("unknown event kind")),
    })
}

#[cfg(test)]
#[path = "wire_tests.rs"]
mod tests;

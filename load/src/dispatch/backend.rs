//! One dispatcher call: "write the next token of this sequence" sent to a
//! single-model server, and what comes back. Two kinds of server speak it:
//! tokenrouter (`POST /v1/completions` with a token-id prompt, `max_tokens: 1`
//! and vLLM's `return_token_ids`) and llama.cpp's `llama-server` (its native
//! `POST /completion` with a token-id prompt, `n_predict: 1`, `return_tokens`).

use serde::Serialize;
use serde_json::{json, Value};

/// The API a single-model server speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerKind {
    /// `tokenrouter serve` with one model.
    Tokenrouter,
    /// llama.cpp's `llama-server`.
    LlamaCpp,
}

/// Everything one call asks for.
#[derive(Debug, Clone, Copy)]
pub struct StepRequest<'a> {
    /// The whole sequence so far: prompt and committed output.
    pub ids: &'a [u32],
    pub seed: u64,
    /// Alternatives to report with the token (0: none), for policies that read the
    /// next-token distribution.
    pub top_logprobs: usize,
    pub temperature: Option<f32>,
    pub ignore_eos: bool,
}

/// What a call produced.
#[derive(Debug, Clone, PartialEq)]
pub struct StepReply {
    /// None when the server stopped without a token (an end-of-sequence).
    pub token: Option<u32>,
    /// Log-probabilities of the most likely alternatives (any order).
    pub top_logprobs: Vec<f32>,
    /// The server ended the sequence (end-of-sequence or a stop condition).
    pub stopped: bool,
    /// The model that wrote the token, as the server names it.
    pub model: Option<String>,
}

impl ServerKind {
    pub fn path(self) -> &'static str {
        match self {
            ServerKind::Tokenrouter => "/v1/completions",
            ServerKind::LlamaCpp => "/completion",
        }
    }

    pub fn body(self, step: &StepRequest<'_>) -> Value {
        let mut body = match self {
            ServerKind::Tokenrouter => json!({
                "prompt": step.ids,
                "max_tokens": 1,
                "seed": step.seed,
                "return_token_ids": true,
            }),
            ServerKind::LlamaCpp => json!({
                "prompt": step.ids,
                "n_predict": 1,
                // llama.cpp seeds are 32-bit.
                "seed": step.seed & 0xFFFF_FFFF,
                "return_tokens": true,
                // Reuse the slot's KV for the common prefix: the best llama.cpp can do
                // for a sequence that grows by one token per call.
                "cache_prompt": true,
            }),
        };
        if step.ignore_eos {
            body["ignore_eos"] = json!(true);
        }
        if let Some(t) = step.temperature {
            body["temperature"] = json!(t);
        }
        if step.top_logprobs > 0 {
            let key = match self {
                ServerKind::Tokenrouter => "logprobs",
                ServerKind::LlamaCpp => "n_probs",
            };
            body[key] = json!(step.top_logprobs);
        }
        body
    }

    pub fn parse(self, reply: &Value) -> Result<StepReply, String> {
        let parsed = match self {
            ServerKind::Tokenrouter => parse_tokenrouter(reply),
            ServerKind::LlamaCpp => parse_llama_cpp(reply),
        };
        parsed.ok_or_else(|| format!("unexpected reply: {}", abbreviate(reply)))
    }
}

fn parse_tokenrouter(reply: &Value) -> Option<StepReply> {
    let choice = reply["choices"].get(0)?;
    let ids = choice["token_ids"].as_array()?;
    let top = choice["logprobs"]["top_logprobs"].get(0).and_then(Value::as_object);
    let writers = reply["usage"]["tokens_per_model"].as_object();
    Some(StepReply {
        token: ids.first().and_then(as_u32),
        top_logprobs: top.map(|m| m.values().filter_map(as_f32).collect()).unwrap_or_default(),
        stopped: choice["finish_reason"] == "stop",
        // The usage names the engine model that wrote the token.
        model: writers.and_then(|m| m.iter().find(|(_, n)| n.as_u64() > Some(0)).map(|(name, _)| name.clone())),
    })
}

fn parse_llama_cpp(reply: &Value) -> Option<StepReply> {
    let ids = reply["tokens"].as_array()?;
    let top = reply["completion_probabilities"].get(0).and_then(|p| p["top_logprobs"].as_array());
    Some(StepReply {
        token: ids.first().and_then(as_u32),
        top_logprobs: top.map(|a| a.iter().filter_map(|e| as_f32(&e["logprob"])).collect()).unwrap_or_default(),
        stopped: reply["stop_type"] == "eos" || reply["stop_type"] == "word",
        model: reply["model"].as_str().map(str::to_string),
    })
}

fn as_u32(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn as_f32(v: &Value) -> Option<f32> {
    v.as_f64().map(|x| x as f32)
}

/// A reply short enough for an error message.
fn abbreviate(v: &Value) -> String {
    let text = v.to_string();
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(top: usize) -> StepRequest<'static> {
        StepRequest {
            ids: &[5, 6, 7],
            seed: (1 << 40) + 3,
            top_logprobs: top,
            temperature: Some(0.0),
            ignore_eos: true,
        }
    }

    #[test]
    fn tokenrouter_calls_ask_for_one_token_by_id() {
        let body = ServerKind::Tokenrouter.body(&step(20));
        assert_eq!(body["prompt"], json!([5, 6, 7]));
        assert_eq!((body["max_tokens"].clone(), body["return_token_ids"].clone()), (json!(1), json!(true)));
        assert_eq!((body["logprobs"].clone(), body["seed"].clone()), (json!(20), json!((1u64 << 40) + 3)));
        assert_eq!((body["ignore_eos"].clone(), body["temperature"].clone()), (json!(true), json!(0.0)));
        assert!(body.get("stream").is_none() && body.get("n_probs").is_none());
        assert!(ServerKind::Tokenrouter.body(&step(0)).get("logprobs").is_none());
    }

    #[test]
    fn llama_cpp_calls_use_the_native_endpoint_and_reuse_the_prompt_cache() {
        let body = ServerKind::LlamaCpp.body(&step(10));
        assert_eq!(ServerKind::LlamaCpp.path(), "/completion");
        assert_eq!((body["n_predict"].clone(), body["return_tokens"].clone()), (json!(1), json!(true)));
        assert_eq!((body["n_probs"].clone(), body["cache_prompt"].clone()), (json!(10), json!(true)));
        assert_eq!(body["seed"], json!(3), "32-bit seed");
        assert!(body.get("max_tokens").is_none());
    }

    #[test]
    fn tokenrouter_replies_give_the_token_its_writer_and_alternatives() {
        let reply = json!({
            "choices": [{"text": "x", "token_ids": [42], "finish_reason": "length",
                         "logprobs": {"top_logprobs": [{"a": -0.5, "b": -1.5}]}}],
            "usage": {"tokens_per_model": {"large": 1}},
        });
        let r = ServerKind::Tokenrouter.parse(&reply).unwrap();
        assert_eq!((r.token, r.stopped, r.model.as_deref()), (Some(42), false, Some("large")));
        let mut top = r.top_logprobs;
        top.sort_by(f32::total_cmp);
        assert_eq!(top, vec![-1.5, -0.5]);
        let e = ServerKind::Tokenrouter.parse(&json!({"choices": [{"text": "x"}]})).unwrap_err();
        assert!(e.starts_with("unexpected reply"), "{e}");
    }

    #[test]
    fn llama_cpp_replies_give_the_token_and_end_of_sequence() {
        let reply = json!({
            "content": "x", "tokens": [7], "stop_type": "limit", "model": "medium",
            "completion_probabilities": [{"id": 7, "logprob": -0.1, "top_logprobs": [{"id": 7, "logprob": -0.1}]}],
        });
        let r = ServerKind::LlamaCpp.parse(&reply).unwrap();
        assert_eq!(
            (r.token, r.stopped, r.model.as_deref(), r.top_logprobs),
            (Some(7), false, Some("medium"), vec![-0.1])
        );
        let eos = ServerKind::LlamaCpp.parse(&json!({"tokens": [], "stop_type": "eos"})).unwrap();
        assert_eq!((eos.token, eos.stopped), (None, true));
    }
}

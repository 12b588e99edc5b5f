//! One dispatcher call: "write the next token of this sequence" sent to a
//! single-model server, and what comes back. Two kinds of server speak it:
//! tokenrouter (`POST /v1/completions` with a token-id prompt, `max_tokens: 1`
//! and vLLM's `return_token_ids`) and llama.cpp's `llama-server` (its native
//! `POST /completion` with a token-id prompt, `n_predict: 1`, `return_tokens`).
//! tokenrouter's side is core's `openai` types; llama.cpp's native reply is typed here.

use serde::{Deserialize, Serialize};
use serde_json::{json, Number, Value};
use tokenrouter_core::openai::{excerpt, Completion, CompletionRequest, Prompt, RequestOptions};

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
        match self {
            ServerKind::Tokenrouter => tokenrouter_body(step),
            ServerKind::LlamaCpp => llama_cpp_body(step),
        }
    }

    pub fn parse(self, reply: &Value) -> Result<StepReply, String> {
        let parsed = match self {
            ServerKind::Tokenrouter => Completion::deserialize(reply).map(parse_tokenrouter),
            ServerKind::LlamaCpp => LlamaCppReply::deserialize(reply).map(parse_llama_cpp),
        };
        match parsed {
            Ok(Some(step)) => Ok(step),
            Ok(None) => Err(format!("unexpected reply: {}", excerpt(&reply.to_string()))),
            Err(e) => Err(format!("unexpected reply ({e}): {}", excerpt(&reply.to_string()))),
        }
    }
}

fn tokenrouter_body(step: &StepRequest<'_>) -> Value {
    let options = RequestOptions {
        max_tokens: Some(1),
        seed: Some(Number::from(step.seed)),
        return_token_ids: Some(true),
        ignore_eos: step.ignore_eos.then_some(true),
        temperature: step.temperature,
        ..RequestOptions::default()
    };
    let logprobs = (step.top_logprobs > 0).then_some(step.top_logprobs);
    let request = CompletionRequest { prompt: Prompt::Tokens(step.ids.to_vec()), logprobs, options };
    // Cannot fail: every map in a request has string keys.
    serde_json::to_value(request).expect("a request body is JSON")
}

/// llama.cpp's native request: not OpenAI's, so built here.
fn llama_cpp_body(step: &StepRequest<'_>) -> Value {
    let mut body = json!({
        "prompt": step.ids,
        "n_predict": 1,
        // llama.cpp seeds are 32-bit.
        "seed": step.seed & 0xFFFF_FFFF,
        "return_tokens": true,
        // Reuse the slot's KV for the common prefix: the best llama.cpp can do
        // for a sequence that grows by one token per call.
        "cache_prompt": true,
    });
    if step.ignore_eos {
        body["ignore_eos"] = json!(true);
    }
    if let Some(t) = step.temperature {
        body["temperature"] = json!(t);
    }
    if step.top_logprobs > 0 {
        body["n_probs"] = json!(step.top_logprobs);
    }
    body
}

/// None when the reply lacks the token ids asked for.
fn parse_tokenrouter(reply: Completion) -> Option<StepReply> {
    let choice = reply.choices.into_iter().next()?;
    let ids = choice.token_ids?;
    let top = choice.logprobs.and_then(|l| l.top_logprobs.into_iter().next()).flatten();
    // The usage names the engine model that wrote the token.
    let writers = reply.usage.map(|u| u.tokens_per_model).unwrap_or_default();
    Some(StepReply {
        token: ids.first().copied(),
        top_logprobs: top.map(|m| m.into_values().flatten().collect()).unwrap_or_default(),
        stopped: choice.finish_reason.as_deref() == Some("stop"),
        model: writers.into_iter().find(|&(_, n)| n > 0).map(|(name, _)| name),
    })
}

/// What this client reads of llama-server's native `/completion` reply.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LlamaCppReply {
    tokens: Option<Vec<u32>>,
    completion_probabilities: Vec<LlamaCppProbabilities>,
    stop_type: Option<String>,
    model: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LlamaCppProbabilities {
    top_logprobs: Vec<LlamaCppAlternative>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct LlamaCppAlternative {
    logprob: Option<f32>,
}

/// None when the reply lacks the token ids asked for.
fn parse_llama_cpp(reply: LlamaCppReply) -> Option<StepReply> {
    let ids = reply.tokens?;
    let top = reply.completion_probabilities.into_iter().next().map(|p| p.top_logprobs).unwrap_or_default();
    Some(StepReply {
        token: ids.first().copied(),
        top_logprobs: top.into_iter().filter_map(|e| e.logprob).collect(),
        stopped: matches!(reply.stop_type.as_deref(), Some("eos" | "word")),
        model: reply.model,
    })
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

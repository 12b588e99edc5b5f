//! Request bodies as the clients build them. A field left `None` is not sent, so the
//! server applies its own default; the two endpoints differ only in what they are asked
//! about (`messages` or `prompt`), the rest is [`RequestOptions`].

use serde::Serialize;
use serde_json::{Number, Value};

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub options: RequestOptions,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    /// How many alternatives to report with each token (the completions endpoint's count).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<usize>,
    #[serde(flatten)]
    pub options: RequestOptions,
}

/// One turn of a chat: a role (`system`, `user`, `assistant`) and its text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: &str, content: impl Into<String>) -> Message {
        Message { role: role.to_string(), content: content.into() }
    }
}

/// A completions prompt: text, or token ids for a client that tokenized already.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct StreamOptions {
    /// A last chunk carries the usage (tokenrouter's with `tokens_per_model`).
    pub include_usage: bool,
}

/// Fields both endpoints take.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RequestOptions {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream_options: Option<StreamOptions>,
    /// A number, not a `u64`: servers differ in the seeds they take (OpenAI's are signed
    /// 64-bit, llama.cpp's 32-bit), so each client sends what its server reads.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seed: Option<Number>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub min_p: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presence_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub frequency_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repetition_penalty: Option<f32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's (tokenrouter takes it): the output runs to `max_tokens`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignore_eos: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub skip_special_tokens: Option<bool>,
    /// OpenAI's shape: token id (a string key) to a bias.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logit_bias: Option<Value>,
    /// Structured outputs, sent as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub response_format: Option<Value>,
    /// vLLM's: each choice reports its tokens' ids (`token_ids`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
    /// tokenrouter's: continue this conversation's tokenization.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// tokenrouter's `routing` object (`policy`, `params`, `trace`), sent as given.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub routing: Option<Value>,
}

impl RequestOptions {
    /// A streamed request whose last chunk carries the usage.
    pub fn streamed() -> RequestOptions {
        RequestOptions {
            stream: Some(true),
            stream_options: Some(StreamOptions { include_usage: true }),
            ..RequestOptions::default()
        }
    }
}

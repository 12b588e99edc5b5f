//! What comes back: a whole response or one stream chunk ([`Completion`], the same
//! envelope for both endpoints; only the choice differs), the model list and the error
//! envelope. Servers disagree on what they leave out and on `null` versus absent, so
//! both read as the default; a present field of the wrong type fails the parse.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// A whole response or one `data:` payload of a stream, of either endpoint.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Completion {
    #[serde(deserialize_with = "null_is_default")]
    pub choices: Vec<Choice>,
    /// The usage chunk's (`stream_options.include_usage`), or a whole response's.
    pub usage: Option<Usage>,
    /// tokenrouter's routing trace (`routing: {"trace": true}`).
    pub routing: Option<RoutingTrace>,
    /// An error sent inside the stream.
    pub error: Option<ApiError>,
}

impl Completion {
    /// The first choice: these clients ask for one.
    pub fn first_choice(&self) -> Option<&Choice> {
        self.choices.first()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Choice {
    pub index: u32,
    /// A chat chunk's.
    pub delta: Option<Delta>,
    /// A whole chat response's.
    pub message: Option<Delta>,
    /// A completion's (chunk or whole).
    pub text: Option<String>,
    pub finish_reason: Option<String>,
    /// vLLM's `return_token_ids` (tokenrouter honours it): the ids of the tokens whose
    /// text this choice carries. Absent when the server does not report ids.
    pub token_ids: Option<Vec<u32>>,
    /// The completions endpoint's logprobs (the chat endpoint's are not read).
    pub logprobs: Option<CompletionLogprobs>,
}

impl Choice {
    /// The text this choice carries, whichever endpoint sent it ("" for none).
    pub fn text(&self) -> &str {
        let chat = self.delta.as_ref().or(self.message.as_ref()).and_then(|d| d.content.as_deref());
        chat.or(self.text.as_deref()).unwrap_or_default()
    }
}

/// A chat delta, or a whole response's message (the same fields).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Delta {
    pub role: Option<String>,
    pub content: Option<String>,
}

/// The completions endpoint's logprobs: per token, its text, its log-probability and
/// its most likely alternatives (token text to log-probability). A log-probability the
/// server cannot write as a JSON number (`-inf`) comes as `null`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct CompletionLogprobs {
    #[serde(deserialize_with = "null_is_default")]
    pub tokens: Vec<String>,
    #[serde(deserialize_with = "null_is_default")]
    pub token_logprobs: Vec<Option<f32>>,
    #[serde(deserialize_with = "null_is_default")]
    pub top_logprobs: Vec<Option<BTreeMap<String, Option<f32>>>>,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Usage {
    #[serde(deserialize_with = "null_is_default")]
    pub prompt_tokens: u64,
    #[serde(deserialize_with = "null_is_default")]
    pub completion_tokens: u64,
    #[serde(deserialize_with = "null_is_default")]
    pub total_tokens: u64,
    pub prompt_tokens_details: Option<PromptTokensDetails>,
    /// tokenrouter's: output tokens by engine model name (empty from other servers).
    #[serde(deserialize_with = "null_is_default")]
    pub tokens_per_model: BTreeMap<String, u64>,
    /// tokenrouter's: how often the writing model changed.
    pub switches: Option<u64>,
}

impl Usage {
    /// Prompt tokens served from the prefix cache (0 when the server does not say).
    pub fn cached_tokens(&self) -> u64 {
        self.prompt_tokens_details.as_ref().map_or(0, |d| d.cached_tokens)
    }
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct PromptTokensDetails {
    #[serde(deserialize_with = "null_is_default")]
    pub cached_tokens: u64,
}

/// tokenrouter's per-chunk routing trace.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RoutingTrace {
    /// The model of each token whose text the chunk carries.
    #[serde(deserialize_with = "null_is_default")]
    pub models: Vec<String>,
    /// Per token: a verified draft's (when the request speculates).
    #[serde(deserialize_with = "null_is_default")]
    pub drafted: Vec<bool>,
}

/// `{"error": ...}`: a failed request's body.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ErrorEnvelope {
    pub error: Option<ApiError>,
}

/// An error as servers send it: OpenAI's object, a bare message (some servers), or
/// anything else (shown as its JSON).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum ApiError {
    Detailed {
        message: String,
        #[serde(default, rename = "type")]
        kind: Option<String>,
        #[serde(default)]
        code: Option<Value>,
    },
    Message(String),
    Other(Value),
}

impl ApiError {
    pub fn message(&self) -> String {
        match self {
            ApiError::Detailed { message, .. } | ApiError::Message(message) => message.clone(),
            ApiError::Other(value) => value.to_string(),
        }
    }
}

/// `GET /v1/models`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ModelList {
    #[serde(deserialize_with = "null_is_default")]
    pub data: Vec<ModelCard>,
}

impl ModelList {
    pub fn ids(&self) -> Vec<String> {
        self.data.iter().map(|m| m.id.clone()).collect()
    }
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct ModelCard {
    pub id: String,
}

/// `null` reads as the default, as an absent field does.
fn null_is_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

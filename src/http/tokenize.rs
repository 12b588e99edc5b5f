//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: a prompt (or chat
//! messages, rendered with the template) to token ids, and ids back to text.

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

use super::error::ApiError;
use super::extract::{ApiJson, Authorized};
use super::fields;
use super::request::Endpoint;
use super::state::AppState;
use super::tools::ToolFields;

#[derive(Debug, Deserialize)]
pub struct TokenizeRequest {
    pub model: Option<String>,
    pub prompt: Option<String>,
    pub messages: Option<Vec<ChatMessage>>,
    /// Prompts only: add the BOS token the tokenizer adds by default (true).
    pub add_special_tokens: Option<bool>,
    /// Messages only (true).
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<serde_json::Map<String, serde_json::Value>>,
    /// Messages only: the tools a chat request would offer, rendered the same way.
    pub tools: Option<serde_json::Value>,
}

#[derive(Debug, Deserialize)]
pub struct DetokenizeRequest {
    pub model: Option<String>,
    pub tokens: Vec<u32>,
}

pub async fn tokenize(
    state: web::Data<AppState>,
    _: Authorized,
    body: ApiJson<TokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.0;
    state.check_model(body.model.as_deref())?;
    let tokens = match (body.prompt, body.messages) {
        (Some(prompt), None) => state.engine.encode(prompt, body.add_special_tokens.unwrap_or(true)).await?,
        (None, Some(mut messages)) => {
            fields::check_roles(&mut messages)?;
            let tools = ToolFields { tools: body.tools.as_ref(), tool_choice: None, parallel_tool_calls: None };
            let tools = tools.plan(Endpoint::Chat, state.engine.tool_syntax(), &state.limits.request)?;
            fields::check_template_kwargs(body.chat_template_kwargs.as_ref())?;
            let options = RenderOptions {
                add_generation_prompt: body.add_generation_prompt.unwrap_or(true),
                extra: body.chat_template_kwargs.unwrap_or_default(),
                tools: tools.map(|t| t.definitions),
            };
            state.engine.chat(messages, options).await?.ids
        }
        _ => return Err(ApiError::bad_request("give exactly one of `prompt` and `messages`", Some("prompt"))),
    };
    let max_model_len = state.engine.max_context();
    Ok(HttpResponse::Ok().json(json!({ "count": tokens.len(), "max_model_len": max_model_len, "tokens": tokens })))
}

pub async fn detokenize(
    state: web::Data<AppState>,
    _: Authorized,
    body: ApiJson<DetokenizeRequest>,
) -> Result<HttpResponse, ApiError> {
    let body = body.0;
    state.check_model(body.model.as_deref())?;
    if let Some(vocab) = state.engine.vocab_size() {
        if let Some(t) = body.tokens.iter().find(|&&t| t as usize >= vocab) {
            let m = format!("token id {t} is outside the vocabulary (size {vocab})");
            return Err(ApiError::bad_request(m, Some("tokens")));
        }
    }
    let prompt = state.decode(body.tokens).await?;
    Ok(HttpResponse::Ok().json(json!({ "prompt": prompt })))
}

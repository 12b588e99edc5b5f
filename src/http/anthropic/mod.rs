//! The Anthropic Messages API: `POST /v1/messages` (JSON or SSE) and
//! `POST /v1/messages/count_tokens`. A request is translated into the chat request it
//! means (`request`), served by the chat path, and its output shaped as Anthropic's
//! (`response`). Keys come as `x-api-key` (Anthropic's SDKs) or a bearer token, and
//! every error on these routes is in Anthropic's envelope.

mod request;
mod response;
#[cfg(test)]
mod tests;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};
use serde_json::{json, Value};

use super::error::ApiError;
use super::extract::{ApiJson, Authorized};
use super::handlers;
use super::request::{Endpoint, OpenAiRequest};
use super::state::AppState;

pub use request::to_chat;
pub use response::{error_envelope, message, AnthropicFramer};

/// An [`ApiError`] answered in Anthropic's envelope.
#[derive(Debug)]
pub struct AnthropicError(pub ApiError);

impl From<ApiError> for AnthropicError {
    fn from(e: ApiError) -> Self {
        AnthropicError(e)
    }
}

impl std::fmt::Display for AnthropicError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl ResponseError for AnthropicError {
    fn status_code(&self) -> actix_web::http::StatusCode {
        self.0.status()
    }

    fn error_response(&self) -> HttpResponse {
        self.0.response_with(error_envelope(&self.0))
    }
}

fn app_state(req: &HttpRequest) -> Result<web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>().cloned().ok_or_else(|| ApiError::Internal("the app has no AppState".into()))
}

/// The key check and the JSON body, with their errors in Anthropic's envelope.
async fn authorized_body(req: &HttpRequest, payload: web::Payload) -> Result<Value, ApiError> {
    Authorized::from_request(req, &mut Payload::None).await?;
    let ApiJson(body) = ApiJson::<Value>::from_request(req, &mut payload.into_inner()).await?;
    Ok(body)
}

/// The chat request a Messages body means, parsed as chat's own body would be.
fn chat_request(body: &Value, count_only: bool) -> Result<OpenAiRequest, ApiError> {
    OpenAiRequest::from_chat_json(&to_chat(body, count_only)?)
}

pub async fn messages(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, AnthropicError> {
    let state = app_state(&req)?;
    let body = authorized_body(&req, payload).await?;
    let chat = chat_request(&body, false)?;
    let started = handlers::start(&state, chat, Endpoint::Chat, "messages").await?;
    if started.plan.stream {
        let framer = AnthropicFramer::new(&started.shape.id, &started.plan.model, started.plan.generate.prompt.len());
        return Ok(started.stream(&state, Box::new(framer)));
    }
    let openai = started.collect().await?;
    Ok(HttpResponse::Ok().json(message(&openai)))
}

/// The prompt's tokens as the template renders the request (system, turns, tools).
pub async fn count_tokens(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, AnthropicError> {
    let state = app_state(&req)?;
    let body = authorized_body(&req, payload).await?;
    let mut chat = chat_request(&body, true)?;
    chat.max_tokens = Some(1);
    let plan = chat.plan(&state, Endpoint::Chat).await?;
    Ok(HttpResponse::Ok().json(json!({ "input_tokens": plan.generate.prompt.len() })))
}

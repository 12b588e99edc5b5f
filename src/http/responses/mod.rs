//! The OpenAI Responses API: `POST /v1/responses` (JSON or SSE), `GET` and `DELETE
//! /v1/responses/{id}`. A request is translated into the chat request it means
//! (`request`), after the kept conversation of its `previous_response_id`, served by
//! the chat path, and its output shaped as a response (`response`). With `store` (the
//! default) the conversation is kept (`store`) for the key that made it; its turns
//! continue one tokenization session, so a turn tokenizes only its new text, and the
//! prefix cache holds the transcript's K/V, so it prefills only its new tokens.

mod items;
mod request;
mod response;
pub mod store;
#[cfg(test)]
mod tests;

use actix_web::dev::Payload;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::error::ApiError;
use super::extract::{ApiJson, Authorized};
use super::handlers;
use super::request::{Endpoint, OpenAiRequest};
use super::state::{unix_now, AppState};
use request::{input_messages, read_ask, to_chat};
use response::{from_chat, Keep, ResponseMeta, ResponsesFramer};
use store::Owner;

fn app_state(req: &HttpRequest) -> Result<web::Data<AppState>, ApiError> {
    req.app_data::<web::Data<AppState>>().cloned().ok_or_else(|| ApiError::Internal("the app has no AppState".into()))
}

async fn owner(req: &HttpRequest) -> Result<Owner, ApiError> {
    Ok(Authorized::from_request(req, &mut Payload::None).await?.owner)
}

/// Chat's names for a field, in the Responses request's terms.
fn in_responses_terms(error: ApiError) -> ApiError {
    let ApiError::BadRequest { message, param: Some(param) } = error else { return error };
    let renamed = [
        ("max_completion_tokens", "max_output_tokens"),
        ("response_format", "text.format"),
        ("messages", "input"),
        ("stream_options", "stream"),
    ]
    .iter()
    .find_map(|(chat, ours)| param.strip_prefix(chat).map(|rest| format!("{ours}{rest}")));
    ApiError::BadRequest { message, param: Some(renamed.unwrap_or(param)) }
}

/// The tokenization session of a conversation: one per key and first response.
fn session_of(owner: &Owner, chain: &str, max_bytes: usize) -> Option<String> {
    let digest = Sha256::new().chain_update(owner).chain_update(chain.as_bytes()).finalize();
    let hex: String = digest.iter().take(8).map(|b| format!("{b:02x}")).collect();
    let id = format!("resp:{hex}");
    (id.len() <= max_bytes).then_some(id)
}

pub async fn create(req: HttpRequest, payload: web::Payload) -> Result<HttpResponse, ApiError> {
    let state = app_state(&req)?;
    let owner = owner(&req).await?;
    let ApiJson(body) = ApiJson::<Value>::from_request(&req, &mut payload.into_inner()).await?;
    let ask = read_ask(&body)?;
    let input = input_messages(&body)?;
    let (history, chain) = match &ask.previous_response_id {
        None => (Vec::new(), None),
        Some(id) => {
            let previous = state.responses.get(id, &owner).ok_or_else(|| ApiError::NotFound {
                message: format!("previous response {id:?} was not found (never stored, deleted, or evicted)"),
                param: Some("previous_response_id".into()),
                code: "previous_response_not_found",
            })?;
            (previous.messages, Some(previous.chain))
        }
    };
    let id = state.new_stored_id("resp");
    let chain = chain.unwrap_or_else(|| id.clone());
    let chat = to_chat(&body, &history, &input)?;
    let mut chat = OpenAiRequest::from_chat_json(&chat).map_err(in_responses_terms)?;
    chat.session_id = session_of(&owner, &chain, state.limits.request.max_session_id_bytes);
    let started = handlers::start(&state, chat, Endpoint::Chat, "responses").await.map_err(in_responses_terms)?;
    let meta = ResponseMeta { id, created_at: unix_now(), model: started.plan.model.clone(), echo: ask.echo };
    let keep = ask.store.then(|| {
        let mut messages = history;
        messages.extend(input);
        Keep { store: state.responses.clone(), owner, chain, messages }
    });
    if started.plan.stream {
        return Ok(started.stream(&state, Box::new(ResponsesFramer::new(meta, keep))));
    }
    let chat = started.collect().await?;
    Ok(HttpResponse::Ok().json(from_chat(&meta, &chat, keep)))
}

fn not_found(id: &str) -> ApiError {
    ApiError::NotFound {
        message: format!("no response with id {id:?} (never stored, deleted, or evicted)"),
        param: None,
        code: "response_not_found",
    }
}

pub async fn get(req: HttpRequest, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let state = app_state(&req)?;
    let owner = owner(&req).await?;
    let stored = state.responses.get(&id, &owner).ok_or_else(|| not_found(&id))?;
    Ok(HttpResponse::Ok().json(stored.response))
}

pub async fn delete(req: HttpRequest, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let state = app_state(&req)?;
    let owner = owner(&req).await?;
    if !state.responses.remove(&id, &owner) {
        return Err(not_found(&id));
    }
    Ok(HttpResponse::Ok().json(json!({ "id": id.as_str(), "object": "response", "deleted": true })))
}

/// `GET /v1/responses/{id}/input_items`: the kept response's input (its chain's kept turns
/// and its own input) as items, a page at a time.
pub async fn input_items(req: HttpRequest, id: web::Path<String>) -> Result<HttpResponse, ApiError> {
    let state = app_state(&req)?;
    let owner = owner(&req).await?;
    let stored = state.responses.get(&id, &owner).ok_or_else(|| not_found(&id))?;
    // The last kept message is the response's own output.
    let inputs = &stored.messages[..stored.messages.len().saturating_sub(1)];
    let page = items::page(items::conversation_items(&stored.chain, inputs), req.query_string())?;
    Ok(HttpResponse::Ok().json(page))
}

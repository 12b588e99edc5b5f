//! `POST /v1/chat/completions` and `POST /v1/completions`: one path for both, which
//! differs only in how the prompt is tokenized and how the response is shaped.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use futures::StreamExt;
use serde_json::Value;
use tokenrouter_actors::GenerationEvent;

use super::error::ApiError;
use super::extract::{ApiJson, Authorized, SessionHeader};
use super::generator::EventStream;
use super::request::{Endpoint, OpenAiRequest};
use super::response::{Collected, Shape, StreamEncoder, TokenInfo};
use super::sse::SseStream;
use super::state::{unix_now, AppState};

pub async fn chat_completions(
    state: web::Data<AppState>,
    _: Authorized,
    session: SessionHeader,
    body: ApiJson<OpenAiRequest>,
) -> Result<HttpResponse, ApiError> {
    serve(&state, with_session(body.0, session), Endpoint::Chat).await
}

pub async fn completions(
    state: web::Data<AppState>,
    _: Authorized,
    session: SessionHeader,
    body: ApiJson<OpenAiRequest>,
) -> Result<HttpResponse, ApiError> {
    serve(&state, with_session(body.0, session), Endpoint::Completions).await
}

fn with_session(mut body: OpenAiRequest, header: SessionHeader) -> OpenAiRequest {
    body.session_id = body.session_id.or(header.0);
    body
}

async fn serve(state: &AppState, body: OpenAiRequest, endpoint: Endpoint) -> Result<HttpResponse, ApiError> {
    let label = match endpoint {
        Endpoint::Chat => "chat",
        Endpoint::Completions => "completions",
    };
    metrics::counter!("tokenrouter_http_requests_total", "endpoint" => label).increment(1);
    // Admission first: a full server refuses before spending time on templates.
    let permit = state.admit()?;
    let plan = body.plan(state, endpoint).await?;
    let shape = Shape::new(&plan, state.next_response_id(), unix_now(), state.engine.clone());
    let stream = plan.stream;
    // Errors up to here (including the engine refusing the request) are HTTP errors;
    // once the stream has begun they travel inside it.
    let events = state.engine.generate_with_text(plan.generate, plan.prompt_text.as_deref()).await?;
    if stream {
        let body = SseStream::new(events, StreamEncoder::new(shape), state.limits.keep_alive_interval, permit);
        return Ok(HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            // Tell reverse proxies (nginx) not to buffer the stream.
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(body));
    }
    // If the client goes away, actix drops this future and with it `events`, which
    // cancels the request.
    let response = collect(events, shape).await;
    drop(permit);
    Ok(HttpResponse::Ok().json(response?))
}

async fn collect(mut events: EventStream, shape: Shape) -> Result<Value, ApiError> {
    let mut collected = Collected::new(shape);
    while let Some(event) = events.next().await {
        match event {
            GenerationEvent::Token { token, model, logprob, top_logprobs, text, .. } => {
                collected.token(TokenInfo { token, model, logprob, top_logprobs }, &text);
            }
            GenerationEvent::Finished { reason, usage, text, .. } => return Ok(collected.finish(reason, &usage, &text)),
            GenerationEvent::Error { error, .. } => return Err(ApiError::from(error)),
        }
    }
    Err(ApiError::Internal("the engine ended the request without a final event".into()))
}

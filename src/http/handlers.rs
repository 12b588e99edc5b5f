//! `POST /v1/chat/completions` and `POST /v1/completions`: one path for both, which
//! differs only in how the prompt is tokenized and how the response is shaped. The
//! Anthropic route (`anthropic/`) starts and collects requests through it too.

use actix_web::http::header;
use actix_web::{web, HttpResponse};
use futures::StreamExt;
use serde_json::Value;
use tokenrouter_actors::{GenerationEvent, Usage};

use super::error::ApiError;
use super::extract::{ApiJson, Authorized, SessionHeader};
use super::generator::EventStream;
use super::request::{Endpoint, OpenAiRequest, Plan};
use super::response::{add_choice_usage, Collected, Shape, StreamEncoder, TokenInfo};
use super::sse::{Framer, OpenAiFramer, SseStream};
use super::state::{unix_now, AppState};
use tokio::sync::OwnedSemaphorePermit;

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
    let started = start(state, body, endpoint, label).await?;
    if started.plan.stream {
        return Ok(started.stream(state, Box::new(OpenAiFramer)));
    }
    Ok(HttpResponse::Ok().json(started.collect().await?))
}

/// A request the engine has admitted: its choices' event streams, and what shapes
/// their response.
pub(super) struct Started {
    pub plan: Plan,
    pub shape: Shape,
    streams: Vec<EventStream>,
    permit: OwnedSemaphorePermit,
}

/// Admits, validates, tokenizes and starts every choice. Errors up to here (the
/// engine refusing the request included) are HTTP errors; once a stream has begun
/// they travel inside it. A choice refused after others were admitted refuses the
/// whole request: dropping their streams cancels them.
pub(super) async fn start(
    state: &AppState,
    body: OpenAiRequest,
    endpoint: Endpoint,
    label: &'static str,
) -> Result<Started, ApiError> {
    metrics::counter!("tokenrouter_http_requests_total", "endpoint" => label).increment(1);
    // Admission first: a full server refuses before spending time on templates.
    let permit = state.admit()?;
    let plan = body.plan(state, endpoint).await?;
    let shape = Shape::new(&plan, state.next_response_id(), unix_now(), state.engine.clone());
    let mut streams = Vec::with_capacity(plan.n);
    for request in plan.choice_requests() {
        let stream = state.engine.generate_with_text(request, plan.prompt_text.as_deref()).await;
        streams.push(stream.map_err(|e| plan.engine_error(e))?);
    }
    Ok(Started { plan, shape, streams, permit })
}

impl Started {
    /// The SSE response, framed by `framer`.
    pub fn stream(self, state: &AppState, framer: Box<dyn Framer>) -> HttpResponse {
        let encoders = (0..self.plan.n).map(|i| StreamEncoder::new(self.shape.clone(), i)).collect();
        let body = SseStream::new(self.streams, encoders, framer, state.limits.keep_alive_interval, self.permit);
        HttpResponse::Ok()
            .content_type("text/event-stream")
            .insert_header((header::CACHE_CONTROL, "no-cache"))
            // Tell reverse proxies (nginx) not to buffer the stream.
            .insert_header(("X-Accel-Buffering", "no"))
            .streaming(body)
    }

    /// The whole OpenAI response. If the client goes away, actix drops this future
    /// and with it the streams, which cancels the requests.
    pub async fn collect(self) -> Result<Value, ApiError> {
        let Started { shape, streams, permit, .. } = self;
        let collected =
            streams.into_iter().enumerate().map(|(i, events)| collect(events, Collected::new(shape.clone(), i)));
        // The first failed choice fails the response and drops (cancels) the others.
        let finished = futures::future::try_join_all(collected).await;
        drop(permit);
        let mut usage = Usage::default();
        let mut choices = Vec::new();
        for (choice, choice_usage) in finished? {
            add_choice_usage(&mut usage, &choice_usage);
            choices.push(choice);
        }
        Ok(shape.response(choices, &usage))
    }
}

async fn collect(mut events: EventStream, mut collected: Collected) -> Result<(Value, Usage), ApiError> {
    while let Some(event) = events.next().await {
        match event {
            GenerationEvent::Token { token, model, logprob, top_logprobs, text, drafted, .. } => {
                collected.token(TokenInfo { token, model, logprob, top_logprobs, drafted }, &text);
            }
            GenerationEvent::Finished { reason, usage, text, stop } => {
                return Ok((collected.finish(reason, &text, stop.as_deref()), usage))
            }
            GenerationEvent::Error { error, .. } => return Err(ApiError::from(error)),
        }
    }
    Err(ApiError::Internal("the engine ended the request without a final event".into()))
}

//! The OpenAI-compatible HTTP layer (actix-web): `POST /v1/chat/completions` and
//! `POST /v1/completions` (JSON or SSE), the Responses API (`POST /v1/responses`,
//! `GET`/`DELETE /v1/responses/{id}`), Anthropic's `POST /v1/messages` (and
//! `/v1/messages/count_tokens`), `GET /v1/models`, `GET /health`,
//! `GET /metrics` (Prometheus), `GET /v1/stats` (JSON for the dashboard) and
//! `GET /openapi.json` (an OpenAPI description of all of these).
//!
//! Handlers talk to a [`Generator`] (implemented for the engine) and choose policies
//! through a [`PolicyResolver`]; every failure is an [`ApiError`], mapped to a status
//! and OpenAI's error envelope in one place.
//!
//! With API keys configured, the generation routes and `/v1/models` need
//! `Authorization: Bearer <key>` (or `x-api-key: <key>`); `/health`, `/metrics`,
//! `/v1/stats` and `/openapi.json` are operational read-only views and need none.

mod anthropic;
mod cache;
mod debug;
mod error;
mod extract;
pub(crate) mod fields;
mod generator;
mod handlers;
mod history;
mod info;
mod metrics;
mod openapi;
mod openapi_anthropic;
mod parse_errors;
mod request;
mod response;
pub mod responses;
mod routing;
mod server;
mod speculation;
mod sse;
mod state;
mod tokenize;
mod tools;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::{web, App};

pub use error::ApiError;
pub use extract::{ApiJson, Authorized};
pub use generator::{EngineStats, EventStream, Generator};
pub use metrics::install_metrics_recorder;
pub use openapi::document as openapi_document;
pub use request::{Endpoint, OpenAiRequest};
pub use responses::store::{ResponseStore, StoreLimits as ResponseStoreLimits};
pub use routing::{DefaultPolicyOnly, PolicyResolver, RoutingRequest};
pub use server::{run_server, RunningServer};
pub use state::{AppState, Limits, RequestLimits};

/// The API's routes, for composing into another app (`App::configure`). Needs
/// `web::Data<AppState>` in the app's data.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/chat/completions", web::post().to(handlers::chat_completions))
        .route("/v1/completions", web::post().to(handlers::completions))
        .route("/v1/responses", web::post().to(responses::create))
        .route("/v1/responses/{id}", web::get().to(responses::get))
        .route("/v1/responses/{id}", web::delete().to(responses::delete))
        .route("/v1/responses/{id}/input_items", web::get().to(responses::input_items))
        .route("/v1/messages", web::post().to(anthropic::messages))
        .route("/v1/messages/count_tokens", web::post().to(anthropic::count_tokens))
        .route("/v1/models", web::get().to(info::models))
        .route("/tokenize", web::post().to(tokenize::tokenize))
        .route("/detokenize", web::post().to(tokenize::detokenize))
        .route("/v1/stats", web::get().to(info::stats))
        .route("/reset_prefix_cache", web::post().to(cache::reset_prefix_cache))
        .route("/v1/stats/history", web::get().to(history::history))
        .route("/health", web::get().to(info::health))
        .route("/metrics", web::get().to(info::metrics))
        .route("/openapi.json", web::get().to(openapi::openapi))
        .route("/dashboard", web::get().to(dashboard))
        .route("/debug/fault", web::post().to(debug::inject_fault));
}

async fn dashboard() -> actix_web::HttpResponse {
    actix_web::HttpResponse::Ok().content_type("text/html; charset=utf-8").body(crate::dashboard::DASHBOARD_HTML)
}

/// The whole app: state, the routes, and OpenAI envelopes for unknown routes and
/// for any actix `Json` extractor. More routes can be added to what it returns.
pub fn build_app(
    state: AppState,
) -> App<
    impl ServiceFactory<
        ServiceRequest,
        Config = (),
        Response = ServiceResponse<impl MessageBody>,
        Error = actix_web::Error,
        InitError = (),
    >,
> {
    let limit = state.limits.max_body_bytes;
    let json = web::JsonConfig::default().limit(limit).error_handler(|e, _| ApiError::from(e).into());
    App::new()
        .app_data(web::Data::new(state))
        .app_data(json)
        .app_data(web::PayloadConfig::new(limit))
        .configure(routes)
        .default_service(web::to(info::not_found))
}

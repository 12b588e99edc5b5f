//! The read-only routes: `/v1/models`, `/health`, `/metrics`, `/v1/stats`, and the
//! envelope for unknown routes.

use actix_web::{web, HttpRequest, HttpResponse};
use serde_json::json;

use super::error::ApiError;
use super::extract::Authorized;
use super::state::AppState;

/// OpenAI's list: the served id first, then each engine model (requests may name any).
pub async fn models(state: web::Data<AppState>, _: Authorized) -> HttpResponse {
    let mut ids = vec![state.served_model.clone()];
    ids.extend(state.engine.model_names().into_iter().filter(|n| *n != state.served_model));
    let context = state.engine.max_context();
    let data: Vec<_> = ids
        .into_iter()
        .map(|id| json!({ "id": id, "object": "model", "created": state.created, "owned_by": "tokenrouter", "max_model_len": context }))
        .collect();
    HttpResponse::Ok().json(json!({ "object": "list", "data": data }))
}

/// 200 when every model can serve and the tokenizer answers; 503 with `Retry-After`
/// while shutting down, or while a model is out of service or not answering.
pub async fn health(state: web::Data<AppState>) -> Result<HttpResponse, ApiError> {
    if state.is_shutting_down() {
        return Err(ApiError::ShuttingDown);
    }
    let readiness = state.engine.readiness().await;
    match readiness.problem() {
        None => Ok(HttpResponse::Ok().json(json!({ "status": "ok", "models": readiness.models }))),
        Some(message) => Ok(HttpResponse::ServiceUnavailable()
            .insert_header((actix_web::http::header::RETRY_AFTER, HEALTH_RETRY_AFTER_S.to_string()))
            .json(json!({ "status": "unavailable", "message": message, "models": readiness.models }))),
    }
}

/// When a load balancer should ask again after a 503 from `/health`.
const HEALTH_RETRY_AFTER_S: u64 = 5;

/// Prometheus text exposition of everything recorded through the `metrics` crate.
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    let body = match &state.metrics {
        Some(handle) => {
            handle.run_upkeep();
            handle.render()
        }
        None => String::new(),
    };
    HttpResponse::Ok().content_type("text/plain; version=0.0.4; charset=utf-8").body(body)
}

/// Per-model snapshots, KV use and requests in flight, for the dashboard.
pub async fn stats(state: web::Data<AppState>) -> HttpResponse {
    let engine = state.engine.stats().await;
    let readiness = match engine.readiness.clone() {
        Some(readiness) => readiness,
        None => state.engine.readiness().await,
    };
    HttpResponse::Ok().json(json!({
        "model_names": state.engine.model_names(),
        "served_model": state.served_model,
        "models": engine.models,
        "kv": engine.kv,
        "active_requests": engine.active_requests,
        "nodes": engine.nodes,
        "http_in_flight": state.in_flight(),
        "max_queued_requests": state.limits.max_queued_requests,
        "shutting_down": state.is_shutting_down(),
        "ready": readiness.ready && !state.is_shutting_down(),
        "readiness": readiness,
        "planner": engine.planner,
    }))
}

pub async fn not_found(req: HttpRequest) -> Result<HttpResponse, ApiError> {
    Err(ApiError::UnknownRoute(format!("{} {}", req.method(), req.path())))
}

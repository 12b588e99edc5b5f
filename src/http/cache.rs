//! `POST /reset_prefix_cache` (vLLM's name; SGLang's `/flush_cache`): every model drops
//! the cached prompt prefixes no request holds. Requests in flight keep their K/V; a
//! later request with a prefix that was cached computes it again. Benchmarks call it
//! between runs so that a run does not reuse an earlier run's prompts.

use actix_web::{web, HttpResponse};
use serde_json::json;

use super::error::ApiError;
use super::extract::Authorized;
use super::state::AppState;

pub async fn reset_prefix_cache(state: web::Data<AppState>, _: Authorized) -> Result<HttpResponse, ApiError> {
    let models = state.engine.flush_prefix_caches().await?;
    for flush in &models {
        if let Some(blocks) = flush.dropped_blocks {
            metrics::counter!("tokenrouter_prefix_cache_flushed_blocks_total", "model" => flush.model.clone())
                .increment(blocks as u64);
        }
    }
    let complete = models.iter().all(|m| m.dropped_blocks.is_some());
    Ok(HttpResponse::Ok().json(json!({ "reset": complete, "models": models })))
}

//! `POST /debug/fault {"model": "large", "point": "step" | "mid_apply" | "message" | "recover"}`:
//! makes a model panic at that point, to watch requests survive it (soak tests, the
//! churn workload of `tokenrouter-load`). Served only when the config turns
//! `debug.fault_injection` on; otherwise the route does not exist (404).

use actix_web::{web, HttpResponse};
use serde::Deserialize;
use serde_json::json;
use tokenrouter_actors::Fault;

use super::error::ApiError;
use super::extract::{ApiJson, Authorized};
use super::state::AppState;

#[derive(Debug, Deserialize)]
pub struct FaultRequest {
    pub model: String,
    /// Where the panic strikes; `step` when absent.
    #[serde(default)]
    pub point: Option<Fault>,
}

pub async fn inject_fault(
    state: web::Data<AppState>,
    _: Authorized,
    body: ApiJson<FaultRequest>,
) -> Result<HttpResponse, ApiError> {
    if !state.fault_injection {
        return Err(ApiError::UnknownRoute("/debug/fault".into()));
    }
    let request = body.0;
    let point = request.point.unwrap_or(Fault::Step);
    let Some(model) = state.engine.model_names().iter().position(|m| *m == request.model) else {
        return Err(ApiError::bad_request(format!("no model `{}`", request.model), Some("model")));
    };
    state.engine.inject_fault(model, point)?;
    metrics::counter!("tokenrouter_injected_faults_total", "model" => request.model.clone()).increment(1);
    Ok(HttpResponse::Ok().json(json!({ "injected": true, "model": request.model, "point": point })))
}

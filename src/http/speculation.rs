//! What a request's output is verified against: `speculative` (this server's drafts
//! from text the request has seen) and `prediction` (OpenAI's Predicted Outputs, a
//! draft the client supplies). Either way every token is the model's own.

use serde::Deserialize;
use serde_json::Value;
use tokenrouter_core::spec::{Speculation, SpeculationMethod, DEFAULT_DRAFT_TOKENS, MAX_DRAFT_TOKENS};

use super::error::ApiError;
use super::state::AppState;

/// `"speculative": {"method": "ngram", "max_tokens": 8}`; `"method": "none"` turns the
/// server's default off for this request.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpeculativeRequest {
    pub method: Option<String>,
    pub max_tokens: Option<u64>,
}

/// The request's speculation: its own fields over the server's default.
pub async fn speculation_of(
    speculative: Option<&SpeculativeRequest>,
    prediction: Option<&Value>,
    state: &AppState,
) -> Result<Option<Speculation>, ApiError> {
    let default = state.speculation.as_ref();
    let method = match speculative.and_then(|s| s.method.as_deref()) {
        None => default.and_then(|d| d.method),
        Some("none") => None,
        Some(name) => {
            Some(name.parse::<SpeculationMethod>().map_err(|m| ApiError::bad_request(m, Some("speculative.method")))?)
        }
    };
    if method == Some(SpeculationMethod::Draft) && state.engine.model_names().len() < 2 {
        let m = "speculative method \"draft\" needs a draft model: this server serves one model";
        return Err(ApiError::bad_request(m, Some("speculative.method")));
    }
    let max_tokens = match speculative.and_then(|s| s.max_tokens) {
        Some(k) if (1..=MAX_DRAFT_TOKENS as u64).contains(&k) => k as usize,
        Some(k) => {
            let m = format!("speculative.max_tokens must be in 1..={MAX_DRAFT_TOKENS}, got {k}");
            return Err(ApiError::bad_request(m, Some("speculative.max_tokens")));
        }
        None => default.map_or(DEFAULT_DRAFT_TOKENS, |d| d.max_tokens),
    };
    let prediction = match prediction {
        None => Vec::new(),
        Some(p) => {
            let text = prediction_text(p)?;
            state.engine.encode(text, false).await.map_err(|e| {
                ApiError::bad_request(format!("the prediction cannot be tokenized: {e}"), Some("prediction"))
            })?
        }
    };
    if method.is_none() && prediction.is_empty() {
        return Ok(None);
    }
    Ok(Some(Speculation { method, max_tokens, prediction }))
}

/// `{"type": "content", "content": "…"}`, the content also as text parts, as OpenAI takes it.
fn prediction_text(prediction: &Value) -> Result<String, ApiError> {
    let bad = |m: &str, p: &str| ApiError::bad_request(m, Some(p));
    let Some(object) = prediction.as_object() else {
        return Err(bad("`prediction` must be an object {\"type\": \"content\", \"content\": …}", "prediction"));
    };
    match object.get("type").and_then(Value::as_str) {
        Some("content") => {}
        _ => return Err(bad("`prediction.type` must be \"content\"", "prediction.type")),
    }
    if let Some(field) = object.keys().find(|k| *k != "type" && *k != "content") {
        return Err(bad(&format!("`prediction.{field}` is not a field of a prediction"), "prediction"));
    }
    match object.get("content") {
        Some(Value::String(text)) => Ok(text.clone()),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|part| match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(text)) => Ok(text),
                _ => Err(bad(
                    "each part of `prediction.content` must be {\"type\": \"text\", \"text\": …}",
                    "prediction.content",
                )),
            })
            .collect(),
        _ => Err(bad("`prediction.content` must be a string or an array of text parts", "prediction.content")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn predictions_take_openais_shapes_and_refuse_others_by_field() {
        assert_eq!(prediction_text(&json!({"type": "content", "content": "fn main() {}"})).unwrap(), "fn main() {}");
        let parts =
            json!({"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(prediction_text(&parts).unwrap(), "ab");
        let param = |v: Value| match prediction_text(&v) {
            Err(ApiError::BadRequest { param, .. }) => param,
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert_eq!(param(json!("text")).as_deref(), Some("prediction"));
        assert_eq!(param(json!({"type": "other", "content": "x"})).as_deref(), Some("prediction.type"));
        assert_eq!(param(json!({"type": "content", "content": 3})).as_deref(), Some("prediction.content"));
        assert_eq!(
            param(json!({"type": "content", "content": [{"type": "image"}]})).as_deref(),
            Some("prediction.content")
        );
        assert_eq!(param(json!({"type": "content", "content": "x", "extra": 1})).as_deref(), Some("prediction"));
    }
}

//! The one error type of the HTTP layer, mapped in one place (`status` and
//! `envelope`) to a status code and OpenAI's error envelope
//! `{"error":{"message","type","param","code"}}`, used for response bodies and for
//! errors inside an SSE stream alike.

use std::fmt;

use actix_web::error::JsonPayloadError;
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, ResponseError};
use serde_json::{json, Value};
use tokenrouter_actors::EngineError;

/// `Retry-After` of a model out of service: long enough not to hammer a server that
/// cannot serve, short enough that a client notices when it can again (a load
/// balancer would have moved on long before).
const UNAVAILABLE_RETRY_AFTER_S: u64 = 10;

#[derive(Debug, Clone, PartialEq)]
pub enum ApiError {
    /// 400: malformed JSON, wrong types, bad values. `param` names the offending
    /// field (a dotted path such as `stream_options.include_usage`) when known.
    BadRequest { message: String, param: Option<String> },
    /// 400: actix could not parse the request line or a header (see `parse_errors`).
    MalformedRequest,
    /// 431: the request line and headers are over actix's limit.
    RequestHeadTooLarge,
    /// 408: a connection's first request was not whole within `Limits::idle_connection`.
    RequestHeadTimeout,
    /// 401: API keys are configured and the request has none of them.
    Unauthorized,
    /// 404: the `model` field names no served model.
    UnknownModel(String),
    /// 404: no such route.
    UnknownRoute(String),
    /// 404: a kept object (a stored response) that is not there for this key.
    NotFound { message: String, param: Option<String>, code: &'static str },
    /// 413: the body is larger than the configured limit.
    PayloadTooLarge { limit: usize },
    /// 429: the admission queue is full.
    QueueFull { limit: usize },
    /// 503: the server is shutting down.
    ShuttingDown,
    /// 503 with `Retry-After`: no KV became free within the wait limit.
    Overloaded { message: String, retry_after_s: u64 },
    /// 503 with `Retry-After`: a model the request needs is out of service.
    Unavailable(String),
    /// 504: the request's time limit ran out.
    Timeout(String),
    /// 500: anything else; the message is logged and returned.
    Internal(String),
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError::BadRequest { message: message.into(), param: param.map(str::to_string) }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::BadRequest { .. } | ApiError::MalformedRequest => StatusCode::BAD_REQUEST,
            ApiError::RequestHeadTooLarge => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            ApiError::RequestHeadTimeout => StatusCode::REQUEST_TIMEOUT,
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::UnknownModel(_) | ApiError::UnknownRoute(_) | ApiError::NotFound { .. } => StatusCode::NOT_FOUND,
            ApiError::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::QueueFull { .. } => StatusCode::TOO_MANY_REQUESTS,
            ApiError::ShuttingDown | ApiError::Overloaded { .. } | ApiError::Unavailable(_) => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Timeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `type` and `code` for this error.
    fn kind_and_code(&self) -> (&'static str, Option<&'static str>) {
        match self {
            ApiError::BadRequest { .. } => ("invalid_request_error", None),
            ApiError::MalformedRequest => ("invalid_request_error", Some("malformed_request")),
            ApiError::RequestHeadTooLarge => ("invalid_request_error", Some("request_header_fields_too_large")),
            ApiError::RequestHeadTimeout => ("invalid_request_error", Some("request_head_timeout")),
            ApiError::Unauthorized => ("invalid_request_error", Some("invalid_api_key")),
            ApiError::UnknownModel(_) => ("invalid_request_error", Some("model_not_found")),
            ApiError::UnknownRoute(_) => ("invalid_request_error", Some("not_found")),
            ApiError::NotFound { code, .. } => ("invalid_request_error", Some(*code)),
            ApiError::PayloadTooLarge { .. } => ("invalid_request_error", Some("request_too_large")),
            ApiError::QueueFull { .. } => ("rate_limit_error", Some("queue_full")),
            ApiError::ShuttingDown => ("service_unavailable_error", Some("shutting_down")),
            ApiError::Overloaded { .. } => ("service_unavailable_error", Some("kv_wait_timeout")),
            ApiError::Unavailable(_) => ("service_unavailable_error", Some("model_unavailable")),
            ApiError::Timeout(_) => ("timeout_error", Some("request_timeout")),
            ApiError::Internal(_) => ("server_error", Some("internal_error")),
        }
    }

    /// When a client should try again (`Retry-After`), for errors that pass.
    fn retry_after_s(&self) -> Option<u64> {
        match self {
            ApiError::Overloaded { retry_after_s, .. } => Some(*retry_after_s),
            ApiError::Unavailable(_) => Some(UNAVAILABLE_RETRY_AFTER_S),
            _ => None,
        }
    }

    pub fn param(&self) -> Option<&str> {
        match self {
            ApiError::BadRequest { param, .. } | ApiError::NotFound { param, .. } => param.as_deref(),
            ApiError::UnknownModel(_) => Some("model"),
            _ => None,
        }
    }

    /// The error's response with `body` (OpenAI's envelope, or another API's): its
    /// status, `Retry-After` where it passes, and internal errors logged.
    pub(crate) fn response_with(&self, body: Value) -> HttpResponse {
        if let ApiError::Internal(m) = self {
            tracing::error!(message = %m, "request failed");
        }
        let mut response = HttpResponse::build(self.status());
        if let Some(seconds) = self.retry_after_s() {
            response.insert_header((actix_web::http::header::RETRY_AFTER, seconds.to_string()));
        }
        response.json(body)
    }

    /// `{"error": {...}}`, the body of an error response and of an SSE error event.
    pub fn envelope(&self) -> Value {
        let (kind, code) = self.kind_and_code();
        json!({ "error": { "message": self.to_string(), "type": kind, "param": self.param(), "code": code } })
    }
}

impl fmt::Display for ApiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ApiError::BadRequest { message, .. } => f.write_str(message),
            ApiError::MalformedRequest => f.write_str(
                "the request line or a header could not be parsed (a URL over 64 KiB, or a control character \
                 in a header value such as Authorization)",
            ),
            ApiError::RequestHeadTooLarge => f.write_str("the request line and headers are over 128 KiB"),
            ApiError::RequestHeadTimeout => f.write_str(
                "no whole request arrived on this connection in the server's idle-connection limit \
                 (server.idle_connection_secs); send it again on a new connection",
            ),
            ApiError::Unauthorized => f.write_str("invalid or missing API key: send `Authorization: Bearer <key>`"),
            ApiError::UnknownModel(m) => write!(f, "the model `{m}` does not exist; see GET /v1/models"),
            ApiError::UnknownRoute(p) => write!(f, "no route {p}"),
            ApiError::NotFound { message, .. } => f.write_str(message),
            ApiError::PayloadTooLarge { limit } => {
                write!(f, "the request body is larger than the limit of {limit} bytes")
            }
            ApiError::QueueFull { limit } => {
                write!(f, "the server is at its limit of {limit} requests in flight; retry later")
            }
            ApiError::ShuttingDown => f.write_str("the server is shutting down"),
            ApiError::Overloaded { message, .. } | ApiError::Unavailable(message) | ApiError::Timeout(message) => {
                f.write_str(message)
            }
            ApiError::Internal(m) => write!(f, "internal error: {m}"),
        }
    }
}

impl std::error::Error for ApiError {}

impl ResponseError for ApiError {
    fn status_code(&self) -> StatusCode {
        self.status()
    }

    fn error_response(&self) -> HttpResponse {
        self.response_with(self.envelope())
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::InvalidRequest(m) => ApiError::BadRequest { message: m, param: None },
            e @ EngineError::InvalidGrammar(_) => ApiError::bad_request(e.to_string(), Some("response_format")),
            // The prompt can never fit this engine's KV: the client must send less.
            e @ EngineError::TooLarge { .. } => ApiError::bad_request(e.to_string(), None),
            EngineError::ShuttingDown => ApiError::ShuttingDown,
            EngineError::QueueFull { limit } => ApiError::QueueFull { limit },
            e @ EngineError::Overloaded { retry_after, .. } => {
                ApiError::Overloaded { message: e.to_string(), retry_after_s: retry_after.as_secs_f64().ceil() as u64 }
            }
            e @ EngineError::DeadlineExceeded { .. } => ApiError::Timeout(e.to_string()),
            EngineError::UpstreamTimeout(m) => ApiError::Timeout(m),
            EngineError::ModelUnavailable(m) => ApiError::Unavailable(m),
            // Both say "internal error: ": only one of them may.
            EngineError::Internal(m) => ApiError::Internal(m),
            e @ (EngineError::ModelLoad { .. } | EngineError::Config(_)) => ApiError::Internal(e.to_string()),
        }
    }
}

/// For actix's own `Json` extractor (`JsonConfig::error_handler`), so that any JSON
/// route answers with the envelope rather than actix's plain text.
impl From<JsonPayloadError> for ApiError {
    fn from(e: JsonPayloadError) -> Self {
        match e {
            JsonPayloadError::OverflowKnownLength { limit, .. } | JsonPayloadError::Overflow { limit } => {
                ApiError::PayloadTooLarge { limit }
            }
            JsonPayloadError::Deserialize(e) => ApiError::bad_request(format!("invalid JSON body: {e}"), None),
            JsonPayloadError::ContentType => ApiError::bad_request("expected Content-Type: application/json", None),
            other => ApiError::bad_request(other.to_string(), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_its_status_and_an_openai_envelope() {
        let cases = [
            (ApiError::bad_request("bad n", Some("n")), 400, Some("n")),
            (ApiError::MalformedRequest, 400, None),
            (ApiError::RequestHeadTooLarge, 431, None),
            (ApiError::RequestHeadTimeout, 408, None),
            (ApiError::Unauthorized, 401, None),
            (ApiError::UnknownModel("gpt".into()), 404, Some("model")),
            (ApiError::PayloadTooLarge { limit: 10 }, 413, None),
            (ApiError::QueueFull { limit: 1 }, 429, None),
            (ApiError::ShuttingDown, 503, None),
            (ApiError::Overloaded { message: "wait".into(), retry_after_s: 3 }, 503, None),
            (ApiError::Unavailable("gone".into()), 503, None),
            (ApiError::Timeout("late".into()), 504, None),
            (ApiError::Internal("boom".into()), 500, None),
        ];
        for (error, status, param) in cases {
            assert_eq!(error.status().as_u16(), status, "{error:?}");
            let body = error.envelope();
            let inner = &body["error"];
            assert_eq!(inner["message"], error.to_string());
            assert!(inner["type"].is_string());
            assert_eq!(inner["param"].as_str(), param);
            assert!(inner.get("code").is_some());
        }
    }

    #[test]
    fn engine_errors_map_to_client_or_server_errors() {
        assert_eq!(ApiError::from(EngineError::InvalidRequest("x".into())).status(), StatusCode::BAD_REQUEST);
        assert_eq!(ApiError::from(EngineError::ShuttingDown).status(), StatusCode::SERVICE_UNAVAILABLE);
        let internal = ApiError::from(EngineError::Internal("x".into()));
        assert_eq!(
            (internal.status(), internal.to_string().as_str()),
            (StatusCode::INTERNAL_SERVER_ERROR, "internal error: x")
        );
        let gone = ApiError::from(EngineError::ModelUnavailable("model b is out of service".into())).error_response();
        assert_eq!(gone.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(gone.headers().get("retry-after").unwrap(), "10");
        let too_large = ApiError::from(EngineError::TooLarge { needed: 9, capacity: 8, model: "m".into() });
        assert_eq!(too_large.status(), StatusCode::BAD_REQUEST);
        let waited = std::time::Duration::from_secs(30);
        let overloaded = ApiError::from(EngineError::Overloaded { waited, retry_after: waited / 4 });
        let response = overloaded.error_response();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(response.headers().get("retry-after").unwrap(), "8");
        assert_eq!(ApiError::from(EngineError::QueueFull { limit: 2 }).status(), StatusCode::TOO_MANY_REQUESTS);
        let late = EngineError::DeadlineExceeded { limit: waited };
        assert_eq!(ApiError::from(late).status(), StatusCode::GATEWAY_TIMEOUT);
        let stalled = EngineError::UpstreamTimeout("upstream timed out".into());
        assert_eq!(ApiError::from(stalled).status(), StatusCode::GATEWAY_TIMEOUT);
    }
}

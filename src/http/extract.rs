//! Request extractors whose failures are `ApiError`s (so they answer in the OpenAI
//! envelope): the key check (a bearer token, or Anthropic's `x-api-key`) and a JSON body reader with a size limit that
//! names the offending field of a type error.

use actix_web::dev::Payload;
use actix_web::http::header;
use actix_web::{web, FromRequest, HttpRequest};
use futures::future::{ready, LocalBoxFuture, Ready};
use futures::StreamExt;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::{Choice, ConstantTimeEq};

use super::error::ApiError;
use super::state::AppState;

fn state(req: &HttpRequest) -> Result<&AppState, ApiError> {
    req.app_data::<web::Data<AppState>>()
        .map(|d| d.get_ref())
        .ok_or_else(|| ApiError::Internal("the app has no AppState".into()))
}

/// Present in a handler's arguments (before the body) when the route needs a key.
/// `owner` is the key's SHA-256 digest (all zeros where the server takes no keys): what
/// a request keeps (a stored response) belongs to it.
pub struct Authorized {
    pub owner: [u8; 32],
}

impl FromRequest for Authorized {
    type Error = ApiError;
    type Future = Ready<Result<Authorized, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        ready(state(req).and_then(|s| check_key(req, &s.api_keys)))
    }
}

const API_KEY_HEADER: &str = "x-api-key";

fn check_key(req: &HttpRequest, keys: &[String]) -> Result<Authorized, ApiError> {
    if keys.is_empty() {
        return Ok(Authorized { owner: [0; 32] });
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("bearer ")));
    // Anthropic's SDKs send the key in `x-api-key`.
    let given = bearer.or_else(|| req.headers().get(API_KEY_HEADER).and_then(|v| v.to_str().ok())).map(str::trim);
    let digest = given.map(|given| Sha256::digest(given.as_bytes()));
    match digest {
        Some(digest) if matches_any_key(&digest, keys) => Ok(Authorized { owner: digest.into() }),
        _ => Err(ApiError::Unauthorized),
    }
}

/// Compares fixed-size digests in constant time, against every key, so that timing
/// tells neither how much of a key matched, nor its length, nor which key it was.
fn matches_any_key(given: &[u8], keys: &[String]) -> bool {
    let hit =
        keys.iter().fold(Choice::from(0), |hit, key| hit | Sha256::digest(key.as_bytes()).as_slice().ct_eq(given));
    hit.into()
}

/// The `X-Session-Id` header: the tokenization session a request continues (the body's
/// `session_id` takes precedence).
pub struct SessionHeader(pub Option<String>);

pub const SESSION_HEADER: &str = "x-session-id";

impl FromRequest for SessionHeader {
    type Error = ApiError;
    type Future = Ready<Result<SessionHeader, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        let value = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok());
        ready(Ok(SessionHeader(value.map(str::to_owned))))
    }
}

/// A JSON body, read up to `Limits::max_body_bytes` (413 above) whatever its
/// Content-Type (curl's `-d` sends form-urlencoded), parsed with the path of a bad
/// field kept for `param`. Unknown fields are ignored, as OpenAI does.
pub struct ApiJson<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for ApiJson<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<ApiJson<T>, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let limit = match state(req) {
            Ok(s) => s.limits.max_body_bytes,
            Err(e) => return Box::pin(ready(Err(e))),
        };
        let declared = req
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut payload = payload.take();
        Box::pin(async move {
            if declared.is_some_and(|n| n > limit) {
                return Err(ApiError::PayloadTooLarge { limit });
            }
            let mut body = web::BytesMut::new();
            while let Some(chunk) = payload.next().await {
                let chunk = chunk.map_err(|e| ApiError::bad_request(format!("could not read the body: {e}"), None))?;
                if body.len() + chunk.len() > limit {
                    return Err(ApiError::PayloadTooLarge { limit });
                }
                body.extend_from_slice(&chunk);
            }
            parse_json(&body).map(ApiJson)
        })
    }
}

/// Parses a body; a type error names its field (`stream_options.include_usage`).
pub fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ApiError::bad_request(format!("invalid JSON body: {inner}"), None)
        } else {
            ApiError::bad_request(format!("invalid value for `{path}`: {inner}"), Some(&path))
        }
    })?;
    de.end().map_err(|e| ApiError::bad_request(format!("invalid JSON body: {e}"), None))?;
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, Debug)]
    struct Body {
        #[allow(dead_code)]
        temperature: Option<f32>,
        #[allow(dead_code)]
        options: Option<Inner>,
    }

    #[derive(Deserialize, Debug)]
    struct Inner {
        #[allow(dead_code)]
        flag: bool,
    }

    #[test]
    fn type_errors_name_their_field_and_syntax_errors_name_none() {
        let e = parse_json::<Body>(br#"{"temperature": "hot"}"#).unwrap_err();
        assert_eq!(e.param(), Some("temperature"), "{e}");
        let e = parse_json::<Body>(br#"{"options": {"flag": 3}}"#).unwrap_err();
        assert_eq!(e.param(), Some("options.flag"), "{e}");
        let e = parse_json::<Body>(br#"{"temperature": 1.0"#).unwrap_err();
        assert_eq!(e.param(), None, "{e}");
        let e = parse_json::<Body>(br#"[1, 2]"#).unwrap_err();
        assert_eq!(e.status().as_u16(), 400);
        assert!(parse_json::<Body>(br#"{"temperature": 1.0, "unknown": [1]}"#).is_ok());
    }

    #[actix_web::test]
    async fn the_session_header_is_read_when_present() {
        let with = actix_web::test::TestRequest::default().insert_header(("X-Session-Id", "agent-7")).to_http_request();
        assert_eq!(SessionHeader::extract(&with).await.unwrap().0.as_deref(), Some("agent-7"));
        let without = actix_web::test::TestRequest::default().to_http_request();
        assert_eq!(SessionHeader::extract(&without).await.unwrap().0, None);
    }

    #[test]
    fn keys_must_match_one_key_in_full() {
        let keys = ["secret".to_string(), "other-key".to_string()];
        let matches_any_key = |given: &str, keys: &[String]| matches_any_key(&Sha256::digest(given.as_bytes()), keys);
        assert!(matches_any_key("secret", &keys));
        assert!(matches_any_key("other-key", &keys));
        for wrong in ["secre", "secreT", "secret ", "other", "", "secretother-key"] {
            assert!(!matches_any_key(wrong, &keys), "{wrong:?}");
        }
        assert!(!matches_any_key("secret", &[]));
    }
}

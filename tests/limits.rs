//! Bounds on user-sized request fields, over real HTTP in front of a real engine on two
//! tiny random models: each refusal is a 400 in OpenAI's envelope naming the field, and
//! a request just within every bound is served. Also the OpenAPI document that states
//! these bounds. Skips, saying why, without the Qwen3 tokenizer (`.ci/run` fetches it).

use crate::http_support::*;
use serde_json::{json, Value};
use tokenrouter::http::{Limits, RequestLimits};

/// Tight limits, so the tests can reach them with small requests.
fn tight_limits() -> Limits {
    let request = RequestLimits {
        max_stop_strings: 3,
        max_stop_string_bytes: 8,
        max_stop_token_ids: 4,
        max_top_logprobs: 5,
        max_prompt_tokens: Some(32),
        max_routing_params_bytes: 64,
        max_session_id_bytes: 16,
        max_grammar_bytes: 64,
        max_tools: 2,
        max_tool_schema_bytes: 512,
    };
    Limits { request, ..test_limits() }
}

fn completion(extra: Value) -> Value {
    let mut body = json!({ "prompt": [1, 2, 3], "max_tokens": 2, "seed": 1 });
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

fn tool(name: &str, description: &str) -> Value {
    json!({ "type": "function", "function": { "name": name, "description": description } })
}

fn chat_with(extra: Value) -> Value {
    let mut body = chat("Hello", 2, 1);
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

async fn assert_refused(s: &TestServer, path: &str, body: Value, param: &str) {
    let (status, error) = s.post_json(path, &body).await;
    assert_eq!(status, 400, "{body} -> {error}");
    assert_envelope(&error, Some(param));
    assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_user_sized_field_is_refused_past_its_bound_naming_the_field() {
    let Some(s) = TestServer::start(tight_limits(), vec![]).await else { return };
    let long_prompt: Vec<u32> = (1..=33).collect();
    let cases = [
        ("/v1/completions", completion(json!({ "stop": ["a", "b", "c", "d"] })), "stop"),
        ("/v1/chat/completions", chat_with(json!({ "stop": "nine byte" })), "stop"),
        ("/v1/chat/completions", chat_with(json!({ "stop": ["ok", ""] })), "stop"),
        ("/v1/completions", completion(json!({ "stop_token_ids": [1, 2, 3, 4, 5] })), "stop_token_ids"),
        ("/v1/completions", completion(json!({ "stop_token_ids": [4_000_000_000u32] })), "stop_token_ids"),
        ("/v1/chat/completions", chat_with(json!({ "logprobs": true, "top_logprobs": 6 })), "top_logprobs"),
        ("/v1/completions", completion(json!({ "logprobs": 6 })), "logprobs"),
        ("/v1/completions", completion(json!({ "prompt": long_prompt })), "prompt"),
        ("/v1/completions", completion(json!({ "prompt": [1, 4_000_000_000u32] })), "prompt"),
        (
            "/v1/chat/completions",
            chat_with(json!({ "messages": [{"role": "user", "content": "word ".repeat(40)}] })),
            "messages",
        ),
        (
            "/v1/chat/completions",
            chat_with(json!({ "routing": {"params": {"padding": "x".repeat(64)}} })),
            "routing.params",
        ),
        ("/v1/completions", completion(json!({ "session_id": "a-session-id-of-33-bytes-in-all!!" })), "session_id"),
        (
            "/v1/completions",
            completion(json!({ "response_format": {"type": "regex", "regex": "a".repeat(65)} })),
            "response_format.regex",
        ),
        (
            "/v1/chat/completions",
            chat_with(json!({ "response_format": {"type": "json_schema",
                "json_schema": {"schema": {"type": "string", "description": "x".repeat(64)}}} })),
            "response_format.json_schema.schema",
        ),
        ("/v1/chat/completions", chat_with(json!({ "tools": [tool("a", ""), tool("b", ""), tool("c", "")] })), "tools"),
        ("/v1/chat/completions", chat_with(json!({ "tools": [tool("a", &"x".repeat(512))] })), "tools"),
        (
            "/v1/chat/completions",
            chat_with(json!({ "chat_template_kwargs": {"messages": [{"role": "system", "content": "obey"}]} })),
            "chat_template_kwargs.messages",
        ),
        (
            "/v1/chat/completions",
            chat_with(json!({ "chat_template_kwargs": {"bos_token": ""} })),
            "chat_template_kwargs.bos_token",
        ),
    ];
    for (path, body, param) in cases {
        assert_refused(&s, path, body, param).await;
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_at_every_bound_is_served() {
    let Some(s) = TestServer::start(tight_limits(), vec![]).await else { return };
    let prompt: Vec<u32> = (1..=32).collect();
    let body = completion(json!({
        "prompt": prompt,
        "stop": ["12345678", "b", "c"],
        "stop_token_ids": [151_000, 151_001, 151_002, 151_003],
        "logprobs": 5,
        "session_id": "sixteen-byte-id!",
    }));
    let (status, whole) = s.post_json("/v1/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["usage"]["prompt_tokens"], 32);
    let alternatives = whole["choices"][0]["logprobs"]["top_logprobs"][0].as_object().unwrap();
    assert!(!alternatives.is_empty() && alternatives.len() <= 5, "{whole}");

    let (status, whole) =
        s.post_json("/v1/chat/completions", &chat_with(json!({ "logprobs": true, "top_logprobs": 5 }))).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["choices"][0]["logprobs"]["content"][0]["top_logprobs"].as_array().unwrap().len(), 5);
    let within = chat_with(json!({
        "response_format": {"type": "regex", "regex": format!("[a-z]{{1,3}}{}", "b?".repeat(27))},
        "chat_template_kwargs": {"enable_thinking": false},
    }));
    let (status, whole) = s.post_json("/v1/chat/completions", &within).await;
    assert_eq!(status, 200, "{whole}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_caps_apply_by_default() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let seventeen: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    assert_refused(&s, "/v1/completions", completion(json!({ "stop": seventeen })), "stop").await;
    assert_refused(&s, "/v1/completions", completion(json!({ "stop": "x".repeat(257) })), "stop").await;
    let ids: Vec<u32> = (1..=65).collect();
    assert_refused(&s, "/v1/completions", completion(json!({ "stop_token_ids": ids })), "stop_token_ids").await;
    assert_refused(
        &s,
        "/v1/chat/completions",
        chat_with(json!({ "logprobs": true, "top_logprobs": 21 })),
        "top_logprobs",
    )
    .await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_is_served_with_the_servers_bounds() {
    let Some(s) = TestServer::start(tight_limits(), vec![]).await else { return };
    let response = s.get("/openapi.json").await;
    assert_eq!(response.status(), 200);
    let doc: Value = response.json().await.unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    for path in ["/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics", "/v1/stats"] {
        assert!(doc["paths"].get(path).is_some(), "{path} missing");
    }
    let chat = &doc["components"]["schemas"]["ChatCompletionRequest"]["properties"];
    assert_eq!(chat["max_tokens"]["maximum"], MAX_TOKENS_LIMIT);
    assert_eq!(chat["stop"]["oneOf"][1]["maxItems"], 3);
    assert_eq!(chat["top_logprobs"]["maximum"], 5);
    s.stop().await;
}

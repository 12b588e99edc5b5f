//! Time limits and admission through HTTP: the KV wait (503 with Retry-After, or an
//! error event once a stream has started, with keep-alive comments while it waits),
//! a full admission queue (429), the request time limit (504), requests without
//! `max_tokens`, and opt-in fault injection.

use std::time::Duration;

use crate::http_support::{assert_envelope, chat, sse_chunks, test_limits, Setup, TestServer, CONTEXT};
use serde_json::{json, Value};
use tokenrouter::actors::{AdmissionConfig, SupervisionConfig};

/// KV for this many tokens per model (the tiny preset stores 512 bytes per token).
const CAPACITY_TOKENS: usize = 1152;
const LONG: usize = 1000;

/// Two tiny models whose KV holds one long request at a time (reservations are
/// prompt + max_tokens here, to make "full" easy to reach).
fn one_at_a_time(admission: AdmissionConfig) -> Setup {
    let mut limits = test_limits();
    limits.max_tokens_limit = CONTEXT;
    limits.keep_alive_interval = Duration::from_millis(50);
    Setup {
        kv_budget_bytes: CAPACITY_TOKENS * 512,
        admission: AdmissionConfig { output_headroom: CONTEXT, ..admission },
        limits,
        ..Setup::default()
    }
}

async fn start(setup: Setup) -> Option<TestServer> {
    TestServer::start_setup(setup, futures::future::pending()).await
}

/// A long streamed generation that holds most of the KV while it runs (seconds on
/// these models); dropping the response cancels it.
async fn hold_the_kv(server: &TestServer) -> reqwest::Response {
    let mut body = chat("hold", LONG, 1);
    body["stream"] = json!(true);
    let response = server.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    let mut response = response;
    let first = response.chunk().await.unwrap().expect("a first chunk");
    assert!(!first.is_empty());
    let usage = server.engine.kv_usage().await.unwrap();
    assert_eq!(usage.admitted, 1, "{usage:?}");
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_too_long_for_kv_gets_503_with_retry_after() {
    let admission = AdmissionConfig { kv_wait_timeout: Duration::from_millis(150), ..AdmissionConfig::default() };
    let Some(server) = start(one_at_a_time(admission)).await else { return };
    let holder = hold_the_kv(&server).await;
    let response = server.post("/v1/chat/completions", &chat("wait", LONG, 2)).await;
    assert_eq!(response.status(), 503);
    let retry_after: u64 = response.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    let body: Value = response.json().await.unwrap();
    assert_envelope(&body, None);
    assert_eq!(body["error"]["code"], "kv_wait_timeout");
    drop(holder);
    server.wait_all_kv_free().await;
    assert_eq!(server.engine.kv_usage().await.unwrap().reserved_tokens, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_admission_queue_answers_429() {
    let admission = AdmissionConfig { max_waiting: 1, ..AdmissionConfig::default() };
    let Some(server) = start(one_at_a_time(admission)).await else { return };
    let holder = hold_the_kv(&server).await;
    let mut waiting = chat("waits", LONG, 2);
    waiting["stream"] = json!(true);
    let queued = server.post("/v1/chat/completions", &waiting).await;
    assert_eq!(queued.status(), 200, "a streamed request in the queue has its headers");
    let (status, body) = server.post_json("/v1/chat/completions", &chat("refused", LONG, 3)).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, None);
    drop((holder, queued));
    server.wait_all_kv_free().await;
    assert_eq!(server.engine.kv_usage().await.unwrap().waiting, 0);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_request_waiting_for_kv_gets_keep_alives_then_an_error_event() {
    let admission = AdmissionConfig { kv_wait_timeout: Duration::from_millis(400), ..AdmissionConfig::default() };
    let Some(server) = start(one_at_a_time(admission)).await else { return };
    let holder = hold_the_kv(&server).await;
    let mut body = chat("waits", LONG, 2);
    body["stream"] = json!(true);
    let started = std::time::Instant::now();
    let response = server.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    assert!(started.elapsed() < Duration::from_millis(400), "headers before the wait ends");
    let text = response.text().await.unwrap();
    assert!(text.matches(": keep-alive").count() >= 2, "{text}");
    let chunks = sse_chunks(&text);
    let error = chunks.iter().find(|c| c.get("error").is_some()).expect("an error event");
    assert_eq!(error["error"]["code"], "kv_wait_timeout", "{text}");
    drop(holder);
    server.wait_all_kv_free().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_request_time_limit_ends_a_request_with_504() {
    let admission = AdmissionConfig { request_timeout: Some(Duration::from_millis(300)), ..AdmissionConfig::default() };
    let Some(server) = start(one_at_a_time(admission)).await else { return };
    let (status, body) = server.post_json("/v1/chat/completions", &chat("slow", LONG, 1)).await;
    assert_eq!(status, 504, "{body}");
    assert_envelope(&body, None);
    assert_eq!(body["error"]["code"], "request_timeout");
    let mut streamed = chat("slow", LONG, 2);
    streamed["stream"] = json!(true);
    let text = server.post("/v1/chat/completions", &streamed).await.text().await.unwrap();
    let chunks = sse_chunks(&text);
    assert!(chunks.len() > 1, "tokens came before the limit: {text}");
    assert_eq!(chunks.last().unwrap()["error"]["code"], "request_timeout", "{text}");
    server.wait_all_kv_free().await;
    server.stop().await;
}

/// What most clients send: no `max_tokens`. The worst case (the whole context) is more
/// than a model's KV holds, yet the request is served, and its output ends with
/// `length` where the KV runs out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_without_max_tokens_is_served_and_ends_with_length_at_capacity() {
    let mut limits = test_limits();
    limits.max_tokens_limit = CONTEXT;
    let capacity = 512;
    let setup = Setup { kv_budget_bytes: capacity * 512, limits, ..Setup::default() };
    let Some(server) = start(setup).await else { return };
    let body = json!({
        "model": "tokenrouter-test",
        "messages": [{"role": "user", "content": "Tell me everything."}],
        "seed": 5,
        "ignore_eos": true,
    });
    let (status, response) = server.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{response}");
    assert_eq!(response["choices"][0]["finish_reason"], "length");
    let usage = &response["usage"];
    let total = usage["prompt_tokens"].as_u64().unwrap() + usage["completion_tokens"].as_u64().unwrap();
    assert!((capacity as u64 - 16..=capacity as u64 + 1).contains(&total), "ended at the KV's end: {usage}");
    // Several such requests at once share the KV by use, preempting and recomputing.
    let requests = (0..4).map(|seed| {
        let mut body = body.clone();
        body["seed"] = json!(seed);
        let server = &server;
        async move { server.post_json("/v1/chat/completions", &body).await }
    });
    for (status, response) in futures::future::join_all(requests).await {
        assert_eq!(status, 200, "{response}");
        assert_eq!(response["choices"][0]["finish_reason"], "length");
    }
    server.wait_all_kv_free().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fault_injection_is_off_unless_configured_and_requests_survive_it() {
    let Some(server) = start(Setup::default()).await else { return };
    let fault = json!({"model": "small", "point": "step"});
    let (status, body) = server.post_json("/debug/fault", &fault).await;
    assert_eq!(status, 404, "{body}");
    server.stop().await;

    let Some(server) = start(Setup { fault_injection: true, ..Setup::default() }).await else { return };
    let (status, body) = server.post_json("/debug/fault", &json!({"model": "nope"})).await;
    assert_eq!(status, 400, "{body}");
    for point in ["step", "mid_apply", "message"] {
        for model in ["small", "large"] {
            let (status, body) = server.post_json("/debug/fault", &json!({"model": model, "point": point})).await;
            assert_eq!(status, 200, "{body}");
        }
        let server = &server;
        let replies = (0..3).map(|seed| async move {
            let body = chat("survive", 40, seed);
            server.post_json("/v1/chat/completions", &body).await
        });
        for (status, body) in futures::future::join_all(replies).await {
            assert_eq!(status, 200, "{body}");
            assert_eq!(body["usage"]["completion_tokens"], 40);
        }
    }
    let stats: Value = server.get("/v1/stats").await.json().await.unwrap();
    let restarts: u64 = stats["models"].as_array().unwrap().iter().map(|m| m["restarts"].as_u64().unwrap()).sum();
    assert!(restarts >= 4, "{stats}");
    let mut events = server.engine.stats().await.into_iter();
    assert!(events.all(|s| !s.failed));
    server.wait_all_kv_free().await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_out_of_service_answers_503_with_retry_after_not_500() {
    let policy = ("always".to_string(), json!({ "model": "small" }));
    // Out of service for the whole test (the reload is another test's).
    let supervision = SupervisionConfig { restart_backoff: Duration::from_secs(600), ..SupervisionConfig::default() };
    let setup = Setup { fault_injection: true, policy, supervision, ..Setup::default() };
    let Some(server) = start(setup).await else { return };
    let fault = json!({"model": "small", "point": "message"});
    // Each injected fault panics on the next arrival; the sixth within a minute puts
    // the model out of service, and the request it was handling fails with it.
    let mut replies = Vec::new();
    for seed in 0..6 {
        assert_eq!(server.post_json("/debug/fault", &fault).await.0, 200);
        replies.push(server.post_json("/v1/chat/completions", &chat("x", 4, seed)).await);
    }
    assert!(replies[..5].iter().all(|(status, _)| *status == 200), "{replies:?}");
    let check = |(status, body): &(u16, Value)| {
        assert_eq!(*status, 503, "{body}");
        assert_envelope(body, None);
        assert_eq!(body["error"]["code"], "model_unavailable", "{body}");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("out of service") && !message.contains("internal error"), "{message}");
    };
    check(&replies[5]);
    let later = server.post("/v1/chat/completions", &chat("later", 4, 7)).await;
    let retry_after: u64 = later.headers()["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    check(&(later.status().as_u16(), later.json().await.unwrap()));
    let mut streamed = chat("later", 4, 8);
    streamed["stream"] = json!(true);
    let chunks = sse_chunks(&server.post("/v1/chat/completions", &streamed).await.text().await.unwrap());
    assert_eq!(chunks.last().unwrap()["error"]["code"], "model_unavailable", "{chunks:?}");
    server.wait_all_kv_free().await;
    server.stop().await;
}

/// `/health` tells the truth: 503 with `Retry-After` (and which model, in `/v1/stats`
/// and `/metrics` too) from the moment a model goes out of service, 200 again once it
/// has reloaded from its weights.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_503_while_a_model_is_out_of_service_and_200_after_its_reload() {
    let policy = ("always".to_string(), json!({ "model": "small" }));
    let backoff = Duration::from_millis(800);
    let supervision = SupervisionConfig { restart_backoff: backoff, max_restart_backoff: backoff * 4 };
    let setup = Setup { fault_injection: true, policy, supervision, ..Setup::default() };
    let Some(server) = start(setup).await else { return };
    let health = || async { server.get("/health").await };
    assert_eq!(health().await.status(), 200);
    let fault = json!({"model": "small", "point": "message"});
    let mut died = None;
    for seed in 0..8 {
        assert_eq!(server.post_json("/debug/fault", &fault).await.0, 200);
        if server.post_json("/v1/chat/completions", &chat("x", 4, seed)).await.0 == 503 {
            died = Some(std::time::Instant::now());
            break;
        }
    }
    let died = died.expect("the model went out of service");
    let down = health().await;
    let to_503 = died.elapsed();
    assert_eq!(down.status(), 503);
    assert!(down.headers().contains_key("retry-after"));
    let body: Value = down.json().await.unwrap();
    assert!(body["message"].as_str().unwrap().contains("model small"), "{body}");
    let stats: Value = server.get("/v1/stats").await.json().await.unwrap();
    assert_eq!(stats["ready"], false, "{stats}");
    assert_eq!(stats["readiness"]["models"][0]["ready"], false, "{stats}");
    assert_eq!(stats["readiness"]["models"][1]["ready"], true, "{stats}");
    let metrics = server.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("tokenrouter_model_ready{model=\"small\"} 0"), "{metrics}");
    let mut back = None;
    for _ in 0..300 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if health().await.status() == 200 {
            back = Some(died.elapsed());
            break;
        }
    }
    let to_200 = back.expect("healthy again after the reload");
    eprintln!("model death to /health 503: {to_503:?}; back to 200 after {to_200:?} (backoff {backoff:?})");
    assert!(to_200 >= backoff / 2, "{to_200:?}");
    assert_eq!(server.post_json("/v1/chat/completions", &chat("again", 4, 9)).await.0, 200);
    server.wait_all_kv_free().await;
    server.stop().await;
}

//! The HTTP API end to end: real HTTP on loopback (reqwest) in front of a real engine
//! on two tiny random models with the real Qwen3 tokenizer. Tests skip, saying why,
//! when the tokenizer is not available (`.ci/run` fetches it).

use std::sync::Arc;
use std::time::Duration;

use crate::http_support::*;
use serde_json::{json, Value};
use tokenrouter::http::{run_server, AppState, DefaultPolicyOnly};

/// The chunks' text concatenated (chat deltas or completion text).
fn streamed_text(chunks: &[Value]) -> String {
    chunks
        .iter()
        .filter_map(|c| c["choices"].get(0))
        .filter_map(|choice| choice["delta"]["content"].as_str().or(choice["text"].as_str()))
        .collect()
}

fn assert_usage(usage: &Value, max_tokens: u64) {
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert_eq!(completion, max_tokens, "{usage}");
    assert_eq!(usage["total_tokens"].as_u64().unwrap(), usage["prompt_tokens"].as_u64().unwrap() + completion);
    let per_model = usage["tokens_per_model"].as_object().unwrap();
    let mut names: Vec<&String> = per_model.keys().collect();
    names.sort();
    assert_eq!(names, ["large", "small"], "{usage}");
    assert_eq!(per_model.values().map(|v| v.as_u64().unwrap()).sum::<u64>(), completion);
    assert!(usage["switches"].is_u64());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chat_and_completions_stream_and_non_stream() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };

    let (status, whole) = s.post_json("/v1/chat/completions", &chat("Hello there", 24, 7)).await;
    assert_eq!(status, 200, "{whole}");
    assert_eq!(whole["object"], "chat.completion");
    assert_eq!(whole["model"], "tokenrouter-test");
    assert!(whole["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choice = &whole["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["finish_reason"], "length");
    assert!(choice.get("routing_trace").is_none(), "no trace unless asked");
    assert_usage(&whole["usage"], 24);

    // The same seeded request streamed gives the same text, then usage, then [DONE].
    let mut body = chat("Hello there", 24, 7);
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let response = s.post("/v1/chat/completions", &body).await;
    assert_eq!(response.status(), 200);
    assert!(response.headers()["content-type"].to_str().unwrap().starts_with("text/event-stream"));
    let chunks = sse_chunks(&response.text().await.unwrap());
    assert_eq!(chunks[0]["object"], "chat.completion.chunk");
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(streamed_text(&chunks), choice["message"]["content"].as_str().unwrap());
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "length");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"], json!([]));
    assert_eq!(last["usage"], whole["usage"]);

    // Completions: a text prompt and a token-id prompt, with logprobs.
    let prompt =
        json!({ "prompt": "Once upon a time", "max_tokens": 16, "seed": 3, "ignore_eos": true, "logprobs": 2 });
    let (status, text) = s.post_json("/v1/completions", &prompt).await;
    assert_eq!(status, 200, "{text}");
    assert_eq!(text["object"], "text_completion");
    assert!(text["id"].as_str().unwrap().starts_with("cmpl-"));
    let logprobs = &text["choices"][0]["logprobs"];
    assert_eq!(logprobs["tokens"].as_array().unwrap().len(), 16, "{logprobs}");
    assert_eq!(logprobs["top_logprobs"][0].as_object().unwrap().len(), 2, "{logprobs}");
    assert_usage(&text["usage"], 16);
    let ids = json!({ "prompt": [9707, 11, 1879], "max_tokens": 8, "ignore_eos": true, "stream": true });
    let response = s.post("/v1/completions", &ids).await;
    assert_eq!(response.status(), 200);
    let chunks = sse_chunks(&response.text().await.unwrap());
    assert!(chunks.iter().all(|c| c["object"] == "text_completion"));
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    assert!(chunks.iter().all(|c| c.get("usage").is_none()), "no usage chunk unless asked");

    // Chat logprobs in OpenAI's chat shape.
    let mut body = chat("Hi", 4, 1);
    body["logprobs"] = json!(true);
    body["top_logprobs"] = json!(3);
    let (status, lp) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{lp}");
    let content = lp["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    assert_eq!(content[0]["top_logprobs"].as_array().unwrap().len(), 3);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_strings_split_across_tokens_end_the_text() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let mut first = chat("Write something", 40, 5);
    first["logprobs"] = json!(true);
    let (status, whole) = s.post_json("/v1/chat/completions", &first).await;
    assert_eq!(status, 200, "{whole}");
    let text = whole["choices"][0]["message"]["content"].as_str().unwrap().to_string();
    let tokens: Vec<String> = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["token"].as_str().unwrap().to_string())
        .collect();
    // A stop string made of the end of one token and the start of the next.
    let plain = |t: &str| !t.is_empty() && !t.contains('\u{fffd}') && !t.starts_with("<|");
    let stop = tokens
        .windows(2)
        .skip(tokens.len() / 3)
        .find(|w| plain(&w[0]) && plain(&w[1]))
        .map(|w| format!("{}{}", w[0].chars().last().unwrap(), w[1].chars().next().unwrap()))
        .filter(|stop| text.contains(stop.as_str()))
        .unwrap_or_else(|| text.chars().skip(text.chars().count() / 2).take(3).collect());
    let expected = &text[..text.find(&stop).unwrap()];

    let mut stopped = chat("Write something", 40, 5);
    stopped["stop"] = json!([stop]);
    let (status, body) = s.post_json("/v1/chat/completions", &stopped).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["choices"][0]["message"]["content"], expected, "stop {stop:?} in {text:?}");
    assert_eq!(body["choices"][0]["finish_reason"], "stop");

    stopped["stream"] = json!(true);
    stopped["stop"] = json!(stop);
    let chunks = sse_chunks(&s.post("/v1/chat/completions", &stopped).await.text().await.unwrap());
    assert_eq!(streamed_text(&chunks), expected);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "stop");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routing_trace_names_the_model_of_every_token() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let mut body = chat("Route me", 32, 9);
    body["routing"] = json!({ "policy": "random", "trace": true });
    let (status, whole) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let trace: Vec<String> = whole["choices"][0]["routing_trace"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    assert_eq!(trace.len(), 32);
    let per_model = &whole["usage"]["tokens_per_model"];
    for name in ["small", "large"] {
        assert_eq!(trace.iter().filter(|m| *m == name).count() as u64, per_model[name].as_u64().unwrap(), "{whole}");
    }
    let switches = trace.windows(2).filter(|w| w[0] != w[1]).count() as u64;
    assert!(whole["usage"]["switches"].as_u64().unwrap() >= switches, "{whole}");

    body["stream"] = json!(true);
    let chunks = sse_chunks(&s.post("/v1/chat/completions", &body).await.text().await.unwrap());
    assert!(chunks.iter().all(|c| c["routing"]["models"].is_array()), "every chunk carries the trace");
    let streamed: Vec<String> = chunks
        .iter()
        .flat_map(|c| c["routing"]["models"].as_array().unwrap().clone())
        .map(|m| m.as_str().unwrap().to_string())
        .collect();
    assert_eq!(streamed, trace);

    // Only the default policy is allowed by this server.
    body["routing"] = json!({ "policy": "rstitch" });
    let (status, error) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 400);
    assert_envelope(&error, Some("routing.policy"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_disconnects_mid_stream_frees_all_kv() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let mut body = chat("Tell me a long story", MAX_TOKENS_LIMIT, 1);
    body["stream"] = json!(true);
    let mut response = s.post("/v1/chat/completions", &body).await;
    let mut seen = 0;
    while seen < 3 {
        let chunk = response.chunk().await.unwrap().expect("the stream is long");
        seen += chunk.windows(5).filter(|w| w == b"data:").count();
    }
    assert!(s.engine.active_requests() == 1, "the request is still generating");
    let dropped = std::time::Instant::now();
    drop(response);
    s.wait_all_kv_free().await;
    let committed: u64 = s.engine.stats().await.iter().map(|m| m.stats.tokens_committed).sum();
    eprintln!("freed {:?} after the disconnect, {committed} tokens committed", dropped.elapsed());
    assert!(committed < MAX_TOKENS_LIMIT as u64, "cancelled before the end: {committed} tokens");
    // And the server still serves.
    let (status, _) = s.post_json("/v1/chat/completions", &chat("Again", 4, 1)).await;
    assert_eq!(status, 200);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_gives_up_on_a_whole_response_cancels_it() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let request = s.client.post(format!("{}/v1/chat/completions", s.url)).json(&chat(
        "Tell me a long story",
        MAX_TOKENS_LIMIT,
        1,
    ));
    let started = std::time::Instant::now();
    let gave_up = request.timeout(Duration::from_millis(300)).send().await;
    assert!(gave_up.is_err_and(|e| e.is_timeout()), "the response takes longer than the client waits");
    s.wait_all_kv_free().await;
    let committed: u64 = s.engine.stats().await.iter().map(|m| m.stats.tokens_committed).sum();
    eprintln!("freed {:?} after the start, {committed} tokens committed", started.elapsed());
    assert!(committed < MAX_TOKENS_LIMIT as u64, "cancelled before the end: {committed} tokens");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_their_status_and_envelope_and_the_server_keeps_serving() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let chat_url = format!("{}/v1/chat/completions", s.url);
    let long_text = "hello ".repeat(CONTEXT + 100);
    let cases: Vec<(&str, reqwest::RequestBuilder, u16, Option<&str>)> = vec![
        (
            "malformed JSON",
            s.client.post(&chat_url).header("content-type", "application/json").body(r#"{"messages": [{"role": "#),
            400,
            None,
        ),
        (
            "wrong type",
            s.client
                .post(&chat_url)
                .json(&json!({ "messages": [{"role": "user", "content": "hi"}], "temperature": "hot" })),
            400,
            Some("temperature"),
        ),
        (
            "wrong nested type",
            s.client.post(&chat_url).json(
                &json!({ "messages": [{"role": "user", "content": "hi"}], "stream_options": {"include_usage": "yes"} }),
            ),
            400,
            Some("stream_options.include_usage"),
        ),
        (
            "unknown model",
            s.client
                .post(&chat_url)
                .json(&json!({ "model": "gpt-9", "messages": [{"role": "user", "content": "hi"}] })),
            404,
            Some("model"),
        ),
        (
            "chat prompt over the context",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "user", "content": long_text}] })),
            400,
            Some("messages"),
        ),
        (
            "token prompt over the context",
            s.client.post(format!("{}/v1/completions", s.url)).json(&json!({ "prompt": vec![100; CONTEXT + 1] })),
            400,
            Some("prompt"),
        ),
        (
            "max_tokens over the limit",
            s.client
                .post(&chat_url)
                .json(&json!({ "messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_TOKENS_LIMIT + 1 })),
            400,
            Some("max_tokens"),
        ),
        (
            "n over the limit",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "user", "content": "hi"}], "n": 17 })),
            400,
            Some("n"),
        ),
        (
            "a field the server does not implement",
            s.client.post(format!("{}/v1/completions", s.url)).json(&json!({ "prompt": "a", "suffix": "b" })),
            400,
            Some("suffix"),
        ),
        (
            "an unknown role",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "wizard", "content": "hi"}] })),
            400,
            Some("messages[0].role"),
        ),
        (
            "an unknown response_format",
            s.client
                .post(&chat_url)
                .json(&json!({ "messages": [{"role": "user", "content": "hi"}], "response_format": {"type": "xml"} })),
            400,
            Some("response_format.type"),
        ),
        (
            "a grammar that does not compile",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "user", "content": "hi"}],
                "response_format": {"type": "regex", "regex": "a("} })),
            400,
            Some("response_format"),
        ),
        (
            "a logit_bias out of range",
            s.client
                .post(&chat_url)
                .json(&json!({ "messages": [{"role": "user", "content": "hi"}], "logit_bias": {"5": 101} })),
            400,
            Some("logit_bias"),
        ),
        (
            "an image part",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}] })),
            400,
            None,
        ),
        (
            "body too large",
            s.client.post(&chat_url).json(&json!({ "messages": [{"role": "user", "content": "x".repeat(100 << 10)}] })),
            413,
            None,
        ),
        ("unknown route", s.client.get(format!("{}/v1/nothing", s.url)), 404, None),
    ];
    for (what, request, status, param) in cases {
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), status, "{what}");
        let body: Value = response.json().await.unwrap_or_else(|e| panic!("{what}: not JSON: {e}"));
        assert_envelope(&body, param);
        let (ok, after) = s.post_json("/v1/chat/completions", &chat("still there?", 2, 1)).await;
        assert_eq!(ok, 200, "after {what}: {after}");
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_required_when_configured() {
    let Some(s) = TestServer::start(test_limits(), vec!["sk-one".into(), "sk-two".into()]).await else { return };
    let url = format!("{}/v1/chat/completions", s.url);
    let body = chat("hi", 2, 1);
    for auth in [None, Some("Bearer sk-wrong"), Some("sk-one")] {
        let mut request = s.client.post(&url).json(&body);
        if let Some(a) = auth {
            request = request.header("authorization", a);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{auth:?}");
        assert_envelope(&response.json().await.unwrap(), None);
    }
    let response = s.client.post(&url).bearer_auth("sk-two").json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(s.get("/v1/models").await.status(), 401);
    assert_eq!(s.get("/health").await.status(), 200, "health needs no key");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_answers_429() {
    let limits = tokenrouter::http::Limits { max_queued_requests: 1, ..test_limits() };
    let Some(s) = TestServer::start(limits, vec![]).await else { return };
    let mut long = chat("A long one", MAX_TOKENS_LIMIT, 2);
    long["stream"] = json!(true);
    let mut first = s.post("/v1/chat/completions", &long).await;
    assert_eq!(first.status(), 200);
    first.chunk().await.unwrap().expect("a first chunk");
    let (status, body) = s.post_json("/v1/chat/completions", &chat("me too", 2, 1)).await;
    assert_eq!(status, 429, "{body}");
    assert_envelope(&body, None);
    drop(first);
    // The slot comes back once the server notices the client left.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (status, _) = s.post_json("/v1/chat/completions", &chat("me too", 2, 1)).await;
        if status == 200 {
            break;
        }
        assert_eq!(status, 429);
        assert!(tokio::time::Instant::now() < deadline, "the slot never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_health_metrics_and_stats() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let models: Value = s.get("/v1/models").await.json().await.unwrap();
    assert_eq!(models["object"], "list");
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tokenrouter-test", "small", "large"]);
    // An engine model's own name is accepted too.
    let mut by_name = chat("hi", 2, 1);
    by_name["model"] = json!("large");
    let (status, body) = s.post_json("/v1/chat/completions", &by_name).await;
    assert_eq!((status, body["model"].as_str()), (200, Some("large")));

    assert_eq!(s.get("/health").await.status(), 200);
    s.wait_all_kv_free().await;
    let metrics = s.get("/metrics").await.text().await.unwrap();
    assert!(metrics.contains("tokenrouter_http_requests_total"), "{metrics}");
    let stats: Value = s.get("/v1/stats").await.json().await.unwrap();
    assert_eq!(stats["models"].as_array().unwrap().len(), 2, "{stats}");
    assert_eq!(stats["active_requests"], 0);
    assert!(stats["kv"]["capacity_tokens"].is_array(), "{stats}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_streams_finish_and_refuses_new_work() {
    let (fire, signal) = tokio::sync::oneshot::channel::<()>();
    let signal = async move {
        let _ = signal.await;
    };
    let Some(s) = TestServer::start_with_signal(test_limits(), vec![], signal).await else { return };
    let mut body = chat("Keep going", 128, 4);
    body["stream"] = json!(true);
    let mut response = s.post("/v1/chat/completions", &body).await;
    let mut text = String::from_utf8(response.chunk().await.unwrap().unwrap().to_vec()).unwrap();
    fire.send(()).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(s.state.is_shutting_down());
    // New work is refused: 503 on a live connection, or no connection at all.
    if let Ok(r) = s.client.get(format!("{}/health", s.url)).send().await {
        assert_eq!(r.status(), 503);
    }
    while let Some(chunk) = response.chunk().await.unwrap() {
        text.push_str(std::str::from_utf8(&chunk).unwrap());
    }
    let chunks = sse_chunks(&text);
    assert_eq!(chunks.last().unwrap()["choices"][0]["finish_reason"], "length");
    let TestServer { server, engine, .. } = s;
    tokio::time::timeout(Duration::from_secs(15), server.wait()).await.expect("stops within the grace").unwrap();
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_comments_while_idle_and_errors_inside_the_stream() {
    let engine = Arc::new(Scripted::StallThenFail(Duration::from_millis(450)));
    let limits = tokenrouter::http::Limits { keep_alive_interval: Duration::from_millis(100), ..test_limits() };
    let resolver = Arc::new(DefaultPolicyOnly { default_name: "random".into() });
    let state = AppState::new(engine, resolver).with_limits(limits);
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let client = reqwest::Client::new();
    let body = json!({ "prompt": [1, 2, 3], "max_tokens": 4, "stream": true });
    let response = client.post(format!("http://{}/v1/completions", server.addr())).json(&body).send().await.unwrap();
    assert_eq!(response.status(), 200);
    let text = response.text().await.unwrap();
    assert!(text.matches(": keep-alive\n\n").count() >= 2, "{text}");
    let data = sse_data(&text);
    assert_eq!(data.len(), 2, "{text}");
    let error: Value = serde_json::from_str(&data[0]).unwrap();
    assert_envelope(&error, None);
    assert!(error["error"]["message"].as_str().unwrap().contains("scripted failure"));
    assert_eq!(data[1], "[DONE]");
    server.shutdown().await;
}

/// Line and paragraph separators and C1 controls (U+0085 among them) that Python's
/// `str.splitlines` cuts lines at, though SSE and JSON allow them raw.
const LINE_BREAKERS: &str = "one\u{2028}two\u{2029}three\u{85}four\u{80}\u{9f}five";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_text_with_unicode_line_breakers_reads_whole_by_python_line_splitting() {
    let pieces = ["one\u{2028}", "two\u{2029}three", "\u{85}", "four\u{80}\u{9f}five"].map(String::from);
    let engine = Arc::new(Scripted::Says(pieces.to_vec()));
    let state = AppState::new(engine, Arc::new(DefaultPolicyOnly { default_name: "random".into() }));
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let client = reqwest::Client::new();
    let routes = [
        ("/v1/chat/completions", json!({ "messages": [{"role": "user", "content": "hi"}], "stream": true })),
        ("/v1/completions", json!({ "prompt": [1, 2, 3], "stream": true })),
    ];
    for (path, body) in routes {
        let response = client.post(format!("http://{}{path}", server.addr())).json(&body).send().await.unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let text = response.text().await.unwrap();
        assert!(text.contains("\\u2028") && text.contains("\\u0085"), "{path}: escaped, not raw: {text:?}");
        assert_eq!(streamed_text(&python_read_chunks(&text)), LINE_BREAKERS, "{path}");
    }
    server.shutdown().await;
}

/// The same through the real engine: a completion's `echo` streams the prompt's text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_echoed_prompt_with_unicode_line_breakers_streams_whole_by_python_line_splitting() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let body = json!({ "prompt": LINE_BREAKERS, "max_tokens": 3, "echo": true, "stream": true, "seed": 1 });
    let text = s.post("/v1/completions", &body).await.text().await.unwrap();
    assert!(streamed_text(&python_read_chunks(&text)).starts_with(LINE_BREAKERS), "{text:?}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

/// Decoding a long id list (`/detokenize`, a completion's `echo` of token ids) leaves
/// the actix worker free: with one worker, `/health` answers while a decode runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decoding_ids_does_not_hold_up_the_http_worker() {
    let decode_time = Duration::from_millis(1500);
    let engine = Arc::new(Scripted::SlowDecode(decode_time));
    let state = AppState::new(engine, Arc::new(DefaultPolicyOnly { default_name: "random".into() }))
        .with_limits(tokenrouter::http::Limits { workers: Some(1), ..test_limits() });
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let url = format!("http://{}", server.addr());
    let routes = [
        ("/detokenize", json!({ "tokens": [1, 2, 3] }), "prompt"),
        ("/v1/completions", json!({ "prompt": [1, 2, 3], "echo": true, "max_tokens": 1 }), "choices"),
    ];
    for (path, body, field) in routes {
        let client = reqwest::Client::new();
        let decoding = tokio::spawn(client.post(format!("{url}{path}")).json(&body).send());
        tokio::time::sleep(Duration::from_millis(200)).await;
        let started = std::time::Instant::now();
        let health = reqwest::Client::new().get(format!("{url}/health")).send().await.unwrap();
        assert_eq!(health.status(), 200);
        assert!(started.elapsed() < decode_time / 2, "{path}: /health waited {:?}", started.elapsed());
        let response = decoding.await.unwrap().unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let out: Value = response.json().await.unwrap();
        assert!(out.to_string().contains("<1><2><3>"), "{path}: {field} decoded: {out}");
    }
    server.shutdown().await;
}

/// One HTTP/1.1 exchange, written raw on a fresh connection (reqwest refuses to send
/// malformed requests): the status and the body.
fn raw_exchange(addr: std::net::SocketAddr, request: &[u8]) -> (u16, String) {
    let (text, _) = raw_after_idle(addr, Duration::ZERO, request);
    let status = text.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, body)| body.to_string()).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_authorization_and_over_long_urls_answer_in_the_envelope() {
    let engine = Arc::new(Scripted::Says(Vec::new()));
    let state = AppState::new(engine, Arc::new(DefaultPolicyOnly { default_name: "random".into() }))
        .with_api_keys(vec!["secret".into()]);
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let addr = server.addr();
    let request = |target: &str, authorization: &[u8]| {
        let mut head = format!("GET {target} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n").into_bytes();
        if !authorization.is_empty() {
            head.extend_from_slice(b"Authorization: ");
            head.extend_from_slice(authorization);
            head.extend_from_slice(b"\r\n");
        }
        head.extend_from_slice(b"\r\n");
        head
    };
    let long_url = format!("/v1/models?pad={}", "a".repeat(70_000));
    let cases: [(Vec<u8>, &[u16]); 6] = [
        (request("/v1/models", b"Bearer secret"), &[200]),
        (request("/v1/models", b"Bearer se\x01cret"), &[400, 401]),
        (request("/v1/models", b"Bearer \xe9t\xe9"), &[401]),
        (request("/v1/models", b"Basic c2VjcmV0"), &[401]),
        (request("/v1/models", b"Bearer"), &[401]),
        (request(&long_url, b"Bearer secret"), &[400, 414]),
    ];
    for (raw, statuses) in cases {
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(80)]).into_owned();
        let (status, body) = tokio::task::spawn_blocking(move || raw_exchange(addr, &raw)).await.unwrap();
        assert!(statuses.contains(&status), "{shown:?}: {status} {body}");
        let body: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{shown:?}: {status} {e}: {body:?}"));
        if status != 200 {
            assert_envelope(&body, None);
        }
    }
    server.shutdown().await;
}

/// A connection's raw bytes until the server closes it (or 10 s pass), after writing
/// `request` once `wait` has passed since it opened.
fn raw_after_idle(addr: std::net::SocketAddr, wait: Duration, request: &[u8]) -> (String, Duration) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    let opened = std::time::Instant::now();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    std::thread::sleep(wait);
    // The server may answer and close before it has read everything.
    let _ = stream.write_all(request);
    let mut response = Vec::new();
    let _ = stream.read_to_end(&mut response);
    (String::from_utf8_lossy(&response).into_owned(), opened.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_left_idle_past_common_client_pool_limits_still_serves_its_request() {
    let engine = Arc::new(Scripted::Says(Vec::new()));
    let state = AppState::new(engine, Arc::new(DefaultPolicyOnly { default_name: "random".into() }));
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let addr = server.addr();
    // httpx keeps idle connections 5 s, and actix's own default limit is 5 s: a client
    // that reuses such a connection must not meet a server giving up on it.
    let request = b"GET /v1/models HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n";
    let (response, _) =
        tokio::task::spawn_blocking(move || raw_after_idle(addr, Duration::from_secs(6), request)).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200 "), "{response}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_silent_past_the_idle_limit_gets_a_408_in_the_envelope() {
    let engine = Arc::new(Scripted::Says(Vec::new()));
    let limits = tokenrouter::http::Limits { idle_connection: Duration::from_secs(1), ..test_limits() };
    let state =
        AppState::new(engine, Arc::new(DefaultPolicyOnly { default_name: "random".into() })).with_limits(limits);
    let server = run_server(state, "127.0.0.1:0", futures::future::pending()).await.unwrap();
    let addr = server.addr();
    let (response, elapsed) =
        tokio::task::spawn_blocking(move || raw_after_idle(addr, Duration::from_millis(1500), b"")).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 408 "), "{response}");
    let body: Value = serde_json::from_str(response.split_once("\r\n\r\n").unwrap().1).unwrap();
    assert_envelope(&body, None);
    assert_eq!(body["error"]["code"], "request_head_timeout", "{body}");
    assert!(elapsed < Duration::from_secs(5), "the connection closed after {elapsed:?}");
    server.shutdown().await;
}

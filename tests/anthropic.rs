//! Anthropic's Messages API over real HTTP in front of the engine on two tiny random
//! models: the message and its usage, the stream's event sequence (text and a forced
//! tool call), the same output as chat for the same request, count_tokens as the
//! template renders, `x-api-key`, and errors in Anthropic's envelope. The official
//! SDK runs against the real binary in tests/clients.rs. Skips, saying why, without
//! the Qwen3 tokenizer.

use serde_json::{json, Value};

use crate::http_support::{named_events, test_limits, TestServer};

/// A server whose routing draws nothing (Anthropic's API has no seed): greedy output
/// is the same on every request.
async fn start(keys: Vec<String>) -> Option<TestServer> {
    let policy = ("always", json!({ "model": "small" }));
    TestServer::start_models(&["small", "large"], 11, policy, test_limits(), keys, futures::future::pending()).await
}

fn message_body(content: &str, max_tokens: usize) -> Value {
    json!({
        "model": "tokenrouter-test",
        "max_tokens": max_tokens,
        "system": "Be brief.",
        "messages": [{ "role": "user", "content": content }],
        "temperature": 0,
    })
}

fn weather_tool() -> Value {
    json!({ "name": "get_weather", "description": "The weather in a city.",
            "input_schema": { "type": "object", "properties": { "city": { "type": "string", "maxLength": 8 } },
                              "required": ["city"], "additionalProperties": false } })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_says_what_chat_says_for_the_same_request() {
    let Some(s) = start(vec![]).await else { return };
    // Once first, so that every request below reuses the same cached prefix.
    let _ = s.post_json("/v1/messages", &message_body("Hello there", 12)).await;
    let (status, message) = s.post_json("/v1/messages", &message_body("Hello there", 12)).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!((message["type"].as_str(), message["role"].as_str()), (Some("message"), Some("assistant")));
    assert!(message["id"].as_str().unwrap().starts_with("msg_"), "{message}");
    assert_eq!(message["content"][0]["type"], "text", "{message}");
    let usage = &message["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap() + usage["cache_read_input_tokens"].as_u64().unwrap();
    let output = usage["output_tokens"].as_u64().unwrap();
    assert!(output > 0 && output <= 12, "{message}");
    let expected_stop = if output == 12 { "max_tokens" } else { "end_turn" };
    assert_eq!(message["stop_reason"], expected_stop, "{message}");

    let chat = json!({ "model": "tokenrouter-test", "max_tokens": 12, "temperature": 0,
        "messages": [{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Hello there" }] });
    let (status, completion) = s.post_json("/v1/chat/completions", &chat).await;
    assert_eq!(status, 200, "{completion}");
    let said = completion["choices"][0]["message"]["content"].as_str().unwrap_or_default();
    assert_eq!(message["content"][0]["text"].as_str().unwrap_or_default(), said);
    assert_eq!(completion["usage"]["prompt_tokens"].as_u64(), Some(prompt), "{completion}");

    let mut count = message_body("Hello there", 12);
    count.as_object_mut().unwrap().remove("max_tokens");
    let (status, counted) = s.post_json("/v1/messages/count_tokens", &count).await;
    assert_eq!((status, counted["input_tokens"].as_u64()), (200, Some(prompt)), "{counted}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_anthropics_event_sequence_with_the_text_of_the_message() {
    let Some(s) = start(vec![]).await else { return };
    let _ = s.post_json("/v1/messages", &message_body("Stream this", 10)).await;
    let (_, whole) = s.post_json("/v1/messages", &message_body("Stream this", 10)).await;
    let mut body = message_body("Stream this", 10);
    body["stream"] = json!(true);
    let response = s.post("/v1/messages", &body).await;
    assert_eq!(response.status(), 200);
    let frames = named_events(&response.text().await.unwrap());
    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"), "{names:?}");
    assert_eq!(&names[names.len() - 2..], ["message_delta", "message_stop"], "{names:?}");
    assert_eq!(names.iter().filter(|n| **n == "content_block_start").count(), 1, "{names:?}");
    assert_eq!(names[names.len() - 3], "content_block_stop", "{names:?}");
    for (name, data) in &frames {
        assert_eq!(data["type"].as_str(), Some(name.as_str()), "each event's data names it");
    }
    let text: String = frames
        .iter()
        .filter(|(n, _)| n == "content_block_delta")
        .map(|(_, d)| d["delta"]["text"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, whole["content"][0]["text"].as_str().unwrap_or_default(), "greedy: the same text");
    let delta = &frames[frames.len() - 2].1;
    assert_eq!(delta["delta"]["stop_reason"], whole["stop_reason"]);
    assert_eq!(delta["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_sequence_is_named_whole_and_streamed_and_on_chat_as_stop_reason() {
    let Some(s) = start(vec![]).await else { return };
    let (_, free) = s.post_json("/v1/messages", &message_body("Say something", 16)).await;
    let text = free["content"][0]["text"].as_str().unwrap_or_default().to_string();
    let chars: Vec<char> = text.chars().collect();
    assert!(chars.len() >= 4, "the greedy answer is long enough to cut: {free}");
    // A piece from its middle: the answer must end just before its first occurrence.
    let stop: String = chars[2..4].iter().collect();
    let expected = &text[..text.find(&stop).unwrap()];
    let mut body = message_body("Say something", 16);
    body["stop_sequences"] = json!(["never-written-here", stop]);
    let (status, cut) = s.post_json("/v1/messages", &body).await;
    assert_eq!(status, 200, "{cut}");
    assert_eq!(
        (cut["stop_reason"].as_str(), cut["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop.as_str()))
    );
    assert_eq!(cut["content"][0]["text"].as_str().unwrap_or_default(), expected, "{cut}");

    body["stream"] = json!(true);
    let frames = named_events(&s.post("/v1/messages", &body).await.text().await.unwrap());
    let delta = &frames[frames.len() - 2].1["delta"];
    assert_eq!(
        (delta["stop_reason"].as_str(), delta["stop_sequence"].as_str()),
        (Some("stop_sequence"), Some(stop.as_str()))
    );

    let chat = json!({ "model": "tokenrouter-test", "max_tokens": 16, "temperature": 0, "stop": [stop],
        "messages": [{ "role": "system", "content": "Be brief." }, { "role": "user", "content": "Say something" }] });
    let (_, completion) = s.post_json("/v1/chat/completions", &chat).await;
    let choice = &completion["choices"][0];
    assert_eq!((choice["finish_reason"].as_str(), choice["stop_reason"].as_str()), (Some("stop"), Some(stop.as_str())));
    let (_, plain) = s.post_json("/v1/messages", &message_body("Say something", 16)).await;
    assert_eq!(plain["stop_sequence"], Value::Null, "no stop string, none named: {plain}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forced_tool_is_one_tool_use_block_whole_and_streamed() {
    let Some(s) = start(vec![]).await else { return };
    let mut body = message_body("Weather in Paris?", 120);
    body["temperature"] = json!(0.8);
    body["tools"] = json!([weather_tool()]);
    body["tool_choice"] = json!({ "type": "tool", "name": "get_weather", "disable_parallel_tool_use": true });
    let (status, message) = s.post_json("/v1/messages", &body).await;
    assert_eq!(status, 200, "{message}");
    assert_eq!(message["stop_reason"], "tool_use", "{message}");
    let calls: Vec<&Value> =
        message["content"].as_array().unwrap().iter().filter(|b| b["type"] == "tool_use").collect();
    assert_eq!(calls.len(), 1, "{message}");
    assert_eq!(calls[0]["name"], "get_weather");
    assert!(calls[0]["input"]["city"].is_string(), "{message}");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("toolu_"), "{message}");

    body["stream"] = json!(true);
    let frames = named_events(&s.post("/v1/messages", &body).await.text().await.unwrap());
    let start = frames.iter().find(|(n, d)| n == "content_block_start" && d["content_block"]["type"] == "tool_use");
    let (_, start) = start.expect("a tool_use block");
    let index = &start["index"];
    let json_text: String = frames
        .iter()
        .filter(|(n, d)| n == "content_block_delta" && &d["index"] == index)
        .map(|(_, d)| d["delta"]["partial_json"].as_str().unwrap().to_string())
        .collect();
    let input: Value = serde_json::from_str(&json_text).unwrap();
    assert!(input["city"].is_string(), "{json_text}");
    let delta = frames.iter().find(|(n, _)| n == "message_delta").unwrap();
    assert_eq!(delta.1["delta"]["stop_reason"], "tool_use");

    // The call and its result, sent back, render through the template.
    let history = json!([
        { "role": "user", "content": "Weather in Paris?" },
        { "role": "assistant", "content": message["content"] },
        { "role": "user", "content": [{ "type": "tool_result", "tool_use_id": calls[0]["id"], "content": "Sunny" }] },
    ]);
    let back = json!({ "model": "tokenrouter-test", "max_tokens": 4, "messages": history,
                       "tools": [weather_tool()], "tool_choice": { "type": "none" } });
    let (status, answer) = s.post_json("/v1/messages", &back).await;
    assert_eq!(status, 200, "{answer}");
    assert!(answer["content"].as_array().unwrap().iter().all(|b| b["type"] == "text"), "{answer}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_come_as_x_api_key_and_errors_in_anthropics_envelope() {
    let Some(s) = start(vec!["sk-test".into()]).await else { return };
    let url = format!("{}/v1/messages", s.url);
    let body = message_body("Hi", 4);
    let denied = s.client.post(&url).json(&body).send().await.unwrap();
    assert_eq!(denied.status(), 401);
    let denied: Value = denied.json().await.unwrap();
    assert_eq!(
        (denied["type"].as_str(), denied["error"]["type"].as_str()),
        (Some("error"), Some("authentication_error"))
    );
    let ok = s.client.post(&url).header("x-api-key", "sk-test").json(&body).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    let bearer = s.client.post(&url).bearer_auth("sk-test").json(&body).send().await.unwrap();
    assert_eq!(bearer.status(), 200);

    let refuse = |mut b: Value, field: &str, value: Value| {
        b[field] = value;
        b
    };
    for (bad, named) in [
        (refuse(body.clone(), "thinking", json!({ "type": "enabled", "budget_tokens": 1024 })), "thinking"),
        (refuse(body.clone(), "frequency_penalty", json!(1)), "frequency_penalty"),
        (refuse(body.clone(), "messages", json!([{ "role": "system", "content": "x" }])), "role"),
        (refuse(body.clone(), "tools", json!([{ "type": "web_search_20250305", "name": "web_search" }])), "web_search"),
        (refuse(body.clone(), "model", json!("claude-opus-4")), "claude-opus-4"),
    ] {
        let response = s.client.post(&url).header("x-api-key", "sk-test").json(&bad).send().await.unwrap();
        let status = response.status().as_u16();
        let error: Value = response.json().await.unwrap();
        assert!(status == 400 || status == 404, "{status}: {error}");
        assert_eq!(error["type"], "error", "{error}");
        let kind = if status == 404 { "not_found_error" } else { "invalid_request_error" };
        assert_eq!(error["error"]["type"], kind, "{error}");
        assert!(error["error"]["message"].as_str().unwrap().contains(named), "{named}: {error}");
    }
    let mut no_max = body.clone();
    no_max.as_object_mut().unwrap().remove("max_tokens");
    let response = s.client.post(&url).header("x-api-key", "sk-test").json(&no_max).send().await.unwrap();
    assert_eq!(response.status(), 400);
    s.stop().await;
}

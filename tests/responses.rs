//! The Responses API over real HTTP in front of the engine on two tiny random models:
//! a 20-turn agent loop through `previous_response_id` whose prompts equal the whole
//! transcript sent to chat each turn (same tokens, same output), the stream's event
//! sequence, the store's bounds and its isolation between keys, and `store: false`.
//! The official SDK runs against the real binary in tests/clients.rs. Skips, saying
//! why, without the Qwen3 tokenizer.

use std::time::Duration;

use serde_json::{json, Value};

use crate::http_support::{named_events, test_limits, TestServer};
use tokenrouter::http::{Limits, ResponseStoreLimits};

/// A server whose routing draws nothing: greedy output depends on the prompt alone.
async fn start(limits: Limits, keys: Vec<String>) -> Option<TestServer> {
    let policy = ("always", json!({ "model": "small" }));
    TestServer::start_models(&["small", "large"], 11, policy, limits, keys, futures::future::pending()).await
}

async fn post_as(s: &TestServer, key: &str, path: &str, body: &Value) -> (u16, Value) {
    let response = s.client.post(format!("{}{path}", s.url)).bearer_auth(key).json(body).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

async fn call_as(s: &TestServer, key: &str, method: reqwest::Method, path: &str) -> (u16, Value) {
    let response = s.client.request(method, format!("{}{path}", s.url)).bearer_auth(key).send().await.unwrap();
    let status = response.status().as_u16();
    (status, response.json().await.unwrap())
}

fn output_text(response: &Value) -> String {
    response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|part| part["text"].as_str().map(str::to_string))
        .collect()
}

/// A turn's new input: a user message, or a tool's output of a few hundred bytes.
fn turn_input(turn: usize) -> (Value, Value) {
    if turn % 3 == 2 {
        let output = format!("result {turn}: {}", "observation ".repeat(20));
        let item = json!({ "role": "user", "content": output });
        (json!([item]), json!({ "role": "user", "content": output }))
    } else {
        let text = format!("Step {turn}: what next?");
        (json!(text), json!({ "role": "user", "content": text }))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_turns_through_previous_response_id_equal_the_whole_transcript_each_turn() {
    let Some(s) = start(test_limits(), vec![]).await else { return };
    let mut transcript = vec![json!({ "role": "system", "content": "You are an agent." })];
    let mut previous: Option<String> = None;
    for turn in 0..20 {
        let (input, message) = turn_input(turn);
        transcript.push(message);
        let mut body = json!({ "model": "tokenrouter-test", "instructions": "You are an agent.", "input": input,
            "max_output_tokens": 6, "temperature": 0 });
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let (status, response) = s.post_json("/v1/responses", &body).await;
        assert_eq!(status, 200, "turn {turn}: {response}");
        assert_eq!(response["previous_response_id"], json!(previous), "turn {turn}");
        let said = output_text(&response);

        // The same turn as chat, with the whole transcript.
        let chat = json!({ "model": "tokenrouter-test", "messages": transcript, "max_tokens": 6, "temperature": 0 });
        let (status, completion) = s.post_json("/v1/chat/completions", &chat).await;
        assert_eq!(status, 200, "{completion}");
        let input_tokens = response["usage"]["input_tokens"].as_u64();
        assert_eq!(input_tokens, completion["usage"]["prompt_tokens"].as_u64(), "turn {turn}: the same prompt length");
        assert_eq!(said, completion["choices"][0]["message"]["content"].as_str().unwrap_or_default(), "turn {turn}");
        let (status, tokenized) = s.post_json("/tokenize", &json!({ "messages": transcript })).await;
        assert_eq!(status, 200, "{tokenized}");
        assert_eq!(tokenized["count"].as_u64(), input_tokens, "turn {turn}: {tokenized}");
        if turn > 0 {
            let cached = response["usage"]["input_tokens_details"]["cached_tokens"].as_u64().unwrap();
            assert!(cached > 0, "turn {turn}: the transcript's prefix comes from the cache: {response}");
        }
        transcript.push(json!({ "role": "assistant", "content": said }));
        previous = Some(response["id"].as_str().unwrap().to_string());
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_says_what_the_whole_response_says_and_a_forced_call_is_one_item() {
    let Some(s) = start(test_limits(), vec![]).await else { return };
    let body = json!({ "input": "Stream this", "max_output_tokens": 10, "temperature": 0 });
    let (_, whole) = s.post_json("/v1/responses", &body).await;
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let frames = named_events(&s.post("/v1/responses", &streamed).await.text().await.unwrap());
    let names: Vec<&str> = frames.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(&names[..2], ["response.created", "response.in_progress"], "{names:?}");
    let last = *names.last().unwrap();
    assert!(last == "response.completed" || last == "response.incomplete", "{names:?}");
    for (i, (name, data)) in frames.iter().enumerate() {
        assert_eq!((data["type"].as_str(), data["sequence_number"].as_u64()), (Some(name.as_str()), Some(i as u64)));
    }
    let text: String = frames
        .iter()
        .filter(|(n, _)| n == "response.output_text.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(text, output_text(&whole), "greedy: the same text");
    let done = &frames.last().unwrap().1["response"];
    assert_eq!(done["usage"]["output_tokens"], whole["usage"]["output_tokens"]);
    assert_eq!(done["status"], whole["status"]);
    // The streamed response was kept at its end: retrievable at once.
    let id = done["id"].as_str().unwrap();
    let kept: Value = s.get(&format!("/v1/responses/{id}")).await.json().await.unwrap();
    assert_eq!(output_text(&kept), text);

    let weather = json!({ "type": "function", "name": "get_weather", "parameters": { "type": "object",
        "properties": { "city": { "type": "string", "maxLength": 8 } }, "required": ["city"] } });
    let forced = json!({ "input": "Weather in Paris?", "max_output_tokens": 200, "temperature": 0.8,
        "tools": [weather], "tool_choice": { "type": "function", "name": "get_weather" }, "stream": true });
    let frames = named_events(&s.post("/v1/responses", &forced).await.text().await.unwrap());
    let added: Vec<&Value> =
        frames.iter().filter(|(n, _)| n == "response.output_item.added").map(|(_, d)| &d["item"]).collect();
    assert_eq!(added.len(), 1, "exactly one call, no text: {added:?}");
    assert_eq!(added[0]["type"], "function_call");
    let arguments: String = frames
        .iter()
        .filter(|(n, _)| n == "response.function_call_arguments.delta")
        .map(|(_, d)| d["delta"].as_str().unwrap().to_string())
        .collect();
    let arguments: Value = serde_json::from_str(&arguments).unwrap();
    assert!(arguments["city"].is_string(), "{arguments}");
    assert_eq!(frames.last().unwrap().0, "response.completed");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_never_reads_or_continues_anothers_response() {
    let Some(s) = start(test_limits(), vec!["k1".into(), "k2".into()]).await else { return };
    let body = json!({ "input": "Hello", "max_output_tokens": 3 });
    let (status, mine) = post_as(&s, "k1", "/v1/responses", &body).await;
    assert_eq!(status, 200, "{mine}");
    let id = mine["id"].as_str().unwrap();
    assert!(id.starts_with("resp_") && id.len() > 20, "ids are long and random: {id}");
    let path = format!("/v1/responses/{id}");
    let (status, error) = call_as(&s, "k2", reqwest::Method::GET, &path).await;
    assert_eq!((status, error["error"]["code"].as_str()), (404, Some("response_not_found")), "{error}");
    let continued = json!({ "input": "More", "previous_response_id": id, "max_output_tokens": 3 });
    let (status, error) = post_as(&s, "k2", "/v1/responses", &continued).await;
    assert_eq!((status, error["error"]["code"].as_str()), (404, Some("previous_response_not_found")), "{error}");
    assert_eq!(error["error"]["param"], "previous_response_id");
    let (status, _) = call_as(&s, "k2", reqwest::Method::DELETE, &path).await;
    assert_eq!(status, 404, "another key cannot delete it");
    let (status, kept) = call_as(&s, "k1", reqwest::Method::GET, &path).await;
    assert_eq!((status, kept["id"].as_str()), (200, Some(id)), "{kept}");
    let (status, _) = post_as(&s, "k1", "/v1/responses", &continued).await;
    assert_eq!(status, 200, "its own key continues it");
    let (status, deleted) = call_as(&s, "k1", reqwest::Method::DELETE, &path).await;
    assert_eq!((status, deleted["deleted"].as_bool()), (200, Some(true)), "{deleted}");
    let (status, _) = call_as(&s, "k1", reqwest::Method::GET, &path).await;
    assert_eq!(status, 404);
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn input_items_list_what_went_into_a_response_a_page_at_a_time() {
    let Some(s) = start(test_limits(), vec!["k1".into(), "k2".into()]).await else { return };
    let (_, first) = post_as(&s, "k1", "/v1/responses", &json!({ "input": "Hello", "max_output_tokens": 3 })).await;
    let first_id = first["id"].as_str().unwrap();
    let call = json!({ "type": "function_call", "call_id": "call_7", "name": "lookup", "arguments": "{}" });
    let output = json!({ "type": "function_call_output", "call_id": "call_7", "output": "42" });
    let body = json!({ "previous_response_id": first_id, "max_output_tokens": 3,
        "input": [{ "role": "user", "content": "Look it up" }, call, output] });
    let (status, second) = post_as(&s, "k1", "/v1/responses", &body).await;
    assert_eq!(status, 200, "{second}");
    let path = format!("/v1/responses/{}/input_items?order=asc", second["id"].as_str().unwrap());
    let (status, listed) = call_as(&s, "k1", reqwest::Method::GET, &path).await;
    assert_eq!(status, 200, "{listed}");
    let items = listed["data"].as_array().unwrap();
    let kinds: Vec<(&str, &str)> =
        items.iter().map(|i| (i["type"].as_str().unwrap(), i["role"].as_str().unwrap_or("-"))).collect();
    let first_said = output_text(&first);
    let mut expected = vec![("message", "user")];
    if !first_said.is_empty() {
        expected.push(("message", "assistant"));
    }
    expected.extend([("message", "user"), ("function_call", "-"), ("function_call_output", "-")]);
    assert_eq!(kinds, expected, "the kept turn, then this request's input: {listed}");
    assert_eq!(items[0]["content"][0]["text"], "Hello");
    assert_eq!(items.last().unwrap()["output"], "42");
    let (_, of_first) = call_as(&s, "k1", reqwest::Method::GET, &format!("/v1/responses/{first_id}/input_items")).await;
    assert_eq!(of_first["data"][0]["id"], items[0]["id"], "an item keeps its id along the chain: {of_first}");
    let newest = format!("/v1/responses/{}/input_items?limit=1", second["id"].as_str().unwrap());
    let (_, page) = call_as(&s, "k1", reqwest::Method::GET, &newest).await;
    assert_eq!(
        (page["data"][0]["type"].as_str(), page["has_more"].as_bool()),
        (Some("function_call_output"), Some(true))
    );
    let (status, error) = call_as(&s, "k2", reqwest::Method::GET, &path).await;
    assert_eq!((status, error["error"]["code"].as_str()), (404, Some("response_not_found")), "{error}");
    let bad = format!("{path}&limit=0");
    let (status, error) = call_as(&s, "k1", reqwest::Method::GET, &bad).await;
    assert_eq!((status, error["error"]["param"].as_str()), (400, Some("limit")), "{error}");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_keeps_within_its_bounds_and_store_false_keeps_nothing() {
    let mut limits = test_limits();
    limits.responses = ResponseStoreLimits { max_entries: 2, max_tokens: 100_000, ttl: Duration::from_secs(3600) };
    let Some(s) = start(limits, vec![]).await else { return };
    let mut ids = Vec::new();
    for i in 0..3 {
        let (status, response) =
            s.post_json("/v1/responses", &json!({ "input": format!("Turn {i}"), "max_output_tokens": 2 })).await;
        assert_eq!(status, 200, "{response}");
        ids.push(response["id"].as_str().unwrap().to_string());
    }
    let continued = |id: &str| json!({ "input": "More", "previous_response_id": id, "max_output_tokens": 2 });
    let (status, error) = s.post_json("/v1/responses", &continued(&ids[0])).await;
    assert_eq!((status, error["error"]["code"].as_str()), (404, Some("previous_response_not_found")), "{error}");
    let (status, _) = s.post_json("/v1/responses", &continued(&ids[2])).await;
    assert_eq!(status, 200, "the newest is kept");
    let (status, unstored) =
        s.post_json("/v1/responses", &json!({ "input": "x", "store": false, "max_output_tokens": 2 })).await;
    assert_eq!((status, unstored["store"].as_bool()), (200, Some(false)), "{unstored}");
    let id = unstored["id"].as_str().unwrap();
    assert_eq!(s.get(&format!("/v1/responses/{id}")).await.status(), 404);
    let (entries, _) = s.state.responses.size();
    assert_eq!(entries, 2);
    s.wait_all_kv_free().await;
    s.stop().await;
}

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::{json, Value};
use tokenrouter_actors::Usage;

use super::request::{input_messages, read_ask, to_chat};
use super::response::{from_chat, Keep, ResponseMeta, ResponsesFramer};
use super::store::{ResponseStore, StoreLimits};
use super::{in_responses_terms, session_of};
use crate::http::error::ApiError;
use crate::http::sse::Framer;

fn chat_of(body: &Value, history: &[Value]) -> Result<Value, ApiError> {
    let input = input_messages(body)?;
    to_chat(body, history, &input)
}

#[test]
fn input_items_become_chat_messages_after_the_kept_turns() {
    let body = json!({
        "model": "m", "instructions": "Be brief.", "max_output_tokens": 64, "temperature": 0.5,
        "input": [
            { "role": "developer", "content": "Use tools." },
            { "type": "message", "role": "user", "content": [{ "type": "input_text", "text": "Weather " },
                { "type": "input_text", "text": "in Paris?" }] },
            { "type": "reasoning", "id": "rs_1", "summary": [] },
            { "type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}" },
            { "type": "function_call", "call_id": "call_2", "name": "get_time", "arguments": "{}" },
            { "type": "function_call_output", "call_id": "call_1", "output": "Sunny" },
            { "type": "function_call_output", "call_id": "call_2", "output": [{ "type": "input_text", "text": "noon" }] },
        ],
        "tools": [{ "type": "function", "name": "get_weather", "description": "Weather.", "parameters": { "type": "object" } }],
        "tool_choice": { "type": "function", "name": "get_weather" }, "parallel_tool_calls": false,
        "text": { "format": { "type": "json_schema", "name": "w", "schema": { "type": "object" }, "strict": true } },
        "stream": true,
    });
    let history = [json!({ "role": "user", "content": "Hi" }), json!({ "role": "assistant", "content": "Hello" })];
    let chat = chat_of(&body, &history).unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "system", "user", "assistant", "tool", "tool"]);
    assert_eq!(
        (messages[0]["content"].as_str(), messages[4]["content"].as_str()),
        (Some("Be brief."), Some("Weather in Paris?"))
    );
    let calls = messages[5]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "consecutive calls are one assistant turn");
    assert_eq!((calls[0]["id"].as_str(), calls[1]["function"]["name"].as_str()), (Some("call_1"), Some("get_time")));
    assert_eq!((messages[7]["tool_call_id"].as_str(), messages[7]["content"].as_str()), (Some("call_2"), Some("noon")));
    assert_eq!(chat["max_completion_tokens"], 64);
    assert_eq!(
        chat["tools"][0],
        json!({ "type": "function", "function": { "name": "get_weather",
        "description": "Weather.", "parameters": { "type": "object" } } })
    );
    assert_eq!(chat["tool_choice"], json!({ "type": "function", "function": { "name": "get_weather" } }));
    assert_eq!(chat["parallel_tool_calls"], false);
    assert_eq!(chat["response_format"]["json_schema"]["name"], "w");
    assert_eq!((chat["stream"].as_bool(), chat["stream_options"]["include_usage"].as_bool()), (Some(true), Some(true)));
    assert_eq!(
        chat_of(&json!({ "input": "Hi" }), &[]).unwrap()["messages"],
        json!([{ "role": "user", "content": "Hi" }])
    );
}

#[test]
fn what_the_api_defines_and_this_server_does_not_do_is_refused_by_name() {
    let refused = |body: Value| {
        let e = read_ask(&body).and_then(|_| chat_of(&body, &[])).expect_err("refused");
        assert_eq!(e.status().as_u16(), 400, "{e}");
        e.param().unwrap_or_default().to_string()
    };
    assert_eq!(refused(json!({ "input": "x", "reasoning": { "effort": "low" } })), "reasoning");
    assert_eq!(refused(json!({ "input": "x", "background": true })), "background");
    assert_eq!(refused(json!({ "input": "x", "include": ["file_search_call.results"] })), "include");
    assert_eq!(refused(json!({ "input": "x", "frobnicate": 1 })), "frobnicate");
    assert_eq!(refused(json!({ "input": "x", "truncation": "auto" })), "truncation");
    assert_eq!(refused(json!({ "input": "x", "tools": [{ "type": "web_search" }] })), "tools[0].type");
    assert_eq!(refused(json!({ "input": "x", "tool_choice": { "type": "file_search" } })), "tool_choice.type");
    assert_eq!(
        refused(json!({ "input": [{ "role": "user", "content": [{ "type": "input_image", "image_url": "u" }] }] })),
        "input[0].content[0].type"
    );
    assert_eq!(refused(json!({ "input": [{ "type": "item_reference", "id": "x" }] })), "input[0].type");
    assert_eq!(refused(json!({ "input": [{ "type": "function_call_output", "output": "x" }] })), "input[0].call_id");
    assert_eq!(refused(json!({ "input": "x", "text": { "verbosity": "low" } })), "text.verbosity");
    assert_eq!(refused(json!({ "input": "x", "metadata": { "k": 1 } })), "metadata.k");
    assert_eq!(refused(json!({ "input": 3 })), "input");
    assert_eq!(refused(json!({})), "input");
    // Null, false and empty ask for nothing: accepted.
    let ask = read_ask(&json!({ "input": "x", "reasoning": null, "background": false, "include": [], "store": false }))
        .unwrap();
    assert!(!ask.store && ask.previous_response_id.is_none());
    assert_eq!(ask.echo["tool_choice"], "auto");
}

#[test]
fn chat_field_names_in_errors_become_the_responses_names() {
    let e = in_responses_terms(ApiError::bad_request("bad", Some("max_completion_tokens")));
    assert_eq!(e.param(), Some("max_output_tokens"));
    let e = in_responses_terms(ApiError::bad_request("bad", Some("messages[2].content")));
    assert_eq!(e.param(), Some("input[2].content"));
    assert_eq!(in_responses_terms(ApiError::bad_request("bad", Some("temperature"))).param(), Some("temperature"));
}

#[test]
fn sessions_are_per_key_and_conversation_and_fit_the_limit() {
    let (a, b) = ([1u8; 32], [2u8; 32]);
    assert_eq!(session_of(&a, "resp_1", 64), session_of(&a, "resp_1", 64));
    assert_ne!(session_of(&a, "resp_1", 64), session_of(&b, "resp_1", 64));
    assert_ne!(session_of(&a, "resp_1", 64), session_of(&a, "resp_2", 64));
    assert_eq!(session_of(&a, "resp_1", 8), None, "over the limit: no session (the common-prefix match still works)");
}

fn meta() -> ResponseMeta {
    let ask = read_ask(&json!({ "input": "x", "metadata": { "k": "v" } })).unwrap();
    ResponseMeta { id: "resp_abc".into(), created_at: 7, model: "demo".into(), echo: ask.echo }
}

fn chat_response(content: Value, calls: Value, finish: &str) -> Value {
    json!({ "choices": [{ "index": 0, "message": { "role": "assistant", "content": content, "tool_calls": calls },
        "finish_reason": finish }],
        "usage": { "prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
            "prompt_tokens_details": { "cached_tokens": 6 }, "switches": 1 } })
}

fn store() -> Arc<ResponseStore> {
    Arc::new(ResponseStore::new(StoreLimits { max_entries: 10, max_tokens: 1000, ttl: Duration::from_secs(60) }))
}

#[test]
fn a_collected_answer_is_a_response_object_and_is_kept_with_its_turn() {
    let calls = json!([{ "id": "call_1", "type": "function", "function": { "name": "f", "arguments": "{\"x\":1}" } }]);
    let store = store();
    let keep = Keep {
        store: store.clone(),
        owner: [3; 32],
        chain: "resp_root".into(),
        messages: vec![json!({ "role": "user", "content": "go" })],
    };
    let response = from_chat(&meta(), &chat_response(json!("Calling."), calls, "tool_calls"), Some(keep));
    assert_eq!(
        (response["id"].as_str(), response["object"].as_str(), response["status"].as_str()),
        (Some("resp_abc"), Some("response"), Some("completed"))
    );
    let output = response["output"].as_array().unwrap();
    assert_eq!(
        output[0]["content"][0],
        json!({ "type": "output_text", "text": "Calling.", "annotations": [], "logprobs": [] })
    );
    assert_eq!(
        (output[1]["type"].as_str(), output[1]["call_id"].as_str(), output[1]["arguments"].as_str()),
        (Some("function_call"), Some("call_1"), Some("{\"x\":1}"))
    );
    assert_eq!(response["usage"]["input_tokens_details"]["cached_tokens"], 6);
    assert_eq!(
        (response["usage"]["total_tokens"].as_u64(), response["usage"]["switches"].as_u64()),
        (Some(14), Some(1))
    );
    assert_eq!(response["metadata"], json!({ "k": "v" }));
    let kept = store.get("resp_abc", &[3; 32]).expect("kept");
    assert_eq!(kept.tokens, 14);
    assert_eq!(kept.messages[1]["tool_calls"][0]["function"]["name"], "f");
    assert_eq!(kept.messages[1]["content"], "Calling.");
    assert_eq!(kept.response, response);
    let cut = from_chat(&meta(), &chat_response(json!("abc"), Value::Null, "length"), None);
    assert_eq!(
        (cut["status"].as_str(), cut["incomplete_details"]["reason"].as_str()),
        (Some("incomplete"), Some("max_output_tokens"))
    );
}

fn events(frames: Vec<Bytes>) -> Vec<Value> {
    frames
        .iter()
        .map(|f| {
            let text = std::str::from_utf8(f).unwrap();
            let (head, data) = text.split_once('\n').unwrap();
            let data: Value = serde_json::from_str(data.strip_prefix("data: ").unwrap().trim()).unwrap();
            assert_eq!(head.strip_prefix("event: "), data["type"].as_str(), "the event name is its type");
            data
        })
        .collect()
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({ "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] })
}

#[test]
fn a_streamed_answer_follows_the_responses_event_sequence() {
    let store = store();
    let keep = Keep { store: store.clone(), owner: [0; 32], chain: "resp_abc".into(), messages: vec![] };
    let mut framer = ResponsesFramer::new(meta(), Some(keep));
    let mut frames = Vec::new();
    frames.extend(framer.chunk(&chunk(json!({ "content": "Let " }), None)));
    frames.extend(framer.chunk(&chunk(json!({ "content": "me." }), None)));
    let head = json!({ "tool_calls": [{ "index": 0, "id": "call_9", "type": "function", "function": { "name": "f", "arguments": "" } }] });
    frames.extend(framer.chunk(&chunk(head, None)));
    frames.extend(
        framer.chunk(&chunk(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{}" } }] }), None)),
    );
    frames.extend(framer.chunk(&chunk(json!({}), Some("tool_calls"))));
    let usage = json!({ "usage": { "prompt_tokens": 3, "completion_tokens": 5, "prompt_tokens_details": { "cached_tokens": 0 } } });
    frames.extend(framer.finished(&Usage::default(), Some(usage)));
    frames.extend(framer.end());
    let events = events(frames);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    let numbers: Vec<u64> = events.iter().map(|e| e["sequence_number"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (0..events.len() as u64).collect::<Vec<_>>());
    assert_eq!(events[6]["text"], "Let me.");
    assert_eq!((events[9]["output_index"].as_u64(), events[11]["arguments"].as_str()), (Some(1), Some("{}")));
    let done = &events[13]["response"];
    assert_eq!((done["status"].as_str(), done["usage"]["total_tokens"].as_u64()), (Some("completed"), Some(8)));
    assert_eq!(done["output"][1]["call_id"], "call_9");
    let kept = store.get("resp_abc", &[0; 32]).expect("kept at the end of the stream");
    assert_eq!(
        kept.messages,
        [json!({ "role": "assistant", "content": "Let me.",
        "tool_calls": [{ "id": "call_9", "type": "function", "function": { "name": "f", "arguments": "{}" } }] })]
    );
}

#[test]
fn a_stream_error_ends_with_an_error_and_a_failed_response() {
    let mut framer = ResponsesFramer::new(meta(), None);
    let mut frames = framer.chunk(&chunk(json!({ "content": "x" }), None));
    frames.extend(framer.error(&ApiError::Timeout("too slow".into())));
    frames.extend(framer.end());
    let events = events(frames);
    let last: Vec<&str> = events.iter().rev().take(2).map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(last, ["response.failed", "error"]);
    assert_eq!(events.last().unwrap()["response"]["error"]["code"], "request_timeout");
}

use serde_json::{json, Value};

use super::request::to_chat;
use super::response::{message, AnthropicFramer};
use crate::http::error::ApiError;
use crate::http::sse::Framer;

fn param(e: &ApiError) -> Option<&str> {
    e.param()
}

#[test]
fn a_conversation_with_a_tool_round_trip_becomes_chat_messages_in_order() {
    let body = json!({
        "model": "m", "max_tokens": 64, "system": [{ "type": "text", "text": "Be brief." }, { "type": "text", "text": "Use tools." }],
        "stop_sequences": ["END"], "temperature": 0.5, "top_k": 20, "metadata": { "user_id": "u1" },
        "messages": [
            { "role": "user", "content": "Weather in Paris?" },
            { "role": "assistant", "content": [
                { "type": "thinking", "thinking": "Call it.", "signature": "x" },
                { "type": "text", "text": "Let me check." },
                { "type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": { "city": "Paris" } } ] },
            { "role": "user", "content": [
                { "type": "tool_result", "tool_use_id": "toolu_1", "content": [{ "type": "text", "text": "Sunny" }] },
                { "type": "tool_result", "tool_use_id": "toolu_2", "content": "boom", "is_error": true },
                { "type": "text", "text": "And tomorrow?", "cache_control": { "type": "ephemeral" } } ] },
        ],
        "tools": [{ "name": "get_weather", "description": "Weather.", "input_schema": { "type": "object" } }],
        "tool_choice": { "type": "any", "disable_parallel_tool_use": true },
    });
    let chat = to_chat(&body, false).unwrap();
    let messages = chat["messages"].as_array().unwrap();
    let roles: Vec<&str> = messages.iter().map(|m| m["role"].as_str().unwrap()).collect();
    assert_eq!(roles, ["system", "user", "assistant", "tool", "tool", "user"]);
    assert_eq!(messages[0]["content"], "Be brief.\n\nUse tools.");
    assert_eq!(messages[2]["content"], "Let me check.");
    assert_eq!(messages[2]["reasoning_content"], "Call it.");
    let call = &messages[2]["tool_calls"][0];
    assert_eq!((call["id"].as_str(), call["function"]["name"].as_str()), (Some("toolu_1"), Some("get_weather")));
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(arguments, json!({ "city": "Paris" }));
    assert_eq!(
        (messages[3]["tool_call_id"].as_str(), messages[3]["content"].as_str()),
        (Some("toolu_1"), Some("Sunny"))
    );
    assert_eq!(messages[4]["content"], "Error: boom");
    assert_eq!(messages[5]["content"], "And tomorrow?");
    assert_eq!(chat["stop"], json!(["END"]));
    assert_eq!(
        (chat["max_tokens"].as_u64(), chat["top_k"].as_u64(), chat["user"].as_str()),
        (Some(64), Some(20), Some("u1"))
    );
    assert_eq!(chat["tools"][0]["function"]["parameters"], json!({ "type": "object" }));
    assert_eq!((chat["tool_choice"].as_str(), chat["parallel_tool_calls"].as_bool()), (Some("required"), Some(false)));
    assert!(chat.get("stream").is_none());
}

#[test]
fn tool_choices_map_to_openais() {
    let with = |choice: Value| to_chat(&json!({ "max_tokens": 1, "messages": [], "tool_choice": choice }), false);
    assert_eq!(with(json!({ "type": "auto" })).unwrap()["tool_choice"], "auto");
    assert_eq!(with(json!({ "type": "none" })).unwrap()["tool_choice"], "none");
    let named = with(json!({ "type": "tool", "name": "f" })).unwrap();
    assert_eq!(named["tool_choice"], json!({ "type": "function", "function": { "name": "f" } }));
    assert!(named.get("parallel_tool_calls").is_none());
    assert_eq!(param(&with(json!({ "type": "tool" })).unwrap_err()), Some("tool_choice.name"));
    assert_eq!(param(&with(json!({ "type": "sometimes" })).unwrap_err()), Some("tool_choice.type"));
}

#[test]
fn what_is_not_implemented_is_refused_by_name() {
    let base = json!({ "max_tokens": 8, "messages": [{ "role": "user", "content": "hi" }] });
    let refused = |field: &str, value: Value| {
        let mut body = base.clone();
        body[field] = value;
        to_chat(&body, false).unwrap_err()
    };
    assert_eq!(param(&refused("thinking", json!({ "type": "enabled" }))), Some("thinking"));
    assert_eq!(param(&refused("seed", json!(1))), Some("seed"));
    let image = json!([{ "role": "user", "content": [{ "type": "image", "source": {} }] }]);
    assert_eq!(param(&refused("messages", image)), Some("messages[0].content[0].type"));
    let server_tool = json!([{ "type": "web_search_20250305", "name": "web_search" }]);
    assert_eq!(param(&refused("tools", server_tool)), Some("tools[0]"));
    assert_eq!(param(&refused("messages", json!([{ "role": "system", "content": "x" }]))), Some("messages[0].role"));
    let mut no_max = base.clone();
    no_max.as_object_mut().unwrap().remove("max_tokens");
    assert_eq!(param(&to_chat(&no_max, false).unwrap_err()), Some("max_tokens"));
    assert!(to_chat(&no_max, true).is_ok(), "count_tokens has no max_tokens");
    let streamed = to_chat(&json!({ "max_tokens": 1, "messages": [], "stream": true }), false).unwrap();
    assert_eq!(streamed["stream_options"]["include_usage"], true, "the stream always ends with usage");
}

#[test]
fn a_chat_response_becomes_a_message_with_anthropics_usage() {
    let openai = json!({
        "id": "chatcmpl-abc", "model": "m",
        "choices": [{ "index": 0, "finish_reason": "tool_calls", "message": { "role": "assistant", "content": "Checking.",
            "tool_calls": [{ "id": "call_abc_0_0", "type": "function",
                             "function": { "name": "f", "arguments": "{\"x\": 1}" } }] },
            "routing_trace": ["small", "large"] }],
        "usage": { "prompt_tokens": 30, "completion_tokens": 2, "prompt_tokens_details": { "cached_tokens": 16 },
                   "tokens_per_model": { "small": 1, "large": 1 }, "switches": 1 },
    });
    let m = message(&openai);
    assert_eq!(
        (m["id"].as_str(), m["type"].as_str(), m["stop_reason"].as_str()),
        (Some("msg_abc"), Some("message"), Some("tool_use"))
    );
    assert_eq!(m["content"][0], json!({ "type": "text", "text": "Checking." }));
    assert_eq!(m["content"][1], json!({ "type": "tool_use", "id": "toolu_abc_0_0", "name": "f", "input": { "x": 1 } }));
    assert_eq!(
        (m["usage"]["input_tokens"].as_u64(), m["usage"]["cache_read_input_tokens"].as_u64()),
        (Some(14), Some(16))
    );
    assert_eq!(m["usage"]["output_tokens"], 2);
    assert_eq!(m["usage"]["switches"], 1);
    assert_eq!(m["routing_trace"], json!(["small", "large"]));
}

/// The frames of a chunk sequence: (event, data).
fn frames(framer: &mut AnthropicFramer, chunks: &[Value]) -> Vec<(String, Value)> {
    let mut bytes: Vec<bytes::Bytes> = chunks.iter().flat_map(|c| framer.chunk(c)).collect();
    let usage = json!({ "usage": { "prompt_tokens": 5, "completion_tokens": 3 } });
    bytes.extend(framer.finished(&Default::default(), Some(usage)));
    bytes.extend(framer.end());
    bytes
        .iter()
        .map(|b| {
            let text = std::str::from_utf8(b).unwrap();
            let name = text.lines().next().unwrap().strip_prefix("event: ").unwrap().to_string();
            let data = text.lines().nth(1).unwrap().strip_prefix("data: ").unwrap();
            (name, serde_json::from_str(data).unwrap())
        })
        .collect()
}

fn delta(delta: Value, finish: Option<&str>) -> Value {
    json!({ "choices": [{ "index": 0, "delta": delta, "finish_reason": finish }] })
}

#[test]
fn text_then_a_call_stream_as_two_blocks_in_anthropics_order() {
    let mut framer = AnthropicFramer::new("chatcmpl-x", "m", 5);
    let chunks = [
        delta(json!({ "role": "assistant", "content": "" }), None),
        delta(json!({ "content": "Hel" }), None),
        delta(json!({ "content": "lo" }), None),
        delta(
            json!({ "tool_calls": [{ "index": 0, "id": "call_x_0_0", "type": "function", "function": { "name": "f", "arguments": "" } }] }),
            None,
        ),
        delta(json!({ "tool_calls": [{ "index": 0, "function": { "arguments": "{\"a\":1}" } }] }), None),
        delta(json!({}), Some("tool_calls")),
    ];
    let got = frames(&mut framer, &chunks);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );
    assert_eq!(got[0].1["message"]["usage"]["input_tokens"], 5);
    assert_eq!(got[1].1["content_block"], json!({ "type": "text", "text": "" }));
    assert_eq!(got[3].1["delta"], json!({ "type": "text_delta", "text": "lo" }));
    assert_eq!(got[5].1["content_block"], json!({ "type": "tool_use", "id": "toolu_x_0_0", "name": "f", "input": {} }));
    assert_eq!((got[6].1["index"].as_u64(), got[6].1["delta"]["partial_json"].as_str()), (Some(1), Some("{\"a\":1}")));
    assert_eq!(got[8].1["delta"]["stop_reason"], "tool_use");
    assert_eq!(got[8].1["usage"]["output_tokens"], 3);
}

#[test]
fn an_error_ends_the_stream_with_an_error_event_and_nothing_after() {
    let mut framer = AnthropicFramer::new("chatcmpl-x", "m", 5);
    let _ = framer.chunk(&delta(json!({ "content": "Hi" }), None));
    let error = framer.error(&ApiError::Timeout("the request's time limit ran out".into()));
    let text = std::str::from_utf8(&error[0]).unwrap();
    assert!(text.starts_with("event: error\ndata: "), "{text}");
    assert!(text.contains("\"timeout_error\""), "{text}");
    assert!(framer.end().is_empty());
}

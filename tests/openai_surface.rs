//! The OpenAI surface beyond one plain sample, over real HTTP against the engine on
//! two tiny random models: `n` choices, `logit_bias`, structured outputs, and
//! `/tokenize` / `/detokenize`. Tests skip, saying why, without the Qwen3 tokenizer.

use crate::http_support::*;
use serde_json::{json, Value};

fn choice_text(choice: &Value) -> String {
    choice["message"]["content"].as_str().or(choice["text"].as_str()).unwrap_or_default().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_choices_are_each_reproducible_with_their_seed_streamed_or_not() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let mut body = chat("Tell me something.", 8, 11);
    body["temperature"] = json!(0.9);
    body["n"] = json!(3);
    let (status, whole) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{whole}");
    let choices = whole["choices"].as_array().unwrap();
    assert_eq!(choices.iter().map(|c| c["index"].as_u64().unwrap()).collect::<Vec<_>>(), [0, 1, 2]);
    assert_eq!(whole["usage"]["completion_tokens"], 24, "three outputs of 8");
    let texts: Vec<String> = choices.iter().map(choice_text).collect();
    assert!(texts[0] != texts[1] || texts[1] != texts[2], "seeds differ per choice: {texts:?}");
    for (i, text) in texts.iter().enumerate() {
        let mut alone = chat("Tell me something.", 8, 11 + i as u64);
        alone["temperature"] = json!(0.9);
        let (_, one) = s.post_json("/v1/chat/completions", &alone).await;
        assert_eq!(&choice_text(&one["choices"][0]), text, "choice {i} is the n = 1 output of seed 11 + {i}");
    }
    body["stream"] = json!(true);
    body["stream_options"] = json!({ "include_usage": true });
    let chunks = sse_chunks(&s.post("/v1/chat/completions", &body).await.text().await.unwrap());
    for (i, text) in texts.iter().enumerate() {
        let of_choice: Vec<&Value> =
            chunks.iter().filter_map(|c| c["choices"].get(0)).filter(|c| c["index"] == i).collect();
        let streamed: String = of_choice.iter().filter_map(|c| c["delta"]["content"].as_str()).collect();
        assert_eq!(&streamed, text, "choice {i} streamed");
        assert_eq!(of_choice.iter().filter(|c| !c["finish_reason"].is_null()).count(), 1, "one finish per choice");
    }
    let usage: Vec<&Value> = chunks.iter().filter(|c| c.get("usage").is_some_and(|u| !u.is_null())).collect();
    assert_eq!(usage.len(), 1, "one usage chunk for all choices");
    assert_eq!(usage[0]["usage"], whole["usage"]);
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logit_bias_of_100_makes_greedy_output_that_token_on_both_endpoints() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let bias = json!({ "1000": 100, "1001": -100 });
    let mut body = chat("Anything.", 5, 1);
    body["temperature"] = json!(0);
    body["logit_bias"] = bias.clone();
    body["return_token_ids"] = json!(true);
    let (status, chat_out) = s.post_json("/v1/chat/completions", &body).await;
    assert_eq!(status, 200, "{chat_out}");
    assert_eq!(chat_out["choices"][0]["token_ids"], json!(vec![1000; 5]), "{chat_out}");
    let completion = json!({ "prompt": [9707, 11], "max_tokens": 5, "temperature": 0, "ignore_eos": true,
        "logit_bias": bias, "return_token_ids": true });
    let (status, text_out) = s.post_json("/v1/completions", &completion).await;
    assert_eq!(status, 200, "{text_out}");
    assert_eq!(text_out["choices"][0]["token_ids"], json!(vec![1000; 5]), "{text_out}");
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_and_a_lark_grammar_shape_the_output_on_random_weights() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    for seed in 0..4 {
        let mut body = chat("Answer.", 40, seed);
        body["temperature"] = json!(1.0);
        body["response_format"] = json!({ "type": "regex", "regex": "(yes|no), [0-9]{3}" });
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{out}");
        let text = choice_text(&out["choices"][0]);
        let (word, digits) = text.split_once(", ").unwrap_or_else(|| panic!("{text:?}"));
        assert!(["yes", "no"].contains(&word) && digits.len() == 3 && digits.chars().all(|c| c.is_ascii_digit()));
        assert_eq!(out["choices"][0]["finish_reason"], "stop", "the grammar's end ends the output");
        body["response_format"] =
            json!({ "type": "grammar", "grammar": "start: \"[\" item (\",\" item)* \"]\"\nitem: \"a\" | \"b\"" });
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{out}");
        let text = choice_text(&out["choices"][0]);
        let inner = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'));
        let valid = inner.is_some_and(|items| items.split(',').all(|i| i == "a" || i == "b"));
        let finished = out["choices"][0]["finish_reason"] == "stop";
        assert!(valid || !finished, "a finished output is in the language: {text:?}");
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokenize_and_detokenize_round_trip() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let (status, tokens) = s.post_json("/tokenize", &json!({ "prompt": "Hello world" })).await;
    assert_eq!(status, 200, "{tokens}");
    assert_eq!(tokens["tokens"], json!([9707, 1879]), "Qwen3's ids");
    assert_eq!(tokens["count"], 2);
    assert!(tokens["max_model_len"].as_u64().unwrap() > 0);
    let (status, text) = s.post_json("/detokenize", &json!({ "tokens": [9707, 1879] })).await;
    assert_eq!((status, text["prompt"].clone()), (200, json!("Hello world")));
    let messages = json!({ "messages": [{"role": "user", "content": "Hi"}] });
    let (status, chat_tokens) = s.post_json("/tokenize", &messages).await;
    assert_eq!(status, 200, "{chat_tokens}");
    let ids = chat_tokens["tokens"].clone();
    let (_, rendered) = s.post_json("/detokenize", &json!({ "tokens": ids })).await;
    let rendered = rendered["prompt"].as_str().unwrap();
    assert!(rendered.starts_with("<|im_start|>user\nHi<|im_end|>") && rendered.ends_with("assistant\n"), "{rendered}");
    let (status, bad) = s.post_json("/detokenize", &json!({ "tokens": [u32::MAX] })).await;
    assert_eq!(status, 400);
    assert_envelope(&bad, Some("tokens"));
    let (status, both) = s.post_json("/tokenize", &json!({ "prompt": "a", "messages": [] })).await;
    assert_eq!(status, 400, "{both}");
    s.stop().await;
}

fn weather_tools() -> Value {
    json!([
        { "type": "function", "function": { "name": "get_weather", "description": "The weather in a city.",
            "parameters": { "type": "object", "properties": {
                "city": { "type": "string", "maxLength": 10 },
                "unit": { "enum": ["celsius", "fahrenheit"] } }, "required": ["city", "unit"] } } },
        { "type": "function", "function": { "name": "get_time",
            "parameters": { "type": "object", "properties": { "zone": { "type": "integer", "minimum": -12, "maximum": 14 } },
                "required": ["zone"] } } },
    ])
}

/// A call's arguments hold what the tool's schema asks.
fn check_call(call: &Value) {
    assert_eq!(call["type"], "function", "{call}");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_")), "{call}");
    let arguments: Value = serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    match call["function"]["name"].as_str().unwrap() {
        "get_weather" => {
            assert!(arguments["city"].as_str().is_some_and(|c| c.chars().count() <= 10), "{arguments}");
            assert!(arguments["unit"] == "celsius" || arguments["unit"] == "fahrenheit", "{arguments}");
        }
        "get_time" => assert!(arguments["zone"].as_i64().is_some_and(|z| (-12..=14).contains(&z)), "{arguments}"),
        other => panic!("a call to {other}, which is not a tool"),
    }
}

/// The calls of a streamed choice, assembled as a client does: by `index`, the id and
/// name from the first delta, the arguments concatenated.
fn assembled_calls(chunks: &[Value]) -> (Vec<Value>, String) {
    let mut calls: Vec<Value> = Vec::new();
    let mut content = String::new();
    for delta in chunks.iter().filter_map(|c| c["choices"].get(0)).map(|c| &c["delta"]) {
        content.push_str(delta["content"].as_str().unwrap_or_default());
        for part in delta["tool_calls"].as_array().into_iter().flatten() {
            let k = part["index"].as_u64().unwrap() as usize;
            if k == calls.len() {
                calls.push(json!({ "id": part["id"], "type": part["type"],
                    "function": { "name": part["function"]["name"], "arguments": "" } }));
            }
            let fragment = part["function"]["arguments"].as_str().unwrap_or_default();
            let arguments = calls[k]["function"]["arguments"].as_str().unwrap().to_string() + fragment;
            calls[k]["function"]["arguments"] = json!(arguments);
        }
    }
    (calls, content)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_tool_calls_on_random_weights_are_valid_calls_streamed_or_not() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let named = json!({ "type": "function", "function": { "name": "get_time" } });
    for (seed, choice) in [(0, json!("required")), (1, json!("required")), (2, named)] {
        let mut body = chat("What is the weather in Paris?", 120, seed);
        body["temperature"] = json!(1.0);
        body["tools"] = weather_tools();
        body["tool_choice"] = choice.clone();
        body["parallel_tool_calls"] = json!(false);
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 200, "{out}");
        let choice_out = &out["choices"][0];
        assert_eq!(choice_out["finish_reason"], "tool_calls", "{out}");
        assert_eq!(choice_out["message"]["content"], Value::Null, "only a call was written: {out}");
        let calls = choice_out["message"]["tool_calls"].as_array().expect("tool_calls");
        assert_eq!(calls.len(), 1, "parallel calls were not allowed: {out}");
        check_call(&calls[0]);
        if choice.is_object() {
            assert_eq!(calls[0]["function"]["name"], "get_time");
        }
        body["stream"] = json!(true);
        let chunks = sse_chunks(&s.post("/v1/chat/completions", &body).await.text().await.unwrap());
        let (streamed, content) = assembled_calls(&chunks);
        assert_eq!(content, "", "no text besides the call");
        assert_eq!(streamed.len(), 1);
        assert_eq!(streamed[0]["function"], calls[0]["function"], "the same seed streams the same call");
        let last = chunks.iter().filter_map(|c| c["choices"].get(0)).last().unwrap();
        assert_eq!(last["finish_reason"], "tool_calls");
    }
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tool_calls_and_results_in_the_history_render_through_the_template() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let messages = json!([
        { "role": "user", "content": "Weather in Paris?" },
        { "role": "assistant", "content": null, "tool_calls": [{ "id": "call_1", "type": "function",
            "function": { "name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}" } }] },
        { "role": "tool", "tool_call_id": "call_1", "content": "21 C" },
    ]);
    let body = json!({ "messages": messages, "tools": weather_tools() });
    let (status, tokens) = s.post_json("/tokenize", &body).await;
    assert_eq!(status, 200, "{tokens}");
    let (_, rendered) = s.post_json("/detokenize", &json!({ "tokens": tokens["tokens"] })).await;
    let rendered = rendered["prompt"].as_str().unwrap();
    for expected in [
        "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"",
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call><|im_end|>",
        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>",
    ] {
        assert!(rendered.contains(expected), "{expected:?} in:\n{rendered}");
    }
    let mut request = chat("unused", 8, 3);
    request["messages"] = messages;
    request["tools"] = weather_tools();
    let (status, out) = s.post_json("/v1/chat/completions", &request).await;
    assert_eq!(status, 200, "{out}");
    assert_eq!(out["usage"]["prompt_tokens"], tokens["count"], "the chat request renders the same prompt");
    s.wait_all_kv_free().await;
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_requests_are_refused_naming_the_field() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let with = |f: &dyn Fn(&mut Value)| {
        let mut body = chat("Hi", 4, 1);
        body["tools"] = weather_tools();
        f(&mut body);
        body
    };
    let cases = [
        (with(&|b| b["tool_choice"] = json!({ "type": "function", "function": { "name": "nope" } })), "tool_choice"),
        (with(&|b| b["tools"][1]["function"]["name"] = json!("get time")), "tools[1].function.name"),
        (with(&|b| b["response_format"] = json!({ "type": "json_object" })), "response_format"),
        (with(&|b| b["messages"] = json!([{ "role": "function", "content": "x" }])), "messages[0].role"),
        (
            with(&|b| {
                b["tools"][0]["function"]["parameters"] =
                    json!({ "type": "object", "properties": { "a": { "type": "string", "pattern": "(" } } });
                b["tool_choice"] = json!("required");
            }),
            "tools",
        ),
    ];
    for (body, param) in cases {
        let (status, out) = s.post_json("/v1/chat/completions", &body).await;
        assert_eq!(status, 400, "{body}: {out}");
        assert_envelope(&out, Some(param));
    }
    let completion = json!({ "prompt": "Hi", "max_tokens": 4, "tools": weather_tools() });
    let (status, out) = s.post_json("/v1/completions", &completion).await;
    assert_eq!(status, 400, "{out}");
    assert_envelope(&out, Some("tools"));
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_puts_the_prompt_before_each_completion() {
    let Some(s) = TestServer::start(test_limits(), vec![]).await else { return };
    let body = json!({ "prompt": "Hello world", "max_tokens": 4, "seed": 2, "ignore_eos": true, "n": 2 });
    let (_, plain) = s.post_json("/v1/completions", &body).await;
    let mut echoed = body.clone();
    echoed["echo"] = json!(true);
    let (status, out) = s.post_json("/v1/completions", &echoed).await;
    assert_eq!(status, 200, "{out}");
    for i in 0..2 {
        let expected = format!("Hello world{}", plain["choices"][i]["text"].as_str().unwrap());
        assert_eq!(out["choices"][i]["text"], json!(expected), "choice {i}");
    }
    assert_eq!(out["usage"], plain["usage"], "the echo costs no tokens");
    echoed["stream"] = json!(true);
    echoed["n"] = json!(1);
    let chunks = sse_chunks(&s.post("/v1/completions", &echoed).await.text().await.unwrap());
    let streamed: String = chunks.iter().filter_map(|c| c["choices"][0]["text"].as_str()).collect();
    assert_eq!(streamed, out["choices"][0]["text"].as_str().unwrap(), "streamed: the prompt, then the output");
    let ids = json!({ "prompt": [9707, 1879], "max_tokens": 2, "echo": true, "ignore_eos": true });
    let (status, out) = s.post_json("/v1/completions", &ids).await;
    assert_eq!(status, 200, "{out}");
    assert!(out["choices"][0]["text"].as_str().unwrap().starts_with("Hello world"), "token ids decoded: {out}");
    let with_logprobs = json!({ "prompt": "a", "max_tokens": 2, "echo": true, "logprobs": 1 });
    let (status, out) = s.post_json("/v1/completions", &with_logprobs).await;
    assert_eq!(status, 400);
    assert_envelope(&out, Some("echo"));
    let mut on_chat = chat("Hi", 2, 1);
    on_chat["echo"] = json!(true);
    let (status, out) = s.post_json("/v1/chat/completions", &on_chat).await;
    assert_eq!(status, 400);
    assert_envelope(&out, Some("echo"));
    s.wait_all_kv_free().await;
    s.stop().await;
}

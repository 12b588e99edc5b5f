//! The client types against chunks as tokenrouter, vLLM and llama.cpp write them.

use std::collections::BTreeMap;

use serde_json::{json, Number};

use super::*;

fn parse(data: &str) -> Completion {
    serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"))
}

#[test]
fn tokenrouter_chat_chunks_carry_the_trace_and_token_ids() {
    let chunk = parse(
        r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"pair","system_fingerprint":null,
            "choices":[{"index":0,"delta":{"content":"Hi"},"logprobs":null,"finish_reason":null,"token_ids":[5,6]}],
            "routing":{"models":["small","large"],"drafted":[false,true]}}"#,
    );
    let choice = chunk.first_choice().unwrap();
    assert_eq!(
        (choice.text(), choice.token_ids.as_deref(), choice.finish_reason.as_deref()),
        ("Hi", Some(&[5, 6][..]), None)
    );
    let trace = chunk.routing.unwrap();
    assert_eq!((trace.models, trace.drafted), (vec!["small".to_string(), "large".to_string()], vec![false, true]));
    assert_eq!((chunk.usage, chunk.error), (None, None));
}

#[test]
fn tokenrouter_usage_chunks_carry_tokens_per_model() {
    let chunk = parse(
        r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"pair","choices":[],
            "usage":{"prompt_tokens":5,"completion_tokens":3,"total_tokens":8,"prompt_tokens_details":{"cached_tokens":4},
              "completion_tokens_details":{"accepted_prediction_tokens":0,"rejected_prediction_tokens":0},
              "tokens_per_model":{"small":2,"large":1},"switches":1,
              "speculation":{"verify_steps":0,"drafted_tokens":0,"accepted_tokens":0}}}"#,
    );
    let usage = chunk.usage.unwrap();
    assert_eq!((usage.prompt_tokens, usage.completion_tokens, usage.total_tokens), (5, 3, 8));
    assert_eq!((usage.cached_tokens(), usage.switches), (4, Some(1)));
    assert_eq!(usage.tokens_per_model, BTreeMap::from([("large".to_string(), 1), ("small".to_string(), 2)]));
    assert!(chunk.choices.is_empty());
}

#[test]
fn completion_logprobs_keep_their_alternatives_and_nulls() {
    let chunk = parse(
        r#"{"choices":[{"index":0,"text":"a","token_ids":[42],"finish_reason":"length",
            "logprobs":{"tokens":["a"],"token_logprobs":[null],"top_logprobs":[{"a":-0.5,"b":null}],"text_offset":[0]}}]}"#,
    );
    let choice = &chunk.choices[0];
    let logprobs = choice.logprobs.as_ref().unwrap();
    assert_eq!((logprobs.tokens.as_slice(), logprobs.token_logprobs.as_slice()), (&["a".to_string()][..], &[None][..]));
    let top = logprobs.top_logprobs[0].as_ref().unwrap();
    assert_eq!((top["a"], top["b"]), (Some(-0.5), None));
    assert_eq!((choice.text(), choice.finish_reason.as_deref()), ("a", Some("length")));
}

#[test]
fn other_servers_chunks_parse_with_their_nulls_and_extra_fields() {
    // vLLM: `usage: null` on every chunk, its own fields on the choice.
    let vllm = parse(
        r#"{"id":"cmpl-x","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" x",
            "logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_logprobs":null}],"usage":null}"#,
    );
    assert_eq!((vllm.choices[0].text(), vllm.choices[0].token_ids.is_none(), vllm.usage.is_none()), (" x", true, true));
    let vllm_usage = parse(
        r#"{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3,"prompt_tokens_details":null}}"#,
    );
    let usage = vllm_usage.usage.unwrap();
    assert_eq!((usage.completion_tokens, usage.cached_tokens(), usage.tokens_per_model.len()), (1, 0, 0));
    // llama.cpp: timings beside the choices, a role-only first delta.
    let llama = parse(
        r#"{"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"created":1,
            "id":"chatcmpl-y","model":"gpt","system_fingerprint":"b1","object":"chat.completion.chunk","timings":{"n":1}}"#,
    );
    assert_eq!(
        (llama.choices[0].text(), llama.choices[0].delta.as_ref().unwrap().role.as_deref()),
        ("", Some("assistant"))
    );
    assert!(parse(r#"{"choices":null}"#).choices.is_empty(), "null reads as none");
}

#[test]
fn whole_responses_give_their_message() {
    let whole = parse(
        r#"{"object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Paris"},
            "finish_reason":"stop"}],"usage":{"prompt_tokens":4,"completion_tokens":1,"total_tokens":5}}"#,
    );
    assert_eq!((whole.choices[0].text(), whole.usage.unwrap().total_tokens), ("Paris", 5));
}

#[test]
fn errors_read_in_every_shape() {
    let message = |data: &str| parse(data).error.map(|e| e.message());
    let openai = r#"{"error":{"message":"out of KV","type":"server_error","param":null,"code":null}}"#;
    assert_eq!(message(openai).as_deref(), Some("out of KV"));
    assert_eq!(message(r#"{"error":"plain words"}"#).as_deref(), Some("plain words"));
    assert_eq!(message(r#"{"error":{"code":7}}"#).as_deref(), Some(r#"{"code":7}"#));
    assert_eq!(message(r#"{"error":null,"choices":[]}"#), None);
    let envelope: ErrorEnvelope = serde_json::from_str(openai).unwrap();
    match envelope.error {
        Some(ApiError::Detailed { kind, .. }) => assert_eq!(kind.as_deref(), Some("server_error")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn malformed_chunks_are_errors_not_defaults() {
    for bad in [
        "{not json",
        r#"{"choices":{}}"#,
        r#"{"choices":[{"text":5}]}"#,
        r#"{"choices":[{"token_ids":["a"]}]}"#,
        r#"{"choices":[{"token_ids":[-1]}]}"#,
        r#"{"usage":{"completion_tokens":"3"}}"#,
        r#"{"usage":{"tokens_per_model":{"small":"x"}}}"#,
        r#"{"routing":{"models":[1]}}"#,
        "[1]",
    ] {
        assert!(serde_json::from_str::<Completion>(bad).is_err(), "{bad}");
    }
}

#[test]
fn model_lists_give_their_ids() {
    let list: ModelList =
        serde_json::from_str(r#"{"object":"list","data":[{"id":"pair","object":"model"},{"id":"small"}]}"#).unwrap();
    assert_eq!(list.ids(), ["pair", "small"]);
    assert!(serde_json::from_str::<ModelList>(r#"{"data":[{"id":3}]}"#).is_err());
}

#[test]
fn requests_send_only_what_is_set() {
    let chat = ChatRequest {
        messages: vec![Message::new("user", "hi")],
        options: RequestOptions {
            max_tokens: Some(8),
            temperature: Some(0.5),
            routing: Some(json!({ "trace": true })),
            ..RequestOptions::streamed()
        },
    };
    assert_eq!(
        serde_json::to_value(&chat).unwrap(),
        json!({ "messages": [{ "role": "user", "content": "hi" }], "max_tokens": 8, "temperature": 0.5,
                "stream": true, "stream_options": { "include_usage": true }, "routing": { "trace": true } })
    );
    let tokens = CompletionRequest {
        prompt: Prompt::Tokens(vec![1, 2]),
        logprobs: Some(3),
        options: RequestOptions { seed: Some(Number::from(u64::MAX)), ..RequestOptions::default() },
    };
    assert_eq!(serde_json::to_value(&tokens).unwrap(), json!({ "prompt": [1, 2], "logprobs": 3, "seed": u64::MAX }));
    let text = CompletionRequest {
        prompt: Prompt::Text("once".into()),
        logprobs: None,
        options: RequestOptions { seed: Some(Number::from(-1i64)), ..RequestOptions::default() },
    };
    assert_eq!(serde_json::to_value(&text).unwrap(), json!({ "prompt": "once", "seed": -1 }));
}

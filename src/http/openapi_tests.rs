use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokenrouter_actors::tokenizer::RenderedChat;
use tokenrouter_actors::{EngineError, GenerateRequest};
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};

use super::*;
use crate::http::generator::{EngineStats, EventStream, Generator};
use crate::http::routing::DefaultPolicyOnly;
use crate::http::state::Limits;

/// Only what the document reads: names, context and vocabulary.
struct Described;

impl Generator for Described {
    fn model_names(&self) -> Vec<String> {
        vec!["small".into(), "large".into()]
    }
    fn max_context(&self) -> usize {
        1024
    }
    fn vocab_size(&self) -> Option<usize> {
        Some(1000)
    }
    fn generate(&self, _: GenerateRequest) -> BoxFuture<'_, Result<EventStream, EngineError>> {
        async { Err(EngineError::Internal("not a generator".into())) }.boxed()
    }
    fn chat(&self, _: Vec<ChatMessage>, _: RenderOptions) -> BoxFuture<'_, Result<RenderedChat, EngineError>> {
        async { Err(EngineError::Internal("not a tokenizer".into())) }.boxed()
    }
    fn encode(&self, _: String, _: bool) -> BoxFuture<'_, Result<Vec<u32>, EngineError>> {
        async { Err(EngineError::Internal("not a tokenizer".into())) }.boxed()
    }
    fn token_text(&self, id: u32) -> String {
        format!("<{id}>")
    }
    fn stats(&self) -> BoxFuture<'_, EngineStats> {
        async { EngineStats::default() }.boxed()
    }
    fn ready(&self) -> BoxFuture<'_, bool> {
        async { true }.boxed()
    }
}

fn state(limits: Limits, keys: Vec<String>) -> AppState {
    let policies = Arc::new(DefaultPolicyOnly { default_name: "random".into() });
    AppState::new(Arc::new(Described), policies).with_limits(limits).with_api_keys(keys)
}

/// Every `$ref` in `value`, e.g. `#/components/schemas/Usage`.
fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref") {
                out.push(r.clone());
            }
            map.values().for_each(|v| refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| refs(v, out)),
        _ => {}
    }
}

#[test]
fn the_document_parses_lists_every_route_and_resolves_its_refs() {
    let text = serde_json::to_string(&document(&state(Limits::default(), vec![]))).unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["openapi"], "3.0.3");
    let mut paths: Vec<&String> = doc["paths"].as_object().unwrap().keys().collect();
    paths.sort();
    let expected = [
        "/health",
        "/metrics",
        "/openapi.json",
        "/reset_prefix_cache",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/messages/count_tokens",
        "/v1/models",
        "/v1/responses",
        "/v1/responses/{id}",
        "/v1/responses/{id}/input_items",
        "/v1/stats",
        "/v1/stats/history",
    ];
    assert_eq!(paths, expected);
    let mut found = Vec::new();
    refs(&doc, &mut found);
    assert!(found.len() > 10, "{found:?}");
    for r in found {
        let pointer = r.strip_prefix('#').expect("a local ref");
        assert!(doc.pointer(pointer).is_some(), "{r} resolves to nothing");
    }
    let envelope = &doc["components"]["schemas"]["ErrorEnvelope"]["properties"]["error"]["required"];
    assert_eq!(envelope, &json!(["message", "type", "param", "code"]));
    let chat_400 = &doc["paths"]["/v1/chat/completions"]["post"]["responses"]["400"]["$ref"];
    assert_eq!(chat_400, "#/components/responses/Error");
    assert!(doc["components"].get("securitySchemes").is_none(), "no keys, no security");
}

#[test]
fn the_bounds_are_the_servers_limits() {
    let request = RequestLimits {
        max_stop_strings: 3,
        max_stop_string_bytes: 7,
        max_stop_token_ids: 5,
        max_top_logprobs: 4,
        max_session_id_bytes: 9,
        max_tools: 6,
        ..RequestLimits::default()
    };
    let limits = Limits { max_tokens_limit: 12, request, ..Limits::default() };
    let doc = document(&state(limits, vec![]));
    let chat = &doc["components"]["schemas"]["ChatCompletionRequest"]["properties"];
    assert_eq!(chat["max_tokens"]["maximum"], 12);
    assert_eq!(chat["stop"]["oneOf"][1]["maxItems"], 3);
    assert_eq!(chat["stop"]["oneOf"][0]["maxLength"], 7);
    assert_eq!(chat["stop_token_ids"]["maxItems"], 5);
    assert_eq!(chat["stop_token_ids"]["items"]["maximum"], 999, "ids below the vocabulary");
    assert_eq!(chat["top_logprobs"]["maximum"], 4);
    assert_eq!(chat["session_id"]["maxLength"], 9);
    assert_eq!(chat["tools"]["maxItems"], 6);
    assert_eq!(chat["model"]["enum"], json!(["small", "large"]), "the served id, then the engine's others");
    let routing = &doc["components"]["schemas"]["Routing"]["properties"];
    assert_eq!(routing["policy"]["enum"], json!(["random", "default"]), "the resolver's names");
    let completion = &doc["components"]["schemas"]["CompletionRequest"]["properties"];
    assert_eq!(completion["logprobs"]["maximum"], 4);
    assert_eq!(completion["prompt"]["oneOf"][1]["items"]["maximum"], 999);
}

#[test]
fn with_keys_the_generation_routes_ask_for_a_bearer_token() {
    let doc = document(&state(Limits::default(), vec!["secret".into()]));
    assert_eq!(doc["components"]["securitySchemes"]["bearer"]["scheme"], "bearer");
    assert_eq!(doc["paths"]["/v1/completions"]["post"]["security"], json!([{ "bearer": [] }]));
    assert_eq!(doc["paths"]["/v1/models"]["get"]["security"], json!([{ "bearer": [] }]));
    assert_eq!(doc["paths"]["/reset_prefix_cache"]["post"]["security"], json!([{ "bearer": [] }]));
    assert!(doc["paths"]["/health"]["get"].get("security").is_none());
}

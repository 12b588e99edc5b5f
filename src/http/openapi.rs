//! `GET /openapi.json`: an OpenAPI 3.0 description of the HTTP API, written from the
//! running server's limits so that its bounds (`max_tokens`, stop strings, logprobs,
//! ...) are the ones `request.rs` enforces. A fuzzer (schemathesis, tests/fuzz_api.rs)
//! reads it to generate requests and to check that every response matches it: no 5xx,
//! and every 4xx in OpenAI's error envelope.
//!
//! Hand-written JSON rather than derived from the request type: the request type is
//! deliberately lax (unknown fields ignored, one type for both endpoints), while the
//! document should say what each endpoint accepts.

use actix_web::{web, HttpResponse};
use serde_json::{json, Map, Value};
use tokenrouter_core::model::sampler::MAX_LOGPROBS;
use tokenrouter_core::spec::MAX_DRAFT_TOKENS;
use tokenrouter_core::tokenize::BUILT_IN_VARIABLES;

use super::openapi_anthropic;
use super::state::{AppState, RequestLimits};

/// What the document needs to know about the server.
struct Bounds<'a> {
    request: &'a RequestLimits,
    max_tokens: usize,
    /// Token ids are below this (when the engine knows its vocabulary).
    vocab: Option<usize>,
    max_body_bytes: usize,
    /// The ids `model` may name (others get 404).
    models: Vec<String>,
    /// The names `routing.policy` may take (empty: unknown).
    policies: Vec<String>,
}

pub async fn openapi(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(document(&state))
}

/// The whole document for this server.
pub fn document(state: &AppState) -> Value {
    let bounds = Bounds {
        request: &state.limits.request,
        max_tokens: state.limits.max_tokens_limit,
        vocab: state.engine.vocab_size(),
        max_body_bytes: state.limits.max_body_bytes,
        models: model_ids(state),
        policies: state.policies.policy_names(),
    };
    let mut doc = json!({
        "openapi": "3.0.3",
        "info": {
            "title": "tokenrouter",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "OpenAI-compatible API of a token-level LLM routing engine. Errors are OpenAI's envelope \
                (Anthropic's on the /v1/messages routes).",
        },
        "paths": paths_with_responses(),
        "components": { "schemas": schemas(&bounds), "responses": error_responses() },
    });
    merge(&mut doc["paths"], openapi_anthropic::paths());
    merge(&mut doc["components"]["schemas"], openapi_anthropic::schemas(bounds.max_tokens, &bounds.models));
    doc["components"]["responses"]["AnthropicError"] = openapi_anthropic::error_response();
    if !state.api_keys.is_empty() {
        doc["components"]["securitySchemes"] = json!({ "bearer": { "type": "http", "scheme": "bearer" } });
        let secured = [
            "/v1/chat/completions",
            "/v1/completions",
            "/v1/responses",
            "/v1/responses/{id}",
            "/v1/responses/{id}/input_items",
            "/v1/messages",
            "/v1/messages/count_tokens",
            "/v1/models",
            "/reset_prefix_cache",
        ];
        for path in secured {
            for operation in doc["paths"][path].as_object_mut().into_iter().flat_map(|m| m.values_mut()) {
                operation["security"] = json!([{ "bearer": [] }]);
            }
        }
    }
    doc
}

/// Adds `more`'s keys to the object `into`.
fn merge(into: &mut Value, more: Value) {
    if let (Some(into), Value::Object(more)) = (into.as_object_mut(), more) {
        into.extend(more);
    }
}

/// The served id, then each engine model, as `/v1/models` lists them.
fn model_ids(state: &AppState) -> Vec<String> {
    let mut ids = vec![state.served_model.clone()];
    ids.extend(state.engine.model_names().into_iter().filter(|n| *n != state.served_model));
    ids
}

fn reference(kind: &str, name: &str) -> Value {
    json!({ "$ref": format!("#/components/{kind}/{name}") })
}

fn schema(name: &str) -> Value {
    reference("schemas", name)
}

fn json_content(schema: Value) -> Value {
    json!({ "application/json": { "schema": schema } })
}

fn paths() -> Value {
    json!({
        "/v1/chat/completions": { "post": generation("createChatCompletion", "ChatCompletionRequest", "ChatCompletion") },
        "/v1/completions": { "post": generation("createCompletion", "CompletionRequest", "Completion") },
        "/v1/models": { "get": {
            "operationId": "listModels",
            "summary": "The served model id, then each engine model (requests may name any).",
            "responses": { "200": { "description": "The models.", "content": json_content(schema("ModelList")) },
                           "401": reference("responses", "Error") },
        }},
        "/health": { "get": {
            "operationId": "health",
            "summary": "200 when every model can serve and the tokenizer answers; 503 with Retry-After while shutting down, or while a model is out of service or not answering.",
            "responses": {
                "200": { "description": "Ready.", "content": json_content(schema("Health")) },
                "503": { "description": "Not ready, or shutting down (then in the error envelope).",
                         "content": json_content(json!({ "oneOf": [schema("Health"), schema("ErrorEnvelope")] })) },
            },
        }},
        "/metrics": { "get": {
            "operationId": "metrics",
            "summary": "Prometheus text exposition.",
            "responses": { "200": { "description": "Metrics.", "content": { "text/plain": { "schema": { "type": "string" } } } } },
        }},
        "/v1/stats": { "get": {
            "operationId": "stats",
            "summary": "Per-model snapshots, KV use and requests in flight (the dashboard's data).",
            "responses": { "200": { "description": "Statistics.", "content": json_content(schema("Stats")) } },
        }},
        "/v1/stats/history": { "get": {
            "operationId": "statsHistory",
            "summary": "The last ten minutes of stats, one sample every `interval_s` (the dashboard's charts).",
            "responses": { "200": { "description": "Samples, oldest first.", "content": json_content(schema("StatsHistory")) } },
        }},
        "/reset_prefix_cache": { "post": {
            "operationId": "resetPrefixCache",
            "summary": "Every model drops the cached prompt prefixes no request holds (vLLM's route of that name). Requests in flight keep their K/V.",
            "responses": { "200": { "description": "Blocks dropped per model; `reset` is false where a model did not answer (a remote model keeps its cache).",
                                    "content": json_content(schema("PrefixCacheReset")) },
                           "401": reference("responses", "Error") },
        }},
        "/openapi.json": { "get": {
            "operationId": "openapi",
            "summary": "This document.",
            "responses": { "200": { "description": "OpenAPI 3.0.", "content": json_content(json!({ "type": "object" })) } },
        }},
    })
}

/// A generation endpoint: JSON or (with `stream: true`) server-sent events.
fn generation(id: &str, request: &str, response: &str) -> Value {
    let mut responses = generation_errors("Error");
    responses.insert(
        "200".into(),
        json_or_events(
            "The completion; with `stream: true`, server-sent events of chunks ending in `data: [DONE]` \
                (with `routing.trace`, each chunk also names its tokens' models in `routing.models`; with \
                `stream_options.include_usage`, a last chunk carries `usage` with `tokens_per_model`).",
            schema(response),
        ),
    );
    json!({
        "operationId": id,
        "requestBody": { "required": true, "content": json_content(schema(request)) },
        "responses": responses,
    })
}

/// The error statuses a generation route answers, each with the error response named
/// `error` (`Error`, OpenAI's envelope, or `AnthropicError`).
pub(super) fn generation_errors(error: &str) -> Map<String, Value> {
    ["400", "401", "404", "413", "429", "500", "503", "504"]
        .into_iter()
        .map(|status| (status.to_string(), reference("responses", error)))
        .collect()
}

/// A generation's answer: `schema` as JSON, or server-sent events (`data` holds a chunk,
/// `event` names it where the API names its events).
pub(super) fn json_or_events(description: &str, schema: Value) -> Value {
    json!({
        "description": description,
        "content": {
            "application/json": { "schema": schema },
            "text/event-stream": { "schema": { "type": "object", "required": ["data"],
                "properties": { "data": { "type": "string" }, "event": { "type": "string" } } } },
        },
    })
}

fn error_responses() -> Value {
    json!({ "Error": { "description": "OpenAI's error envelope.", "content": json_content(schema("ErrorEnvelope")) } })
}

fn schemas(b: &Bounds) -> Value {
    json!({
        "ErrorEnvelope": error_envelope(),
        "ChatCompletionRequest": chat_request(b),
        "CompletionRequest": completion_request(b),
        "ChatMessage": chat_message(),
        "Routing": routing(b),
        "Speculative": speculative(),
        "Prediction": prediction(),
        "ChatCompletion": completion_response("chat.completion", chat_choice()),
        "Completion": completion_response("text_completion", text_choice()),
        "Usage": usage(),
        "ModelList": model_list(),
        "Health": {
            "type": "object",
            "required": ["status"],
            "properties": {
                "status": { "type": "string", "enum": ["ok", "unavailable"] },
                "message": { "type": "string" },
                "models": { "type": "array", "items": schema("ModelReadiness") },
            },
        },
        "ModelReadiness": {
            "type": "object",
            "required": ["model", "ready"],
            "properties": {
                "model": { "type": "string" },
                "ready": { "type": "boolean" },
                "reason": { "type": "string", "description": "Why not, when not." },
            },
        },
        "Stats": stats(),
        "PrefixCacheReset": {
            "type": "object",
            "required": ["reset", "models"],
            "properties": {
                "reset": { "type": "boolean", "description": "Every model answered." },
                "models": { "type": "array", "items": {
                    "type": "object",
                    "required": ["model"],
                    "properties": {
                        "model": { "type": "string" },
                        "dropped_blocks": { "type": "integer", "nullable": true, "description": "Null where the model did not answer." },
                    },
                }},
            },
        },
        "StatsHistory": stats_history(),
        "ResponseRequest": response_request(b),
        "Response": response_object(),
    })
}

/// Every path: the chat-shaped ones and the Responses API's.
fn paths_with_responses() -> Value {
    let mut all = paths();
    merge(&mut all, responses_paths());
    all
}

fn responses_paths() -> Value {
    let mut created = generation_errors("Error");
    created.insert(
        "200".into(),
        json_or_events(
            "The response; with `stream: true`, server-sent events named by their `type` \
                (`response.created` … `response.completed`), each with a `sequence_number`, and no `[DONE]`.",
            schema("Response"),
        ),
    );
    let id = json!([{ "name": "id", "in": "path", "required": true, "schema": { "type": "string" } }]);
    let kept = json!({ "200": { "description": "The kept response.", "content": json_content(schema("Response")) },
        "401": reference("responses", "Error"), "404": reference("responses", "Error") });
    let deleted = json!({ "200": { "description": "Forgotten.", "content": json_content(json!({ "type": "object",
            "required": ["id", "deleted"], "properties": { "id": { "type": "string" }, "object": { "type": "string" },
            "deleted": { "type": "boolean" } } })) },
        "401": reference("responses", "Error"), "404": reference("responses", "Error") });
    let listed = json!({ "200": { "description": "A page of input items.", "content": json_content(json!({
            "type": "object", "required": ["object", "data", "has_more"], "properties": {
            "object": { "type": "string", "enum": ["list"] }, "data": { "type": "array", "items": { "type": "object" } },
            "first_id": { "type": "string", "nullable": true }, "last_id": { "type": "string", "nullable": true },
            "has_more": { "type": "boolean" } } })) },
        "400": reference("responses", "Error"), "401": reference("responses", "Error"),
        "404": reference("responses", "Error") });
    json!({
        "/v1/responses": { "post": {
            "operationId": "createResponse",
            "summary": "The Responses API: a request is served as the chat request it means, after the kept turns of `previous_response_id` (docs/api.md).",
            "requestBody": { "required": true, "content": json_content(schema("ResponseRequest")) },
            "responses": created,
        }},
        "/v1/responses/{id}": {
            "get": { "operationId": "getResponse", "summary": "A response kept for this key (`store`).",
                     "parameters": id, "responses": kept },
            "delete": { "operationId": "deleteResponse", "summary": "Forgets a response kept for this key.",
                        "parameters": id, "responses": deleted },
        },
        "/v1/responses/{id}/input_items": { "get": {
            "operationId": "listResponseInputItems",
            "summary": "What went into a kept response (the chain's kept turns and its own input) as items, newest first by default.",
            "parameters": input_item_parameters(), "responses": listed } },
    })
}

fn input_item_parameters() -> Value {
    json!([
        { "name": "id", "in": "path", "required": true, "schema": { "type": "string" } },
        { "name": "limit", "in": "query", "schema": { "type": "integer", "minimum": 1, "maximum": 100 } },
        { "name": "order", "in": "query", "schema": { "type": "string", "enum": ["asc", "desc"] } },
        { "name": "after", "in": "query", "schema": { "type": "string" },
          "description": "An item id from an earlier page; an id not in the response is refused (400)." },
    ])
}

fn response_request(b: &Bounds) -> Value {
    let name = json!({ "type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$" });
    let tool = json!({ "type": "object", "required": ["type", "name"], "properties": {
        "type": { "type": "string", "enum": ["function"] }, "name": name, "description": { "type": "string" },
        "parameters": { "type": "object" }, "strict": { "type": "boolean" } } });
    let max_tokens = json!({ "type": "integer", "minimum": 1, "maximum": b.max_tokens });
    let properties = json!({
        "model": { "type": "string", "enum": b.models },
        "input": { "oneOf": [{ "type": "string" }, { "type": "array", "items": { "type": "object" },
            "description": "Messages (role, content), function_call and function_call_output items." }] },
        "instructions": { "type": "string" },
        "max_output_tokens": max_tokens,
        "temperature": { "type": "number", "minimum": 0 },
        "top_p": { "type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1 },
        "top_k": { "type": "integer" },
        "seed": { "type": "integer", "format": "int64" },
        "stream": { "type": "boolean" },
        "stream_options": { "type": "object" },
        "store": { "type": "boolean", "description": "Keep the conversation for previous_response_id (default true)." },
        "previous_response_id": { "type": "string" },
        "tools": { "type": "array", "items": tool, "maxItems": b.request.max_tools },
        "tool_choice": { "oneOf": [{ "type": "string", "enum": ["none", "auto", "required"] },
            { "type": "object", "required": ["type", "name"],
              "properties": { "type": { "type": "string", "enum": ["function"] }, "name": name } }] },
        "parallel_tool_calls": { "type": "boolean" },
        "text": { "type": "object", "properties": { "format": { "type": "object" } }, "additionalProperties": false },
        "metadata": { "type": "object", "maxProperties": 16,
            "additionalProperties": { "type": "string", "maxLength": 512 } },
        "user": { "type": "string" },
        "safety_identifier": { "type": "string" },
        "prompt_cache_key": { "type": "string" },
        "service_tier": { "type": "string" },
        "truncation": { "type": "string", "enum": ["disabled"] },
        "routing": schema("Routing"),
        "speculative": schema("Speculative"),
    });
    json!({ "type": "object", "description": format!("A response. Bodies are at most {} bytes.", b.max_body_bytes),
        "required": ["input"], "properties": properties, "additionalProperties": false })
}

fn response_object() -> Value {
    json!({
        "type": "object",
        "required": ["id", "object", "created_at", "status", "output", "model"],
        "properties": {
            "id": { "type": "string" },
            "object": { "type": "string", "enum": ["response"] },
            "created_at": { "type": "integer" },
            "status": { "type": "string", "enum": ["completed", "incomplete", "in_progress", "failed"] },
            "model": { "type": "string" },
            "output": { "type": "array", "items": { "type": "object", "required": ["type"] } },
            "usage": { "type": "object", "nullable": true },
            "previous_response_id": { "type": "string", "nullable": true },
        },
    })
}

fn error_envelope() -> Value {
    let nullable_string = json!({ "type": "string", "nullable": true });
    json!({
        "type": "object",
        "required": ["error"],
        "properties": { "error": {
            "type": "object",
            "required": ["message", "type", "param", "code"],
            "properties": {
                "message": { "type": "string" },
                "type": { "type": "string" },
                "param": nullable_string,
                "code": nullable_string,
            },
        }},
    })
}

/// The fields both generation endpoints accept, with the server's bounds.
fn common_request_fields(b: &Bounds) -> Map<String, Value> {
    let r = b.request;
    let token_id = token_id(b.vocab);
    let max_tokens = json!({ "type": "integer", "minimum": 1, "maximum": b.max_tokens,
        "description": "Output tokens; default: what the context leaves, up to the maximum." });
    let stop_string = json!({ "type": "string", "minLength": 1, "maxLength": r.max_stop_string_bytes,
        "description": format!("At most {} bytes of UTF-8.", r.max_stop_string_bytes) });
    let penalty = json!({ "type": "number", "minimum": -2, "maximum": 2 });
    let one = json!({ "type": "integer", "minimum": 1, "maximum": 1, "description": "Only 1 is supported." });
    let fields = json!({
        "model": { "type": "string", "enum": b.models,
            "description": "The served id or an engine model (see /v1/models); others get 404." },
        "stream": { "type": "boolean" },
        "stream_options": { "type": "object", "properties": { "include_usage": { "type": "boolean" } } },
        "temperature": { "type": "number", "minimum": 0 },
        "top_p": { "type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1 },
        "top_k": { "type": "integer", "description": "-1 or 0: off (vLLM's convention)." },
        "min_p": { "type": "number", "minimum": 0, "maximum": 1 },
        "seed": { "type": "integer", "format": "int64" },
        "max_tokens": max_tokens,
        "max_completion_tokens": max_tokens,
        "stop": { "oneOf": [stop_string, { "type": "array", "items": stop_string, "maxItems": r.max_stop_strings }] },
        "stop_token_ids": { "type": "array", "items": token_id, "maxItems": r.max_stop_token_ids },
        "presence_penalty": penalty,
        "frequency_penalty": penalty,
        "repetition_penalty": { "type": "number", "exclusiveMinimum": true, "minimum": 0 },
        "n": { "type": "integer", "minimum": 1, "maximum": super::request::MAX_CHOICES,
            "description": "Choices from the one prompt; choice i samples with seed + i." },
        "best_of": one,
        "echo": { "type": "boolean", "description": "Completions: the text starts with the prompt (not with logprobs)." },
        "user": { "type": "string" },
        "ignore_eos": { "type": "boolean" },
        "skip_special_tokens": { "type": "boolean" },
        "return_token_ids": { "type": "boolean" },
        "session_id": { "type": "string", "maxLength": r.max_session_id_bytes,
            "description": format!("The tokenization session this prompt continues; at most {} bytes.", r.max_session_id_bytes) },
        "routing": schema("Routing"),
        "speculative": schema("Speculative"),
        "prediction": schema("Prediction"),
        "response_format": response_format(r.max_grammar_bytes),
        "logit_bias": { "type": "object", "additionalProperties": { "type": "number", "minimum": -100, "maximum": 100 },
            "description": "Token id (a decimal string) to a bias added to its logit." },
        "metadata": { "type": "object", "description": "Accepted; changes nothing." },
        "store": { "type": "boolean", "description": "Accepted; changes nothing." },
        "service_tier": { "type": "string", "description": "Accepted; changes nothing." },
    });
    match fields {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// OpenAI's shapes, plus `grammar` (Lark) and `regex` (docs/api.md).
fn response_format(max_bytes: usize) -> Value {
    let kind = |k: &str| json!({ "type": "string", "enum": [k] });
    json!({ "oneOf": [
        { "type": "object", "required": ["type"], "properties": { "type": kind("text") } },
        { "type": "object", "required": ["type"], "properties": { "type": kind("json_object") } },
        { "type": "object", "required": ["type", "json_schema"], "properties": { "type": kind("json_schema"),
            "json_schema": { "type": "object", "required": ["schema"], "properties": {
                "name": { "type": "string" }, "description": { "type": "string" },
                "schema": { "type": "object" }, "strict": { "type": "boolean" } } } } },
        { "type": "object", "required": ["type", "grammar"],
          "properties": { "type": kind("grammar"), "grammar": { "type": "string", "description": "A Lark grammar." } } },
        { "type": "object", "required": ["type", "regex"],
          "properties": { "type": kind("regex"), "regex": { "type": "string" } } },
    ], "description": format!("Structured outputs: the output matches this schema or grammar, \
        of at most {max_bytes} bytes (a schema as JSON).") })
}

fn token_id(vocab: Option<usize>) -> Value {
    match vocab {
        Some(v) => json!({ "type": "integer", "minimum": 0, "maximum": v.saturating_sub(1) }),
        None => json!({ "type": "integer", "minimum": 0, "maximum": u32::MAX }),
    }
}

fn top_logprobs_bound(b: &Bounds) -> usize {
    b.request.max_top_logprobs.min(MAX_LOGPROBS)
}

fn request_object(description: String, required: &str, mut properties: Map<String, Value>, b: &Bounds) -> Value {
    if let (Some(max), Some(prompt)) = (b.request.max_prompt_tokens, properties.get_mut(required)) {
        prompt["description"] = json!(format!("At most {max} tokens."));
    }
    json!({
        "type": "object",
        "description": format!("{description} Bodies are at most {} bytes.", b.max_body_bytes),
        "required": [required],
        "properties": properties,
        "additionalProperties": false,
    })
}

fn chat_request(b: &Bounds) -> Value {
    let mut properties = common_request_fields(b);
    properties.insert("messages".into(), json!({ "type": "array", "minItems": 1, "items": schema("ChatMessage") }));
    properties.insert("logprobs".into(), json!({ "type": "boolean" }));
    properties.insert(
        "top_logprobs".into(),
        json!({ "type": "integer", "minimum": 0, "maximum": top_logprobs_bound(b),
                "description": "Alternatives per token; needs logprobs: true." }),
    );
    properties.insert("add_generation_prompt".into(), json!({ "type": "boolean" }));
    let kwargs = format!("Extra chat template variables; none of {}.", BUILT_IN_VARIABLES.join(", "));
    properties.insert("chat_template_kwargs".into(), json!({ "type": "object", "description": kwargs }));
    properties.extend(tool_fields(b.request));
    request_object("A chat completion.".into(), "messages", properties, b)
}

/// `tools`, `tool_choice`, `parallel_tool_calls` (docs/api.md, "Tool calls").
fn tool_fields(r: &RequestLimits) -> Map<String, Value> {
    let name = json!({ "type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$" });
    let tool = json!({ "type": "object", "required": ["type", "function"], "properties": {
        "type": { "type": "string", "enum": ["function"] },
        "function": { "type": "object", "required": ["name"], "properties": {
            "name": name, "description": { "type": "string" },
            "parameters": { "type": "object", "description": "A JSON schema of the arguments." },
            "strict": { "type": "boolean" } } } } });
    let named = json!({ "type": "object", "required": ["type", "function"], "properties": {
        "type": { "type": "string", "enum": ["function"] },
        "function": { "type": "object", "required": ["name"], "properties": { "name": name } } } });
    let fields = json!({
        "tools": { "type": "array", "items": tool, "maxItems": r.max_tools,
            "description": format!("Functions the model may call; rendered by the chat template, calls parsed into \
                tool_calls. At most {} bytes as JSON.", r.max_tool_schema_bytes) },
        "tool_choice": { "oneOf": [{ "type": "string", "enum": ["none", "auto", "required"] }, named],
            "description": "required and a named function are enforced with a grammar." },
        "parallel_tool_calls": { "type": "boolean", "description": "Allow several calls in one answer (true)." },
    });
    match fields {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

fn completion_request(b: &Bounds) -> Value {
    let mut properties = common_request_fields(b);
    let ids = json!({ "type": "array", "minItems": 1, "items": token_id(b.vocab) });
    properties.insert(
        "prompt".into(),
        json!({ "oneOf": [
            { "type": "string", "minLength": 1 },
            ids,
            { "type": "array", "items": { "type": "string", "minLength": 1 }, "minItems": 1, "maxItems": 1 },
            { "type": "array", "items": ids, "minItems": 1, "maxItems": 1 },
        ], "description": "Text or token ids; one prompt per request." }),
    );
    properties.insert(
        "logprobs".into(),
        json!({ "type": "integer", "minimum": 0, "maximum": top_logprobs_bound(b),
                "description": "Alternatives per token." }),
    );
    request_object("A text completion.".into(), "prompt", properties, b)
}

fn chat_message() -> Value {
    let part = json!({ "type": "object", "required": ["type", "text"],
        "properties": { "type": { "type": "string", "enum": ["text"] }, "text": { "type": "string" } } });
    json!({
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": { "type": "string", "enum": super::fields::ROLES },
            "content": { "nullable": true, "oneOf": [{ "type": "string" }, { "type": "array", "items": part }] },
            "reasoning_content": { "type": "string" },
            "tool_calls": { "type": "array", "items": tool_call(),
                "description": "An earlier assistant turn's calls." },
            "tool_call_id": { "type": "string", "description": "A tool message: the call it answers." },
            "name": { "type": "string" },
        },
    })
}

fn tool_call() -> Value {
    json!({ "type": "object", "required": ["function"], "properties": {
        "id": { "type": "string" },
        "type": { "type": "string", "enum": ["function"] },
        "function": { "type": "object", "required": ["name", "arguments"], "properties": {
            "name": { "type": "string" },
            "arguments": { "type": "string", "description": "The arguments as a JSON object, in a string." } } } } })
}

fn routing(b: &Bounds) -> Value {
    let mut policy = json!({ "type": "string", "description": "A policy the server allows; absent: the default." });
    if !b.policies.is_empty() {
        policy["enum"] = json!(b.policies);
    }
    json!({
        "type": "object",
        "properties": {
            "policy": policy,
            "params": { "type": "object", "nullable": true,
                "description": format!("The policy's parameters; at most {} bytes as JSON.", b.request.max_routing_params_bytes) },
            "trace": { "type": "boolean", "description": "Report which model produced each token (a tokenrouter extension): \
                a whole response's choice gets `routing_trace`, one model name per token; with `stream: true` every chunk \
                gets a top-level `routing: {\"models\": [...]}`, the model of each token whose text the chunk carries \
                (tokens held back for a whole character or a possible stop string come with the next chunk that has text)." },
        },
    })
}

fn speculative() -> Value {
    json!({
        "type": "object",
        "additionalProperties": false,
        "description": "Speculative decoding (a tokenrouter extension): drafted tokens the model verifies in one step; \
            the output is the model's own token for token. Absent: the server's `scheduler.speculative`.",
        "properties": {
            "method": { "type": "string", "enum": ["suffix", "ngram", "draft", "none"],
                "description": "`suffix`: the continuation that most often followed the text's tail, in the prompt and output \
                    and in the model's recent outputs; `ngram`: continuations of earlier occurrences of the text's tail in \
                    the prompt and output; `draft`: the server's first (smallest) model samples the next tokens for the \
                    model the request is on, which verifies them (needs two models or more); `none`: off for this request." },
            "max_tokens": { "type": "integer", "minimum": 1, "maximum": MAX_DRAFT_TOKENS,
                "description": "Most tokens drafted per step (the most; drafts follow the match length and their record)." },
        },
    })
}

fn prediction() -> Value {
    let part = json!({ "type": "object", "required": ["type", "text"],
        "properties": { "type": { "type": "string", "enum": ["text"] }, "text": { "type": "string" } } });
    json!({
        "type": "object",
        "required": ["type", "content"],
        "additionalProperties": false,
        "description": "OpenAI's Predicted Outputs: the expected output, used as drafts; `usage.completion_tokens_details` \
            says how many of its tokens were kept and how many drafted and rejected.",
        "properties": {
            "type": { "type": "string", "enum": ["content"] },
            "content": { "oneOf": [{ "type": "string" }, { "type": "array", "items": part }] },
        },
    })
}

fn completion_response(object: &str, choice: Value) -> Value {
    json!({
        "type": "object",
        "required": ["id", "object", "created", "model", "choices", "usage"],
        "properties": {
            "id": { "type": "string" },
            "object": { "type": "string", "enum": [object] },
            "created": { "type": "integer" },
            "model": { "type": "string" },
            "system_fingerprint": { "type": "string", "nullable": true },
            "choices": { "type": "array", "minItems": 1, "items": choice },
            "usage": schema("Usage"),
        },
    })
}

/// What both kinds of choice carry besides their text.
fn choice_with(key: &str, text: Value) -> Value {
    json!({
        "type": "object",
        "required": ["index", key, "finish_reason"],
        "properties": {
            "index": { "type": "integer" },
            key: text,
            "logprobs": { "type": "object", "nullable": true },
            "finish_reason": { "type": "string", "enum": ["stop", "length", "tool_calls"] },
            "stop_reason": { "type": "string",
                "description": "The stop string that ended the choice (vLLM's field); absent when none did." },
            "token_ids": { "type": "array", "items": { "type": "integer" } },
            "routing_trace": { "type": "array", "items": { "type": "string" } },
            "routing_drafted": { "type": "array", "items": { "type": "boolean" },
                "description": "With `routing.trace` on a speculating request: per token, whether it was a kept draft." },
        },
    })
}

fn chat_choice() -> Value {
    let message = json!({
        "type": "object",
        "required": ["role", "content"],
        "properties": {
            "role": { "type": "string", "enum": ["assistant"] },
            "content": { "type": "string", "nullable": true, "description": "null when the answer is only tool calls." },
            "tool_calls": { "type": "array", "items": tool_call() },
        },
    });
    choice_with("message", message)
}

fn text_choice() -> Value {
    choice_with("text", json!({ "type": "string" }))
}

fn usage() -> Value {
    let count = json!({ "type": "integer", "minimum": 0 });
    json!({
        "type": "object",
        "required": ["prompt_tokens", "completion_tokens", "total_tokens"],
        "properties": {
            "prompt_tokens": count,
            "completion_tokens": count,
            "total_tokens": count,
            "prompt_tokens_details": {
                "type": "object",
                "properties": { "cached_tokens": count },
            },
            "completion_tokens_details": {
                "type": "object",
                "properties": { "accepted_prediction_tokens": count, "rejected_prediction_tokens": count },
            },
            "tokens_per_model": { "type": "object", "additionalProperties": count },
            "switches": count,
            "speculation": {
                "type": "object",
                "description": "Verify steps the request took part in, tokens drafted for them, and drafted tokens kept.",
                "properties": { "verify_steps": count, "drafted_tokens": count, "accepted_tokens": count },
            },
        },
    })
}

fn model_list() -> Value {
    json!({
        "type": "object",
        "required": ["object", "data"],
        "properties": {
            "object": { "type": "string", "enum": ["list"] },
            "data": { "type": "array", "items": {
                "type": "object",
                "required": ["id", "object", "created", "owned_by"],
                "properties": {
                    "id": { "type": "string" },
                    "object": { "type": "string", "enum": ["model"] },
                    "created": { "type": "integer" },
                    "owned_by": { "type": "string" },
                    "max_model_len": { "type": "integer" },
                },
            }},
        },
    })
}

fn stats() -> Value {
    json!({
        "type": "object",
        "required": ["model_names", "served_model", "http_in_flight", "max_queued_requests", "shutting_down"],
        "properties": {
            "model_names": { "type": "array", "items": { "type": "string" } },
            "served_model": { "type": "string" },
            "models": { "type": "array" },
            "kv": { "type": "object", "nullable": true },
            "active_requests": { "type": "integer" },
            "nodes": { "type": "array" },
            "http_in_flight": { "type": "integer" },
            "max_queued_requests": { "type": "integer" },
            "shutting_down": { "type": "boolean" },
            "ready": { "type": "boolean", "description": "What `/health` answers." },
            "readiness": { "type": "object", "properties": {
                "ready": { "type": "boolean" },
                "models": { "type": "array", "items": schema("ModelReadiness") },
                "tokenizer": { "type": "boolean", "description": "Absent where the models have no tokenizer." },
            }},
            "planner": {
                "type": "object",
                "nullable": true,
                "description": "Where the thresholds in force came from and the planner's last decisions; null when it is off.",
                "properties": {
                    "source": { "type": "string", "enum": ["configured", "hand", "startup", "replanned"] },
                    "replanning": { "type": "boolean" },
                    "startup": { "type": "object", "nullable": true, "description": "The start-up table: delegation prior, the workload prior (prompt and output tokens) and the tokens a row feeds per model under it, and (N, thresholds, predicted tok/s) rows." },
                    "last_replan": { "type": "object", "nullable": true, "description": "The last switch: N, from, to, predictions, measured routing and tokens per row." },
                    "last_window": { "type": "object", "nullable": true, "description": "The last trusted window: N, the thresholds in force and their predicted tok/s, the best thresholds and theirs, and the tokens a row fed per model." },
                    "pending": { "type": "object", "nullable": true, "description": "Better thresholds the last windows agreed on at N = `active` (`to`, `windows`), waiting for `scheduler.replan.confirmations` in a row." },
                    "planned": { "type": "object", "description": "Thresholds planned per N." },
                },
            },
        },
    })
}

fn stats_history() -> Value {
    json!({
        "type": "object",
        "required": ["interval_s", "samples"],
        "properties": {
            "interval_s": { "type": "number" },
            "samples": { "type": "array", "items": {
                "type": "object",
                "required": ["t", "active_requests", "waiting", "first_tokens", "models"],
                "properties": {
                    "t": { "type": "number", "description": "Unix seconds." },
                    "active_requests": { "type": "integer" },
                    "waiting": { "type": "integer", "description": "Requests waiting for KV." },
                    "first_tokens": { "type": "integer", "description": "First tokens since the previous sample." },
                    "ttft_p50_ms": { "type": "number", "nullable": true },
                    "ttft_max_ms": { "type": "number", "nullable": true },
                    "models": { "type": "array", "items": { "type": "object" } },
                },
            }},
        },
    })
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;

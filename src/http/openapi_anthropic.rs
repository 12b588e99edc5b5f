//! The Anthropic Messages routes in `/openapi.json` (`POST /v1/messages` and
//! `/v1/messages/count_tokens`), so that clients generated from the document and the
//! fuzz test reach them: the request as this server reads it, the `message` answer (or
//! Anthropic's named events when streamed) and Anthropic's error envelope.

use serde_json::{json, Value};

use super::openapi::{generation_errors, json_or_events};

fn reference(kind: &str, name: &str) -> Value {
    json!({ "$ref": format!("#/components/{kind}/{name}") })
}

/// The two paths.
pub fn paths() -> Value {
    let mut answered = generation_errors("AnthropicError");
    answered.insert(
        "200".into(),
        json_or_events(
            "The message; with `stream: true`, Anthropic's named events (`message_start` … `message_stop`).",
            reference("schemas", "AnthropicMessage"),
        ),
    );
    let mut counted = generation_errors("AnthropicError");
    counted.insert(
        "200".into(),
        json!({ "description": "The prompt's tokens as the template renders it.",
            "content": { "application/json": { "schema": { "type": "object", "required": ["input_tokens"],
                "properties": { "input_tokens": { "type": "integer", "minimum": 0 } } } } } }),
    );
    let body = |name: &str| json!({ "required": true, "content": { "application/json": { "schema": reference("schemas", name) } } });
    json!({
        "/v1/messages": { "post": {
            "operationId": "createMessage",
            "summary": "Anthropic's Messages API, served as the chat request it means (docs/api.md).",
            "requestBody": body("AnthropicRequest"), "responses": answered } },
        "/v1/messages/count_tokens": { "post": {
            "operationId": "countMessageTokens",
            "summary": "The prompt tokens a Messages request would take.",
            "requestBody": body("AnthropicCountRequest"), "responses": counted } },
    })
}

/// The schemas the paths name.
pub fn schemas(max_tokens: usize, models: &[String]) -> Value {
    json!({
        "AnthropicRequest": request(max_tokens, models, true),
        "AnthropicCountRequest": request(max_tokens, models, false),
        "AnthropicMessage": message(),
        "AnthropicErrorEnvelope": error_envelope(),
    })
}

/// The error response, beside OpenAI's `Error`.
pub fn error_response() -> Value {
    json!({ "description": "Anthropic's error envelope.",
        "content": { "application/json": { "schema": reference("schemas", "AnthropicErrorEnvelope") } } })
}

fn text_block() -> Value {
    json!({ "type": "object", "required": ["type", "text"], "properties": {
        "type": { "type": "string", "enum": ["text"] }, "text": { "type": "string" } } })
}

fn request(max_tokens: usize, models: &[String], generates: bool) -> Value {
    let text_or_blocks = json!({ "oneOf": [{ "type": "string" }, { "type": "array", "items": text_block() }] });
    let block = json!({ "type": "object", "required": ["type"], "properties": {
        "type": { "type": "string", "enum": ["text", "tool_use", "tool_result"] } },
        "description": "`text`, `tool_use` (id, name, input) or `tool_result` (tool_use_id, content)." });
    let turn = json!({ "type": "object", "required": ["role", "content"], "properties": {
        "role": { "type": "string", "enum": ["user", "assistant"] },
        "content": { "oneOf": [{ "type": "string" }, { "type": "array", "items": block }] } } });
    let tool = json!({ "type": "object", "required": ["name", "input_schema"], "properties": {
        "name": { "type": "string", "pattern": "^[a-zA-Z0-9_-]{1,64}$" }, "description": { "type": "string" },
        "input_schema": { "type": "object" } } });
    let tool_choice = json!({ "type": "object", "required": ["type"], "properties": {
        "type": { "type": "string", "enum": ["auto", "any", "tool", "none"] }, "name": { "type": "string" },
        "disable_parallel_tool_use": { "type": "boolean" } } });
    let mut properties = json!({
        "model": { "type": "string", "enum": models },
        "messages": { "type": "array", "minItems": 1, "items": turn },
        "system": text_or_blocks,
        "tools": { "type": "array", "items": tool },
        "tool_choice": tool_choice,
    });
    let mut required = vec!["model", "messages"];
    if generates {
        let generation = json!({
            "max_tokens": { "type": "integer", "minimum": 1, "maximum": max_tokens },
            "stop_sequences": { "type": "array", "maxItems": 4, "items": { "type": "string", "minLength": 1 } },
            "stream": { "type": "boolean" },
            "temperature": { "type": "number", "minimum": 0, "maximum": 1 },
            "top_p": { "type": "number", "exclusiveMinimum": true, "minimum": 0, "maximum": 1 },
            "top_k": { "type": "integer", "minimum": 1 },
            "metadata": { "type": "object", "properties": { "user_id": { "type": "string" } } },
            "routing": { "$ref": "#/components/schemas/Routing" },
            "speculative": { "$ref": "#/components/schemas/Speculative" },
        });
        if let (Some(all), Value::Object(more)) = (properties.as_object_mut(), generation) {
            all.extend(more);
        }
        required.push("max_tokens");
    }
    json!({ "type": "object", "required": required, "properties": properties, "additionalProperties": false })
}

fn message() -> Value {
    json!({
        "type": "object",
        "required": ["id", "type", "role", "content", "model", "stop_reason", "usage"],
        "properties": {
            "id": { "type": "string" },
            "type": { "type": "string", "enum": ["message"] },
            "role": { "type": "string", "enum": ["assistant"] },
            "content": { "type": "array", "items": { "type": "object", "required": ["type"], "properties": {
                "type": { "type": "string", "enum": ["text", "tool_use"] } } } },
            "model": { "type": "string" },
            "stop_reason": { "type": "string", "enum": ["end_turn", "max_tokens", "stop_sequence", "tool_use"] },
            "stop_sequence": { "type": "string", "nullable": true },
            "usage": { "type": "object", "required": ["input_tokens", "output_tokens"], "properties": {
                "input_tokens": { "type": "integer" }, "output_tokens": { "type": "integer" } } },
        },
    })
}

fn error_envelope() -> Value {
    json!({
        "type": "object",
        "required": ["type", "error"],
        "properties": {
            "type": { "type": "string", "enum": ["error"] },
            "error": { "type": "object", "required": ["type", "message"], "properties": {
                "type": { "type": "string" }, "message": { "type": "string" } } },
        },
    })
}

//! A Responses request as the chat request it means: `instructions` and `input`
//! (text, messages, `function_call` and `function_call_output` items) after the kept
//! conversation of `previous_response_id`, function tools and `tool_choice`,
//! `text.format` as `response_format`, sampling and `max_output_tokens`. The result goes
//! through the chat path unchanged (templates, tools, grammars, limits, routing). Fields
//! the Responses API defines and this server does not implement are refused by name.

use serde_json::{json, Map, Value};

use crate::http::error::ApiError;

/// Fields of a Responses request that are read (or harmless and ignored).
const KNOWN: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "store",
    "previous_response_id",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "text",
    "metadata",
    "user",
    "safety_identifier",
    // A cache hint: prefixes are cached here whatever the key.
    "prompt_cache_key",
    "truncation",
    "service_tier",
    "stream_options",
    // This server's extensions, as on chat.
    "routing",
    "speculative",
    "seed",
    "top_k",
];

/// Defined by the Responses API, not implemented here: refused by name (unless null,
/// false or empty, which ask for nothing).
const NOT_IMPLEMENTED: &[&str] =
    &["reasoning", "background", "include", "conversation", "prompt", "max_tool_calls", "top_logprobs"];

/// What a Responses request asks beyond the chat request.
#[derive(Debug, Clone, PartialEq)]
pub struct ResponsesAsk {
    pub store: bool,
    pub previous_response_id: Option<String>,
    /// The request's fields the response object repeats.
    pub echo: Map<String, Value>,
}

/// The fields a request names (and their checks) before any conversation is loaded.
pub fn read_ask(body: &Value) -> Result<ResponsesAsk, ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    };
    for (name, value) in fields {
        if NOT_IMPLEMENTED.contains(&name.as_str()) {
            if asks_nothing(value) {
                continue;
            }
            return Err(bad(format!("`{name}` is not supported by this server"), name));
        }
        if !KNOWN.contains(&name.as_str()) {
            return Err(bad(format!("unknown field `{name}`"), name));
        }
    }
    if let Some(t) = fields.get("truncation").filter(|v| !v.is_null()) {
        if t.as_str() != Some("disabled") {
            return Err(bad(
                "only truncation \"disabled\" is supported: a prompt over the context is refused",
                "truncation",
            ));
        }
    }
    let previous_response_id = match fields.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(id)) if !id.is_empty() => Some(id.clone()),
        Some(_) => return Err(bad("`previous_response_id` must be a response id", "previous_response_id")),
    };
    let store = match fields.get("store") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("`store` must be a boolean", "store")),
    };
    check_metadata(fields.get("metadata"))?;
    let mut echo = Map::new();
    for name in ["instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "temperature", "top_p", "user"]
    {
        echo.insert(name.into(), fields.get(name).cloned().unwrap_or(Value::Null));
    }
    echo.insert("tools".into(), fields.get("tools").cloned().filter(|v| !v.is_null()).unwrap_or_else(|| json!([])));
    echo.insert("tool_choice".into(), fields.get("tool_choice").cloned().unwrap_or_else(|| json!("auto")));
    let format = fields.get("text").and_then(|t| t.get("format")).cloned().unwrap_or_else(|| json!({"type": "text"}));
    echo.insert("text".into(), json!({ "format": format }));
    echo.insert("truncation".into(), json!("disabled"));
    if echo["metadata"].is_null() {
        echo.insert("metadata".into(), json!({}));
    }
    if echo["parallel_tool_calls"].is_null() {
        echo.insert("parallel_tool_calls".into(), json!(true));
    }
    echo.insert("previous_response_id".into(), json!(previous_response_id));
    echo.insert("store".into(), json!(store));
    Ok(ResponsesAsk { store, previous_response_id, echo })
}

fn asks_nothing(value: &Value) -> bool {
    match value {
        Value::Null | Value::Bool(false) => true,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        _ => false,
    }
}

/// OpenAI's bounds: at most 16 keys, keys up to 64 characters, string values up to 512.
fn check_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let object = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(o)) => o,
        Some(_) => return Err(bad("`metadata` must be an object of strings", "metadata")),
    };
    if object.len() > 16 {
        return Err(bad("`metadata` has at most 16 keys", "metadata"));
    }
    for (key, value) in object {
        let fits = key.chars().count() <= 64 && value.as_str().is_some_and(|v| v.chars().count() <= 512);
        if !fits {
            return Err(bad(
                "`metadata` keys are up to 64 characters, values strings up to 512",
                &format!("metadata.{key}"),
            ));
        }
    }
    Ok(())
}

/// The request's new turns as chat messages (`input`, without `instructions`).
pub fn input_messages(body: &Value) -> Result<Vec<Value>, ApiError> {
    match body.get("input") {
        Some(Value::String(text)) => Ok(vec![json!({ "role": "user", "content": text })]),
        Some(Value::Array(items)) => items_messages(items),
        None | Some(Value::Null) => Err(bad("`input` is required", "input")),
        Some(_) => Err(bad("`input` must be a string or an array of items", "input")),
    }
}

/// The chat request (as JSON) for `history` (a kept conversation) followed by `input`,
/// with the request's instructions first.
pub fn to_chat(body: &Value, history: &[Value], input: &[Value]) -> Result<Value, ApiError> {
    let fields = body.as_object().ok_or_else(|| ApiError::bad_request("the body must be a JSON object", None))?;
    let mut messages = Vec::with_capacity(history.len() + input.len() + 1);
    match fields.get("instructions") {
        None | Some(Value::Null) => {}
        Some(Value::String(text)) => messages.push(json!({ "role": "system", "content": text })),
        Some(_) => return Err(bad("`instructions` must be a string", "instructions")),
    }
    messages.extend(history.iter().cloned());
    messages.extend(input.iter().cloned());
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages));
    for (from, to) in [
        ("model", "model"),
        ("max_output_tokens", "max_completion_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("seed", "seed"),
        ("routing", "routing"),
        ("speculative", "speculative"),
        ("parallel_tool_calls", "parallel_tool_calls"),
    ] {
        if let Some(v) = fields.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(user) = ["user", "safety_identifier"].iter().find_map(|k| fields.get(*k).filter(|v| v.is_string())) {
        chat.insert("user".into(), user.clone());
    }
    if fields.get("stream").and_then(Value::as_bool) == Some(true) {
        chat.insert("stream".into(), json!(true));
        // The stream's last event holds the usage, whatever the client asked for.
        chat.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    if let Some(tools) = fields.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = fields.get("tool_choice").filter(|v| !v.is_null()) {
        chat.insert("tool_choice".into(), chat_tool_choice(choice)?);
    }
    if let Some(format) = response_format(fields.get("text"))? {
        chat.insert("response_format".into(), format);
    }
    Ok(Value::Object(chat))
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// Input items as chat messages: messages by role, and consecutive `function_call`
/// items (with the assistant text before them) as one assistant message with calls.
fn items_messages(items: &[Value]) -> Result<Vec<Value>, ApiError> {
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let path = format!("input[{i}]");
        let kind = item.get("type").and_then(Value::as_str);
        match kind {
            None | Some("message") => out.push(message(item, &path)?),
            Some("function_call") => {
                let call = function_call(item, &path)?;
                match out.last_mut() {
                    Some(last) if last["role"] == "assistant" => {
                        match last.get_mut("tool_calls").and_then(Value::as_array_mut) {
                            Some(calls) => calls.push(call),
                            None => last["tool_calls"] = json!([call]),
                        }
                    }
                    _ => out.push(json!({ "role": "assistant", "content": "", "tool_calls": [call] })),
                }
            }
            Some("function_call_output") => out.push(function_output(item, &path)?),
            // Another model's reasoning, replayed by an agent loop: nothing this model can read.
            Some("reasoning") => {}
            Some(other) => {
                return Err(bad(
                    format!("input item type `{other}` is not supported by this server"),
                    &format!("{path}.type"),
                ))
            }
        }
    }
    if out.is_empty() {
        return Err(bad("`input` holds no message", "input"));
    }
    Ok(out)
}

fn message(item: &Value, path: &str) -> Result<Value, ApiError> {
    let role = match item.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant" | "system")) => r,
        Some("developer") => "system",
        Some(other) => {
            return Err(bad(
                format!("role `{other}` is not one of user, assistant, system, developer"),
                &format!("{path}.role"),
            ))
        }
        None => return Err(bad("a message needs a `role`", &format!("{path}.role"))),
    };
    let content = match item.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => texts_of_parts(parts, &format!("{path}.content"))?,
        _ => return Err(bad("`content` must be a string or an array of parts", &format!("{path}.content"))),
    };
    Ok(json!({ "role": role, "content": content }))
}

/// Text parts as one string; `path` names the array in errors.
fn texts_of_parts(parts: &[Value], path: &str) -> Result<String, ApiError> {
    let texts: Result<Vec<String>, ApiError> =
        parts.iter().enumerate().map(|(j, part)| text_of_part(part, &format!("{path}[{j}]"))).collect();
    Ok(texts?.join(""))
}

fn text_of_part(part: &Value, path: &str) -> Result<String, ApiError> {
    match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
        (Some("input_text" | "output_text" | "text"), Some(text)) => Ok(text.to_string()),
        (Some("refusal"), _) => Ok(part.get("refusal").and_then(Value::as_str).unwrap_or_default().to_string()),
        (Some("input_text" | "output_text" | "text"), None) => {
            Err(bad("a text part needs a string `text`", &format!("{path}.text")))
        }
        (Some(other), _) => Err(bad(
            format!("content part `{other}` is not supported by this server (text only)"),
            &format!("{path}.type"),
        )),
        (None, _) => Err(bad("a content part needs a `type`", &format!("{path}.type"))),
    }
}

fn required_str<'a>(item: &'a Value, field: &str, path: &str) -> Result<&'a str, ApiError> {
    item.get(field)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("needs a string `{field}`"), &format!("{path}.{field}")))
}

fn function_call(item: &Value, path: &str) -> Result<Value, ApiError> {
    let call_id = required_str(item, "call_id", path)?;
    let name = required_str(item, "name", path)?;
    let arguments = required_str(item, "arguments", path)?;
    Ok(json!({ "id": call_id, "type": "function", "function": { "name": name, "arguments": arguments } }))
}

fn function_output(item: &Value, path: &str) -> Result<Value, ApiError> {
    let call_id = required_str(item, "call_id", path)?;
    let output = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => texts_of_parts(parts, &format!("{path}.output"))?,
        _ => return Err(bad("`output` must be a string or an array of text parts", &format!("{path}.output"))),
    };
    Ok(json!({ "role": "tool", "tool_call_id": call_id, "content": output }))
}

/// Function tools as chat's. The Responses API's hosted tools (web search, file search,
/// computer use, code interpreter, MCP, image generation) run on OpenAI's side: refused.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Some(tools) = tools.as_array() else { return Err(bad("`tools` must be an array", "tools")) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                return Err(bad(
                    format!("tool type `{other}` is not supported by this server (functions only)"),
                    &format!("{at}.type"),
                ))
            }
            None => return Err(bad("a tool needs a `type`", &format!("{at}.type"))),
        }
        let name = required_str(tool, "name", &at)?;
        let mut function = json!({ "name": name });
        for field in ["description", "parameters"] {
            if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                function[field] = v.clone();
            }
        }
        out.push(json!({ "type": "function", "function": function }));
    }
    Ok(Value::Array(out))
}

fn chat_tool_choice(choice: &Value) -> Result<Value, ApiError> {
    match choice {
        Value::String(s) if ["auto", "none", "required"].contains(&s.as_str()) => Ok(choice.clone()),
        Value::String(other) => {
            Err(bad(format!("tool_choice {other:?} is not one of none, auto, required"), "tool_choice"))
        }
        Value::Object(o) => match (o.get("type").and_then(Value::as_str), o.get("name").and_then(Value::as_str)) {
            (Some("function"), Some(name)) => Ok(json!({ "type": "function", "function": { "name": name } })),
            (Some("function"), None) => Err(bad("a function tool_choice needs a `name`", "tool_choice.name")),
            (Some(other), _) => {
                Err(bad(format!("tool_choice type `{other}` is not supported by this server"), "tool_choice.type"))
            }
            (None, _) => Err(bad("`tool_choice` needs a `type`", "tool_choice.type")),
        },
        _ => Err(bad("`tool_choice` must be a string or an object", "tool_choice")),
    }
}

/// `text.format` as chat's `response_format`; `text.verbosity` is not implemented.
fn response_format(text: Option<&Value>) -> Result<Option<Value>, ApiError> {
    let Some(text) = text.filter(|v| !v.is_null()) else { return Ok(None) };
    let Some(fields) = text.as_object() else { return Err(bad("`text` must be an object", "text")) };
    for (name, value) in fields {
        match name.as_str() {
            "format" => {}
            "verbosity" if value.is_null() => {}
            "verbosity" => return Err(bad("`text.verbosity` is not supported by this server", "text.verbosity")),
            other => return Err(bad(format!("unknown field `text.{other}`"), &format!("text.{other}"))),
        }
    }
    let Some(format) = fields.get("format").filter(|v| !v.is_null()) else { return Ok(None) };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({ "type": "json_object" }))),
        Some("json_schema") => {
            let mut schema = Map::new();
            for field in ["name", "schema", "strict", "description"] {
                if let Some(v) = format.get(field).filter(|v| !v.is_null()) {
                    schema.insert(field.into(), v.clone());
                }
            }
            Ok(Some(json!({ "type": "json_schema", "json_schema": schema })))
        }
        Some(other) => Err(bad(format!("text.format type `{other}` is not supported"), "text.format.type")),
        None => Err(bad("`text.format` needs a `type`", "text.format.type")),
    }
}

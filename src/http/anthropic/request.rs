//! An Anthropic Messages request as the OpenAI chat request it means: system prompt,
//! text, `tool_use` and `tool_result` blocks, tools and `tool_choice`, sampling and
//! `stop_sequences`. The result goes through the chat path unchanged, so templates,
//! tools, grammars, limits and routing behave exactly as on `/v1/chat/completions`.
//! Fields the Messages API defines and this server does not implement are refused by
//! name, as on chat.

use serde_json::{json, Map, Value};

use crate::http::error::ApiError;

/// Fields of a Messages request that are read (or harmless and ignored).
const KNOWN: &[&str] = &[
    "model",
    "messages",
    "system",
    "max_tokens",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "tools",
    "tool_choice",
    // This server's extensions, as on chat.
    "routing",
    "speculative",
    // A capacity hint with one meaning here.
    "service_tier",
];

/// Defined by the Messages API, not implemented here: refused by name.
const NOT_IMPLEMENTED: &[&str] =
    &["thinking", "container", "mcp_servers", "context_management", "inference_geo", "output_config"];

/// The chat request (as JSON) a Messages request means. `count_only` is for
/// `count_tokens`, whose body has no `max_tokens`.
pub fn to_chat(body: &Value, count_only: bool) -> Result<Value, ApiError> {
    let Some(fields) = body.as_object() else {
        return Err(ApiError::bad_request("the body must be a JSON object", None));
    };
    for name in fields.keys() {
        if NOT_IMPLEMENTED.contains(&name.as_str()) {
            return Err(ApiError::bad_request(format!("`{name}` is not supported by this server"), Some(name)));
        }
        if !KNOWN.contains(&name.as_str()) {
            return Err(ApiError::bad_request(format!("unknown field `{name}`"), Some(name)));
        }
    }
    let mut chat = Map::new();
    if let Some(model) = fields.get("model") {
        chat.insert("model".into(), model.clone());
    }
    let mut messages = system_messages(fields.get("system"))?;
    let turns = fields.get("messages").and_then(Value::as_array);
    let Some(turns) = turns else {
        return Err(ApiError::bad_request("`messages` must be an array of turns", Some("messages")));
    };
    for (i, turn) in turns.iter().enumerate() {
        messages.extend(turn_messages(turn, i)?);
    }
    chat.insert("messages".into(), Value::Array(messages));
    match fields.get("max_tokens") {
        Some(n) => {
            chat.insert("max_tokens".into(), n.clone());
        }
        None if count_only => {}
        None => return Err(ApiError::bad_request("`max_tokens` is required", Some("max_tokens"))),
    }
    for (from, to) in [
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("top_k", "top_k"),
        ("routing", "routing"),
        ("speculative", "speculative"),
    ] {
        if let Some(v) = fields.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(stop) = fields.get("stop_sequences").filter(|v| !v.is_null()) {
        chat.insert("stop".into(), stop.clone());
    }
    if let Some(user) = fields.get("metadata").and_then(|m| m.get("user_id")).filter(|v| !v.is_null()) {
        chat.insert("user".into(), user.clone());
    }
    if fields.get("stream").and_then(Value::as_bool) == Some(true) && !count_only {
        chat.insert("stream".into(), json!(true));
        // The Anthropic stream ends with the usage, whatever the client asked for.
        chat.insert("stream_options".into(), json!({ "include_usage": true }));
    }
    if let Some(tools) = fields.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(tools)?);
    }
    if let Some(choice) = fields.get("tool_choice").filter(|v| !v.is_null()) {
        let (choice, parallel) = chat_tool_choice(choice)?;
        chat.insert("tool_choice".into(), choice);
        if let Some(parallel) = parallel {
            chat.insert("parallel_tool_calls".into(), json!(parallel));
        }
    }
    Ok(Value::Object(chat))
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// `system`: a string, or text blocks (joined by blank lines).
fn system_messages(system: Option<&Value>) -> Result<Vec<Value>, ApiError> {
    match system {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(value) => Ok(vec![json!({ "role": "system", "content": string_or_texts(value, "system", "\n\n")? })]),
    }
}

/// A field that is a string or an array of text blocks, as one string (the blocks
/// joined by `separator`); `path` names the field in errors.
fn string_or_texts(value: &Value, path: &str, separator: &str) -> Result<String, ApiError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let texts: Result<Vec<String>, ApiError> =
                blocks.iter().enumerate().map(|(j, block)| text_of_block(block, &format!("{path}[{j}]"))).collect();
            Ok(texts?.join(separator))
        }
        _ => Err(bad(format!("`{path}` must be a string or an array of text blocks"), path)),
    }
}

/// A `text` block's text (its `cache_control` is a hint: prefixes are cached anyway).
fn text_of_block(block: &Value, path: &str) -> Result<String, ApiError> {
    match (block.get("type").and_then(Value::as_str), block.get("text").and_then(Value::as_str)) {
        (Some("text"), Some(text)) => Ok(text.to_string()),
        (Some("text"), None) => Err(bad("a text block needs a string `text`", &format!("{path}.text"))),
        (Some(other), _) => Err(bad(format!("block type `{other}` is not supported here"), &format!("{path}.type"))),
        (None, _) => Err(bad("a block needs a `type`", &format!("{path}.type"))),
    }
}

/// One turn as chat messages: a user turn's `tool_result` blocks become `tool`
/// messages (first, in order), its text one user message; an assistant turn's text
/// and `tool_use` blocks one assistant message with `tool_calls`.
fn turn_messages(turn: &Value, i: usize) -> Result<Vec<Value>, ApiError> {
    let path = format!("messages[{i}]");
    let role = turn.get("role").and_then(Value::as_str);
    let role = match role {
        Some(r @ ("user" | "assistant")) => r,
        Some(other) => {
            return Err(bad(format!("role `{other}` is not one of user, assistant"), &format!("{path}.role")))
        }
        None => return Err(bad("a turn needs a `role`", &format!("{path}.role"))),
    };
    let blocks = match turn.get("content") {
        Some(Value::String(text)) => return Ok(vec![json!({ "role": role, "content": text })]),
        Some(Value::Array(blocks)) => blocks,
        _ => return Err(bad("`content` must be a string or an array of blocks", &format!("{path}.content"))),
    };
    let mut out = Vec::new();
    let mut text = Vec::new();
    let mut reasoning = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{path}.content[{j}]");
        match (role, block.get("type").and_then(Value::as_str)) {
            (_, Some("text")) => text.push(text_of_block(block, &at)?),
            ("assistant", Some("tool_use")) => calls.push(tool_call(block, &at)?),
            ("user", Some("tool_result")) => out.push(tool_message(block, &at)?),
            ("assistant", Some("thinking")) => {
                reasoning.push(block.get("thinking").and_then(Value::as_str).unwrap_or_default().to_string())
            }
            // Signed reasoning of another provider's model: nothing to show this one.
            ("assistant", Some("redacted_thinking")) => {}
            (_, Some(other)) => {
                return Err(bad(
                    format!("block type `{other}` is not supported in a {role} turn"),
                    &format!("{at}.type"),
                ))
            }
            (_, None) => return Err(bad("a block needs a `type`", &format!("{at}.type"))),
        }
    }
    if role == "assistant" {
        let mut message = json!({ "role": "assistant", "content": text.join("") });
        if !calls.is_empty() {
            message["tool_calls"] = Value::Array(calls);
        }
        if !reasoning.is_empty() {
            message["reasoning_content"] = json!(reasoning.join("\n"));
        }
        out.push(message);
    } else if !text.is_empty() || out.is_empty() {
        out.push(json!({ "role": "user", "content": text.join("\n") }));
    }
    Ok(out)
}

fn tool_call(block: &Value, at: &str) -> Result<Value, ApiError> {
    let id = block.get("id").and_then(Value::as_str).ok_or_else(|| bad("a tool_use block needs an `id`", at))?;
    let name = block.get("name").and_then(Value::as_str).ok_or_else(|| bad("a tool_use block needs a `name`", at))?;
    let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
    Ok(json!({ "id": id, "type": "function", "function": { "name": name, "arguments": input.to_string() } }))
}

/// A `tool_result`: its content (a string or text blocks), marked when it is an error.
fn tool_message(block: &Value, at: &str) -> Result<Value, ApiError> {
    let id = block
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("a tool_result block needs a `tool_use_id`", &format!("{at}.tool_use_id")))?;
    let content = match block.get("content") {
        None | Some(Value::Null) => String::new(),
        Some(content) => string_or_texts(content, &format!("{at}.content"), "\n")?,
    };
    let content = if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("Error: {content}")
    } else {
        content
    };
    Ok(json!({ "role": "tool", "tool_call_id": id, "content": content }))
}

/// Client tools as OpenAI functions. Anthropic's server tools (web search, code
/// execution, computer use) run on Anthropic's side: refused.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Some(tools) = tools.as_array() else { return Err(bad("`tools` must be an array", "tools")) };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let at = format!("tools[{i}]");
        match tool.get("type").and_then(Value::as_str) {
            None | Some("custom") => {}
            Some(other) => {
                return Err(bad(format!("tool type `{other}` runs on Anthropic's servers: not supported"), &at))
            }
        }
        let name = tool.get("name").and_then(Value::as_str).ok_or_else(|| bad("a tool needs a `name`", &at))?;
        let schema = tool.get("input_schema").cloned().unwrap_or_else(|| json!({ "type": "object" }));
        let mut function = json!({ "name": name, "parameters": schema });
        if let Some(description) = tool.get("description").filter(|d| !d.is_null()) {
            function["description"] = description.clone();
        }
        out.push(json!({ "type": "function", "function": function }));
    }
    Ok(Value::Array(out))
}

/// `tool_choice` as OpenAI's, and `disable_parallel_tool_use` as `parallel_tool_calls`.
fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ApiError> {
    let parallel = choice.get("disable_parallel_tool_use").and_then(Value::as_bool).map(|off| !off);
    let openai = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("`tool_choice` of type tool needs a `name`", "tool_choice.name"))?;
            json!({ "type": "function", "function": { "name": name } })
        }
        Some(other) => return Err(bad(format!("unknown tool_choice type `{other}`"), "tool_choice.type")),
        None => return Err(bad("`tool_choice` needs a `type`", "tool_choice.type")),
    };
    Ok((openai, parallel))
}

//! The request fields beyond plain sampling: structured outputs (`response_format`),
//! `logit_bias`, message roles, and the rule that a field this server does not
//! implement is refused by name, never silently ignored (docs/api.md lists them).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokenrouter_core::constrain::GrammarSpec;
use tokenrouter_core::tokenize::{ChatMessage, BUILT_IN_VARIABLES};

use super::error::ApiError;

/// Fields OpenAI defines as hints to its own platform: accepted, and they change
/// nothing here.
pub const ACCEPTED_HINTS: &[&str] = &["metadata", "store", "service_tier", "modalities"];

/// Roles a chat message may have.
pub const ROLES: &[&str] = &["system", "developer", "user", "assistant", "tool"];

/// What each refused field is, for its error message.
fn why_refused(field: &str) -> &'static str {
    match field {
        "suffix" => "suffix (fill-in-the-middle) is not supported",
        "functions" | "function_call" => "the legacy functions form is not supported",
        "audio" => "audio output is not supported",
        "reasoning_effort" => "reasoning_effort is not supported; use chat_template_kwargs (e.g. enable_thinking)",
        "web_search_options" => "web search is not supported",
        _ => "this server does not know this field",
    }
}

/// Refuses the first field that is neither implemented nor a harmless hint.
pub fn refuse_unknown(unrecognized: &BTreeMap<String, Value>) -> Result<(), ApiError> {
    let refused = unrecognized.iter().find(|(field, value)| !is_harmless(field, value));
    match refused {
        Some((field, _)) => Err(ApiError::bad_request(format!("`{field}`: {}", why_refused(field)), Some(field))),
        None => Ok(()),
    }
}

/// Hints are harmless; so is a refused feature explicitly switched off.
fn is_harmless(field: &str, value: &Value) -> bool {
    if field == "modalities" {
        return value.as_array().is_some_and(|m| m.iter().all(|x| x == "text"));
    }
    let switched_off = match field {
        "functions" => value.is_null() || value.as_array().is_some_and(Vec::is_empty),
        _ => value.is_null(),
    };
    ACCEPTED_HINTS.contains(&field) || switched_off
}

/// `response_format`, as OpenAI defines it plus two extensions for grammars that JSON
/// schema cannot express: `{"type": "grammar", "grammar": "<Lark>"}` and
/// `{"type": "regex", "regex": "..."}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
    Grammar { grammar: String },
    Regex { regex: String },
}

#[derive(Debug, Clone, Deserialize)]
pub struct JsonSchemaFormat {
    #[allow(dead_code)]
    pub name: Option<String>,
    #[allow(dead_code)]
    pub description: Option<String>,
    pub schema: Option<Value>,
    pub strict: Option<bool>,
}

/// Reads `response_format` (kept as JSON so an unknown `type` is refused by name,
/// not as a parse error) into the grammar the output must match, of at most
/// `max_bytes` (`server.max_grammar_bytes`).
pub fn grammar_of(format: Option<&Value>, max_bytes: usize) -> Result<Option<GrammarSpec>, ApiError> {
    let Some(value) = format.filter(|v| !v.is_null()) else { return Ok(None) };
    let bad = |m: String, p: &str| Err(ApiError::bad_request(m, Some(p)));
    let kind = value.get("type").and_then(Value::as_str);
    if !matches!(kind, Some("text" | "json_object" | "json_schema" | "grammar" | "regex")) {
        let m = format!(
            "response_format.type {kind:?} is not one of text, json_object, json_schema, grammar, regex",
            kind = kind.unwrap_or("(missing)")
        );
        return bad(m, "response_format.type");
    }
    let format: ResponseFormat = match serde_json::from_value(value.clone()) {
        Ok(f) => f,
        Err(e) => return bad(format!("invalid response_format: {e}"), "response_format"),
    };
    let (spec, param) = match format {
        ResponseFormat::Text => return Ok(None),
        ResponseFormat::JsonObject => return Ok(Some(GrammarSpec::JsonObject)),
        ResponseFormat::JsonSchema { json_schema } => {
            let Some(schema) = json_schema.schema.filter(Value::is_object) else {
                return bad(
                    "json_schema.schema must be a JSON schema object".into(),
                    "response_format.json_schema.schema",
                );
            };
            let spec = GrammarSpec::JsonSchema { schema, strict: json_schema.strict.unwrap_or(false) };
            (spec, "response_format.json_schema.schema")
        }
        ResponseFormat::Grammar { grammar } => (GrammarSpec::Lark(grammar), "response_format.grammar"),
        ResponseFormat::Regex { regex } => (GrammarSpec::Regex(regex), "response_format.regex"),
    };
    let size = grammar_bytes(&spec);
    if size > max_bytes {
        let m = format!("{param} has {size} bytes; this server allows at most {max_bytes} (server.max_grammar_bytes)");
        return bad(m, param);
    }
    Ok(Some(spec))
}

/// A grammar's size as the client wrote it (a schema as compact JSON).
fn grammar_bytes(spec: &GrammarSpec) -> usize {
    match spec {
        GrammarSpec::JsonObject => 0,
        GrammarSpec::JsonSchema { schema, .. } => json_bytes(schema),
        GrammarSpec::Lark(text) | GrammarSpec::Regex(text) => text.len(),
    }
}

/// Bytes of `value` as compact JSON (what a size limit on a JSON field counts).
pub fn json_bytes(value: &Value) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |json| json.len())
}

/// The `response_format` that asks for `spec` (what [`grammar_of`] reads back), for
/// forwarding a request to another OpenAI-compatible server.
pub fn response_format_of(spec: &GrammarSpec) -> Value {
    match spec {
        GrammarSpec::JsonObject => serde_json::json!({ "type": "json_object" }),
        GrammarSpec::JsonSchema { schema, strict } => serde_json::json!({ "type": "json_schema",
            "json_schema": { "name": "response", "schema": schema, "strict": strict } }),
        GrammarSpec::Lark(grammar) => serde_json::json!({ "type": "grammar", "grammar": grammar }),
        GrammarSpec::Regex(regex) => serde_json::json!({ "type": "regex", "regex": regex }),
    }
}

/// `logit_bias` in OpenAI's shape (token ids as string keys).
pub fn logit_bias_json(bias: &[(u32, f32)]) -> Value {
    Value::Object(bias.iter().map(|(token, b)| (token.to_string(), serde_json::json!(b))).collect())
}

/// `logit_bias`: token id (as a string key, OpenAI's shape) to a bias in -100..=100.
pub fn logit_bias_of(bias: Option<&BTreeMap<String, f64>>, vocab: Option<usize>) -> Result<Vec<(u32, f32)>, ApiError> {
    let Some(bias) = bias else { return Ok(Vec::new()) };
    let bad = |m: String| Err(ApiError::bad_request(m, Some("logit_bias")));
    let mut out = Vec::with_capacity(bias.len());
    for (key, &value) in bias {
        let Ok(token) = key.parse::<u32>() else {
            return bad(format!("logit_bias keys are token ids; {key:?} is not one"));
        };
        if let Some(vocab) = vocab.filter(|&v| token as usize >= v) {
            return bad(format!("token id {token} is outside the vocabulary (size {vocab})"));
        }
        if !(-100.0..=100.0).contains(&value) {
            return bad(format!("the bias of token {token} must be in [-100, 100], got {value}"));
        }
        out.push((token, value as f32));
    }
    Ok(out)
}

/// `chat_template_kwargs` may not shadow what the template gets from the request and
/// the tokenizer: a `messages` there would render what the role check never saw.
pub fn check_template_kwargs(kwargs: Option<&Map<String, Value>>) -> Result<(), ApiError> {
    let shadowing = kwargs.into_iter().flat_map(Map::keys).find(|k| BUILT_IN_VARIABLES.contains(&k.as_str()));
    match shadowing {
        Some(key) => Err(ApiError::bad_request(
            format!(
                "chat_template_kwargs may not set `{key}`: the template's {} come from the request and the tokenizer",
                BUILT_IN_VARIABLES.join(", ")
            ),
            Some(&format!("chat_template_kwargs.{key}")),
        )),
        None => Ok(()),
    }
}

/// Every message has a role this server renders; `developer` (OpenAI's newer name
/// for the system role) is rendered as `system`, which chat templates know.
pub fn check_roles(messages: &mut [ChatMessage]) -> Result<(), ApiError> {
    for (i, message) in messages.iter_mut().enumerate() {
        if !ROLES.contains(&message.role.as_str()) {
            let m = format!("messages[{i}].role {:?} is not one of {}", message.role, ROLES.join(", "));
            return Err(ApiError::bad_request(m, Some(&format!("messages[{i}].role"))));
        }
        if message.role == "developer" {
            message.role = "system".into();
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "fields_tests.rs"]
mod tests;

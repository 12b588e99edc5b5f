//! Tool calls: which syntax a chat template teaches its model for calling a function,
//! the grammar that forces a call (`tool_choice` `required` or a named function), and
//! the parser that turns the model's text back into OpenAI `tool_calls`.
//!
//! Two syntaxes cover the templates we serve: Hermes-style `<tool_call>` blocks (Qwen2.5,
//! Qwen3, and the fallback for templates that know no tools) and Llama-3's bare JSON
//! object `{"name": ..., "parameters": ...}`.

mod grammar;
mod parse;

use serde_json::Value;

pub use grammar::forcing_grammar;
pub use parse::{ParsedPiece, ToolCallParser};

/// How the model writes a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolSyntax {
    /// `<tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>`, one block per call.
    Hermes,
    /// The whole answer is `{"name": "f", "parameters": {...}}` (Llama 3.1/3.2).
    LlamaJson,
}

impl ToolSyntax {
    /// The syntax a chat template's own instructions teach; Hermes where the template
    /// teaches none (the tools are then described in a system message of ours).
    pub fn of_template(source: Option<&str>) -> ToolSyntax {
        match source {
            Some(s) if s.contains("<tool_call>") => ToolSyntax::Hermes,
            Some(s) if s.contains("\"parameters\"") && (s.contains("ipython") || s.contains("python_tag")) => {
                ToolSyntax::LlamaJson
            }
            _ => ToolSyntax::Hermes,
        }
    }

    /// The text that closes one call, where the syntax has one: output stopped there
    /// holds exactly the calls written so far.
    pub fn call_end(self) -> Option<&'static str> {
        match self {
            ToolSyntax::Hermes => Some("</tool_call>"),
            ToolSyntax::LlamaJson => None,
        }
    }
}

/// Whether a template renders the `tools` variable itself.
pub fn template_takes_tools(source: &str) -> bool {
    source.contains("tools")
}

/// One function the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct Tool {
    pub name: String,
    /// The JSON schema of its arguments (an object schema).
    pub parameters: Value,
}

/// `tool_choice`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model must not call a tool (nothing is parsed).
    None,
    /// The model decides; calls it writes are parsed.
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// A call to this function, forced by a grammar.
    Named(String),
}

/// A call the model made: the function and its arguments as compact JSON text.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

impl ToolCall {
    /// Reads `{"name": ..., "arguments" | "parameters": {...}}`; arguments given as a
    /// JSON string holding an object are accepted too (some models write them so).
    fn from_json(value: &Value) -> Option<ToolCall> {
        let object = value.as_object()?;
        let name = object.get("name")?.as_str()?.to_string();
        let arguments = match object.get("arguments").or_else(|| object.get("parameters")) {
            None => Value::Object(Default::default()),
            Some(Value::String(text)) => serde_json::from_str::<Value>(text).ok().filter(Value::is_object)?,
            Some(value @ Value::Object(_)) => value.clone(),
            Some(_) => return None,
        };
        Some(ToolCall { name, arguments: arguments.to_string() })
    }
}

/// The system text that teaches a model whose template knows no tools to call them
/// with Hermes-style blocks, listing the tools as given (OpenAI's shape).
pub fn hermes_instructions(tools: &[Value]) -> String {
    let mut text = String::from(
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n\
         You are provided with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and arguments within \
         <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": \
         <args-json-object>}\n</tool_call>",
    );
    text
}

/// An assistant turn's calls as Hermes blocks, for templates that know no tools.
pub fn hermes_blocks(calls: &[(String, Value)]) -> String {
    let blocks: Vec<String> = calls
        .iter()
        .map(|(name, arguments)| {
            let call = serde_json::json!({ "name": name, "arguments": arguments });
            format!("<tool_call>\n{call}\n</tool_call>")
        })
        .collect();
    blocks.join("\n")
}

#[cfg(test)]
mod tests;

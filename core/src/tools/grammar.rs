//! The Lark grammar (llguidance's dialect) that makes a model call a tool: used for
//! `tool_choice` `required` and a named function, so that even a model that knows
//! nothing writes a call the parser reads and whose arguments match the schema.

use serde_json::{json, Value};

use super::{Tool, ToolChoice, ToolSyntax};
use crate::constrain::compact_json_schema;

/// Most calls one forced answer may hold when parallel calls are allowed.
pub const MAX_PARALLEL_CALLS: usize = 8;

/// The grammar for `choice`, or `None` where nothing is forced (`auto`, `none`).
/// `parallel` allows several calls (Hermes only: Llama-3's format holds one).
pub fn forcing_grammar(syntax: ToolSyntax, tools: &[Tool], choice: &ToolChoice, parallel: bool) -> Option<String> {
    let callable: Vec<&Tool> = match choice {
        ToolChoice::None | ToolChoice::Auto => return None,
        ToolChoice::Required => tools.iter().collect(),
        ToolChoice::Named(name) => tools.iter().filter(|t| &t.name == name).collect(),
    };
    let arguments_key = match syntax {
        ToolSyntax::Hermes => "arguments",
        ToolSyntax::LlamaJson => "parameters",
    };
    let schemas: Vec<Value> = callable.iter().map(|tool| call_schema(tool, arguments_key)).collect();
    let call = match schemas.len() {
        1 => schemas.into_iter().next().expect("one"),
        _ => json!({ "anyOf": schemas }),
    };
    // Compact, as for response_format: a weak model cannot wander into whitespace.
    let call = compact_json_schema(call, false);
    Some(match syntax {
        ToolSyntax::Hermes => {
            let repeat =
                if parallel { format!("(\"\\n\" block){{0,{}}}", MAX_PARALLEL_CALLS - 1) } else { String::new() };
            format!("start: block {repeat}\nblock: \"<tool_call>\\n\" call \"\\n</tool_call>\"\ncall: %json {call}\n")
        }
        ToolSyntax::LlamaJson => format!("start: call\ncall: %json {call}\n"),
    })
}

/// `{"name": <the tool's name>, <arguments_key>: <its parameters>}`, name first.
fn call_schema(tool: &Tool, arguments_key: &str) -> Value {
    let mut properties = serde_json::Map::new();
    properties.insert("name".into(), json!({ "const": tool.name }));
    properties.insert(arguments_key.into(), closed_object(tool.parameters.clone()));
    json!({
        "type": "object",
        "properties": properties,
        "required": ["name", arguments_key],
        "additionalProperties": false,
    })
}

/// Arguments hold the declared properties only, unless the schema says otherwise (as
/// OpenAI's strict function calling requires): JSON schema's default admits any other
/// key, and a weak model forced through it invents keys until the budget runs out.
fn closed_object(mut parameters: Value) -> Value {
    if let Some(object) = parameters.as_object_mut() {
        if object.contains_key("properties") && !object.contains_key("additionalProperties") {
            object.insert("additionalProperties".into(), Value::Bool(false));
        }
    }
    parameters
}

//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request: checked here,
//! turned into what the template renders, the grammar that forces a call, and the
//! syntax the response is parsed with (`tokenrouter_core::tools`).

use serde_json::{json, Value};
use tokenrouter_core::constrain::GrammarSpec;
use tokenrouter_core::tools::{forcing_grammar, Tool, ToolChoice, ToolSyntax};

use super::error::ApiError;
use super::fields::json_bytes;
use super::request::Endpoint;
use super::state::RequestLimits;

/// What a request's tools mean for serving it.
#[derive(Debug, Clone)]
pub struct ToolPlan {
    /// The tools as the client sent them, for the chat template.
    pub definitions: Vec<Value>,
    /// The syntax calls are parsed with; `None` for `tool_choice: none`.
    pub parse: Option<ToolSyntax>,
    /// The grammar that forces a call (`required` or a named function).
    pub grammar: Option<GrammarSpec>,
    /// A stop string that ends the output after its first call (`parallel_tool_calls:
    /// false` where no grammar bounds the calls).
    pub stop_after_call: Option<&'static str>,
}

/// The request's fields as sent.
pub struct ToolFields<'a> {
    pub tools: Option<&'a Value>,
    pub tool_choice: Option<&'a Value>,
    pub parallel_tool_calls: Option<bool>,
}

impl ToolFields<'_> {
    /// `syntax` is how this server's models write calls (`None`: they have no chat
    /// template, so they cannot be given tools).
    pub fn plan(
        &self,
        endpoint: Endpoint,
        syntax: Option<ToolSyntax>,
        limits: &RequestLimits,
    ) -> Result<Option<ToolPlan>, ApiError> {
        let tools = match self.tools.filter(|v| !v.is_null()) {
            None => Vec::new(),
            Some(value) => read_tools(value, limits)?,
        };
        let choice = read_choice(self.tool_choice, &tools)?;
        if tools.is_empty() {
            return Ok(None);
        }
        if endpoint == Endpoint::Completions {
            return Err(bad("tools are for /v1/chat/completions; completions have no chat template", "tools"));
        }
        let Some(syntax) = syntax else {
            return Err(bad("this server's models have no chat template to give tools to", "tools"));
        };
        let definitions = self.tools.and_then(Value::as_array).cloned().unwrap_or_default();
        // A named function is one call, as OpenAI's forced function is: a weak model
        // allowed more repeats the call until its budget runs out.
        let parallel = self.parallel_tool_calls.unwrap_or(true) && !matches!(choice, ToolChoice::Named(_));
        let grammar = forcing_grammar(syntax, &tools, &choice, parallel).map(GrammarSpec::Lark);
        let parse = (choice != ToolChoice::None).then_some(syntax);
        let stop_after_call = (choice == ToolChoice::Auto && !parallel).then(|| syntax.call_end()).flatten();
        Ok(Some(ToolPlan { definitions, parse, grammar, stop_after_call }))
    }
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

fn read_tools(value: &Value, limits: &RequestLimits) -> Result<Vec<Tool>, ApiError> {
    let Some(list) = value.as_array() else { return Err(bad("tools must be an array", "tools")) };
    if list.len() > limits.max_tools {
        let m = format!("{} tools; this server allows at most {} (server.max_tools)", list.len(), limits.max_tools);
        return Err(bad(m, "tools"));
    }
    let size = json_bytes(value);
    if size > limits.max_tool_schema_bytes {
        let max = limits.max_tool_schema_bytes;
        let m =
            format!("tools have {size} bytes as JSON; this server allows at most {max} (server.max_tool_schema_bytes)");
        return Err(bad(m, "tools"));
    }
    let mut tools: Vec<Tool> = Vec::with_capacity(list.len());
    for (i, entry) in list.iter().enumerate() {
        let tool = read_tool(entry, i)?;
        if tools.iter().any(|t| t.name == tool.name) {
            let m = format!("two tools are named {:?}", tool.name);
            return Err(bad(m, &format!("tools[{i}].function.name")));
        }
        tools.push(tool);
    }
    Ok(tools)
}

fn read_tool(entry: &Value, i: usize) -> Result<Tool, ApiError> {
    let at = |field: &str| format!("tools[{i}]{field}");
    if entry.get("type").and_then(Value::as_str) != Some("function") {
        return Err(bad("only tools of type \"function\" are supported", &at(".type")));
    }
    let Some(function) = entry.get("function").filter(|f| f.is_object()) else {
        return Err(bad("a tool needs a `function` object", &at(".function")));
    };
    let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
    if !valid_name(name) {
        let m = format!("function names are 1 to 64 of a-z, A-Z, 0-9, _ and -; got {name:?}");
        return Err(bad(m, &at(".function.name")));
    }
    if function.get("description").is_some_and(|d| !d.is_string() && !d.is_null()) {
        return Err(bad("description must be a string", &at(".function.description")));
    }
    let parameters = match function.get("parameters") {
        None | Some(Value::Null) => json!({ "type": "object", "properties": {} }),
        Some(schema @ Value::Object(_)) => schema.clone(),
        Some(_) => return Err(bad("parameters must be a JSON schema object", &at(".function.parameters"))),
    };
    Ok(Tool { name: name.to_string(), parameters })
}

fn valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tool_choice`: `auto` by default when tools are given, `none` without.
fn read_choice(value: Option<&Value>, tools: &[Tool]) -> Result<ToolChoice, ApiError> {
    let choice = match value.filter(|v| !v.is_null()) {
        None if tools.is_empty() => ToolChoice::None,
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                let m = format!("tool_choice {other:?} is not one of none, auto, required, or a named function");
                return Err(bad(m, "tool_choice"));
            }
        },
        Some(object) => {
            let name = object.pointer("/function/name").and_then(Value::as_str);
            match (object.get("type").and_then(Value::as_str), name) {
                (Some("function"), Some(name)) => ToolChoice::Named(name.to_string()),
                _ => {
                    let m = "a named tool_choice is {\"type\": \"function\", \"function\": {\"name\": ...}}";
                    return Err(bad(m, "tool_choice"));
                }
            }
        }
    };
    match &choice {
        ToolChoice::Required if tools.is_empty() => Err(bad("tool_choice \"required\" needs tools", "tool_choice")),
        ToolChoice::Named(name) if !tools.iter().any(|t| &t.name == name) => {
            Err(bad(format!("tool_choice names {name:?}, which is not among the tools"), "tool_choice"))
        }
        _ => Ok(choice),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn plan(tools: Value, choice: Option<Value>) -> Result<Option<ToolPlan>, ApiError> {
        plan_within(tools, choice, &RequestLimits::default())
    }

    fn plan_within(tools: Value, choice: Option<Value>, limits: &RequestLimits) -> Result<Option<ToolPlan>, ApiError> {
        let fields = ToolFields { tools: Some(&tools), tool_choice: choice.as_ref(), parallel_tool_calls: None };
        fields.plan(Endpoint::Chat, Some(ToolSyntax::Hermes), limits)
    }

    fn refused(result: Result<Option<ToolPlan>, ApiError>) -> String {
        let e = result.expect_err("refused");
        assert_eq!(e.status().as_u16(), 400, "{e}");
        e.param().expect("the field is named").to_string()
    }

    #[test]
    fn tools_parse_and_choices_decide_parsing_and_forcing() {
        let auto = plan(json!([weather()]), None).unwrap().unwrap();
        assert_eq!((auto.parse, auto.grammar.is_none()), (Some(ToolSyntax::Hermes), true));
        let none = plan(json!([weather()]), Some(json!("none"))).unwrap().unwrap();
        assert_eq!((none.parse, none.grammar.is_none()), (None, true));
        let required = plan(json!([weather()]), Some(json!("required"))).unwrap().unwrap();
        assert!(matches!(required.grammar, Some(GrammarSpec::Lark(ref g)) if g.contains("get_weather")));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert!(plan(json!([weather()]), Some(named)).unwrap().unwrap().grammar.is_some());
        assert!(plan(json!([]), None).unwrap().is_none(), "no tools, nothing to do");
        assert_eq!(auto.definitions, [weather()], "the template gets the tools as sent");
    }

    #[test]
    fn a_named_function_or_no_parallel_calls_writes_one_call() {
        let two_calls = |g: &Option<GrammarSpec>| matches!(g, Some(GrammarSpec::Lark(g)) if g.contains("block){0,"));
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        let forced = plan(json!([weather()]), Some(named.clone())).unwrap().unwrap();
        assert!(forced.grammar.is_some() && !two_calls(&forced.grammar), "{:?}", forced.grammar);
        assert_eq!(forced.stop_after_call, None, "the grammar itself ends after the call");
        let required = plan(json!([weather()]), Some(json!("required"))).unwrap().unwrap();
        assert!(two_calls(&required.grammar), "required may call several times: {:?}", required.grammar);
        let with = |choice: Option<Value>, parallel: Option<bool>| {
            let tools = json!([weather()]);
            let fields =
                ToolFields { tools: Some(&tools), tool_choice: choice.as_ref(), parallel_tool_calls: parallel };
            fields.plan(Endpoint::Chat, Some(ToolSyntax::Hermes), &RequestLimits::default()).unwrap().unwrap()
        };
        let single_required = with(Some(json!("required")), Some(false));
        assert!(single_required.grammar.is_some() && !two_calls(&single_required.grammar));
        assert_eq!(with(None, Some(false)).stop_after_call, Some("</tool_call>"));
        assert_eq!(with(None, Some(true)).stop_after_call, None);
        assert_eq!(with(None, None).stop_after_call, None);
        let llama =
            ToolFields { tools: Some(&json!([weather()])), tool_choice: None, parallel_tool_calls: Some(false) };
        let llama = llama.plan(Endpoint::Chat, Some(ToolSyntax::LlamaJson), &RequestLimits::default());
        assert_eq!(llama.unwrap().unwrap().stop_after_call, None, "Llama's answer is one call already");
    }

    #[test]
    fn bad_tools_and_choices_are_refused_by_field() {
        assert_eq!(refused(plan(json!({"a": 1}), None)), "tools");
        assert_eq!(refused(plan(json!([{"type": "retrieval"}]), None)), "tools[0].type");
        assert_eq!(refused(plan(json!([{"type": "function"}]), None)), "tools[0].function");
        let spaced = json!([weather(), {"type": "function", "function": {"name": "get weather"}}]);
        assert_eq!(refused(plan(spaced, None)), "tools[1].function.name");
        assert_eq!(refused(plan(json!([weather(), weather()]), None)), "tools[1].function.name");
        let bad_parameters = json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]);
        assert_eq!(refused(plan(bad_parameters, None)), "tools[0].function.parameters");
        assert_eq!(refused(plan(json!([weather()]), Some(json!("always")))), "tool_choice");
        let unknown = json!({"type": "function", "function": {"name": "get_time"}});
        assert_eq!(refused(plan(json!([weather()]), Some(unknown))), "tool_choice");
        assert_eq!(refused(plan(json!([]), Some(json!("required")))), "tool_choice");
        let fields = ToolFields { tools: Some(&json!([weather()])), tool_choice: None, parallel_tool_calls: None };
        let limits = RequestLimits::default();
        assert_eq!(refused(fields.plan(Endpoint::Completions, Some(ToolSyntax::Hermes), &limits)), "tools");
        assert_eq!(refused(fields.plan(Endpoint::Chat, None, &limits)), "tools");
    }

    #[test]
    fn tool_count_and_schema_size_are_bounded_by_the_limits() {
        let two = |i: usize| {
            let mut tool = weather();
            tool["function"]["name"] = json!(format!("tool_{i}"));
            tool
        };
        let tools = json!([two(0), two(1)]);
        let size = serde_json::to_string(&tools).unwrap().len();
        let limits = RequestLimits { max_tools: 2, max_tool_schema_bytes: size, ..RequestLimits::default() };
        assert!(plan_within(tools.clone(), None, &limits).unwrap().is_some(), "at both limits");
        let one_tool = RequestLimits { max_tools: 1, ..limits.clone() };
        assert_eq!(refused(plan_within(tools.clone(), None, &one_tool)), "tools");
        let smaller = RequestLimits { max_tool_schema_bytes: size - 1, ..limits };
        let error = plan_within(tools, None, &smaller).unwrap_err();
        assert!(error.to_string().contains("server.max_tool_schema_bytes"), "{error}");
    }
}

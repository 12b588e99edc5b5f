use serde_json::{json, Value};

use super::*;
use crate::constrain::tests::{compiler, random_walk};
use crate::constrain::GrammarSpec;
use crate::tokenize::test_support::asset_folder;
use crate::tokenize::TokenizerConfig;

fn call(name: &str, arguments: Value) -> ParsedPiece {
    ParsedPiece::Call(ToolCall { name: name.into(), arguments: arguments.to_string() })
}

fn content(text: &str) -> ParsedPiece {
    ParsedPiece::Content(text.into())
}

/// Adjacent content pieces joined: how the text was cut must not matter beyond that.
fn merged(pieces: Vec<ParsedPiece>) -> Vec<ParsedPiece> {
    let mut out: Vec<ParsedPiece> = Vec::new();
    for piece in pieces {
        match (out.last_mut(), piece) {
            (Some(ParsedPiece::Content(last)), ParsedPiece::Content(text)) => last.push_str(&text),
            (_, piece) => out.push(piece),
        }
    }
    out
}

/// Parses `output` whole, then cut at every character, and checks both agree.
fn parse(syntax: ToolSyntax, output: &str) -> Vec<ParsedPiece> {
    parse_ended(syntax, output, ToolCallParser::finish)
}

/// As [`parse`], for output the token budget cut.
fn parse_cut(syntax: ToolSyntax, output: &str) -> Vec<ParsedPiece> {
    parse_ended(syntax, output, ToolCallParser::finish_cut)
}

fn parse_ended(syntax: ToolSyntax, output: &str, end: fn(&mut ToolCallParser) -> Vec<ParsedPiece>) -> Vec<ParsedPiece> {
    let mut whole = ToolCallParser::new(syntax);
    let mut pieces = whole.push(output);
    pieces.extend(end(&mut whole));
    let mut by_char = ToolCallParser::new(syntax);
    let mut cut = Vec::new();
    for c in output.chars() {
        cut.extend(by_char.push(&c.to_string()));
    }
    cut.extend(end(&mut by_char));
    let pieces = merged(pieces);
    assert_eq!(merged(cut), pieces, "cutting {output:?} into characters changed the result");
    pieces
}

#[test]
fn hermes_blocks_become_calls_and_the_rest_stays_content() {
    let hermes = |s: &str| parse(ToolSyntax::Hermes, s);
    assert_eq!(hermes("Just text, no <tool> here."), [content("Just text, no <tool> here.")]);
    let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    assert_eq!(hermes(one), [call("get_weather", json!({"city": "Paris"}))]);
    let two = format!("Let me check.\n{one}\n<tool_call>\n{{\"name\": \"time\", \"arguments\": {{}}}}\n</tool_call>\n");
    assert_eq!(
        hermes(&two),
        [content("Let me check."), call("get_weather", json!({"city": "Paris"})), call("time", json!({}))]
    );
    // Arguments written as a JSON string holding the object read the same.
    let stringly = "<tool_call>{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}</tool_call>";
    assert_eq!(hermes(stringly), [call("f", json!({"x": 1}))]);
}

#[test]
fn hermes_blocks_that_are_not_calls_are_passed_on_as_content() {
    let hermes = |s: &str| parse(ToolSyntax::Hermes, s);
    let broken = "<tool_call>\n{\"name\": \"f\", \"arguments\": {\n</tool_call> after";
    assert_eq!(hermes(broken), [content(broken)]);
    let no_name = "<tool_call>{\"arguments\": {}}</tool_call>";
    assert_eq!(hermes(no_name), [content(no_name)]);
    // The output ended inside a block: a readable body is a call, anything else content.
    assert_eq!(hermes("<tool_call>\n{\"name\": \"f\", \"arguments\": {}}"), [call("f", json!({}))]);
    assert_eq!(
        hermes("ok <tool_call>\n{\"name\": \"f\", \"argu"),
        [content("ok <tool_call>\n{\"name\": \"f\", \"argu")]
    );
    // A tag cut short at the end is text.
    assert_eq!(hermes("see <tool_ca"), [content("see <tool_ca")]);
}

#[test]
fn whitespace_around_calls_is_separation_not_content() {
    let block = "<tool_call>{\"name\": \"f\", \"arguments\": {}}</tool_call>";
    let pieces = parse(ToolSyntax::Hermes, &format!("\n\n{block}\n\n{block}\n"));
    assert_eq!(pieces, [call("f", json!({})), call("f", json!({}))]);
    let pieces = parse(ToolSyntax::Hermes, &format!("{block}\n\nDone."));
    assert_eq!(pieces, [call("f", json!({})), content("Done.")]);
    // Without calls, whitespace is the model's text like any other.
    assert_eq!(parse(ToolSyntax::Hermes, "a\n\n"), [content("a\n\n")]);
}

#[test]
fn llama_answers_that_are_a_json_call_become_calls() {
    let llama = |s: &str| parse(ToolSyntax::LlamaJson, s);
    let one = "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}";
    assert_eq!(llama(one), [call("get_weather", json!({"city": "Paris"}))]);
    assert_eq!(llama(&format!("<|python_tag|>{one}")), [call("get_weather", json!({"city": "Paris"}))]);
    let paris = || call("get_weather", json!({"city": "Paris"}));
    assert_eq!(llama(&format!("  {one}; {one}")), [paris(), paris()]);
    assert_eq!(llama("The weather is fine."), [content("The weather is fine.")]);
    assert_eq!(llama("{\"not\": \"a call\"}"), [content("{\"not\": \"a call\"}")]);
    assert_eq!(llama("<|python"), [content("<|python")]);
}

#[test]
fn the_real_templates_name_their_syntax() {
    assert_eq!(ToolSyntax::of_template(None), ToolSyntax::Hermes);
    assert_eq!(ToolSyntax::of_template(Some("{{ messages[0].content }}")), ToolSyntax::Hermes);
    for (model, file, syntax) in [
        ("qwen3", "tokenizer_config.json", ToolSyntax::Hermes),
        ("llama3", "chat_template.jinja", ToolSyntax::LlamaJson),
    ] {
        let Some(folder) = asset_folder(model, file) else { continue };
        let config = TokenizerConfig::from_folder(&folder).unwrap();
        let source = config.chat_template.as_deref().expect("a chat template");
        assert_eq!(ToolSyntax::of_template(Some(source)), syntax, "{model}");
        assert!(template_takes_tools(source), "{model}");
    }
}

fn weather_tools() -> Vec<Tool> {
    vec![
        Tool {
            name: "get_weather".into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 12},
                    "unit": {"enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city", "unit"],
            }),
        },
        Tool {
            name: "get_time".into(),
            parameters: json!({"type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}}, "required": ["zone"]}),
        },
    ]
}

fn check_arguments(call: &ToolCall) {
    let arguments: Value = serde_json::from_str(&call.arguments).unwrap();
    match call.name.as_str() {
        "get_weather" => {
            assert!(arguments["city"].as_str().is_some_and(|c| c.chars().count() <= 12), "{arguments}");
            assert!(arguments["unit"] == "celsius" || arguments["unit"] == "fahrenheit", "{arguments}");
        }
        "get_time" => assert!(arguments["zone"].as_i64().is_some_and(|z| (-12..=14).contains(&z)), "{arguments}"),
        other => panic!("a call to {other}, which is not a tool"),
    }
}

/// A model that knows nothing (a uniform pick among the allowed tokens) still writes
/// calls the parser reads, to the right tool, with arguments matching its schema.
#[test]
fn forced_calls_from_random_walks_parse_and_match_their_schema() {
    let Some((compiler, tokenizer)) = compiler() else { return };
    let tools = weather_tools();
    let cases = [
        (ToolSyntax::Hermes, ToolChoice::Required, false),
        (ToolSyntax::Hermes, ToolChoice::Named("get_time".into()), false),
        (ToolSyntax::Hermes, ToolChoice::Required, true),
        (ToolSyntax::LlamaJson, ToolChoice::Required, false),
        (ToolSyntax::LlamaJson, ToolChoice::Named("get_weather".into()), false),
    ];
    for (syntax, choice, parallel) in cases {
        let lark = forcing_grammar(syntax, &tools, &choice, parallel).expect("a forced choice has a grammar");
        for seed in 0..6 {
            let constraint = compiler.compile(&GrammarSpec::Lark(lark.clone()), tokenizer.eos_token_ids()).unwrap();
            let walk = random_walk(&constraint, &tokenizer, seed, 400);
            assert!(walk.ended, "{syntax:?} {choice:?} seed {seed}: no end within 400 tokens: {}", walk.text);
            let mut parser = ToolCallParser::new(syntax);
            let mut pieces = parser.push(&walk.text);
            pieces.extend(parser.finish());
            let calls: Vec<&ToolCall> = pieces
                .iter()
                .map(|p| match p {
                    ParsedPiece::Call(call) => call,
                    ParsedPiece::Content(text) => panic!("{syntax:?} {choice:?}: content {text:?} in {}", walk.text),
                })
                .collect();
            assert!(!calls.is_empty() && (parallel || calls.len() == 1), "{}", walk.text);
            for call in calls {
                check_arguments(call);
                if let ToolChoice::Named(name) = &choice {
                    assert_eq!(&call.name, name);
                }
            }
        }
    }
    let auto = forcing_grammar(ToolSyntax::Hermes, &tools, &ToolChoice::Auto, true);
    assert!(auto.is_none() && forcing_grammar(ToolSyntax::Hermes, &tools, &ToolChoice::None, true).is_none());
}

#[test]
fn templates_without_tools_get_them_as_hermes_instructions() {
    let tools = [json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}})];
    let text = hermes_instructions(&tools);
    assert!(text.contains("<tools>\n{\"type\":\"function\",\"function\":{\"name\":\"f\""), "{text}");
    assert!(text.ends_with("</tool_call>"), "{text}");
    let blocks = hermes_blocks(&[("f".into(), json!({"x": 1})), ("g".into(), json!({}))]);
    let mut parser = ToolCallParser::new(ToolSyntax::Hermes);
    let mut pieces = parser.push(&blocks);
    pieces.extend(parser.finish());
    assert_eq!(pieces, [call("f", json!({"x": 1})), call("g", json!({}))], "the blocks read back as the calls");
}

#[test]
fn a_call_the_budget_cut_off_is_dropped_never_content() {
    let one = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
    let cut_off = format!("Checking.\n{one}\n<tool_call>\n{{\"name\": \"get_weather\", \"argum");
    assert_eq!(
        parse_cut(ToolSyntax::Hermes, &cut_off),
        [content("Checking."), call("get_weather", json!({"city": "Paris"}))]
    );
    // Ended by itself inside a block: the model's own text, passed on as content.
    let stopped = parse(ToolSyntax::Hermes, &cut_off);
    assert!(matches!(stopped.last(), Some(ParsedPiece::Content(t)) if t.contains("<tool_call>")), "{stopped:?}");
    // Cut inside a block whose body already reads as a call: the call stands.
    let whole_body = "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}";
    assert_eq!(parse_cut(ToolSyntax::Hermes, whole_body), [call("f", json!({}))]);
    // Plain text cut by the budget stays text.
    assert_eq!(parse_cut(ToolSyntax::Hermes, "It is sunny in Par"), [content("It is sunny in Par")]);
    // Llama: a call cut off is dropped; an answer that is only brace-led text is kept.
    assert_eq!(parse_cut(ToolSyntax::LlamaJson, "{\"name\": \"get_weather\", \"parameters\": {\"ci"), []);
    assert_eq!(parse_cut(ToolSyntax::LlamaJson, "<|python_tag|>{\"na"), []);
    assert_eq!(parse_cut(ToolSyntax::LlamaJson, "{x} is a set"), [content("{x} is a set")]);
}

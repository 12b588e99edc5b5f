use super::*;

fn param(result: Result<impl std::fmt::Debug, ApiError>) -> Option<String> {
    let e = result.expect_err("refused");
    assert_eq!(e.status().as_u16(), 400, "{e}");
    e.param().map(str::to_string)
}

fn fields(json: Value) -> BTreeMap<String, Value> {
    serde_json::from_value(json).unwrap()
}

#[test]
fn unimplemented_fields_are_refused_by_name_and_hints_pass() {
    for field in ["suffix", "functions", "function_call", "audio", "prediction", "wizardry"] {
        let body = fields(serde_json::json!({ field: [{"x": 1}] }));
        assert_eq!(param(refuse_unknown(&body)).as_deref(), Some(field));
    }
    let hints = fields(serde_json::json!({
        "metadata": {"a": "b"}, "store": false, "service_tier": "auto",
        "modalities": ["text"], "functions": [], "suffix": null,
    }));
    assert!(refuse_unknown(&hints).is_ok());
    let audio_out = fields(serde_json::json!({"modalities": ["text", "audio"]}));
    assert_eq!(param(refuse_unknown(&audio_out)).as_deref(), Some("modalities"));
}

const ANY_SIZE: usize = usize::MAX;

#[test]
fn response_formats_become_grammars() {
    let g = |v: Value| grammar_of(Some(&v), ANY_SIZE);
    assert_eq!(g(serde_json::json!({"type": "text"})).unwrap(), None);
    assert_eq!(g(serde_json::json!({"type": "json_object"})).unwrap(), Some(GrammarSpec::JsonObject));
    let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let format =
        serde_json::json!({"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}});
    assert_eq!(g(format).unwrap(), Some(GrammarSpec::JsonSchema { schema, strict: true }));
    assert_eq!(g(serde_json::json!({"type": "regex", "regex": "a+"})).unwrap(), Some(GrammarSpec::Regex("a+".into())));
    let lark = serde_json::json!({"type": "grammar", "grammar": "start: \"yes\" | \"no\""});
    assert!(matches!(g(lark).unwrap(), Some(GrammarSpec::Lark(_))));
    assert_eq!(grammar_of(None, ANY_SIZE).unwrap(), None);
}

#[test]
fn bad_response_formats_name_the_part_at_fault() {
    let g = |v: Value| param(grammar_of(Some(&v), ANY_SIZE));
    assert_eq!(g(serde_json::json!({"type": "xml"})).as_deref(), Some("response_format.type"));
    assert_eq!(g(serde_json::json!({})).as_deref(), Some("response_format.type"));
    assert_eq!(g(serde_json::json!({"type": "json_schema"})).as_deref(), Some("response_format"));
    let no_schema = serde_json::json!({"type": "json_schema", "json_schema": {"name": "x"}});
    assert_eq!(g(no_schema).as_deref(), Some("response_format.json_schema.schema"));
}

#[test]
fn grammars_over_the_size_limit_are_refused_naming_their_field() {
    let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let size = serde_json::to_string(&schema).unwrap().len();
    let format = serde_json::json!({"type": "json_schema", "json_schema": {"schema": schema}});
    assert!(grammar_of(Some(&format), size).unwrap().is_some(), "at the limit");
    let refused = grammar_of(Some(&format), size - 1).unwrap_err();
    assert_eq!(refused.param(), Some("response_format.json_schema.schema"));
    assert!(refused.to_string().contains("server.max_grammar_bytes"), "{refused}");
    let regex = serde_json::json!({"type": "regex", "regex": "a".repeat(9)});
    assert_eq!(param(grammar_of(Some(&regex), 8)).as_deref(), Some("response_format.regex"));
    let lark = serde_json::json!({"type": "grammar", "grammar": "start: \"yes\""});
    assert_eq!(param(grammar_of(Some(&lark), 8)).as_deref(), Some("response_format.grammar"));
    assert!(grammar_of(Some(&serde_json::json!({"type": "json_object"})), 0).unwrap().is_some());
}

#[test]
fn template_kwargs_may_not_shadow_the_templates_own_variables() {
    let kwargs = |v: Value| v.as_object().unwrap().clone();
    assert!(check_template_kwargs(Some(&kwargs(serde_json::json!({"enable_thinking": false})))).is_ok());
    assert!(check_template_kwargs(None).is_ok());
    for key in ["messages", "tools", "add_generation_prompt", "bos_token", "eos_token"] {
        let shadowing = kwargs(serde_json::json!({"enable_thinking": false, key: "x"}));
        assert_eq!(param(check_template_kwargs(Some(&shadowing))), Some(format!("chat_template_kwargs.{key}")));
    }
}

#[test]
fn logit_bias_is_read_and_bounded() {
    let bias = |v: Value| serde_json::from_value::<BTreeMap<String, f64>>(v).unwrap();
    let read = logit_bias_of(Some(&bias(serde_json::json!({"5": 100, "7": -2.5}))), Some(10)).unwrap();
    assert_eq!(read, vec![(5, 100.0), (7, -2.5)]);
    for bad in [serde_json::json!({"x": 1}), serde_json::json!({"10": 1}), serde_json::json!({"3": 101})] {
        assert_eq!(param(logit_bias_of(Some(&bias(bad)), Some(10))).as_deref(), Some("logit_bias"));
    }
    assert!(logit_bias_of(None, Some(10)).unwrap().is_empty());
}

#[test]
fn unknown_roles_are_refused_and_developer_is_system() {
    let mut messages = vec![ChatMessage::new("developer", "be brief"), ChatMessage::new("user", "hi")];
    check_roles(&mut messages).unwrap();
    assert_eq!(messages[0].role, "system");
    let mut wizard = vec![ChatMessage::new("user", "hi"), ChatMessage::new("wizard", "abracadabra")];
    assert_eq!(param(check_roles(&mut wizard)).as_deref(), Some("messages[1].role"));
}

#[test]
fn forwarded_grammars_and_biases_read_back_as_sent() {
    let schema = serde_json::json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    for spec in [
        GrammarSpec::JsonObject,
        GrammarSpec::JsonSchema { schema, strict: true },
        GrammarSpec::Lark("start: \"a\"".into()),
        GrammarSpec::Regex("[0-9]+".into()),
    ] {
        assert_eq!(grammar_of(Some(&response_format_of(&spec)), ANY_SIZE).unwrap(), Some(spec));
    }
    let bias = vec![(5, 100.0), (7, -2.5)];
    let json: BTreeMap<String, f64> = serde_json::from_value(logit_bias_json(&bias)).unwrap();
    assert_eq!(logit_bias_of(Some(&json), None).unwrap(), bias);
}

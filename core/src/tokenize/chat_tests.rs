//! Tests of `ChatTemplate`: the real Qwen3 and Llama-3.2 templates against transformers' renderings
//! (tests/fixtures/chat), then the Jinja features HF templates rely on, one by one.

use std::path::PathBuf;

use serde::Deserialize;

use super::*;
use crate::tokenize::test_support::asset_folder;

fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/chat")
}

#[derive(Deserialize)]
struct Cases {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    model: String,
    messages: Vec<ChatMessage>,
    add_generation_prompt: bool,
    #[serde(default)]
    kwargs: serde_json::Map<String, serde_json::Value>,
    now_unix: Option<i64>,
    #[serde(default)]
    tools: Option<Vec<serde_json::Value>>,
}

/// The folder holding `model`'s template, or None (with the reason printed) when it was not fetched.
fn template_folder(model: &str) -> Option<PathBuf> {
    match model {
        "llama3" => asset_folder("llama3", "chat_template.jinja"),
        other => asset_folder(other, "tokenizer_config.json"),
    }
}

fn render_case(case: &Case, folder: &std::path::Path) -> String {
    let mut template = ChatTemplate::from_folder(folder).unwrap();
    if let Some(now) = case.now_unix {
        template = template.with_fixed_time(now);
    }
    let options = RenderOptions {
        add_generation_prompt: case.add_generation_prompt,
        extra: case.kwargs.clone(),
        tools: case.tools.clone(),
    };
    template.render(&case.messages, &options).unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

#[test]
fn real_templates_render_exactly_like_transformers() {
    let text = std::fs::read_to_string(fixtures_dir().join("cases.json")).unwrap();
    let cases: Cases = serde_json::from_str(&text).unwrap();
    let mut checked = 0;
    for case in &cases.cases {
        let Some(folder) = template_folder(&case.model) else { continue };
        let expected = std::fs::read_to_string(fixtures_dir().join(format!("{}.txt", case.name))).unwrap();
        let rendered = render_case(case, &folder);
        assert_eq!(
            rendered, expected,
            "case {}:\n--- ours ---\n{rendered}\n--- transformers ---\n{expected}",
            case.name
        );
        checked += 1;
    }
    eprintln!("{checked} of {} chat cases checked against transformers", cases.cases.len());
}

#[test]
fn content_parts_render_like_the_joined_string() {
    let Some(folder) = template_folder("qwen3") else { return };
    let template = ChatTemplate::from_folder(&folder).unwrap();
    let parts: ChatMessage = serde_json::from_str(
        r#"{"role": "user", "content": [{"type": "text", "text": "Line one"}, {"type": "text", "text": "line two"}]}"#,
    )
    .unwrap();
    let options = RenderOptions::default();
    assert_eq!(
        template.render(&[parts], &options).unwrap(),
        template.render(&[ChatMessage::new("user", "Line one\nline two")], &options).unwrap()
    );
}

#[test]
fn llama_template_without_fixed_time_uses_todays_date() {
    let Some(folder) = template_folder("llama3") else { return };
    let template = ChatTemplate::from_folder(&folder).unwrap();
    let rendered = template.render(&[ChatMessage::new("user", "Hi")], &RenderOptions::default()).unwrap();
    let today = strftime::strftime("%d %b %Y", strftime::unix_now()).unwrap();
    assert!(rendered.contains(&format!("Today Date: {today}\n")), "{rendered}");
}

fn inline(source: &str) -> ChatTemplate {
    let special = SpecialTokens { bos: Some("<s>".into()), eos: Some("</s>".into()), ..Default::default() };
    ChatTemplate::new(source, special).unwrap()
}

fn render_inline(source: &str, messages: &[ChatMessage]) -> Result<String, TokenizeError> {
    inline(source).render(messages, &RenderOptions { add_generation_prompt: true, ..Default::default() })
}

#[test]
fn special_tokens_and_generation_prompt_are_variables() {
    let source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{{ eos_token }}{% endfor %}\
                  {% if add_generation_prompt %}[assistant]{% endif %}|{{ pad_token }}|{{ tools is none }}";
    let rendered = render_inline(source, &[ChatMessage::new("user", "hi")]).unwrap();
    assert_eq!(rendered, "<s>[user]hi</s>[assistant]||True");
}

#[test]
fn trim_and_lstrip_blocks_are_on_like_transformers() {
    let source = "{% for m in messages %}\n    {% if true %}\n{{ m.content }}\n    {% endif %}\n{% endfor %}\n";
    assert_eq!(render_inline(source, &[ChatMessage::new("user", "x")]).unwrap(), "x\n");
}

#[test]
fn raise_exception_is_a_client_error_with_the_templates_message() {
    let source = "{% if messages[0].role != 'system' %}{{ raise_exception('System first!') }}{% endif %}";
    let err = render_inline(source, &[ChatMessage::new("user", "x")]).unwrap_err();
    assert!(matches!(&err, TokenizeError::TemplateRaised(m) if m == "System first!"), "{err:?}");
    assert!(err.is_client_error());
}

#[test]
fn syntax_and_render_errors_are_values_not_panics() {
    let err = ChatTemplate::new("{% for m in messages %}", SpecialTokens::default()).unwrap_err();
    assert!(matches!(err, TokenizeError::TemplateSyntax(_)), "{err:?}");
    let err =
        render_inline("{{ messages[0].content.no_such_method() }}", &[ChatMessage::new("user", "x")]).unwrap_err();
    assert!(matches!(err, TokenizeError::TemplateRender(_)), "{err:?}");
    assert!(!err.is_client_error());
    let err = ChatTemplate::from_config(&TokenizerConfig::default()).unwrap_err();
    assert!(matches!(err, TokenizeError::NoChatTemplate), "{err:?}");
}

#[test]
fn python_string_methods_and_slices_work() {
    let source = "{% set c = messages[0].content %}{{ c.split('</think>')[-1].lstrip('\\n') }}|\
                  {{ c.startswith('<think>') }}|{{ ' x\\n'.strip() }}|{{ 'a-b'.replace('-', '+') }}|\
                  {{ (messages[::-1] | first).role }}|{{ 'ab'.upper() }}";
    let messages = [ChatMessage::new("user", "<think>r</think>\n\nanswer"), ChatMessage::new("assistant", "y")];
    assert_eq!(render_inline(source, &messages).unwrap(), "answer|True|x|a+b|assistant|AB");
}

#[test]
fn loop_controls_and_namespaces_work() {
    let source = "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}\
                  {% if m.role == 'stop' %}{% break %}{% endif %}{% set ns.n = ns.n + 1 %}{{ m.content }}{% endfor %}={{ ns.n }}";
    let messages = ["a", "b", "c", "stop", "d"].map(|c| ChatMessage::new(if c == "stop" { "stop" } else { "user" }, c));
    assert_eq!(render_inline(source, &messages).unwrap(), "ac=2");
}

#[test]
fn tojson_is_pythons_json_dumps() {
    // Message fields keep their order. (Dict literals are key-sorted by minijinja unless its
    // `preserve_order` feature is on, hence sorted keys in the literal here.)
    let source = "{{ {'args': [1, 2.0, '<x>'], 'name': 'f'} | tojson }}|{{ messages[0] | tojson }}";
    assert_eq!(
        render_inline(source, &[ChatMessage::new("user", "é")]).unwrap(),
        r#"{"args": [1, 2.0, "<x>"], "name": "f"}|{"role": "user", "content": "é"}"#
    );
}

#[test]
fn strftime_now_follows_the_fixed_clock() {
    let template = inline("{{ strftime_now('%d %b %Y') }}").with_fixed_time(1_741_944_413);
    assert_eq!(template.render(&[], &RenderOptions::default()).unwrap(), "14 Mar 2025");
}

#[test]
fn extra_variables_reach_the_template() {
    let mut options = RenderOptions::default();
    options.extra.insert("enable_thinking".into(), false.into());
    let template = inline("{% if enable_thinking is defined and enable_thinking is false %}off{% endif %}");
    assert_eq!(template.render(&[], &options).unwrap(), "off");
}

#[test]
fn extras_cannot_shadow_the_messages_tools_or_special_tokens() {
    let source = "{{ bos_token }}{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}|{{ tools is none }}\
                  |{{ add_generation_prompt }}|{{ documents is none }}|{{ eos_token }}{{ pad_token }}";
    let mut options = RenderOptions { add_generation_prompt: true, ..Default::default() };
    let shadows = serde_json::json!({ "messages": [{"role": "system", "content": "obey"}], "tools": [1],
        "add_generation_prompt": false, "documents": [2], "bos_token": "B", "eos_token": "E", "pad_token": "P" });
    options.extra = shadows.as_object().unwrap().clone();
    options.extra.insert("enable_thinking".into(), false.into());
    let rendered = inline(source).render(&[ChatMessage::new("user", "hi")], &options).unwrap();
    assert_eq!(rendered, "<s>[user]hi|True|True|True|</s>");
}

#[test]
fn unsupported_content_parts_are_client_errors() {
    let message: ChatMessage =
        serde_json::from_str(r#"{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}"#)
            .unwrap();
    let err = render_inline("{{ messages[0].content }}", &[message]).unwrap_err();
    assert!(matches!(err, TokenizeError::UnsupportedContent(_)) && err.is_client_error(), "{err:?}");
}

#[test]
fn null_content_and_reasoning_alias_are_accepted() {
    let message: ChatMessage =
        serde_json::from_str(r#"{"role": "assistant", "content": null, "reasoning": "r"}"#).unwrap();
    let source = "[{{ messages[0].content }}]{{ messages[0].reasoning_content }}{{ messages[0].thinking }}";
    assert_eq!(render_inline(source, &[message]).unwrap(), "[]rr");
}

#[test]
fn generation_tags_render_their_body() {
    let source = "{% for m in messages %}{%- generation -%} {{ m.content }} {%- endgeneration %}{% endfor %}";
    assert_eq!(render_inline(source, &[ChatMessage::new("assistant", "ok")]).unwrap(), "ok");
    assert_eq!(neutralize_generation_tags("{% if x %}{%generation%}"), "{% if x %}{%if true%}");
}

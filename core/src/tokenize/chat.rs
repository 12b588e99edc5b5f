//! `ChatTemplate`: renders a model folder's HF chat template with minijinja, set up to behave like the
//! Jinja2 environment transformers builds (`trim_blocks`, `lstrip_blocks`, loop controls, Python string
//! methods, `raise_exception`, Python's `tojson`, `strftime_now`), so the prompt — and so the token ids —
//! equal what the model was trained with. Tools go to templates that take them as `tools`; a template
//! that knows none gets them as Hermes-style instructions in the system message (see [`crate::tools`]).

use std::path::Path;

use minijinja::value::Value;
use minijinja::{Environment, Error, ErrorKind};
use serde::{Deserialize, Serialize};

use super::config::{SpecialTokens, TokenizerConfig};
use super::error::TokenizeError;
use super::{pyjson, strftime};
use crate::tools;

const TEMPLATE_NAME: &str = "chat_template";

/// One OpenAI-style chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// Absent or null for e.g. an assistant turn that only called tools; renders as "".
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// Reasoning of an earlier assistant turn (Qwen3's template re-wraps it in `<think>`).
    #[serde(default, alias = "reasoning", skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// The calls an earlier assistant turn made.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<MessageToolCall>>,
    /// A `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the function that answered (some templates show it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }
}

/// One call of an assistant turn, in OpenAI's shape.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    /// OpenAI sends a string of JSON; an object is accepted too.
    pub arguments: serde_json::Value,
}

fn function_type() -> String {
    "function".into()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

/// A content part; only `{"type": "text", "text": ...}` is supported for now.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

/// The variables a template gets from the request and the tokenizer (see `ChatTemplate::context`),
/// which [`RenderOptions::extra`] may not shadow.
pub const BUILT_IN_VARIABLES: &[&str] =
    &["messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token", "pad_token", "unk_token"];

/// Per-request rendering choices.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Append the header of the assistant turn the model should write.
    pub add_generation_prompt: bool,
    /// Extra template variables (`chat_template_kwargs`), e.g. `enable_thinking: false` for Qwen3 or
    /// `date_string` for Llama-3.x. Those named like a [`BUILT_IN_VARIABLES`] entry are left out: the
    /// messages, tools and special tokens come from the request and the tokenizer, never from extras
    /// (that would let a client slip past the checks made on them).
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The tools the model may call, in OpenAI's shape (`{"type": "function", "function": {...}}`).
    pub tools: Option<Vec<serde_json::Value>>,
}

/// What the template sees of a message: content already flattened to a string, because most
/// templates (Qwen3's and Llama-3's among them) concatenate `message.content` as a string.
#[derive(Serialize)]
struct TemplateMessage<'a> {
    role: &'a str,
    content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    /// transformers fills this alias for templates (gpt-oss) that read `thinking`.
    #[serde(skip_serializing_if = "Option::is_none")]
    thinking: Option<&'a str>,
    /// Absent, not empty, without calls: Llama-3's template tests `'tool_calls' in message`.
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Vec<TemplateToolCall<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a str>,
}

/// A call as templates read it: arguments as a mapping (Llama-3's template writes them
/// with `tojson`, Qwen3's accepts either), as transformers users and vLLM pass them.
#[derive(Serialize)]
struct TemplateToolCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a str>,
    #[serde(rename = "type")]
    kind: &'a str,
    function: TemplateFunction<'a>,
}

#[derive(Serialize)]
struct TemplateFunction<'a> {
    name: &'a str,
    arguments: serde_json::Value,
}

pub struct ChatTemplate {
    env: Environment<'static>,
    special: SpecialTokens,
    /// The template renders `tools` itself.
    takes_tools: bool,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate").field("special", &self.special).finish_non_exhaustive()
    }
}

/// Marks errors raised by the template itself, so they map to the client (HTTP 400).
#[derive(Debug)]
struct RaisedByTemplate;

impl std::fmt::Display for RaisedByTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("raised by the chat template")
    }
}

impl std::error::Error for RaisedByTemplate {}

impl ChatTemplate {
    /// Compiles `source`; `special` provides the `bos_token`/`eos_token`/... variables.
    pub fn new(source: &str, special: SpecialTokens) -> Result<Self, TokenizeError> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_template_owned(TEMPLATE_NAME, neutralize_generation_tags(source))
            .map_err(|e| TokenizeError::TemplateSyntax(describe(&e)))?;
        let template = Self { env, special, takes_tools: tools::template_takes_tools(source) };
        Ok(template.with_clock(strftime::unix_now))
    }

    /// The folder's template: `chat_template.jinja`, else `tokenizer_config.json`'s `chat_template`.
    pub fn from_folder(folder: &Path) -> Result<Self, TokenizeError> {
        Self::from_config(&TokenizerConfig::from_folder(folder)?)
    }

    pub fn from_config(config: &TokenizerConfig) -> Result<Self, TokenizeError> {
        let source = config.chat_template.as_deref().ok_or(TokenizeError::NoChatTemplate)?;
        Self::new(source, config.special.clone())
    }

    /// Makes `strftime_now` report a fixed instant (seconds since the Unix epoch, UTC), for tests and
    /// reproducible prompts.
    pub fn with_fixed_time(self, unix_seconds: i64) -> Self {
        self.with_clock(move || unix_seconds)
    }

    fn with_clock(mut self, clock: impl Fn() -> i64 + Send + Sync + 'static) -> Self {
        self.env.add_function("strftime_now", move |format: String| {
            strftime::strftime(&format, clock()).map_err(|detail| Error::new(ErrorKind::InvalidOperation, detail))
        });
        self
    }

    /// The prompt text for `messages`. Encode it with `add_special_tokens = false`: the template already
    /// writes the BOS text where the model wants it.
    pub fn render(&self, messages: &[ChatMessage], options: &RenderOptions) -> Result<String, TokenizeError> {
        if let (Some(tools), false) = (&options.tools, self.takes_tools) {
            let messages = tools_as_instructions(messages, tools);
            let options = RenderOptions { tools: None, ..options.clone() };
            return self.render(&messages, &options);
        }
        let messages = messages.iter().map(template_message).collect::<Result<Vec<_>, _>>()?;
        let template = self.env.get_template(TEMPLATE_NAME).map_err(|e| TokenizeError::TemplateRender(describe(&e)))?;
        template.render(self.context(messages, options)).map_err(classify_render_error)
    }

    /// The variables transformers passes: messages, tools, documents, add_generation_prompt, the
    /// special-token strings that are set, then the caller's extras that shadow none of these.
    fn context(&self, messages: Vec<TemplateMessage<'_>>, options: &RenderOptions) -> Value {
        let mut vars: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from_serialize(&messages)),
            ("tools".into(), options.tools.as_ref().map_or(Value::from(()), Value::from_serialize)),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(options.add_generation_prompt)),
        ];
        let special = [
            ("bos_token", &self.special.bos),
            ("eos_token", &self.special.eos),
            ("pad_token", &self.special.pad),
            ("unk_token", &self.special.unk),
        ];
        // Unset tokens stay undefined (render as ""), as transformers leaves them out of the variables.
        vars.extend(special.into_iter().filter_map(|(name, token)| Some((name.into(), Value::from(token.clone()?)))));
        let extra = options.extra.iter().filter(|(k, _)| !BUILT_IN_VARIABLES.contains(&k.as_str()));
        vars.extend(extra.map(|(k, v)| (k.clone(), Value::from_serialize(v))));
        vars.into_iter().collect()
    }
}

fn template_message(message: &ChatMessage) -> Result<TemplateMessage<'_>, TokenizeError> {
    let content = match &message.content {
        None => String::new(),
        Some(MessageContent::Text(text)) => text.clone(),
        Some(MessageContent::Parts(parts)) => flatten_text_parts(parts)?,
    };
    let reasoning = message.reasoning_content.as_deref();
    let tool_calls = message.tool_calls.as_ref().map(|calls| calls.iter().map(template_tool_call).collect());
    Ok(TemplateMessage {
        role: &message.role,
        content,
        reasoning_content: reasoning,
        thinking: reasoning,
        tool_calls,
        tool_call_id: message.tool_call_id.as_deref(),
        name: message.name.as_deref(),
    })
}

fn template_tool_call(call: &MessageToolCall) -> TemplateToolCall<'_> {
    let function =
        TemplateFunction { name: &call.function.name, arguments: arguments_object(&call.function.arguments) };
    TemplateToolCall { id: call.id.as_deref(), kind: &call.kind, function }
}

/// Arguments as a mapping where the string holds JSON; otherwise as given.
fn arguments_object(arguments: &serde_json::Value) -> serde_json::Value {
    match arguments {
        serde_json::Value::String(text) => serde_json::from_str(text).unwrap_or_else(|_| arguments.clone()),
        other => other.clone(),
    }
}

/// For a template that knows no tools: the tools described in the system message,
/// earlier calls written as Hermes blocks, tool results as user turns wrapped in
/// `<tool_response>` (as Qwen's templates render them).
fn tools_as_instructions(messages: &[ChatMessage], tools: &[serde_json::Value]) -> Vec<ChatMessage> {
    let instructions = tools::hermes_instructions(tools);
    let mut out = Vec::with_capacity(messages.len() + 1);
    match messages.first().filter(|m| m.role == "system") {
        Some(system) => {
            let text = template_message(system).map(|m| m.content).unwrap_or_default();
            out.push(ChatMessage::new("system", &format!("{text}\n\n{instructions}")));
        }
        None => out.push(ChatMessage::new("system", &instructions)),
    }
    let has_system = messages.first().is_some_and(|m| m.role == "system");
    for message in messages.iter().skip(usize::from(has_system)) {
        let mut message = message.clone();
        if let Some(calls) = message.tool_calls.take() {
            let calls: Vec<_> =
                calls.iter().map(|c| (c.function.name.clone(), arguments_object(&c.function.arguments))).collect();
            let text = template_message(&message).map(|m| m.content).unwrap_or_default();
            let blocks = tools::hermes_blocks(&calls);
            let joined = if text.is_empty() { blocks } else { format!("{text}\n{blocks}") };
            message.content = Some(MessageContent::Text(joined));
        }
        if message.role == "tool" {
            let text = template_message(&message).map(|m| m.content).unwrap_or_default();
            message = ChatMessage::new("user", &format!("<tool_response>\n{text}\n</tool_response>"));
        }
        out.push(message);
    }
    out
}

/// Text parts joined by newlines (as vLLM does for string-content templates).
fn flatten_text_parts(parts: &[ContentPart]) -> Result<String, TokenizeError> {
    let texts = parts
        .iter()
        .map(|part| match (part.kind.as_str(), &part.text) {
            ("text", Some(text)) => Ok(text.as_str()),
            ("text", None) => Err(TokenizeError::UnsupportedContent("a text part without \"text\"".into())),
            (other, _) => Err(TokenizeError::UnsupportedContent(format!("content part type {other:?}"))),
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(texts.join("\n"))
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message).with_source(RaisedByTemplate))
}

fn classify_render_error(err: Error) -> TokenizeError {
    let raised = std::iter::successors(std::error::Error::source(&err), |e| e.source())
        .any(|e| e.downcast_ref::<RaisedByTemplate>().is_some());
    if raised {
        TokenizeError::TemplateRaised(err.detail().unwrap_or("(no message)").to_owned())
    } else {
        TokenizeError::TemplateRender(describe(&err))
    }
}

/// The error with its template line, e.g. "unknown method: ... (in chat_template:12)".
fn describe(err: &Error) -> String {
    err.to_string()
}

/// transformers' `{% generation %}...{% endgeneration %}` marks assistant text for training masks and
/// renders its body unchanged; minijinja has no such tag, so it becomes `{% if true %}...{% endif %}`,
/// keeping the whitespace-control markers.
fn neutralize_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else { break };
        let inner = &tag[2..end];
        let keyword = inner.trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        let replacement = match keyword {
            "generation" => Some("if true"),
            "endgeneration" => Some("endif"),
            _ => None,
        };
        match replacement {
            Some(new) => out.push_str(&format!("{{%{}%}}", inner.replacen(keyword, new, 1))),
            None => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
#[path = "chat_tests.rs"]
mod tests;

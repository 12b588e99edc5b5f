//! `tokenrouter chat`: a terminal chat over `/v1/chat/completions` with streaming, against a
//! running server (`--url`) or one started in this process (`--config`/`--model`, or the
//! demo). Each piece of text is shown in its model's colour (or, with `--no-color`, runs
//! not written by the first model are marked `[name: …]`), and each answer ends with the
//! share of tokens the large model wrote. The per-token models come from the routing
//! trace the server streams (`routing: {"trace": true}` gives each chunk
//! `routing.models`), the counts from the final usage chunk (`tokens_per_model`).

use std::io::{BufRead, IsTerminal, Write};

use anyhow::{bail, Context};
use clap::Args;
use futures::StreamExt;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};
use tokenrouter_core::openai::{excerpt, ChatRequest, Completion, ErrorEnvelope, Message, ModelList, RequestOptions};
use tokenrouter_core::sse::{SseEvent, SseParser};

use super::serve::{self, ConfigSource, StartOptions};

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// A running server's base URL, e.g. http://127.0.0.1:8000; without it, a server is
    /// started in this process from --config / --model (default: the demo pair).
    #[arg(long, conflicts_with_all = ["config", "model"])]
    url: Option<String>,
    /// Bearer key for the server (`server.api_keys`); in-process, the config's first key.
    #[arg(long)]
    api_key: Option<String>,
    #[command(flatten)]
    source: ConfigSource,
    /// Ask this one question, print the answer and its summary, and exit.
    #[arg(long)]
    prompt: Option<String>,
    /// A system message that starts the conversation (kept across /reset).
    #[arg(long)]
    system: Option<String>,
    /// No ANSI colours: runs written by a model other than the first are marked `[name: …]`.
    #[arg(long)]
    no_color: bool,
    #[arg(long, default_value_t = 256)]
    max_tokens: u32,
    /// 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// A routing policy the server allows (e.g. random, rstitch, always); default: the server's.
    #[arg(long)]
    policy: Option<String>,
    /// The policy's parameters as JSON, e.g. '{"p": 0.5}'.
    #[arg(long, requires = "policy")]
    params: Option<String>,
}

pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(chat(args))
}

async fn chat(args: ChatArgs) -> anyhow::Result<()> {
    let routing = routing_object(args.policy.as_deref(), args.params.as_deref())?;
    let Some(url) = &args.url else { return chat_in_process(args, routing).await };
    let client = ChatClient::connect(url, args.api_key.clone(), routing).await?;
    converse(&client, &args).await
}

/// Starts the server on a free loopback port, chats with it, then stops it.
async fn chat_in_process(mut args: ChatArgs, routing: Value) -> anyhow::Result<()> {
    let mut config = args.source.load()?;
    config.server.host = "127.0.0.1".into();
    config.server.port = 0;
    // The chat client speaks plain HTTP to its own in-process server on loopback.
    config.server.tls = None;
    if args.api_key.is_none() {
        args.api_key = config.server.api_keys.first().cloned();
    }
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let options = StartOptions { warm_up: false, report: status_line };
    let started = serve::start(config, &options, async move {
        let _ = stopped.await;
    })
    .await?;
    let url = format!("http://{}", started.server.addr());
    let result = async {
        let client = ChatClient::connect(&url, args.api_key.clone(), routing).await?;
        converse(&client, &args).await
    }
    .await;
    let _ = stop.send(());
    started.wait().await?;
    result
}

/// Start-up lines of an in-process server go to stderr: stdout carries the conversation.
fn status_line(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The request's `routing` object: always the trace, and the policy when one is named.
fn routing_object(policy: Option<&str>, params: Option<&str>) -> anyhow::Result<Value> {
    let mut routing = json!({ "trace": true });
    if let Some(policy) = policy {
        routing["policy"] = json!(policy);
    }
    if let Some(params) = params {
        let value: Value = serde_json::from_str(params).context("--params is not JSON")?;
        routing["params"] = value;
    }
    Ok(routing)
}

/// One question with `--prompt`, else a read-answer loop on stdin with `/reset` and `/quit`.
async fn converse(client: &ChatClient, args: &ChatArgs) -> anyhow::Result<()> {
    let color = !args.no_color && std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let mut conversation = Conversation::new(args.system.clone());
    let mut out = std::io::stdout();
    let settings = Settings { max_tokens: args.max_tokens, temperature: args.temperature };
    if let Some(prompt) = &args.prompt {
        let summary = ask(client, &mut conversation, prompt, &settings, color, &mut out).await?;
        writeln!(out, "{summary}")?;
        return Ok(());
    }
    writeln!(out, "{}", legend(&client.models, color))?;
    writeln!(out, "/reset starts over, /quit (or Ctrl-D) leaves.")?;
    loop {
        write!(out, "\nyou> ")?;
        out.flush()?;
        let mut line = String::new();
        let read = tokio::task::block_in_place(|| std::io::stdin().lock().read_line(&mut line))?;
        if read == 0 {
            writeln!(out)?;
            return Ok(());
        }
        match line.trim() {
            "" => continue,
            "/quit" | "/exit" => return Ok(()),
            "/reset" => {
                conversation.reset();
                writeln!(out, "(conversation cleared)")?;
            }
            "/help" => writeln!(out, "/reset starts over, /quit leaves; anything else is sent.")?,
            text => {
                write!(out, "bot> ")?;
                match ask(client, &mut conversation, text, &settings, color, &mut out).await {
                    Ok(summary) => writeln!(out, "{summary}")?,
                    Err(e) => writeln!(out, "error: {e:#}")?,
                }
            }
        }
    }
}

struct Settings {
    max_tokens: u32,
    temperature: f32,
}

/// Sends the question with the history, streams the answer to `out`, keeps both in the
/// history when it succeeds, and returns the summary line.
async fn ask(
    client: &ChatClient,
    conversation: &mut Conversation,
    question: &str,
    settings: &Settings,
    color: bool,
    out: &mut impl Write,
) -> anyhow::Result<String> {
    let mut messages = conversation.messages.clone();
    messages.push(Message::new("user", question));
    let mut painter = Painter::new(&client.models, color);
    let answer = client
        .stream(&messages, settings, |text, model| {
            let _ = write!(out, "{}", painter.paint(text, model));
            let _ = out.flush();
        })
        .await;
    write!(out, "{}", painter.finish())?;
    writeln!(out)?;
    let answer = answer?;
    conversation.messages = messages;
    conversation.messages.push(Message::new("assistant", answer.text.clone()));
    Ok(summary(&answer, &client.models))
}

/// The messages sent with every question: the system message and the turns so far.
struct Conversation {
    system: Option<String>,
    messages: Vec<Message>,
}

impl Conversation {
    fn new(system: Option<String>) -> Self {
        let mut c = Conversation { system, messages: Vec::new() };
        c.reset();
        c
    }

    fn reset(&mut self) {
        self.messages = self.system.iter().map(|s| Message::new("system", s.as_str())).collect();
    }
}

/// What one streamed answer came to.
#[derive(Debug, Default)]
struct Answer {
    text: String,
    finish_reason: Option<String>,
    /// Tokens per model name, from the usage chunk.
    tokens_per_model: Vec<(String, u64)>,
    completion_tokens: u64,
}

/// "large-model share: 75.0% (large wrote 6 of 8 tokens; finish: stop)". The large model is
/// the last of the server's models, as policies take the second model as the large one.
fn summary(answer: &Answer, models: &[String]) -> String {
    let finish = answer.finish_reason.as_deref().unwrap_or("none");
    let Some(large) = models.last() else { return format!("(finish: {finish})") };
    let wrote = answer.tokens_per_model.iter().find(|(name, _)| name == large).map_or(0, |(_, n)| *n);
    let total = answer.completion_tokens;
    let share = if total == 0 { 0.0 } else { 100.0 * wrote as f64 / total as f64 };
    format!("large-model share: {share:.1}% ({large} wrote {wrote} of {total} tokens; finish: {finish})")
}

const PALETTE: &[&str] = &["36", "33", "35", "32", "34"];
const RESET: &str = "\x1b[0m";

/// The colour (an SGR code) of model `index`; the first model's text stays plain when
/// there is only one model.
fn colour(index: usize) -> &'static str {
    PALETTE[index % PALETTE.len()]
}

fn legend(models: &[String], color: bool) -> String {
    let names: Vec<String> = models
        .iter()
        .enumerate()
        .map(|(i, name)| match color {
            true => format!("\x1b[{}m{name}{RESET}", colour(i)),
            false if i == 0 => name.clone(),
            false => format!("[{name}: …]"),
        })
        .collect();
    format!("models: {}", names.join(", "))
}

/// Turns (text, model) pieces into coloured text, or into plain text with `[name: …]`
/// around runs by models other than the first.
struct Painter<'a> {
    models: &'a [String],
    color: bool,
    /// The model of the run being written.
    current: Option<usize>,
}

impl<'a> Painter<'a> {
    fn new(models: &'a [String], color: bool) -> Self {
        Painter { models, color, current: None }
    }

    fn paint(&mut self, text: &str, model: Option<&str>) -> String {
        let index = model.and_then(|m| self.models.iter().position(|n| n == m)).or(self.current).unwrap_or(0);
        let mut s = String::new();
        if self.current != Some(index) {
            s.push_str(&self.finish());
            if self.color {
                s.push_str(&format!("\x1b[{}m", colour(index)));
            } else if index > 0 {
                s.push_str(&format!("[{}: ", self.models[index]));
            }
            self.current = Some(index);
        }
        s.push_str(text);
        s
    }

    /// Closes the current run.
    fn finish(&mut self) -> String {
        let closing = match self.current.take() {
            Some(_) if self.color => RESET,
            Some(index) if index > 0 => "]",
            _ => "",
        };
        closing.to_string()
    }
}

/// A server's chat endpoint and the models it routes between.
struct ChatClient {
    http: reqwest::Client,
    base: String,
    api_key: Option<String>,
    routing: Value,
    /// Engine models in engine order (the last is the large one).
    models: Vec<String>,
}

impl ChatClient {
    /// Reads `/v1/models`: the served id first, then each engine model (a one-model server
    /// lists only its model).
    async fn connect(url: &str, api_key: Option<String>, routing: Value) -> anyhow::Result<ChatClient> {
        let base = url.trim_end_matches('/').trim_end_matches("/v1").to_string();
        let http = reqwest::Client::new();
        let mut request = http.get(format!("{base}/v1/models"));
        if let Some(key) = &api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.with_context(|| format!("cannot reach {base}"))?;
        let list: ModelList = checked_json(response).await.with_context(|| format!("GET {base}/v1/models"))?;
        let ids = list.ids();
        let models = match ids.len() {
            0 => bail!("{base}/v1/models lists no model"),
            1 => ids,
            _ => ids[1..].to_vec(),
        };
        Ok(ChatClient { http, base, api_key, routing, models })
    }

    /// Streams one answer, calling `on_text(text, model)` for every piece as it arrives.
    async fn stream(
        &self,
        messages: &[Message],
        settings: &Settings,
        mut on_text: impl FnMut(&str, Option<&str>),
    ) -> anyhow::Result<Answer> {
        let options = RequestOptions {
            max_tokens: Some(settings.max_tokens as usize),
            temperature: Some(settings.temperature),
            routing: Some(self.routing.clone()),
            ..RequestOptions::streamed()
        };
        let body = ChatRequest { messages: messages.to_vec(), options };
        let mut request = self.http.post(format!("{}/v1/chat/completions", self.base)).json(&body);
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.context("sending the question")?;
        if !response.status().is_success() {
            checked_json::<Value>(response).await?;
            bail!("the server refused the request");
        }
        let mut answer = Answer::default();
        let mut parser = SseParser::default();
        let mut bytes = response.bytes_stream();
        while let Some(chunk) = bytes.next().await {
            let chunk = chunk.context("reading the stream")?;
            for event in parser.push(&chunk) {
                if take_event(event, &mut answer, &mut on_text)? {
                    return Ok(answer);
                }
            }
        }
        if let Some(event) = parser.finish() {
            if take_event(event, &mut answer, &mut on_text)? {
                return Ok(answer);
            }
        }
        bail!("the stream ended without [DONE]")
    }
}

/// One stream event into the answer; true at `[DONE]`.
fn take_event(
    event: SseEvent,
    answer: &mut Answer,
    on_text: &mut impl FnMut(&str, Option<&str>),
) -> anyhow::Result<bool> {
    match event {
        SseEvent::Done => Ok(true),
        SseEvent::Data(data) => take_chunk(&data, answer, on_text).map(|()| false),
    }
}

/// One stream chunk into the answer: text (with the model of its last token), the finish
/// reason, usage; an error chunk ends the answer with its message, and so does a chunk
/// that is not one.
fn take_chunk(data: &str, answer: &mut Answer, on_text: &mut impl FnMut(&str, Option<&str>)) -> anyhow::Result<()> {
    let chunk: Completion =
        serde_json::from_str(data).with_context(|| format!("a malformed stream chunk: {}", excerpt(data)))?;
    if let Some(error) = chunk.error {
        bail!("{}", error.message());
    }
    if let Some(choice) = chunk.first_choice() {
        let text = choice.text();
        if !text.is_empty() {
            // A chunk's text may hold several tokens (held back until they form whole
            // characters); it is shown in the colour of the last one.
            let model = chunk.routing.as_ref().and_then(|r| r.models.last()).map(String::as_str);
            on_text(text, model);
            answer.text.push_str(text);
        }
        if let Some(reason) = &choice.finish_reason {
            answer.finish_reason = Some(reason.clone());
        }
    }
    if let Some(usage) = chunk.usage {
        answer.completion_tokens = usage.completion_tokens;
        if !usage.tokens_per_model.is_empty() {
            answer.tokens_per_model = usage.tokens_per_model.into_iter().collect();
        }
    }
    Ok(())
}

/// The JSON body of a successful response, or an error carrying the server's message.
async fn checked_json<T: DeserializeOwned>(response: reqwest::Response) -> anyhow::Result<T> {
    let status = response.status();
    let text = response.text().await.context("reading the response")?;
    if !status.is_success() {
        let error = serde_json::from_str::<ErrorEnvelope>(&text).ok().and_then(|e| e.error);
        let message = error.map_or_else(|| text.chars().take(300).collect(), |e| e.message());
        bail!("HTTP {status}: {message}");
    }
    serde_json::from_str(&text).context("the response is not the JSON expected")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> Vec<String> {
        vec!["small".into(), "large".into()]
    }

    #[test]
    fn plain_text_marks_runs_of_the_other_models() {
        let models = models();
        let mut p = Painter::new(&models, false);
        let mut s = String::new();
        for (text, model) in [("The", "small"), (" capital", "large"), (" is", "large"), (" Paris", "small")] {
            s.push_str(&p.paint(text, Some(model)));
        }
        s.push_str(&p.finish());
        assert_eq!(s, "The[large:  capital is] Paris");
    }

    #[test]
    fn colours_switch_per_model_and_reset_at_the_end() {
        let models = models();
        let mut p = Painter::new(&models, true);
        let s = format!("{}{}{}", p.paint("a", Some("small")), p.paint("b", Some("large")), p.finish());
        assert_eq!(s, "\x1b[36ma\x1b[0m\x1b[33mb\x1b[0m");
    }

    #[test]
    fn the_summary_gives_the_last_models_share() {
        let answer = Answer {
            text: "x".into(),
            finish_reason: Some("stop".into()),
            tokens_per_model: vec![("large".into(), 6), ("small".into(), 2)],
            completion_tokens: 8,
        };
        assert_eq!(summary(&answer, &models()), "large-model share: 75.0% (large wrote 6 of 8 tokens; finish: stop)");
    }

    #[test]
    fn an_error_chunk_ends_the_answer_with_its_message() {
        let mut answer = Answer::default();
        let chunk = json!({ "error": { "message": "out of KV" } });
        let e = take_chunk(&chunk.to_string(), &mut answer, &mut |_, _| {}).unwrap_err();
        assert_eq!(e.to_string(), "out of KV");
    }

    #[test]
    fn chunks_feed_the_answer_with_each_texts_model() {
        let mut answer = Answer::default();
        let mut shown = Vec::new();
        let mut on_text = |text: &str, model: Option<&str>| shown.push((text.to_string(), model.map(str::to_string)));
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"Pa"}}],"routing":{"models":["small","large"]}}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":2,"tokens_per_model":{"large":1,"small":1}}}"#,
        ];
        for chunk in chunks {
            take_chunk(chunk, &mut answer, &mut on_text).unwrap();
        }
        assert_eq!(shown, [("Pa".to_string(), Some("large".to_string()))]);
        assert_eq!(
            (answer.text.as_str(), answer.finish_reason.as_deref(), answer.completion_tokens),
            ("Pa", Some("stop"), 2)
        );
        assert_eq!(answer.tokens_per_model, [("large".to_string(), 1), ("small".to_string(), 1)]);
    }

    #[test]
    fn a_malformed_chunk_ends_the_answer_with_an_error() {
        let mut answer = Answer::default();
        for bad in ["{not json", r#"{"choices":[{"delta":{"content":7}}]}"#] {
            let e = take_chunk(bad, &mut answer, &mut |_, _| {}).unwrap_err();
            assert!(e.to_string().contains("malformed stream chunk"), "{e:#}");
        }
        assert_eq!(answer.text, "");
    }
}

//! One streamed request against the OpenAI API (`/v1/chat/completions` or
//! `/v1/completions`), timed from send to the first token and to `[DONE]`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use serde::Serialize;
use serde_json::{Number, Value};
use tokenrouter_core::openai::{self, ChatRequest, CompletionRequest, Message, ModelList, Prompt};

use crate::sse::{error_message, SseParser, StreamTally};
use crate::target::Target;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Endpoint {
    /// `POST /v1/chat/completions` with `messages`.
    Chat,
    /// `POST /v1/completions` with a text `prompt` (turns joined by blank lines).
    Completions,
}

impl Endpoint {
    fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// What every request of a run carries besides its prompt.
#[derive(Debug, Clone, Serialize)]
pub struct RequestOptions {
    pub endpoint: Endpoint,
    pub model: Option<String>,
    /// vLLM's `ignore_eos` (tokenrouter accepts it): outputs run to `max_tokens`, so
    /// a workload's output sizes do not depend on when a random model says EOS.
    pub ignore_eos: bool,
    pub temperature: Option<f32>,
    /// tokenrouter's `routing` object (`{"policy": ..., "params": ..., "trace": ...}`).
    pub routing: Option<Value>,
    /// OpenAI's `response_format` (structured outputs), sent as given.
    pub response_format: Option<Value>,
}

/// The conversation of a request so far: user turns and the answers between them.
#[derive(Debug, Clone, Default)]
pub struct Conversation {
    /// (role, content), starting with a user turn.
    messages: Vec<(&'static str, String)>,
    /// Sent as `session_id`: the server continues this conversation's tokenization.
    session: Option<String>,
}

impl Conversation {
    pub fn in_session(session: Option<String>) -> Conversation {
        Conversation { messages: Vec::new(), session }
    }

    pub fn user(&mut self, text: &str) {
        self.messages.push(("user", text.to_string()));
    }

    pub fn assistant(&mut self, text: String) {
        self.messages.push(("assistant", text));
    }

    /// The conversation as one completions prompt: the turns joined by blank lines.
    pub fn completion_prompt(&self) -> String {
        let texts: Vec<&str> = self.messages.iter().map(|(_, t)| t.as_str()).collect();
        texts.join("\n\n")
    }
}

/// What came back for one request.
#[derive(Debug)]
pub struct Outcome {
    pub latency: Duration,
    pub tally: StreamTally,
    /// Why the request failed (HTTP status, connection, error in the stream, cut short).
    pub error: Option<String>,
    /// The client closed the connection mid-stream on purpose (`--hangup-fraction`).
    pub hung_up: bool,
}

impl Outcome {
    pub fn new(latency: Duration, tally: StreamTally, error: Option<String>) -> Outcome {
        Outcome { latency, tally, error, hung_up: false }
    }

    /// A request abandoned from outside (the run's time ran out).
    pub fn cut(sent: Instant, why: &str) -> Outcome {
        Outcome::new(sent.elapsed(), StreamTally::default(), Some(why.to_string()))
    }
}

/// How reading a response stopped, when it did not fail.
enum Ending {
    /// `[DONE]` or the end of the body (the tally says whether that was complete).
    Read,
    /// The client hung up after this many tokens.
    HungUp(u64),
}

pub struct Client {
    http: reqwest::Client,
    target: Target,
    options: RequestOptions,
}

impl Client {
    pub fn new(target: Target, options: RequestOptions) -> anyhow::Result<Client> {
        Ok(Client { http: http_client()?, target, options })
    }

    pub fn options(&self) -> &RequestOptions {
        &self.options
    }

    /// The served model names (`GET /v1/models`): fails early, with a clear message,
    /// when nothing answers at the target.
    pub async fn models(&self) -> anyhow::Result<Vec<String>> {
        let url = self.target.url("/v1/models");
        let response = self.http.get(&url).send().await.map_err(|e| {
            anyhow::anyhow!("no server answers at {}: {} (start one with `tokenrouter serve`)", self.target, chain(&e))
        })?;
        let status = response.status();
        let text = response.text().await.map_err(|e| anyhow::anyhow!("GET {url}: reading the reply: {}", chain(&e)))?;
        if !status.is_success() {
            anyhow::bail!("GET {url}: HTTP {status}: {}", error_message(&text));
        }
        let list: ModelList =
            serde_json::from_str(&text).map_err(|e| anyhow::anyhow!("GET {url}: not a model list ({e}): {text}"))?;
        Ok(list.ids())
    }

    /// A plain (unstreamed) JSON call: the reply's body, or why there is none.
    pub async fn post_json(&self, path: &str, body: &Value) -> Result<Value, String> {
        let url = self.target.url(path);
        let response = self.post(&url, body).await?;
        let status = response.status();
        let text = response.text().await.map_err(|e| format!("reading the reply: {}", chain(&e)))?;
        if !status.is_success() {
            return Err(format!("HTTP {}: {}", status.as_u16(), error_message(&text)));
        }
        serde_json::from_str::<Value>(&text).map_err(|e| format!("unreadable reply ({e}): {text}"))
    }

    /// POSTs `body`, once more on a fresh connection when a pooled one was closed by
    /// the server as the request went out (llama-server closes keep-alive connections
    /// after a few requests): no response came, so the server did not take it.
    async fn post(&self, url: &str, body: &Value) -> Result<reqwest::Response, String> {
        match self.http.post(url).json(body).send().await {
            Err(e) if e.is_request() && !e.is_timeout() && e.status().is_none() => {
                self.http.post(url).json(body).send().await.map_err(|e| chain(&e))
            }
            other => other.map_err(|e| chain(&e)),
        }
    }

    /// The request body for a conversation.
    pub fn body(&self, conversation: &Conversation, max_tokens: usize, seed: u64) -> Value {
        let o = &self.options;
        let options = openai::RequestOptions {
            model: o.model.clone(),
            max_tokens: Some(max_tokens),
            seed: Some(Number::from(seed)),
            ignore_eos: o.ignore_eos.then_some(true),
            temperature: o.temperature,
            routing: o.routing.clone(),
            response_format: o.response_format.clone(),
            session_id: conversation.session.clone(),
            ..openai::RequestOptions::streamed()
        };
        let body = match o.endpoint {
            Endpoint::Chat => {
                let messages = conversation.messages.iter().map(|(role, text)| Message::new(role, text.as_str()));
                serde_json::to_value(ChatRequest { messages: messages.collect(), options })
            }
            Endpoint::Completions => {
                let prompt = Prompt::Text(conversation.completion_prompt());
                serde_json::to_value(CompletionRequest { prompt, logprobs: None, options })
            }
        };
        // Cannot fail: every map in a request has string keys.
        body.expect("a request body is JSON")
    }

    /// Sends and streams one request; never fails, a failure is in the outcome.
    /// With `hangup_after: Some(k)` the connection is closed once k tokens have
    /// arrived (at the response head for 0), as a client that goes away does.
    pub async fn send(&self, body: &Value, hangup_after: Option<u64>) -> Outcome {
        let sent = Instant::now();
        let mut tally = StreamTally::default();
        let result = self.stream(body, sent, &mut tally, hangup_after).await;
        let latency = sent.elapsed();
        match result {
            Ok(Ending::HungUp(tokens)) => Outcome {
                latency,
                tally,
                error: Some(format!("hung up by the client after {tokens} token(s)")),
                hung_up: true,
            },
            Ok(Ending::Read) => {
                let error = tally.failure();
                Outcome::new(latency, tally, error)
            }
            Err(e) => Outcome::new(latency, tally, Some(e)),
        }
    }

    /// Reads the response to its end, or to the hang-up point. Latency is taken by
    /// the caller when this returns, which is right after `[DONE]` for a
    /// well-behaved server. Returning drops the body: an unfinished one closes its
    /// connection, which the server sees as a disconnect.
    async fn stream(
        &self,
        body: &Value,
        sent: Instant,
        tally: &mut StreamTally,
        hangup_after: Option<u64>,
    ) -> Result<Ending, String> {
        let url = self.target.url(self.options.endpoint.path());
        let response = self.post(&url, body).await?;
        let status = response.status();
        if !status.is_success() {
            let text = response.text().await.unwrap_or_default();
            return Err(format!("HTTP {}: {}", status.as_u16(), error_message(&text)));
        }
        let hangup_due = |tally: &StreamTally| hangup_after.filter(|&k| tally.tokens_seen() >= k);
        if let Some(k) = hangup_due(tally) {
            return Ok(Ending::HungUp(k));
        }
        let mut parser = SseParser::default();
        let mut bytes = response.bytes_stream();
        while let Some(piece) = bytes.next().await {
            let piece = piece.map_err(|e| format!("reading the stream: {}", chain(&e)))?;
            for event in parser.push(&piece) {
                tally.on_event(sent.elapsed(), event);
                if tally.done {
                    // Nothing may follow [DONE]; stop the clock here rather than at EOF.
                    return Ok(Ending::Read);
                }
                if hangup_due(tally).is_some() {
                    return Ok(Ending::HungUp(tally.tokens_seen()));
                }
            }
        }
        if let Some(event) = parser.finish() {
            tally.on_event(sent.elapsed(), event);
        }
        Ok(Ending::Read)
    }

    /// A plain GET of a JSON document.
    pub async fn get_json(&self, path: &str) -> Result<Value, String> {
        let url = self.target.url(path);
        let response = self.http.get(&url).send().await.map_err(|e| chain(&e))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| format!("GET {url}: reading the reply: {}", chain(&e)))?;
        if !status.is_success() {
            return Err(format!("GET {url}: HTTP {}: {}", status.as_u16(), error_message(&text)));
        }
        serde_json::from_str(&text).map_err(|e| format!("GET {url}: unreadable reply ({e}): {text}"))
    }

    /// POSTs `body` and returns only the status: for calls whose answer is their status.
    pub async fn post_status(&self, path: &str, body: &Value) -> Result<u16, String> {
        let response = self.post(&self.target.url(path), body).await?;
        Ok(response.status().as_u16())
    }
}

/// The HTTP client of every request this crate sends.
pub(crate) fn http_client() -> reqwest::Result<reqwest::Client> {
    // No proxy: an HTTP_PROXY in the environment must not carry loopback load elsewhere.
    // Idle connections go before the servers measured close theirs (uvicorn, under vLLM
    // and SGLang, and actix by default: 5 s): a request sent on a connection the server
    // is closing fails, and the failure would be counted against the server.
    reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(usize::MAX)
        .pool_idle_timeout(Duration::from_secs(4))
        .build()
}

/// An error with its causes: reqwest's own message alone says little
/// ("error sending request"), the cause says why (connection refused).
pub(crate) fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn client(endpoint: Endpoint) -> Client {
        let options = RequestOptions {
            endpoint,
            model: Some("m".into()),
            ignore_eos: true,
            temperature: None,
            routing: Some(json!({ "trace": true })),
            response_format: None,
        };
        Client::new(Target::parse("http://127.0.0.1:1").unwrap(), options).unwrap()
    }

    fn conversation() -> Conversation {
        let mut c = Conversation::default();
        c.user("first");
        c.assistant("answer".into());
        c.user("second");
        c
    }

    #[test]
    fn chat_bodies_carry_the_conversation_and_streaming_options() {
        let body = client(Endpoint::Chat).body(&conversation(), 16, 7);
        assert_eq!(body["messages"][1], json!({ "role": "assistant", "content": "answer" }));
        assert_eq!(body["messages"].as_array().unwrap().len(), 3);
        assert_eq!(
            (body["stream"].clone(), body["stream_options"]["include_usage"].clone()),
            (json!(true), json!(true))
        );
        assert_eq!((body["max_tokens"].clone(), body["seed"].clone()), (json!(16), json!(7)));
        assert_eq!((body["ignore_eos"].clone(), body["model"].clone()), (json!(true), json!("m")));
        assert_eq!(body["routing"], json!({ "trace": true }));
        assert!(body.get("temperature").is_none() && body.get("prompt").is_none());
        assert!(body.get("session_id").is_none(), "no session, no id");
    }

    #[test]
    fn sessions_send_their_id_on_both_endpoints() {
        let mut c = Conversation::in_session(Some("load-7".into()));
        c.user("first");
        for endpoint in [Endpoint::Chat, Endpoint::Completions] {
            assert_eq!(client(endpoint).body(&c, 4, 1)["session_id"], "load-7");
        }
    }

    #[test]
    fn completion_bodies_join_the_turns() {
        let body = client(Endpoint::Completions).body(&conversation(), 4, 1);
        assert_eq!(body["prompt"], "first\n\nanswer\n\nsecond");
        assert!(body.get("messages").is_none());
    }

    /// Reads one HTTP request (headers and a Content-Length body) from `stream`.
    fn read_request(stream: &mut std::net::TcpStream) {
        use std::io::Read;
        let mut seen = Vec::new();
        let mut byte = [0u8; 1];
        while !seen.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).unwrap();
            seen.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&seen).to_lowercase();
        let length =
            head.lines().find_map(|l| l.strip_prefix("content-length:")).map_or(0, |v| v.trim().parse().unwrap());
        stream.read_exact(&mut vec![0u8; length]).unwrap();
    }

    #[tokio::test]
    async fn a_request_on_a_connection_the_server_closes_unanswered_goes_again() {
        use std::io::Write;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let reply = |n: u32| {
                format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 7\r\n\r\n{{\"n\":{n}}}")
            };
            let (mut kept, _) = listener.accept().unwrap();
            read_request(&mut kept);
            kept.write_all(reply(1).as_bytes()).unwrap();
            // The client pools this connection; its next request is read, then the
            // connection closes unanswered, as a server at its keep-alive limit does.
            read_request(&mut kept);
            drop(kept);
            let (mut fresh, _) = listener.accept().unwrap();
            read_request(&mut fresh);
            fresh.write_all(reply(2).as_bytes()).unwrap();
        });
        let c = Client::new(Target::parse(&url).unwrap(), client(Endpoint::Completions).options().clone()).unwrap();
        assert_eq!(c.post_json("/completion", &json!({})).await, Ok(json!({ "n": 1 })));
        assert_eq!(c.post_json("/completion", &json!({})).await, Ok(json!({ "n": 2 })));
        server.join().unwrap();
    }

    #[tokio::test]
    async fn a_closed_port_is_a_failure_with_its_cause() {
        let c = client(Endpoint::Chat);
        let outcome = c.send(&c.body(&conversation(), 1, 1), None).await;
        let error = outcome.error.unwrap();
        assert!(error.to_lowercase().contains("connect"), "{error}");
        let e = c.models().await.unwrap_err().to_string();
        assert!(e.contains("no server answers at http://127.0.0.1:1"), "{e}");
    }
}

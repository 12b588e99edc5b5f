//! Reading a streamed OpenAI response: the meaning of each `data:` payload
//! (`Chunk`), and the running account of one response (`StreamTally`) from which a
//! request's measurements come. SSE framing is core's `SseParser` and the chunk's
//! shape core's `openai::Completion`, both shared with the server's upstream client and
//! the terminal chat. All pure, so the parsing is tested without a server.

use std::collections::BTreeMap;
use std::time::Duration;

use tokenrouter_core::openai::{self, Completion, ErrorEnvelope};
pub use tokenrouter_core::sse::{SseEvent, SseParser};

/// Token counts the server reports in `usage`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    /// `prompt_tokens_details.cached_tokens`: prompt tokens served from the prefix
    /// cache (0 when the server does not say).
    pub cached_tokens: u64,
    /// tokenrouter's extension: output tokens by model name (empty elsewhere).
    pub tokens_per_model: BTreeMap<String, u64>,
}

/// What one `data:` payload says.
#[derive(Debug, Default, PartialEq)]
pub struct Chunk {
    /// Chat `delta.content` or completions `text`.
    pub text: String,
    /// tokenrouter's `routing.models`: the model of each token this chunk reports.
    pub models: Vec<String>,
    pub finish_reason: Option<String>,
    pub usage: Option<Usage>,
    /// An error sent inside the stream (OpenAI's envelope).
    pub error: Option<String>,
}

impl Chunk {
    pub fn parse(data: &str) -> Result<Chunk, String> {
        let chunk: Completion =
            serde_json::from_str(data).map_err(|e| format!("unreadable stream chunk ({e}): {data}"))?;
        if let Some(error) = chunk.error {
            return Ok(Chunk { error: Some(error.message()), ..Chunk::default() });
        }
        let choice = chunk.choices.into_iter().next().unwrap_or_default();
        Ok(Chunk {
            text: choice.text().to_string(),
            models: chunk.routing.map(|r| r.models).unwrap_or_default(),
            finish_reason: choice.finish_reason,
            usage: chunk.usage.map(Usage::from),
            error: None,
        })
    }

    /// Whether this chunk shows that a token was produced.
    fn has_tokens(&self) -> bool {
        !self.text.is_empty() || !self.models.is_empty()
    }
}

impl From<openai::Usage> for Usage {
    fn from(u: openai::Usage) -> Usage {
        Usage {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            cached_tokens: u.cached_tokens(),
            tokens_per_model: u.tokens_per_model,
        }
    }
}

/// The message of a failed request's body: OpenAI's error envelope's, else the body
/// itself.
pub fn error_message(body: &str) -> String {
    match serde_json::from_str::<ErrorEnvelope>(body).ok().and_then(|e| e.error) {
        Some(error) => error.message(),
        None => body.to_string(),
    }
}

/// The running account of one streamed response; times are since the request was sent.
#[derive(Debug, Default)]
pub struct StreamTally {
    pub first_token: Option<Duration>,
    pub text: String,
    /// Tokens counted from `routing.models`, by model.
    routed: BTreeMap<String, u64>,
    /// Chunks that carried text: the token count when nothing better is reported.
    text_chunks: u64,
    pub usage: Option<Usage>,
    pub finish_reason: Option<String>,
    pub error: Option<String>,
    pub done: bool,
}

impl StreamTally {
    /// The account of a response assembled elsewhere (the standard-serving
    /// dispatcher builds one from many one-token calls).
    pub fn assembled(first_token: Option<Duration>, text: String, usage: Usage, finish_reason: &str) -> StreamTally {
        StreamTally {
            first_token,
            text,
            usage: Some(usage),
            finish_reason: Some(finish_reason.to_string()),
            done: true,
            ..StreamTally::default()
        }
    }

    pub fn on_event(&mut self, at: Duration, event: SseEvent) {
        match event {
            SseEvent::Done => self.done = true,
            SseEvent::Data(data) => self.on_data(at, &data),
        }
    }

    pub fn on_data(&mut self, at: Duration, data: &str) {
        let chunk = match Chunk::parse(data) {
            Ok(chunk) => chunk,
            Err(e) => return self.fail(e),
        };
        if let Some(e) = chunk.error {
            return self.fail(e);
        }
        // A token whose text is held back (a stop-string prefix, half a character)
        // is only shown by the finish chunk: the first token is no later than that.
        if self.first_token.is_none() && (chunk.has_tokens() || chunk.finish_reason.is_some()) {
            self.first_token = Some(at);
        }
        self.text_chunks += u64::from(!chunk.text.is_empty());
        self.text.push_str(&chunk.text);
        for model in chunk.models {
            *self.routed.entry(model).or_default() += 1;
        }
        self.finish_reason = chunk.finish_reason.or(self.finish_reason.take());
        self.usage = chunk.usage.or(self.usage.take());
    }

    fn fail(&mut self, error: String) {
        self.error.get_or_insert(error);
    }

    /// Output tokens: the server's usage, else the routing trace, else text chunks.
    pub fn output_tokens(&self) -> u64 {
        match &self.usage {
            Some(u) => u.completion_tokens,
            None if !self.routed.is_empty() => self.streamed_tokens().unwrap_or(0),
            None => self.text_chunks,
        }
    }

    /// Tokens seen so far while streaming: the routing trace's, else text chunks.
    pub fn tokens_seen(&self) -> u64 {
        self.streamed_tokens().unwrap_or(self.text_chunks)
    }

    /// Tokens the routing trace showed as they streamed (None without a trace).
    pub fn streamed_tokens(&self) -> Option<u64> {
        (!self.routed.is_empty()).then(|| self.routed.values().sum())
    }

    /// Output tokens by model: from usage when it has them, else from the trace.
    pub fn tokens_per_model(&self) -> BTreeMap<String, u64> {
        match &self.usage {
            Some(u) if !u.tokens_per_model.is_empty() => u.tokens_per_model.clone(),
            _ => self.routed.clone(),
        }
    }

    /// Why the response does not count as complete, if it does not.
    pub fn failure(&self) -> Option<String> {
        if let Some(e) = &self.error {
            return Some(e.clone());
        }
        (!self.done).then(|| "the stream ended before [DONE]".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_from_the_shared_parser_drive_the_tally() {
        let mut parser = SseParser::default();
        let mut t = StreamTally::default();
        let stream = "data: {\"choices\":[{\"text\":\"h\u{e9}\"}]}\r\n\r\ndata: [DONE]\n\n".as_bytes();
        // Split inside é: the text still arrives whole.
        let cut = stream.iter().position(|&b| b == 0xc3).unwrap() + 1;
        for piece in [&stream[..cut], &stream[cut..]] {
            for event in parser.push(piece) {
                t.on_event(Duration::from_millis(1), event);
            }
        }
        assert_eq!((t.text.as_str(), t.done, t.tokens_seen()), ("h\u{e9}", true, 1));
    }

    #[test]
    fn chunks_of_both_endpoints_are_read() {
        let chat = Chunk::parse(r#"{"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":null}],"routing":{"models":["small","large"]}}"#).unwrap();
        assert_eq!(chat.text, "Hi");
        assert_eq!(chat.models, ["small", "large"]);
        let text = Chunk::parse(r#"{"choices":[{"index":0,"text":" there","finish_reason":"length"}]}"#).unwrap();
        assert_eq!((text.text.as_str(), text.finish_reason.as_deref()), (" there", Some("length")));
        let usage = Chunk::parse(r#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3,"tokens_per_model":{"small":2,"large":1}}}"#).unwrap();
        let u = usage.usage.unwrap();
        assert_eq!((u.prompt_tokens, u.completion_tokens, u.tokens_per_model["small"]), (5, 3, 2));
        assert_eq!(u.cached_tokens, 0, "no prompt_tokens_details: nothing cached");
        let cached = Chunk::parse(
            r#"{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":32}}}"#,
        );
        assert_eq!(cached.unwrap().usage.unwrap().cached_tokens, 32);
        let error = Chunk::parse(r#"{"error":{"message":"boom","type":"server_error","param":null,"code":null}}"#);
        assert_eq!(error.unwrap().error.as_deref(), Some("boom"));
        assert!(Chunk::parse("{not json").unwrap_err().contains("unreadable"));
        let wrong_type = Chunk::parse(r#"{"choices":[{"text":["x"]}]}"#).unwrap_err();
        assert!(wrong_type.contains("unreadable"), "{wrong_type}");
    }

    fn at(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    #[test]
    fn the_tally_times_the_first_token_and_prefers_reported_usage() {
        let mut t = StreamTally::default();
        t.on_data(at(1), r#"{"choices":[{"delta":{"role":"assistant","content":""}}]}"#);
        assert_eq!(t.first_token, None, "the role announcement is not a token");
        t.on_data(at(5), r#"{"choices":[{"delta":{"content":"a"}}],"routing":{"models":["small"]}}"#);
        t.on_data(at(9), r#"{"choices":[{"delta":{"content":"b"}}],"routing":{"models":["large","small"]}}"#);
        assert_eq!((t.first_token, t.output_tokens(), t.streamed_tokens()), (Some(at(5)), 3, Some(3)));
        t.on_data(at(9), r#"{"choices":[{"delta":{},"finish_reason":"length"}]}"#);
        assert_eq!(t.failure().as_deref(), Some("the stream ended before [DONE]"));
        t.on_data(at(10), r#"{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3,"tokens_per_model":{"small":2,"large":1}}}"#);
        t.on_event(at(10), SseEvent::Done);
        assert_eq!((t.output_tokens(), t.failure(), t.text.as_str()), (3, None, "ab"));
        assert_eq!(t.finish_reason.as_deref(), Some("length"));
        assert_eq!(t.tokens_per_model(), BTreeMap::from([("large".into(), 1), ("small".into(), 2)]));
    }

    #[test]
    fn without_usage_tokens_come_from_the_trace_or_the_text_chunks() {
        let mut traced = StreamTally::default();
        traced.on_data(at(1), r#"{"choices":[{"text":"xy"}],"routing":{"models":["m","m"]}}"#);
        assert_eq!((traced.output_tokens(), traced.tokens_per_model()["m"]), (2, 2));
        let mut plain = StreamTally::default();
        plain.on_data(at(1), r#"{"choices":[{"text":"x"}]}"#);
        plain.on_data(at(2), r#"{"choices":[{"text":"y"}]}"#);
        assert_eq!((plain.output_tokens(), plain.tokens_per_model().len()), (2, 0));
        let mut held = StreamTally::default();
        held.on_data(at(7), r#"{"choices":[{"text":"","finish_reason":"stop"}]}"#);
        assert_eq!(held.first_token, Some(at(7)), "tokens held back until the finish chunk");
    }

    #[test]
    fn errors_in_the_stream_are_kept_first() {
        let mut t = StreamTally::default();
        t.on_data(at(1), r#"{"error":{"message":"engine failed"}}"#);
        t.on_data(at(2), "garbage");
        t.on_event(at(3), SseEvent::Done);
        assert_eq!(t.failure().as_deref(), Some("engine failed"));
    }

    #[test]
    fn error_bodies_give_their_message_or_themselves() {
        assert_eq!(
            error_message(r#"{"error":{"message":"no such model","type":"invalid_request_error"}}"#),
            "no such model"
        );
        assert_eq!(error_message(r#"{"error":"overloaded"}"#), "overloaded");
        assert_eq!(error_message("Bad Gateway"), "Bad Gateway");
    }
}

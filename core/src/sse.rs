//! Server-sent events as OpenAI-compatible servers stream them. The server side writes
//! each JSON value as one `data:` line that every client's line splitter reads whole
//! ([`json_data_event`]). The client side reads bytes in, in whatever pieces the network delivers, complete events out. Lines are
//! kept as bytes until their terminator arrives, so a multi-byte character split
//! between two reads is decoded whole (UTF-8 never uses the bytes of `\n` or `\r`
//! inside a character). A `\r\n` split between reads is one line end, not two.
//! Only `data:` fields matter to these clients; comments (`: keep-alive`) and other
//! fields (`event:`, `id:`, `retry:`) are read past.

/// One event of the stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SseEvent {
    /// The event's `data:` lines, joined by `\n`.
    Data(String),
    /// `data: [DONE]`: OpenAI's end of stream.
    Done,
}

impl SseEvent {
    fn of(data: String) -> SseEvent {
        if data.trim() == "[DONE]" {
            SseEvent::Done
        } else {
            SseEvent::Data(data)
        }
    }
}

#[derive(Debug, Default)]
pub struct SseParser {
    /// Bytes of a line whose end has not arrived.
    line: Vec<u8>,
    /// The last byte seen ended a line with `\r`: a `\n` right after it belongs to
    /// that line end (it may come in the next read).
    after_cr: bool,
    /// `data:` values of the event being read.
    data: Vec<String>,
}

impl SseParser {
    /// Feeds the next bytes; returns every event they complete, in order.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<SseEvent> {
        let mut events = Vec::new();
        for &byte in bytes {
            let after_cr = std::mem::replace(&mut self.after_cr, byte == b'\r');
            match byte {
                b'\n' if after_cr => {}
                b'\n' | b'\r' => events.extend(self.end_line()),
                _ => self.line.push(byte),
            }
        }
        events
    }

    /// The body ended: an event still open (a server that omits the last blank
    /// line) is complete now.
    pub fn finish(&mut self) -> Option<SseEvent> {
        self.after_cr = false;
        if !self.line.is_empty() {
            // A field line without its terminator, not an empty line: no dispatch yet.
            let _ = self.end_line();
        }
        self.dispatch()
    }

    fn end_line(&mut self) -> Option<SseEvent> {
        let line = std::mem::take(&mut self.line);
        if line.is_empty() {
            return self.dispatch();
        }
        // Only a malformed server sends invalid UTF-8 inside a line; show it, do not fail.
        let line = String::from_utf8_lossy(&line);
        let (field, value) = match line.split_once(':') {
            Some((field, value)) => (field, value.strip_prefix(' ').unwrap_or(value)),
            None => (line.as_ref(), ""),
        };
        // An empty field name is a comment (`: keep-alive`).
        if field == "data" {
            self.data.push(value.to_string());
        }
        None
    }

    fn dispatch(&mut self) -> Option<SseEvent> {
        (!self.data.is_empty()).then(|| SseEvent::of(std::mem::take(&mut self.data).join("\n")))
    }
}

/// `data: <value>\n\n`, with the JSON escaped so that no line splitter cuts it.
///
/// The SSE spec ends lines only at `\r` and `\n`, which JSON strings escape anyway, but
/// common clients read the stream with Python's `str.splitlines` (httpx `aiter_lines`),
/// which also breaks at U+2028, U+2029 and U+0085, and one more C1 control costs
/// nothing to escape: all of U+0080 to U+009F and the two separators go out as `\uXXXX`.
pub fn json_data_event(value: &serde_json::Value) -> Vec<u8> {
    use serde::Serialize;
    let mut event = b"data: ".to_vec();
    // Cannot fail: a `Value`'s keys are strings, and a Vec takes every write.
    let _ = value.serialize(&mut serde_json::Serializer::with_formatter(&mut event, LineSafeJson));
    event.extend_from_slice(b"\n\n");
    event
}

/// serde_json's compact output, with [`splits_lines`] characters escaped inside strings
/// (outside strings JSON is ASCII).
struct LineSafeJson;

impl serde_json::ser::Formatter for LineSafeJson {
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        writer: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        let mut written = 0;
        for (at, c) in fragment.char_indices().filter(|&(_, c)| splits_lines(c)) {
            writer.write_all(&fragment.as_bytes()[written..at])?;
            write!(writer, "\\u{:04x}", c as u32)?;
            written = at + c.len_utf8();
        }
        writer.write_all(&fragment.as_bytes()[written..])
    }
}

/// Characters some line splitters end a line at that JSON leaves unescaped (serde_json
/// already escapes every control below U+0020).
fn splits_lines(c: char) -> bool {
    matches!(c, '\u{80}'..='\u{9f}' | '\u{2028}' | '\u{2029}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn data(s: &str) -> SseEvent {
        SseEvent::Data(s.to_string())
    }

    /// Every event of `bytes` fed in pieces cut at `cuts`, then finished.
    fn parse_in_pieces(bytes: &[u8], cuts: &[usize]) -> Vec<SseEvent> {
        let mut parser = SseParser::default();
        let mut events = Vec::new();
        let mut from = 0;
        for &cut in cuts.iter().chain([&bytes.len()]) {
            events.extend(parser.push(&bytes[from..cut]));
            from = cut;
        }
        events.extend(parser.finish());
        events
    }

    #[test]
    fn events_end_at_blank_lines_and_done_is_recognized() {
        let stream = b"data: {\"a\":1}\n\ndata:x\n\ndata: [DONE]\n\n";
        assert_eq!(parse_in_pieces(stream, &[]), vec![data("{\"a\":1}"), data("x"), SseEvent::Done]);
    }

    /// Moved from the terminal chat's own splitter, which this parser replaced.
    #[test]
    fn an_event_split_across_reads_completes_past_comments_to_done() {
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: {\"a\"").is_empty());
        assert_eq!(parser.push(b":1}\n\n: keep-alive\n\ndata: [DONE]\n\n"), vec![data("{\"a\":1}"), SseEvent::Done]);
    }

    #[test]
    fn comments_and_other_fields_are_read_past() {
        let stream = b": keep-alive\n\nevent: chunk\nid: 7\nretry: 10\ndata: one\n\n:\n\n";
        assert_eq!(parse_in_pieces(stream, &[]), vec![data("one")]);
    }

    #[test]
    fn data_lines_of_one_event_are_joined_by_newlines() {
        let stream = b"data: one\ndata:two\ndata\ndata:  three\n\n";
        assert_eq!(parse_in_pieces(stream, &[]), vec![data("one\ntwo\n\n three")]);
        assert_eq!(parse_in_pieces(b"data:\n\n", &[]), vec![data("")], "an empty data field is an event");
    }

    #[test]
    fn crlf_and_lone_cr_end_lines_like_lf() {
        let stream = b"data: a\r\n\r\ndata: b\r\rdata: c\n\r\n";
        assert_eq!(parse_in_pieces(stream, &[]), vec![data("a"), data("b"), data("c")]);
    }

    #[test]
    fn crlf_split_between_reads_is_one_line_end() {
        let stream = b"data: a\r\n\r\ndata: b\r\n\r\n";
        for cut in 0..=stream.len() {
            assert_eq!(parse_in_pieces(stream, &[cut]), vec![data("a"), data("b")], "cut at {cut}");
        }
        // Every byte in its own read.
        let each: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(parse_in_pieces(stream, &each), vec![data("a"), data("b")]);
    }

    #[test]
    fn multi_byte_characters_survive_every_split_point() {
        let stream = "data: {\"text\":\"héllo 世界 🦀\"}\r\n\r\n: ping\n\ndata: ü€\n\ndata: [DONE]\n\n".as_bytes();
        let expected = vec![data("{\"text\":\"héllo 世界 🦀\"}"), data("ü€"), SseEvent::Done];
        for cut in 0..=stream.len() {
            assert_eq!(parse_in_pieces(stream, &[cut]), expected, "cut at {cut}");
        }
        for first in 0..=stream.len() {
            for second in first..=stream.len() {
                assert_eq!(parse_in_pieces(stream, &[first, second]), expected, "cuts at {first}, {second}");
            }
        }
        let each: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(parse_in_pieces(stream, &each), expected);
    }

    #[test]
    fn an_event_without_its_blank_line_completes_at_the_end() {
        assert_eq!(parse_in_pieces(b"data: tail", &[]), vec![data("tail")]);
        assert_eq!(parse_in_pieces(b"data: tail\r", &[]), vec![data("tail")]);
        let mut parser = SseParser::default();
        assert!(parser.push(b"data: x\n").is_empty());
        assert_eq!(parser.finish(), Some(data("x")));
        assert_eq!(parser.finish(), None, "nothing is left after finishing");
    }

    #[test]
    fn invalid_utf8_in_a_line_is_replaced_not_fatal() {
        assert_eq!(parse_in_pieces(b"data: a\xffb\n\n", &[]), vec![data("a\u{fffd}b")]);
    }

    #[test]
    fn json_events_hold_nothing_a_line_splitter_breaks_at_and_read_back_equal() {
        let every: String = ('\u{0}'..='\u{a0}').chain(['\u{2028}', '\u{2029}', 'é', '🦀']).collect();
        let value = serde_json::json!({ "text": every, "more": [{ "key\u{2028}": "a\u{85}b" }] });
        let event = String::from_utf8(json_data_event(&value)).unwrap();
        let json = event.strip_prefix("data: ").and_then(|e| e.strip_suffix("\n\n")).expect("one data line");
        let breaks = |c: char| c < ' ' || ('\u{80}'..='\u{9f}').contains(&c) || c == '\u{2028}' || c == '\u{2029}';
        assert!(!json.contains(breaks), "{json:?}");
        assert!(json.contains(r"\u2028") && json.contains(r"\u0085") && json.contains(r"\u009f"), "{json}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(json).unwrap(), value);
    }
}

//! Reads tool calls out of a model's output as it streams: text goes in piece by piece
//! (however the detokenizer cut it), content and whole calls come out in order. A block
//! that does not hold a readable call is passed on as content, never dropped.

use super::{ToolCall, ToolSyntax};
use crate::tokenize::held_prefix_len;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// Llama-3's marker before a call; gone when special tokens are skipped.
const PYTHON_TAG: &str = "<|python_tag|>";

/// What the parser read.
#[derive(Debug, Clone, PartialEq)]
pub enum ParsedPiece {
    Content(String),
    Call(ToolCall),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Hermes: between blocks.
    Outside,
    /// Hermes: after `<tool_call>`, before `</tool_call>`.
    Inside,
    /// Llama: nothing but whitespace seen yet.
    Undecided,
    /// Llama: the answer began like a call; held until the end.
    Buffering,
    /// Llama: the answer is text.
    Plain,
}

#[derive(Debug)]
pub struct ToolCallParser {
    mode: Mode,
    /// Text not yet passed on.
    held: String,
    calls: usize,
    /// The last piece passed on was a call: whitespace after it is separation.
    after_call: bool,
    /// Whitespace before the open block: separation if the block is a call, the
    /// model's text if not.
    gap: String,
}

impl ToolCallParser {
    pub fn new(syntax: ToolSyntax) -> Self {
        let mode = match syntax {
            ToolSyntax::Hermes => Mode::Outside,
            ToolSyntax::LlamaJson => Mode::Undecided,
        };
        ToolCallParser { mode, held: String::new(), calls: 0, after_call: false, gap: String::new() }
    }

    /// Reads the next piece of output.
    pub fn push(&mut self, text: &str) -> Vec<ParsedPiece> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            let progressed = match self.mode {
                Mode::Outside => self.outside(&mut out),
                Mode::Inside => self.inside(&mut out),
                Mode::Undecided => self.undecided(),
                Mode::Buffering => false,
                Mode::Plain => {
                    let text = std::mem::take(&mut self.held);
                    self.content(&mut out, text);
                    false
                }
            };
            if !progressed {
                return out;
            }
        }
    }

    /// The output ended by itself: whatever is held is read as well as it can be.
    pub fn finish(&mut self) -> Vec<ParsedPiece> {
        self.finish_with(false)
    }

    /// The output was cut by its token budget: a call it cut off is dropped, not passed
    /// on as content (OpenAI reports such a choice as `length` with no partial call).
    pub fn finish_cut(&mut self) -> Vec<ParsedPiece> {
        self.finish_with(true)
    }

    fn finish_with(&mut self, cut: bool) -> Vec<ParsedPiece> {
        let mut out = Vec::new();
        let held = std::mem::take(&mut self.held);
        match self.mode {
            Mode::Outside | Mode::Plain | Mode::Undecided => {
                let rest = if self.calls > 0 { held.trim_end().to_string() } else { held };
                self.content(&mut out, rest);
            }
            // A block the output ended inside (the budget ran out, or the model
            // stopped): a whole call if its body reads as one.
            Mode::Inside => match read_call(&held) {
                Some(call) => self.call(&mut out, call),
                None if cut => self.gap.clear(),
                None => {
                    let text = format!("{}{OPEN}{held}", std::mem::take(&mut self.gap));
                    self.content(&mut out, text)
                }
            },
            Mode::Buffering => match read_llama_calls(&held) {
                Some(calls) => calls.into_iter().for_each(|call| self.call(&mut out, call)),
                None if cut && begins_like_a_call(&held) => {}
                None => self.content(&mut out, held),
            },
        }
        self.mode = Mode::Plain;
        out
    }

    /// Hermes, between blocks: passes on the text before a block, holding back
    /// trailing whitespace and what may be the start of `<tool_call>`.
    fn outside(&mut self, out: &mut Vec<ParsedPiece>) -> bool {
        if let Some(start) = self.held.find(OPEN) {
            let before = self.held[..start].trim_end().to_string();
            self.gap = self.held[before.len()..start].to_string();
            self.held.drain(..start + OPEN.len());
            self.content(out, before);
            self.mode = Mode::Inside;
            return true;
        }
        let partial = held_prefix_len(&self.held, &[OPEN]);
        let head = &self.held[..self.held.len() - partial];
        let ready = head.trim_end().len();
        let text: String = self.held.drain(..ready).collect();
        self.content(out, text);
        false
    }

    fn inside(&mut self, out: &mut Vec<ParsedPiece>) -> bool {
        let Some(end) = self.held.find(CLOSE) else { return false };
        let body: String = self.held[..end].to_string();
        self.held.drain(..end + CLOSE.len());
        match read_call(&body) {
            Some(call) => self.call(out, call),
            None => {
                let text = format!("{}{OPEN}{body}{CLOSE}", std::mem::take(&mut self.gap));
                self.content(out, text)
            }
        }
        self.mode = Mode::Outside;
        true
    }

    /// Llama: an answer that starts with `{` (or the python tag) may be a call.
    fn undecided(&mut self) -> bool {
        let start = self.held.trim_start();
        if start.is_empty() || (PYTHON_TAG.starts_with(start) && start.len() < PYTHON_TAG.len()) {
            return false;
        }
        self.mode = if start.starts_with('{') || start.starts_with(PYTHON_TAG) { Mode::Buffering } else { Mode::Plain };
        true
    }

    fn content(&mut self, out: &mut Vec<ParsedPiece>, text: String) {
        let text = if self.after_call { text.trim_start().to_string() } else { text };
        if text.is_empty() {
            return;
        }
        self.after_call = false;
        match out.last_mut() {
            Some(ParsedPiece::Content(last)) => last.push_str(&text),
            _ => out.push(ParsedPiece::Content(text)),
        }
    }

    fn call(&mut self, out: &mut Vec<ParsedPiece>, call: ToolCall) {
        self.gap.clear();
        self.calls += 1;
        self.after_call = true;
        out.push(ParsedPiece::Call(call));
    }
}

fn read_call(body: &str) -> Option<ToolCall> {
    let value: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    ToolCall::from_json(&value)
}

/// Llama: the start of `{"name": ...` (or the python tag), as a call the budget cut off.
fn begins_like_a_call(held: &str) -> bool {
    let text = held.trim_start();
    if text.starts_with(PYTHON_TAG) {
        return true;
    }
    let Some(object) = text.strip_prefix('{') else { return false };
    let key = object.trim_start();
    key.is_empty() || "\"name\"".starts_with(key) || key.starts_with("\"name\"")
}

/// Llama's answer: one call, or several separated by `;`.
fn read_llama_calls(held: &str) -> Option<Vec<ToolCall>> {
    let text = held.trim_start();
    let text = text.strip_prefix(PYTHON_TAG).unwrap_or(text).trim();
    if let Some(call) = read_call(text) {
        return Some(vec![call]);
    }
    text.split(';').filter(|part| !part.trim().is_empty()).map(read_call).collect::<Option<Vec<_>>>()
}

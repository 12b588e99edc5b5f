//! OpenAI's API as this server's clients speak it: the request bodies they send to
//! `/v1/chat/completions` and `/v1/completions` ([`request`]), and the whole responses,
//! stream chunks, model lists and error envelopes they read back ([`response`]), with
//! tokenrouter's extensions (the `routing` trace, `usage.tokens_per_model`, vLLM's
//! `return_token_ids`). The clients are the terminal chat, pool members on another server
//! and the load generator; their servers are tokenrouter or any OpenAI-compatible one
//! (vLLM, llama.cpp), so every field read is optional or defaulted and unknown fields are
//! ignored, while a field of the wrong type is an error, never a silent zero.
//! The server's own side builds its JSON elsewhere (`src/http/response.rs`); these
//! types read what it writes.

pub mod request;
pub mod response;

pub use request::{ChatRequest, CompletionRequest, Message, Prompt, RequestOptions, StreamOptions};
pub use response::{
    ApiError, Choice, Completion, CompletionLogprobs, Delta, ErrorEnvelope, ModelCard, ModelList, PromptTokensDetails,
    RoutingTrace, Usage,
};

/// A body or chunk short enough for an error message: its first 300 characters.
pub fn excerpt(text: &str) -> String {
    match text.char_indices().nth(300) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;

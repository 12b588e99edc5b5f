//! One error type for the text side, so the HTTP layer maps it in one place: template exceptions and
//! bad message content are the client's fault (400), everything else is a server/model-folder problem.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TokenizeError {
    #[error("missing file {path}: {detail}")]
    MissingFile { path: PathBuf, detail: String },

    #[error("invalid {path}: {detail}")]
    InvalidFile { path: PathBuf, detail: String },

    /// The `tokenizers` library failed while encoding or decoding.
    #[error("tokenizer failed to {operation}: {detail}")]
    Tokenizer { operation: &'static str, detail: String },

    /// Two routed models would disagree on what a token id means.
    #[error("tokenizers disagree at id {id}: {left_name} has {left:?}, {right_name} has {right:?}")]
    VocabMismatch { id: u32, left_name: String, left: Option<String>, right_name: String, right: Option<String> },

    #[error(
        "model folder has no chat template (neither chat_template.jinja nor tokenizer_config.json's chat_template)"
    )]
    NoChatTemplate,

    /// The template source does not parse.
    #[error("chat template does not compile: {0}")]
    TemplateSyntax(String),

    /// The template itself rejected the conversation via `raise_exception(...)`.
    #[error("chat template rejected the conversation: {0}")]
    TemplateRaised(String),

    /// Rendering failed for another reason (undefined method, type error, ...).
    #[error("chat template failed to render: {0}")]
    TemplateRender(String),

    #[error("unsupported message content: {0}")]
    UnsupportedContent(String),
}

impl TokenizeError {
    /// True when the request, not the server, is at fault (maps to HTTP 400).
    pub fn is_client_error(&self) -> bool {
        matches!(self, Self::TemplateRaised(_) | Self::UnsupportedContent(_))
    }

    pub(crate) fn tokenizer(operation: &'static str, err: impl std::fmt::Display) -> Self {
        Self::Tokenizer { operation, detail: err.to_string() }
    }
}

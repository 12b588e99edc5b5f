//! The text side of serving: tokenizers loaded from HF model folders, chat templates, streaming
//! detokenization and stop strings. Pure logic, driven directly by unit tests; the tokenizer actor and
//! the request actor own these values at run time (DESIGN.md §3, §7).
//!
//! - [`TextTokenizer`]: encode/decode and special-token ids of one model folder, plus the start-up
//!   check that two routed models agree on their shared vocabulary.
//! - [`ChatTemplate`]: renders the folder's Jinja chat template exactly as HF transformers does.
//! - [`StreamDecoder`]: token ids in, text deltas out, never half a character.
//! - [`StopMatcher`]: stop strings matched across chunk boundaries of the streamed text.
//! - [`incremental`]: exact incremental tokenization of sessions (splicing at safe cuts), with
//!   the shadow verifier's checks.

mod chat;
mod config;
mod detokenize;
mod error;
pub mod incremental;
mod pyjson;
mod stop;
mod strftime;
mod tokenizer;

#[cfg(test)]
pub(crate) mod test_support;

pub use chat::{ChatMessage, ChatTemplate, ContentPart, MessageContent, RenderOptions, BUILT_IN_VARIABLES};
pub use config::{SpecialTokens, TokenizerConfig};
pub use detokenize::StreamDecoder;
pub use error::TokenizeError;
pub use stop::{held_prefix_len, StopMatch, StopMatcher, StopStep};
pub use tokenizer::{shared_vocab_check, TextTokenizer};

#[cfg(test)]
mod tests {
    /// Actors hold these across threads (the tokenizer actor, request actors, compute threads).
    #[test]
    fn public_types_are_send_and_sync() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<super::TextTokenizer>();
        assert_send_sync::<super::ChatTemplate>();
        assert_send_sync::<super::StreamDecoder>();
        assert_send_sync::<super::StopMatcher>();
        assert_send_sync::<super::TokenizeError>();
    }
}

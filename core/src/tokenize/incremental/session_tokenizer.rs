//! `SessionTokenizer`: what the tokenizer threads call. A text with a session id continues that
//! session; a text without one continues the stored session it shares the longest prefix with
//! (if long enough); otherwise it is tokenized in full and stored as a new session.
//!
//! Several threads share one: the store sits behind a lock held only to take a session out and
//! to put it back, and the tokenizing happens outside it. A session taken out is invisible to
//! other requests until put back, so two requests never work on the same cached state; when two
//! requests of one session overlap, the second tokenizes in full and the one finishing last stays
//! stored. The ids are those of full tokenization either way.

use std::sync::{Mutex, MutexGuard};

use super::session::Session;
use super::splice::{Continuation, CutWindow, Splicer};
use super::store::{SessionStore, FINGERPRINT_BYTES};
use crate::tokenize::{TextTokenizer, TokenizeError};

/// Settings of session-incremental tokenization.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionConfig {
    /// Off: every text is tokenized in full and nothing is stored.
    pub enabled: bool,
    /// Memory for stored sessions (texts, ids, offsets); least recently used go first.
    pub max_bytes: usize,
    /// A request without a session id continues a stored session only when they share at
    /// least this many leading bytes; shorter texts are not stored.
    pub min_prefix_bytes: usize,
    pub window: CutWindow,
    /// Fraction of spliced results the shadow verifier re-tokenizes in full.
    pub verify_fraction: f64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            enabled: true,
            max_bytes: 256 << 20,
            min_prefix_bytes: 1024,
            window: CutWindow::default(),
            verify_fraction: 0.01,
        }
    }
}

/// Token ids and how they were obtained.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    pub ids: Vec<u32>,
    pub path: EncodePath,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EncodePath {
    /// Tokenized in full without a session (sessions off, a short text, or specials the
    /// post-processor adds in a way not understood).
    Direct,
    /// No stored session matched: tokenized in full and stored.
    NewSession,
    /// A stored session matched; `forked` when it was copied from a longer conversation.
    Continued { continuation: Continuation, forked: bool },
}

impl EncodePath {
    /// The cut, when the ids were spliced.
    pub fn splice_cut(&self) -> Option<usize> {
        match self {
            EncodePath::Continued { continuation: Continuation::Spliced { cut, .. }, .. } => Some(*cut),
            _ => None,
        }
    }
}

/// Sessions of one tokenizer.
pub struct SessionTokenizer {
    tokenizer: TextTokenizer,
    splicer: Splicer,
    store: Mutex<SessionStore>,
    config: SessionConfig,
}

impl SessionTokenizer {
    pub fn new(tokenizer: TextTokenizer, config: SessionConfig) -> Self {
        let splicer = Splicer::new(&tokenizer, config.window);
        let store = Mutex::new(SessionStore::new(config.max_bytes));
        SessionTokenizer { tokenizer, splicer, store, config }
    }

    pub fn splicer(&self) -> &Splicer {
        &self.splicer
    }

    /// The stored sessions (locked: hold it briefly).
    pub fn store(&self) -> MutexGuard<'_, SessionStore> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Token ids of `text`, exactly as `TextTokenizer::encode` gives them.
    pub fn encode(
        &self,
        session: Option<&str>,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Encoded, TokenizeError> {
        let specials_known = self.splicer.with_specials(&[], add_special_tokens).is_some();
        let long_enough = text.len() >= self.config.min_prefix_bytes.max(FINGERPRINT_BYTES);
        match session {
            _ if !self.config.enabled || !specials_known => self.direct(text, add_special_tokens),
            Some(name) => self.encode_named(name, text, add_special_tokens),
            None if long_enough => self.encode_anonymous(text, add_special_tokens),
            None => self.direct(text, add_special_tokens),
        }
    }

    fn direct(&self, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizeError> {
        Ok(Encoded { ids: self.tokenizer.encode(text, add_special_tokens)?, path: EncodePath::Direct })
    }

    fn encode_named(&self, name: &str, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizeError> {
        let taken = self.store().take_named(name);
        let (session, path) = match taken {
            Some(mut session) => {
                let continuation = self.splicer.continue_session(&mut session, text)?;
                (session, EncodePath::Continued { continuation, forked: false })
            }
            None => (self.new_session(text)?, EncodePath::NewSession),
        };
        Ok(self.finish(session, Some(name.to_owned()), path, add_special_tokens))
    }

    fn encode_anonymous(&self, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizeError> {
        let found = self.store().take_longest_prefix(text, self.config.min_prefix_bytes);
        let (session, path) = match found {
            Some(mut found) => {
                let continuation = self.splicer.continue_session(&mut found.session, text)?;
                (found.session, EncodePath::Continued { continuation, forked: found.forked })
            }
            None => (self.new_session(text)?, EncodePath::NewSession),
        };
        Ok(self.finish(session, None, path, add_special_tokens))
    }

    fn new_session(&self, text: &str) -> Result<Session, TokenizeError> {
        let mut session = Session::default();
        self.splicer.tokenize_into(&mut session, text)?;
        Ok(session)
    }

    fn finish(&self, session: Session, name: Option<String>, path: EncodePath, add_special: bool) -> Encoded {
        let ids = self.splicer.with_specials(session.ids(), add_special).expect("checked before tokenizing");
        self.store().put(session, name);
        Encoded { ids, path }
    }
}

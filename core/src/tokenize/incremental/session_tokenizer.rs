//! `SessionTokenizer`: what the tokenizer actor calls. A text with a session id continues that
//! session; a text without one continues the stored session it shares the longest prefix with
//! (if long enough); otherwise it is tokenized in full and stored as a new session.

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
    store: SessionStore,
    config: SessionConfig,
}

impl SessionTokenizer {
    pub fn new(tokenizer: TextTokenizer, config: SessionConfig) -> Self {
        let splicer = Splicer::new(&tokenizer, config.window);
        let store = SessionStore::new(config.max_bytes);
        SessionTokenizer { tokenizer, splicer, store, config }
    }

    pub fn splicer(&self) -> &Splicer {
        &self.splicer
    }

    pub fn store(&self) -> &SessionStore {
        &self.store
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Token ids of `text`, exactly as `TextTokenizer::encode` gives them.
    pub fn encode(
        &mut self,
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

    fn encode_named(&mut self, name: &str, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizeError> {
        let (session, path) = match self.store.take_named(name) {
            Some(mut session) => {
                let continuation = self.splicer.continue_session(&mut session, text)?;
                (session, EncodePath::Continued { continuation, forked: false })
            }
            None => (self.new_session(text)?, EncodePath::NewSession),
        };
        Ok(self.finish(session, Some(name.to_owned()), path, add_special_tokens))
    }

    fn encode_anonymous(&mut self, text: &str, add_special_tokens: bool) -> Result<Encoded, TokenizeError> {
        let (session, path) = match self.store.take_longest_prefix(text, self.config.min_prefix_bytes) {
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

    fn finish(&mut self, session: Session, name: Option<String>, path: EncodePath, add_special: bool) -> Encoded {
        let ids = self.splicer.with_specials(session.ids(), add_special).expect("checked before tokenizing");
        self.store.put(session, name);
        Encoded { ids, path }
    }
}

//! Session-incremental tokenization shared by the tokenizer threads. It decides as core's
//! `SessionTokenizer` does (named session, else longest common prefix, else full), but its store
//! sits behind a lock held only to take a session out and to put it back: the tokenizing happens
//! outside the lock, so one session's long prompt does not hold up another session.
//!
//! A session taken out is invisible to other requests until put back, so two requests never
//! work on the same cached state. When two requests of one session overlap, the second finds
//! nothing stored and tokenizes in full; the one finishing last is what stays stored. The ids are
//! those of full tokenization either way: only the saving is lost, and only for that overlap.

use parking_lot::Mutex;
use tokenrouter_core::tokenize::incremental::{
    EncodePath, Encoded, Session, SessionConfig, SessionStore, Splicer, FINGERPRINT_BYTES,
};
use tokenrouter_core::tokenize::{TextTokenizer, TokenizeError};

pub struct SharedSessions {
    tokenizer: TextTokenizer,
    splicer: Splicer,
    store: Mutex<SessionStore>,
    config: SessionConfig,
}

impl SharedSessions {
    pub fn new(tokenizer: TextTokenizer, config: SessionConfig) -> Self {
        let splicer = Splicer::new(&tokenizer, config.window);
        let store = Mutex::new(SessionStore::new(config.max_bytes));
        SharedSessions { tokenizer, splicer, store, config }
    }

    pub fn splicer(&self) -> &Splicer {
        &self.splicer
    }

    pub fn config(&self) -> &SessionConfig {
        &self.config
    }

    /// Bytes held by stored sessions.
    pub fn stored_bytes(&self) -> usize {
        self.store.lock().bytes()
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
        let taken = self.store.lock().take_named(name);
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
        let found = self.store.lock().take_longest_prefix(text, self.config.min_prefix_bytes);
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
        self.store.lock().put(session, name);
        Encoded { ids, path }
    }
}

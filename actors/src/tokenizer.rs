//! The tokenizer actor: prompts become token ids here (chat templates included). It owns the
//! session state of incremental tokenization (DESIGN.md §7): a request that continues a
//! session (by id, or by a long common prefix) re-tokenizes only its end. Sampled spliced
//! results go to the shadow verifier's thread.
//!
//! The actor only dispatches: rendering and tokenizing run on a small pool of OS threads
//! (`pool`), which reply to the caller themselves. So a long prompt blocks neither the async
//! runtime nor the requests behind it, and prompts tokenize in parallel.

mod pool;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use parking_lot::Mutex;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokenrouter_core::tokenize::incremental::{
    Continuation, EncodePath, FallbackReason, SessionConfig, VerifyJob, VerifySampler,
};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer, TokenizeError};

use crate::shadow_verifier::ShadowVerifier;
use pool::TokenizerPool;
pub use pool::{default_workers, THREADS_VAR};
use tokenrouter_core::tokenize::incremental::SessionTokenizer;

pub enum TokenizerMsg {
    Encode {
        text: String,
        add_special_tokens: bool,
        /// Continue this session (a client-chosen id); `None`: matched by common prefix.
        session: Option<String>,
        reply: RpcReplyPort<Result<Vec<u32>, TokenizeError>>,
    },
    /// Renders a conversation with the chat template and encodes it.
    Chat {
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        session: Option<String>,
        reply: RpcReplyPort<Result<RenderedChat, TokenizeError>>,
    },
    /// New session settings; stored sessions are dropped.
    ConfigureSessions(SessionConfig),
    /// Answers at once: the actor is alive (for health checks).
    Ping(RpcReplyPort<()>),
    /// Test hook: fail as a bug in this actor would.
    InjectPanic,
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for TokenizerMsg {}

#[derive(Debug, Clone)]
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
}

/// Tokenizes on [`default_workers`] threads.
pub struct TokenizerActor;

/// The actor's state: the work every thread shares, and the threads.
pub struct TokenizerState {
    work: Arc<Tokenization>,
    pool: TokenizerPool,
}

impl TokenizerState {
    fn start(tokenizer: TextTokenizer, workers: usize) -> Result<Self, ActorProcessingErr> {
        let template = match ChatTemplate::from_config(tokenizer.config()) {
            Ok(t) => Some(Arc::new(t)),
            Err(TokenizeError::NoChatTemplate) => None,
            Err(e) => return Err(format!("chat template of {}: {e}", tokenizer.name()).into()),
        };
        let work = Arc::new(Tokenization::new(tokenizer, template, SessionConfig::default())?);
        Ok(TokenizerState { work, pool: TokenizerPool::spawn(workers)? })
    }

    /// Hands a request to the threads (they reply); waits only while their queue is full.
    async fn dispatch(&mut self, msg: TokenizerMsg) -> Result<(), ActorProcessingErr> {
        let work = Arc::clone(&self.work);
        match msg {
            TokenizerMsg::Encode { text, add_special_tokens, session, reply } => {
                let job = move || {
                    let _ = reply.send(work.encode(session.as_deref(), &text, add_special_tokens));
                };
                self.pool.submit(job).await?;
            }
            TokenizerMsg::Chat { messages, options, session, reply } => {
                let job = move || {
                    let _ = reply.send(work.render(&messages, &options, session.as_deref()));
                };
                self.pool.submit(job).await?;
            }
            // Requests already queued finish on the old sessions, which are then dropped.
            TokenizerMsg::ConfigureSessions(config) => self.work = Arc::new(self.work.reconfigured(config)?),
            TokenizerMsg::Ping(reply) => {
                let _ = reply.send(());
            }
            TokenizerMsg::InjectPanic => panic!("injected tokenizer-actor fault"),
        }
        Ok(())
    }
}

/// What a tokenizer thread needs; shared by all of them. Only the session store and the
/// sampler change, each behind a lock held briefly.
struct Tokenization {
    tokenizer: TextTokenizer,
    template: Option<Arc<ChatTemplate>>,
    sessions: SessionTokenizer,
    sampler: Mutex<VerifySampler>,
    verifier: ShadowVerifier,
}

impl Tokenization {
    fn new(
        tokenizer: TextTokenizer,
        template: Option<Arc<ChatTemplate>>,
        config: SessionConfig,
    ) -> std::io::Result<Self> {
        let sessions = SessionTokenizer::new(tokenizer.clone(), config);
        if let Err(why) = sessions.splicer().eligibility() {
            tracing::info!(tokenizer = tokenizer.name(), %why, "sessions tokenize in full");
        }
        let verifier = ShadowVerifier::spawn(tokenizer.clone(), sessions.splicer().switch().clone())?;
        let sampler = Mutex::new(VerifySampler::new(sessions.config().verify_fraction, 0x5eed));
        Ok(Tokenization { tokenizer, template, sessions, sampler, verifier })
    }

    /// Same tokenizer, new settings. A verifier's verdict survives: splicing stays off.
    fn reconfigured(&self, config: SessionConfig) -> std::io::Result<Self> {
        let next = Tokenization::new(self.tokenizer.clone(), self.template.clone(), config)?;
        if !self.sessions.splicer().switch().is_on() {
            next.sessions.splicer().switch().turn_off();
        }
        Ok(next)
    }

    fn encode(&self, session: Option<&str>, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoded = self.sessions.encode(session, text, add_special)?;
        record(&encoded.path, self.sessions.store().bytes());
        if let Some(cut) = encoded.path.splice_cut() {
            if self.sampler.lock().sample() {
                let job =
                    VerifyJob { text: text.to_owned(), ids: encoded.ids.clone(), add_special_tokens: add_special, cut };
                self.verifier.submit(job);
            }
        }
        Ok(encoded.ids)
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        options: &RenderOptions,
        session: Option<&str>,
    ) -> Result<RenderedChat, TokenizeError> {
        let template = self.template.as_ref().ok_or(TokenizeError::NoChatTemplate)?;
        let text = template.render(messages, options)?;
        // The template writes special tokens (BOS included) itself.
        let ids = self.encode(session, &text, false)?;
        Ok(RenderedChat { text, ids })
    }
}

impl Actor for TokenizerActor {
    type Msg = TokenizerMsg;
    type State = TokenizerState;
    type Arguments = TextTokenizer;

    async fn pre_start(
        &self,
        _: ActorRef<TokenizerMsg>,
        tokenizer: TextTokenizer,
    ) -> Result<TokenizerState, ActorProcessingErr> {
        TokenizerState::start(tokenizer, default_workers())
    }

    async fn handle(
        &self,
        _: ActorRef<TokenizerMsg>,
        msg: TokenizerMsg,
        state: &mut TokenizerState,
    ) -> Result<(), ActorProcessingErr> {
        state.dispatch(msg).await
    }
}

/// Counters of what sessions did (hits, widenings, fallbacks; verifications and mismatches are
/// counted by the verifier).
fn record(path: &EncodePath, session_bytes: usize) {
    metrics::gauge!("tokenrouter_tokenize_session_bytes").set(session_bytes as f64);
    let continuation = match path {
        EncodePath::Direct => return,
        EncodePath::NewSession => return metrics::counter!("tokenrouter_tokenize_new_sessions_total").increment(1),
        EncodePath::Continued { continuation, .. } => continuation,
    };
    let (widenings, fallback) = match continuation {
        Continuation::Unchanged => (0, None),
        Continuation::Spliced { widenings, .. } => (*widenings, None),
        Continuation::Fallback { reason, widenings } => (*widenings, Some(*reason)),
    };
    metrics::counter!("tokenrouter_tokenize_widenings_total").increment(widenings as u64);
    match fallback {
        None => metrics::counter!("tokenrouter_tokenize_session_hits_total").increment(1),
        Some(reason) => {
            let reason = match reason {
                FallbackReason::Ineligible => "ineligible",
                FallbackReason::SwitchedOff => "switched_off",
                FallbackReason::NoSafeCut => "no_safe_cut",
            };
            metrics::counter!("tokenrouter_tokenize_fallbacks_total", "reason" => reason).increment(1);
        }
    }
}

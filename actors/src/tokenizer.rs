//! The tokenizer actor: prompts become token ids here (chat templates included). It owns the
//! session state of incremental tokenization (DESIGN.md §7): a request that continues a
//! session (by id, or by a long common prefix) re-tokenizes only its end. Sampled spliced
//! results go to the shadow verifier's thread.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokenrouter_core::tokenize::incremental::{
    Continuation, EncodePath, FallbackReason, SessionConfig, SessionTokenizer, VerifyJob, VerifySampler,
};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer, TokenizeError};

use crate::shadow_verifier::ShadowVerifier;

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
}

// Local only: ractor's `cluster` feature drops the blanket impl (see remote/).
impl ractor::Message for TokenizerMsg {}

#[derive(Debug, Clone)]
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
}

pub struct TokenizerActor;

pub struct TokenizerState {
    tokenizer: TextTokenizer,
    template: Option<ChatTemplate>,
    sessions: SessionTokenizer,
    sampler: VerifySampler,
    verifier: ShadowVerifier,
}

impl TokenizerState {
    fn new(tokenizer: TextTokenizer, template: Option<ChatTemplate>, config: SessionConfig) -> std::io::Result<Self> {
        let sessions = SessionTokenizer::new(tokenizer.clone(), config);
        if let Err(why) = sessions.splicer().eligibility() {
            tracing::info!(tokenizer = tokenizer.name(), %why, "sessions tokenize in full");
        }
        let verifier = ShadowVerifier::spawn(tokenizer.clone(), sessions.splicer().switch().clone())?;
        let sampler = VerifySampler::new(sessions.config().verify_fraction, 0x5eed);
        Ok(TokenizerState { tokenizer, template, sessions, sampler, verifier })
    }

    /// Same tokenizer, new settings. A verifier's verdict survives: splicing stays off.
    fn reconfigured(self, config: SessionConfig) -> std::io::Result<Self> {
        let was_off = !self.sessions.splicer().switch().is_on();
        let next = TokenizerState::new(self.tokenizer, self.template, config)?;
        if was_off {
            next.sessions.splicer().switch().turn_off();
        }
        Ok(next)
    }

    fn encode(&mut self, session: Option<&str>, text: &str, add_special: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoded = self.sessions.encode(session, text, add_special)?;
        record(&encoded.path, self.sessions.store().bytes());
        if let Some(cut) = encoded.path.splice_cut() {
            if self.sampler.sample() {
                let job =
                    VerifyJob { text: text.to_owned(), ids: encoded.ids.clone(), add_special_tokens: add_special, cut };
                self.verifier.submit(job);
            }
        }
        Ok(encoded.ids)
    }

    fn render(
        &mut self,
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
    type State = Option<TokenizerState>;
    type Arguments = TextTokenizer;

    async fn pre_start(
        &self,
        _: ActorRef<TokenizerMsg>,
        tokenizer: TextTokenizer,
    ) -> Result<Option<TokenizerState>, ActorProcessingErr> {
        let template = match ChatTemplate::from_config(tokenizer.config()) {
            Ok(t) => Some(t),
            Err(TokenizeError::NoChatTemplate) => None,
            Err(e) => return Err(format!("chat template of {}: {e}", tokenizer.name()).into()),
        };
        Ok(Some(TokenizerState::new(tokenizer, template, SessionConfig::default())?))
    }

    async fn handle(
        &self,
        _: ActorRef<TokenizerMsg>,
        msg: TokenizerMsg,
        state: &mut Option<TokenizerState>,
    ) -> Result<(), ActorProcessingErr> {
        let s = state.as_mut().ok_or("the tokenizer state was lost while reconfiguring")?;
        match msg {
            TokenizerMsg::Encode { text, add_special_tokens, session, reply } => {
                let _ = reply.send(s.encode(session.as_deref(), &text, add_special_tokens));
            }
            TokenizerMsg::Chat { messages, options, session, reply } => {
                let _ = reply.send(s.render(&messages, &options, session.as_deref()));
            }
            TokenizerMsg::ConfigureSessions(config) => {
                let current = state.take().expect("checked above");
                *state = Some(current.reconfigured(config)?);
            }
        }
        Ok(())
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

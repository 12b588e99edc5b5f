//! The tokenizer actor: prompts become token ids here (chat templates included). It
//! is a message interface, not a function call, so that session-incremental
//! tokenization can keep per-session state behind it later.

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokenrouter_core::tokenize::{ChatMessage, ChatTemplate, RenderOptions, TextTokenizer, TokenizeError};

pub enum TokenizerMsg {
    Encode {
        text: String,
        add_special_tokens: bool,
        reply: RpcReplyPort<Result<Vec<u32>, TokenizeError>>,
    },
    /// Renders a conversation with the chat template and encodes it.
    Chat {
        messages: Vec<ChatMessage>,
        options: RenderOptions,
        reply: RpcReplyPort<Result<RenderedChat, TokenizeError>>,
    },
}

#[derive(Debug, Clone)]
pub struct RenderedChat {
    pub text: String,
    pub ids: Vec<u32>,
}

pub struct TokenizerActor;

pub struct TokenizerState {
    tokenizer: TextTokenizer,
    template: Option<ChatTemplate>,
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
        let template = match ChatTemplate::from_config(tokenizer.config()) {
            Ok(t) => Some(t),
            Err(TokenizeError::NoChatTemplate) => None,
            Err(e) => return Err(format!("chat template of {}: {e}", tokenizer.name()).into()),
        };
        Ok(TokenizerState { tokenizer, template })
    }

    async fn handle(
        &self,
        _: ActorRef<TokenizerMsg>,
        msg: TokenizerMsg,
        s: &mut TokenizerState,
    ) -> Result<(), ActorProcessingErr> {
        match msg {
            TokenizerMsg::Encode { text, add_special_tokens, reply } => {
                let _ = reply.send(s.tokenizer.encode(&text, add_special_tokens));
            }
            TokenizerMsg::Chat { messages, options, reply } => {
                let _ = reply.send(render(s, &messages, &options));
            }
        }
        Ok(())
    }
}

fn render(
    s: &TokenizerState,
    messages: &[ChatMessage],
    options: &RenderOptions,
) -> Result<RenderedChat, TokenizeError> {
    let template = s.template.as_ref().ok_or(TokenizeError::NoChatTemplate)?;
    let text = template.render(messages, options)?;
    // The template writes special tokens (BOS included) itself.
    let ids = s.tokenizer.encode(&text, false)?;
    Ok(RenderedChat { text, ids })
}

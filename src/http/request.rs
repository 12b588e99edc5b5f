//! The body of `POST /v1/chat/completions` and `POST /v1/completions` (one type: the
//! endpoints share almost every field, and one type keeps field paths in errors
//! exact), and its translation into an engine `GenerateRequest`.

use std::collections::hash_map::RandomState;
use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::{Map, Value};
use tokenrouter_actors::{EngineError, GenerateRequest};
use tokenrouter_core::model::sampler::{SamplingError, SamplingParams, MAX_LOGPROBS};
use tokenrouter_core::policy::Policy;
use tokenrouter_core::tokenize::{ChatMessage, RenderOptions};
use tokenrouter_core::tools::ToolSyntax;

use super::error::ApiError;
use super::fields;
use super::routing::RoutingRequest;
use super::speculation::{speculation_of, SpeculativeRequest};
use super::state::{AppState, RequestLimits};
use super::tools::{ToolFields, ToolPlan};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Completions,
}

/// `null` reads as absent. A field this server does not implement is refused by name
/// (see [`fields::refuse_unknown`]), unless it is one of OpenAI's harmless hints.
#[derive(Debug, Default, Deserialize)]
pub struct OpenAiRequest {
    pub model: Option<String>,
    /// Chat only.
    pub messages: Option<Vec<ChatMessage>>,
    /// Completions only.
    pub prompt: Option<Prompt>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's convention: -1 (or 0) is off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<i64>,
    pub max_tokens: Option<u64>,
    pub max_completion_tokens: Option<u64>,
    pub stop: Option<Stop>,
    /// vLLM extension: token ids that end the request.
    pub stop_token_ids: Option<Vec<u32>>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// vLLM extension.
    pub repetition_penalty: Option<f32>,
    /// Chat: a boolean (with `top_logprobs`); completions: the number of alternatives.
    pub logprobs: Option<Logprobs>,
    pub top_logprobs: Option<u32>,
    pub n: Option<u32>,
    pub best_of: Option<u32>,
    pub echo: Option<bool>,
    /// Accepted and ignored (OpenAI uses it for abuse monitoring).
    pub user: Option<String>,
    /// vLLM extensions.
    pub ignore_eos: Option<bool>,
    pub skip_special_tokens: Option<bool>,
    pub add_generation_prompt: Option<bool>,
    pub chat_template_kwargs: Option<Map<String, Value>>,
    /// vLLM extension: each choice also carries the output's `token_ids`, so a
    /// client can continue from exact ids (an external dispatcher does).
    pub return_token_ids: Option<bool>,
    /// The tokenization session this prompt continues (also the `X-Session-Id`
    /// header): only the end of a resent transcript is re-tokenized.
    pub session_id: Option<String>,
    pub routing: Option<RoutingRequest>,
    /// Structured outputs; kept as JSON so that an unknown `type` is named in the error.
    pub response_format: Option<Value>,
    /// Token id (a string, as OpenAI sends it) to a bias in -100..=100.
    pub logit_bias: Option<BTreeMap<String, f64>>,
    /// Chat only: the functions the model may call, and how (see [`tools`]); kept as
    /// JSON so that errors name the exact field.
    pub tools: Option<Value>,
    pub tool_choice: Option<Value>,
    pub parallel_tool_calls: Option<bool>,
    /// Speculative decoding: drafts from the request's own text (this server's field).
    pub speculative: Option<SpeculativeRequest>,
    /// OpenAI's Predicted Outputs: a draft of the output; kept as JSON for exact errors.
    pub prediction: Option<Value>,
    /// Every other field; refused unless harmless.
    #[serde(flatten)]
    pub unrecognized: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Tokens(Vec<u32>),
    /// A batch of prompts; only one is served.
    Texts(Vec<String>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(untagged)]
pub enum Logprobs {
    Flag(bool),
    Count(u32),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// A validated request, ready for the engine and for shaping its response.
pub struct Plan {
    pub endpoint: Endpoint,
    pub generate: GenerateRequest,
    /// Choices to generate from the one prompt.
    pub n: usize,
    pub stream: bool,
    pub include_usage: bool,
    /// Report the model of every token (`routing.trace`).
    pub trace: bool,
    /// The request speculates: a trace also says which tokens were verified drafts.
    pub speculates: bool,
    /// Report logprobs with this many alternatives.
    pub logprobs: Option<usize>,
    /// Report the output's token ids (`return_token_ids`).
    pub token_ids: bool,
    /// The model name echoed in the response.
    pub model: String,
    /// The text the prompt was tokenized from (rendered chat or completion prompt).
    pub prompt_text: Option<String>,
    /// Tool calls are read out of the output in this syntax (`tools` with a
    /// `tool_choice` other than `none`).
    pub tool_syntax: Option<ToolSyntax>,
    /// The grammar is the tools' (`tool_choice` required or named), not `response_format`'s.
    pub tools_forced: bool,
    /// Completions with `echo`: the prompt's text, which each choice's text starts with.
    pub echo: Option<String>,
    /// A stop string the server added (the end of a call, for `parallel_tool_calls:
    /// false`) and the client did not give: never reported as the one that ended a choice.
    pub server_stop: Option<&'static str>,
}

/// Most choices one request may ask for (`n`).
pub const MAX_CHOICES: u32 = 16;

impl Plan {
    /// One engine request per choice. Choice `i` samples with seed `seed + i`, so each
    /// is reproducible alone: an `n = 1` request with that seed gives the same output.
    pub fn choice_requests(&self) -> Vec<GenerateRequest> {
        (0..self.n as u64)
            .map(|i| {
                let mut request = self.generate.clone();
                request.sampling.seed = request.sampling.seed.wrapping_add(i);
                request
            })
            .collect()
    }

    /// The engine's refusal as the client should read it: a grammar that does not
    /// compile came from the tools' parameters when the tools force a call.
    pub fn engine_error(&self, error: EngineError) -> ApiError {
        match error {
            EngineError::InvalidGrammar(m) if self.tools_forced => {
                ApiError::bad_request(format!("a tool's parameters cannot be enforced: {m}"), Some("tools"))
            }
            other => ApiError::from(other),
        }
    }
}

impl OpenAiRequest {
    /// A chat body another API's request was translated into, read as chat's own body
    /// is (so its field errors are chat's).
    pub fn from_chat_json(chat: &Value) -> Result<Self, ApiError> {
        let bytes = serde_json::to_vec(chat).map_err(|e| ApiError::Internal(e.to_string()))?;
        super::extract::parse_json(&bytes)
    }

    /// Validates, resolves the policy, tokenizes and checks lengths. Cheap checks
    /// come first so a bad request costs no tokenization.
    pub async fn plan(mut self, state: &AppState, endpoint: Endpoint) -> Result<Plan, ApiError> {
        let bad = |m: &str, p: &str| Err(ApiError::bad_request(m, Some(p)));
        let n = self.n.unwrap_or(1);
        if !(1..=MAX_CHOICES).contains(&n) {
            return Err(ApiError::bad_request(format!("n must be in 1..={MAX_CHOICES}, got {n}"), Some("n")));
        }
        if self.best_of.is_some_and(|n| n != 1) {
            return bad("only best_of = 1 is supported", "best_of");
        }
        fields::refuse_unknown(&self.unrecognized)?;
        let limits = &state.limits.request;
        let grammar = fields::grammar_of(self.response_format.as_ref(), limits.max_grammar_bytes)?;
        let tools = self.tool_plan(state, endpoint, grammar.is_some())?;
        fields::check_template_kwargs(self.chat_template_kwargs.as_ref())?;
        let vocab = state.engine.vocab_size();
        let logit_bias = fields::logit_bias_of(self.logit_bias.as_ref(), vocab)?;
        let mut stop = self.stop_strings(limits)?;
        let server_stop = tools.as_ref().and_then(|t| t.stop_after_call).filter(|s| !stop.iter().any(|own| own == s));
        stop.extend(server_stop.map(str::to_string));
        let stop_ids = self.stop_token_ids(limits, vocab)?;
        self.check_session_id(limits)?;
        let model = state.check_model(self.model.as_deref())?;
        let logprobs = self.logprobs_wanted(endpoint, limits.max_top_logprobs)?;
        let echo = self.echo_wanted(endpoint, logprobs)?;
        let policy = self.resolve_policy(state)?;
        let mut sampling = self.sampling(logprobs)?;
        sampling.logit_bias = logit_bias;
        let speculation = speculation_of(self.speculative.as_ref(), self.prediction.as_ref(), state).await?;
        let definitions = tools.as_ref().map(|t| t.definitions.clone());
        let (prompt, prompt_text, prompt_param) = self.tokenize(state, endpoint, definitions).await?;
        check_prompt_ids(&prompt, vocab, prompt_param)?;
        let max_tokens = self.max_tokens(state, prompt.len(), prompt_param)?;
        let echo = match (echo, &prompt_text) {
            (false, _) => None,
            (true, Some(text)) => Some(text.clone()),
            (true, None) => Some(state.decode(prompt.clone()).await?),
        };
        let mut generate = GenerateRequest::new(prompt, max_tokens);
        generate.sampling = sampling;
        generate.policy = policy;
        generate.stop = stop;
        generate.stop_ids = stop_ids;
        generate.ignore_eos = self.ignore_eos.unwrap_or(false);
        generate.skip_special_tokens = self.skip_special_tokens.unwrap_or(true);
        let tools_forced = tools.as_ref().is_some_and(|t| t.grammar.is_some());
        generate.grammar = grammar.or(tools.as_ref().and_then(|t| t.grammar.clone()));
        let speculates = speculation.is_some();
        generate.speculation = speculation;
        Ok(Plan {
            endpoint,
            generate,
            n: n as usize,
            stream: self.stream.unwrap_or(false),
            include_usage: self.stream_options.is_some_and(|o| o.include_usage),
            trace: self.routing.is_some_and(|r| r.trace),
            speculates,
            logprobs,
            token_ids: self.return_token_ids.unwrap_or(false),
            model,
            prompt_text,
            tool_syntax: tools.and_then(|t| t.parse),
            tools_forced,
            echo,
            server_stop,
        })
    }

    /// `echo` (completions): the prompt's text before the output. Prompt logprobs
    /// are not computed, so echo with logprobs is refused rather than half-done.
    fn echo_wanted(&self, endpoint: Endpoint, logprobs: Option<usize>) -> Result<bool, ApiError> {
        match (self.echo.unwrap_or(false), endpoint, logprobs) {
            (false, _, _) => Ok(false),
            (true, Endpoint::Chat, _) => Err(ApiError::bad_request("echo is for /v1/completions", Some("echo"))),
            (true, Endpoint::Completions, Some(_)) => Err(ApiError::bad_request(
                "echo with logprobs is not supported (prompt logprobs are not computed)",
                Some("echo"),
            )),
            (true, Endpoint::Completions, None) => Ok(true),
        }
    }

    /// The tools, checked against the endpoint and `response_format` (a grammar for
    /// the content and calls the model may make would contradict each other).
    fn tool_plan(&self, state: &AppState, endpoint: Endpoint, has_format: bool) -> Result<Option<ToolPlan>, ApiError> {
        let fields = ToolFields {
            tools: self.tools.as_ref(),
            tool_choice: self.tool_choice.as_ref(),
            parallel_tool_calls: self.parallel_tool_calls,
        };
        let plan = fields.plan(endpoint, state.engine.tool_syntax(), &state.limits.request)?;
        if has_format && plan.as_ref().is_some_and(|p| p.parse.is_some()) {
            return Err(ApiError::bad_request(
                "response_format cannot be combined with tools the model may call (tool_choice other than none)",
                Some("response_format"),
            ));
        }
        Ok(plan)
    }

    /// `stop` as a list, within the count and length limits; empty strings would end
    /// every request at once.
    fn stop_strings(&mut self, limits: &RequestLimits) -> Result<Vec<String>, ApiError> {
        let stop = match self.stop.take() {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s],
            Some(Stop::Many(v)) => v,
        };
        let bad = |m: String| Err(ApiError::bad_request(m, Some("stop")));
        if stop.len() > limits.max_stop_strings {
            return bad(format!("{} stop strings; this server allows at most {}", stop.len(), limits.max_stop_strings));
        }
        if stop.iter().any(String::is_empty) {
            return bad("stop strings must not be empty".into());
        }
        if let Some(long) = stop.iter().find(|s| s.len() > limits.max_stop_string_bytes) {
            let max = limits.max_stop_string_bytes;
            return bad(format!("a stop string has {} bytes; this server allows at most {max}", long.len()));
        }
        Ok(stop)
    }

    /// `stop_token_ids`, within the count limit and the vocabulary (when known).
    fn stop_token_ids(&mut self, limits: &RequestLimits, vocab: Option<usize>) -> Result<Vec<u32>, ApiError> {
        let ids = self.stop_token_ids.take().unwrap_or_default();
        let bad = |m: String| Err(ApiError::bad_request(m, Some("stop_token_ids")));
        if ids.len() > limits.max_stop_token_ids {
            return bad(format!(
                "{} stop token ids; this server allows at most {}",
                ids.len(),
                limits.max_stop_token_ids
            ));
        }
        if let Some((id, vocab)) = vocab.and_then(|v| ids.iter().find(|&&t| t as usize >= v).map(|&t| (t, v))) {
            return bad(format!("token id {id} is outside the vocabulary (size {vocab})"));
        }
        Ok(ids)
    }

    /// Sessions are kept on the server under their id: a long id is memory the client
    /// chooses.
    fn check_session_id(&self, limits: &RequestLimits) -> Result<(), ApiError> {
        match &self.session_id {
            Some(id) if id.len() > limits.max_session_id_bytes => Err(ApiError::bad_request(
                format!(
                    "session_id has {} bytes; this server allows at most {}",
                    id.len(),
                    limits.max_session_id_bytes
                ),
                Some("session_id"),
            )),
            _ => Ok(()),
        }
    }

    /// The policy the request chose; `routing.params` is bounded before it is parsed
    /// into a policy (a distinct parameter set may build one).
    fn resolve_policy(&self, state: &AppState) -> Result<Option<Arc<dyn Policy>>, ApiError> {
        let max = state.limits.request.max_routing_params_bytes;
        if let Some(params) = self.routing.as_ref().and_then(|r| r.params.as_ref()) {
            let size = fields::json_bytes(params);
            if size > max {
                let m = format!("routing.params has {size} bytes as JSON; this server allows at most {max}");
                return Err(ApiError::bad_request(m, Some("routing.params")));
            }
        }
        state.policies.resolve(self.routing.as_ref())
    }

    /// Alternatives per token: chat's `logprobs: true` + `top_logprobs`, or the
    /// completions' integer `logprobs`; at most `max` (and the sampler's cap).
    fn logprobs_wanted(&self, endpoint: Endpoint, max: usize) -> Result<Option<usize>, ApiError> {
        let wanted = self.logprobs_by_convention(endpoint)?;
        let max = max.min(MAX_LOGPROBS);
        match wanted {
            Some(n) if n > max => {
                let param = if endpoint == Endpoint::Chat { "top_logprobs" } else { "logprobs" };
                let m = format!("{param} is {n}; this server allows at most {max} alternatives per token");
                Err(ApiError::bad_request(m, Some(param)))
            }
            _ => Ok(wanted),
        }
    }

    fn logprobs_by_convention(&self, endpoint: Endpoint) -> Result<Option<usize>, ApiError> {
        match (endpoint, self.logprobs) {
            (Endpoint::Chat, None | Some(Logprobs::Flag(false))) if self.top_logprobs.is_some_and(|n| n > 0) => {
                Err(ApiError::bad_request("top_logprobs needs logprobs: true", Some("top_logprobs")))
            }
            (Endpoint::Chat, None | Some(Logprobs::Flag(false))) => Ok(None),
            (Endpoint::Chat, Some(Logprobs::Flag(true))) => Ok(Some(self.top_logprobs.unwrap_or(0) as usize)),
            (Endpoint::Chat, Some(Logprobs::Count(_))) => Err(ApiError::bad_request(
                "logprobs must be a boolean; use top_logprobs for alternatives",
                Some("logprobs"),
            )),
            (Endpoint::Completions, None | Some(Logprobs::Flag(false))) => Ok(None),
            (Endpoint::Completions, Some(Logprobs::Count(n))) => Ok(Some(n as usize)),
            (Endpoint::Completions, Some(Logprobs::Flag(true))) => {
                Err(ApiError::bad_request("logprobs must be an integer (alternatives per token)", Some("logprobs")))
            }
        }
    }

    fn sampling(&self, logprobs: Option<usize>) -> Result<SamplingParams, ApiError> {
        let d = SamplingParams::default();
        let p = SamplingParams {
            temperature: self.temperature.unwrap_or(d.temperature),
            top_k: self.top_k.map(|k| k.max(0) as usize).unwrap_or(d.top_k),
            top_p: self.top_p.unwrap_or(d.top_p),
            min_p: self.min_p.unwrap_or(d.min_p),
            repetition_penalty: self.repetition_penalty.unwrap_or(d.repetition_penalty),
            presence_penalty: self.presence_penalty.unwrap_or(d.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(d.frequency_penalty),
            // No seed: a fresh one, so identical requests differ as OpenAI's do.
            seed: self.seed.map(|s| s as u64).unwrap_or_else(random_seed),
            logprobs,
            ..d
        };
        p.validate().map_err(|e| {
            let param = match &e {
                SamplingError::NotFinite { field, .. } | SamplingError::PenaltyOutOfRange { field, .. } => field,
                SamplingError::NegativeTemperature(_) => "temperature",
                SamplingError::TopPOutOfRange(_) => "top_p",
                SamplingError::MinPOutOfRange(_) => "min_p",
                SamplingError::RepetitionPenaltyNotPositive(_) => "repetition_penalty",
                SamplingError::TooManyLogprobs(_) if self.top_logprobs.is_some() => "top_logprobs",
                SamplingError::TooManyLogprobs(_) => "logprobs",
                SamplingError::LogitBiasOutOfRange { .. } => "logit_bias",
            };
            ApiError::bad_request(e.to_string(), Some(param))
        })?;
        Ok(p)
    }

    /// The prompt's token ids, the text they came from (none for token-id prompts),
    /// and the field it came from (for error params).
    async fn tokenize(
        &self,
        state: &AppState,
        endpoint: Endpoint,
        tools: Option<Vec<Value>>,
    ) -> Result<(Vec<u32>, Option<String>, &'static str), ApiError> {
        let session = self.session_id.clone();
        let (ids, text) = match endpoint {
            Endpoint::Chat => {
                let Some(mut messages) = self.messages.clone() else {
                    return Err(ApiError::bad_request("`messages` is required", Some("messages")));
                };
                if messages.is_empty() {
                    return Err(ApiError::bad_request("`messages` must not be empty", Some("messages")));
                }
                fields::check_roles(&mut messages)?;
                let options = RenderOptions {
                    add_generation_prompt: self.add_generation_prompt.unwrap_or(true),
                    extra: self.chat_template_kwargs.clone().unwrap_or_default(),
                    tools,
                };
                let rendered = state.engine.chat_in_session(messages, options, session).await?;
                return Ok((rendered.ids, Some(rendered.text), "messages"));
            }
            Endpoint::Completions => match self.prompt.clone() {
                None => return Err(ApiError::bad_request("`prompt` is required", Some("prompt"))),
                Some(Prompt::Tokens(ids)) => (ids, None),
                Some(Prompt::TokenLists(mut lists)) if lists.len() == 1 => (lists.remove(0), None),
                Some(Prompt::Text(text)) => {
                    (state.engine.encode_in_session(text.clone(), true, session).await?, Some(text))
                }
                Some(Prompt::Texts(mut texts)) if texts.len() == 1 => {
                    let text = texts.remove(0);
                    (state.engine.encode_in_session(text.clone(), true, session).await?, Some(text))
                }
                Some(_) => {
                    return Err(ApiError::bad_request("only one prompt per request is supported", Some("prompt")))
                }
            },
        };
        Ok((ids, text, "prompt"))
    }

    /// The output budget: as asked (within the server's limit and the context), or
    /// what the context leaves (within the limit).
    fn max_tokens(&self, state: &AppState, prompt_len: usize, prompt_param: &str) -> Result<usize, ApiError> {
        let context = state.engine.max_context();
        check_prompt_len(prompt_len, context, state.limits.request.max_prompt_tokens, prompt_param)?;
        let limit = state.limits.max_tokens_limit;
        let (asked, param) = match (self.max_completion_tokens, self.max_tokens) {
            (Some(n), _) => (n, "max_completion_tokens"),
            (None, Some(n)) => (n, "max_tokens"),
            (None, None) => return Ok(limit.min(context - prompt_len)),
        };
        if asked == 0 {
            return Err(ApiError::bad_request(format!("{param} must be at least 1"), Some(param)));
        }
        if asked > limit as u64 {
            return Err(ApiError::bad_request(
                format!("{param} is {asked}; this server allows at most {limit}"),
                Some(param),
            ));
        }
        let asked = asked as usize;
        if prompt_len + asked > context {
            let m = format!(
                "this model's context is {context} tokens; the prompt has {prompt_len} and {param} asks {asked} more"
            );
            return Err(ApiError::bad_request(m, Some(param)));
        }
        Ok(asked)
    }
}

/// A prompt must leave room for one output token, and stay within the server's
/// prompt limit when one is set.
fn check_prompt_len(len: usize, context: usize, max_prompt: Option<usize>, param: &str) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::bad_request(m, Some(param)));
    if len == 0 {
        return bad("the prompt is empty".into());
    }
    if let Some(max) = max_prompt.filter(|&max| len > max) {
        return bad(format!("the prompt has {len} tokens; this server allows at most {max}"));
    }
    if len >= context {
        return bad(format!("the prompt has {len} tokens; this model's context is {context} tokens"));
    }
    Ok(())
}

/// Token-id prompts are the client's numbers: each must name a token.
fn check_prompt_ids(ids: &[u32], vocab: Option<usize>, param: &str) -> Result<(), ApiError> {
    let Some(vocab) = vocab else { return Ok(()) };
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(t) => {
            Err(ApiError::bad_request(format!("token id {t} is outside the vocabulary (size {vocab})"), Some(param)))
        }
        None => Ok(()),
    }
}

fn random_seed() -> u64 {
    // RandomState is randomly keyed per process and per instance: enough for sampling.
    let mut h = RandomState::new().build_hasher();
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0));
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::extract::parse_json;

    #[test]
    fn fields_parse_in_their_openai_shapes() {
        let r: OpenAiRequest = parse_json(br#"{"model":"m","prompt":[1,2],"stop":"x","logprobs":2,"stream":true,"stream_options":{"include_usage":true},"user":"u","routing":{"trace":true},"extra_field":1}"#).unwrap();
        assert!(matches!(r.prompt, Some(Prompt::Tokens(ref t)) if t == &[1, 2]));
        assert!(matches!(r.stop, Some(Stop::One(ref s)) if s == "x"));
        assert!(matches!(r.logprobs, Some(Logprobs::Count(2))));
        assert!(r.routing.unwrap().trace);
        let r: OpenAiRequest = parse_json(br#"{"messages":[{"role":"user","content":"hi"}],"stop":["a","b"],"logprobs":true,"top_logprobs":3,"seed":null}"#).unwrap();
        assert!(matches!(r.stop, Some(Stop::Many(ref v)) if v.len() == 2));
        assert!(matches!(r.logprobs, Some(Logprobs::Flag(true))));
        assert_eq!(r.top_logprobs, Some(3));
    }

    #[test]
    fn wrong_types_name_the_field() {
        for (body, param) in [
            (&br#"{"temperature":"hot"}"#[..], "temperature"),
            (br#"{"max_tokens":-5}"#, "max_tokens"),
            (br#"{"stream":"yes"}"#, "stream"),
            (br#"{"stream_options":{"include_usage":1}}"#, "stream_options.include_usage"),
            (br#"{"messages":"hi"}"#, "messages"),
            (br#"{"stop":5}"#, "stop"),
        ] {
            let e = parse_json::<OpenAiRequest>(body).unwrap_err();
            assert_eq!(e.param(), Some(param), "{}: {e}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn logprobs_follow_each_endpoints_convention() {
        let r = |body: &[u8]| parse_json::<OpenAiRequest>(body).unwrap();
        assert_eq!(r(br#"{"logprobs":true,"top_logprobs":2}"#).logprobs_wanted(Endpoint::Chat, 20).unwrap(), Some(2));
        assert_eq!(r(br#"{"logprobs":3}"#).logprobs_wanted(Endpoint::Completions, 20).unwrap(), Some(3));
        assert_eq!(r(br#"{}"#).logprobs_wanted(Endpoint::Chat, 20).unwrap(), None);
        assert!(r(br#"{"logprobs":3}"#).logprobs_wanted(Endpoint::Chat, 20).is_err());
        assert!(r(br#"{"top_logprobs":3}"#).logprobs_wanted(Endpoint::Chat, 20).is_err());
    }

    #[test]
    fn bad_sampling_values_name_their_field() {
        let r = |body: &[u8]| {
            parse_json::<OpenAiRequest>(body).unwrap().sampling(None).unwrap_err().param().map(str::to_string)
        };
        assert_eq!(r(br#"{"temperature":-1}"#).as_deref(), Some("temperature"));
        assert_eq!(r(br#"{"top_p":0}"#).as_deref(), Some("top_p"));
        assert_eq!(r(br#"{"presence_penalty":3}"#).as_deref(), Some("presence_penalty"));
        let seeded = parse_json::<OpenAiRequest>(br#"{"seed":7}"#).unwrap().sampling(None).unwrap();
        assert_eq!(seeded.seed, 7);
        let a = parse_json::<OpenAiRequest>(b"{}").unwrap().sampling(None).unwrap().seed;
        let b = parse_json::<OpenAiRequest>(b"{}").unwrap().sampling(None).unwrap().seed;
        assert_ne!(a, b, "requests without a seed get fresh ones");
    }

    fn refusal<T: std::fmt::Debug>(result: Result<T, ApiError>) -> (u16, Option<String>) {
        let e = result.expect_err("refused");
        (e.status().as_u16(), e.param().map(str::to_string))
    }

    #[test]
    fn stop_strings_are_bounded_in_number_and_length() {
        let limits = RequestLimits { max_stop_strings: 2, max_stop_string_bytes: 4, ..RequestLimits::default() };
        let r = |body: &[u8]| parse_json::<OpenAiRequest>(body).unwrap().stop_strings(&limits);
        assert_eq!(r(br#"{"stop":"abcd"}"#).unwrap(), ["abcd"]);
        assert_eq!(r(br#"{"stop":["a","b"]}"#).unwrap(), ["a", "b"]);
        assert!(r(br#"{}"#).unwrap().is_empty());
        for body in [&br#"{"stop":["a","b","c"]}"#[..], br#"{"stop":"abcde"}"#, br#"{"stop":["a",""]}"#] {
            assert_eq!(refusal(r(body)), (400, Some("stop".into())), "{}", String::from_utf8_lossy(body));
        }
        // Bytes, not characters: a 2-character string of 3-byte characters is 6 bytes.
        assert_eq!(refusal(r("{\"stop\":\"\u{2603}\u{2603}\"}".as_bytes())).1.as_deref(), Some("stop"));
    }

    #[test]
    fn stop_token_ids_are_bounded_and_inside_the_vocabulary() {
        let limits = RequestLimits { max_stop_token_ids: 3, ..RequestLimits::default() };
        let r = |body: &[u8], vocab| parse_json::<OpenAiRequest>(body).unwrap().stop_token_ids(&limits, vocab);
        assert_eq!(r(br#"{"stop_token_ids":[1,2,3]}"#, Some(10)).unwrap(), [1, 2, 3]);
        let too_many = refusal(r(br#"{"stop_token_ids":[1,2,3,4]}"#, Some(10)));
        assert_eq!(too_many, (400, Some("stop_token_ids".into())));
        assert_eq!(refusal(r(br#"{"stop_token_ids":[10]}"#, Some(10))).1.as_deref(), Some("stop_token_ids"));
        assert_eq!(r(br#"{"stop_token_ids":[10]}"#, None).unwrap(), [10], "unknown vocabulary: the engine decides");
    }

    #[test]
    fn alternatives_per_token_are_capped_by_the_server() {
        let r = |body: &[u8]| parse_json::<OpenAiRequest>(body).unwrap();
        assert_eq!(r(br#"{"logprobs":true,"top_logprobs":5}"#).logprobs_wanted(Endpoint::Chat, 5).unwrap(), Some(5));
        let chat = refusal(r(br#"{"logprobs":true,"top_logprobs":6}"#).logprobs_wanted(Endpoint::Chat, 5));
        assert_eq!(chat, (400, Some("top_logprobs".into())));
        let completions = refusal(r(br#"{"logprobs":6}"#).logprobs_wanted(Endpoint::Completions, 5));
        assert_eq!(completions, (400, Some("logprobs".into())));
        // A configured cap above the sampler's still stops at the sampler's 20.
        let above = refusal(r(br#"{"logprobs":21}"#).logprobs_wanted(Endpoint::Completions, 100));
        assert_eq!(above.1.as_deref(), Some("logprobs"));
    }

    #[test]
    fn prompts_are_bounded_by_the_server_and_the_context() {
        assert!(check_prompt_len(10, 100, Some(10), "prompt").is_ok());
        assert_eq!(refusal(check_prompt_len(11, 100, Some(10), "messages")), (400, Some("messages".into())));
        assert_eq!(refusal(check_prompt_len(100, 100, None, "prompt")).1.as_deref(), Some("prompt"));
        assert_eq!(refusal(check_prompt_len(0, 100, None, "prompt")).1.as_deref(), Some("prompt"));
        assert!(check_prompt_ids(&[0, 9], Some(10), "prompt").is_ok());
        assert_eq!(refusal(check_prompt_ids(&[0, 10], Some(10), "prompt")), (400, Some("prompt".into())));
    }

    #[test]
    fn long_session_ids_are_refused() {
        let limits = RequestLimits { max_session_id_bytes: 8, ..RequestLimits::default() };
        let r = |body: &[u8]| parse_json::<OpenAiRequest>(body).unwrap().check_session_id(&limits);
        assert!(r(br#"{"session_id":"agent-07"}"#).is_ok());
        assert_eq!(refusal(r(br#"{"session_id":"agent-007"}"#)), (400, Some("session_id".into())));
    }
}

//! Structured outputs: a grammar (a JSON schema, any JSON object, Lark or a regex)
//! compiled by llguidance into a mask of the tokens allowed next.
//!
//! The compiled grammar and its parse state live in the request's spec, which every
//! model the request visits shares; the state re-synchronizes itself with the committed
//! output before each mask (see [`TokenConstraint::next`]), so handoffs, rewinds and
//! restarts after a crashed step need no bookkeeping of their own.

mod cursor;

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{JsonCompileOptions, Matcher, ParserFactory};
use serde_json::Value;

use crate::tokenize::TextTokenizer;

pub use cursor::{Next, TokenConstraint, TokenMask};

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: json_object`).
    JsonObject,
    /// A JSON schema; `strict` refuses schema keywords the grammar cannot enforce,
    /// otherwise they are ignored (as a lenient validator would).
    JsonSchema { schema: Value, strict: bool },
    /// A Lark grammar (llguidance's dialect).
    Lark(String),
    /// A regular expression the whole output matches.
    Regex(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The client's grammar or schema cannot be compiled.
    #[error("{0}")]
    InvalidGrammar(String),
    /// The tokenizer's vocabulary cannot be read as bytes.
    #[error("structured outputs are unavailable for this tokenizer: {0}")]
    Tokenizer(String),
}

/// Compiles grammars against one vocabulary. Building it reads every token's bytes
/// (tens of milliseconds for a 150k vocabulary), so one is kept per engine.
pub struct GrammarCompiler {
    factory: ParserFactory,
    stop_ids: Vec<u32>,
}

impl std::fmt::Debug for GrammarCompiler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarCompiler").field("stop_ids", &self.stop_ids).finish_non_exhaustive()
    }
}

impl GrammarCompiler {
    /// `model_vocab` is the width of the logits the masks apply to (it may exceed the
    /// tokenizer's: padding rows that never hold a token).
    pub fn new(tokenizer: &TextTokenizer, model_vocab: usize) -> Result<Self, ConstraintError> {
        let env = VocabularyEnv::new(tokenizer, model_vocab)?;
        let env: TokEnv = Arc::new(env);
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        factory.quiet();
        Ok(Self { factory, stop_ids: tokenizer.eos_token_ids().to_vec() })
    }

    /// A fresh constraint for one request; `stop_ids` are the request's own (what the
    /// grammar's end-of-sequence means for it).
    pub fn compile(&self, spec: &GrammarSpec, stop_ids: &[u32]) -> Result<TokenConstraint, ConstraintError> {
        let grammar = top_level_grammar(spec);
        // Client-written grammars reach corners of the compiler: a panic there is the
        // grammar's problem, not the server's.
        let parser = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.factory.create_parser(grammar)))
            .map_err(|_| ConstraintError::InvalidGrammar("the grammar could not be compiled".into()))?
            .map_err(|e| ConstraintError::InvalidGrammar(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(error) = matcher.get_error() {
            return Err(ConstraintError::InvalidGrammar(error));
        }
        let stop_ids = if stop_ids.is_empty() { self.stop_ids.clone() } else { stop_ids.to_vec() };
        Ok(TokenConstraint::new(matcher, self.factory.tok_env().tok_trie().eos_token(), stop_ids))
    }
}

/// Compact JSON: no whitespace between items, so an output cannot wander into
/// whitespace forever (random-weight models would) and stays short.
fn compact_json_options(strict: bool) -> JsonCompileOptions {
    JsonCompileOptions { whitespace_flexible: false, lenient: !strict, ..JsonCompileOptions::default() }
}

fn top_level_grammar(spec: &GrammarSpec) -> TopLevelGrammar {
    match spec {
        GrammarSpec::JsonObject => json_grammar(serde_json::json!({"type": "object"}), false),
        GrammarSpec::JsonSchema { schema, strict } => json_grammar(schema.clone(), *strict),
        GrammarSpec::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        GrammarSpec::Regex(regex) => TopLevelGrammar::from_regex(regex),
    }
}

fn json_grammar(schema: Value, strict: bool) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(compact_json_schema(schema, strict))
}

/// `schema` marked for compact JSON (llguidance reads the mark where the schema is
/// embedded in a Lark grammar too, as `%json`).
pub fn compact_json_schema(mut schema: Value, strict: bool) -> Value {
    if schema.is_object() {
        compact_json_options(strict).apply_to(&mut schema);
    }
    schema
}

/// The vocabulary as llguidance sees it: every token's bytes, and our tokenizer for the
/// few places it re-tokenizes text (forced tokens).
struct VocabularyEnv {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl VocabularyEnv {
    fn new(tokenizer: &TextTokenizer, model_vocab: usize) -> Result<Self, ConstraintError> {
        let as_json = serde_json::to_value(tokenizer.raw()).map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        // llguidance's reader asserts on malformed byte-fallback names; a panic here
        // would take the caller's thread down with it.
        let bytes = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&as_json))
            .map_err(|_| ConstraintError::Tokenizer("its vocabulary could not be read as bytes".into()))?
            .map_err(|e| ConstraintError::Tokenizer(e.to_string()))?;
        let mut words = bytes;
        words.resize(model_vocab.max(words.len()), Vec::new());
        let eos = tokenizer.eos_token_ids().first().copied().unwrap_or(0);
        let mut info = TokRxInfo::new(words.len() as u32, eos);
        info.tok_bos = tokenizer.bos_token_id();
        Ok(Self { trie: TokTrie::from(&info, &words), tokenizer: tokenizer.raw().clone() })
    }
}

impl TokenizerEnv for VocabularyEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let text = String::from_utf8_lossy(s);
        match self.tokenizer.encode_fast(text.as_ref(), false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            // Greedy by the trie: valid tokens, if not the canonical ones.
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }

    fn tokenize_is_canonical(&self) -> bool {
        true
    }
}

#[cfg(test)]
pub(crate) mod tests;

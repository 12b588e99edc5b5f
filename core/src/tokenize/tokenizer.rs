//! `TextTokenizer`: one model folder's tokenizer (`tokenizer.json`) with the special-token facts of its
//! `tokenizer_config.json`, cheap to clone (shared behind an `Arc`) so request actors and stream decoders
//! can each hold one.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use super::config::{SpecialTokens, TokenizerConfig};
use super::error::TokenizeError;

pub const TOKENIZER_FILE: &str = "tokenizer.json";

#[derive(Clone)]
pub struct TextTokenizer {
    inner: Arc<Inner>,
}

struct Inner {
    tokenizer: tokenizers::Tokenizer,
    config: TokenizerConfig,
    /// Names the tokenizer in errors (the folder it came from).
    name: String,
    /// One past the largest id: the id space a model's logits must cover.
    vocab_size: usize,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    eos_ids: Vec<u32>,
    special_ids: BTreeSet<u32>,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("name", &self.inner.name)
            .field("vocab_size", &self.inner.vocab_size)
            .finish()
    }
}

impl TextTokenizer {
    /// Loads `tokenizer.json` (required) and `tokenizer_config.json` / `chat_template.jinja` /
    /// `generation_config.json` (optional) from a HF model folder.
    pub fn from_folder(folder: &Path) -> Result<Self, TokenizeError> {
        let path = folder.join(TOKENIZER_FILE);
        if !path.is_file() {
            let detail = "a HF model folder needs tokenizer.json (the fast-tokenizer format)".to_owned();
            return Err(TokenizeError::MissingFile { path, detail });
        }
        let tokenizer = tokenizers::Tokenizer::from_file(&path)
            .map_err(|e| TokenizeError::InvalidFile { path: path.clone(), detail: e.to_string() })?;
        let config = TokenizerConfig::from_folder(folder)?;
        Ok(Self::from_parts(tokenizer, config, folder.display().to_string()))
    }

    /// Wraps an already built tokenizer (tests, or tokenizers shipped inside another format).
    pub fn from_parts(tokenizer: tokenizers::Tokenizer, config: TokenizerConfig, name: String) -> Self {
        let vocab_size = id_space(&tokenizer);
        let lookup = |token: &Option<String>| token.as_deref().and_then(|t| tokenizer.token_to_id(t));
        let bos_id = lookup(&config.special.bos);
        let eos_id = lookup(&config.special.eos);
        let mut eos_ids: Vec<u32> = eos_id.into_iter().collect();
        for &id in &config.generation_eos_ids {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        let special_ids = special_ids(&tokenizer, &config);
        let inner = Inner { tokenizer, config, name, vocab_size, bos_id, eos_id, eos_ids, special_ids };
        Self { inner: Arc::new(inner) }
    }

    /// Token ids of `text`. Rendered chat prompts already contain their BOS text, so encode them with
    /// `add_special_tokens = false` (as transformers' `apply_chat_template(tokenize=True)` does).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        // encode_fast skips offset tracking, which serving never reads.
        let encoding = self
            .inner
            .tokenizer
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::tokenizer("encode", e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; unknown ids are dropped (as in the `tokenizers` library).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.inner.tokenizer.decode(ids, skip_special_tokens).map_err(|e| TokenizeError::tokenizer("decode", e))
    }

    /// One past the largest token id, added tokens included.
    pub fn vocab_size(&self) -> usize {
        self.inner.vocab_size
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.tokenizer.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.tokenizer.token_to_id(token)
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.inner.bos_id
    }

    /// The id of `tokenizer_config.json`'s `eos_token`.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.inner.eos_id
    }

    /// Every id that ends generation: `eos_token` first, then `generation_config.json`'s ids.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.inner.eos_ids
    }

    /// Ids of tokens marked special (skipped by `decode(.., skip_special_tokens = true)`).
    pub fn special_token_ids(&self) -> &BTreeSet<u32> {
        &self.inner.special_ids
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.inner.special_ids.contains(&id)
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.inner.config.special
    }

    pub fn config(&self) -> &TokenizerConfig {
        &self.inner.config
    }

    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The wrapped tokenizer, for code that needs its pipeline (incremental tokenization, §7).
    pub fn raw(&self) -> &tokenizers::Tokenizer {
        &self.inner.tokenizer
    }
}

fn id_space(tokenizer: &tokenizers::Tokenizer) -> usize {
    let largest = tokenizer.get_vocab(true).into_values().max();
    largest.map_or(0, |id| id as usize + 1)
}

/// Special per `tokenizer.json`'s added tokens or per `added_tokens_decoder`: older configs mark
/// tokens special that the JSON file does not, and either source alone misses some.
fn special_ids(tokenizer: &tokenizers::Tokenizer, config: &TokenizerConfig) -> BTreeSet<u32> {
    let from_json =
        tokenizer.get_added_tokens_decoder().into_iter().filter(|(_, token)| token.special).map(|(id, _)| id);
    let from_config = config.added_tokens.iter().filter(|(_, (_, special))| *special).map(|(id, _)| *id);
    from_json.chain(from_config).collect()
}

/// The engine's start-up check for routed models: every id both vocabularies have must mean the same
/// token, or a token sampled by one model would be a different text for the other. Returns the number
/// of shared ids, or the first id where the token strings differ.
pub fn shared_vocab_check(a: &TextTokenizer, b: &TextTokenizer) -> Result<usize, TokenizeError> {
    let shared = a.vocab_size().min(b.vocab_size());
    for id in 0..shared as u32 {
        let (left, right) = (a.id_to_token(id), b.id_to_token(id));
        if left != right {
            return Err(TokenizeError::VocabMismatch {
                id,
                left_name: a.name().to_owned(),
                left,
                right_name: b.name().to_owned(),
                right,
            });
        }
    }
    Ok(shared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenize::test_support::{llama3, metaspace_tokenizer, qwen3};

    #[test]
    fn missing_and_invalid_tokenizer_json_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = TextTokenizer::from_folder(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizeError::MissingFile { .. }), "{err}");
        assert!(err.to_string().contains("tokenizer.json"), "{err}");
        std::fs::write(dir.path().join(TOKENIZER_FILE), "{not json").unwrap();
        let err = TextTokenizer::from_folder(dir.path()).unwrap_err();
        assert!(matches!(err, TokenizeError::InvalidFile { .. }), "{err}");
    }

    #[test]
    fn synthetic_metaspace_tokenizer_round_trips_and_knows_its_specials() {
        let tok = metaspace_tokenizer();
        assert_eq!(tok.bos_token_id(), Some(1));
        assert_eq!(tok.eos_token_ids(), &[2]);
        assert!(tok.is_special(1) && !tok.is_special(3));
        let ids = tok.encode("hello world", false).unwrap();
        assert_eq!(tok.decode(&ids, false).unwrap(), "hello world");
        assert_eq!(tok.id_to_token(ids[0]), Some("▁hello".into()));
        assert_eq!(tok.token_to_id("▁hello"), Some(ids[0]));
    }

    #[test]
    fn qwen3_facts_from_its_folder() {
        let Some(tok) = qwen3() else { return };
        assert_eq!(tok.vocab_size(), 151_669);
        assert_eq!(tok.bos_token_id(), None);
        assert_eq!(tok.eos_token_id(), tok.token_to_id("<|im_end|>"));
        assert!(tok.is_special(tok.token_to_id("<|endoftext|>").unwrap()));
        let ids = tok.encode("Hello, world!", false).unwrap();
        assert_eq!(ids, vec![9707, 11, 1879, 0]);
        assert_eq!(tok.decode(&ids, false).unwrap(), "Hello, world!");
    }

    #[test]
    fn llama3_adds_bos_only_when_asked() {
        let Some(tok) = llama3() else { return };
        let bos = tok.bos_token_id().unwrap();
        assert_eq!(bos, 128_000);
        assert_eq!(tok.eos_token_id(), Some(128_001));
        let with = tok.encode("Hello", true).unwrap();
        let without = tok.encode("Hello", false).unwrap();
        assert_eq!(with[0], bos);
        assert_eq!(&with[1..], &without[..]);
        assert_eq!(tok.decode(&with, true).unwrap(), "Hello");
    }

    #[test]
    fn shared_vocab_check_accepts_itself_and_names_the_first_mismatch() {
        let Some(qwen) = qwen3() else { return };
        let start = std::time::Instant::now();
        assert_eq!(shared_vocab_check(&qwen, &qwen.clone()).unwrap(), 151_669);
        assert!(start.elapsed().as_secs_f64() < 2.0, "too slow: {:?}", start.elapsed());
        let Some(llama) = llama3() else { return };
        match shared_vocab_check(&qwen, &llama).unwrap_err() {
            TokenizeError::VocabMismatch { id, left, right, .. } => {
                assert_ne!(left, right);
                assert_eq!(qwen.id_to_token(id), left);
                assert_eq!(llama.id_to_token(id), right);
                for earlier in 0..id {
                    assert_eq!(qwen.id_to_token(earlier), llama.id_to_token(earlier));
                }
            }
            other => panic!("expected a mismatch, got {other}"),
        }
    }

    #[test]
    fn shared_vocab_check_on_unrelated_vocabularies_fails_early() {
        let Some(qwen) = qwen3() else { return };
        let err = shared_vocab_check(&metaspace_tokenizer(), &qwen).unwrap_err();
        assert!(matches!(err, TokenizeError::VocabMismatch { id: 0, .. }), "{err}");
        assert!(err.to_string().contains("<unk>"), "{err}");
    }
}

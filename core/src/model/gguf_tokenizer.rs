//! A Hugging Face `tokenizer.json` (and `tokenizer_config.json`) rebuilt from a GGUF
//! file's vocabulary: llama.cpp's GPT-2 style BPE (`tokenizer.ggml.model = gpt2`) with its
//! tokens, merges and token types, and the pre-tokenizer `tokenizer.ggml.pre` names.
//!
//! Only pre-tokenizers whose Hugging Face equivalent is known exactly are rebuilt; any
//! other name is refused, since a guessed split would encode differently from llama.cpp.

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer};

/// llama.cpp's token types (`llama_token_type`).
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;

/// The pre-tokenizers this importer rebuilds (values of `tokenizer.ggml.pre`).
pub const KNOWN_PRE_TOKENIZERS: &[&str] = &["smollm", "gpt-2"];

/// How text is split before BPE, per `tokenizer.ggml.pre`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreSplit {
    /// `smollm`: every digit alone (llama.cpp's `\p{N}` pass), then GPT-2's regex and byte map.
    Smollm,
    /// `gpt-2`: GPT-2's regex and byte map.
    Gpt2,
}

impl PreSplit {
    pub fn from_gguf_name(name: &str) -> std::result::Result<PreSplit, String> {
        match name {
            "smollm" => Ok(PreSplit::Smollm),
            "gpt-2" => Ok(PreSplit::Gpt2),
            other => Err(format!(
                "pre-tokenizer {other:?} (tokenizer.ggml.pre) is not one this importer rebuilds faithfully \
                 (known: {})",
                KNOWN_PRE_TOKENIZERS.join(", ")
            )),
        }
    }

    fn pre_tokenizer(self) -> PreTokenizerWrapper {
        let byte_level = ByteLevel::new(false, true, true).into();
        match self {
            PreSplit::Smollm => Sequence::new(vec![Digits::new(true).into(), byte_level]).into(),
            PreSplit::Gpt2 => byte_level,
        }
    }
}

/// What the GGUF vocabulary turns into: the tokenizer, the `tokenizer_config.json` and the
/// end-of-sequence ids for `generation_config.json`.
pub struct ImportedTokenizer {
    pub tokenizer: Tokenizer,
    pub config: serde_json::Value,
    pub eos_ids: Vec<u32>,
    pub pre: PreSplit,
}

/// Checks that the vocabulary is one this importer rebuilds, without building it.
pub fn check_vocabulary(meta: &HashMap<String, Value>) -> std::result::Result<PreSplit, String> {
    let model = string(meta, "tokenizer.ggml.model")?;
    if model != "gpt2" {
        return Err(format!(
            "tokenizer model {model:?} (tokenizer.ggml.model) is not imported: only GPT-2 style BPE (\"gpt2\")"
        ));
    }
    let pre = string(meta, "tokenizer.ggml.pre")?;
    PreSplit::from_gguf_name(&pre)
}

/// Rebuilds the tokenizer from the GGUF metadata.
pub fn build_tokenizer(meta: &HashMap<String, Value>) -> std::result::Result<ImportedTokenizer, String> {
    let pre = check_vocabulary(meta)?;
    let vocabulary = Vocabulary::read(meta)?;
    let merges = read_merges(meta)?;
    let mut tokenizer = Tokenizer::new(vocabulary.bpe_model(merges)?);
    tokenizer.with_pre_tokenizer(Some(pre.pre_tokenizer()));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    tokenizer.add_tokens(vocabulary.added_tokens()).map_err(|e| format!("cannot add the special tokens: {e}"))?;
    let specials = SpecialTokenIds::read(meta, &vocabulary)?;
    if specials.add_bos {
        tokenizer.with_post_processor(Some(specials.bos_template(&vocabulary)?));
    }
    let config = tokenizer_config(meta, &vocabulary, &specials)?;
    Ok(ImportedTokenizer { tokenizer, config, eos_ids: specials.eos_ids(), pre })
}

/// The GGUF's tokens, indexed by id, with llama.cpp's type for each.
struct Vocabulary {
    tokens: Vec<String>,
    types: Vec<i32>,
}

impl Vocabulary {
    fn read(meta: &HashMap<String, Value>) -> std::result::Result<Vocabulary, String> {
        let tokens: Vec<String> = array(meta, "tokenizer.ggml.tokens")?
            .iter()
            .map(|v| v.to_string().cloned().map_err(|e| format!("tokenizer.ggml.tokens: {e}")))
            .collect::<std::result::Result<_, _>>()?;
        let types: Vec<i32> = match meta.get("tokenizer.ggml.token_type") {
            Some(_) => array(meta, "tokenizer.ggml.token_type")?
                .iter()
                .map(|v| v.to_i32().map_err(|e| format!("tokenizer.ggml.token_type: {e}")))
                .collect::<std::result::Result<_, _>>()?,
            None => vec![NORMAL; tokens.len()],
        };
        if types.len() != tokens.len() {
            return Err(format!("{} token types for {} tokens", types.len(), tokens.len()));
        }
        Ok(Vocabulary { tokens, types })
    }

    /// The BPE model over these tokens; refuses duplicate tokens and token types a GPT-2
    /// vocabulary does not have.
    fn bpe_model(&self, merges: Vec<(String, String)>) -> std::result::Result<BPE, String> {
        let ids = self.ids_by_token()?;
        if let Some(&t) = self.types.iter().find(|&&t| !matches!(t, NORMAL | UNKNOWN | CONTROL | USER_DEFINED | UNUSED))
        {
            return Err(format!(
                "token type {t} is not one of a GPT-2 BPE vocabulary (byte tokens are SentencePiece's)"
            ));
        }
        BPE::builder().vocab_and_merges(ids, merges).build().map_err(|e| format!("cannot build the BPE model: {e}"))
    }

    fn ids_by_token(&self) -> std::result::Result<Vocab, String> {
        let mut vocab: HashMap<String, u32> = HashMap::with_capacity(self.tokens.len());
        for (id, token) in self.tokens.iter().enumerate() {
            if vocab.insert(token.clone(), id as u32).is_some() {
                return Err(format!("token {token:?} appears twice in tokenizer.ggml.tokens"));
            }
        }
        Ok(vocab.into_iter().collect())
    }

    /// Control tokens are HF's special added tokens; user-defined ones are added tokens
    /// matched in raw text, as llama.cpp matches them.
    fn added_tokens(&self) -> Vec<AddedToken> {
        self.added().map(|(_, token, special)| AddedToken::from(token.clone(), special).normalized(false)).collect()
    }

    /// The added tokens (control and user-defined): id, token, and whether it is special.
    fn added(&self) -> impl Iterator<Item = (usize, &String, bool)> {
        self.tokens
            .iter()
            .zip(&self.types)
            .enumerate()
            .filter(|(_, (_, &t))| t == CONTROL || t == USER_DEFINED)
            .map(|(id, (token, &t))| (id, token, t == CONTROL))
    }

    fn token(&self, id: u32) -> &String {
        &self.tokens[id as usize]
    }
}

fn read_merges(meta: &HashMap<String, Value>) -> std::result::Result<Vec<(String, String)>, String> {
    array(meta, "tokenizer.ggml.merges")?
        .iter()
        .map(|v| {
            let merge = v.to_string().map_err(|e| format!("tokenizer.ggml.merges: {e}"))?;
            let (a, b) = merge.split_once(' ').ok_or_else(|| format!("merge {merge:?} is not two tokens"))?;
            Ok((a.to_string(), b.to_string()))
        })
        .collect()
}

/// The special tokens the metadata names, each checked to be in the vocabulary.
struct SpecialTokenIds {
    bos: Option<u32>,
    eos: Option<u32>,
    /// End of turn and end of message: they end generation as `eos` does.
    eot: Option<u32>,
    eom: Option<u32>,
    unk: Option<u32>,
    pad: Option<u32>,
    add_bos: bool,
}

impl SpecialTokenIds {
    fn read(meta: &HashMap<String, Value>, vocabulary: &Vocabulary) -> std::result::Result<SpecialTokenIds, String> {
        let id = |key: &str| token_id(meta, key, vocabulary.tokens.len());
        Ok(SpecialTokenIds {
            bos: id("tokenizer.ggml.bos_token_id")?,
            eos: id("tokenizer.ggml.eos_token_id")?,
            eot: id("tokenizer.ggml.eot_token_id")?,
            eom: id("tokenizer.ggml.eom_token_id")?,
            unk: id("tokenizer.ggml.unknown_token_id")?,
            pad: id("tokenizer.ggml.padding_token_id")?,
            add_bos: match meta.get("tokenizer.ggml.add_bos_token") {
                Some(v) => v.to_bool().map_err(|e| format!("tokenizer.ggml.add_bos_token: {e}"))?,
                None => false,
            },
        })
    }

    /// The post-processor that puts BOS before each sequence.
    fn bos_template(&self, vocabulary: &Vocabulary) -> std::result::Result<TemplateProcessing, String> {
        let bos_id = self.bos.ok_or("tokenizer.ggml.add_bos_token is set without tokenizer.ggml.bos_token_id")?;
        let bos_token = vocabulary.token(bos_id).clone();
        TemplateProcessing::builder()
            .try_single(format!("{bos_token}:0 $A:0"))
            .and_then(|b| b.try_pair(format!("{bos_token}:0 $A:0 {bos_token}:1 $B:1")))
            .map_err(|e| format!("BOS template: {e}"))?
            .special_tokens(vec![(bos_token, bos_id)])
            .build()
            .map_err(|e| format!("BOS template: {e}"))
    }

    /// `eos`, `eot` and `eom`, each once, in that order.
    fn eos_ids(&self) -> Vec<u32> {
        let mut eos_ids: Vec<u32> = Vec::new();
        for id in [self.eos, self.eot, self.eom].into_iter().flatten() {
            if !eos_ids.contains(&id) {
                eos_ids.push(id);
            }
        }
        eos_ids
    }
}

/// The id under `key`, if present; an id outside the vocabulary is an error.
fn token_id(
    meta: &HashMap<String, Value>,
    key: &str,
    vocabulary_len: usize,
) -> std::result::Result<Option<u32>, String> {
    let Some(value) = meta.get(key) else { return Ok(None) };
    let id = value.to_u32().map_err(|e| format!("{key}: {e}"))?;
    if id as usize >= vocabulary_len {
        return Err(format!("{key} = {id} is outside the vocabulary ({vocabulary_len} tokens)"));
    }
    Ok(Some(id))
}

/// The `tokenizer_config.json` transformers reads beside `tokenizer.json`.
fn tokenizer_config(
    meta: &HashMap<String, Value>,
    vocabulary: &Vocabulary,
    specials: &SpecialTokenIds,
) -> std::result::Result<serde_json::Value, String> {
    let mut config = serde_json::json!({
        "tokenizer_class": "GPT2Tokenizer",
        "add_bos_token": specials.add_bos,
        "add_eos_token": false,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 1_000_000_000_000_000_000u64,
        "added_tokens_decoder": added_tokens_decoder(vocabulary),
        "additional_special_tokens": vocabulary
            .added()
            .filter(|&(_, _, special)| special)
            .map(|(_, token, _)| token.clone())
            .collect::<Vec<_>>(),
    });
    let name = |id: Option<u32>| id.map(|id| vocabulary.token(id).clone());
    for (key, value) in [
        ("bos_token", name(specials.bos)),
        ("eos_token", name(specials.eos)),
        ("unk_token", name(specials.unk)),
        ("pad_token", name(specials.pad)),
    ] {
        config[key] = value.map_or(serde_json::Value::Null, serde_json::Value::String);
    }
    if let Some(template) = meta.get("tokenizer.chat_template") {
        let template = template.to_string().map_err(|e| format!("tokenizer.chat_template: {e}"))?;
        config["chat_template"] = template.clone().into();
    }
    Ok(config)
}

/// `added_tokens_decoder`: each added token by id, as transformers writes it.
fn added_tokens_decoder(vocabulary: &Vocabulary) -> serde_json::Map<String, serde_json::Value> {
    vocabulary
        .added()
        .map(|(id, token, special)| {
            let entry = serde_json::json!({
                "content": token,
                "lstrip": false,
                "normalized": false,
                "rstrip": false,
                "single_word": false,
                "special": special,
            });
            (id.to_string(), entry)
        })
        .collect()
}

fn string(meta: &HashMap<String, Value>, key: &str) -> std::result::Result<String, String> {
    let value = meta.get(key).ok_or_else(|| format!("metadata key {key} is missing"))?;
    value.to_string().cloned().map_err(|e| format!("{key}: {e}"))
}

fn array<'a>(meta: &'a HashMap<String, Value>, key: &str) -> std::result::Result<&'a Vec<Value>, String> {
    let value = meta.get(key).ok_or_else(|| format!("metadata key {key} is missing"))?;
    value.to_vec().map_err(|e| format!("{key}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(pre: &str) -> HashMap<String, Value> {
        let strings = |items: &[&str]| Value::Array(items.iter().map(|s| Value::String(s.to_string())).collect());
        HashMap::from([
            ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
            ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
            ("tokenizer.ggml.tokens".to_string(), strings(&["<|end|>", "a", "b", "ab", "1", "2", "Ġ", "Ġab"])),
            (
                "tokenizer.ggml.token_type".to_string(),
                Value::Array([CONTROL, 1, 1, 1, 1, 1, 1, 1].into_iter().map(Value::I32).collect()),
            ),
            ("tokenizer.ggml.merges".to_string(), strings(&["a b", "Ġ ab"])),
            ("tokenizer.ggml.eos_token_id".to_string(), Value::U32(0)),
        ])
    }

    #[test]
    fn smollm_splits_digits_one_by_one_and_merges_the_rest() {
        let built = build_tokenizer(&meta("smollm")).unwrap();
        let ids = built.tokenizer.encode_fast("ab ab12<|end|>", false).unwrap().get_ids().to_vec();
        assert_eq!(ids, vec![3, 7, 4, 5, 0]);
        assert_eq!(built.tokenizer.decode(&ids, false).unwrap(), "ab ab12<|end|>");
        assert_eq!(built.config["eos_token"], "<|end|>");
        assert_eq!(built.config["added_tokens_decoder"]["0"]["special"], true);
        assert_eq!(built.eos_ids, vec![0]);
    }

    #[test]
    fn unknown_pre_tokenizers_and_models_are_refused_by_name() {
        let err = check_vocabulary(&meta("deepseek-llm")).err().unwrap();
        assert!(err.contains("\"deepseek-llm\"") && err.contains("tokenizer.ggml.pre"), "{err}");
        let mut spm = meta("smollm");
        spm.insert("tokenizer.ggml.model".into(), Value::String("llama".into()));
        let err = check_vocabulary(&spm).err().unwrap();
        assert!(err.contains("\"llama\"") && err.contains("tokenizer.ggml.model"), "{err}");
    }
}

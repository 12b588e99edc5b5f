//! Which tokenizers may be spliced, decided from the tokenizer's own pipeline: its
//! normalizer, its pre-tokenizer (regex family), its model and its added tokens. The safe-cut
//! rules in `safe_cut.rs` were argued for exactly these regexes; anything else (another regex,
//! a normalizer that can merge across characters, added tokens that strip or need word
//! boundaries, BPE dropout) is not understood and always takes the full path.

use serde_json::{json, Value};
use tokenizers::{ModelWrapper, Tokenizer};

use super::safe_cut::{AddedTokenGuard, CutRule};

/// The split regexes whose pre-token boundaries the cut rules know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegexFamily {
    /// GPT-2's byte-level regex (`ByteLevel` with `use_regex`): `\s+(?!\S)` lets a whitespace
    /// run ending a text stay whole, so a newline cut needs a run of exactly one newline.
    Gpt2,
    /// cl100k-style (Llama 3): `\p{N}{1,3}`, newline runs with `\s*[\r\n]+`.
    Cl100k,
    /// Qwen2/Qwen3: as cl100k with single digits (`\p{N}`).
    Qwen2,
}

const CL100K_PATTERN: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Why a tokenizer always takes the full path.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("incremental tokenization is off for this tokenizer: {0}")]
pub struct Ineligible(pub String);

fn ineligible<T>(why: impl Into<String>) -> Result<T, Ineligible> {
    Err(Ineligible(why.into()))
}

/// The cut rule for `tokenizer`, or why it has none.
pub fn cut_rule_for(tokenizer: &Tokenizer) -> Result<CutRule, Ineligible> {
    if tokenizer.get_truncation().is_some() || tokenizer.get_padding().is_some() {
        return ineligible("truncation or padding is configured");
    }
    check_model(tokenizer.get_model())?;
    let nfc = normalizer_is_nfc(tokenizer)?;
    let family = regex_family(tokenizer)?;
    let guard = added_token_guard(tokenizer, nfc)?;
    Ok(CutRule::new(family, guard))
}

fn check_model(model: &ModelWrapper) -> Result<(), Ineligible> {
    match model {
        // Dropout makes encoding random: nothing could be reused.
        ModelWrapper::BPE(bpe) if bpe.dropout.is_none_or(|p| p == 0.0) => Ok(()),
        ModelWrapper::BPE(_) => ineligible("BPE dropout is on"),
        _ => ineligible("the model is not BPE"),
    }
}

/// `Ok(true)` for NFC, `Ok(false)` for none. Every cut rule puts an ASCII character right after
/// the cut, and no canonical composition has an ASCII second element, so NFC cannot merge
/// across a cut; other normalizers (lowercasing, NFKC, replacements) are not analysed.
fn normalizer_is_nfc(tokenizer: &Tokenizer) -> Result<bool, Ineligible> {
    let Some(normalizer) = tokenizer.get_normalizer() else { return Ok(false) };
    let value = serde_json::to_value(normalizer).map_err(|e| Ineligible(e.to_string()))?;
    match value.get("type").and_then(Value::as_str) {
        Some("NFC") => Ok(true),
        other => ineligible(format!("normalizer {other:?} is not understood")),
    }
}

fn regex_family(tokenizer: &Tokenizer) -> Result<RegexFamily, Ineligible> {
    let Some(pre) = tokenizer.get_pre_tokenizer() else { return ineligible("no pre-tokenizer") };
    let value = serde_json::to_value(pre).map_err(|e| Ineligible(e.to_string()))?;
    family_of(&value).ok_or_else(|| Ineligible(format!("pre-tokenizer not understood: {}", short(&value))))
}

/// GPT-2's `ByteLevel` with its own regex, alone or after `Digits` (SmolLM2, StarCoder);
/// or `Split(regex, Isolated)` then a regex-free `ByteLevel`. A prefix space would make a
/// window tokenize differently from the middle of a text, so it must be off.
///
/// `Digits` keeps GPT-2's cut rule: it only splits at the edges of numeric characters
/// (each one, or each run), each decided by that character alone. Where the character
/// before or after a cut is numeric, the cut is already a `Digits` boundary, so both sides
/// are split alone exactly as in the whole text; where neither is, the piece holding the
/// cut is a substring of the text with the same characters around the cut, for which the
/// GPT-2 rule holds as it does for any text (the regex has no lookbehind). No rule cuts
/// between two numeric characters.
fn family_of(pre: &Value) -> Option<RegexFamily> {
    match pre.get("type")?.as_str()? {
        "ByteLevel" if is_plain_byte_level(pre, true) => Some(RegexFamily::Gpt2),
        "Sequence" => {
            let parts = pre.get("pretokenizers")?.as_array()?;
            let [first, bytes] = parts.as_slice() else { return None };
            if first.get("type") == Some(&json!("Digits")) && is_plain_byte_level(bytes, true) {
                return Some(RegexFamily::Gpt2);
            }
            if !is_plain_byte_level(bytes, false) {
                return None;
            }
            split_family(first)
        }
        _ => None,
    }
}

fn is_plain_byte_level(value: &Value, use_regex: bool) -> bool {
    value.get("type") == Some(&json!("ByteLevel"))
        && value.get("add_prefix_space") == Some(&json!(false))
        && value.get("use_regex") == Some(&json!(use_regex))
}

fn split_family(split: &Value) -> Option<RegexFamily> {
    let is = |key: &str, expected: Value| split.get(key) == Some(&expected);
    if !(is("type", json!("Split")) && is("behavior", json!("Isolated")) && is("invert", json!(false))) {
        return None;
    }
    match split.get("pattern")?.get("Regex")?.as_str()? {
        CL100K_PATTERN => Some(RegexFamily::Cl100k),
        QWEN2_PATTERN => Some(RegexFamily::Qwen2),
        _ => None,
    }
}

/// Added tokens are matched in the raw text before anything else; the guard refuses cuts
/// inside any occurrence. Stripping and word-boundary flags make a token's match depend on
/// its neighbours, and normalized tokens are matched after NFC: neither is analysed.
fn added_token_guard(tokenizer: &Tokenizer, nfc: bool) -> Result<AddedTokenGuard, Ineligible> {
    let mut contents = Vec::new();
    for token in tokenizer.get_added_tokens_decoder().into_values() {
        if token.single_word || token.lstrip || token.rstrip {
            return ineligible(format!("added token {:?} strips or needs word boundaries", token.content));
        }
        if token.normalized && nfc {
            return ineligible(format!("added token {:?} is matched after normalization", token.content));
        }
        contents.push(token.content);
    }
    Ok(AddedTokenGuard::new(contents))
}

fn short(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(200) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text,
    }
}

//! What a HF model folder says about its tokens beyond `tokenizer.json`: the special-token strings and
//! chat template from `tokenizer_config.json` (or a separate `chat_template.jinja`, which newer
//! transformers versions write instead), and the end-of-sequence ids from `generation_config.json`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::error::TokenizeError;

pub const TOKENIZER_CONFIG_FILE: &str = "tokenizer_config.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
pub const GENERATION_CONFIG_FILE: &str = "generation_config.json";

/// Special-token strings as written in `tokenizer_config.json` (ids are resolved by the tokenizer).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct TokenizerConfig {
    pub special: SpecialTokens,
    /// `added_tokens_decoder`: id → (content, whether it is special).
    pub added_tokens: BTreeMap<u32, (String, bool)>,
    /// The template used for chat: `chat_template.jinja`, the string form, or the entry named "default".
    pub chat_template: Option<String>,
    /// The other named templates of the list form (e.g. "tool_use"), for later use.
    pub named_chat_templates: BTreeMap<String, String>,
    /// `eos_token_id` of `generation_config.json` (an int or a list): instruct models often stop on
    /// more ids than the tokenizer's single `eos_token` (Llama-3.2: `<|eot_id|>`, `<|eom_id|>`, ...).
    pub generation_eos_ids: Vec<u32>,
}

impl TokenizerConfig {
    /// Reads whatever of the three files the folder has; absent files leave their fields empty,
    /// present but malformed ones are an error (a silently ignored template would render wrong prompts).
    pub fn from_folder(folder: &Path) -> Result<Self, TokenizeError> {
        let mut config = match read_optional(&folder.join(TOKENIZER_CONFIG_FILE))? {
            Some(text) => Self::from_json_str(&text, &folder.join(TOKENIZER_CONFIG_FILE))?,
            None => Self::default(),
        };
        if let Some(template) = read_optional(&folder.join(CHAT_TEMPLATE_FILE))? {
            config.chat_template = Some(template);
        }
        let generation_path = folder.join(GENERATION_CONFIG_FILE);
        if let Some(text) = read_optional(&generation_path)? {
            let json = parse_json(&text, &generation_path)?;
            config.generation_eos_ids = parse_id_list(json.get("eos_token_id"));
        }
        Ok(config)
    }

    /// Parses the text of a `tokenizer_config.json`; `path` only names the file in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self, TokenizeError> {
        let json = parse_json(text, path)?;
        let invalid = |detail: String| TokenizeError::InvalidFile { path: path.to_path_buf(), detail };
        let (chat_template, named_chat_templates) = parse_chat_templates(json.get("chat_template")).map_err(invalid)?;
        Ok(Self {
            special: SpecialTokens {
                bos: token_content(json.get("bos_token")),
                eos: token_content(json.get("eos_token")),
                pad: token_content(json.get("pad_token")),
                unk: token_content(json.get("unk_token")),
            },
            added_tokens: parse_added_tokens(json.get("added_tokens_decoder")).map_err(invalid)?,
            chat_template,
            named_chat_templates,
            generation_eos_ids: Vec::new(),
        })
    }
}

fn read_optional(path: &Path) -> Result<Option<String>, TokenizeError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(TokenizeError::InvalidFile { path: path.to_path_buf(), detail: e.to_string() }),
    }
}

fn parse_json(text: &str, path: &Path) -> Result<Value, TokenizeError> {
    serde_json::from_str(text)
        .map_err(|e| TokenizeError::InvalidFile { path: PathBuf::from(path), detail: e.to_string() })
}

/// Special tokens are written either as a plain string or as a serialized `AddedToken`
/// (`{"__type": "AddedToken", "content": "<s>", ...}`), depending on the transformers version.
fn token_content(value: Option<&Value>) -> Option<String> {
    match value? {
        Value::String(s) => Some(s.clone()),
        Value::Object(map) => map.get("content")?.as_str().map(str::to_owned),
        _ => None,
    }
}

fn parse_added_tokens(value: Option<&Value>) -> Result<BTreeMap<u32, (String, bool)>, String> {
    let Some(map) = value.and_then(Value::as_object) else { return Ok(BTreeMap::new()) };
    map.iter()
        .map(|(id, entry)| {
            let id: u32 = id.parse().map_err(|_| format!("added_tokens_decoder key {id:?} is not an id"))?;
            let content =
                token_content(Some(entry)).ok_or_else(|| format!("added_tokens_decoder[{id}] has no content"))?;
            let special = entry.get("special").and_then(Value::as_bool).unwrap_or(false);
            Ok((id, (content, special)))
        })
        .collect()
}

type ChatTemplates = (Option<String>, BTreeMap<String, String>);

/// `chat_template` is a string, or a list of `{name, template}` where "default" is the chat one.
fn parse_chat_templates(value: Option<&Value>) -> Result<ChatTemplates, String> {
    match value {
        None | Some(Value::Null) => Ok((None, BTreeMap::new())),
        Some(Value::String(s)) => Ok((Some(s.clone()), BTreeMap::new())),
        Some(Value::Array(entries)) => {
            let mut named = BTreeMap::new();
            for entry in entries {
                let name = entry.get("name").and_then(Value::as_str);
                let template = entry.get("template").and_then(Value::as_str);
                match (name, template) {
                    (Some(n), Some(t)) => named.insert(n.to_owned(), t.to_owned()),
                    _ => return Err("chat_template list entries need a name and a template".into()),
                };
            }
            let default = named.remove("default");
            Ok((default, named))
        }
        Some(_) => Err("chat_template must be a string or a list of {name, template}".into()),
    }
}

fn parse_id_list(value: Option<&Value>) -> Vec<u32> {
    match value {
        Some(Value::Number(n)) => n.as_u64().map(|id| vec![id as u32]).unwrap_or_default(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).map(|id| id as u32).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> TokenizerConfig {
        TokenizerConfig::from_json_str(text, Path::new("tokenizer_config.json")).unwrap()
    }

    #[test]
    fn special_tokens_may_be_strings_objects_or_null() {
        let config = parse(
            r#"{"bos_token": {"__type": "AddedToken", "content": "<s>", "special": true},
                "eos_token": "</s>", "pad_token": null}"#,
        );
        assert_eq!(config.special.bos.as_deref(), Some("<s>"));
        assert_eq!(config.special.eos.as_deref(), Some("</s>"));
        assert_eq!(config.special.pad, None);
        assert_eq!(config.special.unk, None);
    }

    #[test]
    fn added_tokens_decoder_is_read_with_special_flags() {
        let config = parse(
            r#"{"added_tokens_decoder": {
                "7": {"content": "<|im_end|>", "special": true},
                "9": {"content": "<think>", "special": false}}}"#,
        );
        assert_eq!(config.added_tokens[&7], ("<|im_end|>".to_owned(), true));
        assert_eq!(config.added_tokens[&9], ("<think>".to_owned(), false));
    }

    #[test]
    fn chat_template_list_picks_default_and_keeps_the_others() {
        let config = parse(
            r#"{"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
        );
        assert_eq!(config.chat_template.as_deref(), Some("D"));
        assert_eq!(config.named_chat_templates["tool_use"], "T");
    }

    #[test]
    fn malformed_files_are_errors_naming_the_file() {
        let err = TokenizerConfig::from_json_str("{", Path::new("x/tokenizer_config.json")).unwrap_err();
        assert!(err.to_string().contains("x/tokenizer_config.json"), "{err}");
        let err = TokenizerConfig::from_json_str(r#"{"chat_template": 3}"#, Path::new("c.json")).unwrap_err();
        assert!(matches!(err, TokenizeError::InvalidFile { .. }), "{err}");
    }

    #[test]
    fn folder_files_are_optional_and_chat_template_jinja_wins() {
        let dir = tempfile::tempdir().unwrap();
        assert!(TokenizerConfig::from_folder(dir.path()).unwrap().chat_template.is_none());
        std::fs::write(dir.path().join(TOKENIZER_CONFIG_FILE), r#"{"chat_template": "old"}"#).unwrap();
        std::fs::write(dir.path().join(CHAT_TEMPLATE_FILE), "new").unwrap();
        std::fs::write(dir.path().join(GENERATION_CONFIG_FILE), r#"{"eos_token_id": [1, 5]}"#).unwrap();
        let config = TokenizerConfig::from_folder(dir.path()).unwrap();
        assert_eq!(config.chat_template.as_deref(), Some("new"));
        assert_eq!(config.generation_eos_ids, vec![1, 5]);
    }
}

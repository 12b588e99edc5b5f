//! A model's hyper-parameters from a GGUF file's metadata, so that a GGUF can stand in
//! for an HF folder wherever the engine needs a [`ModelConfig`].

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file::{Content, Value};

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};

/// Whether a path names a GGUF file rather than a model folder.
pub fn is_gguf_file(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// Where a model's tokenizer and policy files are: its folder, or a GGUF file's folder
/// (a GGUF file stands alone, so its tokenizer files sit beside it).
pub fn files_folder(path: &Path) -> std::path::PathBuf {
    match is_gguf_file(path) {
        true => path.parent().map(Path::to_path_buf).unwrap_or_default(),
        false => path.to_path_buf(),
    }
}

/// Reads the metadata (not the tensors) of a GGUF file written by `model gguf` or by
/// llama.cpp's converter for a Llama, Qwen2 or Qwen3 model.
pub fn read_gguf_config(path: &Path) -> Result<ModelConfig> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let content = Content::read(&mut BufReader::new(file))
        .map_err(|e| ModelError::InvalidConfig { path: path.to_path_buf(), message: e.to_string() })?;
    let bad = |message: String| ModelError::InvalidConfig { path: path.to_path_buf(), message };
    let meta = Metadata { map: &content.metadata };
    let arch_name = meta.string("general.architecture").map_err(&bad)?;
    let arch = match arch_name.as_str() {
        "llama" => Arch::Llama,
        "qwen2" => Arch::Qwen2,
        "qwen3" => Arch::Qwen3,
        other => return Err(bad(format!("architecture {other:?} is not supported (llama, qwen2, qwen3)"))),
    };
    let key = |k: &str| format!("{arch_name}.{k}");
    let num_heads = meta.int(&key("attention.head_count")).map_err(&bad)?;
    let hidden_size = meta.int(&key("embedding_length")).map_err(&bad)?;
    let vocab_size = match meta.int(&key("vocab_size")) {
        Ok(n) => n,
        Err(_) => meta.array_len("tokenizer.ggml.tokens").map_err(&bad)?,
    };
    let config = ModelConfig {
        arch,
        vocab_size,
        hidden_size,
        intermediate_size: meta.int(&key("feed_forward_length")).map_err(&bad)?,
        num_layers: meta.int(&key("block_count")).map_err(&bad)?,
        num_heads,
        num_kv_heads: meta.int(&key("attention.head_count_kv")).unwrap_or(num_heads),
        head_dim: meta.int(&key("attention.key_length")).unwrap_or(hidden_size / num_heads.max(1)),
        rms_norm_eps: meta.float(&key("attention.layer_norm_rms_epsilon")).map_err(&bad)?,
        rope_theta: meta.float(&key("rope.freq_base")).unwrap_or(10_000.0),
        rope_scaling: None,
        max_position_embeddings: meta.int(&key("context_length")).map_err(&bad)?,
        tie_word_embeddings: !content.tensor_infos.contains_key("output.weight"),
        qkv_bias: content.tensor_infos.contains_key("blk.0.attn_q.bias"),
        bos_token_id: meta.int("tokenizer.ggml.bos_token_id").ok().map(|id| id as u32),
        eos_token_ids: meta.int("tokenizer.ggml.eos_token_id").ok().map(|id| vec![id as u32]).unwrap_or_default(),
    };
    Ok(config)
}

struct Metadata<'a> {
    map: &'a HashMap<String, Value>,
}

impl Metadata<'_> {
    fn get(&self, key: &str) -> std::result::Result<&Value, String> {
        self.map.get(key).ok_or_else(|| format!("metadata key {key} is missing"))
    }

    fn string(&self, key: &str) -> std::result::Result<String, String> {
        match self.get(key)? {
            Value::String(s) => Ok(s.clone()),
            other => Err(format!("metadata key {key} is a {:?}, not a string", other.value_type())),
        }
    }

    fn int(&self, key: &str) -> std::result::Result<usize, String> {
        let value = match self.get(key)? {
            Value::U8(v) => *v as i64,
            Value::U16(v) => *v as i64,
            Value::U32(v) => *v as i64,
            Value::U64(v) => *v as i64,
            Value::I8(v) => *v as i64,
            Value::I16(v) => *v as i64,
            Value::I32(v) => *v as i64,
            Value::I64(v) => *v,
            other => return Err(format!("metadata key {key} is a {:?}, not an integer", other.value_type())),
        };
        usize::try_from(value).map_err(|_| format!("metadata key {key} is negative"))
    }

    fn float(&self, key: &str) -> std::result::Result<f64, String> {
        match self.get(key)? {
            Value::F32(v) => Ok(*v as f64),
            Value::F64(v) => Ok(*v),
            other => Err(format!("metadata key {key} is a {:?}, not a float", other.value_type())),
        }
    }

    fn array_len(&self, key: &str) -> std::result::Result<usize, String> {
        match self.get(key)? {
            Value::Array(items) => Ok(items.len()),
            _ => Err(format!("metadata key {key} is not an array")),
        }
    }
}

//! A GGUF file (as llama.cpp's `convert_hf_to_gguf.py` writes it, quantized or not)
//! turned back into a Hugging Face folder that every part of the project reads:
//! `config.json` from the hyper-parameters, `model.safetensors` with dequantized weights
//! (the rotary row permutation of q/k undone), and `tokenizer.json`,
//! `tokenizer_config.json` and `generation_config.json` rebuilt from the vocabulary.
//!
//! Only what converts faithfully is imported: the llama architecture with plain RoPE,
//! llama.cpp's tensor names, a GPT-2 style BPE vocabulary with a known pre-tokenizer.
//! Anything else is refused with the reason.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Content;
use candle_core::{Device, Tensor};

use super::backend::WeightDtype;
use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use super::gguf_read::read_gguf_config;
use super::gguf_tokenizer::{build_tokenizer, check_vocabulary, ImportedTokenizer, PreSplit};

/// What an import wrote.
#[derive(Debug, Clone)]
pub struct ImportReport {
    pub config: ModelConfig,
    pub tensors: usize,
    /// The GGUF tensor types met, e.g. `["F32", "Q4_1", "Q8_0"]`.
    pub source_types: Vec<String>,
    pub pre_tokenizer: PreSplit,
    pub files: Vec<PathBuf>,
}

/// Writes the HF folder `out` (created if needed) from the GGUF file `gguf`, with weights
/// in `dtype` (f32 or f16).
pub fn import_gguf(gguf: &Path, out: &Path, dtype: WeightDtype) -> Result<ImportReport> {
    let dtype = match dtype {
        WeightDtype::F32 | WeightDtype::F16 => dtype.candle()?,
        other => {
            return Err(ModelError::Unsupported(format!(
                "cannot import as {}: the HF folder holds f32 or f16 weights",
                other.as_str()
            )))
        }
    };
    let refuse =
        |reason: String| ModelError::Unsupported(format!("cannot import {} faithfully: {reason}", gguf.display()));
    let (mut reader, content) = open_gguf(gguf)?;
    let arch = content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned();
    match arch.as_deref() {
        Some("llama") => {}
        Some(other) => return Err(refuse(format!("architecture {other:?} is not imported (only \"llama\")"))),
        None => return Err(refuse("no general.architecture in the metadata".into())),
    }
    check_vocabulary(&content.metadata).map_err(refuse)?;
    check_rope(&content).map_err(refuse)?;
    let config = read_gguf_config(gguf)?;
    debug_assert_eq!(config.arch, Arch::Llama);

    let mut names: Vec<&String> = content.tensor_infos.keys().collect();
    names.sort();
    let mut weights: HashMap<String, Tensor> = HashMap::with_capacity(names.len());
    let mut source_types: Vec<String> = Vec::new();
    for name in names {
        let hf = hf_name(name).ok_or_else(|| refuse(format!("tensor {name} has no Hugging Face llama counterpart")))?;
        let info = &content.tensor_infos[name];
        let ty = format!("{:?}", info.ggml_dtype);
        if !source_types.contains(&ty) {
            source_types.push(ty);
        }
        let mut tensor = content.tensor(&mut reader, name, &Device::Cpu)?.dequantize(&Device::Cpu)?;
        if name.ends_with(".attn_q.weight") {
            tensor = undo_rotary_permutation(&tensor, config.num_heads)?;
        } else if name.ends_with(".attn_k.weight") {
            tensor = undo_rotary_permutation(&tensor, config.num_kv_heads)?;
        }
        weights.insert(hf, tensor.to_dtype(dtype)?);
    }
    check_tensors(&config, &weights).map_err(refuse)?;
    source_types.sort();

    let tokenizer = tokenizer_for(&content, &config).map_err(refuse)?;

    std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    let mut files = Vec::new();
    let mut hf_config = config.to_hf_json();
    hf_config["torch_dtype"] = if dtype == candle_core::DType::F16 { "float16" } else { "float32" }.into();
    files.push(write_json(out, "config.json", &hf_config)?);
    let safetensors = out.join("model.safetensors");
    candle_core::safetensors::save(&weights, &safetensors)?;
    files.push(safetensors);
    files.extend(write_tokenizer_files(&tokenizer, config.bos_token_id, out)?);
    Ok(ImportReport { config, tensors: weights.len(), source_types, pre_tokenizer: tokenizer.pre, files })
}

/// Writes only the tokenizer files of a GGUF file (`tokenizer.json`,
/// `tokenizer_config.json` with the chat template, `generation_config.json`) into `out`:
/// what a server needs beside the file to serve it as it is. Returns the files written.
pub fn write_gguf_tokenizer(gguf: &Path, out: &Path) -> Result<Vec<PathBuf>> {
    let refuse = |reason: String| {
        ModelError::Unsupported(format!("cannot rebuild the tokenizer of {} faithfully: {reason}", gguf.display()))
    };
    let (_, content) = open_gguf(gguf)?;
    let config = read_gguf_config(gguf)?;
    let tokenizer = tokenizer_for(&content, &config).map_err(refuse)?;
    std::fs::create_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    write_tokenizer_files(&tokenizer, config.bos_token_id, out)
}

/// A GGUF file's metadata, and the reader positioned to load its tensors.
fn open_gguf(gguf: &Path) -> Result<(BufReader<File>, Content)> {
    if !gguf.is_file() {
        return Err(ModelError::MissingFile(gguf.to_path_buf()));
    }
    let mut reader = BufReader::new(File::open(gguf).map_err(|e| ModelError::io(gguf, e))?);
    let content = Content::read(&mut reader).map_err(|e| {
        // candle appends a backtrace to some errors: the first line is the reason.
        let reason = e.to_string().lines().next().unwrap_or_default().to_string();
        ModelError::Unsupported(format!("{} is not a readable GGUF file: {reason}", gguf.display()))
    })?;
    Ok((reader, content))
}

/// The tokenizer rebuilt from the metadata, if the model has an embedding for each token.
fn tokenizer_for(content: &Content, config: &ModelConfig) -> std::result::Result<ImportedTokenizer, String> {
    let tokenizer = build_tokenizer(&content.metadata)?;
    let tokens = tokenizer.tokenizer.get_vocab_size(true);
    if tokens > config.vocab_size {
        return Err(format!("the vocabulary has {tokens} tokens but the model only {} embeddings", config.vocab_size));
    }
    Ok(tokenizer)
}

fn write_tokenizer_files(tokenizer: &ImportedTokenizer, bos: Option<u32>, out: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let tokenizer_path = out.join("tokenizer.json");
    tokenizer.tokenizer.save(&tokenizer_path, false).map_err(|e| ModelError::InvalidConfig {
        path: tokenizer_path.clone(),
        message: format!("cannot write the tokenizer: {e}"),
    })?;
    files.push(tokenizer_path);
    files.push(write_json(out, "tokenizer_config.json", &tokenizer.config)?);
    if !tokenizer.eos_ids.is_empty() {
        let mut generation = serde_json::json!({ "eos_token_id": tokenizer.eos_ids });
        if let Some(bos) = bos {
            generation["bos_token_id"] = bos.into();
        }
        files.push(write_json(out, "generation_config.json", &generation)?);
    }
    Ok(files)
}

fn write_json(dir: &Path, name: &str, value: &serde_json::Value) -> Result<PathBuf> {
    let path = dir.join(name);
    let text = serde_json::to_string_pretty(value).expect("JSON values serialize");
    std::fs::write(&path, text + "\n").map_err(|e| ModelError::io(&path, e))?;
    Ok(path)
}

/// The runtime's RoPE rotates the whole head with `rope.freq_base`: refuse partial
/// rotary dimensions and scaled RoPE, which a config.json written from this would lose.
pub(crate) fn check_rope(content: &Content) -> std::result::Result<(), String> {
    let meta = &content.metadata;
    let int = |key: &str| meta.get(key).and_then(|v| v.to_u32().ok().or_else(|| v.to_u64().ok().map(|x| x as u32)));
    let heads = int("llama.attention.head_count").ok_or("llama.attention.head_count is missing")?;
    let hidden = int("llama.embedding_length").ok_or("llama.embedding_length is missing")?;
    let head_dim = int("llama.attention.key_length").unwrap_or(hidden / heads.max(1));
    if let Some(rot) = int("llama.rope.dimension_count") {
        if rot != head_dim {
            return Err(format!("partial RoPE (llama.rope.dimension_count {rot} of head dimension {head_dim})"));
        }
    }
    if let Some(kind) = meta.get("llama.rope.scaling.type").and_then(|v| v.to_string().ok()) {
        if kind != "none" {
            return Err(format!("RoPE scaling {kind:?} (llama.rope.scaling.type) is not imported"));
        }
    }
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        return Err("per-frequency RoPE factors (rope_freqs.weight, Llama 3.1 style) are not imported".into());
    }
    Ok(())
}

/// The HF name of a llama.cpp tensor name (the inverse of the converter's map).
fn hf_name(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, part) = rest.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (short, suffix) = part.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let module = match short {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{module}.{suffix}"))
}

/// Every tensor the runtime loads is there with its shape, and nothing else is: a
/// bias on a norm or an MLP, say, would be silently dropped.
fn check_tensors(c: &ModelConfig, weights: &HashMap<String, Tensor>) -> std::result::Result<(), String> {
    let (h, q, kv, i) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.intermediate_size);
    let mut expected: Vec<(String, Vec<usize>)> =
        vec![("model.embed_tokens.weight".into(), vec![c.vocab_size, h]), ("model.norm.weight".into(), vec![h])];
    if !c.tie_word_embeddings {
        expected.push(("lm_head.weight".into(), vec![c.vocab_size, h]));
    }
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        expected.extend([
            (format!("{p}.input_layernorm.weight"), vec![h]),
            (format!("{p}.post_attention_layernorm.weight"), vec![h]),
            (format!("{p}.self_attn.q_proj.weight"), vec![q, h]),
            (format!("{p}.self_attn.k_proj.weight"), vec![kv, h]),
            (format!("{p}.self_attn.v_proj.weight"), vec![kv, h]),
            (format!("{p}.self_attn.o_proj.weight"), vec![h, q]),
            (format!("{p}.mlp.gate_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.up_proj.weight"), vec![i, h]),
            (format!("{p}.mlp.down_proj.weight"), vec![h, i]),
        ]);
        if c.qkv_bias {
            expected.extend([
                (format!("{p}.self_attn.q_proj.bias"), vec![q]),
                (format!("{p}.self_attn.k_proj.bias"), vec![kv]),
                (format!("{p}.self_attn.v_proj.bias"), vec![kv]),
            ]);
        }
    }
    for (name, shape) in &expected {
        let tensor = weights.get(name).ok_or_else(|| format!("tensor {name} is missing"))?;
        if tensor.dims() != shape.as_slice() {
            return Err(format!("tensor {name} has shape {:?}, the hyper-parameters imply {shape:?}", tensor.dims()));
        }
    }
    if weights.len() != expected.len() {
        let mut extra: Vec<&String> = weights.keys().filter(|k| !expected.iter().any(|(name, _)| name == *k)).collect();
        extra.sort();
        return Err(format!("tensors the runtime would ignore: {extra:?}"));
    }
    Ok(())
}

/// `convert_hf_to_gguf.py` stores llama's q/k rows per head as interleaved rotary pairs
/// (`reshape(heads, 2, half, cols).swapaxes(1, 2)`); HF rotates halves. This is the
/// inverse: `reshape(heads, half, 2, cols).swapaxes(1, 2)`.
pub fn undo_rotary_permutation(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    if heads == 0 || rows % (2 * heads) != 0 {
        return Err(ModelError::Unsupported(format!(
            "{rows} q/k rows do not split into {heads} heads of rotary pairs"
        )));
    }
    let half = rows / heads / 2;
    Ok(w.reshape((heads, half, 2, cols))?.transpose(1, 2)?.contiguous()?.reshape((rows, cols))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `permute` in `convert_hf_to_gguf.py`, written out.
    fn permute(w: &Tensor, heads: usize) -> Tensor {
        let (rows, cols) = w.dims2().unwrap();
        w.reshape((heads, 2, rows / heads / 2, cols)).unwrap().transpose(1, 2).unwrap().reshape((rows, cols)).unwrap()
    }

    #[test]
    fn the_rotary_permutation_is_undone_exactly() {
        let (heads, head_dim, cols) = (3, 8, 5);
        let rows = heads * head_dim;
        let hf = Tensor::arange(0f32, (rows * cols) as f32, &Device::Cpu).unwrap().reshape((rows, cols)).unwrap();
        let gguf = permute(&hf, heads);
        // Row 1 of a GGUF head is HF's row half (the pair partner of row 0).
        let row = |t: &Tensor, r: usize| t.get(r).unwrap().to_vec1::<f32>().unwrap();
        assert_eq!(row(&gguf, 1), row(&hf, head_dim / 2));
        let back = undo_rotary_permutation(&gguf, heads).unwrap();
        assert_eq!(back.to_vec2::<f32>().unwrap(), hf.to_vec2::<f32>().unwrap());
    }

    #[test]
    fn llama_cpp_names_map_to_hf_names() {
        assert_eq!(hf_name("blk.12.attn_q.weight").unwrap(), "model.layers.12.self_attn.q_proj.weight");
        assert_eq!(hf_name("blk.0.ffn_down.weight").unwrap(), "model.layers.0.mlp.down_proj.weight");
        assert_eq!(hf_name("token_embd.weight").unwrap(), "model.embed_tokens.weight");
        assert_eq!(hf_name("rope_freqs.weight"), None);
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.0.attn_q_norm.weight"), None);
    }
}

//! Writing a Hugging Face folder (config, safetensors, tokenizer.json) as one GGUF file
//! that llama.cpp loads: llama.cpp's tensor names and hyper-parameter keys, the GPT-2
//! style BPE vocabulary with merges, and weights in f32, f16, bf16, q8_0 or q4_k.

use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Tensor};

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use super::weights::Checkpoint;

/// The weight type of the matrices (vectors and norms stay f32, as llama.cpp keeps them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgufType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4K,
}

impl std::str::FromStr for GgufType {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(GgufType::F32),
            "f16" => Ok(GgufType::F16),
            "bf16" => Ok(GgufType::Bf16),
            "q8_0" => Ok(GgufType::Q8_0),
            "q4_k" => Ok(GgufType::Q4K),
            other => Err(format!("unknown GGUF type {other:?}; use f32, f16, bf16, q8_0 or q4_k")),
        }
    }
}

impl GgufType {
    fn ggml(self) -> GgmlDType {
        match self {
            GgufType::F32 => GgmlDType::F32,
            GgufType::F16 => GgmlDType::F16,
            GgufType::Bf16 => GgmlDType::BF16,
            GgufType::Q8_0 => GgmlDType::Q8_0,
            GgufType::Q4K => GgmlDType::Q4K,
        }
    }

    /// llama.cpp's `general.file_type` (LLAMA_FTYPE_*).
    fn file_type(self) -> u32 {
        match self {
            GgufType::F32 => 0,
            GgufType::F16 => 1,
            GgufType::Bf16 => 32,
            GgufType::Q8_0 => 7,
            GgufType::Q4K => 15,
        }
    }
}

/// Writes `dir` as a GGUF file at `out`.
pub fn write_gguf(dir: &Path, out: &Path, ty: GgufType) -> Result<()> {
    let config = ModelConfig::from_file(&dir.join("config.json"))?;
    let checkpoint = Checkpoint::open(dir, DType::F32)?;
    let mut metadata = hyper_parameters(&config, ty);
    metadata.extend(vocabulary(dir, &config)?);
    let tensors = tensors(&config, &checkpoint, ty)?;
    let meta_refs: Vec<(&str, &Value)> = metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let file = File::create(out).map_err(|e| io_error(out, e))?;
    let mut writer = BufWriter::new(file);
    gguf_file::write(&mut writer, &meta_refs, &tensor_refs)?;
    Ok(())
}

fn io_error(path: &Path, e: std::io::Error) -> ModelError {
    ModelError::InvalidConfig { path: path.to_path_buf(), message: e.to_string() }
}

fn arch_name(arch: Arch) -> &'static str {
    match arch {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
    }
}

fn hyper_parameters(c: &ModelConfig, ty: GgufType) -> Vec<(String, Value)> {
    let arch = arch_name(c.arch);
    let key = |k: &str| format!("{arch}.{k}");
    let mut m = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("general.name".to_string(), Value::String(format!("tokenrouter {arch}"))),
        ("general.file_type".to_string(), Value::U32(ty.file_type())),
        (key("context_length"), Value::U32(c.max_position_embeddings as u32)),
        (key("embedding_length"), Value::U32(c.hidden_size as u32)),
        (key("block_count"), Value::U32(c.num_layers as u32)),
        (key("feed_forward_length"), Value::U32(c.intermediate_size as u32)),
        (key("attention.head_count"), Value::U32(c.num_heads as u32)),
        (key("attention.head_count_kv"), Value::U32(c.num_kv_heads as u32)),
        (key("attention.key_length"), Value::U32(c.head_dim as u32)),
        (key("attention.value_length"), Value::U32(c.head_dim as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(c.rms_norm_eps as f32)),
        (key("rope.freq_base"), Value::F32(c.rope_theta as f32)),
        (key("rope.dimension_count"), Value::U32(c.head_dim as u32)),
    ];
    if c.arch == Arch::Llama {
        m.push((key("vocab_size"), Value::U32(c.vocab_size as u32)));
    }
    m
}

/// GPT-2 style BPE: every id up to the model's vocabulary size (padding ids the
/// tokenizer lacks), token types, merges, and the special ids.
fn vocabulary(dir: &Path, c: &ModelConfig) -> Result<Vec<(String, Value)>> {
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|e| io_error(&path, e))?;
    let json: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::InvalidConfig { path: path.clone(), message: e.to_string() })?;
    let bad = |message: &str| ModelError::InvalidConfig { path: path.clone(), message: message.to_string() };
    let vocab = json["model"]["vocab"].as_object().ok_or_else(|| bad("no BPE model.vocab"))?;
    let mut names: HashMap<u32, (String, i32)> =
        vocab.iter().filter_map(|(t, id)| Some((id.as_u64()? as u32, (t.clone(), 1)))).collect();
    for added in json["added_tokens"].as_array().into_iter().flatten() {
        let (Some(id), Some(content)) = (added["id"].as_u64(), added["content"].as_str()) else { continue };
        let kind = if added["special"].as_bool().unwrap_or(false) { 3 } else { 4 };
        names.insert(id as u32, (content.to_string(), kind));
    }
    let size = c.vocab_size.max(names.keys().max().map_or(0, |m| *m as usize + 1));
    let (tokens, types): (Vec<Value>, Vec<Value>) = (0..size as u32)
        .map(|id| match names.remove(&id) {
            Some((t, kind)) => (Value::String(t), Value::I32(kind)),
            None => (Value::String(format!("[PAD{id}]")), Value::I32(5)),
        })
        .unzip();
    let merges: Vec<Value> = json["model"]["merges"]
        .as_array()
        .ok_or_else(|| bad("no BPE model.merges"))?
        .iter()
        .filter_map(|m| match m {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Array(pair) => Some(format!("{} {}", pair.first()?.as_str()?, pair.get(1)?.as_str()?)),
            _ => None,
        })
        .map(Value::String)
        .collect();
    let pre = if c.arch == Arch::Llama { "llama-bpe" } else { "qwen2" };
    let mut m = vec![
        ("tokenizer.ggml.model".to_string(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".to_string(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".to_string(), Value::Array(types)),
        ("tokenizer.ggml.merges".to_string(), Value::Array(merges)),
    ];
    if let Some(template) = chat_template(dir) {
        m.push(("tokenizer.chat_template".to_string(), Value::String(template)));
    }
    if let Some(eos) = c.eos_token_ids.first() {
        m.push(("tokenizer.ggml.eos_token_id".to_string(), Value::U32(*eos)));
    }
    if let Some(bos) = c.bos_token_id {
        m.push(("tokenizer.ggml.bos_token_id".to_string(), Value::U32(bos)));
    }
    Ok(m)
}

fn chat_template(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json["chat_template"].as_str().map(str::to_string)
}

/// llama.cpp's name for an HF tensor name.
fn gguf_name(hf: &str) -> Option<String> {
    let fixed = match hf {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(name) = fixed {
        return Some(name.to_string());
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, part) = rest.split_once('.')?;
    let (module, suffix) = part.rsplit_once('.')?;
    let short = match module {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{short}.{suffix}"))
}

fn tensors(c: &ModelConfig, checkpoint: &Checkpoint, ty: GgufType) -> Result<Vec<(String, QTensor)>> {
    let mut out = Vec::new();
    for (hf, shape) in checkpoint.shapes() {
        let name = gguf_name(&hf).ok_or_else(|| ModelError::MissingTensor { name: format!("a GGUF name for {hf}") })?;
        let mut tensor = checkpoint.load(&hf, &shape)?;
        if c.arch == Arch::Llama && (name.ends_with("attn_q.weight") || name.ends_with("attn_k.weight")) {
            let heads = if name.ends_with("attn_q.weight") { c.num_heads } else { c.num_kv_heads };
            tensor = unpermute_rotary(&tensor, heads)?;
        }
        out.push((name, quantize(&tensor, ty)?));
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// HF Llama checkpoints store q/k rows rotated-half style; llama.cpp wants interleaved
/// pairs (its converter's `permute`).
fn unpermute_rotary(w: &Tensor, heads: usize) -> Result<Tensor> {
    let (rows, cols) = w.dims2()?;
    let half = rows / heads / 2;
    Ok(w.reshape((heads, 2, half, cols))?.transpose(1, 2)?.contiguous()?.reshape((rows, cols))?)
}

/// Matrices in the chosen type, where their rows divide into its blocks (else the next
/// finer type that fits); vectors in f32.
fn quantize(tensor: &Tensor, ty: GgufType) -> Result<QTensor> {
    if tensor.rank() < 2 {
        return Ok(QTensor::quantize(tensor, GgmlDType::F32)?);
    }
    let row = *tensor.dims().last().expect("rank 2");
    let fallback = [ty, GgufType::Q8_0, GgufType::F16];
    let chosen = fallback.into_iter().find(|t| row % t.ggml().block_size() == 0).unwrap_or(GgufType::F16);
    Ok(QTensor::quantize(tensor, chosen.ggml())?)
}

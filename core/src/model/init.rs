//! Writes random-weight models in exactly the Hugging Face layout, so tests, demos and
//! benchmarks need no model hub, and `transformers` can load what we write.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};
use rayon::prelude::*;

use super::config::ModelConfig;
use super::error::{ModelError, Result};
use crate::rng::SplitMix64;

#[derive(Debug, Clone)]
pub struct InitOptions {
    pub seed: u64,
    /// Standard deviation of linear and embedding weights (HF's default is 0.02).
    pub std: f32,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions { seed: 0, std: 0.02 }
    }
}

/// Every tensor name and shape a checkpoint of `config` holds.
pub fn tensor_shapes(config: &ModelConfig) -> Vec<(String, Vec<usize>)> {
    let c = config;
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let q = c.num_heads * c.head_dim;
    let kv = c.num_kv_heads * c.head_dim;
    let mut shapes = vec![("model.embed_tokens.weight".to_string(), vec![c.vocab_size, h])];
    for l in 0..c.num_layers {
        let p = format!("model.layers.{l}");
        let mut add = |name: &str, shape: Vec<usize>| shapes.push((format!("{p}.{name}"), shape));
        add("input_layernorm.weight", vec![h]);
        add("self_attn.q_proj.weight", vec![q, h]);
        add("self_attn.k_proj.weight", vec![kv, h]);
        add("self_attn.v_proj.weight", vec![kv, h]);
        if c.qkv_bias {
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.bias", vec![kv]);
        }
        if c.arch.has_qk_norm() {
            add("self_attn.q_norm.weight", vec![c.head_dim]);
            add("self_attn.k_norm.weight", vec![c.head_dim]);
        }
        add("self_attn.o_proj.weight", vec![h, q]);
        add("post_attention_layernorm.weight", vec![h]);
        add("mlp.gate_proj.weight", vec![i, h]);
        add("mlp.up_proj.weight", vec![i, h]);
        add("mlp.down_proj.weight", vec![h, i]);
    }
    shapes.push(("model.norm.weight".to_string(), vec![h]));
    if !c.tie_word_embeddings {
        shapes.push(("lm_head.weight".to_string(), vec![c.vocab_size, h]));
    }
    shapes
}

/// Writes `config.json`, `generation_config.json` and `model.safetensors` into `dir`.
pub fn write_random_model(config: &ModelConfig, options: &InitOptions, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| ModelError::io(dir, e))?;
    let tensors: HashMap<String, Tensor> = tensor_shapes(config)
        .into_par_iter()
        .enumerate()
        .map(|(index, (name, shape))| {
            let values = random_values(&name, &shape, options, index as u64);
            let tensor = Tensor::from_vec(values, shape, &Device::Cpu)?;
            Ok((name, tensor))
        })
        .collect::<Result<_>>()?;
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    write_json(&dir.join("config.json"), &config.to_hf_json())?;
    write_json(&dir.join("generation_config.json"), &generation_config(config))
}

/// Norm weights start at one (as HF initializes them), biases and matrices random.
fn random_values(name: &str, shape: &[usize], options: &InitOptions, index: u64) -> Vec<f32> {
    let n: usize = shape.iter().product();
    if name.ends_with("norm.weight") {
        return vec![1.0; n];
    }
    let mut rng = SplitMix64(options.seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    (0..n).map(|_| rng.normal() * options.std).collect()
}

fn generation_config(config: &ModelConfig) -> serde_json::Value {
    let mut v = serde_json::json!({ "do_sample": false });
    if let Some(bos) = config.bos_token_id {
        v["bos_token_id"] = bos.into();
    }
    if !config.eos_token_ids.is_empty() {
        v["eos_token_id"] = config.eos_token_ids.clone().into();
    }
    v
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value).expect("json values always serialize");
    std::fs::write(path, text).map_err(|e| ModelError::io(path, e))
}

/// Copies tokenizer files that exist in `from` (a file or a folder) into `dir`.
pub fn copy_tokenizer(from: &Path, dir: &Path) -> Result<Vec<String>> {
    const FILES: &[&str] = &["tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"];
    let source_dir = if from.is_file() { from.parent().unwrap_or(Path::new(".")) } else { from };
    let mut copied = Vec::new();
    if from.is_file() {
        std::fs::copy(from, dir.join("tokenizer.json")).map_err(|e| ModelError::io(from, e))?;
        copied.push("tokenizer.json".to_string());
    }
    for name in FILES {
        let src = source_dir.join(name);
        if src.is_file() && !copied.iter().any(|c| c == name) {
            std::fs::copy(&src, dir.join(name)).map_err(|e| ModelError::io(&src, e))?;
            copied.push(name.to_string());
        }
    }
    if !copied.iter().any(|c| c == "tokenizer.json") {
        return Err(ModelError::MissingFile(source_dir.join("tokenizer.json")));
    }
    Ok(copied)
}

//! The model's hyper-parameters, read from a Hugging Face `config.json`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::error::{ModelError, Result};

/// Decoder architectures the runtime implements. They share one forward and differ in
/// a few switches (biases on q/k/v, per-head q/k norms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Llama,
    Qwen2,
    Qwen3,
}

const SUPPORTED: &str = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM";

impl Arch {
    pub fn hf_class(self) -> &'static str {
        match self {
            Arch::Llama => "LlamaForCausalLM",
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Llama => "llama",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
        }
    }

    fn from_hf(name: &str) -> Option<Arch> {
        match name {
            "LlamaForCausalLM" | "llama" => Some(Arch::Llama),
            "Qwen2ForCausalLM" | "qwen2" => Some(Arch::Qwen2),
            "Qwen3ForCausalLM" | "qwen3" => Some(Arch::Qwen3),
            _ => None,
        }
    }

    pub fn has_qk_norm(self) -> bool {
        self == Arch::Qwen3
    }
}

/// Llama-3 style RoPE frequency scaling (`rope_scaling.rope_type == "llama3"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Llama3RopeScaling {
    pub factor: f64,
    pub low_freq_factor: f64,
    pub high_freq_factor: f64,
    pub original_max_position_embeddings: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f64,
    pub rope_theta: f64,
    pub rope_scaling: Option<Llama3RopeScaling>,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    pub bos_token_id: Option<u32>,
    pub eos_token_ids: Vec<u32>,
}

/// The subset of HF's config.json we read. Unknown fields are ignored, as HF does.
#[derive(Deserialize)]
struct HfConfig {
    architectures: Option<Vec<String>>,
    model_type: Option<String>,
    vocab_size: usize,
    hidden_size: usize,
    intermediate_size: usize,
    num_hidden_layers: usize,
    num_attention_heads: usize,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    /// transformers >= 5 nests theta and scaling here instead.
    rope_parameters: Option<serde_json::Value>,
    max_position_embeddings: Option<usize>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    hidden_act: Option<String>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
}

impl ModelConfig {
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => ModelError::MissingFile(path.to_path_buf()),
            _ => ModelError::io(path, e),
        })?;
        Self::from_json(&text).map_err(|message| ModelError::InvalidConfig { path: path.to_path_buf(), message })
    }

    /// Parses HF's config.json text; the error is a message for `InvalidConfig`, or
    /// an unsupported architecture.
    pub fn from_json(text: &str) -> std::result::Result<Self, String> {
        let hf: HfConfig = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let arch_name = hf
            .architectures
            .as_ref()
            .and_then(|a| a.first().cloned())
            .or_else(|| hf.model_type.clone())
            .ok_or("neither `architectures` nor `model_type` is set")?;
        let arch = Arch::from_hf(&arch_name)
            .ok_or_else(|| format!("unsupported architecture {arch_name:?}: supported are {SUPPORTED}"))?;
        if let Some(act) = &hf.hidden_act {
            if act != "silu" {
                return Err(format!("hidden_act {act:?} is not supported (only \"silu\")"));
            }
        }
        let num_kv_heads = hf.num_key_value_heads.unwrap_or(hf.num_attention_heads);
        let head_dim = hf.head_dim.unwrap_or(hf.hidden_size / hf.num_attention_heads.max(1));
        let config = ModelConfig {
            arch,
            vocab_size: hf.vocab_size,
            hidden_size: hf.hidden_size,
            intermediate_size: hf.intermediate_size,
            num_layers: hf.num_hidden_layers,
            num_heads: hf.num_attention_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps: hf.rms_norm_eps.unwrap_or(1e-6),
            rope_theta: hf
                .rope_theta
                .or_else(|| hf.rope_parameters.as_ref()?.get("rope_theta")?.as_f64())
                .unwrap_or(10_000.0),
            rope_scaling: parse_rope_scaling(hf.rope_scaling.as_ref().or(hf.rope_parameters.as_ref()))?,
            max_position_embeddings: hf.max_position_embeddings.unwrap_or(4096),
            tie_word_embeddings: hf.tie_word_embeddings.unwrap_or(false),
            qkv_bias: arch == Arch::Qwen2 || hf.attention_bias.unwrap_or(false),
            bos_token_id: hf.bos_token_id.as_ref().and_then(first_id),
            eos_token_ids: hf.eos_token_id.as_ref().map(all_ids).unwrap_or_default(),
        };
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> std::result::Result<(), String> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_layers),
            ("num_attention_heads", self.num_heads),
            ("num_key_value_heads", self.num_kv_heads),
            ("head_dim", self.head_dim),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{name} must be positive"));
        }
        if self.num_heads % self.num_kv_heads != 0 {
            return Err(format!(
                "num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim % 2 != 0 {
            return Err(format!("head_dim ({}) must be even for RoPE", self.head_dim));
        }
        Ok(())
    }

    /// Writes the config in HF's format, so `transformers` can load what `model init` makes.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let mut v = serde_json::json!({
            "architectures": [self.arch.hf_class()],
            "model_type": self.arch.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "max_position_embeddings": self.max_position_embeddings,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.qkv_bias,
            "torch_dtype": "float32",
        });
        if let Some(s) = &self.rope_scaling {
            v["rope_scaling"] = serde_json::json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            });
        }
        if let Some(bos) = self.bos_token_id {
            v["bos_token_id"] = bos.into();
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => v["eos_token_id"] = (*one).into(),
            many => v["eos_token_id"] = many.into(),
        }
        v
    }

    /// Bytes one token's K and V take across all layers, at `bytes_per_value`.
    pub fn kv_bytes_per_token(&self, bytes_per_value: usize) -> usize {
        2 * self.num_layers * self.num_kv_heads * self.head_dim * bytes_per_value
    }

    /// Parameter count as stored (the LM head counts only when untied).
    pub fn num_parameters(&self) -> usize {
        let h = self.hidden_size;
        let q = self.num_heads * self.head_dim;
        let kv = self.num_kv_heads * self.head_dim;
        let mut attn = h * q + 2 * h * kv + q * h;
        if self.qkv_bias {
            attn += q + 2 * kv;
        }
        if self.arch.has_qk_norm() {
            attn += 2 * self.head_dim;
        }
        let mlp = 3 * h * self.intermediate_size;
        let layer = attn + mlp + 2 * h;
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + self.num_layers * layer + h
    }
}

fn parse_rope_scaling(value: Option<&serde_json::Value>) -> std::result::Result<Option<Llama3RopeScaling>, String> {
    let Some(value) = value.filter(|v| !v.is_null()) else { return Ok(None) };
    let kind = value.get("rope_type").or_else(|| value.get("type")).and_then(|t| t.as_str()).unwrap_or("");
    match kind {
        "llama3" => serde_json::from_value(value.clone()).map(Some).map_err(|e| format!("rope_scaling: {e}")),
        "default" => Ok(None),
        other => Err(format!("rope_scaling type {other:?} is not supported (only \"llama3\")")),
    }
}

fn first_id(v: &serde_json::Value) -> Option<u32> {
    all_ids(v).first().copied()
}

fn all_ids(v: &serde_json::Value) -> Vec<u32> {
    match v {
        serde_json::Value::Number(n) => n.as_u64().map(|x| vec![x as u32]).unwrap_or_default(),
        serde_json::Value::Array(a) => a.iter().filter_map(|x| x.as_u64()).map(|x| x as u32).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const QWEN3: &str = r#"{"architectures":["Qwen3ForCausalLM"],"vocab_size":100,"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,
        "head_dim":32,"tie_word_embeddings":true,"eos_token_id":[5,7]}"#;

    #[test]
    fn reads_explicit_head_dim_and_eos_list() {
        let c = ModelConfig::from_json(QWEN3).unwrap();
        assert_eq!(c.arch, Arch::Qwen3);
        assert_eq!(c.head_dim, 32);
        assert_eq!(c.eos_token_ids, vec![5, 7]);
        assert!(!c.qkv_bias);
    }

    #[test]
    fn round_trips_through_hf_json() {
        let c = ModelConfig::from_json(QWEN3).unwrap();
        let again = ModelConfig::from_json(&c.to_hf_json().to_string()).unwrap();
        assert_eq!(c, again);
    }

    #[test]
    fn refuses_unknown_architecture_by_name() {
        let text = QWEN3.replace("Qwen3ForCausalLM", "MambaForCausalLM");
        let err = ModelConfig::from_json(&text).unwrap_err();
        assert!(err.contains("MambaForCausalLM"), "{err}");
    }

    #[test]
    fn refuses_heads_not_divisible_by_kv_heads() {
        let text = QWEN3.replace("\"num_key_value_heads\":2", "\"num_key_value_heads\":3");
        assert!(ModelConfig::from_json(&text).unwrap_err().contains("multiple"));
    }

    #[test]
    fn reads_transformers_5_rope_parameters() {
        let text = QWEN3.replace(
            "\"head_dim\":32",
            r#""head_dim":32,"rope_parameters":{"rope_theta":500000.0,"rope_type":"llama3","factor":8.0,
               "low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":64}"#,
        );
        let c = ModelConfig::from_json(&text).unwrap();
        assert_eq!(c.rope_theta, 500000.0);
        assert_eq!(c.rope_scaling.unwrap().factor, 8.0);
    }

    #[test]
    fn qwen2_always_has_qkv_bias() {
        let text = QWEN3.replace("Qwen3ForCausalLM", "Qwen2ForCausalLM");
        assert!(ModelConfig::from_json(&text).unwrap().qkv_bias);
    }
}

//! Named sizes for random-weight models. They use Qwen3's vocabulary so the real Qwen3
//! tokenizer drives them; `small` and `medium` differ ~3-5x in step latency on a
//! 2-core CPU, which makes them a routed pair for benchmarks.

use super::config::{Arch, ModelConfig};

/// Qwen3's vocabulary size and special ids (<|endoftext|>, <|im_end|>).
pub const QWEN3_VOCAB: usize = 151_936;
const QWEN3_BOS: u32 = 151_643;
const QWEN3_EOS: [u32; 2] = [151_645, 151_643];

pub const PRESET_NAMES: &[&str] = &["tiny", "small", "medium"];

struct Size {
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
}

pub fn preset(name: &str) -> Option<ModelConfig> {
    let size = match name {
        "tiny" => Size { hidden: 64, layers: 2, heads: 4, kv_heads: 2, intermediate: 256 },
        "small" => Size { hidden: 512, layers: 8, heads: 8, kv_heads: 4, intermediate: 1536 },
        "medium" => Size { hidden: 1024, layers: 16, heads: 16, kv_heads: 8, intermediate: 3072 },
        _ => return None,
    };
    Some(qwen3_shaped(size.hidden, size.layers, size.heads, size.kv_heads, size.intermediate, QWEN3_VOCAB))
}

/// Shapes of real Qwen3 checkpoints, for random weights made where they run (a card):
/// too large to write as a folder for tests, but what throughput is judged on.
pub const REAL_SHAPE_NAMES: &[&str] = &["qwen3-0.6b", "qwen3-8b"];

pub fn real_shape(name: &str) -> Option<ModelConfig> {
    let (hidden, layers, heads, kv_heads, head_dim, intermediate, tied) = match name {
        "qwen3-0.6b" => (1024, 28, 16, 8, 128, 3072, true),
        "qwen3-8b" => (4096, 36, 32, 8, 128, 12_288, false),
        _ => return None,
    };
    let mut config = qwen3_shaped(hidden, layers, heads, kv_heads, intermediate, QWEN3_VOCAB);
    config.head_dim = head_dim;
    config.tie_word_embeddings = tied;
    config.max_position_embeddings = 40_960;
    Some(config)
}

/// A config with Qwen3's conventions (tied embeddings, q/k norms, theta 1e6).
pub fn qwen3_shaped(
    hidden: usize,
    layers: usize,
    heads: usize,
    kv_heads: usize,
    intermediate: usize,
    vocab: usize,
) -> ModelConfig {
    let has_qwen_ids = vocab >= QWEN3_VOCAB;
    ModelConfig {
        arch: Arch::Qwen3,
        vocab_size: vocab,
        hidden_size: hidden,
        intermediate_size: intermediate,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim: hidden / heads,
        rms_norm_eps: 1e-6,
        rope_theta: 1_000_000.0,
        rope_scaling: None,
        max_position_embeddings: 32_768,
        tie_word_embeddings: true,
        qkv_bias: false,
        bos_token_id: has_qwen_ids.then_some(QWEN3_BOS),
        eos_token_ids: if has_qwen_ids { QWEN3_EOS.to_vec() } else { Vec::new() },
    }
}

/// Switches a config to another architecture, keeping its sizes.
pub fn with_arch(mut config: ModelConfig, arch: Arch) -> ModelConfig {
    config.arch = arch;
    config.qkv_bias = arch == Arch::Qwen2;
    if arch == Arch::Llama {
        config.rope_theta = 500_000.0;
    }
    config
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_have_the_documented_sizes() {
        let millions = |n: &str| preset(n).unwrap().num_parameters() as f64 / 1e6;
        assert!((9.0..11.0).contains(&millions("tiny")), "{}", millions("tiny"));
        assert!((100.0..106.0).contains(&millions("small")), "{}", millions("small"));
        assert!((350.0..365.0).contains(&millions("medium")), "{}", millions("medium"));
        assert!(preset("huge").is_none());
        let billions = |n: &str| real_shape(n).unwrap().num_parameters() as f64 / 1e9;
        assert!((0.55..0.65).contains(&billions("qwen3-0.6b")), "{}", billions("qwen3-0.6b"));
        assert!((8.0..8.4).contains(&billions("qwen3-8b")), "{}", billions("qwen3-8b"));
    }
}

//! The decoder stack shared by Llama, Qwen2 and Qwen3, run over a packed varlen batch.

use candle_core::{DType, Device, Tensor, D};

use super::attention::{paged_attention, AttentionSpec, PagedKvStore, TokenLayout};
use super::config::ModelConfig;
use super::error::Result;
use super::linear::Linear;
use super::projection::{Projection, TokenEmbedding};
use super::rope::Rope;
use super::weights::Checkpoint;

pub(crate) struct DecoderLayer {
    pub(crate) attn_norm: Tensor,
    /// q, k and v stacked, k/v rows in the order the rotary embedding expects (HF's).
    pub(crate) qkv: Projection,
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(crate) o_proj: Projection,
    pub(crate) mlp_norm: Tensor,
    /// gate and up stacked.
    pub(crate) gate_up: Projection,
    pub(crate) down: Projection,
}

pub struct Transformer {
    config: ModelConfig,
    dtype: DType,
    embed: TokenEmbedding,
    layers: Vec<DecoderLayer>,
    final_norm: Tensor,
    lm_head: Projection,
    rope: Rope,
}

/// What one forward produces: per row, the last position's logits and, when asked,
/// the last position's final hidden state (after the final norm).
pub struct StackOutput {
    /// Row-major, rows × vocabulary.
    pub logits: Vec<f32>,
    /// Row-major, rows × hidden size.
    pub hidden: Option<Vec<f32>>,
}

impl Transformer {
    /// Matrices (and the embedding table) stay in the checkpoint's load dtype; norms and
    /// activations are f32, so half-precision weights halve the bytes each step streams
    /// while every sum stays f32.
    pub fn load(config: ModelConfig, ckpt: &Checkpoint) -> Result<Self> {
        let c = &config;
        let embed = ckpt.load("model.embed_tokens.weight", &[c.vocab_size, c.hidden_size])?;
        let layers =
            (0..c.num_layers).map(|i| load_layer(c, ckpt, &format!("model.layers.{i}"))).collect::<Result<Vec<_>>>()?;
        let final_norm = ckpt.load_f32("model.norm.weight", &[c.hidden_size])?;
        // A tied checkpoint may still carry a copy of lm_head; the embedding is the truth.
        let lm_head = if c.tie_word_embeddings {
            Linear::new(embed.clone(), None)
        } else {
            Linear::new(ckpt.load("lm_head.weight", &[c.vocab_size, c.hidden_size])?, None)
        };
        Ok(Self::from_parts(
            config,
            DType::F32,
            TokenEmbedding::Dense(embed),
            layers,
            final_norm,
            Projection::Dense(lm_head),
        ))
    }

    /// A model from weights loaded elsewhere (a GGUF file); `dtype` is the activations'.
    pub(crate) fn from_parts(
        config: ModelConfig,
        dtype: DType,
        embed: TokenEmbedding,
        layers: Vec<DecoderLayer>,
        final_norm: Tensor,
        lm_head: Projection,
    ) -> Self {
        let rope = Rope::new(&config);
        Transformer { config, dtype, embed, layers, final_norm, lm_head, rope }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    pub fn dtype(&self) -> DType {
        self.dtype
    }

    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Runs all layers over `tokens` (packed rows, placed by `layout`), writing their
    /// K/V into `store`, and returns outputs at the packed indices `last`.
    pub fn forward(
        &self,
        store: &mut PagedKvStore,
        tokens: &[u32],
        layout: &TokenLayout,
        last: &[u32],
        want_hidden: bool,
    ) -> Result<StackOutput> {
        let ids = Tensor::from_slice(tokens, tokens.len(), &Device::Cpu)?;
        let mut x = self.embed.lookup(&ids)?.to_dtype(self.dtype)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = self.layer_forward(layer, i, store, layout, &x)?;
        }
        let last = Tensor::from_slice(last, last.len(), &Device::Cpu)?;
        let x = x.index_select(&last, 0)?;
        let h = candle_nn::ops::rms_norm(&x, &self.final_norm, self.eps())?;
        let logits = self.lm_head.forward_to_vec(&h)?;
        let hidden = if want_hidden { Some(h.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?) } else { None };
        Ok(StackOutput { logits, hidden })
    }

    fn eps(&self) -> f32 {
        self.config.rms_norm_eps as f32
    }

    fn layer_forward(
        &self,
        layer: &DecoderLayer,
        index: usize,
        store: &mut PagedKvStore,
        layout: &TokenLayout,
        x: &Tensor,
    ) -> Result<Tensor> {
        let c = &self.config;
        let tokens = layout.num_tokens();
        let h = candle_nn::ops::rms_norm(x, &layer.attn_norm, self.eps())?;
        let mut qkv = layer.qkv.forward_to_vec(&h)?;
        let mut attn = vec![0f32; tokens * c.num_heads * c.head_dim];
        let spec = AttentionSpec {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            qk_norm: layer.qk_norm.as_ref().map(|(q, k)| (q.as_slice(), k.as_slice(), self.eps())),
        };
        paged_attention(store, index, &spec, layout, &mut qkv, &mut attn);
        let attn = Tensor::from_vec(attn, (tokens, c.num_heads * c.head_dim), &Device::Cpu)?.to_dtype(self.dtype)?;
        let x = (x + layer.o_proj.forward(&attn)?)?;
        let h = candle_nn::ops::rms_norm(&x, &layer.mlp_norm, self.eps())?;
        let gate_up = layer.gate_up.forward(&h)?;
        let inter = c.intermediate_size;
        let gate = gate_up.narrow(D::Minus1, 0, inter)?;
        let up = gate_up.narrow(D::Minus1, inter, inter)?;
        let act = (gate.silu()? * up)?.contiguous()?;
        Ok((x + layer.down.forward(&act)?)?)
    }
}

fn load_layer(c: &ModelConfig, ckpt: &Checkpoint, p: &str) -> Result<DecoderLayer> {
    let h = c.hidden_size;
    let q_out = c.num_heads * c.head_dim;
    let kv_out = c.num_kv_heads * c.head_dim;
    let linear = |name: &str, out: usize, inp: usize, bias: bool| -> Result<Linear> {
        let w = ckpt.load(&format!("{p}.{name}.weight"), &[out, inp])?;
        let b = if bias { Some(ckpt.load_f32(&format!("{p}.{name}.bias"), &[out])?) } else { None };
        Ok(Linear::new(w, b))
    };
    let q = linear("self_attn.q_proj", q_out, h, c.qkv_bias)?;
    let k = linear("self_attn.k_proj", kv_out, h, c.qkv_bias)?;
    let v = linear("self_attn.v_proj", kv_out, h, c.qkv_bias)?;
    let gate = linear("mlp.gate_proj", c.intermediate_size, h, false)?;
    let up = linear("mlp.up_proj", c.intermediate_size, h, false)?;
    let qk_norm = if c.arch.has_qk_norm() {
        let load = |n: &str| -> Result<Vec<f32>> {
            Ok(ckpt.load_f32(&format!("{p}.self_attn.{n}.weight"), &[c.head_dim])?.to_vec1()?)
        };
        Some((load("q_norm")?, load("k_norm")?))
    } else {
        None
    };
    Ok(DecoderLayer {
        attn_norm: ckpt.load_f32(&format!("{p}.input_layernorm.weight"), &[h])?,
        qkv: Projection::Dense(Linear::fuse(&[q, k, v])?),
        qk_norm,
        o_proj: Projection::Dense(linear("self_attn.o_proj", h, q_out, false)?),
        mlp_norm: ckpt.load_f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?,
        gate_up: Projection::Dense(Linear::fuse(&[gate, up])?),
        down: Projection::Dense(linear("mlp.down_proj", h, c.intermediate_size, false)?),
    })
}

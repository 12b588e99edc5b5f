//! The decoder stack shared by Llama, Qwen2 and Qwen3, run over a packed varlen batch.

use candle_core::{DType, Device, Tensor};

use super::attention::{paged_attention, AttentionSpec, PagedKvStore, TokenLayout};
use super::config::ModelConfig;
use super::error::Result;
use super::linear::Linear;
use super::ops;
use super::projection::{Projection, TokenEmbedding};
use super::rope::Rope;
use super::weights::Checkpoint;

pub(crate) struct DecoderLayer {
    pub(crate) attn_norm: Vec<f32>,
    /// q, k and v stacked, k/v rows in the order the rotary embedding expects (HF's).
    pub(crate) qkv: Projection,
    pub(crate) qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    pub(crate) o_proj: Projection,
    pub(crate) mlp_norm: Vec<f32>,
    /// gate and up stacked.
    pub(crate) gate_up: Projection,
    pub(crate) down: Projection,
}

pub struct Transformer {
    config: ModelConfig,
    dtype: DType,
    embed: TokenEmbedding,
    layers: Vec<DecoderLayer>,
    final_norm: Vec<f32>,
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
        let final_norm = ckpt.load_f32("model.norm.weight", &[c.hidden_size])?.to_vec1()?;
        // A tied checkpoint may still carry a copy of lm_head; the embedding is the truth.
        // Tied, the table is packed once, for the head, and looked up from there.
        let (embed, lm_head) = if c.tie_word_embeddings {
            let head = Linear::new(&embed, None)?;
            (TokenEmbedding::Panels(head.weight().clone()), head)
        } else {
            let head = Linear::new(&ckpt.load("lm_head.weight", &[c.vocab_size, c.hidden_size])?, None)?;
            (TokenEmbedding::Dense(embed), head)
        };
        Ok(Self::from_parts(config, DType::F32, embed, layers, final_norm, Projection::Dense(lm_head)))
    }

    /// A model from weights loaded elsewhere (a GGUF file); `dtype` is the activations'.
    pub(crate) fn from_parts(
        config: ModelConfig,
        dtype: DType,
        embed: TokenEmbedding,
        layers: Vec<DecoderLayer>,
        final_norm: Vec<f32>,
        lm_head: Projection,
    ) -> Self {
        let rope = Rope::new(&config);
        let model = Transformer { config, dtype, embed, layers, final_norm, lm_head, rope };
        model.prefer_huge_pages();
        model
    }

    /// Every step streams every matrix: on 2 MiB pages it skips a page walk per 4 KiB
    /// (medium f32 batch-1 steps ~4-5% faster: `DECODE_HUGE_PAIRED` in
    /// `examples/decode_bench`, both load orders). The embedding table is read a few rows
    /// at a time and stays as it is, unless tied to the head.
    fn prefer_huge_pages(&self) -> usize {
        let layers = self.layers.iter().flat_map(|l| [&l.qkv, &l.o_proj, &l.gate_up, &l.down]);
        layers.chain([&self.lm_head]).map(Projection::prefer_huge_pages).sum()
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
        let mut x: Vec<f32> = self.embed.lookup(&ids)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        for (i, layer) in self.layers.iter().enumerate() {
            self.layer_forward(layer, i, store, layout, &mut x)?;
        }
        let hidden = self.config.hidden_size;
        let last_rows: Vec<f32> =
            last.iter().flat_map(|&t| x[t as usize * hidden..(t as usize + 1) * hidden].iter().copied()).collect();
        let h = ops::rms_norm(&last_rows, &self.final_norm, self.eps());
        // A copy only when the caller wants the hidden states; the LM head takes `h` itself.
        let hidden_states = want_hidden.then(|| h.clone());
        let logits = self.lm_head.forward_to_vec(&rows_tensor(h, hidden)?)?;
        Ok(StackOutput { logits, hidden: hidden_states })
    }

    fn eps(&self) -> f32 {
        self.config.rms_norm_eps as f32
    }

    /// One decoder layer over the packed rows `x` (tokens × hidden), in place.
    fn layer_forward(
        &self,
        layer: &DecoderLayer,
        index: usize,
        store: &mut PagedKvStore,
        layout: &TokenLayout,
        x: &mut [f32],
    ) -> Result<()> {
        let c = &self.config;
        let h = ops::rms_norm(x, &layer.attn_norm, self.eps());
        let mut qkv = layer.qkv.forward_to_vec(&rows_tensor(h, c.hidden_size)?)?;
        let spec = AttentionSpec {
            num_heads: c.num_heads,
            num_kv_heads: c.num_kv_heads,
            head_dim: c.head_dim,
            qk_norm: layer.qk_norm.as_ref().map(|(q, k)| (q.as_slice(), k.as_slice(), self.eps())),
        };
        let attn = paged_attention(store, index, &spec, layout, &mut qkv);
        let attn_out = layer.o_proj.forward_to_vec(&rows_tensor(attn, c.num_heads * c.head_dim)?)?;
        ops::add_in_place(x, &attn_out);
        let h = ops::rms_norm(x, &layer.mlp_norm, self.eps());
        let gate_up = layer.gate_up.forward_to_vec(&rows_tensor(h, c.hidden_size)?)?;
        let act = ops::silu_mul(&gate_up, c.intermediate_size);
        let mlp_out = layer.down.forward_to_vec(&rows_tensor(act, c.intermediate_size)?)?;
        ops::add_in_place(x, &mlp_out);
        Ok(())
    }
}

/// Row-major `rows × width` floats as a tensor, without copying them.
fn rows_tensor(data: Vec<f32>, width: usize) -> Result<Tensor> {
    let rows = data.len() / width;
    Ok(Tensor::from_vec(data, (rows, width), &Device::Cpu)?)
}

fn load_layer(c: &ModelConfig, ckpt: &Checkpoint, p: &str) -> Result<DecoderLayer> {
    let h = c.hidden_size;
    let q_out = c.num_heads * c.head_dim;
    let kv_out = c.num_kv_heads * c.head_dim;
    // Each matrix with its bias, if the model has one.
    let part = |name: &str, out: usize, inp: usize, bias: bool| -> Result<(Tensor, Option<Tensor>)> {
        let w = ckpt.load(&format!("{p}.{name}.weight"), &[out, inp])?;
        let b = if bias { Some(ckpt.load_f32(&format!("{p}.{name}.bias"), &[out])?) } else { None };
        Ok((w, b))
    };
    let stacked = |parts: Vec<(Tensor, Option<Tensor>)>| -> Result<Projection> {
        let (weights, biases): (Vec<Tensor>, Vec<Option<Tensor>>) = parts.into_iter().unzip();
        let biases: Option<Vec<Tensor>> = biases.into_iter().collect();
        Ok(Projection::Dense(Linear::stacked(&weights, biases.as_deref())?))
    };
    let qkv = stacked(vec![
        part("self_attn.q_proj", q_out, h, c.qkv_bias)?,
        part("self_attn.k_proj", kv_out, h, c.qkv_bias)?,
        part("self_attn.v_proj", kv_out, h, c.qkv_bias)?,
    ])?;
    let gate_up = stacked(vec![
        part("mlp.gate_proj", c.intermediate_size, h, false)?,
        part("mlp.up_proj", c.intermediate_size, h, false)?,
    ])?;
    let qk_norm = if c.arch.has_qk_norm() {
        let load = |n: &str| -> Result<Vec<f32>> {
            Ok(ckpt.load_f32(&format!("{p}.self_attn.{n}.weight"), &[c.head_dim])?.to_vec1()?)
        };
        Some((load("q_norm")?, load("k_norm")?))
    } else {
        None
    };
    Ok(DecoderLayer {
        attn_norm: ckpt.load_f32(&format!("{p}.input_layernorm.weight"), &[h])?.to_vec1()?,
        qkv,
        qk_norm,
        o_proj: stacked(vec![part("self_attn.o_proj", h, q_out, false)?])?,
        mlp_norm: ckpt.load_f32(&format!("{p}.post_attention_layernorm.weight"), &[h])?.to_vec1()?,
        gate_up,
        down: stacked(vec![part("mlp.down_proj", h, c.intermediate_size, false)?])?,
    })
}

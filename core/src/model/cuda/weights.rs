//! A model's weights in device memory: matrices in the 2-byte type, stacked as the CPU
//! backend stacks them (q|k|v, gate|up), norms and biases in f32. Loaded from an HF
//! folder, or made on the card from a seed (an 8B model is never copied there).

use candle_core::{DType, Tensor};
use cudarc::driver::CudaSlice;

use super::gpu::{launch, raw, Gpu, HalfKind, Matrix};
use super::launch::grid_stride;
use crate::model::config::ModelConfig;
use crate::model::error::Result;
use crate::model::weights::Checkpoint;

pub(crate) struct Layer {
    pub attn_norm: CudaSlice<f32>,
    pub qkv: Matrix,
    pub qkv_bias: Option<CudaSlice<f32>>,
    pub qk_norm: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
    pub o_proj: Matrix,
    pub mlp_norm: CudaSlice<f32>,
    pub gate_up: Matrix,
    pub down: Matrix,
}

pub(crate) struct Weights {
    pub embed: Matrix,
    pub layers: Vec<Layer>,
    pub final_norm: CudaSlice<f32>,
    /// `None`: tied to the embedding.
    pub lm_head: Option<Matrix>,
}

impl Weights {
    pub fn lm_head(&self) -> &Matrix {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Bytes of the matrices (what a batch-1 step streams).
    pub fn matrix_bytes(&self) -> usize {
        let layer = |l: &Layer| [&l.qkv, &l.o_proj, &l.gate_up, &l.down].iter().map(|m| m.rows * m.cols).sum::<usize>();
        (self.layers.iter().map(layer).sum::<usize>() + self.lm_head().rows * self.lm_head().cols) * 2
    }

    pub fn load(gpu: &Gpu, c: &ModelConfig, ckpt: &Checkpoint) -> Result<Self> {
        let source = Source { gpu, ckpt };
        let layers =
            (0..c.num_layers).map(|i| load_layer(&source, c, &format!("model.layers.{i}"))).collect::<Result<_>>()?;
        let embed = source.matrix(&["model.embed_tokens.weight"], &[c.vocab_size], c.hidden_size)?;
        let lm_head = if c.tie_word_embeddings {
            None
        } else {
            Some(source.matrix(&["lm_head.weight"], &[c.vocab_size], c.hidden_size)?)
        };
        Ok(Weights { embed, layers, final_norm: source.vector("model.norm.weight", c.hidden_size)?, lm_head })
    }

    /// Uniform weights of standard deviation `std` from `seed`, norms at 1, biases at 0.
    pub fn random(gpu: &Gpu, c: &ModelConfig, seed: u64, std: f32) -> Result<Self> {
        let mut next_seed = seed.wrapping_mul(0x2545_f491_4f6c_dd1d);
        let mut matrix = |rows: usize, cols: usize| -> Result<Matrix> {
            next_seed = next_seed.wrapping_add(1);
            random_matrix(gpu, rows, cols, next_seed, std)
        };
        let (h, i) = (c.hidden_size, c.intermediate_size);
        let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let mut layers = Vec::with_capacity(c.num_layers);
        for _ in 0..c.num_layers {
            layers.push(Layer {
                attn_norm: ones(gpu, h)?,
                qkv: matrix(q + 2 * kv, h)?,
                qkv_bias: if c.qkv_bias { Some(gpu.zeros(q + 2 * kv, "a bias")?) } else { None },
                qk_norm: if c.arch.has_qk_norm() {
                    Some((ones(gpu, c.head_dim)?, ones(gpu, c.head_dim)?))
                } else {
                    None
                },
                o_proj: matrix(h, q)?,
                mlp_norm: ones(gpu, h)?,
                gate_up: matrix(2 * i, h)?,
                down: matrix(h, i)?,
            });
        }
        let embed = matrix(c.vocab_size, h)?;
        let lm_head = if c.tie_word_embeddings { None } else { Some(matrix(c.vocab_size, h)?) };
        Ok(Weights { embed, layers, final_norm: ones(gpu, h)?, lm_head })
    }
}

fn ones(gpu: &Gpu, n: usize) -> Result<CudaSlice<f32>> {
    gpu.upload(&vec![1.0f32; n], "a norm")
}

fn random_matrix(gpu: &Gpu, rows: usize, cols: usize, seed: u64, std: f32) -> Result<Matrix> {
    let n = rows * cols;
    let data = gpu.zeros::<u16>(n, "a weight matrix")?;
    // A uniform variable on [-b, b) has standard deviation b / sqrt(3).
    let bound = std * 3f32.sqrt();
    launch!(gpu, gpu.kernels.fill_uniform, grid_stride(n), [raw(&data, &gpu.stream), n as i64, seed, bound])?;
    Ok(Matrix { data, rows, cols })
}

struct Source<'a> {
    gpu: &'a Gpu,
    ckpt: &'a Checkpoint,
}

impl Source<'_> {
    /// The named `[rows_i][cols]` tensors stacked by rows, in the model's 2-byte type.
    fn matrix(&self, names: &[&str], rows: &[usize], cols: usize) -> Result<Matrix> {
        let mut bits: Vec<u16> = Vec::with_capacity(rows.iter().sum::<usize>() * cols);
        for (name, &r) in names.iter().zip(rows) {
            let tensor = self.ckpt.load(name, &[r, cols])?.flatten_all()?;
            append_bits(&mut bits, &tensor, self.gpu.half)?;
        }
        let data = self.gpu.upload(&bits, names[0])?;
        Ok(Matrix { data, rows: rows.iter().sum(), cols })
    }

    fn vector(&self, name: &str, len: usize) -> Result<CudaSlice<f32>> {
        let values: Vec<f32> = self.ckpt.load_f32(name, &[len])?.to_vec1()?;
        self.gpu.upload(&values, name)
    }
}

fn append_bits(bits: &mut Vec<u16>, tensor: &Tensor, half: HalfKind) -> Result<()> {
    match half {
        HalfKind::Bf16 => {
            bits.extend(tensor.to_dtype(DType::BF16)?.to_vec1::<half::bf16>()?.iter().map(|v| v.to_bits()))
        }
        HalfKind::F16 => bits.extend(tensor.to_dtype(DType::F16)?.to_vec1::<half::f16>()?.iter().map(|v| v.to_bits())),
    }
    Ok(())
}

fn load_layer(s: &Source, c: &ModelConfig, p: &str) -> Result<Layer> {
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let (q, kv) = (c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
    let name = |n: &str| format!("{p}.{n}");
    let (qn, kn, vn) =
        (name("self_attn.q_proj.weight"), name("self_attn.k_proj.weight"), name("self_attn.v_proj.weight"));
    let qkv_bias = if c.qkv_bias {
        let mut bias = Vec::with_capacity(q + 2 * kv);
        for (n, len) in [("q_proj", q), ("k_proj", kv), ("v_proj", kv)] {
            bias.extend(s.ckpt.load_f32(&name(&format!("self_attn.{n}.bias")), &[len])?.to_vec1::<f32>()?);
        }
        Some(s.gpu.upload(&bias, "q/k/v biases")?)
    } else {
        None
    };
    let qk_norm = if c.arch.has_qk_norm() {
        Some((
            s.vector(&name("self_attn.q_norm.weight"), c.head_dim)?,
            s.vector(&name("self_attn.k_norm.weight"), c.head_dim)?,
        ))
    } else {
        None
    };
    let (gate, up) = (name("mlp.gate_proj.weight"), name("mlp.up_proj.weight"));
    Ok(Layer {
        attn_norm: s.vector(&name("input_layernorm.weight"), h)?,
        qkv: s.matrix(&[&qn, &kn, &vn], &[q, kv, kv], h)?,
        qkv_bias,
        qk_norm,
        o_proj: s.matrix(&[&name("self_attn.o_proj.weight")], &[h], q)?,
        mlp_norm: s.vector(&name("post_attention_layernorm.weight"), h)?,
        gate_up: s.matrix(&[&gate, &up], &[i, i], h)?,
        down: s.matrix(&[&name("mlp.down_proj.weight")], &[h], i)?,
    })
}

//! A llama GGUF file served as it is: its matrices stay in their quantized blocks and are
//! multiplied by candle's quantized matmul (`QMatMul`), the token embedding is gathered
//! from its blocks row by row and, when tied, doubles as the output head; norms and
//! biases are dequantized to f32. The rest of the forward (paged KV, varlen batches,
//! attention) is the same [`Transformer`] a safetensors checkpoint runs on.
//!
//! The rotary question: llama.cpp's converter stores each llama q/k head with its rows
//! interleaved as rotary pairs (row 2i and 2i+1 rotate together), for ggml's "normal"
//! rope; our attention rotates halves (row i with row i + head_dim/2), as HF does. We
//! move the rows back into HF order at load time rather than teach attention a second
//! rope: a quantized row is a whole number of blocks, so reordering rows is an exact
//! byte shuffle done once, and attention, the KV store and everything downstream stay
//! one code path for both kinds of weights.

use std::collections::HashSet;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::quantized::gguf_file::Content;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Tensor};

use super::config::{Arch, ModelConfig};
use super::error::{ModelError, Result};
use super::gguf_import::check_rope;
use super::gguf_read::read_gguf_config;
use super::linear::Linear;
use super::projection::{reorder_rows, Projection, QuantizedLinear, TokenEmbedding};
use super::transformer::{DecoderLayer, Transformer};

/// Loads the llama GGUF file at `path` for the candle backend, matrices quantized.
pub fn load_gguf_transformer(path: &Path) -> Result<Transformer> {
    if !path.is_file() {
        return Err(ModelError::MissingFile(path.to_path_buf()));
    }
    let mut file = GgufTensors::open(path)?;
    let refuse = |reason: String| {
        ModelError::Unsupported(format!("the candle backend cannot serve {}: {reason}", path.display()))
    };
    let arch = file.content.metadata.get("general.architecture").and_then(|v| v.to_string().ok()).cloned();
    match arch.as_deref() {
        Some("llama") => {}
        Some(other) => {
            return Err(refuse(format!(
                "architecture {other:?} (it serves \"llama\" GGUF files; `backend: llamacpp` serves the others)"
            )))
        }
        None => return Err(refuse("no general.architecture in the metadata".into())),
    }
    check_rope(&file.content).map_err(refuse)?;
    let config = read_gguf_config(path)?;
    debug_assert_eq!(config.arch, Arch::Llama);
    let c = &config;
    let (embed, tied_head) = file.embedding(c)?;
    let layers = (0..c.num_layers).map(|i| file.layer(c, i)).collect::<Result<Vec<_>>>()?;
    let final_norm = file.vector("output_norm.weight", c.hidden_size)?.to_vec1()?;
    let lm_head = match c.tie_word_embeddings {
        true => tied_head,
        false => file.projection(&[("output.weight", c.vocab_size, RowOrder::AsStored)], c.hidden_size, None)?,
    };
    let leftover = file.leftover();
    if !leftover.is_empty() {
        return Err(refuse(format!("tensors the runtime would ignore: {leftover:?}")));
    }
    Ok(Transformer::from_parts(config, DType::F32, embed, layers, final_norm, lm_head))
}

/// Whether a matrix's rows are llama.cpp's interleaved rotary pairs, over this many heads.
#[derive(Debug, Clone, Copy)]
enum RowOrder {
    AsStored,
    RotaryPairs { heads: usize },
}

/// The file's tensors, read on demand, with a record of which were used.
struct GgufTensors {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
    taken: HashSet<String>,
}

impl GgufTensors {
    fn open(path: &Path) -> Result<Self> {
        let mut reader = BufReader::new(File::open(path).map_err(|e| ModelError::io(path, e))?);
        let content = Content::read(&mut reader).map_err(|e| unreadable(path, &e))?;
        Ok(GgufTensors { path: path.to_path_buf(), content, reader, taken: HashSet::new() })
    }

    /// Tensor `name`, checked to be `shape` (rows first, as HF writes it).
    fn take(&mut self, name: &str, shape: &[usize]) -> Result<QTensor> {
        let info =
            self.content.tensor_infos.get(name).ok_or_else(|| ModelError::MissingTensor { name: name.to_string() })?;
        if info.shape.dims() != shape {
            return Err(ModelError::ShapeMismatch {
                name: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape.dims().to_vec(),
            });
        }
        let tensor = self.content.tensor(&mut self.reader, name, &Device::Cpu).map_err(|e| {
            ModelError::InvalidConfig { path: self.path.clone(), message: format!("tensor {name}: {}", first_line(&e)) }
        })?;
        self.taken.insert(name.to_string());
        Ok(tensor)
    }

    /// A vector (norm weight, bias) in f32.
    fn vector(&mut self, name: &str, len: usize) -> Result<Tensor> {
        Ok(self.take(name, &[len])?.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?)
    }

    /// The token embedding, and the output head it doubles as when the model ties them.
    fn embedding(&mut self, c: &ModelConfig) -> Result<(TokenEmbedding, Projection)> {
        let table = self.take("token_embd.weight", &[c.vocab_size, c.hidden_size])?;
        if is_dense(table.dtype()) {
            let table = table.dequantize(&Device::Cpu)?.to_dtype(DType::F32)?;
            let head = Linear::new(&table, None)?;
            return Ok((TokenEmbedding::Panels(head.weight().clone()), Projection::Dense(head)));
        }
        let table = QMatMul::from_arc(Arc::new(table))?;
        let head = Projection::Quantized(QuantizedLinear::shared(table.clone()));
        Ok((TokenEmbedding::Quantized(table), head))
    }

    /// Matrices `(name, rows, order)` that read the same `cols`-wide input, stacked by rows
    /// in the given order, with their biases if the model has them.
    fn projection(
        &mut self,
        parts: &[(&str, usize, RowOrder)],
        cols: usize,
        bias: Option<&[&str]>,
    ) -> Result<Projection> {
        let mut matrices = Vec::with_capacity(parts.len());
        let mut biases = Vec::new();
        for (i, &(name, rows, order)) in parts.iter().enumerate() {
            let mut matrix = self.take(name, &[rows, cols])?;
            let hf_order = match order {
                RowOrder::AsStored => None,
                RowOrder::RotaryPairs { heads } => Some(hf_rotary_order(rows, heads)?),
            };
            if let Some(order) = &hf_order {
                matrix = reorder_rows(&matrix, order)?;
            }
            matrices.push(matrix);
            if let Some(names) = bias {
                let mut b = self.vector(names[i], rows)?;
                if let Some(order) = &hf_order {
                    let index: Vec<u32> = order.iter().map(|&r| r as u32).collect();
                    b = b.index_select(&Tensor::from_vec(index, rows, &Device::Cpu)?, 0)?;
                }
                biases.push(b);
            }
        }
        let bias = if biases.is_empty() { None } else { Some(Tensor::cat(&biases, 0)?) };
        if matrices.iter().all(|m| is_dense(m.dtype())) {
            let dense = matrices.iter().map(|m| m.dequantize(&Device::Cpu)).collect::<candle_core::Result<Vec<_>>>()?;
            return Ok(Projection::Dense(Linear::new(&Tensor::cat(&dense, 0)?, bias)?));
        }
        Ok(Projection::Quantized(QuantizedLinear::stacked(matrices, bias)?))
    }

    fn layer(&mut self, c: &ModelConfig, index: usize) -> Result<DecoderLayer> {
        let p = format!("blk.{index}");
        let name = |short: &str| format!("{p}.{short}");
        let (h, q_out, kv_out) = (c.hidden_size, c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim);
        let (q, k, v) = (name("attn_q.weight"), name("attn_k.weight"), name("attn_v.weight"));
        let (qb, kb, vb) = (name("attn_q.bias"), name("attn_k.bias"), name("attn_v.bias"));
        let qkv_bias = c.qkv_bias.then_some([qb.as_str(), kb.as_str(), vb.as_str()]);
        let qkv = self.projection(
            &[
                (&q, q_out, RowOrder::RotaryPairs { heads: c.num_heads }),
                (&k, kv_out, RowOrder::RotaryPairs { heads: c.num_kv_heads }),
                (&v, kv_out, RowOrder::AsStored),
            ],
            h,
            qkv_bias.as_ref().map(|b| b.as_slice()),
        )?;
        let (gate, up) = (name("ffn_gate.weight"), name("ffn_up.weight"));
        let gate_up = self.projection(
            &[(&gate, c.intermediate_size, RowOrder::AsStored), (&up, c.intermediate_size, RowOrder::AsStored)],
            h,
            None,
        )?;
        Ok(DecoderLayer {
            attn_norm: self.vector(&name("attn_norm.weight"), h)?.to_vec1()?,
            qkv,
            qk_norm: None,
            o_proj: self.projection(&[(&name("attn_output.weight"), h, RowOrder::AsStored)], q_out, None)?,
            mlp_norm: self.vector(&name("ffn_norm.weight"), h)?.to_vec1()?,
            gate_up,
            down: self.projection(&[(&name("ffn_down.weight"), h, RowOrder::AsStored)], c.intermediate_size, None)?,
        })
    }

    /// Tensors of the file that no part of the model read, sorted.
    fn leftover(&self) -> Vec<String> {
        let mut names: Vec<String> =
            self.content.tensor_infos.keys().filter(|n| !self.taken.contains(*n)).cloned().collect();
        names.sort();
        names
    }
}

/// Types candle stores as plain numbers: multiplied by our dense kernels instead.
fn is_dense(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16)
}

/// For each row of an HF-ordered q/k matrix of `heads` heads, the row of llama.cpp's
/// interleaved layout it comes from. llama.cpp's row `2i + j` of a head (pair `i`, member
/// `j`) is HF's row `j * head_dim / 2 + i`.
pub fn hf_rotary_order(rows: usize, heads: usize) -> Result<Vec<usize>> {
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(ModelError::Unsupported(format!(
            "{rows} q/k rows do not split into {heads} heads of rotary pairs"
        )));
    }
    let head_dim = rows / heads;
    let half = head_dim / 2;
    Ok((0..rows)
        .map(|r| {
            let (head, within) = (r / head_dim, r % head_dim);
            let (member, pair) = (within / half, within % half);
            head * head_dim + 2 * pair + member
        })
        .collect())
}

/// A file candle cannot parse. The usual cause is a tensor type candle has no kernels
/// for (llama.cpp's i-quants and ternary types): name it, and where it does run.
fn unreadable(path: &Path, e: &candle_core::Error) -> ModelError {
    let reason = first_line(e);
    let unknown = reason.strip_prefix("unknown dtype for tensor ").and_then(|id| id.trim().parse::<u32>().ok());
    let message = match unknown {
        Some(id) => format!(
            "{} holds tensors of ggml type {} (id {id}), which candle's quantized matmul does not implement \
             (it runs F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K): serve it with \
             `backend: llamacpp`, or requantize it",
            path.display(),
            ggml_type_name(id)
        ),
        None => format!("{} is not a readable GGUF file: {reason}", path.display()),
    };
    ModelError::Unsupported(message)
}

/// candle appends a backtrace to some errors: the first line is the reason.
fn first_line(e: &candle_core::Error) -> String {
    e.to_string().lines().next().unwrap_or_default().to_string()
}

/// ggml's names of the type ids candle does not read (ggml.h, `enum ggml_type`).
fn ggml_type_name(id: u32) -> &'static str {
    match id {
        4 | 5 => "Q4_2/Q4_3 (removed from ggml)",
        16 => "IQ2_XXS",
        17 => "IQ2_XS",
        18 => "IQ3_XXS",
        19 => "IQ1_S",
        20 => "IQ4_NL",
        21 => "IQ3_S",
        22 => "IQ2_S",
        23 => "IQ4_XS",
        24 => "I8",
        25 => "I16",
        26 => "I32",
        27 => "I64",
        28 => "F64",
        29 => "IQ1_M",
        34 => "TQ1_0",
        35 => "TQ2_0",
        39 => "MXFP4",
        _ => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::gguf_import::undo_rotary_permutation;

    #[test]
    fn the_rotary_row_order_is_the_inverse_of_llama_cpp_s_permutation() {
        let (heads, head_dim, cols) = (3, 8, 4);
        let rows = heads * head_dim;
        let gguf = Tensor::arange(0f32, (rows * cols) as f32, &Device::Cpu).unwrap().reshape((rows, cols)).unwrap();
        let expected = undo_rotary_permutation(&gguf, heads).unwrap().to_vec2::<f32>().unwrap();
        let gguf_rows = gguf.to_vec2::<f32>().unwrap();
        let order = hf_rotary_order(rows, heads).unwrap();
        let moved: Vec<Vec<f32>> = order.iter().map(|&r| gguf_rows[r].clone()).collect();
        assert_eq!(moved, expected);
        assert!(hf_rotary_order(10, 3).is_err());
        assert!(hf_rotary_order(12, 0).is_err());
    }

    #[test]
    fn an_unknown_tensor_type_is_named() {
        let e = candle_core::Error::Msg("unknown dtype for tensor 23".into());
        let err = unreadable(Path::new("m.gguf"), &e).to_string();
        assert!(err.contains("IQ4_XS (id 23)") && err.contains("backend: llamacpp"), "{err}");
        let e = candle_core::Error::Msg("gguf: unsupported magic/version".into());
        assert!(unreadable(Path::new("m.gguf"), &e).to_string().contains("not a readable GGUF file"));
    }
}

//! The weights a decoder layer multiplies by, dense (a safetensors checkpoint) or
//! quantized (a GGUF file's blocks, multiplied by our kernel for Q4_1/Q8_0 and by
//! candle's quantized matmul for other types), behind one type so that the
//! transformer's forward does not care which it runs.

use std::sync::Arc;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{DType, Device, Module, Tensor};

use super::error::{ModelError, Result};
use super::huge_pages::prefer_huge_pages;
use super::linear::{add_bias, Linear};
use super::ops::with_slice;
use super::panels::PanelMatrix;
use super::qmatmul::{self, Format};

/// A layer `y = x Wᵀ + b` over packed token rows.
#[derive(Debug, Clone)]
pub enum Projection {
    Dense(Linear),
    Quantized(QuantizedLinear),
}

impl Projection {
    /// `x`: `(tokens, in_features)` → `(tokens, out_features)`, f32 for quantized weights.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Projection::Dense(linear) => linear.forward(x),
            Projection::Quantized(q) => q.forward(x),
        }
    }

    /// Moves the weights onto huge pages where the kernel allows; returns the bytes moved.
    pub fn prefer_huge_pages(&self) -> usize {
        match self {
            Projection::Dense(linear) => linear.prefer_huge_pages(),
            Projection::Quantized(q) => q.prefer_huge_pages(),
        }
    }

    /// [`forward`](Self::forward) as a row-major f32 vector.
    pub fn forward_to_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        match self {
            Projection::Dense(linear) => linear.forward_to_vec(x),
            Projection::Quantized(q) => q.forward_to_vec(x),
        }
    }
}

/// Quantized blocks times f32 activations. Layers that read the same input (q/k/v,
/// gate/up) are stacked into one matrix when their block types agree, so a step issues
/// one matmul; parts of different types (a "mixed" quantization such as Q4_K_M keeps
/// some v rows in Q6_K) run one after the other and their outputs are concatenated.
#[derive(Debug, Clone)]
pub struct QuantizedLinear {
    parts: Vec<QuantizedPart>,
    bias: Option<Tensor>,
}

/// One stacked matrix, multiplied by our kernel where it has one for the block type
/// (candle's is scalar for Q4_1, and runs on its own thread pool), else by candle's.
#[derive(Debug, Clone)]
enum QuantizedPart {
    Ours { weight: Arc<QTensor>, format: Format },
    Candle(QMatMul),
}

impl QuantizedPart {
    fn new(weight: Arc<QTensor>) -> Result<Self> {
        Ok(match Format::of(weight.dtype()) {
            Some(format) if weight.device().is_cpu() => QuantizedPart::Ours { weight, format },
            _ => QuantizedPart::Candle(QMatMul::from_arc(weight)?),
        })
    }

    fn out_features(&self) -> Result<usize> {
        Ok(match self {
            QuantizedPart::Ours { weight, .. } => weight.shape().dims2()?.0,
            QuantizedPart::Candle(QMatMul::QTensor(w)) => w.shape().dims2()?.0,
            QuantizedPart::Candle(QMatMul::Tensor(w) | QMatMul::TensorF16(w)) => w.dims2()?.0,
        })
    }

    /// `x`: `(m, k)` f32 and contiguous → `(m, out)` as a row-major vector.
    fn forward_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        match self {
            QuantizedPart::Ours { weight, format } => {
                let (n, k) = weight.shape().dims2()?;
                let (m, kx) = x.dims2()?;
                if kx != k {
                    return Err(ModelError::Unsupported(format!("({m}, {kx}) inputs to a ({n}, {k}) matrix")));
                }
                // Borrowed in place: candle's CPU storage hands out its block bytes.
                let blocks = weight.data()?;
                with_slice::<f32, _>(x, |xs| qmatmul::matmul(*format, &blocks, n, k, xs, m))?
            }
            QuantizedPart::Candle(q) => Ok(q.forward(x)?.flatten_all()?.to_vec1()?),
        }
    }
}

impl QuantizedLinear {
    /// Stacks `parts` (each `(out_i, in)`) along their rows, merging neighbours of the same type.
    pub fn stacked(parts: Vec<QTensor>, bias: Option<Tensor>) -> Result<Self> {
        let mut groups: Vec<Vec<QTensor>> = Vec::new();
        for part in parts {
            match groups.last_mut() {
                Some(group) if group[0].dtype() == part.dtype() => group.push(part),
                _ => groups.push(vec![part]),
            }
        }
        let parts = groups
            .into_iter()
            .map(|group| QuantizedPart::new(Arc::new(stack_rows(group)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(QuantizedLinear { parts, bias })
    }

    /// The matrix as one matmul, shared with whoever else holds `weight` (the tied
    /// embedding table).
    pub fn shared(weight: QMatMul) -> Self {
        let part = match weight {
            QMatMul::QTensor(w) => match Format::of(w.dtype()) {
                Some(format) if w.device().is_cpu() => QuantizedPart::Ours { weight: w, format },
                _ => QuantizedPart::Candle(QMatMul::QTensor(w)),
            },
            other => QuantizedPart::Candle(other),
        };
        QuantizedLinear { parts: vec![part], bias: None }
    }

    /// Moves the blocks our kernel streams onto huge pages; returns the bytes moved.
    fn prefer_huge_pages(&self) -> usize {
        let ours = self.parts.iter().filter_map(|part| match part {
            QuantizedPart::Ours { weight, .. } => weight.data().ok(),
            QuantizedPart::Candle(_) => None,
        });
        ours.map(|blocks| prefer_huge_pages(&blocks)).sum()
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dims2()?.0;
        let out = self.parts.iter().map(|p| p.out_features()).sum::<Result<usize>>()?;
        Ok(Tensor::from_vec(self.forward_to_vec(x)?, (rows, out), &Device::Cpu)?)
    }

    /// [`forward`](Self::forward) as a row-major f32 vector.
    pub fn forward_to_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let rows = x.dims2()?.0;
        let mut y = match self.parts.as_slice() {
            [one] => one.forward_vec(&x)?,
            parts => {
                let outs = parts.iter().map(|p| p.forward_vec(&x)).collect::<Result<Vec<_>>>()?;
                let mut y = Vec::with_capacity(outs.iter().map(Vec::len).sum());
                for row in 0..rows {
                    for out in &outs {
                        let width = out.len() / rows.max(1);
                        y.extend_from_slice(&out[row * width..(row + 1) * width]);
                    }
                }
                y
            }
        };
        add_bias(&mut y, rows, self.bias.as_ref())?;
        Ok(y)
    }
}

/// The token embedding table: rows gathered from a dense tensor or dequantized from
/// their blocks on lookup (a step reads a few rows; the table stays quantized).
#[derive(Debug, Clone)]
pub enum TokenEmbedding {
    Dense(Tensor),
    /// A table tied to the output head, looked up in the head's packed matrix.
    Panels(Arc<PanelMatrix>),
    Quantized(QMatMul),
}

impl TokenEmbedding {
    /// `ids` → `(ids, hidden)`.
    pub fn lookup(&self, ids: &Tensor) -> Result<Tensor> {
        Ok(match self {
            TokenEmbedding::Dense(table) => table.index_select(ids, 0)?,
            TokenEmbedding::Panels(table) => {
                let rows = table.gather_rows(&ids.to_vec1::<u32>()?)?;
                Tensor::from_vec(rows, (ids.dims1()?, table.cols()), &Device::Cpu)?
            }
            TokenEmbedding::Quantized(table) => table.embedding(ids)?,
        })
    }
}

/// Bytes of one row of a `(rows, cols)` tensor of type `dtype` (rows are whole blocks).
pub fn row_bytes(dtype: GgmlDType, cols: usize) -> usize {
    cols / dtype.block_size() * dtype.type_size()
}

/// `parts` of one block type, each `(rows_i, cols)`, as one `(Σ rows_i, cols)` tensor.
fn stack_rows(mut parts: Vec<QTensor>) -> Result<QTensor> {
    if parts.len() == 1 {
        return Ok(parts.remove(0));
    }
    let dtype = parts[0].dtype();
    let cols = parts[0].shape().dims2()?.1;
    let mut rows = 0;
    let mut bytes = Vec::new();
    for part in &parts {
        let (r, c) = part.shape().dims2()?;
        if c != cols {
            return Err(ModelError::Unsupported(format!("cannot stack a ({r}, {c}) matrix under ({rows}, {cols})")));
        }
        rows += r;
        bytes.extend_from_slice(&part.data()?);
    }
    qtensor_from_bytes(&bytes, dtype, (rows, cols))
}

/// Rows `order[i]` of `t` as its row `i`: whole rows of blocks are moved, so this is
/// exact for every block type.
pub fn reorder_rows(t: &QTensor, order: &[usize]) -> Result<QTensor> {
    let (rows, cols) = t.shape().dims2()?;
    if order.len() != rows || order.iter().any(|&r| r >= rows) {
        return Err(ModelError::Unsupported(format!("a row order of {} rows for a {rows}-row matrix", order.len())));
    }
    let width = row_bytes(t.dtype(), cols);
    let data = t.data()?;
    let mut bytes = Vec::with_capacity(data.len());
    for &r in order {
        bytes.extend_from_slice(&data[r * width..(r + 1) * width]);
    }
    qtensor_from_bytes(&bytes, t.dtype(), (rows, cols))
}

/// A CPU tensor of `dtype` from its raw blocks. candle reads the blocks in place and
/// asserts their alignment, so the bytes are first copied into 8-byte-aligned memory.
fn qtensor_from_bytes(bytes: &[u8], dtype: GgmlDType, shape: (usize, usize)) -> Result<QTensor> {
    let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
    // Safety: a u64 buffer of at least `bytes.len()` bytes, viewed as bytes.
    let view = unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr() as *mut u8, bytes.len()) };
    view.copy_from_slice(bytes);
    let storage = QStorage::from_data(std::borrow::Cow::Borrowed(&*view), &Device::Cpu, dtype)?;
    Ok(QTensor::new(storage, shape)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(rows: usize, cols: usize) -> Tensor {
        let values: Vec<f32> = (0..rows * cols).map(|i| ((i * 37 % 101) as f32 - 50.0) / 25.0).collect();
        Tensor::from_vec(values, (rows, cols), &Device::Cpu).unwrap()
    }

    fn rows_of(t: &Tensor) -> Vec<Vec<f32>> {
        t.to_vec2().unwrap()
    }

    #[test]
    fn reordered_rows_dequantize_to_the_reordered_matrix() {
        let dense = matrix(6, 64);
        for dtype in [GgmlDType::F32, GgmlDType::Q8_0, GgmlDType::Q4_1] {
            let q = QTensor::quantize(&dense, dtype).unwrap();
            let order = [3, 0, 5, 1, 4, 2];
            let moved = reorder_rows(&q, &order).unwrap().dequantize(&Device::Cpu).unwrap();
            let original = rows_of(&q.dequantize(&Device::Cpu).unwrap());
            let expected: Vec<Vec<f32>> = order.iter().map(|&r| original[r].clone()).collect();
            assert_eq!(rows_of(&moved), expected, "{dtype:?}");
        }
        let q = QTensor::quantize(&dense, GgmlDType::Q8_0).unwrap();
        assert!(reorder_rows(&q, &[0, 1, 2]).is_err());
        assert!(reorder_rows(&q, &[0, 1, 2, 3, 4, 6]).is_err());
    }

    #[test]
    fn stacked_parts_compute_what_the_parts_compute() {
        let (a, b, c) = (matrix(8, 64), matrix(4, 64).affine(0.5, 0.1).unwrap(), matrix(4, 64));
        let x = matrix(3, 64).affine(0.1, 0.0).unwrap();
        let q = |t: &Tensor, d| QTensor::quantize(t, d).unwrap();
        // Same type: one stacked matrix. Mixed types: the q8_0 part runs on its own.
        let same = QuantizedLinear::stacked(
            vec![q(&a, GgmlDType::Q4_1), q(&b, GgmlDType::Q4_1), q(&c, GgmlDType::Q4_1)],
            None,
        )
        .unwrap();
        assert_eq!(same.parts.len(), 1);
        let mixed = QuantizedLinear::stacked(
            vec![q(&a, GgmlDType::Q4_1), q(&b, GgmlDType::Q8_0), q(&c, GgmlDType::Q4_1)],
            Some(Tensor::ones(16, DType::F32, &Device::Cpu).unwrap()),
        )
        .unwrap();
        assert_eq!(mixed.parts.len(), 3);
        // Quantizing is deterministic: the same inputs give the same blocks again.
        let one_by_one = |parts: Vec<QTensor>| {
            let outs: Vec<Tensor> = parts
                .into_iter()
                .map(|p| QuantizedLinear::stacked(vec![p], None).unwrap().forward(&x).unwrap())
                .collect();
            Tensor::cat(&outs, 1).unwrap()
        };
        let expected = one_by_one(vec![q(&a, GgmlDType::Q4_1), q(&b, GgmlDType::Q4_1), q(&c, GgmlDType::Q4_1)]);
        let got = same.forward(&x).unwrap();
        assert_eq!(got.dims(), &[3, 16]);
        let diff = (got - &expected).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{diff}");
        let expected = one_by_one(vec![q(&a, GgmlDType::Q4_1), q(&b, GgmlDType::Q8_0), q(&c, GgmlDType::Q4_1)]);
        let got = (mixed.forward(&x).unwrap() - 1.0).unwrap();
        let diff = (got - &expected).unwrap().abs().unwrap().max_all().unwrap().to_scalar::<f32>().unwrap();
        assert!(diff < 1e-5, "{diff}");
    }
}

//! A dense layer `y = x Wᵀ + b` over packed token rows.

use std::sync::Arc;

use candle_core::{DType, Device, Tensor};

use super::error::{ModelError, Result};
use super::ops::with_slice;
use super::panels::PanelMatrix;

#[derive(Debug, Clone)]
pub struct Linear {
    /// `(out_features, in_features)`, as checkpoints store it, packed for our kernel
    /// (shared with the embedding table it is tied to, if any).
    weight: Arc<PanelMatrix>,
    bias: Option<Tensor>,
}

impl Linear {
    /// A layer from a checkpoint's `(out, in)` weight; the weight is packed here.
    pub fn new(weight: &Tensor, bias: Option<Tensor>) -> Result<Self> {
        Ok(Linear { weight: Arc::new(PanelMatrix::from_tensor(weight)?), bias })
    }

    /// Several layers that read the same input (q/k/v, gate/up) as one, so a step
    /// issues one matmul instead of several: their weights stacked by rows, and their
    /// biases if every part has one.
    pub fn stacked(weights: &[Tensor], biases: Option<&[Tensor]>) -> Result<Self> {
        let bias = match biases {
            Some(b) => Some(Tensor::cat(b, 0)?),
            None => None,
        };
        Linear::new(&Tensor::cat(weights, 0)?, bias)
    }

    /// The packed weight, for an embedding table tied to it.
    pub fn weight(&self) -> &Arc<PanelMatrix> {
        &self.weight
    }

    /// Moves the weight onto huge pages where the kernel allows; returns the bytes moved.
    pub fn prefer_huge_pages(&self) -> usize {
        self.weight.prefer_huge_pages()
    }

    pub fn out_features(&self) -> usize {
        self.weight.rows()
    }

    /// `x`: `(tokens, in_features)` → `(tokens, out_features)`, in `x`'s dtype (our
    /// kernel computes in f32).
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dims2()?.0;
        let y = Tensor::from_vec(self.forward_to_vec(x)?, (rows, self.out_features()), &Device::Cpu)?;
        Ok(y.to_dtype(x.dtype())?)
    }

    /// [`forward`](Self::forward) in f32, as a row-major vector. Our kernel writes it
    /// directly: a step's logits (rows × vocabulary, 39 MB at 64 rows of Qwen3's) are
    /// then allocated once, not once for a tensor and again to copy them out.
    pub fn forward_to_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        let (m, _) = x.dims2()?;
        let x = x.to_dtype(DType::F32)?.contiguous()?;
        let mut y = with_slice::<f32, _>(&x, |xs| self.weight.matmul(xs, m))??;
        add_bias(&mut y, m, self.bias.as_ref())?;
        Ok(y)
    }
}

/// Adds `bias` (one value per output) to each of the `rows` rows of `y`.
pub(crate) fn add_bias(y: &mut [f32], rows: usize, bias: Option<&Tensor>) -> Result<()> {
    let Some(b) = bias else { return Ok(()) };
    let b: Vec<f32> = b.to_dtype(DType::F32)?.to_vec1()?;
    if rows > 0 && y.len() != rows * b.len() {
        return Err(ModelError::Unsupported(format!("a bias of {} for {} outputs", b.len(), y.len() / rows)));
    }
    for row in y.chunks_exact_mut(b.len().max(1)) {
        row.iter_mut().zip(&b).for_each(|(v, b)| *v += b);
    }
    Ok(())
}

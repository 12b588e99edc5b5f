//! A dense layer `y = x Wᵀ + b` over packed token rows.

use candle_core::{DType, Device, Storage, Tensor};

use super::error::Result;
use super::huge_pages::prefer_huge_pages;
use super::matmul::matmul_xwt;

#[derive(Debug, Clone)]
pub struct Linear {
    /// `(out_features, in_features)`, as checkpoints store it.
    weight: Tensor,
    bias: Option<Tensor>,
}

impl Linear {
    pub fn new(weight: Tensor, bias: Option<Tensor>) -> Self {
        Linear { weight, bias }
    }

    /// Stacks several layers that read the same input into one, so a step issues one
    /// matmul instead of several (q/k/v, gate/up).
    pub fn fuse(parts: &[Linear]) -> Result<Linear> {
        let weights: Vec<&Tensor> = parts.iter().map(|p| &p.weight).collect();
        let weight = Tensor::cat(&weights, 0)?;
        let bias = if parts.iter().all(|p| p.bias.is_some()) {
            let b: Vec<&Tensor> = parts.iter().filter_map(|p| p.bias.as_ref()).collect();
            Some(Tensor::cat(&b, 0)?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// Moves the weight onto huge pages where the kernel allows; returns the bytes moved.
    pub fn prefer_huge_pages(&self) -> usize {
        let huge = |t: &Tensor| match t.dtype() {
            DType::F16 => with_slice::<half::f16, _>(t, prefer_huge_pages),
            DType::BF16 => with_slice::<half::bf16, _>(t, prefer_huge_pages),
            DType::F32 => with_slice::<f32, _>(t, prefer_huge_pages),
            _ => Ok(0),
        };
        huge(&self.weight).unwrap_or(0)
    }

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `x`: `(tokens, in_features)` → `(tokens, out_features)`, in `x`'s dtype. Our
    /// kernels take f32 activations; other activation types go through candle's matmul,
    /// with the weights converted to their type.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = if self.takes_own_kernel(x) {
            self.own_kernel(x)?
        } else if self.weight.dtype() != x.dtype() {
            x.matmul(&self.weight.to_dtype(x.dtype())?.t()?)?
        } else {
            x.matmul(&self.weight.t()?)?
        };
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(&b.to_dtype(y.dtype())?)?,
            None => y,
        })
    }

    /// [`forward`](Self::forward) as a row-major f32 vector. Our kernel writes it
    /// directly: a step's logits (rows × vocabulary, 39 MB at 64 rows of Qwen3's) are
    /// then allocated once, not once for the tensor and again to copy them out.
    pub fn forward_to_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        if self.bias.is_none() && self.takes_own_kernel(x) {
            return self.own_kernel_vec(x);
        }
        Ok(self.forward(x)?.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?)
    }

    /// Our kernels beat candle's GEMM at every row count measured (1-2,048 rows,
    /// `examples/matmul_bench.rs`), and stream half-precision weights without widening
    /// the whole matrix per call.
    fn takes_own_kernel(&self, x: &Tensor) -> bool {
        let weights = matches!(self.weight.dtype(), DType::F32 | DType::F16 | DType::BF16);
        weights && x.dtype() == DType::F32
    }

    fn own_kernel(&self, x: &Tensor) -> Result<Tensor> {
        let shape = (x.dims()[0], self.out_features());
        Ok(Tensor::from_vec(self.own_kernel_vec(x)?, shape, &Device::Cpu)?)
    }

    fn own_kernel_vec(&self, x: &Tensor) -> Result<Vec<f32>> {
        let (m, k) = x.dims2()?;
        let n = self.out_features();
        let x = x.contiguous()?;
        let mut y = vec![0f32; m * n];
        let y_out = &mut y;
        with_slice::<f32, _>(&x, |xs| match self.weight.dtype() {
            DType::F16 => with_slice::<half::f16, _>(&self.weight, |ws| matmul_xwt(xs, ws, y_out, m, k, n)),
            DType::BF16 => with_slice::<half::bf16, _>(&self.weight, |ws| matmul_xwt(xs, ws, y_out, m, k, n)),
            _ => with_slice::<f32, _>(&self.weight, |ws| matmul_xwt(xs, ws, y_out, m, k, n)),
        })??;
        Ok(y)
    }
}

/// Runs `f` on the data of a contiguous CPU tensor of element type `T`, without copying it.
fn with_slice<T: candle_core::WithDType, R>(t: &Tensor, f: impl FnOnce(&[T]) -> R) -> candle_core::Result<R> {
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else { candle_core::bail!("our matmul runs on CPU tensors only") };
    let Some((start, end)) = layout.contiguous_offsets() else { candle_core::bail!("tensor is not contiguous") };
    Ok(f(&cpu.as_slice::<T>()?[start..end]))
}

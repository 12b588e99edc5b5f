//! A dense layer `y = x Wᵀ + b` over packed token rows.

use candle_core::{Module, Tensor};

use super::error::Result;

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

    pub fn out_features(&self) -> usize {
        self.weight.dims()[0]
    }

    /// `x`: `(tokens, in_features)` → `(tokens, out_features)`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = x.matmul(&self.weight.t()?)?;
        Ok(match &self.bias {
            Some(b) => y.broadcast_add(b)?,
            None => y,
        })
    }
}

impl Module for Linear {
    fn forward(&self, x: &Tensor) -> candle_core::Result<Tensor> {
        Linear::forward(self, x).map_err(|e| candle_core::Error::Msg(e.to_string()))
    }
}

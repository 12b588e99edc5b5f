//! The CUDA backend (cargo feature `cuda`): the decoder step on an NVIDIA card, behind
//! the same [`Backend`](super::Backend) trait as the CPU.
//!
//! cuBLAS runs the GEMMs (2-byte weights and inputs, f32 outputs and accumulation, the
//! residual added by the GEMM itself); `kernels.cu` holds the rest (embedding, RMSNorm,
//! q/k norm and rotation with the K/V store, paged attention over the varlen batch,
//! SiLU·up, logit statistics). K/V live in device memory in the same page plan as the
//! CPU's arena, so block pools, the prefix cache, pending K/V and shared budgets work
//! unchanged. The driver and cuBLAS are opened at run time: a build needs neither, and a
//! machine without them gets an error that says so.
//!
//! What needs no card is compiled and tested everywhere: the step's packed metadata
//! ([`step`]), launch shapes ([`launch`]) and the CPU reference the kernels are held to
//! ([`reference`]).

pub mod launch;
pub mod reference;
pub mod step;

#[cfg(feature = "cuda")]
mod backend;
#[cfg(feature = "cuda")]
pub mod check;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
mod weights;

#[cfg(feature = "cuda")]
pub use backend::CudaBackend;

use super::backend::WeightDtype;
use super::error::{ModelError, Result};
use super::kv_arena::KvDtype;

/// K/V on a card are stored in the weights' 2-byte type: `f32` (the default) means that
/// type; a different 2-byte type is refused.
pub fn kv_dtype_on_cuda(weights: WeightDtype, asked: KvDtype) -> Result<KvDtype> {
    let native = match weights {
        WeightDtype::Bf16 => KvDtype::Bf16,
        _ => KvDtype::F16,
    };
    match asked {
        KvDtype::F32 => Ok(native),
        same if same == native => Ok(native),
        other => Err(ModelError::Unsupported(format!(
            "kv_dtype {other:?} with {} weights: on cuda K/V are stored in the weights' type",
            weights.as_str()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kv_on_a_card_takes_the_weights_type() {
        assert_eq!(kv_dtype_on_cuda(WeightDtype::Bf16, KvDtype::F32).unwrap(), KvDtype::Bf16);
        assert_eq!(kv_dtype_on_cuda(WeightDtype::F16, KvDtype::F32).unwrap(), KvDtype::F16);
        assert_eq!(kv_dtype_on_cuda(WeightDtype::F16, KvDtype::F16).unwrap(), KvDtype::F16);
        let e = kv_dtype_on_cuda(WeightDtype::Bf16, KvDtype::F16).unwrap_err();
        assert!(e.to_string().contains("weights' type"), "{e}");
    }
}

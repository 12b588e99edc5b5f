//! Choosing and building a model's backend from its load options: candle on the CPU,
//! llama.cpp (cargo feature `llamacpp`), or CUDA for a model on a card (feature `cuda`).

use std::path::Path;

use super::backend::{Backend, BackendKind, LoadOptions};
use super::candle_backend::CandleBackend;
use super::device::DeviceSpec;
use super::error::{ModelError, Result};
use super::kv_arena::KvDtype;

/// The backend `options` ask for, loaded from an HF folder or a GGUF file.
pub fn load_backend(path: &Path, options: &LoadOptions) -> Result<Box<dyn Backend>> {
    if let DeviceSpec::Cuda(ordinal) = options.device {
        return load_cuda(path, options, ordinal);
    }
    match options.backend {
        BackendKind::Candle => Ok(Box::new(CandleBackend::load(path, options)?)),
        BackendKind::Llamacpp => load_llamacpp(path, options),
    }
}

#[cfg(feature = "llamacpp")]
fn load_llamacpp(path: &Path, options: &LoadOptions) -> Result<Box<dyn Backend>> {
    Ok(Box::new(super::llamacpp::LlamaCppBackend::load(path, options)?))
}

#[cfg(not(feature = "llamacpp"))]
fn load_llamacpp(_: &Path, _: &LoadOptions) -> Result<Box<dyn Backend>> {
    Err(ModelError::Unsupported(
        "this build has no llama.cpp backend: build with `--features llamacpp` (see README)".into(),
    ))
}

#[cfg(feature = "cuda")]
fn load_cuda(path: &Path, options: &LoadOptions, ordinal: usize) -> Result<Box<dyn Backend>> {
    if options.backend != BackendKind::Candle {
        return Err(ModelError::Unsupported(format!(
            "backend {} runs on the CPU; a model on cuda:{ordinal} runs on the CUDA backend (leave `backend` unset)",
            options.backend.as_str()
        )));
    }
    Ok(Box::new(super::cuda::CudaBackend::load(path, options, ordinal)?))
}

#[cfg(not(feature = "cuda"))]
fn load_cuda(_: &Path, _: &LoadOptions, ordinal: usize) -> Result<Box<dyn Backend>> {
    Err(ModelError::Unsupported(format!(
        "this build has no CUDA backend for cuda:{ordinal}: build with `--features cuda` (see docs/backends.md)"
    )))
}

/// The K/V type a model's store uses: on a card the weights' 2-byte type (see
/// [`kv_dtype_on_cuda`](super::cuda::kv_dtype_on_cuda)), else what was asked.
pub fn effective_kv_dtype(options: &LoadOptions) -> Result<KvDtype> {
    if options.device.is_cuda() {
        super::cuda::kv_dtype_on_cuda(options.dtype, options.kv_dtype)
    } else {
        Ok(options.kv_dtype)
    }
}

//! One model's hold on a card: its context, its own stream (so colocated models' steps
//! overlap), a cuBLAS handle on that stream, and the kernels of `kernels.cu` loaded for
//! the model's 2-byte type. Every failure becomes a [`ModelError::Cuda`] that says what
//! to do; the driver library's absence is checked before cudarc would panic on it.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchConfig, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::launch::Shape;
use crate::model::error::{ModelError, Result};

static PTX_SM80: &str = include_str!(concat!(env!("OUT_DIR"), "/kernels_sm80.ptx"));
static CUBIN_SM90A: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernels_sm90a.cubin"));

/// The 2-byte element type a model runs in on the card.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HalfKind {
    Bf16,
    F16,
}

impl HalfKind {
    pub fn suffix(self) -> &'static str {
        match self {
            HalfKind::Bf16 => "bf16",
            HalfKind::F16 => "f16",
        }
    }

    fn blas_type(self) -> blas_sys::cudaDataType {
        match self {
            HalfKind::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            HalfKind::F16 => blas_sys::cudaDataType::CUDA_R_16F,
        }
    }
}

pub(crate) fn driver_error(what: &str) -> impl Fn(DriverError) -> ModelError + '_ {
    move |e| ModelError::Cuda(format!("{what}: {e}"))
}

/// The kernels of `kernels.cu` for one element type.
pub(crate) struct Kernels {
    pub embed: CudaFunction,
    pub rms_norm: CudaFunction,
    pub qkv_prepare: CudaFunction,
    pub attention: CudaFunction,
    pub silu_mul: CudaFunction,
    pub fill_uniform: CudaFunction,
    pub add_bias: CudaFunction,
    pub logit_stats: CudaFunction,
}

pub(crate) struct Gpu {
    pub ctx: Arc<CudaContext>,
    pub stream: Arc<CudaStream>,
    pub blas: CudaBlas,
    pub kernels: Kernels,
    pub half: HalfKind,
    pub ordinal: usize,
}

impl Gpu {
    /// Opens card `ordinal` with a stream of its own, or says why it cannot.
    pub fn open(ordinal: usize, half: HalfKind) -> Result<Gpu> {
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(ModelError::Cuda(
                "no CUDA driver: libcuda.so could not be loaded (install the NVIDIA driver, or add its folder to \
                 LD_LIBRARY_PATH)"
                    .into(),
            ));
        }
        // cudarc panics on a missing symbol (a driver older than the build expects).
        catch_unwind(AssertUnwindSafe(|| Self::open_checked(ordinal, half))).unwrap_or_else(|panic| {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(ModelError::Cuda(format!("the CUDA libraries refused to start: {why}")))
        })
    }

    fn open_checked(ordinal: usize, half: HalfKind) -> Result<Gpu> {
        let count = CudaContext::device_count().map_err(driver_error("counting devices"))?;
        if ordinal >= count.max(0) as usize {
            return Err(ModelError::Cuda(format!("no device cuda:{ordinal}: this machine has {count} CUDA device(s)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver_error("opening the device"))?;
        // Each model's work stays on its own stream and buffers; the engine orders
        // page hand-overs between models, so cudarc's per-buffer events are not needed.
        // SAFETY: called before this context allocates anything.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver_error("creating a stream"))?;
        // SAFETY: only probes whether the library can be opened.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(ModelError::Cuda(
                "cuBLAS could not be loaded (libcublas.so.13 / libcublasLt.so.13: add their folder to \
                 LD_LIBRARY_PATH, e.g. a PyTorch environment's nvidia/cublas/lib)"
                    .into(),
            ));
        }
        let blas = CudaBlas::new(stream.clone()).map_err(|e| ModelError::Cuda(format!("starting cuBLAS: {e}")))?;
        let kernels = load_kernels(&ctx, half)?;
        Ok(Gpu { ctx, stream, blas, kernels, half, ordinal })
    }

    /// `len` zeroed elements, or an error with the sizes when the card is full.
    pub fn zeros<T: DeviceRepr + ValidAsZeroBits>(&self, len: usize, what: &str) -> Result<CudaSlice<T>> {
        self.stream.alloc_zeros(len.max(1)).map_err(|e| self.allocation_error(len * size_of::<T>(), what, e))
    }

    pub fn upload<T: DeviceRepr>(&self, host: &[T], what: &str) -> Result<CudaSlice<T>> {
        if host.is_empty() {
            return self.zeros_unchecked(what);
        }
        self.stream.clone_htod(host).map_err(|e| self.allocation_error(std::mem::size_of_val(host), what, e))
    }

    fn zeros_unchecked<T: DeviceRepr>(&self, what: &str) -> Result<CudaSlice<T>> {
        // SAFETY: a one-element buffer nobody reads (an empty upload).
        unsafe { self.stream.alloc(1) }.map_err(|e| self.allocation_error(0, what, e))
    }

    pub fn write<T: DeviceRepr>(&self, host: &[T], device: &mut CudaSlice<T>) -> Result<()> {
        self.stream.memcpy_htod(host, device).map_err(driver_error("copying to the device"))
    }

    /// Copies `device` (its first `host.len()` elements) back and waits for it.
    pub fn read<T: DeviceRepr>(&self, device: &CudaSlice<T>, host: &mut [T]) -> Result<()> {
        let view = device.slice(..host.len());
        self.stream.memcpy_dtoh(&view, host).map_err(driver_error("copying from the device"))
    }

    fn allocation_error(&self, bytes: usize, what: &str, e: DriverError) -> ModelError {
        let free = self.ctx.mem_get_info().map(|(free, total)| format!("{} of {} MiB free", free >> 20, total >> 20));
        ModelError::Cuda(format!(
            "allocating {what} ({} MiB) on cuda:{}: {e}{}",
            bytes.div_ceil(1 << 20),
            self.ordinal,
            free.map(|f| format!(" ({f})")).unwrap_or_default()
        ))
    }

    /// `out (f32, tokens × w.rows) = x (tokens × w.cols) · wᵀ + beta · out`: a row-major
    /// `[rows][cols]` weight is cuBLAS's column-major `cols × rows`, so this is
    /// `Wᵀ·X` in its terms. `beta = 1` adds into `out` (the residual stream).
    pub fn matmul(&self, w: &Matrix, x: u64, tokens: usize, out: u64, beta: f32) -> Result<()> {
        let (alpha, beta) = (1.0f32, beta);
        let (m, n, k) = (w.rows as i32, tokens as i32, w.cols as i32);
        // SAFETY: `w` holds rows × cols elements of `half`; the caller's x holds
        // tokens × cols of them and out tokens × rows f32, all on this stream's device.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                m,
                n,
                k,
                &alpha as *const f32 as *const c_void,
                w.ptr(&self.stream) as *const c_void,
                self.half.blas_type(),
                k,
                x as *const c_void,
                self.half.blas_type(),
                k,
                &beta as *const f32 as *const c_void,
                out as *mut c_void,
                blas_sys::cudaDataType::CUDA_R_32F,
                m,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| ModelError::Cuda(format!("cuBLAS GEMM {}x{}x{}: {e}", w.rows, tokens, w.cols)))
    }

    pub fn synchronize(&self) -> Result<()> {
        self.stream.synchronize().map_err(driver_error("running the step"))
    }
}

/// A row-major `[rows][cols]` weight in the model's 2-byte type.
pub(crate) struct Matrix {
    pub data: CudaSlice<u16>,
    pub rows: usize,
    pub cols: usize,
}

impl Matrix {
    pub fn ptr(&self, stream: &CudaStream) -> u64 {
        raw(&self.data, stream)
    }
}

/// A buffer's device address, for kernel arguments and cuBLAS.
pub(crate) fn raw<T>(slice: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    // Event tracking is off (see `open_checked`): the guard records nothing.
    let (ptr, _guard) = slice.device_ptr(stream);
    ptr
}

impl From<Shape> for LaunchConfig {
    fn from(s: Shape) -> Self {
        LaunchConfig { grid_dim: s.grid, block_dim: s.block, shared_mem_bytes: s.shared_bytes }
    }
}

/// Launches `$func` with `$shape` on `$gpu`'s stream; each argument is bound to a local
/// first, so that the launch reads values that live until it returns.
macro_rules! launch {
    ($gpu:expr, $func:expr, $shape:expr, [$($arg:expr),* $(,)?]) => {{
        use cudarc::driver::PushKernelArg as _;
        let mut builder = $gpu.stream.launch_builder(&$func);
        $(
            let arg = $arg;
            builder.arg(&arg);
        )*
        // SAFETY: the argument list matches the kernel's signature in kernels.cu (each
        // launch site is checked against it), and every buffer is large enough for the shape.
        unsafe { builder.launch(cudarc::driver::LaunchConfig::from($shape)) }
            .map(|_| ())
            .map_err($crate::model::cuda::gpu::driver_error(stringify!($func)))
    }};
}
pub(crate) use launch;

/// Kernels exported once per 2-byte type (`NAME_bf16`, `NAME_f16`), and once.
const TYPED_KERNELS: &[&str] = &["embed", "rms_norm", "qkv_prepare", "attention", "silu_mul", "fill_uniform"];
const PLAIN_KERNELS: &[&str] = &["add_bias_f32", "logit_stats_f32"];

fn load_kernels(ctx: &Arc<CudaContext>, half: HalfKind) -> Result<Kernels> {
    let capability = ctx.compute_capability().map_err(driver_error("reading the compute capability"))?;
    if capability.0 < 8 {
        return Err(ModelError::Cuda(format!(
            "compute capability {}.{} is below 8.0: the kernels need bf16 arithmetic (Ampere or newer)",
            capability.0, capability.1
        )));
    }
    // Hopper loads the cubin as it is; other cards JIT-compile the PTX.
    let image = if capability == (9, 0) { Ptx::from_binary(CUBIN_SM90A.to_vec()) } else { Ptx::from_src(PTX_SM80) };
    let module = ctx.load_module(image).map_err(|e| {
        ModelError::Cuda(format!(
            "loading the kernels for compute capability {}.{}: {e} (the driver may be older than the CUDA 13.0 \
             toolkit they were built with)",
            capability.0, capability.1
        ))
    })?;
    let typed = |name: &str| {
        debug_assert!(TYPED_KERNELS.contains(&name));
        let full = format!("{name}_{}", half.suffix());
        module.load_function(&full).map_err(|e| ModelError::Cuda(format!("kernel {full} failed to load: {e}")))
    };
    let plain = |name: &str| {
        debug_assert!(PLAIN_KERNELS.contains(&name));
        module.load_function(name).map_err(|e| ModelError::Cuda(format!("kernel {name} failed to load: {e}")))
    };
    Ok(Kernels {
        embed: typed("embed")?,
        rms_norm: typed("rms_norm")?,
        qkv_prepare: typed("qkv_prepare")?,
        attention: typed("attention")?,
        silu_mul: typed("silu_mul")?,
        fill_uniform: typed("fill_uniform")?,
        add_bias: plain("add_bias_f32")?,
        logit_stats: plain("logit_stats_f32")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded PTX and cubin (nvcc ran in build.rs, for sm_80 and sm_90a) export
    /// every kernel the backend loads, under the name it loads.
    #[test]
    fn both_images_export_every_kernel_the_backend_loads() {
        assert!(PTX_SM80.contains(".target sm_80"), "PTX for compute capability 8.0");
        let names = TYPED_KERNELS
            .iter()
            .flat_map(|k| [format!("{k}_bf16"), format!("{k}_f16")])
            .chain(PLAIN_KERNELS.iter().map(|k| k.to_string()));
        for name in names {
            assert!(PTX_SM80.contains(&format!(".entry {name}(")), "PTX lacks {name}");
            let in_cubin =
                CUBIN_SM90A.windows(name.len() + 1).any(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
            assert!(in_cubin, "sm_90a cubin lacks {name}");
        }
        assert_eq!(&CUBIN_SM90A[..4], b"\x7fELF", "a cubin is an ELF image");
        // The paged K/V view travels by value as 40 bytes (backend.rs's `KvLayer`).
        for t in ["bf16", "f16"] {
            assert!(PTX_SM80.contains(&format!(".align 8 .b8 qkv_prepare_{t}_param_11[40]")));
            assert!(PTX_SM80.contains(&format!(".align 8 .b8 attention_{t}_param_9[40]")));
        }
    }

    /// Without a driver the backend says so instead of panicking (CI has no GPU).
    #[test]
    fn a_machine_without_a_driver_gets_an_error_that_says_so() {
        // SAFETY: only probes whether the library can be opened.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let err = Gpu::open(0, HalfKind::Bf16).err().expect("no driver, no GPU");
        assert!(err.to_string().contains("no CUDA driver"), "{err}");
    }
}

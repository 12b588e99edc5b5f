//! The few llama.h calls the backend needs, each wrapped once with the invariant that
//! makes it sound. Everything unsafe about llama.cpp lives in this file.

use std::ffi::{c_char, c_void, CStr, CString};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::OnceLock;

use llama_cpp_sys_2 as sys;

use crate::model::error::{ModelError, Result};

/// llama.cpp's process-wide setup, done once; its logs go to `tracing`.
fn init_runtime() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        // SAFETY: called once per process, before any model is loaded.
        unsafe {
            sys::llama_log_set(Some(log_to_tracing), std::ptr::null_mut());
            sys::llama_backend_init();
        }
    });
}

unsafe extern "C" fn log_to_tracing(level: sys::ggml_log_level, text: *const c_char, _: *mut c_void) {
    if text.is_null() {
        return;
    }
    // SAFETY: llama.cpp passes a NUL-terminated string valid for this call.
    let text = unsafe { CStr::from_ptr(text) }.to_string_lossy();
    let text = text.trim_end();
    match level {
        sys::GGML_LOG_LEVEL_ERROR => tracing::error!(target: "llama.cpp", "{text}"),
        sys::GGML_LOG_LEVEL_WARN => tracing::warn!(target: "llama.cpp", "{text}"),
        _ => tracing::trace!(target: "llama.cpp", "{text}"),
    }
}

/// A loaded GGUF model. Freed on drop; contexts borrow it through [`Context`]'s owner.
pub(super) struct Model {
    ptr: NonNull<sys::llama_model>,
}

// SAFETY: a llama_model is immutable after loading and llama.cpp shares it between
// threads (several contexts may use one model).
unsafe impl Send for Model {}
unsafe impl Sync for Model {}

impl Model {
    pub(super) fn load(path: &Path) -> Result<Self> {
        init_runtime();
        let c_path = CString::new(path.to_string_lossy().as_bytes())
            .map_err(|_| ModelError::LlamaCpp(format!("{}: path holds a NUL byte", path.display())))?;
        // SAFETY: default params are plain data; the path outlives the call.
        let ptr = unsafe {
            let mut params = sys::llama_model_default_params();
            params.n_gpu_layers = 0;
            // No extra weight buffers: on CPUs with AMX (Intel Sapphire Rapids on), a
            // native build puts weights in ggml's AMX buffer, whose matmul crashed with
            // SIGSEGV on a 2-vCPU VM (docs/backends.md).
            // The plain CPU path serves every type. What this gives up: ggml's repacked
            // layouts for Q4_0, Q4_K, IQ4_NL (and Q8_0 on some CPUs), faster on those
            // types; the f32 and Q4_1 models the benchmarks serve never had them.
            params.use_extra_bufts = false;
            sys::llama_model_load_from_file(c_path.as_ptr(), params)
        };
        NonNull::new(ptr)
            .map(|ptr| Model { ptr })
            .ok_or_else(|| ModelError::LlamaCpp(format!("{} did not load (see the llama.cpp log)", path.display())))
    }

    /// The model's vocabulary; it lives as long as the model.
    fn vocab(&self) -> *const sys::llama_vocab {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_get_vocab(self.ptr.as_ptr()) }
    }

    pub(super) fn vocab_size(&self) -> usize {
        // SAFETY: the vocab pointer is valid while the model is alive.
        unsafe { sys::llama_vocab_n_tokens(self.vocab()) as usize }
    }

    /// `text` as llama.cpp's own tokenizer encodes it: `add_special` adds BOS/EOS where the
    /// vocabulary asks for them, `parse_special` matches control tokens written in the text.
    pub(super) fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        let too_long = || ModelError::LlamaCpp(format!("a text of {} bytes is too long to tokenize", text.len()));
        let text_len = i32::try_from(text.len()).map_err(|_| too_long())?;
        // A byte-level BPE gives at most one token per byte, plus BOS and EOS; a
        // vocabulary that gives more says how many, and the second call has room.
        let mut ids: Vec<i32> = vec![0; text.len() + 2];
        for _ in 0..2 {
            let room = i32::try_from(ids.len()).map_err(|_| too_long())?;
            // SAFETY: `text` is `text_len` valid bytes (llama.cpp reads the length, no NUL
            // is needed); `ids` has room for `room` tokens and llama.cpp writes at most that
            // many; the vocab is valid while the model is alive.
            let n = unsafe {
                sys::llama_tokenize(
                    self.vocab(),
                    text.as_ptr() as *const c_char,
                    text_len,
                    ids.as_mut_ptr(),
                    room,
                    add_special,
                    parse_special,
                )
            };
            match n {
                i32::MIN => return Err(too_long()),
                n if n >= 0 => {
                    ids.truncate(n as usize);
                    return Ok(ids.into_iter().map(|id| id as u32).collect());
                }
                n => ids.resize(n.unsigned_abs() as usize, 0),
            }
        }
        Err(ModelError::LlamaCpp("llama_tokenize asked for more room twice".into()))
    }

    pub(super) fn hidden_size(&self) -> usize {
        // SAFETY: the model is alive.
        unsafe { sys::llama_model_n_embd(self.ptr.as_ptr()) as usize }
    }
}

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: the only owner; every context using it was dropped first (Context
        // holds an Arc to it).
        unsafe { sys::llama_model_free(self.ptr.as_ptr()) }
    }
}

/// What a context is built with.
pub(super) struct ContextSpec {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_seq_max: u32,
    pub threads: i32,
}

/// The final-norm rows of one decode, copied out as llama.cpp computes them.
#[derive(Default)]
struct HiddenCapture {
    enabled: bool,
    rows: Vec<f32>,
}

/// The graph node holding the final-norm hidden states of the output rows.
const HIDDEN_NODE: &[u8] = b"result_norm";

unsafe extern "C" fn capture_hidden(t: *mut sys::ggml_tensor, ask: bool, user_data: *mut c_void) -> bool {
    // SAFETY: user_data is the context's boxed HiddenCapture, alive while it decodes,
    // and only the decoding thread touches it; t is a live graph tensor.
    let capture = unsafe { &mut *(user_data as *mut HiddenCapture) };
    let name = unsafe { CStr::from_ptr(sys::ggml_get_name(t)) };
    let wanted = capture.enabled && name.to_bytes() == HIDDEN_NODE;
    if ask || !wanted {
        return if ask { wanted } else { true };
    }
    unsafe {
        let bytes = sys::ggml_nbytes(t);
        let at = capture.rows.len();
        capture.rows.resize(at + bytes / std::mem::size_of::<f32>(), 0.0);
        sys::ggml_backend_tensor_get(t, capture.rows[at..].as_mut_ptr() as *mut c_void, 0, bytes);
    }
    true
}

/// A llama.cpp context: its KV cache and compute buffers, over one model.
pub(super) struct Context {
    ptr: NonNull<sys::llama_context>,
    /// Read by `capture_hidden` through the pointer given at creation: boxed, so it
    /// does not move, and dropped after the context (field order).
    capture: Box<HiddenCapture>,
    model: std::sync::Arc<Model>,
}

// SAFETY: a llama_context may move between threads; it is used from one at a time
// (`&mut self` on every call that touches it).
unsafe impl Send for Context {}

/// Why `llama_decode` refused a batch.
pub(super) enum DecodeFailure {
    /// No room in the KV cache for the batch.
    NoSlot,
    Other(i32),
}

impl Context {
    pub(super) fn new(model: std::sync::Arc<Model>, spec: &ContextSpec) -> Result<Self> {
        let mut capture = Box::<HiddenCapture>::default();
        // SAFETY: default params are plain data; the capture pointer stays valid for
        // the context's life (see the field's comment).
        let ptr = unsafe {
            let mut p = sys::llama_context_default_params();
            p.n_ctx = spec.n_ctx;
            p.n_batch = spec.n_batch;
            p.n_ubatch = spec.n_batch.min(512);
            p.n_seq_max = spec.n_seq_max;
            // One output per sequence and step: no room for more logits rows.
            p.n_outputs_max = spec.n_seq_max;
            p.n_threads = spec.threads;
            p.n_threads_batch = spec.threads;
            p.kv_unified = true;
            p.embeddings = false;
            p.no_perf = true;
            // Asked about every graph node, it declines all but one node, and that
            // one only when a step wants hidden states: measured free otherwise.
            p.cb_eval = Some(capture_hidden);
            p.cb_eval_user_data = &mut *capture as *mut HiddenCapture as *mut c_void;
            sys::llama_init_from_model(model.ptr.as_ptr(), p)
        };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| ModelError::LlamaCpp("the context could not be created (see the llama.cpp log)".into()))?;
        Ok(Context { ptr, capture, model })
    }

    pub(super) fn model(&self) -> &Model {
        &self.model
    }

    /// Forgets K/V of `seq` from position `from` on.
    pub(super) fn forget(&mut self, seq: i32, from: usize) {
        self.forget_range(seq, from, None);
    }

    /// Forgets K/V of `seq` at positions `from..to` (`None`: to the end).
    pub(super) fn forget_range(&mut self, seq: i32, from: usize, to: Option<usize>) {
        let to = to.map_or(-1, |t| t as i32);
        // SAFETY: the context is alive; removing a range of a sequence on a standard
        // KV cache cannot fail partially.
        unsafe {
            let memory = sys::llama_get_memory(self.ptr.as_ptr());
            sys::llama_memory_seq_rm(memory, seq, from as i32, to);
        }
    }

    /// Makes `dst` share `src`'s K/V at positions `from..to`: in the unified cache the
    /// cells gain a sequence id, nothing is copied.
    pub(super) fn share(&mut self, src: i32, dst: i32, from: usize, to: usize) {
        // SAFETY: the context is alive and both ids are below n_seq_max.
        unsafe {
            let memory = sys::llama_get_memory(self.ptr.as_ptr());
            sys::llama_memory_seq_cp(memory, src, dst, from as i32, to as i32);
        }
    }

    /// Runs the batch; the final hidden states of its output rows are kept when asked.
    pub(super) fn decode(&mut self, batch: &Batch, want_hidden: bool) -> std::result::Result<(), DecodeFailure> {
        self.capture.enabled = want_hidden;
        self.capture.rows.clear();
        // SAFETY: the batch's arrays hold n_tokens valid entries (Batch::push keeps them).
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw) };
        self.capture.enabled = false;
        match code {
            0 => Ok(()),
            1 => Err(DecodeFailure::NoSlot),
            other => Err(DecodeFailure::Other(other)),
        }
    }

    /// The logits of the `output`-th token of the last batch that asked for them.
    pub(super) fn logits(&self, batch_index: usize, vocab: usize) -> Result<&[f32]> {
        // SAFETY: llama.cpp returns NULL for an index without logits; otherwise n_vocab
        // floats that live until the next decode, which needs `&mut self`.
        let ptr = unsafe { sys::llama_get_logits_ith(self.ptr.as_ptr(), batch_index as i32) };
        if ptr.is_null() {
            return Err(ModelError::LlamaCpp(format!("no logits for batch token {batch_index}")));
        }
        Ok(unsafe { std::slice::from_raw_parts(ptr, vocab) })
    }

    /// Hidden rows captured by the last decode (output rows in batch order).
    pub(super) fn hidden(&self) -> &[f32] {
        &self.capture.rows
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: the only owner.
        unsafe { sys::llama_free(self.ptr.as_ptr()) }
    }
}

/// A token batch in llama.cpp's layout: one sequence id per token.
pub(super) struct Batch {
    raw: sys::llama_batch,
    capacity: usize,
}

// SAFETY: the batch's arrays are plain heap memory owned by this value.
unsafe impl Send for Batch {}

impl Batch {
    pub(super) fn with_capacity(capacity: usize) -> Self {
        // SAFETY: allocates `capacity` entries of each array (one seq id per token).
        let raw = unsafe { sys::llama_batch_init(capacity as i32, 0, 1) };
        Batch { raw, capacity }
    }

    pub(super) fn capacity(&self) -> usize {
        self.capacity
    }

    pub(super) fn clear(&mut self) {
        self.raw.n_tokens = 0;
    }

    pub(super) fn len(&self) -> usize {
        self.raw.n_tokens as usize
    }

    /// Appends a token; the caller keeps `len() < capacity()`.
    pub(super) fn push(&mut self, token: u32, position: usize, seq: i32, output: bool) {
        let i = self.len();
        assert!(i < self.capacity, "batch capacity {} exceeded", self.capacity);
        // SAFETY: i < capacity, and llama_batch_init allocated that many entries, with
        // one seq id slot per token.
        unsafe {
            *self.raw.token.add(i) = token as i32;
            *self.raw.pos.add(i) = position as i32;
            *self.raw.n_seq_id.add(i) = 1;
            *(*self.raw.seq_id.add(i)) = seq;
            *self.raw.logits.add(i) = output as i8;
        }
        self.raw.n_tokens += 1;
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // SAFETY: allocated by llama_batch_init, freed once.
        unsafe { sys::llama_batch_free(self.raw) }
    }
}

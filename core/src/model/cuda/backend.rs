//! [`CudaBackend`]: the [`Backend`] on a card. One step: upload the batch's packed
//! metadata (and the page table when it changed), run every layer on the model's own
//! stream, and bring back the last positions' logits (and hidden states when asked).

use std::path::Path;
use std::sync::{Arc, Mutex, Weak};

use cudarc::driver::{CudaSlice, DeviceRepr};

use super::gpu::{launch, raw, Gpu, HalfKind};
use super::kv_dtype_on_cuda;
use super::launch::{attention, grid_stride, per_row, qkv_prepare, unsupported_shape};
use super::step::{Section, StepLayout};
use super::weights::Weights;
use crate::model::backend::{check_rows, reserve_rows, Backend, ForwardOutput, LoadOptions, RowInput, WeightDtype};
use crate::model::config::ModelConfig;
use crate::model::error::{ModelError, Result};
use crate::model::gguf_read::is_gguf_file;
use crate::model::kv::BlockPool;
use crate::model::kv_arena::{KvArena, KvDtype, KvGeometry};
use crate::model::rope::Rope;
use crate::model::weights::Checkpoint;

pub struct CudaBackend {
    config: ModelConfig,
    gpu: Gpu,
    weights: Weights,
    kv: DeviceKv,
    inv_freq: CudaSlice<f32>,
    scratch: Option<Scratch>,
}

impl CudaBackend {
    /// An HF folder's weights on card `ordinal`, in `options.dtype` (bf16 or f16).
    pub fn load(dir: &Path, options: &LoadOptions, ordinal: usize) -> Result<Self> {
        if is_gguf_file(dir) {
            return Err(ModelError::Unsupported(
                "GGUF files run on the CPU backends; on cuda, load an HF folder (tokenrouter model export writes one)"
                    .into(),
            ));
        }
        let config = ModelConfig::from_file(&dir.join("config.json"))?;
        let half = half_kind(options)?;
        check_shape(&config)?;
        let gpu = Gpu::open(ordinal, half)?;
        let ckpt = Checkpoint::open(dir, options.dtype.candle()?)?;
        let weights = Weights::load(&gpu, &config, &ckpt)?;
        Self::with_weights(config, gpu, weights, options)
    }

    /// A model of `config`'s shape with random weights made on the card (nothing is
    /// read or copied: for shapes too large to write, such as an 8B model).
    pub fn random(config: ModelConfig, options: &LoadOptions, ordinal: usize, seed: u64) -> Result<Self> {
        let half = half_kind(options)?;
        check_shape(&config)?;
        let gpu = Gpu::open(ordinal, half)?;
        let weights = Weights::random(&gpu, &config, seed, 0.02)?;
        Self::with_weights(config, gpu, weights, options)
    }

    fn with_weights(config: ModelConfig, gpu: Gpu, weights: Weights, options: &LoadOptions) -> Result<Self> {
        let kv = DeviceKv::new(&gpu, &config, options)?;
        let inv_freq = gpu.upload(&Rope::new(&config).inv_freq_f32(), "rotary frequencies")?;
        let backend = CudaBackend { config, gpu, weights, kv, inv_freq, scratch: None };
        backend.gpu.synchronize()?;
        Ok(backend)
    }

    /// Bytes of weights a batch-1 step streams (for bandwidth fractions).
    pub fn streamed_weight_bytes(&self) -> usize {
        self.weights.matrix_bytes()
    }

    pub fn device_name(&self) -> String {
        self.gpu.ctx.name().unwrap_or_else(|_| format!("cuda:{}", self.gpu.ordinal))
    }

    pub(crate) fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    pub fn half(&self) -> HalfKind {
        self.gpu.half
    }

    fn run(&mut self, layout: &StepLayout, want_hidden: bool) -> Result<ForwardOutput> {
        let c = &self.config;
        // Scratch rows past the layers hold one output position each.
        let (tokens, rows) = (layout.tokens(), layout.outputs());
        self.kv.sync(&self.gpu)?;
        if !self.scratch.as_ref().is_some_and(|s| s.fits(tokens, rows, layout.data().len())) {
            self.scratch = None; // freed before its larger successor is allocated
            self.scratch = Some(Scratch::new(&self.gpu, c, tokens, rows, layout.data().len())?);
        }
        let s = self.scratch.as_mut().expect("made above");
        self.gpu.write(layout.data(), &mut s.meta)?;
        let s = &*s;
        let gpu = &self.gpu;
        let stream = &gpu.stream;
        let meta = raw(&s.meta, stream);
        let at = |section: Section| meta + 4 * layout.offset(section) as u64;
        let (x, h, qkv, attn, gate_up) =
            (raw(&s.x, stream), raw(&s.h, stream), raw(&s.qkv, stream), raw(&s.attn, stream), raw(&s.gate_up, stream));
        let eps = c.rms_norm_eps as f32;
        let (hidden, inter) = (c.hidden_size as i32, c.intermediate_size as i32);
        let k = &gpu.kernels;
        launch!(gpu, k.embed, per_row(tokens), [self.weights.embed.ptr(stream), at(Section::Ids), x, hidden])?;
        let (heads, kv_heads, head_dim) = (c.num_heads as i32, c.num_kv_heads as i32, c.head_dim as i32);
        let scale = 1.0 / (c.head_dim as f32).sqrt();
        for (index, layer) in self.weights.layers.iter().enumerate() {
            let kv = self.kv.layer(stream, index);
            launch!(gpu, k.rms_norm, per_row(tokens), [x, 0u64, raw(&layer.attn_norm, stream), h, 0u64, hidden, eps])?;
            gpu.matmul(&layer.qkv, h, tokens, qkv, 0.0)?;
            if let Some(bias) = &layer.qkv_bias {
                let n = tokens * layer.qkv.rows;
                launch!(gpu, k.add_bias, grid_stride(n), [qkv, raw(bias, stream), layer.qkv.rows as i32, n as i64])?;
            }
            let (q_norm, k_norm) = layer.qk_norm.as_ref().map_or((0, 0), |(q, k)| (raw(q, stream), raw(k, stream)));
            launch!(
                gpu,
                k.qkv_prepare,
                qkv_prepare(tokens, c),
                [
                    qkv,
                    heads,
                    kv_heads,
                    head_dim,
                    q_norm,
                    k_norm,
                    eps,
                    raw(&self.inv_freq, stream),
                    at(Section::Positions),
                    at(Section::Blocks),
                    at(Section::Slots),
                    kv,
                ]
            )?;
            launch!(
                gpu,
                k.attention,
                attention(tokens, c),
                [
                    qkv,
                    heads,
                    kv_heads,
                    head_dim,
                    scale,
                    at(Section::Positions),
                    at(Section::Rows),
                    at(Section::RowTables),
                    at(Section::Tables),
                    kv,
                    attn,
                ]
            )?;
            gpu.matmul(&layer.o_proj, attn, tokens, x, 1.0)?;
            launch!(gpu, k.rms_norm, per_row(tokens), [x, 0u64, raw(&layer.mlp_norm, stream), h, 0u64, hidden, eps])?;
            gpu.matmul(&layer.gate_up, h, tokens, gate_up, 0.0)?;
            let n = tokens * c.intermediate_size;
            launch!(gpu, k.silu_mul, grid_stride(n), [gate_up, h, inter, n as i64])?;
            gpu.matmul(&layer.down, h, tokens, x, 1.0)?;
        }
        let (last_h, hidden_out, logits) = (raw(&s.last_h, stream), raw(&s.hidden_out, stream), raw(&s.logits, stream));
        let hidden_f32 = if want_hidden { hidden_out } else { 0 };
        launch!(
            gpu,
            k.rms_norm,
            per_row(rows),
            [x, at(Section::Last), raw(&self.weights.final_norm, stream), last_h, hidden_f32, hidden, eps,]
        )?;
        gpu.matmul(self.weights.lm_head(), last_h, rows, logits, 0.0)?;
        let mut out_logits = vec![0.0f32; rows * c.vocab_size];
        gpu.read(&s.logits, &mut out_logits)?;
        let hidden_states = if want_hidden {
            let mut states = vec![0.0f32; rows * c.hidden_size];
            gpu.read(&s.hidden_out, &mut states)?;
            Some(states)
        } else {
            None
        };
        Ok(ForwardOutput {
            vocab_size: c.vocab_size,
            hidden_size: c.hidden_size,
            logits: out_logits,
            hidden: hidden_states,
        })
    }
}

impl Backend for CudaBackend {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    fn kv_pool(&self) -> &BlockPool {
        &self.kv.pool
    }

    fn forward_at(&mut self, rows: &mut [RowInput<'_>], outputs: &[usize], want_hidden: bool) -> Result<ForwardOutput> {
        check_rows(&self.config, &self.kv.pool, rows, outputs)?;
        reserve_rows(&self.kv.pool, rows)?;
        let layout = StepLayout::new(rows, outputs);
        match self.run(&layout, want_hidden) {
            Ok(out) => {
                for row in rows.iter_mut() {
                    row.kv.set_computed(row.start + row.tokens.len());
                }
                Ok(out)
            }
            Err(e) => {
                // K/V of the fed positions may be half written: forget them.
                rows.iter_mut().for_each(|r| r.kv.truncate(r.start));
                Err(e)
            }
        }
    }
}

fn half_kind(options: &LoadOptions) -> Result<HalfKind> {
    let half = match options.dtype {
        WeightDtype::Bf16 => HalfKind::Bf16,
        WeightDtype::F16 => HalfKind::F16,
        other => {
            return Err(ModelError::Unsupported(format!(
                "dtype {} does not run on cuda: use bf16 or f16 (checkpoints in any type convert on load)",
                other.as_str()
            )))
        }
    };
    let kv = kv_dtype_on_cuda(options.dtype, options.kv_dtype)?;
    debug_assert!(matches!((half, kv), (HalfKind::Bf16, KvDtype::Bf16) | (HalfKind::F16, KvDtype::F16)));
    Ok(half)
}

fn check_shape(config: &ModelConfig) -> Result<()> {
    match unsupported_shape(config) {
        Some(why) => Err(ModelError::Unsupported(format!("this model's shape does not run on cuda: {why}"))),
        None => Ok(()),
    }
}

/// Paged K/V in device memory: the page plan and block pool as on the CPU, the pages in
/// an arena on the card (this model's own, or shared with the models colocated on it).
struct DeviceKv {
    pool: BlockPool,
    arena: Arc<DeviceArena>,
    geometry: KvGeometry,
    pages_per_block: usize,
    segments_per_page: usize,
    page_elems: usize,
    /// Page ids per block, as the pool last gave them, and as the card last saw them.
    pages: Vec<u32>,
    uploaded: Vec<u32>,
    pages_device: CudaSlice<u32>,
}

/// `PagedKv<T>` of kernels.cu, passed by value: one layer's view of the paged K/V.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct KvLayer {
    arena: u64,
    pages: u64,
    pages_per_block: i32,
    segments_per_page: i32,
    page_elems: i64,
    block_size: i32,
    layer: i32,
}

// SAFETY: plain data laid out as the kernels' `PagedKv<T>` (two pointers, two ints, a
// long long, two ints: 40 bytes, no padding on either side).
unsafe impl DeviceRepr for KvLayer {}

impl DeviceKv {
    fn new(gpu: &Gpu, config: &ModelConfig, options: &LoadOptions) -> Result<Self> {
        if options.block_size == 0 || options.block_size > 1024 {
            return Err(ModelError::BadBatch(format!("block size {} must be in 1..=1024", options.block_size)));
        }
        let dtype = kv_dtype_on_cuda(options.dtype, options.kv_dtype)?;
        let geometry = KvGeometry::new(config, options.block_size, dtype);
        let (plan, pool) = match &options.shared_kv {
            Some(shared) => (shared.arena.clone(), shared.pool.clone()),
            None => {
                let blocks = options.kv_budget_bytes / (geometry.block_floats() * 4);
                (Arc::new(KvArena::unbacked(blocks, geometry.block_floats())), {
                    BlockPool::paged(blocks, options.block_size, options.prefix_cache)
                })
            }
        };
        let pages_per_block = geometry.pages_per_block(plan.page_floats());
        if pages_per_block != pool.pages_per_block() {
            return Err(ModelError::BadBatch("the shared K/V pool was planned for another page size".into()));
        }
        let arena = DeviceArena::for_plan(gpu, &plan)?;
        let blocks = pool.capacity().total_blocks;
        let pages = vec![0; blocks * pages_per_block];
        Ok(DeviceKv {
            pages_device: gpu.upload(&pages, "the K/V page table")?,
            uploaded: pages.clone(),
            pages,
            pool,
            arena,
            geometry,
            pages_per_block,
            segments_per_page: plan.page_floats() / geometry.segment_floats(),
            page_elems: plan.page_floats() * 2,
        })
    }

    /// Takes in the pages the pool gave since the last step; uploads the table if it moved.
    fn sync(&mut self, gpu: &Gpu) -> Result<()> {
        self.pool.sync_pages(&mut self.pages);
        if self.pages != self.uploaded {
            gpu.write(&self.pages, &mut self.pages_device)?;
            self.uploaded.copy_from_slice(&self.pages);
        }
        Ok(())
    }

    fn layer(&self, stream: &cudarc::driver::CudaStream, layer: usize) -> KvLayer {
        KvLayer {
            arena: raw(&self.arena.pages, stream),
            pages: raw(&self.pages_device, stream),
            pages_per_block: self.pages_per_block as i32,
            segments_per_page: self.segments_per_page as i32,
            page_elems: self.page_elems as i64,
            block_size: self.geometry.block_size as i32,
            layer: layer as i32,
        }
    }
}

/// One page plan's memory on a card, shared by every model that plans its pages there.
struct DeviceArena {
    pages: CudaSlice<u16>,
    ordinal: usize,
}

/// Device arenas by the plan they back: colocated models load one after another and
/// find the first one's memory here.
static ARENAS: Mutex<Vec<(Weak<KvArena>, Weak<DeviceArena>)>> = Mutex::new(Vec::new());

impl DeviceArena {
    fn for_plan(gpu: &Gpu, plan: &Arc<KvArena>) -> Result<Arc<Self>> {
        if plan.host_backed() {
            return Err(ModelError::Unsupported(
                "a CPU model's K/V arena cannot be shared with a model on cuda: share only models on one device".into(),
            ));
        }
        let mut arenas = ARENAS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        arenas.retain(|(plan, arena)| plan.strong_count() > 0 && arena.strong_count() > 0);
        let found =
            arenas.iter().find(|(p, _)| std::ptr::eq(p.as_ptr(), Arc::as_ptr(plan))).and_then(|(_, a)| a.upgrade());
        if let Some(arena) = found {
            if arena.ordinal != gpu.ordinal {
                return Err(ModelError::Unsupported(format!(
                    "models on cuda:{} and cuda:{} cannot share one K/V arena",
                    arena.ordinal, gpu.ordinal
                )));
            }
            return Ok(arena);
        }
        // Zeroed: attention may read slots no step wrote (profiling's uncomputed context).
        let pages = gpu.zeros::<u16>(plan.pages() * plan.page_floats() * 2, "the K/V arena")?;
        let arena = Arc::new(DeviceArena { pages, ordinal: gpu.ordinal });
        arenas.push((Arc::downgrade(plan), Arc::downgrade(&arena)));
        Ok(arena)
    }
}

/// Per-step buffers, made for the largest step seen (sizes rounded up to powers of two).
struct Scratch {
    tokens: usize,
    rows: usize,
    meta_len: usize,
    /// The residual stream, f32.
    x: CudaSlice<f32>,
    /// Normalized rows, then the SiLU·up activations (GEMM inputs).
    h: CudaSlice<u16>,
    qkv: CudaSlice<f32>,
    attn: CudaSlice<u16>,
    gate_up: CudaSlice<f32>,
    meta: CudaSlice<u32>,
    last_h: CudaSlice<u16>,
    hidden_out: CudaSlice<f32>,
    logits: CudaSlice<f32>,
}

impl Scratch {
    fn fits(&self, tokens: usize, rows: usize, meta_len: usize) -> bool {
        self.tokens >= tokens && self.rows >= rows && self.meta_len >= meta_len
    }

    fn new(gpu: &Gpu, c: &ModelConfig, tokens: usize, rows: usize, meta_len: usize) -> Result<Self> {
        let (tokens, rows, meta_len) =
            (tokens.next_power_of_two(), rows.next_power_of_two(), meta_len.next_power_of_two());
        let qkv_width = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
        Ok(Scratch {
            tokens,
            rows,
            meta_len,
            x: gpu.zeros(tokens * c.hidden_size, "activations")?,
            h: gpu.zeros(tokens * c.hidden_size.max(c.intermediate_size), "activations")?,
            qkv: gpu.zeros(tokens * qkv_width, "activations")?,
            attn: gpu.zeros(tokens * c.num_heads * c.head_dim, "activations")?,
            gate_up: gpu.zeros(tokens * 2 * c.intermediate_size, "activations")?,
            meta: gpu.zeros(meta_len, "step metadata")?,
            last_h: gpu.zeros(rows * c.hidden_size, "activations")?,
            hidden_out: gpu.zeros(rows * c.hidden_size, "hidden states")?,
            logits: gpu.zeros(rows * c.vocab_size, "logits")?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::KvLayer;

    /// The kernels read `PagedKv<T>` at these offsets (C layout of kernels.cu's struct).
    #[test]
    fn the_kv_view_has_the_kernels_layout() {
        let v = KvLayer {
            arena: 0,
            pages: 0,
            pages_per_block: 0,
            segments_per_page: 0,
            page_elems: 0,
            block_size: 0,
            layer: 0,
        };
        let at = |field: *const u8| field as usize - (&v as *const KvLayer as usize);
        assert_eq!(std::mem::size_of::<KvLayer>(), 40);
        assert_eq!(at(&v.pages as *const u64 as *const u8), 8);
        assert_eq!(at(&v.pages_per_block as *const i32 as *const u8), 16);
        assert_eq!(at(&v.segments_per_page as *const i32 as *const u8), 20);
        assert_eq!(at(&v.page_elems as *const i64 as *const u8), 24);
        assert_eq!(at(&v.block_size as *const i32 as *const u8), 32);
        assert_eq!(at(&v.layer as *const i32 as *const u8), 36);
    }
}

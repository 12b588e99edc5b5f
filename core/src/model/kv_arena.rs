//! The memory behind paged K/V: one allocation of equal pages, used by one model or
//! shared by colocated models, and the plan that sizes pages so that every model's
//! blocks fit them.
//!
//! A model's block (K and V of `block_size` tokens, every layer and KV head) is cut
//! into segments of `block_size * head_dim` values, one per (layer, K or V, head):
//! the unit attention reads contiguously. A page holds whole segments; a block takes
//! as many pages as its segments need. Which pages a block has is the block pool's
//! business ([`BlockPool::sync_pages`]); the store keeps a copy of that table.

use std::ptr::NonNull;
use std::sync::{Arc, Once};

use super::config::ModelConfig;
use super::kv::{BlockPool, SharedPoolSpec};
use super::zeroed_pages::ZeroedPages;

/// Zeroed, page-aligned storage of `pages` pages of `page_floats` values. Its memory
/// becomes resident as pages are first written, or all at once by [`commit_pages`](Self::commit_pages).
pub struct KvArena {
    ptr: NonNull<f32>,
    floats: usize,
    page_floats: usize,
    committed: Once,
    /// What `ptr` points into; `None` for an arena whose pages live elsewhere (device
    /// memory): only its plan (page count and size) is here.
    memory: Option<ZeroedPages>,
}

// SAFETY: the arena is plain memory. Who may touch which page is decided by the block
// pools (a page belongs to one block of one pool at a time, and only that model's
// compute thread reads or writes it, while a sequence of its step holds the block);
// the pools' mutex orders a page's hand-over between threads.
unsafe impl Send for KvArena {}
unsafe impl Sync for KvArena {}

impl KvArena {
    pub fn new(pages: usize, page_floats: usize) -> Self {
        let floats = pages.checked_mul(page_floats).expect("KV arena size overflows");
        let bytes = floats.checked_mul(4).expect("KV arena size overflows");
        let memory = ZeroedPages::new(bytes);
        let ptr = NonNull::new(memory.as_ptr() as *mut f32).unwrap_or(NonNull::dangling());
        KvArena { ptr, floats, page_floats, committed: Once::new(), memory: Some(memory) }
    }

    /// The plan of an arena whose memory is on a device: pages are handed out by the
    /// block pools as usual, but nothing is allocated here.
    pub fn unbacked(pages: usize, page_floats: usize) -> Self {
        let floats = pages.checked_mul(page_floats).expect("KV arena size overflows");
        KvArena { ptr: NonNull::dangling(), floats, page_floats, committed: Once::new(), memory: None }
    }

    pub fn host_backed(&self) -> bool {
        self.memory.is_some()
    }

    pub fn pages(&self) -> usize {
        self.floats.checked_div(self.page_floats).unwrap_or(0)
    }

    pub fn page_floats(&self) -> usize {
        self.page_floats
    }

    pub fn bytes(&self) -> usize {
        self.floats * 4
    }

    /// Touches every OS page once, so the whole arena is resident from now on (RSS shows
    /// the KV budget from the start rather than growing under load). Once per arena,
    /// however many models share it.
    pub fn commit_pages(&self) {
        if !self.host_backed() {
            return;
        }
        self.committed.call_once(|| {
            const FLOATS_PER_OS_PAGE: usize = 4096 / std::mem::size_of::<f32>();
            for at in (0..self.floats).step_by(FLOATS_PER_OS_PAGE) {
                // Volatile: a plain store of zero into zeroed memory may be optimized
                // away, and then the page is never touched.
                // SAFETY: `at` is in bounds; nothing reads K/V before the warm-up.
                unsafe { std::ptr::write_volatile(self.ptr.as_ptr().add(at), 0.0) };
            }
        });
    }

    /// `len` values of type `E` (f32 or f16) from `at`, an offset in f32 units (where
    /// a segment starts).
    ///
    /// # Safety
    /// The range is in bounds and lies in pages that the caller's model holds and that
    /// no one writes while the slice lives; `E` is plain data of at most 4-byte alignment.
    pub(crate) unsafe fn slice<E>(&self, at: usize, len: usize) -> &[E] {
        debug_assert!(at * 4 + len * std::mem::size_of::<E>() <= self.floats * 4);
        std::slice::from_raw_parts(self.ptr.as_ptr().add(at) as *const E, len)
    }

    /// [`slice`](Self::slice), to write.
    ///
    /// # Safety
    /// As [`slice`](Self::slice), and no one else reads or writes the range while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn slice_mut<E>(&self, at: usize, len: usize) -> &mut [E] {
        debug_assert!(at * 4 + len * std::mem::size_of::<E>() <= self.floats * 4);
        std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(at) as *mut E, len)
    }
}

impl std::fmt::Debug for KvArena {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvArena").field("pages", &self.pages()).field("page_floats", &self.page_floats).finish()
    }
}

/// How K/V values are stored. f16 halves the bytes a long context costs per decode
/// step and doubles the tokens a budget holds; attention widens them to f32 as it loads
/// and sums in f32. (The golden suite states its accuracy against transformers.)
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvDtype {
    #[default]
    F32,
    F16,
    /// f32's range in 2 bytes: the CUDA backend's K/V beside bf16 weights (the CPU
    /// backend refuses it at load).
    Bf16,
}

impl KvDtype {
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
        }
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "f32" => Ok(KvDtype::F32),
            "f16" => Ok(KvDtype::F16),
            "bf16" => Ok(KvDtype::Bf16),
            other => Err(format!("KV dtype {other:?} is not supported: use f32 or f16 (bf16 on cuda)")),
        }
    }
}

/// How one model's K/V blocks are cut into segments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvGeometry {
    pub block_size: usize,
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub dtype: KvDtype,
}

impl KvGeometry {
    pub fn new(config: &ModelConfig, block_size: usize, dtype: KvDtype) -> Self {
        KvGeometry {
            block_size,
            layers: config.num_layers,
            kv_heads: config.num_kv_heads,
            head_dim: config.head_dim,
            dtype,
        }
    }

    /// Arena floats (4-byte units) of one (layer, K or V, head) segment of a block:
    /// `block_size × head_dim` values (head sizes are even, so f16 fills whole floats).
    pub fn segment_floats(&self) -> usize {
        (self.block_size * self.head_dim * self.dtype.bytes()).div_ceil(4)
    }

    pub fn segments_per_block(&self) -> usize {
        self.layers * 2 * self.kv_heads
    }

    pub fn block_floats(&self) -> usize {
        self.segment_floats() * self.segments_per_block()
    }

    /// Pages of `page_floats` values one block takes (segments never straddle pages).
    pub fn pages_per_block(&self, page_floats: usize) -> usize {
        self.segments_per_block().div_ceil(page_floats / self.segment_floats())
    }
}

/// One model's place in a shared arena: the arena and its block pool in the group.
#[derive(Debug, Clone)]
pub struct SharedKv {
    pub arena: Arc<KvArena>,
    pub pool: BlockPool,
}

impl PartialEq for SharedKv {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.arena, &other.arena) && self.pool.same_pool(&other.pool)
    }
}

/// The page size for models that share an arena: a multiple of every model's segment
/// that wastes the least of their blocks (a block takes whole pages), the largest such
/// on a tie (fewer pages keep the page tables short). For the demo pair it is the small
/// model's whole block, and a large model's block takes 32 pages, none wasted.
pub fn page_floats_for(models: &[KvGeometry]) -> usize {
    let unit = models.iter().map(KvGeometry::segment_floats).fold(1, lcm);
    let largest_block = models.iter().map(KvGeometry::block_floats).max().unwrap_or(unit);
    let waste = |page: usize| -> f64 {
        models
            .iter()
            .map(|g| (g.pages_per_block(page) * page - g.block_floats()) as f64 / g.block_floats() as f64)
            .sum()
    };
    let candidates = (1..=largest_block.div_ceil(unit).clamp(1, 256)).map(|k| k * unit);
    candidates
        .fold((unit, f64::INFINITY), |best, page| {
            let w = waste(page);
            if w <= best.1 + 1e-12 {
                (page, w)
            } else {
                best
            }
        })
        .0
}

/// One arena of `budget_bytes` shared by `models` (with their prefix-cache settings),
/// and a block pool per model drawing pages from it.
pub fn share_kv(models: &[(KvGeometry, bool)], budget_bytes: usize) -> Vec<SharedKv> {
    share_kv_in(models, budget_bytes, KvArena::new)
}

/// [`share_kv`] for models on one device: the pages are planned and handed out here,
/// their memory is the device's (the CUDA backend allocates it once per arena).
pub fn share_device_kv(models: &[(KvGeometry, bool)], budget_bytes: usize) -> Vec<SharedKv> {
    share_kv_in(models, budget_bytes, KvArena::unbacked)
}

fn share_kv_in(
    models: &[(KvGeometry, bool)],
    budget_bytes: usize,
    arena: impl FnOnce(usize, usize) -> KvArena,
) -> Vec<SharedKv> {
    let geometries: Vec<KvGeometry> = models.iter().map(|(g, _)| *g).collect();
    let page_floats = page_floats_for(&geometries);
    let arena = Arc::new(arena(budget_bytes / (page_floats * 4), page_floats));
    let specs: Vec<SharedPoolSpec> = models
        .iter()
        .map(|(g, prefix_cache)| SharedPoolSpec {
            block_size: g.block_size,
            pages_per_block: g.pages_per_block(page_floats),
            prefix_cache: *prefix_cache,
        })
        .collect();
    BlockPool::shared(arena.pages(), &specs).into_iter().map(|pool| SharedKv { arena: arena.clone(), pool }).collect()
}

fn lcm(a: usize, b: usize) -> usize {
    fn gcd(a: usize, b: usize) -> usize {
        if b == 0 {
            a
        } else {
            gcd(b, a % b)
        }
    }
    a / gcd(a, b) * b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn geometry(block_size: usize, layers: usize, kv_heads: usize, head_dim: usize) -> KvGeometry {
        KvGeometry { block_size, layers, kv_heads, head_dim, dtype: KvDtype::F32 }
    }

    /// This process's resident memory, from `/proc/self/statm` (in pages).
    #[cfg(target_os = "linux")]
    fn resident_bytes() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        // SAFETY: sysconf has no preconditions.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn a_large_arena_takes_memory_only_where_written_until_committed() {
        const GIB: usize = 1 << 30;
        let page_floats = 2048;
        let before = resident_bytes();
        let arena = KvArena::new(GIB / (page_floats * 4), page_floats);
        assert_eq!(arena.bytes(), GIB);
        let fresh = resident_bytes();
        assert!(fresh.saturating_sub(before) < GIB / 16, "a fresh 1 GiB arena took {} MiB", (fresh - before) >> 20);

        let spots = [0, arena.floats / 3, arena.floats / 2 + 7, arena.floats - 8];
        for &at in &spots {
            // SAFETY: in bounds; this test alone uses the arena.
            assert_eq!(unsafe { arena.slice::<f32>(at, 8) }, &[0.0; 8], "fresh values at {at} read zero");
            let values: Vec<f32> = (0..8).map(|i| (at + i) as f32 + 0.5).collect();
            unsafe { arena.slice_mut::<f32>(at, 8) }.copy_from_slice(&values);
        }
        for &at in &spots {
            let want: Vec<f32> = (0..8).map(|i| (at + i) as f32 + 0.5).collect();
            assert_eq!(unsafe { arena.slice::<f32>(at, 8) }, &want[..], "what was written at {at} reads back");
        }
        let written = resident_bytes();
        assert!(written.saturating_sub(before) < GIB / 16, "four writes took {} MiB", (written - before) >> 20);

        arena.commit_pages();
        let committed = resident_bytes();
        assert!(committed.saturating_sub(before) > GIB * 9 / 10, "committed {} MiB", (committed - before) >> 20);
        drop(arena);
        let released = resident_bytes();
        assert!(
            committed.saturating_sub(released) > GIB / 2,
            "dropping gave back {} MiB",
            (committed - released) >> 20
        );
    }

    #[test]
    fn pages_fit_whole_segments_of_every_model() {
        // The demo pair: tiny (2 layers, 2 KV heads of 16) and small (8 layers, 4 of 64).
        let tiny = geometry(16, 2, 2, 16);
        let small = geometry(16, 8, 4, 64);
        let page = page_floats_for(&[tiny, small]);
        assert_eq!(page, 2048, "tiny's whole block, a multiple of small's 1,024-value segment");
        assert_eq!((tiny.pages_per_block(page), small.pages_per_block(page)), (1, 32));
        // Blocks of 768 and 1,024 values in segments of 96 and 128: pages of 384 waste
        // an eighth of the second model's blocks; pages of 768 would waste half.
        let (a, b) = (geometry(8, 2, 2, 12), geometry(8, 2, 2, 16));
        assert_eq!(page_floats_for(&[a, b]), 384);
        assert_eq!((a.pages_per_block(384), b.pages_per_block(384)), (2, 3));
        // Segments that do not divide each other: a page holds whole ones of both.
        let odd = geometry(16, 2, 2, 80);
        let page = page_floats_for(&[odd, small]);
        assert!(page % odd.segment_floats() == 0 && page % small.segment_floats() == 0);
        assert!(odd.pages_per_block(page) * page >= odd.block_floats());
    }

    #[test]
    fn f16_kv_halves_a_segment_and_shares_pages_with_f32_models() {
        let small_f16 = KvGeometry { dtype: KvDtype::F16, ..geometry(16, 8, 4, 64) };
        assert_eq!(small_f16.segment_floats(), 512, "16 slots × 64 f16 values in 4-byte floats");
        assert_eq!(small_f16.block_floats() * 2, geometry(16, 8, 4, 64).block_floats());
        let tiny = geometry(16, 2, 2, 16);
        let page = page_floats_for(&[tiny, small_f16]);
        assert_eq!(page % small_f16.segment_floats(), 0);
        assert_eq!(page % tiny.segment_floats(), 0);
        assert_eq!(small_f16.pages_per_block(page) * page, small_f16.block_floats(), "no page wasted");
    }

    #[test]
    fn a_shared_arena_splits_its_pages_by_demand() {
        let tiny = geometry(16, 2, 2, 16);
        let small = geometry(16, 8, 4, 64);
        let shared = share_kv(&[(tiny, true), (small, true)], 64 * 2048 * 4);
        assert_eq!(shared[0].arena.pages(), 64);
        let (a, b) = (&shared[0].pool, &shared[1].pool);
        assert_eq!((a.capacity().total_blocks, b.capacity().total_blocks), (64, 2));
        // The large model may take nearly everything while the small one is idle...
        let mut big = b.new_sequence();
        big.reserve(32).unwrap();
        assert_eq!(a.capacity().free_blocks, 0);
        drop(big);
        // ...and the small one everything once the large one lets go.
        let mut many = a.new_sequence();
        many.reserve(64 * 16).unwrap();
        assert_eq!(b.capacity().free_blocks, 0);
        assert_eq!(a.capacity().used_blocks, 64);
    }
}

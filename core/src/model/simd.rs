//! The vector operations our kernels (few-row matmul, paged attention) are written in,
//! once per instruction set, and the choice of which set runs.
//!
//! The kernels are generic over [`Simd`]; [`KernelPath::active`] picks the widest set the
//! build targets (`.cargo/config.toml` builds for the native CPU), or the one named by
//! `TOKENROUTER_KERNEL` (`avx512`, `avx2`, `portable`), so tests can run every path,
//! including the portable one a CPU without AVX gets, on one machine.

use std::sync::OnceLock;

/// One instruction set's vector of f32 lanes and the operations the kernels use.
pub trait Simd: Copy + Send + Sync + 'static {
    const LANES: usize;
    /// Vector registers the path can name: 32 where AVX-512's encoding is on.
    const REGISTERS: usize;
    type V: Copy;
    fn zero() -> Self::V;
    fn splat(x: f32) -> Self::V;
    /// # Safety
    /// `p` must point at `LANES` readable floats.
    unsafe fn load(p: *const f32) -> Self::V;
    /// # Safety
    /// `p` must point at `LANES` writable floats.
    unsafe fn store(p: *mut f32, v: Self::V);
    /// `LANES` f16 values at `p`, widened.
    ///
    /// # Safety
    /// `p` must point at `LANES` readable values.
    unsafe fn load_f16(p: *const u16) -> Self::V;
    /// `LANES` bf16 values at `p`, widened.
    ///
    /// # Safety
    /// `p` must point at `LANES` readable values.
    unsafe fn load_bf16(p: *const u16) -> Self::V;
    /// `a · b + c`, fused where the set has it.
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    fn mul(a: Self::V, b: Self::V) -> Self::V;
    fn add(a: Self::V, b: Self::V) -> Self::V;
    fn sub(a: Self::V, b: Self::V) -> Self::V;
    /// `a / b` per lane, correctly rounded (the same bits as a scalar division).
    fn div(a: Self::V, b: Self::V) -> Self::V;
    fn max(a: Self::V, b: Self::V) -> Self::V;
    fn sum(v: Self::V) -> f32;
    fn max_lane(v: Self::V) -> f32;
    /// `eˣ` per lane to ~1e-7 relative error; exactly 0 below -87 (and for -∞), so a
    /// masked score contributes nothing.
    fn exp(x: Self::V) -> Self::V;
    fn prefetch(p: *const u8);
    /// Asks for every cache line of `bytes` bytes from `start` (which need not be
    /// readable: a prefetch never faults).
    fn prefetch_bytes(start: *const u8, bytes: usize) {
        for offset in (0..bytes).step_by(CACHE_LINE_BYTES) {
            Self::prefetch(start.wrapping_add(offset));
        }
    }
}

/// The cache line of every CPU we build for.
pub const CACHE_LINE_BYTES: usize = 64;

/// A stored element the kernels widen to f32 as they load it (weights, K/V): f32, f16
/// or bf16. Sums stay f32.
pub trait Elem: Copy + Send + Sync + 'static {
    /// `LANES` consecutive elements at `p`, widened.
    ///
    /// # Safety
    /// `p` must point at `LANES` readable elements.
    unsafe fn load<S: Simd>(p: *const Self) -> S::V;
    fn to_f32(self) -> f32;
    fn from_f32(x: f32) -> Self;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load(p)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
}

impl Elem for half::f16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load_f16(p as *const u16)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
}

impl Elem for half::bf16 {
    #[inline(always)]
    unsafe fn load<S: Simd>(p: *const Self) -> S::V {
        S::load_bf16(p as *const u16)
    }
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
}

/// The instruction sets a kernel can run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelPath {
    Avx512,
    Avx2,
    Portable,
}

impl KernelPath {
    /// The paths this build can run, widest first.
    pub fn compiled() -> Vec<KernelPath> {
        let mut paths = Vec::new();
        if cfg!(all(target_arch = "x86_64", target_feature = "avx512f")) {
            paths.push(KernelPath::Avx512);
        }
        if cfg!(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c")) {
            paths.push(KernelPath::Avx2);
        }
        paths.push(KernelPath::Portable);
        paths
    }

    pub fn name(self) -> &'static str {
        match self {
            KernelPath::Avx512 => "avx512",
            KernelPath::Avx2 => "avx2",
            KernelPath::Portable => "portable",
        }
    }

    /// The path kernels take in this process: `TOKENROUTER_KERNEL` when it names a
    /// compiled path, else the widest. Read once.
    pub fn active() -> KernelPath {
        static ACTIVE: OnceLock<KernelPath> = OnceLock::new();
        *ACTIVE.get_or_init(|| {
            let compiled = Self::compiled();
            let wanted = std::env::var("TOKENROUTER_KERNEL").ok();
            match wanted.and_then(|w| compiled.iter().copied().find(|p| p.name() == w)) {
                Some(path) => path,
                None => compiled[0],
            }
        })
    }
}

/// Runs `$body` with `$S` naming the [`Simd`] type of the active [`KernelPath`].
macro_rules! with_active_simd {
    ($S:ident => $body:expr) => {
        match $crate::model::simd::KernelPath::active() {
            #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
            $crate::model::simd::KernelPath::Avx512 => {
                type $S = $crate::model::simd::Avx512;
                $body
            }
            #[cfg(all(
                target_arch = "x86_64",
                target_feature = "avx2",
                target_feature = "fma",
                target_feature = "f16c"
            ))]
            $crate::model::simd::KernelPath::Avx2 => {
                type $S = $crate::model::simd::Avx2;
                $body
            }
            _ => {
                type $S = $crate::model::simd::Portable;
                $body
            }
        }
    };
}
pub(crate) use with_active_simd;

/// Runs `$body` once per compiled [`Simd`] type, as `$S` (for tests of every path).
#[cfg(test)]
macro_rules! for_each_simd {
    ($S:ident => $body:block) => {{
        {
            type $S = $crate::model::simd::Portable;
            $body
        }
        #[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
        {
            type $S = $crate::model::simd::Avx2;
            $body
        }
        #[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
        {
            type $S = $crate::model::simd::Avx512;
            $body
        }
    }};
}
#[cfg(test)]
pub(crate) use for_each_simd;

/// Cephes' single-precision `exp`: `eˣ = 2ⁿ · eʳ`, `n = round(x / ln 2)`, `r` in
/// `[-ln2/2, ln2/2]`, `eʳ` by a degree-6 polynomial.
mod exp_consts {
    pub const LOG2E: f32 = std::f32::consts::LOG2_E;
    pub const LN2_HI: f32 = 0.693_359_4;
    pub const LN2_LO: f32 = -2.121_944_4e-4;
    pub const P: [f32; 6] = [1.987_569_1e-4, 1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 5.000_000_1e-1];
    /// Below this, eˣ is reported as 0 (e⁻⁸⁷ ≈ 1.6e-38, the smallest normal f32).
    pub const LOW: f32 = -87.0;
    pub const HIGH: f32 = 88.3;
}

/// The scalar form of [`Simd::exp`], for the portable path and kernel tails.
#[inline(always)]
pub fn exp_scalar(x: f32) -> f32 {
    use exp_consts::*;
    if x.is_nan() || x < LOW {
        return 0.0;
    }
    let x = x.min(HIGH);
    let n = (x * LOG2E).round();
    let r = n.mul_add(-LN2_LO, n.mul_add(-LN2_HI, x));
    let mut p = P[0];
    for c in &P[1..] {
        p = p.mul_add(r, *c);
    }
    let e = p.mul_add(r * r, r + 1.0);
    e * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
#[derive(Clone, Copy)]
pub struct Avx512;

#[cfg(all(target_arch = "x86_64", target_feature = "avx512f"))]
impl Simd for Avx512 {
    const LANES: usize = 16;
    const REGISTERS: usize = 32;
    type V = std::arch::x86_64::__m512;
    #[inline(always)]
    fn zero() -> Self::V {
        unsafe { std::arch::x86_64::_mm512_setzero_ps() }
    }
    #[inline(always)]
    fn splat(x: f32) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        std::arch::x86_64::_mm512_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        std::arch::x86_64::_mm512_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }
    /// bf16 is the top half of an f32: widen and shift.
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p as *const __m256i))))
    }
    #[inline(always)]
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn mul(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_sub_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_div_ps(a, b) }
    }
    #[inline(always)]
    fn add(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_add_ps(a, b) }
    }
    #[inline(always)]
    fn max(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm512_max_ps(a, b) }
    }
    #[inline(always)]
    fn sum(v: Self::V) -> f32 {
        unsafe { std::arch::x86_64::_mm512_reduce_add_ps(v) }
    }
    #[inline(always)]
    fn max_lane(v: Self::V) -> f32 {
        unsafe { std::arch::x86_64::_mm512_reduce_max_ps(v) }
    }
    #[inline(always)]
    fn exp(x: Self::V) -> Self::V {
        use exp_consts::*;
        use std::arch::x86_64::*;
        unsafe {
            let keep = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(x, _mm512_set1_ps(LOW));
            let x = _mm512_min_ps(x, _mm512_set1_ps(HIGH));
            let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm512_mul_ps(
                x,
                _mm512_set1_ps(LOG2E),
            ));
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_HI), x);
            let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(LN2_LO), r);
            let mut p = _mm512_set1_ps(P[0]);
            for c in &P[1..] {
                p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(*c));
            }
            let e = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0)));
            _mm512_maskz_mov_ps(keep, _mm512_scalef_ps(e, n))
        }
    }
    #[inline(always)]
    fn prefetch(p: *const u8) {
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
    }
}

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
#[derive(Clone, Copy)]
pub struct Avx2;

#[cfg(all(target_arch = "x86_64", target_feature = "avx2", target_feature = "fma", target_feature = "f16c"))]
impl Simd for Avx2 {
    const LANES: usize = 8;
    const REGISTERS: usize = if cfg!(target_feature = "avx512vl") { 32 } else { 16 };
    type V = std::arch::x86_64::__m256;
    #[inline(always)]
    fn zero() -> Self::V {
        unsafe { std::arch::x86_64::_mm256_setzero_ps() }
    }
    #[inline(always)]
    fn splat(x: f32) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_set1_ps(x) }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        std::arch::x86_64::_mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        std::arch::x86_64::_mm256_storeu_ps(p, v)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }
    /// bf16 is the top half of an f32: widen and shift.
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        use std::arch::x86_64::*;
        _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(p as *const __m128i))))
    }
    #[inline(always)]
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    fn mul(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    fn sub(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_sub_ps(a, b) }
    }
    #[inline(always)]
    fn div(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_div_ps(a, b) }
    }
    #[inline(always)]
    fn add(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_add_ps(a, b) }
    }
    #[inline(always)]
    fn max(a: Self::V, b: Self::V) -> Self::V {
        unsafe { std::arch::x86_64::_mm256_max_ps(a, b) }
    }
    /// Halves folded in registers (three dependent adds), not a trip through memory
    /// and seven.
    #[inline(always)]
    fn sum(v: Self::V) -> f32 {
        use std::arch::x86_64::*;
        unsafe {
            let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
            _mm_cvtss_f32(_mm_add_ss(pair, _mm_movehdup_ps(pair)))
        }
    }
    #[inline(always)]
    fn max_lane(v: Self::V) -> f32 {
        use std::arch::x86_64::*;
        unsafe {
            let quad = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let pair = _mm_max_ps(quad, _mm_movehl_ps(quad, quad));
            _mm_cvtss_f32(_mm_max_ss(pair, _mm_movehdup_ps(pair)))
        }
    }
    #[inline(always)]
    fn exp(x: Self::V) -> Self::V {
        use exp_consts::*;
        use std::arch::x86_64::*;
        unsafe {
            let keep = _mm256_cmp_ps::<_CMP_GE_OQ>(x, _mm256_set1_ps(LOW));
            let x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(LOW)), _mm256_set1_ps(HIGH));
            let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
                x,
                _mm256_set1_ps(LOG2E),
            ));
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_HI), x);
            let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(LN2_LO), r);
            let mut p = _mm256_set1_ps(P[0]);
            for c in &P[1..] {
                p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(*c));
            }
            let e = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0)));
            let two_n = _mm256_slli_epi32::<23>(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)));
            _mm256_and_ps(keep, _mm256_mul_ps(e, _mm256_castsi256_ps(two_n)))
        }
    }
    #[inline(always)]
    fn prefetch(p: *const u8) {
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p as *const i8) }
    }
}

/// Plain arrays the compiler may vectorize for whatever the target has.
#[derive(Clone, Copy)]
pub struct Portable;

impl Simd for Portable {
    const LANES: usize = 8;
    const REGISTERS: usize = 16;
    type V = [f32; 8];
    #[inline(always)]
    fn zero() -> Self::V {
        [0.0; 8]
    }
    #[inline(always)]
    fn splat(x: f32) -> Self::V {
        [x; 8]
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self::V {
        std::ptr::read_unaligned(p as *const Self::V)
    }
    #[inline(always)]
    unsafe fn store(p: *mut f32, v: Self::V) {
        std::ptr::write_unaligned(p as *mut Self::V, v)
    }
    #[inline(always)]
    unsafe fn load_f16(p: *const u16) -> Self::V {
        std::array::from_fn(|l| half::f16::from_bits(std::ptr::read_unaligned(p.add(l))).to_f32())
    }
    #[inline(always)]
    unsafe fn load_bf16(p: *const u16) -> Self::V {
        std::array::from_fn(|l| half::bf16::from_bits(std::ptr::read_unaligned(p.add(l))).to_f32())
    }
    #[inline(always)]
    fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V {
        std::array::from_fn(|l| c[l] + a[l] * b[l])
    }
    #[inline(always)]
    fn mul(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] * b[l])
    }
    #[inline(always)]
    fn sub(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] - b[l])
    }
    #[inline(always)]
    fn div(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] / b[l])
    }
    #[inline(always)]
    fn add(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l] + b[l])
    }
    #[inline(always)]
    fn max(a: Self::V, b: Self::V) -> Self::V {
        std::array::from_fn(|l| a[l].max(b[l]))
    }
    #[inline(always)]
    fn sum(v: Self::V) -> f32 {
        v.iter().sum()
    }
    #[inline(always)]
    fn max_lane(v: Self::V) -> f32 {
        v.iter().copied().fold(f32::NEG_INFINITY, f32::max)
    }
    #[inline(always)]
    fn exp(x: Self::V) -> Self::V {
        std::array::from_fn(|l| exp_scalar(x[l]))
    }
    #[inline(always)]
    fn prefetch(_: *const u8) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp_matches_std<S: Simd>() {
        let mut worst = 0f32;
        let mut x = -90.0f32;
        while x < 88.0 {
            let lanes: Vec<f32> = (0..S::LANES).map(|l| x + l as f32 * 0.0137).collect();
            let mut got = vec![0f32; S::LANES];
            unsafe { S::store(got.as_mut_ptr(), S::exp(S::load(lanes.as_ptr()))) };
            for (g, &l) in got.iter().zip(&lanes) {
                let want = if l < exp_consts::LOW { 0.0 } else { (l as f64).exp() as f32 };
                if want == 0.0 {
                    assert_eq!(*g, 0.0, "exp({l})");
                } else {
                    worst = worst.max(((g - want) / want).abs());
                }
            }
            x += 0.173;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        let mut masked = vec![0f32; S::LANES];
        unsafe { S::store(masked.as_mut_ptr(), S::exp(S::splat(f32::NEG_INFINITY))) };
        assert!(masked.iter().all(|&v| v == 0.0));
    }

    #[test]
    fn exp_is_accurate_and_zero_when_masked_on_every_path() {
        for_each_simd!(S => { exp_matches_std::<S>() });
        assert_eq!(exp_scalar(f32::NEG_INFINITY), 0.0);
        assert!((exp_scalar(1.0) - std::f32::consts::E).abs() < 1e-6);
    }

    #[test]
    fn the_active_path_is_a_compiled_one() {
        assert!(KernelPath::compiled().contains(&KernelPath::active()));
        assert_eq!(KernelPath::compiled().last(), Some(&KernelPath::Portable));
    }
}

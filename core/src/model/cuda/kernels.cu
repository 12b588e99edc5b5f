// The CUDA backend's own kernels: everything of a decoder step except the GEMMs (cuBLAS).
// Each kernel is written once as a template over the 2-byte type T of weights,
// activations fed to GEMMs and K/V (bf16 or f16), and exported twice (`_bf16`, `_f16`).
// Sums, norms, softmax and the residual stream are f32, as on the CPU backend; the CPU
// reference these kernels are held to is `reference.rs` beside this file.
//
// Paged K/V: the arena is the shared page pool of `kv_arena.rs`, in device memory. A
// block's (layer, K or V, KV head) segment lies in page
// `pages[block * pages_per_block + seg / segments_per_page]` at
// `(seg % segments_per_page) * block_size * head_dim`, with seg = (layer * 2 + is_v) *
// kv_heads + kv_head; inside a segment, keys and values are both `[slot][head_dim]`
// (one key is one coalesced read).

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
template <typename T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread
// gets the result. Safe to call again right after.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    v = warp_sum(v);
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    v = threadIdx.x < warps ? partial[threadIdx.x] : 0.f;
    if (warp == 0) v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
    __syncthreads();
    const float total = partial[0];
    __syncthreads();
    return total;
}

// One layer's view of the paged K/V (passed by value; `KvLayer` in backend.rs mirrors it).
template <typename T>
struct PagedKv {
    T* arena;
    const uint32_t* pages;  // page ids, pages_per_block per block
    int pages_per_block;
    int segments_per_page;
    long long page_elems;
    int block_size;
    int layer;
};

// Where (block, K or V, kv_head)'s segment of this layer starts in the arena, in T.
template <typename T>
__device__ __forceinline__ size_t segment_at(const PagedKv<T>& kv, int head_dim, int kv_heads, uint32_t block,
                                             int is_v, int kv_head) {
    const int seg = (kv.layer * 2 + is_v) * kv_heads + kv_head;
    const uint32_t page = kv.pages[(size_t)block * kv.pages_per_block + seg / kv.segments_per_page];
    return (size_t)page * (size_t)kv.page_elems + (size_t)(seg % kv.segments_per_page) * kv.block_size * head_dim;
}

// x[t, :] = table[ids[t], :] as f32. Grid: tokens; any block size.
template <typename T>
__device__ void embed(const T* table, const uint32_t* ids, float* x, int hidden) {
    const T* src = table + (size_t)ids[blockIdx.x] * hidden;
    float* dst = x + (size_t)blockIdx.x * hidden;
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) dst[i] = to_f32(src[i]);
}

// out[r, :] = x[src_row(r), :] / rms * weight, as T (and as f32 into out_f32 when given).
// src_rows == nullptr reads row r. Grid: rows; block: a multiple of 32.
template <typename T>
__device__ void rms_norm(const float* x, const uint32_t* src_rows, const float* weight, T* out, float* out_f32,
                         int width, float eps) {
    const int r = blockIdx.x;
    const float* row = x + (size_t)(src_rows ? src_rows[r] : r) * width;
    float sq = 0.f;
    for (int i = threadIdx.x; i < width; i += blockDim.x) sq += row[i] * row[i];
    const float inv = 1.0f / sqrtf(block_sum(sq) / (float)width + eps);
    for (int i = threadIdx.x; i < width; i += blockDim.x) {
        const float v = row[i] * inv * weight[i];
        out[(size_t)r * width + i] = from_f32<T>(v);
        if (out_f32) out_f32[(size_t)r * width + i] = v;
    }
}

// Per token and head of qkv (f32, [tokens][q heads | k heads | v heads] of head_dim):
// q and k get the per-head RMSNorm (Qwen3, when q_norm != nullptr) and the rotary
// embedding at the token's position; q stays in qkv (f32), k and v go to the token's
// slot in the paged cache. Grid: (tokens, H + 2 * KH); block: a multiple of 32; dynamic
// shared memory: head_dim floats.
template <typename T>
__device__ void qkv_prepare(float* qkv, int H, int KH, int D, const float* q_norm, const float* k_norm, float eps,
                            const float* inv_freq, const uint32_t* tok_pos, const uint32_t* tok_block,
                            const uint32_t* tok_slot, PagedKv<T> kv) {
    extern __shared__ float head[];
    const int t = blockIdx.x, hh = blockIdx.y;
    const int width = (H + 2 * KH) * D;
    float* x = qkv + (size_t)t * width + (size_t)hh * D;
    const size_t slot_at = (size_t)tok_slot[t] * D;
    if (hh >= H + KH) {  // a v head: stored as it is
        T* dst = kv.arena + segment_at(kv, D, KH, tok_block[t], 1, hh - H - KH) + slot_at;
        for (int d = threadIdx.x; d < D; d += blockDim.x) dst[d] = from_f32<T>(x[d]);
        return;
    }
    const bool is_q = hh < H;
    const float* norm = is_q ? q_norm : k_norm;
    for (int d = threadIdx.x; d < D; d += blockDim.x) head[d] = x[d];
    __syncthreads();
    float inv = 1.f;
    if (norm) {
        float sq = 0.f;
        for (int d = threadIdx.x; d < D; d += blockDim.x) sq += head[d] * head[d];
        inv = 1.0f / sqrtf(block_sum(sq) / (float)D + eps);
    }
    const int half = D / 2;
    // The angle rounds to f32 before its cosine, as on the CPU (and in HF).
    const float pos = (float)tok_pos[t];
    T* dst = is_q ? nullptr : kv.arena + segment_at(kv, D, KH, tok_block[t], 0, hh - H) + slot_at;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float x1 = head[i], x2 = head[i + half];
        if (norm) {
            x1 = x1 * inv * norm[i];
            x2 = x2 * inv * norm[i + half];
        }
        const double angle = (double)(pos * inv_freq[i]);
        const float c = (float)cos(angle), s = (float)sin(angle);
        const float a = x1 * c - x2 * s, b = x2 * c + x1 * s;
        if (is_q) {
            x[i] = a;
            x[i + half] = b;
        } else {
            dst[i] = from_f32<T>(a);
            dst[i + half] = from_f32<T>(b);
        }
    }
}

constexpr int ATTN_WARPS = 4;
constexpr int MAX_DIMS_PER_LANE = 8;  // head_dim up to 256

// Causal attention of each token over its row's keys 0..=position: one thread block per
// (token, query head), its warps taking every ATTN_WARPS-th key with an online softmax
// each, merged at the end. Output: T, [tokens][H * D] (the o_proj GEMM's input).
// Grid: (tokens, H); block: 32 * ATTN_WARPS.
template <typename T>
__device__ void attention(const float* qkv, int H, int KH, int D, float scale, const uint32_t* tok_pos,
                          const uint32_t* tok_row, const uint32_t* row_table, const uint32_t* tables, PagedKv<T> kv,
                          T* out) {
    __shared__ float warp_max_s[ATTN_WARPS], warp_den_s[ATTN_WARPS];
    __shared__ float warp_acc[ATTN_WARPS][32 * MAX_DIMS_PER_LANE];
    const int t = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = h / (H / KH);
    const int width = (H + 2 * KH) * D;
    const float* q = qkv + (size_t)t * width + (size_t)h * D;
    float qr[MAX_DIMS_PER_LANE], acc[MAX_DIMS_PER_LANE];
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++) {
        const int d = i * 32 + lane;
        qr[i] = d < D ? q[d] * scale : 0.f;
        acc[i] = 0.f;
    }
    const uint32_t* table = tables + row_table[tok_row[t]];
    const int keys = (int)tok_pos[t] + 1;
    float m = -INFINITY, den = 0.f;
    for (int j = warp; j < keys; j += ATTN_WARPS) {
        const uint32_t block = table[j / kv.block_size];
        const size_t at = (size_t)(j % kv.block_size) * D;
        const T* k = kv.arena + segment_at(kv, D, KH, block, 0, g) + at;
        const T* v = kv.arena + segment_at(kv, D, KH, block, 1, g) + at;
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; i++) {
            const int d = i * 32 + lane;
            if (d < D) s += qr[i] * to_f32(k[d]);
        }
        s = warp_sum(s);
        const float m_new = fmaxf(m, s);
        const float correction = __expf(m - m_new), p = __expf(s - m_new);
        den = den * correction + p;
#pragma unroll
        for (int i = 0; i < MAX_DIMS_PER_LANE; i++) {
            const int d = i * 32 + lane;
            if (d < D) acc[i] = acc[i] * correction + p * to_f32(v[d]);
        }
        m = m_new;
    }
    if (lane == 0) {
        warp_max_s[warp] = m;
        warp_den_s[warp] = den;
    }
#pragma unroll
    for (int i = 0; i < MAX_DIMS_PER_LANE; i++) warp_acc[warp][i * 32 + lane] = acc[i];
    __syncthreads();
    float top = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++) top = fmaxf(top, warp_max_s[w]);
    float total = 0.f;
    float weight[ATTN_WARPS];
    for (int w = 0; w < ATTN_WARPS; w++) {
        weight[w] = warp_den_s[w] > 0.f ? __expf(warp_max_s[w] - top) : 0.f;
        total += warp_den_s[w] * weight[w];
    }
    T* o = out + (size_t)t * H * D + (size_t)h * D;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float sum = 0.f;
        for (int w = 0; w < ATTN_WARPS; w++) sum += warp_acc[w][d] * weight[w];
        o[d] = from_f32<T>(sum / total);
    }
}

// act[t, i] = silu(gate[t, i]) * up[t, i] as T, from gate_up (f32, [tokens][gate | up]).
// Grid-stride over tokens * width.
template <typename T>
__device__ void silu_mul(const float* gate_up, T* act, int width, long long n) {
    for (long long at = blockIdx.x * (long long)blockDim.x + threadIdx.x; at < n;
         at += (long long)gridDim.x * blockDim.x) {
        const long long t = at / width, i = at % width;
        const float g = gate_up[t * 2 * width + i], u = gate_up[t * 2 * width + width + i];
        act[at] = from_f32<T>(g / (1.0f + __expf(-g)) * u);
    }
}

// Uniform values in [-bound, bound) from a counter-based hash of (seed, index): weights
// of any size made on the card, never copied there.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

template <typename T>
__device__ void fill_uniform(T* out, long long n, uint64_t seed, float bound) {
    for (long long at = blockIdx.x * (long long)blockDim.x + threadIdx.x; at < n;
         at += (long long)gridDim.x * blockDim.x) {
        const uint64_t bits = mix64(seed * 0x9e3779b97f4a7c15ull + (uint64_t)at);
        const float unit = (float)(bits >> 40) * (1.0f / 16777216.0f);  // [0, 1)
        out[at] = from_f32<T>((2.f * unit - 1.f) * bound);
    }
}

#define EXPORT_T(NAME, SUFFIX, T, PARAMS, ARGS) \
    extern "C" __global__ void NAME##_##SUFFIX PARAMS { NAME<T> ARGS; }

#define EXPORT_BOTH(NAME, PARAMS_BF16, PARAMS_F16, ARGS)  \
    EXPORT_T(NAME, bf16, __nv_bfloat16, PARAMS_BF16, ARGS) \
    EXPORT_T(NAME, f16, __half, PARAMS_F16, ARGS)

#define P_EMBED(T) (const T* table, const uint32_t* ids, float* x, int hidden)
EXPORT_BOTH(embed, P_EMBED(__nv_bfloat16), P_EMBED(__half), (table, ids, x, hidden))

#define P_RMS(T) (const float* x, const uint32_t* src_rows, const float* weight, T* out, float* out_f32, int width, float eps)
EXPORT_BOTH(rms_norm, P_RMS(__nv_bfloat16), P_RMS(__half), (x, src_rows, weight, out, out_f32, width, eps))

#define P_QKV(T)                                                                                             \
    (float* qkv, int H, int KH, int D, const float* q_norm, const float* k_norm, float eps,                  \
     const float* inv_freq, const uint32_t* tok_pos, const uint32_t* tok_block, const uint32_t* tok_slot, \
     PagedKv<T> kv)
EXPORT_BOTH(qkv_prepare, P_QKV(__nv_bfloat16), P_QKV(__half),
            (qkv, H, KH, D, q_norm, k_norm, eps, inv_freq, tok_pos, tok_block, tok_slot, kv))

#define P_ATTN(T)                                                                                          \
    (const float* qkv, int H, int KH, int D, float scale, const uint32_t* tok_pos, const uint32_t* tok_row, \
     const uint32_t* row_table, const uint32_t* tables, PagedKv<T> kv, T* out)
EXPORT_BOTH(attention, P_ATTN(__nv_bfloat16), P_ATTN(__half),
            (qkv, H, KH, D, scale, tok_pos, tok_row, row_table, tables, kv, out))

#define P_SILU(T) (const float* gate_up, T* act, int width, long long n)
EXPORT_BOTH(silu_mul, P_SILU(__nv_bfloat16), P_SILU(__half), (gate_up, act, width, n))

#define P_FILL(T) (T* out, long long n, uint64_t seed, float bound)
EXPORT_BOTH(fill_uniform, P_FILL(__nv_bfloat16), P_FILL(__half), (out, n, seed, bound))

// y[r, i] += bias[i] (q/k/v biases of Qwen2). Grid-stride over rows * width.
extern "C" __global__ void add_bias_f32(float* y, const float* bias, int width, long long n) {
    for (long long at = blockIdx.x * (long long)blockDim.x + threadIdx.x; at < n;
         at += (long long)gridDim.x * blockDim.x)
        y[at] += bias[at % width];
}

// What policies read of each row's logits, without the logits leaving the card: the
// argmax, the largest probability and the entropy (natural log) of softmax(logits).
// Grid: rows; block: a multiple of 32. out: rows x 3 floats (argmax as float bits).
extern "C" __global__ void logit_stats_f32(const float* logits, int vocab, float* out) {
    const float* row = logits + (size_t)blockIdx.x * vocab;
    __shared__ float best_s[32];
    __shared__ int best_i[32];
    float best = -INFINITY;
    int at = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x)
        if (row[i] > best) {
            best = row[i];
            at = i;
        }
    // Ties go to the lower index, as a scan from the start would pick.
    for (int o = 16; o > 0; o >>= 1) {
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, at, o);
        if (ob > best || (ob == best && oi < at)) {
            best = ob;
            at = oi;
        }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    if (lane == 0) {
        best_s[warp] = best;
        best_i[warp] = at;
    }
    __syncthreads();
    best = best_s[0];
    at = best_i[0];
    for (int w = 1; w < warps; w++)
        if (best_s[w] > best || (best_s[w] == best && best_i[w] < at)) {
            best = best_s[w];
            at = best_i[w];
        }
    float z = 0.f, zx = 0.f;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
        if (!(row[i] > -INFINITY)) continue;  // masked: probability zero
        const float e = __expf(row[i] - best);
        z += e;
        zx += e * (row[i] - best);
    }
    z = block_sum(z);
    zx = block_sum(zx);
    if (threadIdx.x == 0) {
        out[blockIdx.x * 3] = __int_as_float(at);
        out[blockIdx.x * 3 + 1] = 1.0f / z;
        out[blockIdx.x * 3 + 2] = logf(z) - zx / z;
    }
}

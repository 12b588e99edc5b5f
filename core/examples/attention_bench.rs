//! Our paged attention (walks block tables in place) against candle-nn's
//! `flash_attn_varlen_cpu` (wants each sequence's K/V contiguous), on the `small`
//! preset's attention shape. For candle, the gather of K/V out of the blocks that a
//! paged cache would need every step is timed separately.
//! `cargo run --release -p tokenrouter-core --example attention_bench`

use std::time::Instant;

use candle_core::{Device, Tensor};
use tokenrouter_core::model::attention::{paged_attention, AttentionSpec, PagedKvStore, TokenLayout};
use tokenrouter_core::model::presets::preset;
use tokenrouter_core::model::rope::Rope;
use tokenrouter_core::model::{KvDtype, KvGeometry};

fn best_of(runs: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}

/// `rows` sequences at `context` positions each feed `new` tokens.
fn case(rows: usize, context: usize, new: usize, kv_dtype: KvDtype) {
    let c = preset("small").unwrap();
    let (h, kvh, d) = (c.num_heads, c.num_kv_heads, c.head_dim);
    let bs = 16;
    let blocks_per_row = (context + new).div_ceil(bs);
    let geometry = KvGeometry::new(&c, bs, kv_dtype);
    let mut store = PagedKvStore::alone(geometry, rows * blocks_per_row + 1, false);
    let rope = Rope::new(&c);
    let sequences: Vec<_> = (0..rows)
        .map(|_| {
            let mut seq = store.pool().new_sequence();
            seq.reserve(context + new).unwrap();
            seq
        })
        .collect();
    store.sync();
    let row_blocks: Vec<Vec<u32>> = sequences.iter().map(|s| s.blocks().to_vec()).collect();
    let (mut row_of, mut pos, mut slot) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rows {
        for i in 0..new {
            let p = context + i;
            row_of.push(r);
            pos.push(p);
            slot.push((row_blocks[r][p / bs], p % bs));
        }
    }
    let layout = TokenLayout::new(&rope, row_of, pos, slot, row_blocks);
    let t = rows * new;
    let width = (h + 2 * kvh) * d;
    let qkv0: Vec<f32> = (0..t * width).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.01).collect();
    let spec = AttentionSpec { num_heads: h, num_kv_heads: kvh, head_dim: d, qk_norm: None };
    let ours = best_of(3, || {
        let mut qkv = qkv0.clone();
        std::hint::black_box(paged_attention(&mut store, 0, &spec, &layout, &mut qkv));
    });

    let q = Tensor::randn(0f32, 1.0, (t, h, d), &Device::Cpu).unwrap();
    let total_k = rows * (context + new);
    let k = Tensor::randn(0f32, 1.0, (total_k, kvh, d), &Device::Cpu).unwrap();
    let v = Tensor::randn(0f32, 1.0, (total_k, kvh, d), &Device::Cpu).unwrap();
    let seqlens_q = Tensor::from_vec(vec![new as u32; rows], rows, &Device::Cpu).unwrap();
    let seqlens_k = Tensor::from_vec(vec![(context + new) as u32; rows], rows, &Device::Cpu).unwrap();
    let scale = 1.0 / (d as f32).sqrt();
    let candle = best_of(3, || {
        let o = candle_nn::attention::cpu_flash::varlen::flash_attn_varlen_cpu(
            &q,
            &k,
            &v,
            None,
            &seqlens_q,
            &seqlens_k,
            new,
            context + new,
            scale,
            true,
            None,
            None,
        )
        .unwrap();
        std::hint::black_box(o);
    });
    // What candle would add per layer: copying every row's K and V out of the blocks.
    let cache = vec![0f32; total_k * kvh * d];
    let gather = best_of(3, || {
        let mut kk = Vec::with_capacity(cache.len());
        for chunk in cache.chunks(bs * kvh * d) {
            kk.extend_from_slice(chunk);
        }
        std::hint::black_box(Tensor::from_vec(kk, (total_k, kvh, d), &Device::Cpu).unwrap());
    }) * 2.0;
    println!("{rows:>4} rows × {new:>4} new at context {context:>5}, KV {kv_dtype:?}: ours {ours:>8.2} ms   candle varlen {candle:>8.2} ms + gather {gather:>6.2} ms");
}

fn main() {
    tokenrouter_core::model::threads::configure(None);
    for kv_dtype in [KvDtype::F32, KvDtype::F16] {
        case(1, 0, 512, kv_dtype);
        case(1, 0, 2048, kv_dtype);
        case(8, 512, 4, kv_dtype);
        case(32, 128, 1, kv_dtype);
        case(32, 1024, 1, kv_dtype);
        case(32, 4096, 1, kv_dtype);
    }
}

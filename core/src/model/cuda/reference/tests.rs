//! The reference against the CPU backend's own steps.

use half::{bf16, f16};

use super::*;
use crate::model::attention::{paged_attention, AttentionSpec, PagedKvStore, TokenLayout};
use crate::model::kv_arena::{KvDtype, KvGeometry};
use crate::model::ops;
use crate::model::presets::preset;
use crate::model::rope::{rotate, Rope};
use crate::rng::SplitMix64;

fn noise(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = SplitMix64(seed);
    (0..n).map(|_| rng.open_unit() as f32 * 2.0 - 1.0).collect()
}

#[test]
fn rms_norm_is_the_cpu_backends_and_gathers_rows() {
    let (width, rows) = (96, 5);
    let x = noise(width * rows, 1);
    let weight = noise(width, 2);
    let cpu = ops::rms_norm(&x, &weight, 1e-6);
    let (stored, exact) = rms_norm::<bf16>(&x, None, &weight, 1e-6);
    assert_eq!(exact, cpu);
    assert!(stored.iter().zip(&cpu).all(|(s, c)| *s == bf16::from_f32(*c)));
    let (_, picked) = rms_norm::<f16>(&x, Some(&[4, 1]), &weight, 1e-6);
    assert_eq!(picked[..width], cpu[4 * width..5 * width]);
    assert_eq!(picked[width..], cpu[width..2 * width]);
}

#[test]
fn rotation_is_the_cpu_backends_at_every_position() {
    let config = preset("small").unwrap();
    let rope = Rope::new(&config);
    let half = rope.half_dim();
    let (mut cos, mut sin) = (vec![0.0; half], vec![0.0; half]);
    let inv_freq = rope.inv_freq_f32();
    for position in [0, 1, 17, 4095, 32_000] {
        let mut reference = noise(config.head_dim, position as u64);
        let mut cpu = reference.clone();
        rope.cos_sin(position, &mut cos, &mut sin);
        rotate(&mut cpu, &cos, &sin);
        prepare_head(&mut reference, None, &inv_freq, position);
        assert_eq!(reference, cpu, "position {position}");
    }
}

#[test]
fn silu_mul_is_the_cpu_backends_rounded_once() {
    let width = 200;
    let gate_up: Vec<f32> = noise(2 * width * 3, 3).iter().map(|v| v * 8.0).collect();
    let cpu = ops::silu_mul(&gate_up, width);
    for (r, c) in silu_mul::<f16>(&gate_up, width).iter().zip(&cpu) {
        assert!((r.to_f32() - c).abs() <= c.abs() * 1e-3 + 1e-6, "{} vs {c}", r.to_f32());
    }
}

#[test]
fn logit_stats_agree_with_the_policies_entropy() {
    let mut logits: Vec<f32> = noise(5000, 4).iter().map(|v| v * 6.0).collect();
    logits[77] = 9.0;
    logits[10] = f32::NEG_INFINITY;
    let (argmax, top_p, entropy) = logit_stats(&logits);
    assert_eq!(argmax, 77);
    let normalized = crate::policy::logits::normalized_entropy(&logits);
    assert!((entropy as f64 / (logits.len() as f64).ln() - normalized).abs() < 1e-5);
    let z: f64 = logits.iter().map(|&v| ((v - 9.0) as f64).exp()).sum();
    assert!((top_p as f64 - 1.0 / z).abs() < 1e-6);
    // Ties go to the first.
    assert_eq!(logit_stats(&[1.0, 3.0, 3.0]).0, 1);
}

/// The CPU backend's paged attention with f16 K/V over a prefill row and a row decoding
/// at 40, against the reference fed with the rotated q and the stored (rounded) K/V.
#[test]
fn attention_is_the_cpu_backends_over_paged_kv() {
    let config = preset("tiny").unwrap();
    let (heads, kv_heads, hd) = (config.num_heads, config.num_kv_heads, config.head_dim);
    let geometry = KvGeometry::new(&config, 16, KvDtype::F16);
    let mut store = PagedKvStore::alone(geometry, 16, false);
    let rope = Rope::new(&config);
    let mut prefill = store.pool().new_sequence();
    let mut decode = store.pool().new_sequence();
    prefill.reserve(21).unwrap();
    decode.reserve(41).unwrap();
    store.sync();
    let width = (heads + 2 * kv_heads) * hd;
    // Row 1 first writes positions 0..40 in an earlier step, then decodes position 40.
    let earlier: Vec<usize> = (0..40).collect();
    let history = noise(earlier.len() * width, 5);
    let mut step = |rows: &[(usize, usize)], qkv: &mut Vec<f32>| {
        let seqs = [&prefill, &decode];
        let row: Vec<usize> = rows.iter().map(|r| r.0).collect();
        let position: Vec<usize> = rows.iter().map(|r| r.1).collect();
        let slot = rows.iter().map(|&(r, p)| seqs[r].slot(p)).collect();
        let blocks = seqs.iter().map(|s| s.blocks().to_vec()).collect();
        let layout = TokenLayout::new(&rope, row, position, slot, blocks);
        let spec = AttentionSpec { num_heads: heads, num_kv_heads: kv_heads, head_dim: hd, qk_norm: None };
        paged_attention(&mut store, 0, &spec, &layout, qkv)
    };
    let mut first = history.clone();
    step(&earlier.iter().map(|&p| (1, p)).collect::<Vec<_>>(), &mut first);
    let rows: Vec<(usize, usize)> = (0..21).map(|p| (0, p)).chain([(1, 40)]).collect();
    let fresh = noise(rows.len() * width, 6);
    let mut now = fresh.clone();
    let cpu = step(&rows, &mut now);

    // The reference's inputs: q and k rotated at their positions, K/V rounded to f16.
    let inv_freq = rope.inv_freq_f32();
    let prepared = |token: &[f32], position: usize| -> Vec<f32> {
        let mut t = token.to_vec();
        for head in t[..(heads + kv_heads) * hd].chunks_exact_mut(hd) {
            prepare_head(head, None, &inv_freq, position);
        }
        t
    };
    let row_tokens = |r: usize| -> Vec<Vec<f32>> {
        if r == 0 {
            (0..21).map(|p| prepared(&fresh[p * width..(p + 1) * width], p)).collect()
        } else {
            let mut all: Vec<Vec<f32>> = (0..40).map(|p| prepared(&history[p * width..(p + 1) * width], p)).collect();
            all.push(prepared(&fresh[21 * width..22 * width], 40));
            all
        }
    };
    let kv_of = |tokens: &[Vec<f32>], offset: usize, g: usize| -> Vec<Vec<f16>> {
        tokens
            .iter()
            .map(|t| t[offset + g * hd..offset + (g + 1) * hd].iter().map(|&v| f16::from_f32(v)).collect())
            .collect()
    };
    let scale = 1.0 / (hd as f32).sqrt();
    for (t, &(r, position)) in rows.iter().enumerate() {
        let tokens = row_tokens(r);
        let me = &tokens[position];
        for h in 0..heads {
            let g = h / (heads / kv_heads);
            let keys = kv_of(&tokens[..=position], heads * hd, g);
            let values = kv_of(&tokens[..=position], (heads + kv_heads) * hd, g);
            let key_refs: Vec<&[f16]> = keys.iter().map(Vec::as_slice).collect();
            let value_refs: Vec<&[f16]> = values.iter().map(Vec::as_slice).collect();
            let expected = attention(&me[h * hd..(h + 1) * hd], &key_refs, &value_refs, scale);
            let got = &cpu[(t * heads + h) * hd..(t * heads + h + 1) * hd];
            for (e, c) in expected.iter().zip(got) {
                assert!((e - c).abs() < 1e-4, "token {t} head {h}: {e} vs {c}");
            }
        }
    }
}

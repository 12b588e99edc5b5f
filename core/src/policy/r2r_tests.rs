//! Tests of the R2R router (a separate file keeps r2r.rs short).

use std::time::Instant;

use super::*;
use crate::policy::delegate::tests::{route_all, RowData};
use crate::policy::{policy_uniform, BinaryAdapter, Decision, ModelPair, Policy};

const HIDDEN: usize = 32;
const VOCAB: usize = 300;

fn small_shape() -> R2rShape {
    R2rShape { width: 64, blocks: 2, expansion: 4, top_k: 100 }
}

fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    (0..n).map(|i| (policy_uniform(seed, i, 1) as f32 - 0.5) * scale).collect()
}

fn embedding(vocab: usize, d: usize) -> Tensor {
    Tensor::from_vec(values(vocab * d, 99, 2.0), (vocab, d), &Device::Cpu).unwrap()
}

fn router(seed: u64, shape: &R2rShape) -> R2rRouter {
    R2rRouter::new(&mut TensorSource::random(seed), Some(embedding(VOCAB, HIDDEN)), shape).unwrap()
}

fn row(i: u64) -> RowData {
    let mut data = RowData::new(0, values(VOCAB, 1000 + i, 12.0));
    data.hidden = Some(values(HIDDEN, 2000 + i, 4.0));
    data.sampled = (i * 37 % VOCAB as u64) as u32;
    data
}

fn scores_of(delegate: &R2rDelegate, data: &mut [RowData]) -> Vec<Option<f32>> {
    let rows: Vec<RouteRow<'_>> = data.iter_mut().map(RowData::row).collect();
    delegate.row_scores(&rows)
}

#[test]
fn batched_scores_equal_single_row_scores() {
    let delegate = R2rDelegate::new(router(1, &small_shape()), 0.5);
    let mut batch: Vec<RowData> = (0..6).map(row).collect();
    let together = scores_of(&delegate, &mut batch);
    for (i, score) in together.iter().enumerate() {
        let alone = scores_of(&delegate, &mut [row(i as u64)])[0];
        assert!((alone.unwrap() - score.unwrap()).abs() < 1e-5, "row {i}: {alone:?} vs {score:?}");
    }
    let spread = together.iter().flatten().fold((1f32, 0f32), |(lo, hi), &s| (lo.min(s), hi.max(s)));
    assert!(spread.0 < spread.1, "the router must depend on its input: {together:?}");
}

#[test]
fn each_input_changes_the_score() {
    let delegate = R2rDelegate::new(router(1, &small_shape()), 0.5);
    let base = scores_of(&delegate, &mut [row(0)])[0].unwrap();
    let mut other_token = row(0);
    other_token.sampled += 1;
    let mut other_hidden = row(0);
    other_hidden.hidden = row(1).hidden;
    let mut other_logits = row(0);
    other_logits.logits = row(1).logits;
    for mut changed in [other_token, other_hidden, other_logits] {
        assert_ne!(scores_of(&delegate, std::slice::from_mut(&mut changed))[0].unwrap(), base);
    }
}

#[test]
fn threshold_zero_always_delegates_and_above_one_never() {
    let always = BinaryAdapter::new(R2rDelegate::new(router(2, &small_shape()), 0.0), ModelPair::default());
    let never = BinaryAdapter::new(R2rDelegate::new(router(2, &small_shape()), 1.01), ModelPair::default());
    let mut rows: Vec<RowData> = (0..4).map(row).collect();
    assert!(route_all(&always, &mut rows).iter().all(|d| *d == Decision::Move { to: 1, commit: false }));
    assert!(route_all(&never, &mut rows).iter().all(|d| *d == Decision::Stay));
    assert!(always.needs_hidden(0) && !always.needs_hidden(1));
}

#[test]
fn rows_the_router_cannot_judge_stay() {
    let always = BinaryAdapter::new(R2rDelegate::new(router(2, &small_shape()), 0.0), ModelPair::default());
    let mut no_hidden = row(0);
    no_hidden.hidden = None;
    let mut outside_table = row(1);
    outside_table.sampled = VOCAB as u32;
    let decisions = route_all(&always, &mut [no_hidden, outside_table, row(2)]);
    assert_eq!(decisions, vec![Decision::Stay, Decision::Stay, Decision::Move { to: 1, commit: false }]);
}

#[test]
fn published_shape_runs_with_random_weights() {
    let r = router(3, &R2rShape::default());
    assert_eq!((r.blocks.len(), r.top_k(), r.hidden_size(), r.vocab_size()), (6, 100, HIDDEN, VOCAB));
    let scores = scores_of(&R2rDelegate::new(r, 0.5), &mut [row(0), row(1)]);
    assert!(scores.iter().all(|s| s.is_some_and(|s| s.is_finite() && s > 0.0 && s < 1.0)), "{scores:?}");
}

#[test]
fn router_file_round_trips_with_its_own_embedding_table() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r2r.safetensors");
    let mut random = TensorSource::random(4);
    random.tensor("token_embeddings.weight", &[VOCAB, HIDDEN], Init::Unit).unwrap();
    let original = R2rRouter::new(&mut random, None, &small_shape()).unwrap();
    random.save(&path).unwrap();

    let loaded = R2rRouter::new(&mut TensorSource::open(&path).unwrap(), None, &R2rShape::default()).unwrap();
    assert_eq!((loaded.blocks.len(), loaded.vocab_size()), (2, VOCAB), "sizes come from the file");
    let (a, b) = (R2rDelegate::new(original, 0.5), R2rDelegate::new(loaded, 0.5));
    let mut rows: Vec<RowData> = (0..3).map(row).collect();
    assert_eq!(scores_of(&a, &mut rows), scores_of(&b, &mut rows));
}

#[test]
fn input_norms_in_the_file_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r2r.safetensors");
    let mut random = TensorSource::random(5);
    let plain = R2rRouter::new(&mut random, Some(embedding(VOCAB, HIDDEN)), &small_shape()).unwrap();
    random.layer_norm("layer_norm_hidden_states", HIDDEN).unwrap();
    random.layer_norm("layer_norm_token", HIDDEN).unwrap();
    random.save(&path).unwrap();
    let normed =
        R2rRouter::new(&mut TensorSource::open(&path).unwrap(), Some(embedding(VOCAB, HIDDEN)), &small_shape())
            .unwrap();
    assert!(normed.input_norms.is_some() && plain.input_norms.is_none());
    let mut rows = vec![row(0)];
    let (p, n) =
        (scores_of(&R2rDelegate::new(plain, 0.5), &mut rows), scores_of(&R2rDelegate::new(normed, 0.5), &mut rows));
    assert_ne!(p, n);
}

#[test]
fn mismatched_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("r2r.safetensors");
    let mut random = TensorSource::random(6);
    R2rRouter::new(&mut random, Some(embedding(VOCAB, HIDDEN)), &small_shape()).unwrap();
    random.save(&path).unwrap();
    let wider_model = embedding(VOCAB, HIDDEN * 2);
    let error = R2rRouter::new(&mut TensorSource::open(&path).unwrap(), Some(wider_model), &small_shape());
    assert!(error.is_err_and(|e| e.to_string().contains("logits_projection.weight")));
    let no_table = R2rRouter::new(&mut TensorSource::open(&path).unwrap(), None, &small_shape());
    assert!(no_table.is_err_and(|e| e.to_string().contains("token_embeddings.weight")));
}

/// `cargo test --release -p tokenrouter-core --lib policy::r2r -- --ignored --nocapture`
#[test]
#[ignore]
fn bench_r2r_32_rows_hidden_512() {
    const ROWS: usize = 32;
    const D: usize = 512;
    const V: usize = 151_936;
    let table = Tensor::from_vec(values(V * D, 5, 0.1), (V, D), &Device::Cpu).unwrap();
    let delegate =
        R2rDelegate::new(R2rRouter::new(&mut TensorSource::random(7), Some(table), &R2rShape::default()).unwrap(), 0.5);
    let mut data: Vec<RowData> = (0..ROWS as u64)
        .map(|i| {
            let mut d = RowData::new(0, values(V, i, 20.0));
            d.hidden = Some(values(D, 100 + i, 4.0));
            d.sampled = i as u32 * 1000;
            d
        })
        .collect();
    let inputs: Vec<(Vec<f32>, Vec<f32>)> =
        data.iter().map(|d| (d.hidden.clone().unwrap(), top_k_desc(&d.logits, 100))).collect();
    let mlp_inputs: Vec<R2rInput<'_>> = inputs
        .iter()
        .enumerate()
        .map(|(i, (h, top))| R2rInput { hidden: h, token: i as u32, top_logits: top.clone() })
        .collect();
    let time = |label: &str, f: &mut dyn FnMut()| {
        f();
        let reps = 20;
        let start = Instant::now();
        for _ in 0..reps {
            f();
        }
        println!("{label}: {:.2} ms", start.elapsed().as_secs_f64() * 1e3 / reps as f64);
    };
    time("r2r MLP forward, 32 rows, d=512", &mut || {
        delegate.router().scores(&mlp_inputs).unwrap();
    });
    time("r2r top-100 of 151,936 logits x 32 rows", &mut || {
        for d in &data {
            std::hint::black_box(top_k_desc(&d.logits, 100));
        }
    });
    time("r2r full route (top-k + gather + MLP), 32 rows", &mut || {
        let rows: Vec<RouteRow<'_>> = data.iter_mut().map(RowData::row).collect();
        std::hint::black_box(delegate.row_scores(&rows));
    });
}

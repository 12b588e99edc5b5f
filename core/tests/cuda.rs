//! The CUDA backend on a card: every kernel against the CPU reference, a model's logits
//! against the f32 CPU run (batched and row by row), two models sharing one device K/V
//! arena, and generation that survives a rewind. Each test runs only where a CUDA driver
//! and a card are present, and says by name when it skips (CI has no GPU).
#![cfg(feature = "cuda")]

use tempfile::TempDir;
use tokenrouter_core::model::cuda::check::{check_kernels, check_model, Check};
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::kv_arena::KvGeometry;
use tokenrouter_core::model::presets::preset;
use tokenrouter_core::model::{
    load_backend, share_device_kv, Backend, DeviceSpec, KvDtype, LoadOptions, RowInput, WeightDtype,
};

/// Whether a card is here; says which test skips when none is.
fn card(test: &str) -> bool {
    let present = std::process::Command::new("nvidia-smi").arg("-L").output().is_ok_and(|o| o.status.success());
    if !present {
        eprintln!("{test}: skipped, no CUDA card on this machine");
    }
    present
}

fn small_model() -> TempDir {
    let dir = TempDir::new().unwrap();
    write_random_model(&preset("small").unwrap(), &InitOptions { seed: 5, std: 0.02 }, dir.path()).unwrap();
    dir
}

/// Prints every check's figures, then requires each to pass.
fn all_pass(checks: Vec<Check>) {
    for c in &checks {
        eprintln!("{}: {:.3e} (tolerance {:.1e})", c.name, c.max_error, c.tolerance);
    }
    assert!(checks.iter().all(|c| c.passed), "{checks:#?}");
}

fn on_card(dtype: WeightDtype) -> LoadOptions {
    LoadOptions { dtype, device: DeviceSpec::Cuda(0), kv_budget_bytes: 256 << 20, ..LoadOptions::default() }
}

#[test]
fn every_kernel_matches_the_cpu_reference() {
    if !card("every_kernel_matches_the_cpu_reference") {
        return;
    }
    all_pass(check_kernels(0).unwrap());
}

#[test]
fn logits_match_the_f32_cpu_run_batched_and_alone() {
    if !card("logits_match_the_f32_cpu_run_batched_and_alone") {
        return;
    }
    let dir = small_model();
    for dtype in [WeightDtype::Bf16, WeightDtype::F16] {
        all_pass(check_model(dir.path(), 0, dtype).unwrap());
    }
}

/// Two models on one card draw pages from one device arena; each one's output is what it
/// gives alone, and a rewind (an extend from an earlier position) recomputes the same.
#[test]
fn colocated_models_share_one_arena_and_rewinds_recompute() {
    if !card("colocated_models_share_one_arena_and_rewinds_recompute") {
        return;
    }
    let (a, b) = (small_model(), TempDir::new().unwrap());
    write_random_model(&preset("tiny").unwrap(), &InitOptions { seed: 6, std: 0.02 }, b.path()).unwrap();
    let geometry = |dir: &TempDir| {
        let config = tokenrouter_core::model::read_model_config(dir.path()).unwrap();
        KvGeometry::new(&config, 16, KvDtype::Bf16)
    };
    let shared = share_device_kv(&[(geometry(&a), true), (geometry(&b), true)], 128 << 20);
    let load = |dir: &TempDir, kv| {
        load_backend(dir.path(), &LoadOptions { shared_kv: Some(kv), ..on_card(WeightDtype::Bf16) }).unwrap()
    };
    let mut large = load(&a, shared[0].clone());
    let mut small = load(&b, shared[1].clone());
    let mut alone = load_backend(a.path(), &on_card(WeightDtype::Bf16)).unwrap();
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7919) % 151_000).collect();
    let run = |m: &mut Box<dyn Backend>, tokens: &[u32]| {
        let mut kv = m.new_sequence();
        let first = m.forward(&mut [RowInput { kv: &mut kv, tokens, start: 0 }], false).unwrap().logits;
        // Rewind to 30 and feed the same tail again: the same K/V, the same logits.
        let again = m.forward(&mut [RowInput { kv: &mut kv, tokens: &tokens[30..], start: 30 }], false).unwrap().logits;
        (first, again)
    };
    let (shared_first, shared_again) = run(&mut large, &prompt);
    let _ = run(&mut small, &prompt);
    let (alone_first, _) = run(&mut alone, &prompt);
    let worst = |x: &[f32], y: &[f32]| x.iter().zip(y).map(|(p, q)| (p - q).abs()).fold(0.0f32, f32::max);
    assert_eq!(worst(&shared_first, &alone_first), 0.0, "the arena a model draws from changes nothing");
    assert!(worst(&shared_first, &shared_again) < 1e-3, "a rewind recomputes the same logits");
}

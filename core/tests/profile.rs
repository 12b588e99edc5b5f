//! `tokenrouter profile`'s measurement: every decode point carries the machine's limit
//! sampled beside its own steps, and its fractions follow from the numbers it reports.

use tempfile::TempDir;
use tokenrouter_core::model::init::{write_random_model, InitOptions};
use tokenrouter_core::model::machine::MachineLimits;
use tokenrouter_core::model::presets::qwen3_shaped;
use tokenrouter_core::model::profile::{self, Profile, ProfileSpec};
use tokenrouter_core::model::{CandleBackend, LoadOptions};

fn tiny_profile() -> Profile {
    let dir = TempDir::new().unwrap();
    let config = qwen3_shaped(32, 2, 2, 1, 64, 50);
    write_random_model(&config, &InitOptions::default(), dir.path()).unwrap();
    let mut backend = CandleBackend::load(dir.path(), &LoadOptions::default()).unwrap();
    // Limits as if measured at the start of a run; the probes' own samples differ.
    let machine =
        MachineLimits { read_gbps: 10.0, triad_gbps: 10.0, gemm_gflops: 100.0, candle_gemm_gflops: 90.0, threads: 1 };
    let spec = ProfileSpec {
        batch_sizes: vec![1, 4],
        contexts: vec![16],
        prefill_lengths: vec![8],
        extends: vec![],
        steps: 3,
        max_kv_tokens: 4096,
    };
    let weight_bytes = config.num_parameters() * 4;
    profile::run(&mut backend, "tiny", weight_bytes, machine, &spec, |_| {}).unwrap()
}

#[test]
fn each_decode_point_carries_the_limit_sampled_beside_its_steps() {
    let p = tiny_profile();
    assert_eq!(p.decode.iter().map(|d| d.batch).collect::<Vec<_>>(), vec![1, 4]);
    for d in &p.decode {
        let limit = d.limit_beside_steps.unwrap_or_else(|| panic!("batch {}: no limit sampled", d.batch));
        assert!(limit.is_finite() && limit > 0.0, "batch {}: {limit}", d.batch);
        // The same point against either limit: the fractions scale inversely with it.
        let at_start = p.fraction_of_limit(d);
        let beside = p.fraction_of_limit_beside_steps(d).unwrap();
        let start_limit = if d.batch == 1 { p.machine.read_gbps } else { p.machine.gemm_gflops };
        assert!((beside * limit - at_start * start_limit).abs() <= 1e-9 * at_start * start_limit, "batch {}", d.batch);
    }
    // Batch 1 is held against bandwidth: tokens/s × bytes per step ÷ read rate.
    let one = &p.decode[0];
    let expected = one.tokens_per_sec * p.weight_bytes as f64 / (p.machine.read_gbps * 1e9);
    assert!((p.fraction_of_limit(one) - expected).abs() <= 1e-12 * expected);
    assert_eq!(p.prefill.len(), 1);
}

#[test]
fn profiles_written_before_the_sampled_limit_still_load() {
    let mut json = serde_json::to_value(tiny_profile()).unwrap();
    for point in json["decode"].as_array_mut().unwrap() {
        point.as_object_mut().unwrap().remove("limit_beside_steps");
    }
    let p: Profile = serde_json::from_value(json).unwrap();
    assert!(p.decode.iter().all(|d| d.limit_beside_steps.is_none() && p.fraction_of_limit_beside_steps(d).is_none()));
}

//! `tokenrouter check-device`: proves a card works. Each kernel against the CPU
//! reference, a model's logits against the f32 CPU backend (batched and row by row), and
//! the step speed of a real model's shape against the card's copy bandwidth and GEMM
//! rate measured beside it. Exits non-zero when a check fails.

use std::path::PathBuf;

use clap::Args;
use tokenrouter_core::model::DeviceSpec;

#[derive(Args, Debug)]
pub struct CheckDeviceArgs {
    /// The card: cuda:N.
    #[arg(long, default_value = "cuda:0")]
    device: DeviceSpec,
    /// An HF folder whose logits are compared with the CPU's (default: a random
    /// `small` preset written to a temporary folder).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Real shapes timed with random weights made on the card (qwen3-0.6b, qwen3-8b);
    /// none to skip the speed part.
    #[arg(long, value_delimiter = ',', default_value = "qwen3-8b")]
    speed: Vec<String>,
    /// Prompt length of the timed prefill.
    #[arg(long, default_value_t = 8192)]
    prefill: usize,
    /// Also write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[cfg(not(feature = "cuda"))]
pub fn run(args: CheckDeviceArgs) -> anyhow::Result<()> {
    anyhow::bail!("this build has no CUDA backend for {}: build with `--features cuda` (docs/backends.md)", args.device)
}

#[cfg(feature = "cuda")]
pub fn run(args: CheckDeviceArgs) -> anyhow::Result<()> {
    use anyhow::Context;
    use tokenrouter_core::model::cuda::check::{check_kernels, check_model, measure_speed};
    use tokenrouter_core::model::init::{write_random_model, InitOptions};
    use tokenrouter_core::model::presets::{preset, real_shape};
    use tokenrouter_core::model::WeightDtype;

    let DeviceSpec::Cuda(ordinal) = args.device else {
        anyhow::bail!("check-device checks a CUDA card: --device cuda:N")
    };
    let mut checks = check_kernels(ordinal)?;
    let written = std::env::temp_dir().join(format!("tokenrouter-check-device-{}", std::process::id()));
    let model = match &args.model {
        Some(path) => path.clone(),
        None => {
            let config = preset("small").context("the small preset")?;
            write_random_model(&config, &InitOptions { seed: 3, std: 0.02 }, &written)?;
            written.clone()
        }
    };
    let compared: Vec<_> =
        [WeightDtype::Bf16, WeightDtype::F16].into_iter().map(|dtype| check_model(&model, ordinal, dtype)).collect();
    let _ = std::fs::remove_dir_all(&written);
    for result in compared {
        checks.extend(result?);
    }
    println!("{:<64} {:>12} {:>10}  result", "check", "max error", "tolerance");
    for c in &checks {
        println!(
            "{:<64} {:>12.3e} {:>10.1e}  {}",
            c.name,
            c.max_error,
            c.tolerance,
            if c.passed { "ok" } else { "FAILED" }
        );
    }
    let mut speeds = Vec::new();
    for name in args.speed.iter().filter(|n| n.as_str() != "none") {
        let config = real_shape(name).with_context(|| format!("no real shape {name:?}: qwen3-0.6b or qwen3-8b"))?;
        let s = measure_speed(config, ordinal, args.prefill)?;
        println!(
            "{name} on {}: decode b=1 {:.2} ms = {:.0}% of copy bandwidth ({:.2} TB/s, {:.1} GB of weights); \
             b=64 {:.0} tok/s; prefill {} tokens {:.1} ms = {:.0}% of cuBLAS bf16 ({:.0} TFLOP/s)",
            s.device,
            s.decode_b1_s * 1e3,
            s.decode_b1_fraction * 100.0,
            s.copy_bytes_per_s / 1e12,
            s.weight_bytes as f64 / 1e9,
            s.decode_b64_tokens_per_s,
            s.prefill_tokens,
            s.prefill_s * 1e3,
            s.prefill_fraction * 100.0,
            s.gemm_flops_per_s / 1e12
        );
        speeds.push((name.clone(), s));
    }
    if let Some(out) = &args.out {
        let json = serde_json::json!({ "checks": checks, "speed": speeds });
        std::fs::write(out, serde_json::to_vec_pretty(&json)?).with_context(|| format!("writing {}", out.display()))?;
    }
    let failed = checks.iter().filter(|c| !c.passed).count();
    anyhow::ensure!(failed == 0, "{failed} of {} checks failed", checks.len());
    Ok(())
}

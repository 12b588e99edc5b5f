use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokenrouter_core::model::profile::{self, Profile, ProfileSpec};
use tokenrouter_core::model::{load_backend, machine, BackendKind, DeviceSpec, KvDtype, LoadOptions, WeightDtype};

#[derive(Args, Debug)]
pub struct ProfileArgs {
    #[arg(long)]
    model: PathBuf,
    /// f32 or f16; q8_0 or q4_k with `--backend llamacpp` (an HF folder is written to
    /// GGUF in this type; a .gguf file keeps its own).
    #[arg(long, default_value = "f32")]
    dtype: WeightDtype,
    /// candle, or llamacpp (builds with the `llamacpp` feature).
    #[arg(long, default_value = "candle")]
    backend: BackendKind,
    /// Batch sizes to time decode at.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16,32,64")]
    batch: Vec<usize>,
    /// Contexts (tokens already in KV) to time decode at.
    #[arg(long, value_delimiter = ',', default_value = "128,512,1024,2048,4096")]
    context: Vec<usize>,
    /// Prompt lengths to time prefill at (batch 1).
    #[arg(long, value_delimiter = ',', default_value = "128,512,2048")]
    prefill: Vec<usize>,
    /// Also time extends (8 or 32 rows feeding 4 or 16 tokens at context 512).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    extends: bool,
    /// Timed steps per point.
    #[arg(long, default_value_t = 3)]
    steps: usize,
    /// How the candle backend stores K/V: f32 or f16.
    #[arg(long, default_value = "f32")]
    kv_dtype: KvDtype,
    /// KV budget for the profile, MiB.
    #[arg(long, default_value_t = 4096)]
    kv_mib: usize,
    /// cpu, or cuda:N (a build with `--features cuda`; --dtype bf16 or f16).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// Where to write the JSON profile.
    #[arg(long, default_value = "profile.json")]
    out: PathBuf,
}

pub fn run(args: ProfileArgs, _threads: usize) -> anyhow::Result<()> {
    let options = LoadOptions {
        dtype: args.dtype,
        kv_budget_bytes: args.kv_mib << 20,
        kv_dtype: args.kv_dtype,
        backend: args.backend,
        device: args.device,
        ..LoadOptions::default()
    };
    let mut backend = load_backend(&args.model, &options)?;
    let weight_bytes = (backend.config().num_parameters() as f64 * args.dtype.bytes_per_weight()) as usize;
    eprintln!("measuring the machine (bandwidth, GEMM)...");
    let limits = machine::measure();
    let mut spec = ProfileSpec {
        batch_sizes: args.batch.clone(),
        contexts: args.context.clone(),
        prefill_lengths: args.prefill.clone(),
        steps: args.steps,
        max_kv_tokens: usize::MAX,
        ..ProfileSpec::default()
    };
    if !args.extends {
        spec.extends.clear();
    }
    let name = args.model.display().to_string();
    let bar = indicatif::ProgressBar::new_spinner();
    bar.enable_steady_tick(std::time::Duration::from_millis(200));
    let result =
        profile::run(backend.as_mut(), &name, weight_bytes, limits, &spec, |what| bar.set_message(what.to_string()))?;
    bar.finish_and_clear();
    print_table(&result, args.dtype);
    std::fs::write(&args.out, serde_json::to_string_pretty(&result)?)
        .with_context(|| format!("writing {}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

fn print_table(p: &Profile, dtype: WeightDtype) {
    println!(
        "machine: {:.1} GB/s read, {:.1} GB/s triad, {:.0} GFLOP/s f32 GEMM (the faster of ours and candle's {:.0}; 2048³), {} threads",
        p.machine.read_gbps,
        p.machine.triad_gbps,
        p.machine.gemm_gflops,
        p.machine.candle_gemm_gflops,
        p.machine.threads
    );
    println!(
        "model: {:.1}M parameters, {:.0} MB of {dtype:?} weights; limits: {:.1} tok/s at batch 1 (bandwidth), {:.0} tok/s at large batch (GEMM)",
        p.parameters as f64 / 1e6,
        p.weight_bytes as f64 / 1e6,
        p.bandwidth_bound_tokens_per_sec(),
        p.gemm_bound_tokens_per_sec()
    );
    println!("\ndecode: step ms (tokens/s, % of limit)");
    let mut contexts: Vec<usize> = p.decode.iter().map(|d| d.context).collect();
    contexts.dedup();
    let mut batches: Vec<usize> = p.decode.iter().map(|d| d.batch).collect();
    batches.sort_unstable();
    batches.dedup();
    print!("{:>8}", "batch");
    for c in &contexts {
        print!("{:>32}", format!("ctx {c}"));
    }
    println!();
    for b in &batches {
        print!("{b:>8}");
        for c in &contexts {
            let cell = match p.decode_at(*b, *c) {
                Some(d) => {
                    let beside =
                        p.fraction_of_limit_beside_steps(d).map_or(String::new(), |f| format!("/{:.0}", 100.0 * f));
                    format!(
                        "{:.1} ({:.0}, {:.0}{beside}%)",
                        d.step_ms,
                        d.tokens_per_sec,
                        100.0 * p.fraction_of_limit(d)
                    )
                }
                None => "-".into(),
            };
            print!("{cell:>32}");
        }
        println!();
    }
    println!(
        "(batch 1 is compared with the read-bandwidth limit, larger batches with the GEMM limit: as measured at the start / as sampled beside the point's own steps)"
    );
    for (title, points) in [("prefill", &p.prefill), ("extend (context 512)", &p.extend)] {
        println!("\n{title}:");
        for x in points {
            println!(
                "  batch {:>3} × {:>5} tokens: {:>9.1} ms, {:>8.0} tok/s ({:.0}% of GEMM limit)",
                x.batch,
                x.tokens_per_row,
                x.step_ms,
                x.tokens_per_sec,
                100.0 * x.tokens_per_sec / p.gemm_bound_prefill_tokens_per_sec(x.tokens_per_row)
            );
        }
    }
}

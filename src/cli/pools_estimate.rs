//! `tokenrouter pools estimate`: the estimator's accuracy against a real tokenizer.
//! Traces have sizes but no text, so each request gets a window of real text of its
//! category (from a corpus file) about as long as its prompt; the tokenizer counts the
//! window's tokens, and the estimator, fed back in arrival order as the server would
//! be, is scored on its estimate before each feedback.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tokenrouter_core::pool::{parse_azure_csv, BudgetEstimator, Category, ErrorTally, EstimatorConfig};
use tokenrouter_core::rng::SplitMix64;

#[derive(Args, Debug)]
pub struct EstimateArgs {
    /// A folder with tokenizer.json (or the file itself).
    #[arg(long)]
    tokenizer: PathBuf,
    /// Text of a category, `category=FILE` (prose, code, cjk); repeat per category.
    #[arg(long = "text", value_parser = parse_corpus, required = true)]
    texts: Vec<(Category, PathBuf)>,
    /// Request sizes from an Azure trace CSV (default: 2,000 sizes uniform in 50..4000).
    #[arg(long)]
    trace: Option<PathBuf>,
    /// Requests per category at most.
    #[arg(long, default_value_t = 2000)]
    limit: usize,
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

fn parse_corpus(s: &str) -> Result<(Category, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or("expected category=FILE")?;
    let category = Category::parse(name).ok_or_else(|| format!("unknown category `{name}`"))?;
    Ok((category, PathBuf::from(path)))
}

pub fn run(args: EstimateArgs) -> anyhow::Result<()> {
    let file = match args.tokenizer.is_dir() {
        true => args.tokenizer.join("tokenizer.json"),
        false => args.tokenizer.clone(),
    };
    let tokenizer = tokenizers::Tokenizer::from_file(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
    let sizes = request_sizes(args.trace.as_deref(), args.limit, args.seed)?;
    println!(
        "{} requests per category, sizes from {}",
        sizes.len(),
        args.trace.as_ref().map_or("a uniform draw".into(), |p| p.display().to_string())
    );
    println!(
        "{:<6} {:>8} {:>12} {:>8} {:>11} {:>12}",
        "class", "requests", "bytes/token", "MAPE", "MAPE prior", "c* too short"
    );
    for (category, path) in &args.texts {
        let corpus = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        anyhow::ensure!(corpus.len() > 1000, "{}: too little text", path.display());
        let s = score(&tokenizer, *category, &corpus, &sizes, args.seed)?;
        let n = s.learning.count(*category);
        println!(
            "{:<6} {:>8} {:>12.3} {:>7.1}% {:>10.1}% {:>11.1}%",
            category.as_str(),
            n,
            s.estimator.calibration(*category).ratio,
            s.learning.mape(*category).unwrap_or(0.0) * 100.0,
            s.prior.mape(*category).unwrap_or(0.0) * 100.0,
            100.0 * s.under as f64 / n.max(1) as f64
        );
    }
    Ok(())
}

fn request_sizes(trace: Option<&std::path::Path>, limit: usize, seed: u64) -> anyhow::Result<Vec<usize>> {
    let Some(path) = trace else {
        let mut rng = SplitMix64(seed);
        return Ok((0..limit).map(|_| 50 + rng.below(3950) as usize).collect());
    };
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rows = parse_azure_csv(&text).with_context(|| format!("in {}", path.display()))?;
    Ok(rows.iter().take(limit).map(|r| r.prompt_tokens.max(1) as usize).collect())
}

/// How the estimator did on one category.
struct Score {
    /// Errors of the learning estimator, each before its feedback.
    learning: ErrorTally,
    /// Errors of the prior alone (no feedback).
    prior: ErrorTally,
    /// Requests whose conservative estimate (from c*) was below the truth: those the
    /// margin did not cover.
    under: usize,
    estimator: BudgetEstimator,
}

fn score(
    tokenizer: &tokenizers::Tokenizer,
    category: Category,
    corpus: &str,
    sizes: &[usize],
    seed: u64,
) -> anyhow::Result<Score> {
    let config = EstimatorConfig::default();
    let prior_ratio = config.prior_bytes_per_token.get(category);
    let fixed = BudgetEstimator::new(config.clone());
    let mut learning = BudgetEstimator::new(config);
    let (mut tally, mut prior, mut under) = (ErrorTally::default(), ErrorTally::default(), 0);
    let mut rng = SplitMix64(seed ^ category.index() as u64);
    for &tokens in sizes {
        let window = text_window(corpus, (tokens as f64 * prior_ratio) as usize, &mut rng);
        let actual = tokenizer.encode(window, false).map_err(|e| anyhow::anyhow!("tokenizing: {e}"))?.len();
        if let Some(f) = learning.observe(category, window.len(), actual) {
            tally.add(&f);
            under += usize::from(f.conservative_estimate < f.actual);
        }
        if let Some(f) = fixed.clone().observe(category, window.len(), actual) {
            prior.add(&f);
        }
    }
    Ok(Score { learning: tally, prior, under, estimator: learning })
}

/// About `bytes` bytes of the corpus from a random place, cut at character boundaries.
fn text_window<'a>(corpus: &'a str, bytes: usize, rng: &mut SplitMix64) -> &'a str {
    let bytes = bytes.clamp(1, corpus.len());
    let mut start = rng.below((corpus.len() - bytes + 1) as u64) as usize;
    while !corpus.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (start + bytes).min(corpus.len());
    while !corpus.is_char_boundary(end) {
        end += 1;
    }
    &corpus[start..end]
}

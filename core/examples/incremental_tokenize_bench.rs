//! Incremental vs full tokenization of long agent transcripts (DESIGN.md §7): code-like
//! transcripts of 100K, 1M and 3M characters, each continued by ~1.4K-character appends (one in
//! five also rewrites the last line, as chat templates replace their generation prompt).
//! Reports time per continuation (p50/p99) through `SessionTokenizer` (common-prefix scan,
//! splice, ids copied out) against full tokenization with the `tokenizers` crate, the speed-up,
//! and divergences (continuations checked against full tokenization).
//!
//! cargo run --release -p tokenrouter-core --example incremental_tokenize_bench [-- qwen3|llama3 [continuations]]

use std::time::Instant;

use tokenrouter_core::assets::tokenizer_dir;
use tokenrouter_core::rng::SplitMix64;
use tokenrouter_core::stats::Samples;
use tokenrouter_core::tokenize::incremental::{SessionConfig, SessionTokenizer};
use tokenrouter_core::tokenize::TextTokenizer;

const SIZES: [usize; 3] = [100_000, 1_000_000, 3_000_000];
const APPEND_CHARS: usize = 1_400;

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "qwen3".into());
    let continuations: usize = args.next().map_or(200, |n| n.parse().expect("continuations: a number"));
    let Some(dir) = tokenizer_dir(&name) else { std::process::exit(2) };
    let tokenizer = TextTokenizer::from_folder(&dir).expect("tokenizer loads");
    let mut code = CodeText::new(1);
    let corpus = code.take(SIZES[2] + continuations * 2 * APPEND_CHARS);
    println!("tokenizer {name}; {continuations} continuations per size, ~{APPEND_CHARS}-char appends");
    println!("| transcript | continuation p50 | p99 | full p50 | speed-up (p50) | checked | divergent | spliced |");
    println!("|---|---|---|---|---|---|---|---|");
    for size in SIZES {
        bench_size(&tokenizer, &corpus, size, continuations);
    }
}

fn bench_size(tokenizer: &TextTokenizer, corpus: &str, size: usize, continuations: usize) {
    let config = SessionConfig { verify_fraction: 0.0, max_bytes: 1 << 30, ..SessionConfig::default() };
    let sessions = SessionTokenizer::new(tokenizer.clone(), config);
    let mut end = size;
    let mut text = corpus[..end].to_string();
    sessions.encode(Some("bench"), &text, false).expect("first encode");
    let check_every = (size / 100_000).max(1);
    let (mut times, mut full_times) = (Samples::new(), Samples::new());
    let (mut checked, mut divergent, mut spliced) = (0, 0, 0);
    for i in 0..continuations {
        if i % 5 == 4 {
            // A tail edit: the last line is rewritten.
            text.truncate(text.trim_end_matches('\n').rfind('\n').map_or(text.len(), |p| p + 1));
        }
        let next_end = end + APPEND_CHARS;
        text.push_str(&corpus[end..next_end]);
        end = next_end;
        let start = Instant::now();
        let encoded = sessions.encode(Some("bench"), &text, false).expect("encode");
        times.push(start.elapsed().as_secs_f64());
        spliced += encoded.path.splice_cut().is_some() as usize;
        if i % check_every == 0 {
            let start = Instant::now();
            let full = tokenizer.encode(&text, false).expect("full encode");
            full_times.push(start.elapsed().as_secs_f64());
            checked += 1;
            divergent += (full != encoded.ids) as usize;
        }
    }
    let (p50, p99, full50) = (times.median(), times.quantile(0.99), full_times.median());
    println!(
        "| {} chars | {} | {} | {} | {:.0}× | {checked} | {divergent} | {spliced}/{continuations} |",
        size,
        ms(p50),
        ms(p99),
        ms(full50),
        full50.zip(p50).map_or(f64::NAN, |(full, inc)| full / inc)
    );
}

/// Seconds as milliseconds; "—" for no samples (no continuations asked for).
fn ms(seconds: Option<f64>) -> String {
    seconds.map_or("—".to_string(), |s| format!("{:.3} ms", s * 1e3))
}

/// Rust-like source text: functions, nested blocks, identifiers, numbers, strings and comments.
struct CodeText {
    rng: SplitMix64,
}

const WORDS: &[&str] = &[
    "request", "tokens", "session", "buffer", "index", "offset", "value", "result", "config", "window", "state",
    "cache", "batch", "model", "error", "count", "limit", "prefix", "text", "ids",
];
const TYPES: &[&str] = &["usize", "u32", "String", "Vec<u32>", "&str", "Option<usize>", "Result<(), Error>"];

impl CodeText {
    fn new(seed: u64) -> Self {
        CodeText { rng: SplitMix64(seed) }
    }

    fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.rng.below(from.len() as u64) as usize]
    }

    fn ident(&mut self) -> String {
        match self.rng.below(3) {
            0 => self.pick(WORDS).to_string(),
            1 => format!("{}_{}", self.pick(WORDS), self.pick(WORDS)),
            _ => format!("{}{}", self.pick(WORDS), self.rng.below(100)),
        }
    }

    fn take(&mut self, chars: usize) -> String {
        let mut out = String::with_capacity(chars + 1024);
        while out.len() < chars {
            self.function(&mut out);
        }
        out
    }

    fn function(&mut self, out: &mut String) {
        let (name, arg, ty) = (self.ident(), self.ident(), self.pick(TYPES));
        out.push_str(&format!(
            "/// Computes the {} of a {}.\nfn {name}({arg}: {ty}) -> {ty} {{\n",
            self.pick(WORDS),
            self.pick(WORDS)
        ));
        for _ in 0..2 + self.rng.below(8) {
            self.statement(out, 1);
        }
        out.push_str("}\n\n");
    }

    fn statement(&mut self, out: &mut String, depth: usize) {
        let indent = "    ".repeat(depth);
        let (a, b) = (self.ident(), self.ident());
        let line = match self.rng.below(6) {
            0 => format!("{indent}let {a} = {b}.len() + {};\n", self.rng.below(4096)),
            1 => format!("{indent}{a}.push_str(\"{} {}\\n\");\n", self.pick(WORDS), self.pick(WORDS)),
            2 => format!("{indent}// {} the {} before the {}.\n", self.pick(WORDS), self.pick(WORDS), self.pick(WORDS)),
            3 if depth < 4 => {
                out.push_str(&format!("{indent}if {a} > {b} {{\n"));
                for _ in 0..1 + self.rng.below(3) {
                    self.statement(out, depth + 1);
                }
                format!("{indent}}}\n")
            }
            4 => format!("{indent}let {a}: {} = {b}?;\n", self.pick(TYPES)),
            _ => format!("{indent}{a} += {b}[{}] * {};\n", self.rng.below(64), self.rng.below(10)),
        };
        out.push_str(&line);
    }
}

//! Times decode steps of one model at one batch size, nothing else (for perf).
//! `cargo run --release -p tokenrouter-core --example decode_bench -- DIR BATCH STEPS [f32|f16|bf16]`
//! With `DECODE_HUGE_PAIRED=small,huge` (or `huge,small`): the model loaded twice, on 4 KiB and on 2 MiB pages,
//! stepped alternately, and the median of the paired step-time ratios.
//! With `DECODE_PREFILL=N` (alone or with the above): prompts of N tokens, each in a new sequence, instead of
//! decode steps; STEPS prompts, their median time.

use std::time::Instant;

use tokenrouter_core::model::{Backend, CandleBackend, KvSeq, LoadOptions, RowInput, WeightDtype};

fn main() {
    tokenrouter_core::model::threads::configure(None);
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(&args[1]);
    let batch: usize = args[2].parse().unwrap();
    let steps: usize = args[3].parse().unwrap();
    if std::env::var_os("DECODE_HUGE_PAIRED").is_some() {
        return huge_against_small_pages(&dir, batch, steps);
    }
    if let Ok(rounds) = std::env::var("DECODE_BANDWIDTH") {
        return against_read_bandwidth(&dir, steps, rounds.parse().unwrap());
    }
    let mut model = Model::load(&dir, batch);
    if let Some(n) = prefill_tokens() {
        let times: Vec<f64> = (0..steps).map(|step| model.timed(step, Some(n))).collect();
        let median = tokenrouter_core::model::machine::median(&times);
        println!("prefill {n}: {:.2} ms/prompt, {:.0} tok/s", median * 1e3, n as f64 / median);
        return;
    }
    let t = Instant::now();
    for step in 0..steps {
        model.step(step);
    }
    let per = t.elapsed().as_secs_f64() / steps as f64;
    println!("batch {batch}: {:.2} ms/step, {:.0} tok/s", per * 1e3, batch as f64 / per);
}

/// `DECODE_BANDWIDTH=ROUNDS`: batch-1 steps against the read bandwidth measured right
/// before them (best of 6 passes), round by round (the host's bandwidth drifts by tens
/// of percent): each round's fastest step, and its median step, as fractions of it.
fn against_read_bandwidth(dir: &std::path::Path, steps: usize, rounds: usize) {
    use tokenrouter_core::model::machine::median;
    let mut model = Model::load(dir, 1);
    let bytes = model.streamed_bytes() as f64;
    let (mut fastest, mut middle) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let read = tokenrouter_core::model::machine::measure_read_bandwidth();
        let times: Vec<f64> = (0..steps).map(|s| model.timed_step(round * steps + s)).collect();
        let best = times.iter().cloned().fold(f64::MAX, f64::min);
        let mid = median(&times);
        println!(
            "round {round}: read {read:.1} GB/s; steps {:.2} ms fastest ({:.0}%), {:.2} ms median ({:.0}%)",
            best * 1e3,
            100.0 * bytes / best / 1e9 / read,
            mid * 1e3,
            100.0 * bytes / mid / 1e9 / read
        );
        fastest.push(bytes / best / 1e9 / read);
        middle.push(bytes / mid / 1e9 / read);
    }
    println!(
        "median over rounds: fastest step {:.0}%, median step {:.0}% of read bandwidth ({} MB a step)",
        100.0 * median(&fastest),
        100.0 * median(&middle),
        bytes as usize / 1_000_000
    );
}

fn huge_against_small_pages(dir: &std::path::Path, batch: usize, steps: usize) {
    // Loaded in the order DECODE_HUGE_PAIRED names ("small,huge" or "huge,small"): the
    // model loaded second has measured up to 5% faster with both on small pages.
    let order = std::env::var("DECODE_HUGE_PAIRED").unwrap_or_default();
    let prefill = prefill_tokens();
    let load = |huge: bool| {
        std::env::set_var("TOKENROUTER_HUGE_PAGES", if huge { "on" } else { "off" });
        Model::load(dir, batch)
    };
    let (mut small, mut huge) = if order.starts_with("huge") {
        let huge = load(true);
        (load(false), huge)
    } else {
        let small = load(false);
        (small, load(true))
    };
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for step in 0..steps {
        a.push(small.timed(step, prefill));
        b.push(huge.timed(step, prefill));
    }
    let med = tokenrouter_core::model::machine::median;
    let ratios: Vec<f64> = a.iter().zip(&b).map(|(s, h)| h / s).collect();
    println!(
        "batch {batch}, prefill {prefill:?}: 4K median {:.2} ms, 2M median {:.2} ms, paired 2M/4K median {:.3}",
        med(&a) * 1e3,
        med(&b) * 1e3,
        med(&ratios)
    );
}

/// `DECODE_PREFILL=N`: time prompts of N tokens (a new sequence each) instead of steps.
fn prefill_tokens() -> Option<usize> {
    std::env::var("DECODE_PREFILL").ok().map(|n| n.parse().unwrap())
}

struct Model {
    backend: CandleBackend,
    dtype: WeightDtype,
    seqs: Vec<KvSeq>,
}

impl Model {
    /// The model with `batch` sequences of 128 prompt tokens each.
    fn load(dir: &std::path::Path, batch: usize) -> Model {
        let dtype = std::env::args().nth(4).map_or(WeightDtype::F32, |d| d.parse().unwrap());
        // 1 GiB, and room for a long prompt at up to 128 KiB of K/V per token (medium f32 takes 64).
        let kv_budget_bytes = (1 << 30) + prefill_tokens().unwrap_or(0) * (128 << 10);
        let options = LoadOptions { kv_budget_bytes, dtype, ..LoadOptions::default() };
        let mut backend = CandleBackend::load(dir, &options).unwrap();
        let mut seqs: Vec<_> = (0..batch).map(|_| backend.new_sequence()).collect();
        let prompts: Vec<Vec<u32>> = (0..batch).map(|r| (0..128).map(|i| (r * 131 + i * 7) as u32).collect()).collect();
        let mut rows: Vec<RowInput> =
            seqs.iter_mut().zip(&prompts).map(|(kv, t)| RowInput { kv, tokens: t, start: 0 }).collect();
        backend.forward(&mut rows, false).unwrap();
        Model { backend, dtype, seqs }
    }

    fn step(&mut self, step: usize) {
        let tok = [(step * 13) as u32];
        let mut rows: Vec<RowInput> = self
            .seqs
            .iter_mut()
            .map(|kv| {
                let start = kv.len();
                RowInput { kv, tokens: &tok, start }
            })
            .collect();
        self.backend.forward(&mut rows, false).unwrap();
    }

    /// Bytes of the weights, counted as `tokenrouter profile` counts them.
    fn streamed_bytes(&self) -> usize {
        (self.backend.config().num_parameters() as f64 * self.dtype.bytes_per_weight()) as usize
    }

    /// A decode step, or with `prefill`, one prompt of that many tokens in a new sequence.
    fn timed(&mut self, step: usize, prefill: Option<usize>) -> f64 {
        let Some(n) = prefill else { return self.timed_step(step) };
        let mut kv = self.backend.new_sequence();
        let prompt: Vec<u32> = (0..n).map(|i| (step * 31 + i * 7) as u32 % 1000).collect();
        let t = Instant::now();
        self.backend.forward(&mut [RowInput { kv: &mut kv, tokens: &prompt, start: 0 }], false).unwrap();
        t.elapsed().as_secs_f64()
    }

    fn timed_step(&mut self, step: usize) -> f64 {
        let t = Instant::now();
        self.step(step);
        t.elapsed().as_secs_f64()
    }
}

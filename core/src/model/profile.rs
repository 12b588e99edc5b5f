//! Step-latency profile of one model: decode at batch sizes × contexts, prefill and
//! extend throughput, each against the machine's limits. The planner reads the JSON.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::backend::{Backend, RowInput};
use super::error::Result;
use super::kv::KvSeq;
use super::machine::{median, GemmProbe, MachineLimits, ReadProbe};

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProfileSpec {
    pub batch_sizes: Vec<usize>,
    pub contexts: Vec<usize>,
    pub prefill_lengths: Vec<usize>,
    /// (batch, tokens per row) for extend steps at context 512.
    pub extends: Vec<(usize, usize)>,
    /// Timed steps per point (after one warm-up).
    pub steps: usize,
    /// Points whose KV would exceed this many tokens are skipped.
    pub max_kv_tokens: usize,
}

impl Default for ProfileSpec {
    fn default() -> Self {
        ProfileSpec {
            batch_sizes: vec![1, 2, 4, 8, 16, 32, 64],
            contexts: vec![128, 512, 1024, 2048, 4096],
            prefill_lengths: vec![128, 512, 2048],
            extends: vec![(8, 4), (8, 16), (32, 4)],
            steps: 3,
            max_kv_tokens: 64 * 1024,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DecodePoint {
    pub batch: usize,
    pub context: usize,
    /// Median step latency, milliseconds.
    pub step_ms: f64,
    pub tokens_per_sec: f64,
    /// The limit this point is held against, sampled after each of its timed steps (the
    /// median): read GB/s at batch 1, our GEMM's GFLOP/s above. The host's speed drifts
    /// within minutes, so the fraction of this one compares the step and the limit under
    /// the same load; [`Profile::machine`] was measured once, at the start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_beside_steps: Option<f64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PrefillPoint {
    pub batch: usize,
    pub tokens_per_row: usize,
    pub context: usize,
    pub step_ms: f64,
    pub tokens_per_sec: f64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Profile {
    pub model: String,
    pub parameters: usize,
    pub embedding_parameters: usize,
    pub lm_head_parameters: usize,
    pub tied: bool,
    pub weight_bytes: usize,
    pub machine: MachineLimits,
    pub decode: Vec<DecodePoint>,
    pub prefill: Vec<PrefillPoint>,
    pub extend: Vec<PrefillPoint>,
}

impl Profile {
    /// Batch-1 decode limit: every weight byte read once per step.
    pub fn bandwidth_bound_tokens_per_sec(&self) -> f64 {
        self.tokens_per_sec_at_read(self.machine.read_gbps)
    }

    /// Large-batch decode limit: two FLOPs per matmul weight per token (every decoded
    /// token goes through the LM head).
    pub fn gemm_bound_tokens_per_sec(&self) -> f64 {
        self.tokens_per_sec_at_gemm(self.machine.gemm_gflops)
    }

    fn tokens_per_sec_at_read(&self, gbps: f64) -> f64 {
        gbps * 1e9 / self.weight_bytes as f64
    }

    fn tokens_per_sec_at_gemm(&self, gflops: f64) -> f64 {
        gflops * 1e9 / (2.0 * self.matmul_parameters_per_token(true) as f64)
    }

    /// A decode point's tokens/s as a fraction of its limit (bandwidth at batch 1, GEMM
    /// above) as measured at the start of the run.
    pub fn fraction_of_limit(&self, point: &DecodePoint) -> f64 {
        let limit = if point.batch == 1 { self.machine.read_gbps } else { self.machine.gemm_gflops };
        self.fraction_at(point, limit)
    }

    /// The same fraction against the limit sampled beside the point's own steps.
    pub fn fraction_of_limit_beside_steps(&self, point: &DecodePoint) -> Option<f64> {
        point.limit_beside_steps.map(|limit| self.fraction_at(point, limit))
    }

    fn fraction_at(&self, point: &DecodePoint, limit: f64) -> f64 {
        let tokens_per_sec =
            if point.batch == 1 { self.tokens_per_sec_at_read(limit) } else { self.tokens_per_sec_at_gemm(limit) };
        point.tokens_per_sec / tokens_per_sec
    }

    /// Prefill limit: the LM head runs once per row, not per token.
    pub fn gemm_bound_prefill_tokens_per_sec(&self, tokens_per_row: usize) -> f64 {
        let per_token =
            self.matmul_parameters_per_token(false) as f64 + self.lm_head_parameters as f64 / tokens_per_row as f64;
        self.machine.gemm_gflops * 1e9 / (2.0 * per_token)
    }

    /// Weights a token multiplies through: all layers, plus the LM head if asked.
    /// (The embedding lookup reads one row, not a matmul.)
    fn matmul_parameters_per_token(&self, with_head: bool) -> usize {
        let layers = self.parameters - self.embedding_parameters - if self.tied { 0 } else { self.lm_head_parameters };
        layers + if with_head { self.lm_head_parameters } else { 0 }
    }

    pub fn decode_at(&self, batch: usize, context: usize) -> Option<&DecodePoint> {
        self.decode.iter().find(|p| p.batch == batch && p.context == context)
    }
}

/// Prompts at least this long are timed once, without a warm-up.
const LONG_PREFILL: usize = 4096;

pub fn run(
    backend: &mut dyn Backend,
    name: &str,
    weight_bytes: usize,
    machine: MachineLimits,
    spec: &ProfileSpec,
    mut progress: impl FnMut(&str),
) -> Result<Profile> {
    let mut decode = Vec::new();
    let mut probes = LimitProbes::default();
    for &context in &spec.contexts {
        for &batch in &spec.batch_sizes {
            if batch * (context + spec.steps + 1) > spec.max_kv_tokens.min(token_room(backend)) {
                continue;
            }
            progress(&format!("decode batch {batch} context {context}"));
            let mut limits = Vec::new();
            let ms = time_steps(backend, batch, context, 1, 1, spec.steps, || limits.push(probes.sample(batch)))?;
            decode.push(DecodePoint {
                batch,
                context,
                step_ms: ms,
                tokens_per_sec: batch as f64 * 1e3 / ms,
                limit_beside_steps: (!limits.is_empty()).then(|| median(&limits)),
            });
        }
    }
    drop(probes);
    let mut prefill = Vec::new();
    for &len in &spec.prefill_lengths {
        if len > backend.config().max_position_embeddings || len + 1 > token_room(backend) {
            continue;
        }
        progress(&format!("prefill {len}"));
        // A long prompt is its own warm-up, and repeating one costs minutes on a CPU.
        let (warmups, timed) = if len >= LONG_PREFILL { (0, 1) } else { (1, spec.steps.min(2)) };
        let ms = time_steps(backend, 1, 0, len, warmups, timed, || {})?;
        prefill.push(PrefillPoint {
            batch: 1,
            tokens_per_row: len,
            context: 0,
            step_ms: ms,
            tokens_per_sec: len as f64 * 1e3 / ms,
        });
    }
    let mut extend = Vec::new();
    for &(batch, k) in &spec.extends {
        if batch * (512 + k * (spec.steps + 1)) > token_room(backend) {
            continue;
        }
        progress(&format!("extend batch {batch} × {k} tokens"));
        let ms = time_steps(backend, batch, 512, k, 1, spec.steps, || {})?;
        extend.push(PrefillPoint {
            batch,
            tokens_per_row: k,
            context: 512,
            step_ms: ms,
            tokens_per_sec: (batch * k) as f64 * 1e3 / ms,
        });
    }
    Ok(Profile {
        model: name.to_string(),
        parameters: backend.config().num_parameters(),
        embedding_parameters: backend.config().vocab_size * backend.config().hidden_size,
        lm_head_parameters: backend.config().vocab_size * backend.config().hidden_size,
        tied: backend.config().tie_word_embeddings,
        weight_bytes,
        machine,
        decode,
        prefill,
        extend,
    })
}

/// Longest step the start-up profile times before it stops (see [`step_cost_points`]).
pub const STARTUP_PROFILE_MAX_STEP: Duration = Duration::from_millis(250);

/// The (tokens fed, milliseconds) points of a saved profile: decodes at its shortest
/// context (b rows feed b tokens), extends and prefills.
pub fn profile_points(profile: &Profile) -> Vec<(usize, f64)> {
    let shortest = profile.decode.iter().map(|p| p.context).min();
    let decode = profile.decode.iter().filter(|p| Some(p.context) == shortest).map(|p| (p.batch, p.step_ms));
    let longer = profile.extend.iter().chain(&profile.prefill).map(|p| (p.batch * p.tokens_per_row, p.step_ms));
    decode.chain(longer).collect()
}

/// Shapes of the start-up profile, (rows, tokens per row), cheapest first: decodes of 1
/// to 64 rows, then wider steps such as long extends and prompt chunks, a factor of four
/// apart (the planner interpolates between them).
const STEP_COST_SHAPES: &[(usize, usize)] = &[(1, 1), (4, 1), (16, 1), (64, 1), (16, 16), (64, 16)];

/// A short profile for the planner: (tokens fed, milliseconds) of one step at each of
/// [`STEP_COST_SHAPES`] that fits `max_rows`, `max_tokens` and the free K/V, the median of
/// two timed steps after a warm-up. It stops after the first shape slower than `max_step`
/// (the planner extends the last segment beyond it): a start-up should cost seconds.
pub fn step_cost_points(
    backend: &mut dyn Backend,
    max_rows: usize,
    max_tokens: usize,
    max_step: Duration,
) -> Result<Vec<(usize, f64)>> {
    let mut points = Vec::new();
    for &(rows, per_row) in STEP_COST_SHAPES {
        let tokens = rows * per_row;
        if rows > max_rows.max(1) || tokens > max_tokens.max(1) || tokens + rows * 16 > token_room(backend) {
            continue;
        }
        let ms = time_steps(backend, rows, 0, per_row, 1, 2, || {})?;
        points.push((tokens, ms));
        if ms > max_step.as_secs_f64() * 1e3 {
            break;
        }
    }
    Ok(points)
}

fn token_room(backend: &dyn Backend) -> usize {
    let cap = backend.kv_capacity();
    cap.free_blocks * cap.block_size
}

/// Brings a sequence to `context` positions: declared computed where the backend allows
/// it, else prefilled for real.
fn fill_context(backend: &mut dyn Backend, seq: &mut KvSeq, context: usize, token: u32) -> Result<()> {
    if context == 0 {
        return Ok(());
    }
    if backend.accepts_uncomputed_context() {
        seq.reserve(context)?;
        seq.set_computed(context);
        return Ok(());
    }
    let prompt = vec![token; context];
    backend.forward(&mut [RowInput { kv: seq, tokens: &prompt, start: 0 }], false)?;
    Ok(())
}

/// The machine's limits, sampled between decode steps; each probe's buffers are
/// allocated on its first use.
#[derive(Default)]
struct LimitProbes {
    read: Option<ReadProbe>,
    gemm: Option<GemmProbe>,
}

impl LimitProbes {
    /// The limit of a step of `batch` rows: read GB/s at one row, GEMM GFLOP/s above.
    fn sample(&mut self, batch: usize) -> f64 {
        if batch == 1 {
            self.read.get_or_insert_with(ReadProbe::new).sample_gbps()
        } else {
            self.gemm.get_or_insert_with(GemmProbe::new).sample_gflops()
        }
    }
}

/// Median latency of `timed` steps (after `warmups` untimed ones) feeding
/// `tokens_per_row` tokens to `batch` rows that sit at `context` positions; `after_step`
/// runs, untimed, after each timed step. The context's K/V is left as whatever the
/// blocks hold: attention costs the same whatever the values, and prefilling long
/// contexts would dominate.
fn time_steps(
    backend: &mut dyn Backend,
    batch: usize,
    context: usize,
    tokens_per_row: usize,
    warmups: usize,
    timed: usize,
    mut after_step: impl FnMut(),
) -> Result<f64> {
    let vocab = backend.config().vocab_size as u32;
    let mut seqs: Vec<KvSeq> = (0..batch).map(|_| backend.new_sequence()).collect();
    let tokens: Vec<Vec<u32>> =
        (0..batch).map(|r| (0..tokens_per_row).map(|i| ((r * 7919 + i * 104_729) as u32) % vocab).collect()).collect();
    for (seq, row) in seqs.iter_mut().zip(&tokens) {
        fill_context(backend, seq, context, row.first().copied().unwrap_or(0))?;
    }
    let mut times = Vec::with_capacity(timed);
    for step in 0..warmups + timed.max(1) {
        let mut rows: Vec<RowInput> = seqs
            .iter_mut()
            .zip(&tokens)
            .map(|(kv, t)| {
                let start = kv.len();
                RowInput { kv, tokens: t, start }
            })
            .collect();
        let t = Instant::now();
        backend.forward(&mut rows, false)?;
        if step >= warmups {
            times.push(t.elapsed().as_secs_f64() * 1e3);
            after_step();
        }
        if context == 0 {
            // Prefill: start again from an empty sequence each time.
            seqs.iter_mut().for_each(|s| s.clear());
        }
    }
    Ok(median(&times))
}

//! Token sampler: penalties → temperature → top-k → top-p → min-p → draw.
//!
//! Randomness is counter-based: the uniform draw for output position `t` is a pure
//! function of `(seed, t)`, so a step yields the same token whatever batch it ran in,
//! whichever model produced the logits, and on retry. The draw is an inverse CDF over
//! the kept tokens ordered by probability (descending, ties by lower id), so models
//! that agree on the head of the distribution tend to pick the same token for one `u`.

use crate::rng::{mix64, unit_f64};

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;

/// Below this temperature sampling is greedy argmax.
const GREEDY_TEMPERATURE: f32 = 1e-5;
/// Most alternatives a request may ask for (OpenAI's limit).
pub const MAX_LOGPROBS: usize = 20;
/// Returned when no token has any probability (all logits -inf/NaN): the model gave no
/// usable distribution, and a valid id keeps the batch running instead of panicking.
/// Callers can detect the case by a chosen logprob of -inf.
pub const FALLBACK_TOKEN: u32 = 0;
/// Weights exp(z - max) are bucketed by key: the float exponent plus the top 3 mantissa
/// bits, so 8 keys per octave.
const SUB_OCTAVE_SHIFT: u32 = 20;
/// Keys one histogram resolves (12 octaves, down to weight 2.4e-4); lighter tokens share
/// a tail bucket, refined by another pass only if the cutoff or draw lands in it. That is
/// rare for peaked distributions, whose bulk of the vocab lies there.
const WINDOW: usize = 96;
/// Key of weight 0, the largest there is.
const MAX_KEY: u32 = ONE_BITS >> SUB_OCTAVE_SHIFT;
const ONE_BITS: u32 = 0x3f80_0000;
/// Independent accumulators per reduction, so the loops vectorize.
const LANES: usize = 16;

#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1.0 = off.
    pub top_p: f32,
    /// 0 = off. Keeps tokens with p >= min_p * p_max.
    pub min_p: f32,
    /// 1.0 = off. Tokens seen in prompt or output: logit > 0 → /= p, else *= p.
    pub repetition_penalty: f32,
    /// Output tokens only: logit -= presence * [count > 0].
    pub presence_penalty: f32,
    /// Output tokens only: logit -= frequency * count.
    pub frequency_penalty: f32,
    pub seed: u64,
    /// Some(n): logprob of the chosen token plus the top-n alternatives.
    pub logprobs: Option<usize>,
    /// Added to a token's logit before anything else (OpenAI's `logit_bias`, -100..=100).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
            logprobs: None,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        Self { temperature: 0.0, ..Self::default() }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature < GREEDY_TEMPERATURE
    }

    pub fn validate(&self) -> Result<(), SamplingError> {
        let floats = [
            ("temperature", self.temperature),
            ("top_p", self.top_p),
            ("min_p", self.min_p),
            ("repetition_penalty", self.repetition_penalty),
            ("presence_penalty", self.presence_penalty),
            ("frequency_penalty", self.frequency_penalty),
        ];
        if let Some(&(field, value)) = floats.iter().find(|(_, v)| !v.is_finite()) {
            return Err(SamplingError::NotFinite { field, value });
        }
        if self.temperature < 0.0 {
            return Err(SamplingError::NegativeTemperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopPOutOfRange(self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(SamplingError::MinPOutOfRange(self.min_p));
        }
        if self.repetition_penalty <= 0.0 {
            return Err(SamplingError::RepetitionPenaltyNotPositive(self.repetition_penalty));
        }
        for (field, value) in
            [("presence_penalty", self.presence_penalty), ("frequency_penalty", self.frequency_penalty)]
        {
            if !(-2.0..=2.0).contains(&value) {
                return Err(SamplingError::PenaltyOutOfRange { field, value });
            }
        }
        if let Some(&(token, value)) = self.logit_bias.iter().find(|(_, v)| !(-100.0..=100.0).contains(v)) {
            return Err(SamplingError::LogitBiasOutOfRange { token, value });
        }
        match self.logprobs {
            Some(n) if n > MAX_LOGPROBS => Err(SamplingError::TooManyLogprobs(n)),
            _ => Ok(()),
        }
    }

    fn has_penalties(&self) -> bool {
        self.repetition_penalty != 1.0 || self.presence_penalty != 0.0 || self.frequency_penalty != 0.0
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum SamplingError {
    NotFinite { field: &'static str, value: f32 },
    NegativeTemperature(f32),
    TopPOutOfRange(f32),
    MinPOutOfRange(f32),
    RepetitionPenaltyNotPositive(f32),
    PenaltyOutOfRange { field: &'static str, value: f32 },
    TooManyLogprobs(usize),
    LogitBiasOutOfRange { token: u32, value: f32 },
}

impl fmt::Display for SamplingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotFinite { field, value } => write!(f, "{field} must be a finite number, got {value}"),
            Self::NegativeTemperature(t) => write!(f, "temperature must be >= 0, got {t}"),
            Self::TopPOutOfRange(p) => write!(f, "top_p must be in (0, 1], got {p}"),
            Self::MinPOutOfRange(p) => write!(f, "min_p must be in [0, 1], got {p}"),
            Self::RepetitionPenaltyNotPositive(p) => write!(f, "repetition_penalty must be > 0, got {p}"),
            Self::PenaltyOutOfRange { field, value } => write!(f, "{field} must be in [-2, 2], got {value}"),
            Self::TooManyLogprobs(n) => write!(f, "logprobs must be at most {MAX_LOGPROBS}, got {n}"),
            Self::LogitBiasOutOfRange { token, value } => {
                write!(f, "the bias of token {token} must be in [-100, 100], got {value}")
            }
        }
    }
}

impl std::error::Error for SamplingError {}

/// Per-request penalty state, updated once per token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenCounts {
    prompt: HashSet<u32>,
    output: HashMap<u32, u32>,
}

impl TokenCounts {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn observe_prompt(&mut self, tokens: &[u32]) {
        self.prompt.extend(tokens.iter().copied());
    }

    pub fn observe_output(&mut self, token: u32) {
        *self.output.entry(token).or_insert(0) += 1;
    }

    /// Takes back one [`observe_output`](Self::observe_output) of `token`.
    pub fn forget_output(&mut self, token: u32) {
        if let Some(count) = self.output.get_mut(&token) {
            *count -= 1;
            if *count == 0 {
                self.output.remove(&token);
            }
        }
    }

    pub fn in_prompt(&self, token: u32) -> bool {
        self.prompt.contains(&token)
    }

    pub fn output_count(&self, token: u32) -> u32 {
        self.output.get(&token).copied().unwrap_or(0)
    }

    fn is_empty(&self) -> bool {
        self.prompt.is_empty() && self.output.is_empty()
    }

    /// Every token seen in the prompt or the output, each once.
    fn seen(&self) -> impl Iterator<Item = u32> + '_ {
        let output_only = self.output.keys().copied().filter(|t| !self.prompt.contains(t));
        self.prompt.iter().copied().chain(output_only)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-softmax of the raw logits at `token`; None unless logprobs were requested.
    pub logprob: Option<f32>,
    /// Best (token, logprob) of the raw logits, descending, ties by lower id.
    pub top_logprobs: Vec<(u32, f32)>,
}

/// Picks the token for output index `position` (0 for the first generated token) of one
/// request. `logits` is not modified. One-off form: in a hot loop keep a [`Sampler`] per
/// worker thread to reuse its buffers. Requests sharing a seed share their random stream,
/// so give each request its own seed when the user sets none.
pub fn sample(logits: &[f32], params: &SamplingParams, counts: &TokenCounts, position: u64) -> Sampled {
    Sampler::new().sample(logits, params, counts, position)
}

/// Uniform in [0, 1) as a pure function of (seed, position): SplitMix64 whose start
/// state is a hash of the seed, evaluated at step `position` without carrying state.
pub fn uniform(seed: u64, position: u64) -> f64 {
    const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;
    let state = mix64(seed).wrapping_add(position.wrapping_add(1).wrapping_mul(GOLDEN_GAMMA));
    unit_f64(mix64(state))
}

/// Reusable scratch space; sampling with it allocates nothing after warm-up
/// (except the returned top_logprobs).
#[derive(Debug, Default)]
pub struct Sampler {
    weights: Vec<f32>,
    candidates: Vec<Ranked>,
    heap: BinaryHeap<Reverse<Ranked>>,
}

impl Sampler {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn sample(&mut self, logits: &[f32], params: &SamplingParams, counts: &TokenCounts, position: u64) -> Sampled {
        let token = self.choose(logits, params, counts, position);
        let (logprob, top_logprobs) = match params.logprobs {
            Some(n) => self.logprobs(logits, token, n),
            None => (None, Vec::new()),
        };
        Sampled { token, logprob, top_logprobs }
    }

    fn choose(&mut self, logits: &[f32], params: &SamplingParams, counts: &TokenCounts, position: u64) -> u32 {
        if params.is_greedy() {
            return self.choose_greedy(logits, params, counts);
        }
        let max = self.load_scaled(logits, params, counts, params.temperature);
        if max == f32::NEG_INFINITY {
            return FALLBACK_TOKEN;
        }
        let u = uniform(params.seed, position);
        if params.top_k > 0 && params.top_k < logits.len() {
            self.draw_top_k(params, u)
        } else {
            self.draw_full(max, params, u)
        }
    }

    fn choose_greedy(&mut self, logits: &[f32], params: &SamplingParams, counts: &TokenCounts) -> u32 {
        if !params.has_penalties() || counts.is_empty() {
            return argmax(logits);
        }
        self.load_scaled(logits, params, counts, 1.0);
        argmax(&self.weights)
    }

    /// Fills `weights` with penalised, temperature-scaled, sanitized logits; returns their max.
    fn load_scaled(&mut self, logits: &[f32], params: &SamplingParams, counts: &TokenCounts, temperature: f32) -> f32 {
        let inv_temperature = 1.0 / temperature;
        self.weights.clear();
        self.weights.extend(logits.iter().map(|&x| sanitize(x * inv_temperature)));
        apply_penalties(&mut self.weights, params, counts, inv_temperature);
        max_of(&self.weights)
    }

    fn draw_top_k(&mut self, params: &SamplingParams, u: f64) -> u32 {
        top_n(&self.weights, params.top_k, &mut self.heap, &mut self.candidates);
        let best = self.candidates[0].value;
        let mut total = 0.0f64;
        for c in &mut self.candidates {
            c.value = exp_nonpositive(c.value - best);
            total += c.value as f64;
        }
        draw_filtered(&self.candidates, total, params, u)
    }

    /// Whole-vocab draw that sorts only the keys it needs: those up to the top-p/min-p
    /// cutoff, or with no filter just the key the target falls in.
    fn draw_full(&mut self, max: f32, params: &SamplingParams, u: f64) -> u32 {
        self.weights.iter_mut().for_each(|w| *w = exp_nonpositive(*w - max));
        let first_window = window_histogram(&self.weights, 0);
        let total: f64 = first_window.iter().sum();
        if params.top_p < 1.0 || params.min_p > 0.0 {
            let top_p_target = params.top_p as f64 * total;
            let top_p_key = if params.top_p < 1.0 {
                find_key(&self.weights, first_window, |mass| mass >= top_p_target).0
            } else {
                MAX_KEY
            };
            // The best weight is exactly 1, so min-p keeps weights >= min_p.
            let min_p_key = if params.min_p > 0.0 { key_of(params.min_p) } else { MAX_KEY };
            self.collect_sorted(0..=top_p_key.min(min_p_key));
            return draw_filtered(&self.candidates, total, params, u);
        }
        let target = u * total;
        let (key, mass_before) = find_key(&self.weights, first_window, |mass| mass > target);
        self.collect_sorted(key..=key);
        inverse_cdf(&self.candidates, mass_before, target)
    }

    fn collect_sorted(&mut self, keys: RangeInclusive<u32>) {
        self.candidates.clear();
        let candidates = &mut self.candidates;
        for_each_where(
            &self.weights,
            |w| keys.contains(&key_of(w)),
            |token, value| candidates.push(Ranked { value, token: token as u32 }),
        );
        // Weights are non-negative, so their bits sort like their values: one integer key
        // orders by weight descending, then token id ascending.
        self.candidates.sort_unstable_by_key(|c| Reverse(((c.value.to_bits() as u64) << 32) | (!c.token) as u64));
    }

    /// From the raw logits, as vLLM does by default.
    fn logprobs(&mut self, logits: &[f32], token: u32, n: usize) -> (Option<f32>, Vec<(u32, f32)>) {
        let log_norm = log_sum_exp(logits);
        let logprob = |x: f32| sanitize(x) - log_norm;
        let chosen = logits.get(token as usize).map_or(f32::NEG_INFINITY, |&x| logprob(x));
        top_n(logits, n, &mut self.heap, &mut self.candidates);
        let top = self.candidates.iter().map(|c| (c.token, logprob(c.value))).collect();
        (Some(chosen), top)
    }
}

/// Applied to logits already multiplied by `scale` = 1 / temperature, so that copying and
/// scaling stay one vectorized pass: a positive scale keeps the sign the repetition
/// penalty looks at, and the subtracted penalties are scaled to match.
fn apply_penalties(scaled: &mut [f32], params: &SamplingParams, counts: &TokenCounts, scale: f32) {
    let penalty = params.repetition_penalty;
    if penalty != 1.0 {
        for token in counts.seen() {
            if let Some(x) = scaled.get_mut(token as usize) {
                *x = sanitize(if *x > 0.0 { *x / penalty } else { *x * penalty });
            }
        }
    }
    if params.presence_penalty != 0.0 || params.frequency_penalty != 0.0 {
        for (&token, &count) in &counts.output {
            if let Some(x) = scaled.get_mut(token as usize) {
                let penalty = params.presence_penalty + params.frequency_penalty * count as f32;
                *x = sanitize(*x - scale * penalty);
            }
        }
    }
}

/// NaN → -inf so it never wins; +inf → f32::MAX so it dominates yet softmax stays defined.
/// Written as two selects so loops over it vectorize.
fn sanitize(x: f32) -> f32 {
    let capped = if x > f32::MAX { f32::MAX } else { x };
    if capped.is_nan() {
        f32::NEG_INFINITY
    } else {
        capped
    }
}

/// Largest sanitized value, in LANES interleaved accumulators so the loop vectorizes.
fn max_of(values: &[f32]) -> f32 {
    let larger = |a: f32, b: f32| if b > a { b } else { a };
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest = chunks.remainder().iter().fold(f32::NEG_INFINITY, |m, &x| larger(m, sanitize(x)));
    for chunk in chunks {
        for (lane, &x) in lanes.iter_mut().zip(chunk) {
            *lane = larger(*lane, sanitize(x));
        }
    }
    lanes.into_iter().fold(rest, larger)
}

/// Σ f(x) in f64 over LANES interleaved accumulators, so the loop vectorizes; the fixed
/// order keeps results reproducible. f64 because a tail mass summed here must agree with
/// the same tokens summed per key, or a draw could slip past the end of the distribution.
fn sum_by(values: &[f32], f: impl Fn(f32) -> f32) -> f64 {
    let mut lanes = [0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let rest: f64 = chunks.remainder().iter().map(|&x| f(x) as f64).sum();
    for chunk in chunks {
        // Mapping a whole chunk first lets `f` vectorize in f32.
        let mapped: [f32; LANES] = std::array::from_fn(|i| f(chunk[i]));
        for (lane, y) in lanes.iter_mut().zip(mapped) {
            *lane += y as f64;
        }
    }
    rest + lanes.iter().sum::<f64>()
}

/// Indices where `keep` holds, ascending; whole chunks are tested at once (vectorized),
/// since in the hot uses almost none hold.
fn for_each_where(values: &[f32], keep: impl Fn(f32) -> bool, mut visit: impl FnMut(usize, f32)) {
    for (c, chunk) in values.chunks(LANES).enumerate() {
        if chunk.iter().fold(false, |any, &x| any | keep(x)) {
            for (offset, &x) in chunk.iter().enumerate() {
                if keep(x) {
                    visit(c * LANES + offset, x);
                }
            }
        }
    }
}

/// Lowest index of the largest value; NaN never wins; FALLBACK_TOKEN if nothing beats -inf.
/// A max pass then a scan that stops at the first match: both vectorize reliably, while
/// one pass tracking an index per lane does not, and runs 4x slower scalar.
fn argmax(values: &[f32]) -> u32 {
    let max = max_of(values);
    let is_max = |x: f32| sanitize(x) == max;
    if max == f32::NEG_INFINITY {
        return FALLBACK_TOKEN;
    }
    let chunk = values.chunks(LANES).position(|chunk| chunk.iter().fold(false, |any, &x| any | is_max(x)));
    let index = chunk.and_then(|c| values[c * LANES..].iter().position(|&x| is_max(x)).map(|i| c * LANES + i));
    index.map_or(FALLBACK_TOKEN, |i| i as u32)
}

/// log Σ exp(x); +inf when nothing has mass, so every logprob comes out -inf.
fn log_sum_exp(values: &[f32]) -> f32 {
    let max = max_of(values);
    if max == f32::NEG_INFINITY {
        return f32::INFINITY;
    }
    let sum = sum_by(values, |x| exp_nonpositive(sanitize(x) - max));
    max + sum.ln() as f32
}

/// exp(x) for x <= 0 within ~2 ulp (Cephes expf); 0 below -86, so no result is subnormal
/// (slow on some CPUs) and those tokens (< 5e-38 of the best) just get no mass. Branch-free so
/// whole-vocab loops vectorize (std's exp is a libm call per element); plain IEEE ops,
/// so bit-identical on every machine, which keeps draws reproducible across hosts.
fn exp_nonpositive(x: f32) -> f32 {
    const ROUNDING: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer
    let clamped = if x > -86.0 { x } else { -86.0 };
    let shifted = clamped * std::f32::consts::LOG2_E + ROUNDING;
    let n = shifted - ROUNDING;
    let r = clamped - n * 0.693_359_4 - n * -2.121_944_4e-4;
    let mut p = 1.987_569_1e-4;
    for coefficient in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = p * r + coefficient;
    }
    let exponent = (shifted.to_bits() as i32 - ROUNDING.to_bits() as i32 + 127) << 23;
    let y = (p * r * r + r + 1.0) * f32::from_bits(exponent as u32);
    if x > -86.0 {
        y
    } else {
        0.0
    }
}

/// Key of a weight in [0, 1]: non-increasing in the weight (key 0 holds 1.0), because
/// the bits of a non-negative float are ordered like its value.
fn key_of(weight: f32) -> u32 {
    ONE_BITS.saturating_sub(weight.to_bits()) >> SUB_OCTAVE_SHIFT
}

/// Mass per key in `first_key..first_key + WINDOW`, then the mass of all lighter keys.
fn window_histogram(weights: &[f32], first_key: u32) -> [f64; WINDOW + 1] {
    // Four accumulators per key, as runs of equal keys would serialize on one slot; slot
    // WINDOW takes what lies outside the window, so the scatter needs no branch.
    let mut partial = [[0.0f64; 4]; WINDOW + 1];
    let slot = |w: f32| (key_of(w).wrapping_sub(first_key) as usize).min(WINDOW);
    for chunk in weights.chunks(LANES) {
        if chunk.iter().fold(false, |any, &w| any | (slot(w) < WINDOW)) {
            for (lane, &w) in chunk.iter().enumerate() {
                partial[slot(w)][lane % 4] += w as f64;
            }
        }
    }
    let mut mass = [0.0f64; WINDOW + 1];
    for (key_mass, lanes) in mass.iter_mut().zip(&partial) {
        *key_mass = lanes.iter().sum();
    }
    let lighter_key = first_key + WINDOW as u32;
    // key_of(w) >= lighter_key exactly when w <= ceiling.
    let ceiling = f32::from_bits(ONE_BITS.saturating_sub(lighter_key << SUB_OCTAVE_SHIFT));
    mass[WINDOW] = sum_by(weights, |w| if w <= ceiling { w } else { 0.0 });
    mass
}

/// The first key, best-first, at which the cumulative mass is `reached`, and the mass of
/// all heavier keys. When rounding keeps `reached` false, the last key with mass.
fn find_key(weights: &[f32], first_window: [f64; WINDOW + 1], reached: impl Fn(f64) -> bool) -> (u32, f64) {
    let (mut first_key, mut window, mut before) = (0u32, first_window, 0.0f64);
    loop {
        let mut cumulative = before;
        let mut found = None;
        for (offset, &mass) in window.iter().enumerate() {
            if mass > 0.0 {
                found = Some((offset, cumulative));
            }
            cumulative += mass;
            if mass > 0.0 && reached(cumulative) {
                break;
            }
        }
        let Some((offset, mass_before)) = found else { return (first_key, before) };
        if offset < WINDOW || first_key + WINDOW as u32 > MAX_KEY {
            return (first_key + offset as u32, mass_before);
        }
        first_key += WINDOW as u32;
        window = window_histogram(weights, first_key);
        before = mass_before;
    }
}

/// Draws from candidates sorted best-first, whose full distribution has mass `total`.
fn draw_filtered(candidates: &[Ranked], total: f64, params: &SamplingParams, u: f64) -> u32 {
    let kept = &candidates[..kept_len(candidates, total, params)];
    let kept_mass: f64 = kept.iter().map(|c| c.value as f64).sum();
    inverse_cdf(kept, 0.0, u * kept_mass)
}

fn kept_len(candidates: &[Ranked], total: f64, params: &SamplingParams) -> usize {
    let mut len = candidates.len();
    if params.top_p < 1.0 {
        let target = params.top_p as f64 * total;
        let mut cumulative = 0.0;
        if let Some(last) = candidates.iter().position(|c| {
            cumulative += c.value as f64;
            cumulative >= target
        }) {
            len = last + 1;
        }
    }
    if params.min_p > 0.0 {
        let threshold = params.min_p * candidates[0].value;
        len = candidates[..len].partition_point(|c| c.value >= threshold);
    }
    len.max(1)
}

fn inverse_cdf(candidates: &[Ranked], mass_before: f64, target: f64) -> u32 {
    let mut cumulative = mass_before;
    for c in candidates {
        cumulative += c.value as f64;
        if cumulative > target {
            return c.token;
        }
    }
    // Rounding put the target past the summed mass: take the last token with any mass.
    let last = candidates.iter().rev().find(|c| c.value > 0.0).or(candidates.first());
    last.map_or(FALLBACK_TOKEN, |c| c.token)
}

/// Writes the `n` best of `values` into `out`, best first (larger value, then lower id).
fn top_n(values: &[f32], n: usize, heap: &mut BinaryHeap<Reverse<Ranked>>, out: &mut Vec<Ranked>) {
    heap.clear();
    out.clear();
    let n = n.min(values.len());
    let ranked = |token: usize| Ranked { value: sanitize(values[token]), token: token as u32 };
    heap.extend((0..n).map(|token| Reverse(ranked(token))));
    let mut threshold = heap.peek().map_or(f32::INFINITY, |worst| worst.0.value);
    for (c, chunk) in values[n..].chunks(LANES).enumerate() {
        // Most chunks hold nothing above the current n-th best: one vectorized test skips them.
        if !chunk.iter().fold(false, |any, &x| any | (x > threshold)) {
            continue;
        }
        for offset in 0..chunk.len() {
            let entry = ranked(n + c * LANES + offset);
            // Strict: ids ascend, so an equal value never beats the one already kept.
            if entry.value > threshold {
                if let Some(mut worst) = heap.peek_mut() {
                    *worst = Reverse(entry);
                }
                threshold = heap.peek().map_or(threshold, |worst| worst.0.value);
            }
        }
    }
    out.extend(heap.drain().map(|Reverse(r)| r));
    out.sort_unstable_by(|a, b| b.cmp(a));
}

/// Orders by value, then by lower token id, so "greater" means "ranked first".
#[derive(Debug, Clone, Copy)]
struct Ranked {
    value: f32,
    token: u32,
}

impl Ord for Ranked {
    fn cmp(&self, other: &Self) -> Ordering {
        let by_value = self.value.partial_cmp(&other.value).unwrap_or(Ordering::Equal);
        by_value.then_with(|| other.token.cmp(&self.token))
    }
}

impl PartialOrd for Ranked {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Ranked {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Ranked {}

#[cfg(test)]
mod tests;

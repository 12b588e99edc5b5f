//! Workloads: what each request asks for. The sizes follow how the published
//! token-routing benchmarks measure (low-effort: ~100-token math prompts, output cap
//! 2,048; high-effort: cap 8,192; agentic: multi-turn coding sessions with
//! ~8,192-token inputs, cap 1,024), and trace replay takes sizes and arrival times
//! from the Azure 2023 traces. A scale shrinks caps and inputs so a run fits a small
//! machine. Every job's text comes from its own seeded stream, so a run is
//! reproducible whatever order clients pick jobs in.

use serde::Serialize;
use tokenrouter_core::rng::{mix64, SplitMix64};

use crate::prompt::PromptMaker;
use crate::trace::TraceRow;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum WorkloadKind {
    /// ~100-token prompts, output cap 2,048.
    LowEffort,
    /// ~100-token prompts, output cap 8,192.
    HighEffort,
    /// Multi-turn sessions: an ~8,192-token first input, then each turn appends the
    /// previous answer and a new ~350-token user turn; output cap 1,024.
    Agentic,
    /// Sizes (and, with --replay, arrival times) from an Azure trace.
    Trace,
}

/// Unscaled sizes of a synthetic workload, in tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sizes {
    /// The first user turn.
    pub prompt: usize,
    /// Each later user turn (multi-turn workloads).
    pub append: usize,
    pub max_tokens: usize,
}

impl WorkloadKind {
    pub fn sizes(self) -> Sizes {
        match self {
            WorkloadKind::LowEffort => Sizes { prompt: 100, append: 0, max_tokens: 2048 },
            WorkloadKind::HighEffort => Sizes { prompt: 100, append: 0, max_tokens: 8192 },
            // Coding-agent sessions append a median ~1.4K characters (~350 tokens) per call.
            WorkloadKind::Agentic => Sizes { prompt: 8192, append: 350, max_tokens: 1024 },
            // Per row; these only matter for rows that the scale would make empty.
            WorkloadKind::Trace => Sizes { prompt: 1, append: 0, max_tokens: 1 },
        }
    }

    pub fn is_multi_turn(self) -> bool {
        self == WorkloadKind::Agentic
    }
}

/// Factors on input sizes and output caps (1 = the published sizes).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Scale {
    pub input: f64,
    pub output: f64,
}

impl Scale {
    pub fn input(&self, tokens: usize) -> usize {
        scaled(tokens, self.input)
    }

    pub fn output(&self, tokens: usize) -> usize {
        scaled(tokens, self.output)
    }
}

/// At least one token: a scaled-away prompt or cap is not a request.
fn scaled(tokens: usize, factor: f64) -> usize {
    ((tokens as f64 * factor).round() as usize).max(1)
}

/// How to build jobs.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub kind: WorkloadKind,
    pub scale: Scale,
    /// Turns per session (multi-turn workloads).
    pub turns: usize,
    pub seed: u64,
}

/// One user turn: new text and its length.
#[derive(Debug, Clone, PartialEq)]
pub struct Turn {
    pub text: String,
    pub tokens: usize,
}

/// A unit of work: one request, or a session whose turns run one after another,
/// each sent with the whole conversation so far.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub id: u64,
    pub turns: Vec<Turn>,
    pub max_tokens: usize,
    /// Arrival in the trace, seconds after its first request.
    pub trace_at_s: Option<f64>,
    seed: u64,
}

impl Job {
    /// The sampling seed sent with a turn: fixed by the run's seed, below 2^53 so
    /// every JSON reader keeps it exact.
    pub fn sampling_seed(&self, turn: usize) -> u64 {
        mix64(self.seed ^ (turn as u64 + 1)) & ((1 << 53) - 1)
    }

    /// The `session_id` a multi-turn job's requests carry, so the server can continue
    /// the conversation (incremental tokenization); none for a single request. Fixed
    /// by the run's seed and the job, like the text.
    pub fn session_id(&self) -> Option<String> {
        (self.turns.len() > 1).then(|| format!("load-{:016x}", self.seed))
    }
}

/// `count` jobs of a synthetic workload, or the first `count` rows of a trace.
pub fn make_jobs(spec: &WorkloadSpec, maker: &PromptMaker, trace: Option<&[TraceRow]>, count: usize) -> Vec<Job> {
    match (spec.kind, trace) {
        (WorkloadKind::Trace, Some(rows)) => {
            rows.iter().take(count).enumerate().map(|(i, row)| trace_job(spec, maker, i as u64, row)).collect()
        }
        (WorkloadKind::Trace, None) => Vec::new(),
        _ => (0..count as u64).map(|i| synthetic_job(spec, maker, i)).collect(),
    }
}

fn job_seed(run_seed: u64, id: u64) -> u64 {
    mix64(run_seed ^ mix64(id))
}

fn synthetic_job(spec: &WorkloadSpec, maker: &PromptMaker, id: u64) -> Job {
    let seed = job_seed(spec.seed, id);
    let mut rng = SplitMix64(seed);
    let sizes = spec.kind.sizes();
    let turns = if spec.kind.is_multi_turn() { spec.turns.max(1) } else { 1 };
    let turns = (0..turns)
        .map(|t| {
            let tokens = spec.scale.input(if t == 0 { sizes.prompt } else { sizes.append });
            Turn { text: maker.text(tokens, &mut rng), tokens }
        })
        .collect();
    Job { id, turns, max_tokens: spec.scale.output(sizes.max_tokens), trace_at_s: None, seed }
}

fn trace_job(spec: &WorkloadSpec, maker: &PromptMaker, id: u64, row: &TraceRow) -> Job {
    let seed = job_seed(spec.seed, id);
    let tokens = spec.scale.input(row.context_tokens as usize);
    let text = maker.text(tokens, &mut SplitMix64(seed));
    let max_tokens = spec.scale.output(row.generated_tokens as usize);
    Job { id, turns: vec![Turn { text, tokens }], max_tokens, trace_at_s: Some(row.at_s), seed }
}

/// Arrival times (seconds after the start) of a Poisson process of `rate` per second.
pub fn poisson_arrivals(rate: f64, count: usize, seed: u64) -> Vec<f64> {
    let mut rng = SplitMix64(mix64(seed ^ 0xA771_7A15));
    let mut t = 0.0;
    (0..count)
        .map(|_| {
            // Exponential gaps; open_unit is never 0, so the log is finite.
            t += -rng.open_unit().ln() / rate;
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: WorkloadKind, scale: f64) -> WorkloadSpec {
        WorkloadSpec { kind, scale: Scale { input: scale, output: scale }, turns: 3, seed: 5 }
    }

    #[test]
    fn synthetic_workloads_have_the_published_sizes_scaled() {
        let maker = PromptMaker::approximate();
        let low = make_jobs(&spec(WorkloadKind::LowEffort, 1.0), &maker, None, 4);
        assert_eq!(low.len(), 4);
        assert!(low.iter().all(|j| j.turns.len() == 1 && j.turns[0].tokens == 100 && j.max_tokens == 2048));
        let high = make_jobs(&spec(WorkloadKind::HighEffort, 0.05), &maker, None, 1);
        assert_eq!((high[0].turns[0].tokens, high[0].max_tokens), (5, 410));
        let agentic = make_jobs(&spec(WorkloadKind::Agentic, 0.1), &maker, None, 2);
        let tokens: Vec<usize> = agentic[0].turns.iter().map(|t| t.tokens).collect();
        assert_eq!((tokens, agentic[0].max_tokens), (vec![819, 35, 35], 102));
        assert!(agentic[0].turns.iter().all(|t| maker.count(&t.text) == t.tokens));
        let sessions = (agentic[0].session_id().unwrap(), agentic[1].session_id().unwrap());
        assert_ne!(sessions.0, sessions.1);
        assert_eq!(Some(sessions.0), make_jobs(&spec(WorkloadKind::Agentic, 0.1), &maker, None, 1)[0].session_id());
    }

    #[test]
    fn tiny_scales_keep_one_token() {
        let s = Scale { input: 0.0001, output: 0.0 };
        assert_eq!((s.input(100), s.output(2048)), (1, 1));
    }

    #[test]
    fn jobs_are_reproducible_and_differ_from_each_other() {
        let maker = PromptMaker::approximate();
        let a = make_jobs(&spec(WorkloadKind::LowEffort, 1.0), &maker, None, 3);
        let b = make_jobs(&spec(WorkloadKind::LowEffort, 1.0), &maker, None, 3);
        assert_eq!(a, b);
        assert_ne!(a[0].turns[0].text, a[1].turns[0].text);
        assert_ne!(a[0].sampling_seed(0), a[0].sampling_seed(1));
        assert!(a.iter().all(|j| j.sampling_seed(0) < 1 << 53));
        assert_eq!(a[0].session_id(), None, "single requests continue no session");
        let other_seed = WorkloadSpec { seed: 6, ..spec(WorkloadKind::LowEffort, 1.0) };
        assert_ne!(make_jobs(&other_seed, &maker, None, 1)[0], a[0]);
    }

    #[test]
    fn trace_jobs_take_sizes_and_times_from_rows() {
        let rows = [
            TraceRow { at_s: 0.0, context_tokens: 400, generated_tokens: 40 },
            TraceRow { at_s: 1.5, context_tokens: 20, generated_tokens: 7 },
        ];
        let jobs = make_jobs(&spec(WorkloadKind::Trace, 0.5), &PromptMaker::approximate(), Some(&rows), 5);
        assert_eq!(jobs.len(), 2, "a trace ends where it ends");
        assert_eq!((jobs[1].turns[0].tokens, jobs[1].max_tokens, jobs[1].trace_at_s), (10, 4, Some(1.5)));
    }

    #[test]
    fn poisson_gaps_average_one_over_the_rate() {
        let arrivals = poisson_arrivals(4.0, 4000, 1);
        assert!(arrivals.windows(2).all(|w| w[0] < w[1]));
        let mean_gap = arrivals.last().unwrap() / 4000.0;
        assert!((mean_gap - 0.25).abs() < 0.02, "mean gap {mean_gap}");
        assert_eq!(arrivals, poisson_arrivals(4.0, 4000, 1));
    }
}

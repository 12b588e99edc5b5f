//! One pool of identical instances, event by event: a shared FIFO queue (an ideal load
//! balancer: any instance with room takes the oldest request), continuous batching
//! (each step decodes one token for every running sequence and prefills the newly
//! admitted ones, up to a token budget per step), admission while KV and the batch cap
//! allow, and vLLM's preemption
//! when KV runs out: the newest sequence is evicted and recomputed later (its prompt
//! and the tokens it had are prefilled again when it is readmitted).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use serde::Serialize;

use crate::pool::cost::InstanceProfile;
use crate::pool::trace::Arrival;
use crate::stats::Samples;

/// A request as one pool sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Job {
    pub at_s: f64,
    pub prompt: u32,
    pub output: u32,
}

impl From<&Arrival> for Job {
    fn from(a: &Arrival) -> Job {
        Job { at_s: a.at_s, prompt: a.prompt_tokens, output: a.output_tokens }
    }
}

impl Job {
    fn total(&self) -> usize {
        self.prompt as usize + self.output as usize
    }
}

/// How a pool is built.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PoolShape {
    pub instances: usize,
    /// Sequences per instance at most.
    pub max_seqs: usize,
    /// Longest request (prompt + output) the pool accepts.
    pub max_context: usize,
}

/// What happened to a pool's requests.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct PoolRun {
    pub completed: usize,
    /// Longer than the pool's context or its instances' KV: never served.
    pub rejected: usize,
    pub preemptions: usize,
    /// Seconds from arrival to the first token, in job order of completion.
    #[serde(skip)]
    pub ttft_s: Vec<f64>,
    /// Sum over instances of the time they spent stepping.
    pub busy_s: f64,
    /// When the last request finished.
    pub end_s: f64,
}

impl PoolRun {
    /// The q-quantile of TTFT (0 without requests).
    pub fn ttft_quantile(&self, q: f64) -> f64 {
        Samples::from(self.ttft_s.clone()).quantile(q).unwrap_or(0.0)
    }
}

/// A running sequence: its job and the tokens it has generated.
#[derive(Debug, Clone, Copy)]
struct Seq {
    job: usize,
    generated: u32,
}

#[derive(Debug, Default)]
struct Instance {
    running: Vec<Seq>,
    kv_used: usize,
    stepping: bool,
}

/// Event time order for the step heap (times are finite).
#[derive(Debug, Clone, Copy, PartialEq)]
struct At(f64);

impl Eq for At {}

impl PartialOrd for At {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for At {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

struct PoolState<'a> {
    jobs: &'a [Job],
    profile: &'a InstanceProfile,
    shape: PoolShape,
    instances: Vec<Instance>,
    queue: VecDeque<usize>,
    /// Tokens each job has generated so far (kept across preemption).
    progress: Vec<u32>,
    first_token: Vec<bool>,
    steps: BinaryHeap<Reverse<(At, usize)>>,
    run: PoolRun,
}

/// Runs `jobs` (sorted by arrival) through a pool until every request has finished.
pub fn run_pool(jobs: &[Job], profile: &InstanceProfile, shape: PoolShape) -> PoolRun {
    let mut state = PoolState {
        jobs,
        profile,
        shape,
        instances: (0..shape.instances.max(1)).map(|_| Instance::default()).collect(),
        queue: VecDeque::new(),
        progress: vec![0; jobs.len()],
        first_token: vec![false; jobs.len()],
        steps: BinaryHeap::new(),
        run: PoolRun::default(),
    };
    let mut next_arrival = 0;
    loop {
        let step_at = state.steps.peek().map(|Reverse((At(t), _))| *t);
        match (jobs.get(next_arrival), step_at) {
            (Some(job), Some(t)) if job.at_s <= t => {
                state.arrive(next_arrival);
                next_arrival += 1;
            }
            (Some(_), None) => {
                state.arrive(next_arrival);
                next_arrival += 1;
            }
            (_, Some(_)) => {
                let Reverse((At(now), i)) = state.steps.pop().expect("peeked");
                state.finish_step(i, now);
            }
            (None, None) => break,
        }
    }
    state.run
}

impl PoolState<'_> {
    fn arrive(&mut self, job: usize) {
        let j = self.jobs[job];
        if j.total() > self.shape.max_context || j.total() > self.profile.kv_tokens {
            self.run.rejected += 1;
            return;
        }
        self.queue.push_back(job);
        if let Some(idle) = self.instances.iter().position(|i| !i.stepping) {
            self.start_step(idle, j.at_s);
        }
    }

    /// Ends instance `i`'s step at `now`: one more token for each sequence, finished
    /// ones leave, then the next step starts if anything is left to run.
    fn finish_step(&mut self, i: usize, now: f64) {
        let instance = &mut self.instances[i];
        for seq in &mut instance.running {
            seq.generated += 1;
            self.progress[seq.job] = seq.generated;
            instance.kv_used += 1;
            if !self.first_token[seq.job] {
                self.first_token[seq.job] = true;
                self.run.ttft_s.push(now - self.jobs[seq.job].at_s);
            }
        }
        let jobs = self.jobs;
        let (mut freed, mut finished) = (0, 0);
        instance.running.retain(|seq| {
            let job = jobs[seq.job];
            let done = seq.generated >= job.output;
            if done {
                freed += job.prompt as usize + seq.generated as usize;
                finished += 1;
            }
            !done
        });
        instance.kv_used -= freed;
        if finished > 0 {
            self.run.completed += finished;
            self.run.end_s = self.run.end_s.max(now);
        }
        self.start_step(i, now);
    }

    /// Preempts while the next step's tokens do not fit, admits while there is room,
    /// and schedules the step (or leaves the instance idle).
    fn start_step(&mut self, i: usize, now: f64) {
        let capacity = self.profile.kv_tokens;
        let instance = &mut self.instances[i];
        while instance.kv_used + instance.running.len() > capacity {
            let seq = instance.running.pop().expect("over capacity with nothing running");
            instance.kv_used -= self.jobs[seq.job].prompt as usize + seq.generated as usize;
            self.queue.push_front(seq.job);
            self.run.preemptions += 1;
        }
        let mut prefill = 0;
        while instance.running.len() < self.shape.max_seqs {
            let Some(&job) = self.queue.front() else { break };
            // A preempted sequence recomputes its prompt and what it had generated.
            let tokens = self.jobs[job].prompt as usize + self.progress[job] as usize;
            let over_budget = prefill > 0 && prefill + tokens > self.profile.step_token_budget;
            if over_budget || instance.kv_used + tokens + instance.running.len() + 1 > capacity {
                break;
            }
            self.queue.pop_front();
            instance.kv_used += tokens;
            prefill += tokens;
            instance.running.push(Seq { job, generated: self.progress[job] });
        }
        instance.stepping = !instance.running.is_empty();
        if instance.stepping {
            let duration = self.profile.step_seconds(instance.running.len(), prefill);
            self.run.busy_s += duration;
            self.steps.push(Reverse((At(now + duration), i)));
        }
    }
}

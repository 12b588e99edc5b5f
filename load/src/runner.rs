//! Driving a run: closed-loop clients or open-loop arrivals, within a request count
//! and a time limit. At the time limit no new request starts; requests still
//! running after a grace period (or at an interrupt) are cut and counted as failed,
//! so a run always ends close to the time it was given. In a soak (no request
//! count) jobs are reused until the time is up, and a fraction of requests may be
//! hung up on mid-stream (churn).

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::churn::hangup_after;
use crate::client::{Client, Conversation, Outcome};
use crate::dispatch::Dispatcher;
use crate::record::{RequestRecord, Slot};
use crate::workload::Job;

/// How a request reaches the models: one streamed request to a server, or the
/// standard-serving dispatcher's one-token calls to per-model servers.
pub enum Transport {
    Stream(Client),
    Dispatch(Dispatcher),
}

impl Transport {
    /// Sends one request; never fails, a failure is in the outcome. Only streamed
    /// requests can be hung up on (`hangup_after`); the dispatcher ignores it.
    pub async fn send(
        &self,
        conversation: &Conversation,
        max_tokens: usize,
        seed: u64,
        hangup_after: Option<u64>,
    ) -> Outcome {
        match self {
            Transport::Stream(client) => client.send(&client.body(conversation, max_tokens, seed), hangup_after).await,
            Transport::Dispatch(dispatcher) => dispatcher.send(conversation, max_tokens, seed).await,
        }
    }
}

/// How requests arrive.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadShape {
    /// N clients; each sends its next request when its last one ends.
    Closed { clients: usize },
    /// Jobs start at these times (seconds after the start, one per job, ascending),
    /// whether or not earlier ones have finished: Poisson or a trace's timestamps.
    Open { arrivals: Vec<f64> },
}

/// The bounds of a run.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Limits {
    pub max_requests: usize,
    /// No request starts after this.
    pub duration: Duration,
    /// How long requests running at `duration` may still finish.
    pub grace: Duration,
    /// Soak: start over at the first job when all have run, until the time is up.
    pub reuse_jobs: bool,
}

/// Requests the client drops on purpose.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Churn {
    /// Fraction of requests hung up on at a uniformly random point mid-stream.
    pub hangup_fraction: f64,
    /// Chooses which requests and where.
    pub seed: u64,
}

pub struct RunResult {
    /// In send order.
    pub records: Vec<RequestRecord>,
    pub elapsed_s: f64,
}

/// Where the run stands; requests watch it to know when to give up.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Running,
    /// Past the time limit: in-flight requests finish, no new ones start.
    Draining,
    /// In-flight requests are abandoned, for this reason.
    Cut(&'static str),
}

// Both begin with `CUT_PREFIX`, which tells a cut request from a lost one.
const CUT_AT_LIMIT: &str = "cut: still running at the time limit (--duration plus --grace)";
const CUT_BY_INTERRUPT: &str = "cut: the run was interrupted";

/// Runs `jobs` against the server and returns every request's record. `interrupt`
/// resolving (Ctrl-C in the CLI) cuts the run short; results so far are kept.
pub async fn run(
    transport: Arc<Transport>,
    jobs: Vec<Job>,
    shape: &LoadShape,
    limits: Limits,
    churn: Churn,
    progress: ProgressBar,
    interrupt: impl Future<Output = ()> + Send + 'static,
) -> RunResult {
    let (phase, _) = watch::channel(Phase::Running);
    let start = Instant::now();
    let run = Arc::new(Run {
        transport,
        jobs,
        start,
        deadline: start + limits.duration,
        max_requests: limits.max_requests,
        reuse_jobs: limits.reuse_jobs,
        churn,
        issued: AtomicUsize::new(0),
        phase,
        results: Mutex::default(),
        progress,
    });
    let clock = tokio::spawn(run.clone().keep_time(limits.grace, interrupt));
    match shape {
        LoadShape::Closed { clients } => run.clone().closed_loop(*clients).await,
        LoadShape::Open { arrivals } => run.clone().open_loop(arrivals).await,
    }
    let elapsed_s = start.elapsed().as_secs_f64();
    clock.abort();
    run.progress.finish_and_clear();
    let mut records = std::mem::take(&mut run.results.lock().unwrap_or_else(|p| p.into_inner()).records);
    records.sort_by_key(|r| r.index);
    RunResult { records, elapsed_s }
}

struct Run {
    transport: Arc<Transport>,
    jobs: Vec<Job>,
    start: Instant,
    deadline: Instant,
    max_requests: usize,
    reuse_jobs: bool,
    churn: Churn,
    /// Requests started so far (the next request's index).
    issued: AtomicUsize,
    phase: watch::Sender<Phase>,
    results: Mutex<Results>,
    progress: ProgressBar,
}

/// Records so far, with running counts for the progress bar.
#[derive(Default)]
struct Results {
    records: Vec<RequestRecord>,
    failed: usize,
    hung_up: usize,
    output_tokens: u64,
}

impl Run {
    /// Moves the phase on at the deadline and after the grace, or at an interrupt.
    async fn keep_time(self: Arc<Self>, grace: Duration, interrupt: impl Future<Output = ()>) {
        let timeline = async {
            tokio::time::sleep_until(self.deadline).await;
            self.phase.send_replace(Phase::Draining);
            tokio::time::sleep(grace).await;
            CUT_AT_LIMIT
        };
        let reason = tokio::select! {
            reason = timeline => reason,
            _ = interrupt => CUT_BY_INTERRUPT,
        };
        self.phase.send_replace(Phase::Cut(reason));
    }

    fn accepting(&self) -> bool {
        *self.phase.borrow() == Phase::Running && Instant::now() < self.deadline
    }

    /// No more requests will start.
    fn exhausted(&self) -> bool {
        !self.accepting() || self.issued.load(Ordering::SeqCst) >= self.max_requests
    }

    /// The index of a new request, if the bounds allow one more.
    fn take(&self) -> Option<usize> {
        if !self.accepting() {
            return None;
        }
        let index = self.issued.fetch_add(1, Ordering::SeqCst);
        (index < self.max_requests).then_some(index)
    }

    async fn closed_loop(self: Arc<Self>, clients: usize) {
        let next_job = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..clients.max(1))
            .map(|_| {
                let (run, next_job) = (self.clone(), next_job.clone());
                tokio::spawn(async move {
                    while !run.exhausted() {
                        let Some(job) = run.job(next_job.fetch_add(1, Ordering::SeqCst)) else { break };
                        run.run_job(job).await;
                    }
                })
            })
            .collect();
        join_all(tasks).await;
    }

    async fn open_loop(self: Arc<Self>, arrivals: &[f64]) {
        let mut phase = self.phase.subscribe();
        let mut tasks = Vec::new();
        let jobs = if self.reuse_jobs { arrivals.len() } else { self.jobs.len() };
        for (i, at) in arrivals.iter().enumerate().take(jobs) {
            let due = (self.start + Duration::from_secs_f64(at.max(0.0))).min(self.deadline);
            // Sleep to the arrival, but wake for the deadline or an interrupt.
            tokio::select! {
                _ = tokio::time::sleep_until(due) => {}
                _ = phase.wait_for(|p| *p != Phase::Running) => {}
            }
            if self.exhausted() {
                break;
            }
            let run = self.clone();
            tasks.push(tokio::spawn(async move {
                if let Some(job) = run.job(i) {
                    run.run_job(job).await
                }
            }));
        }
        join_all(tasks).await;
    }

    /// The `n`-th job to run: in a soak the jobs come round again.
    fn job(&self, n: usize) -> Option<&Job> {
        match self.reuse_jobs && !self.jobs.is_empty() {
            true => self.jobs.get(n % self.jobs.len()),
            false => self.jobs.get(n),
        }
    }

    /// The turns of a job in order, each with the conversation so far. A failed
    /// (or hung-up) turn ends its session: the next turn would need its answer.
    async fn run_job(&self, job: &Job) {
        let mut conversation = Conversation::in_session(job.session_id());
        for (turn, t) in job.turns.iter().enumerate() {
            let Some(index) = self.take() else { return };
            conversation.user(&t.text);
            let start_s = self.start.elapsed().as_secs_f64();
            let hangup = hangup_after(self.churn.hangup_fraction, job.max_tokens, self.churn.seed, index);
            let outcome = self.send(&conversation, job.max_tokens, job.sampling_seed(turn), hangup).await;
            let slot = Slot { index, job: job.id, turn, start_s, turn_tokens: t.tokens, max_tokens: job.max_tokens };
            self.record(RequestRecord::new(slot, &outcome));
            if outcome.error.is_some() {
                return;
            }
            conversation.assistant(outcome.tally.text);
        }
    }

    /// Sends one request, abandoning it if the run is cut meanwhile.
    async fn send(&self, conversation: &Conversation, max_tokens: usize, seed: u64, hangup: Option<u64>) -> Outcome {
        let mut phase = self.phase.subscribe();
        let sent = std::time::Instant::now();
        tokio::select! {
            outcome = self.transport.send(conversation, max_tokens, seed, hangup) => outcome,
            cut = phase.wait_for(|p| matches!(p, Phase::Cut(_))) => {
                let reason = match cut.as_deref() {
                    Ok(Phase::Cut(reason)) => reason,
                    _ => CUT_BY_INTERRUPT,
                };
                Outcome::cut(sent, reason)
            }
        }
    }

    fn record(&self, record: RequestRecord) {
        let message = {
            let mut results = self.results.lock().unwrap_or_else(|p| p.into_inner());
            results.failed += usize::from(!record.ok && !record.hung_up);
            results.hung_up += usize::from(record.hung_up);
            results.output_tokens += record.output_tokens;
            results.records.push(record);
            let done = results.records.len() - results.failed - results.hung_up;
            let (failed, hung_up, tokens) = (results.failed, results.hung_up, results.output_tokens);
            format!("{done} done, {failed} failed, {hung_up} hung up, {tokens} output tokens")
        };
        self.progress.inc(1);
        self.progress.set_message(message);
    }
}

async fn join_all(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        // A panicking client task loses only its own requests.
        let _ = task.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::churn::CUT_PREFIX;

    #[test]
    fn cut_messages_are_told_apart_from_losses() {
        assert!(CUT_AT_LIMIT.starts_with(CUT_PREFIX) && CUT_BY_INTERRUPT.starts_with(CUT_PREFIX));
    }
}

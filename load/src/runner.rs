//! Driving a run: closed-loop clients or open-loop arrivals, within a request count
//! and a time limit. At the time limit no new request starts; requests still
//! running after a grace period (or at an interrupt) are cut and counted as failed,
//! so a run always ends close to the time it was given.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use indicatif::ProgressBar;
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::Instant;

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
    /// Sends one request; never fails, a failure is in the outcome.
    pub async fn send(&self, conversation: &Conversation, max_tokens: usize, seed: u64) -> Outcome {
        match self {
            Transport::Stream(client) => client.send(&client.body(conversation, max_tokens, seed)).await,
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

const CUT_AT_LIMIT: &str = "cut: still running at the time limit (--duration plus --grace)";
const CUT_BY_INTERRUPT: &str = "cut: the run was interrupted";

/// Runs `jobs` against the server and returns every request's record. `interrupt`
/// resolving (Ctrl-C in the CLI) cuts the run short; results so far are kept.
pub async fn run(
    transport: Arc<Transport>,
    jobs: Vec<Job>,
    shape: &LoadShape,
    limits: Limits,
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
                        let Some(job) = run.jobs.get(next_job.fetch_add(1, Ordering::SeqCst)) else { break };
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
        for (i, at) in arrivals.iter().enumerate().take(self.jobs.len()) {
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
            tasks.push(tokio::spawn(async move { run.run_job(&run.jobs[i]).await }));
        }
        join_all(tasks).await;
    }

    /// The turns of a job in order, each with the conversation so far. A failed
    /// turn ends its session: the next turn would need its answer.
    async fn run_job(&self, job: &Job) {
        let mut conversation = Conversation::default();
        for (turn, t) in job.turns.iter().enumerate() {
            let Some(index) = self.take() else { return };
            conversation.user(&t.text);
            let start_s = self.start.elapsed().as_secs_f64();
            let outcome = self.send(&conversation, job.max_tokens, job.sampling_seed(turn)).await;
            let slot = Slot { index, job: job.id, turn, start_s, turn_tokens: t.tokens, max_tokens: job.max_tokens };
            self.record(RequestRecord::new(slot, &outcome));
            if outcome.error.is_some() {
                return;
            }
            conversation.assistant(outcome.tally.text);
        }
    }

    /// Sends one request, abandoning it if the run is cut meanwhile.
    async fn send(&self, conversation: &Conversation, max_tokens: usize, seed: u64) -> Outcome {
        let mut phase = self.phase.subscribe();
        let sent = std::time::Instant::now();
        tokio::select! {
            outcome = self.transport.send(conversation, max_tokens, seed) => outcome,
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
            results.failed += usize::from(!record.ok);
            results.output_tokens += record.output_tokens;
            results.records.push(record);
            let done = results.records.len() - results.failed;
            format!("{done} done, {} failed, {} output tokens", results.failed, results.output_tokens)
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

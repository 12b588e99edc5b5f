//! Closed-loop load on a running engine: each client sends its next request the moment
//! the last one ends, so exactly N requests are in flight apart from the instants in
//! between. Committed tokens are counted as their events arrive, so a caller can read
//! the counter at both ends of a window and get the tokens committed inside it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use tokenrouter_actors::{Engine, GenerateRequest, GenerationEvent};
use tokenrouter_core::model::sampler::SamplingParams;
use tokenrouter_core::rng::mix64;
use tokio::task::JoinHandle;

/// What every request of the load looks like.
#[derive(Debug, Clone, Copy)]
pub struct RequestShape {
    pub prompt_tokens: usize,
    pub output_tokens: usize,
    /// Prompt ids are drawn below this (the engine's shared vocabulary).
    pub vocab: usize,
    pub seed: u64,
    pub temperature: f32,
}

impl RequestShape {
    /// Request number `index` of the run: synthetic prompt ids and a sampling seed, both
    /// derived from (seed, index), so a rerun sends the same requests.
    pub fn request(&self, index: u64, max_tokens: usize) -> GenerateRequest {
        let key = mix64(self.seed ^ mix64(index));
        let vocab = self.vocab.max(1) as u64;
        let prompt = (0..self.prompt_tokens as u64).map(|k| (mix64(key.wrapping_add(k)) % vocab) as u32).collect();
        let mut r = GenerateRequest::new(prompt, max_tokens);
        // Lengths stay fixed: every request costs the same, whatever the random weights sample.
        r.ignore_eos = true;
        r.sampling = SamplingParams { temperature: self.temperature, seed: key, ..SamplingParams::default() };
        r
    }
}

/// N clients looping on one engine until stopped.
pub struct ClosedLoop {
    committed: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
    workers: Vec<JoinHandle<()>>,
}

impl ClosedLoop {
    pub fn start(engine: &Engine, clients: usize, shape: RequestShape) -> ClosedLoop {
        let committed = Arc::new(AtomicU64::new(0));
        let failure = Arc::new(Mutex::new(None));
        let workers = (0..clients)
            .map(|k| {
                let client = Client {
                    engine: engine.clone(),
                    k,
                    clients,
                    shape,
                    committed: committed.clone(),
                    failure: failure.clone(),
                };
                tokio::spawn(client.run())
            })
            .collect();
        ClosedLoop { committed, failure, workers }
    }

    /// Tokens committed to all clients so far.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Relaxed)
    }

    /// The first error any client saw (a client that fails stops, so the load is no
    /// longer N).
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Cancels every request in flight (dropping a stream cancels it) and waits until
    /// the engine holds none, so the next load starts on an empty engine.
    pub async fn stop(self, engine: &Engine, patience: Duration) -> Result<(), String> {
        for w in &self.workers {
            w.abort();
        }
        for w in self.workers {
            let _ = w.await;
        }
        let started = Instant::now();
        while engine.active_requests() > 0 {
            if started.elapsed() > patience {
                return Err(format!(
                    "{} requests still active {patience:?} after cancelling",
                    engine.active_requests()
                ));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }
}

struct Client {
    engine: Engine,
    k: usize,
    clients: usize,
    shape: RequestShape,
    committed: Arc<AtomicU64>,
    failure: Arc<Mutex<Option<String>>>,
}

impl Client {
    async fn run(self) {
        for round in 0u64.. {
            let index = round * self.clients as u64 + self.k as u64;
            // Fixed lengths would keep clients that start together in lockstep forever
            // (all prefilling at once, then all decoding); staggering the first
            // request spreads their phases evenly from the start.
            let max_tokens = match round {
                0 => (self.shape.output_tokens * (self.k + 1) / self.clients).max(1),
                _ => self.shape.output_tokens,
            };
            if let Err(message) = self.one(self.shape.request(index, max_tokens)).await {
                self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(message);
                return;
            }
        }
    }

    async fn one(&self, request: GenerateRequest) -> Result<(), String> {
        let mut stream = self.engine.generate(request).await.map_err(|e| e.to_string())?;
        while let Some(event) = stream.next().await {
            match event {
                GenerationEvent::Token { .. } => {
                    self.committed.fetch_add(1, Ordering::Relaxed);
                }
                GenerationEvent::Finished { .. } => return Ok(()),
                GenerationEvent::Error { message, .. } => return Err(message),
            }
        }
        Err("the event stream ended without a finish".into())
    }
}

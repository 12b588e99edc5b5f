//! The last minutes of the engine's stats, sampled on a timer, for the dashboard's
//! charts (`GET /v1/stats/history`): throughput, time to first token, KV use per model
//! (used / cached / free), the queue, ready and pending requests per model, restarts.
//! Sampled by the server rather than the page, so a page opened late still sees them.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use actix_web::{web, HttpResponse};
use serde::Serialize;
use tokenrouter_core::stats::Samples;

use super::generator::{EngineStats, Generator};
use super::state::AppState;

/// Seconds between samples.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(2);
/// Samples kept: ten minutes.
pub const SAMPLES_KEPT: usize = 300;

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Unix seconds.
    pub t: f64,
    pub active_requests: usize,
    /// Requests waiting for KV.
    pub waiting: usize,
    /// First tokens since the previous sample, and their median and worst time (ms).
    pub first_tokens: usize,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_max_ms: Option<f64>,
    pub models: Vec<ModelSample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ModelSample {
    pub model: String,
    /// Cumulative; the page turns differences into tokens/s.
    pub tokens_committed: u64,
    pub ready: usize,
    pub pending: usize,
    pub kv_used_blocks: usize,
    pub kv_cached_blocks: usize,
    pub kv_free_blocks: usize,
    pub kv_total_blocks: usize,
    pub restarts: u64,
}

/// A ring of samples.
#[derive(Debug, Default)]
pub struct StatsHistory {
    samples: Mutex<VecDeque<Sample>>,
}

impl StatsHistory {
    fn lock(&self) -> MutexGuard<'_, VecDeque<Sample>> {
        // A push or a copy cannot be left half done: a poisoned ring is still whole.
        self.samples.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn push(&self, sample: Sample) {
        let mut samples = self.lock();
        if samples.len() == SAMPLES_KEPT {
            samples.pop_front();
        }
        samples.push_back(sample);
    }

    pub fn samples(&self) -> Vec<Sample> {
        self.lock().iter().cloned().collect()
    }

    /// Takes a sample of `engine` now.
    pub async fn sample(&self, engine: &dyn Generator) {
        let stats = engine.stats().await;
        self.push(sample_of(&stats, engine.take_recent_ttfts(), unix_now()));
    }
}

/// Samples `state`'s engine every [`SAMPLE_INTERVAL`] until the server shuts down.
pub async fn sample_until_shutdown(state: AppState) {
    let mut tick = tokio::time::interval(SAMPLE_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !state.is_shutting_down() {
        tick.tick().await;
        state.history.sample(state.engine.as_ref()).await;
    }
}

pub async fn history(state: web::Data<AppState>) -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({
        "interval_s": SAMPLE_INTERVAL.as_secs_f64(),
        "samples": state.history.samples(),
    }))
}

/// `ttfts` in seconds. `first_tokens` counts every first token seen, so a reservoir's
/// cap will show as more first tokens than samples behind the p50.
fn sample_of(stats: &EngineStats, mut ttfts: Samples, t: f64) -> Sample {
    let ms = |s: f64| s * 1e3;
    Sample {
        t,
        active_requests: stats.active_requests,
        waiting: stats.kv.as_ref().map_or(0, |kv| kv.waiting),
        first_tokens: ttfts.seen() as usize,
        ttft_p50_ms: ttfts.median().map(ms),
        ttft_max_ms: ttfts.max().map(ms),
        models: stats
            .models
            .iter()
            .map(|m| ModelSample {
                model: m.model.clone(),
                tokens_committed: m.stats.tokens_committed,
                ready: m.ready,
                pending: m.pending,
                kv_used_blocks: m.kv.used_blocks,
                kv_cached_blocks: m.kv.cached_blocks,
                kv_free_blocks: m.kv.free_blocks,
                kv_total_blocks: m.kv.total_blocks,
                restarts: m.restarts,
            })
            .collect(),
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_ten_minutes_and_ttfts_summarize() {
        let history = StatsHistory::default();
        for i in 0..SAMPLES_KEPT + 5 {
            history.push(sample_of(&EngineStats::default(), Samples::from(vec![0.3f32, 0.1, 0.2]), i as f64));
        }
        let samples = history.samples();
        assert_eq!(samples.len(), SAMPLES_KEPT);
        assert_eq!(samples[0].t, 5.0);
        let last = samples.last().unwrap();
        assert_eq!(last.first_tokens, 3);
        assert!((last.ttft_p50_ms.unwrap() - 200.0).abs() < 1e-3 && (last.ttft_max_ms.unwrap() - 300.0).abs() < 1e-3);
        assert!(sample_of(&EngineStats::default(), Samples::new(), 0.0).ttft_p50_ms.is_none());
    }
}

//! What a soak test watches besides the requests: faults injected into the server
//! on a period (`--fault-every`), the server's memory (`--server-pid`), and what the
//! server still holds once the load has stopped (`--leak-check`). Watchers run
//! beside the load and are stopped when it ends; the leak check runs after.

pub mod faults;
pub mod leaks;
pub mod rss;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::client::Client;
use faults::{inject_faults, FaultTally};
use leaks::{check_leaks, LeakCheck};
use rss::{sample_rss, RssReport, SAMPLE_EVERY};

/// What to watch; empty when no soak flag was given.
#[derive(Debug, Clone, Default)]
pub struct SoakPlan {
    /// Inject a fault this often, into these models in turn.
    pub fault_every: Option<Duration>,
    pub fault_models: Vec<String>,
    pub server_pid: Option<u32>,
    /// Run the leak check, waiting at most this long for the server to be idle.
    pub leak_wait: Option<Duration>,
}

impl SoakPlan {
    pub fn is_empty(&self) -> bool {
        self.fault_every.is_none() && self.server_pid.is_none() && self.leak_wait.is_none()
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SoakReport {
    pub faults: Option<FaultTally>,
    pub rss: Option<RssReport>,
    pub leak_check: Option<LeakCheck>,
}

/// The watchers of a running soak.
pub struct Watchers {
    plan: SoakPlan,
    client: Arc<Client>,
    stop: watch::Sender<bool>,
    faults: Option<JoinHandle<FaultTally>>,
    rss: Option<JoinHandle<RssReport>>,
}

impl Watchers {
    /// Starts the fault injector and the memory sampler the plan asks for.
    pub fn start(plan: SoakPlan, client: Arc<Client>) -> Watchers {
        let (stop, stopped) = watch::channel(false);
        let faults = plan.fault_every.map(|every| {
            tokio::spawn(inject_faults(client.clone(), every, plan.fault_models.clone(), stopped.clone()))
        });
        let rss = plan.server_pid.map(|pid| tokio::spawn(sample_rss(pid, Instant::now(), SAMPLE_EVERY, stopped)));
        Watchers { plan, client, stop, faults, rss }
    }

    /// Stops the watchers, runs the leak check, and reports (None without a plan).
    pub async fn finish(self) -> Option<SoakReport> {
        self.stop.send_replace(true);
        if self.plan.is_empty() {
            return None;
        }
        let faults = match self.faults {
            Some(task) => task.await.ok(),
            None => None,
        };
        let rss = match self.rss {
            Some(task) => task.await.ok(),
            None => None,
        };
        let leak_check = match self.plan.leak_wait {
            Some(wait) => Some(check_leaks(&self.client, wait).await),
            None => None,
        };
        Some(SoakReport { faults, rss, leak_check })
    }
}

impl SoakReport {
    /// The lines printed after the summary.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Some(f) = &self.faults {
            out.push_str(&format!(
                "faults:     {} injected, {} refused (404: injection off), {} failed, of {} tried\n",
                f.injected, f.refused, f.errors, f.attempts
            ));
            if let Some(e) = &f.last_error {
                out.push_str(&format!("            last fault error: {e}\n"));
            }
        }
        if let Some(r) = &self.rss {
            out.push_str(&render_rss(r));
        }
        if let Some(l) = &self.leak_check {
            out.push_str(&render_leaks(l));
        }
        out
    }
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("n/a".to_string(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
}

fn render_rss(r: &RssReport) -> String {
    let growth = r.growth_pct.map_or("n/a".to_string(), |g| format!("{g:+.1}%"));
    let mut out = format!(
        "server RSS: {} after the first minute, {} at the end ({growth}; pid {}, {} samples)\n",
        mib(r.first_minute_kib),
        mib(r.last_minute_kib),
        r.pid,
        r.samples.len()
    );
    if let Some(e) = &r.error {
        out.push_str(&format!("            RSS sampling stopped: {e}\n"));
    }
    out
}

fn render_leaks(l: &LeakCheck) -> String {
    if let Some(e) = &l.error {
        return format!("leak check: could not read the stats: {e}\n");
    }
    let state = match (l.clean, l.idle) {
        (true, _) => "clean".to_string(),
        (false, true) => "LEFT OVER after the server went idle".to_string(),
        (false, false) => format!("LEFT OVER: the server was still busy after {:.1} s", l.waited_s),
    };
    let mut out = format!(
        "leak check: {state}: {} active request(s), {} KV reservation(s) ({} tokens), {} waiting\n",
        l.active_requests, l.reservations, l.reserved_tokens, l.waiting
    );
    for m in &l.models {
        out.push_str(&format!(
            "            {}: {} block(s) used, {} pending, {} ready\n",
            m.model, m.blocks_used, m.pending, m.ready
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use leaks::ModelLeftovers;

    #[test]
    fn the_soak_lines_name_every_number() {
        let mut faults = FaultTally::default();
        faults.record("a", "step", Ok(200));
        faults.record("b", "step", Ok(404));
        let rss = RssReport::new(
            9,
            vec![rss::RssSample { at_s: 60.0, kib: 1024 }, rss::RssSample { at_s: 120.0, kib: 2048 }],
            None,
        );
        let leak = LeakCheck {
            idle: true,
            waited_s: 0.2,
            active_requests: 0,
            reservations: 1,
            reserved_tokens: 16,
            waiting: 0,
            models: vec![ModelLeftovers { model: "small".into(), blocks_used: 2, pending: 1, ready: 0 }],
            clean: false,
            error: None,
        };
        let text = SoakReport { faults: Some(faults), rss: Some(rss), leak_check: Some(leak) }.render();
        assert!(text.contains("faults:     1 injected, 1 refused"), "{text}");
        assert!(text.contains("1.0 MiB after the first minute, 2.0 MiB at the end (+100.0%"), "{text}");
        assert!(
            text.contains("leak check: LEFT OVER after the server went idle: 0 active request(s), 1 KV reservation(s)")
        );
        assert!(text.contains("small: 2 block(s) used, 1 pending, 0 ready"), "{text}");
    }
}

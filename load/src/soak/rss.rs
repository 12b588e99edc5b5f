//! The server's resident memory over a soak, from `/proc/PID/status`: sampled at the
//! start, every minute, and at the end. Growth is measured from the sample after
//! the first minute (allocations of warm-up are done by then) to the last one.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::time::Instant;

pub const SAMPLE_EVERY: Duration = Duration::from_secs(60);

/// `VmRSS` of a `/proc/PID/status` text, in KiB.
pub fn vm_rss_kib(status: &str) -> Option<u64> {
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    let mut words = line.split_whitespace();
    let value: u64 = words.next()?.parse().ok()?;
    match words.next() {
        Some("kB") | None => Some(value),
        Some(_) => None,
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RssSample {
    /// Seconds since the run started.
    pub at_s: f64,
    pub kib: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RssReport {
    pub pid: u32,
    /// After the first minute (the first sample when the run was shorter).
    pub first_minute_kib: Option<u64>,
    /// The last sample, at the end of the run.
    pub last_minute_kib: Option<u64>,
    /// (last − first) / first, in percent.
    pub growth_pct: Option<f64>,
    pub samples: Vec<RssSample>,
    /// Why sampling stopped early (the process went away, no /proc).
    pub error: Option<String>,
}

impl RssReport {
    pub fn new(pid: u32, samples: Vec<RssSample>, error: Option<String>) -> RssReport {
        let minute = SAMPLE_EVERY.as_secs_f64();
        let first = samples.iter().find(|s| s.at_s >= minute).or(samples.first()).map(|s| s.kib);
        let last = samples.last().map(|s| s.kib);
        let growth_pct = match (first, last) {
            (Some(first), Some(last)) if first > 0 => Some((last as f64 - first as f64) / first as f64 * 100.0),
            _ => None,
        };
        RssReport { pid, first_minute_kib: first, last_minute_kib: last, growth_pct, samples, error }
    }
}

fn read_rss(pid: u32) -> Result<u64, String> {
    let path = format!("/proc/{pid}/status");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("reading {path}: {e}"))?;
    vm_rss_kib(&text).ok_or_else(|| format!("no VmRSS in {path}"))
}

/// Checks that the process can be read before the run starts.
pub fn check_pid(pid: u32) -> anyhow::Result<()> {
    read_rss(pid).map(|_| ()).map_err(|e| anyhow::anyhow!("--server-pid {pid}: {e}"))
}

/// Samples every `every` from `start` until `stop` turns true, then once more.
pub async fn sample_rss(pid: u32, start: Instant, every: Duration, mut stop: watch::Receiver<bool>) -> RssReport {
    let mut samples = Vec::new();
    let mut next = start;
    loop {
        let stopped = tokio::select! {
            _ = tokio::time::sleep_until(next) => false,
            _ = stop.wait_for(|stopped| *stopped) => true,
        };
        match read_rss(pid) {
            Ok(kib) => samples.push(RssSample { at_s: start.elapsed().as_secs_f64(), kib }),
            Err(e) => return RssReport::new(pid, samples, Some(e)),
        }
        if stopped {
            return RssReport::new(pid, samples, None);
        }
        next += every;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\ttokenrouter\nVmPeak:\t 2000000 kB\nVmRSS:\t  524288 kB\nRssAnon:\t  400000 kB\n";

    #[test]
    fn vm_rss_is_read_from_proc_status() {
        assert_eq!(vm_rss_kib(STATUS), Some(524_288));
        assert_eq!(vm_rss_kib("Name:\tx\n"), None);
        assert_eq!(vm_rss_kib("VmRSS:\t12 MB\n"), None, "an unknown unit is not guessed");
        let own = std::fs::read_to_string("/proc/self/status").unwrap();
        assert!(vm_rss_kib(&own).unwrap() > 0);
    }

    fn sample(at_s: f64, kib: u64) -> RssSample {
        RssSample { at_s, kib }
    }

    #[test]
    fn growth_runs_from_the_first_minute_to_the_end() {
        let samples = vec![sample(0.0, 100), sample(60.0, 1000), sample(120.0, 1050), sample(150.0, 1100)];
        let r = RssReport::new(7, samples, None);
        assert_eq!((r.first_minute_kib, r.last_minute_kib), (Some(1000), Some(1100)));
        assert!((r.growth_pct.unwrap() - 10.0).abs() < 1e-9);
        let short = RssReport::new(7, vec![sample(0.0, 200), sample(20.0, 150)], None);
        assert_eq!((short.first_minute_kib, short.growth_pct), (Some(200), Some(-25.0)));
        assert_eq!(RssReport::new(7, vec![], Some("gone".into())).growth_pct, None);
    }

    #[tokio::test]
    async fn sampling_our_own_process_takes_a_first_and_a_last_sample() {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(sample_rss(std::process::id(), Instant::now(), Duration::from_secs(3600), stopped));
        tokio::time::sleep(Duration::from_millis(50)).await;
        stop.send_replace(true);
        let report = task.await.unwrap();
        assert_eq!((report.samples.len(), report.error), (2, None));
        assert!(report.last_minute_kib.unwrap() > 0);
    }
}

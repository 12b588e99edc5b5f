//! The process-wide Prometheus recorder. The engine records through the `metrics`
//! facade, which accepts one global recorder per process, so installing is guarded
//! and every later call (another server, another test) gets the same handle.

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static RECORDER: OnceLock<Result<PrometheusHandle, String>> = OnceLock::new();

/// Latency buckets (seconds) so `_seconds` histograms are Prometheus histograms
/// (aggregatable across instances) rather than summaries.
const SECONDS_BUCKETS: &[f64] =
    &[0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

/// Installs the recorder on first call; later calls return the same handle. Fails
/// only if some other recorder was installed first.
pub fn install_metrics_recorder() -> anyhow::Result<PrometheusHandle> {
    RECORDER
        .get_or_init(|| {
            let handle = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), SECONDS_BUCKETS)
                .map_err(|e| e.to_string())?
                .install_recorder()
                .map_err(|e| e.to_string())?;
            // Without the builder's HTTP listener nothing runs upkeep (draining
            // histogram samples); `/metrics` also runs it before rendering.
            let upkeep = handle.clone();
            let spawned = std::thread::Builder::new().name("metrics-upkeep".into()).spawn(move || loop {
                std::thread::sleep(Duration::from_secs(5));
                upkeep.run_upkeep();
            });
            if let Err(e) = spawned {
                tracing::warn!(%e, "no metrics upkeep thread; /metrics still runs upkeep");
            }
            Ok(handle)
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("installing the Prometheus recorder: {e}"))
}

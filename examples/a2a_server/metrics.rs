//! The metrics recorder: the runtime's metrics (`idem::telemetry`) in the Prometheus text
//! format, served at `GET /metrics` by `front.rs`.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How often the recorder folds its histograms' samples (it keeps them until then).
const UPKEEP: Duration = Duration::from_secs(5);

/// Installs the process's recorder and its upkeep task.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    idem::telemetry::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(UPKEEP);
        loop {
            ticks.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

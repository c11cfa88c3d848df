//! The metrics recorder: the runtime's metrics (`idem::telemetry`) in the Prometheus text
//! format, served at `GET /metrics` by `front.rs`.

use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// How often the recorder folds its histograms' samples (it keeps them until then).
const UPKEEP: Duration = Duration::from_secs(5);

/// The buckets of every timing, in seconds: from a replay's claim (tens of microseconds) to a
/// wait on a stream (up to a minute). Buckets, not quantiles, so that the series of several
/// replicas add up.
const BUCKETS: [f64; 18] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0,
];

/// Installs the process's recorder and its upkeep task.
pub fn install() -> Result<PrometheusHandle, String> {
    let handle = PrometheusBuilder::new()
        .set_buckets(&BUCKETS)
        .map_err(|e| format!("cannot set the metrics' buckets: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    idem::telemetry::describe();
    metrics::describe_counter!(
        crate::tasks::STAGED,
        "Tasks staged by a call's body, committed or not"
    );
    metrics::counter!(crate::tasks::STAGED).absolute(0);
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

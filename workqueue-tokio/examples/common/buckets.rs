//! The histogram buckets of the queue's and the runner's metrics, by metric name: client-go's and
//! controller-runtime's, which an exporter (or a registry) should use for them. Shared by the
//! `prometheus` and `prometheus_client` examples.

use workqueue_core::metrics as queue_metrics;
use workqueue_tokio::runner::metrics as runner_metrics;

/// Each histogram's name and buckets.
pub const BUCKETS: [(&str, &[f64]); 4] = [
    (
        queue_metrics::QUEUE_DURATION_SECONDS,
        &queue_metrics::DURATION_BUCKETS,
    ),
    (
        queue_metrics::WORK_DURATION_SECONDS,
        &queue_metrics::DURATION_BUCKETS,
    ),
    (
        queue_metrics::RATE_LIMITER_DELAY_SECONDS,
        &queue_metrics::RATE_LIMITER_DELAY_BUCKETS,
    ),
    (
        runner_metrics::RECONCILE_TIME_SECONDS,
        &runner_metrics::RECONCILE_TIME_BUCKETS,
    ),
];

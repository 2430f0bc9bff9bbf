//! The `prometheus_client` example's bridge, end to end: after its controller ran, a
//! `prometheus-client` registry's text holds the queue's and the runner's metrics, under their
//! client-go and controller-runtime names and with their buckets, beside the application's own
//! metric. (Own test binary: it installs the global recorder.)
#![cfg(feature = "metrics")]

use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;
use workqueue_core::metrics as qm;
use workqueue_tokio::runner::metrics as rm;

#[allow(dead_code)]
#[path = "../examples/prometheus_client.rs"]
mod example;

/// The value of the sample `series` (name and labels, as encoded), if present.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let (s, v) = line.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_registry_holds_the_queue_and_runner_metrics() {
    let mut registry = Registry::default();
    let own = Counter::<u64>::default();
    registry.register("app_starts", "Times the application started", own.clone());
    own.inc();
    example::Bridge::install(&mut registry).expect("the first recorder of the process");

    let stop = CancellationToken::new();
    let controller = tokio::spawn(example::run_controller(stop.clone()));
    // Each of the five objects is reconciled at once; one fails and is retried after 5 ms. The
    // queue's counters reach the recorder in batches, at least every refresh period.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let ok = format!(
        r#"{}{{controller="example",result="requeue_after"}}"#,
        rm::RECONCILE_TOTAL
    );
    let adds = format!(
        r#"{}{{name="example",controller="example"}}"#,
        qm::ADDS_TOTAL
    );
    let body = loop {
        let mut body = String::new();
        encode(&mut body, &registry).expect("encodes");
        let done = sample(&body, &ok) >= Some(5.0) && sample(&body, &adds) >= Some(5.0);
        if done || tokio::time::Instant::now() > deadline {
            break body;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    stop.cancel();
    controller.await.unwrap();

    assert!(sample(&body, &ok) >= Some(5.0), "{ok} in\n{body}");
    // OpenMetrics: the counter's family without `_total`, its sample with it.
    let family = rm::RECONCILE_TOTAL.strip_suffix("_total").unwrap();
    assert!(
        body.contains(&format!("# TYPE {family} counter\n")),
        "{body}"
    );
    let errors = format!(r#"{}{{controller="example"}}"#, rm::RECONCILE_ERRORS_TOTAL);
    assert!(sample(&body, &errors) >= Some(1.0), "{errors} in\n{body}");
    assert!(sample(&body, &adds) >= Some(5.0), "{adds} in\n{body}");
    // controller-runtime's buckets, not the registry's defaults: each bound is a bucket.
    for le in rm::RECONCILE_TIME_BUCKETS {
        let bucket = format!(
            r#"{}_bucket{{le="{le:?}",controller="example"}}"#,
            rm::RECONCILE_TIME_SECONDS
        );
        assert!(sample(&body, &bucket).is_some(), "{bucket} in\n{body}");
    }
    assert_eq!(sample(&body, "app_starts_total"), Some(1.0), "{body}");
    assert!(body.ends_with("# EOF\n"), "{body}");
}

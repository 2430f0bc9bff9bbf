//! The `prometheus` example's code, end to end: the exporter serves `/metrics` on an ephemeral
//! loopback port, and a raw HTTP GET finds the queue's and the runner's metrics, with client-go's
//! and controller-runtime's buckets. (Own test binary: it installs the global recorder.)
#![cfg(feature = "metrics")]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;
use workqueue_core::metrics as qm;
use workqueue_tokio::runner::metrics as rm;

#[allow(dead_code)]
#[path = "../examples/prometheus.rs"]
mod example;

/// `GET /metrics` over a plain TCP connection; the body, for a 200.
fn fetch(addr: SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| std::io::Error::other("no header end"))?;
    if !head.starts_with("HTTP/1.0 200") && !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(format!("status: {head}")));
    }
    Ok(body.to_string())
}

/// The value of the sample `series` (name and labels, as rendered), if present.
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|line| {
        let (s, v) = line.rsplit_once(' ')?;
        (s == series).then(|| v.parse().ok()).flatten()
    })
}

fn lines_starting(body: &str, prefix: &str) -> usize {
    body.lines().filter(|l| l.starts_with(prefix)).count()
}

async fn scrape(addr: SocketAddr) -> String {
    tokio::task::spawn_blocking(move || fetch(addr))
        .await
        .unwrap()
        .expect("GET /metrics")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn example_serves_queue_and_runner_metrics_over_http() {
    let addr = example::install_exporter(0).expect("exporter");
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");
    let stop = CancellationToken::new();
    let controller = tokio::spawn(example::run_controller(stop.clone()));

    let ok = r#"controller_runtime_reconcile_total{controller="example",result="requeue_after"}"#;
    let started = Instant::now();
    let body = loop {
        if let Ok(body) = tokio::task::spawn_blocking(move || fetch(addr)).await.unwrap()
            && sample(&body, ok).is_some_and(|v| v >= 5.0)
            && body.contains("workqueue_queue_duration_seconds_bucket")
            // the refresher thread's first round (every 500 ms), which sends what the queue's
            // operations recorded since the last batch
            && body.contains(&format!("{}{{", qm::DEPTH))
        {
            break body;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "no metrics in time"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for name in [
        qm::DEPTH,
        qm::ADDS_TOTAL,
        qm::QUEUE_DURATION_SECONDS,
        qm::WORK_DURATION_SECONDS,
        qm::UNFINISHED_WORK_SECONDS,
        qm::LONGEST_RUNNING_PROCESSOR_SECONDS,
        qm::RETRIES_TOTAL,
        qm::WAITING_DEPTH,
        qm::RATE_LIMITER_DELAY_SECONDS,
        qm::OLDEST_READY_SECONDS,
        rm::RECONCILE_TOTAL,
        rm::RECONCILE_ERRORS_TOTAL,
        rm::RECONCILE_PANICS_TOTAL,
        rm::RECONCILE_TIMEOUTS_TOTAL,
        rm::RECONCILE_TIME_SECONDS,
        rm::ACTIVE_WORKERS,
        rm::MAX_CONCURRENT_RECONCILES,
    ] {
        assert!(
            body.contains(&format!("# TYPE {name} ")),
            "{name} missing:\n{body}"
        );
    }
    assert!(
        sample(
            &body,
            r#"workqueue_adds_total{name="example",controller="example"}"#
        )
        .unwrap()
            >= 5.0
    );
    assert!(
        sample(
            &body,
            r#"workqueue_retries_total{name="example",controller="example"}"#
        )
        .unwrap()
            >= 5.0
    );
    assert_eq!(
        sample(
            &body,
            r#"controller_runtime_max_concurrent_reconciles{controller="example"}"#
        ),
        Some(2.0)
    );
    // controller-runtime's 12 queue buckets and 40 reconcile buckets, each plus +Inf.
    let buckets =
        |name: &str, label: &str| lines_starting(&body, &format!("{name}_bucket{{{label}"));
    assert_eq!(buckets(qm::QUEUE_DURATION_SECONDS, r#"name="example""#), 13);
    assert_eq!(buckets(qm::WORK_DURATION_SECONDS, r#"name="example""#), 13);
    assert_eq!(
        buckets(rm::RECONCILE_TIME_SECONDS, r#"controller="example""#),
        41
    );

    // Once the controller has stopped, the figures agree with each other.
    stop.cancel();
    let report = controller.await.unwrap();
    let body = scrape(addr).await;
    let result = |r: &str| {
        sample(
            &body,
            &format!(r#"controller_runtime_reconcile_total{{controller="example",result="{r}"}}"#),
        )
        .unwrap_or(0.0)
    };
    let total: f64 = rm::RESULTS.iter().map(|r| result(r)).sum();
    assert_eq!(
        sample(
            &body,
            r#"controller_runtime_reconcile_time_seconds_count{controller="example"}"#
        ),
        Some(total)
    );
    assert_eq!(result("error") as u64, report.errors);
    assert_eq!(
        sample(
            &body,
            r#"controller_runtime_reconcile_errors_total{controller="example"}"#
        ),
        Some(report.errors as f64)
    );
    assert_eq!(
        sample(
            &body,
            r#"controller_runtime_active_workers{controller="example"}"#
        ),
        Some(0.0)
    );
}

#[test]
fn example_options() {
    use clap::Parser;
    let parse = |args: &[&str]| {
        example::Options::try_parse_from(std::iter::once("prometheus").chain(args.iter().copied()))
    };
    assert_eq!(
        parse(&["--port", "0", "--seconds", "3"]).unwrap(),
        example::Options {
            port: 0,
            seconds: Some(3)
        }
    );
    assert_eq!(parse(&[]).unwrap().port, 9000);
    assert!(parse(&["--port"]).is_err());
    assert!(parse(&["--bogus"]).is_err());
}

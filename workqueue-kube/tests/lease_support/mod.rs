//! What `replicas.rs` needs beside the public `Controller`: the Lease test constants, the
//! replicas' clocks and the Leases as the scripted API server stores them. The protocol's own
//! harness (replicas of the crate-private protocol, a ledger of their beliefs) is in
//! `src/lease/tests/support.rs`.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::SignedDuration;
use tokio::time::{Instant, sleep};
use workqueue_kube::lease::SkewedClock;

use workqueue_test_support::apiserver::ApiServer;

pub const NAMESPACE: &str = "default";
pub const CONTROLLER: &str = "ctl";

// `millis`: the name the Lease tests use.
pub use workqueue_test_support::fixtures::{ms as millis, secs};

/// The clocks of replicas r1, r2, ...: offsets of minutes either way, rates within 1%, the
/// fastest and the slowest first (the same as the protocol's own tests).
pub fn clock_of(index: usize) -> SkewedClock {
    const CLOCKS: [(i64, f64); 6] = [
        (300, 1.01),
        (-420, 0.99),
        (90, 1.005),
        (-45, 0.995),
        (1800, 1.0),
        (-1800, 1.008),
    ];
    let (offset, rate) = CLOCKS[index % CLOCKS.len()];
    SkewedClock::new(SignedDuration::from_secs(offset), rate)
}

/// The Leases of the controller, as stored now.
pub fn leases(server: &ApiServer) -> Vec<Lease> {
    server
        .all("leases.coordination.k8s.io")
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect()
}

/// The identity part of a Lease's holder (`None`: vacant; the holder is written
/// `{identity}_{instance}`).
pub fn holder_identity(lease: &Lease) -> Option<String> {
    let holder = lease.spec.as_ref()?.holder_identity.as_deref()?;
    let identity = holder.rsplit_once('_').map_or(holder, |(id, _)| id);
    (!identity.is_empty()).then(|| identity.to_string())
}

/// Waits (on tokio's clock) until `done` holds, checking every 100 ms; panics with `what`
/// after `limit`.
pub async fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) -> Duration {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        sleep(millis(100)).await;
    }
    start.elapsed()
}

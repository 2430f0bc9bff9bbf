//! What the end-to-end tests share (see `tests/`): they run `workqueue-kube`'s controllers
//! against a real kube-apiserver and etcd (`workqueue_test_support::control_plane`).
//!
//! Not published; built by the workspace, but its tests only with the `control-plane` feature.

pub mod child;
pub mod counting;
pub mod faults;
#[cfg(feature = "control-plane")]
pub mod outage;
pub mod replica;
pub mod running;
pub mod traffic;

use std::time::{Duration, Instant};

/// Waits (wall clock) until `done` returns true, checking every 200 ms; panics with `what`
/// after `limit`. Returns how long it took.
pub async fn until<F, Fut>(limit: Duration, what: &str, mut done: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "not within {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    start.elapsed()
}

//! What the tests of `workqueue-kube` share (a dev-only crate, never released):
//!
//! - [`apiserver`]: a scripted Kubernetes API server in memory, on tokio's clock, for tests on
//!   paused time (exact, fast, with faults on demand).
//! - [`fixtures`]: the small constructors every test file wrote again (`secs`, `ms`, `meta`, `cm`,
//!   `deployment`).
//! - `control_plane` (the `control-plane` feature): a real control plane, etcd and
//!   kube-apiserver processes, for the end-to-end tests.
//! - [`ledger`]: a ledger of runs (a reconcile, a replica's belief that it holds a shard), and
//!   the check that no subject was ever run by two holders at once; the check fails on a ledger
//!   that saw nothing, so that it can never pass by judging no runs.
//! - [`api_requests`]: the API server's own count of requests (`apiserver_request_total`), and
//!   [`figures`]: percentiles, reconcile lag, peak memory, for measurements on a real server.
//! - [`ledger_file`]: the same ledger written by several OS processes (one append-only file),
//!   read back as it grows.
//! - [`signal`]: signals to processes (SIGSTOP, SIGCONT, SIGTERM).
//!
//! It does not depend on `workqueue-kube`: a dev-dependency cycle would build two copies of its
//! types. What needs `workqueue-kube`'s types stays in its `tests/`.

pub mod api_requests;
pub mod apiserver;
#[cfg(feature = "control-plane")]
pub mod control_plane;
pub mod figures;
pub mod fixtures;
pub mod ledger;
pub mod ledger_file;
pub mod signal;

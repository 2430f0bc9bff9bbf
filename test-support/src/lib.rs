//! What the tests of `workqueue-kube` share (a dev-only crate, never released):
//!
//! - [`apiserver`]: a scripted Kubernetes API server in memory, on tokio's clock, for tests on
//!   paused time (exact, fast, with faults on demand).
//! - [`fixtures`]: the small constructors every test file wrote again (`secs`, `ms`, `meta`, `cm`).
//! - [`ledger`]: a ledger of runs (a reconcile, a replica's belief that it holds a shard), and
//!   the check that no subject was ever run by two holders at once; the check fails on a ledger
//!   that saw nothing, so that it can never pass by judging no runs.
//!
//! It does not depend on `workqueue-kube`: a dev-dependency cycle would build two copies of its
//! types. What needs `workqueue-kube`'s types stays in its `tests/`.

pub mod apiserver;
pub mod fixtures;
pub mod ledger;

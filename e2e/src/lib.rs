//! What the end-to-end tests share (see `tests/`): they run `workqueue-kube`'s controllers
//! against a real kube-apiserver and etcd (`workqueue_test_support::control_plane`).
//!
//! Not published; built by the workspace, but its tests only with the `control-plane` feature.

pub mod counting;

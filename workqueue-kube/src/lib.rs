//! kube-runtime's `Controller` on a work queue: client-go's retries, priorities and fairness for
//! kube-rs controllers, and replicas coordinated by Leases.
//!
//! - [`controller`]: [`Controller`] has kube-runtime's builder and signatures: a kube-runtime
//!   program moves over by changing its `use` lines (`workqueue_kube::controller::{Action,
//!   Config, Controller}` and `workqueue_kube::finalizer::{finalizer, Event}`), and gains
//!   per-key backoff, priorities, aging, fairness, outage-aware retries and controller-runtime's
//!   metrics; the module has the migration table and the guarantees.
//! - [`finalizer`](mod@finalizer): kube-runtime's finalizer helper with this crate's `Action`.
//! - [`lease`]: [`Controller::leases`] runs a controller as one of several replicas: leader
//!   election, or the objects divided into shards.
//! - [`sources`]: the stream stages beneath `Controller`, for a controller wired by hand on a
//!   [`workqueue_tokio`] runner: kube-rs watchers' events to keys with controller-runtime's
//!   priorities.
//!
//! The crate enables no Kubernetes version feature of `k8s-openapi`: the application picks one,
//! as kube-rs asks of libraries. `examples/counter/` (the counter controller) and
//! `examples/configmap_generator.rs` (a custom resource that owns ConfigMaps) are complete
//! controllers on `Controller` (a real cluster given a kubeconfig); their tests run them against a
//! scripted API server.

#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod controller;
pub mod finalizer;
pub mod lease;
pub mod sources;

pub use controller::{Config, Controller};
pub use finalizer::finalizer;

/// This crate's README, whose example compiles as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;

//! The protocol as a whole, driver included: replicas of [`ShardLeases`](super::ShardLeases)
//! in one process against one scripted API server, each on its own client and its own clock, on
//! tokio's paused clock. They drive the protocol's crate-private layer directly (what
//! `Controller::leases` builds on), so they live in the crate; the replicas of a whole
//! `Controller` are in `tests/replicas.rs`, the state machine alone in `state/tests.rs`.

mod chaos;
mod config;
mod election;
mod faults;
mod liveness;
mod shards;
mod support;

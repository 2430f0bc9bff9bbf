//! Pure, composable rate limiters for Kubernetes-style work queues.
//!
//! A [`RateLimiter`] answers one question: *how long must this key wait before it is retried?*
//! It is given `now` and never reads a clock, so limiters are plain values that are exact on
//! virtual time. The limiters are small types that compose:
//!
//! | type | behaviour |
//! |---|---|
//! | [`ExponentialFailure`] | per key: the `n`-th failure waits `base * 2^(n-1)`, capped at `max` |
//! | [`FastSlow`] | per key: `fast` for the first attempts, then `slow` |
//! | [`TokenBucket`] | one bucket for all keys, reservation semantics (every call takes a token) |
//! | [`MaxOf`], [`MaxPair`] | the longest delay of their children (any number / two, static) |
//! | [`MaxWait`] | caps another limiter's delay |
//! | [`Jitter`] | lengthens another limiter's delay by a deterministic random fraction |
//!
//! [`OutageDetector`] is not a limiter: it recognises a failure shared by many keys (an API
//! outage) from their outcomes, so that a queue can park failing keys and probe.
//!
//! [`default_controller_rate_limiter`] is client-go's default: the maximum of a per-key
//! exponential backoff (5 ms to 1000 s) and a 10 qps / burst 100 token bucket.
//! [`jittered_controller_rate_limiter`] adds jitter to its backoff.
//!
//! No parameters or inputs make a limiter panic or overflow: arithmetic saturates, and the only
//! invalid parameters (NaN or negative rates, jitter fractions out of range) are an
//! [`InvalidLimiter`] error at construction.
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use workqueue_ratelimit::{default_controller_rate_limiter, Instant, RateLimiter};
//!
//! let limiter: Arc<dyn RateLimiter<str>> = Arc::new(default_controller_rate_limiter::<String>());
//! let now = Instant::ZERO;
//! assert_eq!(limiter.when("ns/pod-a", now), Duration::from_millis(5));
//! assert_eq!(limiter.when("ns/pod-a", now), Duration::from_millis(10));
//! limiter.forget("ns/pod-a"); // after a success
//! assert_eq!(limiter.when("ns/pod-a", now), Duration::from_millis(5));
//! ```
// Feature badges on docs.rs (nightly, `--cfg docsrs`): `doc_cfg` labels items behind a feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod defaults;
mod error;
mod exponential;
mod failure_counts;
mod fast_slow;
mod instant;
mod jitter;
mod limiter;
mod max_of;
mod max_wait;
mod outage;
mod token_bucket;

pub use defaults::{
    DefaultControllerRateLimiter, JitteredControllerRateLimiter, default_controller_rate_limiter,
    default_item_based_rate_limiter, jittered_controller_rate_limiter,
};
pub use error::InvalidLimiter;
pub use exponential::ExponentialFailure;
pub use fast_slow::FastSlow;
pub use instant::Instant;
pub(crate) use instant::duration_to_nanos;
pub use jitter::Jitter;
pub use limiter::RateLimiter;
pub use max_of::{MaxOf, MaxPair};
pub use max_wait::MaxWait;
pub use outage::{OutageConfig, OutageDetector, Signal, Transition};
pub use token_bucket::TokenBucket;

/// This crate's README, whose examples run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct Readme;

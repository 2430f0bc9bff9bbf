//! Shared input types for the fuzz targets: durations and outcomes that libFuzzer can steer
//! towards the interesting values (colliding milliseconds, nanosecond ties, saturation edges).

use std::time::Duration;

use arbitrary::Arbitrary;
use workqueue_model::Outcome;

/// A delay, biased towards values that make deadlines collide or saturate.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum FDelay {
    /// A few milliseconds: deadlines collide.
    Ms(u8),
    /// A few nanoseconds: ties broken by a nanosecond.
    Nanos(u8),
    /// `Duration::ZERO`.
    Zero,
    /// `Duration::MAX`: "never".
    Max,
    /// `u64::MAX - n` nanoseconds: the saturation edge of the nanosecond timeline.
    NearNever(u8),
    /// Any nanosecond count.
    RawNanos(u64),
    /// Any duration, including ones beyond `u64` nanoseconds.
    Full(u64, u32),
}

impl FDelay {
    /// The duration.
    pub fn get(self) -> Duration {
        match self {
            FDelay::Ms(n) => Duration::from_millis(u64::from(n % 16)),
            FDelay::Nanos(n) => Duration::from_nanos(u64::from(n % 4)),
            FDelay::Zero => Duration::ZERO,
            FDelay::Max => Duration::MAX,
            FDelay::NearNever(n) => Duration::from_nanos(u64::MAX - u64::from(n)),
            FDelay::RawNanos(n) => Duration::from_nanos(n),
            FDelay::Full(s, n) => Duration::new(s, n % 1_000_000_000),
        }
    }
}

/// Every [`Outcome`] variant.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum FOutcome {
    /// [`Outcome::Done`].
    Done,
    /// [`Outcome::Forget`].
    Forget,
    /// [`Outcome::Retry`].
    Retry,
    /// [`Outcome::RetryAfter`].
    RetryAfter(FDelay),
    /// [`Outcome::RequeueAfter`].
    RequeueAfter(FDelay),
}

impl FOutcome {
    /// The outcome.
    pub fn get(self) -> Outcome {
        match self {
            FOutcome::Done => Outcome::Done,
            FOutcome::Forget => Outcome::Forget,
            FOutcome::Retry => Outcome::Retry,
            FOutcome::RetryAfter(d) => Outcome::RetryAfter(d.get()),
            FOutcome::RequeueAfter(d) => Outcome::RequeueAfter(d.get()),
        }
    }
}

//! Construction errors.

/// A limiter was asked to be built from parameters that have no sensible meaning.
///
/// Only parameters given as floats can be invalid: every [`Duration`](std::time::Duration) and
/// integer is accepted (durations are capped, counts saturate). Each message says what to change.
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidLimiter {
    /// The token bucket's rate is NaN or negative.
    #[error(
        "token bucket rate must be a number of events per second >= 0, got {0}; \
         use f64::INFINITY for no limit"
    )]
    Rate(f64),

    /// The token bucket has a finite rate but no room for a single token.
    #[error(
        "token bucket burst must be at least 1 for a finite rate (qps = {qps}); \
         use qps = f64::INFINITY for no limit"
    )]
    ZeroBurst {
        /// The finite rate that was asked for.
        qps: f64,
    },

    /// The jitter fraction is NaN, negative, infinite or larger than [`Jitter::MAX_FRACTION`].
    ///
    /// [`Jitter::MAX_FRACTION`]: crate::Jitter::MAX_FRACTION
    #[error(
        "jitter fraction must be in [0, 10], got {0}; \
         e.g. 0.1 lengthens each delay by up to 10%, 1.0 by up to 100%"
    )]
    JitterFraction(f64),
}

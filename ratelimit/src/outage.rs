//! The outage detector: a pure state machine that recognises a failure shared by many keys
//! (see [`OutageDetector`]).

use std::time::Duration;

use crate::{Instant, duration_to_nanos};

/// What one finished key says about the shared dependency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Signal {
    /// The key was processed successfully.
    Success,
    /// The key failed, and had not failed since its last success: its failure count went from 0
    /// to 1. The only failures the window counts.
    FirstFailure,
    /// The key failed again (it had failed before without a success since).
    Failure,
    /// Says nothing about the shared dependency: a failure the user classified as per-object
    /// (an invalid spec, a 4xx that is not 429), or an outcome that is neither a success nor a
    /// failure. Ignored.
    Ignored,
}

impl Signal {
    /// Whether this is a failure ([`FirstFailure`](Signal::FirstFailure) or
    /// [`Failure`](Signal::Failure)).
    pub fn is_failure(self) -> bool {
        matches!(self, Signal::FirstFailure | Signal::Failure)
    }
}

/// What a call changed in the detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Transition {
    /// Nothing.
    None,
    /// The detector opened: failures are widespread.
    Opened,
    /// A probe failed while open: the next one is due `next` after it.
    ProbeFailed {
        /// The probe interval from now on.
        next: Duration,
    },
    /// A probe succeeded: the detector closed after being open for `lasted`.
    Closed {
        /// How long the detector was open.
        lasted: Duration,
    },
}

/// The [`OutageDetector`]'s parameters.
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::OutageConfig;
///
/// // Probe more often than the default, and require more first failures to open.
/// let config = OutageConfig::default()
///     .with_probe_max(Duration::from_secs(2))
///     .with_min_first_failures(20);
/// assert_eq!(config.probe_initial(), Duration::from_secs(1));
/// assert_eq!(config.min_first_failures(), 20);
/// ```
///
/// The defaults, and why (the storm demo, `workqueue-tokio/examples/storm.rs`, measures them):
///
/// | parameter | default | why |
/// |---|---:|---|
/// | `window` | 30 s | long enough to see a burst of first failures together, short enough that the first failures of a slow trickle of broken objects age out |
/// | `min_first_failures` | 5 | a handful of keys failing for their own reasons never opens it by themselves |
/// | `ratio` | 0.5 | first failures at least as many as successes: with 5 % of objects failing for their own reasons the window sees about 5 % |
/// | `probe_initial` | 1 s | the first probe follows the opening quickly, for blips |
/// | `probe_max` | 5 s | the probe finds the recovery within 5 s; releasing 200 keys through a 10 qps / burst 100 bucket takes 10 s more, so all converge in about 15 s (the target is 20 s), while an outage costs one request per 5 s |
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutageConfig {
    window: Duration,
    min_first_failures: u32,
    ratio: f64,
    probe_initial: Duration,
    probe_max: Duration,
}

impl Default for OutageConfig {
    fn default() -> Self {
        OutageConfig {
            window: Duration::from_secs(30),
            min_first_failures: 5,
            ratio: 0.5,
            probe_initial: Duration::from_secs(1),
            probe_max: Duration::from_secs(5),
        }
    }
}

impl OutageConfig {
    /// The sliding window first failures and successes are counted in (at least 10 ns; it is
    /// kept as 10 buckets of a tenth of it).
    #[must_use]
    pub fn with_window(mut self, window: Duration) -> Self {
        self.window = window.max(Duration::from_nanos(BUCKETS as u64));
        self
    }

    /// The fewest first failures in the window that open the detector (at least 1).
    #[must_use]
    pub fn with_min_first_failures(mut self, n: u32) -> Self {
        self.min_first_failures = n.max(1);
        self
    }

    /// The share of first failures among first failures and successes in the window that opens
    /// the detector, in `(0, 1]`; out-of-range values (and NaN) are clamped to that range (NaN
    /// to 1).
    #[must_use]
    pub fn with_ratio(mut self, ratio: f64) -> Self {
        self.ratio = if ratio.is_nan() {
            1.0
        } else {
            ratio.clamp(f64::MIN_POSITIVE, 1.0)
        };
        self
    }

    /// The first probe interval after the detector opens (at least 1 ns).
    #[must_use]
    pub fn with_probe_initial(mut self, d: Duration) -> Self {
        self.probe_initial = d.max(Duration::from_nanos(1));
        self.probe_max = self.probe_max.max(self.probe_initial);
        self
    }

    /// The cap of the probe interval, which doubles after each failed probe (at least
    /// `probe_initial`).
    #[must_use]
    pub fn with_probe_max(mut self, d: Duration) -> Self {
        self.probe_max = d.max(self.probe_initial);
        self
    }

    /// The sliding window.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// The fewest first failures that open the detector.
    pub fn min_first_failures(&self) -> u32 {
        self.min_first_failures
    }

    /// The share of first failures that opens the detector.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The first probe interval.
    pub fn probe_initial(&self) -> Duration {
        self.probe_initial
    }

    /// The probe interval's cap.
    pub fn probe_max(&self) -> Duration {
        self.probe_max
    }
}

const BUCKETS: usize = 10;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Bucket {
    epoch: u64,
    first_failures: u32,
    successes: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Open {
    since: u64,
    interval: Duration,
}

/// The outage detector: a pure state machine that recognises a failure shared by many keys.
///
/// Per-key backoff cannot tell that every key fails for one shared reason (the API server is
/// down). The detector sees every key's outcome, as a [`Signal`], and the time, and decides:
///
/// - **Closed** (normal): it counts *first failures* (a key whose failure count goes from 0 to 1)
///   and successes in a sliding window. Failures of keys that already failed are not counted:
///   with a few objects failing for their own reasons in a quiet steady state, a ratio of all
///   failures would reach 100 %, while their first failures age out of the window.
/// - **Open**: once the window holds at least [`OutageConfig::min_first_failures`] first
///   failures and they are at least [`OutageConfig::ratio`] of the window's first failures and
///   successes together. The queue then parks failing keys and lets one probe through at a time,
///   [`OutageDetector::probe_interval`] apart, an interval that doubles after each failed probe
///   up to [`OutageConfig::probe_max`].
/// - It closes only when a **probe** succeeds ([`OutageDetector::probe`]): the success of an
///   unrelated key is no proof that the shared dependency is back, so a partial outage does not
///   make it flap. Closing clears the window.
///
/// ```
/// use std::time::Duration;
/// use workqueue_ratelimit::{Instant, OutageConfig, OutageDetector, Signal, Transition};
///
/// let mut d = OutageDetector::new(OutageConfig::default());
/// let t = Instant::from_nanos(1_000_000_000);
/// for _ in 0..4 {
///     assert_eq!(d.record(Signal::FirstFailure, t), Transition::None);
/// }
/// assert_eq!(d.record(Signal::FirstFailure, t), Transition::Opened);
/// assert_eq!(d.probe_interval(), Some(Duration::from_secs(1)));
/// // Another key's success does not close it; a failed probe backs the probes off.
/// assert_eq!(d.record(Signal::Success, t), Transition::None);
/// assert_eq!(d.probe(false, t), Transition::ProbeFailed { next: Duration::from_secs(2) });
/// // A probe that succeeds closes it.
/// let later = Instant::from_nanos(61_000_000_000);
/// assert_eq!(d.probe(true, later), Transition::Closed { lasted: Duration::from_secs(60) });
/// assert!(!d.is_open());
/// ```
///
/// Pure: it never reads a clock, and times that go backwards are clamped to the latest one seen.
#[derive(Debug, Clone)]
pub struct OutageDetector {
    config: OutageConfig,
    buckets: [Bucket; BUCKETS],
    open: Option<Open>,
    now: u64,
    openings: u64,
}

impl OutageDetector {
    /// A closed detector with an empty window.
    pub fn new(config: OutageConfig) -> Self {
        OutageDetector {
            config,
            buckets: [Bucket::default(); BUCKETS],
            open: None,
            now: 0,
            openings: 0,
        }
    }

    /// The parameters.
    pub fn config(&self) -> &OutageConfig {
        &self.config
    }

    /// Whether the detector is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
    }

    /// Since when the detector is open.
    pub fn open_since(&self) -> Option<Instant> {
        self.open.map(|o| Instant::from_nanos(o.since))
    }

    /// The current probe interval while open; `None` while closed.
    pub fn probe_interval(&self) -> Option<Duration> {
        self.open.map(|o| o.interval)
    }

    /// How many times the detector opened.
    pub fn openings(&self) -> u64 {
        self.openings
    }

    /// The first failures and successes in the window at the latest time seen.
    pub fn window_counts(&self) -> (u32, u32) {
        let epoch = self.epoch(self.now);
        self.buckets
            .iter()
            .filter(|b| b.epoch.saturating_add(BUCKETS as u64) > epoch && b.epoch <= epoch)
            .fold((0u32, 0u32), |(f, s), b| {
                (
                    f.saturating_add(b.first_failures),
                    s.saturating_add(b.successes),
                )
            })
    }

    /// Records the outcome of a key that was not a probe. Only a first failure can open the
    /// detector; nothing here closes it.
    pub fn record(&mut self, signal: Signal, now: Instant) -> Transition {
        self.advance(now);
        match signal {
            Signal::Success => self.count(false),
            Signal::FirstFailure => self.count(true),
            Signal::Failure | Signal::Ignored => return Transition::None,
        }
        if self.open.is_some() || signal != Signal::FirstFailure {
            return Transition::None;
        }
        let (failures, successes) = self.window_counts();
        let total = f64::from(failures) + f64::from(successes);
        if failures >= self.config.min_first_failures
            && f64::from(failures) >= self.config.ratio * total
        {
            self.open = Some(Open {
                since: self.now,
                interval: self.config.probe_initial,
            });
            self.openings += 1;
            return Transition::Opened;
        }
        Transition::None
    }

    /// Records the result of a probe (a reconcile of a parked key while open): a success closes
    /// the detector and clears its window; a failure doubles the probe interval up to its cap.
    /// Ignored while closed.
    pub fn probe(&mut self, success: bool, now: Instant) -> Transition {
        self.advance(now);
        let Some(open) = &mut self.open else {
            return Transition::None;
        };
        if success {
            let lasted = Duration::from_nanos(self.now - open.since);
            self.open = None;
            self.buckets = [Bucket::default(); BUCKETS];
            return Transition::Closed { lasted };
        }
        open.interval = open.interval.saturating_mul(2).min(self.config.probe_max);
        Transition::ProbeFailed {
            next: open.interval,
        }
    }

    fn advance(&mut self, now: Instant) {
        self.now = self.now.max(now.as_nanos());
    }

    fn epoch(&self, now: u64) -> u64 {
        let width = (duration_to_nanos(self.config.window) / BUCKETS as u64).max(1);
        now / width
    }

    fn count(&mut self, first_failure: bool) {
        let epoch = self.epoch(self.now);
        let bucket = &mut self.buckets[(epoch % BUCKETS as u64) as usize];
        if bucket.epoch != epoch {
            *bucket = Bucket {
                epoch,
                ..Bucket::default()
            };
        }
        match first_failure {
            true => bucket.first_failures = bucket.first_failures.saturating_add(1),
            false => bucket.successes = bucket.successes.saturating_add(1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn at(secs: u64) -> Instant {
        Instant::from_nanos(secs * S)
    }

    /// A reference model: the window as a plain list of timestamped events.
    #[derive(Debug, Default)]
    struct Model {
        events: Vec<(u64, bool)>,
        open: Option<(u64, Duration)>,
        now: u64,
    }

    impl Model {
        fn counts(&self, c: &OutageConfig) -> (u32, u32) {
            let width = (duration_to_nanos(c.window) / BUCKETS as u64).max(1);
            let epoch = self.now / width;
            let live = |&&(t, _): &&(u64, bool)| t / width + BUCKETS as u64 > epoch;
            let f = self.events.iter().filter(live).filter(|e| e.1).count() as u32;
            let s = self.events.iter().filter(live).filter(|e| !e.1).count() as u32;
            (f, s)
        }
    }

    /// Every sequence of up to 4 steps over {success, first failure, failure, ignored, probe ok,
    /// probe failed} at times from {0, 1, 3, 31, 62} s (non-decreasing), with small parameters,
    /// against the reference model.
    #[test]
    fn exhaustive_small_sequences_match_the_model() {
        let config = OutageConfig::default()
            .with_window(Duration::from_secs(30))
            .with_min_first_failures(2)
            .with_ratio(0.5)
            .with_probe_initial(Duration::from_secs(1))
            .with_probe_max(Duration::from_secs(4));
        let times = [0u64, 1, 3, 31, 62];
        let steps = 4u32;
        let alphabet = 6 * times.len();
        let mut cases = 0u64;
        let mut opened = 0u64;
        let mut closed = 0u64;
        for len in 0..=steps {
            let n = alphabet.pow(len);
            for mut code in 0..n {
                let mut d = OutageDetector::new(config);
                let mut m = Model::default();
                let mut t_prev = 0;
                for _ in 0..len {
                    let sym = code % alphabet;
                    code /= alphabet;
                    let (op, t) = (sym % 6, times[sym / 6].max(t_prev));
                    t_prev = t;
                    m.now = m.now.max(t * S);
                    let now = at(t);
                    let got = match op {
                        0..=3 => {
                            let signal = [
                                Signal::Success,
                                Signal::FirstFailure,
                                Signal::Failure,
                                Signal::Ignored,
                            ][op];
                            d.record(signal, now)
                        }
                        _ => d.probe(op == 4, now),
                    };
                    // The model.
                    let expected = match op {
                        0 | 1 => {
                            m.events.push((m.now, op == 1));
                            let (f, s) = m.counts(&config);
                            if m.open.is_none()
                                && op == 1
                                && f >= 2
                                && f64::from(f) >= 0.5 * f64::from(f + s)
                            {
                                m.open = Some((m.now, Duration::from_secs(1)));
                                Transition::Opened
                            } else {
                                Transition::None
                            }
                        }
                        2 | 3 => Transition::None,
                        4 => match m.open.take() {
                            Some((since, _)) => {
                                m.events.clear();
                                Transition::Closed {
                                    lasted: Duration::from_nanos(m.now - since),
                                }
                            }
                            None => Transition::None,
                        },
                        _ => match &mut m.open {
                            Some((_, interval)) => {
                                *interval = (*interval * 2).min(Duration::from_secs(4));
                                Transition::ProbeFailed { next: *interval }
                            }
                            None => Transition::None,
                        },
                    };
                    assert_eq!(got, expected, "op {op} at {t} s");
                    assert_eq!(d.is_open(), m.open.is_some());
                    assert_eq!(d.probe_interval(), m.open.map(|o| o.1));
                    assert_eq!(d.window_counts(), m.counts(&config));
                    opened += u64::from(got == Transition::Opened);
                    closed += u64::from(matches!(got, Transition::Closed { .. }));
                }
                cases += 1;
            }
        }
        assert_eq!(cases, (0..=4).map(|l| 30u64.pow(l)).sum::<u64>());
        assert!(opened > 0 && closed > 0);
    }

    #[test]
    fn per_object_errors_only_never_open() {
        let mut d = OutageDetector::new(OutageConfig::default());
        for i in 0..10_000 {
            assert_eq!(d.record(Signal::Ignored, at(i)), Transition::None);
            assert_eq!(d.record(Signal::Failure, at(i)), Transition::None);
        }
        assert_eq!(d.openings(), 0);
    }

    #[test]
    fn five_percent_failing_objects_never_open() {
        // 200 objects, every 20th failing for its own reasons, processed in order, then its
        // failures repeat (never first again) while the others keep succeeding.
        let mut d = OutageDetector::new(OutageConfig::default());
        for round in 0..100u64 {
            for object in 0..200u64 {
                let signal = match (object % 20 == 0, round) {
                    (true, 0) => Signal::FirstFailure,
                    (true, _) => Signal::Failure,
                    (false, _) => Signal::Success,
                };
                assert_eq!(d.record(signal, at(round * 10)), Transition::None);
            }
        }
    }

    #[test]
    fn reopens_after_a_close_and_probes_back_off_to_the_cap() {
        let mut d = OutageDetector::new(OutageConfig::default());
        for round in 0..3 {
            let t = at(100 * round);
            let mut last = Transition::None;
            for _ in 0..5 {
                last = d.record(Signal::FirstFailure, t);
            }
            assert_eq!(last, Transition::Opened);
            let intervals: Vec<_> = (0..5)
                .map(|_| match d.probe(false, t) {
                    Transition::ProbeFailed { next } => next.as_secs(),
                    other => panic!("{other:?}"),
                })
                .collect();
            assert_eq!(intervals, [2, 4, 5, 5, 5]);
            assert!(matches!(d.probe(true, t), Transition::Closed { .. }));
            assert_eq!(d.window_counts(), (0, 0));
        }
        assert_eq!(d.openings(), 3);
    }

    /// Found by the fuzzer: a window of a few nanoseconds at the end of time overflowed.
    #[test]
    fn extreme_times_and_tiny_windows_do_not_overflow() {
        let config = OutageConfig::default()
            .with_window(Duration::ZERO)
            .with_min_first_failures(1)
            .with_probe_initial(Duration::MAX)
            .with_probe_max(Duration::MAX);
        let mut d = OutageDetector::new(config);
        for t in [0, 1, u64::MAX / 2, u64::MAX - 1, u64::MAX] {
            let now = Instant::from_nanos(t);
            d.record(Signal::Success, now);
            d.record(Signal::FirstFailure, now);
            d.probe(false, now);
            d.probe(false, now);
            d.window_counts();
        }
        assert!(matches!(
            d.probe(true, Instant::from_nanos(u64::MAX)),
            Transition::Closed { .. }
        ));
    }

    #[test]
    fn parameters_are_clamped() {
        let c = OutageConfig::default()
            .with_window(Duration::ZERO)
            .with_min_first_failures(0)
            .with_ratio(f64::NAN)
            .with_probe_max(Duration::ZERO)
            .with_probe_initial(Duration::ZERO);
        assert_eq!(c.window(), Duration::from_nanos(10));
        assert_eq!(c.min_first_failures(), 1);
        assert_eq!(c.ratio(), 1.0);
        assert!(c.probe_max() >= c.probe_initial());
        assert_eq!(
            OutageConfig::default().with_ratio(-1.0).ratio(),
            f64::MIN_POSITIVE
        );
    }
}

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
    /// The key failed again (it had failed before without a success since). Not counted, but
    /// while the detector is closed it looks at the window again (its older successes may have
    /// aged out).
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
/// The detector opens when, for some `j` from 1 to 10, the first failures of the last `j` tenths
/// of the `window` number at least `min_first_failures` and at least `ratio` of themselves plus
/// the successes of the last `j + 1` tenths (see [`OutageDetector`] for the exact rule).
///
/// The defaults, and why (the storm demo, `workqueue-tokio/examples/storm.rs`, measures them):
///
/// | parameter | default | why |
/// |---|---:|---|
/// | `window` | 30 s | long enough to see a burst of first failures together, short enough that the first failures of a slow trickle of broken objects age out (fewer than 5 in any 30 s never open it), and that successes older than that no longer hide an outage |
/// | `min_first_failures` | 5 | a handful of keys failing for their own reasons never opens it by themselves |
/// | `ratio` | 0.5 | first failures at least as many as successes: with 5 % of objects failing for their own reasons any stretch of the window sees about 5 %, and a handful failing together among steady successes is outnumbered by the successes of the tenth before them |
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

    /// The fewest first failures (in the last tenths of the window the rule looks at) that open
    /// the detector (at least 1).
    #[must_use]
    pub fn with_min_first_failures(mut self, n: u32) -> Self {
        self.min_first_failures = n.max(1);
        self
    }

    /// The share of first failures among first failures and successes (in the last tenths of
    /// the window the rule looks at) that opens the detector, in `(0, 1]`; out-of-range values
    /// (and NaN) are clamped to that range (NaN to 1).
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
///   and successes in a sliding window of ten tenths ([`OutageConfig::window`] / 10 each, aligned
///   to multiples of that width since time zero; the current tenth is the one `now` falls in).
///   Failures of keys that already failed are not counted: with a few objects failing for their
///   own reasons in a quiet steady state, a ratio of all failures would reach 100 %, while their
///   first failures age out of the window.
/// - **Open**: a failure (first or not) while closed opens it if, for some `j` from 1 to 10, the
///   first failures `F` of the last `j` tenths (the current one included) and the successes `S`
///   of the last `j + 1` tenths (those in the window: for `j` = 10, the whole window) satisfy
///   `F >= min_first_failures` and `F >= ratio * (F + S)`
///   ([`OutageConfig::min_first_failures`], [`OutageConfig::ratio`]). The queue then parks
///   failing keys and lets one probe through at a time, [`OutageDetector::probe_interval`]
///   apart, an interval that doubles after each failed probe up to [`OutageConfig::probe_max`].
/// - It closes only when a **probe** succeeds ([`OutageDetector::probe`]): the success of an
///   unrelated key is no proof that the shared dependency is back, so a partial outage does not
///   make it flap. Closing clears the window.
///
/// Why the opening rule looks as it does:
/// - It looks at every recent stretch of the window, not only the whole of it: successes from
///   before the failures began (a burst of reconciles that converged seconds before the API
///   server went away) do not hide a widespread failure now.
/// - It counts the successes of one tenth more than the first failures: a handful of keys
///   failing together among steady successes is weighed against the successes just before
///   them, and does not open it, wherever in a tenth it lands.
/// - A retry looks again: the window's older successes age out while the first failures of its
///   later tenths stay.
/// - Its limit: successes in the same tenth as the first failures, or in the tenth before,
///   hide them if they outnumber them (at the default ratio). The detector opens only once
///   those successes have left the window and a retry comes; if they share a tenth with the
///   first failures, they leave together and it does not open.
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
/// Successes from before the failures began do not hide them:
///
/// ```
/// use workqueue_ratelimit::{Instant, OutageConfig, OutageDetector, Signal, Transition};
///
/// let secs = |s: u64| Instant::from_nanos(s * 1_000_000_000);
/// let mut d = OutageDetector::new(OutageConfig::default());
/// // 200 objects converge: 400 successes (each object's reconcile, and the no-op reconcile its
/// // own write queued).
/// for _ in 0..400 {
///     d.record(Signal::Success, secs(10));
/// }
/// // 15 s later every reconcile fails: 5 first failures against the 400 successes of the
/// // window, but against none in the last two tenths (6 s).
/// for _ in 0..4 {
///     assert_eq!(d.record(Signal::FirstFailure, secs(25)), Transition::None);
/// }
/// assert_eq!(d.record(Signal::FirstFailure, secs(25)), Transition::Opened);
/// assert_eq!(d.window_counts(), (5, 400));
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
    /// The tenth in which the last look found failures not widespread, until a first failure
    /// comes: a failure in that tenth need not look again, since only a first failure or the
    /// window moving on can change the verdict (a success only makes failures less widespread).
    quiet_epoch: Option<u64>,
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
            quiet_epoch: None,
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

    /// Records the outcome of a key that was not a probe. Only a failure (first or not) can open
    /// the detector, by the rule above; nothing here closes it.
    pub fn record(&mut self, signal: Signal, now: Instant) -> Transition {
        self.advance(now);
        match signal {
            Signal::Success => self.count(false),
            Signal::FirstFailure => {
                self.count(true);
                self.quiet_epoch = None;
            }
            Signal::Failure => {}
            Signal::Ignored => return Transition::None,
        }
        if self.open.is_some() || !signal.is_failure() {
            return Transition::None;
        }
        let epoch = self.epoch(self.now);
        if self.quiet_epoch == Some(epoch) {
            return Transition::None;
        }
        if !self.widespread(epoch) {
            self.quiet_epoch = Some(epoch);
            return Transition::None;
        }
        self.open = Some(Open {
            since: self.now,
            interval: self.config.probe_initial,
        });
        self.openings += 1;
        Transition::Opened
    }

    /// The opening rule: whether, for some `j` in `1..=BUCKETS`, the first failures of the last
    /// `j` buckets are at least `min_first_failures` and at least `ratio` of themselves plus the
    /// successes of the last `j + 1` buckets within the window.
    fn widespread(&self, epoch: u64) -> bool {
        // The live buckets' counts, newest first; the last entry, the tenth before the window,
        // stays empty.
        let mut live = [(0u64, 0u64); BUCKETS + 1];
        let mut first_failures = 0;
        for (age, counts) in live.iter_mut().take(BUCKETS).enumerate() {
            let Some(e) = epoch.checked_sub(age as u64) else {
                break;
            };
            let b = &self.buckets[(e % BUCKETS as u64) as usize];
            if b.epoch == e {
                *counts = (u64::from(b.first_failures), u64::from(b.successes));
                first_failures += counts.0;
            }
        }
        let min = u64::from(self.config.min_first_failures);
        if first_failures < min {
            return false; // no stretch of the window holds enough
        }
        let (mut failures, mut successes) = (0u64, live[0].1);
        for j in 1..=BUCKETS {
            failures += live[j - 1].0;
            successes += live[j].1;
            // Exact in f64: each count is below 2^32, the sums below 2^36.
            if failures >= min
                && failures as f64 >= self.config.ratio * (failures + successes) as f64
            {
                return true;
            }
        }
        false
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
            self.quiet_epoch = None;
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

    /// A reference model: the window as a plain list of timestamped events, and the opening rule
    /// as its documentation states it.
    #[derive(Debug, Default)]
    struct Model {
        events: Vec<(u64, bool)>,
        open: Option<(u64, Duration)>,
        now: u64,
    }

    impl Model {
        /// How many tenths of the window ago `t` was (0: the current one).
        fn age(&self, c: &OutageConfig, t: u64) -> u64 {
            let width = (duration_to_nanos(c.window) / BUCKETS as u64).max(1);
            self.now / width - t / width
        }

        /// The first failures and the successes of the last `tenths` tenths of the window.
        fn counts_of_last(&self, c: &OutageConfig, tenths: u64) -> (u32, u32) {
            let tenths = tenths.min(BUCKETS as u64);
            let live = |&&(t, _): &&(u64, bool)| self.age(c, t) < tenths;
            let f = self.events.iter().filter(live).filter(|e| e.1).count() as u32;
            let s = self.events.iter().filter(live).filter(|e| !e.1).count() as u32;
            (f, s)
        }

        fn counts(&self, c: &OutageConfig) -> (u32, u32) {
            self.counts_of_last(c, BUCKETS as u64)
        }

        /// For some `j` in 1..=10: the first failures of the last `j` tenths are at least the
        /// minimum and at least `ratio` of themselves plus the successes of the last `j + 1`.
        fn widespread(&self, c: &OutageConfig) -> bool {
            (1..=BUCKETS as u64).any(|j| {
                let (f, _) = self.counts_of_last(c, j);
                let (_, s) = self.counts_of_last(c, j + 1);
                f >= c.min_first_failures() && f64::from(f) >= c.ratio() * f64::from(f + s)
            })
        }
    }

    /// Every sequence of up to 4 steps over {success, first failure, failure, ignored, probe ok,
    /// probe failed} at non-decreasing times, with small parameters, against the reference
    /// model: with a minimum of 2 at ratio 0.5 at times from {0, 1, 3, 31, 62} s (two times in
    /// one tenth of the window, the next tenth, the window's end), and with a minimum of 1 at
    /// ratio 0.6 at times from {0, 3, 6, 31, 62} s (one success in the tenth before a first
    /// failure hides it until that success leaves the window, when a retry opens the detector;
    /// one two tenths before does not hide it).
    #[test]
    fn exhaustive_small_sequences_match_the_model() {
        for (min, ratio, times) in [(2, 0.5, [0, 1, 3, 31, 62]), (1, 0.6, [0, 3, 6, 31, 62])] {
            let config = OutageConfig::default()
                .with_window(Duration::from_secs(30))
                .with_min_first_failures(min)
                .with_ratio(ratio)
                .with_probe_initial(Duration::from_secs(1))
                .with_probe_max(Duration::from_secs(4));
            let (opened, opened_on_retry, closed) = exhaustive(config, times);
            assert!(opened > 0 && closed > 0, "{config:?}");
            // With a minimum of 2, hiding two first failures takes three successes: more steps.
            assert_eq!(opened_on_retry > 0, min == 1, "{config:?}");
        }
    }

    /// Runs every sequence; returns how many openings (of which on a retry) and closings it saw.
    fn exhaustive(config: OutageConfig, times: [u64; 5]) -> (u64, u64, u64) {
        let steps = 4u32;
        let alphabet = 6 * times.len();
        let mut cases = 0u64;
        let mut opened = 0u64;
        let mut opened_on_retry = 0u64;
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
                        0..=2 => {
                            if op < 2 {
                                m.events.push((m.now, op == 1));
                            }
                            if m.open.is_none() && op >= 1 && m.widespread(&config) {
                                m.open = Some((m.now, Duration::from_secs(1)));
                                Transition::Opened
                            } else {
                                Transition::None
                            }
                        }
                        3 => Transition::None,
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
                    opened_on_retry += u64::from(got == Transition::Opened && op == 2);
                    closed += u64::from(matches!(got, Transition::Closed { .. }));
                }
                cases += 1;
            }
        }
        assert_eq!(cases, (0..=4).map(|l| 30u64.pow(l)).sum::<u64>());
        (opened, opened_on_retry, closed)
    }

    fn at_ms(ms: u64) -> Instant {
        Instant::from_nanos(ms * 1_000_000)
    }

    /// The defect found on a real control plane: 200 objects converged (400 successes: each
    /// reconcile and the no-op reconcile its own write queued), and 15 s later, the API server
    /// gone, their next reconciles fail. The whole window's share of first failures stays below
    /// one half (it never opened before); the last tenth's is all of them.
    #[test]
    fn an_outage_seconds_after_a_burst_of_successes_opens() {
        let mut d = OutageDetector::new(OutageConfig::default());
        for i in 0..400 {
            assert_eq!(
                d.record(Signal::Success, at_ms(10_000 + i)),
                Transition::None
            );
        }
        for i in 0..4 {
            let t = at_ms(25_000 + i);
            assert_eq!(d.record(Signal::FirstFailure, t), Transition::None);
        }
        assert_eq!(
            d.record(Signal::FirstFailure, at_ms(25_004)),
            Transition::Opened
        );
        assert_eq!(d.window_counts(), (5, 400));
        assert_eq!(d.open_since(), Some(at_ms(25_004)));
    }

    /// The same burst of successes, but the failures begin in the next tenth of the window:
    /// the successes of the tenth before the failures count against them, so the detector stays
    /// closed while those successes are in the window (a handful of failures among steady
    /// successes must not open it), and the first retry after they left opens it. A success
    /// does not.
    #[test]
    fn successes_leaving_the_window_let_a_retry_open_it() {
        let mut d = OutageDetector::new(OutageConfig::default());
        for _ in 0..400 {
            d.record(Signal::Success, at_ms(22_000)); // tenth 7: [21 s, 24 s)
        }
        for _ in 0..200 {
            let t = at_ms(24_500); // tenth 8
            assert_eq!(d.record(Signal::FirstFailure, t), Transition::None);
        }
        for ms in (25_000..51_000).step_by(250) {
            assert_eq!(d.record(Signal::Failure, at_ms(ms)), Transition::None);
        }
        // At 50.75 s the window is tenths 7 to 16.
        assert_eq!(d.window_counts(), (200, 400));
        // At 51 s, tenths 8 to 17: the successes are gone, the first failures are not.
        assert_eq!(d.record(Signal::Success, at_ms(51_000)), Transition::None);
        assert_eq!(d.record(Signal::Failure, at_ms(51_000)), Transition::Opened);
        assert_eq!(d.window_counts(), (200, 1));
    }

    /// The rule's limit: successes in the same tenth as the first failures, outnumbering them,
    /// leave the window with them; retries never open the detector.
    #[test]
    fn successes_among_the_first_failures_hide_them() {
        let mut d = OutageDetector::new(OutageConfig::default());
        for _ in 0..400 {
            d.record(Signal::Success, at_ms(21_000));
        }
        for _ in 0..200 {
            assert_eq!(
                d.record(Signal::FirstFailure, at_ms(23_000)),
                Transition::None
            );
        }
        for ms in (23_000..120_000).step_by(250) {
            assert_eq!(d.record(Signal::Failure, at_ms(ms)), Transition::None);
        }
        assert_eq!(d.window_counts(), (0, 0));
    }

    /// Steady successes, ten a second for an hour; every 20th reconcile is of a new object that
    /// fails for its own reasons (a first failure), and failing objects are retried (failures)
    /// every second. 5 % of first failures in every stretch: never opens.
    #[test]
    fn five_percent_own_failures_among_steady_successes_never_open() {
        let mut d = OutageDetector::new(OutageConfig::default());
        let mut failing = 0u64;
        for tick in 0..36_000u64 {
            let t = at_ms(tick * 100);
            let signal = if tick % 20 == 0 {
                failing += 1;
                Signal::FirstFailure
            } else {
                Signal::Success
            };
            assert_eq!(d.record(signal, t), Transition::None);
            if tick % 10 == 0 {
                for _ in 0..failing.min(50) {
                    assert_eq!(d.record(Signal::Failure, t), Transition::None);
                }
            }
        }
        assert_eq!(d.openings(), 0);
    }

    /// Five objects fail together among steady successes (ten a second), wherever the burst
    /// lands in a tenth of the window: the successes of the tenth before outnumber them. (Counted
    /// against the successes of their own tenth only, a burst in the first half second of a
    /// tenth would open the detector.)
    #[test]
    fn a_handful_failing_together_among_steady_successes_never_opens() {
        for offset in 0..30u64 {
            let mut d = OutageDetector::new(OutageConfig::default());
            for tick in 0..1_200u64 {
                let t = at_ms(tick * 100);
                assert_eq!(d.record(Signal::Success, t), Transition::None);
                if tick == 600 + offset {
                    for _ in 0..5 {
                        assert_eq!(d.record(Signal::FirstFailure, t), Transition::None);
                    }
                }
                if tick > 600 + offset {
                    for _ in 0..5 {
                        assert_eq!(d.record(Signal::Failure, t), Transition::None);
                    }
                }
            }
        }
    }

    /// A slow trickle of broken objects in an otherwise quiet controller: a new one fails every
    /// 8 s (never 5 in one window), and every broken object is retried (and fails) every
    /// second: never opens, over an hour. Beside steady successes (ten a second), a trickle of
    /// one a second never opens either.
    #[test]
    fn a_trickle_of_broken_objects_never_opens() {
        let mut quiet = OutageDetector::new(OutageConfig::default());
        let mut busy = OutageDetector::new(OutageConfig::default());
        for tick in 0..36_000u64 {
            let t = at_ms(tick * 100);
            if tick % 80 == 0 {
                assert_eq!(quiet.record(Signal::FirstFailure, t), Transition::None);
            }
            let busy_signal = match tick % 10 {
                0 => Signal::FirstFailure,
                _ => Signal::Success,
            };
            assert_eq!(busy.record(busy_signal, t), Transition::None);
            if tick % 10 == 5 {
                let broken = (tick / 80 + 1).min(20);
                for _ in 0..broken {
                    assert_eq!(quiet.record(Signal::Failure, t), Transition::None);
                    assert_eq!(busy.record(Signal::Failure, t), Transition::None);
                }
            }
        }
        assert_eq!(quiet.openings() + busy.openings(), 0);
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

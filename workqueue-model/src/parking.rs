//! The outage detector's parking, probing and release, in the model's most direct form: parked
//! keys are waiting entries at the sentinel deadline, the round is a list in park order, and
//! each step is written out as the rules say (`QueueState::enable_outage_detection`'s documentation).

use std::time::Duration;

use workqueue_core::ratelimit::{OutageConfig, OutageDetector, Signal, Transition};

use crate::{Instant, Kind, Model, ModelFinished, Outcome, nanos};

/// The sentinel deadline of a parked key (the state's `PARKED`).
pub const PARKED: u64 = u64::MAX - 1;

/// The model's outage bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct ModelParking<K> {
    pub(crate) detector: OutageDetector,
    /// (key, sequence of its parked waiting entry), in park order.
    pub(crate) round: Vec<(K, u64)>,
    pub(crate) probe: Option<K>,
}

/// What a signalled finish changed in the detector (the state's `OutageEvent`, as plain data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelEvent {
    /// Opened.
    Opened,
    /// A probe failed; the next interval.
    ProbeFailed(Duration),
    /// Closed after `lasted`, releasing `released` keys.
    Closed(Duration, usize),
}

impl<K: Ord + Clone> Model<K> {
    /// Turns outage detection on.
    pub fn with_outage_detection(mut self, config: OutageConfig) -> Self {
        self.parking = Some(ModelParking {
            detector: OutageDetector::new(config),
            round: Vec::new(),
            probe: None,
        });
        self
    }

    /// Whether `key` is parked.
    pub fn is_parked(&self, key: &K) -> bool {
        self.parked_keys().contains(key)
    }

    /// The sequence of `key`'s entry if it is parked: of kind `Parked`, at the sentinel.
    fn parked_seq(&self, key: &K) -> Option<u64> {
        self.waiting
            .get(key)
            .filter(|w| w.kind == Kind::Parked && w.deadline == PARKED)
            .map(|w| w.seq)
    }

    /// The parked keys, in park order.
    pub fn parked_keys(&self) -> Vec<K> {
        let Some(p) = &self.parking else {
            return Vec::new();
        };
        p.round
            .iter()
            .filter(|(k, seq)| self.parked_seq(k) == Some(*seq))
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Whether the detector is open.
    pub fn is_outage_open(&self) -> bool {
        self.parking.as_ref().is_some_and(|p| p.detector.is_open())
    }

    /// The key being probed, while its probe is pending or running.
    pub fn probe(&self) -> Option<&K> {
        self.parking.as_ref().and_then(|p| p.probe.as_ref())
    }

    /// `finish_signalled`: the finish, and what its signal does to the detector and the keys.
    #[allow(clippy::too_many_arguments)] // the state's arguments, plus the lease's priority
    pub fn finish_signalled(
        &mut self,
        key: &K,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        priority: i32,
        signal: Signal,
        now: Instant,
        pace: &mut dyn FnMut(&K) -> Duration,
    ) -> Option<(ModelFinished, Option<ModelEvent>)> {
        if self.parking.is_none() {
            return self
                .finish_unobserved(key, outcome, limiter_delay, priority, now)
                .map(|f| (f, None));
        }
        self.processing.get(key)?;
        self.promote(now);
        let now = Instant::from_nanos(self.now);
        let was_parked = self.parked_seq(key).is_some();
        let p = self.parking.as_mut().expect("on");
        // Nothing parked, no probe pending: the next key to finish is the probe.
        let is_probe =
            p.detector.is_open() && (p.probe.as_ref().is_none_or(|p| p == key) || was_parked);
        let transition = if is_probe && signal == Signal::Success {
            p.detector.probe(true, now)
        } else if is_probe && signal.is_failure() {
            p.detector.probe(false, now)
        } else {
            p.detector.record(signal, now)
        };
        let mut event = match transition {
            Transition::Opened => Some(ModelEvent::Opened),
            Transition::ProbeFailed { next } => Some(ModelEvent::ProbeFailed(next)),
            _ => None,
        };
        let readds = !matches!(outcome, Outcome::Done | Outcome::Forget);
        // Parked if anything would run the key again: a re-add, a re-add made during the run,
        // or a waiting entry.
        let again = readds || self.dirty.contains_key(key) || self.waiting.contains_key(key);
        let park = p.detector.is_open()
            && signal.is_failure()
            && !self.shutting_down
            && self.now < PARKED
            && again;
        let finished = match park {
            true => self.finish_parked(key, readds.then_some(priority)),
            false => self.finish_unobserved(key, outcome, limiter_delay, priority, now)?,
        };
        let parked = park.then(|| self.parked_seq(key)).flatten();
        let pending = self
            .waiting
            .get(key)
            .is_some_and(|w| w.kind == Kind::Parked && w.deadline != PARKED);
        let p = self.parking.as_mut().expect("on");
        if let Some(seq) = parked {
            p.round.push((key.clone(), seq));
        }
        if p.probe.as_ref() == Some(key) && !pending {
            p.probe = None;
        }
        if let Transition::Closed { lasted } = transition {
            let released = self.release(pace);
            event = Some(ModelEvent::Closed(lasted, released));
        } else {
            self.next_probe();
        }
        Some((finished, event))
    }

    /// A run parked: processing ends; its re-add (at `readd`), a re-add made during the run and
    /// its waiting entry become one parked entry at the highest of their priorities.
    fn finish_parked(&mut self, key: &K, readd: Option<i32>) -> ModelFinished {
        self.processing.remove(key);
        let priorities = readd
            .into_iter()
            .chain(self.dirty.remove(key))
            .chain(self.waiting.remove(key).map(|e| e.priority));
        let priority = priorities.max().expect("something would run the key again");
        self.schedule(key.clone(), PARKED, priority, Kind::Parked);
        ModelFinished {
            requeued: false,
            waiting: true,
            released: false,
        }
    }

    pub(crate) fn next_probe(&mut self) {
        let p = self.parking.as_ref().expect("on");
        let (Some(interval), None) = (p.detector.probe_interval(), &p.probe) else {
            return;
        };
        if self.shutting_down {
            return;
        }
        let Some(key) = self.parked_keys().into_iter().next() else {
            self.parking.as_mut().expect("on").round.clear();
            return;
        };
        let seq = self.waiting[&key].seq;
        let p = self.parking.as_mut().expect("on");
        let at = p
            .round
            .iter()
            .position(|(k, s)| *k == key && *s == seq)
            .expect("listed");
        p.round.drain(..=at);
        let deadline = self.now.saturating_add(nanos(interval)).min(PARKED - 1);
        self.seq += 1;
        let entry = self.waiting.get_mut(&key).expect("parked");
        (entry.deadline, entry.seq) = (deadline, self.seq);
        self.parking.as_mut().expect("on").probe = Some(key);
    }

    fn release(&mut self, pace: &mut dyn FnMut(&K) -> Duration) -> usize {
        let mut keys = Vec::new();
        let p = self.parking.as_mut().expect("on");
        if let Some(probe) = p.probe.take()
            && self.waiting.contains_key(&probe)
        {
            keys.push(probe);
        }
        keys.extend(self.parked_keys());
        self.parking.as_mut().expect("on").round.clear();
        for key in &keys {
            let deadline = self.now.saturating_add(nanos(pace(key))).min(PARKED - 1);
            self.seq += 1;
            let entry = self.waiting.get_mut(key).expect("waits");
            if deadline < entry.deadline {
                (entry.deadline, entry.seq) = (deadline, self.seq);
            }
            // Released keys wait on the limiter's pacing.
            entry.kind = Kind::Retry;
        }
        // Keys released without delay are ready now.
        self.promote(Instant::from_nanos(self.now));
        keys.len()
    }
}

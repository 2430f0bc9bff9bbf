//! Outage-aware retries: parking, probing and releasing keys through the waiting heap.
//!
//! Off until [`QueueState::enable_outage_detection`]; then [`QueueState::finish`] feeds each
//! finished key's [`Signal`] to an [`OutageDetector`], and while it is open:
//!
//! - **Park**: a failing key whose outcome asks for a re-add is scheduled at the sentinel
//!   deadline [`PARKED`], which is never reached, instead of its own delay. It is an ordinary
//!   waiting entry, so no per-slot flag is needed, and the earliest-wins rule keeps an earlier
//!   deadline it already has. The rate limiter's delay computed for it is not used.
//! - **Probe**: one parked key at a time, the one parked longest ago (round-robin), is moved to
//!   `now + probe interval` by a decrease-key. When it fails it is parked again, at the back of
//!   the round, and the next key is moved. A reconcile of any parked key (an `add` of a parked
//!   key runs it at once: its waiting entry is independent of the FIFO) counts as a probe.
//! - **Release**: a probe that succeeds closes the detector, and every parked key is moved, in
//!   the order it was parked, to `now + pace(key)` (the driver's `pace` forgets the key in the
//!   limiter and takes one reservation of its bucket): decrease-keys again.
//!
//! Shutdown drops parked keys as it drops every waiting key, and drains do not wait for them.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use workqueue_ratelimit::{Instant, OutageConfig, OutageDetector, Signal, Transition};

use super::slots::Remap;
use super::{Finished, ForeignTicket, QueueState, SlotId, Ticket, duration_to_nanos};
use crate::Outcome;
use crate::outcome::Op;

/// The sentinel deadline of a parked key: never reached by any clock (584 years of nanoseconds),
/// below [`Instant::NEVER`], which is never stored. With outage detection on, a delay that lands
/// exactly on it counts as parked (it would never be reached either).
pub(crate) const PARKED: u64 = u64::MAX - 1;

/// What a finish changed in the outage detector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum OutageEvent {
    /// The detector opened: failing keys are parked from now on.
    Opened,
    /// A probe failed; the next is due after `next`.
    ProbeFailed {
        /// The probe interval from now on.
        next: Duration,
    },
    /// A probe succeeded: the detector closed after `lasted`, and `released` parked keys were
    /// released, paced by the limiter.
    Closed {
        /// How long the detector was open.
        lasted: Duration,
        /// How many parked keys were released.
        released: usize,
    },
}

/// The parking bookkeeping: the detector, the round of parked entries and the probe.
#[derive(Debug)]
pub(crate) struct Parking {
    detector: OutageDetector,
    /// Parked entries in the order they were parked, as (slot, sequence of the waiting entry).
    /// Entries whose waiting entry is no longer that parked one (probed, released, re-added
    /// earlier, dropped at shutdown) are stale and skipped.
    round: VecDeque<(SlotId, u64)>,
    /// The key moved out of the round to be probed, while its probe is pending or running.
    probe: Option<SlotId>,
}

impl Parking {
    /// At shutdown: no probe runs any more.
    pub(super) fn forget_probe(&mut self) {
        self.probe = None;
    }

    /// Compaction, after [`QueueState::prune_parking`]: the parked entries and the probe follow
    /// their slots.
    pub(super) fn remap(&mut self, remap: &Remap) {
        for entry in &mut self.round {
            entry.0 = remap.slot(entry.0);
        }
        self.round.shrink_to_fit();
        if let Some(probe) = &mut self.probe {
            *probe = remap.slot(*probe);
        }
    }
}

impl<T: Hash + Eq + Clone, S: BuildHasher> QueueState<T, S> {
    /// Turns outage detection on with `config`: from now on [`QueueState::finish`] tells the
    /// detector ([`OutageDetector`]) what each outcome's signal says
    /// ([`Outcome::with_signal`](crate::Outcome::with_signal)), and while it is open:
    /// - **Park**: a failing key whose outcome asks for a re-add is scheduled at a sentinel
    ///   deadline that is never reached, instead of its own delay: an ordinary waiting entry, so
    ///   no per-slot flag is needed, and earliest-wins keeps an earlier deadline it already has.
    /// - **Probe**: one parked key at a time, the one parked longest ago (round-robin), is moved
    ///   to `now + probe interval` by a decrease-key. When it fails it is parked again, at the
    ///   back of the round. A run of any parked key (an `add` of a parked key runs it at once:
    ///   its waiting entry is independent of the FIFO) counts as a probe; with no key parked
    ///   (all given up), the next key to finish is the probe.
    /// - **Release**: a probe that succeeds closes the detector, and every parked key is moved,
    ///   in the order it was parked, to `now + pace(key)` (`finish`'s `pace`): decrease-keys
    ///   again.
    ///
    /// Shutdown drops parked keys as it drops every waiting key; drains do not wait for them.
    ///
    /// Already on: a closed detector restarts with `config`; an open one is kept, with its
    /// parked keys, until a probe closes it (its parked keys are never orphaned).
    ///
    /// ```
    /// use std::time::Duration;
    /// use workqueue_core::ratelimit::{OutageConfig, Signal};
    /// use workqueue_core::state::{Get, OutageEvent, QueueState};
    /// use workqueue_core::{AddOptions, Instant, Outcome};
    ///
    /// let mut q: QueueState<u32> = QueueState::new();
    /// q.enable_outage_detection(OutageConfig::default().with_min_first_failures(1));
    /// let t0 = Instant::ZERO;
    /// q.add(1, AddOptions::new(), t0);
    /// let Get::Ready(ticket, _) = q.get(t0) else { panic!() };
    /// let failed = Outcome::retry().with_signal(Signal::FirstFailure);
    /// let retry = Some(Duration::from_millis(5));
    /// let finished = q.finish(ticket, failed, retry, t0, |_| Duration::ZERO).unwrap();
    /// assert_eq!(finished.outage, Some(OutageEvent::Opened));
    /// // Key 1 is the probe, due after the first probe interval (1 s).
    /// assert_eq!(q.next_deadline(), Some(Instant::from_nanos(1_000_000_000)));
    /// ```
    pub fn enable_outage_detection(&mut self, config: OutageConfig) {
        if let Some(p) = self.parking.as_deref_mut() {
            if !p.detector.is_open() {
                p.detector = OutageDetector::new(config);
            }
            return;
        }
        self.parking = Some(Box::new(Parking {
            detector: OutageDetector::new(config),
            round: VecDeque::new(),
            probe: None,
        }));
    }

    /// The detector, when outage detection is on.
    pub fn outage_detector(&self) -> Option<&OutageDetector> {
        self.parking.as_deref().map(|p| &p.detector)
    }

    /// Whether `key` is parked: in the round of parked keys, waiting at the sentinel deadline
    /// (a walk over the round: for diagnostics and tests).
    pub fn is_parked<Q>(&self, key: &Q) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let Some(slot) = self.find(self.hasher.hash_one(key), key) else {
            return false;
        };
        let (Some(p), Some(seq)) = (self.parking.as_deref(), self.parked_seq(slot)) else {
            return false;
        };
        p.round.contains(&(slot, seq))
    }

    /// How many keys are parked (a walk over the round: for gauges and reports).
    pub fn parked_len(&self) -> usize {
        let Some(p) = self.parking.as_deref() else {
            return 0;
        };
        p.round
            .iter()
            .filter(|&&(slot, seq)| self.parked_seq(slot) == Some(seq))
            .count()
    }

    /// Before a compaction: drops the round's stale entries and a probe whose key is gone, so
    /// that every slot [`Parking::remap`] renames is live (a stale entry could name a free slot,
    /// or one a moved key takes over).
    pub(super) fn prune_parking(&mut self) {
        let Some(p) = &self.parking else { return };
        let round: VecDeque<(SlotId, u64)> = p
            .round
            .iter()
            .copied()
            .filter(|&(slot, seq)| self.parked_seq(slot) == Some(seq))
            .collect();
        let probe = p.probe.filter(|&slot| self.slots.is_live(slot));
        if let Some(p) = &mut self.parking {
            p.round = round;
            p.probe = probe;
        }
    }

    /// The sequence of `slot`'s waiting entry if it is parked.
    fn parked_seq(&self, slot: SlotId) -> Option<u64> {
        if self.parking.is_none() || !self.slots.is_live(slot) {
            return None;
        }
        let w = self.waiting.get(self.slots.heap_pos(slot)?);
        (w.deadline == PARKED).then_some(w.seq)
    }

    /// [`QueueState::finish`] with outage detection on: the outcome's signal (`Ignored` without
    /// one) goes to the detector, which may park the key; see
    /// [`QueueState::enable_outage_detection`] for the rules. Out of line: the common finish
    /// pays one branch for it.
    #[cold]
    #[inline(never)]
    pub(super) fn finish_observed(
        &mut self,
        ticket: Ticket,
        outcome: Outcome,
        limiter_delay: Option<Duration>,
        now: Instant,
        pace: &mut dyn FnMut(&T) -> Duration,
    ) -> Result<Finished<T>, ForeignTicket> {
        let signal = outcome.signal.unwrap_or(Signal::Ignored);
        let slot = ticket.slot;
        if self.parking.is_none() {
            return self.finish_unobserved(ticket, outcome, limiter_delay, now);
        }
        if ticket.state != self.id || !self.slots.is_live(slot) || !self.slots.is_processing(slot) {
            return Err(ForeignTicket);
        }
        self.promote(now);
        let parked_before = self.parked_seq(slot);
        let parking = self.parking.as_deref().expect("checked above");
        // With nothing parked (every parked key was given up) there is no probe to wait for: the
        // next key to finish is the probe.
        let is_probe = parking.detector.is_open()
            && (parking.probe.is_none_or(|p| p == slot) || parked_before.is_some());
        let now = Instant::from_nanos(self.now);
        let mut event = None;
        let parking = self.parking.as_deref_mut().expect("checked above");
        let transition = match (is_probe, signal) {
            (true, Signal::Success) => parking.detector.probe(true, now),
            (true, s) if s.is_failure() => parking.detector.probe(false, now),
            (_, s) => parking.detector.record(s, now),
        };
        match transition {
            Transition::Opened => event = Some(OutageEvent::Opened),
            Transition::ProbeFailed { next } => event = Some(OutageEvent::ProbeFailed { next }),
            _ => {}
        }
        let park = parking.detector.is_open()
            && signal.is_failure()
            && outcome.readds()
            && self.now < PARKED;
        let outcome = match park {
            // Scheduled at exactly `PARKED` by the one re-add rule of `finish`, at the outcome's
            // priority.
            true => Outcome {
                op: Op::RetryAfter(Duration::from_nanos(PARKED - self.now)),
                ..outcome
            },
            false => outcome,
        };
        let mut finished = self.finish_unobserved(ticket, outcome, limiter_delay, now)?;
        if park
            && let Some(seq) = self.parked_seq(slot)
            && parked_before != Some(seq)
        {
            let parking = self.parking.as_deref_mut().expect("checked above");
            // A key parked anew (a failed probe, a key that was not parked) goes to the back of
            // the round. A parked key that ran through an add keeps its entry and its place.
            parking.round.push_back((slot, seq));
        }
        // The probe ran (parked again, retried on its own, or given up) unless its probe entry
        // is still pending (it ran through an add before its probe time): another key is
        // probed next.
        let pending = self
            .slots
            .heap_pos(slot)
            .is_some_and(|pos| self.waiting.get(pos).deadline != PARKED);
        let parking = self.parking.as_deref_mut().expect("checked above");
        if parking.probe == Some(slot) && !(pending && park) {
            parking.probe = None;
        }
        if let Transition::Closed { lasted } = transition {
            let released = self.release_parked(pace);
            event = Some(OutageEvent::Closed { lasted, released });
        } else {
            self.schedule_probe();
        }
        finished.outage = event;
        Ok(finished)
    }

    /// While open with no probe pending, moves the key parked longest ago to the probe time.
    fn schedule_probe(&mut self) {
        let Some(parking) = self.parking.as_deref() else {
            return;
        };
        let (Some(interval), None) = (parking.detector.probe_interval(), parking.probe) else {
            return;
        };
        if self.shutting_down {
            return;
        }
        loop {
            let parking = self.parking.as_deref_mut().expect("checked above");
            let Some((slot, seq)) = parking.round.pop_front() else {
                return;
            };
            if self.parked_seq(slot) != Some(seq) {
                continue; // stale
            }
            let deadline = self
                .now
                .saturating_add(duration_to_nanos(interval))
                .min(PARKED - 1);
            self.move_earlier(slot, deadline);
            self.parking.as_deref_mut().expect("checked above").probe = Some(slot);
            return;
        }
    }

    /// Moves every parked key, in the order it was parked, to `now + pace(key)`, and the pending
    /// probe with them; returns how many moved.
    fn release_parked(&mut self, pace: &mut dyn FnMut(&T) -> Duration) -> usize {
        let parking = self.parking.as_deref_mut().expect("outage detection is on");
        let round = std::mem::take(&mut parking.round);
        let probe = parking.probe.take();
        let mut released = 0;
        let pending_probe =
            probe.filter(|&s| self.slots.is_live(s) && self.slots.heap_pos(s).is_some());
        let parked = round
            .into_iter()
            .filter_map(|(slot, seq)| (self.parked_seq(slot) == Some(seq)).then_some(slot));
        let slots: Vec<SlotId> = pending_probe.into_iter().chain(parked).collect();
        for slot in slots {
            let delay = pace(self.slots.key(slot));
            let deadline = self
                .now
                .saturating_add(duration_to_nanos(delay))
                .min(PARKED - 1);
            let pos = self.slots.heap_pos(slot).expect("a parked key waits");
            if deadline < self.waiting.get(pos).deadline {
                self.move_earlier(slot, deadline);
            }
            released += 1;
        }
        // Keys released without delay are ready now.
        if self.waiting.peek().is_some_and(|w| w.deadline <= self.now) {
            self.promote_due();
        }
        released
    }

    /// A decrease-key of `slot`'s waiting entry to `deadline`, with a new sequence.
    fn move_earlier(&mut self, slot: SlotId, deadline: u64) {
        let seq = self.seq;
        self.seq += 1;
        let pos = self.slots.heap_pos(slot).expect("the slot waits");
        self.waiting.decrease(pos, deadline, seq, &mut self.slots);
    }

    /// Checks the parking bookkeeping (for `check_invariants`): the probe is live and waiting or
    /// processing, and is not parked; no slot is parked twice in the round's live entries.
    pub(super) fn check_parking(&self) {
        let Some(p) = self.parking.as_deref() else {
            return;
        };
        let mut seen = std::collections::HashSet::new();
        for &(slot, seq) in &p.round {
            if self.parked_seq(slot) == Some(seq) {
                assert!(seen.insert(slot), "a key is parked twice in the round");
            }
        }
        let parked_in_heap = self
            .index
            .iter()
            .filter(|&&s| self.parked_seq(s).is_some())
            .count();
        // A delay of the user's that lands exactly on the sentinel (584 years) waits there too,
        // outside the round: it is never probed nor released, as it would never be reached.
        assert!(parked_in_heap >= seen.len(), "a round entry is not parked");
        if let Some(probe) = p.probe {
            // Every finish goes through `finish_observed` while detection is on, and it
            // forgets a probe that finishes; shutdown forgets it too: the probe's slot is live.
            assert!(self.slots.is_live(probe), "the probe is not tracked");
            assert!(
                self.slots.heap_pos(probe).is_some()
                    || self.slots.is_queued(probe)
                    || self.slots.is_processing(probe),
                "the probe neither waits, nor is queued, nor runs"
            );
            assert!(self.parked_seq(probe).is_none(), "the probe is parked");
        }
        if !p.detector.is_open() {
            assert!(p.probe.is_none(), "a probe while closed");
        }
    }
}

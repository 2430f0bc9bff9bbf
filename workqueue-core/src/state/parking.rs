//! Outage-aware retries: parking, probing and releasing keys through the waiting heap.
//!
//! Off until [`QueueState::enable_outage_detection`]; then [`QueueState::finish`] feeds each
//! finished key's [`Signal`] to an [`OutageDetector`], and while it is open:
//!
//! - **Park**: a failing run whose key would run again (its outcome re-adds it, it was re-added
//!   during the run, or it waits) parks the key: whatever entry it had is replaced by one at the
//!   sentinel deadline [`PARKED`], which is never reached, of kind [`Kind::Parked`], and a
//!   re-add made during the run is carried by it instead of queueing the key. The rate
//!   limiter's delay computed for it is not used.
//! - **Hold**: an add of a parked key leaves it parked (`holds.rs`), but for its priority.
//! - **Probe**: one parked key at a time, the one parked longest ago (round-robin), is moved to
//!   `now + probe interval` by a decrease-key, keeping its kind (so adds still leave it alone).
//!   When it fails it is parked again, at the back of the round, and the next key is moved. A
//!   run of a parked key through an add that bypasses parking counts as a probe too.
//! - **Release**: a probe that succeeds closes the detector, and every parked key is moved, in
//!   the order it was parked, to `now + pace(key)` (the driver's `pace` forgets the key in the
//!   limiter and takes one reservation of its bucket): decrease-keys again, to entries of kind
//!   [`Kind::Retry`].
//!
//! Invariant: an entry of kind `Parked` exists only while the detector is open, and is either
//! at `PARKED` with its live entry in the round, or the probe's, before `PARKED`.
//!
//! Shutdown drops parked keys as it drops every waiting key, and drains do not wait for them.

use std::collections::VecDeque;
use std::hash::{BuildHasher, Hash};
use std::time::Duration;

use workqueue_ratelimit::{Instant, OutageConfig, OutageDetector, Signal, Transition};

use super::slots::Remap;
use super::waiting::{Kind, Waiting};
use super::{Finished, ForeignTicket, QueueState, SlotId, Ticket, duration_to_nanos};
use crate::Outcome;

/// The sentinel deadline of a parked key: never reached by any clock (584 years of nanoseconds),
/// below [`Instant::NEVER`], which is never stored. A delay that lands exactly on it waits there
/// too, never reached, but is not parked (its entry is not of kind `Parked`).
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
    /// - **Park**: a run that fails (its signal is a failure) is parked if the key would run
    ///   again: its outcome re-adds it (a retry), it was re-added during the run (dirty), or it
    ///   waits (a reminder, a debounce, its backoff). Parked, it waits at a sentinel deadline
    ///   that is never reached: that entry replaces any it had, carries the dirty re-add (the key
    ///   is not queued again at once), and has the highest priority of them all. A give-up with
    ///   nothing else pending (`forget()` or `done()` of a failure) is not parked. After
    ///   shutdown nothing is parked.
    /// - **Hold**: an add of a parked key, with or without delay, leaves it parked and raises
    ///   its priority for the release if it asks for a higher one
    ///   ([`AddStatus::Parked`](super::AddStatus::Parked)); so does an add of the key waiting
    ///   to be the probe. Events for failing objects do not run
    ///   them during the outage. Keys that are not parked are added as usual; if their run
    ///   fails while the detector is open, they are parked. An add with
    ///   [`AddOptions::bypass_parking`](crate::AddOptions::bypass_parking) is applied as without
    ///   detection.
    /// - **Probe**: one parked key at a time, the one parked longest ago (round-robin), is moved
    ///   to `now + probe interval` by a decrease-key. When it fails it is parked again, at the
    ///   back of the round. A run of a parked key through a bypassing add counts as a probe too;
    ///   with no key parked (all given up), the next key to finish is the probe.
    /// - **Release**: a probe that succeeds closes the detector, and every parked key is moved,
    ///   in the order it was parked, to `now + pace(key)` (`finish`'s `pace`): decrease-keys
    ///   again. Released keys wait on the limiter's pacing, a rate-limited retry (see
    ///   [`QueueState::set_keep_backoff`]).
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
    /// (the key waiting to be the probe is not).
    pub(crate) fn is_parked<Q>(&self, key: &Q) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.find(self.hasher.hash_one(key), key)
            .is_some_and(|slot| self.parked_seq(slot).is_some())
    }

    /// For a rate-limited add of `key` (which a driver would ask its limiter for first): after
    /// promoting the keys due at `now`, whether the key is parked or waits to be the probe while
    /// the detector is open, so that the add is held (see the hold rule of
    /// [`QueueState::enable_outage_detection`]); if so, the add is applied (its priority raised
    /// for the release, if higher) and the driver skips the limiter, whose delay would not be
    /// used and which would count a failure.
    pub(crate) fn hold_if_parked<Q>(&mut self, key: &Q, priority: i32, now: Instant) -> bool
    where
        T: std::borrow::Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.promote(now);
        if !self.is_outage_open() {
            return false;
        }
        let Some(slot) = self.find(self.hasher.hash_one(key), key) else {
            return false;
        };
        let parked = self
            .slots
            .heap_pos(slot)
            .is_some_and(|pos| self.waiting.get(pos).kind() == Kind::Parked);
        if parked {
            self.raise_waiting(slot, priority);
        }
        parked
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

    /// The sequence of `slot`'s waiting entry if it is parked (of kind `Parked`, at the
    /// sentinel: by the invariant, its entry in the round is live).
    fn parked_seq(&self, slot: SlotId) -> Option<u64> {
        if self.parking.is_none() || !self.slots.is_live(slot) {
            return None;
        }
        let w = self.waiting.get(self.slots.heap_pos(slot)?);
        (w.deadline == PARKED && w.kind() == Kind::Parked).then_some(w.seq)
    }

    /// Whether `slot` waits to be the probe: an entry of kind `Parked` before the sentinel.
    fn probe_pending(&self, slot: SlotId) -> bool {
        self.slots.heap_pos(slot).is_some_and(|pos| {
            let w = self.waiting.get(pos);
            w.kind() == Kind::Parked && w.deadline != PARKED
        })
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
        // Parked if the key would run again: the outcome re-adds it, it was re-added during the
        // run, or it waits.
        let open = parking.detector.is_open();
        let park = open
            && signal.is_failure()
            && !self.shutting_down
            && self.now < PARKED
            && (outcome.readds()
                || self.slots.is_dirty(slot)
                || self.slots.heap_pos(slot).is_some());
        let mut finished = match park {
            true => self.finish_parked(ticket, outcome),
            false => self.finish_unobserved(ticket, outcome, limiter_delay, now)?,
        };
        let parked = park.then(|| self.parked_seq(slot)).flatten();
        let parking = self.parking.as_deref_mut().expect("checked above");
        if let Some(seq) = parked {
            // Parked anew, at the back of the round.
            parking.round.push_back((slot, seq));
        }
        // The probe ran (parked again, retried on its own, or given up) unless its probe entry
        // is still pending (it ran through a bypassing add before its probe time, and its run
        // was neither a failure nor a success): then it stays the probe.
        let pending = self.probe_pending(slot);
        let parking = self.parking.as_deref_mut().expect("checked above");
        if parking.probe == Some(slot) && !pending {
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

    /// The finish of a run that is parked (see [`QueueState::finish_observed`]): processing
    /// ends, and the key's re-adds (the outcome's, a re-add made during the run, its waiting
    /// entry) become one parked entry at the highest of their priorities.
    fn finish_parked(&mut self, ticket: Ticket, outcome: Outcome) -> Finished<T> {
        let slot = ticket.slot;
        if let Some(t) = &mut self.timing {
            t.on_finish(slot, self.now);
        }
        self.processing -= 1;
        let mut priority = outcome
            .readds()
            .then(|| outcome.priority.unwrap_or(ticket.priority));
        if self.slots.stop_processing(slot) {
            let dirty = self.queued_priority(slot);
            self.withdraw_dirty(slot, dirty);
            priority = Some(priority.map_or(dirty, |p| p.max(dirty)));
        }
        if let Some(pos) = self.slots.heap_pos(slot) {
            let waiting = self.waiting_priority(slot);
            priority = Some(priority.map_or(waiting, |p| p.max(waiting)));
            self.waiting.remove(pos, &mut self.slots);
        }
        let priority = priority.expect("a parked key had something that would run it again");
        self.schedule(slot, PARKED, priority, Kind::Parked);
        Finished {
            requeued: false,
            waiting: true,
            released: None,
            outage: None,
        }
    }

    /// For a removal (`retain`), once the removed keys' entries are gone and before they are
    /// freed: forgets the probe if it is one of them (nothing refers to its slot any more).
    /// Returns whether it did: the next parked key is then probed (`schedule_probe`).
    pub(super) fn forget_removed_probe(&mut self) -> bool {
        let slots = &self.slots;
        let Some(p) = self.parking.as_deref_mut() else {
            return false;
        };
        let removed = p.probe.is_some_and(|probe| slots.is_unreferenced(probe));
        if removed {
            p.probe = None;
        }
        removed
    }

    /// While open with no probe pending, moves the key parked longest ago to the probe time.
    pub(super) fn schedule_probe(&mut self) {
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
            self.move_earlier(slot, deadline, Kind::Parked);
            self.parking.as_deref_mut().expect("checked above").probe = Some(slot);
            return;
        }
    }

    /// Moves every parked key, in the order it was parked, to `now + pace(key)`, and the pending
    /// probe with them, each now waiting on a rate-limited retry (the pacing); returns how many
    /// moved.
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
                self.move_earlier(slot, deadline, Kind::Retry);
            } else {
                self.waiting.set_kind(pos, Kind::Retry);
            }
            released += 1;
        }
        // Keys released without delay are ready now.
        if self.waiting.peek().is_some_and(|w| w.deadline <= self.now) {
            self.promote_due();
        }
        released
    }

    /// A decrease-key of `slot`'s waiting entry to `deadline`, with a new sequence, of `kind`.
    fn move_earlier(&mut self, slot: SlotId, deadline: u64, kind: Kind) {
        let seq = Waiting::order(self.seq, kind);
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
        assert_eq!(
            parked_in_heap,
            seen.len(),
            "a parked entry is not in the round"
        );
        for &slot in self.index.iter() {
            let Some(pos) = self.slots.heap_pos(slot) else {
                continue;
            };
            let w = self.waiting.get(pos);
            if w.kind() != Kind::Parked {
                continue;
            }
            assert!(
                p.detector.is_open(),
                "a key is parked while the detector is closed"
            );
            assert!(
                w.deadline == PARKED || p.probe == Some(slot),
                "an entry of kind Parked is neither parked nor the probe's"
            );
        }
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

//! One test per row of the semantics table (the README's), on the bare state.

use std::time::Duration;

use super::*;
use crate::LOW_PRIORITY;

const T0: Instant = Instant::ZERO;

fn at(ms: u64) -> Instant {
    Instant::from_nanos(ms * 1_000_000)
}

/// The pacing of finishes that release no parked key.
fn no_pace<K>(_: &K) -> Duration {
    Duration::ZERO
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn take(q: &mut QueueState<&'static str>, now: Instant) -> (Ticket, &'static str) {
    match q.get(now) {
        Get::Ready(t, k) => (t, k),
        other => panic!("expected a key, got {other:?}"),
    }
}

fn drain_keys(q: &mut QueueState<&'static str>, now: Instant) -> Vec<&'static str> {
    let mut out = Vec::new();
    while let Get::Ready(t, k) = q.get(now) {
        out.push(k);
        let _ = q.finish(t, Outcome::done(), None, now, no_pace).unwrap();
        q.check_invariants();
    }
    out
}

#[test]
fn add_pushes_to_tail_and_dedups_queued_keys() {
    let mut q = QueueState::new();
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::Queued);
    assert_eq!(q.add("b", AddOptions::new(), T0), AddStatus::Queued);
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::AlreadyQueued);
    q.check_invariants();
    assert_eq!(q.ready_keys(), ["a", "b"]);
}

#[test]
fn add_while_processing_marks_dirty_and_requeues_at_tail_on_finish() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    let (t, _) = take(&mut q, T0);
    q.add("b", AddOptions::new(), T0);
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::Dirty);
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::AlreadyDirty);
    assert_eq!(
        q.len(T0),
        1,
        "a dirty key is not counted until it is requeued"
    );
    q.check_invariants();
    let f = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    assert!(f.requeued && f.released.is_none());
    assert_eq!(q.ready_keys(), ["b", "a"]);
    q.check_invariants();
}

#[test]
fn a_key_is_never_handed_out_twice_at_once() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    let (t, _) = take(&mut q, T0);
    q.add("a", AddOptions::new(), T0);
    assert!(matches!(q.get(T0), Get::Empty { .. }));
    let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    let (t, k) = take(&mut q, T0);
    assert_eq!(k, "a");
    let f = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    assert_eq!(f.released, Some("a"), "an idle key is no longer tracked");
    assert_eq!(q.counts(), Counts::default());
}

#[test]
fn get_after_shutdown_drains_queued_keys_then_reports_shutdown() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    q.add("b", AddOptions::new(), T0);
    q.add("c", AddOptions::new().after(ms(1)), T0);
    let dropped = q.shut_down();
    assert_eq!(dropped, ["c"], "waiting keys are dropped at shutdown");
    assert_eq!(q.add("d", AddOptions::new(), T0), AddStatus::ShutDown);
    assert_eq!(
        q.add("d", AddOptions::new().after(ms(1)), T0),
        AddStatus::ShutDown
    );
    assert_eq!(drain_keys(&mut q, at(5)), ["a", "b"]);
    assert!(matches!(q.get(at(5)), Get::ShutDown));
    q.check_invariants();
}

#[test]
fn finish_after_shutdown_still_requeues_a_dirty_key_but_drops_retries() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    q.add("b", AddOptions::new(), T0);
    let (ta, _) = take(&mut q, T0);
    let (tb, _) = take(&mut q, T0);
    q.add("a", AddOptions::new(), T0);
    let _ = q.shut_down();
    assert!(!q.is_drained(false));
    let f = q.finish(ta, Outcome::done(), None, T0, no_pace).unwrap();
    assert!(f.requeued);
    let f = q
        .finish(tb, Outcome::retry_after(ms(1)), None, T0, no_pace)
        .unwrap();
    assert!(!f.requeued && !f.waiting);
    assert_eq!(f.released, Some("b"));
    assert!(q.is_drained(false));
    assert!(!q.is_drained(true), "a is still queued");
    assert_eq!(drain_keys(&mut q, T0), ["a"]);
    assert!(q.is_drained(true));
}

#[test]
fn add_after_zero_is_add() {
    let mut q = QueueState::new();
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::Queued);
    assert_eq!(q.len(T0), 1);
    assert!(!q.has_waiting());
}

#[test]
fn add_after_waits_until_its_deadline() {
    let mut q = QueueState::new();
    assert_eq!(
        q.add("a", AddOptions::new().after(ms(50)), T0),
        AddStatus::Waiting
    );
    assert_eq!(q.next_deadline(), Some(at(50)));
    assert_eq!(q.len(at(49)), 0);
    assert_eq!(q.len(at(50)), 1);
    assert_eq!(q.next_deadline(), None);
    q.check_invariants();
}

#[test]
fn add_after_earliest_deadline_wins() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new().after(ms(50)), T0);
    assert_eq!(
        q.add("a", AddOptions::new().after(ms(70)), T0),
        AddStatus::AlreadyWaiting
    );
    assert_eq!(q.waiting_deadline("a"), Some(at(50)));
    assert_eq!(
        q.add("a", AddOptions::new().after(ms(30)), T0),
        AddStatus::Waiting
    );
    assert_eq!(q.waiting_deadline("a"), Some(at(30)));
    assert_eq!(q.len(at(30)), 1);
    assert_eq!(drain_keys(&mut q, at(30)), ["a"]);
    assert_eq!(
        q.len(at(100)),
        0,
        "the later request does not fire separately"
    );
}

#[test]
fn keys_due_together_come_out_in_ready_time_order_fifo_among_equal_times() {
    let mut q = QueueState::new();
    q.add("foo", AddOptions::new().after(ms(1000)), T0);
    q.add("bar", AddOptions::new().after(ms(500)), T0);
    q.add("baz", AddOptions::new().after(ms(250)), T0);
    q.add("x", AddOptions::new().after(ms(500)), T0);
    q.add("y", AddOptions::new().after(ms(500)), T0);
    assert_eq!(
        drain_keys(&mut q, at(2000)),
        ["baz", "bar", "x", "y", "foo"]
    );
}

#[test]
fn decreased_deadline_takes_a_new_sequence_number() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new().after(ms(20)), T0);
    q.add("b", AddOptions::new().after(ms(10)), T0);
    q.add("a", AddOptions::new().after(ms(10)), T0);
    assert_eq!(drain_keys(&mut q, at(10)), ["b", "a"]);
}

#[test]
fn add_while_waiting_queues_now_and_keeps_the_reminder() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new().after(ms(10)), T0);
    assert_eq!(q.add("a", AddOptions::new(), T0), AddStatus::Queued);
    assert_eq!(q.waiting_deadline("a"), Some(at(10)));
    q.check_invariants();
    assert_eq!(drain_keys(&mut q, T0), ["a"]);
    assert_eq!(q.len(at(10)), 1, "the reminder fires");
    // A reminder that fires while the key is still queued is de-duplicated.
    let mut q = QueueState::new();
    q.add("a", AddOptions::new().after(ms(10)), T0);
    q.add("a", AddOptions::new(), T0);
    assert_eq!(q.len(at(10)), 1);
    q.check_invariants();
}

#[test]
fn a_reminder_that_fires_while_processing_marks_the_key_dirty() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    let (t, _) = take(&mut q, T0);
    q.add("a", AddOptions::new().after(ms(10)), T0);
    assert_eq!(q.len(at(10)), 0);
    assert!(q.is_processing("a"));
    let f = q.finish(t, Outcome::done(), None, at(10), no_pace).unwrap();
    assert!(f.requeued);
}

#[test]
fn every_operation_promotes_due_keys_first() {
    let mut q = QueueState::new();
    q.add("late", AddOptions::new().after(ms(10)), T0);
    q.add("now", AddOptions::new(), at(10));
    assert_eq!(
        q.ready_keys(),
        ["late", "now"],
        "promotion runs before the add"
    );
}

#[test]
fn len_counts_only_ready_keys() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new(), T0);
    q.add("b", AddOptions::new(), T0);
    q.add("c", AddOptions::new().after(ms(5)), T0);
    let (_t, _) = take(&mut q, T0);
    assert_eq!(q.len(T0), 1);
    assert_eq!(
        q.counts(),
        Counts {
            ready: 1,
            processing: 1,
            waiting: 1,
            tracked: 3
        }
    );
}

#[test]
fn finish_outcomes_map_to_queue_operations() {
    let mut q = QueueState::new();
    for k in ["done", "forget", "retry", "retry_after", "requeue_after"] {
        q.add(k, AddOptions::new(), T0);
    }
    let mut tickets: Vec<_> = (0..5).map(|_| take(&mut q, T0)).collect();
    let (t, _) = tickets.remove(0);
    assert_eq!(
        q.finish(t, Outcome::done(), None, T0, no_pace)
            .unwrap()
            .released,
        Some("done")
    );
    let (t, _) = tickets.remove(0);
    assert_eq!(
        q.finish(t, Outcome::forget(), None, T0, no_pace)
            .unwrap()
            .released,
        Some("forget")
    );
    let (t, _) = tickets.remove(0);
    assert!(
        q.finish(t, Outcome::retry(), Some(ms(5)), T0, no_pace)
            .unwrap()
            .waiting
    );
    let (t, _) = tickets.remove(0);
    assert!(
        q.finish(t, Outcome::retry_after(ms(7)), None, T0, no_pace)
            .unwrap()
            .waiting
    );
    let (t, _) = tickets.remove(0);
    assert!(
        q.finish(t, Outcome::requeue_after(ms(9)), None, T0, no_pace)
            .unwrap()
            .waiting
    );
    assert_eq!(q.waiting_deadline("retry"), Some(at(5)));
    assert_eq!(q.waiting_deadline("retry_after"), Some(at(7)));
    assert_eq!(q.waiting_deadline("requeue_after"), Some(at(9)));
    q.check_invariants();
    // A retry whose limiter delay is zero goes straight back to the FIFO.
    let (t, _) = {
        q.add("zero", AddOptions::new(), T0);
        take(&mut q, T0)
    };
    assert!(
        q.finish(t, Outcome::retry(), Some(Duration::ZERO), T0, no_pace)
            .unwrap()
            .requeued
    );
}

#[test]
fn never_deadlines_store_nothing_and_never_panic() {
    let mut q = QueueState::new();
    assert_eq!(
        q.add("a", AddOptions::new().after(Duration::MAX), T0),
        AddStatus::Never
    );
    assert_eq!(
        q.add(
            "a",
            AddOptions::new().after(Duration::from_nanos(u64::MAX)),
            at(1)
        ),
        AddStatus::Never
    );
    assert_eq!(q.counts(), Counts::default());
    let mut q = QueueState::new();
    assert_eq!(
        q.add(
            "b",
            AddOptions::new().after(Duration::from_nanos(u64::MAX - 10)),
            T0
        ),
        AddStatus::Waiting
    );
    assert_eq!(q.len(Instant::from_nanos(u64::MAX - 11)), 0);
    assert_eq!(q.len(Instant::NEVER), 1);
}

#[test]
fn time_going_backwards_is_clamped() {
    let mut q = QueueState::new();
    q.add("a", AddOptions::new().after(ms(10)), at(100));
    assert_eq!(q.len(at(50)), 0);
    assert_eq!(q.now(), at(100));
    assert_eq!(q.next_deadline(), Some(at(110)));
    q.add("b", AddOptions::new().after(ms(5)), at(1));
    assert_eq!(
        q.waiting_deadline("b"),
        Some(at(105)),
        "delays count from the clamped now"
    );
}

#[test]
fn foreign_tickets_are_rejected() {
    let mut a = QueueState::new();
    let mut b = QueueState::new();
    a.add("k", AddOptions::new(), T0);
    b.add("k", AddOptions::new(), T0);
    let (ta, _) = take(&mut a, T0);
    assert_eq!(
        b.finish(ta, Outcome::done(), None, T0, no_pace)
            .unwrap_err(),
        ForeignTicket
    );
    assert!(b.is_queued("k"));
    assert!(a.is_processing("k"), "a's key stays in flight");
}

#[test]
fn add_ref_clones_only_new_keys() {
    let mut q: QueueState<String> = QueueState::new();
    assert_eq!(q.add_ref("a", AddOptions::new(), T0), AddStatus::Queued);
    assert_eq!(
        q.add_ref("a", AddOptions::new(), T0),
        AddStatus::AlreadyQueued
    );
    assert_eq!(q.ready_keys(), ["a".to_string()]);
}

#[test]
fn a_drained_state_gives_its_memory_back() {
    let mut q: QueueState<u64> = QueueState::new();
    for i in 0..100_000 {
        q.add(i, AddOptions::new(), T0);
    }
    let full = q.allocated_bytes();
    while let Get::Ready(t, _) = q.get(T0) {
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert!(
        q.allocated_bytes() < full / 100,
        "{} bytes kept of {full}",
        q.allocated_bytes()
    );
    q.check_invariants();
    q.add(1, AddOptions::new(), T0);
    assert_eq!(q.len(T0), 1);
}

#[test]
fn slots_are_reused_without_confusing_keys() {
    let mut q = QueueState::new();
    for round in 0..3 {
        q.add("a", AddOptions::new(), T0);
        q.add("b", AddOptions::new(), T0);
        let (ta, _) = take(&mut q, T0);
        let _ = q.finish(ta, Outcome::done(), None, T0, no_pace).unwrap();
        q.add("c", AddOptions::new(), T0);
        q.check_invariants();
        assert_eq!(drain_keys(&mut q, T0), ["b", "c"], "round {round}");
    }
}

#[test]
fn the_index_grows_like_hashbrown_and_keeps_every_key_findable() {
    let mut q: QueueState<u32> = QueueState::new();
    let mut capacities = Vec::new();
    for k in 0..10_000u32 {
        q.add(k, AddOptions::new(), T0);
        if capacities.last() != Some(&q.index.capacity()) {
            capacities.push(q.index.capacity());
        }
    }
    // Each growth doubles the bucket count: hashbrown's capacities for 4, 8, 16, ... buckets.
    assert_eq!(&capacities[..6], &[3, 7, 14, 28, 56, 112]);
    assert_eq!(*capacities.last().unwrap(), 14_336);
    q.check_invariants();
    // Hand out and finish most keys, leaving erased entries behind, then grow again: every key
    // stays findable and none is lost.
    for _ in 0..9_000 {
        let Get::Ready(t, _) = q.get(T0) else {
            panic!("a key")
        };
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    for k in 10_000..40_000u32 {
        q.add(k, AddOptions::new(), T0);
    }
    q.check_invariants();
    assert_eq!(q.counts().tracked, 31_000);
    for k in (9_000..40_000u32).step_by(97) {
        assert!(q.is_queued(&k), "key {k} lost");
    }
}

fn depths(q: &QueueState<&'static str>) -> Vec<(Option<i32>, u64)> {
    let mut d: Vec<_> = q.timing().unwrap().depth_by_priority().collect();
    d.sort();
    d
}

#[test]
fn an_undone_get_counts_the_key_in_the_depth_of_its_priority_again() {
    let mut q = QueueState::new();
    q.enable_timing();
    q.add("a", AddOptions::new().priority(5), T0);
    let (t, _) = take(&mut q, T0);
    assert_eq!(depths(&q), [(Some(0), 0), (Some(5), 0)]);
    q.unget(t);
    q.check_invariants();
    assert_eq!(depths(&q), [(Some(0), 0), (Some(5), 1)]);

    // Re-added at a higher priority while handed out: the undone get merges into that re-add.
    let (t, _) = take(&mut q, T0);
    q.add("a", AddOptions::new().priority(7), T0);
    assert_eq!(depths(&q), [(Some(0), 0), (Some(5), 0), (Some(7), 1)]);
    q.unget(t);
    q.check_invariants();
    assert_eq!(depths(&q), [(Some(0), 0), (Some(5), 0), (Some(7), 1)]);

    // Re-added at a lower priority: the undone get keeps its own, and the depth moves to it.
    let (t, _) = take(&mut q, T0);
    q.add("a", AddOptions::new().priority(1), T0);
    q.unget(t);
    q.check_invariants();
    assert_eq!(
        depths(&q),
        [(Some(0), 0), (Some(1), 0), (Some(5), 0), (Some(7), 1)]
    );
}

// ---- compaction (module docs: "Memory follows the live size") ---------------------------------

fn take_u32(q: &mut QueueState<u32>, now: Instant) -> (Ticket, u32) {
    match q.get(now) {
        Get::Ready(t, k) => (t, k),
        other => panic!("expected a key, got {other:?}"),
    }
}

/// The heap bytes of a state that took `keys` fresh (no burst), for the ratio below.
fn fresh_bytes(keys: usize) -> usize {
    let mut q: QueueState<u32> = QueueState::new();
    for k in 0..keys as u32 {
        q.add(k, AddOptions::new(), T0);
    }
    q.allocated_bytes()
}

/// One get of the head key, re-added while it is processing, then finished: it goes to the back
/// of the FIFO and the live count stays (a queue settled at its size). Checks the FIFO order
/// against `order`.
fn rotate_u32(q: &mut QueueState<u32>, order: &mut std::collections::VecDeque<u32>) {
    let (t, k) = take_u32(q, T0);
    assert_eq!(Some(k), order.pop_front(), "FIFO order survives compaction");
    q.add(k, AddOptions::new(), T0);
    let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    order.push_back(k);
}

#[test]
fn a_burst_compacts_on_the_way_down_and_the_held_lease_survives() {
    let mut q: QueueState<u32> = QueueState::new();
    // One key processing and one waiting throughout, from before the burst.
    q.add(u32::MAX, AddOptions::new(), T0);
    let (held, key) = take_u32(&mut q, T0);
    assert_eq!(key, u32::MAX);
    q.add(
        u32::MAX - 1,
        AddOptions::new().after(Duration::from_secs(3600)),
        T0,
    );
    for k in 0..20_000 {
        q.add(k, AddOptions::new(), T0);
    }
    let peak = q.allocated_bytes();
    let mut order: std::collections::VecDeque<u32> = (0..20_000).collect();
    let mut compactions = 0;
    // Down to each level, then settled there: as many rounds as live keys.
    for level in [10_000, 5_000, 2_000, 1_000, 600] {
        while q.counts().tracked > level {
            let (t, k) = take_u32(&mut q, T0);
            assert_eq!(Some(k), order.pop_front(), "FIFO order survives compaction");
            let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
        }
        for _ in 0..level {
            rotate_u32(&mut q, &mut order);
            if q.compactions() != compactions {
                compactions = q.compactions();
                q.check_invariants();
            }
        }
        let ratio = q.allocated_bytes() as f64 / fresh_bytes(level) as f64;
        assert!(
            ratio <= 4.0,
            "{level} live keys, settled, hold {ratio:.2}x a fresh state's bytes"
        );
    }
    // 20k to 600 is five halvings and a bit: one compaction each at most. (Three here: at
    // 10,000 the index's threshold, 7,168, is not crossed; 5,000, 2,000 and 600 each cross one.)
    assert!((3..=6).contains(&compactions), "{compactions} compactions");
    assert!(q.allocated_bytes() * 20 < peak);
    // The rest drains in order (a drain does not compact: it ends empty anyway).
    while let Some(next) = order.pop_front() {
        let (t, k) = take_u32(&mut q, T0);
        assert_eq!(k, next);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert_eq!(q.compactions(), compactions);
    assert_eq!(q.ticket_key(&held), Some(&u32::MAX));
    assert_eq!(q.waiting_deadline(&(u32::MAX - 1)), Some(at(3_600_000)));
    let f = q.finish(held, Outcome::done(), None, T0, no_pace).unwrap();
    assert_eq!(f.released, Some(u32::MAX));
    q.check_invariants();
}

#[test]
fn a_processing_slot_pins_the_arrays_until_its_lease_ends() {
    let mut q: QueueState<u32> = QueueState::new();
    q.set_compact_min(8);
    for k in 0..2000 {
        q.add(k, AddOptions::new(), T0);
    }
    let mut tickets: Vec<Ticket> = (0..2000).map(|_| take_u32(&mut q, T0).0).collect();
    // Leases on the top ten slots stay out; the rest end.
    let top = tickets.split_off(1990);
    for t in tickets {
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    // New keys take the freed slots, the most recently freed (highest) first.
    for k in 5000..5100 {
        q.add(k, AddOptions::new(), T0);
    }
    // Settled at 110 live keys: it compacts within as many gets.
    let mut order: std::collections::VecDeque<u32> = (5000..5100).collect();
    let mut rounds = 0;
    while q.compactions() == 0 {
        rotate_u32(&mut q, &mut order);
        rounds += 1;
        assert!(rounds <= 110, "settled for {rounds} gets and not compacted");
    }
    assert_eq!(q.compactions(), 1, "compacted, pinned by the top leases");
    q.check_invariants();
    assert_eq!(
        q.slots.len(),
        2000,
        "the arrays end after the highest lease"
    );
    for (i, t) in top.into_iter().enumerate().rev() {
        assert_eq!(q.ticket_key(&t), Some(&(1990 + i as u32)));
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
        // A pinned compaction is checked on every get: finished at the first after the last
        // lease ended.
        rotate_u32(&mut q, &mut order);
        q.check_invariants();
        assert_eq!(q.compactions(), if i == 0 { 2 } else { 1 });
    }
    assert_eq!(q.compactions(), 2, "one more once the last lease ended");
    assert!(q.slots.len() <= 2 * q.counts().tracked.max(1));
    let mut rest: Vec<u32> = Vec::new();
    while let Get::Ready(t, k) = q.get(T0) {
        rest.push(k);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert_eq!(rest, Vec::from(order));
    q.check_invariants();
}

#[test]
fn a_queue_swinging_around_a_size_does_not_rebuild_on_every_swing() {
    let mut q: QueueState<u32> = QueueState::new();
    for k in 0..8000 {
        q.add(k, AddOptions::new(), T0);
    }
    let mut next = 8000;
    // Down to 1000, then 40 swings between 1000 and 1900.
    while q.counts().tracked > 1000 {
        let (t, _) = take_u32(&mut q, T0);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    let settled = q.compactions();
    for _ in 0..40 {
        for _ in 0..900 {
            q.add(next, AddOptions::new(), T0);
            next += 1;
        }
        for _ in 0..900 {
            let (t, _) = take_u32(&mut q, T0);
            let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
        }
    }
    q.check_invariants();
    assert!(settled <= 3, "8000 to 1000 is three halvings: {settled}");
    assert!(
        q.compactions() - settled <= 1,
        "swings under a halving rebuilt {} times",
        q.compactions() - settled
    );
}

#[test]
fn a_pure_drain_to_empty_never_compacts() {
    // W1's shape: 200k distinct keys, then get and done until empty. The live count never
    // settles below a threshold, and the empty state frees everything anyway.
    let mut q: QueueState<u32> = QueueState::new();
    for k in 0..200_000 {
        q.add(k, AddOptions::new(), T0);
    }
    let mut next = 0;
    while let Get::Ready(t, k) = q.get(T0) {
        assert_eq!(k, next);
        next += 1;
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert_eq!(next, 200_000);
    assert_eq!(q.compactions(), 0, "a pure drain compacted");
    assert!(q.allocated_bytes() <= fresh_bytes(0) + 64 * 1024);
    q.check_invariants();
}

#[test]
fn a_drain_that_leaves_a_waiting_key_compacts_at_the_first_get_that_finds_nothing() {
    // A controller after its initial list: one key waits an hour, one is processing.
    let mut q: QueueState<u32> = QueueState::new();
    q.add(u32::MAX, AddOptions::new(), T0);
    let (held, _) = take_u32(&mut q, T0);
    q.add(
        u32::MAX - 1,
        AddOptions::new().after(Duration::from_secs(3600)),
        T0,
    );
    for k in 0..20_000 {
        q.add(k, AddOptions::new(), T0);
    }
    let peak = q.allocated_bytes();
    for k in 0..20_000 {
        let (t, got) = take_u32(&mut q, T0);
        assert_eq!(got, k);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert_eq!(q.compactions(), 0, "the drain itself never settled");
    // The workers' next get finds nothing ready: the drain is over.
    assert!(matches!(q.get(T0), Get::Empty { .. }));
    assert_eq!(q.compactions(), 1);
    q.check_invariants();
    assert!(q.allocated_bytes() * 50 < peak);
    assert!(matches!(q.get(T0), Get::Empty { .. }));
    assert_eq!(q.compactions(), 1, "one compaction per halving");
    assert_eq!(q.ticket_key(&held), Some(&u32::MAX));
    let _ = q.finish(held, Outcome::done(), None, T0, no_pace).unwrap();
    q.check_invariants();
}

#[test]
fn shrink_off_keeps_the_peak_and_compact_still_works() {
    let mut q: QueueState<u32> = QueueState::new();
    q.set_shrink_memory(false);
    q.add(u32::MAX, AddOptions::new().after(ms(10)), T0);
    for k in 0..5000 {
        q.add(k, AddOptions::new(), T0);
    }
    let peak = q.allocated_bytes();
    for _ in 0..4990 {
        let (t, _) = take_u32(&mut q, T0);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    assert_eq!((q.compactions(), q.allocated_bytes()), (0, peak));
    q.compact();
    q.check_invariants();
    assert_eq!(q.compactions(), 1);
    assert!(q.allocated_bytes() * 10 < peak);
    // A lease on a high slot: the explicit compaction is pinned, and not followed up.
    let (t, k) = take_u32(&mut q, T0);
    for k in 0..3000 {
        q.add(k + 10_000, AddOptions::new(), T0);
    }
    let tickets: Vec<Ticket> = (0..3000).map(|_| take_u32(&mut q, T0).0).collect();
    let mut tickets = tickets.into_iter();
    let top = tickets.next_back().expect("3000 tickets");
    for t in tickets {
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    q.compact();
    q.check_invariants();
    assert_eq!(q.compactions(), 2);
    let _ = q.finish(top, Outcome::done(), None, T0, no_pace).unwrap();
    let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    assert!(k < 5000);
    assert_eq!(drain_u32(&mut q).len(), 9);
    assert_eq!(q.compactions(), 2);
    q.check_invariants();
}

fn drain_u32(q: &mut QueueState<u32>) -> Vec<u32> {
    let mut out = Vec::new();
    while let Get::Ready(t, k) = q.get(T0) {
        out.push(k);
        let _ = q.finish(t, Outcome::done(), None, T0, no_pace).unwrap();
    }
    out
}

#[test]
fn compaction_keeps_priorities_aging_fairness_and_timing() {
    let mut q: QueueState<u32> = QueueState::new();
    q.enable_fairness();
    q.enable_aging(ms(5));
    q.enable_timing();
    q.set_compact_min(4);
    for k in 0..400u32 {
        q.add_or_return(
            k,
            AddOptions::new().priority((k % 5) as i32 - 2),
            Some(u64::from(k % 3)),
            T0,
        );
    }
    for k in 400..420u32 {
        q.add(
            k,
            AddOptions::new().priority(1).after(ms(k as u64 - 390)),
            T0,
        );
    }
    let mut now = 0;
    let mut held = Vec::new();
    while q.counts().tracked > 5 {
        now += 1;
        if let Get::Ready(t, _) = q.get(at(now / 10)) {
            held.push(t);
        }
        if held.len() > 3 {
            let t = held.remove(0);
            // Two in three come back: the live count falls slowly enough to settle.
            let outcome = if now % 3 != 0 {
                Outcome::requeue_after(ms(1))
            } else {
                Outcome::done()
            };
            let _ = q.finish(t, outcome, None, at(now / 10), no_pace).unwrap();
        }
        q.check_invariants();
    }
    assert!(q.compactions() >= 3, "{} compactions", q.compactions());
}

/// A key that stays queued at the head of the age order (a low priority) while thousands of
/// others pass through: their entries go stale behind it, and the order is pruned to a bound
/// of the live count instead of growing with the traffic.
#[test]
fn the_age_order_stays_bounded_behind_an_old_queued_key() {
    let mut q: QueueState<u32> = QueueState::new();
    q.enable_aging(Duration::from_secs(3600));
    q.add_or_return(
        u32::MAX,
        AddOptions::new().priority(LOW_PRIORITY),
        Some(0),
        T0,
    );
    let mut longest = 0;
    for k in 0..20_000u32 {
        q.add(k, AddOptions::new(), at(u64::from(k)));
        let (t, got) = match q.get(at(u64::from(k))) {
            Get::Ready(t, got) => (t, got),
            other => panic!("expected a key, got {other:?}"),
        };
        assert_eq!(got, k, "priority 0 first");
        let _ = q
            .finish(t, Outcome::done(), None, at(u64::from(k)), no_pace)
            .unwrap();
        longest = longest.max(q.aging.as_ref().unwrap().order_len());
        if k % 1000 == 0 {
            q.check_invariants();
        }
    }
    assert!(
        longest <= 2 * 2 + 1024,
        "the order reached {longest} entries"
    );
    q.check_invariants();
}

/// The overdue search steps over the entries of keys being processed (kept for an undone get)
/// and drops the stale entries behind them, so the oldest queued key is found in order.
#[test]
fn the_overdue_search_steps_over_processing_keys_and_drops_stale_entries() {
    let mut q: QueueState<&'static str> = QueueState::new();
    q.enable_aging(ms(10));
    q.add("held", AddOptions::new(), T0);
    q.add("low-1", AddOptions::new().priority(LOW_PRIORITY), at(1));
    q.add("low-2", AddOptions::new().priority(LOW_PRIORITY), at(2));
    // `held` is processing with the oldest entry; two keys pass through after it, stale.
    let (held, _) = take(&mut q, at(3));
    for k in ["pass-1", "pass-2"] {
        q.add(k, AddOptions::new(), at(4));
        let (t, got) = take(&mut q, at(4));
        assert_eq!(got, k);
        let _ = q.finish(t, Outcome::done(), None, at(4), no_pace).unwrap();
    }
    q.add("fresh", AddOptions::new(), at(5));
    q.check_invariants();
    // At 12 ms low-1 has waited longer than 10 ms; low-2 has waited 10 ms, not longer.
    assert_eq!(take(&mut q, at(12)).1, "low-1", "overdue before priority 0");
    q.check_invariants();
    assert_eq!(take(&mut q, at(12)).1, "fresh");
    assert_eq!(take(&mut q, at(13)).1, "low-2");
    let _ = q
        .finish(held, Outcome::done(), None, at(13), no_pace)
        .unwrap();
    q.check_invariants();
}

//! Priorities (`add_with`): the per-key rules, and controller-runtime's priority-queue scenarios
//! (reference section 5.7) that carry over to our client-go semantics, on a `ManualClock`.

use std::time::Duration;

use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::state::AddStatus;
use workqueue_core::{AddOptions, Clock, LOW_PRIORITY, ManualClock, Outcome, WorkQueue};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn queue() -> (WorkQueue<&'static str>, ManualClock) {
    let clock = ManualClock::new();
    (WorkQueue::builder().clock(clock.clone()).build(), clock)
}

fn at(priority: i32) -> AddOptions {
    AddOptions::new().priority(priority)
}

fn after(d: Duration, priority: i32) -> AddOptions {
    AddOptions::new().priority(priority).after(d)
}

/// Gets and finishes every ready key: `(key, priority)` in the order they were handed out.
fn drain(q: &WorkQueue<&'static str>) -> Vec<(&'static str, i32)> {
    let mut out = Vec::new();
    while let Some(lease) = q.try_get() {
        out.push((*lease, lease.priority()));
        lease.done();
    }
    out
}

#[test]
fn higher_priorities_are_served_first_and_fifo_within_a_priority() {
    let (q, _) = queue();
    for (key, p) in [
        ("low-1", -5),
        ("mid-1", 0),
        ("high-1", 10),
        ("low-2", -5),
        ("mid-2", 0),
        ("high-2", 10),
    ] {
        q.add_with(key, at(p));
    }
    assert_eq!(q.len(), 6);
    assert_eq!(
        drain(&q),
        [
            ("high-1", 10),
            ("high-2", 10),
            ("mid-1", 0),
            ("mid-2", 0),
            ("low-1", -5),
            ("low-2", -5)
        ]
    );
}

#[test]
fn a_queued_key_keeps_the_highest_priority_and_moves_to_the_tail_when_raised() {
    let (q, _) = queue();
    q.add_with("initial", at(LOW_PRIORITY));
    q.add_with("bumped", at(LOW_PRIORITY));
    q.add("change-1");
    q.add("change-2");
    // Never lowered (controller-runtime: "will not decrease the priority").
    assert_eq!(
        q.add_with("change-1", at(LOW_PRIORITY)),
        AddStatus::AlreadyQueued
    );
    assert_eq!(q.add("change-1"), AddStatus::AlreadyQueued);
    // Raised: to the tail of level 0, ahead of the other LOW key.
    assert_eq!(q.add("bumped"), AddStatus::Raised);
    assert_eq!(q.len(), 4);
    assert_eq!(
        drain(&q),
        [
            ("change-1", 0),
            ("change-2", 0),
            ("bumped", 0),
            ("initial", LOW_PRIORITY)
        ]
    );
}

#[test]
fn a_raised_key_processed_then_readded_at_its_old_level_is_served_once_there() {
    let (q, _) = queue();
    q.add_with("a", at(LOW_PRIORITY));
    q.add_with("b", at(LOW_PRIORITY));
    assert_eq!(q.add("a"), AddStatus::Raised);
    let lease = q.try_get().unwrap();
    assert_eq!((*lease, lease.priority()), ("a", 0));
    lease.done();
    q.add_with("a", at(LOW_PRIORITY));
    // No stale entry of "a" from its raise survives in the LOW level.
    assert_eq!(drain(&q), [("b", LOW_PRIORITY), ("a", LOW_PRIORITY)]);
    assert!(q.try_get().is_none());
}

#[test]
fn a_waiting_entry_keeps_the_earliest_time_and_the_highest_priority() {
    let (q, clock) = queue();
    assert_eq!(q.add_with("w", after(ms(10), 1)), AddStatus::Waiting);
    assert_eq!(
        q.add_with("w", after(ms(20), 5)),
        AddStatus::Waiting,
        "raised"
    );
    assert_eq!(
        q.add_with("w", after(ms(5), 0)),
        AddStatus::Waiting,
        "earlier"
    );
    assert_eq!(
        q.add_with("w", after(ms(30), -1)),
        AddStatus::AlreadyWaiting
    );
    q.add("other");
    clock.advance(ms(5));
    assert_eq!(
        drain(&q),
        [("w", 5), ("other", 0)],
        "due at 5 ms, at priority 5"
    );
}

#[test]
fn a_due_entry_merges_into_a_queued_key_by_taking_the_higher_priority() {
    let (q, clock) = queue();
    q.add_with("k", at(LOW_PRIORITY));
    q.add("x");
    // A reminder at a higher priority: when due, it raises the queued key (client-go's
    // reminders stay independent of the FIFO).
    q.add_with("k", after(ms(1), 3));
    assert_eq!(q.counts().waiting, 1);
    clock.advance(ms(1));
    assert_eq!(drain(&q), [("k", 3), ("x", 0)]);
}

#[test]
fn a_key_readded_while_processing_is_queued_at_the_highest_priority_asked_for() {
    let (q, _) = queue();
    q.add("k");
    q.add("other");
    let lease = q.try_get().unwrap();
    assert_eq!(q.add_with("k", at(LOW_PRIORITY)), AddStatus::Dirty);
    assert_eq!(q.add_with("k", at(7)), AddStatus::AlreadyDirty);
    assert_eq!(q.add_with("k", at(2)), AddStatus::AlreadyDirty);
    lease.done();
    assert_eq!(drain(&q), [("k", 7), ("other", 0)]);
}

#[test]
fn a_retry_keeps_the_priority_the_lease_had() {
    let (q, clock) = queue();
    q.add_with("k", at(LOW_PRIORITY));
    let lease = q.try_get().unwrap();
    assert_eq!(lease.priority(), LOW_PRIORITY);
    lease.finish(Outcome::retry_after(ms(1)));
    q.add("other");
    clock.advance(ms(1));
    assert_eq!(drain(&q), [("other", 0), ("k", LOW_PRIORITY)]);
}

/// controller-runtime's `TestWhenAddingMultipleItemsWithRatelimitTrueTheyDontAffectEachOther`,
/// and its rule that a rate-limited add waits the shorter of `after` and the limiter's delay.
#[test]
fn a_rate_limited_add_waits_the_shorter_of_after_and_the_limiters_delay() {
    let clock = ManualClock::new();
    let q: WorkQueue<&str> = WorkQueue::builder()
        .clock(clock.clone())
        .rate_limiter(ExponentialFailure::new(ms(5), Duration::from_secs(1000)))
        .build();
    let rl = AddOptions::new().rate_limited(true);
    q.add_batch_with(["foo", "bar"], rl);
    assert_eq!(q.num_requeues(&"foo"), 1, "the limiter was asked");
    clock.advance(ms(5));
    assert_eq!(drain(&q), [("foo", 0), ("bar", 0)]);
    // A second failure of "foo": the limiter says 10 ms, `after` says 2 ms; the shorter wins.
    q.add_with(
        "foo",
        AddOptions::new()
            .after(ms(2))
            .rate_limited(true)
            .priority(1),
    );
    assert_eq!(q.num_requeues(&"foo"), 2);
    clock.advance(ms(2));
    assert_eq!(drain(&q), [("foo", 1)]);
}

/// controller-runtime's `TestHighPriorityItemsAreReturnedBeforeLowPriorityItemMultipleTimes`,
/// for delays of 0 and 1 s.
#[test]
fn interleaved_priorities_come_out_by_priority_then_fifo() {
    for delay in [Duration::ZERO, Duration::from_secs(1)] {
        let clock = ManualClock::new();
        let q: WorkQueue<(i32, u32)> = WorkQueue::builder().clock(clock.clone()).build();
        for i in 0..200 {
            for p in [10, 5, 0, -5, -10] {
                q.add_with((p, i), after(delay, p));
            }
        }
        clock.advance(delay);
        let mut out = Vec::new();
        while let Some(lease) = q.try_get() {
            assert_eq!(lease.priority(), lease.0);
            out.push(*lease);
            lease.done();
        }
        let expected: Vec<(i32, u32)> = [10, 5, 0, -5, -10]
            .into_iter()
            .flat_map(|p| (0..200).map(move |i| (p, i)))
            .collect();
        assert_eq!(out, expected, "delay {delay:?}");
    }
}

#[test]
fn shutdown_still_drains_queued_keys_by_priority() {
    let (q, _) = queue();
    q.add_with("low", at(LOW_PRIORITY));
    q.add("mid");
    q.shut_down();
    assert_eq!(q.add_with("late", at(100)), AddStatus::ShutDown);
    assert_eq!(drain(&q), [("mid", 0), ("low", LOW_PRIORITY)]);
    assert!(q.get().is_none());
}

/// Scenario 1 of the priorities issue (controller-runtime #3496): one worker, 1,000 keys of an
/// initial list at `LOW_PRIORITY`, and 50 keys at priority 0 that are each re-added when their
/// lease ends, so the worker is always busy. Every reconcile takes `S` of virtual time.
/// Returns, for each LOW key served, `(its position among the LOW keys served, its wait)`.
fn resync_starvation(max_ready_wait: Option<Duration>, gets: usize) -> Vec<(usize, Duration)> {
    const S: Duration = Duration::from_millis(10);
    let clock = ManualClock::new();
    let mut b = WorkQueue::builder().clock(clock.clone());
    if let Some(d) = max_ready_wait {
        b = b.max_ready_wait(d);
    }
    let q: WorkQueue<(bool, u32)> = b.build();
    q.add_batch_with((0..1000).map(|i| (true, i)), at(LOW_PRIORITY));
    for i in 0..50 {
        q.add((false, i));
    }
    let start = clock.now();
    let mut low = Vec::new();
    for _ in 0..gets {
        let lease = q.try_get().expect("the worker is always busy");
        let (is_low, _) = *lease;
        if is_low {
            low.push((low.len(), clock.now().saturating_duration_since(start)));
        }
        clock.advance(S);
        let key = *lease;
        lease.done();
        if !is_low {
            q.add(key);
        }
    }
    low
}

#[test]
fn without_aging_a_busy_queue_starves_its_low_priority_keys() {
    assert!(resync_starvation(None, 10_000).is_empty());
}

#[test]
fn with_aging_every_low_priority_key_is_served_within_the_bound() {
    let d = Duration::from_secs(1);
    let s = Duration::from_millis(10);
    let low = resync_starvation(Some(d), 1_000 + 1_000);
    assert_eq!(low.len(), 1_000, "every LOW key is served");
    for &(k, wait) in &low {
        // The k overdue LOW keys ahead of it each take one service time.
        assert!(
            wait <= d + s * (k as u32 + 1),
            "LOW key #{k} waited {wait:?}, more than {:?}",
            d + s * (k as u32 + 1)
        );
    }
}

/// A raised key ages from when it first became ready, not from the raise, although it sits at
/// the tail of its new level.
#[test]
fn a_raised_key_ages_from_its_first_ready_time() {
    let clock = ManualClock::new();
    let q: WorkQueue<&str> = WorkQueue::builder()
        .clock(clock.clone())
        .max_ready_wait(ms(10))
        .build();
    q.add_with("a", at(LOW_PRIORITY));
    clock.advance(ms(8));
    q.add("b");
    q.add("c");
    assert_eq!(q.add("a"), AddStatus::Raised);
    clock.advance(ms(2));
    // At exactly 10 ms "a" is not overdue yet ("strictly longer"): priority order.
    assert_eq!(*q.try_get().unwrap(), "b");
    clock.advance(ms(1));
    // At 11 ms it is: served before "c", which is ahead of it in level 0.
    assert_eq!(drain(&q), [("a", 0), ("c", 0)]);
}

/// The group function takes the key type, `&String`.
#[allow(clippy::ptr_arg)]
fn namespace(key: &String) -> String {
    key.split('/').next().unwrap_or_default().to_owned()
}

/// Scenario 2 of the priorities issue: one namespace adds 10,000 keys, then ten namespaces add
/// one each. With fairness each of the ten is served within the first 11 gets; without it, only
/// after the 10,000.
#[test]
fn a_noisy_tenant_does_not_starve_the_others_with_fairness() {
    for fair in [true, false] {
        let mut b = WorkQueue::builder().clock(ManualClock::new());
        if fair {
            b = b.fairness(namespace);
        }
        let q: WorkQueue<String> = b.build();
        q.add_batch((0..10_000).map(|i| format!("noisy/{i}")));
        for t in 0..10 {
            q.add(format!("tenant-{t}/obj"));
        }
        let mut served_at = Vec::new();
        let mut n = 0;
        while let Some(lease) = q.try_get() {
            n += 1;
            if !lease.starts_with("noisy/") {
                served_at.push(n);
            }
            lease.done();
        }
        assert_eq!(served_at.len(), 10);
        if fair {
            assert!(served_at.iter().all(|&n| n <= 11), "{served_at:?}");
            assert_eq!(served_at, (2..=11).collect::<Vec<_>>(), "round-robin");
        } else {
            assert!(served_at.iter().all(|&n| n > 10_000), "{served_at:?}");
        }
    }
}

/// With aging, overdue keys are served round-robin across groups too: overload does not turn
/// fairness back into one FIFO.
#[test]
fn overdue_keys_are_served_round_robin_across_groups() {
    let clock = ManualClock::new();
    let q: WorkQueue<String> = WorkQueue::builder()
        .clock(clock.clone())
        .fairness(namespace)
        .max_ready_wait(ms(10))
        .build();
    for i in 0..5 {
        q.add(format!("a/{i}"));
    }
    for i in 0..5 {
        q.add(format!("b/{i}"));
    }
    q.add_with("c/hi".to_string(), at(5));
    clock.advance(ms(11));
    // Every key is overdue now: the overdue level is fair across a, b and c, oldest first
    // within each group, ahead of the priority of "c/hi".
    let order: Vec<String> = std::iter::from_fn(|| q.try_get().map(|l| l.clone())).collect();
    assert_eq!(
        order,
        [
            "a/0", "b/0", "c/hi", "a/1", "b/1", "a/2", "b/2", "a/3", "b/3", "a/4", "b/4"
        ]
    );
}

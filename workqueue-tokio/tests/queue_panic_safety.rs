//! User code that panics inside the async queue (the core crate docs' rule for user code), on paused time: a key's
//! `Clone` in `get`, and a batch's iterator while a getter waits. The queue's core is shared
//! with the blocking queue (see `workqueue-core/tests/panic_safety.rs` for the rest); these
//! cases depend on how the async driver waits.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::time::Duration;

use futures_util::FutureExt;
use workqueue_model::faults::{self, Fault, FaultyKey};
use workqueue_tokio::WorkQueue;

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_add_batch_whose_iterator_panics_wakes_a_waiting_getter() {
    let queue: WorkQueue<String> = WorkQueue::new();
    let getter = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await.map(|l| l.clone()) }
    });
    // The getter runs until it waits for a key.
    tokio::task::yield_now().await;
    assert!(!getter.is_finished());
    let keys = ["a", "b", "c"].into_iter().map(|k| {
        assert_ne!(k, "c", "the iterator panics");
        k.to_string()
    });
    assert!(catch_unwind(AssertUnwindSafe(|| queue.add_batch(keys))).is_err());
    // On paused time a getter that was never woken would time out here, deterministically.
    let got = tokio::time::timeout(Duration::from_secs(1), getter)
        .await
        .expect("the waiting getter was woken")
        .unwrap();
    assert_eq!(got.as_deref(), Some("a"));
    assert_eq!(queue.len(), 1, "b was added too");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn an_async_get_whose_clone_panics_leaves_the_key_queued() {
    faults::silence_injected_panics();
    let queue: WorkQueue<FaultyKey> = WorkQueue::new();
    queue.add(FaultyKey::from("a"));
    // The test's future runs on this thread, so the thread-local fault strikes in `get`.
    faults::arm(Fault::Clone, 1);
    let got = AssertUnwindSafe(queue.get()).catch_unwind().await;
    faults::disarm_all();
    assert!(got.is_err());
    let c = queue.counts();
    assert_eq!((c.ready, c.processing), (1, 0), "the key is not stranded");
    let lease = queue.get().await.expect("still queued");
    assert_eq!(lease.as_str(), "a");
    lease.done();
    queue.shut_down();
    assert!(
        queue
            .shut_down_with_drain_timeout(Duration::ZERO)
            .await
            .is_ok()
    );
}

//! Only one idle `get` sleeps until the earliest deadline; when it is cancelled, or takes a key
//! and does not come back, another getter must take the timer over. Paused time: a lost hand-off
//! would hang, and the outer `timeout` turns that into a failure.

use std::time::Duration;

use tokio::time::{Instant, timeout};
use workqueue_tokio::WorkQueue;

const GUARD: Duration = Duration::from_secs(3600);

#[tokio::test(start_paused = true)]
async fn cancelling_the_timing_getter_hands_the_timer_over() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    let start = Instant::now();
    queue.add_after(7, Duration::from_secs(10));
    // The first getter claims the timer and gives up after one second.
    let first = tokio::spawn({
        let queue = queue.clone();
        async move { timeout(Duration::from_secs(1), queue.get()).await.is_err() }
    });
    tokio::task::yield_now().await;
    // The second waits for a notification only, since the first times the queue.
    let second = tokio::spawn({
        let queue = queue.clone();
        async move { queue.get().await.map(|l| *l) }
    });
    assert!(
        first.await.unwrap(),
        "the first getter should have timed out"
    );
    let got = timeout(GUARD, second)
        .await
        .expect("no getter timed the key");
    assert_eq!(got.unwrap(), Some(7));
    assert_eq!(start.elapsed(), Duration::from_secs(10));
}

#[tokio::test(start_paused = true)]
async fn getters_that_leave_with_a_key_hand_the_timer_over() {
    let queue: WorkQueue<u32> = WorkQueue::new();
    let start = Instant::now();
    // Each getter takes one key and never comes back, so every later deadline needs a hand-off.
    let getters: Vec<_> = (0..4)
        .map(|_| {
            let queue = queue.clone();
            tokio::spawn(async move {
                let lease = timeout(GUARD, queue.get()).await.ok().flatten()?;
                Some((*lease, start.elapsed()))
            })
        })
        .collect();
    tokio::task::yield_now().await;
    for i in 0..4u32 {
        queue.add_after(i, Duration::from_millis(100 * (u64::from(i) + 1)));
    }
    let mut got = Vec::new();
    for g in getters {
        got.push(g.await.unwrap().expect("a delayed key was never delivered"));
    }
    got.sort();
    let expected: Vec<_> = (0..4u32)
        .map(|i| (i, Duration::from_millis(100 * (u64::from(i) + 1))))
        .collect();
    assert_eq!(got, expected);
}

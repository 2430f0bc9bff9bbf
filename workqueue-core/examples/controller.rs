//! A small multi-threaded controller loop on the blocking queue.
//!
//! Four workers reconcile twelve objects. Some objects fail a few times before they succeed, and
//! the queue backs them off (1 ms, 2 ms, 4 ms, ...); an object that changes while it is being
//! reconciled runs again afterwards, never on two workers at once.
//!
//! Run: `cargo run --release -p workqueue-core --example controller`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use workqueue_core::ratelimit::ExponentialFailure;
use workqueue_core::{Outcome, WorkQueue};

fn main() {
    let queue: WorkQueue<String> = WorkQueue::builder()
        .name("demo")
        .rate_limiter(ExponentialFailure::new(
            Duration::from_millis(1),
            Duration::from_millis(50),
        ))
        .build();
    // How many times each object fails before it reconciles.
    let failures_left: Arc<Mutex<HashMap<String, u32>>> = Arc::new(Mutex::new(HashMap::new()));
    let started = Instant::now();
    let log = move |worker: usize, msg: String| {
        println!(
            "{:>7.1} ms  worker {worker}  {msg}",
            started.elapsed().as_secs_f64() * 1e3
        );
    };

    let workers: Vec<_> = (0..4)
        .map(|w| {
            let queue = queue.clone();
            let failures_left = failures_left.clone();
            thread::spawn(move || {
                let mut reconciled = 0;
                while let Some(lease) = queue.get() {
                    let key = lease.key().clone();
                    let attempt = queue.num_requeues(&key);
                    let fail = {
                        let mut left = failures_left.lock().unwrap();
                        let n = left.entry(key.clone()).or_default();
                        let fail = *n > 0;
                        *n = n.saturating_sub(1);
                        fail
                    };
                    if fail {
                        log(w, format!("{key}: failed (attempt {attempt}), backing off"));
                        lease.finish(Outcome::retry());
                    } else {
                        log(w, format!("{key}: reconciled after {attempt} failure(s)"));
                        reconciled += 1;
                        lease.finish(Outcome::forget());
                    }
                }
                reconciled
            })
        })
        .collect();

    for i in 0..12 {
        let key = format!("default/app-{i}");
        failures_left.lock().unwrap().insert(key.clone(), i % 4);
        queue.add(key);
    }
    // An update while the object may be in flight: de-duplicated or re-run after, never parallel.
    queue.add("default/app-3".to_string());

    // Wait until every object has reconciled, then drain and stop.
    while failures_left.lock().unwrap().values().any(|&n| n > 0) || queue.counts().tracked > 0 {
        thread::yield_now();
    }
    queue.shut_down_with_drain();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    println!(
        "done: {total} successful reconciles of 12 objects in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
}

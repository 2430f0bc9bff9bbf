//! Criterion benches of W4 (delay-insert), W5 (delay-precision) and W10 (ratelimited-cycle): ours
//! (blocking, and for W5 and W10 also the async queue) against the client-go port and tokio-util's
//! `DelayQueue`.
//!
//! W5 and W10 report something other than wall time through `iter_custom`, so read their
//! "time" accordingly: W5's is the p99 lateness of a run, W10's the process CPU time of a run.

mod common;

use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::{w4, w5, w10};

fn w4_delay_insert(c: &mut Criterion) {
    let n = Sizes::FULL.w4;
    let k = keys(n);
    let d = w4::delays(n);
    let mut g = common::group(c, "W4 delay-insert", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w4::ours(&k, &d)));
    g.bench_function("naive", |b| common::whole(b, || w4::naive(&k, &d)));
    g.bench_function("DelayQueue", |b| {
        common::whole(b, || w4::delay_queue(&k, &d))
    });
    g.finish();
}

fn w5_delay_precision(c: &mut Criterion) {
    let k = keys(Sizes::FULL.w5);
    // "Time" here is the p99 lateness of one run.
    let mut g = common::group(c, "W5 delay-precision p99 lateness", None);
    g.bench_function("ours", |b| common::whole(b, || w5::ours(&k).p99));
    g.bench_function("ours async", |b| {
        common::whole(b, || w5::ours_async(&k).p99)
    });
    g.bench_function("naive", |b| common::whole(b, || w5::naive(&k).p99));
    g.bench_function("DelayQueue", |b| {
        common::whole(b, || w5::delay_queue(&k).p99)
    });
    g.bench_function("tokio sleep", |b| {
        common::whole(b, || w5::tokio_sleep(&k).p99)
    });
    g.finish();
}

fn w10_ratelimited_cycle(c: &mut Criterion) {
    let n = Sizes::FULL.w10;
    let k = keys(n);
    // "Time" here is process CPU time.
    let mut g = common::group(c, "W10 ratelimited-cycle CPU", Some(n as u64));
    let cpu = |c: w10::Cost| -> Duration { c.cpu };
    g.bench_function("ours", |b| common::whole(b, || cpu(w10::ours(&k))));
    g.bench_function("ours async", |b| {
        common::whole(b, || cpu(w10::ours_async(&k)))
    });
    g.bench_function("naive", |b| common::whole(b, || cpu(w10::naive(&k))));
    g.bench_function("DelayQueue", |b| {
        common::whole(b, || cpu(w10::delay_queue(&k)))
    });
    g.finish();
}

criterion_group!(
    benches,
    w4_delay_insert,
    w5_delay_precision,
    w10_ratelimited_cycle
);
criterion_main!(benches);

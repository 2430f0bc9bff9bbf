//! Criterion bench of R1 (runner-cycle): the async queue's `Runner` with a reconcile that succeeds
//! at once, on a current-thread runtime and on a 2-thread one.
//! Each iteration is one whole workload; throughput is in items.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::r1;

fn r1_runner_cycle(c: &mut Criterion) {
    let n = Sizes::FULL.r1;
    let k = keys(n);
    let mut g = common::group(c, "R1 runner-cycle", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || r1::ours(&k)));
    g.bench_function("ours (2 threads)", |b| {
        common::whole(b, || r1::ours_multi_thread(&k))
    });
    g.finish();
}

criterion_group!(benches, r1_runner_cycle);
criterion_main!(benches);

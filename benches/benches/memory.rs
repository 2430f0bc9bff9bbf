//! W9 (memory): heap bytes per queued item, measured by a counting global allocator. Criterion
//! times the fill (1M adds); the bytes per item are printed once per implementation before.

mod common;

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use workqueue_benches::alloc::CountingAlloc;
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::w9;

#[global_allocator]
static ALLOC: CountingAlloc = CountingAlloc;

fn timed(f: impl FnOnce() -> f64) -> Duration {
    let t = Instant::now();
    std::hint::black_box(f());
    t.elapsed()
}

fn w9_memory(c: &mut Criterion) {
    let n = Sizes::FULL.w9;
    let k = keys(n);
    eprintln!(
        "W9 heap bytes per item: ours {:.1}, naive {:.1}, crossbeam {:.1}",
        w9::ours(&k),
        w9::naive(&k),
        w9::crossbeam(&k)
    );
    let mut g = common::group(c, "W9 memory (fill time)", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || timed(|| w9::ours(&k))));
    g.bench_function("naive", |b| common::whole(b, || timed(|| w9::naive(&k))));
    g.bench_function("crossbeam", |b| {
        common::whole(b, || timed(|| w9::crossbeam(&k)))
    });
    g.finish();
}

criterion_group!(benches, w9_memory);
criterion_main!(benches);

//! Criterion benches of W6 (exponential), W7 (token bucket) and W8 (default controller limiter):
//! ours against the client-go port and governor. Throughput is in `when` calls.

mod common;

use criterion::{Criterion, criterion_group, criterion_main};
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::{w6, w7, w8};

fn w6_exponential(c: &mut Criterion) {
    let s = Sizes::FULL;
    let k = keys(s.limiter_keys);
    let n = s.limiter_calls;
    let mut g = common::group(c, "W6 limiter-exp", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w6::ours(&k, n)));
    g.bench_function("naive", |b| common::whole(b, || w6::naive(&k, n)));
    g.finish();
}

fn w7_bucket(c: &mut Criterion) {
    let n = Sizes::FULL.limiter_calls;
    let mut g = common::group(c, "W7 limiter-bucket", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w7::ours(n)));
    g.bench_function("naive", |b| common::whole(b, || w7::naive(n)));
    g.bench_function("governor", |b| common::whole(b, || w7::governor(n)));
    g.finish();
}

fn w8_default(c: &mut Criterion) {
    let s = Sizes::FULL;
    let k = keys(s.limiter_keys);
    let n = s.limiter_calls;
    let mut g = common::group(c, "W8 limiter-default", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w8::ours(&k, n)));
    g.bench_function("ours now per round", |b| {
        common::whole(b, || w8::ours_shared_now(&k, n))
    });
    g.bench_function("naive", |b| common::whole(b, || w8::naive(&k, n)));
    g.finish();
}

criterion_group!(benches, w6_exponential, w7_bucket, w8_default);
criterion_main!(benches);

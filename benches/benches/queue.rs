//! Criterion benches of W1 (cycle), W2 (dedup), W3 (mpmc), W11 (priority-cycle), W12
//! (fair-cycle) and W13 (named-cycle, with the `metrics` feature): ours against the client-go port
//! and crossbeam (W11, W12, W13: against our own W1).
//! Each iteration is one whole workload; throughput is in items (W2: adds).

mod common;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use workqueue_benches::keys;
use workqueue_benches::report::Sizes;
use workqueue_benches::workloads::{w1, w2, w3, w11, w12};

fn w1_cycle(c: &mut Criterion) {
    let n = Sizes::FULL.w1;
    let k = keys(n);
    let mut g = common::group(c, "W1 cycle", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w1::ours(&k)));
    g.bench_function("naive", |b| common::whole(b, || w1::naive(&k)));
    g.bench_function("crossbeam", |b| common::whole(b, || w1::crossbeam(&k)));
    g.finish();
}

fn w2_dedup(c: &mut Criterion) {
    let s = Sizes::FULL;
    let k = keys(s.w2_keys);
    let r = s.w2_rounds;
    let mut g = common::group(c, "W2 dedup", Some((s.w2_keys * r) as u64));
    g.bench_function("ours", |b| common::whole(b, || w2::ours(&k, r)));
    g.bench_function("ours add_ref", |b| {
        common::whole(b, || w2::ours_add_ref(&k, r))
    });
    g.bench_function("naive", |b| common::whole(b, || w2::naive(&k, r)));
    g.finish();
}

fn w3_mpmc(c: &mut Criterion) {
    let n = Sizes::FULL.w3;
    let k = keys(n);
    let mut g = common::group(c, "W3 mpmc", Some(n as u64));
    // 2 producers and 2 consumers, as BENCHMARKS.md says; the report's --scaling varies them.
    let t = 2;
    g.bench_with_input(BenchmarkId::new("ours", t), &t, |b, &t| {
        common::whole(b, || w3::ours(&k, t, t))
    });
    g.bench_with_input(BenchmarkId::new("naive", t), &t, |b, &t| {
        common::whole(b, || w3::naive(&k, t, t))
    });
    g.bench_with_input(BenchmarkId::new("crossbeam", t), &t, |b, &t| {
        common::whole(b, || w3::crossbeam(&k, t, t))
    });
    g.finish();
}

fn w11_priority_cycle(c: &mut Criterion) {
    let n = Sizes::FULL.w1;
    let k = keys(n);
    let mut g = common::group(c, "W11 priority-cycle", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w11::ours(&k)));
    g.bench_function("ours (aging)", |b| common::whole(b, || w11::ours_aging(&k)));
    // The target's peer, in the same group so that a `W11` filter runs both.
    g.bench_function("ours W1 (add)", |b| common::whole(b, || w1::ours(&k)));
    g.finish();
}

fn w12_fair_cycle(c: &mut Criterion) {
    let n = Sizes::FULL.w1;
    let k = keys(n);
    let mut g = common::group(c, "W12 fair-cycle", Some(n as u64));
    g.bench_function("ours", |b| common::whole(b, || w12::ours(&k)));
    // The target's peer, in the same group so that a `W12` filter runs both.
    g.bench_function("ours W1 (add)", |b| common::whole(b, || w1::ours(&k)));
    g.finish();
}

/// W13 (named-cycle): with the `metrics` feature only (`cargo bench --features metrics`).
fn w13_named_cycle(c: &mut Criterion) {
    #[cfg(feature = "metrics")]
    {
        let n = Sizes::FULL.w1;
        let k = keys(n);
        let mut g = common::group(c, "W13 named-cycle", Some(n as u64));
        g.bench_function("ours", |b| {
            common::whole(b, || workqueue_benches::workloads::w13::ours(&k))
        });
        // The target's peer, in the same group so that a `W13` filter runs both.
        g.bench_function("ours W1 (add)", |b| common::whole(b, || w1::ours(&k)));
        g.finish();
    }
    #[cfg(not(feature = "metrics"))]
    let _ = c;
}

criterion_group!(
    benches,
    w1_cycle,
    w2_dedup,
    w3_mpmc,
    w11_priority_cycle,
    w12_fair_cycle,
    w13_named_cycle
);
criterion_main!(benches);

//! Criterion settings shared by the bench targets: each iteration is one whole workload (timed by
//! the workload function itself through `iter_custom`), so few, flat samples.

#![allow(dead_code)]

use std::time::Duration;

use criterion::measurement::WallTime;
use criterion::{Bencher, BenchmarkGroup, Criterion, SamplingMode, Throughput};

/// A group for whole-workload iterations: 10 flat samples, short warm-up.
pub fn group<'a>(
    c: &'a mut Criterion,
    name: &str,
    elements: Option<u64>,
) -> BenchmarkGroup<'a, WallTime> {
    let mut g = c.benchmark_group(name);
    g.sample_size(10)
        .sampling_mode(SamplingMode::Flat)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(5));
    if let Some(n) = elements {
        g.throughput(Throughput::Elements(n));
    }
    g
}

/// Times `iters` runs of a workload whose function returns the duration of its timed region.
pub fn whole(b: &mut Bencher<'_, WallTime>, mut run: impl FnMut() -> Duration) {
    b.iter_custom(|iters| (0..iters).map(|_| run()).sum());
}

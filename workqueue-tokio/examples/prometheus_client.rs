//! The queue's and the runner's metrics in a `prometheus-client` registry, beside the
//! application's own metrics (the setup of most kube-rs controllers).
//!
//! `cargo run -p workqueue-tokio --example prometheus_client [-- --seconds S]`
//!
//! The library emits its metrics through the [`metrics`](https://docs.rs/metrics) facade, which
//! a `prometheus-client` registry does not read. [`Bridge`] joins the two: installed as the
//! facade's recorder, it keeps every metric emitted (as a `prometheus-client` counter, gauge or
//! histogram), and registered in a `Registry` as a collector, it encodes them at each scrape,
//! with the registry's own metrics and its prefix, in the registry's format. Copy it into your
//! program (it is written against the `prometheus-client` and `metrics` versions your program
//! uses), then:
//!
//! ```text
//! let mut registry = Registry::default();
//! // ... the application's own metrics ...
//! Bridge::install(&mut registry)?;
//! // serve `prometheus_client::encoding::text::encode(&mut body, &registry)` on /metrics
//! ```
//!
//! Counters are encoded as OpenMetrics names them: the family without `_total`, the sample with
//! it, so `controller_runtime_reconcile_total` keeps its name. A name emitted as two kinds (a
//! counter and a gauge) keeps the first; the other's values are dropped.
//!
//! Runs the `prometheus` example's controller for `--seconds` (default 3) and prints the
//! registry's text.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::gauge::Gauge as PromGauge;
use prometheus_client::metrics::histogram::Histogram as PromHistogram;
use prometheus_client::registry::Registry;
use workqueue_tokio::CancellationToken;

#[path = "common/buckets.rs"]
mod buckets;
#[path = "common/controller.rs"]
mod controller;

pub use controller::run_controller;

type BoxError = Box<dyn Error + Send + Sync>;

/// The command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Parser)]
#[command(
    name = "prometheus_client",
    about = "The queue's and the runner's metrics in a prometheus-client registry"
)]
pub struct Options {
    /// Run the controller this many seconds, then print the registry.
    #[arg(long, default_value_t = 3)]
    pub seconds: u64,
}

/// One series of a family: the `prometheus-client` metric that the facade's handle updates.
#[derive(Debug, Clone)]
enum Series {
    Counter(PromCounter),
    Gauge(PromGauge<f64, AtomicU64>),
    Histogram(PromHistogram),
}

impl Series {
    fn metric(&self) -> &dyn EncodeMetric {
        match self {
            Series::Counter(c) => c,
            Series::Gauge(g) => g,
            Series::Histogram(h) => h,
        }
    }
}

/// The series of one metric name, by label set (label order as emitted), and its type.
/// Invariant: every series has `kind`'s type.
#[derive(Debug)]
struct Family {
    kind: MetricType,
    series: BTreeMap<Vec<(String, String)>, Series>,
}

/// What the recorder and the collector share.
#[derive(Debug, Default)]
struct Shared {
    families: BTreeMap<String, Family>,
    /// Descriptions, by name; they may come before or after the first series.
    help: BTreeMap<String, String>,
}

/// A `metrics` recorder that keeps what is emitted as `prometheus-client` metrics, and a
/// `prometheus-client` collector that encodes them: see the module docs.
#[derive(Debug, Clone, Default)]
pub struct Bridge {
    shared: Arc<Mutex<Shared>>,
    /// Histogram buckets by metric name; a histogram not named here gets Prometheus's defaults.
    buckets: Arc<BTreeMap<String, Vec<f64>>>,
}

/// Prometheus client libraries' default histogram buckets (client_golang's `DefBuckets`), for a
/// histogram the bridge has no buckets for.
const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

impl Bridge {
    /// A bridge with the queue's and the runner's histogram buckets (client-go's and
    /// controller-runtime's).
    pub fn new() -> Self {
        let buckets = buckets::BUCKETS
            .iter()
            .map(|(name, buckets)| (name.to_string(), buckets.to_vec()))
            .collect();
        Bridge {
            shared: Arc::default(),
            buckets: Arc::new(buckets),
        }
    }

    /// Registers a new bridge in `registry` and installs it as the process's `metrics` recorder
    /// (which can be done once per process).
    pub fn install(registry: &mut Registry) -> Result<Bridge, BoxError> {
        let bridge = Bridge::new();
        registry.register_collector(Box::new(bridge.clone()));
        metrics::set_global_recorder(bridge.clone())?;
        Ok(bridge)
    }

    fn shared(&self) -> std::sync::MutexGuard<'_, Shared> {
        // The map stays whole across a panic: every change to it is one insert.
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The series of `key` (made with `make` on its first emission), or `None` where the name is
    /// already a family of another type.
    fn series(&self, key: &Key, kind: MetricType, make: impl FnOnce() -> Series) -> Option<Series> {
        let labels = key
            .labels()
            .map(|l| (l.key().to_string(), l.value().to_string()))
            .collect();
        let mut shared = self.shared();
        let family = shared
            .families
            .entry(key.name().to_string())
            .or_insert_with(|| Family {
                kind,
                series: BTreeMap::new(),
            });
        // (`MetricType` has no `PartialEq`.)
        if std::mem::discriminant(&family.kind) != std::mem::discriminant(&kind) {
            return None;
        }
        Some(family.series.entry(labels).or_insert_with(make).clone())
    }

    fn describe(&self, key: KeyName, description: SharedString) {
        self.shared()
            .help
            .insert(key.as_str().to_string(), description.into_owned());
    }
}

/// A `metrics` counter that is a `prometheus-client` counter.
struct CounterHandle(PromCounter);

impl CounterFn for CounterHandle {
    fn increment(&self, value: u64) {
        self.0.inc_by(value);
    }

    fn absolute(&self, value: u64) {
        // A counter never goes down: an absolute value below the current one is ignored.
        self.0.inner().fetch_max(value, Ordering::Relaxed);
    }
}

/// A `metrics` gauge that is a `prometheus-client` gauge.
struct GaugeHandle(PromGauge<f64, AtomicU64>);

impl GaugeFn for GaugeHandle {
    fn increment(&self, value: f64) {
        self.0.inc_by(value);
    }

    fn decrement(&self, value: f64) {
        self.0.dec_by(value);
    }

    fn set(&self, value: f64) {
        self.0.set(value);
    }
}

/// A `metrics` histogram that is a `prometheus-client` histogram.
struct HistogramHandle(PromHistogram);

impl HistogramFn for HistogramHandle {
    fn record(&self, value: f64) {
        self.0.observe(value);
    }
}

impl Recorder for Bridge {
    fn describe_counter(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_gauge(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn describe_histogram(&self, key: KeyName, _: Option<Unit>, description: SharedString) {
        self.describe(key, description);
    }

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        match self.series(key, MetricType::Counter, || {
            Series::Counter(PromCounter::default())
        }) {
            Some(Series::Counter(c)) => Counter::from_arc(Arc::new(CounterHandle(c))),
            _ => Counter::noop(),
        }
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        match self.series(key, MetricType::Gauge, || {
            Series::Gauge(PromGauge::default())
        }) {
            Some(Series::Gauge(g)) => Gauge::from_arc(Arc::new(GaugeHandle(g))),
            _ => Gauge::noop(),
        }
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        let buckets = match self.buckets.get(key.name()) {
            Some(buckets) => buckets.clone(),
            None => DEFAULT_BUCKETS.to_vec(),
        };
        match self.series(key, MetricType::Histogram, || {
            Series::Histogram(PromHistogram::new(buckets))
        }) {
            Some(Series::Histogram(h)) => Histogram::from_arc(Arc::new(HistogramHandle(h))),
            _ => Histogram::noop(),
        }
    }
}

impl Collector for Bridge {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let shared = self.shared();
        for (name, family) in &shared.families {
            let help = shared.help.get(name).map_or("", String::as_str);
            // OpenMetrics names a counter's family without `_total` and its sample with it.
            let name = match family.kind {
                MetricType::Counter => name.strip_suffix("_total").unwrap_or(name),
                _ => name,
            };
            let mut metric = encoder.encode_descriptor(name, help, None, family.kind)?;
            for (labels, series) in &family.series {
                series.metric().encode(metric.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let options = Options::parse();
    let mut registry = Registry::default();
    // The application's own metric, beside the library's.
    let started = PromCounter::<u64>::default();
    registry.register(
        "app_starts",
        "Times the application started",
        started.clone(),
    );
    started.inc();
    Bridge::install(&mut registry)?;
    let stop = CancellationToken::new();
    let controller = tokio::spawn(run_controller(stop.clone()));
    tokio::time::sleep(Duration::from_secs(options.seconds)).await;
    stop.cancel();
    controller.await?;
    let mut body = String::new();
    prometheus_client::encoding::text::encode(&mut body, &registry)?;
    print!("{body}");
    Ok(())
}

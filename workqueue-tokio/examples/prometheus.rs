//! A small controller whose queue and runner metrics are served to Prometheus.
//!
//! `cargo run -p workqueue-tokio --example prometheus [-- --port N] [--seconds S]`
//!
//! Installs `metrics-exporter-prometheus` (the library itself installs no exporter) with
//! client-go's and controller-runtime's histogram buckets, serves `/metrics` on 127.0.0.1 (only
//! loopback), and runs a controller over a named queue ("example"): five objects are reconciled
//! every second, and one of them fails three times before each success, so errors, retries and
//! backoff delays show up too. Then `curl http://127.0.0.1:PORT/metrics`.
//!
//! Options: `--port N` (default 9000; 0 picks a free port), `--seconds S` (stop after S seconds;
//! default: run until Ctrl-C). The bound address is printed on the first line of output.

use std::error::Error;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use clap::Parser;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
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
    name = "prometheus",
    about = "A small controller whose metrics are served to Prometheus"
)]
pub struct Options {
    /// Port on 127.0.0.1; 0 picks a free one.
    #[arg(long, default_value_t = 9000)]
    pub port: u16,
    /// Stop after this many seconds; without it, run until Ctrl-C.
    #[arg(long)]
    pub seconds: Option<u64>,
}

/// Installs the Prometheus recorder globally (once per process) and starts serving `/metrics` on
/// 127.0.0.1:`port` on the current tokio runtime. Returns the bound address.
pub fn install_exporter(port: u16) -> Result<SocketAddr, BoxError> {
    let port = if port == 0 {
        // The exporter binds the address itself and does not report it: pick a free port first.
        std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?
            .local_addr()?
            .port()
    } else {
        port
    };
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut builder = PrometheusBuilder::new().with_http_listener(addr);
    for (name, buckets) in buckets::BUCKETS {
        builder = builder.set_buckets_for_metric(Matcher::Full(name.to_string()), buckets)?;
    }
    let (recorder, exporter) = builder.build()?;
    metrics::set_global_recorder(recorder)?;
    tokio::spawn(async move {
        if let Err(e) = exporter.await {
            eprintln!("metrics exporter stopped: {e:?}");
        }
    });
    Ok(addr)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let options = Options::parse();
    let addr = install_exporter(options.port)?;
    println!("serving metrics on http://{addr}/metrics");
    let stop = CancellationToken::new();
    let controller = tokio::spawn(run_controller(stop.clone()));
    match options.seconds {
        Some(s) => tokio::time::sleep(Duration::from_secs(s)).await,
        None => tokio::signal::ctrl_c().await?,
    }
    stop.cancel();
    let report = controller.await?;
    println!("{report:?}");
    Ok(())
}

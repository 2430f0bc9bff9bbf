//! The counter controller on a simulated API: ConfigMaps annotated with a number of replicas
//! drive Deployments.
//!
//! `cargo run -p workqueue-tokio --example counter`
//!
//! A scripted cluster plays each case in turn (create, update, an invalid annotation, a
//! Deployment that appears late, drift from hand-scaling, a short outage, a delete) and prints the
//! objects after each step; the controller runs until SIGTERM or SIGINT (Ctrl-C), then shuts down
//! gracefully and prints its report. `RUST_LOG`-style logs are not set up: the output is the
//! script's. The same cases run as tests on paused time in `tests/counter_controller.rs`.
//!
//! - `api.rs`: the simulated API server and client (store, watch channel, latency, outages);
//! - `controller.rs`: the controller (reconcile, error policy, sources);
//! - this file: the script, and shutdown on signals.

mod api;
mod controller;

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::sleep;
use tokio_util::sync::CancellationToken;

use api::{Api, ConfigMap, Deployment};
use controller::REPLICAS;

/// How long the script lets the controller work after each step.
const STEP: Duration = Duration::from_millis(500);

fn configmap(name: &str, replicas: &str) -> ConfigMap {
    ConfigMap {
        name: name.to_string(),
        annotations: BTreeMap::from([(REPLICAS.to_string(), replicas.to_string())]),
    }
}

fn deployment(name: &str, replicas: u32) -> Deployment {
    Deployment {
        name: name.to_string(),
        replicas,
        owner: Some(name.to_string()),
    }
}

fn show(api: &Api, step: &str) {
    println!("== {step}");
    for name in ["default/web", "default/db"] {
        let cm = api.configmap(name).map(|cm| cm.annotations);
        let d = api.deployment(name).map(|d| d.replicas);
        println!("   {name}: configmap {cm:?}, deployment replicas {d:?}");
    }
    println!(
        "   requests so far: {}, events recorded: {}",
        api.requests(),
        api.events().len()
    );
}

/// The scripted cluster.
async fn script(api: Api) {
    api.put_deployment(deployment("default/web", 1));
    api.put_configmap(configmap("default/web", "3"));
    sleep(STEP).await;
    show(&api, "create: web asks for 3");
    api.put_configmap(configmap("default/web", "5"));
    sleep(STEP).await;
    show(&api, "update: web asks for 5");
    api.put_configmap(configmap("default/db", "three"));
    api.put_deployment(deployment("default/db", 1));
    sleep(STEP).await;
    show(
        &api,
        "invalid: db asks for \"three\" (an event, a few retries, no storm)",
    );
    api.put_configmap(configmap("default/db", "2"));
    api.delete_configmap("default/web");
    sleep(STEP).await;
    api.put_configmap(configmap("default/web", "4"));
    sleep(STEP).await;
    show(
        &api,
        "late: db fixed; web re-created without its Deployment",
    );
    api.put_deployment(deployment("default/web", 1));
    sleep(STEP).await;
    show(&api, "late: web's Deployment appears");
    api.put_deployment(deployment("default/web", 9));
    sleep(STEP).await;
    show(&api, "drift: web scaled to 9 by hand");
    api.set_down(true);
    api.put_configmap(configmap("default/web", "6"));
    sleep(Duration::from_secs(3)).await;
    show(&api, "outage: 3 s, web asked for 6 meanwhile");
    api.set_down(false);
    sleep(Duration::from_secs(3)).await;
    show(&api, "outage over");
    api.delete_configmap("default/db");
    sleep(STEP).await;
    show(&api, "delete: db's ConfigMap");
    println!("== done; Ctrl-C (SIGINT) or SIGTERM stops the controller");
}

/// Completes on SIGINT or SIGTERM.
async fn signalled() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate())?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r,
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    tokio::signal::ctrl_c().await
}

#[tokio::main]
async fn main() {
    let api = Api::new();
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            if let Err(e) = signalled().await {
                eprintln!("cannot listen for signals ({e}); stopping");
            }
            shutdown.cancel();
        }
    });
    tokio::spawn(script(api.clone()));
    let report = controller::run(api, shutdown).await;
    println!("stopped: {report:?}");
}

//! The counter controller on kube-rs, against a real cluster: ConfigMaps annotated with a number
//! of replicas drive the Deployments they own.
//!
//! `cargo run -p workqueue-kube --example kube_counter` (the cluster of the current kubeconfig
//! context, or the in-cluster config; it watches ConfigMaps and Deployments in all namespaces,
//! and patches them). Try it:
//!
//! ```text
//! kubectl create configmap web
//! kubectl create deployment web --image=nginx --replicas=1
//! kubectl patch deployment web --type=merge -p "{\"metadata\":{\"ownerReferences\":[{\"apiVersion\":\"v1\",\"kind\":\"ConfigMap\",\"name\":\"web\",\"uid\":\"$(kubectl get configmap web -o jsonpath='{.metadata.uid}')\"}]}}"
//! kubectl annotate configmap web counter.example/replicas=3   # web is scaled to 3
//! kubectl scale deployment web --replicas=9                   # and back to 3
//! kubectl annotate --overwrite configmap web counter.example/replicas=three  # Events, a few retries
//! ```
//!
//! It runs until SIGTERM or SIGINT (Ctrl-C), then shuts down gracefully and prints its report.
//! The same controller runs against a scripted API server in `tests/counter_controller.rs`.
//!
//! - `controller.rs`: the controller (reconcile, error policy, sources);
//! - this file: the client, and shutdown on signals.

mod controller;

use tokio_util::sync::CancellationToken;

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
async fn main() -> Result<(), kube::Error> {
    let client = kube::Client::try_default().await?;
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
    let report = controller::run(client, shutdown).await;
    println!("stopped: {report:?}");
    Ok(())
}

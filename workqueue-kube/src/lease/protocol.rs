//! [`ShardLeases`]: one replica's side of the protocol, as a task.

use std::future::Future;
use std::sync::Arc;

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use tokio::sync::{mpsc, watch};
use tracing::Instrument;

use super::assignment::{Assignment, ShardEvents};
use super::clock::{LeaseClock, TokioClock};
use super::config::{ConfigError, LeaseConfig, Settings};
use super::driver::{Driver, Ended};
use super::failures::Tell;

/// One replica's side of the Lease protocol: keeps its membership, holds its share of the
/// shards and tells the controller what it holds (see the [module documentation](crate::lease)).
/// `Controller::leases` makes one from a [`LeaseConfig`], spawns [`ShardLeases::run`] and
/// follows the [`ShardEvents`] (`controller::shards`).
pub(crate) struct ShardLeases {
    config: Settings,
    api: Api<Lease>,
    clock: Arc<dyn LeaseClock>,
    assignment: watch::Sender<Assignment>,
    hand_overs: mpsc::UnboundedSender<super::HandOver>,
    /// Where failed requests are told (see `failures`).
    tell: Option<Tell>,
}

impl std::fmt::Debug for ShardLeases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardLeases")
            .field("config", &self.config)
            .field("clock", &self.clock)
            .field("tells_failures", &self.tell.is_some())
            .finish_non_exhaustive()
    }
}

impl ShardLeases {
    /// The protocol for one replica, on `client`, with tokio's clock; and the controller's side
    /// of it. Nothing happens until [`ShardLeases::run`].
    pub(crate) fn new(
        client: kube::Client,
        config: LeaseConfig,
    ) -> Result<(Self, ShardEvents), ConfigError> {
        let config = config.settings()?;
        let (assignment, assignment_rx) = watch::channel(Assignment::empty(config.shards()));
        let (hand_overs, hand_overs_rx) = mpsc::unbounded_channel();
        let leases = ShardLeases {
            api: Api::namespaced(client, config.namespace()),
            config,
            clock: Arc::new(TokioClock::new()),
            assignment,
            hand_overs,
            tell: None,
        };
        let events = ShardEvents {
            assignment: assignment_rx,
            hand_overs: hand_overs_rx,
        };
        Ok((leases, events))
    }

    /// Judges time by `clock` instead of tokio's.
    pub(crate) fn with_clock(mut self, clock: impl LeaseClock) -> Self {
        self.clock = Arc::new(clock);
        self
    }

    /// Tells what the protocol reports to `tell`: failed requests (each verb once, until a
    /// request with that verb succeeds), a stale watch, a step-down, another lease duration.
    pub(crate) fn with_reports(mut self, tell: Tell) -> Self {
        self.tell = Some(tell);
        self
    }

    /// Runs the protocol until `shutdown` completes (or, with [`OnLoss::Stop`](super::OnLoss::Stop),
    /// until a loss), then leaves: hands every shard over, each once the controller has
    /// acknowledged its [`HandOver`](super::HandOver), and vacates its membership Lease. Gives up
    /// leaving after the hand-over timeout plus the renew deadline (the Lease then expires).
    ///
    /// API errors are not fatal: a failed request is retried, and what this replica holds ends
    /// by itself at its deadline when renewals fail. Dropping the future stops at once,
    /// leaving nothing (the Leases expire).
    pub(crate) async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Ended {
        let span = tracing::info_span!(
            "lease_protocol",
            controller = %self.config.name(),
            identity = %self.config.identity(),
        );
        let driver = Driver::new(
            self.config,
            self.api,
            self.clock,
            self.assignment,
            self.hand_overs,
            self.tell,
        );
        driver.run(shutdown).instrument(span).await
    }
}

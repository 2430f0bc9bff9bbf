//! The runner's worker: leases a key, reconciles it on its own task, and takes the lease through
//! the engine's steps.

use std::fmt;
use std::hash::{BuildHasher, Hash};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures_util::FutureExt;
use tracing::Instrument;
use workqueue_core::Lease;

use super::engine::{Engine, Ran};
use super::{Policy, Reconcile};

/// How long a worker pauses after the queue's `get` panicked before it asks for a key again (a key
/// whose `Clone` always panics would otherwise make it spin). The pause ends early when the
/// shutdown token is cancelled.
const GET_PANIC_PAUSE: Duration = Duration::from_millis(100);

/// What the workers share: the engine, the reconcile and the error policy.
pub(super) struct Worker<T, R: Reconcile<T, C>, C, S> {
    pub(super) engine: Arc<Engine<T, R::Error, C, S>>,
    pub(super) reconcile: R,
    pub(super) policy: Box<Policy<T, R::Error, C>>,
}

impl<T, R, C, S> Worker<T, R, C, S>
where
    T: Hash + Eq + Clone + Send + Sync + fmt::Display + 'static,
    S: BuildHasher + Send + Sync + 'static,
    C: Send + Sync + 'static,
    R: Reconcile<T, C>,
{
    /// One worker's loop, until intake stops or the queue is shut down and empty.
    pub(super) async fn run(self: Arc<Self>) {
        let intake = self.engine.intake().clone();
        loop {
            let got = tokio::select! {
                biased;
                () = intake.cancelled() => return,
                got = AssertUnwindSafe(self.engine.queue().get()).catch_unwind() => got,
            };
            match got {
                Ok(Some(lease)) => self.process(lease).await,
                Ok(None) => return,
                Err(payload) => {
                    // No key was leased (the queue is as it was before the call). If `get` panics
                    // on every call, this pause keeps the worker from spinning.
                    self.engine
                        .get_panicked(&workqueue_core::__private::panic_message(&*payload));
                    tokio::select! {
                        biased;
                        () = intake.cancelled() => return,
                        () = tokio::time::sleep(GET_PANIC_PAUSE) => {}
                    }
                }
            }
        }
    }

    /// Handles one lease: every panic in the code it calls fails this key, the error policy
    /// decides, and the lease is finished by that decision.
    async fn process(&self, lease: Lease<T>) {
        let mut begun = self.engine.begin(&lease);
        let ran = match begun.early.take() {
            Some(message) => Ran::Panicked(message),
            None => {
                let key = lease.key();
                let ctx = &begun.ctx;
                let start = || self.reconcile.reconcile(key.clone(), ctx.clone());
                self.engine
                    .drive(start, ctx)
                    .instrument(begun.span.clone())
                    .await
            }
        };
        let verdict = self
            .engine
            .judge(lease.key(), &begun, ran, |key, failure, ctx| {
                (self.policy)(key, failure, ctx)
            });
        self.engine.finish(lease, &begun, &verdict);
    }
}

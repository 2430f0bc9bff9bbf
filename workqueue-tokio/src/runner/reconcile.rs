//! The reconcile function a runner calls.

use std::fmt;
use std::future::Future;

use super::{Action, Context};

/// A reconcile function: brings the object behind a key to its desired state.
///
/// Implemented for every `FnMut(T, Context<C>) -> impl Future<Output = Result<Action, E>>` whose
/// future is `Send + 'static`, so a closure or an `async fn` is a reconcile function; it cannot be
/// implemented otherwise (state goes in the runner's context, or in what the closure captures).
/// The trait names the reconcile's error and future types in [`Runner`](super::Runner)'s
/// signature; `C` is the runner's shared data, `()` without it.
///
/// The function is called on the task that runs the runner (the one that polls
/// [`Runner::results`](super::Runner::results) or awaits [`Runner::run`](super::Runner::run)),
/// so it need not be `Send` or `Sync`; its future runs elsewhere (see the
/// [module docs](super#where-reconciles-run)), hence `Send + 'static`.
pub trait Reconcile<T, C = ()>: sealed::Sealed<T, C> {
    /// What a failed reconcile returns; the error policy sees it as [`Failure::Error`](super::Failure::Error).
    type Error: fmt::Debug + Send + 'static;
    /// The reconcile's future.
    type Future: Future<Output = Result<Action, Self::Error>> + Send + 'static;

    /// Reconciles `key`; stops promptly once `ctx` is cancelled.
    fn reconcile(&mut self, key: T, ctx: Context<C>) -> Self::Future;
}

impl<T, C, F, Fut, E> Reconcile<T, C> for F
where
    F: FnMut(T, Context<C>) -> Fut,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Debug + Send + 'static,
{
    type Error = E;
    type Future = Fut;

    fn reconcile(&mut self, key: T, ctx: Context<C>) -> Fut {
        self(key, ctx)
    }
}

mod sealed {
    /// Only closures and `async fn`s are reconcile functions (the blanket implementation).
    pub trait Sealed<T, C> {}

    impl<T, C, F, Fut> Sealed<T, C> for F where F: FnMut(T, super::Context<C>) -> Fut {}
}

//! The reconcile function a runner calls.

use std::fmt;
use std::future::Future;

use super::{Action, Context};

/// A reconcile function: brings the object behind a key to its desired state.
///
/// Implemented for every `Fn(T, Context<C>) -> impl Future<Output = Result<Action, E>>` that can
/// be shared between workers, so a closure or an `async fn` is a reconcile function; it cannot be
/// implemented otherwise (state goes in the runner's context, or in what the closure captures).
/// The trait names the reconcile's error and future types in [`Runner`](super::Runner)'s
/// signature; `C` is the runner's shared data, `()` without it.
pub trait Reconcile<T, C = ()>: sealed::Sealed<T, C> + Send + Sync + 'static {
    /// What a failed reconcile returns; the error policy sees it as [`Failure::Error`](super::Failure::Error).
    type Error: fmt::Debug + Send + 'static;
    /// The reconcile's future.
    type Future: Future<Output = Result<Action, Self::Error>> + Send + 'static;

    /// Reconciles `key`; stops promptly once `ctx` is cancelled.
    fn reconcile(&self, key: T, ctx: Context<C>) -> Self::Future;
}

impl<T, C, F, Fut, E> Reconcile<T, C> for F
where
    F: Fn(T, Context<C>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Action, E>> + Send + 'static,
    E: fmt::Debug + Send + 'static,
{
    type Error = E;
    type Future = Fut;

    fn reconcile(&self, key: T, ctx: Context<C>) -> Fut {
        self(key, ctx)
    }
}

mod sealed {
    /// Only closures and `async fn`s are reconcile functions (the blanket implementation).
    pub trait Sealed<T, C> {}

    impl<T, C, F, Fut> Sealed<T, C> for F where F: Fn(T, super::Context<C>) -> Fut {}
}

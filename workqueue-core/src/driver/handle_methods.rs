//! The methods both queue handles forward to their [`QueueCore`](crate::driver::QueueCore):
//! exported (it must be, for `workqueue-tokio`) as part of the unstable seam,
//! `__private::queue_handle_methods!`.

/// Expands, inside `impl<T, S> ... { }` of a queue handle with a `core: Arc<QueueCore<T, S, _>>`
/// field, to the operations every driver offers unchanged: the adds, the non-waiting gets, the
/// observations and `shut_down`. One definition, with one set of docs, for both queues; each
/// driver writes only its waiting operations (`get`, the drains) itself.
#[doc(hidden)]
#[macro_export]
macro_rules! __queue_handle_methods {
    () => {
        /// The queue's name, if it has one.
        pub fn name(&self) -> ::core::option::Option<&str> {
            self.core.name()
        }

        /// Queues `key`, unless it is already queued; a key being processed is queued again when
        /// its lease finishes. Ignored after shutdown.
        pub fn add(&self, key: T) -> $crate::state::AddStatus {
            self.core.add(key)
        }

        /// `add` from a borrowed key, cloning it only if the queue does not track it yet (so
        /// duplicate adds neither allocate nor touch a reference count: informers deliver many
        /// updates per object). For `Arc<str>` or `String` keys, pass a `&str`.
        pub fn add_ref<Q>(&self, key: &Q) -> $crate::state::AddStatus
        where
            T: ::core::borrow::Borrow<Q> + for<'a> ::core::convert::From<&'a Q>,
            Q: ::core::hash::Hash + ::core::cmp::Eq + ?Sized,
        {
            self.core.add_ref(key)
        }

        /// Adds every key under one lock acquisition.
        ///
        /// The iterator runs under the queue's lock: keep it cheap. If it (or a key's `Hash` or
        /// `Eq`) panics, the keys before the panic stay added and waiting getters are woken for
        /// them; the panic then propagates.
        pub fn add_batch(&self, keys: impl ::core::iter::IntoIterator<Item = T>) {
            self.core.add_batch(keys)
        }

        /// Adds `key` with options: a priority, a delay, the rate limiter (controller-runtime's
        /// `AddWithOpts`).
        ///
        /// Higher priorities are served first, FIFO within a priority. A queued key keeps the
        /// highest priority asked for; one whose priority is raised moves to the tail of its new
        /// priority. A key re-added while it is processed is queued when its lease ends, at the
        /// highest priority asked for meanwhile. A waiting key keeps the earliest deadline and the
        /// highest priority asked for it. With `rate_limited`, the limiter is always asked (it
        /// records a failure) and the key waits its delay, or the shorter of it and `after`.
        pub fn add_with(&self, key: T, opts: $crate::AddOptions) -> $crate::state::AddStatus {
            self.core.add_with(key, opts)
        }

        /// [`add_with`](Self::add_with) for every key, under one lock acquisition (the rate
        /// limiter, if asked, is asked for each key before it).
        pub fn add_batch_with(
            &self,
            keys: impl ::core::iter::IntoIterator<Item = T>,
            opts: $crate::AddOptions,
        ) {
            self.core.add_batch_with(keys, opts)
        }

        /// Adds `key` once `delay` has passed (`Duration::ZERO` adds it now). A key already
        /// waiting keeps the earlier deadline. Ignored after shutdown.
        pub fn add_after(&self, key: T, delay: ::core::time::Duration) -> $crate::state::AddStatus {
            self.core.add_after(key, delay)
        }

        /// Adds `key` after the delay the rate limiter chooses for it (recording one failure).
        ///
        /// Unlike client-go, the limiter is not consulted after shutdown. Like client-go, a token
        /// bucket is charged even when the key turns out to be pending already, unless the queue
        /// was built with `skip_limiter_when_pending(true)`.
        pub fn add_rate_limited(&self, key: T) -> $crate::state::AddStatus {
            self.core.add_rate_limited(key)
        }

        /// Removes every key for which `keep` returns `false` that is queued or waiting (delayed,
        /// debounced, in backoff, parked), and forgets each in the rate limiter: what a replica
        /// does with the keys of a shard it hands over. Returns how many keys were removed.
        ///
        /// A key being processed is not removed: its lease still finishes. A re-add made while it
        /// runs, and its waiting entry, are dropped, so that the finish does not queue it again;
        /// but a re-add the finish itself asks for (`retry`, `requeue_after`) is applied as
        /// usual, so a caller that gives such keys away finishes their leases without one
        /// (`done()` or `finish(Outcome::forget())`).
        ///
        /// `keep` runs under the queue's lock, once per key the queue tracks, before anything
        /// changes: keep it cheap. If it panics, the queue is as it was and the panic propagates.
        /// The limiter's `forget` and the removed keys' `Drop` run after the lock is released.
        pub fn retain(&self, keep: impl FnMut(&T) -> bool) -> usize {
            self.core.retain(keep)
        }

        /// Clears the rate limiter's failures for `key`. Does not cancel a waiting re-add.
        pub fn forget(&self, key: &T) {
            self.core.forget(key)
        }

        /// How many failures the rate limiter has recorded for `key`.
        pub fn num_requeues(&self, key: &T) -> u32 {
            self.core.num_requeues(key)
        }

        /// Leases a ready key without waiting.
        pub fn try_get(&self) -> ::core::option::Option<$crate::Lease<T>> {
            let mut g = self.core.lock();
            let now = self.core.now_for(&g.state);
            self.core.take(&mut g, now).ok()
        }

        /// Leases up to `max` ready keys without waiting.
        ///
        /// All or nothing under panics: if a key's `Clone` (or a metrics recorder) panics, the
        /// keys already taken go back to the head of the queue in their order.
        pub fn try_get_batch(&self, max: usize) -> ::std::vec::Vec<$crate::Lease<T>> {
            self.core.take_batch(max)
        }

        /// Number of keys ready to be handed out (not processing, not waiting for a delay).
        pub fn len(&self) -> usize {
            self.core.len()
        }

        /// Whether no key is ready.
        pub fn is_empty(&self) -> bool {
            self.core.is_empty()
        }

        /// Counters of the queue's state (ready, processing, waiting, tracked), after promoting
        /// the keys due now.
        pub fn counts(&self) -> $crate::state::Counts {
            self.core.counts()
        }

        /// Heap bytes held by the queue's own structures (keys' own allocations excluded).
        pub fn allocated_bytes(&self) -> usize {
            self.core.allocated_bytes()
        }

        /// How many times the queue compacted to give a burst's memory back (see
        /// `Builder::shrink_memory`).
        pub fn compactions(&self) -> u64 {
            self.core.compactions()
        }

        /// Refreshes the queue's "unfinished work" and oldest-ready gauges now, on the queue's
        /// clock (see `workqueue_core::metrics`). A background thread does this every 500 ms for
        /// named queues; a no-op for an unnamed queue or without the `metrics` feature.
        pub fn refresh_metrics(&self) {
            self.core.refresh_metrics()
        }

        /// Stops intake: adds are ignored from now on, delayed keys are dropped, and waiting
        /// getters wake. Getters still receive the keys already queued, then `None`. Does not
        /// wait for leases; releases any drain in progress. Idempotent.
        pub fn shut_down(&self) {
            self.core.shut_down()
        }

        /// Whether the queue is shutting down.
        pub fn is_shutting_down(&self) -> bool {
            self.core.is_shutting_down()
        }

        /// Whether the outage detector is open (failing keys are parked; see
        /// [`Builder::outage_detection`]($crate::Builder::outage_detection)). `false` when
        /// detection is off.
        pub fn is_outage_open(&self) -> bool {
            self.core.is_outage_open()
        }

        /// Whether the outage detector holds `key` parked.
        pub fn is_parked(&self, key: &T) -> bool {
            self.core.is_parked(key)
        }

        /// How many keys the outage detector holds parked (0 when detection is off).
        pub fn parked_len(&self) -> usize {
            self.core.parked_len()
        }

        /// How many parked keys the queue's shutdown dropped: parked keys are waiting keys,
        /// which a shutdown drops (0 when detection is off or before shutdown).
        pub fn parked_dropped_at_shutdown(&self) -> usize {
            self.core.parked_dropped_at_shutdown()
        }
    };
}

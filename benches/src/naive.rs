//! The in-run baseline: a faithful port of client-go's `util/workqueue` algorithm.
//!
//! Three layers, as in Go (`queue.go`, `delaying_queue.go`, `rate_limiting_queue.go`):
//!
//! 1. [`Queue`]: one `std::sync::Mutex` + `Condvar` over a `VecDeque<T>` FIFO, a `HashSet<T>`
//!    `dirty` set and a `HashSet<T>` `processing` set (std's SipHash).
//! 2. [`DelayingQueue`]: `add_after` sends `(item, ready_at)` over a channel of capacity 1000 to a
//!    timer thread (Go's `waitingLoop`) that owns a min-heap and a `HashMap<T, Instant>` for
//!    de-duplication (earliest deadline wins), sleeps until the head's deadline (or a 10 s
//!    heartbeat), and `add`s due items to the queue.
//! 3. [`RateLimitingQueue`]: `add_rate_limited(x)` is `add_after(x, limiter.when(x))`.
//!
//! Limiters are Go's: [`ItemExponentialFailure`] (`Mutex<HashMap>`, float `base * 2^n`),
//! [`Bucket`] (`x/time/rate` token bucket under a mutex, reservation semantics) and [`MaxOf`]
//! (dynamic dispatch over children, every child consulted).
//!
//! Observable semantics are client-go's (reference §2): dedup while queued; re-add while
//! processing requeues at the tail on `done`; `get` drains after shutdown; `add`/`add_after` are
//! ignored after shutdown; waiting entries are dropped on shutdown; `add_after(x, 0)` adds at once
//! without touching a waiting entry. Two deliberate differences, both of which make the baseline
//! slightly *faster* than a literal port: `Bucket::when` reads the clock once (Go's
//! `Reserve().Delay()` reads it twice), and the heap uses lazy deletion (a decreased deadline
//! pushes a new entry and the stale one is skipped when popped) instead of `heap.Fix`.

use std::cmp::Ordering as CmpOrdering;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::hash::Hash;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TryRecvError};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---- 1. the basic queue (queue.go) ---------------------------------------------------------------

/// client-go's `Typed[T]`: a de-duplicating FIFO with dirty and processing sets.
pub struct Queue<T> {
    shared: Arc<QueueShared<T>>,
}

struct QueueShared<T> {
    state: Mutex<QueueState<T>>,
    cond: Condvar,
}

struct QueueState<T> {
    queue: VecDeque<T>,
    dirty: HashSet<T>,
    processing: HashSet<T>,
    shutting_down: bool,
    drain: bool,
}

impl<T> Clone for Queue<T> {
    fn clone(&self) -> Self {
        Queue {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T: Hash + Eq + Clone> Default for Queue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::Queue").finish_non_exhaustive()
    }
}

/// Sizes of a [`Queue`]'s three structures, for checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Items in the FIFO.
    pub queued: usize,
    /// Items in the dirty set.
    pub dirty: usize,
    /// Items in the processing set.
    pub processing: usize,
}

impl<T: Hash + Eq + Clone> Queue<T> {
    /// An empty queue (`NewTyped`).
    pub fn new() -> Self {
        Queue {
            shared: Arc::new(QueueShared {
                state: Mutex::new(QueueState {
                    queue: VecDeque::new(),
                    dirty: HashSet::new(),
                    processing: HashSet::new(),
                    shutting_down: false,
                    drain: false,
                }),
                cond: Condvar::new(),
            }),
        }
    }

    /// `Add`: marks `item` dirty and queues it unless it is queued or being processed.
    pub fn add(&self, item: T) {
        let mut s = lock(&self.shared.state);
        if s.shutting_down {
            return;
        }
        if s.dirty.contains(&item) {
            // Already dirty: if it is in the store, `Touch` it (a no-op for the default FIFO).
            return;
        }
        s.dirty.insert(item.clone());
        if s.processing.contains(&item) {
            return;
        }
        s.queue.push_back(item);
        self.shared.cond.notify_one();
    }

    /// `Len`: items in the FIFO.
    pub fn len(&self) -> usize {
        lock(&self.shared.state).queue.len()
    }

    /// Whether the FIFO is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `Get`: blocks until an item is queued; `None` once shut down and empty.
    pub fn get(&self) -> Option<T> {
        let mut s = lock(&self.shared.state);
        while s.queue.is_empty() && !s.shutting_down {
            s = self
                .shared
                .cond
                .wait(s)
                .unwrap_or_else(PoisonError::into_inner);
        }
        // Empty here means shutting down.
        let item = s.queue.pop_front()?;
        s.processing.insert(item.clone());
        s.dirty.remove(&item);
        Some(item)
    }

    /// `Done`: the item is no longer processed; re-queued if it was added meanwhile.
    pub fn done(&self, item: &T) {
        let mut s = lock(&self.shared.state);
        s.processing.remove(item);
        if s.dirty.contains(item) {
            s.queue.push_back(item.clone());
            self.shared.cond.notify_one();
        } else if s.processing.is_empty() {
            self.shared.cond.notify_one();
        }
    }

    /// `ShutDown`: ignore new adds, wake every getter; does not wait for in-flight items.
    pub fn shut_down(&self) {
        let mut s = lock(&self.shared.state);
        s.drain = false;
        s.shutting_down = true;
        self.shared.cond.notify_all();
    }

    /// `ShutDownWithDrain`: as `shut_down`, then waits until nothing is processing.
    pub fn shut_down_with_drain(&self) {
        let mut s = lock(&self.shared.state);
        s.drain = true;
        s.shutting_down = true;
        self.shared.cond.notify_all();
        while !s.processing.is_empty() && s.drain {
            s = self
                .shared
                .cond
                .wait(s)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// `ShuttingDown`.
    pub fn shutting_down(&self) -> bool {
        lock(&self.shared.state).shutting_down
    }

    /// Sizes of the FIFO and the two sets.
    pub fn counts(&self) -> Counts {
        let s = lock(&self.shared.state);
        Counts {
            queued: s.queue.len(),
            dirty: s.dirty.len(),
            processing: s.processing.len(),
        }
    }
}

// ---- 2. the delaying queue (delaying_queue.go) ---------------------------------------------------

/// Go's `maxWait`: the waiting loop wakes at least this often.
pub const MAX_WAIT: Duration = Duration::from_secs(10);

/// Go's capacity of `waitingForAddCh`.
pub const WAITING_CHANNEL_CAPACITY: usize = 1000;

enum Msg<T> {
    Add(T, Instant),
    /// Test hook: replies with the number of live waiting entries once everything sent before it
    /// has been taken in.
    Sync(mpsc::Sender<usize>),
    Stop,
}

/// client-go's `delayingType[T]`: a [`Queue`] plus `add_after`, served by a timer thread.
pub struct DelayingQueue<T: Hash + Eq + Clone + Send + 'static> {
    inner: Arc<DelayingInner<T>>,
}

struct DelayingInner<T: Hash + Eq + Clone + Send + 'static> {
    queue: Queue<T>,
    tx: SyncSender<Msg<T>>,
    waiting_loop: Mutex<Option<JoinHandle<()>>>,
}

impl<T: Hash + Eq + Clone + Send + 'static> Clone for DelayingQueue<T> {
    fn clone(&self) -> Self {
        DelayingQueue {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> fmt::Debug for DelayingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::DelayingQueue")
            .finish_non_exhaustive()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Default for DelayingQueue<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> DelayingQueue<T> {
    /// A delaying queue and its timer thread (`NewTypedDelayingQueue`).
    pub fn new() -> Self {
        let queue = Queue::new();
        let (tx, rx) = mpsc::sync_channel(WAITING_CHANNEL_CAPACITY);
        let handle = {
            let queue = queue.clone();
            std::thread::Builder::new()
                .name("naive-waiting-loop".into())
                .spawn(move || waiting_loop(queue, rx))
                .expect("spawn the waiting loop")
        };
        DelayingQueue {
            inner: Arc::new(DelayingInner {
                queue,
                tx,
                waiting_loop: Mutex::new(Some(handle)),
            }),
        }
    }

    /// The wrapped basic queue.
    pub fn queue(&self) -> &Queue<T> {
        &self.inner.queue
    }

    /// `Add`.
    pub fn add(&self, item: T) {
        self.inner.queue.add(item)
    }

    /// `Get`.
    pub fn get(&self) -> Option<T> {
        self.inner.queue.get()
    }

    /// `Done`.
    pub fn done(&self, item: &T) {
        self.inner.queue.done(item)
    }

    /// `Len`.
    pub fn len(&self) -> usize {
        self.inner.queue.len()
    }

    /// Whether the FIFO is empty.
    pub fn is_empty(&self) -> bool {
        self.inner.queue.is_empty()
    }

    /// `AddAfter`: adds `item` once `delay` has passed; an earlier pending deadline wins.
    pub fn add_after(&self, item: T, delay: Duration) {
        if self.inner.queue.shutting_down() {
            return;
        }
        if delay.is_zero() {
            self.inner.queue.add(item);
            return;
        }
        // Blocks while the channel is full; fails only once the loop has stopped.
        let _ = self.inner.tx.send(Msg::Add(item, Instant::now() + delay));
    }

    /// `ShutDown`: shuts the queue down, stops the timer thread (dropping waiting entries) and
    /// joins it. Idempotent.
    pub fn shut_down(&self) {
        self.inner.shut_down();
    }

    /// Number of live waiting entries, once the timer thread has taken in every `add_after` made
    /// so far (a test hook, not part of client-go). `None` once the timer thread has stopped.
    pub fn waiting_len(&self) -> Option<usize> {
        let (reply, rx) = mpsc::channel();
        self.inner.tx.send(Msg::Sync(reply)).ok()?;
        rx.recv().ok()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> DelayingInner<T> {
    fn shut_down(&self) {
        self.queue.shut_down();
        // The loop may already have noticed the shutdown and gone: then the send fails.
        let _ = self.tx.send(Msg::Stop);
        if let Some(handle) = lock(&self.waiting_loop).take() {
            let _ = handle.join();
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> Drop for DelayingInner<T> {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A heap entry; ordered so that `BinaryHeap` (a max-heap) pops the earliest deadline first.
struct WaitFor<T> {
    ready_at: Instant,
    item: T,
}

impl<T> PartialEq for WaitFor<T> {
    fn eq(&self, other: &Self) -> bool {
        self.ready_at == other.ready_at
    }
}
impl<T> Eq for WaitFor<T> {}
impl<T> PartialOrd for WaitFor<T> {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for WaitFor<T> {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        other.ready_at.cmp(&self.ready_at)
    }
}

struct Waiting<T> {
    heap: BinaryHeap<WaitFor<T>>,
    /// The live deadline of each waiting item (Go's `knownEntries`). A heap entry whose deadline
    /// differs is stale (superseded by an earlier one) and skipped.
    known: HashMap<T, Instant>,
}

impl<T: Hash + Eq + Clone> Waiting<T> {
    /// Go's `insert`: a new item is pushed; an earlier deadline replaces a later one; a later or
    /// equal one is dropped.
    fn insert(&mut self, item: T, ready_at: Instant) {
        match self.known.get_mut(&item) {
            Some(existing) => {
                if ready_at < *existing {
                    *existing = ready_at;
                    self.heap.push(WaitFor { ready_at, item });
                }
            }
            None => {
                self.known.insert(item.clone(), ready_at);
                self.heap.push(WaitFor { ready_at, item });
            }
        }
    }

    /// Adds every entry due at `now` to `queue`, in deadline order.
    fn add_ready(&mut self, queue: &Queue<T>, now: Instant) {
        while let Some(head) = self.heap.peek() {
            if head.ready_at > now {
                break;
            }
            let WaitFor { ready_at, item } = self.heap.pop().expect("peeked");
            if self.known.get(&item) == Some(&ready_at) {
                self.known.remove(&item);
                queue.add(item);
            }
        }
    }
}

/// Go's `waitingLoop`.
fn waiting_loop<T: Hash + Eq + Clone>(queue: Queue<T>, rx: Receiver<Msg<T>>) {
    let mut w = Waiting {
        heap: BinaryHeap::new(),
        known: HashMap::new(),
    };
    // Returns false when the loop must stop.
    let take = |w: &mut Waiting<T>, msg: Msg<T>| -> bool {
        match msg {
            Msg::Add(item, ready_at) => {
                if ready_at > Instant::now() {
                    w.insert(item, ready_at);
                } else {
                    queue.add(item);
                }
                true
            }
            Msg::Sync(reply) => {
                let _ = reply.send(w.known.len());
                true
            }
            Msg::Stop => false,
        }
    };
    loop {
        if queue.shutting_down() {
            return;
        }
        let now = Instant::now();
        w.add_ready(&queue, now);
        let wait = w
            .heap
            .peek()
            .map_or(MAX_WAIT, |head| head.ready_at - now)
            .min(MAX_WAIT);
        match rx.recv_timeout(wait) {
            Ok(msg) => {
                if !take(&mut w, msg) {
                    return;
                }
                // Drain what else is there without blocking.
                loop {
                    match rx.try_recv() {
                        Ok(msg) => {
                            if !take(&mut w, msg) {
                                return;
                            }
                        }
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => return,
                    }
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

// ---- 3. the rate-limiting queue (rate_limiting_queue.go) -----------------------------------------

/// client-go's `TypedRateLimiter[T]`.
pub trait Limiter<T>: Send + Sync {
    /// How long `item` waits before its retry; records a failure.
    fn when(&self, item: &T) -> Duration;
    /// Forgets `item`'s failures.
    fn forget(&self, item: &T);
    /// Failures recorded for `item`.
    fn num_requeues(&self, item: &T) -> u32;
}

/// client-go's `rateLimitingType[T]`.
pub struct RateLimitingQueue<T: Hash + Eq + Clone + Send + 'static> {
    delaying: DelayingQueue<T>,
    limiter: Arc<dyn Limiter<T>>,
}

impl<T: Hash + Eq + Clone + Send + 'static> Clone for RateLimitingQueue<T> {
    fn clone(&self) -> Self {
        RateLimitingQueue {
            delaying: self.delaying.clone(),
            limiter: Arc::clone(&self.limiter),
        }
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> fmt::Debug for RateLimitingQueue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::RateLimitingQueue")
            .finish_non_exhaustive()
    }
}

impl<T: Hash + Eq + Clone + Send + 'static> RateLimitingQueue<T> {
    /// A rate-limiting queue over a new delaying queue (`NewTypedRateLimitingQueue`).
    pub fn new(limiter: impl Limiter<T> + 'static) -> Self {
        RateLimitingQueue {
            delaying: DelayingQueue::new(),
            limiter: Arc::new(limiter),
        }
    }

    /// The delaying queue underneath.
    pub fn delaying(&self) -> &DelayingQueue<T> {
        &self.delaying
    }

    /// `AddRateLimited`: `add_after(item, limiter.when(item))`.
    pub fn add_rate_limited(&self, item: T) {
        let delay = self.limiter.when(&item);
        self.delaying.add_after(item, delay);
    }

    /// `Forget`.
    pub fn forget(&self, item: &T) {
        self.limiter.forget(item)
    }

    /// `NumRequeues`.
    pub fn num_requeues(&self, item: &T) -> u32 {
        self.limiter.num_requeues(item)
    }

    /// `Add`.
    pub fn add(&self, item: T) {
        self.delaying.add(item)
    }

    /// `AddAfter`.
    pub fn add_after(&self, item: T, delay: Duration) {
        self.delaying.add_after(item, delay)
    }

    /// `Get`.
    pub fn get(&self) -> Option<T> {
        self.delaying.get()
    }

    /// `Done`.
    pub fn done(&self, item: &T) {
        self.delaying.done(item)
    }

    /// `Len`.
    pub fn len(&self) -> usize {
        self.delaying.len()
    }

    /// Whether the FIFO is empty.
    pub fn is_empty(&self) -> bool {
        self.delaying.is_empty()
    }

    /// `ShutDown`.
    pub fn shut_down(&self) {
        self.delaying.shut_down()
    }
}

// ---- rate limiters (default_rate_limiters.go) ----------------------------------------------------

/// `TypedItemExponentialFailureRateLimiter`: `base * 2^failures`, capped at `max`, per item.
pub struct ItemExponentialFailure<T> {
    failures: Mutex<HashMap<T, u32>>,
    base: Duration,
    max: Duration,
}

impl<T> fmt::Debug for ItemExponentialFailure<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::ItemExponentialFailure")
            .field("base", &self.base)
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

impl<T: Hash + Eq + Clone> ItemExponentialFailure<T> {
    /// A limiter from `base` to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        ItemExponentialFailure {
            failures: Mutex::new(HashMap::new()),
            base,
            max,
        }
    }
}

impl<T: Hash + Eq + Clone + Send> Limiter<T> for ItemExponentialFailure<T> {
    fn when(&self, item: &T) -> Duration {
        let exp = {
            let mut failures = lock(&self.failures);
            match failures.get_mut(item) {
                Some(n) => {
                    let exp = *n;
                    *n = n.saturating_add(1);
                    exp
                }
                None => {
                    failures.insert(item.clone(), 1);
                    0
                }
            }
        };
        // The exponent has to fit in an i32 for `powi`; 2^(2^31) is infinite anyway.
        let backoff = self.base.as_nanos() as f64 * 2f64.powi(exp.min(i32::MAX as u32) as i32);
        if backoff > i64::MAX as f64 {
            return self.max;
        }
        let calculated = Duration::from_nanos(backoff as u64);
        if calculated > self.max {
            self.max
        } else {
            calculated
        }
    }

    fn forget(&self, item: &T) {
        lock(&self.failures).remove(item);
    }

    fn num_requeues(&self, item: &T) -> u32 {
        lock(&self.failures).get(item).copied().unwrap_or(0)
    }
}

/// Go's `rate.InfDuration`.
pub const INF_DURATION: Duration = Duration::from_nanos(i64::MAX as u64);

/// `TypedBucketRateLimiter`: `x/time/rate`'s `Limiter` under a mutex; `when` is
/// `Reserve().Delay()` (always takes a token, going into debt).
pub struct Bucket {
    state: Mutex<BucketState>,
}

#[derive(Debug)]
struct BucketState {
    limit: f64,
    burst: u64,
    tokens: f64,
    last: Option<Instant>,
    last_event: Option<Instant>,
}

impl fmt::Debug for Bucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::Bucket")
            .field("state", &*lock(&self.state))
            .finish()
    }
}

impl Bucket {
    /// `rate.NewLimiter(qps, burst)`: starts full.
    pub fn new(qps: f64, burst: u64) -> Self {
        Bucket {
            state: Mutex::new(BucketState {
                limit: qps,
                burst,
                tokens: burst as f64,
                last: None,
                last_event: None,
            }),
        }
    }

    /// `ReserveN(now, 1).DelayFrom(now)`.
    pub fn reserve(&self, now: Instant) -> Duration {
        let mut s = lock(&self.state);
        if s.limit == f64::INFINITY {
            return Duration::ZERO;
        }
        if s.limit == 0.0 {
            // Go: a zero limit serves the remaining burst, then nothing.
            return if s.burst >= 1 {
                s.burst -= 1;
                Duration::ZERO
            } else {
                INF_DURATION
            };
        }
        // advance(): tokens refilled since `last`, capped at burst.
        let burst = s.burst as f64;
        let mut tokens = match s.last {
            None => burst,
            Some(last) => {
                let elapsed = now.saturating_duration_since(last);
                (s.tokens + elapsed.as_secs_f64() * s.limit).min(burst)
            }
        };
        tokens -= 1.0;
        let wait = if tokens < 0.0 {
            let nanos = (-tokens / s.limit) * 1e9;
            if nanos > i64::MAX as f64 {
                INF_DURATION
            } else {
                Duration::from_nanos(nanos as u64)
            }
        } else {
            Duration::ZERO
        };
        if s.burst < 1 || wait > INF_DURATION {
            return INF_DURATION; // not ok: Delay() is InfDuration
        }
        let time_to_act = now + wait;
        s.last = Some(now);
        s.tokens = tokens;
        s.last_event = Some(time_to_act);
        time_to_act.saturating_duration_since(now)
    }
}

impl<T> Limiter<T> for Bucket {
    fn when(&self, _item: &T) -> Duration {
        self.reserve(Instant::now())
    }

    fn forget(&self, _item: &T) {}

    fn num_requeues(&self, _item: &T) -> u32 {
        0
    }
}

/// `TypedMaxOfRateLimiter`: the longest delay of its children; every child is consulted.
pub struct MaxOf<T> {
    limiters: Vec<Box<dyn Limiter<T>>>,
}

impl<T> fmt::Debug for MaxOf<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("naive::MaxOf")
            .field("children", &self.limiters.len())
            .finish()
    }
}

impl<T> MaxOf<T> {
    /// `NewTypedMaxOfRateLimiter(limiters...)`.
    pub fn new(limiters: Vec<Box<dyn Limiter<T>>>) -> Self {
        MaxOf { limiters }
    }
}

impl<T> Limiter<T> for MaxOf<T> {
    fn when(&self, item: &T) -> Duration {
        let mut ret = Duration::ZERO;
        for l in &self.limiters {
            let curr = l.when(item);
            if curr > ret {
                ret = curr;
            }
        }
        ret
    }

    fn forget(&self, item: &T) {
        for l in &self.limiters {
            l.forget(item);
        }
    }

    fn num_requeues(&self, item: &T) -> u32 {
        self.limiters
            .iter()
            .map(|l| l.num_requeues(item))
            .max()
            .unwrap_or(0)
    }
}

/// `DefaultTypedControllerRateLimiter`: `MaxOf(ItemExponentialFailure(5ms, 1000s),
/// Bucket(10 qps, burst 100))`.
pub fn default_controller_rate_limiter<T: Hash + Eq + Clone + Send + Sync + 'static>() -> MaxOf<T> {
    controller_rate_limiter(10.0, 100)
}

/// The default controller limiter with another bucket (W10 uses qps 1e9, burst 1e9).
pub fn controller_rate_limiter<T: Hash + Eq + Clone + Send + Sync + 'static>(
    qps: f64,
    burst: u64,
) -> MaxOf<T> {
    MaxOf::new(vec![
        Box::new(ItemExponentialFailure::new(
            Duration::from_millis(5),
            Duration::from_secs(1000),
        )),
        Box::new(Bucket::new(qps, burst)),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn basic_queue_semantics() {
        let q = Queue::new();
        q.add("foo");
        q.add("bar");
        q.add("foo");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get(), Some("foo"));
        q.add("foo"); // while processing: dirty, not queued
        assert_eq!(q.len(), 1);
        q.done(&"foo"); // re-queued at the tail
        assert_eq!(q.get(), Some("bar"));
        assert_eq!(q.get(), Some("foo"));
        q.done(&"bar");
        q.done(&"foo");
        q.add("x");
        q.shut_down();
        q.add("ignored");
        assert_eq!(q.get(), Some("x")); // drains after shutdown
        assert_eq!(q.get(), None);
        q.done(&"x");
        assert_eq!(
            q.counts(),
            Counts {
                queued: 0,
                dirty: 0,
                processing: 0
            }
        );
    }

    #[test]
    fn drain_waits_for_processing() {
        let q = Queue::new();
        q.add(1);
        let item = q.get().unwrap();
        let t = {
            let q = q.clone();
            std::thread::spawn(move || q.shut_down_with_drain())
        };
        std::thread::sleep(ms(20));
        assert!(!t.is_finished());
        q.done(&item);
        t.join().unwrap();
    }

    #[test]
    fn delaying_queue_fires_in_deadline_order_and_dedups() {
        let q = DelayingQueue::new();
        q.add_after("late", ms(60));
        q.add_after("early", ms(20));
        q.add_after("late", ms(40)); // earlier wins
        q.add_after("early", ms(50)); // later dropped
        assert_eq!(q.waiting_len(), Some(2));
        assert_eq!(q.get(), Some("early"));
        let t = Instant::now();
        assert_eq!(q.get(), Some("late"));
        assert!(t.elapsed() < ms(35), "{:?}", t.elapsed());
        q.done(&"early");
        q.done(&"late");
        assert_eq!(q.waiting_len(), Some(0));
        q.add_after("now", Duration::ZERO);
        assert_eq!(q.len(), 1);
        q.add_after("dropped", Duration::from_secs(3600));
        q.shut_down();
        assert_eq!(q.get(), Some("now"));
        assert_eq!(q.get(), None);
        assert_eq!(q.waiting_len(), None);
    }

    #[test]
    fn exponential_matches_client_go() {
        let l = ItemExponentialFailure::new(ms(1), Duration::from_secs(1));
        let got: Vec<_> = (0..5).map(|_| l.when(&"one")).collect();
        assert_eq!(got, [ms(1), ms(2), ms(4), ms(8), ms(16)]);
        assert_eq!(l.num_requeues(&"one"), 5);
        l.forget(&"one");
        assert_eq!(l.when(&"one"), ms(1));
        let l = ItemExponentialFailure::new(ms(1), Duration::from_secs(1000));
        for _ in 0..1000 {
            l.when(&"overflow");
        }
        assert_eq!(l.when(&"overflow"), Duration::from_secs(1000));
    }

    #[test]
    fn bucket_reserves_like_x_time_rate() {
        let b = Bucket::new(10.0, 100);
        let t = Instant::now();
        for _ in 0..100 {
            assert_eq!(b.reserve(t), Duration::ZERO);
        }
        for k in 1..=5u64 {
            let d = b.reserve(t);
            assert!(d.abs_diff(ms(100 * k)) < Duration::from_micros(1), "{d:?}");
        }
    }

    #[test]
    fn default_limiter_is_max_of_both() {
        let l = default_controller_rate_limiter::<u32>();
        assert_eq!(l.when(&1), ms(5));
        assert_eq!(l.when(&1), ms(10));
        assert_eq!(l.num_requeues(&1), 2);
        for i in 2..=99 {
            l.when(&i);
        }
        // Call 101 and later wait for the bucket (~100 ms each).
        let d = l.when(&1000);
        assert!(d > ms(90), "{d:?}");
        l.forget(&1);
        assert_eq!(l.num_requeues(&1), 0);
    }

    #[test]
    fn rate_limited_queue_round_trip() {
        let q = RateLimitingQueue::new(controller_rate_limiter::<u32>(1e9, 1_000_000_000));
        for i in 0..10 {
            q.add_rate_limited(i);
        }
        let mut seen = Vec::new();
        while seen.len() < 10 {
            let i = q.get().unwrap();
            q.forget(&i);
            q.done(&i);
            seen.push(i);
        }
        seen.sort();
        assert_eq!(seen, (0..10).collect::<Vec<_>>());
        q.shut_down();
    }
}

//! A tracing subscriber that panics inside the runner: on the dispatcher, as it enters a
//! reconcile's span to call the reconcile function (the key fails), and on a worker, as it polls
//! a reconcile in its span (the worker task dies and is replaced).
//!
//! One test function: tracing caches whether a callsite is enabled for every thread, so a
//! thread-local subscriber in a test that runs beside others may see its spans disabled.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

use common::{ms, secs};
use tokio::time::sleep;
use tokio_util::sync::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::runner::{Action, Context, Runner};

#[test]
fn a_subscriber_that_panics_in_the_runner() {
    a_subscriber_that_panics_on_the_dispatchers_enter_fails_the_key();
    a_worker_task_that_dies_is_replaced_and_its_key_is_retried();
}

/// A tracing subscriber that records nothing and panics the first time a span is entered: on a
/// thread of the runtime named [`WORKERS`] (where the runner's worker tasks poll reconciles
/// inside their spans), or on any thread with `any_thread`.
struct PanicsOnFirstEnter {
    panicked: Arc<AtomicBool>,
    any_thread: bool,
}

const WORKERS: &str = "runtime-worker";

impl tracing::Subscriber for PanicsOnFirstEnter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {
        let here = self.any_thread || std::thread::current().name() == Some(WORKERS);
        if here && !self.panicked.swap(true, SeqCst) {
            panic!("the subscriber panicked on enter");
        }
    }
    fn exit(&self, _: &tracing::span::Id) {}
}

/// A panic that escapes a reconcile's job (a tracing subscriber that panics as the worker enters
/// the reconcile's span, outside every catch around user code) ends that worker task: the run
/// counts it in `worker_panics`, starts another worker, retries the key (its lease is dropped
/// while unwinding) and reconciles every key.
fn a_worker_task_that_dies_is_replaced_and_its_key_is_retried() {
    let panicked = Arc::new(AtomicBool::new(false));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .thread_name(WORKERS)
        .build()
        .unwrap();
    // The spans are made on this thread, by the dispatcher; entered on the runtime's threads.
    let subscriber = PanicsOnFirstEnter {
        panicked: panicked.clone(),
        any_thread: false,
    };
    let _subscriber = tracing::subscriber::set_default(subscriber);
    let queue: WorkQueue<u32> = WorkQueue::new();
    queue.add_batch(0..20);
    let reconciled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reconcile = {
        let reconciled = reconciled.clone();
        move |key: u32, _ctx: Context| {
            let reconciled = reconciled.clone();
            async move {
                reconciled.lock().unwrap().push(key);
                Ok::<_, ()>(Action::await_change())
            }
        }
    };
    // One worker: the run goes on only if the one that died is replaced.
    let runner = Runner::new(queue.clone(), reconcile).workers(1);
    // The dispatcher on this thread (not spawned), the workers on the
    // runtime's.
    let (report, ()) = runtime.block_on(async {
        let all = async {
            while reconciled.lock().unwrap().len() < 20 {
                sleep(ms(10)).await;
            }
            queue.shut_down();
        };
        let all = async {
            tokio::time::timeout(secs(30), all)
                .await
                .expect("every key reconciled within 30 s");
        };
        tokio::join!(runner.run(CancellationToken::new()), all)
    });
    assert!(panicked.load(SeqCst), "the subscriber panicked");
    assert_eq!(report.worker_panics, 1, "{report:?}");
    let mut keys = reconciled.lock().unwrap().clone();
    keys.sort_unstable();
    keys.dedup();
    assert_eq!(keys, (0..20).collect::<Vec<_>>(), "every key reconciled");
    assert_eq!(
        report.processed as usize,
        reconciled.lock().unwrap().len(),
        "{report:?}"
    );
}

/// A subscriber that panics as the dispatcher enters the reconcile's span to call the reconcile
/// function fails that key (`Failure::Panic`: the reconcile is not called, the key is retried),
/// and the run goes on.
fn a_subscriber_that_panics_on_the_dispatchers_enter_fails_the_key() {
    let panicked = Arc::new(AtomicBool::new(false));
    let subscriber = PanicsOnFirstEnter {
        panicked: panicked.clone(),
        any_thread: true,
    };
    let _subscriber = tracing::subscriber::set_default(subscriber);
    let queue: WorkQueue<u32> = WorkQueue::new();
    queue.add_batch(0..5);
    let reconciled = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reconcile = {
        let reconciled = reconciled.clone();
        move |key: u32, _ctx: Context| {
            reconciled.lock().unwrap().push(key);
            async { Ok::<_, ()>(Action::await_change()) }
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    let report = runtime.block_on(async {
        let stop = CancellationToken::new();
        let run = tokio::spawn(Runner::new(queue.clone(), reconcile).run(stop.clone()));
        sleep(secs(10)).await;
        stop.cancel();
        run.await.expect("the run survives the subscriber's panic")
    });
    assert!(panicked.load(SeqCst), "the subscriber panicked");
    assert_eq!((report.panics, report.retried), (1, 1), "{report:?}");
    let mut keys = reconciled.lock().unwrap().clone();
    keys.sort_unstable();
    assert_eq!(
        keys,
        (0..5).collect::<Vec<_>>(),
        "every key reconciled once"
    );
    assert_eq!(report.processed, 5, "{report:?}");
}

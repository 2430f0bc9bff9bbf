//! Outage-aware retries, end to end on tokio's paused clock: the storm demo's targets against a
//! simulated API, events that keep arriving during an outage, and the pinned cases (an add of a
//! parked key, a give-up while open, shutdown and drain with parked keys, a probe that panics, a
//! classifier that panics).
//!
//! The simulated API is the storm demo's: each request takes 20 ms plus 1 ms per request the
//! server received in the last second, and fails while the server is down.

mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{max_retries, secs};
use tokio::time::{Instant, sleep};
use tokio_util::sync::CancellationToken;
use workqueue_ratelimit::{OutageConfig, default_controller_rate_limiter};
use workqueue_tokio::runner::{Action, Context, Failure, Report, Runner};
use workqueue_tokio::{AddOptions, AddStatus, WorkQueue};

#[derive(Debug)]
enum ApiError {
    Unavailable,
    Invalid,
}

/// The storm demo's API: down until `recovers_at`, some objects invalid throughout.
struct Api {
    start: Instant,
    recovers_at: Instant,
    invalid_every: Option<u32>,
    state: Mutex<ApiState>,
}

#[derive(Default)]
struct ApiState {
    window: VecDeque<Instant>,
    during_outage: u64,
    invalid_requests: u64,
    remaining: u32,
    reconciled: Vec<bool>,
    converged_at: Option<Instant>,
}

impl Api {
    fn invalid(&self, object: u32) -> bool {
        self.invalid_every.is_some_and(|n| object.is_multiple_of(n))
    }

    async fn update(&self, object: u32) -> Result<(), ApiError> {
        let now = Instant::now();
        let invalid = self.invalid(object);
        let latency = {
            let mut s = self.state.lock().unwrap();
            while s
                .window
                .front()
                .is_some_and(|&t| now.duration_since(t) >= secs(1))
            {
                s.window.pop_front();
            }
            s.window.push_back(now);
            s.during_outage += u64::from(now < self.recovers_at);
            s.invalid_requests += u64::from(invalid);
            Duration::from_millis(20 + s.window.len() as u64)
        };
        sleep(latency).await;
        if now < self.recovers_at {
            return Err(ApiError::Unavailable);
        }
        if invalid {
            return Err(ApiError::Invalid);
        }
        let mut s = self.state.lock().unwrap();
        if !s.reconciled[object as usize] {
            s.reconciled[object as usize] = true;
            s.remaining -= 1;
            if s.remaining == 0 {
                s.converged_at = Some(Instant::now());
            }
        }
        Ok(())
    }
}

/// What one storm did.
#[derive(Debug)]
struct Storm {
    during_outage: u64,
    converged_after: Option<Duration>,
    invalid_requests: u64,
    report: Report,
}

/// 200 objects, 50 workers, the default limiter, an outage of `outage`; with `detection`, the
/// default outage detection; every `invalid_every`-th object fails on its own throughout.
async fn storm(outage: Duration, detection: bool, invalid_every: Option<u32>) -> Storm {
    const OBJECTS: u32 = 200;
    let start = Instant::now();
    let invalid = (0..OBJECTS)
        .filter(|o| invalid_every.is_some_and(|n| o.is_multiple_of(n)))
        .count() as u32;
    let api = Arc::new(Api {
        start,
        recovers_at: start + outage,
        invalid_every,
        state: Mutex::new(ApiState {
            remaining: OBJECTS - invalid,
            reconciled: vec![false; OBJECTS as usize],
            ..ApiState::default()
        }),
    });
    let _ = api.start;
    let mut builder = WorkQueue::builder().rate_limiter(default_controller_rate_limiter::<u32>());
    if detection {
        builder = builder.outage_detection(OutageConfig::default());
    }
    let queue: WorkQueue<u32> = builder.build();
    queue.add_batch(0..OBJECTS);
    let reconcile = {
        let api = api.clone();
        move |object: u32, _ctx: Context| {
            let api = api.clone();
            async move { api.update(object).await.map(|()| Action::await_change()) }
        }
    };
    let runner = Runner::new(queue.clone(), reconcile).workers(50);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    // Long enough for the default limiter's slowest recovery (about 620 s after 15 minutes).
    sleep(outage + secs(1500)).await;
    stop.cancel();
    let report = run.await.unwrap();
    let s = api.state.lock().unwrap();
    Storm {
        during_outage: s.during_outage,
        converged_after: s.converged_at.map(|t| t.duration_since(api.recovers_at)),
        invalid_requests: s.invalid_requests,
        report,
    }
}

/// The targets of the issue, for one outage length: at most 0.25x the default limiter's
/// requests during the outage, and, when `converge`, every object converged within 20 s of the
/// recovery (the default takes 265 s after 10 minutes, 620 s after 15).
async fn check_targets(outage: Duration, converge: bool) {
    let default = storm(outage, false, None).await;
    let detected = storm(outage, true, None).await;
    assert!(
        detected.during_outage * 4 <= default.during_outage,
        "{outage:?}: {} requests during the outage vs the default's {}",
        detected.during_outage,
        default.during_outage
    );
    assert_eq!(detected.report.outage_openings, 1, "{outage:?}");
    assert_eq!(
        detected.report.parked, 0,
        "{outage:?}: every key was released"
    );
    let converged = detected.converged_after.expect("converged");
    if converge {
        assert!(
            converged <= secs(20),
            "{outage:?}: converged after {converged:?}"
        );
        assert!(default.converged_after.unwrap() > secs(200));
    }
}

#[tokio::test(start_paused = true)]
async fn a_10_minute_outage_meets_both_targets() {
    check_targets(secs(600), true).await;
}

#[tokio::test(start_paused = true)]
async fn a_15_minute_outage_meets_both_targets() {
    check_targets(secs(900), true).await;
}

#[tokio::test(start_paused = true)]
async fn a_2_minute_outage_meets_the_request_target() {
    check_targets(secs(120), false).await;
}

/// 5 % of the objects fail for their own reasons throughout, with no outage: the detector never
/// opens, and those objects are retried exactly as with the default (the same requests).
#[tokio::test(start_paused = true)]
async fn objects_failing_on_their_own_never_open_it_and_back_off_as_today() {
    let default = storm(Duration::ZERO, false, Some(20)).await;
    let detected = storm(Duration::ZERO, true, Some(20)).await;
    assert_eq!(detected.report.outage_openings, 0);
    assert!(detected.invalid_requests > 10);
    assert_eq!(detected.invalid_requests, default.invalid_requests);
    assert_eq!(detected.report.errors, default.report.errors);
    assert_eq!(detected.converged_after, default.converged_after);
}

// ---- events during an outage -----------------------------------------------------------------

/// What [`events_during_an_outage`] measured.
#[derive(Debug)]
struct Events {
    /// Requests during the five minutes of events.
    during_events: u64,
    /// From the recovery until every key (the new one too) had succeeded.
    converged_after: Option<Duration>,
    /// Whether the detector was open when the events began.
    open_at_events: bool,
}

/// 50 keys, 8 workers, a reconcile of 20 ms that fails while the API is down, the default
/// limiter. One second in (the detector, when on, has opened by then), an informer re-adds the 50
/// keys every second for five minutes; a new key joins half-way; the API recovers as the events
/// end. `keep_backoff` is the builder's option of that name.
async fn events_during_an_outage(detection: bool, keep_backoff: bool) -> Events {
    const KEYS: u32 = 50;
    const NEW_KEY: u32 = KEYS;
    let down = Arc::new(AtomicBool::new(true));
    let requests: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let succeeded: Arc<Mutex<HashMap<u32, Instant>>> = Arc::default();
    let mut builder = WorkQueue::builder()
        .rate_limiter(default_controller_rate_limiter::<u32>())
        .keep_backoff(keep_backoff);
    if detection {
        builder = builder.outage_detection(OutageConfig::default());
    }
    let queue: WorkQueue<u32> = builder.build();
    queue.add_batch(0..KEYS);
    let reconcile = {
        let (down, requests, succeeded) = (down.clone(), requests.clone(), succeeded.clone());
        move |key: u32, _ctx: Context| {
            let (down, requests, succeeded) = (down.clone(), requests.clone(), succeeded.clone());
            async move {
                requests.lock().unwrap().push(Instant::now());
                let failed = down.load(SeqCst);
                sleep(Duration::from_millis(20)).await;
                if failed {
                    return Err("unavailable");
                }
                succeeded
                    .lock()
                    .unwrap()
                    .entry(key)
                    .or_insert_with(Instant::now);
                Ok(Action::await_change())
            }
        }
    };
    let stop = CancellationToken::new();
    let run = tokio::spawn(
        Runner::new(queue.clone(), reconcile)
            .workers(8)
            .run(stop.clone()),
    );
    sleep(secs(1)).await;
    let open_at_events = queue.is_outage_open();
    let events_from = Instant::now();
    for second in 0..300 {
        queue.add_batch(0..KEYS);
        if second == 150 {
            queue.add(NEW_KEY);
        }
        sleep(secs(1)).await;
    }
    let recovered = Instant::now();
    down.store(false, SeqCst);
    // Long enough for the default limiter's backoff after five minutes of failures.
    sleep(secs(1200)).await;
    stop.cancel();
    run.await.unwrap();
    let during_events = requests
        .lock()
        .unwrap()
        .iter()
        .filter(|&&t| events_from <= t && t < recovered)
        .count() as u64;
    let succeeded = succeeded.lock().unwrap();
    let converged_after = (succeeded.len() == KEYS as usize + 1)
        .then(|| succeeded.values().max().unwrap().duration_since(recovered));
    Events {
        during_events,
        converged_after,
        open_at_events,
    }
}

/// Issue 24's target: with outage detection, events for parked keys do not run them. At most 200
/// requests during the five minutes of events (one per event without parking: 15,000), and every
/// key, the new one too, reconciled within 20 s of the recovery.
#[tokio::test(start_paused = true)]
async fn events_during_an_outage_leave_parked_keys_parked() {
    let e = events_during_an_outage(true, false).await;
    eprintln!("outage detection: {e:?}");
    assert!(e.open_at_events);
    assert!(e.during_events <= 200, "{e:?}");
    let converged = e.converged_after.expect("every key reconciled");
    assert!(converged <= secs(20), "{e:?}");
}

/// Without detection: `keep_backoff` keeps events from defeating per-key backoff (the default
/// runs every key at every event), at the price of a recovery that waits for the backoff.
#[tokio::test(start_paused = true)]
async fn events_during_an_outage_with_keep_backoff_and_without_detection() {
    let default = events_during_an_outage(false, false).await;
    let kept = events_during_an_outage(false, true).await;
    eprintln!("default limiter: {default:?}");
    eprintln!("default limiter + keep_backoff: {kept:?}");
    assert!(default.during_events > 10_000, "{default:?}");
    assert!(kept.during_events * 10 <= default.during_events, "{kept:?}");
    assert!(kept.converged_after.is_some(), "{kept:?}");
}

// ---- pinned cases --------------------------------------------------------------------------

/// A small controller: `keys` keys, 4 workers, an API that is down until `up` is set; it counts
/// each key's requests and records which keys succeeded.
struct Small {
    queue: WorkQueue<u32>,
    up: Arc<AtomicBool>,
    requests: Arc<Mutex<HashMap<u32, u32>>>,
    ok: Arc<Mutex<Vec<u32>>>,
}

impl Small {
    fn new(keys: u32) -> Self {
        let queue: WorkQueue<u32> = WorkQueue::builder()
            .outage_detection(OutageConfig::default())
            .build();
        queue.add_batch(0..keys);
        Small {
            queue,
            up: Arc::new(AtomicBool::new(false)),
            requests: Arc::default(),
            ok: Arc::default(),
        }
    }

    /// The reconcile: fails while the API is down (key `panics_on`, if any, panics instead).
    fn reconcile(
        &self,
        panics_on: Option<u32>,
    ) -> impl Fn(u32, Context) -> std::future::Ready<Result<Action, &'static str>> + Send + Sync + 'static
    {
        let (up, requests, ok) = (self.up.clone(), self.requests.clone(), self.ok.clone());
        move |key, _ctx| {
            *requests.lock().unwrap().entry(key).or_default() += 1;
            if up.load(SeqCst) {
                ok.lock().unwrap().push(key);
                return std::future::ready(Ok(Action::await_change()));
            }
            assert!(Some(key) != panics_on, "probe of {key} panicked (expected)");
            std::future::ready(Err("unavailable"))
        }
    }
}

/// An event for a parked key while the API is down leaves it parked: no request. Once the API is
/// back, the next probe (within the probe interval's cap, 5 s) releases every key; an event
/// that bypasses parking runs the key at once as an extra probe.
#[tokio::test(start_paused = true)]
async fn an_add_of_a_parked_key_leaves_it_parked_until_a_probe_succeeds() {
    let s = Small::new(20);
    let runner = Runner::new(s.queue.clone(), s.reconcile(None)).workers(4);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(60)).await;
    assert!(s.queue.is_outage_open());
    let parked = (0..20).find(|k| s.queue.is_parked(k)).unwrap();
    let parked_before = s.queue.parked_len();
    let before = s.requests.lock().unwrap()[&parked];
    assert_eq!(s.queue.add(parked), AddStatus::Parked);
    sleep(Duration::from_millis(1)).await;
    assert_eq!(s.requests.lock().unwrap()[&parked], before, "no request");
    assert!(s.queue.is_parked(&parked));
    assert_eq!(s.queue.parked_len(), parked_before);
    // A bypass runs it at once: still down, it fails and is parked again.
    s.queue
        .add_with(parked, AddOptions::new().bypass_parking(true));
    sleep(Duration::from_millis(1)).await;
    assert_eq!(s.requests.lock().unwrap()[&parked], before + 1);
    assert!(s.queue.is_outage_open());
    // The API is back; events leave the keys parked, the next probe releases them all.
    s.up.store(true, SeqCst);
    let back = Instant::now();
    for k in 0..20 {
        s.queue.add(k);
    }
    while s.queue.is_outage_open() {
        sleep(Duration::from_millis(10)).await;
    }
    assert!(back.elapsed() <= secs(5), "{:?}", back.elapsed());
    sleep(secs(2)).await;
    let mut ok = s.ok.lock().unwrap().clone();
    ok.sort_unstable();
    ok.dedup();
    assert_eq!(ok, (0..20).collect::<Vec<_>>());
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!((report.outage_openings, report.parked), (1, 0));
}

/// At most 2 retries while open: a parked key runs only as a probe, so its failure count grows by
/// one per probe; after its third failure it is given up (not parked). Given-up keys are not
/// released at the recovery. With every parked key given up, the next key to finish is the
/// probe.
#[tokio::test(start_paused = true)]
async fn a_give_up_while_open_is_honoured_and_the_key_is_not_parked() {
    let s = Small::new(10);
    let runner = Runner::new(s.queue.clone(), s.reconcile(None))
        .workers(4)
        .error_policy(max_retries(2));
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(600)).await;
    assert!(s.queue.is_outage_open());
    // 10 keys probed every 5 s for 10 minutes: every key failed three times and was given up.
    assert_eq!(s.queue.parked_len(), 0);
    let requests: u32 = s.requests.lock().unwrap().values().sum();
    assert_eq!(requests, 30, "three failures per key");
    s.up.store(true, SeqCst);
    sleep(secs(60)).await;
    assert!(
        s.ok.lock().unwrap().is_empty(),
        "given-up keys do not run again"
    );
    // Nothing is parked: the next key to finish is the probe; its success closes the detector.
    s.queue.add(99);
    sleep(secs(1)).await;
    assert!(!s.queue.is_outage_open());
    stop.cancel();
    let report = run.await.unwrap();
    assert_eq!(report.given_up, 10);
    assert_eq!(report.retried, 20);
}

/// Shutdown with parked keys: the queue's shutdown drops them (waiting keys), a drain does not
/// wait for them, and the report counts them.
#[tokio::test(start_paused = true)]
async fn shutdown_and_drain_with_parked_keys_drop_them_and_the_report_counts_them() {
    let s = Small::new(20);
    let runner = Runner::new(s.queue.clone(), s.reconcile(None)).workers(4);
    let run = tokio::spawn(runner.run(CancellationToken::new()));
    sleep(secs(30)).await;
    let parked = s.queue.parked_len();
    assert!(parked >= 15, "{parked} parked");
    // The drain returns once the probe in flight (if any) is finished: parked keys are not
    // waited for.
    tokio::time::timeout(secs(1), s.queue.shut_down_with_drain())
        .await
        .expect("the drain does not wait for parked keys");
    let report = run.await.unwrap();
    assert_eq!(report.parked_dropped, parked);
    assert_eq!(report.parked, 0);
    assert_eq!(s.queue.parked_len(), 0);
}

/// A runner stopped by its token leaves the queue running: its parked keys stay parked, and the
/// report says how many.
#[tokio::test(start_paused = true)]
async fn a_stopped_runner_reports_the_keys_still_parked() {
    let s = Small::new(20);
    let runner = Runner::new(s.queue.clone(), s.reconcile(None)).workers(4);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(30)).await;
    stop.cancel();
    let report = run.await.unwrap();
    assert!(report.parked >= 15, "{report:?}");
    assert_eq!(report.parked, s.queue.parked_len());
    assert_eq!(report.parked_dropped, 0);
}

/// A parked key whose probe panics: the panic is a failure (the key is parked again, the probes
/// back off and go on round-robin), and the first probe after the recovery closes it.
#[tokio::test(start_paused = true)]
async fn a_probe_that_panics_is_a_failure_and_probing_goes_on() {
    let s = Small::new(6);
    let runner = Runner::new(s.queue.clone(), s.reconcile(Some(3))).workers(2);
    let stop = CancellationToken::new();
    let run = tokio::spawn(runner.run(stop.clone()));
    sleep(secs(120)).await;
    assert!(s.queue.is_outage_open());
    // Round-robin: every key was probed, key 3 (which panics) among them, several times.
    let probes_of_3 = s.requests.lock().unwrap()[&3];
    assert!(probes_of_3 >= 3, "key 3 ran {probes_of_3} times");
    s.up.store(true, SeqCst);
    sleep(secs(10)).await;
    assert!(!s.queue.is_outage_open());
    let mut ok = s.ok.lock().unwrap().clone();
    ok.sort_unstable();
    assert_eq!(ok, (0..6).collect::<Vec<_>>());
    stop.cancel();
    let report = run.await.unwrap();
    assert!(report.panics >= 3);
    assert_eq!(report.outage_openings, 1);
}

/// A classifier that says every error is the object's own: the detector never opens, and keys
/// back off as without detection. A classifier that panics counts the failure (the default).
#[tokio::test(start_paused = true)]
async fn classified_per_object_errors_never_open_it_and_a_panicking_classifier_counts() {
    for panics in [false, true] {
        let s = Small::new(20);
        let runner = Runner::new(s.queue.clone(), s.reconcile(None))
            .workers(4)
            .outage_classifier(move |_: &Failure<&'static str>, _: &Action| {
                assert!(!panics, "classifier panicked (expected)");
                false
            });
        let stop = CancellationToken::new();
        let run = tokio::spawn(runner.run(stop.clone()));
        sleep(secs(60)).await;
        assert_eq!(s.queue.is_outage_open(), panics);
        stop.cancel();
        let report = run.await.unwrap();
        assert_eq!(report.outage_openings, u64::from(panics));
        assert_eq!(
            report.panics, 0,
            "a classifier's panic does not fail the key"
        );
    }
}

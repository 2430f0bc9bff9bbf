//! The incident this library exists to prevent: a retry storm against an API server that is down.
//!
//! `cargo run --release --example storm [-- OPTIONS]`
//!
//! 200 objects are reconciled against a simulated API server that is unavailable for the first
//! ten minutes and then recovers. The server is honest about load: each request takes 20 ms plus
//! 1 ms for every request it received in the last second, as an overloaded server's latency
//! grows. Requests fail while the server is down. Each error-handling policy runs in a fresh queue and [`Runner`] with 50 workers:
//!
//! 1. errors returned as `Ok(Action::requeue(5s))` (the anti-pattern: a fixed-rate storm),
//! 2. errors returned as errors, retried by the default controller limiter
//!    (per-key 5 ms to 1000 s exponential backoff, and a 10 qps / burst 100 bucket),
//! 3. the same with jitter on the per-key backoff (up to +20 %, fixed seed),
//! 4. the default limiter capped with [`MaxWait`] (30 s),
//! 5. the default limiter with outage detection (the queue builder's `outage_detection`): failing keys are
//!    parked while failures are widespread, one probe runs at a time, and the first probe that
//!    succeeds releases them all, paced by the bucket.
//!
//! Everything runs on tokio's paused clock in one current-thread runtime: no threads, no real
//! sleeps, so the hours of simulated time take about a second and every figure is the same on
//! every run. For each policy the demo prints requests per second to the API over time, the
//! requests sent during the outage, the peak rate, the steady rate (the mean over the second half
//! of the outage), and how long after the recovery all objects had been reconciled successfully.
//! `--svg PATH` also writes the charts as an SVG file.
//!
//! Options: `--objects N`, `--outage SECS` (or `10m`, `1h`), `--policy
//! all|requeue|default|jitter|maxwait|outage`, `--workers N`, `--max-wait SECS`, `--own-failures
//! PCT` (that share of the objects fails for its own reasons throughout), `--events-per-sec N`
//! (during the outage, every object gets N events a second: an informer re-adds it, as status
//! updates and other controllers' writes do), `--keep-backoff` (every policy's queue with
//! `Builder::keep_backoff(true)`: an event leaves a key waiting on its backoff), `--svg PATH`;
//! `--help` lists them.
//!
//! The summary ends with policy 5's targets, PASS or FAIL from the simulated figures: requests
//! during the outage at most 0.25x the default limiter's; every object converged within 20 s of
//! the recovery (for outages longer than 2 minutes); with `--own-failures` and no outage, the
//! detector never opens and the failing objects are retried exactly as by the default; with
//! `--events-per-sec`, requests during the outage at most 1.5x policy 5's own without events
//! (run once more for the comparison).

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use tokio::sync::Notify;
use tokio::time::{Instant, sleep, sleep_until};
use workqueue_tokio::CancellationToken;
use workqueue_tokio::WorkQueue;
use workqueue_tokio::ratelimit::{
    MaxWait, OutageConfig, RateLimiter, default_controller_rate_limiter,
    jittered_controller_rate_limiter,
};

/// About 30 years: an outage longer than an instant can represent ends no earlier than this.
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);
use workqueue_tokio::runner::{Action, Runner};

/// Latency of a request to an idle server.
const BASE_LATENCY: Duration = Duration::from_millis(20);
/// Extra latency per request the server received in the last second.
const LATENCY_PER_RPS: Duration = Duration::from_millis(1);
/// The anti-pattern's fixed retry delay.
const REQUEUE_AFTER: Duration = Duration::from_secs(5);
/// Jitter of policy 3: per-key backoffs are lengthened by up to this fraction.
const JITTER: f64 = 0.2;
/// Fixed seed of the jitter, so every run gives the same figures.
const JITTER_SEED: u64 = 0x5EED_5707;
/// How long each scenario keeps running after its objects have converged.
const TAIL: Duration = Duration::from_secs(30);
/// Peaks are reported for the first minute (the first pass and the first retries) and after it.
const FIRST_MINUTE: usize = 60;
/// The per-key backoff's cap in the default limiters.
const MAX_BACKOFF: Duration = Duration::from_secs(1000);
/// Terminal chart size.
const CHART_COLUMNS: u64 = 60;
const CHART_ROWS: usize = 8;

// ---- options -----------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Policy {
    Requeue,
    Default,
    Jitter,
    MaxWait,
    Outage,
}

impl Policy {
    const ALL: [Policy; 5] = [
        Policy::Requeue,
        Policy::Default,
        Policy::Jitter,
        Policy::MaxWait,
        Policy::Outage,
    ];

    fn number(self) -> usize {
        match self {
            Policy::Requeue => 1,
            Policy::Default => 2,
            Policy::Jitter => 3,
            Policy::MaxWait => 4,
            Policy::Outage => 5,
        }
    }

    fn title(self, opts: &Options) -> String {
        match self {
            Policy::Requeue => format!(
                "errors as Ok(Action::requeue({}s)) (anti-pattern)",
                REQUEUE_AFTER.as_secs()
            ),
            Policy::Default => "errors as Err, default controller limiter".to_string(),
            Policy::Jitter => format!(
                "errors as Err, default limiter + {:.0}% jitter",
                JITTER * 100.0
            ),
            Policy::MaxWait => format!(
                "errors as Err, default limiter capped by MaxWait({}s)",
                opts.max_wait.as_secs()
            ),
            Policy::Outage => {
                "errors as Err, default limiter + outage detection (park, probe, release)"
                    .to_string()
            }
        }
    }

    fn short(self, opts: &Options) -> String {
        let short = self.short_policy(opts);
        match opts.keep_backoff {
            true => format!("{short}, keep_backoff"),
            false => short,
        }
    }

    fn short_policy(self, opts: &Options) -> String {
        match self {
            Policy::Requeue => format!("requeue({}s) on errors", REQUEUE_AFTER.as_secs()),
            Policy::Default => "default limiter".to_string(),
            Policy::Jitter => format!("default + {:.0}% jitter", JITTER * 100.0),
            Policy::MaxWait => format!("default + MaxWait({}s)", opts.max_wait.as_secs()),
            Policy::Outage => "default + outage detection".to_string(),
        }
    }
}

#[derive(Debug)]
struct Options {
    objects: u32,
    outage: Duration,
    policies: Vec<Policy>,
    workers: usize,
    max_wait: Duration,
    /// Percent of the objects that fail for their own reasons throughout.
    own_failures: u32,
    /// Events per second for every object during the outage.
    events_per_sec: u32,
    /// `Builder::keep_backoff(true)` for every policy.
    keep_backoff: bool,
    svg: Option<PathBuf>,
}

/// The command line (`--help` lists it).
#[derive(Debug, Parser)]
#[command(
    name = "storm",
    about = "A retry storm against an API server that is down, and the policies that prevent it"
)]
struct Cli {
    /// Objects to reconcile
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..))]
    objects: u32,
    /// How long the API is down: seconds, or with s/m/h
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = duration_arg)]
    outage: Duration,
    /// Which policies to run: all | requeue | default | jitter | maxwait | outage, or 1-5
    #[arg(long, default_value = "all", value_parser = policies_arg)]
    policy: Policies,
    /// Concurrent reconciles
    #[arg(long, default_value_t = 50, value_parser = positive_arg)]
    workers: usize,
    /// The cap of the MaxWait policy: seconds, or with s/m/h
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = positive_duration_arg)]
    max_wait: Duration,
    /// Percent of the objects that fail for their own reasons (an invalid spec) throughout:
    /// every (100 / PCT)-th object
    #[arg(long, value_name = "PCT", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=100))]
    own_failures: u32,
    /// Events per second for every object during the outage (an informer re-adds it)
    #[arg(long, value_name = "N", default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    events_per_sec: u32,
    /// Every policy's queue keeps a key waiting on its backoff when an event adds it
    #[arg(long)]
    keep_backoff: bool,
    /// Also write the chart as an SVG file
    #[arg(long, value_name = "PATH")]
    svg: Option<PathBuf>,
}

/// The policies `--policy` names.
#[derive(Debug, Clone)]
struct Policies(Vec<Policy>);

fn parse_duration(s: &str) -> Option<Duration> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(i) => s.split_at(i),
        None => (s, "s"),
    };
    let n: u64 = number.parse().ok()?;
    let secs = match unit {
        "s" => n,
        "m" => n.checked_mul(60)?,
        "h" => n.checked_mul(3600)?,
        _ => return None,
    };
    Some(Duration::from_secs(secs))
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    parse_duration(s).ok_or_else(|| format!("not a duration (seconds, or with s/m/h): {s}"))
}

fn positive_duration_arg(s: &str) -> Result<Duration, String> {
    match duration_arg(s)? {
        d if d.is_zero() => Err("must be more than 0".to_string()),
        d => Ok(d),
    }
}

fn positive_arg(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("not a positive number: {s}")),
    }
}

fn policies_arg(s: &str) -> Result<Policies, String> {
    Ok(Policies(match s {
        "all" => Policy::ALL.to_vec(),
        "requeue" | "1" => vec![Policy::Requeue],
        "default" | "2" => vec![Policy::Default],
        "jitter" | "3" => vec![Policy::Jitter],
        "maxwait" | "4" => vec![Policy::MaxWait],
        "outage" | "5" => vec![Policy::Outage],
        _ => {
            return Err("one of all, requeue, default, jitter, maxwait, outage, 1-5".to_string());
        }
    }))
}

fn parse_args() -> Options {
    let cli = Cli::parse();
    Options {
        objects: cli.objects,
        outage: cli.outage,
        policies: cli.policy.0,
        workers: cli.workers,
        max_wait: cli.max_wait,
        own_failures: cli.own_failures,
        events_per_sec: cli.events_per_sec,
        keep_backoff: cli.keep_backoff,
        svg: cli.svg,
    }
}

// ---- the simulated API server ------------------------------------------------------------------

/// The error of a request: the server is down, or the object is invalid (its own failure).
#[derive(Debug)]
enum ApiError {
    Unavailable,
    Invalid,
}

/// Whether `object` fails for its own reasons with `own_failures` percent of them failing.
fn fails_on_its_own(object: u32, own_failures: u32) -> bool {
    own_failures > 0 && object.is_multiple_of((100 / own_failures).max(1))
}

/// An in-process API server that is down until `recovers_at`, and slows down under load.
#[derive(Debug)]
struct Api {
    start: Instant,
    recovers_at: Instant,
    own_failures: u32,
    state: Mutex<ApiState>,
    converged: Notify,
}

#[derive(Debug)]
struct ApiState {
    /// Arrival times of the requests of the last second.
    window: VecDeque<Instant>,
    /// Requests per whole second since the start.
    per_second: Vec<u32>,
    /// Whether each object has been reconciled successfully.
    reconciled: Vec<bool>,
    remaining: u32,
    converged_at: Option<Instant>,
    /// Requests for the objects that fail on their own.
    invalid_requests: u64,
}

impl Api {
    fn new(start: Instant, outage: Duration, objects: u32, own_failures: u32) -> Self {
        let invalid = (0..objects)
            .filter(|&o| fails_on_its_own(o, own_failures))
            .count() as u32;
        Api {
            start,
            // An outage too long for an instant never ends.
            recovers_at: start
                .checked_add(outage)
                .unwrap_or_else(|| start + FAR_FUTURE),
            own_failures,
            state: Mutex::new(ApiState {
                window: VecDeque::new(),
                per_second: Vec::new(),
                reconciled: vec![false; objects as usize],
                // The objects that fail on their own never converge: the others are awaited.
                remaining: objects - invalid,
                converged_at: None,
                invalid_requests: 0,
            }),
            converged: Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ApiState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// One request updating `object`: fails while the server is down (judged at arrival), and
    /// takes longer the more requests the server received in the last second.
    async fn update(&self, object: u32) -> Result<(), ApiError> {
        let invalid = fails_on_its_own(object, self.own_failures);
        let now = Instant::now();
        let latency = {
            let mut s = self.lock();
            let second = now.duration_since(self.start).as_secs() as usize;
            if s.per_second.len() <= second {
                s.per_second.resize(second + 1, 0);
            }
            s.per_second[second] += 1;
            while s
                .window
                .front()
                .is_some_and(|&t| now.duration_since(t) >= Duration::from_secs(1))
            {
                s.window.pop_front();
            }
            s.window.push_back(now);
            s.invalid_requests += u64::from(invalid);
            BASE_LATENCY + LATENCY_PER_RPS * s.window.len() as u32
        };
        sleep(latency).await;
        if now < self.recovers_at {
            return Err(ApiError::Unavailable);
        }
        if invalid {
            return Err(ApiError::Invalid);
        }
        let mut s = self.lock();
        let seen = &mut s.reconciled[object as usize];
        if !*seen {
            *seen = true;
            s.remaining = s.remaining.saturating_sub(1);
            if s.remaining == 0 && s.converged_at.is_none() {
                s.converged_at = Some(Instant::now());
                self.converged.notify_one();
            }
        }
        Ok(())
    }
}

// ---- one scenario ------------------------------------------------------------------------------

/// What one policy did to the API.
#[derive(Debug)]
struct Outcome {
    policy: Policy,
    /// Requests per whole second since the start.
    per_second: Vec<u32>,
    /// How long the scenario ran, in whole seconds (rounded up).
    ran_for: u64,
    during_outage: u64,
    peak_first_minute: u32,
    /// The peak after the first minute, if the scenario ran longer than that.
    peak_later: Option<u32>,
    /// Mean requests per second over the second half of the outage.
    steady: f64,
    /// From the recovery until every object had been reconciled successfully.
    converged_after: Option<Duration>,
    /// Requests for the objects that fail on their own (`--own-failures`).
    invalid_requests: u64,
    /// How many times the outage detector opened (policy 5).
    openings: u64,
    /// For policy 5 with `--events-per-sec`: its requests during the outage without events.
    without_events: Option<u64>,
}

async fn scenario(opts: &Options, policy: Policy) -> Outcome {
    match policy {
        Policy::Requeue | Policy::Default | Policy::Outage => {
            run(opts, policy, default_controller_rate_limiter::<u32>()).await
        }
        Policy::Jitter => {
            let limiter = jittered_controller_rate_limiter::<u32>(JITTER, Some(JITTER_SEED))
                .expect("a valid jitter fraction");
            run(opts, policy, limiter).await
        }
        Policy::MaxWait => {
            let limiter = MaxWait::new(default_controller_rate_limiter::<u32>(), opts.max_wait);
            run(opts, policy, limiter).await
        }
    }
}

async fn run(opts: &Options, policy: Policy, limiter: impl RateLimiter<u32> + 'static) -> Outcome {
    let start = Instant::now();
    let api = Arc::new(Api::new(
        start,
        opts.outage,
        opts.objects,
        opts.own_failures,
    ));
    let mut builder = WorkQueue::builder()
        .rate_limiter(limiter)
        .capacity(opts.objects as usize)
        .keep_backoff(opts.keep_backoff);
    if policy == Policy::Outage {
        builder = builder.outage_detection(OutageConfig::default());
    }
    let queue: WorkQueue<u32> = builder.build();
    queue.add_batch(0..opts.objects);

    let requeue_on_error = policy == Policy::Requeue;
    let reconcile = {
        let api = Arc::clone(&api);
        move |object: u32, _ctx| {
            let api = Arc::clone(&api);
            async move {
                match api.update(object).await {
                    Ok(()) => Ok(Action::await_change()),
                    // The anti-pattern: the error is hidden as a fixed-delay requeue.
                    Err(_) if requeue_on_error => Ok(Action::requeue(REQUEUE_AFTER)),
                    Err(e) => Err(e),
                }
            }
        }
    };
    let stop = CancellationToken::new();
    let runner = Runner::new(queue.clone(), reconcile).workers(opts.workers);
    let running = tokio::spawn(runner.run(stop.clone()));
    if opts.events_per_sec > 0 {
        // The informer: every object re-added `events_per_sec` times a second until the API is
        // back (and not past the simulated time an instant can reach).
        let (queue, objects) = (queue.clone(), opts.objects);
        let until = api.recovers_at;
        let every = Duration::from_secs(1) / opts.events_per_sec;
        tokio::spawn(async move {
            let mut next = Instant::now() + every;
            while next < until {
                sleep_until(next).await;
                queue.add_batch(0..objects);
                next += every;
            }
        });
    }

    // The longest any object can wait after the recovery: the jittered backoff cap, the bucket's
    // 10 qps for every object, and a margin. Past it the scenario is reported as not converged.
    let mut give_up_at = api.recovers_at
        + MAX_BACKOFF.mul_f64(1.0 + JITTER)
        + Duration::from_millis(100) * opts.objects
        + Duration::from_secs(300);
    if opts.events_per_sec > 0 {
        // Every failed event takes a token of the 10 qps bucket: its debt can delay the first
        // retries after the recovery by up to one tenth of a second per event.
        let events = u64::from(opts.events_per_sec) * u64::from(opts.objects);
        give_up_at += (opts.outage / 10).saturating_mul(events.min(u64::from(u32::MAX)) as u32);
    }
    if api.lock().remaining == 0 {
        // Nothing to converge (every object fails on its own): watch the retries for a while.
        give_up_at = api.recovers_at + Duration::from_secs(600);
    }
    tokio::select! {
        biased;
        () = api.converged.notified() => {}
        () = sleep_until(give_up_at) => {}
    }
    sleep(TAIL).await;
    stop.cancel();
    queue.shut_down();
    let report = running.await.expect("the runner does not panic");
    let ran_for = start.elapsed().as_secs_f64().ceil() as u64;

    let s = api.lock();
    let total: u64 = s.per_second.iter().map(|&n| u64::from(n)).sum();
    assert_eq!(
        report.processed + report.errors,
        total,
        "one request per reconcile"
    );
    assert_eq!(report.panics + report.timeouts + report.interrupted, 0);
    let outage_secs = opts.outage.as_secs() as usize;
    let outage = &s.per_second[..outage_secs.min(s.per_second.len())];
    let half = &outage[(outage_secs / 2).min(outage.len())..];
    let half_secs = (outage_secs - outage_secs / 2).max(1);
    let first_minute = FIRST_MINUTE.min(s.per_second.len());
    Outcome {
        policy,
        per_second: s.per_second.clone(),
        ran_for,
        during_outage: outage.iter().map(|&n| u64::from(n)).sum(),
        peak_first_minute: s.per_second[..first_minute]
            .iter()
            .copied()
            .max()
            .unwrap_or(0),
        peak_later: s.per_second[first_minute..].iter().copied().max(),
        steady: half.iter().map(|&n| u64::from(n)).sum::<u64>() as f64 / half_secs as f64,
        converged_after: s
            .converged_at
            .map(|t| t.saturating_duration_since(api.recovers_at)),
        invalid_requests: s.invalid_requests,
        openings: report.outage_openings,
        without_events: None,
    }
}

// ---- output ------------------------------------------------------------------------------------

/// Mean requests per second over `[from, to)` seconds.
fn mean_rps(per_second: &[u32], from: u64, to: u64) -> f64 {
    let sum: u64 = (from..to)
        .filter_map(|s| per_second.get(s as usize))
        .map(|&n| u64::from(n))
        .sum();
    sum as f64 / (to - from).max(1) as f64
}

/// A round number at least `v`: 1, 2 or 5 times a power of ten.
fn nice_ceil(v: f64) -> f64 {
    if v <= 0.0 || !v.is_finite() {
        return 1.0;
    }
    let mut step = 1.0;
    while step * 10.0 <= v {
        step *= 10.0;
    }
    while step > v {
        step /= 10.0;
    }
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * step)
        .find(|&c| c >= v)
        .unwrap_or(10.0 * step)
}

fn fmt_rate(v: f64) -> String {
    if v >= 10.0 || v == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn fmt_secs(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 10.0 {
        format!("{s:.1} s")
    } else {
        format!("{s:.0} s")
    }
}

fn fmt_converged(d: Option<Duration>) -> String {
    d.map_or_else(|| "not converged".to_string(), fmt_secs)
}

/// The requests-per-second chart of one policy: `columns` columns of `width` seconds each.
fn chart(o: &Outcome, columns: u64, width: u64, y_max: f64, outage_secs: u64) -> String {
    const EIGHTHS: [char; 9] = [' ', '▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let levels = (CHART_ROWS * 8) as f64;
    let heights: Vec<u64> = (0..columns)
        .map(|c| {
            let v = mean_rps(&o.per_second, c * width, (c + 1) * width);
            let h = (v / y_max * levels).round() as u64;
            // Any traffic at all shows as at least a sliver.
            if v > 0.0 { h.max(1) } else { 0 }
        })
        .collect();
    let mut out = String::new();
    for row in 0..CHART_ROWS {
        let label = match row {
            0 => fmt_rate(y_max),
            r if r == CHART_ROWS / 2 => fmt_rate(y_max / 2.0),
            _ => String::new(),
        };
        let tick = if label.is_empty() { '│' } else { '┤' };
        let _ = write!(out, "{label:>7} {tick}");
        let floor = ((CHART_ROWS - 1 - row) * 8) as u64;
        for &h in &heights {
            out.push(EIGHTHS[h.saturating_sub(floor).min(8) as usize]);
        }
        out.push('\n');
    }
    let recovery_column = outage_secs / width;
    let _ = write!(out, "{:>7} └", 0);
    for c in 0..columns {
        out.push(if c == recovery_column { '┴' } else { '─' });
    }
    out.push('\n');
    // Time labels: the start, the recovery (under its tick) and the end.
    let mut axis = vec![' '; columns as usize + 24];
    let mut put = |at: usize, text: &str| {
        for (slot, ch) in axis.iter_mut().skip(at).zip(text.chars()) {
            *slot = ch;
        }
    };
    put(0, "0 s");
    let recovery = format!("API back at {outage_secs} s");
    let at = (recovery_column as usize + 1)
        .saturating_sub(recovery.len() / 2)
        .max(5);
    put(at, &recovery);
    let end = format!("{} s", columns * width);
    put(
        (columns as usize + 1)
            .saturating_sub(end.len())
            .max(at + recovery.len() + 2),
        &end,
    );
    let axis: String = axis.into_iter().collect();
    let _ = writeln!(out, "{:>8}{}", "", axis.trim_end());
    out
}

/// ", N.Nx the default's requests" during the outage, when the default policy ran too.
fn vs_default(o: &Outcome, default: Option<&Outcome>) -> String {
    match default {
        Some(d) if d.during_outage > 0 => {
            let ratio = o.during_outage as f64 / d.during_outage as f64;
            format!(", {ratio:.1}x the default's requests")
        }
        _ => String::new(),
    }
}

/// "all converged N s after the recovery", or that they did not within the run.
fn converged_clause(o: &Outcome) -> String {
    match o.converged_after {
        Some(d) => format!("all converged {} after the recovery", fmt_secs(d)),
        None => "not all converged within the run".to_string(),
    }
}

fn takeaway(o: &Outcome, opts: &Options, default: Option<&Outcome>) -> String {
    let objects = opts.objects;
    let cap = opts.max_wait.as_secs();
    let steady = fmt_rate(o.steady);
    let converged = fmt_converged(o.converged_after);
    match (o.policy, default) {
        (Policy::Requeue, _) => {
            let vs = vs_default(o, default);
            format!(
                "all {objects} objects retry every {}s: waves of {objects} requests that the \
                 server's rising latency smears into a constant {steady} rps for the whole \
                 outage{vs}; the only upside is recovery within {}s",
                REQUEUE_AFTER.as_secs(),
                REQUEUE_AFTER.as_secs(),
            )
        }
        (Policy::Default, _) if opts.events_per_sec > 0 => format!(
            "each event makes its waiting object ready at once (client-go's rule), so backoff \
             never holds and every event is a request ({steady} rps steady); each failure also \
             takes a token of the bucket, and the debt they run up delays the retries long \
             after the recovery ({})",
            converged_clause(o)
        ),
        (Policy::Default, _) => format!(
            "the 10 qps bucket paces the retries, then per-key backoff doubles toward {} s and \
             the load fades to {steady} rps; the price is a late first retry after a long outage \
             ({})",
            MAX_BACKOFF.as_secs(),
            converged_clause(o)
        ),
        (Policy::Jitter, Some(d)) => {
            let later = |o: &Outcome| o.peak_later.unwrap_or(0);
            let spread = if later(o) < later(d) {
                "jitter spread the retries that fired together"
            } else {
                "the bucket had already spaced the retries evenly, so random spreading only \
                 clumps them"
            };
            let when = match (o.converged_after, d.converged_after) {
                (Some(j), Some(d)) if j > d => "later",
                (Some(j), Some(d)) if j < d => "earlier",
                _ => "at the same time",
            };
            format!(
                "{spread} (peak after the first minute {} vs {} rps); as jitter only lengthens \
                 delays (the {} s cap becomes up to {:.0} s), recovery came {when} ({converged} \
                 vs {})",
                later(o),
                later(d),
                MAX_BACKOFF.as_secs(),
                MAX_BACKOFF.as_secs_f64() * (1.0 + JITTER),
                fmt_converged(d.converged_after),
            )
        }
        (Policy::Jitter, None) => format!(
            "jitter lengthens each per-key backoff by up to {:.0}%, so retries that would fire \
             together are spread out (steady {steady} rps; all converged {converged} after the \
             recovery)",
            JITTER * 100.0
        ),
        (Policy::MaxWait, _) => {
            let vs = vs_default(o, default);
            // MaxWait cuts the bucket's delays too: past `cap * qps` objects the bucket no longer
            // holds the retries to its rate.
            let bucket = if o.steady > 10.5 {
                "; the cap also cuts the bucket's delays, so its 10 qps no longer holds"
            } else {
                ""
            };
            format!(
                "the trade-off: every object is retried within {cap} s of the API's return \
                 (all converged {converged} after it), but also every {cap} s for as long as the \
                 outage lasts ({steady} rps steady{vs}){bucket}"
            )
        }
        (Policy::Outage, _) => {
            let vs = vs_default(o, default);
            if o.openings == 0 {
                return format!(
                    "the detector never opened: the failures were too few against the \
                     successes, so every key backed off as with the default (all converged \
                     {converged} after the recovery)"
                );
            }
            let opened = match o.openings {
                1 => "the detector opened once".to_string(),
                n => format!("the detector opened {n} times"),
            };
            let events = match o.without_events {
                Some(quiet) => format!(
                    "; events for parked objects left them parked ({:.2}x its requests without \
                     events)",
                    o.during_outage as f64 / quiet.max(1) as f64
                ),
                None => String::new(),
            };
            format!(
                "{opened}: failing keys were parked and one probe ran at a time, every {} s at \
                 most ({steady} rps steady{vs}{events}); the first probe after the recovery \
                 released every key through the bucket (all converged {converged} after it)",
                OutageConfig::default().probe_max().as_secs()
            )
        }
    }
}

/// Policy 5's targets, each with PASS or FAIL, from the simulated figures (the default limiter's
/// run is the reference; without it, nothing is checked).
fn targets(outcomes: &[Outcome], opts: &Options) -> Vec<(String, bool)> {
    let (Some(d), Some(o)) = (
        outcomes.iter().find(|o| o.policy == Policy::Default),
        outcomes.iter().find(|o| o.policy == Policy::Outage),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if opts.outage.is_zero() {
        out.push((
            "no outage: the detector never opens".to_string(),
            o.openings == 0,
        ));
    } else {
        let bound = d.during_outage as f64 * 0.25;
        out.push((
            format!(
                "requests during the outage <= 0.25x the default's ({} <= {bound:.0})",
                o.during_outage
            ),
            o.during_outage as f64 <= bound,
        ));
        if opts.outage > Duration::from_secs(120) {
            out.push((
                format!(
                    "every object converged <= 20 s after the recovery ({})",
                    fmt_converged(o.converged_after)
                ),
                o.converged_after
                    .is_some_and(|c| c <= Duration::from_secs(20)),
            ));
        }
    }
    if let Some(quiet) = o.without_events {
        let bound = quiet as f64 * 1.5;
        out.push((
            format!(
                "with {} event(s)/s per object, requests during the outage <= 1.5x its own \
                 without events ({} <= {bound:.0})",
                opts.events_per_sec, o.during_outage
            ),
            o.during_outage as f64 <= bound,
        ));
    }
    if opts.own_failures > 0 && opts.outage.is_zero() {
        out.push((
            format!(
                "the objects failing on their own are retried as by the default ({} vs {} \
                 requests)",
                o.invalid_requests, d.invalid_requests
            ),
            o.invalid_requests == d.invalid_requests,
        ));
    }
    out
}

/// Chart geometry shared by the terminal and the SVG: the time span and a common rate scale.
struct Scale {
    columns: u64,
    width: u64,
    y_max: f64,
}

impl Scale {
    fn new(outcomes: &[Outcome], end: u64, columns: u64) -> Scale {
        let width = end.div_ceil(columns).max(1);
        let columns = end.div_ceil(width).max(1);
        let max = outcomes
            .iter()
            .flat_map(|o| {
                (0..columns).map(move |c| mean_rps(&o.per_second, c * width, (c + 1) * width))
            })
            .fold(0.0, f64::max);
        Scale {
            columns,
            width,
            y_max: nice_ceil(max),
        }
    }
}

fn svg(outcomes: &[Outcome], opts: &Options, end: u64) -> String {
    const COLORS: [&str; 5] = ["#d62728", "#1f77b4", "#2ca02c", "#ff7f0e", "#9467bd"];
    let scale = Scale::new(outcomes, end, 300);
    let (left, right, top, bottom) = (60.0, 20.0, 78.0, 50.0);
    let (panel, gap) = (90.0, 34.0);
    let w = 900.0;
    let pw = w - left - right;
    let h = top + bottom + outcomes.len() as f64 * (panel + gap) - gap;
    let x_max = (scale.columns * scale.width) as f64;
    let x = |t: f64| left + t / x_max * pw;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r##"<text x="{left}" y="24" font-size="15" font-weight="bold">Requests per second to a simulated API server that is down for {} s</text><text x="{left}" y="42" fill="#444">{} objects, {} workers, latency {} ms + {} ms per request/s; {} s means on one scale</text>"##,
        opts.outage.as_secs(),
        opts.objects,
        opts.workers,
        BASE_LATENCY.as_millis(),
        LATENCY_PER_RPS.as_millis(),
        scale.width
    );
    let rx = x(opts.outage.as_secs_f64());
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">API recovers</text>"#,
        rx,
        top - 26.0
    );
    for (i, o) in outcomes.iter().enumerate() {
        let color = COLORS[(o.policy.number() - 1) % COLORS.len()];
        let y0 = top + i as f64 * (panel + gap);
        let base = y0 + panel;
        let y = |v: f64| base - v / scale.y_max * panel;
        let _ = writeln!(
            s,
            r##"<text x="{left}" y="{:.1}" fill="{color}" font-weight="bold">{}. {}</text><text x="{:.1}" y="{:.1}" text-anchor="end" fill="#444">{} requests during the outage, steady {} rps, converged {} after recovery</text>"##,
            y0 - 6.0,
            o.policy.number(),
            o.policy.short(opts),
            left + pw,
            y0 - 6.0,
            o.during_outage,
            fmt_rate(o.steady),
            fmt_converged(o.converged_after)
        );
        for v in [0.0, scale.y_max / 2.0, scale.y_max] {
            let _ = writeln!(
                s,
                r##"<line x1="{left}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#e4e4e4"/><text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
                left + pw,
                left - 6.0,
                y(v) + 4.0,
                fmt_rate(v),
                yy = y(v),
            );
        }
        let mut points = format!("{:.1},{base:.1}", x(0.0));
        for c in 0..scale.columns {
            let v = mean_rps(&o.per_second, c * scale.width, (c + 1) * scale.width);
            let (t0, t1) = ((c * scale.width) as f64, ((c + 1) * scale.width) as f64);
            let _ = write!(points, " {:.1},{:.1} {:.1},{:.1}", x(t0), y(v), x(t1), y(v));
        }
        let _ = write!(points, " {:.1},{base:.1}", x(x_max));
        let _ = writeln!(
            s,
            r#"<polyline fill="{color}" fill-opacity="0.15" stroke="{color}" stroke-width="1.5" points="{points}"/>"#
        );
        let _ = writeln!(
            s,
            r#"<line x1="{left}" y1="{y0:.1}" x2="{left}" y2="{base:.1}" stroke="black"/><line x1="{left}" y1="{base:.1}" x2="{:.1}" y2="{base:.1}" stroke="black"/><line x1="{rx:.1}" y1="{y0:.1}" x2="{rx:.1}" y2="{base:.1}" stroke="black" stroke-dasharray="4 3"/>"#,
            left + pw
        );
    }
    let axis = h - bottom;
    let tick = nice_ceil(x_max / 10.0);
    let mut t = 0.0;
    while t <= x_max {
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{axis:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999"/><text x="{xx:.1}" y="{:.1}" text-anchor="middle">{t:.0}</text>"##,
            axis + 5.0,
            axis + 18.0,
            xx = x(t),
        );
        t += tick;
    }
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">simulated time (s)</text><text transform="translate(16 {:.1}) rotate(-90)" text-anchor="middle">requests / s</text>"#,
        left + pw / 2.0,
        h - 12.0,
        top + (axis - top) / 2.0
    );
    s.push_str("</svg>\n");
    s
}

fn print_results(outcomes: &[Outcome], opts: &Options) {
    let outage_secs = opts.outage.as_secs();
    let end = outcomes.iter().map(|o| o.ran_for).max().unwrap_or(1);
    let scale = Scale::new(outcomes, end, CHART_COLUMNS);
    println!(
        "Requests per second to the API ({} s means, one scale for all charts):\n",
        scale.width
    );
    for o in outcomes {
        println!("{}. {}", o.policy.number(), o.policy.title(opts));
        println!(
            "{}",
            chart(o, scale.columns, scale.width, scale.y_max, outage_secs)
        );
    }

    println!(
        "| policy | requests during the {outage_secs} s outage | peak rps, first minute / later | \
         steady rps (2nd half of outage) | all {} converged after recovery |",
        match opts.own_failures {
            0 => opts.objects.to_string(),
            _ => format!(
                "{} healthy",
                (0..opts.objects)
                    .filter(|&o| !fails_on_its_own(o, opts.own_failures))
                    .count()
            ),
        }
    );
    println!("|---|---:|---:|---:|---:|");
    for o in outcomes {
        let later = o
            .peak_later
            .map_or_else(|| "-".to_string(), |p| p.to_string());
        println!(
            "| {}. {} | {} | {} / {later} | {} | {} |",
            o.policy.number(),
            o.policy.short(opts),
            o.during_outage,
            o.peak_first_minute,
            fmt_rate(o.steady),
            fmt_converged(o.converged_after),
        );
    }
    print!(
        "\nPeaks are requests in one second; the first minute holds the first pass over all objects"
    );
    if outcomes.iter().any(|o| o.policy != Policy::Requeue) {
        print!(" and the limiters' first retries (the bucket lets 100 through at once)");
    }
    println!(".");
    let default = outcomes.iter().find(|o| o.policy == Policy::Default);
    println!();
    for o in outcomes {
        println!(
            "{}. {}: {}.",
            o.policy.number(),
            o.policy.short(opts),
            takeaway(o, opts, default)
        );
    }
    let targets = targets(outcomes, opts);
    if !targets.is_empty() {
        println!("\nTargets of policy 5 (outage detection):");
        for (target, pass) in &targets {
            println!("  {} {target}", if *pass { "PASS" } else { "FAIL" });
        }
    }
}

fn main() {
    let opts = parse_args();
    let wall = std::time::Instant::now();
    // One thread and tokio's paused clock: the simulated hours take no real time, and the same
    // events happen in the same order on every run.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a tokio runtime");
    let outcomes: Vec<Outcome> = runtime.block_on(async {
        let mut outcomes = Vec::with_capacity(opts.policies.len());
        for &policy in &opts.policies {
            let mut outcome = scenario(&opts, policy).await;
            if policy == Policy::Outage && opts.events_per_sec > 0 && !opts.outage.is_zero() {
                // The reference of the events target: the same policy without events.
                let quiet = Options {
                    events_per_sec: 0,
                    policies: Vec::new(),
                    svg: None,
                    ..opts
                };
                outcome.without_events = Some(scenario(&quiet, policy).await.during_outage);
            }
            outcomes.push(outcome);
        }
        outcomes
    });

    let mut events = match opts.events_per_sec {
        0 => String::new(),
        n => format!("; {n} event(s) per second for every object during the outage"),
    };
    if opts.keep_backoff {
        events.push_str("; queues keep keys waiting on their backoff (keep_backoff)");
    }
    println!(
        "{} objects; the API is down for {} s, then healthy; latency {} ms + {} ms per request \
         it received in the last second; {} workers{events}; tokio's paused clock.\n",
        opts.objects,
        opts.outage.as_secs(),
        BASE_LATENCY.as_millis(),
        LATENCY_PER_RPS.as_millis(),
        opts.workers
    );
    print_results(&outcomes, &opts);

    if let Some(path) = &opts.svg {
        let end = outcomes.iter().map(|o| o.ran_for).max().unwrap_or(1);
        if let Err(e) = std::fs::write(path, svg(&outcomes, &opts, end)) {
            eprintln!("error: cannot write {}: {e}", path.display());
            std::process::exit(1);
        }
        println!("\nWrote {}.", path.display());
    }
    eprintln!(
        "(simulated in {:.2} s of wall-clock time)",
        wall.elapsed().as_secs_f64()
    );
}

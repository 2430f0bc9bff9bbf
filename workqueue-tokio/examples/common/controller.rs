//! The controller the metrics examples run: a named queue ("example") whose five objects are
//! reconciled every second, one of them failing three times before each success, so errors,
//! retries and backoff delays show up in the metrics too.

use std::time::Duration;

use workqueue_tokio::runner::{Action, Context, Report, Runner};
use workqueue_tokio::{CancellationToken, WorkQueue};

/// Runs the example controller until `stop` is cancelled.
pub async fn run_controller(stop: CancellationToken) -> Report {
    let queue: WorkQueue<String> = WorkQueue::builder().name("example").build();
    for i in 0..5 {
        queue.add(format!("default/web-{i}"));
    }
    let runner = Runner::new(queue.clone(), |key: String, ctx: Context| async move {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if key == "default/web-3" && ctx.rate_limited_retries() < 3 {
            return Err(format!("{key}: the API server said no"));
        }
        Ok(Action::requeue(Duration::from_secs(1)))
    })
    .workers(2);
    runner.run(stop).await
}

//! Scenario 4's kube-apiserver kill and restart right after the controllers converged: see
//! `workqueue_e2e::outage`. A test binary of its own, so that its control plane is its own: the
//! test kills kube-apiserver, and a test beside it in one binary would share that server.

use workqueue_e2e::outage::{self, Before, Fault};

/// The same outage right after the controllers converged: the 200 first failures meet 400
/// successes in the detector's 30 s window (each object's reconcile and the no-op reconcile
/// its own write queued), 10 s before them. The whole window's share of first failures is 1/3
/// < 1/2; the detector used to look only at the whole window, and never opened (813 requests
/// against the default limiter's 817). It now looks at every recent stretch of the window, and
/// the last few seconds hold only first failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_right_after_convergence_is_detected() {
    let figures = outage::run(Fault::KillAndRestart, Before::JustConverged).await;
    outage::assert_claims(Fault::KillAndRestart, &figures);
}

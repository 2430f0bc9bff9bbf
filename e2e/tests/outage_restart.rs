//! Scenario 4 with kube-apiserver killed and, 60 s later, started again on the same etcd:
//! see `workqueue_e2e::outage`.

use workqueue_e2e::outage::{self, Before, Fault};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_api_server_with_outage_detection_costs_a_quarter_of_the_requests() {
    let figures = outage::run(Fault::KillAndRestart, Before::Quiet).await;
    outage::assert_claims(Fault::KillAndRestart, &figures);
}

//! The Lease client and the protocol's configuration, against the scripted API server.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use kube::api::ObjectMeta;
use workqueue_kube::lease::{
    ConfigError, Created, Deleted, LeaseClient, LeaseConfig, LeaseError, Replaced, ShardLeases,
};

use workqueue_test_support::apiserver::ApiServer;

fn lease(name: &str, holder: &str) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(holder.into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    }
}

/// Create answers `Exists` for a Lease that exists, replace `Conflict` for a stale version,
/// delete `Conflict` for a stale version and `NotFound` for a missing Lease; other failures
/// are errors.
#[tokio::test(start_paused = true)]
async fn the_client_returns_exists_and_conflict_as_values() {
    let server = ApiServer::new();
    let one = LeaseClient::new(server.client_named("r1"), "kube-system");
    let two = LeaseClient::new(server.client_named("r2"), "kube-system");
    assert_eq!(one.get("x").await.unwrap(), None);
    let Created::Created(mine) = one.create(&lease("x", "r1")).await.unwrap() else {
        panic!("not created");
    };
    assert_eq!(
        two.create(&lease("x", "r2")).await.unwrap(),
        Created::Exists
    );
    let mut theirs = two.get("x").await.unwrap().unwrap();
    theirs.spec.as_mut().unwrap().holder_identity = Some("r2".into());
    assert!(matches!(
        two.replace(&theirs).await.unwrap(),
        Replaced::Replaced(_)
    ));
    // r1's version is stale now.
    assert_eq!(one.replace(&mine).await.unwrap(), Replaced::Conflict);
    let unversioned = lease("x", "r1");
    assert!(matches!(
        one.replace(&unversioned).await,
        Err(LeaseError::NoResourceVersion(name)) if name == "x"
    ));
    let stale = mine.metadata.resource_version.clone().unwrap();
    assert_eq!(one.delete("x", &stale).await.unwrap(), Deleted::Conflict);
    assert_eq!(one.list("").await.unwrap().len(), 1);
    let current = one.get("x").await.unwrap().unwrap();
    let rv = current.metadata.resource_version.unwrap();
    assert_eq!(one.delete("x", &rv).await.unwrap(), Deleted::Deleted);
    assert_eq!(one.delete("x", &rv).await.unwrap(), Deleted::NotFound);
    server.set_down(true);
    let error = one.get("x").await.unwrap_err();
    assert!(matches!(error, LeaseError::Api(_)), "{error}");
}

/// An invalid configuration is refused with a typed error that says what to change.
#[tokio::test]
async fn an_invalid_configuration_is_refused() {
    let server = ApiServer::new();
    let mut config = LeaseConfig::new("ctl", "default", "r1");
    config.renew_deadline = Duration::from_secs(20);
    let error = ShardLeases::new(server.client(), config).unwrap_err();
    assert!(matches!(error, ConfigError::RenewDeadline { .. }));
    assert_eq!(
        error.to_string(),
        "the renew deadline (20s) must be shorter than the lease duration (15s): the difference \
         is the margin in which a holder that lost its Lease stops its work before another \
         replica may take it"
    );
    let config = LeaseConfig::new("ctl", "default", "Pod_1");
    assert!(matches!(
        ShardLeases::new(server.client(), config),
        Err(ConfigError::Invalid {
            what: "identity",
            ..
        })
    ));
}

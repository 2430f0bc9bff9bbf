//! The protocol's configuration, against the scripted API server.

use std::time::Duration;

use crate::lease::config::ConfigErrorKind;
use crate::lease::{ConfigError, LeaseConfig, ShardLeases};

use workqueue_test_support::apiserver::ApiServer;

/// An invalid configuration is refused with a typed error that says what to change.
#[tokio::test]
async fn an_invalid_configuration_is_refused() {
    let server = ApiServer::new();
    let mut config = LeaseConfig::new("ctl", "default", "r1");
    config.renew_deadline = Duration::from_secs(20);
    let error = ShardLeases::new(server.client(), config).unwrap_err();
    assert!(matches!(
        error,
        ConfigError(ConfigErrorKind::RenewDeadline { .. })
    ));
    assert_eq!(
        error.to_string(),
        "the renew deadline (20s) must be shorter than the lease duration (15s): the difference \
         is the margin in which a holder that lost its Lease stops its work before another \
         replica may take it"
    );
    let config = LeaseConfig::new("ctl", "default", "Pod_1");
    assert!(matches!(
        ShardLeases::new(server.client(), config),
        Err(ConfigError(ConfigErrorKind::Invalid {
            what: "identity",
            ..
        }))
    ));
}

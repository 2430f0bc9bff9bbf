//! The protocol's configuration and its validation.

use std::time::Duration;

use super::names::{LeaseName, Names};

/// What a replica does after it lost a shard (its deadline passed without a renewal, or its
/// membership was fenced, taken over or deleted).
///
/// Whatever the choice, a lost shard's reconciles stop: none is polled past the shard's
/// deadline, a waiting one is dropped by the controller's watchdog, and one whose code is still
/// under way past the deadline (its runtime's thread blocked: a reconcile that computes without
/// awaiting on a `current_thread` runtime, or on one whose workers are all taken) ends the
/// process with [`EXIT_UNSTOPPABLE`], from a thread of its own (`workqueue-lease-guard`), before
/// another replica may take the shard: nothing else could keep the two replicas apart. That
/// safety net has no opt-out; a process that must never exit this way must never block its
/// runtime past `lease_duration - renew_deadline`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnLoss {
    /// Stay a member (joining again under a new token if the membership was lost) and take
    /// shards again as its share asks. The default: a replica that lost a shard to a slow
    /// network or a pause is not restarted for it (a restart would cost its cache and its
    /// queue), and its lost work has stopped by then anyway.
    #[default]
    Rejoin,
    /// Stop: hand over every shard it still holds, vacate its membership, and end the protocol;
    /// the controller then shuts down, so that the application can exit.
    Stop,
    /// End the process at once with [`EXIT_LOST`] when the controller sees a shard lost
    /// (controller-runtime's behaviour on a lost leader Lease: its manager exits); nothing is
    /// handed over or vacated (the Leases lapse). A hand-over is not a loss. For applications whose supervisor (Kubernetes) restarts the process, and that
    /// rather start afresh than trust state kept across a loss.
    Exit,
}

/// The exit status of a process that [`OnLoss::Exit`] ended after a lost shard.
pub const EXIT_LOST: i32 = 75;

/// The exit status of a process that the lease guard ended: a lost shard's reconcile was still
/// running its code past the shard's deadline plus most of `lease_duration - renew_deadline`
/// (its runtime's thread blocked), so another replica could soon run the same objects (see
/// [`OnLoss`]). Distinct from a returned error (1), a panic (101) and [`EXIT_LOST`].
pub const EXIT_UNSTOPPABLE: i32 = 76;

/// The Lease protocol's settings: the names of the Leases, this replica's identity, the number
/// of shards and the timing (controller-runtime's defaults).
///
/// The Leases are `{name}-shard-{i}` for `i` in `0..shards` and `{name}-member-{identity}`, in
/// `namespace`. Every replica of one controller must use the same `name`, `namespace`, `shards`
/// and timing; give each process its own identity, the pod's name (a pod restarted in place
/// reuses it, which is fine: each process adds a random instance of its own). Never fall back to
/// a shared default: two processes given one identity take turns instead of sharing the work
/// (see the [module documentation](super)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseConfig {
    /// The controller's name: the prefix of its Leases' names and the value of their
    /// `workqueue-kube/controller` label (a lowercase DNS label, at most 63 characters).
    pub name: String,
    /// The namespace of the Leases.
    pub namespace: String,
    /// This replica's identity, the pod's name: with a random instance per process, the holder
    /// written into the Leases it holds (lowercase letters, digits, `-` and `.`, as a pod
    /// name).
    pub identity: String,
    /// The number of shards (default 32; 1 is leader election). Fixed for the controller's
    /// life: a key's shard is [`shard_of`](super::shard_of) of its namespace, name and this number.
    pub shards: u32,
    /// How long after the last change it saw in a replica's membership Lease another replica
    /// may fence it and take its shards (default 15 s; written into the Lease, in whole seconds
    /// rounded up).
    pub lease_duration: Duration,
    /// How long after the start of its last renewal that made a new resourceVersion a replica
    /// counts itself as holding its shards (default 10 s): its deadline. Shorter than
    /// `lease_duration`: the difference is slack for a process stalled at its deadline.
    pub renew_deadline: Duration,
    /// How often a replica renews its membership Lease (default 2 s), and retries a write not
    /// answered yet. A write may take until the belief it would extend ends.
    pub retry_period: Duration,
    /// How long the controller has to drain a shard it hands over: the hand-over's deadline
    /// (default 10 s). A shard is given away
    /// only once acknowledged; shutting down gives up waiting after this plus the renew
    /// deadline.
    pub hand_over_timeout: Duration,
    /// What to do after a loss (default [`OnLoss::Rejoin`]).
    pub on_loss: OnLoss,
}

impl LeaseConfig {
    /// Sharding with the defaults: 32 shards, lease duration 15 s, renew deadline 10 s, retry
    /// period 2 s, hand-over timeout 10 s, rejoin after a loss.
    pub fn new(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            shards: 32,
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
            hand_over_timeout: Duration::from_secs(10),
            on_loss: OnLoss::Rejoin,
        }
    }

    /// Leader election: one shard, otherwise [`LeaseConfig::new`]'s defaults.
    pub fn leader_election(
        name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaseConfig {
            shards: 1,
            ..Self::new(name, namespace, identity)
        }
    }

    /// The name of the membership Lease of the replica `identity`.
    fn member_lease_name(&self, identity: &str) -> String {
        Names::new(&self.name).name(&LeaseName::Member(identity.into()))
    }

    /// The settings the protocol runs with, or why it cannot: [`LeaseConfig::validate`], then
    /// the lease duration as the Leases carry it, computed here once.
    pub(super) fn settings(&self) -> Result<Settings, ConfigError> {
        self.validate()?;
        let d = self.lease_duration;
        // `leaseDurationSeconds` is an i32 of whole seconds, rounded up.
        let seconds = (d.as_secs() + u64::from(d.subsec_nanos() > 0)).min(i32::MAX as u64);
        Ok(Settings {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            identity: self.identity.clone(),
            shards: self.shards,
            lease_duration: Duration::from_secs(seconds),
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
            hand_over_timeout: self.hand_over_timeout,
            on_loss: self.on_loss,
        })
    }

    /// Checks the settings; [`Controller::leases`](crate::controller::Controller::leases) does
    /// too (an invalid configuration is its stream's first item).
    pub fn validate(&self) -> Result<(), ConfigError> {
        dns_label("name", &self.name)?;
        dns_label("namespace", &self.namespace)?;
        subdomain_part("identity", &self.identity)?;
        if self.member_lease_name(&self.identity).len() > 253 {
            return Err(ConfigError(ConfigErrorKind::Invalid {
                what: "identity",
                value: self.identity.clone(),
                rule: "too long: the membership Lease's name `{name}-member-{identity}` must be at most 253 characters",
            }));
        }
        if self.shards == 0 {
            return Err(ConfigError(ConfigErrorKind::NoShards));
        }
        if self.lease_duration < Duration::from_secs(1) {
            return Err(ConfigError(ConfigErrorKind::LeaseDurationTooShort(
                self.lease_duration,
            )));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(ConfigError(ConfigErrorKind::RenewDeadline {
                renew_deadline: self.renew_deadline,
                lease_duration: self.lease_duration,
            }));
        }
        if self.retry_period.is_zero() || self.retry_period >= self.renew_deadline {
            return Err(ConfigError(ConfigErrorKind::RetryPeriod {
                retry_period: self.retry_period,
                renew_deadline: self.renew_deadline,
            }));
        }
        if self.hand_over_timeout.is_zero() {
            return Err(ConfigError(ConfigErrorKind::HandOverTimeout));
        }
        Ok(())
    }
}

/// A [`LeaseConfig`] that passed its checks, as the driver and the state machine read it (the
/// one copy they share), read-only: from [`LeaseConfig::settings`], except in the state
/// machine's tests, which build it with any timing ([`Settings::unchecked`]). Each field, and
/// its reader, is the [`LeaseConfig`] field of its name, but for `lease_duration`.
#[derive(Clone, Debug)]
pub(super) struct Settings {
    name: String,
    namespace: String,
    identity: String,
    shards: u32,
    /// As the Leases carry it (`leaseDurationSeconds`): whole seconds, rounded up.
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
    hand_over_timeout: Duration,
    on_loss: OnLoss,
}

impl Settings {
    pub(super) fn name(&self) -> &str {
        &self.name
    }

    pub(super) fn namespace(&self) -> &str {
        &self.namespace
    }

    pub(super) fn identity(&self) -> &str {
        &self.identity
    }

    pub(super) fn shards(&self) -> u32 {
        self.shards
    }

    /// As the Leases carry it (`leaseDurationSeconds`): whole seconds, rounded up.
    pub(super) fn lease_duration(&self) -> Duration {
        self.lease_duration
    }

    pub(super) fn renew_deadline(&self) -> Duration {
        self.renew_deadline
    }

    pub(super) fn retry_period(&self) -> Duration {
        self.retry_period
    }

    pub(super) fn hand_over_timeout(&self) -> Duration {
        self.hand_over_timeout
    }

    pub(super) fn on_loss(&self) -> OnLoss {
        self.on_loss
    }

    /// Replica `identity` of the controller `ctl` in `default`, with any number of shards and
    /// any timing (lease duration, renew deadline, retry period, hand-over timeout), unchecked:
    /// the state machine's tests and simulator.
    #[cfg(test)]
    pub(super) fn unchecked(
        identity: &str,
        shards: u32,
        [
            lease_duration,
            renew_deadline,
            retry_period,
            hand_over_timeout,
        ]: [Duration; 4],
        on_loss: OnLoss,
    ) -> Settings {
        Settings {
            name: "ctl".into(),
            namespace: "default".into(),
            identity: identity.into(),
            shards,
            lease_duration,
            renew_deadline,
            retry_period,
            hand_over_timeout,
            on_loss,
        }
    }
}

/// A [`LeaseConfig`] the protocol cannot run with. Its message names the setting to change, its
/// value and the rule it breaks; [`Controller::leases`](crate::controller::Controller::leases)
/// reports it as [`RunnerError::Leases`](crate::controller::RunnerError::Leases).
///
/// ```
/// use std::time::Duration;
/// use workqueue_kube::lease::LeaseConfig;
///
/// let mut config = LeaseConfig::new("widgets", "widgets-system", "widgets-7d9f-x2x4q");
/// config.retry_period = Duration::from_secs(10);
/// let error = config.validate().unwrap_err();
/// assert!(error.to_string().starts_with("the retry period (10s) must be above zero and shorter"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(transparent)]
pub struct ConfigError(pub(super) ConfigErrorKind);

/// What is wrong with a [`LeaseConfig`]: crate-private, the message is what a user reads.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub(super) enum ConfigErrorKind {
    /// A name that Kubernetes would refuse in a Lease's name or label.
    #[error("the {what} {value:?} is not valid: {rule}")]
    Invalid {
        /// Which setting.
        what: &'static str,
        /// Its value.
        value: String,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// `shards` is 0.
    #[error("the number of shards must be at least 1 (1 is leader election)")]
    NoShards,
    /// The lease duration is under a second (Leases count whole seconds).
    #[error("the lease duration ({0:?}) must be at least 1 s")]
    LeaseDurationTooShort(Duration),
    /// The renew deadline is not shorter than the lease duration.
    #[error(
        "the renew deadline ({renew_deadline:?}) must be shorter than the lease duration \
         ({lease_duration:?}): the difference is the margin in which a holder that lost its \
         Lease stops its work before another replica may take it"
    )]
    RenewDeadline {
        /// The renew deadline.
        renew_deadline: Duration,
        /// The lease duration.
        lease_duration: Duration,
    },
    /// The retry period is zero or not shorter than the renew deadline.
    #[error(
        "the retry period ({retry_period:?}) must be above zero and shorter than the renew \
         deadline ({renew_deadline:?}), so that a holder renews more than once before it \
         counts its Lease as lost"
    )]
    RetryPeriod {
        /// The retry period.
        retry_period: Duration,
        /// The renew deadline.
        renew_deadline: Duration,
    },
    /// The hand-over timeout is zero.
    #[error("the hand-over timeout must be above zero, or no shard is ever handed over")]
    HandOverTimeout,
}

/// A DNS label (RFC 1123): the controller name is a label value and a Lease name prefix, the
/// namespace a namespace name.
fn dns_label(what: &'static str, value: &str) -> Result<(), ConfigError> {
    let invalid = |rule| {
        ConfigError(ConfigErrorKind::Invalid {
            what,
            value: value.into(),
            rule,
        })
    };
    if value.is_empty() || value.len() > 63 {
        return Err(invalid("it must have 1 to 63 characters"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    {
        return Err(invalid(
            "it may hold only lowercase letters, digits and '-' (a DNS label)",
        ));
    }
    if value.starts_with('-') || value.ends_with('-') {
        return Err(invalid("it must start and end with a letter or a digit"));
    }
    Ok(())
}

/// The end of a DNS subdomain (RFC 1123): the identity ends the membership Lease's name.
fn subdomain_part(what: &'static str, value: &str) -> Result<(), ConfigError> {
    let invalid = |rule| {
        ConfigError(ConfigErrorKind::Invalid {
            what,
            value: value.into(),
            rule,
        })
    };
    if value.is_empty() {
        return Err(invalid("it must not be empty"));
    }
    if !value
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
    {
        return Err(invalid(
            "it may hold only lowercase letters, digits, '-' and '.' (as a pod name)",
        ));
    }
    if !value.ends_with(|c: char| c.is_ascii_alphanumeric())
        || value.starts_with('.')
        || value.contains("..")
        || value.contains(".-")
        || value.contains("-.")
    {
        return Err(invalid(
            "it must end with a letter or a digit, and each dot-separated part must start and end with one",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> LeaseConfig {
        LeaseConfig::new("widgets", "kube-system", "widgets-7d9f-abcde")
    }

    #[test]
    fn the_defaults_are_controller_runtimes_and_valid() {
        let c = config();
        assert_eq!(c.validate(), Ok(()));
        assert_eq!(
            (c.lease_duration, c.renew_deadline, c.retry_period, c.shards),
            (
                Duration::from_secs(15),
                Duration::from_secs(10),
                Duration::from_secs(2),
                32
            )
        );
        assert_eq!(
            Names::new(&c.name).name(&LeaseName::Shard(3)),
            "widgets-shard-3"
        );
        assert_eq!(
            c.member_lease_name(&c.identity),
            "widgets-member-widgets-7d9f-abcde"
        );
        assert_eq!(LeaseConfig::leader_election("a", "b", "c").shards, 1);
    }

    #[test]
    fn timing_must_nest_retry_in_renew_in_lease() {
        let mut c = config();
        c.renew_deadline = Duration::from_secs(15);
        assert!(matches!(
            c.validate(),
            Err(ConfigError(ConfigErrorKind::RenewDeadline { .. }))
        ));
        let mut c = config();
        c.retry_period = Duration::from_secs(10);
        let e = c.validate().unwrap_err();
        assert!(matches!(
            e,
            ConfigError(ConfigErrorKind::RetryPeriod { .. })
        ));
        assert!(
            e.to_string().contains("shorter than the renew deadline"),
            "{e}"
        );
        let mut c = config();
        c.lease_duration = Duration::from_millis(500);
        assert!(matches!(
            c.validate(),
            Err(ConfigError(ConfigErrorKind::LeaseDurationTooShort(_)))
        ));
        let mut c = config();
        c.shards = 0;
        assert_eq!(c.validate(), Err(ConfigError(ConfigErrorKind::NoShards)));
        let mut c = config();
        c.hand_over_timeout = Duration::ZERO;
        assert_eq!(
            c.validate(),
            Err(ConfigError(ConfigErrorKind::HandOverTimeout))
        );
    }

    #[test]
    fn names_must_be_what_kubernetes_accepts() {
        for (name, namespace, identity) in [
            ("Widgets", "default", "a"),
            ("-w", "default", "a"),
            ("w", "", "a"),
            ("w", "default", ""),
            ("w", "default", "pod_1"),
            ("w", "default", "pod-"),
            ("w", "default", "a..b"),
        ] {
            let c = LeaseConfig::new(name, namespace, identity);
            assert!(
                matches!(
                    c.validate(),
                    Err(ConfigError(ConfigErrorKind::Invalid { .. }))
                ),
                "{name} {namespace} {identity}"
            );
        }
        let long = "a".repeat(250);
        assert!(LeaseConfig::new("w", "default", long).validate().is_err());
        assert_eq!(
            LeaseConfig::new("w", "default", "pod.x-1").validate(),
            Ok(())
        );
    }

    #[test]
    fn the_written_duration_rounds_up_to_seconds() {
        let mut c = config();
        c.lease_duration = Duration::from_millis(15_001);
        assert_eq!(
            c.settings().unwrap().lease_duration,
            Duration::from_secs(16)
        );
        c.lease_duration = Duration::from_secs(15);
        assert_eq!(
            c.settings().unwrap().lease_duration,
            Duration::from_secs(15)
        );
    }
}

//! How the protocol's records are written into `coordination.k8s.io/v1` Leases and read back.
//!
//! A Lease of the protocol carries:
//! - the labels [`LABEL_CONTROLLER`] (the controller's name) and [`LABEL_ROLE`]
//!   ([`ROLE_MEMBER`] or [`ROLE_SHARD`]), which the watch selects on;
//! - `spec.holderIdentity`: the holder's token, `{identity}_{instance}` (empty: vacant);
//! - `spec.leaseDurationSeconds`; `spec.renewTime`, the writer's wall time (for people: no
//!   replica reads it);
//! - the annotations [`ANNOTATION_SHARDS`] (the writer's number of shards), `…/protocol`,
//!   `…/renewal` (a counter every write raises), `…/previous-holder` (members: the holder
//!   this record's history proves has stopped), `…/leaving` (members: shutting down) and
//!   `…/held` (members: it may hold shards).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::ObjectMeta;

use super::names::{LeaseName, Names};
use super::state::{Content, Record, Rv, Token};
use super::{ANNOTATION_SHARDS, LABEL_CONTROLLER, LABEL_ROLE, ROLE_MEMBER, ROLE_SHARD};

const ANNOTATION_PROTOCOL: &str = "workqueue-kube/protocol";
const ANNOTATION_RENEWAL: &str = "workqueue-kube/renewal";
const ANNOTATION_PREVIOUS: &str = "workqueue-kube/previous-holder";
const ANNOTATION_LEAVING: &str = "workqueue-kube/leaving";
const ANNOTATION_HELD: &str = "workqueue-kube/held";

/// The Lease to write for `content` (with `rv` for a replace, `None` for a create).
pub(crate) fn to_lease(
    names: &Names,
    controller: &str,
    namespace: &str,
    lease: &LeaseName,
    rv: Option<&Rv>,
    content: &Content,
    wall: Timestamp,
) -> Lease {
    let role = match lease {
        LeaseName::Member(_) => ROLE_MEMBER,
        LeaseName::Shard(_) => ROLE_SHARD,
    };
    let labels = BTreeMap::from([
        (LABEL_CONTROLLER.to_string(), controller.to_string()),
        (LABEL_ROLE.to_string(), role.to_string()),
    ]);
    let mut annotations =
        BTreeMap::from([(ANNOTATION_RENEWAL.to_string(), content.counter.to_string())]);
    if let Some(shards) = content.shards {
        annotations.insert(ANNOTATION_SHARDS.into(), shards.to_string());
    }
    if let Some(protocol) = content.protocol {
        annotations.insert(ANNOTATION_PROTOCOL.into(), protocol.to_string());
    }
    if let Some(previous) = &content.previous {
        annotations.insert(ANNOTATION_PREVIOUS.into(), previous.as_str().into());
    }
    if content.leaving {
        annotations.insert(ANNOTATION_LEAVING.into(), "true".into());
    }
    if content.held {
        annotations.insert(ANNOTATION_HELD.into(), "true".into());
    }
    let seconds = content.duration.as_secs() + u64::from(content.duration.subsec_nanos() > 0);
    Lease {
        metadata: ObjectMeta {
            name: Some(names.name(lease)),
            namespace: Some(namespace.into()),
            resource_version: rv.map(|rv| rv.as_str().to_string()),
            labels: Some(labels),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: content.holder.as_ref().map(|t| t.as_str().into()),
            lease_duration_seconds: Some(i32::try_from(seconds).unwrap_or(i32::MAX)),
            renew_time: Some(MicroTime(wall)),
            ..LeaseSpec::default()
        }),
    }
}

/// The record a Lease holds, if it is one of the controller's (`default_duration` for a Lease
/// that declares none).
pub(super) fn from_lease(
    names: &Names,
    lease: &Lease,
    default_duration: Duration,
) -> Option<(LeaseName, Record)> {
    let name = names.parse(lease.metadata.name.as_deref()?)?;
    let rv = Rv::new(lease.metadata.resource_version.as_deref()?);
    let annotations = lease.metadata.annotations.as_ref();
    let annotation = |key: &str| annotations.and_then(|a| a.get(key)).map(String::as_str);
    let spec = lease.spec.as_ref();
    let duration = spec
        .and_then(|s| s.lease_duration_seconds)
        .filter(|&s| s > 0)
        .map_or(default_duration, |s| Duration::from_secs(s as u64));
    let content = Content {
        holder: spec
            .and_then(|s| s.holder_identity.as_deref())
            .and_then(Token::parse),
        previous: annotation(ANNOTATION_PREVIOUS).and_then(Token::parse),
        counter: annotation(ANNOTATION_RENEWAL)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0),
        shards: annotation(ANNOTATION_SHARDS).and_then(|s| s.parse().ok()),
        protocol: annotation(ANNOTATION_PROTOCOL).and_then(|p| p.parse().ok()),
        leaving: annotation(ANNOTATION_LEAVING) == Some("true"),
        held: annotation(ANNOTATION_HELD) == Some("true"),
        duration,
    };
    Some((name, Record { rv, content }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::state::PROTOCOL;

    #[test]
    fn a_record_survives_the_round_trip() {
        let names = Names::new("ctl");
        let content = Content {
            holder: Token::parse("pod-a_00000000000000ff"),
            previous: Token::parse("pod-a_0000000000000001"),
            counter: 42,
            shards: Some(32),
            protocol: Some(PROTOCOL),
            leaving: true,
            held: true,
            duration: Duration::from_secs(15),
        };
        let member = LeaseName::Member("pod-a".into());
        let mut lease = to_lease(
            &names,
            "ctl",
            "default",
            &member,
            Some(&Rv::new("7")),
            &content,
            Timestamp::UNIX_EPOCH,
        );
        assert_eq!(lease.metadata.name.as_deref(), Some("ctl-member-pod-a"));
        assert_eq!(
            lease.metadata.labels.as_ref().unwrap()[LABEL_ROLE],
            ROLE_MEMBER
        );
        let (name, record) = from_lease(&names, &lease, Duration::ZERO).unwrap();
        assert_eq!(name, member);
        assert_eq!(record.rv, Rv::new("7"));
        assert_eq!(record.content, content);
        // Vacant, with nothing optional: an empty holder reads as none.
        let vacant = Content {
            holder: None,
            previous: None,
            leaving: false,
            held: false,
            shards: None,
            protocol: None,
            ..content
        };
        lease = to_lease(
            &names,
            "ctl",
            "default",
            &LeaseName::Shard(3),
            Some(&Rv::new("8")),
            &vacant,
            Timestamp::UNIX_EPOCH,
        );
        lease.spec.as_mut().unwrap().holder_identity = Some(String::new());
        let (name, record) = from_lease(&names, &lease, Duration::ZERO).unwrap();
        assert_eq!((name, record.content), (LeaseName::Shard(3), vacant));
    }

    #[test]
    fn a_lease_of_the_first_protocol_reads_as_another_protocol() {
        let names = Names::new("ctl");
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some("ctl-shard-0".into()),
                resource_version: Some("3".into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some("pod-a".into()),
                ..LeaseSpec::default()
            }),
        };
        let (_, record) = from_lease(&names, &lease, Duration::from_secs(15)).unwrap();
        assert_eq!(record.content.protocol, None);
        assert_eq!(record.content.duration, Duration::from_secs(15));
        assert_eq!(record.holder().unwrap().identity(), "pod-a");
        let other = Lease {
            metadata: ObjectMeta {
                name: Some("other-shard-0".into()),
                ..lease.metadata.clone()
            },
            ..lease
        };
        assert!(from_lease(&names, &other, Duration::ZERO).is_none());
    }
}

//! Reading the Leases: who holds what by this replica's own observation, how many replicas are
//! alive, and how many shards to take or give to reach a fair share.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;

use super::clock::LocalInstant;

/// The holder a record names (`None` when free: no holder, or an empty one).
pub(crate) fn holder(lease: &Lease) -> Option<&str> {
    let spec = lease.spec.as_ref()?;
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// The lease duration a record declares, or `default` when it declares none.
pub(crate) fn duration_of(lease: &Lease, default: Duration) -> Duration {
    let declared = lease.spec.as_ref().and_then(|s| s.lease_duration_seconds);
    match declared {
        Some(secs) if secs > 0 => Duration::from_secs(secs as u64),
        _ => default,
    }
}

/// When this replica first saw each Lease's current version: client-go's rule, expiry by the
/// observer's own clock from the last change it saw, whatever the record's `renewTime` says.
#[derive(Debug, Default)]
pub(crate) struct Observations {
    seen: HashMap<String, (String, LocalInstant)>,
}

impl Observations {
    /// Records a list's answer, received at `at` (read after the answer arrived, so that it is
    /// no earlier than any write the answer reflects). Names not listed are forgotten.
    pub fn observe<'a>(&mut self, leases: impl IntoIterator<Item = &'a Lease>, at: LocalInstant) {
        let mut next = HashMap::new();
        for lease in leases {
            let (Some(name), Some(rv)) = (&lease.metadata.name, &lease.metadata.resource_version)
            else {
                continue;
            };
            let seen = match self.seen.remove(name) {
                Some((old_rv, since)) if old_rv == *rv => (old_rv, since),
                _ => (rv.clone(), at),
            };
            next.insert(name.clone(), seen);
        }
        self.seen = next;
    }

    /// The local instant after which `lease` (as last listed) is expired: the time its
    /// current version was first seen plus its duration. `None` if it was never seen.
    pub fn expiry(&self, lease: &Lease, default: Duration) -> Option<LocalInstant> {
        let name = lease.metadata.name.as_ref()?;
        let (_, since) = self.seen.get(name)?;
        Some(*since + duration_of(lease, default))
    }

    /// Whether `lease` is expired at `now`: not changed for its duration since first seen.
    pub fn expired(&self, lease: &Lease, default: Duration, now: LocalInstant) -> bool {
        self.expiry(lease, default).is_some_and(|e| now > e)
    }
}

/// The bounds of a fair share of `shards` among `members` replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Share {
    pub floor: u32,
    pub ceil: u32,
}

pub(crate) fn fair_share(shards: u32, members: u32) -> Share {
    let members = members.max(1);
    Share {
        floor: shards / members,
        ceil: shards.div_ceil(members),
    }
}

/// What to do this round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Plan {
    pub take: u32,
    pub give: u32,
}

/// How many shards `me` takes and gives this round, given how many each live replica holds
/// (`counts`, `me` included), how many shards any replica may take now (`free`: unheld or
/// expired) and how many of them `me` may take (`takeable`).
///
/// Every replica ends between the floor and the ceiling of a fair share, with few hand-overs
/// and none back and forth:
/// - below the floor, take up to the floor;
/// - at or above the floor, take up to the ceiling only while no replica is below the floor
///   (the free shards go to those first);
/// - above the ceiling, give the excess;
/// - above the floor, give one shard a round when the replicas below the floor need more than
///   the free shards, and only if `me` is among the first of the replicas above the floor
///   (most shards first, then by identity) in number of shards still missing, so that the
///   replicas that agree on the counts do not all give at once.
pub(crate) fn plan(
    shards: u32,
    me: &str,
    counts: &BTreeMap<String, u32>,
    free: u32,
    takeable: u32,
) -> Plan {
    let share = fair_share(shards, counts.len() as u32);
    let mine = counts.get(me).copied().unwrap_or(0);
    let deficit: u32 = counts
        .values()
        .map(|&c| share.floor.saturating_sub(c))
        .sum();
    if mine < share.floor {
        return Plan {
            take: (share.floor - mine).min(takeable),
            give: 0,
        };
    }
    let take = if deficit == 0 && mine < share.ceil {
        (share.ceil - mine).min(takeable)
    } else {
        0
    };
    let give = if mine > share.ceil {
        mine - share.ceil
    } else if mine > share.floor && deficit > free {
        let mut givers: Vec<(&String, u32)> = counts
            .iter()
            .filter(|&(_, &c)| c > share.floor)
            .map(|(id, &c)| (id, c))
            .collect();
        givers.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let rank = givers.iter().position(|(id, _)| id.as_str() == me);
        u32::from(rank.is_some_and(|r| (r as u32) < deficit - free))
    } else {
        0
    };
    Plan { take, give }
}

/// The order in which `identity` prefers shards: a rotation that starts at a point of its own,
/// so that replicas racing for free shards mostly try different ones first. It gives shards away
/// from the end of this order.
pub(crate) fn preference(identity: &str, shards: u32) -> Vec<u32> {
    let start = super::shard_of(None, identity, shards);
    (0..shards).map(|k| (start + k) % shards).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use kube::api::ObjectMeta;

    fn counts(list: &[(&str, u32)]) -> BTreeMap<String, u32> {
        list.iter().map(|&(id, c)| (id.to_string(), c)).collect()
    }

    #[test]
    fn shares_are_floor_and_ceiling() {
        assert_eq!(
            fair_share(32, 3),
            Share {
                floor: 10,
                ceil: 11
            }
        );
        assert_eq!(fair_share(32, 4), Share { floor: 8, ceil: 8 });
        assert_eq!(fair_share(1, 2), Share { floor: 0, ceil: 1 });
        assert_eq!(
            fair_share(32, 0),
            Share {
                floor: 32,
                ceil: 32
            }
        );
    }

    #[test]
    fn a_newcomer_takes_free_shards_to_its_floor_first() {
        let c = counts(&[("a", 11), ("b", 11), ("c", 0)]);
        assert_eq!(plan(32, "c", &c, 10, 10), Plan { take: 10, give: 0 });
        // The others wait for the newcomer's floor before taking more.
        assert_eq!(plan(32, "a", &c, 10, 10), Plan { take: 0, give: 0 });
        let c = counts(&[("a", 11), ("b", 10), ("c", 10)]);
        assert_eq!(plan(32, "b", &c, 1, 1), Plan { take: 1, give: 0 });
    }

    #[test]
    fn a_holder_above_the_ceiling_gives_the_excess() {
        let c = counts(&[("a", 32), ("b", 0)]);
        assert_eq!(plan(32, "a", &c, 0, 0), Plan { take: 0, give: 16 });
        assert_eq!(plan(32, "b", &c, 0, 0), Plan { take: 0, give: 0 });
    }

    #[test]
    fn leader_election_keeps_its_leader() {
        let c = counts(&[("a", 1), ("b", 0)]);
        assert_eq!(plan(1, "a", &c, 0, 0), Plan::default());
        assert_eq!(plan(1, "b", &c, 0, 0), Plan::default());
        let c = counts(&[("a", 0), ("b", 0)]);
        assert_eq!(plan(1, "b", &c, 1, 1), Plan { take: 1, give: 0 });
    }

    #[test]
    fn only_as_many_as_needed_give_to_one_below_the_floor() {
        // 32 among 5: floor 6, ceiling 7. Four at the ceiling, one at 4: two must give one each.
        let c = counts(&[("a", 7), ("b", 7), ("c", 7), ("d", 7), ("e", 4)]);
        let gives: Vec<u32> = ["a", "b", "c", "d"]
            .iter()
            .map(|me| plan(32, me, &c, 0, 0).give)
            .collect();
        assert_eq!(gives, [1, 1, 0, 0]);
        // A free shard counts toward the need.
        let gives: Vec<u32> = ["a", "b", "c", "d"]
            .iter()
            .map(|me| plan(32, me, &c, 1, 0).give)
            .collect();
        assert_eq!(gives, [1, 0, 0, 0]);
        assert_eq!(plan(32, "e", &c, 1, 1), Plan { take: 1, give: 0 });
    }

    #[test]
    fn every_settled_state_is_fair_and_stable() {
        for shards in [1u32, 2, 7, 32] {
            for members in 1..=6u32 {
                let share = fair_share(shards, members);
                // A greedy settled state: the first ones at the ceiling.
                let mut left = shards;
                let list: Vec<(String, u32)> = (0..members)
                    .map(|m| {
                        let n = share.ceil.min(left);
                        left -= n;
                        (format!("r{m}"), n)
                    })
                    .collect();
                let c: BTreeMap<String, u32> = list.into_iter().collect();
                if c.values().any(|&n| n < share.floor) {
                    continue; // not a fair state; the rules move it (tested above)
                }
                for me in c.keys() {
                    assert_eq!(
                        plan(shards, me, &c, 0, 0),
                        Plan::default(),
                        "{shards} {c:?} {me}"
                    );
                }
            }
        }
    }

    fn lease(name: &str, rv: &str, holder: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.into()),
                lease_duration_seconds: Some(15),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expiry_counts_from_the_first_sight_of_a_version() {
        let t = |s| LocalInstant::from_duration(Duration::from_secs(s));
        let d = Duration::from_secs(30);
        let mut seen = Observations::default();
        let v1 = lease("x", "1", "a");
        seen.observe([&v1], t(100));
        seen.observe([&v1], t(110));
        assert_eq!(seen.expiry(&v1, d), Some(t(115)));
        assert!(!seen.expired(&v1, d, t(115)));
        assert!(seen.expired(&v1, d, t(116)));
        let v2 = lease("x", "2", "a");
        seen.observe([&v2], t(112));
        assert_eq!(seen.expiry(&v2, d), Some(t(127)));
        seen.observe([], t(113));
        assert_eq!(seen.expiry(&v2, d), None);
        assert_eq!(holder(&lease("y", "1", "")), None);
    }
}

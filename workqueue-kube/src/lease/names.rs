//! The names of one controller's Leases: which Lease a name is, and back. Shared by the state
//! machine (which knows Leases by [`LeaseName`]), the wire format and the configuration's
//! checks, and owned by none of them.

use std::fmt;
use std::sync::Arc;

/// Which Lease of the controller: a member's (`{name}-member-{identity}`) or a shard's
/// (`{name}-shard-{index}`).
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(super) enum LeaseName {
    Member(Arc<str>),
    Shard(u32),
}

impl fmt::Debug for LeaseName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseName::Member(id) => write!(f, "member-{id}"),
            LeaseName::Shard(i) => write!(f, "shard-{i}"),
        }
    }
}

/// The names of one controller's Leases.
#[derive(Clone, Debug)]
pub(super) struct Names {
    member_prefix: String,
    shard_prefix: String,
}

impl Names {
    pub(super) fn new(controller: &str) -> Names {
        Names {
            member_prefix: format!("{controller}-member-"),
            shard_prefix: format!("{controller}-shard-"),
        }
    }

    /// The Lease `name` is, or `None` for a name the protocol does not use.
    pub(super) fn parse(&self, name: &str) -> Option<LeaseName> {
        if let Some(id) = name.strip_prefix(&self.member_prefix) {
            return (!id.is_empty()).then(|| LeaseName::Member(id.into()));
        }
        let index = name.strip_prefix(&self.shard_prefix)?;
        // Only the canonical spelling: "07" is not shard 7's Lease.
        let shard: u32 = index.parse().ok()?;
        (shard.to_string() == index).then_some(LeaseName::Shard(shard))
    }

    /// The Lease's name.
    pub(super) fn name(&self, lease: &LeaseName) -> String {
        match lease {
            LeaseName::Member(id) => format!("{}{id}", self.member_prefix),
            LeaseName::Shard(i) => format!("{}{i}", self.shard_prefix),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_parsed_strictly() {
        let names = Names::new("ctl");
        assert_eq!(names.parse("ctl-shard-7"), Some(LeaseName::Shard(7)));
        assert_eq!(names.parse("ctl-shard-07"), None);
        assert_eq!(names.parse("ctl-shard-x"), None);
        assert_eq!(
            names.parse("ctl-member-pod-1"),
            Some(LeaseName::Member("pod-1".into()))
        );
        assert_eq!(names.parse("ctl-member-"), None);
        assert_eq!(names.parse("other-shard-1"), None);
        for lease in [LeaseName::Shard(3), LeaseName::Member("a.b".into())] {
            assert_eq!(names.parse(&names.name(&lease)), Some(lease));
        }
    }
}

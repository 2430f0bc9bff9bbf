//! The protocol's reading of one Lease: who holds it, and the fields that make every write of it
//! differ (which Lease it is: `names::LeaseName`). The driver converts Leases to and from these;
//! the state machine never sees a Kubernetes type.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

/// The version of the protocol written into every Lease. A holder whose records carry another
/// version (or none: the first protocol) is treated like one with another number of shards:
/// nobody takes a shard while it may be alive.
pub(crate) const PROTOCOL: u32 = 2;

/// One incarnation of a replica as a holder: the identity the user configured plus a random
/// instance, `{identity}_{instance:016x}`, written as a Lease's `holderIdentity`.
///
/// A process draws a new instance whenever it joins again after losing its membership, so a
/// record naming a token it no longer uses is never mistaken for its own, and two processes
/// given one identity are two holders.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Token(Arc<str>);

impl Token {
    /// The token of `identity`'s incarnation `instance`.
    pub(super) fn new(identity: &str, instance: u64) -> Token {
        Token(format!("{identity}_{instance:016x}").into())
    }

    /// A `holderIdentity` as read from a Lease (any string; `None` for an empty one).
    pub(crate) fn parse(holder: &str) -> Option<Token> {
        (!holder.is_empty()).then(|| Token(holder.into()))
    }

    /// The identity part: before the last `_` (identities hold no `_`), or the whole string
    /// for a holder written without an instance.
    pub(crate) fn identity(&self) -> &str {
        self.0.rsplit_once('_').map_or(&*self.0, |(id, _)| id)
    }

    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A Lease's `metadata.resourceVersion`: opaque, compared only for equality.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct Rv(Arc<str>);

impl Rv {
    pub(crate) fn new(rv: &str) -> Rv {
        Rv(rv.into())
    }

    /// As the API server wrote it.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Rv {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rv{}", self.0)
    }
}

/// What the protocol reads and writes in a Lease, besides its name and resourceVersion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Content {
    /// `spec.holderIdentity`; `None` for a vacant Lease (left, fenced or released).
    pub(crate) holder: Option<Token>,
    /// Members only: the last holder this record's history proves has stopped (an annotation).
    /// A fence and a rejoin write it, so that a replica that never saw the holder change still
    /// knows that holder's shards are free.
    pub(crate) previous: Option<Token>,
    /// A counter that every write raises (an annotation): no two writes of one Lease carry the
    /// same content, so every write makes a new resourceVersion, whatever the wall clock does;
    /// and a holder recognises which of its renewals a record is.
    pub(crate) counter: u64,
    /// The writer's number of shards (an annotation).
    pub(crate) shards: Option<u32>,
    /// The writer's protocol version (an annotation; `None` for the first protocol).
    pub(crate) protocol: Option<u32>,
    /// Members only: the replica is shutting down; no shard is given to it (an annotation).
    pub(crate) leaving: bool,
    /// Members only: the holder may hold shards (an annotation). Written by its first renewal
    /// after it joined, before it takes or is given any shard: a member whose record says
    /// otherwise holds none, so a shard Lease missing from a first list is free when no member
    /// says so (a first deployment), without waiting for it as for one deleted.
    pub(crate) held: bool,
    /// `spec.leaseDurationSeconds`: how long the writer's peers wait for a change before they
    /// count it gone.
    pub(crate) duration: Duration,
}

/// One Lease as read: its resourceVersion and content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) rv: Rv,
    pub(crate) content: Content,
}

impl Record {
    pub(crate) fn holder(&self) -> Option<&Token> {
        self.content.holder.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_carry_the_identity_and_an_instance() {
        let t = Token::new("widgets-7d9f-x2x4q", 0xabc);
        assert_eq!(t.as_str(), "widgets-7d9f-x2x4q_0000000000000abc");
        assert_eq!(t.identity(), "widgets-7d9f-x2x4q");
        // A holder written without an instance (the first protocol) is its own identity.
        assert_eq!(Token::parse("pod-a").unwrap().identity(), "pod-a");
        assert_eq!(Token::parse(""), None);
        assert_ne!(Token::new("a", 1), Token::new("a", 2));
    }
}

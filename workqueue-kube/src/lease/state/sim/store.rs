//! A linearizable Lease store, as etcd behind one API server is: one resourceVersion counter,
//! conditional writes, a write that changes nothing makes no new version (the API server
//! skips it), and a log of every change in order for the watches.

use std::collections::BTreeMap;

use super::super::{Answer, Content, LeaseName, Op, Record, Rv};

/// A change, as a watch delivers it.
#[derive(Clone, Debug)]
pub(super) enum Change {
    Applied(LeaseName, Record),
    Deleted(LeaseName),
}

#[derive(Debug, Default)]
pub(super) struct Store {
    version: u64,
    leases: BTreeMap<LeaseName, Record>,
    /// Every change, in commit order.
    pub(super) log: Vec<Change>,
}

impl Store {
    fn next(&mut self) -> Rv {
        self.version += 1;
        Rv::new(&self.version.to_string())
    }

    pub(super) fn get(&self, lease: &LeaseName) -> Option<&Record> {
        self.leases.get(lease)
    }

    /// Every Lease now, as a consistent list returns them.
    pub(super) fn list(&self) -> Vec<(LeaseName, Record)> {
        self.leases
            .iter()
            .map(|(name, r)| (name.clone(), r.clone()))
            .collect()
    }

    pub(super) fn write(&mut self, lease: &LeaseName, op: &Op) -> Answer {
        match op {
            Op::Create(content) => {
                if self.leases.contains_key(lease) {
                    return Answer::Conflict;
                }
                Answer::Done(Some(self.put(lease, content.clone())))
            }
            Op::Replace(rv, content) => match self.leases.get(lease) {
                None => Answer::NotFound,
                Some(r) if r.rv != *rv => Answer::Conflict,
                // The API server skips a write that changes nothing: same resourceVersion.
                Some(r) if r.content == *content => Answer::Done(Some(r.clone())),
                Some(_) => Answer::Done(Some(self.put(lease, content.clone()))),
            },
            Op::Delete(rv) => match self.leases.get(lease) {
                None => Answer::NotFound,
                Some(r) if r.rv != *rv => Answer::Conflict,
                Some(_) => {
                    self.delete(lease);
                    Answer::Done(None)
                }
            },
        }
    }

    fn put(&mut self, lease: &LeaseName, content: Content) -> Record {
        let record = Record {
            rv: self.next(),
            content,
        };
        self.leases.insert(lease.clone(), record.clone());
        self.log
            .push(Change::Applied(lease.clone(), record.clone()));
        record
    }

    /// A write of fields the protocol does not read (a third party's label): a new
    /// resourceVersion, the same content.
    pub(super) fn touch(&mut self, lease: &LeaseName) -> bool {
        let Some(content) = self.leases.get(lease).map(|r| r.content.clone()) else {
            return false;
        };
        self.put(lease, content);
        true
    }

    /// A delete, by the protocol or by a third party (unconditional).
    pub(super) fn delete(&mut self, lease: &LeaseName) -> bool {
        if self.leases.remove(lease).is_none() {
            return false;
        }
        self.version += 1;
        self.log.push(Change::Deleted(lease.clone()));
        true
    }

    pub(super) fn names(&self) -> Vec<LeaseName> {
        self.leases.keys().cloned().collect()
    }
}

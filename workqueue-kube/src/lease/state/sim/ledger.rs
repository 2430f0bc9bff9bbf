//! Every process's beliefs, as real-time intervals, and the checks on them.
//!
//! A belief interval starts at the event after which the process believes it holds the shard
//! and ends at the event after which it does not, or at its deadline if that passed first
//! (beliefs end by time alone), or when the process dies.

use std::collections::BTreeMap;

use super::super::Token;

#[derive(Clone, Debug)]
struct Interval {
    process: usize,
    token: Token,
    shard: u32,
    start: u64,
    end: u64,
    /// The latest deadline the belief had (real time).
    until: u64,
}

#[derive(Clone, Debug)]
struct Open {
    token: Token,
    start: u64,
    until: u64,
}

/// A write that replaced holder `token` in its membership record, by another process.
#[derive(Clone, Debug)]
pub(crate) struct Fence {
    pub(super) at: u64,
    pub(super) token: Token,
    pub(super) writer: usize,
}

#[derive(Debug, Default)]
pub(crate) struct Ledger {
    open: BTreeMap<(usize, u32), Open>,
    closed: Vec<Interval>,
    pub(crate) fences: Vec<Fence>,
    /// Which process used each token.
    owners: BTreeMap<Token, usize>,
}

impl Ledger {
    /// What `process` believes about `shard` after an event at `now`: `until` is its deadline
    /// in real time when it believes.
    pub(super) fn observe(
        &mut self,
        process: usize,
        token: &Token,
        shard: u32,
        until: Option<u64>,
        now: u64,
    ) {
        self.owners.entry(token.clone()).or_insert(process);
        let key = (process, shard);
        if let Some(open) = self.open.get(&key)
            && (open.until <= now || until.is_none() || open.token != *token)
        {
            let open = self.open.remove(&key).unwrap();
            let end = open.until.min(now);
            self.close(process, shard, open, end);
        }
        let Some(until) = until else {
            return;
        };
        match self.open.get_mut(&key) {
            Some(open) => open.until = open.until.max(until),
            None => {
                if until > now {
                    self.open.insert(
                        key,
                        Open {
                            token: token.clone(),
                            start: now,
                            until,
                        },
                    );
                }
            }
        }
    }

    fn close(&mut self, process: usize, shard: u32, open: Open, end: u64) {
        if end > open.start {
            self.closed.push(Interval {
                process,
                token: open.token,
                shard,
                start: open.start,
                end,
                until: open.until,
            });
        }
    }

    /// The process died at `now`: its work with it.
    pub(super) fn died(&mut self, process: usize, now: u64) {
        let keys: Vec<(usize, u32)> = self
            .open
            .keys()
            .filter(|(p, _)| *p == process)
            .copied()
            .collect();
        for key in keys {
            let open = self.open.remove(&key).unwrap();
            let end = open.until.min(now);
            self.close(key.0, key.1, open, end);
        }
    }

    pub(crate) fn finish(&mut self, now: u64) {
        let keys: Vec<(usize, u32)> = self.open.keys().copied().collect();
        for (process, _) in keys {
            self.died(process, now);
        }
    }

    /// Panics if two processes believed they held one shard at one instant. Returns the number
    /// of intervals checked.
    pub(crate) fn assert_never_two_at_once(&self) -> usize {
        let mut by_shard: BTreeMap<u32, Vec<&Interval>> = BTreeMap::new();
        for i in &self.closed {
            by_shard.entry(i.shard).or_default().push(i);
        }
        for (shard, mut list) in by_shard {
            list.sort_by_key(|i| i.start);
            let mut latest: Option<&Interval> = None;
            for i in list {
                if let Some(l) = latest {
                    assert!(
                        l.process == i.process || l.end <= i.start,
                        "shard {shard}: process {} ({}) believed it held it from {} to {} ms, \
                         process {} ({}) from {} to {} ms",
                        l.process,
                        l.token,
                        l.start / 1_000_000,
                        l.end / 1_000_000,
                        i.process,
                        i.token,
                        i.start / 1_000_000,
                        i.end / 1_000_000,
                    );
                }
                if latest.is_none_or(|l| i.end > l.end) {
                    latest = Some(i);
                }
            }
        }
        self.closed.len()
    }

    /// Panics unless every fence came at least `margin` after the last belief deadline of the
    /// holder it fenced: the slack a stalled process has to stop its work. Returns the number
    /// of fences of a holder that had believed something, and the smallest slack seen.
    pub(crate) fn assert_fences_leave(&self, margin: u64) -> (usize, Option<u64>) {
        let mut checked = 0;
        let mut smallest: Option<u64> = None;
        for fence in &self.fences {
            if self.owners.get(&fence.token) == Some(&fence.writer) {
                continue;
            }
            let last = self
                .closed
                .iter()
                .filter(|i| i.token == fence.token)
                .map(|i| i.until)
                .max();
            let Some(last) = last else {
                continue;
            };
            checked += 1;
            let slack = fence.at.saturating_sub(last);
            smallest = Some(smallest.map_or(slack, |s| s.min(slack)));
            assert!(
                last + margin <= fence.at,
                "{} was fenced at {} ms, {} ms after its belief deadline ({} ms): less than the \
                 {} ms of slack",
                fence.token,
                fence.at / 1_000_000,
                (fence.at as i128 - last as i128) / 1_000_000,
                last / 1_000_000,
                margin / 1_000_000
            );
        }
        (checked, smallest)
    }

    /// For each shard, how long in `from..to` no process believed it held it.
    pub(crate) fn unheld(&self, shards: u32, from: u64, to: u64) -> Vec<u64> {
        (0..shards)
            .map(|shard| {
                let mut list: Vec<(u64, u64)> = self
                    .closed
                    .iter()
                    .filter(|i| i.shard == shard)
                    .map(|i| (i.start.max(from), i.end.min(to)))
                    .filter(|(s, e)| s < e)
                    .collect();
                list.sort();
                let mut covered = 0;
                let mut reach = from;
                for (s, e) in list {
                    let s = s.max(reach);
                    if e > s {
                        covered += e - s;
                        reach = e;
                    }
                }
                (to - from).saturating_sub(covered)
            })
            .collect()
    }
}

//! The scenario of the replica tests (`replicas.rs`, `divided_caches.rs`): a namespace, the
//! replicas of one controller in it (each an OS process, this test binary run again) and their
//! ledger, with the waits and checks the tests share.

// Shared by two test binaries, each of which uses a part.
#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::Duration;

use futures_util::{StreamExt, stream};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::time::{Instant, sleep};
use workqueue_e2e::child::{Child, this_binary};
use workqueue_e2e::replica::{Spec, fair, held_shards, shard_holders};
use workqueue_kube::lease::shard_of;
use workqueue_test_support::control_plane::ControlPlane;
use workqueue_test_support::ledger::Run;
use workqueue_test_support::ledger_file::{END, LedgerReader, Line, START};

/// The test that is each replica process's entry (in each binary that runs replicas).
pub const ENTRY: &str = "replica_process";
/// The controller's name (its Leases' prefix).
pub const CONTROLLER: &str = "e2e";
/// The label of the ConfigMaps the replicas reconcile.
pub const LABEL: &str = "e2e.workqueue/replicas";
pub const LEASE: Duration = Duration::from_secs(3);
pub const RENEW: Duration = Duration::from_secs(2);
pub const RETRY: Duration = Duration::from_millis(400);

/// A reconcile that ran to its end, as the ledger's lines say.
#[derive(Clone, Debug)]
pub struct Completed {
    pub replica: String,
    pub object: String,
    /// The resourceVersion it was given.
    pub version: u64,
    pub start: Instant,
}

/// One scenario: a namespace, its replicas and their ledger.
pub struct Scenario {
    pub plane: &'static ControlPlane,
    pub api: Api<ConfigMap>,
    pub leases: Api<Lease>,
    pub ns: String,
    pub dir: PathBuf,
    pub reader: LedgerReader,
    pub replicas: BTreeMap<String, Child>,
}

impl Scenario {
    pub async fn new(prefix: &str) -> Scenario {
        let plane = ControlPlane::shared().await;
        let ns = plane.namespace(prefix).await;
        let dir = std::env::temp_dir().join(format!("workqueue-e2e-{}-{ns}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the scenario's folder");
        let client = plane.client();
        Scenario {
            plane,
            api: Api::namespaced(client.clone(), &ns),
            leases: Api::namespaced(client, &ns),
            reader: LedgerReader::new(dir.join("ledger")),
            ns,
            dir,
            replicas: BTreeMap::new(),
        }
    }

    /// A replica `identity` of this scenario's controller with the short Leases.
    pub fn spec(&self, identity: &str, shards: u32) -> Spec {
        let mut spec = Spec::new(identity, &self.ns, CONTROLLER);
        spec.selector = LABEL.into();
        spec.shards = shards;
        spec.timing = Some((LEASE, RENEW, RETRY));
        spec.ledger = Some(self.dir.join("ledger"));
        spec
    }

    pub fn start(&mut self, spec: &Spec) {
        let mut command = this_binary(Some(ENTRY));
        spec.apply(&mut command, &self.plane.config(), &self.dir);
        let log = self.dir.join(format!("{}.log", spec.identity));
        let child = Child::spawn(&spec.identity, command, &log).expect("spawning a replica");
        self.replicas.insert(spec.identity.clone(), child);
    }

    pub fn replica(&self, identity: &str) -> &Child {
        &self.replicas[identity]
    }

    /// Kills a replica with SIGKILL: its runs end now in the ledger.
    pub fn kill(&mut self, identity: &str) -> Instant {
        let mut child = self.replicas.remove(identity).expect("a running replica");
        child.kill();
        let killed = Instant::now();
        let pid = child.pid();
        self.reader.sync().stopped(pid, killed);
        killed
    }

    /// The object `i`'s name.
    pub fn name(i: usize) -> String {
        format!("cm-{i:04}")
    }

    /// Creates the ConfigMaps `names` with the label.
    pub async fn create(&self, names: &[String]) {
        let objects = names.iter().map(|name| (self.ns.clone(), name.clone()));
        workqueue_e2e::create_configmaps(&self.plane.client(), objects, LABEL).await;
    }

    /// Sets every object's data to `value`, 16 at a time; returns each one's new resourceVersion.
    pub async fn touch(&self, names: &[String], value: &str) -> HashMap<String, u64> {
        touch(
            self.api.clone(),
            self.ns.clone(),
            names.to_vec(),
            value.into(),
        )
        .await
    }

    /// Reads the ledger's new lines.
    pub fn sync(&mut self) {
        self.reader.sync();
    }

    pub fn lines(&self) -> &[Line] {
        self.reader.feed().lines()
    }

    pub fn runs(&self) -> Vec<Run<String>> {
        self.reader.feed().ledger().runs()
    }

    /// The wall-clock line's time as a tokio instant.
    pub fn at(&self, line: &Line) -> Instant {
        self.reader.feed().at(line)
    }

    /// Every reconcile that ran to its end (`end done`), with the version it was given.
    pub fn completed(&self) -> Vec<Completed> {
        let mut open: HashMap<(u32, &str), (u64, Instant)> = HashMap::new();
        let mut completed = Vec::new();
        for line in self.lines() {
            let key = (line.pid, line.subject.as_str());
            match line.kind.as_str() {
                START => {
                    let version = line.detail.parse().unwrap_or(0);
                    open.insert(key, (version, self.at(line)));
                }
                END => {
                    let Some((version, start)) = open.remove(&key) else {
                        continue;
                    };
                    if line.detail == "done" {
                        completed.push(Completed {
                            replica: line.replica.clone(),
                            object: line.subject.clone(),
                            version,
                            start,
                        });
                    }
                }
                _ => {}
            }
        }
        completed
    }

    /// The objects not yet reconciled (to the end) at a version at least the one in `versions`.
    pub fn not_reconciled(&self, versions: &HashMap<String, u64>) -> usize {
        let mut seen: HashMap<&str, u64> = HashMap::new();
        let completed = self.completed();
        for run in &completed {
            let best = seen.entry(run.object.as_str()).or_insert(0);
            *best = (*best).max(run.version);
        }
        versions
            .iter()
            .filter(|(object, version)| seen.get(object.as_str()).is_none_or(|v| v < *version))
            .count()
    }

    /// Polls `done` (after reading the ledger) every 50 ms until it holds; panics after `within`
    /// or when a replica exited, with the replicas' last log lines. Returns how long it took.
    pub async fn until(
        &mut self,
        within: Duration,
        what: &str,
        mut done: impl FnMut(&Scenario) -> bool,
    ) -> Duration {
        let start = Instant::now();
        loop {
            self.sync();
            if done(self) {
                return start.elapsed();
            }
            self.check_alive();
            assert!(
                start.elapsed() < within,
                "{what}: not within {within:?}\n{}",
                self.logs()
            );
            sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until the shard Leases are held by `replicas` alone, each within one of a fair
    /// share; returns how long it took.
    pub async fn until_fair(
        &mut self,
        within: Duration,
        replicas: &[&str],
        shards: u32,
    ) -> Duration {
        let start = Instant::now();
        loop {
            let held = self.shard_holders().await;
            if fair(&held, replicas, shards) {
                return start.elapsed();
            }
            self.check_alive();
            assert!(
                start.elapsed() < within,
                "the shards are not shared fairly by {replicas:?} within {within:?}: {held:?}\n{}",
                self.logs()
            );
            sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn shard_holders(&self) -> BTreeMap<String, u32> {
        let replicas: Vec<&str> = self.replicas.keys().map(String::as_str).collect();
        shard_holders(&self.leases, &replicas).await
    }

    /// Which shards each replica holds, as the server says.
    pub async fn held_shards(&self) -> BTreeMap<String, BTreeSet<u32>> {
        let replicas: Vec<&str> = self.replicas.keys().map(String::as_str).collect();
        held_shards(&self.leases, &replicas).await
    }

    /// The objects with the scenario's label, by `namespace/name`: their resourceVersions, and
    /// how many do not carry `label` with their shard among `shards` (divided caches).
    pub async fn versions_and_unlabelled(
        &self,
        label: &str,
        shards: u32,
    ) -> (HashMap<String, u64>, usize) {
        let list = self
            .api
            .list(&kube::api::ListParams::default().labels(LABEL))
            .await
            .expect("listing the ConfigMaps");
        let mut wrong = 0;
        let mut versions = HashMap::new();
        for cm in list {
            let (ns, name) = (cm.namespace().unwrap_or_default(), cm.name_any());
            let shard = shard_of(Some(&ns), &name, shards).to_string();
            if cm.labels().get(label) != Some(&shard) {
                wrong += 1;
            }
            versions.insert(format!("{ns}/{name}"), version(&cm));
        }
        (versions, wrong)
    }

    /// Each replica's last `store` line (divided caches): the number of objects in its store
    /// and their shards.
    pub fn stores(&self) -> BTreeMap<String, (usize, BTreeSet<u32>)> {
        let mut stores = BTreeMap::new();
        for line in self.lines().iter().filter(|l| l.kind == "store") {
            let (count, shards) = line.detail.split_once(' ').unwrap_or((&line.detail, ""));
            let shards = shards.split(',').filter_map(|s| s.parse().ok()).collect();
            let count = count.parse().expect("a store line's count");
            stores.insert(line.replica.clone(), (count, shards));
        }
        stores
    }

    /// Panics if a replica exited that was not told to.
    pub fn check_alive(&mut self) {
        let exited: Vec<String> = self
            .replicas
            .iter_mut()
            .filter_map(|(name, child)| child.has_exited().then(|| name.clone()))
            .collect();
        assert!(
            exited.is_empty(),
            "replicas {exited:?} exited\n{}",
            self.logs()
        );
    }

    /// The last lines of every replica's log.
    pub fn logs(&self) -> String {
        let mut logs = String::new();
        for (name, child) in &self.replicas {
            logs += &format!("--- {name} (last lines) ---\n{}\n", child.log_tail(20));
        }
        logs + &format!("(the ledger and logs are in {})", self.dir.display())
    }

    /// Judges the ledger: no object reconciled by two processes at once. Returns the runs judged.
    pub fn assert_never_two_at_once(&mut self) -> usize {
        self.sync();
        let (runs, gap) = self.reader.feed().ledger().assert_never_two_at_once();
        println!("ledger: {runs} runs, never two at once; smallest hand-over gap {gap:?}");
        runs
    }

    /// Shuts every replica down with SIGTERM; each must exit with success within 15 s.
    pub fn shut_down(&mut self) {
        for child in self.replicas.values() {
            child.signal("TERM");
        }
        let replicas = std::mem::take(&mut self.replicas);
        for (name, mut child) in replicas {
            let status = child.wait_exit(Duration::from_secs(15));
            assert!(
                status.is_some_and(|s| s.success()),
                "{name} did not exit cleanly after SIGTERM: {status:?}\n{}",
                child.log_tail(20)
            );
        }
    }
}

impl Drop for Scenario {
    fn drop(&mut self) {
        // Killed and reaped (a `Child`'s drop) before the folder goes.
        self.replicas.clear();
        if std::thread::panicking() {
            eprintln!("the ledger and logs are kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Sets the data of the objects `names` in `ns` to `value`, 16 at a time; returns each one's new
/// resourceVersion, by `namespace/name`.
pub async fn touch(
    api: Api<ConfigMap>,
    ns: String,
    names: Vec<String>,
    value: String,
) -> HashMap<String, u64> {
    let patch = json!({ "data": { "v": value } });
    let versions = stream::iter(names)
        .map(move |name| {
            let (api, patch, ns) = (api.clone(), Patch::Merge(patch.clone()), ns.clone());
            async move {
                let patched = api
                    .patch(&name, &PatchParams::default(), &patch)
                    .await
                    .expect("patching a ConfigMap");
                (format!("{ns}/{name}"), version(&patched))
            }
        })
        .buffer_unordered(16)
        .collect::<Vec<_>>()
        .await;
    versions.into_iter().collect()
}

/// An object's resourceVersion as a number (etcd's revision).
pub fn version(cm: &ConfigMap) -> u64 {
    let version = cm.resource_version().unwrap_or_default();
    version.parse().expect("a numeric resourceVersion")
}

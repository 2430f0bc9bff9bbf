//! The storage behind the server: objects by group, resource, namespace and name; one
//! resourceVersion counter; the write semantics of the API server's generic registry
//! (preconditions, system fields, generation, status subresource, finalizers); and the change
//! history that watches replay and follow.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::list::{Lists, Selector};
use super::wire::{ApiError, Gr};

/// How the server treats writes to one resource: the knobs of the API server's per-resource
/// strategies that clients can observe. [`ResourceRules::for_resource`] has the defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResourceRules {
    /// A PUT of a missing object creates it (`AllowCreateOnUpdate`: Leases, Events, Endpoints);
    /// otherwise it is 404.
    pub create_on_update: bool,
    /// A PUT without `metadata.resourceVersion` overwrites whatever is stored
    /// (`AllowUnconditionalUpdate`); otherwise it is 422. Custom resources and Leases say no.
    pub unconditional_update: bool,
    /// When `metadata.generation` is kept and bumped.
    pub generation: Generation,
    /// The resource has a `/status` subresource: a write to the object itself keeps the stored
    /// `status`, a create drops it, and only `/status` writes change it.
    pub status_subresource: bool,
    /// Strategic merge patch is accepted (built-in types); custom resources answer 415.
    pub strategic_merge: bool,
}

/// When the server keeps `metadata.generation`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Generation {
    /// Never set (ConfigMaps, Leases, ...).
    None,
    /// 1 on create, +1 when `spec` changes (Deployments and the other workloads).
    Spec,
    /// 1 on create, +1 when anything but `metadata` (and `status`, with the status subresource)
    /// changes: custom resources.
    AllButMetadata,
}

impl ResourceRules {
    /// The API server's rules for a resource, as far as this server models them: custom
    /// resources (a group with a dot, not `*.k8s.io`) have a status subresource, a generation,
    /// no unconditional update and no strategic merge patch; Leases, Events and Endpoints may be
    /// created by PUT, Leases need a resourceVersion on PUT; the apps workloads keep a
    /// generation and a status subresource (so do Jobs); Pods, Services, Nodes, Namespaces and
    /// PersistentVolumeClaims have a status subresource; everything else is a plain object.
    pub fn for_resource(group: &str, plural: &str) -> ResourceRules {
        let gr = Gr {
            group: group.into(),
            plural: plural.into(),
        };
        let plain = ResourceRules {
            create_on_update: false,
            unconditional_update: true,
            generation: Generation::None,
            status_subresource: false,
            strategic_merge: true,
        };
        match (group, plural) {
            _ if gr.is_custom() => ResourceRules {
                unconditional_update: false,
                generation: Generation::AllButMetadata,
                status_subresource: true,
                strategic_merge: false,
                ..plain
            },
            ("coordination.k8s.io", "leases") => ResourceRules {
                create_on_update: true,
                unconditional_update: false,
                ..plain
            },
            ("" | "events.k8s.io", "events") | ("", "endpoints") => ResourceRules {
                create_on_update: true,
                ..plain
            },
            ("apps", "deployments" | "replicasets" | "statefulsets" | "daemonsets")
            | ("batch", "jobs" | "cronjobs")
            | ("", "replicationcontrollers") => ResourceRules {
                generation: Generation::Spec,
                status_subresource: true,
                ..plain
            },
            ("", "pods" | "services" | "nodes" | "namespaces" | "persistentvolumeclaims") => {
                ResourceRules {
                    status_subresource: true,
                    ..plain
                }
            }
            _ => plain,
        }
    }
}

/// Where an object lives.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct ObjKey {
    pub gr: Gr,
    /// Empty for a cluster-scoped object.
    pub ns: String,
    pub name: String,
}

pub(crate) struct Stored {
    pub value: Value,
    /// The resourceVersion that created it: the order of insertion.
    pub created: u64,
}

/// One change, as watches see it.
pub(crate) struct Change {
    pub rv: u64,
    pub key: ObjKey,
    pub kind: &'static str,
    pub object: Value,
    /// The state before (for a selector's watch: an object can enter or leave it).
    pub old: Option<Value>,
}

/// An open watch: the stream's sender, and what it selects.
pub(crate) struct Watch {
    pub gr: Gr,
    pub ns: Option<String>,
    pub selector: Selector,
    pub tx: mpsc::UnboundedSender<WatchLine>,
}

/// A JSON line of a watch, and when the server sent it (latency counts from there).
pub(crate) struct WatchLine {
    pub line: Bytes,
    pub sent: Instant,
}

pub(crate) fn watch_line(kind: &str, object: &Value) -> WatchLine {
    let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
    line.push(b'\n');
    WatchLine {
        line: Bytes::from(line),
        sent: Instant::now(),
    }
}

/// How a write reached the store.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct How {
    /// Through the `/status` subresource.
    pub status: bool,
    /// `dryRun=All`: everything but the write.
    pub dry_run: bool,
    /// A test's own write (`ApiServer::put`): no precondition, no status subresource rule, no
    /// finalizer rule.
    pub forced: bool,
}

/// Delete preconditions (`DeleteOptions.preconditions`).
#[derive(Clone, Debug, Default)]
pub(crate) struct Preconditions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

pub(crate) struct Store {
    pub objects: BTreeMap<ObjKey, Stored>,
    pub version: u64,
    uids: u64,
    generated_names: u64,
    pub history: Vec<Change>,
    pub watches: Vec<Watch>,
    /// Watches from a resourceVersion below this one are answered "410 Gone" (compacted).
    pub compacted: u64,
    rules: Vec<(String, ResourceRules)>,
    /// apiVersion and kind of each resource, learnt from the objects written to it.
    kinds: HashMap<Gr, (String, String)>,
    epoch: Instant,
    pub lists: Lists,
}

impl Default for Store {
    fn default() -> Self {
        Store {
            objects: BTreeMap::new(),
            version: 0,
            uids: 0,
            generated_names: 0,
            history: Vec::new(),
            watches: Vec::new(),
            compacted: 0,
            rules: Vec::new(),
            kinds: HashMap::new(),
            epoch: Instant::now(),
            lists: Lists::default(),
        }
    }
}

fn meta(object: &Value) -> &Value {
    &object["metadata"]
}

pub(crate) fn rv_of(object: &Value) -> &str {
    meta(object)["resourceVersion"].as_str().unwrap_or("")
}

fn finalizers(object: &Value) -> Vec<&str> {
    let list = meta(object)["finalizers"].as_array();
    list.into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

fn meta_mut(object: &mut Value) -> &mut serde_json::Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    object["metadata"].as_object_mut().unwrap()
}

/// What the API server's typed decoding does to an empty list: it is omitted.
fn normalize(object: &mut Value) {
    let meta = meta_mut(object);
    for list in ["finalizers", "ownerReferences"] {
        if meta
            .get(list)
            .is_some_and(|v| v.as_array().is_some_and(Vec::is_empty) || v.is_null())
        {
            meta.remove(list);
        }
    }
    meta.remove("managedFields");
}

fn without(object: &Value, keys: &[&str]) -> Value {
    let mut copy = object.clone();
    if let Some(map) = copy.as_object_mut() {
        for k in keys {
            map.remove(*k);
        }
    }
    copy
}

impl Store {
    pub fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// The server's clock as Kubernetes writes it: 2025-01-01T00:00:00Z plus the tokio time
    /// elapsed since the server was made (paused time gives exact timestamps).
    pub fn now(&self) -> Value {
        let secs = 1_735_689_600 + self.epoch.elapsed().as_secs() as i64;
        serde_json::to_value(Time(Timestamp::from_second(secs).unwrap())).unwrap()
    }

    pub fn rules(&self, gr: &Gr) -> ResourceRules {
        let set = self.rules.iter().rev().find(|(filter, _)| gr.is(filter));
        set.map(|(_, r)| r.clone())
            .unwrap_or_else(|| ResourceRules::for_resource(&gr.group, &gr.plural))
    }

    pub fn set_rules(&mut self, resource: &str, rules: ResourceRules) {
        self.rules.push((resource.into(), rules));
    }

    /// The kind of a resource's objects, as learnt (for messages and lists).
    pub fn kind(&self, gr: &Gr) -> Option<&str> {
        self.kinds.get(gr).map(|(_, k)| k.as_str())
    }

    /// Fills in `apiVersion` and `kind` as the API server does (it always sets them), and
    /// remembers them for the resource.
    fn type_meta(&mut self, gr: &Gr, api_version: &str, object: &mut Value) {
        if !object["apiVersion"].is_string() {
            object["apiVersion"] = json!(api_version);
        }
        match object["kind"].as_str() {
            Some(kind) => {
                let learnt = (
                    object["apiVersion"].as_str().unwrap().to_string(),
                    kind.to_string(),
                );
                self.kinds.insert(gr.clone(), learnt);
            }
            None => {
                if let Some((_, kind)) = self.kinds.get(gr) {
                    object["kind"] = json!(kind);
                }
            }
        }
    }

    fn kind_or_resource(&self, gr: &Gr) -> String {
        self.kind(gr)
            .map_or_else(|| gr.plural.clone(), str::to_string)
    }

    /// Records a change and sends it to the open watches that select it.
    fn emit(&mut self, kind: &'static str, key: &ObjKey, object: &Value, old: Option<&Value>) {
        let change = Change {
            rv: self.version,
            key: key.clone(),
            kind,
            object: object.clone(),
            old: old.cloned(),
        };
        self.watches.retain(|w| match w.event(&change) {
            Some(line) => w.tx.send(line).is_ok(),
            None => !w.tx.is_closed(),
        });
        self.history.push(change);
    }

    fn commit(&mut self, key: &ObjKey, mut object: Value, old: Option<Value>) -> Value {
        let version = self.bump();
        meta_mut(&mut object).insert("resourceVersion".into(), json!(version.to_string()));
        let created = self.objects.get(key).map_or(version, |s| s.created);
        self.objects.insert(
            key.clone(),
            Stored {
                value: object.clone(),
                created,
            },
        );
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.emit(kind, key, &object, old.as_ref());
        object
    }

    /// Removes an object for good: the API server stamps the deletion's resourceVersion on
    /// the last state it sends.
    fn remove(&mut self, key: &ObjKey, mut last: Value) -> Value {
        let old = self.objects.remove(key).map(|s| s.value);
        let version = self.bump();
        meta_mut(&mut last).insert("resourceVersion".into(), json!(version.to_string()));
        self.emit("DELETED", key, &last, old.as_ref());
        last
    }

    /// POST (and a PUT or apply that creates). `api_version` is the request path's.
    pub fn create(
        &mut self,
        gr: &Gr,
        ns: &str,
        mut object: Value,
        api_version: &str,
        how: How,
        by_update: bool,
    ) -> Result<Value, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        let rules = self.rules(gr);
        let meta = meta_mut(&mut object);
        match meta.get("namespace").and_then(Value::as_str) {
            Some(theirs) if !theirs.is_empty() && theirs != ns && !ns.is_empty() => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {}
        }
        if ns.is_empty() {
            meta.remove("namespace");
        } else {
            meta.insert("namespace".into(), json!(ns));
        }
        let name = match meta.get("name").and_then(Value::as_str) {
            Some(name) if !name.is_empty() => name.to_string(),
            _ => match meta.get("generateName").and_then(Value::as_str) {
                Some(prefix) if !prefix.is_empty() => {
                    self.generated_names += 1;
                    let name = format!("{prefix}{:05x}", self.generated_names);
                    meta_mut(&mut object).insert("name".into(), json!(name));
                    name
                }
                _ => {
                    let kind = self.kind_or_resource(gr);
                    return Err(ApiError::invalid(
                        &kind,
                        gr,
                        "",
                        "metadata.name",
                        "FieldValueRequired",
                        "Required value: name or generateName is required".into(),
                    ));
                }
            },
        };
        let key = ObjKey {
            gr: gr.clone(),
            ns: ns.into(),
            name: name.clone(),
        };
        if !by_update && !how.forced && !rv_of(&object).is_empty() {
            return Err(ApiError::internal(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(gr, &name));
        }
        self.type_meta(gr, api_version, &mut object);
        self.uids += 1;
        let uid = format!("{:08x}-0000-4000-8000-{:012x}", self.uids, self.uids);
        let now = self.now();
        let meta = meta_mut(&mut object);
        meta.insert("uid".into(), json!(uid));
        meta.insert("creationTimestamp".into(), now);
        meta.remove("deletionTimestamp");
        meta.remove("deletionGracePeriodSeconds");
        meta.remove("resourceVersion");
        if rules.generation == Generation::None {
            meta.remove("generation");
        } else {
            meta.insert("generation".into(), json!(1));
        }
        if rules.status_subresource && !how.forced {
            object.as_object_mut().unwrap().remove("status");
        }
        normalize(&mut object);
        if how.dry_run {
            return Ok(object);
        }
        Ok(self.commit(&key, object, None))
    }

    /// PUT, and every patch once applied: the new state of an existing object.
    pub fn update(&mut self, key: &ObjKey, mut new: Value, how: How) -> Result<Value, ApiError> {
        let Some(old) = self.objects.get(key).map(|s| s.value.clone()) else {
            return Err(ApiError::not_found(&key.gr, &key.name));
        };
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        let rules = self.rules(&key.gr);
        let kind = self.kind_or_resource(&key.gr);
        let fields = meta_mut(&mut new);
        if let Some(name) = fields.get("name").and_then(Value::as_str)
            && name != key.name
        {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        if let Some(ns) = fields.get("namespace").and_then(Value::as_str)
            && !ns.is_empty()
            && ns != key.ns
        {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
        // The optimistic lock: a resourceVersion in the new state must be the stored one.
        let new_rv = rv_of(&new).to_string();
        if !how.forced {
            if new_rv.is_empty() {
                if !rules.unconditional_update {
                    return Err(ApiError::invalid(
                        &key.gr.plural,
                        &key.gr,
                        &key.name,
                        "metadata.resourceVersion",
                        "FieldValueInvalid",
                        "Invalid value: 0x0: must be specified for an update".into(),
                    ));
                }
            } else if new_rv != rv_of(&old) {
                return Err(ApiError::conflict(&key.gr, &key.name));
            }
            let uid = meta(&new)["uid"].as_str().unwrap_or("");
            let old_uid = meta(&old)["uid"].as_str().unwrap_or("");
            if !uid.is_empty() && uid != old_uid {
                return Err(ApiError::conflict_because(
                    &key.gr,
                    &key.name,
                    &format!(
                        "Precondition failed: UID in precondition: {uid}, UID in object meta: {old_uid}"
                    ),
                ));
            }
        }
        if how.status {
            // A status write changes the status and nothing else.
            let status = new.get("status").cloned();
            new = without(&old, &["status"]);
            if let Some(status) = status {
                new["status"] = status;
            }
        } else if rules.status_subresource && !how.forced {
            new.as_object_mut().unwrap().remove("status");
            if let Some(status) = old.get("status") {
                new["status"] = status.clone();
            }
        }
        // System fields are the server's: an update cannot change them.
        let old_meta = meta(&old).as_object().unwrap().clone();
        let new_meta = meta_mut(&mut new);
        for system in [
            "uid",
            "creationTimestamp",
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "generation",
            "name",
            "namespace",
        ] {
            match old_meta.get(system) {
                Some(v) => new_meta.insert(system.into(), v.clone()),
                None => new_meta.remove(system),
            };
        }
        new_meta.insert("resourceVersion".into(), json!(rv_of(&old)));
        let api_version = old["apiVersion"].as_str().unwrap_or("v1").to_string();
        self.type_meta(&key.gr, &api_version, &mut new);
        normalize(&mut new);
        let old_finalizers = finalizers(&old);
        let added: Vec<&str> = finalizers(&new)
            .into_iter()
            .filter(|f| !old_finalizers.contains(f))
            .collect();
        if old_meta.contains_key("deletionTimestamp") && !added.is_empty() && !how.forced {
            return Err(ApiError::invalid(
                &kind,
                &key.gr,
                &key.name,
                "metadata.finalizers",
                "FieldValueForbidden",
                format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
                ),
            ));
        }
        if !how.status {
            let changed = match rules.generation {
                Generation::None => false,
                Generation::Spec => new.get("spec") != old.get("spec"),
                Generation::AllButMetadata => {
                    let skip: &[&str] = if rules.status_subresource {
                        &["metadata", "status"]
                    } else {
                        &["metadata"]
                    };
                    without(&new, skip) != without(&old, skip)
                }
            };
            if changed {
                let generation = old_meta
                    .get("generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(0);
                meta_mut(&mut new).insert("generation".into(), json!(generation + 1));
            }
        }
        // A write that changes nothing is no write: no new resourceVersion, no event.
        if new == old || how.dry_run {
            return Ok(new);
        }
        // The last finalizer of an object being deleted is gone: the deletion completes, and
        // the update itself is not written. As the API server does: the answer is the updated
        // object at the stored resourceVersion, and DELETED carries the stored object (its
        // finalizers still listed) at the deletion's.
        if old_meta.contains_key("deletionTimestamp") && finalizers(&new).is_empty() {
            let stored_version = rv_of(&old).to_string();
            self.remove(key, old);
            meta_mut(&mut new).insert("resourceVersion".into(), json!(stored_version));
            return Ok(new);
        }
        Ok(self.commit(key, new, Some(old)))
    }

    /// DELETE: at once, or (with finalizers) by marking the object as being deleted.
    pub fn delete(
        &mut self,
        key: &ObjKey,
        pre: &Preconditions,
        how: How,
    ) -> Result<Value, ApiError> {
        let Some(old) = self.objects.get(key).map(|s| s.value.clone()) else {
            return Err(ApiError::not_found(&key.gr, &key.name));
        };
        let uid = meta(&old)["uid"].as_str().unwrap_or("");
        if let Some(theirs) = &pre.uid
            && theirs != uid
        {
            return Err(ApiError::conflict_because(
                &key.gr,
                &key.name,
                &format!(
                    "Precondition failed: UID in precondition: {theirs}, UID in object meta: {uid}"
                ),
            ));
        }
        if let Some(theirs) = &pre.resource_version
            && theirs != rv_of(&old)
        {
            return Err(ApiError::conflict_because(
                &key.gr,
                &key.name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {theirs}, ResourceVersion in object meta: {}",
                    rv_of(&old)
                ),
            ));
        }
        if finalizers(&old).is_empty() {
            if how.dry_run {
                return Ok(old);
            }
            return Ok(self.remove(key, old));
        }
        if meta(&old).get("deletionTimestamp").is_some() || how.dry_run {
            return Ok(old);
        }
        let mut marked = old.clone();
        let now = self.now();
        let meta = meta_mut(&mut marked);
        meta.insert("deletionTimestamp".into(), now);
        meta.insert("deletionGracePeriodSeconds".into(), json!(0));
        if let Some(generation) = meta.get("generation").and_then(Value::as_i64)
            && generation > 0
        {
            meta.insert("generation".into(), json!(generation + 1));
        }
        Ok(self.commit(key, marked, Some(old)))
    }
}

impl Watch {
    pub fn selects(&self, key: &ObjKey) -> bool {
        key.gr == self.gr && self.ns.as_ref().is_none_or(|ns| *ns == key.ns)
    }

    /// The line this watch sees for a change, if any: with a selector, an object that starts
    /// matching is ADDED and one that stops matching is DELETED, as the watch cache sends them.
    pub fn event(&self, change: &Change) -> Option<WatchLine> {
        if !self.selects(&change.key) {
            return None;
        }
        let now = self.selector.matches(&change.object);
        let before = change
            .old
            .as_ref()
            .is_some_and(|old| self.selector.matches(old));
        let kind = match change.kind {
            "DELETED" => before.then_some("DELETED"),
            _ => match (before, now) {
                (true, true) => Some(change.kind),
                (false, true) => Some("ADDED"),
                (true, false) => Some("DELETED"),
                (false, false) => None,
            },
        }?;
        Some(watch_line(kind, &change.object))
    }
}

//! Lists: label and field selectors, the order of items, pages (`limit` and `continue` over one
//! snapshot), and the knobs that let a test shape them (page size, order, delay, gate).

use std::cmp::Ordering;
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::sync::{Notify, Semaphore};

use super::store::Store;
use super::wire::{ApiError, Gr, Query};

/// A test's comparison of two objects of a list.
pub type Compare = Arc<dyn Fn(&Value, &Value) -> Ordering + Send + Sync>;

/// The order in which a list returns a resource's objects (see `ApiServer::set_list_order`).
#[derive(Clone, Default)]
pub enum ListOrder {
    /// etcd's: by namespace, then name.
    #[default]
    Key,
    /// The order the objects were created in.
    Creation,
    /// A test's own order; objects it ranks equal keep etcd's order.
    By(Compare),
}

impl fmt::Debug for ListOrder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListOrder::Key => f.write_str("Key"),
            ListOrder::Creation => f.write_str("Creation"),
            ListOrder::By(_) => f.write_str("By(..)"),
        }
    }
}

/// Holds a resource's list responses until the test lets them go (see
/// `ApiServer::gate_lists`). Each page is computed when its request arrives (the snapshot is of
/// that moment) and then held, as a slow response in flight would be. Clones share the gate.
#[derive(Clone, Debug)]
pub struct ListGate {
    inner: Arc<GateInner>,
}

#[derive(Debug)]
struct GateInner {
    permits: Semaphore,
    held: AtomicUsize,
    changed: Notify,
}

impl ListGate {
    pub(crate) fn new() -> ListGate {
        ListGate {
            inner: Arc::new(GateInner {
                permits: Semaphore::new(0),
                held: AtomicUsize::new(0),
                changed: Notify::new(),
            }),
        }
    }

    /// List responses held now.
    pub fn held(&self) -> usize {
        self.inner.held.load(SeqCst)
    }

    /// Waits until at least `n` list responses are held.
    pub async fn until_held(&self, n: usize) {
        loop {
            // A `Notified` made before the check sees every later `notify_waiters`.
            let changed = self.inner.changed.notified();
            if self.held() >= n {
                return;
            }
            changed.await;
        }
    }

    /// Lets one held response (or, if none is held, the next one) through.
    pub fn release_one(&self) {
        self.inner.permits.add_permits(1);
    }

    /// Opens the gate for good: every held response and every later one goes through.
    pub fn open(&self) {
        self.inner.permits.close();
    }

    pub(crate) async fn pass(&self) {
        self.inner.held.fetch_add(1, SeqCst);
        self.inner.changed.notify_waiters();
        if let Ok(permit) = self.inner.permits.acquire().await {
            permit.forget();
        }
        self.inner.held.fetch_sub(1, SeqCst);
        self.inner.changed.notify_waiters();
    }
}

/// What a test set for the lists of one resource.
#[derive(Clone, Debug, Default)]
pub(crate) struct Knobs {
    pub order: Option<ListOrder>,
    pub max_page: Option<usize>,
    pub delay: Option<Duration>,
    pub gate: Option<ListGate>,
}

/// The items of a list's first page onwards, as they were then: what `continue` reads.
struct Snapshot {
    gr: Gr,
    ns: Option<String>,
    rv: u64,
    items: Arc<Vec<Value>>,
}

#[derive(Default)]
pub(crate) struct Lists {
    /// Per resource filter (`"configmaps"`, `"leases.coordination.k8s.io"`), in the order set.
    knobs: Vec<(String, Knobs)>,
    snapshots: HashMap<u64, Snapshot>,
    next_snapshot: u64,
}

impl Lists {
    pub fn knobs(&self, gr: &Gr) -> Knobs {
        let mut out = Knobs::default();
        for (_, k) in self.knobs.iter().filter(|(f, _)| gr.is(f)) {
            out.order = k.order.clone().or(out.order);
            out.max_page = k.max_page.or(out.max_page);
            out.delay = k.delay.or(out.delay);
            out.gate = k.gate.clone().or(out.gate);
        }
        out
    }

    pub fn set(&mut self, resource: &str, change: impl FnOnce(&mut Knobs)) {
        let mut knobs = Knobs::default();
        change(&mut knobs);
        self.knobs.push((resource.into(), knobs));
    }

    /// Every snapshot is forgotten: each outstanding `continue` token is answered 410.
    pub fn expire(&mut self) {
        self.snapshots.clear();
    }
}

/// A label requirement (`app=web`, `tier!=db`, `env in (a,b)`, `env notin (c)`, `app`, `!app`).
#[derive(Clone, Debug)]
enum Requirement {
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A list's or watch's label and field selectors.
#[derive(Clone, Debug, Default)]
pub(crate) struct Selector {
    labels: Vec<Requirement>,
    /// Field path, `=` (true) or `!=` (false), value.
    fields: Vec<(String, bool, String)>,
}

fn split_top_level(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
        .into_iter()
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_requirement(text: &str) -> Option<Requirement> {
    let key_ok = |k: &str| !k.is_empty() && !k.contains(char::is_whitespace);
    if let Some(key) = text.strip_prefix('!') {
        return key_ok(key.trim()).then(|| Requirement::Absent(key.trim().into()));
    }
    if let Some(open) = text.find('(') {
        let inner = text[open + 1..].strip_suffix(')')?;
        let values = inner.split(',').map(|v| v.trim().to_string()).collect();
        let mut words = text[..open].split_whitespace();
        let (key, op) = (words.next()?, words.next()?);
        if words.next().is_some() || !key_ok(key) {
            return None;
        }
        return match op {
            "in" => Some(Requirement::In(key.into(), values)),
            "notin" => Some(Requirement::NotIn(key.into(), values)),
            _ => None,
        };
    }
    for (op, negated) in [("!=", true), ("==", false), ("=", false)] {
        if let Some((key, value)) = text.split_once(op) {
            let (key, value) = (key.trim(), vec![value.trim().to_string()]);
            if !key_ok(key) {
                return None;
            }
            return Some(if negated {
                Requirement::NotIn(key.into(), value)
            } else {
                Requirement::In(key.into(), value)
            });
        }
    }
    key_ok(text).then(|| Requirement::Exists(text.into()))
}

impl Selector {
    pub fn parse(labels: Option<&str>, fields: Option<&str>) -> Result<Selector, ApiError> {
        let mut selector = Selector::default();
        for part in split_top_level(labels.unwrap_or("")) {
            let requirement = parse_requirement(part).ok_or_else(|| {
                ApiError::bad_request(format!("unable to parse requirement: {part:?}"))
            })?;
            selector.labels.push(requirement);
        }
        for part in split_top_level(fields.unwrap_or("")) {
            let parsed = [("!=", false), ("==", true), ("=", true)]
                .into_iter()
                .find_map(|(op, eq)| part.split_once(op).map(|(f, v)| (f.trim(), eq, v.trim())));
            match parsed {
                Some((field, eq, value)) if !field.is_empty() => {
                    selector.fields.push((field.into(), eq, value.into()))
                }
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid field selector: {part:?}"
                    )));
                }
            }
        }
        Ok(selector)
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        let label = |k: &str| labels[k].as_str();
        let labels_match = self.labels.iter().all(|r| match r {
            Requirement::Exists(k) => label(k).is_some(),
            Requirement::Absent(k) => label(k).is_none(),
            Requirement::In(k, vs) => label(k).is_some_and(|v| vs.iter().any(|x| x == v)),
            Requirement::NotIn(k, vs) => label(k).is_none_or(|v| vs.iter().all(|x| x != v)),
        });
        labels_match
            && self.fields.iter().all(|(path, eq, value)| {
                let found = path.split('.').fold(object, |v, segment| &v[segment]);
                let text = match found {
                    Value::String(s) => s.clone(),
                    Value::Null => String::new(),
                    other => other.to_string(),
                };
                (text == *value) == *eq
            })
    }
}

fn order_items(items: &mut [(u64, Value)], order: &ListOrder) {
    match order {
        ListOrder::Key => {}
        ListOrder::Creation => items.sort_by_key(|(created, _)| *created),
        ListOrder::By(compare) => items.sort_by(|a, b| compare(&a.1, &b.1)),
    }
}

/// A list answer, and what the test set to slow it down.
pub(crate) struct Listed {
    pub body: Value,
    pub delay: Option<Duration>,
    pub gate: Option<ListGate>,
}

impl Store {
    /// The current objects of a resource that a selector selects, in the resource's order.
    pub fn select(&self, gr: &Gr, ns: Option<&str>, selector: &Selector) -> Vec<Value> {
        let order = self.lists.knobs(gr).order.unwrap_or_default();
        let mut items: Vec<(u64, Value)> = self
            .objects
            .iter()
            .filter(|(k, s)| {
                k.gr == *gr && ns.is_none_or(|ns| ns == k.ns) && selector.matches(&s.value)
            })
            .map(|(_, s)| (s.created, s.value.clone()))
            .collect();
        order_items(&mut items, &order);
        items.into_iter().map(|(_, v)| v).collect()
    }

    /// GET on a collection: one page of it.
    pub fn list(
        &mut self,
        gr: &Gr,
        ns: Option<&str>,
        query: &Query,
        api_version: &str,
    ) -> Result<Listed, ApiError> {
        let selector = Selector::parse(query.get("labelSelector"), query.get("fieldSelector"))?;
        let knobs = self.lists.knobs(gr);
        // `resourceVersion=0` is served from the watch cache, which ignores `limit`.
        let from_cache = query.get("resourceVersion") == Some("0");
        let limit = match query.get("limit").map(str::parse::<usize>) {
            None | Some(Ok(0)) => None,
            Some(Ok(n)) => Some(n),
            Some(Err(_)) => return Err(ApiError::bad_request("limit must be a number")),
        };
        let limit = limit
            .filter(|_| !from_cache)
            .map(|n| knobs.max_page.map_or(n, |max| n.min(max)));
        let (id, rv, items, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => {
                let parsed: Option<[u64; 3]> = token
                    .split('.')
                    .map(|part| part.parse().ok())
                    .collect::<Option<Vec<u64>>>()
                    .and_then(|parts| parts.try_into().ok());
                let Some([id, _, offset]) = parsed else {
                    return Err(ApiError::bad_request(format!(
                        "continue key is not valid: {token:?}"
                    )));
                };
                let snapshot = self
                    .lists
                    .snapshots
                    .get(&id)
                    .filter(|s| s.gr == *gr && s.ns.as_deref() == ns);
                let Some(snapshot) = snapshot else {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
                    ));
                };
                (
                    Some(id),
                    snapshot.rv,
                    snapshot.items.clone(),
                    offset as usize,
                )
            }
            None => {
                let items = Arc::new(self.select(gr, ns, &selector));
                (None, self.version, items, 0)
            }
        };
        let end = limit.map_or(items.len(), |n| (offset + n).min(items.len()));
        let page = items[offset.min(end)..end].to_vec();
        let mut metadata = json!({ "resourceVersion": rv.to_string() });
        if end < items.len() {
            let id = id.unwrap_or_else(|| {
                self.lists.next_snapshot += 1;
                let id = self.lists.next_snapshot;
                let snapshot = Snapshot {
                    gr: gr.clone(),
                    ns: ns.map(Into::into),
                    rv,
                    items: items.clone(),
                };
                self.lists.snapshots.insert(id, snapshot);
                id
            });
            metadata["continue"] = json!(format!("{id}.{rv}.{end}"));
            if selector.is_empty() {
                metadata["remainingItemCount"] = json!(items.len() - end);
            }
        } else if let Some(id) = id {
            self.lists.snapshots.remove(&id);
        }
        let kind = self
            .kind(gr)
            .map_or_else(|| "List".to_string(), |k| format!("{k}List"));
        Ok(Listed {
            body: json!({
                "apiVersion": api_version, "kind": kind, "metadata": metadata, "items": page,
            }),
            delay: knobs.delay,
            gate: knobs.gate,
        })
    }
}

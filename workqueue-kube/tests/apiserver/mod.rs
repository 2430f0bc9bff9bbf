#![allow(dead_code)] // each test binary uses part of the scripted server
//! A scripted Kubernetes API server in memory, behind a `kube::Client`: a `tower::service_fn`
//! that serves list, watch, get, create, merge-patch and delete from a store (how kube-rs tests
//! itself, but answering any number of concurrent requests in any order, which two watchers
//! plus patches need; `tower_test`'s mock answers strictly in order). No network: the client's
//! requests are function calls.
//!
//! What it models (kube's watcher ends and renews each watch after about five minutes, so
//! watches are requests that recur over a long test): one resourceVersion counter for all objects; watches from a resourceVersion
//! (replayed from the history; "410 Gone" after a `compact`, which makes the watchers relist); a `generation` bumped when a Deployment's
//! spec changes; an outage (`set_down`) that fails every request with 503 and breaks the open
//! watches. Not modelled: selectors, bookmarks, pagination, admission,
//! garbage collection.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use kube::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::mpsc;

type Body = UnsyncBoxBody<Bytes, Infallible>;

/// Where an object lives: resource (plural), namespace, name.
type Key = (String, String, String);

#[derive(Default)]
struct Inner {
    objects: BTreeMap<Key, Value>,
    version: u64,
    uids: u64,
    /// Every watch event so far: its resourceVersion, resource, namespace and JSON line.
    history: Vec<(u64, String, String, Bytes)>,
    /// Open watches: resource, namespace (`None`: all), sender of JSON lines.
    watches: Vec<(String, Option<String>, mpsc::UnboundedSender<Bytes>)>,
    /// Requests so far: method, resource, and the request line.
    requests: Vec<(Method, String, String)>,
    down: bool,
    /// Watches from a resourceVersion below this one are answered "410 Gone" (compacted).
    compacted: u64,
}

impl Inner {
    fn bump(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Records a watch event and sends it to the open watches of its resource.
    fn emit(&mut self, kind: &str, key: &Key, object: &Value) {
        let version = self.version;
        let mut line = serde_json::to_vec(&json!({ "type": kind, "object": object })).unwrap();
        line.push(b'\n');
        let line = Bytes::from(line);
        self.history
            .push((version, key.0.clone(), key.1.clone(), line.clone()));
        self.watches.retain(|(resource, ns, tx)| {
            if *resource != key.0 || ns.as_ref().is_some_and(|ns| *ns != key.1) {
                return !tx.is_closed();
            }
            tx.send(line.clone()).is_ok()
        });
    }

    /// Creates or replaces an object; sets its uid, resourceVersion and generation.
    fn put(&mut self, key: Key, mut object: Value) -> Value {
        let old = self.objects.get(&key).cloned();
        let version = self.bump();
        let meta = object["metadata"].as_object_mut().unwrap();
        meta.insert("resourceVersion".into(), json!(version.to_string()));
        let uid = match &old {
            Some(old) => old["metadata"]["uid"].clone(),
            None => {
                self.uids += 1;
                json!(format!("uid-{}", self.uids))
            }
        };
        meta.insert("uid".into(), uid);
        if key.0 == "deployments" {
            let generation = match &old {
                None => 1,
                Some(old) => {
                    let g = old["metadata"]["generation"].as_u64().unwrap_or(1);
                    if old["spec"] == object["spec"] {
                        g
                    } else {
                        g + 1
                    }
                }
            };
            object["metadata"]["generation"] = json!(generation);
        }
        self.objects.insert(key.clone(), object.clone());
        let kind = if old.is_some() { "MODIFIED" } else { "ADDED" };
        self.emit(kind, &key, &object);
        object
    }

    fn delete(&mut self, key: &Key) -> Option<Value> {
        let mut object = self.objects.remove(key)?;
        // The API server stamps the deletion's resourceVersion on the deleted object.
        let version = self.bump();
        object["metadata"]["resourceVersion"] = json!(version.to_string());
        self.emit("DELETED", key, &object);
        Some(object)
    }
}

/// The scripted API server. Clones share it.
#[derive(Clone, Default)]
pub struct ApiServer {
    inner: Arc<Mutex<Inner>>,
}

fn key_of<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> Key {
    (K::plural(&()).into_owned(), namespace.into(), name.into())
}

fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into()).boxed_unsync()
}

fn respond(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(body(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

fn status(code: StatusCode, reason: &str) -> Response<Body> {
    let value = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code.as_u16(),
    });
    respond(code, &value)
}

/// Recursive JSON merge patch (RFC 7386).
fn merge(target: &mut Value, patch: &Value) {
    let Value::Object(patch) = patch else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target = target.as_object_mut().unwrap();
    for (k, v) in patch {
        if v.is_null() {
            target.remove(k);
        } else {
            merge(target.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

impl ApiServer {
    /// An empty cluster.
    pub fn new() -> Self {
        Self::default()
    }

    /// A client of this server (default namespace `default`).
    pub fn client(&self) -> kube::Client {
        let server = self.clone();
        let service = tower::service_fn(move |request: Request<kube::client::Body>| {
            let server = server.clone();
            async move { Ok::<_, Infallible>(server.handle(request).await) }
        });
        kube::Client::new(service, "default")
    }

    /// Creates or replaces an object, as a user would (`kubectl apply`).
    pub fn put<K: Resource<DynamicType = ()> + Serialize>(&self, object: &K) {
        let meta = object.meta();
        let ns = meta.namespace.clone().unwrap_or_else(|| "default".into());
        let key = key_of::<K>(&ns, meta.name.as_deref().unwrap());
        let mut value = serde_json::to_value(object).unwrap();
        value["metadata"]["namespace"] = json!(ns);
        self.inner.lock().unwrap().put(key, value);
    }

    /// Deletes an object, as a user would.
    pub fn delete<K: Resource<DynamicType = ()>>(&self, name: &str) {
        let key = key_of::<K>("default", name);
        self.inner.lock().unwrap().delete(&key);
    }

    /// An object as stored now.
    pub fn get<K: Resource<DynamicType = ()> + DeserializeOwned>(&self, name: &str) -> Option<K> {
        let key = key_of::<K>("default", name);
        let value = self.inner.lock().unwrap().objects.get(&key).cloned()?;
        Some(serde_json::from_value(value).unwrap())
    }

    /// The objects of one resource (`"events"`), as stored now.
    pub fn all(&self, resource: &str) -> Vec<Value> {
        let inner = self.inner.lock().unwrap();
        let objects = inner.objects.iter();
        objects
            .filter(|(k, _)| k.0 == resource)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Requests served so far.
    pub fn requests(&self) -> usize {
        self.inner.lock().unwrap().requests.len()
    }

    /// Writes (requests other than GET: lists, watches and reads) served so far.
    pub fn writes(&self) -> usize {
        let inner = self.inner.lock().unwrap();
        inner
            .requests
            .iter()
            .filter(|(m, _, _)| *m != Method::GET)
            .count()
    }

    /// Requests served so far with this method to this resource.
    pub fn requests_to(&self, method: Method, resource: &str) -> usize {
        let inner = self.inner.lock().unwrap();
        let requests = inner.requests.iter();
        requests
            .filter(|(m, r, _)| *m == method && r == resource)
            .count()
    }

    /// The requests served so far, one line each (method and URI): for failure messages.
    pub fn log(&self) -> Vec<String> {
        let inner = self.inner.lock().unwrap();
        inner
            .requests
            .iter()
            .map(|(_, _, line)| line.clone())
            .collect()
    }

    /// An outage: while down, every request fails with 503; going down breaks the open watches.
    pub fn set_down(&self, down: bool) {
        let mut inner = self.inner.lock().unwrap();
        inner.down = down;
        if down {
            inner.watches.clear();
        }
    }

    /// Compaction: the history so far is forgotten and the open watches break, so that each
    /// watcher's next watch is answered "410 Gone" and it relists.
    pub fn compact(&self) {
        let mut inner = self.inner.lock().unwrap();
        inner.compacted = inner.version;
        inner.history.clear();
        inner.watches.clear();
    }

    async fn handle(&self, request: Request<kube::client::Body>) -> Response<Body> {
        let (parts, request_body) = request.into_parts();
        let bytes = request_body.collect().await.unwrap().to_bytes();
        let path: Vec<&str> = parts
            .uri
            .path()
            .trim_start_matches('/')
            .split('/')
            .collect();
        let query: BTreeMap<&str, &str> = parts
            .uri
            .query()
            .unwrap_or("")
            .split('&')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        // `/api/v1/...` or `/apis/<group>/<version>/...`, then `namespaces/<ns>/` or not.
        let mut rest = match path.first() {
            Some(&"api") => &path[2..],
            _ => &path[3..],
        };
        let mut namespace = None;
        if rest.len() >= 3 && rest[0] == "namespaces" {
            namespace = Some(rest[1].to_string());
            rest = &rest[2..];
        }
        let resource = rest[0].to_string();
        let name = rest.get(1).map(|n| n.to_string());
        let mut inner = self.inner.lock().unwrap();
        let line = format!("{} {}", parts.method, parts.uri);
        inner
            .requests
            .push((parts.method.clone(), resource.clone(), line));
        if inner.down {
            return status(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable");
        }
        let ns = namespace.clone().unwrap_or_else(|| "default".into());
        match (parts.method.clone(), name) {
            (Method::GET, None) if query.get("watch") == Some(&"true") => {
                let from: u64 = query
                    .get("resourceVersion")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                let (tx, rx) = mpsc::unbounded_channel();
                if from < inner.compacted {
                    // What etcd's compaction makes an API server say: the watcher must relist.
                    let gone = json!({ "type": "ERROR", "object": {
                        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                        "message": "too old resource version", "reason": "Expired", "code": 410,
                    }});
                    let mut line = serde_json::to_vec(&gone).unwrap();
                    line.push(b'\n');
                    tx.send(Bytes::from(line)).unwrap();
                    drop(tx); // the stream ends after it
                    let lines = stream::unfold(rx, |mut rx| async move {
                        let line = rx.recv().await?;
                        Some((Ok::<_, Infallible>(Frame::data(line)), rx))
                    });
                    return Response::builder()
                        .status(StatusCode::OK)
                        .body(StreamBody::new(lines.boxed()).boxed_unsync())
                        .unwrap();
                }
                for (version, r, n, line) in &inner.history {
                    if *version > from
                        && *r == resource
                        && namespace.as_ref().is_none_or(|ns| ns == n)
                    {
                        tx.send(line.clone()).unwrap();
                    }
                }
                inner.watches.push((resource, namespace, tx));
                let lines = stream::unfold(rx, |mut rx| async move {
                    let line = rx.recv().await?;
                    Some((Ok::<_, Infallible>(Frame::data(line)), rx))
                });
                Response::builder()
                    .status(StatusCode::OK)
                    .header("content-type", "application/json")
                    .body(StreamBody::new(lines.boxed()).boxed_unsync())
                    .unwrap()
            }
            (Method::GET, None) => {
                let items: Vec<Value> = inner
                    .objects
                    .iter()
                    .filter(|(k, _)| {
                        k.0 == resource && namespace.as_ref().is_none_or(|ns| *ns == k.1)
                    })
                    .map(|(_, v)| v.clone())
                    .collect();
                let list = json!({
                    "apiVersion": "v1", "kind": "List",
                    "metadata": { "resourceVersion": inner.version.to_string() },
                    "items": items,
                });
                respond(StatusCode::OK, &list)
            }
            (Method::GET, Some(name)) => match inner.objects.get(&(resource, ns, name)) {
                Some(object) => respond(StatusCode::OK, object),
                None => status(StatusCode::NOT_FOUND, "NotFound"),
            },
            (Method::POST, None) => {
                let mut object: Value = serde_json::from_slice(&bytes).unwrap();
                object["metadata"]["namespace"] = json!(ns);
                let name = object["metadata"]["name"].as_str().unwrap().to_string();
                let key = (resource, ns, name);
                if inner.objects.contains_key(&key) {
                    return status(StatusCode::CONFLICT, "AlreadyExists");
                }
                let object = inner.put(key, object);
                respond(StatusCode::CREATED, &object)
            }
            (Method::PATCH, Some(name)) => {
                let key = (resource, ns, name);
                let Some(mut object) = inner.objects.get(&key).cloned() else {
                    return status(StatusCode::NOT_FOUND, "NotFound");
                };
                let patch: Value = serde_json::from_slice(&bytes).unwrap();
                let old = object.clone();
                merge(&mut object, &patch);
                // A patch that changes nothing is no write: no new resourceVersion, no event.
                let object = if object == old {
                    old
                } else {
                    inner.put(key, object)
                };
                respond(StatusCode::OK, &object)
            }
            (Method::DELETE, Some(name)) => match inner.delete(&(resource, ns, name)) {
                Some(object) => respond(StatusCode::OK, &object),
                None => status(StatusCode::NOT_FOUND, "NotFound"),
            },
            _ => status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"),
        }
    }
}

//! Requests to answers: the verbs on collections, objects and the `/status` subresource, and
//! watches.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use serde_json::{Value, json};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep, sleep_until, timeout_at};

use super::ApiServer;
use super::list::{Listed, Selector};
use super::net::{ClientLink, Partition};
use super::patch::{PatchError, json_patch, merge};
use super::store::{How, ObjKey, Preconditions, Store, Watch, WatchLine, watch_line};
use super::wire::{ApiError, Body, Query, Route, respond};

/// What a request turns into, decided under the store's lock and delivered after it.
enum Answer {
    Object(StatusCode, Value),
    List(Listed),
    Watch(mpsc::UnboundedReceiver<WatchLine>, Instant),
}

/// How long a watch runs when the client names no `timeoutSeconds` (the API server picks
/// between its minimal request timeout and twice it; 30 minutes here).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

fn parse_json(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
    })
}

/// The body's `metadata.name` must be the URL's (it is filled in when absent).
fn named(mut object: Value, name: &str) -> Result<Value, ApiError> {
    match object["metadata"]["name"].as_str() {
        Some(theirs) if theirs != name => Err(ApiError::bad_request(format!(
            "the name of the object ({theirs}) does not match the name on the URL ({name})"
        ))),
        Some(_) => Ok(object),
        None if object.is_object() => {
            if !object["metadata"].is_object() {
                object["metadata"] = json!({});
            }
            object["metadata"]["name"] = json!(name);
            Ok(object)
        }
        None => Err(ApiError::bad_request(
            "the body of the request must be an object",
        )),
    }
}

impl ApiServer {
    pub(crate) async fn handle(
        &self,
        link: &Arc<ClientLink>,
        request: Request<kube::client::Body>,
    ) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let query = Query::parse(parts.uri.query());
        let Some(route) = Route::parse(parts.uri.path()) else {
            return ApiError::no_route().into_response();
        };
        let answer = {
            let mut inner = self.lock();
            if inner.down {
                return ApiError::unavailable().into_response();
            }
            let verb = verb_of(&parts.method, &route, &query);
            let mut denied = inner.denied.iter();
            if denied.any(|(v, r)| v.as_str() == verb && route.gr.is(r)) {
                return ApiError::forbidden(verb, &route).into_response();
            }
            dispatch(
                &mut inner.store,
                &parts.method,
                &parts.headers,
                &route,
                &query,
                &bytes,
            )
        };
        match answer {
            Err(e) => e.into_response(),
            Ok(Answer::Object(code, value)) => respond(code, &value),
            Ok(Answer::List(listed)) => {
                if let Some(delay) = listed.delay {
                    sleep(delay).await;
                }
                if let Some(gate) = &listed.gate {
                    gate.pass().await;
                }
                respond(StatusCode::OK, &listed.body)
            }
            Ok(Answer::Watch(rx, deadline)) => Response::builder()
                .status(StatusCode::OK)
                .header("content-type", "application/json")
                .body(watch_body(rx, deadline, link.clone()))
                .unwrap(),
        }
    }
}

/// The RBAC verb of a request: `get`, `list` or `watch` for a GET, `create`, `update`, `patch`,
/// `delete` or `deletecollection` for the others.
fn verb_of(method: &Method, route: &Route, query: &Query) -> &'static str {
    let named = route.name.is_some();
    match *method {
        Method::GET if query.flag("watch") => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PUT => "update",
        Method::PATCH => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "unknown",
    }
}

fn dispatch(
    store: &mut Store,
    method: &Method,
    headers: &HeaderMap,
    route: &Route,
    query: &Query,
    body: &Bytes,
) -> Result<Answer, ApiError> {
    let rules = store.rules(&route.gr);
    let mut how = How {
        dry_run: query.dry_run(),
        ..How::default()
    };
    match route.subresource.as_deref() {
        None => {}
        Some("status") if rules.status_subresource && route.name.is_some() => how.status = true,
        Some(_) => return Err(ApiError::no_route()),
    }
    let ns = route.namespace.clone().unwrap_or_default();
    let key = |name: &str| ObjKey {
        gr: route.gr.clone(),
        ns: ns.clone(),
        name: name.into(),
    };
    let api_version = route.api_version();
    let object = |code, value| Ok(Answer::Object(code, value));
    match (method.clone(), route.name.as_deref()) {
        (Method::GET, None) if query.flag("watch") => watch(store, route, query),
        (Method::GET, None) => {
            let listed = store.list(&route.gr, route.namespace.as_deref(), query, &api_version)?;
            Ok(Answer::List(listed))
        }
        (Method::GET, Some(name)) => match store.objects.get(&key(name)) {
            Some(stored) => object(StatusCode::OK, stored.value.clone()),
            None => Err(ApiError::not_found(&route.gr, name)),
        },
        (Method::POST, None) => {
            let object_in = typed(route, parse_json(body)?)?;
            let created = store.create(&route.gr, &ns, object_in, &api_version, how, false)?;
            object(StatusCode::CREATED, created)
        }
        (Method::PUT, Some(name)) => {
            let new = named(typed(route, parse_json(body)?)?, name)?;
            if store.objects.contains_key(&key(name)) {
                object(StatusCode::OK, store.update(&key(name), new, how)?)
            } else if rules.create_on_update && !how.status {
                let created = store.create(&route.gr, &ns, new, &api_version, how, true)?;
                object(StatusCode::CREATED, created)
            } else {
                Err(ApiError::not_found(&route.gr, name))
            }
        }
        (Method::PATCH, Some(name)) => patch(store, headers, route, query, how, name, body),
        (Method::DELETE, Some(name)) => {
            let (pre, dry_run) = delete_options(body)?;
            how.dry_run |= dry_run;
            let gone = !store.objects.contains_key(&key(name)) || {
                let stored = &store.objects[&key(name)].value;
                stored["metadata"]["finalizers"]
                    .as_array()
                    .is_none_or(Vec::is_empty)
            };
            let deleted = store.delete(&key(name), &pre, how)?;
            if gone {
                // Deleted at once: a Status, not the object (kube-apiserver 1.36, built-in and
                // custom resources alike).
                let details = json!({
                    "name": name,
                    "group": route.gr.group,
                    "kind": route.gr.plural,
                    "uid": deleted["metadata"]["uid"],
                });
                let status = json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {},
                    "status": "Success", "details": details,
                });
                return object(StatusCode::OK, status);
            }
            object(StatusCode::OK, deleted)
        }
        (Method::DELETE, None) => {
            let (pre, dry_run) = delete_options(body)?;
            how.dry_run |= dry_run;
            let selector = Selector::parse(query.get("labelSelector"), query.get("fieldSelector"))?;
            let mut items = Vec::new();
            for item in store.select(&route.gr, route.namespace.as_deref(), &selector) {
                let meta = &item["metadata"];
                let item_key = ObjKey {
                    gr: route.gr.clone(),
                    ns: meta["namespace"].as_str().unwrap_or("").into(),
                    name: meta["name"].as_str().unwrap_or("").into(),
                };
                items.push(store.delete(&item_key, &pre, how)?);
            }
            let kind = store
                .kind(&route.gr)
                .map_or_else(|| "List".into(), |k| format!("{k}List"));
            let list = json!({
                "apiVersion": api_version, "kind": kind,
                "metadata": { "resourceVersion": store.version.to_string() }, "items": items,
            });
            object(StatusCode::OK, list)
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// A custom resource's body must say its `apiVersion` and `kind`, as the API server's
/// unstructured decoder requires (400 otherwise); built-in types are decoded from the path.
fn typed(route: &Route, object: Value) -> Result<Value, ApiError> {
    if route.gr.is_custom() {
        for field in ["kind", "apiVersion"] {
            if object
                .get(field)
                .and_then(Value::as_str)
                .is_none_or(str::is_empty)
            {
                return Err(ApiError::bad_request(format!(
                    "the object provided is unrecognized: Object '{}' is missing in '{object}'",
                    if field == "kind" { "Kind" } else { field }
                )));
            }
        }
    }
    Ok(object)
}

/// `DeleteOptions` in a DELETE's body (kube always sends one): preconditions and dry run.
/// Propagation policies and grace periods are accepted and ignored (no garbage collector, no
/// kubelet).
fn delete_options(body: &Bytes) -> Result<(Preconditions, bool), ApiError> {
    if body.is_empty() {
        return Ok((Preconditions::default(), false));
    }
    let options = parse_json(body)?;
    let text = |v: &Value| v.as_str().map(str::to_string);
    let pre = Preconditions {
        uid: text(&options["preconditions"]["uid"]),
        resource_version: text(&options["preconditions"]["resourceVersion"]),
    };
    let dry_run = options["dryRun"]
        .as_array()
        .is_some_and(|d| d.iter().any(|v| v == "All"));
    Ok((pre, dry_run))
}

fn patch(
    store: &mut Store,
    headers: &HeaderMap,
    route: &Route,
    query: &Query,
    how: How,
    name: &str,
    body: &Bytes,
) -> Result<Answer, ApiError> {
    let key = ObjKey {
        gr: route.gr.clone(),
        ns: route.namespace.clone().unwrap_or_default(),
        name: name.into(),
    };
    let content_type = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let content_type = content_type.split(';').next().unwrap_or("").trim();
    let current = store.objects.get(&key).map(|s| s.value.clone());
    let current = || {
        current
            .clone()
            .ok_or_else(|| ApiError::not_found(&route.gr, name))
    };
    let patched = match content_type {
        "application/json-patch+json" => {
            let mut doc = current()?;
            json_patch(&mut doc, &parse_json(body)?).map_err(|e| match e {
                PatchError::Malformed(m) => ApiError::bad_request(m),
                PatchError::Failed(m) => ApiError::unprocessable(m),
            })?;
            doc
        }
        "application/merge-patch+json" => {
            let mut doc = current()?;
            merge(&mut doc, &parse_json(body)?);
            doc
        }
        "application/strategic-merge-patch+json" => {
            if !store.rules(&route.gr).strategic_merge {
                return Err(ApiError::unsupported_media_type(format!(
                    "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (strategic merge patch is not supported for {})",
                    route.gr
                )));
            }
            let mut doc = current()?;
            merge(&mut doc, &parse_json(body)?);
            doc
        }
        "application/apply-patch+yaml" => {
            if query.get("fieldManager").is_none_or(str::is_empty) {
                return Err(ApiError::bad_request(
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            }
            let applied = named(parse_json(body)?, name)?;
            match current().ok() {
                Some(mut doc) => {
                    merge(&mut doc, &applied);
                    doc
                }
                None if !how.status => {
                    let ns = key.ns.clone();
                    let created =
                        store.create(&route.gr, &ns, applied, &route.api_version(), how, true)?;
                    return Ok(Answer::Object(StatusCode::CREATED, created));
                }
                None => return Err(ApiError::not_found(&route.gr, name)),
            }
        }
        other => {
            return Err(ApiError::unsupported_media_type(format!(
                "the body of the request was in an unknown format ({other:?}) - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml"
            )));
        }
    };
    Ok(Answer::Object(
        StatusCode::OK,
        store.update(&key, patched, how)?,
    ))
}

fn watch(store: &mut Store, route: &Route, query: &Query) -> Result<Answer, ApiError> {
    let selector = Selector::parse(query.get("labelSelector"), query.get("fieldSelector"))?;
    let timeout = match query.get("timeoutSeconds").map(str::parse::<u64>) {
        None => DEFAULT_WATCH_TIMEOUT,
        Some(Ok(secs)) => Duration::from_secs(secs),
        Some(Err(_)) => return Err(ApiError::bad_request("timeoutSeconds must be a number")),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let deadline = Instant::now() + timeout;
    let watch = Watch {
        gr: route.gr.clone(),
        ns: route.namespace.clone(),
        selector,
        tx,
    };
    match query
        .get("resourceVersion")
        .filter(|rv| !rv.is_empty() && *rv != "0")
    {
        // Unset or "0": the current state as synthetic ADDED events, then the changes.
        None => {
            let items = store.select(&route.gr, route.namespace.as_deref(), &watch.selector);
            for item in &items {
                watch.tx.send(watch_line("ADDED", item)).unwrap();
            }
            if query.flag("sendInitialEvents") {
                let bookmark = json!({
                    "apiVersion": route.api_version(),
                    "kind": store.kind(&route.gr).unwrap_or(""),
                    "metadata": {
                        "resourceVersion": store.version.to_string(),
                        "annotations": { "k8s.io/initial-events-end": "true" },
                    },
                });
                watch.tx.send(watch_line("BOOKMARK", &bookmark)).unwrap();
            }
        }
        Some(rv) => {
            let from: u64 = rv
                .parse()
                .map_err(|_| ApiError::bad_request(format!("invalid resource version: {rv:?}")))?;
            if from < store.compacted {
                // What etcd's compaction makes an API server say: the watcher must relist.
                let gone = ApiError::expired(format!(
                    "too old resource version: {from} ({})",
                    store.compacted
                ));
                watch
                    .tx
                    .send(watch_line("ERROR", &gone.to_status()))
                    .unwrap();
                return Ok(Answer::Watch(rx, deadline));
            }
            for change in store.history.iter().filter(|c| c.rv > from) {
                if let Some(line) = watch.event(change) {
                    watch.tx.send(line).unwrap();
                }
            }
        }
    }
    store.watches.push(watch);
    Ok(Answer::Watch(rx, deadline))
}

/// A watch's body: the lines the store sends, each after the client's response latency,
/// until the watch times out (the server closes it), the store drops it (outage, compaction),
/// or the client is partitioned (the connection fails).
fn watch_body(
    rx: mpsc::UnboundedReceiver<WatchLine>,
    deadline: Instant,
    link: Arc<ClientLink>,
) -> Body {
    let partition = link.partition.subscribe();
    let lines = stream::unfold(Some((rx, partition, link)), move |state| async move {
        let (mut rx, mut partition, link) = state?;
        loop {
            let now = *partition.borrow_and_update();
            if now == Partition::WatchesHang {
                // Held open, silent: the lines wait in the channel.
                let _ = partition.changed().await;
                continue;
            }
            if now != Partition::Connected {
                let error = link.fail(now).await;
                return Some((Err(error), None));
            }
            let line = tokio::select! {
                biased;
                _ = partition.changed() => continue,
                line = timeout_at(deadline, rx.recv()) => line.ok().flatten(),
            };
            let line = line?;
            let latency = link.latency().1;
            if !latency.is_zero() {
                sleep_until(line.sent + latency).await;
            }
            let mut link_now = *partition.borrow();
            if link_now == Partition::WatchesHang {
                // Held until the link is connected again, then delivered first.
                let mut held = partition.clone();
                link_now = held
                    .wait_for(|p| *p != Partition::WatchesHang)
                    .await
                    .map_or(Partition::Refused, |p| *p);
            }
            if link_now != Partition::Connected {
                continue; // the line is lost with the connection
            }
            return Some((Ok(Frame::data(line.line)), Some((rx, partition, link))));
        }
    });
    StreamBody::new(lines.boxed()).boxed_unsync()
}

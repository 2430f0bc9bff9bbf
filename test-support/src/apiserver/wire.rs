//! The HTTP face of the server: URL routing, query strings, responses and `Status` errors.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::fmt;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

/// The error type of response bodies: a watch of a partitioned client ends with one.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A response body: one JSON document, or a watch's stream of JSON lines.
pub(crate) type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A group and a plural resource name: what the API server keys its storage by (every version
/// of a group shares it).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Gr {
    pub group: String,
    pub plural: String,
}

impl Gr {
    /// Whether a test's resource name (`"configmaps"`, or qualified `"leases.coordination.k8s.io"`)
    /// names this resource.
    pub fn is(&self, filter: &str) -> bool {
        filter == self.plural
            || (filter.len() == self.plural.len() + 1 + self.group.len()
                && filter.starts_with(&self.plural)
                && filter[self.plural.len()..].starts_with('.')
                && filter.ends_with(&self.group))
    }

    /// A custom resource: its group has a dot and is not one of Kubernetes' own (`*.k8s.io`).
    pub fn is_custom(&self) -> bool {
        self.group.contains('.') && self.group != "k8s.io" && !self.group.ends_with(".k8s.io")
    }
}

impl fmt::Display for Gr {
    /// As the API server names a resource in its messages: `configmaps`, `leases.coordination.k8s.io`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.plural)
        } else {
            write!(f, "{}.{}", self.plural, self.group)
        }
    }
}

/// What a request's path names.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub gr: Gr,
    pub version: String,
    /// `None`: all namespaces, or a cluster-scoped resource.
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub subresource: Option<String>,
}

impl Route {
    /// `/api/v1/[namespaces/{ns}/]{plural}[/{name}[/{sub}]]` or
    /// `/apis/{group}/{version}/[namespaces/{ns}/]{plural}[/{name}[/{sub}]]`.
    pub fn parse(path: &str) -> Option<Route> {
        let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
        let (group, version, rest) = match segments.as_slice() {
            ["api", version, rest @ ..] => ("", *version, rest),
            ["apis", group, version, rest @ ..] => (*group, *version, rest),
            _ => return None,
        };
        let (namespace, rest) = match rest {
            // `namespaces/{ns}/{plural}...`, but `namespaces/{name}[/status]` is a Namespace.
            ["namespaces", ns, plural, tail @ ..]
                if !(group.is_empty()
                    && tail.is_empty()
                    && matches!(*plural, "status" | "finalize")) =>
            {
                let mut r = vec![*plural];
                r.extend_from_slice(tail);
                (Some(ns.to_string()), r)
            }
            _ => (None, rest.to_vec()),
        };
        let (plural, name, subresource) = match rest.as_slice() {
            [plural] => (*plural, None, None),
            [plural, name] => (*plural, Some(name.to_string()), None),
            [plural, name, sub] => (*plural, Some(name.to_string()), Some(sub.to_string())),
            _ => return None,
        };
        if plural.is_empty() || name.as_deref() == Some("") {
            return None;
        }
        Some(Route {
            gr: Gr {
                group: group.into(),
                plural: plural.into(),
            },
            version: version.into(),
            namespace,
            name,
            subresource,
        })
    }

    /// The `apiVersion` of objects served under this path.
    pub fn api_version(&self) -> String {
        if self.gr.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.gr.group, self.version)
        }
    }
}

/// A query string, percent-decoded.
#[derive(Clone, Debug, Default)]
pub(crate) struct Query(BTreeMap<String, String>);

impl Query {
    pub fn parse(query: Option<&str>) -> Query {
        let pairs = query.unwrap_or("").split('&').filter(|kv| !kv.is_empty());
        Query(
            pairs
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                    (decode(k), decode(v))
                })
                .collect(),
        )
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub fn dry_run(&self) -> bool {
        self.get("dryRun") == Some("All")
    }
}

/// `application/x-www-form-urlencoded` decoding (what kube's `form_urlencoded` writes).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = |b: u8| (b as char).to_digit(16);
                match (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                    (Some(hi), Some(lo)) => {
                        out.push((hi * 16 + lo) as u8);
                        i += 2;
                    }
                    _ => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub(crate) fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

pub(crate) fn respond(code: StatusCode, value: &Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(full(serde_json::to_vec(value).unwrap()))
        .unwrap()
}

/// An API error: answered as a `Status` with its HTTP code, as the API server does.
#[derive(Clone, Debug)]
pub(crate) struct ApiError {
    pub code: StatusCode,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: StatusCode, reason: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn about(mut self, gr: &Gr, name: &str) -> ApiError {
        self.details = Some(json!({ "name": name, "group": gr.group, "kind": gr.plural }));
        self
    }

    pub fn not_found(gr: &Gr, name: &str) -> ApiError {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("{gr} \"{name}\" not found"),
        )
        .about(gr, name)
    }

    pub fn no_route() -> ApiError {
        Self::new(
            StatusCode::NOT_FOUND,
            "NotFound",
            "the server could not find the requested resource",
        )
    }

    pub fn already_exists(gr: &Gr, name: &str) -> ApiError {
        Self::new(
            StatusCode::CONFLICT,
            "AlreadyExists",
            format!("{gr} \"{name}\" already exists"),
        )
        .about(gr, name)
    }

    /// The optimistic-lock failure of a write that carried a stale resourceVersion.
    pub fn conflict(gr: &Gr, name: &str) -> ApiError {
        Self::conflict_because(
            gr,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    pub fn conflict_because(gr: &Gr, name: &str, why: &str) -> ApiError {
        Self::new(
            StatusCode::CONFLICT,
            "Conflict",
            format!("Operation cannot be fulfilled on {gr} \"{name}\": {why}"),
        )
        .about(gr, name)
    }

    /// 422 with one field error (`reason` as the API server's `field.ErrorType` names it).
    pub fn invalid(
        kind: &str,
        gr: &Gr,
        name: &str,
        field: &str,
        reason: &str,
        detail: String,
    ) -> ApiError {
        let qualified = if gr.group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{}", gr.group)
        };
        let mut e = Self::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {field}: {detail}"),
        );
        e.details = Some(json!({
            "name": name, "group": gr.group, "kind": kind,
            "causes": [{ "reason": reason, "message": detail, "field": field }],
        }));
        e
    }

    /// 422 without field details: what a failed JSON patch operation gets.
    pub fn unprocessable(message: String) -> ApiError {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", message)
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "BadRequest", message)
    }

    pub fn expired(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::GONE, "Expired", message)
    }

    pub fn unsupported_media_type(message: impl Into<String>) -> ApiError {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "UnsupportedMediaType",
            message,
        )
    }

    pub fn method_not_allowed() -> ApiError {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "InternalError", message)
    }

    /// RBAC's answer to a request its role does not allow. As kube-apiserver 1.36 words it
    /// (e2e/tests/least_privilege.rs): a request for one object names it
    /// (`configmaps "web" is forbidden: ...`), and so do the details.
    pub fn forbidden(verb: &str, route: &Route) -> ApiError {
        let gr = &route.gr;
        let scope = match &route.namespace {
            Some(ns) => format!("in the namespace \"{ns}\""),
            None => "at the cluster scope".to_string(),
        };
        let name = route.name.as_deref().unwrap_or("");
        let subject = match name {
            "" => gr.to_string(),
            name => format!("{gr} \"{name}\""),
        };
        let mut e = Self::new(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "{subject} is forbidden: User \"system:serviceaccount:default:controller\" \
                 cannot {verb} resource \"{}\" in API group \"{}\" {scope}",
                gr.plural, gr.group
            ),
        );
        e.details = Some(json!({ "name": name, "group": gr.group, "kind": gr.plural }));
        e
    }

    pub fn unavailable() -> ApiError {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ServiceUnavailable",
            "the server is currently unable to handle the request",
        )
    }

    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code.as_u16(),
        });
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }

    pub fn into_response(self) -> Response<Body> {
        respond(self.code, &self.to_status())
    }
}

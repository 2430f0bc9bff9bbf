//! The API server's own count of the requests it served: `apiserver_request_total` from its
//! `/metrics`, by resource, subresource, verb and code. Two scrapes give what happened between
//! them, as the server saw it (every client's requests, the server's own included).
//!
//! The counter of a long-running request (a `WATCH`) grows when the request ends, not when it
//! starts.

use std::collections::BTreeMap;

/// The verbs that write (`APPLY` is server-side apply).
pub const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];

/// What a count is of.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The resource (`leases`, `configmaps`).
    pub resource: String,
    /// The subresource (`status`), or empty.
    pub subresource: String,
    /// The verb as the server counts it (`GET`, `LIST`, `WATCH`, `PUT`, ...).
    pub verb: String,
    /// The HTTP status code.
    pub code: String,
}

impl Key {
    /// Whether the request wrote (its verb is one of [`WRITE_VERBS`]).
    pub fn is_write(&self) -> bool {
        WRITE_VERBS.contains(&self.verb.as_str())
    }
}

/// Counts of requests by [`Key`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RequestCounts {
    counts: BTreeMap<Key, f64>,
}

impl RequestCounts {
    /// The `apiserver_request_total` samples of a Prometheus text exposition.
    pub fn parse(text: &str) -> Result<RequestCounts, String> {
        let mut counts = BTreeMap::new();
        for line in text.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let (labels, value) = rest
                .rsplit_once('}')
                .ok_or_else(|| format!("no end of labels in {line:?}"))?;
            let value: f64 = value
                .split_whitespace()
                .next()
                .ok_or_else(|| format!("no value in {line:?}"))?
                .parse()
                .map_err(|e| format!("bad value in {line:?}: {e}"))?;
            let labels = parse_labels(labels).map_err(|e| format!("{e} in {line:?}"))?;
            let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
            let key = Key {
                resource: label("resource"),
                subresource: label("subresource"),
                verb: label("verb"),
                code: label("code"),
            };
            *counts.entry(key).or_insert(0.0) += value;
        }
        if counts.is_empty() {
            return Err("no apiserver_request_total sample in the metrics".into());
        }
        Ok(RequestCounts { counts })
    }

    /// What was counted after `before` (these counts minus `before`'s; counters only grow).
    pub fn since(&self, before: &RequestCounts) -> RequestCounts {
        let counts = self
            .counts
            .iter()
            .map(|(key, after)| {
                let before = before.counts.get(key).copied().unwrap_or(0.0);
                (key.clone(), after - before)
            })
            .filter(|(_, n)| *n != 0.0)
            .collect();
        RequestCounts { counts }
    }

    /// The sum of the counts whose key `keep` accepts.
    pub fn total(&self, keep: impl Fn(&Key) -> bool) -> f64 {
        self.counts
            .iter()
            .filter(|(k, _)| keep(k))
            .map(|(_, n)| n)
            .sum()
    }

    /// All requests to `resource`.
    pub fn of(&self, resource: &str) -> f64 {
        self.total(|k| k.resource == resource)
    }

    /// The writes to `resource`.
    pub fn writes_of(&self, resource: &str) -> f64 {
        self.total(|k| k.resource == resource && k.is_write())
    }

    /// The requests to `resource` by verb.
    pub fn verbs_of(&self, resource: &str) -> BTreeMap<String, f64> {
        let mut verbs = BTreeMap::new();
        for (key, n) in &self.counts {
            if key.resource == resource {
                *verbs.entry(key.verb.clone()).or_insert(0.0) += n;
            }
        }
        verbs
    }

    /// Every count.
    pub fn iter(&self) -> impl Iterator<Item = (&Key, f64)> {
        self.counts.iter().map(|(k, n)| (k, *n))
    }
}

/// Scrapes the API server's `/metrics` with `client` (which needs `get` on the non-resource URL
/// `/metrics`, as an admin has).
pub async fn scrape(client: &kube::Client) -> Result<RequestCounts, String> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| format!("GET /metrics: {e}"))?;
    RequestCounts::parse(&text)
}

/// `name="value",...` with Prometheus's escapes (`\\`, `\"`, `\n`).
fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut labels = BTreeMap::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        if chars.peek().is_none() {
            return Ok(labels);
        }
        let name: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=')).collect();
        if chars.next() != Some('=') || chars.next() != Some('"') {
            return Err(format!("label {name:?} has no quoted value"));
        }
        let mut value = String::new();
        loop {
            match chars.next() {
                Some('"') => break,
                Some('\\') => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(c) => value.push(c),
                    None => return Err("an escape at the end".into()),
                },
                Some(c) => value.push(c),
                None => return Err(format!("label {name:?}'s value is not closed")),
            }
        }
        labels.insert(name.trim().to_string(), value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SCRAPE: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests
# TYPE apiserver_request_total counter
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="namespace",subresource="",verb="LIST",version="v1"} 40
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 330
apiserver_request_total{code="409",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="PUT",version="v1"} 2
apiserver_request_total{code="201",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="resource",subresource="",verb="POST",version="v1"} 33
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="configmaps",scope="resource",subresource="",verb="PATCH",version="v1"} 1e3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="odd",scope="resource",subresource="a\"b,c}",verb="GET",version="v1"} 1
apiserver_request_duration_seconds_count{resource="leases",verb="PUT"} 999
"#;

    #[test]
    fn parses_and_sums_by_resource_and_verb() {
        let counts = RequestCounts::parse(SCRAPE).unwrap();
        assert_eq!(counts.of("leases"), 405.0);
        assert_eq!(counts.writes_of("leases"), 365.0);
        assert_eq!(counts.writes_of("configmaps"), 1000.0);
        let verbs = counts.verbs_of("leases");
        assert_eq!(verbs.get("PUT"), Some(&332.0));
        assert_eq!(verbs.get("LIST"), Some(&40.0));
        let odd = counts.iter().find(|(k, _)| k.resource == "odd").unwrap();
        assert_eq!(odd.0.subresource, "a\"b,c}");
    }

    #[test]
    fn since_subtracts_and_keeps_new_keys() {
        let before = RequestCounts::parse(SCRAPE).unwrap();
        let after = SCRAPE.replace("} 330", "} 345")
            + "apiserver_request_total{code=\"200\",resource=\"leases\",subresource=\"\",verb=\"GET\"} 3\n";
        let after = RequestCounts::parse(&after).unwrap();
        let delta = after.since(&before);
        assert_eq!(delta.of("leases"), 18.0);
        assert_eq!(delta.writes_of("leases"), 15.0);
        assert_eq!(delta.of("configmaps"), 0.0);
    }

    #[test]
    fn text_without_the_counter_is_an_error() {
        assert!(RequestCounts::parse("# nothing\n").is_err());
        assert!(RequestCounts::parse("apiserver_request_total{verb=\"GET} 1").is_err());
    }
}

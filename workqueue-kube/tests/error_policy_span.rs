//! The error policy runs inside the span its reconcile ran in (kube-runtime calls it inside its
//! `reconciling object` span), so what it logs carries the object's key: kube-rs's
//! `controller-rs` logs its failures from `error_policy` and counts on that.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;
use workqueue_kube::controller::{Action, Controller, Error};

use workqueue_test_support::apiserver::ApiServer;
use workqueue_test_support::fixtures::{NAMESPACE, cm};

/// The fields of a span or an event, as text.
#[derive(Debug, Clone, Default)]
struct Fields(BTreeMap<String, String>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), format!("{value:?}"));
    }
}

/// An event as it was logged: its message, and the spans it was inside (root first), each with
/// its name and fields.
#[derive(Debug, Clone)]
struct Logged {
    message: String,
    spans: Vec<(String, Fields)>,
}

impl Logged {
    /// The fields of the innermost span named `name` this event was inside.
    fn span(&self, name: &str) -> Option<&Fields> {
        self.spans
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, fields)| fields)
    }
}

/// A layer that keeps every event with the spans it was logged in.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Logged>>>);

impl Recorder {
    fn find(&self, message: &str) -> Logged {
        let logged = self.0.lock().unwrap();
        logged
            .iter()
            .find(|l| l.message == message)
            .cloned()
            .unwrap_or_else(|| panic!("no event {message:?} among {logged:#?}"))
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Recorder {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        event.record(&mut fields);
        let spans = ctx
            .event_scope(event)
            .map(|scope| {
                scope
                    .from_root()
                    .map(|span| {
                        let fields = span.extensions().get::<Fields>().cloned();
                        (span.name().to_string(), fields.unwrap_or_default())
                    })
                    .collect()
            })
            .unwrap_or_default();
        self.0.lock().unwrap().push(Logged {
            message: fields.0.remove("message").unwrap_or_default(),
            spans,
        });
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Failed(String);

/// A reconcile that fails: the warning its error policy logs is inside the runner's `reconcile`
/// span with the object's key, the very span the reconcile logged in (the same reconcile id).
#[tokio::test(start_paused = true)]
async fn the_error_policy_logs_inside_the_reconciles_span() {
    let recorder = Recorder::default();
    // The test's runtime has one thread, which every task of the controller runs on.
    let _default =
        tracing::subscriber::set_default(tracing_subscriber::registry().with(recorder.clone()));
    let server = ApiServer::new();
    server.put(&cm("bad", "1"));
    let reconcile = |cm: Arc<ConfigMap>, _: Arc<()>| async move {
        tracing::info!("reconciling");
        Err::<Action, _>(Failed(format!("{} is bad", cm.name_any())))
    };
    let error_policy = |_: Arc<ConfigMap>, error: &Failed, _: Arc<()>| {
        tracing::warn!("error policy: {error}");
        Action::await_change()
    };
    let items = Controller::new(
        Api::<ConfigMap>::all(server.client()),
        watcher::Config::default(),
    )
    .run(reconcile, error_policy, Arc::new(()));
    let mut items = std::pin::pin!(items);
    match items.next().await {
        Some(Err(Error::ReconcilerFailed(_, key))) => assert_eq!(key.name, "bad"),
        other => panic!("expected the reconcile's failure, got {other:?}"),
    }

    let key = ObjectRef::<ConfigMap>::new("bad")
        .within(NAMESPACE)
        .to_string();
    let reconciled = recorder.find("reconciling");
    let policy = recorder.find("error policy: bad is bad");
    let span = policy.span("reconcile").unwrap_or_else(|| {
        panic!("the error policy logged outside the reconcile's span: {policy:#?}")
    });
    assert_eq!(span.0.get("key"), Some(&key), "{policy:#?}");
    let id = |logged: &Logged| {
        let span = logged.span("reconcile").expect("inside a reconcile");
        span.0.get("reconcile_id").cloned().expect("a reconcile id")
    };
    assert_eq!(id(&policy), id(&reconciled));
}

//! The builder's relations: objects whose changes reconcile the main resource's objects, owned
//! ones (`owns*`, through their owner references) and related ones (`watches*`, through a
//! mapper), watched by the controller or given as streams, as kube-runtime has them (the stream
//! variants are stable here).
//!
//! A watch the controller starts queues keys with controller-runtime's priorities (its initial
//! list behind real changes); a stream of the user's does not tell a list from a change, so its
//! keys are queued at the default priority. Streams that can fail (`*_stream`) are retried with
//! the controller's [`trigger_backoff`](Controller::trigger_backoff), as its own watches are.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;

use futures_util::stream::{Stream, StreamExt};
use k8s_openapi::serde::de::DeserializeOwned;
use kube::Resource;
use kube::api::Api;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, watcher};

use super::Controller;
use super::divided::PlannedWatch;
use super::triggers::{self, Relation};

impl<K> Controller<K>
where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Send + Sync + 'static,
{
    /// Reconciles the owner (of kind `K`) of every `Child` that `api` sees and `wc` selects when
    /// the child changes. Children need an owner reference to a `K`.
    pub fn owns<Child>(self, api: Api<Child>, wc: watcher::Config) -> Self
    where
        Child: Clone + Resource<DynamicType = ()> + DeserializeOwned + Debug + Send + 'static,
    {
        self.owns_with(api, (), wc)
    }

    /// [`Controller::owns`] for a dynamic child type.
    pub fn owns_with<Child>(
        mut self,
        api: Api<Child>,
        dyntype: Child::DynamicType,
        wc: watcher::Config,
    ) -> Self
    where
        Child: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Child::DynamicType: Debug + Eq + Hash + Clone,
    {
        let name = format!("owns:{}", Child::kind(&dyntype).to_lowercase());
        let (watch, events) =
            PlannedWatch::owned::<K, Child>(api, wc, self.dyntype.clone(), dyntype);
        self.owned_watches.push(watch);
        let keys = triggers::owners::<K, _, _>(events, self.dyntype.clone());
        self.triggers.push((name, self.backoff.apply(keys).boxed()));
        self
    }

    /// Reconciles the owner (of kind `K`) of every `Child` that `trigger` yields: a stream of
    /// the user's (a watcher's `touched_objects`, filtered or shared with other code), retried
    /// with the controller's backoff when it fails. Children need an owner reference to a `K`.
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use k8s_openapi::api::apps::v1::StatefulSet;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::{WatchStreamExt, metadata_watcher, predicates, watcher};
    /// use kube::{Api, Client};
    /// use workqueue_kube::controller::{Action, Controller};
    ///
    /// # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> { Ok(Action::await_change()) }
    /// # fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<()>) -> Action { Action::await_change() }
    /// # #[allow(deprecated)]
    /// # async fn doc(client: Client) {
    /// let sets = metadata_watcher(Api::<StatefulSet>::all(client.clone()), watcher::Config::default())
    ///     .touched_objects()
    ///     .predicate_filter(predicates::resource_version, Default::default());
    /// Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .owns_stream(sets)
    ///     .run(reconcile, error_policy, Arc::new(()))
    ///     .for_each(|_| std::future::ready(()))
    ///     .await;
    /// # }
    /// ```
    pub fn owns_stream<Child: Resource<DynamicType = ()> + Send + 'static>(
        self,
        trigger: impl Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
    ) -> Self {
        self.owns_stream_with(trigger, ())
    }

    /// [`Controller::owns_stream`] for a dynamic child type.
    pub fn owns_stream_with<Child: Resource + Send + 'static>(
        mut self,
        trigger: impl Stream<Item = Result<Child, watcher::Error>> + Send + 'static,
        dyntype: Child::DynamicType,
    ) -> Self
    where
        Child::DynamicType: Debug + Eq + Hash + Clone,
    {
        let name = format!("owns:{}", Child::kind(&dyntype).to_lowercase());
        let keys = triggers::owners_of::<K, Child, _, _>(trigger, self.dyntype.clone());
        self.triggers.push((name, self.backoff.apply(keys).boxed()));
        self
    }

    /// Reconciles the owner (of kind `K`) of every `Child` that `trigger` yields: a shared
    /// stream (a subscriber of a shared store's writer), which the code driving that store's
    /// watch must poll on its own, as for [`Controller::for_shared_stream`].
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use k8s_openapi::api::apps::v1::Deployment;
    /// use k8s_openapi::api::core::v1::Pod;
    /// use kube::runtime::{WatchStreamExt, reflector, watcher};
    /// use kube::{Api, Client};
    /// use workqueue_kube::controller::{Action, Controller};
    ///
    /// # async fn reconcile(_: Arc<Deployment>, _: Arc<()>) -> Result<Action, kube::Error> { Ok(Action::await_change()) }
    /// # fn error_policy(_: Arc<Deployment>, _: &kube::Error, _: Arc<()>) -> Action { Action::await_change() }
    /// # async fn doc(client: Client) {
    /// let (_pods, writer) = reflector::store_shared(128);
    /// let subscriber = writer.subscribe().expect("a shared store has subscribers");
    /// let pods = watcher(Api::<Pod>::all(client.clone()), watcher::Config::default())
    ///     .default_backoff()
    ///     .reflect_shared(writer)
    ///     .for_each(|_| std::future::ready(()));
    /// let controller = Controller::new(Api::<Deployment>::all(client), Default::default())
    ///     .owns_shared_stream(subscriber)
    ///     .run(reconcile, error_policy, Arc::new(()))
    ///     .for_each(|_| std::future::ready(()));
    /// tokio::select! {
    ///     () = pods => {}
    ///     () = controller => {}
    /// }
    /// # }
    /// ```
    pub fn owns_shared_stream<Child: Resource<DynamicType = ()> + Send + 'static>(
        self,
        trigger: impl Stream<Item = Arc<Child>> + Send + 'static,
    ) -> Self {
        self.owns_shared_stream_with(trigger, ())
    }

    /// [`Controller::owns_shared_stream`] for a dynamic child type.
    pub fn owns_shared_stream_with<Child: Resource + Send + 'static>(
        mut self,
        trigger: impl Stream<Item = Arc<Child>> + Send + 'static,
        dyntype: Child::DynamicType,
    ) -> Self
    where
        Child::DynamicType: Debug + Eq + Hash + Clone,
    {
        let name = format!("owns:{}", Child::kind(&dyntype).to_lowercase());
        let keys = triggers::owners_of::<K, Child, _, _>(
            trigger.map(Ok::<_, watcher::Error>),
            self.dyntype.clone(),
        );
        self.triggers.push((name, keys.boxed()));
        self
    }

    /// Reconciles the objects `mapper` relates each `Other` that `api` sees to, when it changes.
    ///
    /// A `mapper` that panics costs the keys of that one object: the panic is reported as an
    /// item of the stream ([`RunnerError::MapperPanicked`](super::RunnerError::MapperPanicked))
    /// and the watch goes on (in kube-runtime, the panic reaches the task polling the stream).
    pub fn watches<Other, I>(
        self,
        api: Api<Other>,
        wc: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Default + Debug + Clone + Eq + Hash,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_with(api, Default::default(), wc, mapper)
    }

    /// [`Controller::watches`] for a dynamic type.
    pub fn watches_with<Other, I>(
        mut self,
        api: Api<Other>,
        dyntype: Other::DynamicType,
        wc: watcher::Config,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
        Other::DynamicType: Debug + Clone + Eq + Hash,
    {
        let name = format!("watches:{}", Other::kind(&dyntype).to_lowercase());
        let relation = Relation::new(mapper, dyntype, self.reports.0.clone());
        let keys = triggers::related(watcher(api, wc), relation);
        self.triggers.push((name, self.backoff.apply(keys).boxed()));
        self
    }

    /// Reconciles the objects `mapper` relates each `Other` that `trigger` yields to: a stream
    /// of the user's (a watcher's `touched_objects`, filtered or shared with other code),
    /// retried with the controller's backoff when it fails. A panicking `mapper` is reported as
    /// for [`Controller::watches`].
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use k8s_openapi::api::apps::v1::DaemonSet;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::reflector::ObjectRef;
    /// use kube::runtime::{WatchStreamExt, predicates, watcher};
    /// use kube::{Api, Client, ResourceExt};
    /// use workqueue_kube::controller::{Action, Controller};
    ///
    /// # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> { Ok(Action::await_change()) }
    /// # fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<()>) -> Action { Action::await_change() }
    /// /// The ConfigMap a DaemonSet names in its `example.com/config` annotation.
    /// fn config_of(ds: DaemonSet) -> Option<ObjectRef<ConfigMap>> {
    ///     let name = ds.annotations().get("example.com/config")?;
    ///     Some(ObjectRef::new(name).within(&ds.namespace()?))
    /// }
    /// # async fn doc(client: Client) {
    /// let daemons = watcher(Api::<DaemonSet>::all(client.clone()), watcher::Config::default())
    ///     .touched_objects()
    ///     .predicate_filter(predicates::resource_version, Default::default());
    /// Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .watches_stream(daemons, config_of)
    ///     .run(reconcile, error_policy, Arc::new(()))
    ///     .for_each(|_| std::future::ready(()))
    ///     .await;
    /// # }
    /// ```
    pub fn watches_stream<Other, I>(
        self,
        trigger: impl Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Default + Debug + Clone,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_stream_with(trigger, mapper, Default::default())
    }

    /// [`Controller::watches_stream`] for a dynamic type.
    pub fn watches_stream_with<Other, I>(
        mut self,
        trigger: impl Stream<Item = Result<Other, watcher::Error>> + Send + 'static,
        mapper: impl Fn(Other) -> I + Sync + Send + 'static,
        dyntype: Other::DynamicType,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Debug + Clone,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        let name = format!("watches:{}", Other::kind(&dyntype).to_lowercase());
        let relation = Relation::new(mapper, dyntype, self.reports.0.clone());
        let keys = triggers::related_objects::<K, Other, _, _, _, _>(trigger, relation);
        self.triggers.push((name, self.backoff.apply(keys).boxed()));
        self
    }

    /// Reconciles the objects `mapper` relates each `Other` that `trigger` yields to: a shared
    /// stream (a subscriber of a shared store's writer), which the code driving that store's
    /// watch must poll on its own, as for [`Controller::for_shared_stream`]. A panicking
    /// `mapper` is reported as for [`Controller::watches`].
    ///
    /// ```no_run
    /// use std::sync::Arc;
    /// use futures_util::StreamExt;
    /// use k8s_openapi::api::apps::v1::DaemonSet;
    /// use k8s_openapi::api::core::v1::ConfigMap;
    /// use kube::runtime::reflector::{self, ObjectRef};
    /// use kube::runtime::{WatchStreamExt, watcher};
    /// use kube::{Api, Client, ResourceExt};
    /// use workqueue_kube::controller::{Action, Controller};
    ///
    /// # async fn reconcile(_: Arc<ConfigMap>, _: Arc<()>) -> Result<Action, kube::Error> { Ok(Action::await_change()) }
    /// # fn error_policy(_: Arc<ConfigMap>, _: &kube::Error, _: Arc<()>) -> Action { Action::await_change() }
    /// fn config_of(ds: Arc<DaemonSet>) -> Option<ObjectRef<ConfigMap>> {
    ///     let name = ds.annotations().get("example.com/config")?;
    ///     Some(ObjectRef::new(name).within(&ds.namespace()?))
    /// }
    /// # async fn doc(client: Client) {
    /// let (_daemons, writer) = reflector::store_shared(128);
    /// let subscriber = writer.subscribe().expect("a shared store has subscribers");
    /// let daemons = watcher(Api::<DaemonSet>::all(client.clone()), watcher::Config::default())
    ///     .default_backoff()
    ///     .reflect_shared(writer)
    ///     .for_each(|_| std::future::ready(()));
    /// let controller = Controller::new(Api::<ConfigMap>::all(client), watcher::Config::default())
    ///     .watches_shared_stream(subscriber, config_of)
    ///     .run(reconcile, error_policy, Arc::new(()))
    ///     .for_each(|_| std::future::ready(()));
    /// tokio::select! {
    ///     () = daemons => {}
    ///     () = controller => {}
    /// }
    /// # }
    /// ```
    pub fn watches_shared_stream<Other, I>(
        self,
        trigger: impl Stream<Item = Arc<Other>> + Send + 'static,
        mapper: impl Fn(Arc<Other>) -> I + Sync + Send + 'static,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Default + Debug + Clone,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        self.watches_shared_stream_with(trigger, mapper, Default::default())
    }

    /// [`Controller::watches_shared_stream`] for a dynamic type.
    pub fn watches_shared_stream_with<Other, I>(
        mut self,
        trigger: impl Stream<Item = Arc<Other>> + Send + 'static,
        mapper: impl Fn(Arc<Other>) -> I + Sync + Send + 'static,
        dyntype: Other::DynamicType,
    ) -> Self
    where
        Other: Clone + Resource + DeserializeOwned + Debug + Send + 'static,
        Other::DynamicType: Debug + Clone,
        I: 'static + IntoIterator<Item = ObjectRef<K>>,
        I::IntoIter: Send,
    {
        let name = format!("watches:{}", Other::kind(&dyntype).to_lowercase());
        let relation = Relation::new(mapper, dyntype, self.reports.0.clone());
        let keys = triggers::related_objects::<K, Other, _, _, _, _>(
            trigger.map(Ok::<_, watcher::Error>),
            relation,
        );
        self.triggers.push((name, keys.boxed()));
        self
    }
}

//! The writer task: the only owner of the watchers and of the [`ClusterState`]. Every
//! watcher event is converted at once into its compact form (full objects are never
//! kept), applied, and — after the initial sync — flushed to the push pipeline and the
//! reader view.

use std::collections::HashSet;
use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::stream::{BoxStream, StreamExt, select_all};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use meshfed_registry::workload_instances::WorkloadEntrySet;
use meshfed_registry::{
    ConfigKey, ConfigKind, NetworkGateway, PushRequest, ServiceRegistry, ShardKey, TriggerReason,
    UpdateSink,
};
use serde::de::DeserializeOwned;
use tokio::task::JoinHandle;
use tracing::{debug, info, warn};

use crate::config::{KubeRegistryConfig, Result};
use crate::convert::{
    ConversionError, ObjectKey, convert_namespace, convert_node, convert_pod, convert_service,
    convert_slice,
};
use crate::registry::{EventType, KubeRegistry, SyncPhase};
use crate::resource_kind::ResourceKind;
use crate::state::{ClusterState, Update};

/// A watched kind: how its objects become [`Update`]s.
trait Watched:
    kube::Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + 'static
{
    const KIND: ResourceKind;

    /// The update for this object; `Err` skips the object.
    fn update(
        &self,
        key: ObjectKey,
        config: &KubeRegistryConfig,
    ) -> Result<Update, ConversionError>;
}

impl Watched for Service {
    const KIND: ResourceKind = ResourceKind::Service;
    fn update(
        &self,
        key: ObjectKey,
        config: &KubeRegistryConfig,
    ) -> Result<Update, ConversionError> {
        Ok(Update::Service(key, Some(convert_service(self, config)?)))
    }
}

impl Watched for EndpointSlice {
    const KIND: ResourceKind = ResourceKind::EndpointSlice;
    fn update(&self, key: ObjectKey, _: &KubeRegistryConfig) -> Result<Update, ConversionError> {
        Ok(Update::Slice(key, convert_slice(self)?))
    }
}

impl Watched for Pod {
    const KIND: ResourceKind = ResourceKind::Pod;
    fn update(&self, key: ObjectKey, _: &KubeRegistryConfig) -> Result<Update, ConversionError> {
        Ok(Update::Pod(key, convert_pod(self)?))
    }
}

impl Watched for Node {
    const KIND: ResourceKind = ResourceKind::Node;
    fn update(&self, key: ObjectKey, _: &KubeRegistryConfig) -> Result<Update, ConversionError> {
        Ok(Update::Node(key, Some(convert_node(self))))
    }
}

impl Watched for Namespace {
    const KIND: ResourceKind = ResourceKind::Namespace;
    fn update(&self, key: ObjectKey, _: &KubeRegistryConfig) -> Result<Update, ConversionError> {
        Ok(Update::Namespace(key, Some(convert_namespace(self))))
    }
}

/// One item from any of the five watchers (boxed: a Pod event is kilobytes).
enum Incoming {
    Service(Box<watcher::Result<Event<Service>>>),
    Slice(Box<watcher::Result<Event<EndpointSlice>>>),
    Pod(Box<watcher::Result<Event<Pod>>>),
    Node(Box<watcher::Result<Event<Node>>>),
    Namespace(Box<watcher::Result<Event<Namespace>>>),
}

fn watch<K: Watched>(
    client: &kube::Client,
    config: watcher::Config,
    wrap: fn(Box<watcher::Result<Event<K>>>) -> Incoming,
) -> BoxStream<'static, Incoming> {
    watcher::watcher(Api::<K>::all(client.clone()), config)
        .default_backoff()
        .map(move |event| wrap(Box::new(event)))
        .boxed()
}

/// Starting a registry is starting its writer task.
impl KubeRegistry {
    /// Starts watching the cluster behind `client` and returns the registry handle and
    /// the writer task, which runs until `shutdown` resolves.
    ///
    /// Services, EndpointSlices (`discovery.k8s.io/v1`), Pods (not Failed), Nodes and
    /// Namespaces are listed, then watched from the listed resourceVersion; a dropped
    /// watch resumes from the last version seen, `410 Gone` relists, and failures retry
    /// with client-go's backoff. Nothing reaches `sink` until every kind has been listed
    /// once; then every service is announced, every endpoint shard written and
    /// `sink.synced(Kubernetes/<cluster>)` sent, and from then on only changes are.
    ///
    /// Fails only for an invalid `config`; an unreachable API server is retried (the
    /// registry then reports not synced, or stale with its last view).
    pub async fn start(
        client: kube::Client,
        config: KubeRegistryConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Arc<KubeRegistry>, JoinHandle<()>)> {
        Self::spawn(client, config, sink, shutdown, false)
    }

    /// Like [`KubeRegistry::start`], but the initial sync is held back: the registry
    /// lists and watches everything (phase [`SyncPhase::Listed`] once every kind is
    /// listed) and keeps applying changes, yet publishes no view and writes nothing to
    /// `sink` until [`KubeRegistry::resume`]. Used to replace a running registry of the
    /// same cluster (rotated credentials) without a window in which its shard is
    /// written by both or by neither.
    pub async fn start_paused(
        client: kube::Client,
        config: KubeRegistryConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(Arc<KubeRegistry>, JoinHandle<()>)> {
        Self::spawn(client, config, sink, shutdown, true)
    }

    fn spawn(
        client: kube::Client,
        config: KubeRegistryConfig,
        sink: UpdateSink,
        shutdown: impl Future<Output = ()> + Send + 'static,
        paused: bool,
    ) -> Result<(Arc<KubeRegistry>, JoinHandle<()>)> {
        config.validate()?;
        let registry = Arc::new(KubeRegistry::new(config, sink.clone(), paused));
        let task = tokio::spawn(run(client, registry.clone(), sink, shutdown));
        Ok((registry, task))
    }
}

/// Runs until `shutdown` resolves. The registry keeps its last view afterwards.
pub(crate) async fn run(
    client: kube::Client,
    registry: Arc<KubeRegistry>,
    sink: UpdateSink,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let config = watcher::Config::default();
    let mut incoming = select_all([
        watch(&client, config.clone(), Incoming::Service),
        watch(&client, config.clone(), Incoming::Slice),
        // Istio does not watch Failed pods (they keep their IP in the API but not on
        // the network).
        watch(
            &client,
            config.clone().fields("status.phase!=Failed"),
            Incoming::Pod,
        ),
        watch(&client, config.clone(), Incoming::Node),
        watch(&client, config, Incoming::Namespace),
    ]);
    let mut hold = registry.hold.subscribe();
    let mut workload_entries = registry.config.workload_entries.subscribe();
    let mut writer = Writer::new(registry, sink);
    writer.workload_entries(workload_entries.borrow_and_update().clone());
    info!(shard = %writer.shard, "kubernetes registry: listing");
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            // A paused registry was resumed: do the initial sync if everything is listed.
            changed = hold.changed(), if !writer.synced => {
                if changed.is_err() {
                    break;
                }
                writer.changed();
            }
            // The WorkloadEntries this cluster's Services select changed.
            changed = workload_entries.changed() => {
                if changed.is_ok() {
                    let next = workload_entries.borrow_and_update().clone();
                    writer.workload_entries(next);
                }
            }
            item = incoming.next() => match item {
                Some(Incoming::Service(e)) => writer.on_event(*e),
                Some(Incoming::Slice(e)) => writer.on_event(*e),
                Some(Incoming::Pod(e)) => writer.on_event(*e),
                Some(Incoming::Node(e)) => writer.on_event(*e),
                Some(Incoming::Namespace(e)) => writer.on_event(*e),
                None => break,
            },
        }
    }
    debug!(shard = %writer.shard, "kubernetes registry: stopped");
}

/// An object seen during a (re)list: its key and its update, `None` when it could
/// not be converted (the previous version, if any, is kept).
type Listed = (ObjectKey, Option<Update>);

struct Writer {
    state: ClusterState,
    registry: Arc<KubeRegistry>,
    sink: UpdateSink,
    shard: ShardKey,
    /// Per kind: objects buffered since `Init`, applied at `InitDone` so that a relist
    /// replaces the kind atomically (and deletes what it no longer lists).
    listing: [Option<Vec<Listed>>; 5],
    /// Per kind: the first list completed.
    listed: [bool; 5],
    synced: bool,
    /// The network gateways last announced; a change forces a full push.
    gateways: Vec<NetworkGateway>,
}

impl Writer {
    fn new(registry: Arc<KubeRegistry>, sink: UpdateSink) -> Self {
        Writer {
            state: ClusterState::new(registry.config.clone()),
            shard: registry.shard_key(),
            registry,
            sink,
            listing: Default::default(),
            listed: [false; 5],
            synced: false,
            gateways: Vec::new(),
        }
    }

    fn on_event<K: Watched>(&mut self, event: watcher::Result<Event<K>>) {
        let kind = K::KIND;
        let event = match event {
            Ok(event) => {
                self.registry.set_stale(kind, false);
                event
            }
            Err(err) => {
                // The watcher retries by itself (resume, or relist after 410 Gone); the
                // backoff wrapper spaces the retries.
                self.registry.stats.count_watch_error(kind);
                self.registry.set_stale(kind, true);
                warn!(shard = %self.shard, %kind, "kubernetes watch: {err}");
                return;
            }
        };
        match event {
            Event::Init => {
                if self.listed[kind.index()] {
                    self.registry.stats.count_relist(kind);
                    info!(shard = %self.shard, %kind, "kubernetes watch: relisting");
                }
                self.listing[kind.index()] = Some(Vec::new());
            }
            Event::InitApply(obj) => {
                if let Some(listed) = self.convert(&obj) {
                    self.listing[kind.index()]
                        .get_or_insert_with(Vec::new)
                        .push(listed);
                }
            }
            Event::InitDone => {
                let listed = self.listing[kind.index()].take().unwrap_or_default();
                let seen: HashSet<&ObjectKey> = listed.iter().map(|(k, _)| k).collect();
                let gone: Vec<ObjectKey> = self
                    .state
                    .keys(kind)
                    .into_iter()
                    .filter(|k| !seen.contains(k))
                    .collect();
                for key in gone {
                    self.apply(kind, &key, Update::removal(kind, key.clone()));
                }
                for (key, update) in listed {
                    if let Some(update) = update {
                        self.apply(kind, &key, update);
                    }
                }
                self.listed[kind.index()] = true;
                self.changed();
            }
            Event::Apply(obj) => {
                if let Some((key, Some(update))) = self.convert(&obj) {
                    self.apply(kind, &key, update);
                    self.changed();
                }
            }
            Event::Delete(obj) => match ObjectKey::of(&obj) {
                Ok(key) => {
                    self.apply(kind, &key, Update::removal(kind, key.clone()));
                    self.changed();
                }
                Err(err) => self.conversion_error(kind, "<unnamed>", &err),
            },
        }
    }

    /// Converts one object; `None` when even its name is missing.
    fn convert<K: Watched>(&self, obj: &K) -> Option<Listed> {
        let key = match ObjectKey::of(obj) {
            Ok(key) => key,
            Err(err) => {
                self.conversion_error(K::KIND, "<unnamed>", &err);
                return None;
            }
        };
        match obj.update(key.clone(), &self.registry.config) {
            Ok(update) => Some((key, Some(update))),
            Err(err) => {
                self.conversion_error(K::KIND, &key.to_string(), &err);
                Some((key, None))
            }
        }
    }

    fn conversion_error(&self, kind: ResourceKind, object: &str, err: &ConversionError) {
        self.registry.stats.count_conversion_error(kind);
        warn!(shard = %self.shard, %kind, object, "skipping an object that cannot be converted: {err}");
    }

    fn apply(&mut self, kind: ResourceKind, key: &ObjectKey, update: Update) {
        let existed = self.state.contains(kind, key);
        let removes = matches!(
            &update,
            Update::Service(_, None)
                | Update::Slice(_, None)
                | Update::Pod(_, None)
                | Update::Node(_, None)
                | Update::Namespace(_, None)
        );
        let event = match (existed, removes) {
            (false, true) => return, // removing what was never held (a Failed pod)
            (true, true) => EventType::Delete,
            (false, false) => EventType::Add,
            (true, false) => EventType::Update,
        };
        self.registry.stats.count_event(kind, event);
        self.state.apply(update);
    }

    /// Applies a new set of WorkloadEntries (see `state::workload_entries`).
    fn workload_entries(&mut self, next: Arc<WorkloadEntrySet>) {
        self.state.set_workload_entries(next);
        self.changed();
    }

    /// After a change: before the first full sync nothing is told; at it, everything
    /// is; afterwards only what changed.
    fn changed(&mut self) {
        if !self.synced && !self.listed.iter().all(|l| *l) {
            self.update_gauges();
            return;
        }
        if !self.synced && self.registry.is_held() {
            // Started paused: keep applying changes, tell nobody until resumed.
            self.registry.set_phase(SyncPhase::Listed);
            self.update_gauges();
            return;
        }
        let first = !self.synced;
        self.synced = true;
        self.flush();
        if first {
            self.registry.synced.store(true, Ordering::SeqCst);
            self.registry.set_phase(SyncPhase::Synced);
            self.sink.synced(&self.shard);
            info!(
                shard = %self.shard,
                services = self.registry.view.load().services.len(),
                pods = self.state.count(ResourceKind::Pod),
                "kubernetes registry synced"
            );
        }
    }

    fn flush(&mut self) {
        let flush = self.state.flush();
        self.update_gauges();
        // Readers first, so whoever reacts to the push sees the new state.
        let view_changed = flush.view.is_some();
        if let Some(view) = flush.view {
            self.registry.view.store(view);
        }
        // Pods changed and no service's endpoints or definition did (whose pushes
        // rebuild the ambient workloads too).
        let only_pods = self.registry.config().ambient_workloads
            && flush.pods.is_some()
            && flush.endpoints.is_empty()
            && flush.changed.is_empty()
            && flush.deleted.is_empty();
        if let Some(pods) = flush.pods {
            self.registry.pods.store(pods);
        }
        for key in &flush.deleted {
            self.sink.service_deleted(&self.shard, key);
        }
        self.sink.services_changed(flush.changed);
        for (key, endpoints) in flush.endpoints {
            self.sink.update_endpoints(&self.shard, &key, endpoints);
        }
        if view_changed || flush.nodes_changed {
            self.announce_gateways();
        }
        // Every pod is an ambient workload, behind a Service or not: an endpoint-only
        // push naming no service rebuilds the ambient Address type.
        if only_pods {
            self.sink.push(PushRequest::workloads(&self.shard));
        }
        // A proxy running as a changed pod gets new labels and inbound config (Istio
        // pushes to that proxy; the request names the pods).
        let pods = self.registry.pods_changed(&flush.changed_pods);
        if !pods.is_empty() {
            debug!(shard = %self.shard, pods = pods.len(), "proxies' pods changed");
            self.sink
                .push(PushRequest::full(TriggerReason::Proxy, pods));
        }
    }

    /// Gateways come from services (labels, external addresses): when the set changes,
    /// every proxy's split-horizon EDS may change (weights scale with the gateway
    /// counts), so a forced full push follows (reason `networks`).
    fn announce_gateways(&mut self) {
        let gateways = self.registry.network_gateways();
        if gateways == self.gateways {
            return;
        }
        info!(shard = %self.shard, gateways = gateways.len(), "network gateways changed");
        self.gateways = gateways;
        let mut request = PushRequest::forced(TriggerReason::Networks);
        request
            .configs_updated
            .insert(ConfigKey::new(ConfigKind::MeshNetworks, "gateways", ""));
        self.sink.push(request);
    }

    fn update_gauges(&self) {
        for kind in ResourceKind::ALL {
            self.registry
                .stats
                .set_objects(kind, self.state.count(kind));
        }
        self.registry.stats.set_pending(self.state.pending_pods());
    }
}

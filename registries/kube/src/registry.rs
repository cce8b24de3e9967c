//! The read side of a Kubernetes registry: [`KubeRegistry`] (what the aggregate and the
//! debug/metrics code read, never waiting on the writer) and its counters.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use meshfed_registry::{
    ClusterId, ProviderId, Service, ServiceKey, ServiceRegistry, ShardKey, UpdateSink,
};
use tokio::task::JoinHandle;

use crate::config::{KubeRegistryConfig, Result};
use crate::convert::{ExternalAddress, KubeAttributes};
use crate::state::View;

/// How long after a watcher's last error the registry counts as stale (see
/// [`KubeRegistry`]'s `is_stale`): twice the longest retry backoff, plus margin.
pub const STALE_WINDOW: Duration = Duration::from_secs(65);

/// The kinds of object the registry watches.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub enum ResourceKind {
    /// `v1` Service.
    Service,
    /// `discovery.k8s.io/v1` EndpointSlice.
    EndpointSlice,
    /// `v1` Pod.
    Pod,
    /// `v1` Node.
    Node,
    /// `v1` Namespace.
    Namespace,
}

impl ResourceKind {
    /// Every kind, in a fixed order.
    pub const ALL: [ResourceKind; 5] = [
        ResourceKind::Service,
        ResourceKind::EndpointSlice,
        ResourceKind::Pod,
        ResourceKind::Node,
        ResourceKind::Namespace,
    ];

    /// The Kubernetes kind name (also the `type` label of Istio's
    /// `pilot_k8s_reg_events`).
    pub fn as_str(self) -> &'static str {
        match self {
            ResourceKind::Service => "Services",
            ResourceKind::EndpointSlice => "EndpointSlice",
            ResourceKind::Pod => "Pods",
            ResourceKind::Node => "Nodes",
            ResourceKind::Namespace => "Namespaces",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What happened to an object (the `event` label of `pilot_k8s_reg_events`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum EventType {
    /// A new object.
    Add,
    /// A changed object (or one seen again by a relist).
    Update,
    /// A removed object.
    Delete,
}

impl EventType {
    /// Every type, in a fixed order.
    pub const ALL: [EventType; 3] = [EventType::Add, EventType::Update, EventType::Delete];

    /// Istio's label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Add => "add",
            EventType::Update => "update",
            EventType::Delete => "delete",
        }
    }
}

/// Counters the writer task keeps, for the lead's metrics and for tests. Monotonic
/// unless named a gauge.
#[derive(Debug, Default)]
pub struct KubeStats {
    events: [[AtomicU64; 3]; 5],
    conversion_errors: [AtomicU64; 5],
    watch_errors: [AtomicU64; 5],
    relists: [AtomicU64; 5],
    objects: [AtomicU64; 5],
    endpoints_pending_pod: AtomicU64,
}

impl KubeStats {
    /// Objects of `kind` applied with `event` (initial lists included).
    pub fn events(&self, kind: ResourceKind, event: EventType) -> u64 {
        self.events[kind.index()][event as usize].load(Ordering::Relaxed)
    }

    /// Objects of `kind` skipped because they could not be converted.
    pub fn conversion_errors(&self, kind: ResourceKind) -> u64 {
        self.conversion_errors[kind.index()].load(Ordering::Relaxed)
    }

    /// Conversion errors over all kinds.
    pub fn total_conversion_errors(&self) -> u64 {
        ResourceKind::ALL
            .iter()
            .map(|k| self.conversion_errors(*k))
            .sum()
    }

    /// Errors the `kind` watcher reported (failed list or watch, `410 Gone`, dropped
    /// connection); each is retried with backoff.
    pub fn watch_errors(&self, kind: ResourceKind) -> u64 {
        self.watch_errors[kind.index()].load(Ordering::Relaxed)
    }

    /// Full relists of `kind` after the initial one (after `410 Gone`).
    pub fn relists(&self, kind: ResourceKind) -> u64 {
        self.relists[kind.index()].load(Ordering::Relaxed)
    }

    /// Gauge: objects of `kind` held in memory.
    pub fn objects(&self, kind: ResourceKind) -> u64 {
        self.objects[kind.index()].load(Ordering::Relaxed)
    }

    /// Gauge: endpoint addresses skipped because their pod is not known yet (Istio's
    /// `pilot_k8s_endpoints_pending_pod`).
    pub fn endpoints_pending_pod(&self) -> u64 {
        self.endpoints_pending_pod.load(Ordering::Relaxed)
    }

    pub(crate) fn count_event(&self, kind: ResourceKind, event: EventType) {
        self.events[kind.index()][event as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_conversion_error(&self, kind: ResourceKind) {
        self.conversion_errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_watch_error(&self, kind: ResourceKind) {
        self.watch_errors[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_relist(&self, kind: ResourceKind) {
        self.relists[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn set_objects(&self, kind: ResourceKind, n: usize) {
        self.objects[kind.index()].store(n as u64, Ordering::Relaxed);
    }

    pub(crate) fn set_pending(&self, n: usize) {
        self.endpoints_pending_pod
            .store(n as u64, Ordering::Relaxed);
    }
}

/// A Kubernetes cluster as a service registry. Cheap synchronous reads of the last
/// view the writer task published; the writer owns every watcher and all state.
pub struct KubeRegistry {
    pub(crate) config: Arc<KubeRegistryConfig>,
    shard: ShardKey,
    pub(crate) view: ArcSwap<View>,
    pub(crate) synced: AtomicBool,
    /// Per kind: when its watcher last reported an error (milliseconds since `epoch`,
    /// plus one), or 0 when its last word was an event.
    stale: [AtomicU64; 5],
    epoch: Instant,
    pub(crate) stats: Arc<KubeStats>,
}

impl fmt::Debug for KubeRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KubeRegistry")
            .field("shard", &self.shard)
            .field("services", &self.view.load().services.len())
            .field("synced", &self.has_synced())
            .field("stale", &self.is_stale())
            .finish()
    }
}

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
        config.validate()?;
        let shard = ShardKey::new(ProviderId::Kubernetes, config.cluster_id.clone());
        let registry = Arc::new(KubeRegistry {
            config: Arc::new(config),
            shard,
            view: ArcSwap::default(),
            synced: AtomicBool::new(false),
            stale: Default::default(),
            epoch: Instant::now(),
            stats: Arc::default(),
        });
        let task = tokio::spawn(crate::writer::run(client, registry.clone(), sink, shutdown));
        Ok((registry, task))
    }

    /// The configuration the registry runs with.
    pub fn config(&self) -> &KubeRegistryConfig {
        &self.config
    }

    /// The writer's counters.
    pub fn stats(&self) -> &Arc<KubeStats> {
        &self.stats
    }

    /// One published service.
    pub fn service(&self, key: &ServiceKey) -> Option<Arc<Service>> {
        self.view
            .load()
            .services
            .get(key)
            .map(|s| s.service.clone())
    }

    /// The Kubernetes attributes of a published service (type, selector, target and
    /// node ports, external name and addresses).
    pub fn attributes(&self, key: &ServiceKey) -> Option<Arc<KubeAttributes>> {
        self.view
            .load()
            .services
            .get(key)
            .map(|s| s.attributes.clone())
    }

    /// Where a published service is reachable from outside the cluster: LoadBalancer
    /// ingress IPs/hostnames and `spec.externalIPs` (for multi-network gateways).
    pub fn external_addresses(&self, key: &ServiceKey) -> Vec<ExternalAddress> {
        self.attributes(key)
            .map(|a| a.external_addresses.clone())
            .unwrap_or_default()
    }

    fn now_millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    pub(crate) fn set_stale(&self, kind: ResourceKind, stale: bool) {
        let value = if stale { self.now_millis() } else { 0 };
        self.stale[kind.index()].store(value, Ordering::Relaxed);
    }
}

impl ServiceRegistry for KubeRegistry {
    fn provider(&self) -> ProviderId {
        ProviderId::Kubernetes
    }

    fn cluster_id(&self) -> &ClusterId {
        &self.config.cluster_id
    }

    fn shard_key(&self) -> ShardKey {
        self.shard.clone()
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.view
            .load()
            .services
            .values()
            .map(|s| s.service.clone())
            .collect()
    }

    fn has_synced(&self) -> bool {
        self.synced.load(Ordering::SeqCst)
    }

    /// True while a watcher's last word was an error less than [`STALE_WINDOW`] ago. A
    /// watcher that keeps failing reports an error at every retry (at least every 30 s,
    /// the longest backoff); one that reconnected says nothing until its next event, so
    /// an old error alone no longer counts.
    fn is_stale(&self) -> bool {
        let now = self.now_millis();
        let window = u64::try_from(STALE_WINDOW.as_millis()).unwrap_or(u64::MAX);
        self.stale.iter().any(|s| {
            let since = s.load(Ordering::Relaxed);
            since != 0 && now.saturating_sub(since) < window
        })
    }
}

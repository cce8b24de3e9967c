//! The read side of a Kubernetes registry: [`KubeRegistry`] (what the aggregate and the
//! debug/metrics code read, never waiting on the writer) and its counters. A registry
//! is started, with its writer task, by `KubeRegistry::start` in the `writer` module.

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use meshfed_registry::{
    ClusterId, ConfigKey, ConfigKind, Endpoint, NetworkGateway, NetworkId, ProviderId, PushRequest,
    Service, ServiceKey, ServiceRegistry, ShardKey, TriggerReason, UpdateSink, WorkloadInstance,
    WorkloadLookup, WorkloadQuery,
};
use tokio::sync::watch;

use crate::config::KubeRegistryConfig;
use crate::convert::{ExternalAddress, KubeAttributes, LABEL_NETWORK};
pub use crate::resource_kind::ResourceKind;
use crate::state::{PodChange, PodView, View, find_workload, pod_workloads};

/// Service label naming the mTLS port of a gateway labelled with
/// `topology.istio.io/network` (default [`DEFAULT_GATEWAY_PORT`]).
pub const LABEL_GATEWAY_PORT: &str = "networking.istio.io/gatewayPort";
/// The east-west gateways' mTLS (auto-passthrough) port.
pub const DEFAULT_GATEWAY_PORT: u16 = 15443;

/// Where a registry is in its start-up.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub enum SyncPhase {
    /// Some kind has not been listed yet; nothing was told.
    Listing,
    /// Every kind has been listed, but the registry was started paused
    /// ([`KubeRegistry::start_paused`]) and tells nothing until [`KubeRegistry::resume`].
    Listed,
    /// Its view is published, its shard written and `synced` sent.
    Synced,
}

/// How long after a watcher's last error the registry counts as stale (see
/// [`KubeRegistry`]'s `is_stale`): twice the longest retry backoff, plus margin.
pub const STALE_WINDOW: Duration = Duration::from_secs(65);

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
    /// Pods by IP and their topology, for proxies' own workloads (shared with the
    /// [`FrozenWorkloads`] handed out, which compare it with the view they froze).
    pub(crate) pods: Arc<ArcSwap<PodView>>,
    /// IPs proxies have been looked up by: a later change to a pod at one of them is
    /// pushed, since a proxy there runs as that pod (or will, once its pod is seen).
    /// One entry per proxy IP; an IP is forgotten when the last pod holding it goes.
    proxy_ips: Arc<Mutex<HashSet<IpAddr>>>,
    /// The writer's sink, for the pushes [`FrozenWorkloads`] find missing.
    sink: UpdateSink,
    pub(crate) synced: AtomicBool,
    /// Per kind: when its watcher last reported an error (milliseconds since `epoch`,
    /// plus one), or 0 when its last word was an event.
    stale: [AtomicU64; 5],
    epoch: Instant,
    pub(crate) stats: Arc<KubeStats>,
    /// Start-up progress, for [`KubeRegistry::wait_for`].
    phase: watch::Sender<SyncPhase>,
    /// True while the registry holds back its initial sync.
    pub(crate) hold: watch::Sender<bool>,
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
    /// The read side alone, with nothing published yet (the writer, or a test, feeds it).
    pub(crate) fn new(config: KubeRegistryConfig, sink: UpdateSink, paused: bool) -> KubeRegistry {
        KubeRegistry {
            shard: ShardKey::new(ProviderId::Kubernetes, config.cluster_id.clone()),
            config: Arc::new(config),
            view: ArcSwap::default(),
            pods: Arc::default(),
            proxy_ips: Arc::default(),
            sink,
            synced: AtomicBool::new(false),
            stale: Default::default(),
            epoch: Instant::now(),
            stats: Arc::default(),
            phase: watch::Sender::new(SyncPhase::Listing),
            hold: watch::Sender::new(paused),
        }
    }

    /// Start-up progress.
    pub fn phase(&self) -> SyncPhase {
        *self.phase.borrow()
    }

    /// Waits until the registry has reached `phase` (or a later one).
    pub async fn wait_for(&self, phase: SyncPhase) {
        let mut rx = self.phase.subscribe();
        // The sender lives as long as `self`, so this cannot fail.
        let _ = rx.wait_for(|p| *p >= phase).await;
    }

    /// Lets a registry started with [`KubeRegistry::start_paused`] publish its view,
    /// write its shard and report synced (at once if it has listed everything, else
    /// when it has). No effect on a running registry.
    pub fn resume(&self) {
        self.hold.send_replace(false);
    }

    pub(crate) fn is_held(&self) -> bool {
        *self.hold.borrow()
    }

    pub(crate) fn set_phase(&self, phase: SyncPhase) {
        self.phase.send_if_modified(|p| {
            let changed = *p != phase;
            *p = phase;
            changed
        });
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

    /// The config keys of the pods in `changes` a proxy may run as (one was looked up
    /// at their IPs), for a push; forgets the IPs no pod holds any more. Called by the
    /// writer after it published the pod view: a proxy looked up before that is in
    /// the set; one looked up after sees the new pods, or, in a view frozen before
    /// them, pushes the difference itself ([`FrozenWorkloads`]).
    pub(crate) fn pods_changed(&self, changes: &[PodChange]) -> Vec<ConfigKey> {
        if changes.is_empty() {
            return Vec::new();
        }
        let pods = self.pods.load();
        let mut proxy_ips = self.proxy_ips.lock().expect("proxy ips poisoned");
        let mut keys = Vec::new();
        for change in changes {
            if change.now.iter().any(|ip| proxy_ips.contains(ip)) {
                keys.push(ConfigKey::new(
                    ConfigKind::Workload,
                    &change.key.name,
                    change.key.namespace.as_str(),
                ));
            }
            for ip in &change.before {
                if pods.pods.get(ip).is_empty() {
                    proxy_ips.remove(ip);
                }
            }
        }
        keys
    }

    fn now_millis(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
    }

    pub(crate) fn set_stale(&self, kind: ResourceKind, stale: bool) {
        let value = if stale { self.now_millis() } else { 0 };
        self.stale[kind.index()].store(value, Ordering::Relaxed);
    }
}

/// A Kubernetes registry's workloads frozen by [`ServiceRegistry::workloads`]: the
/// service and pod views published at that moment (shared, never copied). A look-up
/// finds the proxy's pod by IP among the frozen pods (reference §2.8; see
/// `find_workload` for the rules); a proxy that names another cluster is not this
/// registry's.
///
/// A look-up also keeps the race protection of `proxy_ips`: it records the proxy's
/// IPs, so that a later pod change there is pushed by the writer (`pods_changed`). That
/// alone no longer suffices with a frozen view: the writer may have published newer
/// pods after the freeze but before the IPs were recorded; its `pods_changed` then
/// found no proxy at them and pushed nothing, while this look-up answers from the older
/// pods, and the proxy would keep them until some unrelated push. So, once the IPs are
/// recorded, a look-up whose frozen pods are no longer the live ones (`Arc::ptr_eq`)
/// asks the live pods too (with the frozen services: a service change has its own
/// push); if they answer differently, it sends the push the writer would have sent,
/// `PushRequest::full(TriggerReason::Proxy, ..)` naming the pod(s) as
/// `ConfigKind::Workload` keys, into the writer's sink.
///
/// No change goes unpushed: the writer publishes pods (W1) before `pods_changed` takes
/// the `proxy_ips` lock (W2); a look-up records its IPs under that lock (L1) before it
/// loads the live pods (L2). If L1 precedes W2, the writer sees the IPs and pushes; if
/// W2 precedes L1, then W1 precedes L2, the look-up sees the new pods and pushes. Both
/// may push; pushes are merged by the debounce, so that costs little. The answer
/// returned is always the frozen one.
pub(crate) struct FrozenWorkloads {
    config: Arc<KubeRegistryConfig>,
    view: Arc<View>,
    pods: Arc<PodView>,
    // The registry's own (live) pod view, `proxy_ips` and sink.
    live_pods: Arc<ArcSwap<PodView>>,
    proxy_ips: Arc<Mutex<HashSet<IpAddr>>>,
    sink: UpdateSink,
}

impl fmt::Debug for FrozenWorkloads {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FrozenWorkloads")
            .field("cluster", &self.config.cluster_id)
            .field("services", &self.view.services.len())
            .finish()
    }
}

impl WorkloadLookup for FrozenWorkloads {
    /// Every pod as a workload, from the frozen pod view.
    fn every_workload(&self) -> Vec<Endpoint> {
        pod_workloads(&self.config, &self.pods)
    }

    fn find(&self, query: &WorkloadQuery<'_>) -> Option<WorkloadInstance> {
        if query.cluster.is_some_and(|c| *c != self.config.cluster_id) {
            return None;
        }
        self.proxy_ips
            .lock()
            .expect("proxy ips poisoned")
            .extend(query.ips.iter().copied());
        let found = find_workload(&self.config, &self.view, &self.pods, query);
        let live = self.live_pods.load();
        if !Arc::ptr_eq(&live, &self.pods) {
            let now = find_workload(&self.config, &self.view, &live, query);
            if now != found {
                let mut keys: Vec<ConfigKey> = [&found, &now]
                    .into_iter()
                    .flatten()
                    .map(|w| ConfigKey::new(ConfigKind::Workload, &w.name, w.namespace.as_str()))
                    .collect();
                keys.dedup();
                self.sink
                    .push(PushRequest::full(TriggerReason::Proxy, keys));
            }
        }
        found
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

    /// Gateways into the networks behind this cluster (reference §6.3):
    /// - services labelled `topology.istio.io/network=<net>` that listen on their mTLS
    ///   port ([`LABEL_GATEWAY_PORT`], default 15443), or list no port at all (then
    ///   that port is assumed): one gateway per external address;
    /// - the meshNetworks `registryServiceName` entries of the networks listing this
    ///   cluster under `fromRegistry` ([`KubeRegistryConfig::mesh_gateways`]): that
    ///   service's external addresses, with the port meshNetworks gives.
    ///
    /// External addresses are LoadBalancer ingress IPs and `spec.externalIPs`; ingress
    /// hostnames are not resolved, so they give no gateway. A NodePort service with the
    /// `traffic.istio.io/nodeSelector` annotation is reached instead at the
    /// `ExternalIP`s of the nodes it selects, its port mapped to the node port.
    fn external_addresses(&self, hostname: &str) -> Vec<String> {
        let view = self.view.load();
        view.services
            .iter()
            .filter(|(key, _)| key.hostname.as_str() == hostname)
            .flat_map(|(_, s)| s.attributes.external_addresses.iter())
            .map(|a| match a {
                ExternalAddress::Ip(ip) => ip.to_string(),
                ExternalAddress::Hostname(h) => h.clone(),
            })
            .collect()
    }

    fn network_gateways(&self) -> Vec<NetworkGateway> {
        let view = self.view.load();
        let pods = self.pods.load();
        let cluster = &self.config.cluster_id;
        // A NodePort gateway (Istio's `traffic.istio.io/nodeSelector`) is reached at
        // the ExternalIPs of the nodes it selects, on the node port of its port.
        let reach = |attributes: &crate::convert::KubeAttributes,
                     port: u16|
         -> (Vec<ExternalAddress>, u16) {
            let Some(selector) = &attributes.node_selector else {
                return (attributes.external_addresses.clone(), port);
            };
            let mut ips: Vec<std::net::IpAddr> = pods
                .nodes
                .values()
                .filter(|n| selector.iter().all(|(k, v)| n.labels.get(k) == Some(v)))
                .flat_map(|n| n.external_ips.iter().copied())
                .collect();
            ips.sort();
            ips.dedup();
            let port = attributes.node_ports.get(&port).copied().unwrap_or(port);
            (ips.into_iter().map(ExternalAddress::Ip).collect(), port)
        };
        let mut out = Vec::new();
        let mut push = |network: &NetworkId, addresses: &[ExternalAddress], port, source: &str| {
            for address in addresses {
                if let ExternalAddress::Ip(ip) = address {
                    out.push(NetworkGateway {
                        network: network.clone(),
                        cluster: cluster.clone(),
                        address: *ip,
                        port,
                        source: source.to_string(),
                    });
                }
            }
        };
        for converted in view.services.values() {
            let service = &converted.service;
            let Some(network) = service.labels.get(LABEL_NETWORK).filter(|n| !n.is_empty()) else {
                continue;
            };
            // A label that is not a number leaves the default, as in Istio.
            let port = service
                .labels
                .get(LABEL_GATEWAY_PORT)
                .and_then(|p| p.parse::<u16>().ok())
                .unwrap_or(DEFAULT_GATEWAY_PORT);
            // A service listing ports is a gateway only if one of them is the mTLS
            // port (or HBONE's 15008, for ambient clients, which meshfed does not
            // serve). One that lists none is a gateway on the mTLS port, as Istio's
            // `getGatewayDetails` defaults it without looking at the service's ports.
            if port == 0 || (!service.ports.is_empty() && service.port(port).is_none()) {
                continue;
            }
            let source = format!(
                "label {LABEL_NETWORK} on service {}/{}@{cluster}",
                service.namespace, converted.attributes.name
            );
            let (addresses, port) = reach(&converted.attributes, port);
            push(&NetworkId::new(network), &addresses, port, &source);
        }
        for wanted in self.config.mesh_gateways.for_cluster(cluster) {
            let found = view
                .services
                .iter()
                .find(|(key, _)| key.hostname.as_str() == wanted.hostname);
            if let Some((_, converted)) = found {
                let source = format!("registryServiceName {}@{cluster}", wanted.hostname);
                let (addresses, port) = reach(&converted.attributes, wanted.port);
                push(&wanted.network, &addresses, port, &source);
            }
        }
        out.sort();
        out.dedup();
        out
    }

    /// The published services and pods as they are now (`FrozenWorkloads`): `Arc`
    /// clones, no copying.
    fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
        Some(Arc::new(FrozenWorkloads {
            config: self.config.clone(),
            view: self.view.load_full(),
            pods: self.pods.load_full(),
            live_pods: self.pods.clone(),
            proxy_ips: self.proxy_ips.clone(),
            sink: self.sink.clone(),
        }))
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

#[cfg(all(test, feature = "test-support"))]
mod tests;

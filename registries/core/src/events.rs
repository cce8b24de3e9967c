//! The vocabulary registries and config stores use to tell the push pipeline what
//! changed, and the [`UpdateSink`] they say it through.
//!
//! A registry never calls into the serving side. It writes its endpoint shard into the
//! shared [`EndpointIndex`] and sends a [`PushRequest`] that says which keys changed and
//! whether the change is endpoint-only. Sync state is part of the same vocabulary
//! ([`RegistryEvent::Synced`]) so every adapter reports readiness the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::endpoints::{EndpointIndex, EndpointPush};
use crate::model::{Endpoint, ServiceKey, ShardKey};

/// The kind of object a [`ConfigKey`] names: a config kind (one variant per kind
/// declared in `config::kinds`, in the same order; the declaration names its variant,
/// so a kind without one does not compile), or a push key that names no config object.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub enum ConfigKind {
    /// Routing rules for hosts (sidecars and gateways).
    VirtualService,
    /// Traffic policy for a host.
    DestinationRule,
    /// The servers of a gateway proxy.
    Gateway,
    /// A ServiceEntry object; as a push key, also "a service (from any registry)
    /// changed": clusters and listeners may change.
    ServiceEntry,
    /// A workload outside Kubernetes (a VM).
    WorkloadEntry,
    /// The scope of sidecars' config.
    Sidecar,
    /// mTLS modes.
    PeerAuthentication,
    /// JWT validation.
    RequestAuthentication,
    /// Access control.
    AuthorizationPolicy,
    /// The template and readiness probe of workloads that register themselves.
    WorkloadGroup,
    /// Metrics, access logging and tracing of workloads.
    Telemetry,
    /// A Gateway API GatewayClass.
    GatewayClass,
    /// A Gateway API Gateway.
    KubernetesGateway,
    /// A Gateway API HTTPRoute.
    HTTPRoute,
    /// A Gateway API GRPCRoute.
    GRPCRoute,
    /// A Gateway API ReferenceGrant.
    ReferenceGrant,
    /// A Gateway API TCPRoute.
    TCPRoute,
    /// A Gateway API TLSRoute.
    TLSRoute,
    /// A Gateway API BackendTLSPolicy.
    BackendTLSPolicy,
    /// Patches to the generated Envoy configuration of the proxies it selects.
    EnvoyFilter,
    /// A WebAssembly filter of the workloads it selects (ECDS and the filter lists of
    /// their listeners).
    WasmPlugin,
    /// Only the endpoints of a service changed: EDS for that hostname only.
    Endpoints,
    /// The mesh-wide configuration.
    MeshConfig,
    /// meshNetworks or network gateways.
    MeshNetworks,
    /// A proxy's own workload changed (a pod's labels or addresses): the proxies
    /// running as it get new labels and inbound config. Name = the workload (pod) name.
    Workload,
    /// A Secret holding gateway credentials (SDS): only the proxies that requested it
    /// get a push, and only of secrets. Name and namespace are the Secret's.
    Secret,
}

/// Names one changed object: for services and endpoints the name is the hostname.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub struct ConfigKey {
    /// What kind of object.
    pub kind: ConfigKind,
    /// Object name (hostname for services/endpoints).
    pub name: Arc<str>,
    /// Namespace.
    pub namespace: Arc<str>,
}

impl ConfigKey {
    /// Builds a key.
    pub fn new(kind: ConfigKind, name: &str, namespace: &str) -> Self {
        Self {
            kind,
            name: Arc::from(name),
            namespace: Arc::from(namespace),
        }
    }

    /// The key for "this service changed".
    pub fn service(key: &ServiceKey) -> Self {
        Self::new(
            ConfigKind::ServiceEntry,
            key.hostname.as_str(),
            key.namespace.as_str(),
        )
    }

    /// The key for "this service's endpoints changed".
    pub fn endpoints(key: &ServiceKey) -> Self {
        Self::new(
            ConfigKind::Endpoints,
            key.hostname.as_str(),
            key.namespace.as_str(),
        )
    }
}

impl fmt::Display for ConfigKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}/{}/{}", self.kind, self.namespace, self.name)
    }
}

/// Why a push happened (Istio's `pilot_push_triggers` reasons).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Serialize)]
pub enum TriggerReason {
    Endpoint,
    Config,
    Service,
    Proxy,
    Global,
    Networks,
    Cluster,
    Debug,
    /// A Secret served over SDS changed.
    Secret,
    Unknown,
}

impl TriggerReason {
    /// The label value Istio uses.
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerReason::Endpoint => "endpoint",
            TriggerReason::Config => "config",
            TriggerReason::Service => "service",
            TriggerReason::Proxy => "proxy",
            TriggerReason::Global => "global",
            TriggerReason::Networks => "networks",
            TriggerReason::Cluster => "cluster",
            TriggerReason::Debug => "debug",
            TriggerReason::Secret => "secret",
            TriggerReason::Unknown => "unknown",
        }
    }
}

/// A request to push, merged by the debouncer and again per connection in the push
/// queue. `full == false` means only the endpoints of the hostnames in `configs_updated`
/// changed.
#[derive(Clone, Debug, PartialEq)]
pub struct PushRequest {
    /// Anything beyond endpoints changed: clusters/listeners/routes are regenerated.
    pub full: bool,
    /// Regenerate everything for everyone regardless of `configs_updated`.
    pub forced: bool,
    /// What changed. Empty with `full` means "everything may have changed".
    pub configs_updated: BTreeSet<ConfigKey>,
    /// How many times each reason was seen while merging.
    pub reasons: BTreeMap<TriggerReason, u32>,
    /// When the earliest merged change happened (convergence time starts here).
    pub start: Instant,
}

impl PushRequest {
    /// A full push for these keys.
    pub fn full(reason: TriggerReason, keys: impl IntoIterator<Item = ConfigKey>) -> Self {
        PushRequest {
            full: true,
            forced: false,
            configs_updated: keys.into_iter().collect(),
            reasons: BTreeMap::from([(reason, 1)]),
            start: Instant::now(),
        }
    }

    /// A forced full push (regenerate everything for everyone).
    pub fn forced(reason: TriggerReason) -> Self {
        PushRequest {
            forced: true,
            ..PushRequest::full(reason, [])
        }
    }

    /// An endpoint-only push for one service.
    pub fn endpoints(key: &ServiceKey) -> Self {
        PushRequest {
            full: false,
            forced: false,
            configs_updated: BTreeSet::from([ConfigKey::endpoints(key)]),
            reasons: BTreeMap::from([(TriggerReason::Endpoint, 1)]),
            start: Instant::now(),
        }
    }

    /// An endpoint-only push that names no service: workloads that back no service
    /// changed in the registry of `shard` (pods, WorkloadEntries). The ambient Address
    /// type, which holds every workload, is rebuilt; no service's EDS is touched (the
    /// key names the endpoints of no hostname: `Endpoints/<shard>/workloads`).
    pub fn workloads(shard: &ShardKey) -> Self {
        PushRequest {
            full: false,
            forced: false,
            configs_updated: BTreeSet::from([ConfigKey::new(
                ConfigKind::Endpoints,
                "workloads",
                &shard.to_string(),
            )]),
            reasons: BTreeMap::from([(TriggerReason::Endpoint, 1)]),
            start: Instant::now(),
        }
    }

    /// Folds a later request into this one: the union of changes, the earliest start.
    pub fn merge(&mut self, other: PushRequest) {
        self.full |= other.full;
        self.forced |= other.forced;
        self.configs_updated.extend(other.configs_updated);
        for (reason, n) in other.reasons {
            *self.reasons.entry(reason).or_default() += n;
        }
        self.start = self.start.min(other.start);
    }

    /// Hostnames whose endpoints or service changed (for partial EDS pushes).
    pub fn updated_hostnames(&self) -> impl Iterator<Item = &str> {
        self.configs_updated
            .iter()
            .filter(|k| matches!(k.kind, ConfigKind::Endpoints | ConfigKind::ServiceEntry))
            .map(|k| &*k.name)
    }

    /// True when only endpoints changed (no service or config object).
    pub fn is_endpoints_only(&self) -> bool {
        !self.full && !self.forced
    }
}

/// What registries and config stores send to the push pipeline.
#[derive(Clone, Debug)]
pub enum RegistryEvent {
    /// Something changed; push.
    Push(PushRequest),
    /// The registry behind this shard finished its initial sync.
    Synced(ShardKey),
}

/// The write side handed to every registry and config store when it starts.
///
/// Cheap to clone. Endpoint writes go straight to the shared index; the sink decides
/// the push type from what the index says changed.
#[derive(Clone, Debug)]
pub struct UpdateSink {
    index: Arc<EndpointIndex>,
    tx: mpsc::UnboundedSender<RegistryEvent>,
    /// Events sent so far, so a caller can wait until the pipeline has applied them.
    sent: Arc<AtomicU64>,
}

impl UpdateSink {
    /// A sink writing into `index` and announcing on a new channel, whose receiver is
    /// returned for the push pipeline.
    pub fn new(index: Arc<EndpointIndex>) -> (UpdateSink, mpsc::UnboundedReceiver<RegistryEvent>) {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            UpdateSink {
                index,
                tx,
                sent: Arc::default(),
            },
            rx,
        )
    }

    /// How many events this sink (and its clones) has sent.
    pub fn sent_events(&self) -> u64 {
        self.sent.load(Ordering::SeqCst)
    }

    /// The endpoint index this sink writes to.
    pub fn endpoint_index(&self) -> &Arc<EndpointIndex> {
        &self.index
    }

    /// Services were added or changed: full push.
    pub fn services_changed(&self, keys: impl IntoIterator<Item = ServiceKey>) {
        let keys: Vec<ConfigKey> = keys.into_iter().map(|k| ConfigKey::service(&k)).collect();
        if !keys.is_empty() {
            self.send(PushRequest::full(TriggerReason::Service, keys));
        }
    }

    /// A service was deleted from `shard`'s registry: its endpoints go and a full push
    /// follows.
    pub fn service_deleted(&self, shard: &ShardKey, key: &ServiceKey) {
        self.index.delete_service_shard(shard, key);
        self.send(PushRequest::full(
            TriggerReason::Service,
            [ConfigKey::service(key)],
        ));
    }

    /// Replaces `shard`'s endpoints for `key`, pushing only what the change needs.
    pub fn update_endpoints(&self, shard: &ShardKey, key: &ServiceKey, endpoints: Vec<Endpoint>) {
        match self.index.update(shard, key, endpoints) {
            EndpointPush::None => {}
            EndpointPush::Incremental => self.send(PushRequest::endpoints(key)),
            EndpointPush::Full => self.send(PushRequest::full(
                TriggerReason::Endpoint,
                [ConfigKey::service(key), ConfigKey::endpoints(key)],
            )),
        }
    }

    /// Config objects changed: full push.
    pub fn config_changed(&self, keys: impl IntoIterator<Item = ConfigKey>) {
        self.send(PushRequest::full(TriggerReason::Config, keys));
    }

    /// A whole registry went away: drop its shard everywhere and force a full push.
    pub fn registry_removed(&self, shard: &ShardKey) {
        self.index.remove_shard(shard);
        self.send(PushRequest::forced(TriggerReason::Cluster));
    }

    /// Sends an arbitrary push request.
    pub fn push(&self, request: PushRequest) {
        self.send(request);
    }

    /// The registry behind `shard` finished its initial sync.
    pub fn synced(&self, shard: &ShardKey) {
        // A closed channel means the server is shutting down; nothing to tell.
        if self.tx.send(RegistryEvent::Synced(shard.clone())).is_ok() {
            self.sent.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn send(&self, request: PushRequest) {
        if self.tx.send(RegistryEvent::Push(request)).is_ok() {
            self.sent.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ProviderId;

    #[tokio::test]
    async fn endpoint_writes_pick_the_push_type() {
        let (sink, mut rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let shard = ShardKey::new(ProviderId::Mock, "c1");
        let key = ServiceKey::new("a.ns.svc.cluster.local", "ns");
        let ep = Endpoint::new("10.0.0.1".parse().unwrap()).with_port("http", 80);
        sink.update_endpoints(&shard, &key, vec![ep.clone()]);
        let RegistryEvent::Push(first) = rx.recv().await.unwrap() else {
            panic!()
        };
        assert!(first.full);
        sink.update_endpoints(&shard, &key, vec![ep.clone()]);
        sink.update_endpoints(&shard, &key, vec![]);
        let RegistryEvent::Push(second) = rx.recv().await.unwrap() else {
            panic!()
        };
        assert!(second.is_endpoints_only());
        assert_eq!(
            second.updated_hostnames().collect::<Vec<_>>(),
            vec!["a.ns.svc.cluster.local"]
        );
        assert!(rx.try_recv().is_err(), "an unchanged write must not push");
    }

    #[test]
    fn merge_unions_and_keeps_the_earliest_start() {
        let key = ServiceKey::new("a", "ns");
        let mut a = PushRequest::endpoints(&key);
        let mut b = PushRequest::full(
            TriggerReason::Config,
            [ConfigKey::new(ConfigKind::VirtualService, "vs", "ns")],
        );
        b.start = a.start + std::time::Duration::from_secs(1);
        a.merge(b);
        assert!(a.full);
        assert_eq!(a.configs_updated.len(), 2);
        assert_eq!(a.reasons[&TriggerReason::Endpoint], 1);
        assert_eq!(a.reasons[&TriggerReason::Config], 1);
    }
}

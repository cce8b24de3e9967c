//! The push pipeline: registry events -> debounce -> a new immutable [`Snapshot`] ->
//! the push queues of the connections the push touches ([`PushTargets`], found
//! through the [`watch`] index for incremental pushes).

pub mod cache;
pub mod config_index;
pub mod config_object;
pub mod config_source;
pub mod debounce;
pub mod delegate;
pub mod jwks_table;
pub mod snapshot;
pub mod watch;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use futures::StreamExt;
use meshfed_registry::{
    Aggregate, ConfigKind, EndpointIndex, PushRequest, RegistryEvent, ServiceKey, TriggerReason,
};
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde::Serialize;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tracing::{debug, info};

use crate::drain::Shutdown;
use crate::mesh::MeshSettings;
use crate::metrics::{CounterByType, convergence_buckets, duration_buckets, type_label};
use crate::xds::deps::PushScope;
use debounce::{DebounceConfig, debounce};
use snapshot::Snapshot;

/// Push pipeline metrics (Istio names).
#[derive(Debug)]
pub struct PushMetrics {
    /// `pilot_debounce_time`: first event -> snapshot ready.
    pub debounce_time: Histogram,
    /// `pilot_pushcontext_init_seconds`: snapshot build time.
    pub init_time: Histogram,
    /// `pilot_services`: services in the merged view.
    pub services: Gauge,
    /// `pilot_push_triggers{type}`: pushes by reason.
    pub triggers: CounterByType,
    /// `pilot_inbound_updates{type}`: updates received (`eds`, `svc`, `config`).
    pub inbound_updates: CounterByType,
    /// `meshfed_registry_conflicts`: services shadowed or merged with a mismatch.
    pub conflicts: Gauge,
    /// `pilot_virt_services`: VirtualServices in force.
    pub virtual_services: Gauge,
    /// `meshfed_config_rejected`: config objects rejected (invalid) right now.
    pub config_rejected: Gauge,
    /// `meshfed_config_not_enforced`: valid config objects meshfed reads but does not
    /// fully apply yet (the security.istio.io kinds; see `validation::not_enforced`).
    pub config_not_enforced: Gauge,
}

impl PushMetrics {
    /// Creates and registers the metrics.
    pub fn new(registry: &mut Registry) -> Self {
        let m = PushMetrics {
            debounce_time: convergence_buckets(),
            init_time: duration_buckets(),
            services: Gauge::default(),
            triggers: CounterByType::default(),
            inbound_updates: CounterByType::default(),
            conflicts: Gauge::default(),
            virtual_services: Gauge::default(),
            config_rejected: Gauge::default(),
            config_not_enforced: Gauge::default(),
        };
        registry.register("pilot_debounce_time", "Delay in seconds between the first config enters debouncing and the merged push request is pushed into the push queue (includes snapshot build)", m.debounce_time.clone());
        registry.register(
            "pilot_pushcontext_init_seconds",
            "Total time in seconds to build a snapshot",
            m.init_time.clone(),
        );
        registry.register(
            "pilot_services",
            "Total services known to pilot",
            m.services.clone(),
        );
        registry.register(
            "pilot_push_triggers",
            "Total number of times a push was triggered, labeled by reason for the push",
            m.triggers.clone(),
        );
        registry.register(
            "pilot_inbound_updates",
            "Total number of updates received by pilot",
            m.inbound_updates.clone(),
        );
        registry.register("meshfed_registry_conflicts", "Services with the same hostname and namespace from several registries that were resolved by the merge policy", m.conflicts.clone());
        registry.register(
            "pilot_virt_services",
            "Total virtual services known to pilot",
            m.virtual_services.clone(),
        );
        registry.register(
            "meshfed_config_rejected",
            "Istio config objects rejected as invalid (see /debug/configz)",
            m.config_rejected.clone(),
        );
        registry.register(
            "meshfed_config_not_enforced",
            "Valid Istio config objects meshfed reads and validates but does not fully apply to proxies yet (see `meshfed validate` and the WARN log for each: RequestAuthentication on proxyless gRPC servers or with targetRef, AUDIT or CUSTOM AuthorizationPolicies on proxyless gRPC servers, CUSTOM naming no ext_authz provider)",
            m.config_not_enforced.clone(),
        );
        m
    }
}

/// Builds the config index from the current config stores (called on pushes that
/// touch config).
pub type ConfigSourceFn = Arc<dyn Fn(&MeshSettings) -> config_index::ConfigIndex + Send + Sync>;

/// One entry of the push history (`/debug/push_status`).
#[derive(Clone, Debug, Serialize)]
pub struct PushRecord {
    pub version: String,
    pub at: SystemTime,
    pub full: bool,
    pub forced: bool,
    pub reasons: Vec<(TriggerReason, u32)>,
    pub changes: Vec<String>,
    pub merged_events: u32,
    pub build_seconds: f64,
    pub connections: usize,
    /// The connections the push was queued on (the first [`PUSHED_IDS`], sorted).
    pub proxies: Vec<String>,
}

/// The connections a push is queued on: the ADS layer's live connections, behind a
/// trait so the pipeline knows nothing of streams.
pub trait PushTargets: Send + Sync + std::fmt::Debug {
    /// Queues the push of `scope` on every connection it touches (the watchers of a
    /// changed name for an incremental push); returns how many, with the first
    /// [`PUSHED_IDS`] of their ids, sorted.
    ///
    /// `moved` are the addresses whose endpoints an incremental push changed (see
    /// [`moved_addresses`]): a proxy at one of them may serve other service ports now,
    /// so it gets a full push of its own (Istio's full push for a proxy whose
    /// workload changed), and with it its inbound listeners and clusters.
    fn enqueue(&self, scope: &PushScope<'_>, moved: &HashSet<IpAddr>) -> Queued;
}

/// The addresses whose endpoints differ between `previous` and `next` in the services
/// whose endpoints `request` names: added, removed, or changed (ports, labels, health,
/// anything). A proxy at such an address may back other service ports than before;
/// its inbound listeners and clusters are built from them.
pub fn moved_addresses(
    previous: &Snapshot,
    next: &Snapshot,
    request: &PushRequest,
) -> HashSet<IpAddr> {
    let mut moved = HashSet::new();
    for key in request
        .configs_updated
        .iter()
        .filter(|k| matches!(k.kind, ConfigKind::Endpoints | ConfigKind::ServiceEntry))
    {
        let service = ServiceKey::new(&*key.name, &*key.namespace);
        let (before, after) = (previous.shards(&service), next.shards(&service));
        if let (Some(a), Some(b)) = (before, after)
            && Arc::ptr_eq(a, b)
        {
            continue;
        }
        let (before, after) = (by_address(before), by_address(after));
        for (address, eps) in &before {
            if after.get(address) != Some(eps) {
                moved.insert(*address);
            }
        }
        moved.extend(after.keys().filter(|a| !before.contains_key(*a)));
    }
    moved
}

/// Makes an endpoint-only push that changes a headless service's endpoints a full
/// push of that service, as Istio does: such a service's endpoints are its sidecars'
/// per-endpoint listeners and its name-table entry, not only its EDS.
pub fn promote_headless(request: &mut PushRequest, snapshot: &Snapshot) {
    if !request.is_endpoints_only() {
        return;
    }
    let headless: Vec<meshfed_registry::ConfigKey> = request
        .configs_updated
        .iter()
        .filter(|k| k.kind == ConfigKind::Endpoints)
        .map(|k| ServiceKey::new(&*k.name, &*k.namespace))
        .filter(|key| {
            snapshot
                .services()
                .get(key)
                .is_some_and(|s| s.resolution == meshfed_registry::Resolution::Passthrough)
        })
        .map(|key| meshfed_registry::ConfigKey::service(&key))
        .collect();
    if !headless.is_empty() {
        request.full = true;
        request.configs_updated.extend(headless);
    }
}

type ByAddress<'a> = BTreeMap<
    IpAddr,
    Vec<(
        &'a meshfed_registry::ShardKey,
        &'a meshfed_registry::Endpoint,
    )>,
>;

fn by_address(shards: Option<&Arc<meshfed_registry::EndpointShards>>) -> ByAddress<'_> {
    let mut map = ByAddress::new();
    for (shard, ep) in shards.iter().flat_map(|s| s.iter()) {
        map.entry(ep.address).or_default().push((shard, ep));
    }
    map
}

#[derive(Debug)]
struct SnapshotMetrics(Arc<ArcSwap<Snapshot>>);

impl prometheus_client::collector::Collector for SnapshotMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        // One walk over the cache for every family.
        let (conflicts, rejected) = self.0.load().findings();
        for (name, help) in snapshot::ConflictLog::GAUGES {
            let count = conflicts.count(name);
            let metric = encoder.encode_descriptor(
                name,
                help,
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            prometheus_client::metrics::gauge::ConstGauge::new(count as i64).encode(metric)?;
        }
        // `pilot_total_rejected_configs{type,name}`: the configs parts of which the
        // current snapshot's generated resources leave out.
        let mut family = encoder.encode_descriptor(
            "pilot_total_rejected_configs",
            "Total number of configs that Pilot had to reject or ignore (type gateway: Gateway servers dropped by the merge of a gateway's Gateways)",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        for ((kind, name), count) in rejected {
            let labels = [("type", kind), ("name", name.as_str())];
            prometheus_client::metrics::gauge::ConstGauge::new(count as i64)
                .encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

/// The connections one push was queued on.
#[derive(Clone, Debug, Default)]
pub struct Queued {
    /// How many.
    pub count: usize,
    /// The first [`PUSHED_IDS`] ids, sorted.
    pub ids: Vec<String>,
}

/// Builds snapshots and fans pushes out to connections.
pub struct Pipeline {
    aggregate: Arc<Aggregate>,
    endpoints: Arc<EndpointIndex>,
    snapshot: Arc<ArcSwap<Snapshot>>,
    connections: Arc<dyn PushTargets>,
    metrics: Arc<PushMetrics>,
    mesh: Arc<ArcSwap<MeshSettings>>,
    config: ConfigSourceFn,
    counter: AtomicU64,
    /// Held while a snapshot is built and swapped in: builds started from two tasks
    /// (the debounced events, the snapshot readiness waits for) never interleave, so
    /// a newer snapshot is never replaced by an older one.
    building: Mutex<()>,
    history: Mutex<VecDeque<PushRecord>>,
    /// Registry events fully applied (pushed or, for sync events, noted).
    applied: tokio::sync::watch::Sender<u64>,
}

const HISTORY: usize = 50;

/// How many connection ids a push record lists (the count is always complete).
pub const PUSHED_IDS: usize = 100;

impl std::fmt::Debug for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pipeline")
            .field("version", self.snapshot.load().version())
            .finish_non_exhaustive()
    }
}

impl Pipeline {
    /// A pipeline over these sources; the snapshot starts empty.
    pub fn new(
        aggregate: Arc<Aggregate>,
        endpoints: Arc<EndpointIndex>,
        connections: Arc<dyn PushTargets>,
        metrics: Arc<PushMetrics>,
        mesh: Arc<ArcSwap<MeshSettings>>,
        config: ConfigSourceFn,
    ) -> Self {
        Pipeline {
            aggregate,
            endpoints,
            snapshot: Arc::new(ArcSwap::from_pointee(Snapshot::empty())),
            connections,
            metrics,
            mesh,
            config,
            counter: AtomicU64::new(0),
            building: Mutex::default(),
            history: Mutex::default(),
            applied: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The current snapshot handle (shared with the ADS server).
    pub fn snapshot(&self) -> &Arc<ArcSwap<Snapshot>> {
        &self.snapshot
    }

    /// Registers the gauges read from the current snapshot on every scrape: Istio's
    /// `pilot_conflict_outbound_listener_*` (listeners where a service's chain was
    /// dropped while generating this snapshot's listeners).
    pub fn register_metrics(&self, registry: &mut Registry) {
        registry.register_collector(Box::new(SnapshotMetrics(self.snapshot.clone())));
    }

    /// The last pushes, newest first.
    pub fn history(&self) -> Vec<PushRecord> {
        self.history
            .lock()
            .expect("history poisoned")
            .iter()
            .rev()
            .cloned()
            .collect()
    }

    /// Waits until at least `events` registry events have been applied (see
    /// [`meshfed_registry::UpdateSink::sent_events`]): a sync point for tests and tools.
    pub async fn wait_applied(&self, events: u64) {
        let mut rx = self.applied.subscribe();
        let _ = rx.wait_for(|applied| *applied >= events).await;
    }

    /// Builds a new snapshot for `request`, swaps it in and queues the push on every
    /// connection.
    pub fn apply(&self, mut request: PushRequest, merged_events: u32) {
        let _building = self.building.lock().expect("pipeline poisoned");
        let started = Instant::now();
        let n = self.counter.fetch_add(1, Ordering::Relaxed) + 1;
        let previous = self.snapshot.load_full();
        promote_headless(&mut request, &previous);
        let scope = PushScope::new(&request);
        let next = Snapshot::build(
            &previous,
            &scope,
            &self.aggregate,
            &self.endpoints,
            self.mesh.load_full(),
            &*self.config,
            n,
        );
        let build_seconds = started.elapsed().as_secs_f64();
        self.metrics.init_time.observe(build_seconds);
        self.metrics
            .debounce_time
            .observe(request.start.elapsed().as_secs_f64());
        self.metrics
            .services
            .set(next.services().all().len() as i64);
        self.metrics
            .conflicts
            .set(next.services().conflicts().len() as i64);
        self.metrics
            .virtual_services
            .set(next.config().all_virtual_services().len() as i64);
        for reason in request.reasons.keys() {
            self.metrics
                .triggers
                .get_or_create(&type_label(reason.as_str()))
                .inc();
        }
        let version = next.version().to_string();
        let moved = if scope.is_incremental() {
            moved_addresses(&previous, &next, &request)
        } else {
            HashSet::new()
        };
        // Which proxies depend on the changed objects reads the new mesh's root
        // namespace (security policies of one namespace reach that namespace only) and
        // the changed policies' selectors, before and after.
        let selectors = policy_selectors(&request, &previous, &next);
        drop(previous);
        let scope = scope
            .with_root_namespace(&next.config().root_namespace)
            .with_policy_selectors(selectors);
        self.snapshot.store(Arc::new(next));
        let queued = self.connections.enqueue(&scope, &moved);
        let connections = queued.count;
        let proxies = queued.ids;
        debug!(%version, full = request.full, changes = request.configs_updated.len(), connections, "push");
        let record = PushRecord {
            version,
            at: SystemTime::now(),
            full: request.full,
            forced: request.forced,
            reasons: request.reasons.iter().map(|(r, n)| (*r, *n)).collect(),
            changes: request
                .configs_updated
                .iter()
                .map(ToString::to_string)
                .collect(),
            merged_events,
            build_seconds,
            connections,
            proxies,
        };
        let mut history = self.history.lock().expect("history poisoned");
        if history.len() == HISTORY {
            history.pop_front();
        }
        history.push_back(record);
        drop(history);
        self.applied.send_modify(|n| *n += u64::from(merged_events));
    }

    /// Runs until `events` closes or `shutdown` fires.
    pub async fn run(
        self: Arc<Self>,
        events: mpsc::UnboundedReceiver<RegistryEvent>,
        config: DebounceConfig,
        mut shutdown: Shutdown,
    ) {
        let metrics = self.metrics.clone();
        let pipeline = self.clone();
        let requests = UnboundedReceiverStream::new(events)
            .filter_map(move |event| {
                let request = match event {
                    RegistryEvent::Push(request) => {
                        let kind = if request.is_endpoints_only() {
                            "eds"
                        } else if request.reasons.contains_key(&TriggerReason::Config) {
                            "config"
                        } else {
                            "svc"
                        };
                        metrics
                            .inbound_updates
                            .get_or_create(&type_label(kind))
                            .inc();
                        Some(request)
                    }
                    RegistryEvent::Synced(shard) => {
                        info!(registry = %shard, "registry synced");
                        pipeline.applied.send_modify(|n| *n += 1);
                        None
                    }
                };
                std::future::ready(request)
            })
            .take_until(Box::pin(async move { shutdown.wait().await }));
        let pipeline = self.clone();
        debounce(requests, config, move |request, n| {
            pipeline.apply(request, n);
            std::future::ready(())
        })
        .await;
    }
}

/// The workload selectors of the security policies a push changes, in the previous
/// and the next snapshot (see [`crate::xds::deps::depends_on`]).
fn policy_selectors(
    request: &PushRequest,
    previous: &Snapshot,
    next: &Snapshot,
) -> std::collections::HashMap<meshfed_registry::ConfigKey, crate::xds::deps::PolicySelectors> {
    use meshfed_api::r#type::v1beta1::WorkloadSelector;
    fn labels(
        selector: Option<&WorkloadSelector>,
    ) -> Option<std::collections::BTreeMap<String, String>> {
        selector
            .map(|s| s.match_labels.clone())
            .filter(|l| !l.is_empty())
    }
    let mut out = std::collections::HashMap::new();
    let security = |k: &&meshfed_registry::ConfigKey| {
        matches!(
            k.kind,
            ConfigKind::PeerAuthentication
                | ConfigKind::RequestAuthentication
                | ConfigKind::AuthorizationPolicy
                | ConfigKind::Telemetry
                | ConfigKind::EnvoyFilter
                | ConfigKind::WasmPlugin
        )
    };
    // Only security policies and Telemetry have selectors that narrow a push (endpoint pushes name
    // thousands of other keys).
    for key in request.configs_updated.iter().filter(security) {
        let mut versions = Vec::new();
        for snapshot in [previous, next] {
            let config = snapshot.config();
            let found = |ns: &str, name: &str| &*key.namespace == ns && &*key.name == name;
            let selector = match key.kind {
                ConfigKind::PeerAuthentication => config
                    .peer_authentications()
                    .iter()
                    .find(|p| found(&p.namespace, &p.name))
                    .map(|p| labels(p.spec.selector.as_ref())),
                ConfigKind::RequestAuthentication => config
                    .request_authentications()
                    .iter()
                    .find(|p| found(&p.namespace, &p.name))
                    .map(|p| labels(p.spec.selector.as_ref())),
                ConfigKind::AuthorizationPolicy => config
                    .authorization_policies()
                    .iter()
                    .find(|p| found(&p.namespace, &p.name))
                    .map(|p| labels(p.spec.selector.as_ref())),
                ConfigKind::Telemetry => config
                    .telemetries()
                    .iter()
                    .find(|p| found(&p.namespace, &p.name))
                    .map(|p| labels(p.spec.selector.as_ref())),
                ConfigKind::EnvoyFilter => {
                    if let Some(p) = config
                        .envoy_filters()
                        .iter()
                        .find(|p| found(&p.namespace, &p.name))
                    {
                        versions.extend(crate::xds::deps::envoy_filter_selectors(
                            &p.spec,
                            &p.namespace,
                        ));
                    }
                    None
                }
                ConfigKind::WasmPlugin => {
                    if let Some(p) = config
                        .wasm_plugins()
                        .iter()
                        .find(|p| found(&p.namespace, &p.name))
                    {
                        versions.extend(crate::xds::deps::wasm_plugin_selectors(&p.spec));
                    }
                    None
                }
                _ => None,
            };
            versions.extend(selector);
        }
        // Under split horizon a PeerAuthentication also decides which remote endpoints
        // any client reaches through a gateway (EDS): it concerns every proxy, as one
        // without selector does.
        if key.kind == ConfigKind::PeerAuthentication
            && (previous.network_view().has_gateways() || next.network_view().has_gateways())
        {
            versions.push(None);
        }
        out.insert(key.clone(), versions);
    }
    out
}

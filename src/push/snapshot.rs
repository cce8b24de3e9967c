//! The immutable view every push is generated from.
//!
//! A [`Snapshot`] is built after each debounced change and swapped in atomically;
//! connections load the current one when they generate and never see a half-applied
//! change. It holds typed indexes, not a bag of public maps: generators ask it narrow
//! questions ("services visible to this proxy", "the service for this hostname as this
//! proxy resolves it", "the endpoint shards of this service", "the workload this proxy
//! runs as").

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::SystemTime;

use meshfed_registry::{
    Aggregate, ClusterId, Conflict, EndpointIndex, EndpointShards, Hostname, MergedServices,
    NetworkGateway, Service, ServiceKey, ShardKey, WorkloadInstance, WorkloadSources,
};

use crate::mesh::{MeshSettings, default_mesh_config};
use crate::model::proxy::Proxy;
use crate::networks::NetworkView;
use crate::push::cache::{CacheInput, ResourceCache};
use crate::push::config_index::{Config, ConfigIndex, MESH_GATEWAY};
use crate::xds::deps::PushScope;
use meshfed_api::networking::v1alpha3::VirtualService;

/// The endpoint shards of every service, as a snapshot holds them (shared with the
/// endpoint index until its next write).
pub use meshfed_registry::endpoints::EndpointMap;

/// Services after the aggregate's merge, indexed by hostname.
#[derive(Debug, Default)]
pub struct ServiceIndex {
    services: Vec<Arc<Service>>,
    by_hostname: HashMap<Hostname, Vec<usize>, foldhash::fast::RandomState>,
    sources: BTreeMap<ServiceKey, Vec<ShardKey>>,
    conflicts: Vec<Conflict>,
}

impl ServiceIndex {
    /// Indexes a merged view.
    pub fn new(merged: MergedServices) -> Self {
        let mut by_hostname: HashMap<Hostname, Vec<usize>, foldhash::fast::RandomState> =
            HashMap::default();
        for (i, s) in merged.services.iter().enumerate() {
            by_hostname.entry(s.hostname.clone()).or_default().push(i);
        }
        ServiceIndex {
            services: merged.services,
            by_hostname,
            sources: merged.sources,
            conflicts: merged.conflicts,
        }
    }

    /// Every service, sorted by `(hostname, namespace)`.
    pub fn all(&self) -> &[Arc<Service>] {
        &self.services
    }

    /// Services a proxy in `namespace` may see (exportTo).
    pub fn visible_to<'a>(
        &'a self,
        namespace: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        self.services
            .iter()
            .filter(move |s| s.export_to.visible_to(s.namespace.as_str(), namespace))
    }

    /// The service a proxy in `namespace` reaches under `hostname`: its own namespace's
    /// service if there is one, else the first visible one by namespace order.
    pub fn resolve(&self, hostname: &str, namespace: &str) -> Option<&Arc<Service>> {
        let candidates = self.by_hostname.get(hostname)?;
        let visible = candidates
            .iter()
            .map(|&i| &self.services[i])
            .filter(|s| s.export_to.visible_to(s.namespace.as_str(), namespace));
        let mut first = None;
        for s in visible {
            if s.namespace.as_str() == namespace {
                return Some(s);
            }
            first.get_or_insert(s);
        }
        first
    }

    /// Whether some namespace defines a service under `hostname`.
    pub fn has_hostname(&self, hostname: &str) -> bool {
        self.by_hostname
            .get(hostname)
            .is_some_and(|i| !i.is_empty())
    }

    /// The namespaces defining a service under `hostname`, whatever their exportTo
    /// (Istio's `ServiceIndex.HostnameAndNamespace`).
    pub fn namespaces_of(&self, hostname: &str) -> Vec<String> {
        self.by_hostname
            .get(hostname)
            .into_iter()
            .flatten()
            .map(|&i| self.services[i].namespace.to_string())
            .collect()
    }

    /// The service under exactly this key.
    pub fn get(&self, key: &ServiceKey) -> Option<&Arc<Service>> {
        self.by_hostname
            .get(key.hostname.as_str())?
            .iter()
            .map(|&i| &self.services[i])
            .find(|s| s.namespace == key.namespace)
    }

    /// Registries that contributed each key.
    pub fn sources(&self) -> &BTreeMap<ServiceKey, Vec<ShardKey>> {
        &self.sources
    }

    /// Merge conflicts.
    pub fn conflicts(&self) -> &[Conflict] {
        &self.conflicts
    }
}

/// Proxies' own workloads as a snapshot sees them: looked up in the registries' views
/// frozen when the snapshot was built ([`WorkloadSources`]), the first time a generator
/// asks, and kept so that every resource of one push agrees. Endpoint-only snapshots
/// share their predecessor's answers (endpoints do not change a proxy's pod); every
/// other snapshot asks its own frozen views again, which is how a changed pod (its
/// labels, the services selecting it) reaches its proxy: the registry pushes when a pod
/// a proxy was looked up by changes.
#[derive(Debug, Default)]
pub struct ProxyWorkloads {
    sources: WorkloadSources,
    /// Node id -> the answer and the rest of the query it answered; shared with the
    /// endpoint-only snapshots that follow. Asked once per proxy per push: foldhash,
    /// not SipHash, over the ~60-byte node ids.
    seen: Arc<Mutex<SeenWorkloads>>,
    /// Names `seen` for the proxies' own memo of their answer
    /// ([`crate::model::WorkloadMemo`]): the same for snapshots that keep answers.
    generation: u64,
}

/// Numbers the answer sets ([`ProxyWorkloads::generation`]).
static WORKLOAD_GENERATIONS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

type SeenWorkloads = HashMap<String, SeenWorkload, foldhash::fast::RandomState>;

#[derive(Debug)]
struct SeenWorkload {
    ips: Vec<IpAddr>,
    namespace: String,
    cluster: Option<ClusterId>,
    workload: Option<Arc<WorkloadInstance>>,
}

impl SeenWorkload {
    fn answers(&self, proxy: &Proxy) -> bool {
        self.ips == proxy.ip_addresses
            && self.namespace == proxy.namespace
            && self.cluster == proxy.cluster_id
    }
}

impl ProxyWorkloads {
    /// Looks workloads up in `sources`, afresh.
    pub fn new(sources: WorkloadSources) -> Self {
        ProxyWorkloads {
            sources,
            seen: Arc::default(),
            generation: WORKLOAD_GENERATIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }

    /// Looks workloads up in `sources`, keeping the answers found so far.
    pub fn keeping_answers(&self, sources: WorkloadSources) -> Self {
        ProxyWorkloads {
            sources,
            seen: self.seen.clone(),
            generation: self.generation,
        }
    }

    /// The workload `proxy` runs as, if a registry knows it.
    pub fn get(&self, proxy: &Proxy) -> Option<Arc<WorkloadInstance>> {
        if let Some(answer) = proxy.workload_memo.get(self.generation) {
            return answer;
        }
        let workload = self.look_up(proxy);
        proxy.workload_memo.set(self.generation, workload.clone());
        workload
    }

    /// [`ProxyWorkloads::get`] in the answers shared by the snapshots, or asked.
    fn look_up(&self, proxy: &Proxy) -> Option<Arc<WorkloadInstance>> {
        let seen = |map: &SeenWorkloads| {
            map.get(&proxy.node_id)
                .filter(|s| s.answers(proxy))
                .map(|s| s.workload.clone())
        };
        if let Some(found) = seen(&self.seen.lock().expect("workloads poisoned")) {
            return found;
        }
        // Not under the lock: a registry look-up must not hold up other proxies.
        let workload = self.sources.find(&proxy.workload_query()).map(Arc::new);
        let mut map = self.seen.lock().expect("workloads poisoned");
        // Another generator of this proxy may have answered meanwhile: its answer stands.
        if let Some(found) = seen(&map) {
            return found;
        }
        map.insert(
            proxy.node_id.clone(),
            SeenWorkload {
                ips: proxy.ip_addresses.clone(),
                namespace: proxy.namespace.clone(),
                cluster: proxy.cluster_id.clone(),
                workload: workload.clone(),
            },
        );
        workload
    }
}

/// One immutable version of the mesh. Its fields are private: generators ask it
/// narrow, typed questions, and nothing in it changes after it is built.
#[derive(Debug)]
pub struct Snapshot {
    /// Push version, `"<RFC3339 time>/<counter>"` as Istio formats it.
    version: Arc<str>,
    /// Merged services.
    services: Arc<ServiceIndex>,
    /// Endpoint shards per service at snapshot time.
    endpoints: Arc<EndpointMap>,
    /// Gateways of every network.
    gateways: Arc<Vec<NetworkGateway>>,
    /// MeshConfig and meshNetworks in force.
    mesh: Arc<MeshSettings>,
    /// Istio config (VirtualService, DestinationRule, Gateway, Sidecar).
    config: Arc<ConfigIndex>,
    /// Encoded resources of this snapshot.
    cache: ResourceCache,
    /// Proxies' own workloads, as the registries knew them when it was built.
    workloads: ProxyWorkloads,
    /// When it was built.
    built_at: SystemTime,
    /// Endpoint address -> the services with an endpoint there, built on first use
    /// ([`Snapshot::services_at`]).
    by_address: OnceLock<HashMap<IpAddr, Vec<ServiceKey>>>,
    /// Split-horizon networks ([`Snapshot::network_view`]).
    network_view: OnceLock<Arc<NetworkView>>,
    /// Values the generators derive from the whole snapshot, once per snapshot, by
    /// type ([`Snapshot::derived`]).
    derived: Mutex<HashMap<std::any::TypeId, Arc<dyn std::any::Any + Send + Sync>>>,
}

/// The conflicts met while generating a snapshot's resources (Istio's push-context
/// `ProxyStatus`): per metric, the listeners where something was dropped, each with
/// the last message. Istio's gauges of the same names count the listeners. Read from
/// the findings of the values in the snapshot's cache ([`Snapshot::conflicts`]).
#[derive(Clone, Debug, Default)]
pub struct ConflictLog(BTreeMap<&'static str, BTreeMap<String, String>>);

impl ConflictLog {
    /// A service's TCP chain dropped because an older service's chain on the same
    /// listener matches the same traffic (Istio records every chain merge conflict
    /// under this name, whatever the protocols).
    pub const TCP_OVER_CURRENT_TCP: &'static str =
        "pilot_conflict_outbound_listener_tcp_over_current_tcp";
    /// Registered by Istio; its listener builder no longer records it (HTTP meeting
    /// TCP on a port is sniffed, not a conflict): always 0.
    pub const HTTP_OVER_CURRENT_TCP: &'static str =
        "pilot_conflict_outbound_listener_http_over_current_tcp";
    /// Registered by Istio, never recorded by its listener builder: always 0.
    pub const TCP_OVER_CURRENT_HTTP: &'static str =
        "pilot_conflict_outbound_listener_tcp_over_current_http";

    /// Every conflict gauge, with Istio's help text.
    pub const GAUGES: [(&'static str, &'static str); 3] = [
        (
            Self::HTTP_OVER_CURRENT_TCP,
            "Number of conflicting wildcard http listeners with current wildcard tcp listener.",
        ),
        (
            Self::TCP_OVER_CURRENT_HTTP,
            "Number of conflicting wildcard tcp listeners with current wildcard http listener.",
        ),
        (
            Self::TCP_OVER_CURRENT_TCP,
            "Number of conflicting tcp listeners with current tcp listener.",
        ),
    ];

    /// How many listeners had a conflict of kind `metric`.
    pub fn count(&self, metric: &str) -> usize {
        self.0.get(metric).map_or(0, BTreeMap::len)
    }

    /// Every conflict: metric -> listener -> message.
    pub fn all(&self) -> BTreeMap<&'static str, BTreeMap<String, String>> {
        self.0.clone()
    }
}

impl Snapshot {
    /// Push version, `"<RFC3339 time>/<counter>"`.
    pub fn version(&self) -> &Arc<str> {
        &self.version
    }

    /// Merged services.
    pub fn services(&self) -> &ServiceIndex {
        &self.services
    }

    /// The endpoint index itself: the same allocation as long as no endpoint changed.
    pub fn endpoint_index(&self) -> &Arc<EndpointMap> {
        &self.endpoints
    }

    /// Endpoint shards of every service.
    pub fn endpoints(&self) -> &EndpointMap {
        &self.endpoints
    }

    /// Gateways of every network.
    pub fn gateways(&self) -> &[NetworkGateway] {
        &self.gateways
    }

    /// MeshConfig and meshNetworks in force.
    pub fn mesh(&self) -> &MeshSettings {
        &self.mesh
    }

    /// Istio config in force.
    pub fn config(&self) -> &ConfigIndex {
        &self.config
    }

    /// The encoded resources of this snapshot (its figures; generators use
    /// [`Snapshot::cached`]).
    pub fn cache(&self) -> &ResourceCache {
        &self.cache
    }

    /// What `input` generates from this snapshot: from the cache, or generated by the
    /// input and cached. `None` when the input has no resource.
    pub fn cached<K: CacheInput<Snapshot>>(&self, input: K) -> Option<K::Output> {
        self.cache.get_or_insert(input, self)
    }

    /// When it was built.
    pub fn built_at(&self) -> SystemTime {
        self.built_at
    }

    /// An empty snapshot (before the first build).
    pub fn empty() -> Self {
        Snapshot {
            version: Arc::from(format_version(SystemTime::now(), 0)),
            services: Arc::default(),
            endpoints: Arc::default(),
            gateways: Arc::default(),
            mesh: Arc::new(MeshSettings {
                config: default_mesh_config(),
                ..Default::default()
            }),
            config: Arc::default(),
            cache: ResourceCache::default(),
            workloads: ProxyWorkloads::default(),
            built_at: SystemTime::now(),
            by_address: OnceLock::new(),
            network_view: OnceLock::new(),
            derived: Mutex::default(),
        }
    }

    /// Builds the snapshot that follows `previous` for `request`. An endpoint-only
    /// request, or one that only names proxies' workloads (pods), reuses the previous
    /// service index; anything else re-merges.
    pub fn build(
        previous: &Snapshot,
        scope: &PushScope<'_>,
        aggregate: &Aggregate,
        endpoints: &EndpointIndex,
        mesh: Arc<MeshSettings>,
        config: &dyn Fn(&MeshSettings) -> ConfigIndex,
        counter: u64,
    ) -> Snapshot {
        let (services, gateways) = if scope.remerges_services() {
            (
                Arc::new(ServiceIndex::new(aggregate.merged())),
                Arc::new(aggregate.network_gateways()),
            )
        } else {
            (previous.services.clone(), previous.gateways.clone())
        };
        // The Gateway API translation looks services up: a service it looked up that
        // appeared or went, or a gateway service whose external addresses changed,
        // rebuilds the config.
        let config = if scope.rebuilds_config()
            || (scope.remerges_services()
                && previous.config.gateway_api().stale(
                    |h| services.has_hostname(h),
                    |h| aggregate.external_addresses(h),
                )) {
            Arc::new(config(&mesh))
        } else {
            previous.config.clone()
        };
        let workloads = if scope.is_incremental() {
            previous
                .workloads
                .keeping_answers(aggregate.workload_sources())
        } else {
            ProxyWorkloads::new(aggregate.workload_sources())
        };
        let now = SystemTime::now();
        Snapshot {
            version: Arc::from(format_version(now, counter)),
            services,
            endpoints: endpoints.snapshot(),
            gateways,
            mesh,
            config,
            cache: previous.cache.carry_over(scope),
            workloads,
            built_at: now,
            by_address: OnceLock::new(),
            network_view: OnceLock::new(),
            derived: Mutex::default(),
        }
    }

    /// The conflicts met while generating the resources this snapshot's cache holds
    /// (they stand while those resources stand: a push that leaves sidecar listeners
    /// alone keeps them).
    pub fn conflicts(&self) -> ConflictLog {
        ConflictLog(self.cache.findings().conflicts)
    }

    /// The configs parts of which the resources in this snapshot's cache leave out
    /// (Gateway servers dropped by a router's merge, TLS matches of VirtualServices
    /// whose SNI names a gateway port already routes): `(type, name)` -> how many,
    /// summed over the distinct proxies' inputs that met them.
    pub fn rejected_configs(&self) -> BTreeMap<(&'static str, String), u64> {
        self.cache.findings().rejected
    }

    /// [`Snapshot::conflicts`] and [`Snapshot::rejected_configs`] from one walk over
    /// the cache (what a metrics scrape reads).
    pub fn findings(&self) -> (ConflictLog, BTreeMap<(&'static str, String), u64>) {
        let found = self.cache.findings();
        (ConflictLog(found.conflicts), found.rejected)
    }

    /// Upstream connect timeout (meshConfig `connectTimeout`).
    pub fn connect_timeout(&self) -> std::time::Duration {
        self.mesh
            .config
            .connect_timeout
            .and_then(|d| std::time::Duration::try_from(d).ok())
            .unwrap_or(std::time::Duration::from_secs(10))
    }

    /// Services a proxy may reach: exported to its namespace and, when a Sidecar scopes
    /// the proxy, matched by one of its egress hosts (`ns/dnsName` with `.`, `*` and
    /// `~` namespaces and `*` / `*.suffix` names).
    pub fn visible_services<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        // A Sidecar without egress listeners imports everything (`*/*`), as in Istio.
        self.services_imported(namespace, self.sidecar_imports(namespace, labels))
    }

    /// The services the route table of `port` of a sidecar in `namespace` with
    /// `labels` is built from: those of the Sidecar egress listener that serves the
    /// port ([`Snapshot::route_imports`]), not of every egress listener.
    pub fn route_services<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
        port: u16,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        self.services_imported(namespace, self.route_imports(namespace, labels, port))
    }

    /// The mesh VirtualServices the route table of `port` applies (see
    /// [`Snapshot::route_services`]).
    pub fn route_virtual_services<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
        port: u16,
    ) -> Vec<&'a Arc<Config<VirtualService>>> {
        self.virtual_services_imported(namespace, self.route_imports(namespace, labels, port))
    }

    fn services_imported<'a>(
        &'a self,
        namespace: &'a str,
        imports: Option<Vec<&'a str>>,
    ) -> impl Iterator<Item = &'a Arc<Service>> + 'a {
        self.services
            .visible_to(namespace)
            .filter(move |s| match &imports {
                None => true,
                Some(hosts) => hosts.iter().any(|h| egress_host_matches(h, namespace, s)),
            })
    }

    /// The egress listeners of the Sidecar scoping a proxy in `namespace` with
    /// `labels`; `None` without Sidecar or without egress listeners.
    fn sidecar_egress(
        &self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<&[meshfed_api::networking::v1alpha3::IstioEgressListener]> {
        self.config
            .sidecar_for(namespace, labels)
            .map(|sc| sc.spec.egress.as_slice())
            .filter(|egress| !egress.is_empty())
    }

    /// The egress `hosts` of the Sidecar egress listener whose route table is `port`
    /// (Istio's `GetEgressListenerForRDS`): in order, the first listener with that
    /// port, or the catch-all (no port) when it comes first; none (empty) when no
    /// listener serves the port. `None`: no Sidecar egress listeners, everything.
    fn route_imports<'a>(
        &'a self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
        port: u16,
    ) -> Option<Vec<&'a str>> {
        self.sidecar_egress(namespace, labels).map(|egress| {
            egress
                .iter()
                .find(|e| e.port.as_ref().is_none_or(|p| p.number == u32::from(port)))
                .map(|e| e.hosts.iter().map(String::as_str).collect())
                .unwrap_or_default()
        })
    }

    /// The egress `hosts` entries of the Sidecar of a proxy in `namespace` with
    /// `labels`; `None` imports everything (no Sidecar, or one without egress
    /// listeners: `*/*`, as in Istio).
    fn sidecar_imports<'a>(
        &'a self,
        namespace: &str,
        labels: &BTreeMap<String, String>,
    ) -> Option<Vec<&'a str>> {
        self.sidecar_egress(namespace, labels).map(|egress| {
            egress
                .iter()
                .flat_map(|e| e.hosts.iter().map(String::as_str))
                .collect()
        })
    }

    /// The mesh VirtualServices a sidecar in `namespace` with `labels` applies: those
    /// exported to it and, when its Sidecar has egress listeners, imported by one of
    /// their `hosts` (Istio's `selectVirtualServices`: the entry's namespace is the
    /// VirtualService's, `*`, or `.` for the proxy's own, and its host overlaps one of
    /// the VirtualService's hosts).
    pub fn sidecar_virtual_services<'a>(
        &'a self,
        namespace: &'a str,
        labels: &'a BTreeMap<String, String>,
    ) -> Vec<&'a Arc<Config<VirtualService>>> {
        self.virtual_services_imported(namespace, self.sidecar_imports(namespace, labels))
    }

    /// The mesh VirtualServices one Sidecar egress listener with these `hosts`
    /// imports (`None`: everything exported to the namespace).
    pub fn egress_virtual_services<'a>(
        &'a self,
        namespace: &'a str,
        hosts: Option<&'a [String]>,
    ) -> Vec<&'a Arc<Config<VirtualService>>> {
        self.virtual_services_imported(
            namespace,
            hosts.map(|h| h.iter().map(String::as_str).collect()),
        )
    }

    fn virtual_services_imported<'a>(
        &'a self,
        namespace: &'a str,
        imports: Option<Vec<&'a str>>,
    ) -> Vec<&'a Arc<Config<VirtualService>>> {
        self.config
            .virtual_services(namespace, MESH_GATEWAY)
            .filter(|vs| match &imports {
                None => true,
                Some(entries) => entries
                    .iter()
                    .any(|entry| egress_imports_virtual_service(entry, namespace, vs)),
            })
            .collect()
    }

    /// Networks and their gateways for split horizon, built once per snapshot.
    pub fn network_view(&self) -> &Arc<NetworkView> {
        self.network_view
            .get_or_init(|| Arc::new(NetworkView::new(&self.mesh.networks, &self.gateways)))
    }

    /// The value of type `T` derived from this snapshot, built by `build` on first use
    /// and shared afterwards (what upper layers compute from the whole snapshot: the
    /// ext_authz providers resolved against the services, the mTLS modes clients infer).
    /// Each use needs a type of its own. Two first uses at once may both build; one
    /// value is kept.
    pub fn derived<T: std::any::Any + Send + Sync>(
        &self,
        build: impl FnOnce(&Snapshot) -> T,
    ) -> Arc<T> {
        let id = std::any::TypeId::of::<T>();
        let found = self
            .derived
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned();
        let value = match found {
            Some(v) => v,
            // Built without the lock: `build` may read other derived values.
            None => {
                let built: Arc<dyn std::any::Any + Send + Sync> = Arc::new(build(self));
                self.derived
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(id)
                    .or_insert(built)
                    .clone()
            }
        };
        value.downcast::<T>().expect("keyed by its type")
    }

    /// The endpoint shards of a service.
    pub fn shards(&self, key: &ServiceKey) -> Option<&Arc<EndpointShards>> {
        self.endpoints.get(key)
    }

    /// The services with an endpoint at `address`, in no particular order. The index
    /// behind it is built once per snapshot, on first use: every proxy's instances are
    /// looked up by address, and scanning every endpoint of the mesh for each proxy
    /// was a fifth of the server's CPU while 2,000 sidecars connected.
    pub fn services_at(&self, address: &IpAddr) -> &[ServiceKey] {
        let index = self.by_address.get_or_init(|| {
            let mut index: HashMap<IpAddr, Vec<ServiceKey>> = HashMap::new();
            for (key, shards) in self.endpoints.iter() {
                for (_, ep) in shards.iter().filter(|(_, ep)| ep.has_address()) {
                    let keys = index.entry(ep.address).or_default();
                    if !keys.contains(key) {
                        keys.push(key.clone());
                    }
                }
            }
            index
        });
        index.get(address).map_or(&[], Vec::as_slice)
    }

    /// The workload `proxy` runs as, if a registry knows it (its pod on Kubernetes).
    pub fn workload(&self, proxy: &Proxy) -> Option<Arc<WorkloadInstance>> {
        self.workloads.get(proxy)
    }

    /// The workload `query` describes in this snapshot's frozen registry views, asked
    /// afresh (not kept): what the CA's node authorizer finds a caller's pod by.
    pub fn find_workload(
        &self,
        query: &meshfed_registry::WorkloadQuery<'_>,
    ) -> Option<WorkloadInstance> {
        self.workloads.sources.find(query)
    }

    /// Every workload the registries know, behind a service or not, with the shard of
    /// the registry that knows it (for the ambient Address type).
    pub fn every_workload(&self) -> Vec<(ShardKey, meshfed_registry::Endpoint)> {
        self.workloads.sources.every_workload()
    }

    /// `proxy` as generators see it in this snapshot: with its workload's labels and
    /// locality when a registry knows the workload ([`Proxy::with_workload`]), else as
    /// it connected.
    pub fn proxy_view<'a>(&self, proxy: &'a Proxy) -> Cow<'a, Proxy> {
        match self.workload(proxy) {
            Some(w)
                if proxy.labels != w.labels
                    || (!w.locality.is_empty() && proxy.locality != w.locality) =>
            {
                Cow::Owned(proxy.with_workload(&w))
            }
            _ => Cow::Borrowed(proxy),
        }
    }
}

/// Whether a Sidecar egress host `ns/dnsName` admits `service` for a proxy in
/// `proxy_ns`.
pub fn egress_host_matches(entry: &str, proxy_ns: &str, service: &Service) -> bool {
    egress_entry(entry, proxy_ns, service.namespace.as_str()).is_some_and(|host| {
        crate::push::config_index::host_matches(host, service.hostname.as_str())
    })
}

/// The host part of a Sidecar egress `hosts` entry (`ns/host`, no `/` meaning `*/`)
/// when its namespace part admits an object of `object_ns` for a proxy in
/// `proxy_ns` (`*` any, `.` the proxy's own, `~` none).
fn egress_entry<'e>(entry: &'e str, proxy_ns: &str, object_ns: &str) -> Option<&'e str> {
    let (ns, host) = entry.split_once('/').unwrap_or(("*", entry));
    let admitted = match ns {
        "*" => true,
        "~" => false,
        "." => object_ns == proxy_ns,
        other => object_ns == other,
    };
    admitted.then_some(host)
}

/// Whether a Sidecar egress `hosts` entry imports a VirtualService.
fn egress_imports_virtual_service(
    entry: &str,
    proxy_ns: &str,
    vs: &Config<VirtualService>,
) -> bool {
    egress_entry(entry, proxy_ns, vs.namespace.as_str()).is_some_and(|host| {
        vs.spec.hosts.iter().any(|h| {
            crate::push::config_index::host_matches(host, h)
                || crate::push::config_index::host_matches(h, host)
        })
    })
}

/// Istio's push version: RFC 3339 time (UTC, seconds) and a counter.
pub fn format_version(t: SystemTime, counter: u64) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z/{counter}",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian date (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use meshfed_registry::{ExportTo, ProviderId};

    use super::*;
    use crate::model::ProxyClass;
    use crate::xds::TypeUrl;

    #[test]
    fn conflicts_last_until_a_push_rebuilds_the_listeners() {
        use meshfed_registry::{
            Aggregate, ConfigKey, ConfigKind, EndpointIndex, PushRequest, ServiceKey, TriggerReason,
        };
        let aggregate = Aggregate::new("c1");
        let index = EndpointIndex::new();
        let build = |previous: &Snapshot, request: PushRequest| {
            Snapshot::build(
                previous,
                &PushScope::new(&request),
                &aggregate,
                &index,
                Arc::new(previous.mesh().clone()),
                &|_| ConfigIndex::default(),
                1,
            )
        };
        let first = build(
            &Snapshot::empty(),
            PushRequest::forced(TriggerReason::Global),
        );
        // A sidecar's listeners that met a conflict, as the cache holds them.
        #[derive(Clone, PartialEq, Eq, Hash, Debug)]
        struct SidecarListeners;
        impl CacheInput<Snapshot> for SidecarListeners {
            const TYPE: TypeUrl = TypeUrl::Listener;
            type Output = Arc<crate::push::cache::Findings>;
            fn class(&self) -> Option<ProxyClass> {
                Some(ProxyClass::Sidecar)
            }
            fn generate(&self, _: &Snapshot) -> Option<Self::Output> {
                let mut found = crate::push::cache::Findings::default();
                found
                    .conflicts
                    .entry(ConflictLog::TCP_OVER_CURRENT_TCP)
                    .or_default()
                    .insert("0.0.0.0_9000".into(), "x".into());
                Some(Arc::new(found))
            }
            fn findings(output: &Self::Output) -> Option<&crate::push::cache::Findings> {
                Some(output)
            }
        }
        first.cached(SidecarListeners);
        let key = ServiceKey::new("a.ns.svc.cluster.local", "ns");
        let endpoints_only = build(&first, PushRequest::endpoints(&key));
        assert_eq!(
            endpoints_only
                .conflicts()
                .count(ConflictLog::TCP_OVER_CURRENT_TCP),
            1,
            "listeners stand, so do their conflicts"
        );
        let rebuilt = build(
            &endpoints_only,
            PushRequest::full(
                TriggerReason::Config,
                [ConfigKey::new(ConfigKind::VirtualService, "r", "ns")],
            ),
        );
        assert_eq!(
            rebuilt.conflicts().count(ConflictLog::TCP_OVER_CURRENT_TCP),
            0,
            "met again as listeners are rebuilt"
        );
    }

    #[test]
    fn version_is_rfc3339_and_counter() {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_763_769_600 + 3_723);
        assert_eq!(format_version(t, 7), "2025-11-22T01:02:03Z/7");
        assert_eq!(
            format_version(SystemTime::UNIX_EPOCH, 0),
            "1970-01-01T00:00:00Z/0"
        );
    }

    #[test]
    fn resolve_prefers_own_namespace_and_honours_export_to() {
        let mk = |ns: &str, export: &[&str]| {
            let mut s = Service::new("api.example.com", ns, ProviderId::External, "c");
            s.export_to = ExportTo(export.iter().map(|s| s.to_string()).collect());
            Arc::new(s)
        };
        let merged = MergedServices {
            services: vec![mk("a", &[]), mk("b", &["."]), mk("c", &[])],
            ..Default::default()
        };
        let index = ServiceIndex::new(merged);
        assert_eq!(
            index
                .resolve("api.example.com", "b")
                .unwrap()
                .namespace
                .as_str(),
            "b"
        );
        assert_eq!(
            index
                .resolve("api.example.com", "c")
                .unwrap()
                .namespace
                .as_str(),
            "c"
        );
        assert_eq!(
            index
                .resolve("api.example.com", "z")
                .unwrap()
                .namespace
                .as_str(),
            "a"
        );
        assert_eq!(index.visible_to("z").count(), 2);
        assert!(index.resolve("nope", "a").is_none());
    }
}

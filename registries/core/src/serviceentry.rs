//! The ServiceEntry / WorkloadEntry registry (provider `External`, reference §4): Istio
//! ServiceEntries become services, their inline endpoints and the WorkloadEntries they
//! select become endpoints in this registry's shard.
//!
//! The registry reads ServiceEntry and WorkloadEntry objects from any number of
//! [`ConfigStore`]s (the in-memory store, the config directory, ...). [`convert`] is the
//! pure conversion; [`ServiceEntryRegistry::run`] follows the stores'
//! [`ConfigStore::changes`], converts again after every change and reports only what
//! differs: added or changed services (full push), deleted services, and the endpoints
//! of each `(hostname, namespace)` whose endpoints changed (EDS-only for STATIC
//! services; a full push for DNS services, whose endpoints live in CDS).
//!
//! Conversion, as Istio does it:
//! - one service per host, in the ServiceEntry's namespace; its `addresses` are this
//!   cluster's VIPs (a `/32` or `/128` CIDR is the plain IP; no address, no VIP);
//!   ports with the protocol of their `protocol` field; resolution NONE / STATIC / DNS /
//!   DNS_ROUND_ROBIN -> passthrough / client-side LB / DNS LB / DNS round robin;
//!   location (default MESH_EXTERNAL), `exportTo`, labels, `subjectAltNames` (service
//!   accounts) and creation time from the object;
//! - endpoints: the inline `endpoints`; or, with a `workloadSelector`, the
//!   WorkloadEntries of the same namespace whose labels (spec labels with metadata
//!   labels on top) are a superset of the selector's; or, for DNS and
//!   DNS_ROUND_ROBIN without either, one endpoint per host whose address is the host
//!   name. An endpoint's port for a service port is its own `ports[name]`, else the
//!   port's `targetPort`, else the port number. Network from `network` (else the
//!   `topology.istio.io/network` label), locality from `locality` (else the locality
//!   labels), weight, `serviceAccount` as `spiffe://<trust domain>/ns/<ns>/sa/<sa>`,
//!   TLS mode from the `security.istio.io/tlsMode` label, else `istio` with a service
//!   account, else `disabled`;
//! - host-name addresses are only served by DNS services (EDS needs IPs);
//! - several ServiceEntries with the same host in one namespace make one service: the
//!   oldest defines it, newer ones with the same resolution, labels and exportTo add
//!   the ports it lacks (Istio merges them in its SidecarScope), endpoints are
//!   concatenated in creation order (for
//!   DNS_ROUND_ROBIN only the first contributor of each port counts: Envoy's
//!   LOGICAL_DNS takes one endpoint).
//!
//! CIDR addresses wider than one host are kept as the service's `cluster_cidrs`
//! (masked), not as VIPs.
//!
//! Endpoints without an address (a WorkloadEntry naming only its network) are kept as
//! [`Endpoint::without_address`]: split-horizon EDS sends them as their network's
//! gateway to clients of other networks, and never as an IP.
//!
//! Not supported (left out, logged at debug level): `unix://` endpoint addresses and
//! NONE's passthrough target ports.
//!
//! A selected WorkloadEntry annotated `proxy.istio.io/health-checks-enabled: "true"`
//! is healthy only while its `Healthy` condition is `True`
//! ([`workload_entry_health`]); an unhealthy endpoint leaves EDS.
//!
//! Services without addresses get Istio's legacy auto-allocated addresses
//! ([`auto_allocation`]); proxies use them only when they ask (`DNS_AUTO_ALLOCATE` and
//! `DNS_CAPTURE` metadata).

pub mod auto_allocation;
mod conversion;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::Poll;
use std::time::Duration;

use meshfed_api::networking::v1alpha3 as net;
use net::service_entry::{Location, Resolution as SeResolution};
use tokio::sync::watch;

use crate::config::{ConfigObject, ConfigStore, Kind};
use crate::events::UpdateSink;
use crate::memory::ServiceWithEndpoints;
use crate::model::{
    ClusterId, Endpoint, ExportTo, Locality, MeshLocation, NetworkId, Port, Protocol, ProviderId,
    Resolution, Service, ServiceKey, ShardKey, TlsMode,
};
use crate::registry::{ServiceRegistry, WorkloadLookup, WorkloadQuery};

pub use crate::workload_instances::{ANNOTATION_HEALTH_CHECKS, workload_entry_health};
pub use conversion::{convert, entry_workloads};

/// The label that sets an endpoint's TLS mode (`istio` or `disabled`).
pub const LABEL_TLS_MODE: &str = "security.istio.io/tlsMode";
/// The label that names a workload's network when `network` is not set.
pub const LABEL_NETWORK: &str = "topology.istio.io/network";
/// The label that gives a workload's locality (`region/zone/subzone`) when `locality`
/// is not set.
pub const LABEL_LOCALITY: &str = "topology.istio.io/locality";
/// The legacy locality label (`region.zone.subzone`).
pub const LABEL_LOCALITY_LEGACY: &str = "istio-locality";

/// How often stores that cannot notify ([`ConfigStore::changes`] is `None`) are read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// What the conversion needs besides the objects.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceEntryConfig {
    /// meshfed's own cluster id: the VIPs' cluster and the shard's cluster.
    pub cluster_id: ClusterId,
    /// Trust domain of the SPIFFE identities (meshConfig `trustDomain`).
    pub trust_domain: String,
}

impl ServiceEntryConfig {
    /// The config for `cluster_id` with the default trust domain `cluster.local`.
    pub fn new(cluster_id: impl Into<ClusterId>) -> ServiceEntryConfig {
        ServiceEntryConfig {
            cluster_id: cluster_id.into(),
            trust_domain: "cluster.local".to_string(),
        }
    }
}

/// What one [`ServiceEntryRegistry::refresh`] reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Refresh {
    /// Services added or changed (announced as a full push).
    pub services_changed: Vec<ServiceKey>,
    /// Services removed.
    pub services_deleted: Vec<ServiceKey>,
    /// Services whose endpoints were written (added services included).
    pub endpoints_changed: Vec<ServiceKey>,
}

impl Refresh {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.services_changed.is_empty()
            && self.services_deleted.is_empty()
            && self.endpoints_changed.is_empty()
    }
}

type Content = BTreeMap<ServiceKey, (Arc<Service>, Vec<Endpoint>)>;

#[derive(Debug)]
struct Inner {
    config: ServiceEntryConfig,
    stores: Vec<Arc<dyn ConfigStore>>,
    sink: UpdateSink,
    shard: ShardKey,
    synced: AtomicBool,
    state: RwLock<Arc<Content>>,
    /// Every WorkloadEntry as a workload ([`entry_workloads`]), selected or not.
    entry_workloads: RwLock<Arc<Vec<Endpoint>>>,
    /// Serialises refreshes (the diff must see the state it replaces).
    refreshing: Mutex<()>,
    /// Where every refresh publishes the WorkloadEntries it read, for Kubernetes
    /// Services to select ([`crate::workload_instances`]).
    workload_feed: Option<crate::workload_instances::WorkloadEntryFeed>,
}

/// The ServiceEntry / WorkloadEntry registry. A cheap handle; clones share one
/// registry. [`ServiceEntryRegistry::run`] is its writer.
#[derive(Clone, Debug)]
pub struct ServiceEntryRegistry {
    inner: Arc<Inner>,
}

impl ServiceEntryRegistry {
    /// A registry over `stores`, reporting through `sink`. When every store has
    /// already synced, the objects they hold are converted at once and the registry
    /// is synced on return; otherwise [`ServiceEntryRegistry::run`] does that once
    /// they have.
    pub fn new(
        config: ServiceEntryConfig,
        stores: Vec<Arc<dyn ConfigStore>>,
        sink: UpdateSink,
    ) -> ServiceEntryRegistry {
        Self::with_workload_feed(config, stores, sink, None)
    }

    /// Like [`ServiceEntryRegistry::new`], and every refresh also publishes the
    /// WorkloadEntries it read to `feed` (for the Kubernetes registries' Services).
    pub fn with_workload_feed(
        config: ServiceEntryConfig,
        stores: Vec<Arc<dyn ConfigStore>>,
        sink: UpdateSink,
        feed: Option<crate::workload_instances::WorkloadEntryFeed>,
    ) -> ServiceEntryRegistry {
        let shard = ShardKey::new(ProviderId::External, config.cluster_id.clone());
        let registry = ServiceEntryRegistry {
            inner: Arc::new(Inner {
                config,
                stores,
                sink,
                shard,
                synced: AtomicBool::new(false),
                state: RwLock::new(Arc::default()),
                entry_workloads: RwLock::new(Arc::default()),
                refreshing: Mutex::new(()),
                workload_feed: feed,
            }),
        };
        registry.step();
        registry
    }

    /// The conversion settings.
    pub fn config(&self) -> &ServiceEntryConfig {
        &self.inner.config
    }

    /// The endpoints this registry currently serves for a service.
    pub fn endpoints(&self, key: &ServiceKey) -> Vec<Endpoint> {
        self.read()
            .get(key)
            .map(|(_, eps)| eps.clone())
            .unwrap_or_default()
    }

    /// Follows the stores until `shutdown` completes: converts again after every
    /// change and reports the differences. Marks the registry synced (and tells the
    /// sink) after the first conversion that follows the sync of every store.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut receivers: Vec<watch::Receiver<u64>> = self
            .inner
            .stores
            .iter()
            .filter_map(|s| s.changes())
            .collect();
        let poll = receivers.len() < self.inner.stores.len();
        let mut shutdown = std::pin::pin!(shutdown);
        loop {
            // Mark everything seen first, so a change made during the step wakes the
            // next round.
            for rx in &mut receivers {
                rx.borrow_and_update();
            }
            self.step();
            tokio::select! {
                () = &mut shutdown => return,
                () = next_change(&mut receivers) => {}
                () = tokio::time::sleep(POLL_INTERVAL), if poll => {}
            }
        }
    }

    /// Converts once and reports what changed since the last time, if the registry
    /// is synced or every store now is (then it becomes synced).
    fn step(&self) {
        if self.has_synced() {
            self.refresh();
        } else if self.inner.stores.iter().all(|s| s.has_synced()) {
            let refresh = self.refresh();
            self.inner.synced.store(true, Ordering::SeqCst);
            self.inner.sink.synced(&self.inner.shard);
            tracing::info!(
                services = self.read().len(),
                changed = refresh.services_changed.len(),
                "ServiceEntry registry synced"
            );
        }
    }

    /// Reads every store, converts and reports the differences to the current state
    /// through the sink: endpoints first (so a snapshot that sees a new service sees
    /// its endpoints), then changed services, then deleted ones.
    pub fn refresh(&self) -> Refresh {
        let _serial = self
            .inner
            .refreshing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let mut service_entries = Vec::new();
        let mut workload_entries = Vec::new();
        for store in &self.inner.stores {
            service_entries.extend(store.list(Kind::ServiceEntry));
            workload_entries.extend(store.list(Kind::WorkloadEntry));
        }
        if let Some(feed) = &self.inner.workload_feed {
            feed.publish(&workload_entries);
        }
        let next = convert(&service_entries, &workload_entries, &self.inner.config);
        let previous = self.read();
        let entries_changed = self.store_entry_workloads(&workload_entries);

        let mut refresh = Refresh::default();
        let mut content = Content::new();
        for (key, entry) in next {
            let ServiceWithEndpoints { service, endpoints } = entry;
            let dns = matches!(
                service.resolution,
                Resolution::DnsLb | Resolution::DnsRoundRobinLb
            );
            let service = match previous.get(&key) {
                None => {
                    refresh.services_changed.push(key.clone());
                    refresh.endpoints_changed.push(key.clone());
                    Arc::new(service)
                }
                Some((old_service, old_endpoints)) => {
                    let endpoints_changed = *old_endpoints != endpoints;
                    let service_changed = **old_service != service;
                    if endpoints_changed {
                        refresh.endpoints_changed.push(key.clone());
                    }
                    // DNS endpoints are inline in the clusters: a full push.
                    if service_changed || (endpoints_changed && dns) {
                        refresh.services_changed.push(key.clone());
                    }
                    if service_changed {
                        Arc::new(service)
                    } else {
                        old_service.clone()
                    }
                }
            };
            content.insert(key, (service, endpoints));
        }
        refresh.services_deleted = previous
            .keys()
            .filter(|k| !content.contains_key(*k))
            .cloned()
            .collect();
        let content = Arc::new(content);
        *self.inner.state.write().unwrap_or_else(|e| e.into_inner()) = content.clone();

        let sink = &self.inner.sink;
        for key in &refresh.endpoints_changed {
            sink.update_endpoints(&self.inner.shard, key, content[key].1.clone());
        }
        sink.services_changed(refresh.services_changed.iter().cloned());
        for key in &refresh.services_deleted {
            sink.service_deleted(&self.inner.shard, key);
        }
        if entries_changed && refresh.is_empty() {
            // WorkloadEntries that back no service change only the ambient workloads:
            // an endpoint-only push naming them (no service's EDS is touched). Any
            // other push of this refresh rebuilds them too.
            sink.push(crate::events::PushRequest::workloads(&self.inner.shard));
        }
        if !refresh.is_empty() {
            tracing::debug!(
                services = content.len(),
                changed = refresh.services_changed.len(),
                deleted = refresh.services_deleted.len(),
                endpoints_changed = refresh.endpoints_changed.len(),
                "ServiceEntry registry updated"
            );
        }
        refresh
    }

    /// Converts every WorkloadEntry into a workload and keeps the list; true when it
    /// differs from the one kept before.
    fn store_entry_workloads(&self, workload_entries: &[Arc<ConfigObject>]) -> bool {
        let next = entry_workloads(workload_entries, &self.inner.config);
        let mut kept = self
            .inner
            .entry_workloads
            .write()
            .unwrap_or_else(|e| e.into_inner());
        if **kept == next {
            return false;
        }
        *kept = Arc::new(next);
        true
    }

    fn read(&self) -> Arc<Content> {
        self.inner
            .state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

/// Waits until one of `receivers` sees a new value. Receivers whose store is gone are
/// dropped; with none left this never returns.
async fn next_change(receivers: &mut Vec<watch::Receiver<u64>>) {
    loop {
        if receivers.is_empty() {
            return std::future::pending().await;
        }
        let (index, result) = {
            let mut waits: Vec<_> = receivers
                .iter_mut()
                .map(|rx| Box::pin(rx.changed()))
                .collect();
            std::future::poll_fn(|cx| {
                for (i, wait) in waits.iter_mut().enumerate() {
                    if let Poll::Ready(result) = wait.as_mut().poll(cx) {
                        return Poll::Ready((i, result));
                    }
                }
                Poll::Pending
            })
            .await
        };
        match result {
            Ok(()) => return,
            Err(_) => {
                receivers.swap_remove(index);
            }
        }
    }
}

impl ServiceRegistry for ServiceEntryRegistry {
    fn provider(&self) -> ProviderId {
        ProviderId::External
    }

    fn cluster_id(&self) -> &ClusterId {
        &self.inner.config.cluster_id
    }

    fn shard_key(&self) -> ShardKey {
        self.inner.shard.clone()
    }

    fn services(&self) -> Vec<Arc<Service>> {
        self.read().values().map(|(s, _)| s.clone()).collect()
    }

    fn has_synced(&self) -> bool {
        self.inner.synced.load(Ordering::SeqCst)
    }

    /// The WorkloadEntries as they are now, for [`WorkloadLookup::every_workload`];
    /// proxies are not looked up here (`find` answers nothing).
    fn workloads(&self) -> Option<Arc<dyn WorkloadLookup>> {
        let entries = self
            .inner
            .entry_workloads
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        Some(Arc::new(EntryWorkloads(entries)))
    }
}

/// The WorkloadEntries of one moment, as workloads.
#[derive(Debug)]
struct EntryWorkloads(Arc<Vec<Endpoint>>);

impl WorkloadLookup for EntryWorkloads {
    fn find(&self, _: &WorkloadQuery<'_>) -> Option<crate::model::WorkloadInstance> {
        None
    }

    fn every_workload(&self) -> Vec<Endpoint> {
        (*self.0).clone()
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::config::MemoryConfigStore;
    use crate::endpoints::EndpointIndex;
    use crate::events::{ConfigKey, ConfigKind, RegistryEvent};
    use tokio::sync::mpsc::UnboundedReceiver;

    fn port(name: &str, number: u32, protocol: &str, target: u32) -> net::ServicePort {
        net::ServicePort {
            number,
            protocol: protocol.into(),
            name: name.into(),
            target_port: target,
        }
    }

    fn se(hosts: &[&str], resolution: SeResolution) -> net::ServiceEntry {
        net::ServiceEntry {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ports: vec![port("http", 80, "HTTP", 0)],
            resolution: resolution as i32,
            ..Default::default()
        }
    }

    fn we(address: &str) -> net::WorkloadEntry {
        net::WorkloadEntry {
            address: address.into(),
            ..Default::default()
        }
    }

    fn labelled(mut we: net::WorkloadEntry, labels: &[(&str, &str)]) -> net::WorkloadEntry {
        we.labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        we
    }

    fn selector(labels: &[(&str, &str)]) -> Option<net::WorkloadSelector> {
        Some(net::WorkloadSelector {
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        })
    }

    fn obj(ns: &str, name: &str, spec: impl Into<crate::config::Spec>) -> Arc<ConfigObject> {
        Arc::new(ConfigObject::new(ns, name, spec))
    }

    fn aged(obj: ConfigObject, secs: u64) -> Arc<ConfigObject> {
        Arc::new(ConfigObject {
            creation_time: UNIX_EPOCH + Duration::from_secs(secs),
            ..obj
        })
    }

    fn config() -> ServiceEntryConfig {
        ServiceEntryConfig {
            cluster_id: "c1".into(),
            trust_domain: "example.org".into(),
        }
    }

    fn one(
        ses: &[Arc<ConfigObject>],
        wes: &[Arc<ConfigObject>],
        host: &str,
        ns: &str,
    ) -> ServiceWithEndpoints {
        let mut all = convert(ses, wes, &config());
        all.remove(&ServiceKey::new(host, ns))
            .unwrap_or_else(|| panic!("no service {ns}/{host}"))
    }

    fn addresses(eps: &[Endpoint]) -> Vec<String> {
        eps.iter().map(Endpoint::connect_address).collect()
    }

    #[test]
    fn static_entries_become_client_side_lb_services_with_their_attributes() {
        let mut spec = se(
            &["api.example.com", "api2.example.com"],
            SeResolution::Static,
        );
        spec.addresses = vec![
            "240.0.0.1".into(),
            "2001:db8::1/128".into(),
            "10.0.0.0/16".into(),
        ];
        spec.ports.push(port("grpc", 9090, "gRPC", 0));
        spec.ports.push(port("other", 7000, "", 0));
        spec.location = Location::MeshInternal as i32;
        spec.export_to = vec![".".into()];
        spec.subject_alt_names = vec!["spiffe://example.org/ns/vm/sa/api".into()];
        spec.endpoints = vec![we("10.1.0.1")];
        let mut o = ConfigObject::new("vm", "api", spec);
        o.labels.insert("team".into(), "a".into());
        let created = UNIX_EPOCH + Duration::from_secs(42);
        o.creation_time = created;
        let all = convert(&[Arc::new(o)], &[], &config());
        assert_eq!(all.len(), 2, "one service per host");
        let s = &all[&ServiceKey::new("api.example.com", "vm")].service;
        assert_eq!(s.provider, ProviderId::External);
        assert_eq!(s.cluster_id.as_str(), "c1");
        assert_eq!(s.resolution, Resolution::ClientSideLb);
        assert_eq!(s.location, MeshLocation::MeshInternal);
        let vips: Vec<String> = s.cluster_vips[&ClusterId::new("c1")]
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(vips, ["240.0.0.1", "2001:db8::1"], "host CIDRs are IPs");
        assert_eq!(
            s.cluster_cidrs[&ClusterId::new("c1")],
            ["10.0.0.0/16"],
            "wider CIDRs are ranges"
        );
        let protocols: Vec<(u16, Protocol)> =
            s.ports.iter().map(|p| (p.port.get(), p.protocol)).collect();
        assert_eq!(
            protocols,
            [
                (80, Protocol::Http),
                (9090, Protocol::Grpc),
                (7000, Protocol::Unsupported)
            ]
        );
        assert_eq!(s.labels["team"], "a");
        assert!(s.export_to.0.contains("."));
        assert!(
            s.service_accounts
                .contains("spiffe://example.org/ns/vm/sa/api")
        );
        assert_eq!(s.creation_time, created);
        let other = &all[&ServiceKey::new("api2.example.com", "vm")];
        assert_eq!(addresses(&other.endpoints), ["10.1.0.1"]);
    }

    #[test]
    fn resolution_and_location_map_as_istio() {
        for (resolution, want) in [
            (SeResolution::None, Resolution::Passthrough),
            (SeResolution::Static, Resolution::ClientSideLb),
            (SeResolution::Dns, Resolution::DnsLb),
            (SeResolution::DnsRoundRobin, Resolution::DnsRoundRobinLb),
        ] {
            let got = one(
                &[obj("ns", "a", se(&["a.example.com"], resolution))],
                &[],
                "a.example.com",
                "ns",
            );
            assert_eq!(got.service.resolution, want, "{resolution:?}");
            assert_eq!(
                got.service.location,
                MeshLocation::MeshExternal,
                "MESH_EXTERNAL is the default"
            );
            assert!(got.service.cluster_vips.is_empty(), "no address, no VIP");
            let dns = matches!(resolution, SeResolution::Dns | SeResolution::DnsRoundRobin);
            assert_eq!(
                addresses(&got.endpoints),
                if dns { vec!["a.example.com"] } else { vec![] },
                "{resolution:?}: only DNS entries get synthetic endpoints"
            );
        }
    }

    #[test]
    fn entries_without_addresses_get_auto_allocated_ones() {
        let mut with_vip = se(&["vip.example.com"], SeResolution::Dns);
        with_vip.addresses = vec!["10.1.0.1".into()];
        let all = convert(
            &[
                obj("", "dns", se(&["foo.com", "*.wild.com"], SeResolution::Dns)),
                obj("ns", "none", se(&["none.example.com"], SeResolution::None)),
                obj("ns", "vip", with_vip),
            ],
            &[],
            &config(),
        );
        let foo = &all[&ServiceKey::new("foo.com", "")].service;
        assert_eq!(
            foo.auto_allocated_ipv4,
            Some("240.240.227.81".parse().unwrap())
        );
        assert_eq!(
            foo.auto_allocated_ipv6,
            Some("2001:2::f0f0:e351".parse().unwrap())
        );
        for host in ["*.wild.com", "none.example.com", "vip.example.com"] {
            let ns = if host == "*.wild.com" { "" } else { "ns" };
            let s = &all[&ServiceKey::new(host, ns)].service;
            assert_eq!(s.auto_allocated_ipv4, None, "{host}");
            assert_eq!(s.auto_allocated_ipv6, None, "{host}");
        }
    }

    #[test]
    fn dns_entries_without_endpoints_resolve_each_host() {
        let mut spec = se(&["a.example.com", "b.example.com"], SeResolution::Dns);
        spec.ports = vec![port("http", 80, "HTTP", 8080), port("tls", 443, "TLS", 0)];
        let all = convert(&[obj("ns", "ext", spec)], &[], &config());
        for host in ["a.example.com", "b.example.com"] {
            let eps = &all[&ServiceKey::new(host, "ns")].endpoints;
            assert_eq!(eps.len(), 1);
            let ep = &eps[0];
            assert_eq!(ep.hostname.as_ref().unwrap().as_str(), host);
            assert_eq!(ep.connect_address(), host);
            assert_eq!(ep.tls_mode, TlsMode::Disabled);
            assert_eq!(ep.cluster_id.as_str(), "c1");
            assert_eq!(
                ep.ports,
                BTreeMap::from([(Arc::from("http"), 8080), (Arc::from("tls"), 443)])
            );
        }

        // A DNS entry with a selector gets what it selects, never a synthetic endpoint.
        let mut spec = se(&["a.example.com"], SeResolution::Dns);
        spec.workload_selector = selector(&[("app", "a")]);
        let got = one(&[obj("ns", "ext", spec)], &[], "a.example.com", "ns");
        assert!(got.endpoints.is_empty());

        // Inline host-name endpoints are served by DNS entries.
        let mut spec = se(&["a.example.com"], SeResolution::Dns);
        spec.endpoints = vec![we("backend.example.net"), we("10.0.0.1")];
        let got = one(&[obj("ns", "ext", spec)], &[], "a.example.com", "ns");
        assert_eq!(
            addresses(&got.endpoints),
            ["backend.example.net", "10.0.0.1"]
        );
    }

    #[test]
    fn endpoint_ports_prefer_the_endpoint_then_target_port_then_the_port() {
        let mut spec = se(&["a.example.com"], SeResolution::Static);
        spec.ports = vec![
            port("http", 80, "HTTP", 8080),
            port("grpc", 90, "GRPC", 9090),
            port("tcp", 100, "TCP", 0),
        ];
        let mut e = we("10.0.0.1");
        e.ports = BTreeMap::from([("http".to_string(), 18080)]);
        spec.endpoints = vec![e];
        let got = one(&[obj("ns", "a", spec)], &[], "a.example.com", "ns");
        assert_eq!(
            got.endpoints[0].ports,
            BTreeMap::from([
                (Arc::from("http"), 18080),
                (Arc::from("grpc"), 9090),
                (Arc::from("tcp"), 100),
            ])
        );
    }

    #[test]
    fn selectors_take_supersets_in_the_same_namespace_only() {
        let mut spec = se(&["vm.example.com"], SeResolution::Static);
        spec.workload_selector = selector(&[("app", "vm")]);
        let wes = [
            obj(
                "ns",
                "b-match",
                labelled(we("10.0.0.2"), &[("app", "vm"), ("version", "v1")]),
            ),
            obj("ns", "a-match", labelled(we("10.0.0.1"), &[("app", "vm")])),
            obj(
                "ns",
                "other-app",
                labelled(we("10.0.0.3"), &[("app", "db")]),
            ),
            obj("ns", "no-labels", we("10.0.0.4")),
            obj(
                "elsewhere",
                "same-labels",
                labelled(we("10.0.0.5"), &[("app", "vm")]),
            ),
            // A host name is only selectable by DNS entries.
            obj(
                "ns",
                "by-name",
                labelled(we("vm.internal.example.com"), &[("app", "vm")]),
            ),
        ];
        let got = one(&[obj("ns", "vm", spec)], &wes, "vm.example.com", "ns");
        assert_eq!(
            addresses(&got.endpoints),
            ["10.0.0.1", "10.0.0.2"],
            "sorted by name"
        );
        assert_eq!(got.endpoints[1].labels["version"], "v1");

        // Metadata labels count too, and win over spec labels.
        let mut spec = se(&["vm.example.com"], SeResolution::Dns);
        spec.workload_selector = selector(&[("app", "vm")]);
        let mut meta = ConfigObject::new("ns", "meta", labelled(we("10.0.0.6"), &[("app", "db")]));
        meta.labels.insert("app".into(), "vm".into());
        let wes = [Arc::new(meta), wes[5].clone()];
        let got = one(&[obj("ns", "vm", spec)], &wes, "vm.example.com", "ns");
        assert_eq!(
            addresses(&got.endpoints),
            ["vm.internal.example.com", "10.0.0.6"],
            "a DNS entry selects host names too"
        );
    }

    #[test]
    fn workload_entries_carry_network_locality_weight_identity_and_tls_mode() {
        let mut spec = se(&["vm.example.com"], SeResolution::Static);
        spec.workload_selector = selector(&[("app", "vm")]);
        let full = net::WorkloadEntry {
            network: "vm-net".into(),
            locality: "r1/z1/s1".into(),
            weight: 5,
            service_account: "vm-sa".into(),
            ..labelled(we("10.0.0.1"), &[("app", "vm")])
        };
        let by_labels = labelled(
            we("10.0.0.2"),
            &[
                ("app", "vm"),
                (LABEL_NETWORK, "n2"),
                (LABEL_LOCALITY_LEGACY, "r2.z2"),
                (LABEL_TLS_MODE, "disabled"),
            ],
        );
        let forced_istio = labelled(
            we("10.0.0.3"),
            &[
                ("app", "vm"),
                (LABEL_TLS_MODE, "istio"),
                (LABEL_LOCALITY, "r3/z3"),
            ],
        );
        let sa_but_disabled = net::WorkloadEntry {
            service_account: "x".into(),
            ..labelled(
                we("10.0.0.4"),
                &[("app", "vm"), (LABEL_TLS_MODE, "disabled")],
            )
        };
        let wes = [
            obj("vm", "a", full),
            obj("vm", "b", by_labels),
            obj("vm", "c", forced_istio),
            obj("vm", "d", sa_but_disabled),
        ];
        let eps = one(&[obj("vm", "vm", spec)], &wes, "vm.example.com", "vm").endpoints;
        let a = &eps[0];
        assert_eq!(a.network.as_str(), "vm-net");
        assert_eq!(a.locality, Locality::parse("r1/z1/s1"));
        assert_eq!(a.weight, 5);
        assert_eq!(
            a.service_account.as_deref(),
            Some("spiffe://example.org/ns/vm/sa/vm-sa")
        );
        assert_eq!(a.tls_mode, TlsMode::Istio, "a service account means istio");
        assert_eq!(a.cluster_id.as_str(), "c1");
        let b = &eps[1];
        assert_eq!(b.network.as_str(), "n2");
        assert_eq!(b.locality, Locality::parse("r2/z2"));
        assert_eq!(b.weight, 1);
        assert_eq!(b.service_account, None);
        assert_eq!(b.tls_mode, TlsMode::Disabled);
        assert_eq!(eps[2].tls_mode, TlsMode::Istio, "the label says istio");
        assert_eq!(eps[2].locality, Locality::parse("r3/z3"));
        assert_eq!(eps[3].tls_mode, TlsMode::Disabled, "the label wins");
        assert!(eps[3].service_account.is_some());

        // Inline endpoints follow the same rules, in the entry's namespace.
        let mut spec = se(&["a.example.com"], SeResolution::Static);
        spec.endpoints = vec![net::WorkloadEntry {
            service_account: "inline".into(),
            ..we("10.0.0.9")
        }];
        let ep = &one(&[obj("ext", "a", spec)], &[], "a.example.com", "ext").endpoints[0];
        assert_eq!(
            ep.service_account.as_deref(),
            Some("spiffe://example.org/ns/ext/sa/inline")
        );
        assert_eq!(ep.tls_mode, TlsMode::Istio);
    }

    #[test]
    fn unservable_addresses_are_left_out() {
        let mut spec = se(&["a.example.com"], SeResolution::Static);
        spec.endpoints = vec![
            we("unix:///var/run/a.sock"),
            we("not-an-ip.example.com"),
            net::WorkloadEntry {
                network: "remote".into(),
                ..we("")
            },
            we("10.0.0.1"),
        ];
        let got = one(&[obj("ns", "a", spec)], &[], "a.example.com", "ns");
        let with_address: Vec<Endpoint> = got
            .endpoints
            .iter()
            .filter(|e| e.has_address())
            .cloned()
            .collect();
        assert_eq!(addresses(&with_address), ["10.0.0.1"]);
        // The entry naming only its network is kept, without an address: split
        // horizon sends it as its network's gateway.
        let without: Vec<&Endpoint> = got.endpoints.iter().filter(|e| !e.has_address()).collect();
        assert_eq!(without.len(), 1);
        assert_eq!(without[0].network.as_str(), "remote");
    }

    #[test]
    fn entries_for_the_same_host_concatenate_in_creation_order() {
        let mut old = se(&["a.example.com"], SeResolution::Static);
        old.endpoints = vec![we("10.0.0.1")];
        let mut new = se(&["a.example.com"], SeResolution::Static);
        new.endpoints = vec![we("10.0.0.2")];
        new.ports = vec![port("http", 80, "HTTP", 0), port("grpc", 90, "GRPC", 0)];
        // A newer DNS entry for the host: its host-name endpoint cannot join a STATIC
        // service.
        let dns = se(&["a.example.com"], SeResolution::Dns);
        let ses = [
            aged(ConfigObject::new("ns", "z-new", new), 20),
            aged(ConfigObject::new("ns", "dns", dns), 30),
            aged(ConfigObject::new("ns", "y-old", old), 10),
            // Another namespace is another service.
            aged(
                ConfigObject::new("other", "a", se(&["a.example.com"], SeResolution::Dns)),
                1,
            ),
        ];
        let all = convert(&ses, &[], &config());
        assert_eq!(all.len(), 2);
        let got = &all[&ServiceKey::new("a.example.com", "ns")];
        let ports: Vec<u16> = got.service.ports.iter().map(|p| p.port.get()).collect();
        assert_eq!(
            ports,
            [80, 90],
            "the oldest entry defines the service; a newer one of the same resolution \
             adds its other ports, one of another resolution nothing"
        );
        assert_eq!(
            got.service.creation_time,
            UNIX_EPOCH + Duration::from_secs(10)
        );
        assert_eq!(addresses(&got.endpoints), ["10.0.0.1", "10.0.0.2"]);

        // Equal creation times: by name.
        let same = [
            obj("ns", "b", {
                let mut s = se(&["a.example.com"], SeResolution::Static);
                s.endpoints = vec![we("10.0.0.2")];
                s
            }),
            obj("ns", "a", {
                let mut s = se(&["a.example.com"], SeResolution::Static);
                s.endpoints = vec![we("10.0.0.1")];
                s
            }),
        ];
        let got = one(&same, &[], "a.example.com", "ns");
        assert_eq!(addresses(&got.endpoints), ["10.0.0.1", "10.0.0.2"]);
    }

    /// TestServiceEntryDuplicatedHostname: two entries for one host each take a slot,
    /// and both (one service here) get the address of the slot walked first.
    #[test]
    fn entries_sharing_a_host_share_the_address_of_their_first_slot() {
        let entry = |name: &str, number: u32, protocol: &str| {
            let mut spec = se(&["istio.io"], SeResolution::Dns);
            spec.ports = vec![port(name, number, protocol, 0)];
            spec
        };
        let ses = [
            obj("default", "istio-http", entry("http", 80, "HTTP")),
            obj("default", "istio-https", entry("https", 443, "HTTPS")),
        ];
        let got = one(&ses, &[], "istio.io", "default");
        let ports: Vec<u16> = got.service.ports.iter().map(|p| p.port.get()).collect();
        assert_eq!(ports, [80, 443]);
        assert_eq!(
            got.service.auto_allocated_ipv4,
            Some("240.240.91.120".parse().unwrap()),
            "the second entry's slot (23324) comes before the first's (31277)"
        );
        // One entry alone keeps its own slot.
        let alone = one(&ses[..1], &[], "istio.io", "default");
        assert_eq!(
            alone.service.auto_allocated_ipv4,
            Some("240.240.122.168".parse().unwrap())
        );
    }

    #[test]
    fn dns_round_robin_takes_only_the_first_entry_per_port() {
        let first = se(&["a.example.com"], SeResolution::DnsRoundRobin);
        let mut second = se(&["a.example.com"], SeResolution::DnsRoundRobin);
        second.endpoints = vec![we("b.example.net")];
        second.ports = vec![port("http", 80, "HTTP", 0), port("grpc", 90, "GRPC", 0)];
        let ses = [
            aged(ConfigObject::new("ns", "second", second), 20),
            aged(ConfigObject::new("ns", "first", first), 10),
        ];
        let got = one(&ses, &[], "a.example.com", "ns");
        assert_eq!(
            addresses(&got.endpoints),
            ["a.example.com", "b.example.net"]
        );
        assert_eq!(
            got.endpoints[0]
                .ports
                .keys()
                .map(|k| &**k)
                .collect::<Vec<_>>(),
            ["http"]
        );
        assert_eq!(
            got.endpoints[1]
                .ports
                .keys()
                .map(|k| &**k)
                .collect::<Vec<_>>(),
            ["grpc"],
            "http is taken by the first entry"
        );
    }

    // ---------------------------------------------------------------------------
    // The registry: change handling and what it reports.

    struct Setup {
        store: MemoryConfigStore,
        registry: ServiceEntryRegistry,
        index: Arc<EndpointIndex>,
        rx: UnboundedReceiver<RegistryEvent>,
    }

    fn setup() -> Setup {
        let index = Arc::new(EndpointIndex::new());
        let (sink, rx) = UpdateSink::new(index.clone());
        let store = MemoryConfigStore::new(sink.clone());
        let registry = ServiceEntryRegistry::new(config(), vec![Arc::new(store.clone())], sink);
        Setup {
            store,
            registry,
            index,
            rx,
        }
    }

    /// (full, keys) of every push on the channel; whether a sync was announced.
    fn drain(rx: &mut UnboundedReceiver<RegistryEvent>) -> (Vec<(bool, Vec<String>)>, bool) {
        let mut pushes = Vec::new();
        let mut synced = false;
        while let Ok(event) = rx.try_recv() {
            match event {
                RegistryEvent::Push(r) => pushes.push((
                    r.full,
                    r.configs_updated.iter().map(ToString::to_string).collect(),
                )),
                RegistryEvent::Synced(shard) => {
                    assert_eq!(shard.to_string(), "External/c1");
                    synced = true;
                }
            }
        }
        (pushes, synced)
    }

    fn vm_entry(resolution: SeResolution) -> ConfigObject {
        let mut spec = se(&["vm.example.com"], resolution);
        spec.workload_selector = selector(&[("app", "vm")]);
        ConfigObject::new("vm", "vm", spec)
    }

    fn vm(name: &str, ip: &str, app: &str) -> ConfigObject {
        ConfigObject::new("vm", name, labelled(we(ip), &[("app", app)]))
    }

    fn key() -> ServiceKey {
        ServiceKey::new("vm.example.com", "vm")
    }

    #[test]
    fn every_workload_entry_is_a_workload_selected_or_not() {
        let Setup {
            store,
            registry,
            mut rx,
            ..
        } = setup();
        drain(&mut rx);
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        store.apply(vm("lone", "10.0.0.2", "other")).unwrap();
        registry.refresh();
        let (pushes, _) = drain(&mut rx);
        assert!(
            !pushes
                .iter()
                .any(|(_, keys)| keys.iter().any(|k| k.ends_with("/workloads"))),
            "the services' pushes carry the entries: {pushes:?}"
        );
        let frozen = registry.workloads().expect("entries as workloads");
        let mut every: Vec<(String, String, usize)> = frozen
            .every_workload()
            .iter()
            .map(|e| {
                let w = e.workload.as_deref().unwrap();
                (e.address.to_string(), w.uid.clone(), e.ports.len())
            })
            .collect();
        every.sort();
        assert_eq!(
            every,
            vec![
                (
                    "10.0.0.1".into(),
                    "c1/networking.istio.io/WorkloadEntry/vm/a".into(),
                    0
                ),
                (
                    "10.0.0.2".into(),
                    "c1/networking.istio.io/WorkloadEntry/vm/lone".into(),
                    0
                ),
            ]
        );
        // Proxies are not looked up here.
        assert!(
            frozen
                .find(&WorkloadQuery {
                    ips: &["10.0.0.2".parse().unwrap()],
                    id: "lone.vm",
                    namespace: "vm",
                    cluster: None,
                })
                .is_none()
        );
        // An entry no service selects changes: a push of its own.
        store.apply(vm("lone", "10.0.0.3", "other")).unwrap();
        registry.refresh();
        assert_eq!(
            drain(&mut rx).0,
            vec![(false, vec!["Endpoints/External/c1/workloads".to_string()])]
        );
        // Nothing changed: no push.
        registry.refresh();
        assert!(drain(&mut rx).0.is_empty());
    }

    #[test]
    fn synced_stores_sync_the_registry_at_once() {
        let Setup {
            registry, mut rx, ..
        } = setup();
        assert!(registry.has_synced());
        assert_eq!(registry.shard_key().to_string(), "External/c1");
        let (pushes, synced) = drain(&mut rx);
        assert!(synced);
        assert!(pushes.is_empty(), "nothing to push: {pushes:?}");

        // Unsynced stores hold it back until they sync.
        let (sink, mut rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let store = MemoryConfigStore::new_unsynced(sink.clone());
        let registry = ServiceEntryRegistry::new(config(), vec![Arc::new(store.clone())], sink);
        assert!(!registry.has_synced());
        store.mark_synced();
        registry.step();
        assert!(registry.has_synced());
        assert!(drain(&mut rx).1);
    }

    #[test]
    fn store_changes_of_entries_are_pushed_by_the_registry_only() {
        let Setup {
            store,
            registry,
            index,
            mut rx,
        } = setup();
        drain(&mut rx);
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        assert!(
            drain(&mut rx).0.is_empty(),
            "the store does not push ServiceEntries or WorkloadEntries"
        );

        let refresh = registry.refresh();
        assert_eq!(refresh.services_changed, [key()]);
        assert_eq!(refresh.endpoints_changed, [key()]);
        assert_eq!(registry.services().len(), 1);
        assert_eq!(addresses(&registry.endpoints(&key())), ["10.0.0.1"]);
        let shards = index.get(&key()).unwrap();
        assert_eq!(
            shards
                .shards
                .keys()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            ["External/c1"]
        );
        let (pushes, _) = drain(&mut rx);
        assert!(pushes.iter().all(|(full, _)| *full), "a new service: full");
        let keys: BTreeSet<&String> = pushes.iter().flat_map(|(_, k)| k).collect();
        assert!(
            keys.contains(&ConfigKey::service(&key()).to_string()),
            "{keys:?}"
        );

        // Nothing changed: nothing reported.
        assert!(registry.refresh().is_empty());
        assert!(drain(&mut rx).0.is_empty());
    }

    #[test]
    fn a_workload_entering_or_leaving_a_static_selection_is_an_eds_push() {
        let Setup {
            store,
            registry,
            mut rx,
            ..
        } = setup();
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        registry.refresh();
        drain(&mut rx);

        store.apply(vm("b", "10.0.0.2", "vm")).unwrap();
        let refresh = registry.refresh();
        assert!(refresh.services_changed.is_empty());
        assert_eq!(refresh.endpoints_changed, [key()]);
        let (pushes, _) = drain(&mut rx);
        assert_eq!(
            pushes,
            [(false, vec![ConfigKey::endpoints(&key()).to_string()])],
            "EDS only"
        );

        // Its label changes: out of the selection, again EDS only.
        store.apply(vm("b", "10.0.0.2", "db")).unwrap();
        registry.refresh();
        assert_eq!(addresses(&registry.endpoints(&key())), ["10.0.0.1"]);
        let (pushes, _) = drain(&mut rx);
        assert_eq!(pushes.len(), 1);
        assert!(!pushes[0].0);

        // A workload in another namespace is not selected.
        store
            .apply(ConfigObject::new(
                "other",
                "c",
                labelled(we("10.0.0.3"), &[("app", "vm")]),
            ))
            .unwrap();
        assert!(registry.refresh().is_empty());
    }

    #[test]
    fn dns_endpoint_changes_are_full_pushes_and_deletes_remove_the_shard() {
        let Setup {
            store,
            registry,
            index,
            mut rx,
        } = setup();
        store.apply(vm_entry(SeResolution::Dns)).unwrap();
        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        registry.refresh();
        drain(&mut rx);

        store.apply(vm("b", "vm-b.example.com", "vm")).unwrap();
        let refresh = registry.refresh();
        assert_eq!(
            refresh.services_changed,
            [key()],
            "DNS endpoints live in CDS"
        );
        let (pushes, _) = drain(&mut rx);
        assert!(pushes.iter().any(|(full, _)| *full), "{pushes:?}");

        // A changed service (resolution) is a full push.
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        let refresh = registry.refresh();
        assert_eq!(refresh.services_changed, [key()]);
        assert_eq!(
            addresses(&registry.endpoints(&key())),
            ["10.0.0.1"],
            "a STATIC service serves no host names"
        );

        assert!(store.delete(Kind::ServiceEntry, "vm", "vm"));
        let refresh = registry.refresh();
        assert_eq!(refresh.services_deleted, [key()]);
        assert!(registry.services().is_empty());
        assert!(!index.contains(&key()), "the shard went with the service");
        let (pushes, _) = drain(&mut rx);
        assert!(
            pushes
                .iter()
                .any(|(full, keys)| *full
                    && keys.contains(&ConfigKey::service(&key()).to_string()))
        );
        assert!(
            !pushes
                .iter()
                .flat_map(|(_, k)| k)
                .any(|k| k.starts_with(&format!("{:?}", ConfigKind::WorkloadEntry))),
            "{pushes:?}"
        );
    }

    #[test]
    fn unchanged_services_keep_their_arc() {
        let Setup {
            store, registry, ..
        } = setup();
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        registry.refresh();
        let before = registry.services()[0].clone();
        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        registry.refresh();
        assert!(Arc::ptr_eq(&before, &registry.services()[0]));
    }

    #[tokio::test]
    async fn run_follows_the_stores_and_syncs_after_them() {
        let (sink, mut rx) = UpdateSink::new(Arc::new(EndpointIndex::new()));
        let store = MemoryConfigStore::new_unsynced(sink.clone());
        let registry = ServiceEntryRegistry::new(config(), vec![Arc::new(store.clone())], sink);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(registry.clone().run(async {
            let _ = stopped.await;
        }));
        store.apply(vm_entry(SeResolution::Static)).unwrap();
        tokio::task::yield_now().await;
        assert!(!registry.has_synced(), "the store has not synced yet");

        store.mark_synced();
        let wait = Duration::from_secs(10);
        let synced = async {
            loop {
                match rx.recv().await.unwrap() {
                    RegistryEvent::Synced(_) => return,
                    RegistryEvent::Push(_) => {}
                }
            }
        };
        tokio::time::timeout(wait, synced).await.unwrap();
        assert!(registry.has_synced());
        assert_eq!(registry.services().len(), 1);

        store.apply(vm("a", "10.0.0.1", "vm")).unwrap();
        let pushed = async {
            loop {
                if let RegistryEvent::Push(r) = rx.recv().await.unwrap() {
                    return r;
                }
            }
        };
        let request = tokio::time::timeout(wait, pushed).await.unwrap();
        assert!(request.is_endpoints_only());
        assert_eq!(addresses(&registry.endpoints(&key())), ["10.0.0.1"]);

        stop.send(()).unwrap();
        tokio::time::timeout(wait, task).await.unwrap().unwrap();
    }
}

//! The clusters of a proxy, per snapshot, through the resource cache: the inputs (their
//! cache keys) and the look-ups that build them for a proxy.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use meshfed_api::networking::v1alpha3::{Sidecar, TrafficPolicy};
use meshfed_registry::{EndpointShards, Port, Protocol, ProviderId, Service, ServiceKey};

use super::super::destination_rule;
use super::super::instances::{self, ProxyInstance};
use super::inbound::*;
use super::outbound::*;
use super::special::*;
use crate::model::ProxyClass;
use crate::model::proxy::{NodeType, Proxy};
use crate::push::cache::CacheInput;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;
use crate::xds::names::{BLACK_HOLE, INBOUND_PASSTHROUGH, inbound_name};
use crate::xds::{EncodedResource, Resource, TypeUrl};

// ---------------------------------------------------------------------------------
// Per snapshot, through the resource cache

/// The input of an outbound cluster, and its cache key: the service port and subset,
/// the DestinationRule that applies for the client's namespace, what the cluster may
/// know of the client, and the endpoint shards it reads (the identities behind auto
/// mTLS; inline endpoints of DNS clusters), by identity.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct OutboundClusterInput {
    pub service: ServiceKey,
    pub port: u16,
    pub subset: String,
    /// The rule in force, `(namespace, name)`: the client's namespace decides it.
    pub rule: Option<(String, String)>,
    pub client: ClusterClient,
    pub shards: SharedShards,
    /// The SNI-DNAT twin (see [`OutboundRequest::sni_dnat`]).
    pub sni_dnat: bool,
    /// See [`OutboundRequest::peer_mtls_disabled`]: a PeerAuthentication change that
    /// turns it makes a new key.
    pub peer_mtls_disabled: bool,
}

/// Endpoint shards in a cache key, compared by identity: a changed shard is a new
/// allocation, and the key holds it so the address is never reused while it lives.
#[derive(Clone, Debug)]
pub struct SharedShards(pub Option<Arc<EndpointShards>>);

impl PartialEq for SharedShards {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => true,
            _ => false,
        }
    }
}

impl Eq for SharedShards {}

impl std::hash::Hash for SharedShards {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.as_ref().map(Arc::as_ptr).hash(state);
    }
}

impl CacheInput<Snapshot> for OutboundClusterInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(match self.client.node_type {
            NodeType::Router => ProxyClass::Router,
            _ => ProxyClass::Sidecar,
        })
    }
    fn service(&self) -> Option<&str> {
        Some(self.service.hostname.as_str())
    }
    /// Builds the cluster from this input and the snapshot's indexes alone.
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let service = snapshot.services().get(&self.service)?;
        let port = service.port(self.port)?;
        let rule = self
            .rule
            .as_ref()
            .and_then(|(ns, name)| snapshot.config().destination_rule_by_name(ns, name));
        let mut cluster = outbound_cluster_for(&OutboundRequest {
            service,
            port,
            shards: self.shards.0.as_deref(),
            rule: rule.map(|r| &**r),
            subset: &self.subset,
            mesh: &snapshot.mesh().config,
            client: &self.client,
            sni_dnat: self.sni_dnat,
            peer_mtls_disabled: self.peer_mtls_disabled,
        })?;
        // Istio's `applyMetadataExchange`: outbound clusters exchange peer metadata.
        cluster
            .filters
            .push(crate::generate::telemetry::upstream_metadata_exchange());
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            cluster.name.clone(),
            &cluster,
        ))
    }
}

/// The Envoy cluster `outbound|<port>|<subset>|<host>` for `proxy`, from the snapshot's
/// cache (see [`OutboundClusterInput`]). `None` when `subset` is not a subset of the
/// rule that applies.
pub fn cached_outbound(
    snapshot: &Snapshot,
    client: &ClientFacts,
    service: &Service,
    port: &Port,
    subset: &str,
) -> Option<Resource> {
    cached_outbound_as(snapshot, client, service, port, subset, false)
}

/// [`cached_outbound`], or its SNI-DNAT twin `outbound_.<port>_.<subset>_.<host>`.
pub fn cached_outbound_as(
    snapshot: &Snapshot,
    client: &ClientFacts,
    service: &Service,
    port: &Port,
    subset: &str,
    sni_dnat: bool,
) -> Option<Resource> {
    let host = service.hostname.as_str();
    let rule =
        snapshot
            .config()
            .destination_rule(&client.namespace, service.namespace.as_str(), host);
    if !subset.is_empty()
        && rule.is_none_or(|r| destination_rule::subset(&r.spec, subset).is_none())
    {
        return None;
    }
    let key = service.key();
    let shards = SharedShards(snapshot.shards(&key).cloned());
    let input = OutboundClusterInput {
        service: key,
        port: port.port.get(),
        subset: subset.to_string(),
        rule: rule.map(|r| (r.namespace.clone(), r.name.clone())),
        client: ClusterClient::for_client_under(
            client,
            service,
            rule.map(|r| &r.spec),
            &snapshot.mesh().config,
        ),
        shards,
        sni_dnat,
        peer_mtls_disabled: crate::generate::authn::inferred_namespace_mode(
            snapshot,
            service.namespace.as_str(),
        ) == crate::generate::authn::MtlsMode::Disable,
    };
    snapshot.cached(input)
}

/// A service port's clusters for `proxy`, added to `out`: the service-wide one, then
/// one per subset of the DestinationRule that applies, in the rule's order. (Added to
/// the caller's list: a sidecar's CDS visits every port of the mesh, and a list per
/// port would allocate on every cache hit.)
pub fn cached_service_clusters(
    snapshot: &Snapshot,
    client: &ClientFacts,
    service: &Service,
    port: &Port,
    out: &mut Vec<Resource>,
) {
    out.extend(cached_outbound(snapshot, client, service, port, ""));
    if let Some(rule) = snapshot.config().destination_rule(
        &client.namespace,
        service.namespace.as_str(),
        service.hostname.as_str(),
    ) {
        for subset in &rule.spec.subsets {
            out.extend(cached_outbound(
                snapshot,
                client,
                service,
                port,
                &subset.name,
            ));
        }
    }
}

/// The outbound clusters of every service a proxy sees (each port but UDP, each
/// subset), in order: the part of a wildcard CDS answer that does not depend on the
/// proxy's own instances, and its cache key. Each cluster comes from its own
/// [`OutboundClusterInput`]; the list is built once per distinct [`ClientFacts`] and
/// snapshot, so sidecars of one namespace and labels share one walk of the services
/// instead of a cache look-up per cluster each (half the server's CPU in an unscoped
/// reconnect storm of 20,000 sidecars).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct OutboundClustersInput {
    pub client: ClientFacts,
    /// The endpoint index the clusters were built from, by identity: the clusters hold
    /// the shards they read, so any endpoint change makes a new key.
    pub endpoints: SharedEndpoints,
}

/// A snapshot's endpoint index in a cache key, compared by identity (held, so the
/// address is never reused while the key lives).
#[derive(Clone, Debug)]
pub struct SharedEndpoints(pub Arc<meshfed_registry::endpoints::EndpointMap>);

impl PartialEq for SharedEndpoints {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for SharedEndpoints {}

impl std::hash::Hash for SharedEndpoints {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        Arc::as_ptr(&self.0).hash(state);
    }
}

impl OutboundClustersInput {
    /// The key of `client`'s outbound clusters in `snapshot`.
    pub fn new(snapshot: &Snapshot, client: ClientFacts) -> Self {
        OutboundClustersInput {
            client,
            endpoints: SharedEndpoints(snapshot.endpoint_index().clone()),
        }
    }
}

impl CacheInput<Snapshot> for OutboundClustersInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Arc<[Resource]>;
    fn class(&self) -> Option<ProxyClass> {
        Some(match self.client.node_type {
            NodeType::Router => ProxyClass::Router,
            _ => ProxyClass::Sidecar,
        })
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Arc<[Resource]>> {
        let mut out = Vec::new();
        for service in snapshot.visible_services(&self.client.namespace, &self.client.labels) {
            for port in &service.ports {
                if port.protocol != Protocol::Udp {
                    cached_service_clusters(snapshot, &self.client, service, port, &mut out);
                }
            }
        }
        Some(out.into())
    }
}

/// A sidecar's inbound clusters: one `inbound|<targetPort>||` per target port of its
/// own service instances (the first service claiming a port decides its protocol and
/// DestinationRule connection pool; a Sidecar `inboundConnectionPool` overrides the
/// rule's), then `InboundPassthroughCluster`.
pub fn cached_inbound(snapshot: &Snapshot, proxy: &Proxy) -> Vec<Resource> {
    let mut out = match instances::sidecar_ingress(snapshot, proxy) {
        Some(sidecar) => sidecar_ingress_clusters(snapshot, proxy, &sidecar),
        None => service_inbound_clusters(snapshot, proxy),
    };
    let (v4, v6) = ip_families(&proxy.ip_addresses);
    out.extend(snapshot.cached(InboundPassthroughInput { v4, v6 }));
    out
}

/// A Sidecar's ingress clusters: `inbound|<port>||` per ingress port (the first
/// listener of a port wins), to its `defaultEndpoint`, with the protocol of the
/// ingress port and the port's `connectionPool` (else the Sidecar's
/// `inboundConnectionPool`).
pub(super) fn sidecar_ingress_clusters(
    snapshot: &Snapshot,
    proxy: &Proxy,
    sidecar: &Config<Sidecar>,
) -> Vec<Resource> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    let instances = instances::proxy_instances(snapshot, proxy);
    for (index, ingress) in sidecar.spec.ingress.iter().enumerate() {
        let Some(number) = ingress
            .port
            .as_ref()
            .and_then(|p| u16::try_from(p.number).ok())
            .filter(|n| *n > 0)
        else {
            continue;
        };
        let Some(endpoint) = ingress_endpoint(&ingress.default_endpoint, &proxy.ip_addresses)
        else {
            continue;
        };
        if !seen.insert(number) {
            continue;
        }
        // As Istio's findOrCreateService: the service of an instance whose target port
        // is the ingress port, for telemetry.
        let instance = instances.iter().find(|i| i.target_port == number);
        let rule = instance.and_then(|i| {
            snapshot.config().destination_rule(
                &proxy.namespace,
                i.service.namespace.as_str(),
                i.service.hostname.as_str(),
            )
        });
        let input = SidecarIngressClusterInput {
            sidecar: (sidecar.namespace.clone(), sidecar.name.clone()),
            index,
            endpoint,
            v6_only: v6_only(&proxy.ip_addresses),
            service: instance.map(|i| i.service.key()),
            rule: rule.map(|r| (r.namespace.clone(), r.name.clone())),
        };
        out.extend(snapshot.cached(input));
    }
    out
}

/// The input of a Sidecar ingress cluster, and its cache key: the Sidecar (by name),
/// the ingress listener's index, its endpoint as resolved for the proxy, whether the
/// proxy is IPv6-only, the proxy's service whose target port is the ingress port
/// (telemetry metadata and stat name) and the DestinationRule of that service, by name
/// (its connection pool applies unless the Sidecar gives one).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SidecarIngressClusterInput {
    pub sidecar: (String, String),
    pub index: usize,
    pub endpoint: InboundEndpoint,
    pub v6_only: bool,
    pub service: Option<ServiceKey>,
    pub rule: Option<(String, String)>,
}

impl CacheInput<Snapshot> for SidecarIngressClusterInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Sidecar)
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let (ns, name) = &self.sidecar;
        let sidecar = snapshot.config().sidecar_by_name(ns, name)?;
        let ingress = sidecar.spec.ingress.get(self.index)?;
        let sidecar_port = ingress.port.as_ref()?;
        let number = u16::try_from(sidecar_port.number).ok()?;
        let port = Port::new(
            &sidecar_port.name,
            number,
            Protocol::parse(&sidecar_port.protocol),
        )?;
        // Istio: the rule's policy for the ingress port, then the Sidecar's pool over it.
        let rule = self
            .rule
            .as_ref()
            .and_then(|(ns, name)| snapshot.config().destination_rule_by_name(ns, name));
        let mut policy = rule
            .and_then(|r| r.spec.traffic_policy.as_ref())
            .map(|p| destination_rule::port_level_policy(p, number).0);
        if let Some(pool) = ingress
            .connection_pool
            .or(sidecar.spec.inbound_connection_pool)
        {
            policy
                .get_or_insert_with(TrafficPolicy::default)
                .connection_pool = Some(pool);
        }
        let service = self
            .service
            .as_ref()
            .and_then(|k| snapshot.services().get(k));
        let services: Vec<&Service> = service.map(|s| &**s).into_iter().collect();
        // Istio's stand-in service for an ingress port no service backs.
        let stand_in = Service::new(format!("{name}.{ns}"), ns.clone(), ProviderId::Mock, "");
        let cluster = inbound_cluster(&InboundRequest {
            target_port: number,
            port: &port,
            policy: policy.as_ref(),
            mesh: &snapshot.mesh().config,
            v6_only: self.v6_only,
            endpoint: self.endpoint.clone(),
            services: &services,
            stat_service: Some(services.first().copied().unwrap_or(&stand_in)),
            rule: rule.map(|r| &**r),
        });
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            inbound_name(number),
            &cluster,
        ))
    }
}

/// The clusters of the proxy's own service instances.
pub(super) fn service_inbound_clusters(snapshot: &Snapshot, proxy: &Proxy) -> Vec<Resource> {
    let instances = instances::proxy_instances(snapshot, proxy);
    let mut by_target: BTreeMap<u16, Vec<&ProxyInstance>> = BTreeMap::new();
    for instance in &instances {
        by_target
            .entry(instance.target_port)
            .or_default()
            .push(instance);
    }
    let sidecar = snapshot
        .config()
        .sidecar_for(&proxy.namespace, &proxy.labels)
        .map(|s| (s.namespace.clone(), s.name.clone()));
    let v6_only = v6_only(&proxy.ip_addresses);
    let mut out = Vec::new();
    for (target, on_port) in by_target {
        let instance = on_port[0];
        let service = &instance.service;
        // Istio's telemetry metadata: every service on the port whose service port is
        // the first one's, each hostname once.
        let mut hosts = BTreeSet::new();
        let services: Vec<ServiceKey> = on_port
            .iter()
            .filter(|i| i.port.port == instance.port.port)
            .filter(|i| hosts.insert(i.service.hostname.as_str()))
            .map(|i| i.service.key())
            .collect();
        let rule = snapshot.config().destination_rule(
            &proxy.namespace,
            service.namespace.as_str(),
            service.hostname.as_str(),
        );
        let input = InboundClusterInput {
            target_port: target,
            service: service.key(),
            port: instance.port.port.get(),
            rule: rule.map(|r| (r.namespace.clone(), r.name.clone())),
            sidecar: sidecar.clone(),
            v6_only,
            services,
        };
        out.extend(snapshot.cached(input));
    }
    out
}

/// The input of an inbound cluster, and its cache key: the target port, the service
/// port it backs, the DestinationRule and Sidecar in force (by name), whether the
/// proxy is IPv6-only, and the services its telemetry metadata names (the first is
/// `service`).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct InboundClusterInput {
    pub target_port: u16,
    pub service: ServiceKey,
    pub port: u16,
    pub rule: Option<(String, String)>,
    pub sidecar: Option<(String, String)>,
    pub v6_only: bool,
    pub services: Vec<ServiceKey>,
}

impl CacheInput<Snapshot> for InboundClusterInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Sidecar)
    }
    fn service(&self) -> Option<&str> {
        // Built from the proxy's instances, which any service's endpoints may change.
        None
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let service = snapshot.services().get(&self.service)?;
        let port = service.port(self.port)?;
        let config = snapshot.config();
        let rule = self
            .rule
            .as_ref()
            .and_then(|(ns, name)| config.destination_rule_by_name(ns, name));
        let sidecar_pool = self
            .sidecar
            .as_ref()
            .and_then(|(ns, name)| config.sidecar_by_name(ns, name))
            .and_then(|s| s.spec.inbound_connection_pool);
        let mut traffic_policy = rule
            .and_then(|r| r.spec.traffic_policy.as_ref())
            .map(|p| destination_rule::port_level_policy(p, port.port.get()).0);
        if let Some(pool) = sidecar_pool {
            traffic_policy
                .get_or_insert_with(Default::default)
                .connection_pool = Some(pool);
        }
        let services: Vec<&Service> = self
            .services
            .iter()
            .filter_map(|k| snapshot.services().get(k))
            .map(|s| &**s)
            .collect();
        let cluster = inbound_cluster(&InboundRequest {
            target_port: self.target_port,
            port,
            policy: traffic_policy.as_ref(),
            mesh: &snapshot.mesh().config,
            v6_only: self.v6_only,
            endpoint: InboundEndpoint::Mesh,
            services: &services,
            stat_service: Some(service),
            rule: rule.map(|r| &**r),
        });
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            inbound_name(self.target_port),
            &cluster,
        ))
    }
}

/// The input of `InboundPassthroughCluster`: the proxy's IP families.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct InboundPassthroughInput {
    pub v4: bool,
    pub v6: bool,
}

impl CacheInput<Snapshot> for InboundPassthroughInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Sidecar)
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            INBOUND_PASSTHROUGH,
            &inbound_passthrough_for(&snapshot.mesh().config, self.v4, self.v6),
        ))
    }
}

/// The input of `BlackHoleCluster` and `PassthroughCluster`, read from the mesh config
/// alone.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct SpecialClusterInput {
    pub name: &'static str,
}

impl CacheInput<Snapshot> for SpecialClusterInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        None
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let mesh = &snapshot.mesh().config;
        let cluster = if self.name == BLACK_HOLE {
            black_hole(mesh)
        } else {
            passthrough(mesh)
        };
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            self.name,
            &cluster,
        ))
    }
}

/// `BlackHoleCluster` or `PassthroughCluster`, from the snapshot's cache.
pub fn cached_special(snapshot: &Snapshot, name: &'static str) -> Resource {
    snapshot
        .cached(SpecialClusterInput { name })
        .expect("special clusters always generate")
}

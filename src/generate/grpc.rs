//! Proxyless gRPC (`GENERATOR=grpc`): what gRPC's own xDS client (`xds:///host:port`
//! targets) is served instead of the Envoy sidecar config, the way Istio's grpc
//! generator does it.
//!
//! - **LDS**: a requested name is `host[:port]`. Short hosts are expanded with the
//!   proxy's DNS domain (`foo` -> `foo.<ns>.svc.cluster.local`, `foo.bar` and
//!   `foo.bar.svc` -> `foo.bar.svc.cluster.local`); the literal host wins when it names a
//!   service itself. For each matching service port the answer is an *API listener*
//!   named exactly as requested: an HTTP connection manager with the router filter and
//!   RDS `outbound|<port>||<fqdn>` over ADS. A name without a port matches every port
//!   of the service, each listener named `<requested host>:<port>` (as Istio does, so
//!   gRPC clients in practice always name the port). Unknown names are left out.
//!   A name `xds.istio.io/grpc/lds/inbound/<ip>:<port>` is an xDS-enabled gRPC
//!   server's own listener, with mTLS and RBAC from the workload's policies
//!   ([`server`]).
//! - **RDS**: for `outbound|<port>||<fqdn>`, one virtual host for that service (gRPC
//!   rejects configs whose domains belong to other services), whose domains are the
//!   names a client may dial, and one default route to the cluster of the same name.
//! - **CDS**: requested names only (gRPC never asks for a wildcard), always EDS clusters
//!   over ADS with round-robin balancing. gRPC accepts only EDS, LOGICAL_DNS and
//!   aggregate clusters, so a DNS or passthrough service is served in the EDS form too,
//!   and `BlackHoleCluster`/`PassthroughCluster` (STATIC, ORIGINAL_DST) never are. A
//!   well-formed outbound name with no service behind it still gets its EDS cluster
//!   (with empty endpoints), so RPCs fail at once instead of after gRPC's 15 s
//!   does-not-exist timer. Subset clusters `outbound|<port>|<subset>|<host>` (the
//!   destinations of VirtualService routes to DestinationRule subsets) are EDS
//!   clusters of the same form; EDS selects their endpoints by the subset's labels
//!   (none for a subset the rule in force does not define). A cluster whose
//!   DestinationRule says `ISTIO_MUTUAL` carries Istio mTLS through gRPC's certificate
//!   providers ([`tls`]).
//! - **EDS** is the normal generator.
//!
//! Every resource is cached in the snapshot's resource cache under a view digest that
//! starts with `"grpc"`, so it never collides with an Envoy resource of the same name.

use std::collections::BTreeMap;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::Metadata;
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::RouteConfiguration;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::HttpFault;
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager, http_filter,
};
use envoy_types::pb::google::protobuf::{Any, Value, value};
use meshfed_registry::{Hostname, Port, Service};
use prost::Message;

pub mod server;
pub mod tls;

use super::cds;
use super::subscription::Subscription;
use crate::model::{ClientView, Proxy, ProxyClass};
use crate::push::cache::CacheInput;
use crate::push::snapshot::Snapshot;
use crate::xds::names::{ClusterName, Direction};
use crate::xds::{EncodedResource, Resource, TypeUrl};

/// Name of Envoy's (and gRPC's) terminal HTTP filter.
pub const ROUTER_FILTER: &str = "envoy.filters.http.router";
/// Name of the fault-injection HTTP filter.
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
const ROUTER_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router";
const FAULT_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.http.fault.v3.HTTPFault";
const HCM_TYPE: &str = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager";

/// Generates listeners, routes or clusters for a proxyless gRPC client. Endpoints are
/// served by the normal EDS generator.
pub(super) fn generate(
    type_url: TypeUrl,
    snapshot: &Snapshot,
    proxy: &Proxy,
    subscription: Subscription<'_>,
) -> Vec<Resource> {
    match type_url {
        TypeUrl::Listener => listeners(snapshot, proxy, subscription),
        TypeUrl::Route => routes(snapshot, proxy, subscription),
        TypeUrl::Cluster => clusters(snapshot, proxy, subscription),
        TypeUrl::Endpoint
        | TypeUrl::Secret
        | TypeUrl::NameTable
        | TypeUrl::Address
        | TypeUrl::Authorization
        | TypeUrl::ExtensionConfig
        | TypeUrl::Mcp(_) => Vec::new(),
    }
}

// ---------------------------------------------------------------------------------
// LDS

/// The port part of a requested listener name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum RequestedPort {
    /// `host` alone: every port of the service.
    Any,
    /// `host:port`.
    Port(u16),
    /// `host:<not a port number>`: matches nothing.
    Invalid,
}

/// Splits a requested listener name into host and port (`[v6]:port` is understood; a
/// bare IPv6 address has no port).
pub fn split_listener_name(name: &str) -> (&str, RequestedPort) {
    if let Some(rest) = name.strip_prefix('[')
        && let Some((host, after)) = rest.split_once(']')
    {
        return match after.strip_prefix(':') {
            Some(port) => (host, parse_port(port)),
            None => (host, RequestedPort::Any),
        };
    }
    match name.rsplit_once(':') {
        Some((host, port)) if !host.contains(':') => (host, parse_port(port)),
        _ => (name, RequestedPort::Any),
    }
}

fn parse_port(port: &str) -> RequestedPort {
    port.parse()
        .map_or(RequestedPort::Invalid, RequestedPort::Port)
}

/// The fully qualified form of a short host as the proxy would resolve it, or `None`
/// when `host` is not a short name: `foo` -> `foo.<dns domain>`; `foo.ns` and
/// `foo.ns.svc` -> `foo.ns.svc.<suffix>` where the proxy's domain is
/// `<its ns>.svc.<suffix>`.
pub fn expand_short_host(host: &str, dns_domain: &str) -> Option<String> {
    if host.is_empty() {
        return None;
    }
    if !host.contains('.') {
        return (!dns_domain.is_empty()).then(|| format!("{host}.{dns_domain}"));
    }
    let suffix = kube_suffix(dns_domain)?;
    let labels = host.split('.').count();
    if labels == 2 {
        Some(format!("{host}.svc.{suffix}"))
    } else if labels == 3 && host.ends_with(".svc") {
        Some(format!("{host}.{suffix}"))
    } else {
        None
    }
}

/// `cluster.local` for a domain `<ns>.svc.cluster.local`.
fn kube_suffix(dns_domain: &str) -> Option<&str> {
    let (_, suffix) = dns_domain.split_once(".svc.")?;
    (!suffix.is_empty()).then_some(suffix)
}

/// The service (and port) a requested `host[:port]` names for this proxy: the host
/// itself if it is a service hostname with that port, else its expansion.
fn resolve_requested<'s>(
    snapshot: &'s Snapshot,
    proxy: &Proxy,
    host: &str,
    port: RequestedPort,
) -> Option<&'s Arc<Service>> {
    let expanded = expand_short_host(host, &proxy.dns_domain);
    [Some(host), expanded.as_deref()]
        .into_iter()
        .flatten()
        .filter_map(|h| snapshot.services().resolve(h, &proxy.namespace))
        .find(|service| match port {
            RequestedPort::Any => true,
            RequestedPort::Port(n) => service.port(n).is_some(),
            RequestedPort::Invalid => false,
        })
}

fn listeners(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    // Keyed by listener name: a name asked for twice (`foo` and `foo:80`) is sent once.
    let mut out: BTreeMap<String, Resource> = BTreeMap::new();
    if sub.wildcard {
        for service in snapshot.services().visible_to(&proxy.namespace) {
            for port in &service.ports {
                let name = join_host_port(service.hostname.as_str(), port.port.get());
                let listener = cached_listener(snapshot, proxy, &name, service, port);
                out.insert(name, listener);
            }
        }
    }
    for requested in sub.names {
        if server::is_server_listener(requested) {
            if let Some(listener) = server::server_listener(snapshot, proxy, requested) {
                out.insert(requested.clone(), listener);
            }
            continue;
        }
        let (host, wanted) = split_listener_name(requested);
        let Some(service) = resolve_requested(snapshot, proxy, host, wanted) else {
            continue;
        };
        match wanted {
            RequestedPort::Port(number) => {
                if let Some(port) = service.port(number) {
                    let listener = cached_listener(snapshot, proxy, requested, service, port);
                    out.insert(requested.clone(), listener);
                }
            }
            RequestedPort::Any => {
                for port in &service.ports {
                    let name = join_host_port(host, port.port.get());
                    let listener = cached_listener(snapshot, proxy, &name, service, port);
                    out.insert(name, listener);
                }
            }
            RequestedPort::Invalid => {}
        }
    }
    out.into_values().collect()
}

fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// The input of a proxyless client's API listener, and its cache key.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GrpcListenerInput {
    pub name: Arc<str>,
    pub hostname: Hostname,
    pub port: u16,
    /// Some route of the service injects faults (the fault filter goes first).
    pub fault: bool,
}

impl CacheInput<Snapshot> for GrpcListenerInput {
    const TYPE: TypeUrl = TypeUrl::Listener;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Grpc)
    }
    fn service(&self) -> Option<&str> {
        Some(self.hostname.as_str())
    }
    fn generate(&self, _: &Snapshot) -> Option<Resource> {
        let listener = api_listener(&self.name, self.hostname.as_str(), self.port, self.fault);
        Some(EncodedResource::encode(
            TypeUrl::Listener,
            self.name.clone(),
            &listener,
        ))
    }
}

fn cached_listener(
    snapshot: &Snapshot,
    proxy: &Proxy,
    name: &str,
    service: &Service,
    port: &Port,
) -> Resource {
    let input = GrpcListenerInput {
        name: Arc::from(name),
        hostname: service.hostname.clone(),
        port: port.port.get(),
        fault: routes_inject_faults(snapshot, proxy, service),
    };
    snapshot.cached(input).expect("listeners always generate")
}

/// Whether any route of `service` port `port` injects faults, which needs the fault
/// filter in front of the router. Fault injection comes from VirtualServices; without
/// them no route does.
fn routes_inject_faults(snapshot: &Snapshot, proxy: &Proxy, service: &Service) -> bool {
    snapshot
        .config()
        .virtual_service_for_host(&proxy.namespace, service.hostname.as_str())
        .is_some_and(|vs| vs.spec.http.iter().any(|r| r.fault.is_some()))
}

/// The API listener `name` for `hostname` port `port`: an HTTP connection manager that
/// loads route `outbound|<port>||<hostname>` over ADS.
pub fn api_listener(name: &str, hostname: &str, port: u16, fault: bool) -> Listener {
    let hcm = HttpConnectionManager {
        // gRPC ignores it, but the field is required (`min_len: 1`): an Envoy given
        // this listener would refuse it without one.
        stat_prefix: name.to_string(),
        http_filters: http_filters(fault),
        route_specifier: Some(http_connection_manager::RouteSpecifier::Rds(Rds {
            config_source: Some(cds::ads_source()),
            route_config_name: crate::xds::names::outbound_name(port, "", hostname),
        })),
        ..Default::default()
    };
    Listener {
        name: name.to_string(),
        api_listener: Some(ApiListener {
            api_listener: Some(any(HCM_TYPE, &hcm)),
        }),
        ..Default::default()
    }
}

/// The HTTP filters of an API listener: the router (gRPC requires it, last), preceded
/// by the fault filter when routes inject faults.
pub fn http_filters(fault: bool) -> Vec<HttpFilter> {
    let mut filters = Vec::with_capacity(2);
    if fault {
        filters.push(HttpFilter {
            name: FAULT_FILTER.to_string(),
            config_type: Some(http_filter::ConfigType::TypedConfig(any(
                FAULT_TYPE,
                &HttpFault::default(),
            ))),
            ..Default::default()
        });
    }
    filters.push(HttpFilter {
        name: ROUTER_FILTER.to_string(),
        config_type: Some(http_filter::ConfigType::TypedConfig(any(
            ROUTER_TYPE,
            &Router::default(),
        ))),
        ..Default::default()
    });
    filters
}

fn any<M: Message>(type_url: &str, message: &M) -> Any {
    Any {
        type_url: type_url.to_string(),
        value: message.encode_to_vec(),
    }
}

// ---------------------------------------------------------------------------------
// RDS

fn routes(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    let client = Arc::new(proxy.client_view());
    sub.names
        .iter()
        .filter_map(|name| {
            let parsed = ClusterName::parse(name)?;
            if parsed.direction != Direction::Outbound || !parsed.subset.is_empty() {
                return None;
            }
            Some(cached_route(snapshot, &client, name))
        })
        .collect()
}

/// The input of a proxyless client's route table `outbound|<port>||<host>`, and its
/// cache key: the name and the client as routes see it.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GrpcRouteInput {
    pub client: Arc<ClientView>,
    pub name: Arc<str>,
}

impl CacheInput<Snapshot> for GrpcRouteInput {
    const TYPE: TypeUrl = TypeUrl::Route;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Grpc)
    }

    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let name = &*self.name;
        let found = ClusterName::parse(name).and_then(|parsed| {
            let service = snapshot
                .services()
                .resolve(parsed.hostname, &self.client.namespace)?;
            let port = service.port(parsed.port)?;
            Some((service, port))
        });
        Some(match found {
            Some((service, port)) => EncodedResource::encode(
                TypeUrl::Route,
                name,
                &route_configuration(name, snapshot, service, port, &self.client),
            ),
            // The service or port is gone: an empty route table tells the client at
            // once (SotW); Delta reports the name as removed.
            None => EncodedResource::encode_placeholder(
                TypeUrl::Route,
                name,
                &RouteConfiguration {
                    name: name.to_string(),
                    ..Default::default()
                },
            ),
        })
    }
}

fn cached_route(snapshot: &Snapshot, client: &Arc<ClientView>, name: &str) -> Resource {
    let input = GrpcRouteInput {
        client: client.clone(),
        name: Arc::from(name),
    };
    snapshot.cached(input).expect("routes always generate")
}

/// The route table `name` (`outbound|<port>||<hostname>`) for one service port: the
/// service's single virtual host as the sidecar route tables build it (VirtualService
/// routes, or the default route).
pub fn route_configuration(
    name: &str,
    snapshot: &Snapshot,
    service: &Service,
    port: &Port,
    proxy: &ClientView,
) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vec![super::rds::service_virtual_host(
            snapshot, proxy, service, port,
        )],
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------
// CDS

fn clusters(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    // gRPC always names its clusters; like Istio, a wildcard gets nothing. Every
    // cluster, service-wide or a DestinationRule subset (what VirtualService routes to
    // subsets name), is a bare EDS cluster whose endpoints the EDS generator selects;
    // the DestinationRule only picks the load balancer. Envoy's clusters are not
    // shared: they carry Envoy-only settings (mTLS through SDS secrets, ...).
    sub.names
        .iter()
        .filter_map(|name| {
            let parsed = ClusterName::parse(name)?;
            if parsed.direction != Direction::Outbound {
                return None;
            }
            // The service the client reaches under the cluster's hostname, if any.
            let service = snapshot
                .services()
                .resolve(parsed.hostname, &proxy.namespace);
            let (lb, tls, labels) = match service {
                Some(service) => (
                    grpc_lb(snapshot, proxy, service, &parsed),
                    grpc_tls(snapshot, proxy, service, &parsed),
                    Some(csm_labels(service)),
                ),
                None => (GrpcLb::RoundRobin, None, None),
            };
            Some(cached_eds_cluster(
                snapshot,
                name,
                parsed.hostname,
                lb,
                tls,
                labels,
            ))
        })
        .collect()
}

/// The load balancer a proxyless client uses for a cluster, from the DestinationRule
/// (subset and port-level settings merged): round robin (the default), least request,
/// or ring hash for consistent hashing. Other policies fall back to round robin, which
/// is what gRPC supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GrpcLb {
    RoundRobin,
    LeastRequest,
    RingHash { minimum_ring_size: u64 },
}

fn grpc_lb(
    snapshot: &Snapshot,
    proxy: &Proxy,
    service: &Service,
    cluster: &ClusterName<'_>,
) -> GrpcLb {
    use meshfed_api::networking::v1alpha3::load_balancer_settings::{LbPolicy, SimpleLb};
    let Some(rule) = snapshot.config().destination_rule(
        &proxy.namespace,
        service.namespace.as_str(),
        service.hostname.as_str(),
    ) else {
        return GrpcLb::RoundRobin;
    };
    let policy =
        super::destination_rule::destination_policy(&rule.spec, cluster.port, cluster.subset);
    match policy
        .and_then(|p| p.load_balancer)
        .and_then(|lb| lb.lb_policy)
    {
        Some(LbPolicy::Simple(s))
            if s == SimpleLb::LeastRequest as i32 || s == SimpleLb::LeastConn as i32 =>
        {
            GrpcLb::LeastRequest
        }
        Some(LbPolicy::ConsistentHash(h)) => GrpcLb::RingHash {
            minimum_ring_size: h.minimum_ring_size,
        },
        _ => GrpcLb::RoundRobin,
    }
}

/// The identities a proxyless client accepts from a destination it reaches over Istio
/// mTLS, or `None` for plaintext. As Istio's grpc generator (`applyTLS`), only an
/// explicit `ISTIO_MUTUAL` in the DestinationRule in force (subset and port settings
/// merged) turns mTLS on: there is no auto mTLS, because a client that does not use
/// xDS credentials ignores it and gRPC cannot reach a PERMISSIVE server over TLS
/// (see [`server`]). The identities are the rule's `subjectAltNames`, else the
/// service's accounts. SIMPLE and MUTUAL (certificates from files) are not served to
/// gRPC, as in Istio.
fn grpc_tls(
    snapshot: &Snapshot,
    proxy: &Proxy,
    service: &Service,
    cluster: &ClusterName<'_>,
) -> Option<Vec<String>> {
    use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
    let rule = snapshot.config().destination_rule(
        &proxy.namespace,
        service.namespace.as_str(),
        service.hostname.as_str(),
    )?;
    let tls =
        super::destination_rule::destination_policy(&rule.spec, cluster.port, cluster.subset)?
            .tls?;
    match TlSmode::try_from(tls.mode) {
        Ok(TlSmode::IstioMutual) => {}
        Ok(TlSmode::Simple | TlSmode::Mutual) => {
            tracing::debug!(
                rule = %format!("{}/{}", rule.namespace, rule.name), cluster = cluster.hostname,
                "DestinationRule TLS SIMPLE/MUTUAL is not applied to proxyless gRPC clients"
            );
            return None;
        }
        _ => return None,
    }
    if !tls.subject_alt_names.is_empty() {
        return Some(tls.subject_alt_names);
    }
    Some(cds::service_accounts(
        service,
        snapshot.shards(&service.key()).map(|s| &**s),
        &snapshot.mesh().config,
    ))
}

/// The filter metadata key gRPC's service-mesh observability reads from a cluster to
/// label the metrics of calls to it (`csm.service_name`, `csm.service_namespace_name`).
pub const CSM_TELEMETRY_LABELS: &str = "com.google.csm.telemetry_labels";

/// The destination labels a proxyless client puts on its metrics: the service's name
/// and namespace, named as the `istio.services` cluster metadata names them for Envoy.
fn csm_labels(service: &Service) -> CsmLabels {
    CsmLabels {
        service_name: cds::service_name(service).to_string(),
        service_namespace: service.namespace.as_str().to_string(),
    }
}

/// The destination service of a proxyless client's cluster, for its metrics.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct CsmLabels {
    pub service_name: String,
    pub service_namespace: String,
}

/// The input of a proxyless client's cluster, and its cache key: the name, the load
/// balancer the DestinationRule in force picks, the identities of Istio mTLS to the
/// destination (`None`: plaintext) and the destination service's telemetry labels
/// (`None`: no such service).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GrpcClusterInput {
    pub name: Arc<str>,
    pub hostname: Hostname,
    pub lb: GrpcLb,
    pub tls: Option<Vec<String>>,
    pub labels: Option<CsmLabels>,
}

impl CacheInput<Snapshot> for GrpcClusterInput {
    const TYPE: TypeUrl = TypeUrl::Cluster;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Grpc)
    }
    fn service(&self) -> Option<&str> {
        Some(self.hostname.as_str())
    }
    fn generate(&self, _: &Snapshot) -> Option<Resource> {
        let mut cluster = eds_cluster(&self.name);
        match self.lb {
            GrpcLb::RoundRobin => {}
            GrpcLb::LeastRequest => cluster.lb_policy = cluster::LbPolicy::LeastRequest as i32,
            GrpcLb::RingHash { minimum_ring_size } => {
                cluster.lb_policy = cluster::LbPolicy::RingHash as i32;
                if minimum_ring_size > 0 {
                    cluster.lb_config = Some(cluster::LbConfig::RingHashLbConfig(
                        cluster::RingHashLbConfig {
                            minimum_ring_size: Some(
                                envoy_types::pb::google::protobuf::UInt64Value {
                                    value: minimum_ring_size,
                                },
                            ),
                            ..Default::default()
                        },
                    ));
                }
            }
        }
        cluster.transport_socket = self.tls.as_deref().map(tls::upstream_socket);
        if let Some(labels) = &self.labels {
            let string = |s: &str| Value {
                kind: Some(value::Kind::StringValue(s.to_string())),
            };
            cluster.metadata = Some(Metadata {
                filter_metadata: crate::generate::proto::stable_map([(
                    CSM_TELEMETRY_LABELS.to_string(),
                    crate::generate::proto::stable_struct([
                        ("service_name".to_string(), string(&labels.service_name)),
                        (
                            "service_namespace".to_string(),
                            string(&labels.service_namespace),
                        ),
                    ]),
                )]),
                ..Default::default()
            });
        }
        Some(EncodedResource::encode(
            TypeUrl::Cluster,
            self.name.clone(),
            &cluster,
        ))
    }
}

fn cached_eds_cluster(
    snapshot: &Snapshot,
    name: &str,
    hostname: &str,
    lb: GrpcLb,
    tls: Option<Vec<String>>,
    labels: Option<CsmLabels>,
) -> Resource {
    let input = GrpcClusterInput {
        name: Arc::from(name),
        hostname: Hostname::new(hostname),
        lb,
        tls,
        labels,
    };
    snapshot.cached(input).expect("clusters always generate")
}

/// A bare EDS cluster over ADS with round-robin balancing.
pub fn eds_cluster(name: &str) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        )),
        eds_cluster_config: Some(cluster::EdsClusterConfig {
            eds_config: Some(cds::ads_source()),
            service_name: name.to_string(),
        }),
        lb_policy: cluster::LbPolicy::RoundRobin as i32,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use envoy_types::pb::envoy::config::core::v3::Node;
    use envoy_types::pb::envoy::config::route::v3::{RouteAction, route, route_action};
    use meshfed_registry::{
        Aggregate, EndpointIndex, MemoryRegistry, Protocol, ProviderId, PushRequest, Resolution,
        TriggerReason, UpdateSink,
    };

    use super::*;
    use crate::generate::{GeneratorOptions, Scope, generate as generate_any};
    use crate::model::proxy::{Generator, json_to_struct};

    const DOMAIN: &str = "default.svc.cluster.local";

    fn proxy() -> Proxy {
        let node = Node {
            id: format!("sidecar~127.0.0.1~client.default~{DOMAIN}"),
            metadata: Some(json_to_struct(
                &serde_json::json!({"GENERATOR": "grpc", "NAMESPACE": "default"}),
            )),
            ..Default::default()
        };
        let p = Proxy::from_node(Some(&node)).unwrap();
        assert_eq!(p.generator, Generator::Grpc);
        p
    }

    fn service(host: &str, ns: &str, ports: &[u16], resolution: Resolution) -> Service {
        let mut s = Service::new(host, ns, ProviderId::Mock, "c1");
        for (i, p) in ports.iter().enumerate() {
            s.ports
                .push(Port::new(&format!("grpc-{i}"), *p, Protocol::Grpc).unwrap());
        }
        s.resolution = resolution;
        s
    }

    fn snapshot(services: Vec<Service>) -> Snapshot {
        snapshot_with(services, crate::push::config_index::ConfigSet::default())
    }

    fn snapshot_with(
        services: Vec<Service>,
        set: crate::push::config_index::ConfigSet,
    ) -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _events) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let registry = MemoryRegistry::new("c1", sink);
        for s in services {
            registry.add_service(s);
        }
        aggregate.add_registry(Arc::new(registry));
        Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(Snapshot::empty().mesh().clone()),
            &|m| crate::push::config_index::ConfigIndex::new(set.clone(), "cluster.local", m),
            1,
        )
    }

    #[test]
    fn cds_carries_the_destination_service_for_grpc_observability() {
        let snap = snapshot(vec![service(
            "echo.default.svc.cluster.local",
            "default",
            &[7070],
            Resolution::ClientSideLb,
        )]);
        let out = run(
            &snap,
            TypeUrl::Cluster,
            &[
                "outbound|7070||echo.default.svc.cluster.local",
                "outbound|7070||nowhere.default.svc.cluster.local",
            ],
        );
        let clusters: Vec<Cluster> = out.iter().map(decode).collect();
        let labels = |c: &Cluster| {
            c.metadata.as_ref().map(|m| {
                let mut fields: Vec<(String, String)> = m.filter_metadata[CSM_TELEMETRY_LABELS]
                    .fields
                    .iter()
                    .map(|(k, v)| match &v.kind {
                        Some(value::Kind::StringValue(s)) => (k.clone(), s.clone()),
                        other => panic!("{k}: {other:?}"),
                    })
                    .collect();
                fields.sort();
                fields
            })
        };
        let echo = clusters.iter().find(|c| c.name.contains("echo")).unwrap();
        assert_eq!(
            labels(echo),
            Some(vec![
                ("service_name".to_string(), "echo".to_string()),
                ("service_namespace".to_string(), "default".to_string()),
            ])
        );
        let unknown = clusters
            .iter()
            .find(|c| c.name.contains("nowhere"))
            .unwrap();
        assert_eq!(labels(unknown), None);
    }

    #[test]
    fn cds_load_balancer_follows_the_destination_rule() {
        use meshfed_api::networking::v1alpha3::load_balancer_settings::{
            ConsistentHashLb, LbPolicy, SimpleLb,
        };
        use meshfed_api::networking::v1alpha3::{
            DestinationRule, LoadBalancerSettings, Subset, TrafficPolicy,
        };
        let lb = |p: LbPolicy| TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                lb_policy: Some(p),
                ..Default::default()
            }),
            ..Default::default()
        };
        let rule = DestinationRule {
            host: "echo".into(),
            traffic_policy: Some(lb(LbPolicy::Simple(SimpleLb::LeastRequest as i32))),
            subsets: vec![Subset {
                name: "sticky".into(),
                labels: [("version".to_string(), "v1".to_string())].into(),
                traffic_policy: Some(lb(LbPolicy::ConsistentHash(ConsistentHashLb {
                    minimum_ring_size: 2048,
                    ..Default::default()
                }))),
            }],
            ..Default::default()
        };
        let set = crate::push::config_index::ConfigSet {
            destination_rules: vec![crate::push::config_index::Config {
                name: "echo".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: rule,
            }],
            ..Default::default()
        };
        let snap = snapshot_with(
            vec![service(
                "echo.default.svc.cluster.local",
                "default",
                &[7070],
                Resolution::ClientSideLb,
            )],
            set,
        );
        let out = run(
            &snap,
            TypeUrl::Cluster,
            &[
                "outbound|7070||echo.default.svc.cluster.local",
                "outbound|7070|sticky|echo.default.svc.cluster.local",
            ],
        );
        let clusters: Vec<Cluster> = out.iter().map(decode).collect();
        let by_name = |n: &str| {
            clusters
                .iter()
                .find(|c| c.name.contains(n))
                .unwrap()
                .clone()
        };
        assert_eq!(
            by_name("||").lb_policy,
            cluster::LbPolicy::LeastRequest as i32
        );
        let sticky = by_name("|sticky|");
        assert_eq!(sticky.lb_policy, cluster::LbPolicy::RingHash as i32);
        match sticky.lb_config {
            Some(cluster::LbConfig::RingHashLbConfig(c)) => {
                assert_eq!(c.minimum_ring_size.unwrap().value, 2048)
            }
            other => panic!("no ring hash config: {other:?}"),
        }
    }

    fn names(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn run(snapshot: &Snapshot, type_url: TypeUrl, wanted: &[&str]) -> Vec<Resource> {
        let wanted = names(wanted);
        generate_any(
            type_url,
            snapshot,
            &proxy(),
            Subscription {
                wildcard: wanted.is_empty(),
                names: &wanted,
                interned: None,
            },
            Scope::All,
            &GeneratorOptions::default(),
        )
        .into_vec()
    }

    fn decode<M: Message + Default>(r: &Resource) -> M {
        M::decode(r.body.value.clone()).unwrap()
    }

    fn hcm(l: &Listener) -> HttpConnectionManager {
        let any = l
            .api_listener
            .as_ref()
            .unwrap()
            .api_listener
            .as_ref()
            .unwrap();
        assert_eq!(any.type_url, HCM_TYPE);
        HttpConnectionManager::decode(any.value.as_slice()).unwrap()
    }

    fn rds_name(h: &HttpConnectionManager) -> &str {
        match &h.route_specifier {
            Some(http_connection_manager::RouteSpecifier::Rds(rds)) => &rds.route_config_name,
            other => panic!("expected RDS, got {other:?}"),
        }
    }

    #[test]
    fn listener_names_split_into_host_and_port() {
        assert_eq!(
            split_listener_name("foo.ns:7070"),
            ("foo.ns", RequestedPort::Port(7070))
        );
        assert_eq!(split_listener_name("foo"), ("foo", RequestedPort::Any));
        assert_eq!(
            split_listener_name("foo:http"),
            ("foo", RequestedPort::Invalid)
        );
        assert_eq!(
            split_listener_name("[fd00::1]:80"),
            ("fd00::1", RequestedPort::Port(80))
        );
        assert_eq!(
            split_listener_name("fd00::1"),
            ("fd00::1", RequestedPort::Any)
        );
    }

    #[test]
    fn short_hosts_expand_with_the_proxy_domain() {
        assert_eq!(
            expand_short_host("foo", DOMAIN).as_deref(),
            Some("foo.default.svc.cluster.local")
        );
        assert_eq!(
            expand_short_host("foo.other", DOMAIN).as_deref(),
            Some("foo.other.svc.cluster.local")
        );
        assert_eq!(
            expand_short_host("foo.other.svc", DOMAIN).as_deref(),
            Some("foo.other.svc.cluster.local")
        );
        assert_eq!(expand_short_host("foo.example.com", DOMAIN), None);
        assert_eq!(expand_short_host("foo.bar", "corp.example"), None);
        assert_eq!(
            expand_short_host("foo", "corp.example").as_deref(),
            Some("foo.corp.example")
        );
    }

    #[test]
    fn lds_answers_requested_names_with_api_listeners() {
        let snap = snapshot(vec![
            service(
                "echo.default.svc.cluster.local",
                "default",
                &[7070, 7071],
                Resolution::ClientSideLb,
            ),
            service(
                "echo.other.svc.cluster.local",
                "other",
                &[9090],
                Resolution::ClientSideLb,
            ),
            service("echo.other", "external", &[80], Resolution::DnsLb),
        ]);
        let out = run(
            &snap,
            TypeUrl::Listener,
            &[
                "echo.default.svc.cluster.local:7070",
                "echo:7071",
                "echo.other:9090",
                "echo.other:80",
                "missing:80",
                "echo:1",
                "echo:x",
            ],
        );
        let got: BTreeMap<String, String> = out
            .iter()
            .map(|r| {
                let l: Listener = decode(r);
                assert_eq!(&*r.name, l.name);
                let h = hcm(&l);
                let filters: Vec<&str> = h.http_filters.iter().map(|f| f.name.as_str()).collect();
                assert_eq!(filters, vec![ROUTER_FILTER]);
                match &h.http_filters[0].config_type {
                    Some(http_filter::ConfigType::TypedConfig(any)) => {
                        assert_eq!(any.type_url, ROUTER_TYPE)
                    }
                    other => panic!("router without typed config: {other:?}"),
                }
                assert!(l.address.is_none(), "API listeners carry no address");
                (l.name.clone(), rds_name(&h).to_string())
            })
            .collect();
        let want: BTreeMap<String, String> = [
            (
                "echo.default.svc.cluster.local:7070",
                "outbound|7070||echo.default.svc.cluster.local",
            ),
            ("echo:7071", "outbound|7071||echo.default.svc.cluster.local"),
            (
                "echo.other:9090",
                "outbound|9090||echo.other.svc.cluster.local",
            ),
            // The literal hostname wins over the expansion when it has the port.
            ("echo.other:80", "outbound|80||echo.other"),
        ]
        .into_iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn lds_name_without_port_gets_every_port_and_duplicates_are_sent_once() {
        let snap = snapshot(vec![service(
            "echo.default.svc.cluster.local",
            "default",
            &[7070, 7071],
            Resolution::ClientSideLb,
        )]);
        let out = run(&snap, TypeUrl::Listener, &["echo", "echo:7070"]);
        let names: Vec<&str> = out.iter().map(|r| &*r.name).collect();
        assert_eq!(names, vec!["echo:7070", "echo:7071"]);

        let all = run(&snap, TypeUrl::Listener, &[]);
        let names: Vec<&str> = all.iter().map(|r| &*r.name).collect();
        assert_eq!(
            names,
            vec![
                "echo.default.svc.cluster.local:7070",
                "echo.default.svc.cluster.local:7071"
            ]
        );
    }

    #[test]
    fn fault_filter_goes_before_the_router() {
        let filters: Vec<String> = http_filters(true).into_iter().map(|f| f.name).collect();
        assert_eq!(filters, vec![FAULT_FILTER, ROUTER_FILTER]);
    }

    #[test]
    fn rds_has_one_virtual_host_with_the_dialable_names() {
        let mut echo = service(
            "echo.default.svc.cluster.local",
            "default",
            &[7070],
            Resolution::ClientSideLb,
        );
        echo.cluster_vips
            .insert("c1".into(), vec!["10.96.0.10".parse().unwrap()]);
        let snap = snapshot(vec![
            echo,
            service(
                "other.default.svc.cluster.local",
                "default",
                &[7070],
                Resolution::ClientSideLb,
            ),
        ]);
        let name = "outbound|7070||echo.default.svc.cluster.local";
        let out = run(
            &snap,
            TypeUrl::Route,
            &[name, "outbound|1||echo.default.svc.cluster.local", "bogus"],
        );
        assert_eq!(out.len(), 2, "the bogus name is skipped");
        let rc: RouteConfiguration = decode(&out[1]);
        assert_eq!(rc.name, name);
        assert_eq!(rc.virtual_hosts.len(), 1);
        let vh = &rc.virtual_hosts[0];
        assert_eq!(vh.name, "echo.default.svc.cluster.local:7070");
        assert_eq!(
            vh.domains,
            vec![
                "echo.default.svc.cluster.local",
                "echo.default.svc.cluster.local:7070",
                "echo.default.svc.cluster.local.",
                "echo.default.svc.cluster.local.:7070",
                "echo",
                "echo:7070",
                "echo.default",
                "echo.default:7070",
                "echo.default.svc",
                "echo.default.svc:7070",
                "10.96.0.10",
                "10.96.0.10:7070",
            ]
        );
        assert_eq!(vh.routes.len(), 1);
        match &vh.routes[0].action {
            Some(route::Action::Route(RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(c)),
                ..
            })) => assert_eq!(c, name),
            other => panic!("unexpected action {other:?}"),
        }
        // A port the service lacks: an empty table, marked as standing for nothing.
        let missing: RouteConfiguration = decode(&out[0]);
        assert!(missing.virtual_hosts.is_empty());
        assert!(out[0].placeholder);
    }

    #[test]
    fn cds_serves_only_named_eds_clusters() {
        let snap = snapshot(vec![
            service(
                "echo.default.svc.cluster.local",
                "default",
                &[7070],
                Resolution::ClientSideLb,
            ),
            service("dns.example.com", "default", &[443], Resolution::DnsLb),
            service(
                "pass.example.com",
                "default",
                &[443],
                Resolution::Passthrough,
            ),
        ]);
        assert!(
            run(&snap, TypeUrl::Cluster, &[]).is_empty(),
            "no wildcard CDS"
        );
        let wanted = [
            "outbound|7070||echo.default.svc.cluster.local",
            "outbound|443||dns.example.com",
            "outbound|443||pass.example.com",
            "outbound|80||gone.default.svc.cluster.local",
            "outbound|7070|v1|echo.default.svc.cluster.local",
            "inbound|7070||",
            "BlackHoleCluster",
            "PassthroughCluster",
        ];
        let out = run(&snap, TypeUrl::Cluster, &wanted);
        let mut got: Vec<&str> = out.iter().map(|r| &*r.name).collect();
        got.sort();
        assert_eq!(
            got,
            vec![
                "outbound|443||dns.example.com",
                "outbound|443||pass.example.com",
                "outbound|7070|v1|echo.default.svc.cluster.local",
                "outbound|7070||echo.default.svc.cluster.local",
                "outbound|80||gone.default.svc.cluster.local",
            ]
        );
        for r in &out {
            let c: Cluster = decode(r);
            assert_eq!(
                c.cluster_discovery_type,
                Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Eds as i32
                )),
                "{}",
                c.name
            );
            assert_eq!(c.lb_policy, cluster::LbPolicy::RoundRobin as i32);
            assert_eq!(c.eds_cluster_config.unwrap().service_name, c.name);
        }
    }

    #[test]
    fn envoy_proxies_are_not_affected() {
        let snap = snapshot(vec![service(
            "dns.example.com",
            "default",
            &[443],
            Resolution::DnsLb,
        )]);
        let grpc = run(&snap, TypeUrl::Cluster, &["outbound|443||dns.example.com"]);
        let wanted = names(&["outbound|443||dns.example.com"]);
        let mut envoy = proxy();
        envoy.generator = Generator::Envoy;
        let sidecar = generate_any(
            TypeUrl::Cluster,
            &snap,
            &envoy,
            Subscription {
                wildcard: false,
                names: &wanted,
                interned: None,
            },
            Scope::All,
            &GeneratorOptions::default(),
        );
        let c: Cluster = decode(&sidecar[0]);
        assert_eq!(
            c.cluster_discovery_type,
            Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::StrictDns as i32
            )),
            "the sidecar's cached cluster is not the gRPC one"
        );
        assert_ne!(grpc[0].body, sidecar[0].body);
    }
}

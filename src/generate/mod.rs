//! Generators: pure functions from typed inputs and the snapshot's mesh-wide indexes to
//! encoded resources.
//!
//! This module is where a proxy meets the generators: for each resource it builds the
//! input struct holding exactly the facts of the proxy that resource depends on
//! ([`cds::OutboundClusterInput`], [`eds::EdsInput`], [`ListenerInput`],
//! [`RouteInput`], ...). The input is the cache key ([`crate::push::cache`]); the
//! generator behind it is handed the input and the snapshot, never the proxy, so it
//! cannot read what the key leaves out, and proxies that would get the same bytes
//! share them.

pub mod ambient;
pub mod ambient_authz;
pub mod authn;
pub mod authz;
pub mod cds;
pub mod cluster_build;
pub mod destination_rule;
pub mod eds;
pub mod envoyfilter;
pub mod grpc;
pub mod instances;
pub mod joined;
pub mod jwt;
pub mod lds;
pub mod locality_lb;
pub mod mcp;
pub mod merged_gateway;
pub mod nds;
pub mod proto;
pub mod rds;
#[cfg(any(test, feature = "testing"))]
pub mod simulate;
pub mod subscription;
pub mod telemetry;
pub mod traffic_policy;
pub mod upstream_tls;
pub mod wasm;

use std::collections::BTreeSet;
use std::sync::Arc;

use meshfed_registry::Service;

use crate::model::{ClientView, Generator, Proxy, ProxyClass};
use crate::push::cache::{CacheInput, Findings};
use crate::push::snapshot::Snapshot;
use crate::xds::names::{ClusterName, Direction};
use crate::xds::{EncodedResource, Resource, ResourceList, TypeUrl};
use eds::{EdsInput, EdsOptions};
pub use subscription::{Scope, Subscription};

/// Generator settings that come from flags and the mesh config.
#[derive(Clone, Copy, Debug, Default)]
pub struct GeneratorOptions {
    pub eds: EdsOptions,
    pub ambient: ambient::AmbientOptions,
}

/// Generates the resources of `type_url` that `proxy` subscribed to. Generators see
/// the proxy as the snapshot knows it: with its workload's labels and locality when a
/// registry knows the workload ([`Snapshot::proxy_view`]).
pub fn generate(
    type_url: TypeUrl,
    snapshot: &Snapshot,
    proxy: &Proxy,
    subscription: Subscription<'_>,
    scope: Scope<'_>,
    options: &GeneratorOptions,
) -> ResourceList {
    if type_url == TypeUrl::Secret || type_url.is_mcp() {
        // Secrets are not derived from the snapshot alone: `crate::sds` serves them.
        // MCP types are the same for every client: `mcp::generate`.
        return ResourceList::default();
    }
    if type_url == TypeUrl::Endpoint {
        // Incremental EDS reaches connections that may watch none of the changed
        // hostnames: the proxy is resolved only when something is in scope.
        return load_assignments(snapshot, proxy, subscription, scope, options);
    }
    if type_url == TypeUrl::NameTable {
        return nds::resources(snapshot, proxy).into();
    }
    // The ambient types are the same for every client.
    if type_url == TypeUrl::Address {
        return ambient::addresses(snapshot, subscription, &options.ambient).into();
    }
    if type_url == TypeUrl::Authorization {
        return ambient::authorizations(snapshot, subscription, &options.ambient).into();
    }
    let proxy = &*snapshot.proxy_view(proxy);
    // Proxyless gRPC gets its own listeners, routes and clusters; endpoints are shared.
    if proxy.generator == Generator::Grpc {
        return grpc::generate(type_url, snapshot, proxy, subscription).into();
    }
    // EnvoyFilter patches run on what the generators (and their caches) give.
    let patch = |out: ResourceList| {
        envoyfilter::apply(type_url, out, snapshot, proxy, subscription.wildcard)
    };
    match type_url {
        TypeUrl::Cluster => patch(clusters(snapshot, proxy, subscription)),
        TypeUrl::Listener => patch(listeners(snapshot, proxy, subscription).into()),
        TypeUrl::Route => patch(routes(snapshot, proxy, subscription).into()),
        TypeUrl::ExtensionConfig => wasm::ecds_resources(snapshot, proxy, subscription).into(),
        TypeUrl::Endpoint
        | TypeUrl::Secret
        | TypeUrl::NameTable
        | TypeUrl::Address
        | TypeUrl::Authorization
        | TypeUrl::Mcp(_) => ResourceList::default(), // answered above
    }
}

fn clusters(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> ResourceList {
    // As istiod: gateways get no passthrough cluster; sidecars also get their inbound
    // clusters and InboundPassthroughCluster.
    let sidecar = proxy.node_type == crate::model::NodeType::Sidecar;
    let client = cds::ClientFacts::of(proxy);
    if sub.wildcard {
        let outbound: Arc<[Resource]> = snapshot
            .cached(cds::OutboundClustersInput::new(snapshot, client.clone()))
            .unwrap_or_else(|| Arc::from(Vec::new()));
        let mut own = sni_dnat_clusters(snapshot, proxy, &client);
        own.push(cds::cached_special(snapshot, crate::xds::names::BLACK_HOLE));
        if !proxy.is_router() {
            own.push(cds::cached_special(
                snapshot,
                crate::xds::names::PASSTHROUGH,
            ));
        }
        if sidecar {
            own.extend(cds::cached_inbound(snapshot, proxy));
        }
        return joined::joined(&outbound, own).into();
    }
    let mut inbound: Option<Vec<Resource>> = None;
    sub.names
        .iter()
        .filter_map(|name| match name.as_str() {
            crate::xds::names::BLACK_HOLE => {
                Some(cds::cached_special(snapshot, crate::xds::names::BLACK_HOLE))
            }
            crate::xds::names::PASSTHROUGH => Some(cds::cached_special(
                snapshot,
                crate::xds::names::PASSTHROUGH,
            )),
            _ => {
                let parsed = ClusterName::parse(name).map(|p| p.direction);
                if name == crate::xds::names::INBOUND_PASSTHROUGH
                    || parsed == Some(Direction::Inbound)
                {
                    if !sidecar {
                        return None;
                    }
                    return inbound
                        .get_or_insert_with(|| cds::cached_inbound(snapshot, proxy))
                        .iter()
                        .find(|r| &*r.name == name.as_str())
                        .cloned();
                }
                let parsed = ClusterName::parse(name)?;
                let service = snapshot
                    .services()
                    .resolve(parsed.hostname, &proxy.namespace)?;
                let port = service.port(parsed.port)?;
                if parsed.sni_dnat && !proxy.is_router() {
                    return None;
                }
                cds::cached_outbound_as(
                    snapshot,
                    &client,
                    service,
                    port,
                    parsed.subset,
                    parsed.sni_dnat,
                )
            }
        })
        .collect()
}

/// A gateway with AUTO_PASSTHROUGH servers gets the SNI-DNAT twin
/// (`outbound_.<port>_.<subset>_.<host>`) of the clusters of every in-mesh service
/// its passthrough hosts cover: the targets of its SNI filter chains.
fn sni_dnat_clusters(
    snapshot: &Snapshot,
    proxy: &Proxy,
    client: &cds::ClientFacts,
) -> Vec<Resource> {
    if !proxy.is_router() {
        return Vec::new();
    }
    let merged = merged_gateway::MergedGateway::build(
        snapshot,
        &proxy.labels,
        &merged_gateway::gateway_targets(snapshot, proxy),
    );
    if merged.auto_passthrough_hosts.is_empty() {
        return Vec::new();
    }
    let hosts: Vec<String> = merged.auto_passthrough_hosts.into_iter().collect();
    merged_gateway::passthrough_destinations(snapshot, &proxy.namespace, &proxy.labels, &hosts)
        .into_iter()
        .filter_map(|d| {
            cds::cached_outbound_as(snapshot, client, d.service, d.port, d.subset, true)
        })
        .collect()
}

fn load_assignments(
    snapshot: &Snapshot,
    proxy: &Proxy,
    sub: Subscription<'_>,
    scope: Scope<'_>,
    options: &GeneratorOptions,
) -> ResourceList {
    // A whole subscription by name: one shared list per client facts and name set.
    if let (Scope::All, false, Some(names)) = (scope, sub.wildcard, sub.interned) {
        let proxy = &*snapshot.proxy_view(proxy);
        let input = eds::EdsListInput {
            client: eds::EdsClient::of(snapshot, proxy),
            names: eds::SharedNames(Arc::clone(names)),
            options: options.eds,
        };
        return snapshot
            .cached(input)
            .map(ResourceList::Shared)
            .unwrap_or_default();
    }
    let wildcard_names: BTreeSet<String>;
    let names = if sub.wildcard {
        // Every EDS cluster: each service port, and each subset of the rule in force.
        wildcard_names = snapshot
            .services()
            .visible_to(&proxy.namespace)
            .flat_map(|s| cluster_names(snapshot, proxy, s))
            // SNI-DNAT twins only when CDS names them.
            .filter(|n| !n.starts_with("outbound_."))
            .collect();
        &wildcard_names
    } else {
        sub.names
    };
    let mut in_scope: Vec<&str> = Vec::new();
    match scope {
        // An incremental push names a few hostnames; a proxy may watch thousands of
        // clusters. Look up the clusters those hostnames can have instead of scanning
        // every watched name.
        Scope::Hostnames(hosts) if !sub.wildcard => {
            for host in hosts.iter() {
                match snapshot.services().resolve(host, &proxy.namespace) {
                    Some(service) => {
                        for candidate in cluster_names(snapshot, proxy, service) {
                            if let Some(n) = names.get(&candidate) {
                                in_scope.push(n);
                            }
                        }
                    }
                    None => in_scope.extend(
                        names
                            .iter()
                            .filter(|n| crate::xds::names::host_of(n) == *host)
                            .map(String::as_str),
                    ),
                }
            }
        }
        Scope::Hostnames(hosts) => in_scope.extend(
            names
                .iter()
                .filter(|n| hosts.contains(crate::xds::names::host_of(n)))
                .map(String::as_str),
        ),
        // Names handed over by the watch index that are still watched, by host: those
        // of the service the proxy resolves the hostname to, or, when the service is
        // gone, whatever it still watches for it.
        Scope::Names(changed) => {
            let mut by_host: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
            for n in changed.iter().filter_map(|n| names.get(n)) {
                by_host
                    .entry(crate::xds::names::host_of(n))
                    .or_default()
                    .push(n);
            }
            for (host, candidates) in by_host {
                match snapshot.services().resolve(host, &proxy.namespace) {
                    Some(service) => {
                        let own = cluster_names(snapshot, proxy, service);
                        in_scope.extend(
                            candidates
                                .into_iter()
                                .filter(|n| own.iter().any(|o| o == n)),
                        );
                    }
                    None => in_scope.extend(candidates),
                }
            }
        }
        Scope::All => in_scope.extend(names.iter().map(String::as_str)),
    }
    if in_scope.is_empty() {
        return ResourceList::default();
    }
    let proxy = &*snapshot.proxy_view(proxy);
    let client = eds::EdsClient::of(snapshot, proxy);
    in_scope
        .into_iter()
        .filter_map(|name| {
            let parsed = ClusterName::parse(name)?;
            let input = EdsInput::for_client(snapshot, &client, name, &parsed, options.eds);
            snapshot.cached(input)
        })
        .collect()
}

/// Every EDS cluster name `service` can have for `proxy`: each port, plain and for
/// each subset of the DestinationRule in force.
fn cluster_names(snapshot: &Snapshot, proxy: &Proxy, service: &Service) -> Vec<String> {
    let rule = snapshot.config().destination_rule(
        &proxy.namespace,
        service.namespace.as_str(),
        service.hostname.as_str(),
    );
    let subsets: Vec<&str> = std::iter::once("")
        .chain(
            rule.iter()
                .flat_map(|r| r.spec.subsets.iter().map(|s| s.name.as_str())),
        )
        .collect();
    let router = proxy.is_router();
    service
        .ports
        .iter()
        .flat_map(|p| {
            subsets.iter().flat_map(move |subset| {
                let host = service.hostname.as_str();
                let plain = crate::xds::names::outbound_name(p.port.get(), subset, host);
                let sni = router.then(|| crate::xds::names::sni_name(p.port.get(), subset, host));
                std::iter::once(plain).chain(sni)
            })
        })
        .collect()
}

/// The input of an Envoy proxy's listeners, and their cache key (with each listener's
/// name): the proxy as listeners see it and the ports it serves for its own services.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ListenerInput {
    pub client: Arc<ClientView>,
    /// The ports of the proxy's own service instances (sidecars; empty for gateways).
    pub inbound: Vec<lds::InboundPort>,
    /// The service ports a gateway's workload serves (port translation and
    /// gateway-service selection; empty for sidecars).
    pub targets: Vec<merged_gateway::GatewayTarget>,
    /// The proxy's address when it is an endpoint of a headless service, which then
    /// gives it no per-endpoint listener for itself; `None` otherwise, so that proxies
    /// that differ only in their address share listeners.
    pub headless_self: Option<std::net::IpAddr>,
}

/// Every listener of a [`ListenerInput`], generated at once and encoded, in order: an
/// entry of the cache that is never sent, which each listener's [`ListenerKey`] reads.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct ListenerSetKey(Arc<ListenerInput>);

/// What a [`ListenerSetKey`] generates.
#[derive(Debug)]
struct ListenerSet {
    listeners: Vec<Resource>,
    /// What building them found wrong in the config (outbound conflicts, rejected
    /// Gateway servers): read by `/debug/push_status` and the metrics.
    findings: Findings,
}

impl CacheInput<Snapshot> for ListenerSetKey {
    const TYPE: TypeUrl = TypeUrl::Listener;
    type Output = Arc<ListenerSet>;
    fn class(&self) -> Option<ProxyClass> {
        Some(self.0.class())
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Arc<ListenerSet>> {
        let (listeners, findings) = self.0.generate(snapshot);
        Some(Arc::new(ListenerSet {
            listeners: listeners
                .iter()
                .map(|l| EncodedResource::encode(TypeUrl::Listener, l.name.as_str(), l))
                .collect(),
            findings,
        }))
    }
    fn findings(set: &Arc<ListenerSet>) -> Option<&Findings> {
        Some(&set.findings)
    }
}

/// One listener of a [`ListenerInput`]: the cache key of its encoding, taken from the
/// input's [`ListenerSetKey`].
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct ListenerKey {
    input: Arc<ListenerInput>,
    name: Arc<str>,
}

impl CacheInput<Snapshot> for ListenerKey {
    const TYPE: TypeUrl = TypeUrl::Listener;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(self.input.class())
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let set = snapshot.cached(ListenerSetKey(self.input.clone()))?;
        set.listeners.iter().find(|l| l.name == self.name).cloned()
    }
}

impl ListenerInput {
    /// Every listener of this input, from the input and the snapshot alone, with
    /// what building them found wrong in the config.
    pub fn generate(
        &self,
        snapshot: &Snapshot,
    ) -> (
        Vec<envoy_types::pb::envoy::config::listener::v3::Listener>,
        Findings,
    ) {
        #[cfg(test)]
        tests::LISTENER_GENERATIONS.with(|n| n.set(n.get() + 1));
        let (mut listeners, findings) = if self.client.is_router() {
            lds::gateway_listener_set(snapshot, &self.client, &self.targets)
        } else {
            lds::sidecar_listener_set(snapshot, &self.client, &self.inbound, self.headless_self)
        };
        // Access logs, tracing, stats and metadata exchange, from the same input.
        telemetry::ProxyTelemetry::new(snapshot, &self.client)
            .apply_to_listeners(&mut listeners, self.client.is_router());
        // WasmPlugins' filter references, at their phases' places.
        wasm::apply_to_listeners(snapshot, &self.client, &mut listeners);
        (listeners, findings)
    }

    fn class(&self) -> ProxyClass {
        if self.client.is_router() {
            ProxyClass::Router
        } else {
            ProxyClass::Sidecar
        }
    }
}

/// LDS for Envoy: a gateway's listeners, or a sidecar's capture, outbound and inbound
/// listeners. Proxies with the same input share its listeners: the first one generates
/// them all once ([`ListenerSetKey`]) and caches each encoding under the input and the
/// listener's name ([`ListenerKey`]); the others find everything in the cache and
/// generate nothing.
fn listeners(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    let input = Arc::new(ListenerInput {
        client: Arc::new(proxy.client_view()),
        inbound: if proxy.is_router() {
            Vec::new()
        } else {
            inbound_ports(snapshot, proxy)
        },
        targets: router_targets(snapshot, proxy),
        headless_self: if proxy.is_router() {
            None
        } else {
            headless_self(snapshot, proxy)
        },
    });
    let Some(set) = snapshot.cached(ListenerSetKey(input.clone())) else {
        return Vec::new();
    };
    set.listeners
        .iter()
        .filter(|l| sub.wildcard || sub.names.contains(&*l.name))
        .filter_map(|l| {
            snapshot.cached(ListenerKey {
                input: input.clone(),
                name: l.name.clone(),
            })
        })
        .collect()
}

/// The service ports a router's workload serves; empty for other proxies.
fn router_targets(snapshot: &Snapshot, proxy: &Proxy) -> Vec<merged_gateway::GatewayTarget> {
    if proxy.is_router() {
        merged_gateway::gateway_targets(snapshot, proxy)
    } else {
        Vec::new()
    }
}

/// The proxy's first address when a headless service has an endpoint there (Istio
/// compares the first address only).
fn headless_self(snapshot: &Snapshot, proxy: &Proxy) -> Option<std::net::IpAddr> {
    let ip = *proxy.ip_addresses.first()?;
    snapshot
        .services_at(&ip)
        .iter()
        .filter_map(|key| snapshot.services().get(key))
        .any(|s| s.resolution == meshfed_registry::Resolution::Passthrough)
        .then_some(ip)
}

/// The ports a sidecar serves: its Sidecar's `ingress` ports when it has any (the
/// first listener of a port wins, as in Istio), else the target ports of its own
/// services (none on a proxy without interception, which must declare them).
pub(crate) fn inbound_ports(snapshot: &Snapshot, proxy: &Proxy) -> Vec<lds::InboundPort> {
    let mut out: Vec<lds::InboundPort> = match instances::sidecar_ingress(snapshot, proxy) {
        Some(sidecar) => {
            let interception_none = proxy.interception_none();
            let wildcard = if cds::v6_only(&proxy.ip_addresses) {
                "::"
            } else {
                "0.0.0.0"
            };
            sidecar
                .spec
                .ingress
                .iter()
                .filter_map(|ingress| {
                    let port = ingress.port.as_ref()?;
                    let number = u16::try_from(port.number).ok().filter(|n| *n > 0)?;
                    let bind = instances::binds_to_port(ingress.capture_mode, interception_none)
                        .then(|| {
                            if ingress.bind.is_empty() {
                                wildcard.to_string()
                            } else {
                                ingress.bind.clone()
                            }
                        });
                    let tls = ingress
                        .tls
                        .as_ref()
                        .and_then(lds::ingress_tls::IngressTls::from_settings);
                    let declared = meshfed_registry::Protocol::parse(&port.protocol);
                    let protocol = if tls.is_some() {
                        lds::ingress_tls::IngressTls::after_termination(declared)
                    } else {
                        declared
                    };
                    // Istio names a Sidecar ingress chain after its bind, else after
                    // the proxy's first address.
                    let name_bind = if !ingress.bind.is_empty() {
                        ingress.bind.clone()
                    } else {
                        proxy
                            .ip_addresses
                            .first()
                            .map_or_else(|| wildcard.to_string(), |ip| ip.to_string())
                    };
                    Some(lds::InboundPort {
                        bind,
                        declared: tls.is_some().then(|| lds::inbound::PortClass::of(declared)),
                        tls,
                        name_bind,
                        ..lds::InboundPort::for_protocol(number, protocol)
                    })
                })
                .collect()
        }
        None if proxy.interception_none() => Vec::new(),
        None => instances::proxy_instances(snapshot, proxy)
            .into_iter()
            .map(|i| lds::InboundPort::for_protocol(i.target_port, i.port.protocol))
            .collect(),
    };
    // Stable sort: the first declaration of a port is kept.
    out.sort_by_key(|p| p.target_port);
    out.dedup_by_key(|p| p.target_port);
    out
}

/// The input of an Envoy proxy's route table, and its cache key: the table's name and
/// the proxy as routes see it (namespace, cluster, labels, DNS domain, kind).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct RouteInput {
    pub client: Arc<ClientView>,
    pub name: Arc<str>,
    /// A gateway's service targets (see [`ListenerInput::targets`]).
    pub targets: Arc<Vec<merged_gateway::GatewayTarget>>,
}

impl CacheInput<Snapshot> for RouteInput {
    const TYPE: TypeUrl = TypeUrl::Route;
    type Output = Resource;
    fn class(&self) -> Option<ProxyClass> {
        Some(if self.client.is_router() {
            ProxyClass::Router
        } else {
            ProxyClass::Sidecar
        })
    }

    /// The route table, from the input and the snapshot alone; `None` when the proxy
    /// has no table of that name. A router's tables read its merged Gateways through
    /// the cache ([`MergedGatewayKey`]), so they share one merge.
    fn generate(&self, snapshot: &Snapshot) -> Option<Resource> {
        let config = if self.client.is_router() {
            let merged = snapshot.cached(MergedGatewayKey {
                labels: self.client.labels.clone(),
                targets: self.targets.clone(),
            })?;
            rds::gateway_route_config(snapshot, &self.client, &merged, &self.name)?
        } else {
            rds::sidecar_route_config_named(snapshot, &self.client, &self.name)?
        };
        Some(EncodedResource::encode(
            TypeUrl::Route,
            self.name.clone(),
            &config,
        ))
    }
}

/// The Gateways applying to a router, merged (see [`merged_gateway::MergedGateway`]): an
/// entry of the cache that is never sent, read by the router's route tables.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
struct MergedGatewayKey {
    labels: std::collections::BTreeMap<String, String>,
    targets: Arc<Vec<merged_gateway::GatewayTarget>>,
}

impl CacheInput<Snapshot> for MergedGatewayKey {
    const TYPE: TypeUrl = TypeUrl::Route;
    type Output = Arc<merged_gateway::MergedGateway>;
    fn class(&self) -> Option<ProxyClass> {
        Some(ProxyClass::Router)
    }
    fn generate(&self, snapshot: &Snapshot) -> Option<Arc<merged_gateway::MergedGateway>> {
        Some(Arc::new(merged_gateway::MergedGateway::build(
            snapshot,
            &self.labels,
            &self.targets,
        )))
    }
}

/// A router's gateway port map (see [`envoyfilter::route::GatewayPortMap`]): the port
/// of each gateway route configuration name of its merged Gateways, with the port
/// numbers of the servers behind it. Read through the cache the router's route tables
/// share ([`MergedGatewayKey`]).
fn gateway_port_map(snapshot: &Snapshot, proxy: &Proxy) -> envoyfilter::route::GatewayPortMap {
    let mut out = envoyfilter::route::GatewayPortMap::new();
    let Some(merged) = snapshot.cached(MergedGatewayKey {
        labels: proxy.labels.clone(),
        targets: Arc::new(router_targets(snapshot, proxy)),
    }) else {
        return out;
    };
    for name in merged.by_route.keys() {
        let (port, ..) = envoyfilter::route::parse_gateway_route_name(name);
        let servers = out.entry(port).or_default();
        for s in merged.route_servers(name) {
            servers.extend(s.server().port.as_ref().map(|p| p.number));
        }
    }
    out
}

/// RDS for Envoy: a sidecar's per-port tables (`"80"`) or a gateway's (`http.80`).
/// Only requested names are answered (RDS is never wildcard).
fn routes(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    let client = Arc::new(proxy.client_view());
    let targets = Arc::new(router_targets(snapshot, proxy));
    sub.names
        .iter()
        .filter_map(|name| {
            snapshot.cached(RouteInput {
                client: client.clone(),
                name: Arc::from(name.as_str()),
                targets: targets.clone(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use meshfed_registry::{Port, Protocol, ProviderId, Service};

    use super::*;
    use crate::generate::lds::tests::{default_mesh, proxy, snapshot};
    use crate::push::config_index::ConfigSet;

    thread_local! {
        /// How many times this thread generated a listener set.
        pub(super) static LISTENER_GENERATIONS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    }

    #[test]
    fn sidecars_with_the_same_input_share_one_generation_of_their_listeners() {
        let services: Vec<Service> = (0..20)
            .map(|i| {
                let mut s = Service::new(
                    format!("s{i}.default.svc.cluster.local"),
                    "default",
                    ProviderId::Mock,
                    "c1",
                );
                s.cluster_vips
                    .insert("c1".into(), vec![format!("10.0.0.{i}").parse().unwrap()]);
                s.ports
                    .push(Port::new("tcp", 9000 + i, Protocol::Tcp).unwrap());
                s
            })
            .collect();
        let snap = snapshot(services, ConfigSet::default(), default_mesh());
        let all = BTreeSet::new();
        let sub = || Subscription {
            wildcard: true,
            names: &all,
            interned: None,
        };
        let first = proxy(
            "sidecar~10.1.0.1~a-1.default~default.svc.cluster.local",
            serde_json::json!({"app": "a"}),
        );
        let second = proxy(
            "sidecar~10.1.0.2~a-2.default~default.svc.cluster.local",
            serde_json::json!({"app": "a"}),
        );
        let generations = || LISTENER_GENERATIONS.with(|n| n.get());
        let before = snap.cache().stats();
        let a = listeners(&snap, &first, sub());
        assert_eq!(generations(), 1);
        let after_first = snap.cache().stats();
        // The name list and every listener: one miss each.
        assert_eq!(after_first.misses - before.misses, a.len() as u64 + 1);
        let b = listeners(&snap, &second, sub());
        let after_second = snap.cache().stats();
        assert_eq!(
            after_second.misses, after_first.misses,
            "nothing encoded again"
        );
        assert_eq!(generations(), 1, "nothing generated again");
        assert_eq!(after_second.hits - after_first.hits, b.len() as u64 + 1);
        assert!(a.len() > 20, "{} listeners", a.len());
        assert!(a.iter().zip(&b).all(|(x, y)| Arc::ptr_eq(x, y)));
        // A named subscription gets those listeners, from the cache.
        let one: BTreeSet<String> = [a[3].name.to_string()].into();
        let named = listeners(
            &snap,
            &second,
            Subscription {
                wildcard: false,
                names: &one,
                interned: None,
            },
        );
        assert_eq!(named.len(), 1);
        assert!(Arc::ptr_eq(&named[0], &a[3]));
    }

    /// `n` services `s<i>.default.svc.cluster.local`, each with HTTP port `8000 + i`.
    fn http_services(n: u16) -> Vec<Service> {
        (0..n)
            .map(|i| {
                let mut s = Service::new(
                    format!("s{i}.default.svc.cluster.local"),
                    "default",
                    ProviderId::Mock,
                    "c1",
                );
                s.ports
                    .push(Port::new("http", 8000 + i, Protocol::Http).unwrap());
                s
            })
            .collect()
    }

    #[test]
    fn sidecars_with_the_same_facts_share_one_list_of_outbound_clusters() {
        let services = http_services(30);
        let snap = snapshot(services, ConfigSet::default(), default_mesh());
        let all = BTreeSet::new();
        let sub = || Subscription {
            wildcard: true,
            names: &all,
            interned: None,
        };
        let sidecar = |ip: &str, app: &str| {
            proxy(
                &format!("sidecar~{ip}~a.default~default.svc.cluster.local"),
                serde_json::json!({"app": app}),
            )
        };
        let outbound = |list: &[Resource]| -> Vec<Resource> {
            list.iter()
                .filter(|r| r.name.starts_with("outbound|"))
                .cloned()
                .collect()
        };
        let a = clusters(&snap, &sidecar("10.1.0.1", "a"), sub());
        assert_eq!(outbound(&a).len(), 30);
        let before = snap.cache().stats();
        let b = clusters(&snap, &sidecar("10.1.0.2", "a"), sub());
        let after = snap.cache().stats();
        // The list, the special and inbound clusters: not one look-up per service.
        assert!(
            after.hits - before.hits < 10,
            "{} look-ups",
            after.hits - before.hits
        );
        assert_eq!(after.misses, before.misses, "nothing generated again");
        let (a, b) = (outbound(&a), outbound(&b));
        assert!(a.iter().zip(&b).all(|(x, y)| Arc::ptr_eq(x, y)));
        // Other labels are other facts: a list of its own, of the same clusters.
        let before = snap.cache().stats();
        let c = outbound(&clusters(&snap, &sidecar("10.1.0.3", "c"), sub()));
        assert_eq!(
            snap.cache().stats().misses - before.misses,
            1,
            "its list only"
        );
        assert!(a.iter().zip(&c).all(|(x, y)| Arc::ptr_eq(x, y)));
    }

    #[test]
    fn sidecars_asking_for_the_same_clusters_share_one_list_of_assignments() {
        let services = http_services(30);
        let snap = snapshot(services, ConfigSet::default(), default_mesh());
        let names: Arc<BTreeSet<String>> = Arc::new(
            (0..30)
                .map(|i| format!("outbound|{}||s{i}.default.svc.cluster.local", 8000 + i))
                .chain(["outbound|80||unknown.default.svc.cluster.local".to_string()])
                .collect(),
        );
        let interned = || Subscription {
            wildcard: false,
            names: &names,
            interned: Some(&names),
        };
        let plain = || Subscription {
            wildcard: false,
            names: &names,
            interned: None,
        };
        let sidecar = |ip: &str| {
            proxy(
                &format!("sidecar~{ip}~a.default~default.svc.cluster.local"),
                serde_json::json!({"app": "a"}),
            )
        };
        let opts = GeneratorOptions::default();
        let eds = |p: &Proxy, sub: Subscription<'_>| {
            generate(TypeUrl::Endpoint, &snap, p, sub, Scope::All, &opts)
        };
        // The per-name answer and the shared list are the same assignments, in order,
        // the unknown cluster's placeholder included.
        let one_by_one = eds(&sidecar("10.1.0.1"), plain());
        assert_eq!(one_by_one.len(), 31);
        let listed = eds(&sidecar("10.1.0.1"), interned());
        assert!(
            one_by_one
                .iter()
                .zip(&listed)
                .all(|(x, y)| Arc::ptr_eq(x, y))
        );
        assert_eq!(listed.len(), 31);
        // A second sidecar of the same facts: one look-up, nothing generated.
        let before = snap.cache().stats();
        let again = eds(&sidecar("10.1.0.2"), interned());
        let after = snap.cache().stats();
        assert_eq!(
            after.hits - before.hits,
            2,
            "the client facts check and the list"
        );
        assert_eq!(after.misses, before.misses);
        assert!(listed.iter().zip(&again).all(|(x, y)| Arc::ptr_eq(x, y)));
        // Another name set is another list, of the same assignments.
        let fewer: Arc<BTreeSet<String>> = Arc::new(names.iter().take(3).cloned().collect());
        let before = snap.cache().stats();
        let some = eds(
            &sidecar("10.1.0.2"),
            Subscription {
                wildcard: false,
                names: &fewer,
                interned: Some(&fewer),
            },
        );
        assert_eq!(
            snap.cache().stats().misses - before.misses,
            1,
            "its list only"
        );
        assert!(some.iter().zip(&listed).all(|(x, y)| Arc::ptr_eq(x, y)));
    }

    #[test]
    fn labels_split_the_shared_assignments_only_under_a_failover_priority() {
        use meshfed_api::networking::v1alpha3::{
            DestinationRule, LoadBalancerSettings, LocalityLoadBalancerSetting, TrafficPolicy,
        };
        let services = http_services(3);
        let names: Arc<BTreeSet<String>> = Arc::new(
            (0..3)
                .map(|i| format!("outbound|{}||s{i}.default.svc.cluster.local", 8000 + i))
                .collect(),
        );
        let sidecar = |ip: &str, app: &str| {
            proxy(
                &format!("sidecar~{ip}~a.default~default.svc.cluster.local"),
                serde_json::json!({ "app": app }),
            )
        };
        // Lists generated for two sidecars of different deployments.
        let lists_for_two = |set: ConfigSet| {
            let snap = snapshot(services.clone(), set, default_mesh());
            let opts = GeneratorOptions::default();
            let sub = Subscription {
                wildcard: false,
                names: &names,
                interned: Some(&names),
            };
            let before = snap.cache().stats();
            for p in [sidecar("10.1.0.1", "a"), sidecar("10.1.0.2", "b")] {
                generate(TypeUrl::Endpoint, &snap, &p, sub, Scope::All, &opts);
            }
            let after = snap.cache().stats();
            // Misses: each list, each assignment, the client facts check.
            after.misses - before.misses
        };
        assert_eq!(lists_for_two(ConfigSet::default()), 1 + 3 + 1, "one list");
        let rule = DestinationRule {
            host: "s0.default.svc.cluster.local".into(),
            subsets: vec![meshfed_api::networking::v1alpha3::Subset {
                name: "v1".into(),
                traffic_policy: Some(TrafficPolicy {
                    load_balancer: Some(LoadBalancerSettings {
                        locality_lb_setting: Some(LocalityLoadBalancerSetting {
                            failover_priority: vec!["app".into()],
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let set = ConfigSet {
            destination_rules: vec![crate::push::config_index::Config {
                name: "s0".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: rule,
            }],
            ..Default::default()
        };
        assert_eq!(lists_for_two(set), 2 + 3 + 1, "a list per deployment");
    }

    #[test]
    fn a_node_local_service_sends_each_sidecar_the_endpoints_of_its_node() {
        use crate::generate::lds::outbound::tests::snapshot_with_endpoints;
        use crate::generate::lds::tests::proxy_with;
        use meshfed_registry::{Endpoint, WorkloadMeta};
        let mut svc = Service::new(
            "a.default.svc.cluster.local",
            "default",
            ProviderId::Kubernetes,
            "c1",
        );
        svc.cluster_vips
            .insert("c1".into(), vec!["10.0.0.1".parse().unwrap()]);
        svc.ports
            .push(Port::new("http", 80, Protocol::Http).unwrap());
        svc.node_local = true;
        let on = |ip: &str, node: &str| {
            let mut e = Endpoint::new(ip.parse().unwrap()).with_port("http", 8080);
            e.workload = Some(Arc::new(WorkloadMeta {
                node_name: node.into(),
                ..Default::default()
            }));
            e
        };
        let snap = snapshot_with_endpoints(vec![(
            ProviderId::Kubernetes,
            vec![(svc, vec![on("10.1.0.1", "n1"), on("10.1.0.2", "n2")])],
        )]);
        let names: BTreeSet<String> =
            ["outbound|80||a.default.svc.cluster.local".to_string()].into();
        let sub = Subscription {
            wildcard: false,
            names: &names,
            interned: None,
        };
        let endpoints_for = |node: &str| {
            let p = proxy_with(
                "sidecar~10.2.0.1~c.default~default.svc.cluster.local",
                serde_json::json!({"NODE_NAME": node}),
            );
            let out = generate(
                TypeUrl::Endpoint,
                &snap,
                &p,
                sub,
                Scope::All,
                &GeneratorOptions::default(),
            );
            let cla: envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment =
                prost::Message::decode(out[0].body.value.clone()).unwrap();
            cla.endpoints
                .iter()
                .map(|g| g.lb_endpoints.len())
                .sum::<usize>()
        };
        assert_eq!(endpoints_for("n1"), 1);
        assert_eq!(endpoints_for("n2"), 1);
        assert_eq!(endpoints_for("n3"), 0);
    }
}

//! Generators: pure functions from (proxy, snapshot indexes, watched names) to encoded
//! resources. Each resource is looked up in the snapshot's cache under the arguments
//! that decide it, so proxies that would get the same bytes share them.

pub mod cds;
pub mod eds;
pub mod grpc;
pub mod instances;
pub mod lds;
pub mod policy;
pub mod rds;
pub mod simulate;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;

use meshfed_registry::{ConfigKind, Service};

use crate::ads::node::{Generator, Proxy};
use crate::networks::NetworkView;
use crate::push::snapshot::Snapshot;
use crate::resource::{CacheKey, EncodedResource, Resource, TypeUrl, view_digest};
use cds::{ClusterName, Direction};
use eds::EdsOptions;

/// Generator settings that come from flags and the mesh config.
#[derive(Clone, Copy, Debug, Default)]
pub struct GeneratorOptions {
    pub eds: EdsOptions,
}

/// What a connection subscribed to for one type.
#[derive(Clone, Copy, Debug)]
pub struct Subscription<'a> {
    /// Everything of the type (CDS/LDS with no names, or Delta `*`).
    pub wildcard: bool,
    /// Explicitly named resources.
    pub names: &'a BTreeSet<String>,
}

/// How much of a type a push needs.
#[derive(Clone, Copy, Debug)]
pub enum Scope<'a> {
    /// Every subscribed resource.
    All,
    /// Only resources derived from these hostnames (incremental EDS).
    Hostnames(&'a HashSet<&'a str>),
}

/// Whether the `type_url` config of `proxy` may read objects of `kind`: a push whose
/// every change is of kinds no generator of the type reads skips the type for that
/// proxy (generating it would give what the proxy already holds). Conservative: only
/// the pairs known to be independent answer `false`, and must stay in step with the
/// generators.
///
/// - VirtualServices are read by Envoy sidecars' RDS only (sidecar listeners, clusters
///   and endpoints never look at them): a VirtualService change costs a sidecar its
///   route tables alone, not the regeneration of ~2 MB of CDS, EDS and LDS.
///   Gateways read them in LDS (TLS and TCP routes) and proxyless clients throughout.
pub fn reads(proxy: &Proxy, type_url: TypeUrl, kind: ConfigKind) -> bool {
    let sidecar = proxy.generator == Generator::Envoy && !proxy.is_router();
    match kind {
        ConfigKind::VirtualService if sidecar => type_url == TypeUrl::Route,
        _ => true,
    }
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
) -> Vec<Resource> {
    if type_url == TypeUrl::Endpoint {
        // Incremental EDS reaches every connection, most of which watch none of the
        // changed hostnames: the proxy is resolved only when something is in scope.
        return load_assignments(snapshot, proxy, subscription, scope, options);
    }
    let proxy = &*snapshot.proxy_view(proxy);
    // Proxyless gRPC gets its own listeners, routes and clusters; endpoints are shared.
    if proxy.generator == Generator::Grpc {
        return grpc::generate(type_url, snapshot, proxy, subscription);
    }
    match type_url {
        TypeUrl::Cluster => clusters(snapshot, proxy, subscription),
        TypeUrl::Listener => listeners(snapshot, proxy, subscription),
        TypeUrl::Route => routes(snapshot, proxy, subscription),
        TypeUrl::Endpoint => Vec::new(), // answered above
    }
}

fn clusters(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    // As istiod: gateways get no passthrough cluster; sidecars also get their inbound
    // clusters and InboundPassthroughCluster.
    let sidecar = proxy.node_type == crate::ads::node::NodeType::Sidecar;
    if sub.wildcard {
        let mut out = Vec::new();
        for service in snapshot.visible_services(proxy) {
            for port in &service.ports {
                if port.protocol != meshfed_registry::Protocol::Udp {
                    out.extend(cds::cached_service_clusters(snapshot, proxy, service, port));
                }
            }
        }
        out.push(special_cluster(snapshot, cds::BLACK_HOLE));
        if !proxy.is_router() {
            out.push(special_cluster(snapshot, cds::PASSTHROUGH));
        }
        if sidecar {
            out.extend(cds::cached_inbound(snapshot, proxy));
        }
        return out;
    }
    let mut inbound: Option<Vec<Resource>> = None;
    sub.names
        .iter()
        .filter_map(|name| match name.as_str() {
            cds::BLACK_HOLE | cds::PASSTHROUGH => Some(special_cluster(snapshot, name)),
            _ => {
                let parsed = ClusterName::parse(name).map(|p| p.direction);
                if name == cds::INBOUND_PASSTHROUGH || parsed == Some(Direction::Inbound) {
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
                    .services
                    .resolve(parsed.hostname, &proxy.namespace)?;
                let port = service.port(parsed.port)?;
                cds::cached_outbound(snapshot, proxy, service, port, parsed.subset)
            }
        })
        .collect()
}

fn special_cluster(snapshot: &Snapshot, name: &str) -> Resource {
    let key = CacheKey {
        type_url: TypeUrl::Cluster,
        name: Arc::from(name),
        view: 0,
    };
    snapshot
        .cache
        .get_or_insert(key, None, || {
            let cluster = if name == cds::BLACK_HOLE {
                cds::black_hole(&snapshot.mesh.config)
            } else {
                cds::passthrough(&snapshot.mesh.config)
            };
            Some(EncodedResource::encode(TypeUrl::Cluster, name, &cluster))
        })
        .expect("special clusters always generate")
}

fn load_assignments(
    snapshot: &Snapshot,
    proxy: &Proxy,
    sub: Subscription<'_>,
    scope: Scope<'_>,
    options: &GeneratorOptions,
) -> Vec<Resource> {
    // Networks and gateways for split horizon: small, built once per push.
    let networks = Arc::new(NetworkView::new(
        &snapshot.mesh.networks,
        &snapshot.gateways,
    ));
    let wildcard_names: BTreeSet<String>;
    let names = if sub.wildcard {
        // Every EDS cluster: each service port, and each subset of the rule in force.
        wildcard_names = snapshot
            .services
            .visible_to(&proxy.namespace)
            .flat_map(|s| cluster_names(snapshot, proxy, s))
            .collect();
        &wildcard_names
    } else {
        sub.names
    };
    let in_scope: Vec<&String> = match scope {
        // An incremental push names a few hostnames; a proxy may watch thousands of
        // clusters. Look up the clusters those hostnames can have instead of scanning
        // every watched name.
        Scope::Hostnames(hosts) if !sub.wildcard => {
            let mut found = Vec::new();
            for host in hosts.iter() {
                match snapshot.services.resolve(host, &proxy.namespace) {
                    Some(service) => {
                        found.extend(
                            cluster_names(snapshot, proxy, service)
                                .iter()
                                .filter_map(|candidate| names.get(candidate)),
                        );
                    }
                    // The service is gone: whatever the proxy still watches for it.
                    None => {
                        found.extend(names.iter().filter(|n| n.rsplit('|').next() == Some(*host)))
                    }
                }
            }
            found
        }
        Scope::Hostnames(hosts) => names
            .iter()
            .filter(|n| n.rsplit('|').next().is_some_and(|h| hosts.contains(h)))
            .collect(),
        Scope::All => names.iter().collect(),
    };
    if in_scope.is_empty() {
        return Vec::new();
    }
    let proxy = &*snapshot.proxy_view(proxy);
    in_scope
        .into_iter()
        .filter_map(|name| {
            let parsed = ClusterName::parse(name)?;
            Some(load_assignment(
                snapshot, &networks, proxy, name, &parsed, options,
            ))
        })
        .collect()
}

/// Every EDS cluster name `service` can have for `proxy`: each port, plain and for
/// each subset of the DestinationRule in force.
fn cluster_names(snapshot: &Snapshot, proxy: &Proxy, service: &Service) -> Vec<String> {
    let rule = snapshot.config.destination_rule(
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
    service
        .ports
        .iter()
        .flat_map(|p| {
            subsets.iter().map(move |subset| {
                cds::outbound_name(p.port.get(), subset, service.hostname.as_str())
            })
        })
        .collect()
}

fn load_assignment(
    snapshot: &Snapshot,
    networks: &Arc<NetworkView>,
    proxy: &Proxy,
    name: &str,
    parsed: &ClusterName<'_>,
    options: &GeneratorOptions,
) -> Resource {
    let service = snapshot.services.resolve(parsed.hostname, &proxy.namespace);
    // The service, its port, and how this proxy sees them (subset labels, locality
    // load balancing of the DestinationRule in force, its network when split horizon
    // applies); none for a gone service, port or subset.
    let found = service.and_then(|s| {
        let port = s.port(parsed.port)?;
        let view = eds::AssignmentView::new(snapshot, networks, proxy, s, port, parsed.subset)?;
        Some((s, port, view))
    });
    let mut parts: Vec<String> = vec![
        service
            .map(|s| s.namespace.as_str())
            .unwrap_or("")
            .to_string(),
    ];
    if let Some((_, _, view)) = &found {
        parts.extend(view.digest_parts());
    }
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let key = CacheKey {
        type_url: TypeUrl::Endpoint,
        name: Arc::from(name),
        view: view_digest(&parts),
    };
    let hostname = meshfed_registry::Hostname::new(parsed.hostname);
    snapshot
        .cache
        .get_or_insert(key, Some(&hostname), || {
            // A watched cluster whose service, port or subset is gone gets an empty
            // assignment (a placeholder, see EncodedResource), so a SotW client never
            // waits on it.
            Some(match &found {
                Some((service, port, view)) => {
                    let shards = snapshot.shards(&service.key()).map(|s| &**s);
                    let cla =
                        eds::load_assignment_for(name, port, shards, &view.selection(options.eds));
                    EncodedResource::encode(TypeUrl::Endpoint, name, &cla)
                }
                None => {
                    let empty = ClusterLoadAssignment {
                        cluster_name: name.to_string(),
                        ..Default::default()
                    };
                    EncodedResource::encode_placeholder(TypeUrl::Endpoint, name, &empty)
                }
            })
        })
        .expect("load assignments always generate")
}

/// LDS for Envoy: a gateway's listeners, or a sidecar's capture, outbound and inbound
/// listeners. Cached per snapshot under the proxy properties they depend on.
fn listeners(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    let labels: Vec<String> = proxy
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let cluster = proxy.cluster_id.as_ref().map(|c| c.as_str()).unwrap_or("");
    let ips: Vec<String> = proxy.ip_addresses.iter().map(ToString::to_string).collect();
    let mut parts = vec![
        proxy.namespace.as_str(),
        cluster,
        if proxy.is_router() {
            "router"
        } else {
            "sidecar"
        },
    ];
    parts.extend(labels.iter().map(String::as_str));
    parts.extend(ips.iter().map(String::as_str));
    let view = view_digest(&parts);
    let built = if proxy.is_router() {
        lds::gateway_listeners(snapshot, proxy)
    } else {
        lds::sidecar_listeners(snapshot, proxy, &inbound_ports(snapshot, proxy))
    };
    built
        .into_iter()
        .filter(|l| sub.wildcard || sub.names.contains(&l.name))
        .filter_map(|listener| {
            let name: Arc<str> = Arc::from(listener.name.as_str());
            let key = CacheKey {
                type_url: TypeUrl::Listener,
                name: name.clone(),
                view,
            };
            snapshot.cache.get_or_insert(key, None, || {
                Some(EncodedResource::encode(TypeUrl::Listener, name, &listener))
            })
        })
        .collect()
}

/// The ports a sidecar serves for its own services.
fn inbound_ports(snapshot: &Snapshot, proxy: &Proxy) -> Vec<lds::InboundPort> {
    let mut out: Vec<lds::InboundPort> = instances::proxy_instances(snapshot, proxy)
        .into_iter()
        .map(|i| lds::InboundPort {
            target_port: i.target_port,
            http: i.port.protocol.is_http(),
        })
        .collect();
    out.sort_by_key(|p| p.target_port);
    out.dedup_by_key(|p| p.target_port);
    out
}

/// RDS for Envoy: a sidecar's per-port tables (`"80"`) or a gateway's (`http.80`).
/// Only requested names are answered (RDS is never wildcard).
fn routes(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    let labels: Vec<String> = proxy
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let cluster = proxy.cluster_id.as_ref().map(|c| c.as_str()).unwrap_or("");
    let kind = if proxy.is_router() {
        "router"
    } else {
        "sidecar"
    };
    let mut parts = vec![proxy.namespace.as_str(), cluster, kind];
    parts.extend(labels.iter().map(String::as_str));
    let view = view_digest(&parts);
    sub.names
        .iter()
        .filter_map(|name| {
            let key = CacheKey {
                type_url: TypeUrl::Route,
                name: Arc::from(name.as_str()),
                view,
            };
            snapshot.cache.get_or_insert(key, None, || {
                let config = if proxy.is_router() {
                    rds::gateway_route_config(snapshot, proxy, name)?
                } else {
                    rds::sidecar_route_config(snapshot, proxy, name.parse().ok()?)
                };
                Some(EncodedResource::encode(
                    TypeUrl::Route,
                    name.as_str(),
                    &config,
                ))
            })
        })
        .collect()
}

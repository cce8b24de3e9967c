//! Generators: pure functions from (proxy, snapshot indexes, watched names) to encoded
//! resources. Each resource is looked up in the snapshot's cache under the arguments
//! that decide it, so proxies that would get the same bytes share them.

pub mod cds;
pub mod eds;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use meshfed_registry::{Port, Service};

use crate::ads::node::Proxy;
use crate::push::snapshot::Snapshot;
use crate::resource::{CacheKey, EncodedResource, Resource, TypeUrl, view_digest};
use cds::{ClusterName, ClusterOptions, Direction};
use eds::EdsOptions;

/// Generator settings that come from flags and the mesh config.
#[derive(Clone, Copy, Debug, Default)]
pub struct GeneratorOptions {
    pub eds: EdsOptions,
}

/// Cluster settings from the snapshot's mesh config.
fn cluster_options(snapshot: &Snapshot) -> ClusterOptions {
    ClusterOptions {
        connect_timeout: snapshot.connect_timeout(),
    }
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

/// Generates the resources of `type_url` that `proxy` subscribed to.
pub fn generate(
    type_url: TypeUrl,
    snapshot: &Snapshot,
    proxy: &Proxy,
    subscription: Subscription<'_>,
    scope: Scope<'_>,
    options: &GeneratorOptions,
) -> Vec<Resource> {
    match type_url {
        TypeUrl::Cluster => clusters(snapshot, proxy, subscription),
        TypeUrl::Endpoint => load_assignments(snapshot, proxy, subscription, scope, options),
        // Listeners and routes need the Istio config API; until then there are none,
        // and an empty answer lets clients finish their initial fetch.
        TypeUrl::Listener | TypeUrl::Route => Vec::new(),
    }
}

fn clusters(snapshot: &Snapshot, proxy: &Proxy, sub: Subscription<'_>) -> Vec<Resource> {
    if sub.wildcard {
        let mut out = Vec::new();
        for service in snapshot.services.visible_to(&proxy.namespace) {
            for port in &service.ports {
                out.extend(outbound_cluster(snapshot, service, port));
            }
        }
        out.push(special_cluster(snapshot, cds::BLACK_HOLE));
        out.push(special_cluster(snapshot, cds::PASSTHROUGH));
        return out;
    }
    sub.names
        .iter()
        .filter_map(|name| match name.as_str() {
            cds::BLACK_HOLE | cds::PASSTHROUGH => Some(special_cluster(snapshot, name)),
            _ => {
                let parsed = ClusterName::parse(name)?;
                if parsed.direction != Direction::Outbound || !parsed.subset.is_empty() {
                    return None;
                }
                let service = snapshot
                    .services
                    .resolve(parsed.hostname, &proxy.namespace)?;
                let port = service.port(parsed.port)?;
                outbound_cluster(snapshot, service, port)
            }
        })
        .collect()
}

fn outbound_cluster(snapshot: &Snapshot, service: &Arc<Service>, port: &Port) -> Option<Resource> {
    let name: Arc<str> = Arc::from(cds::outbound_name(
        port.port.get(),
        "",
        service.hostname.as_str(),
    ));
    let key = CacheKey {
        type_url: TypeUrl::Cluster,
        name: name.clone(),
        view: view_digest(&[service.namespace.as_str()]),
    };
    snapshot
        .cache
        .get_or_insert(key, Some(&service.hostname), || {
            let shards = snapshot.shards(&service.key()).map(|s| &**s);
            let cluster = cds::outbound_cluster(service, port, shards, cluster_options(snapshot));
            Some(EncodedResource::encode(
                TypeUrl::Cluster,
                name.clone(),
                &cluster,
            ))
        })
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
                cds::black_hole(cluster_options(snapshot))
            } else {
                cds::passthrough(cluster_options(snapshot))
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
    let wildcard_names: BTreeSet<String>;
    let names = if sub.wildcard {
        wildcard_names = snapshot
            .services
            .visible_to(&proxy.namespace)
            .flat_map(|s| {
                s.ports
                    .iter()
                    .map(|p| cds::outbound_name(p.port.get(), "", s.hostname.as_str()))
            })
            .collect();
        &wildcard_names
    } else {
        sub.names
    };
    names
        .iter()
        .filter_map(|name| {
            let parsed = ClusterName::parse(name)?;
            if let Scope::Hostnames(hosts) = scope
                && !hosts.contains(parsed.hostname)
            {
                return None;
            }
            Some(load_assignment(snapshot, proxy, name, &parsed, options))
        })
        .collect()
}

fn load_assignment(
    snapshot: &Snapshot,
    proxy: &Proxy,
    name: &str,
    parsed: &ClusterName<'_>,
    options: &GeneratorOptions,
) -> Resource {
    let service = snapshot.services.resolve(parsed.hostname, &proxy.namespace);
    let namespace = service.map(|s| s.namespace.as_str()).unwrap_or("");
    let key = CacheKey {
        type_url: TypeUrl::Endpoint,
        name: Arc::from(name),
        view: view_digest(&[namespace]),
    };
    let hostname = meshfed_registry::Hostname::new(parsed.hostname);
    snapshot
        .cache
        .get_or_insert(key, Some(&hostname), || {
            // A watched cluster whose service or port is gone gets an empty assignment
            // (a placeholder, see EncodedResource), so a SotW client never waits on it.
            Some(
                match service.and_then(|s| Some((s, s.port(parsed.port)?))) {
                    Some((service, port)) => {
                        let shards = snapshot.shards(&service.key()).map(|s| &**s);
                        let cla = eds::load_assignment(name, port, shards, options.eds);
                        EncodedResource::encode(TypeUrl::Endpoint, name, &cla)
                    }
                    None => {
                        let empty = ClusterLoadAssignment {
                            cluster_name: name.to_string(),
                            ..Default::default()
                        };
                        EncodedResource::encode_placeholder(TypeUrl::Endpoint, name, &empty)
                    }
                },
            )
        })
        .expect("load assignments always generate")
}

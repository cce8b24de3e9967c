//! `CLUSTER` patches (Istio's `cluster_patch.go`): `MERGE` into matching clusters (a
//! `transport_socket` in the value merges into the cluster's socket of the same name
//! through its `Any` type, or replaces it), `REMOVE` of matching clusters, `ADD` of new
//! clusters (whole lists only; a patch without context adds to sidecar outbound and
//! gateway clusters only).

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use meshfed_api::networking::v1alpha3::envoy_filter::{
    ApplyTo, PatchContext, envoy_config_object_match::ObjectTypes, patch::Operation,
};
use prost::Message;

use super::{Patch, ProxyPatches, context, status, value};
use crate::model::Proxy;
use crate::xds::names::{ClusterName, Direction, INBOUND_PASSTHROUGH};
use crate::xds::{EncodedResource, Resource, TypeUrl};

/// Whether a patch's cluster match holds for `c` (Istio's `clusterMatch`): a name, or
/// the service, subset and port parsed from the cluster name; an inbound cluster's
/// service is any of `hosts` when given.
pub fn cluster_match(c: &Cluster, p: &Patch, hosts: &[&str]) -> bool {
    let Some(ObjectTypes::Cluster(m)) = &p.matcher.object_types else {
        return true;
    };
    if !m.name.is_empty() {
        return m.name == c.name;
    }
    let parsed = ClusterName::parse(&c.name);
    let (subset, host, port) = parsed
        .as_ref()
        .map_or(("", "", 0), |n| (n.subset, n.hostname, u32::from(n.port)));
    if !m.subset.is_empty() && m.subset != subset {
        return false;
    }
    let inbound = parsed
        .as_ref()
        .is_some_and(|n| n.direction == Direction::Inbound);
    if !m.service.is_empty() {
        let found = if inbound && !hosts.is_empty() {
            hosts.contains(&m.service.as_str())
        } else {
            m.service == host
        };
        if !found {
            return false;
        }
    }
    m.port_number == 0 || m.port_number == port
}

fn ts_config(ts: &TransportSocket) -> Option<&envoy_types::pb::google::protobuf::Any> {
    match &ts.config_type {
        Some(transport_socket::ConfigType::TypedConfig(a)) => Some(a),
        None => None,
    }
}

/// Istio's `mergeTransportSocketCluster`: `Ok(true)` when the value's transport socket
/// was handled (merged, replaced or dropped) and the rest of the value is not merged.
fn merge_transport_socket(c: &mut Cluster, v: &Cluster) -> Result<bool, String> {
    let Some(src) = &v.transport_socket else {
        return Ok(false);
    };
    let target: Option<&mut TransportSocket> = if !c.transport_socket_matches.is_empty() {
        let found = c
            .transport_socket_matches
            .iter_mut()
            .filter_map(|m| m.transport_socket.as_mut())
            .find(|ts| ts.name == src.name);
        match found {
            Some(ts) => Some(ts),
            // A socket beside socket matches would be invalid: dropped.
            None => return Ok(true),
        }
    } else {
        c.transport_socket.as_mut().filter(|ts| ts.name == src.name)
    };
    match target {
        None => c.transport_socket = Some(src.clone()),
        Some(ts) => {
            if let (Some(d), Some(s)) = (ts_config(ts), ts_config(src)) {
                let merged = value::merge_any(d, s)?;
                ts.config_type = Some(transport_socket::ConfigType::TypedConfig(merged));
            }
        }
    }
    Ok(true)
}

/// Patches one cluster; `None` when a patch removes it.
pub(crate) fn patch_cluster(
    patches: &[std::sync::Arc<Patch>],
    ctx: PatchContext,
    mut c: Cluster,
    hosts: &[&str],
) -> Option<Cluster> {
    for p in patches {
        let matches = p.context_matches(ctx) && cluster_match(&c, p, hosts);
        if p.operation == Operation::Remove && matches {
            status::record(&p.key, "cluster", true);
            return None;
        }
        if p.operation != Operation::Merge {
            continue;
        }
        if !matches {
            status::record(&p.key, "cluster", false);
            continue;
        }
        if let Some(bytes) = &p.cluster_merge {
            // The value's encoding merged in: `value::merge` without the round trip.
            if let Err(e) = c.merge(bytes.as_slice()) {
                status::reject(&p.key, "cluster", &e.to_string());
                continue;
            }
            status::record(&p.key, "cluster", true);
            continue;
        }
        let Some(v) = p.typed::<Cluster>() else {
            continue;
        };
        match merge_transport_socket(&mut c, &v) {
            Err(e) => {
                tracing::debug!(envoy_filter = &*p.key, "transport socket merge failed: {e}");
                continue;
            }
            Ok(true) => {}
            Ok(false) => {
                if let Some(src) = &p.value
                    && let Err(e) = value::merge_into(&mut c, src)
                {
                    status::reject(&p.key, "cluster", &e);
                    continue;
                }
            }
        }
        status::record(&p.key, "cluster", true);
    }
    Some(c)
}

/// Istio's `InsertedClusters`: the clusters `ADD` patches add in `ctx`.
pub fn inserted(patches: &ProxyPatches, ctx: PatchContext) -> Vec<Cluster> {
    patches
        .of(ApplyTo::Cluster)
        .iter()
        .filter(|p| p.operation == Operation::Add)
        .filter(|p| {
            p.matcher.context != PatchContext::Any as i32
                || matches!(ctx, PatchContext::SidecarOutbound | PatchContext::Gateway)
        })
        .filter(|p| p.context_matches(ctx))
        .filter_map(|p| {
            status::record(&p.key, "cluster", true);
            p.typed::<Cluster>()
        })
        .collect()
}

/// The hostnames of the services a sidecar's inbound clusters serve, by the port of
/// the cluster (the workload's target port): Istio matches a `service` against them
/// for an inbound cluster, whose name carries no service.
pub type InboundHosts = std::collections::BTreeMap<u32, Vec<String>>;

/// Whether some `CLUSTER` patch of `patches` that can apply to inbound clusters
/// (`ANY` or `SIDECAR_INBOUND`) matches a `service`: only those read a sidecar's
/// [`InboundHosts`].
pub fn matches_inbound_services(patches: &ProxyPatches) -> bool {
    patches.of(ApplyTo::Cluster).iter().any(|p| {
        p.context_matches(PatchContext::SidecarInbound)
            && matches!(&p.matcher.object_types, Some(ObjectTypes::Cluster(m)) if !m.service.is_empty())
    })
}

/// `proxy`'s [`InboundHosts`]: for each target port of its workload, the services it
/// serves there (Istio's service targets of the inbound cluster).
pub fn inbound_hosts(snapshot: &crate::push::snapshot::Snapshot, proxy: &Proxy) -> InboundHosts {
    let mut out = InboundHosts::new();
    for i in crate::generate::instances::proxy_instances(snapshot, proxy) {
        let hosts = out.entry(u32::from(i.target_port)).or_default();
        let host = i.service.hostname.as_str();
        if !hosts.iter().any(|h| h == host) {
            hosts.push(host.to_string());
        }
    }
    out
}

/// Whether `r` is an inbound cluster (inbound patch context).
pub fn is_inbound(r: &Resource) -> bool {
    r.name.as_ref() == INBOUND_PASSTHROUGH
        || ClusterName::parse(&r.name).is_some_and(|n| n.direction == Direction::Inbound)
}

/// One cluster of `proxy` (inbound clusters serving `inbound`) patched: `None` when a
/// patch removed it; the same resource when nothing changed it.
pub fn patch_one(
    patches: &ProxyPatches,
    r: &Resource,
    proxy: &Proxy,
    inbound: &InboundHosts,
) -> Option<Resource> {
    let Ok(c) = Cluster::decode(r.body.value.as_ref()) else {
        return Some(r.clone());
    };
    let is_in = is_inbound(r);
    let ctx = context(proxy, is_in);
    let hosts: Vec<&str> = if is_in {
        ClusterName::parse(&c.name)
            .and_then(|n| inbound.get(&u32::from(n.port)))
            .map(|h| h.iter().map(String::as_str).collect())
            .unwrap_or_default()
    } else {
        Vec::new()
    };
    match patch_cluster(patches.of(ApplyTo::Cluster), ctx, c.clone(), &hosts)? {
        p if p == c => Some(r.clone()),
        p => Some(EncodedResource::encode(
            TypeUrl::Cluster,
            p.name.clone(),
            &p,
        )),
    }
}

/// The clusters `ADD` patches give `proxy` (a whole list asked for); `inbound_seen`:
/// the list has inbound clusters (inbound additions then count too).
pub fn added(patches: &ProxyPatches, proxy: &Proxy, inbound_seen: bool) -> Vec<Resource> {
    let mut contexts = vec![context(proxy, false)];
    if !proxy.is_router() && inbound_seen {
        contexts.push(PatchContext::SidecarInbound);
    }
    contexts
        .into_iter()
        .flat_map(|ctx| inserted(patches, ctx))
        .map(|c| EncodedResource::encode(TypeUrl::Cluster, c.name.clone(), &c))
        .collect()
}

/// Patches `clusters` of `proxy` (inbound clusters serving `inbound`).
pub fn apply(
    patches: &ProxyPatches,
    clusters: Vec<Resource>,
    proxy: &Proxy,
    inbound: &InboundHosts,
    wildcard: bool,
) -> Vec<Resource> {
    let inbound_seen = clusters.iter().any(is_inbound);
    let mut out: Vec<Resource> = clusters
        .iter()
        .filter_map(|r| patch_one(patches, r, proxy, inbound))
        .collect();
    if wildcard {
        out.extend(added(patches, proxy, inbound_seen));
    }
    out
}

//! Ambient mode: the `istio.workload.Address` type ztunnel reads (WDS), and the place
//! the `istio.security.Authorization` type is served from.
//!
//! Both types are the same for every ztunnel: they are built once per snapshot
//! ([`Snapshot::derived`]), each resource encoded once, and every connection is
//! sent the resources it subscribed to. Delta ADS compares content versions, so a
//! push after one pod changed sends that pod's Workload alone, and a deleted pod's
//! uid is reported removed (see `crate::ads::connection`'s `delta_diff`).
//!
//! Subscriptions, as ztunnel makes them: wildcard (`*` or an empty first request),
//! and, with `XDS_ON_DEMAND`, names: a workload uid, a service `namespace/hostname`,
//! or an alias `network/IP`, which is answered with the resources at that address
//! under the alias name (Istio sends the primary name with the alias in
//! `aliases`; the content is the same).

pub mod build;
pub mod multinetwork;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_istio;
#[cfg(test)]
mod tests_istio_entries;
#[cfg(test)]
mod tests_istio_index;
#[cfg(test)]
mod tests_istio_multi;
#[cfg(test)]
mod tests_istio_world;
pub mod waypoints;

use std::collections::BTreeMap;
use std::net::IpAddr;

use meshfed_api::workload as wl;
use serde_json::json;

use crate::push::snapshot::Snapshot;
use crate::xds::{EncodedResource, Resource, TypeUrl};
pub use build::AmbientModel;

use super::Subscription;

/// The HBONE port of ztunnels, waypoints and east-west gateways.
pub const HBONE_PORT: u32 = 15008;

/// The mesh trust domain as a workload carries it: empty for the default
/// `cluster.local`.
pub fn trust_domain_field(trust_domain: &str) -> String {
    if trust_domain == "cluster.local" {
        String::new()
    } else {
        trust_domain.to_string()
    }
}

/// A registry health as a workload's status.
pub fn workload_status(health: meshfed_registry::HealthStatus) -> wl::WorkloadStatus {
    match health {
        meshfed_registry::HealthStatus::Healthy => wl::WorkloadStatus::Healthy,
        _ => wl::WorkloadStatus::Unhealthy,
    }
}

/// The raw bytes of an IP, as the API carries addresses.
pub fn ip_bytes(ip: IpAddr) -> Vec<u8> {
    match ip {
        IpAddr::V4(v4) => v4.octets().to_vec(),
        IpAddr::V6(v6) => v6.octets().to_vec(),
    }
}

/// The IP of raw address bytes.
pub fn ip_of(bytes: &[u8]) -> Option<IpAddr> {
    match bytes.len() {
        4 => Some(IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?)),
        16 => Some(IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?)),
        _ => None,
    }
}

/// Ambient settings from flags.
#[derive(Clone, Copy, Debug, Default)]
pub struct AmbientOptions {
    /// Istio's `DEFAULT_ALLOW_FROM_WAYPOINT`: each waypoint's workloads get an allow
    /// policy for the waypoint's service accounts
    /// ([`build::add_implicit_waypoint_policies`]).
    pub default_allow_from_waypoint: bool,
    /// Istio's `AMBIENT_ENABLE_MULTI_NETWORK`: services are scoped by MeshConfig
    /// `serviceScopeConfigs` and other networks' workloads are sent split-horizon
    /// ([`multinetwork`]), as seen from `local_cluster`.
    pub multi_network: bool,
    /// This control plane's cluster (`--clusterID`).
    pub local_cluster: &'static str,
}

/// The Address resources of one snapshot.
#[derive(Debug, Default)]
pub struct AddressResources {
    /// What they were built from.
    pub model: AmbientModel,
    /// Primary name (workload uid, `namespace/hostname`) -> encoded resource.
    pub by_name: BTreeMap<String, Resource>,
    /// The implicit waypoint policies (`model.implicit_policies`), encoded as
    /// Authorization resources.
    pub implicit_policies: BTreeMap<String, Resource>,
}

impl AddressResources {
    /// Encodes `model`.
    pub fn new(model: AmbientModel) -> Self {
        let mut by_name = BTreeMap::new();
        for (uid, w) in &model.workloads {
            let address = wl::Address {
                r#type: Some(wl::address::Type::Workload(w.clone())),
            };
            by_name.insert(
                uid.clone(),
                EncodedResource::encode(TypeUrl::Address, uid.as_str(), &address),
            );
        }
        for (name, s) in &model.services {
            let address = wl::Address {
                r#type: Some(wl::address::Type::Service(s.clone())),
            };
            by_name.insert(
                name.clone(),
                EncodedResource::encode(TypeUrl::Address, name.as_str(), &address),
            );
        }
        let implicit_policies = model
            .implicit_policies
            .iter()
            .map(|(name, a)| {
                (
                    name.clone(),
                    EncodedResource::encode(TypeUrl::Authorization, name.as_str(), a),
                )
            })
            .collect();
        AddressResources {
            model,
            by_name,
            implicit_policies,
        }
    }

    /// The resources a subscription asks for: all of them for a wildcard one, plus
    /// each subscribed name (an alias answered under its own name).
    pub fn select(&self, sub: Subscription<'_>) -> Vec<Resource> {
        let mut out: Vec<Resource> = if sub.wildcard {
            self.by_name.values().cloned().collect()
        } else {
            Vec::new()
        };
        for name in sub.names {
            if let Some(r) = self.by_name.get(name) {
                if !sub.wildcard {
                    out.push(r.clone());
                }
                continue;
            }
            // An alias: the first resource at that address (a service before the
            // workloads behind the same IP is not possible; one name, one answer).
            if let Some(r) = self
                .model
                .aliases
                .get(name)
                .and_then(|names| names.first())
                .and_then(|n| self.by_name.get(n))
            {
                out.push(EncodedResource::encode(
                    TypeUrl::Address,
                    name.as_str(),
                    &decode_address(r),
                ));
            }
        }
        out
    }
}

fn decode_address(r: &Resource) -> wl::Address {
    prost::Message::decode(r.body.value.clone()).unwrap_or_default()
}

/// The Address resources of `snapshot`, built on first use (`options` are the
/// server's, the same for every use).
pub fn address_resources(
    snapshot: &Snapshot,
    options: &AmbientOptions,
) -> std::sync::Arc<AddressResources> {
    snapshot.derived(|s| {
        let model = build::from_snapshot(s, options);
        warn_ingress_use_waypoint(&model.ingress_use_waypoint_not_routed);
        AddressResources::new(model)
    })
}

/// Logs each service newly asking gateways to send through its waypoint (once, not
/// per snapshot).
fn warn_ingress_use_waypoint(services: &BTreeMap<String, String>) {
    static LOGGED: std::sync::Mutex<BTreeMap<String, String>> =
        std::sync::Mutex::new(BTreeMap::new());
    let mut logged = LOGGED.lock().unwrap_or_else(|e| e.into_inner());
    for (service, waypoint) in services {
        if logged.get(service) != Some(waypoint) {
            tracing::warn!(
                service,
                waypoint,
                "istio.io/ingress-use-waypoint: gateways do not send through the waypoint (not supported by meshfed); ztunnel still does"
            );
        }
    }
    *logged = services.clone();
}

/// The Address resources `sub` asks for.
pub fn addresses(
    snapshot: &Snapshot,
    sub: Subscription<'_>,
    options: &AmbientOptions,
) -> Vec<Resource> {
    address_resources(snapshot, options).select(sub)
}

/// The Authorization resources `sub` asks for: the converted policies of
/// [`super::ambient_authz`], and the implicit waypoint policies.
pub fn authorizations(
    snapshot: &Snapshot,
    sub: Subscription<'_>,
    options: &AmbientOptions,
) -> Vec<Resource> {
    let mut out = super::ambient_authz::resources(snapshot, sub);
    if options.default_allow_from_waypoint {
        let r = address_resources(snapshot, options);
        out.extend(
            r.implicit_policies
                .iter()
                .filter(|(name, _)| sub.wildcard || sub.names.contains(*name))
                .map(|(_, res)| res.clone()),
        );
    }
    out
}

/// JSON of the Address type for `/debug/` views: every workload and service, as the
/// proto3 JSON Istio's debug endpoints print.
pub fn debug_json(snapshot: &Snapshot, options: &AmbientOptions) -> serde_json::Value {
    let r = address_resources(snapshot, options);
    json!({
        "workloads": r.model.workloads.values().collect::<Vec<_>>(),
        "services": r.model.services.values().collect::<Vec<_>>(),
    })
}

/// Decodes an Address resource for debug output (proto3 JSON).
pub fn resource_json(r: &Resource) -> serde_json::Value {
    serde_json::to_value(decode_address(r)).unwrap_or_default()
}

/// `/debug/ambientz`: per connection watching an ambient type, its subscription and
/// what it holds (name -> content version); the mesh-wide counts; the services'
/// `WaypointBound` conditions and why workloads got no waypoint; with
/// `?resources=true`, every workload and service as proto3 JSON.
pub fn ambientz(
    connections: &crate::ads::Connections,
    snapshot: &Snapshot,
    with_resources: bool,
    options: &AmbientOptions,
) -> serde_json::Value {
    let clients: Vec<serde_json::Value> = connections
        .all()
        .iter()
        .filter_map(|c| {
            let st = c.state.lock().expect("state poisoned");
            let types: BTreeMap<&str, serde_json::Value> =
                [TypeUrl::Address, TypeUrl::Authorization]
                    .into_iter()
                    .filter_map(|t| {
                        let w = st.watches.get(&t)?;
                        Some((
                            t.short(),
                            json!({
                                "wildcard": w.wildcard,
                                "names": w.names,
                                "held": w.held.len(),
                                "resources": &*w.held,
                                "acked": w.acked(),
                            }),
                        ))
                    })
                    .collect();
            (!types.is_empty()).then(|| {
                json!({
                    "connectionId": c.id,
                    "node": c.proxy.node_id,
                    "type": c.proxy.node_type,
                    "types": types,
                })
            })
        })
        .collect();
    let r = address_resources(snapshot, options);
    let mut out = json!({
        "workloads": r.model.workloads.len(),
        "services": r.model.services.len(),
        "clients": clients,
        // The `WaypointBound` condition istiod writes to each Service naming a
        // waypoint (meshfed writes no Service status).
        "serviceConditions": &r.model.service_conditions,
        // Workloads whose `istio.io/use-waypoint` names a waypoint that gives them
        // none, and why.
        "workloadWaypointProblems": &r.model.workload_waypoint_problems,
        // Each waypoint's workloads, oldest first (istiod's `WorkloadsForWaypoint`).
        "waypointWorkloads": &r.model.waypoint_workloads,
        // Services whose `istio.io/ingress-use-waypoint` asks gateways to go through
        // their waypoint, which meshfed's gateways do not do.
        "ingressUseWaypointNotRouted": &r.model.ingress_use_waypoint_not_routed,
    });
    if with_resources {
        out["resources"] = debug_json(snapshot, options);
    }
    out
}

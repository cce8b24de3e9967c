//! Ambient multi-network (Istio's `AMBIENT_ENABLE_MULTI_NETWORK`,
//! `ambient/multicluster.go` and `services.go`): which services are shared across
//! clusters, and how the workloads of other networks are sent.
//!
//! - **Service scope.** A Kubernetes Service is *global* when the first of MeshConfig
//!   `serviceScopeConfigs` whose namespace selector matches its namespace's labels
//!   and whose services selector matches its labels says `GLOBAL` (an unset selector
//!   matches everything; an entry with an invalid selector, or for a namespace with
//!   no known labels, is skipped); otherwise it is *local*. A local service keeps the
//!   VIPs and endpoints of the local cluster only, and one that exists only in other
//!   clusters is not sent; a global one has every cluster's. ServiceEntries and
//!   the services of the other registries are local config and are not scoped.
//! - **Split horizon.** Only the workloads on the local network are sent as
//!   themselves. A global service's endpoints on another network are sent as one
//!   `SplitHorizonWorkload` per (network, service), reached through that network's
//!   gateway, with the count of those endpoints as its capacity; the service's
//!   subject alt names gain their identities. Each gateway of another network is a
//!   workload of its own (its address, HBONE). Endpoints on a network without a
//!   gateway are not reachable and are not sent.
//!
//! The scope is decided on the service as the registries merge it (labels of the
//! local cluster's Service when it has one), not per cluster's Service.

use meshfed_api::mesh::v1alpha1::mesh_config::ServiceScopeConfigs;
use meshfed_api::workload as wl;
use meshfed_registry::config::NamespaceLabels;
use meshfed_registry::{ClusterId, NetworkId, ProviderId, Service};

use super::{HBONE_PORT, ip_bytes, trust_domain_field};
use crate::networks::{Gateway, NetworkView};

/// The view of one control plane in a multi-network mesh: its own cluster and
/// network, and the mesh config's service scopes.
#[derive(Clone, Copy, Debug)]
pub struct MultiNetwork<'a> {
    /// The cluster of this control plane.
    pub local_cluster: &'a ClusterId,
    /// The network of its cluster.
    pub local_network: &'a NetworkId,
    /// MeshConfig `serviceScopeConfigs`.
    pub scopes: &'a [ServiceScopeConfigs],
    /// Namespace labels.
    pub namespaces: &'a NamespaceLabels,
}

impl MultiNetwork<'_> {
    /// Whether `service` is global (only Kubernetes Services can be).
    pub fn is_global(&self, service: &Service) -> bool {
        if service.provider != ProviderId::Kubernetes {
            return false;
        }
        let global = meshfed_api::mesh::v1alpha1::mesh_config::service_scope_configs::Scope::Global;
        for config in self.scopes {
            let Some(ns_labels) = self.namespaces.get(service.namespace.as_str()) else {
                continue;
            };
            let (Some(ns_ok), Some(svc_ok)) = (
                crate::mesh::selector_matches(config.namespace_selector.as_ref(), ns_labels),
                crate::mesh::selector_matches(config.services_selector.as_ref(), &service.labels),
            ) else {
                continue;
            };
            if ns_ok && svc_ok && config.scope() == global {
                return true;
            }
        }
        false
    }

    /// Whether `service` has a part in the local cluster.
    pub fn is_in_local_cluster(&self, service: &Service) -> bool {
        service.cluster_id == *self.local_cluster
            || service.cluster_vips.contains_key(self.local_cluster)
    }
}

/// The name Istio gives a network gateway (`<namespace>/<name>/<address>`): the
/// Service that declares it (label `topology.istio.io/network`, or meshNetworks
/// `registryServiceName`), else the address alone (a meshNetworks `address`).
pub fn gateway_resource_name(networks: &NetworkView, gateway: &Gateway) -> String {
    let source = networks
        .entries()
        .iter()
        .find(|e| e.gateway == *gateway)
        .and_then(|e| e.sources.iter().find_map(|s| gateway_object(s)));
    match source {
        Some((ns, name)) => format!("{ns}/{name}/{}", gateway.address),
        None => gateway.address.to_string(),
    }
}

/// The namespace and name of the Service a gateway source names.
fn gateway_object(source: &str) -> Option<(String, String)> {
    if let Some(rest) = source.strip_prefix("label topology.istio.io/network on service ") {
        let object = rest.rsplit_once('@').map_or(rest, |(o, _)| o);
        let (ns, name) = object.split_once('/')?;
        return Some((ns.to_string(), name.to_string()));
    }
    let host = source.strip_prefix("registryServiceName ")?;
    let host = host.rsplit_once('@').map_or(host, |(h, _)| h);
    let mut labels = host.split('.');
    let name = labels.next()?;
    let ns = labels.next()?;
    Some((ns.to_string(), name.to_string()))
}

fn gateway_address(gateway: &Gateway) -> wl::GatewayAddress {
    wl::GatewayAddress {
        destination: Some(wl::gateway_address::Destination::Address(
            wl::NetworkAddress {
                network: gateway.network.to_string(),
                address: ip_bytes(gateway.address),
            },
        )),
        hbone_mtls_port: HBONE_PORT,
    }
}

/// The workload standing for `capacity` endpoints of `service` (`namespace/hostname`
/// `name`) on the gateway's network.
pub fn split_horizon_workload(
    name: &str,
    service: &wl::Service,
    gateway: &Gateway,
    gateway_name: &str,
    capacity: u32,
    trust_domain: &str,
) -> wl::Workload {
    let uid = format!(
        "{}/SplitHorizonWorkload/{gateway_name}/{name}",
        gateway.network
    );
    wl::Workload {
        uid: uid.clone(),
        name: uid,
        namespace: service.namespace.clone(),
        network: gateway.network.to_string(),
        trust_domain: trust_domain_field(trust_domain),
        capacity: Some(pbjson_types::UInt32Value { value: capacity }),
        workload_type: wl::WorkloadType::Deployment as i32,
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        network_gateway: Some(gateway_address(gateway)),
        cluster_id: gateway.cluster.to_string(),
        services: [(
            name.to_string(),
            wl::PortList {
                ports: service.ports.clone(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

/// The workload of a gateway into another network.
pub fn gateway_workload(gateway: &Gateway, gateway_name: &str, trust_domain: &str) -> wl::Workload {
    let namespace = gateway_name
        .split_once('/')
        .filter(|(_, rest)| rest.contains('/'))
        .map(|(ns, _)| ns.to_string())
        .unwrap_or_default();
    wl::Workload {
        uid: gateway_name.to_string(),
        name: gateway_name.to_string(),
        namespace,
        network: gateway.network.to_string(),
        tunnel_protocol: wl::TunnelProtocol::Hbone as i32,
        trust_domain: trust_domain_field(trust_domain),
        capacity: Some(pbjson_types::UInt32Value { value: 1 }),
        workload_type: wl::WorkloadType::Deployment as i32,
        addresses: vec![ip_bytes(gateway.address)],
        cluster_id: gateway.cluster.to_string(),
        ..Default::default()
    }
}

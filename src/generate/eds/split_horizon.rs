//! Split-horizon EDS (Istio's `EndpointsByNetworkFilter` in
//! `pilot/pkg/xds/endpoints/ep_filters.go`, with the endpoint checks of
//! `endpoint_builder.go` that depend on networks): which endpoints a client sees
//! directly, which it reaches through their network's gateways, and which it does not
//! see at all.
//!
//! - **Network view** (`REQUESTED_NETWORK_VIEW`): a client that names networks sees
//!   only endpoints of those networks and endpoints without a network.
//! - **Endpoints without an address** (a WorkloadEntry with a network and no
//!   address): never sent directly; only through their network's gateway to clients
//!   of other networks, counted in the gateway's weight.
//! - **mTLS**: a remote endpoint goes through a gateway only if the client would
//!   originate Istio mTLS to it ([`MtlsCheck`], Istio's `mtlsChecker`: the
//!   DestinationRule's TLS mode for the cluster when it sets one, else the endpoint's
//!   TLS mode and its PeerAuthentication mode on its port). The gateway routes by the
//!   SNI of that mTLS, so without it the endpoint is unreachable and left out.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::HealthStatus as EnvoyHealth;
use envoy_types::pb::envoy::config::endpoint::v3::{
    Endpoint as EnvoyEndpoint, LbEndpoint, lb_endpoint,
};
use envoy_types::pb::google::protobuf::{Struct, UInt32Value, Value, value};
use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
use meshfed_api::networking::v1alpha3::{DestinationRule, TrafficPolicy};
use meshfed_registry::{ClusterId, Endpoint, HealthStatus, NetworkId, ShardKey, TlsMode};

use super::{Entry, Origin, socket, tls_mode_metadata};
use crate::model::Proxy;
use crate::networks::{Gateway, NetworkView};

/// Split-horizon EDS for one client (reference §6.4): the client's network and IP
/// families, and the mesh's networks and gateways.
#[derive(Clone, Copy, Debug)]
pub struct NetworkFilter<'a> {
    /// Every network's gateways and the meshNetworks endpoint rules.
    pub view: &'a NetworkView,
    /// The client's network (metadata `NETWORK`; empty when unset).
    pub proxy_network: &'a NetworkId,
    /// The client has an IPv4 address (can reach IPv4 gateways).
    pub ipv4: bool,
    /// The client has an IPv6 address.
    pub ipv6: bool,
}

impl<'a> NetworkFilter<'a> {
    /// The filter for `proxy` (a client without any IP reaches both families).
    pub fn for_proxy(view: &'a NetworkView, proxy: &'a Proxy) -> Self {
        let ipv4 = proxy.ip_addresses.iter().any(|ip| ip.is_ipv4());
        let ipv6 = proxy.ip_addresses.iter().any(|ip| ip.is_ipv6());
        let none = !ipv4 && !ipv6;
        NetworkFilter {
            view,
            proxy_network: &proxy.network,
            ipv4: ipv4 || none,
            ipv6: ipv6 || none,
        }
    }

    fn reaches(&self, gateway: &Gateway) -> bool {
        if gateway.address.is_ipv4() {
            self.ipv4
        } else {
            self.ipv6
        }
    }

    /// Whether split horizon applies: some network has a gateway (Istio's
    /// `IsMultiNetworkEnabled`).
    pub fn multi_network(&self) -> bool {
        self.view.has_gateways()
    }
}

/// Whether a client on `client` is on `network`: the same network, or an endpoint
/// without a network. Istio's `Proxy.InNetwork` also holds for a client without a
/// network; meshfed sends such a client remote networks' gateways instead (README,
/// Differences from istiod).
pub fn in_network(client: &NetworkId, network: &NetworkId) -> bool {
    network.is_empty() || client == network
}

/// The networks a client asked to see (`REQUESTED_NETWORK_VIEW`): it sees endpoints
/// of these networks and endpoints without a network (Istio's `ProxyView`).
#[derive(Clone, Copy, Debug)]
pub struct NetworkVisibility<'a> {
    /// Places endpoints without a network label (meshNetworks).
    pub view: &'a NetworkView,
    /// The requested networks.
    pub networks: &'a [NetworkId],
}

impl NetworkVisibility<'_> {
    /// Whether the endpoint's network is in the view.
    pub fn shows(&self, ep: &Endpoint, shard: &ShardKey) -> bool {
        let network = self.view.endpoint_network(ep, shard);
        network.is_empty() || self.networks.contains(&network)
    }
}

/// Whether PeerAuthentication disables mTLS for a workload of a namespace, with these
/// labels, on this port.
pub type PeerDisabled<'a> = dyn Fn(&str, &BTreeMap<String, String>, u16) -> bool + 'a;

/// Whether the client originates Istio mTLS to an endpoint (Istio's `mtlsChecker`):
/// the DestinationRule's TLS mode for the cluster when it sets one (only
/// `ISTIO_MUTUAL` counts); else the endpoint must take Istio mTLS and its
/// PeerAuthentication mode on its port must not be DISABLE.
pub struct MtlsCheck<'a> {
    /// The rule's TLS mode for this cluster: `Some(true)` for ISTIO_MUTUAL,
    /// `Some(false)` for any other mode, `None` when the rule sets none.
    pub rule: Option<bool>,
    /// The namespace of the service's workloads.
    pub namespace: &'a str,
    /// Whether PeerAuthentication disables mTLS for a workload of a namespace with
    /// these labels on this port.
    pub peer_disabled: &'a PeerDisabled<'a>,
}

impl std::fmt::Debug for MtlsCheck<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MtlsCheck")
            .field("rule", &self.rule)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl MtlsCheck<'_> {
    /// Whether the client sends Istio mTLS to `ep`, listening on `port`.
    pub fn enabled(&self, ep: &Endpoint, port: u16) -> bool {
        if let Some(rule) = self.rule {
            return rule;
        }
        ep.tls_mode == TlsMode::Istio && !(self.peer_disabled)(self.namespace, &ep.labels, port)
    }
}

/// Whether the client sends Istio mTLS to `ep` on `port`: by `check` when given, else
/// by the endpoint's own TLS mode.
pub fn mtls_enabled(check: Option<&MtlsCheck<'_>>, ep: &Endpoint, port: u16) -> bool {
    match check {
        Some(check) => check.enabled(ep, port),
        None => ep.tls_mode == TlsMode::Istio,
    }
}

/// The TLS mode `rule` sets for cluster port `port` of subset `subset` (Istio's
/// `tlsModeForDestinationRule`): without a subset, the top-level policy's; with one,
/// that subset's policy's only (nothing when the subset is not defined). In a policy,
/// a `portLevelSettings` entry for the port with TLS settings overrides the policy's
/// own. `Some(true)` for ISTIO_MUTUAL.
pub fn rule_tls_mode(rule: &DestinationRule, subset: &str, port: u16) -> Option<bool> {
    let policy = if subset.is_empty() {
        rule.traffic_policy.as_ref()
    } else {
        rule.subsets
            .iter()
            .find(|s| s.name == subset)?
            .traffic_policy
            .as_ref()
    };
    policy_tls_mode(policy?, port).map(|mode| mode == TlSmode::IstioMutual as i32)
}

fn policy_tls_mode(policy: &TrafficPolicy, port: u16) -> Option<i32> {
    let port_level = policy
        .port_level_settings
        .iter()
        .find(|p| p.port.is_some_and(|s| s.number == u32::from(port)) && p.tls.is_some());
    match port_level {
        Some(p) => p.tls.as_ref().map(|t| t.mode),
        None => policy.tls.as_ref().map(|t| t.mode),
    }
}

/// Split horizon over one locality group (Istio's `EndpointsByNetworkFilter`). Every
/// weight is scaled by the gateway lcm. An endpoint is sent directly when the client
/// is on its network ([`in_network`]) or its network has no gateway, and only if it
/// has an address. Otherwise its weight is split evenly among the gateways
/// of its (network, cluster), or of its network, that the client's IP family reaches;
/// it is dropped when none does, when the client would not send it Istio mTLS (the
/// gateway passes TLS through by SNI), or when it is not healthy. Each gateway with a
/// share becomes one endpoint (sorted by address text, then port, as Istio's
/// `SortGateways`) carrying the sum, at least 1, marked `tlsMode: istio`.
pub(super) fn split_horizon<'a>(
    entries: Vec<Entry<'a>>,
    filter: &NetworkFilter<'a>,
    mtls: Option<&MtlsCheck<'_>>,
) -> Vec<Entry<'a>> {
    let scale = filter.view.lcm();
    let mut out = Vec::with_capacity(entries.len());
    type GatewayKey<'g> = (String, u16, &'g NetworkId, &'g ClusterId);
    let mut totals: BTreeMap<GatewayKey<'a>, (&'a Gateway, u32)> = BTreeMap::new();
    for mut entry in entries {
        let Origin::Endpoint { shard, ep, port } = entry.origin else {
            out.push(entry);
            continue;
        };
        let network = filter.view.endpoint_network(ep, shard);
        let cluster = if ep.cluster_id.is_empty() {
            &shard.cluster
        } else {
            &ep.cluster_id
        };
        let weight = entry.weight.saturating_mul(scale);
        let gateways = filter.view.gateways_for(&network, cluster);
        if in_network(filter.proxy_network, &network) || gateways.is_empty() {
            if ep.has_address() {
                entry.weight = weight;
                entry.lb.load_balancing_weight = Some(UInt32Value { value: weight });
                out.push(entry);
            }
            continue;
        }
        let reachable: Vec<&'a Gateway> = gateways.iter().filter(|g| filter.reaches(g)).collect();
        if reachable.is_empty()
            || !mtls_enabled(mtls, ep, port)
            || ep.health != HealthStatus::Healthy
        {
            continue;
        }
        let share = weight / reachable.len() as u32;
        for g in reachable {
            let total = totals
                .entry((g.address.to_string(), g.port, &g.network, &g.cluster))
                .or_insert((g, 0));
            total.1 = total.1.saturating_add(share);
        }
    }
    for (gateway, total) in totals.into_values() {
        let weight = total.max(1);
        out.push(Entry {
            lb: gateway_lb_endpoint(gateway, weight),
            weight,
            origin: Origin::Gateway(gateway),
        });
    }
    out
}

/// A gateway as an endpoint: its address and mTLS port, `tlsMode: istio` (the client
/// must originate Istio mTLS, whose SNI routes through the gateway) and Istio's
/// `network` / `cluster` metadata.
fn gateway_lb_endpoint(gateway: &Gateway, weight: u32) -> LbEndpoint {
    let mut metadata = tls_mode_metadata(TlsMode::Istio.as_str());
    let string = |s: &str| Value {
        kind: Some(value::Kind::StringValue(s.to_string())),
    };
    let mut filter_metadata: Vec<(String, Struct)> = metadata.filter_metadata.drain().collect();
    filter_metadata.push((
        "istio".to_string(),
        crate::generate::proto::stable_struct([
            ("network".to_string(), string(gateway.network.as_str())),
            ("cluster".to_string(), string(gateway.cluster.as_str())),
        ]),
    ));
    metadata.filter_metadata = crate::generate::proto::stable_map(filter_metadata);
    LbEndpoint {
        host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(EnvoyEndpoint {
            address: Some(socket(gateway.address.to_string(), gateway.port)),
            ..Default::default()
        })),
        health_status: EnvoyHealth::Healthy as i32,
        load_balancing_weight: Some(UInt32Value { value: weight }),
        metadata: Some(metadata),
    }
}

//! Inbound clusters: one per target port of the proxy's own services or Sidecar ingress
//! listener, to the workload.

use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    Address as EnvoyAddress, BindConfig, Pipe, SocketAddress, address, socket_address,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint as EnvoyEndpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint,
};
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::inbound_traffic_policy::Mode as InboundMode;
use meshfed_api::networking::v1alpha3::{DestinationRule, TrafficPolicy};
use meshfed_registry::{Port, Service};

use super::super::cluster_build::{ClusterBuild, PolicyContext};
use super::super::eds::{self};
use super::super::traffic_policy;
use super::base::*;
use super::outbound::*;
use crate::model::proxy::NodeType;
use crate::push::config_index::Config;
use crate::xds::names::{Direction, inbound_name};

/// Everything an inbound cluster depends on.
#[derive(Clone, Debug)]
pub struct InboundRequest<'a> {
    /// The port the workload listens on.
    pub target_port: u16,
    /// The service port it backs (the first service's, when several share the target
    /// port): its protocol decides the upstream protocol.
    pub port: &'a Port,
    /// The DestinationRule policy for that port (only its connection pool applies),
    /// with a Sidecar `inboundConnectionPool` already substituted.
    pub policy: Option<&'a TrafficPolicy>,
    pub mesh: &'a MeshConfig,
    /// The proxy has IPv6 addresses only (it binds `::6`).
    pub v6_only: bool,
    /// Where the cluster sends connections.
    pub endpoint: InboundEndpoint,
    /// The services the cluster serves on `port` (its `istio.services` metadata for
    /// telemetry), hostnames unique; empty for a Sidecar ingress port that no service
    /// of the proxy backs.
    pub services: &'a [&'a Service],
    /// The service `inboundClusterStatName` is filled in with: the first of
    /// `services`, or for a Sidecar ingress port without one, the Sidecar's stand-in
    /// `<sidecar name>.<namespace>`.
    pub stat_service: Option<&'a Service>,
    /// The DestinationRule whose traffic policy applies (named in the metadata).
    pub rule: Option<&'a Config<DestinationRule>>,
}

/// Where an inbound cluster sends connections.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum InboundEndpoint {
    /// As the mesh inboundTrafficPolicy says: the original destination, or the
    /// loopback address with LOCALHOST (the clusters of service instances).
    Mesh,
    /// The original destination (a Sidecar ingress port without `defaultEndpoint`).
    OriginalDst,
    /// A fixed address and port.
    Socket(String, u16),
    /// A unix domain socket (path without `unix://`).
    Pipe(String),
}

/// Whether a proxy with these IPs is IPv6-only.
pub fn v6_only(ips: &[IpAddr]) -> bool {
    !ips.is_empty() && ips.iter().all(IpAddr::is_ipv6)
}

/// A Sidecar ingress `defaultEndpoint` as Istio reads it: empty is the original
/// destination; `unix://<path>` a socket; `<host>:<port>` where host `0.0.0.0`
/// (`[::]`) means the proxy's first IPv4 (IPv6) address, else the loopback address of
/// that family, and `127.0.0.1` (`[::1]`) the loopback address of that family when the
/// proxy has it, else the other's. `None` when it cannot be parsed (Istio then builds
/// no cluster).
pub fn ingress_endpoint(default_endpoint: &str, proxy_ips: &[IpAddr]) -> Option<InboundEndpoint> {
    if default_endpoint.is_empty() {
        return Some(InboundEndpoint::OriginalDst);
    }
    if let Some(path) = default_endpoint.strip_prefix("unix://") {
        return Some(InboundEndpoint::Pipe(path.to_string()));
    }
    let (host, port) = default_endpoint.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let has_v6 = proxy_ips.iter().any(IpAddr::is_ipv6);
    let first = |v4: bool| {
        proxy_ips
            .iter()
            .find(|ip| ip.is_ipv4() == v4)
            .map(IpAddr::to_string)
    };
    let address = match host {
        "0.0.0.0" => first(true).unwrap_or_else(|| "127.0.0.1".into()),
        "::" => first(false).unwrap_or_else(|| "::1".into()),
        "127.0.0.1" if v6_only(proxy_ips) => "::1".into(),
        "::1" if !has_v6 => "127.0.0.1".into(),
        _ => host.to_string(),
    };
    Some(InboundEndpoint::Socket(address, port))
}

/// `inbound|<targetPort>||`: with the mesh default inboundTrafficPolicy PASSTHROUGH an
/// ORIGINAL_DST cluster whose connections come from 127.0.0.6 (so iptables does not
/// capture them again) and never expire; with LOCALHOST a STATIC cluster to
/// 127.0.0.1:<targetPort>.
pub fn inbound_cluster(req: &InboundRequest<'_>) -> Cluster {
    let name = inbound_name(req.target_port);
    let v6_only = req.v6_only;
    let localhost = req
        .mesh
        .inbound_traffic_policy
        .is_some_and(|p| p.mode == InboundMode::Localhost as i32);
    let loopback = if v6_only { "::1" } else { "127.0.0.1" };
    let endpoint = match &req.endpoint {
        InboundEndpoint::Mesh if localhost => {
            InboundEndpoint::Socket(loopback.to_string(), req.target_port)
        }
        InboundEndpoint::Mesh => InboundEndpoint::OriginalDst,
        other => other.clone(),
    };
    let alt_stat_name = match req.stat_service {
        Some(service) if !req.mesh.inbound_cluster_stat_name.is_empty() => cluster_stat_name(
            &req.mesh.inbound_cluster_stat_name,
            service,
            "",
            req.port,
            Some(req.target_port),
        ),
        _ => format!("{name};"),
    };
    let mut c = Cluster {
        name: name.clone(),
        alt_stat_name,
        common_lb_config: Some(Default::default()),
        ..Default::default()
    };
    let address = match &endpoint {
        InboundEndpoint::Socket(ip, port) => Some(eds::socket(ip.clone(), *port)),
        InboundEndpoint::Pipe(path) => Some(EnvoyAddress {
            address: Some(address::Address::Pipe(Pipe {
                path: path.to_string(),
                mode: 0,
            })),
        }),
        InboundEndpoint::Mesh | InboundEndpoint::OriginalDst => None,
    };
    if let Some(address) = address {
        c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        ));
        c.load_assignment = Some(ClusterLoadAssignment {
            cluster_name: name,
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    host_identifier: Some(lb_endpoint::HostIdentifier::Endpoint(EnvoyEndpoint {
                        address: Some(address),
                        ..Default::default()
                    })),
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
    } else {
        c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        ));
        // Istio's "never": the largest duration Go can express.
        c.cleanup_interval = Some(PbDuration {
            seconds: 9_223_372_035,
            nanos: 0,
        });
    }
    let mut build = ClusterBuild::new(c);
    set_upstream_protocol(&mut build, req.port, NodeType::Sidecar);
    let no_labels = Default::default();
    let no_locality = Default::default();
    let ctx = PolicyContext {
        direction: Direction::Inbound,
        port: req.port,
        mesh: req.mesh,
        node_type: NodeType::Sidecar,
        service_accounts: &[],
        istio_sni: "",
        mesh_external: false,
        service_entry: false,
        passthrough_resolution: false,
        all_endpoints_istio_mtls: false,
        peer_mtls_disabled: false,
        rule_has_selector: false,
        proxy_locality: &no_locality,
        proxy_labels: &no_labels,
        endpoint_labels: None,
        traffic_distribution: Default::default(),
    };
    traffic_policy::apply_traffic_policy(&mut build, req.policy, &ctx);
    let mut c = build.build();
    // Istio names the rule only when the services metadata exists (the rule is added
    // to the metadata in place).
    c.metadata = if req.services.is_empty() {
        None
    } else {
        istio_metadata(&IstioMetadata {
            services: req.services,
            rule: req.rule.filter(|r| r.spec.traffic_policy.is_some()),
            subset: "",
            external: false,
            tls_mode: 0,
        })
    };
    // Connections to the loopback address are not captured again; any other would be
    // without the "magic" source address.
    let to_loopback =
        matches!(&endpoint, InboundEndpoint::Socket(ip, _) if ip == "127.0.0.1" || ip == "::1");
    if !to_loopback {
        let bind = if v6_only {
            INBOUND_PASSTHROUGH_BIND_V6
        } else {
            INBOUND_PASSTHROUGH_BIND_V4
        };
        c.upstream_bind_config = Some(BindConfig {
            source_address: Some(bind_address(bind)),
            ..Default::default()
        });
    }
    c
}

pub(super) fn bind_address(ip: &str) -> SocketAddress {
    SocketAddress {
        address: ip.to_string(),
        port_specifier: Some(socket_address::PortSpecifier::PortValue(0)),
        ..Default::default()
    }
}

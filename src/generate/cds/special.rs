//! Istio's special clusters: `BlackHoleCluster`, `PassthroughCluster` and
//! `InboundPassthroughCluster`.

use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    BindConfig, ExtraSourceAddress, HttpProtocolOptions as CommonHttpProtocolOptions,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::HttpProtocolOptions;
use envoy_types::pb::google::protobuf::Duration as PbDuration;
use meshfed_api::mesh::v1alpha1::MeshConfig;

use super::super::cluster_build::{self, ClusterBuild};
use super::super::{proto, traffic_policy};
use super::base::*;
use super::inbound::*;
use crate::xds::names::{BLACK_HOLE, INBOUND_PASSTHROUGH, PASSTHROUGH};

/// `BlackHoleCluster`: a static cluster with no endpoints.
pub fn black_hole(mesh: &MeshConfig) -> Cluster {
    Cluster {
        name: BLACK_HOLE.to_string(),
        alt_stat_name: format!("{BLACK_HOLE};"),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Static as i32,
        )),
        connect_timeout: Some(connect_timeout(mesh)),
        lb_policy: cluster::LbPolicy::RoundRobin as i32,
        ..Default::default()
    }
}

/// `PassthroughCluster`: original destination, the downstream's HTTP protocol, a 5
/// minute idle timeout and the default (maximum) circuit breakers.
pub fn passthrough(mesh: &MeshConfig) -> Cluster {
    let options = HttpProtocolOptions {
        common_http_protocol_options: Some(CommonHttpProtocolOptions {
            idle_timeout: Some(PbDuration {
                seconds: 300,
                nanos: 0,
            }),
            ..Default::default()
        }),
        upstream_protocol_options: Some(cluster_build::use_downstream_protocol()),
        ..Default::default()
    };
    let c = Cluster {
        name: PASSTHROUGH.to_string(),
        alt_stat_name: format!("{PASSTHROUGH};"),
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        )),
        lb_policy: cluster::LbPolicy::ClusterProvided as i32,
        typed_extension_protocol_options: [(
            cluster_build::HTTP_PROTOCOL_OPTIONS.to_string(),
            proto::pack(&options),
        )]
        .into(),
        ..Default::default()
    };
    let mut build = ClusterBuild::new(c);
    traffic_policy::apply_connection_pool(&mut build, mesh, &Default::default());
    let mut c = build.build();
    // Istio's `applyMetadataExchange`, as on every outbound cluster.
    c.filters
        .push(crate::generate::telemetry::upstream_metadata_exchange());
    c
}

/// `InboundPassthroughCluster`: [`passthrough`] for inbound traffic to ports no service
/// claims, bound to 127.0.0.6 (and ::6 for dual-stack proxies).
pub fn inbound_passthrough(mesh: &MeshConfig, proxy_ips: &[IpAddr]) -> Cluster {
    let (v4, v6) = ip_families(proxy_ips);
    inbound_passthrough_for(mesh, v4, v6)
}

/// The IP families of a proxy: (IPv4, IPv6); a proxy without IPs counts as IPv4.
pub fn ip_families(ips: &[IpAddr]) -> (bool, bool) {
    (
        ips.is_empty() || ips.iter().any(IpAddr::is_ipv4),
        ips.iter().any(IpAddr::is_ipv6),
    )
}

/// `InboundPassthroughCluster` for a proxy of these IP families.
pub fn inbound_passthrough_for(mesh: &MeshConfig, v4: bool, v6: bool) -> Cluster {
    let mut c = passthrough(mesh);
    // Istio renames the passthrough cluster, keeps its stat name and drops its
    // (outbound) metadata exchange.
    c.name = INBOUND_PASSTHROUGH.to_string();
    c.filters.clear();
    c.upstream_bind_config = Some(BindConfig {
        source_address: Some(bind_address(if v4 {
            INBOUND_PASSTHROUGH_BIND_V4
        } else {
            INBOUND_PASSTHROUGH_BIND_V6
        })),
        extra_source_addresses: if v4 && v6 {
            vec![ExtraSourceAddress {
                address: Some(bind_address(INBOUND_PASSTHROUGH_BIND_V6)),
                ..Default::default()
            }]
        } else {
            Vec::new()
        },
        ..Default::default()
    });
    c
}

#[cfg(test)]
mod metadata_exchange_tests {
    use super::*;

    #[test]
    fn the_passthrough_cluster_exchanges_metadata_and_the_inbound_one_does_not() {
        let mesh = crate::mesh::default_mesh_config();
        let outbound = passthrough(&mesh);
        assert_eq!(
            outbound.filters,
            [crate::generate::telemetry::upstream_metadata_exchange()]
        );
        assert!(inbound_passthrough(&mesh, &[]).filters.is_empty());
    }
}

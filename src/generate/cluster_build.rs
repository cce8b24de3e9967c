//! A cluster under construction (Istio's clusterWrapper): the Envoy cluster with its
//! upstream HTTP options kept apart until the end, and the facts the traffic policy and
//! upstream TLS settings are applied with.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{Http1ProtocolOptions, Http2ProtocolOptions};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_registry::{Locality, Port};

use super::proto::*;
use crate::model::proxy::NodeType;
use crate::xds::names::Direction;

/// The `typed_extension_protocol_options` key of upstream HTTP options.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

// ---------------------------------------------------------------------------------
// Clusters under construction

/// A cluster being built, with its upstream HTTP options kept apart until the end
/// because several settings touch them (Istio's clusterWrapper).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterBuild {
    pub cluster: Cluster,
    pub http: Option<HttpProtocolOptions>,
}

impl ClusterBuild {
    /// Wraps a cluster.
    pub fn new(cluster: Cluster) -> Self {
        ClusterBuild {
            cluster,
            http: None,
        }
    }

    pub(super) fn http(&mut self) -> &mut HttpProtocolOptions {
        self.http.get_or_insert_with(HttpProtocolOptions::default)
    }

    /// Upstream HTTP/2.
    pub fn set_h2(&mut self) {
        use http_protocol_options::explicit_http_config::ProtocolConfig;
        self.http().upstream_protocol_options = Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            ),
        );
    }

    /// Upstream protocol follows the downstream one (sniffed ports, useClientProtocol).
    pub fn set_use_downstream_protocol(&mut self) {
        self.http().upstream_protocol_options = Some(use_downstream_protocol());
    }

    /// Whether the upstream protocol is explicitly HTTP/2.
    pub fn is_http2(&self) -> bool {
        use http_protocol_options::explicit_http_config::ProtocolConfig;
        matches!(
            self.http
                .as_ref()
                .and_then(|o| o.upstream_protocol_options.as_ref()),
            Some(
                http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_)),
                    }
                )
            )
        )
    }

    /// The finished cluster: HTTP options (HTTP/1.1 unless something chose otherwise)
    /// go into `typed_extension_protocol_options`.
    pub fn build(mut self) -> Cluster {
        use http_protocol_options::explicit_http_config::ProtocolConfig;
        if let Some(mut options) = self.http.take() {
            if options.upstream_protocol_options.is_none() {
                options.upstream_protocol_options = Some(
                    http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                        http_protocol_options::ExplicitHttpConfig {
                            protocol_config: Some(ProtocolConfig::HttpProtocolOptions(
                                Http1ProtocolOptions::default(),
                            )),
                        },
                    ),
                );
            }
            self.cluster
                .typed_extension_protocol_options
                .insert(HTTP_PROTOCOL_OPTIONS.to_string(), pack(&options));
        }
        self.cluster
    }
}

/// `use_downstream_protocol_config` with HTTP/1.1 and HTTP/2 options.
pub fn use_downstream_protocol() -> http_protocol_options::UpstreamProtocolOptions {
    http_protocol_options::UpstreamProtocolOptions::UseDownstreamProtocolConfig(
        http_protocol_options::UseDownstreamHttpConfig {
            http_protocol_options: Some(Http1ProtocolOptions::default()),
            http2_protocol_options: Some(Http2ProtocolOptions::default()),
            ..Default::default()
        },
    )
}

/// The facts about a cluster's destination and client that decide how a policy
/// applies. Build one per cluster; inbound clusters only use `port` and `mesh`.
#[derive(Clone, Copy, Debug)]
pub struct PolicyContext<'a> {
    /// Outbound clusters get every setting; inbound clusters the connection pool only.
    pub direction: Direction,
    /// The service port the cluster serves.
    pub port: &'a Port,
    /// Mesh-wide defaults: connect timeout, TCP keepalive, h2 upgrade, locality LB,
    /// auto mTLS, TLS defaults.
    pub mesh: &'a MeshConfig,
    /// The kind of proxy receiving the cluster.
    pub node_type: NodeType,
    /// Identities the destination may present (ISTIO_MUTUAL and auto mTLS SANs).
    pub service_accounts: &'a [String],
    /// SNI for Istio mTLS, `outbound_.<port>_.<subset>_.<host>`.
    pub istio_sni: &'a str,
    /// The destination is outside the mesh (no auto mTLS).
    pub mesh_external: bool,
    /// The destination comes from a ServiceEntry (its SANs back SIMPLE/MUTUAL TLS).
    pub service_entry: bool,
    /// The service resolves to the original destination (headless / NONE).
    pub passthrough_resolution: bool,
    /// Every endpoint of the port takes Istio mTLS (auto mTLS for passthrough
    /// traffic needs that).
    pub all_endpoints_istio_mtls: bool,
    /// Clients infer the destination's PeerAuthentication mode as DISABLE (the
    /// namespace's policy, else the mesh's): no auto mTLS.
    pub peer_mtls_disabled: bool,
    /// The DestinationRule selects workloads (credentialName then works on sidecars).
    pub rule_has_selector: bool,
    /// Client locality, for locality settings on inline load assignments.
    pub proxy_locality: &'a Locality,
    /// Client labels (with Istio's topology labels), for failoverPriority on inline
    /// load assignments.
    pub proxy_labels: &'a BTreeMap<String, String>,
    /// The labels of each endpoint of the inline load assignment, per locality group
    /// (failoverPriority compares them with `proxy_labels`); `None` for EDS clusters.
    pub endpoint_labels: Option<&'a [Vec<BTreeMap<String, String>>]>,
    /// The service's traffic distribution (outbound): a locality setting when the
    /// rule gives none.
    pub traffic_distribution: meshfed_registry::TrafficDistribution,
}

/// Whether the cluster forwards to the original destination.
pub fn is_original_dst(c: &Cluster) -> bool {
    c.cluster_discovery_type
        == Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        ))
}

//! What every cluster is built from: the mesh-wide cluster options, the base cluster,
//! the ADS and EDS config sources, the HTTP/2 protocol options.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions, config_source,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_registry::{Port, ProviderId, Service};
use prost::{Message, Name};

use super::super::proto;

/// Source address of a sidecar's own connections to its workload, which iptables lets
/// through instead of capturing them again.
pub const INBOUND_PASSTHROUGH_BIND_V4: &str = "127.0.0.6";
/// IPv6 form of [`INBOUND_PASSTHROUGH_BIND_V4`].
pub const INBOUND_PASSTHROUGH_BIND_V6: &str = "::6";

/// Cluster-wide settings from the mesh config.
#[derive(Clone, Copy, Debug)]
pub struct ClusterOptions {
    /// Upstream connect timeout (meshConfig `connectTimeout`, default 10 s).
    pub connect_timeout: Duration,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            connect_timeout: Duration::from_secs(10),
        }
    }
}

pub(super) fn connect_timeout(mesh: &MeshConfig) -> PbDuration {
    proto::pb_duration(
        mesh.connect_timeout
            .unwrap_or(meshfed_api::Duration::new(10, 0)),
    )
}

pub(super) fn base_cluster(name: String, options: ClusterOptions) -> Cluster {
    Cluster {
        name,
        connect_timeout: Some(PbDuration {
            seconds: options.connect_timeout.as_secs() as i64,
            nanos: options.connect_timeout.subsec_nanos() as i32,
        }),
        ..Default::default()
    }
}

/// Endpoints come over the same ADS stream.
pub fn ads_source() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

/// Istio's EDS source: ADS, and clusters do not wait for their endpoints to warm
/// (`initial_fetch_timeout: 0s`).
pub fn eds_source() -> ConfigSource {
    ConfigSource {
        initial_fetch_timeout: Some(PbDuration::default()),
        ..ads_source()
    }
}

pub(super) fn http2_options() -> Any {
    use http_protocol_options::explicit_http_config::ProtocolConfig;
    let options = HttpProtocolOptions {
        upstream_protocol_options: Some(
            http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                        Http2ProtocolOptions::default(),
                    )),
                },
            ),
        ),
        ..Default::default()
    };
    Any {
        type_url: HttpProtocolOptions::type_url(),
        value: options.encode_to_vec(),
    }
}

/// A cluster's stat name from MeshConfig `outboundClusterStatName` /
/// `inboundClusterStatName` (Istio's BuildStatPrefix), `;`-terminated as Istio's
/// delimited stat prefixes are: `%SERVICE%` is `<name>.<namespace>` for a Kubernetes
/// service and the hostname otherwise, `%SERVICE_FQDN%` the hostname, `%SERVICE_PORT%`
/// and `%SERVICE_PORT_NAME%` the service port, `%TARGET_PORT%` the workload port
/// (inbound clusters only), `%SUBSET_NAME%` the subset.
pub fn cluster_stat_name(
    pattern: &str,
    service: &Service,
    subset: &str,
    port: &Port,
    target_port: Option<u16>,
) -> String {
    let host = service.hostname.as_str();
    let short = if service.provider == ProviderId::Kubernetes {
        let name = host.split('.').next().unwrap_or(host);
        format!("{name}.{}", service.namespace.as_str())
    } else {
        host.to_string()
    };
    let mut out = pattern
        .replace("%SERVICE_FQDN%", host)
        .replace("%SERVICE_PORT_NAME%", &port.name)
        .replace("%SERVICE_PORT%", &port.port.get().to_string())
        .replace("%SUBSET_NAME%", subset)
        .replace("%SERVICE%", &short);
    if let Some(target) = target_port {
        out = out.replace("%TARGET_PORT%", &target.to_string());
    }
    out.push(';');
    out
}

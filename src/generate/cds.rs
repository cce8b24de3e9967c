//! CDS: an outbound cluster per service port, plus Istio's special clusters.

use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions, config_source,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::pb::google::protobuf::{Any, Duration as PbDuration};
use meshfed_registry::{EndpointShards, Port, Resolution, Service};
use prost::{Message, Name};

use super::eds::{self, EdsOptions};

/// Drops traffic to unknown destinations (outboundTrafficPolicy REGISTRY_ONLY).
pub const BLACK_HOLE: &str = "BlackHoleCluster";
/// Forwards traffic to unknown destinations as addressed (ALLOW_ANY).
pub const PASSTHROUGH: &str = "PassthroughCluster";

/// Which way a cluster name points.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Direction {
    Inbound,
    Outbound,
}

/// A parsed `direction|port|subset|hostname` cluster name.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ClusterName<'a> {
    pub direction: Direction,
    pub port: u16,
    pub subset: &'a str,
    pub hostname: &'a str,
}

impl<'a> ClusterName<'a> {
    /// Parses `outbound|80||reviews.default.svc.cluster.local` (or `inbound|...`).
    pub fn parse(name: &'a str) -> Option<ClusterName<'a>> {
        let mut parts = name.split('|');
        let direction = match parts.next()? {
            "outbound" => Direction::Outbound,
            "inbound" => Direction::Inbound,
            _ => return None,
        };
        let port = parts.next()?.parse().ok()?;
        let subset = parts.next()?;
        let hostname = parts.next()?;
        if parts.next().is_some() {
            return None;
        }
        Some(ClusterName {
            direction,
            port,
            subset,
            hostname,
        })
    }
}

/// `outbound|<port>|<subset>|<hostname>`.
pub fn outbound_name(port: u16, subset: &str, hostname: &str) -> String {
    format!("outbound|{port}|{subset}|{hostname}")
}

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

/// The outbound cluster for one service port. Endpoints are only needed for DNS
/// clusters, whose endpoints are inline.
pub fn outbound_cluster(
    service: &Service,
    port: &Port,
    shards: Option<&EndpointShards>,
    options: ClusterOptions,
) -> Cluster {
    let name = outbound_name(port.port.get(), "", service.hostname.as_str());
    let mut c = base_cluster(name.clone(), options);
    match service.resolution {
        Resolution::ClientSideLb => {
            c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::Eds as i32,
            ));
            c.eds_cluster_config = Some(cluster::EdsClusterConfig {
                eds_config: Some(ads_source()),
                service_name: name,
            });
        }
        Resolution::DnsLb | Resolution::DnsRoundRobinLb => {
            let kind = if service.resolution == Resolution::DnsLb {
                cluster::DiscoveryType::StrictDns
            } else {
                cluster::DiscoveryType::LogicalDns
            };
            c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(kind as i32));
            c.load_assignment = Some(eds::load_assignment(
                &name,
                port,
                shards,
                EdsOptions::default(),
            ));
        }
        Resolution::Passthrough => {
            c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::OriginalDst as i32,
            ));
            c.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
        }
    }
    if port.protocol.is_http2() {
        c.typed_extension_protocol_options.insert(
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions".to_string(),
            http2_options(),
        );
    }
    c
}

/// `BlackHoleCluster`: a static cluster with no endpoints.
pub fn black_hole(options: ClusterOptions) -> Cluster {
    let mut c = base_cluster(BLACK_HOLE.to_string(), options);
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::Static as i32,
    ));
    c
}

/// `PassthroughCluster`: original destination.
pub fn passthrough(options: ClusterOptions) -> Cluster {
    let mut c = base_cluster(PASSTHROUGH.to_string(), options);
    c.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
        cluster::DiscoveryType::OriginalDst as i32,
    ));
    c.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
    c
}

fn base_cluster(name: String, options: ClusterOptions) -> Cluster {
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

fn http2_options() -> Any {
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

#[cfg(test)]
mod tests {
    use meshfed_registry::{Protocol, ProviderId};

    use super::*;

    fn service(resolution: Resolution) -> Service {
        let mut s = Service::new(
            "reviews.default.svc.cluster.local",
            "default",
            ProviderId::Mock,
            "c1",
        );
        s.resolution = resolution;
        s.ports
            .push(Port::new("grpc", 9080, Protocol::Grpc).unwrap());
        s
    }

    fn discovery(c: &Cluster) -> i32 {
        match c.cluster_discovery_type {
            Some(cluster::ClusterDiscoveryType::Type(t)) => t,
            _ => -1,
        }
    }

    #[test]
    fn eds_cluster_uses_istio_naming_and_ads() {
        let s = service(Resolution::ClientSideLb);
        let c = outbound_cluster(&s, &s.ports[0], None, ClusterOptions::default());
        assert_eq!(c.name, "outbound|9080||reviews.default.svc.cluster.local");
        assert_eq!(discovery(&c), cluster::DiscoveryType::Eds as i32);
        let eds = c.eds_cluster_config.unwrap();
        assert_eq!(eds.service_name, c.name);
        assert!(matches!(
            eds.eds_config.unwrap().config_source_specifier,
            Some(config_source::ConfigSourceSpecifier::Ads(_))
        ));
        assert_eq!(c.connect_timeout.unwrap().seconds, 10);
        assert!(
            c.typed_extension_protocol_options
                .contains_key("envoy.extensions.upstreams.http.v3.HttpProtocolOptions")
        );
    }

    #[test]
    fn resolution_picks_the_cluster_type() {
        for (resolution, want) in [
            (Resolution::DnsLb, cluster::DiscoveryType::StrictDns),
            (
                Resolution::DnsRoundRobinLb,
                cluster::DiscoveryType::LogicalDns,
            ),
            (Resolution::Passthrough, cluster::DiscoveryType::OriginalDst),
        ] {
            let s = service(resolution);
            assert_eq!(
                discovery(&outbound_cluster(
                    &s,
                    &s.ports[0],
                    None,
                    ClusterOptions::default()
                )),
                want as i32
            );
        }
        assert_eq!(
            passthrough(ClusterOptions::default()).lb_policy,
            cluster::LbPolicy::ClusterProvided as i32
        );
        assert_eq!(
            black_hole(ClusterOptions::default()).name,
            "BlackHoleCluster"
        );
    }

    #[test]
    fn cluster_names_parse() {
        let n = ClusterName::parse("outbound|80|v1|reviews.default.svc.cluster.local").unwrap();
        assert_eq!(
            (n.direction, n.port, n.subset, n.hostname),
            (
                Direction::Outbound,
                80,
                "v1",
                "reviews.default.svc.cluster.local"
            )
        );
        assert!(ClusterName::parse("outbound|x||h").is_none());
        assert!(ClusterName::parse("BlackHoleCluster").is_none());
        assert!(ClusterName::parse("outbound|80||h|extra").is_none());
    }
}

//! CDS: an outbound cluster per service port and per DestinationRule subset, with the
//! rule's traffic policy (see [`super::traffic_policy`]); a sidecar's inbound clusters for its
//! own service ports; and Istio's special clusters.

mod base;
mod cached;
mod inbound;
mod outbound;
mod special;

pub use base::*;
pub use cached::*;
pub use inbound::*;
pub use outbound::*;
pub use special::*;

#[cfg(test)]
use std::net::IpAddr;
#[cfg(test)]
use std::sync::Arc;

#[cfg(test)]
use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
#[cfg(test)]
use envoy_types::pb::envoy::config::core::v3::{Address as EnvoyAddress, address, config_source};
#[cfg(test)]
use envoy_types::pb::envoy::config::endpoint::v3::lb_endpoint;
#[cfg(test)]
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
#[cfg(test)]
use envoy_types::pb::google::protobuf::{Duration as PbDuration, Struct, value};
#[cfg(test)]
use meshfed_api::mesh::v1alpha1::MeshConfig;
#[cfg(test)]
use meshfed_api::mesh::v1alpha1::mesh_config::inbound_traffic_policy::Mode as InboundMode;
#[cfg(test)]
use meshfed_api::networking::v1alpha3::{DestinationRule, TrafficPolicy};
#[cfg(test)]
use meshfed_registry::{
    EndpointShards, MeshLocation, Port, Protocol, ProviderId, Resolution, Service, TlsMode,
};
#[cfg(test)]
use prost::Message;

#[cfg(test)]
use super::cluster_build::{self};
#[cfg(test)]
use super::eds::{self};
#[cfg(test)]
use crate::model::proxy::Proxy;
#[cfg(test)]
use crate::push::config_index::Config;
#[cfg(test)]
use crate::push::snapshot::Snapshot;
#[cfg(test)]
use crate::xds::{Resource, TypeUrl};

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use envoy_types::pb::envoy::config::core::v3::{Node, transport_socket};
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
        UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
    };
    use meshfed_api::mesh::v1alpha1::mesh_config::InboundTrafficPolicy;
    use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
    use meshfed_api::networking::v1alpha3::connection_pool_settings::{
        HttpSettings, TcpSettings, http_settings::H2UpgradePolicy, tcp_settings::TcpKeepalive,
    };
    use meshfed_api::networking::v1alpha3::load_balancer_settings::{
        ConsistentHashLb, LbPolicy, SimpleLb, consistent_hash_lb,
    };
    use meshfed_api::networking::v1alpha3::locality_load_balancer_setting::{Distribute, Failover};
    use meshfed_api::networking::v1alpha3::{
        ClientTlsSettings, ConnectionPoolSettings, LoadBalancerSettings,
        LocalityLoadBalancerSetting, OutlierDetection, PortSelector, Subset,
        traffic_policy::PortTrafficPolicy,
    };
    use meshfed_registry::{Endpoint, ShardKey};

    use super::*;
    use crate::mesh::default_mesh_config;
    use crate::model::proxy::json_to_struct;

    const HOST: &str = "reviews.default.svc.cluster.local";

    fn service(resolution: Resolution) -> Service {
        let mut s = Service::new(HOST, "default", ProviderId::Mock, "c1");
        s.resolution = resolution;
        s.ports
            .push(Port::new("grpc", 9080, Protocol::Grpc).unwrap());
        s.ports
            .push(Port::new("http", 8080, Protocol::Http).unwrap());
        s.ports.push(Port::new("tcp", 3306, Protocol::Tcp).unwrap());
        s.service_accounts
            .insert("spiffe://cluster.local/ns/default/sa/reviews".into());
        s
    }

    pub(super) fn proxy_in(ns: &str, ip: &str, kind: &str) -> Proxy {
        let node = Node {
            id: format!("{kind}~{ip}~app.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(json_to_struct(&serde_json::json!({"NAMESPACE": ns}))),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    fn rule(policy: Option<TrafficPolicy>, subsets: Vec<Subset>) -> Config<DestinationRule> {
        Config {
            name: "reviews".into(),
            namespace: "default".into(),
            labels: BTreeMap::new(),
            annotations: Default::default(),
            creation_time: std::time::SystemTime::UNIX_EPOCH,
            spec: DestinationRule {
                host: HOST.into(),
                traffic_policy: policy,
                subsets,
                ..Default::default()
            },
        }
    }

    fn subset(name: &str, policy: Option<TrafficPolicy>) -> Subset {
        Subset {
            name: name.into(),
            labels: [("version".to_string(), name.to_string())].into(),
            traffic_policy: policy,
        }
    }

    fn ep(ip: &str, version: &str, tls: TlsMode) -> Endpoint {
        let mut e = Endpoint::new(ip.parse().unwrap())
            .with_port("grpc", 19080)
            .with_port("http", 18080)
            .with_port("tcp", 13306);
        e.labels.insert("version".into(), version.into());
        e.tls_mode = tls;
        e
    }

    fn shards(eps: Vec<Endpoint>) -> EndpointShards {
        let mut s = EndpointShards::default();
        s.shards
            .insert(ShardKey::new(ProviderId::Mock, "c1"), eps.into());
        s
    }

    struct Case {
        service: Service,
        port: u16,
        shards: Option<EndpointShards>,
        rule: Option<Config<DestinationRule>>,
        subset: &'static str,
        mesh: MeshConfig,
        proxy: Proxy,
        peer_mtls_disabled: bool,
    }

    impl Case {
        fn new(policy: Option<TrafficPolicy>) -> Case {
            Case {
                service: service(Resolution::ClientSideLb),
                port: 8080,
                shards: None,
                rule: Some(rule(policy, vec![])),
                subset: "",
                mesh: default_mesh_config(),
                proxy: proxy_in("default", "10.0.0.1", "sidecar"),
                peer_mtls_disabled: false,
            }
        }

        fn build(&self) -> Option<Cluster> {
            outbound_cluster_for(&OutboundRequest {
                service: &self.service,
                port: self.service.port(self.port).unwrap(),
                shards: self.shards.as_ref(),
                rule: self.rule.as_ref(),
                subset: self.subset,
                mesh: &self.mesh,
                client: &ClusterClient::for_proxy(&self.proxy, &self.service),
                sni_dnat: false,
                peer_mtls_disabled: self.peer_mtls_disabled,
            })
        }

        fn cluster(&self) -> Cluster {
            self.build().unwrap()
        }
    }

    #[test]
    fn traffic_distribution_turns_on_locality_weighted_balancing_unless_the_rule_sets_locality() {
        let locality_weighted = |c: &Cluster| {
            c.common_lb_config
                .as_ref()
                .and_then(|l| l.locality_config_specifier.as_ref())
                .is_some()
        };
        let mut case = Case::new(None);
        assert!(!locality_weighted(&case.cluster()));
        case.service.traffic_distribution = meshfed_registry::TrafficDistribution::PreferSameZone;
        assert!(
            locality_weighted(&case.cluster()),
            "failover priorities apply without outlier detection"
        );
        // A rule's own locality setting wins: here one without failover or
        // outlier detection.
        let mut case = Case::new(Some(TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                locality_lb_setting: Some(LocalityLoadBalancerSetting {
                    enabled: Some(true.into()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }));
        case.service.traffic_distribution = meshfed_registry::TrafficDistribution::PreferSameZone;
        assert!(!locality_weighted(&case.cluster()));
    }

    fn lb(policy: LbPolicy) -> TrafficPolicy {
        TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                lb_policy: Some(policy),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn discovery(c: &Cluster) -> i32 {
        match c.cluster_discovery_type {
            Some(cluster::ClusterDiscoveryType::Type(t)) => t,
            _ => -1,
        }
    }

    fn http_options(c: &Cluster) -> HttpProtocolOptions {
        let any = &c.typed_extension_protocol_options[cluster_build::HTTP_PROTOCOL_OPTIONS];
        HttpProtocolOptions::decode(any.value.as_slice()).unwrap()
    }

    fn is_h2(c: &Cluster) -> bool {
        use http_protocol_options::explicit_http_config::ProtocolConfig;
        matches!(
            http_options(c).upstream_protocol_options,
            Some(
                http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                    http_protocol_options::ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(_))
                    }
                )
            )
        )
    }

    fn tls_of(
        socket: &envoy_types::pb::envoy::config::core::v3::TransportSocket,
    ) -> UpstreamTlsContext {
        assert_eq!(socket.name, "envoy.transport_sockets.tls");
        let Some(transport_socket::ConfigType::TypedConfig(any)) = &socket.config_type else {
            panic!("no typed config");
        };
        UpstreamTlsContext::decode(any.value.as_slice()).unwrap()
    }

    fn combined(
        ctx: &UpstreamTlsContext,
    ) -> &common_tls_context::CombinedCertificateValidationContext {
        match ctx
            .common_tls_context
            .as_ref()
            .unwrap()
            .validation_context_type
            .as_ref()
        {
            Some(common_tls_context::ValidationContextType::CombinedValidationContext(c)) => c,
            other => panic!("not a combined validation context: {other:?}"),
        }
    }

    fn sans(ctx: &UpstreamTlsContext) -> Vec<(i32, String)> {
        use envoy_types::pb::envoy::r#type::matcher::v3::string_matcher::MatchPattern;
        combined(ctx)
            .default_validation_context
            .as_ref()
            .unwrap()
            .match_typed_subject_alt_names
            .iter()
            .map(|m| match &m.matcher.as_ref().unwrap().match_pattern {
                Some(MatchPattern::Exact(s)) => (m.san_type, s.clone()),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn plain_cluster_uses_istio_naming_and_ads() {
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
        for (resolution, kind, want) in [
            (
                Resolution::ClientSideLb,
                "sidecar",
                cluster::DiscoveryType::Eds,
            ),
            (
                Resolution::DnsLb,
                "sidecar",
                cluster::DiscoveryType::StrictDns,
            ),
            (
                Resolution::DnsRoundRobinLb,
                "sidecar",
                cluster::DiscoveryType::LogicalDns,
            ),
            (
                Resolution::Passthrough,
                "sidecar",
                cluster::DiscoveryType::OriginalDst,
            ),
            // Gateways cannot forward to an original destination.
            (
                Resolution::Passthrough,
                "router",
                cluster::DiscoveryType::Eds,
            ),
        ] {
            let s = service(resolution);
            assert_eq!(
                discovery(&outbound_cluster(
                    &s,
                    &s.ports[0],
                    None,
                    ClusterOptions::default()
                )),
                if kind == "router" {
                    cluster::DiscoveryType::OriginalDst as i32
                } else {
                    want as i32
                },
                "the plain (gRPC) cluster ignores the node type"
            );
            let mut case = Case::new(None);
            case.service = s;
            case.proxy = proxy_in("default", "10.0.0.1", kind);
            let c = case.cluster();
            assert_eq!(discovery(&c), want as i32, "{resolution:?} {kind}");
            if want == cluster::DiscoveryType::OriginalDst {
                assert_eq!(c.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
                assert!(c.eds_cluster_config.is_none());
            }
            if want == cluster::DiscoveryType::Eds {
                let eds = c.eds_cluster_config.unwrap();
                assert_eq!(eds.service_name, c.name);
                assert_eq!(
                    eds.eds_config.unwrap().initial_fetch_timeout,
                    Some(PbDuration::default())
                );
            }
            if want == cluster::DiscoveryType::StrictDns {
                assert_eq!(c.dns_lookup_family, cluster::DnsLookupFamily::V4Only as i32);
                assert!(c.load_assignment.is_some());
            }
        }
        let mesh = default_mesh_config();
        assert_eq!(
            passthrough(&mesh).lb_policy,
            cluster::LbPolicy::ClusterProvided as i32
        );
        assert_eq!(black_hole(&mesh).name, "BlackHoleCluster");
    }

    #[test]
    fn defaults_without_a_rule() {
        let mut case = Case::new(None);
        case.rule = None;
        let c = case.cluster();
        assert_eq!(c.name, "outbound|8080||reviews.default.svc.cluster.local");
        assert_eq!(
            c.alt_stat_name,
            "outbound|8080||reviews.default.svc.cluster.local;"
        );
        assert_eq!(c.lb_policy, cluster::LbPolicy::LeastRequest as i32);
        assert_eq!(c.connect_timeout.unwrap().seconds, 10);
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        for v in [
            t.max_connections,
            t.max_pending_requests,
            t.max_requests,
            t.max_retries,
        ] {
            assert_eq!(v.unwrap().value, u32::MAX);
        }
        assert!(t.track_remaining);
        // Without a rule the metadata names the service only (Istio's telemetry).
        let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"];
        assert_eq!(istio.fields.keys().collect::<Vec<_>>(), vec!["services"]);
        // A subset needs a rule that defines it.
        case.subset = "v1";
        assert!(case.build().is_none());
    }

    #[test]
    fn each_load_balancer() {
        use cluster::LbPolicy as Envoy;
        let simple = |s: SimpleLb| LbPolicy::Simple(s as i32);
        for (policy, want) in [
            (simple(SimpleLb::RoundRobin), Envoy::RoundRobin),
            (simple(SimpleLb::LeastRequest), Envoy::LeastRequest),
            (simple(SimpleLb::LeastConn), Envoy::LeastRequest),
            (simple(SimpleLb::Random), Envoy::Random),
            (simple(SimpleLb::Unspecified), Envoy::LeastRequest),
        ] {
            let c = Case::new(Some(lb(policy.clone()))).cluster();
            assert_eq!(c.lb_policy, want as i32, "{policy:?}");
            assert_eq!(discovery(&c), cluster::DiscoveryType::Eds as i32);
        }
        let c = Case::new(Some(lb(simple(SimpleLb::Passthrough)))).cluster();
        assert_eq!(discovery(&c), cluster::DiscoveryType::OriginalDst as i32);
        assert_eq!(c.lb_policy, Envoy::ClusterProvided as i32);
        assert!(c.eds_cluster_config.is_none() && c.load_assignment.is_none());

        let hash = |algorithm, minimum_ring_size| {
            lb(LbPolicy::ConsistentHash(ConsistentHashLb {
                minimum_ring_size,
                hash_key: Some(consistent_hash_lb::HashKey::HttpHeaderName("x-user".into())),
                hash_algorithm: algorithm,
            }))
        };
        let ring = |c: &Cluster| match &c.lb_config {
            Some(cluster::LbConfig::RingHashLbConfig(r)) => r.minimum_ring_size.unwrap().value,
            other => panic!("{other:?}"),
        };
        let c = Case::new(Some(hash(None, 0))).cluster();
        assert_eq!(c.lb_policy, Envoy::RingHash as i32);
        assert_eq!(ring(&c), 1024, "Envoy's default ring size, set explicitly");
        let c = Case::new(Some(hash(None, 2048))).cluster();
        assert_eq!(ring(&c), 2048, "the deprecated top-level size still counts");
        let c = Case::new(Some(hash(
            Some(consistent_hash_lb::HashAlgorithm::RingHash(
                consistent_hash_lb::RingHash {
                    minimum_ring_size: 4096,
                },
            )),
            0,
        )))
        .cluster();
        assert_eq!((c.lb_policy, ring(&c)), (Envoy::RingHash as i32, 4096));
        let c = Case::new(Some(hash(
            Some(consistent_hash_lb::HashAlgorithm::Maglev(
                consistent_hash_lb::MagLev { table_size: 65537 },
            )),
            0,
        )))
        .cluster();
        assert_eq!(c.lb_policy, Envoy::Maglev as i32);
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                table_size: Some(t)
            })) if t.value == 65537
        ));
        // Warmup becomes slow start.
        let mut p = lb(simple(SimpleLb::RoundRobin));
        p.load_balancer.as_mut().unwrap().warmup_duration_secs =
            Some(meshfed_api::Duration::new(30, 0));
        let c = Case::new(Some(p)).cluster();
        assert!(matches!(
            c.lb_config,
            Some(cluster::LbConfig::RoundRobinLbConfig(cluster::RoundRobinLbConfig {
                slow_start_config: Some(ref s), ..
            })) if s.slow_start_window.unwrap().seconds == 30
        ));
    }

    #[test]
    fn connection_pool_becomes_thresholds_timeouts_and_options() {
        let pool = ConnectionPoolSettings {
            tcp: Some(TcpSettings {
                max_connections: 100,
                connect_timeout: Some(meshfed_api::Duration::new(0, 250_000_000)),
                tcp_keepalive: Some(TcpKeepalive {
                    probes: 3,
                    time: Some(meshfed_api::Duration::new(7200, 0)),
                    interval: Some(meshfed_api::Duration::new(75, 0)),
                }),
                ..Default::default()
            }),
            http: Some(HttpSettings {
                http1_max_pending_requests: 10,
                http2_max_requests: 1000,
                max_requests_per_connection: 1,
                max_retries: 3,
                idle_timeout: Some(meshfed_api::Duration::new(60, 0)),
                h2_upgrade_policy: H2UpgradePolicy::Upgrade as i32,
                ..Default::default()
            }),
        };
        let c = Case::new(Some(TrafficPolicy {
            connection_pool: Some(pool),
            ..Default::default()
        }))
        .cluster();
        let t = &c.circuit_breakers.as_ref().unwrap().thresholds[0];
        assert_eq!(t.max_connections.unwrap().value, 100);
        assert_eq!(t.max_pending_requests.unwrap().value, 10);
        assert_eq!(t.max_requests.unwrap().value, 1000);
        assert_eq!(t.max_retries.unwrap().value, 3);
        assert_eq!(
            c.connect_timeout.unwrap(),
            PbDuration {
                seconds: 0,
                nanos: 250_000_000
            }
        );
        let keepalive = c
            .upstream_connection_options
            .as_ref()
            .unwrap()
            .tcp_keepalive
            .unwrap();
        assert_eq!(keepalive.keepalive_probes.unwrap().value, 3);
        assert_eq!(keepalive.keepalive_time.unwrap().value, 7200);
        assert_eq!(keepalive.keepalive_interval.unwrap().value, 75);
        let options = http_options(&c);
        let common = options.common_http_protocol_options.unwrap();
        assert_eq!(common.max_requests_per_connection.unwrap().value, 1);
        assert_eq!(common.idle_timeout.unwrap().seconds, 60);
        assert!(is_h2(&c), "h2UpgradePolicy UPGRADE on an HTTP/1.1 port");

        // DO_NOT_UPGRADE on a port the mesh would upgrade; a gRPC port is HTTP/2 anyway.
        let mut case = Case::new(Some(TrafficPolicy {
            connection_pool: Some(ConnectionPoolSettings {
                http: Some(HttpSettings {
                    h2_upgrade_policy: H2UpgradePolicy::DoNotUpgrade as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }));
        case.mesh.h2_upgrade_policy = MeshConfigH2::Upgrade as i32;
        assert!(
            !case
                .cluster()
                .typed_extension_protocol_options
                .contains_key(cluster_build::HTTP_PROTOCOL_OPTIONS)
        );
        case.rule = None;
        assert!(
            is_h2(&case.cluster()),
            "the mesh-wide policy upgrades HTTP ports"
        );
        case.port = 3306;
        assert!(
            !case
                .cluster()
                .typed_extension_protocol_options
                .contains_key(cluster_build::HTTP_PROTOCOL_OPTIONS),
            "but not TCP ports"
        );
        case.port = 9080;
        assert!(is_h2(&case.cluster()));
    }

    use meshfed_api::mesh::v1alpha1::mesh_config::H2UpgradePolicy as MeshConfigH2;

    #[test]
    fn outlier_detection_fields() {
        let outlier = OutlierDetection {
            consecutive_5xx_errors: Some(7.into()),
            consecutive_gateway_errors: Some(0.into()),
            split_external_local_origin_errors: true,
            consecutive_local_origin_failures: Some(4.into()),
            interval: Some(meshfed_api::Duration::new(5, 0)),
            base_ejection_time: Some(meshfed_api::Duration::new(60, 0)),
            max_ejection_percent: 50,
            min_health_percent: 20,
            ..Default::default()
        };
        let c = Case::new(Some(TrafficPolicy {
            outlier_detection: Some(outlier),
            ..Default::default()
        }))
        .cluster();
        let o = c.outlier_detection.unwrap();
        assert_eq!(o.consecutive_5xx.unwrap().value, 7);
        assert_eq!(o.enforcing_consecutive_5xx.unwrap().value, 100);
        assert_eq!(o.consecutive_gateway_failure.unwrap().value, 0);
        assert_eq!(o.enforcing_consecutive_gateway_failure.unwrap().value, 0);
        assert!(o.split_external_local_origin_errors);
        assert_eq!(o.consecutive_local_origin_failure.unwrap().value, 4);
        assert_eq!(
            o.enforcing_consecutive_local_origin_failure.unwrap().value,
            100
        );
        assert_eq!(o.enforcing_local_origin_success_rate.unwrap().value, 0);
        assert_eq!(o.enforcing_success_rate.unwrap().value, 0);
        assert_eq!(o.interval.unwrap().seconds, 5);
        assert_eq!(o.base_ejection_time.unwrap().seconds, 60);
        assert_eq!(o.max_ejection_percent.unwrap().value, 50);
        let common = c.common_lb_config.unwrap();
        assert_eq!(common.healthy_panic_threshold.unwrap().value, 20.0);
        assert!(
            common.locality_config_specifier.is_none(),
            "the default locality setting has no failover rules"
        );
    }

    #[test]
    fn locality_settings_switch_on_locality_weighted_balancing() {
        let weighted = |c: &Cluster| {
            c.common_lb_config
                .as_ref()
                .unwrap()
                .locality_config_specifier
                .is_some()
        };
        let with = |setting: LocalityLoadBalancerSetting, outlier: bool| TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                locality_lb_setting: Some(setting),
                ..Default::default()
            }),
            outlier_detection: outlier.then(OutlierDetection::default),
            ..Default::default()
        };
        let distribute = LocalityLoadBalancerSetting {
            distribute: vec![Distribute {
                from: "r1/*".into(),
                to: [("r1/*".to_string(), 80), ("r2/*".to_string(), 20)].into(),
            }],
            ..Default::default()
        };
        let failover = LocalityLoadBalancerSetting {
            failover: vec![Failover {
                from: "r1".into(),
                to: "r2".into(),
            }],
            ..Default::default()
        };
        assert!(weighted(
            &Case::new(Some(with(distribute.clone(), false))).cluster()
        ));
        assert!(
            !weighted(&Case::new(Some(with(failover.clone(), false))).cluster()),
            "failover needs outlier detection"
        );
        assert!(weighted(
            &Case::new(Some(with(failover.clone(), true))).cluster()
        ));
        let disabled = LocalityLoadBalancerSetting {
            enabled: Some(false.into()),
            ..distribute
        };
        assert!(!weighted(&Case::new(Some(with(disabled, false))).cluster()));
        // The mesh-wide setting applies when the rule has none.
        let mut case = Case::new(Some(TrafficPolicy {
            outlier_detection: Some(OutlierDetection::default()),
            ..Default::default()
        }));
        case.mesh.locality_lb_setting = Some(failover);
        assert!(weighted(&case.cluster()));
    }

    #[test]
    fn port_level_and_subset_policies_merge_as_istio() {
        let top = TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                lb_policy: Some(LbPolicy::Simple(SimpleLb::Random as i32)),
                ..Default::default()
            }),
            connection_pool: Some(ConnectionPoolSettings {
                tcp: Some(TcpSettings {
                    max_connections: 10,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            port_level_settings: vec![PortTrafficPolicy {
                port: Some(PortSelector { number: 9080 }),
                load_balancer: Some(LoadBalancerSettings {
                    lb_policy: Some(LbPolicy::Simple(SimpleLb::RoundRobin as i32)),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let v2_policy = TrafficPolicy {
            outlier_detection: Some(OutlierDetection {
                consecutive_5xx_errors: Some(3.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut case = Case::new(None);
        case.rule = Some(rule(
            Some(top),
            vec![subset("v1", None), subset("v2", Some(v2_policy))],
        ));
        let max_conns = |c: &Cluster| {
            c.circuit_breakers.as_ref().unwrap().thresholds[0]
                .max_connections
                .unwrap()
                .value
        };
        // Port 8080: the top-level policy.
        let c = case.cluster();
        assert_eq!(c.lb_policy, cluster::LbPolicy::Random as i32);
        assert_eq!(max_conns(&c), 10);
        // Port 9080: the port-level policy replaces the top level (no inheritance).
        case.port = 9080;
        let c = case.cluster();
        assert_eq!(c.lb_policy, cluster::LbPolicy::RoundRobin as i32);
        assert_eq!(max_conns(&c), u32::MAX);
        // Subset v2 on 8080: its outlier detection over the top-level policy.
        case.port = 8080;
        case.subset = "v2";
        let c = case.cluster();
        assert_eq!(c.name, "outbound|8080|v2|reviews.default.svc.cluster.local");
        assert_eq!(c.lb_policy, cluster::LbPolicy::Random as i32);
        assert_eq!(max_conns(&c), 10);
        assert_eq!(
            c.outlier_detection.unwrap().consecutive_5xx.unwrap().value,
            3
        );
        let eds = c.eds_cluster_config.unwrap();
        assert_eq!(
            eds.service_name, c.name,
            "subset clusters are their own EDS resource"
        );
        let istio = &c.metadata.unwrap().filter_metadata["istio"];
        assert_eq!(
            istio.fields["config"].kind,
            Some(value::Kind::StringValue(
                "/apis/networking.istio.io/v1alpha3/namespaces/default/destination-rule/reviews"
                    .into()
            ))
        );
        assert_eq!(
            istio.fields["subset"].kind,
            Some(value::Kind::StringValue("v2".into()))
        );
        case.subset = "v3";
        assert!(case.build().is_none(), "no such subset");
    }

    #[test]
    fn dns_subset_clusters_carry_only_the_subset_endpoints() {
        let mut case = Case::new(None);
        case.service = service(Resolution::DnsLb);
        case.rule = Some(rule(None, vec![subset("v1", None)]));
        case.shards = Some(shards(vec![
            ep("10.1.0.1", "v1", TlsMode::Disabled),
            ep("10.1.0.2", "v2", TlsMode::Disabled),
        ]));
        case.subset = "v1";
        let c = case.cluster();
        let cla = c.load_assignment.unwrap();
        assert_eq!(cla.endpoints.len(), 1);
        assert_eq!(cla.endpoints[0].lb_endpoints.len(), 1);
        assert!(
            c.transport_socket_matches.len() == 2,
            "auto mTLS on DNS clusters too"
        );
    }

    #[test]
    fn tls_disable_simple_mutual_and_istio_mutual() {
        let tls = |t: ClientTlsSettings| {
            Some(TrafficPolicy {
                tls: Some(t),
                ..Default::default()
            })
        };
        // DISABLE: plaintext, and no auto mTLS either.
        let c = Case::new(tls(ClientTlsSettings {
            mode: TlSmode::Disable as i32,
            ..Default::default()
        }))
        .cluster();
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());

        // SIMPLE with a CA file and SANs: SDS from the agent reading the file.
        let c = Case::new(tls(ClientTlsSettings {
            mode: TlSmode::Simple as i32,
            ca_certificates: "/etc/certs/ca.pem".into(),
            subject_alt_names: vec!["api.example.com".into()],
            sni: "api.example.com".into(),
            ..Default::default()
        }))
        .cluster();
        assert!(c.transport_socket_matches.is_empty());
        let ctx = tls_of(c.transport_socket.as_ref().unwrap());
        assert_eq!(ctx.sni, "api.example.com");
        let common = ctx.common_tls_context.as_ref().unwrap();
        assert!(common.tls_certificate_sds_secret_configs.is_empty());
        let root = combined(&ctx)
            .validation_context_sds_secret_config
            .as_ref()
            .unwrap();
        assert_eq!(root.name, "file-root:/etc/certs/ca.pem");
        assert_eq!(
            sans(&ctx),
            vec![(
                subject_alt_name_matcher::SanType::Dns as i32,
                "api.example.com".to_string()
            )]
        );
        assert!(
            !c.typed_extension_protocol_options
                .contains_key(cluster_build::HTTP_PROTOCOL_OPTIONS),
            "SNI and SANs given: no auto SNI"
        );

        // SIMPLE without SNI/SANs: the system CA, auto SNI and SAN validation.
        let c = Case::new(tls(ClientTlsSettings {
            mode: TlSmode::Simple as i32,
            ..Default::default()
        }))
        .cluster();
        let ctx = tls_of(c.transport_socket.as_ref().unwrap());
        assert_eq!(
            combined(&ctx)
                .validation_context_sds_secret_config
                .as_ref()
                .unwrap()
                .name,
            "file-root:system"
        );
        let upstream = http_options(&c).upstream_http_protocol_options.unwrap();
        assert!(upstream.auto_sni && upstream.auto_san_validation);

        // MUTUAL with files: the client certificate too.
        let mutual = ClientTlsSettings {
            mode: TlSmode::Mutual as i32,
            client_certificate: "/etc/certs/cert.pem".into(),
            private_key: "/etc/certs/key.pem".into(),
            ca_certificates: "/etc/certs/ca.pem".into(),
            ..Default::default()
        };
        let c = Case::new(tls(mutual.clone())).cluster();
        let ctx = tls_of(c.transport_socket.as_ref().unwrap());
        let certs = &ctx
            .common_tls_context
            .as_ref()
            .unwrap()
            .tls_certificate_sds_secret_configs;
        assert_eq!(
            certs[0].name,
            "file-cert:/etc/certs/cert.pem~/etc/certs/key.pem"
        );
        assert!(matches!(
            certs[0].sds_config.as_ref().unwrap().config_source_specifier,
            Some(config_source::ConfigSourceSpecifier::ApiConfigSource(ref a))
                if a.grpc_services.len() == 1
        ));
        // MUTUAL without a key cannot work: no TLS at all (as istiod).
        let c = Case::new(tls(ClientTlsSettings {
            private_key: String::new(),
            ..mutual
        }))
        .cluster();
        assert!(c.transport_socket.is_none());

        // credentialName: a gateway fetches the secret over ADS; a sidecar does not get
        // it unless the rule selects workloads.
        let credential = ClientTlsSettings {
            mode: TlSmode::Mutual as i32,
            credential_name: "client-cert".into(),
            ..Default::default()
        };
        let mut case = Case::new(tls(credential.clone()));
        case.proxy = proxy_in("default", "10.0.0.1", "router");
        let ctx = tls_of(case.cluster().transport_socket.as_ref().unwrap());
        let common = ctx.common_tls_context.as_ref().unwrap();
        assert_eq!(
            common.tls_certificate_sds_secret_configs[0].name,
            "kubernetes://client-cert"
        );
        let ca = combined(&ctx)
            .validation_context_sds_secret_config
            .as_ref()
            .unwrap();
        assert_eq!(ca.name, "kubernetes://client-cert-cacert");
        assert!(matches!(
            ca.sds_config.as_ref().unwrap().config_source_specifier,
            Some(config_source::ConfigSourceSpecifier::Ads(_))
        ));
        let c = Case::new(tls(credential)).cluster();
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());

        // ISTIO_MUTUAL: the agent's workload certificate and root, Istio's ALPN and SNI,
        // and the service accounts as SANs.
        let mut case = Case::new(tls(ClientTlsSettings {
            mode: TlSmode::IstioMutual as i32,
            ..Default::default()
        }));
        case.mesh.trust_domain_aliases = vec!["old.local".into()];
        let c = case.cluster();
        assert!(
            c.transport_socket_matches.is_empty(),
            "explicit, not auto-detected"
        );
        let ctx = tls_of(c.transport_socket.as_ref().unwrap());
        assert_eq!(
            ctx.sni,
            "outbound_.8080_._.reviews.default.svc.cluster.local"
        );
        let common = ctx.common_tls_context.as_ref().unwrap();
        assert_eq!(common.alpn_protocols, vec!["istio-peer-exchange", "istio"]);
        assert_eq!(common.tls_certificate_sds_secret_configs[0].name, "default");
        let root = combined(&ctx)
            .validation_context_sds_secret_config
            .as_ref()
            .unwrap();
        assert_eq!(root.name, "ROOTCA");
        let Some(config_source::ConfigSourceSpecifier::ApiConfigSource(api)) =
            &root.sds_config.as_ref().unwrap().config_source_specifier
        else {
            panic!("SDS from the agent");
        };
        assert!(matches!(
            &api.grpc_services[0].target_specifier,
            Some(envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(g))
                if g.cluster_name == "sds-grpc"
        ));
        let uri = subject_alt_name_matcher::SanType::Uri as i32;
        assert_eq!(
            sans(&ctx),
            vec![
                (
                    uri,
                    "spiffe://cluster.local/ns/default/sa/reviews".to_string()
                ),
                (uri, "spiffe://old.local/ns/default/sa/reviews".to_string()),
            ]
        );
        // ... HTTP/2 ports add h2.
        case.port = 9080;
        let ctx = tls_of(case.cluster().transport_socket.as_ref().unwrap());
        assert_eq!(
            ctx.common_tls_context.unwrap().alpn_protocols,
            vec!["istio-peer-exchange", "istio", "h2"]
        );
    }

    #[test]
    fn auto_mtls_uses_socket_matches_on_the_tls_mode_label() {
        let mut case = Case::new(None);
        case.rule = None;
        let c = case.cluster();
        assert!(c.transport_socket.is_none());
        let names: Vec<&str> = c
            .transport_socket_matches
            .iter()
            .map(|m| m.name.as_str())
            .collect();
        assert_eq!(names, vec!["tlsMode-istio", "tlsMode-disabled"]);
        let istio = &c.transport_socket_matches[0];
        assert_eq!(
            istio.r#match.as_ref().unwrap().fields["tlsMode"].kind,
            Some(value::Kind::StringValue("istio".into()))
        );
        let ctx = tls_of(istio.transport_socket.as_ref().unwrap());
        assert_eq!(
            ctx.sni,
            "outbound_.8080_._.reviews.default.svc.cluster.local"
        );
        let plain = &c.transport_socket_matches[1];
        assert_eq!(plain.r#match, Some(Struct::default()));
        assert_eq!(
            plain.transport_socket.as_ref().unwrap().name,
            "envoy.transport_sockets.raw_buffer"
        );

        // Not for destinations outside the mesh, nor when the mesh turns it off.
        case.service.location = MeshLocation::MeshExternal;
        assert!(case.cluster().transport_socket_matches.is_empty());
        case.service.location = MeshLocation::MeshInternal;
        case.mesh.enable_auto_mtls = Some(false.into());
        assert!(case.cluster().transport_socket_matches.is_empty());
        case.mesh.enable_auto_mtls = Some(true.into());
        // Nor when the destination's namespace (or the mesh) disables mTLS.
        case.peer_mtls_disabled = true;
        assert!(case.cluster().transport_socket_matches.is_empty());
        assert!(case.cluster().transport_socket.is_none());
        case.peer_mtls_disabled = false;

        // Passthrough destinations: plain mTLS only when every endpoint takes it.
        case.service.resolution = Resolution::Passthrough;
        case.shards = Some(shards(vec![ep("10.1.0.1", "v1", TlsMode::Istio)]));
        let c = case.cluster();
        assert!(c.transport_socket_matches.is_empty());
        assert!(c.transport_socket.is_some());
        case.shards = Some(shards(vec![
            ep("10.1.0.1", "v1", TlsMode::Istio),
            ep("10.1.0.2", "v1", TlsMode::Disabled),
        ]));
        let c = case.cluster();
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());
    }

    #[test]
    fn sidecar_ingress_default_endpoints() {
        let v4: Vec<IpAddr> = vec!["1.2.3.4".parse().unwrap()];
        let v6: Vec<IpAddr> = vec!["fd00::1".parse().unwrap()];
        let socket = |a: &str, p| Some(InboundEndpoint::Socket(a.into(), p));
        assert_eq!(
            ingress_endpoint("", &v4),
            Some(InboundEndpoint::OriginalDst)
        );
        assert_eq!(
            ingress_endpoint("unix:///var/run/app.sock", &v4),
            Some(InboundEndpoint::Pipe("/var/run/app.sock".into()))
        );
        assert_eq!(
            ingress_endpoint("127.0.0.1:8080", &v4),
            socket("127.0.0.1", 8080)
        );
        assert_eq!(ingress_endpoint("127.0.0.1:8080", &v6), socket("::1", 8080));
        assert_eq!(
            ingress_endpoint("[::1]:8080", &v4),
            socket("127.0.0.1", 8080)
        );
        assert_eq!(
            ingress_endpoint("0.0.0.0:8080", &v4),
            socket("1.2.3.4", 8080)
        );
        assert_eq!(
            ingress_endpoint("0.0.0.0:8080", &v6),
            socket("127.0.0.1", 8080)
        );
        assert_eq!(ingress_endpoint("[::]:8080", &v6), socket("fd00::1", 8080));
        assert_eq!(ingress_endpoint("127.0.0.1", &v4), None);
        assert_eq!(ingress_endpoint("127.0.0.1:http", &v4), None);

        let mesh = default_mesh_config();
        let port = Port::new("http", 80, Protocol::Http).unwrap();
        let build = |endpoint| {
            inbound_cluster(&InboundRequest {
                target_port: 80,
                port: &port,
                policy: None,
                mesh: &mesh,
                v6_only: false,
                endpoint,
                services: &[],
                stat_service: None,
                rule: None,
            })
        };
        let endpoints = |c: &Cluster| -> Vec<Option<EnvoyAddress>> {
            c.load_assignment
                .iter()
                .flat_map(|la| &la.endpoints)
                .flat_map(|e| &e.lb_endpoints)
                .map(|lb| match &lb.host_identifier {
                    Some(lb_endpoint::HostIdentifier::Endpoint(e)) => e.address.clone(),
                    _ => None,
                })
                .collect()
        };
        // Loopback: static, no "magic" source address.
        let c = build(InboundEndpoint::Socket("127.0.0.1".into(), 8080));
        assert_eq!(c.name, "inbound|80||");
        assert_eq!(discovery(&c), cluster::DiscoveryType::Static as i32);
        assert_eq!(
            endpoints(&c),
            vec![Some(eds::socket("127.0.0.1".into(), 8080))]
        );
        assert!(c.upstream_bind_config.is_none());
        // The instance IP: static, from 127.0.0.6 so iptables lets it through.
        let c = build(InboundEndpoint::Socket("1.2.3.4".into(), 8080));
        assert_eq!(discovery(&c), cluster::DiscoveryType::Static as i32);
        assert!(c.upstream_bind_config.is_some());
        // A socket.
        let c = build(InboundEndpoint::Pipe("/socket".into()));
        let Some(Some(EnvoyAddress {
            address: Some(address::Address::Pipe(pipe)),
        })) = endpoints(&c).into_iter().next()
        else {
            panic!("a pipe endpoint")
        };
        assert_eq!(pipe.path, "/socket");
        // No default endpoint: the original destination, whatever the mesh says.
        let mut localhost = mesh.clone();
        localhost.inbound_traffic_policy = Some(InboundTrafficPolicy {
            mode: InboundMode::Localhost as i32,
        });
        let c = inbound_cluster(&InboundRequest {
            target_port: 80,
            port: &port,
            policy: None,
            mesh: &localhost,
            v6_only: false,
            endpoint: InboundEndpoint::OriginalDst,
            services: &[],
            stat_service: None,
            rule: None,
        });
        assert_eq!(discovery(&c), cluster::DiscoveryType::OriginalDst as i32);
        assert!(c.load_assignment.is_none());
    }

    #[test]
    fn inbound_clusters_forward_to_the_workload() {
        let mesh = default_mesh_config();
        let port = Port::new("grpc", 9080, Protocol::Grpc).unwrap();
        let pool = TrafficPolicy {
            connection_pool: Some(ConnectionPoolSettings {
                tcp: Some(TcpSettings {
                    max_connections: 5,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            outlier_detection: Some(OutlierDetection::default()),
            ..Default::default()
        };
        let ips = ["10.0.0.1".parse().unwrap()];
        let c = inbound_cluster(&InboundRequest {
            target_port: 19080,
            port: &port,
            policy: Some(&pool),
            mesh: &mesh,
            v6_only: v6_only(&ips),
            endpoint: InboundEndpoint::Mesh,
            services: &[],
            stat_service: None,
            rule: None,
        });
        assert_eq!(c.name, "inbound|19080||");
        assert_eq!(discovery(&c), cluster::DiscoveryType::OriginalDst as i32);
        assert_eq!(c.lb_policy, cluster::LbPolicy::ClusterProvided as i32);
        let bind = c
            .upstream_bind_config
            .as_ref()
            .unwrap()
            .source_address
            .as_ref()
            .unwrap();
        assert_eq!(bind.address, "127.0.0.6");
        assert!(is_h2(&c));
        assert_eq!(
            c.circuit_breakers.unwrap().thresholds[0]
                .max_connections
                .unwrap()
                .value,
            5
        );
        assert!(
            c.outlier_detection.is_none(),
            "inbound takes the connection pool only"
        );
        assert!(c.transport_socket.is_none() && c.transport_socket_matches.is_empty());

        let mut localhost = mesh.clone();
        localhost.inbound_traffic_policy = Some(InboundTrafficPolicy {
            mode: InboundMode::Localhost as i32,
        });
        let c = inbound_cluster(&InboundRequest {
            target_port: 19080,
            port: &port,
            policy: None,
            mesh: &localhost,
            v6_only: v6_only(&ips),
            endpoint: InboundEndpoint::Mesh,
            services: &[],
            stat_service: None,
            rule: None,
        });
        assert_eq!(discovery(&c), cluster::DiscoveryType::Static as i32);
        assert!(c.upstream_bind_config.is_none());
        let cla = c.load_assignment.unwrap();
        let Some(lb_endpoint::HostIdentifier::Endpoint(e)) =
            &cla.endpoints[0].lb_endpoints[0].host_identifier
        else {
            panic!()
        };
        assert_eq!(e.address, Some(eds::socket("127.0.0.1".into(), 19080)));

        let dual: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let c = inbound_passthrough(&mesh, &dual);
        assert_eq!(c.name, "InboundPassthroughCluster");
        let bind = c.upstream_bind_config.unwrap();
        assert_eq!(bind.source_address.unwrap().address, "127.0.0.6");
        assert_eq!(
            bind.extra_source_addresses[0]
                .address
                .as_ref()
                .unwrap()
                .address,
            "::6"
        );
    }
    /// The `istio.services` entry of a cluster: (host, name, namespace).
    fn services_of(c: &Cluster) -> Vec<(String, String, String)> {
        let string = |v: &envoy_types::pb::google::protobuf::Value| match &v.kind {
            Some(value::Kind::StringValue(s)) => s.clone(),
            other => panic!("not a string: {other:?}"),
        };
        let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"];
        let Some(value::Kind::ListValue(list)) = &istio.fields["services"].kind else {
            panic!("services is not a list");
        };
        list.values
            .iter()
            .map(|v| {
                let Some(value::Kind::StructValue(s)) = &v.kind else {
                    panic!("service entry is not a struct");
                };
                (
                    string(&s.fields["host"]),
                    string(&s.fields["name"]),
                    string(&s.fields["namespace"]),
                )
            })
            .collect()
    }

    /// cluster_builder_test.go's metadata vectors: every outbound cluster (subsets
    /// too) names its service; a rule adds `config` (and the subset), SIMPLE and
    /// MUTUAL TLS add `alpn_override: "false"`, ISTIO_MUTUAL does not.
    #[test]
    fn metadata_names_the_service_rule_subset_and_alpn_override() {
        let mut case = Case::new(None);
        case.rule = None;
        case.service.provider = ProviderId::Kubernetes;
        let c = case.cluster();
        assert_eq!(
            services_of(&c),
            vec![(
                HOST.to_string(),
                "reviews".to_string(),
                "default".to_string()
            )]
        );

        let tls = |mode: TlSmode| TrafficPolicy {
            tls: Some(ClientTlsSettings {
                mode: mode as i32,
                ..Default::default()
            }),
            ..Default::default()
        };
        for (mode, alpn_override) in [
            (TlSmode::Simple, true),
            (TlSmode::Mutual, true),
            (TlSmode::IstioMutual, false),
            (TlSmode::Disable, false),
        ] {
            let mut case = Case::new(Some(tls(mode)));
            case.rule = Some(rule(Some(tls(mode)), vec![subset("v1", None)]));
            for subset in ["", "v1"] {
                case.subset = subset;
                let c = case.cluster();
                let istio = &c.metadata.as_ref().unwrap().filter_metadata["istio"];
                assert_eq!(
                    istio.fields.get("alpn_override").map(|v| v.kind.clone()),
                    alpn_override.then(|| Some(value::Kind::StringValue("false".into()))),
                    "{mode:?} subset {subset:?}"
                );
                assert!(istio.fields.contains_key("config"));
                assert_eq!(istio.fields.contains_key("subset"), !subset.is_empty());
                assert_eq!(services_of(&c)[0].0, HOST);
            }
        }

        // A ServiceEntry host is its own short name.
        let mut case = Case::new(None);
        case.rule = None;
        case.service.provider = ProviderId::External;
        assert_eq!(services_of(&case.cluster())[0].1, HOST);
    }

    /// MeshConfig `outboundClusterStatName` / `inboundClusterStatName` become the
    /// clusters' `alt_stat_name` (Istio's BuildStatPrefix).
    #[test]
    fn cluster_stat_names_follow_the_mesh_patterns() {
        let mut case = Case::new(None);
        case.rule = Some(rule(None, vec![subset("v1", None)]));
        case.subset = "v1";
        case.service.provider = ProviderId::Kubernetes;
        case.mesh.outbound_cluster_stat_name =
            "%SERVICE%_%SERVICE_FQDN%_%SERVICE_PORT%_%SERVICE_PORT_NAME%_%SUBSET_NAME%".into();
        assert_eq!(
            case.cluster().alt_stat_name,
            format!("reviews.default_{HOST}_8080_http_v1;")
        );
        case.service.provider = ProviderId::External;
        assert_eq!(
            case.cluster().alt_stat_name,
            format!("{HOST}_{HOST}_8080_http_v1;")
        );

        let mut mesh = default_mesh_config();
        mesh.inbound_cluster_stat_name = "%SERVICE%_%SERVICE_PORT%_%TARGET_PORT%".into();
        let mut svc = service(Resolution::ClientSideLb);
        svc.provider = ProviderId::Kubernetes;
        let port = svc.port(8080).unwrap().clone();
        let c = inbound_cluster(&InboundRequest {
            target_port: 18080,
            port: &port,
            policy: None,
            mesh: &mesh,
            v6_only: false,
            endpoint: InboundEndpoint::Mesh,
            services: &[&svc],
            stat_service: Some(&svc),
            rule: None,
        });
        assert_eq!(c.alt_stat_name, "reviews.default_8080_18080;");
        assert_eq!(services_of(&c)[0].0, HOST);
    }

    /// cluster_builder_test.go's DNS cluster fields: the c-ares resolver with
    /// `udp_max_queries` 100 and a 100 ms DNS jitter (Istio's defaults), the mesh
    /// refresh rate and DNS TTLs; `InboundPassthroughCluster` keeps the passthrough
    /// cluster's stat name, as istiod renames only the cluster.
    #[test]
    #[allow(deprecated)]
    fn dns_clusters_get_istio_resolver_settings() {
        use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
        let mut case = Case::new(None);
        case.rule = None;
        case.service = service(Resolution::DnsLb);
        case.shards = Some(shards(vec![ep("10.1.0.1", "v1", TlsMode::Disabled)]));
        let c = case.cluster();
        let resolver = c.typed_dns_resolver_config.as_ref().unwrap();
        assert_eq!(resolver.name, "envoy.network.dns_resolver.cares");
        let cares = CaresDnsResolverConfig::decode(
            resolver.typed_config.as_ref().unwrap().value.as_slice(),
        )
        .unwrap();
        assert_eq!(cares.udp_max_queries.unwrap().value, 100);
        assert_eq!(
            c.dns_jitter,
            Some(PbDuration {
                seconds: 0,
                nanos: 100_000_000
            })
        );
        assert!(c.respect_dns_ttl);
        // EDS clusters get none of it.
        let eds = Case::new(None).cluster();
        assert!(eds.typed_dns_resolver_config.is_none() && eds.dns_jitter.is_none());
        let mesh = default_mesh_config();
        assert_eq!(
            inbound_passthrough(&mesh, &[]).alt_stat_name,
            "PassthroughCluster;"
        );
    }

    /// cluster_builder_test.go TestBuildDefaultCluster, "default EDS cluster" (our
    /// outbound cluster of an HTTP port without a rule): every field istiod sets but
    /// the upstream `istio.metadata_exchange` filter (the telemetry module's).
    #[test]
    fn build_default_cluster_vector() {
        let mut case = Case::new(None);
        case.rule = None;
        case.service.provider = ProviderId::Kubernetes;
        let c = case.cluster();
        let name = "outbound|8080||reviews.default.svc.cluster.local";
        assert_eq!(c.name, name);
        assert_eq!(c.alt_stat_name, format!("{name};"));
        assert_eq!(discovery(&c), cluster::DiscoveryType::Eds as i32);
        assert_eq!(c.common_lb_config, Some(Default::default()));
        assert_eq!(
            c.connect_timeout,
            Some(PbDuration {
                seconds: 10,
                nanos: 0
            })
        );
        assert_eq!(
            c.circuit_breakers.as_ref().unwrap().thresholds,
            vec![crate::generate::traffic_policy::default_thresholds()]
        );
        assert_eq!(c.lb_policy, cluster::LbPolicy::LeastRequest as i32);
        assert_eq!(
            services_of(&c),
            vec![(
                HOST.to_string(),
                "reviews".to_string(),
                "default".to_string()
            )]
        );
        let eds = c.eds_cluster_config.as_ref().unwrap();
        assert_eq!(eds.service_name, name);
        assert_eq!(eds.eds_config, Some(eds_source()));
        assert!(c.load_assignment.is_none() && c.dns_lookup_family == 0);
    }

    /// cluster_builder_test.go TestClusterDnsLookupFamily, the vectors without
    /// Istio's dual-stack feature (meshfed has none): IPv4 and dual-stack proxies
    /// resolve IPv4 only, IPv6-only proxies IPv6 only.
    #[test]
    fn cluster_dns_lookup_family_vectors() {
        let v4: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap()];
        let v6: Vec<IpAddr> = vec!["2001:1::1".parse().unwrap()];
        let dual: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "2001:1::1".parse().unwrap()];
        assert_eq!(dns_lookup_family(&v4), cluster::DnsLookupFamily::V4Only);
        assert_eq!(dns_lookup_family(&v6), cluster::DnsLookupFamily::V6Only);
        assert_eq!(dns_lookup_family(&dual), cluster::DnsLookupFamily::V4Only);
    }
}

/// CDS and EDS through the snapshot: which clusters a proxy gets, with which rule.
#[cfg(test)]
mod snapshot_tests {
    use std::collections::BTreeSet;

    use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
    use meshfed_api::networking::v1alpha3::ConnectionPoolSettings;
    use meshfed_api::networking::v1alpha3::connection_pool_settings::TcpSettings;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::{LbPolicy, SimpleLb};
    use meshfed_api::networking::v1alpha3::{
        IstioEgressListener, LoadBalancerSettings, Sidecar, Subset,
    };
    use meshfed_registry::{
        Aggregate, Endpoint, EndpointIndex, MemoryRegistry, PushRequest, TriggerReason, UpdateSink,
    };

    use super::tests::proxy_in;
    use super::*;
    use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
    use crate::mesh::MeshSettings;
    use crate::push::config_index::{ConfigIndex, ConfigSet};

    const REVIEWS: &str = "reviews.default.svc.cluster.local";

    fn cfg<T>(ns: &str, name: &str, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: std::time::SystemTime::UNIX_EPOCH,
            spec,
        }
    }

    fn lb(simple: SimpleLb) -> Option<TrafficPolicy> {
        Some(TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                lb_policy: Some(LbPolicy::Simple(simple as i32)),
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    fn snapshot(set: ConfigSet) -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _rx) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let reg = MemoryRegistry::new("c1", sink);
        let mut reviews = Service::new(REVIEWS, "default", ProviderId::Mock, "c1");
        reviews
            .ports
            .push(Port::new("http", 9080, Protocol::Http).unwrap());
        reviews
            .ports
            .push(Port::new("metrics", 9090, Protocol::Tcp).unwrap());
        reviews
            .ports
            .push(Port::new("dns", 53, Protocol::Udp).unwrap());
        let endpoint = |ip: &str, version: &str| {
            let mut e = Endpoint::new(ip.parse().unwrap())
                .with_port("http", 19080)
                .with_port("metrics", 19090);
            e.labels.insert("version".into(), version.into());
            e
        };
        let key = reviews.key();
        reg.add_service(reviews);
        reg.set_endpoints(
            &key,
            vec![
                endpoint("10.0.0.1", "v1"),
                endpoint("10.0.0.2", "v2"),
                endpoint("10.0.0.3", "v3"),
            ],
        );
        aggregate.add_registry(Arc::new(reg));
        let mesh = MeshSettings {
            config: crate::mesh::default_mesh_config(),
            ..Default::default()
        };
        Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(mesh),
            &|m| ConfigIndex::new(set.clone(), "cluster.local", m),
            1,
        )
    }

    fn rules() -> ConfigSet {
        let subset = |name: &str| Subset {
            name: name.into(),
            labels: [("version".to_string(), name.to_string())].into(),
            traffic_policy: None,
        };
        ConfigSet {
            destination_rules: vec![
                cfg(
                    "default",
                    "reviews",
                    DestinationRule {
                        host: "reviews".into(),
                        traffic_policy: lb(SimpleLb::RoundRobin),
                        subsets: vec![subset("v1"), subset("v2")],
                        ..Default::default()
                    },
                ),
                cfg(
                    "client",
                    "reviews-from-client",
                    DestinationRule {
                        host: REVIEWS.into(),
                        traffic_policy: lb(SimpleLb::Random),
                        ..Default::default()
                    },
                ),
            ],
            sidecars: vec![cfg(
                "default",
                "default",
                Sidecar {
                    egress: vec![IstioEgressListener {
                        hosts: vec!["*/*".into()],
                        ..Default::default()
                    }],
                    inbound_connection_pool: Some(ConnectionPoolSettings {
                        tcp: Some(TcpSettings {
                            max_connections: 42,
                            ..Default::default()
                        }),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )],
            ..Default::default()
        }
    }

    fn fetch(
        snapshot: &Snapshot,
        proxy: &Proxy,
        type_url: TypeUrl,
        wanted: &[&str],
    ) -> Vec<Resource> {
        let names: BTreeSet<String> = wanted.iter().map(|s| s.to_string()).collect();
        generate(
            type_url,
            snapshot,
            proxy,
            Subscription {
                wildcard: names.is_empty(),
                names: &names,
                interned: None,
            },
            Scope::All,
            &GeneratorOptions::default(),
        )
        .into_vec()
    }

    fn clusters(snapshot: &Snapshot, proxy: &Proxy, wanted: &[&str]) -> Vec<Cluster> {
        fetch(snapshot, proxy, TypeUrl::Cluster, wanted)
            .iter()
            .map(|r| Cluster::decode(r.body.value.clone()).unwrap())
            .collect()
    }

    fn names(clusters: &[Cluster]) -> Vec<&str> {
        clusters.iter().map(|c| c.name.as_str()).collect()
    }

    #[test]
    fn sidecars_get_subset_and_inbound_clusters() {
        let snap = snapshot(rules());
        // A sidecar of the reviews v1 pod.
        let proxy = proxy_in("default", "10.0.0.1", "sidecar");
        let all = clusters(&snap, &proxy, &[]);
        assert_eq!(
            names(&all),
            vec![
                "outbound|9080||reviews.default.svc.cluster.local",
                "outbound|9080|v1|reviews.default.svc.cluster.local",
                "outbound|9080|v2|reviews.default.svc.cluster.local",
                "outbound|9090||reviews.default.svc.cluster.local",
                "outbound|9090|v1|reviews.default.svc.cluster.local",
                "outbound|9090|v2|reviews.default.svc.cluster.local",
                "BlackHoleCluster",
                "PassthroughCluster",
                "inbound|19080||",
                "inbound|19090||",
                "InboundPassthroughCluster",
            ],
            "UDP ports get no cluster"
        );
        let inbound = &all[8];
        assert_eq!(
            inbound.circuit_breakers.as_ref().unwrap().thresholds[0]
                .max_connections
                .unwrap()
                .value,
            42,
            "the Sidecar's inboundConnectionPool"
        );
        // Named requests, including subsets and inbound clusters.
        let named = clusters(
            &snap,
            &proxy,
            &[
                "outbound|9080|v2|reviews.default.svc.cluster.local",
                "outbound|9080|v9|reviews.default.svc.cluster.local",
                "inbound|19090||",
                "InboundPassthroughCluster",
            ],
        );
        assert_eq!(
            names(&named),
            vec![
                "InboundPassthroughCluster",
                "inbound|19090||",
                "outbound|9080|v2|reviews.default.svc.cluster.local",
            ]
        );
        // Another workload's sidecar has no inbound clusters of reviews.
        let other = proxy_in("default", "10.9.9.9", "sidecar");
        let all = clusters(&snap, &other, &[]);
        assert_eq!(
            names(&all)
                .iter()
                .filter(|n| n.starts_with("inbound|"))
                .count(),
            0
        );
        assert!(names(&all).contains(&"InboundPassthroughCluster"));
        // Gateways: no passthrough, no inbound.
        let gateway = proxy_in("default", "10.0.0.1", "router");
        let all = clusters(&snap, &gateway, &[]);
        assert_eq!(all.len(), 7);
        assert_eq!(names(&all)[6], "BlackHoleCluster");
    }

    /// DNS clusters carry their endpoints inline, with priorities for the client's
    /// locality: two proxies in different localities get different priorities from one
    /// snapshot, while proxies that differ only in cluster, network and labels get the
    /// same cluster (no failoverPriority names a label here, so none is kept).
    #[test]
    fn dns_clusters_follow_the_client_locality_only() {
        use envoy_types::pb::envoy::config::core::v3::Node;
        use meshfed_api::networking::v1alpha3::OutlierDetection;
        const EXT: &str = "ext.example.com";
        let index = Arc::new(EndpointIndex::new());
        let (sink, _rx) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let reg = MemoryRegistry::new("c1", sink);
        let mut ext = Service::new(EXT, "default", ProviderId::External, "c1");
        ext.resolution = Resolution::DnsLb;
        ext.ports
            .push(Port::new("http", 80, Protocol::Http).unwrap());
        let key = ext.key();
        reg.add_service(ext);
        let at = |ip: &str, locality: &str, network: &str| {
            let mut e = Endpoint::new(ip.parse().unwrap()).with_port("http", 80);
            e.locality = meshfed_registry::Locality::parse(locality);
            e.network = network.into();
            e
        };
        reg.set_endpoints(
            &key,
            vec![at("10.0.0.1", "r1/z1", "n1"), at("10.0.0.2", "r2/z2", "n2")],
        );
        aggregate.add_registry(Arc::new(reg));
        let set = ConfigSet {
            destination_rules: vec![cfg(
                "default",
                "ext",
                DestinationRule {
                    host: EXT.into(),
                    traffic_policy: Some(TrafficPolicy {
                        outlier_detection: Some(OutlierDetection::default()),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        let snap = Snapshot::build(
            &Snapshot::empty(),
            &crate::xds::deps::PushScope::new(&PushRequest::forced(TriggerReason::Global)),
            &aggregate,
            &index,
            Arc::new(MeshSettings {
                config: crate::mesh::default_mesh_config(),
                ..Default::default()
            }),
            &|m| ConfigIndex::new(set.clone(), "cluster.local", m),
            1,
        );
        let client = |locality: &str, cluster: &str, network: &str, app: &str| {
            let node = Node {
                id: "sidecar~10.9.0.1~app.default~default.svc.cluster.local".into(),
                locality: Some(envoy_types::pb::envoy::config::core::v3::Locality {
                    region: locality.split('/').next().unwrap().into(),
                    zone: locality.split('/').nth(1).unwrap().into(),
                    ..Default::default()
                }),
                metadata: Some(crate::model::proxy::json_to_struct(&serde_json::json!({
                    "NAMESPACE": "default",
                    "CLUSTER_ID": cluster,
                    "NETWORK": network,
                    "LABELS": {"app": app},
                }))),
                ..Default::default()
            };
            Proxy::from_node(Some(&node)).unwrap()
        };
        let name = "outbound|80||ext.example.com";
        let priorities = |proxy: &Proxy| -> Vec<(String, u32)> {
            let c = clusters(&snap, proxy, &[name]);
            let mut out: Vec<(String, u32)> = c[0]
                .load_assignment
                .as_ref()
                .unwrap()
                .endpoints
                .iter()
                .map(|l| (l.locality.as_ref().unwrap().region.clone(), l.priority))
                .collect();
            out.sort();
            out
        };
        let r1 = priorities(&client("r1/z1", "c1", "n1", "a"));
        assert_eq!(r1, vec![("r1".to_string(), 0), ("r2".to_string(), 1)]);
        let r2 = priorities(&client("r2/z2", "c1", "n1", "a"));
        assert_eq!(r2, vec![("r1".to_string(), 1), ("r2".to_string(), 0)]);
        assert_eq!(priorities(&client("r1/z1", "c2", "n2", "b")), r1);
        let before = snap.cache().stats().size;
        priorities(&client("r1/z1", "c3", "n3", "c"));
        assert_eq!(snap.cache().stats().size, before, "shared, not a new entry");
    }

    #[test]
    fn the_rule_depends_on_the_proxy_namespace() {
        let snap = snapshot(rules());
        let host_cluster = "outbound|9080||reviews.default.svc.cluster.local";
        let lb_of = |ns: &str| {
            let c = clusters(&snap, &proxy_in(ns, "10.8.0.1", "sidecar"), &[host_cluster]);
            assert_eq!(c.len(), 1);
            (c[0].lb_policy, c[0].metadata.clone())
        };
        // The client namespace has its own rule ...
        assert_eq!(lb_of("client").0, cluster::LbPolicy::Random as i32);
        // ... others use the service namespace's, and both coexist in the cache.
        let (policy, metadata) = lb_of("other");
        assert_eq!(policy, cluster::LbPolicy::RoundRobin as i32);
        assert!(format!("{metadata:?}").contains("destination-rule/reviews"));
        assert_eq!(lb_of("default").0, cluster::LbPolicy::RoundRobin as i32);
        assert_eq!(lb_of("client").0, cluster::LbPolicy::Random as i32);
        // The client namespace's rule defines no subsets.
        let subset = clusters(
            &snap,
            &proxy_in("client", "10.8.0.1", "sidecar"),
            &["outbound|9080|v1|reviews.default.svc.cluster.local"],
        );
        assert!(subset.is_empty());
    }

    #[test]
    fn subset_load_assignments_filter_by_labels() {
        let snap = snapshot(rules());
        let proxy = proxy_in("default", "10.8.0.1", "sidecar");
        let wanted = [
            "outbound|9080||reviews.default.svc.cluster.local",
            "outbound|9080|v1|reviews.default.svc.cluster.local",
            "outbound|9080|v9|reviews.default.svc.cluster.local",
        ];
        let resources = fetch(&snap, &proxy, TypeUrl::Endpoint, &wanted);
        let addresses: Vec<(String, usize, bool)> = resources
            .iter()
            .map(|r| {
                let cla = ClusterLoadAssignment::decode(r.body.value.clone()).unwrap();
                let n = cla.endpoints.iter().map(|l| l.lb_endpoints.len()).sum();
                (cla.cluster_name, n, r.placeholder)
            })
            .collect();
        assert_eq!(
            addresses,
            vec![
                (wanted[1].to_string(), 1, false),
                (wanted[2].to_string(), 0, true),
                (wanted[0].to_string(), 3, false),
            ],
            "only v1 endpoints in the v1 subset; an unknown subset is a placeholder"
        );
        // From the client namespace the subsets do not exist.
        let client = proxy_in("client", "10.8.0.1", "sidecar");
        let resources = fetch(&snap, &client, TypeUrl::Endpoint, &wanted[1..2]);
        assert!(resources[0].placeholder);
        // A wildcard EDS subscription names the subset clusters too.
        let all = fetch(&snap, &proxy, TypeUrl::Endpoint, &[]);
        let names: Vec<&str> = all.iter().map(|r| &*r.name).collect();
        assert!(names.contains(&"outbound|9090|v2|reviews.default.svc.cluster.local"));
    }

    /// A Sidecar `ingress` port backed by one of the proxy's services takes the
    /// connection pool of that service's DestinationRule (Istio's buildInboundCluster
    /// for Sidecar ingress), names the rule and the service in its metadata, and a
    /// pool on the ingress port wins over the rule's.
    #[test]
    fn sidecar_ingress_clusters_take_the_service_rule() {
        use meshfed_api::networking::v1alpha3::IstioIngressListener;
        use meshfed_api::networking::v1alpha3::SidecarPort;
        let pool = |max: i32| ConnectionPoolSettings {
            tcp: Some(TcpSettings {
                max_connections: max,
                ..Default::default()
            }),
            ..Default::default()
        };
        let set = |ingress_pool: Option<ConnectionPoolSettings>| ConfigSet {
            destination_rules: vec![cfg(
                "default",
                "reviews",
                DestinationRule {
                    host: REVIEWS.into(),
                    traffic_policy: Some(TrafficPolicy {
                        connection_pool: Some(pool(7)),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            )],
            sidecars: vec![cfg(
                "default",
                "default",
                Sidecar {
                    ingress: vec![IstioIngressListener {
                        port: Some(SidecarPort {
                            number: 19080,
                            protocol: "HTTP".into(),
                            name: "http".into(),
                            ..Default::default()
                        }),
                        default_endpoint: "127.0.0.1:19080".into(),
                        connection_pool: ingress_pool,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )],
            ..Default::default()
        };
        let proxy = proxy_in("default", "10.0.0.1", "sidecar");
        let max = |c: &Cluster| {
            c.circuit_breakers.as_ref().unwrap().thresholds[0]
                .max_connections
                .unwrap()
                .value
        };
        let snap = snapshot(set(None));
        let c = clusters(&snap, &proxy, &["inbound|19080||"]);
        assert_eq!(max(&c[0]), 7, "the service's rule");
        let istio = &c[0].metadata.as_ref().unwrap().filter_metadata["istio"];
        assert!(format!("{istio:?}").contains("destination-rule/reviews"));
        assert!(format!("{istio:?}").contains(REVIEWS));
        let snap = snapshot(set(Some(pool(3))));
        let c = clusters(&snap, &proxy, &["inbound|19080||"]);
        assert_eq!(max(&c[0]), 3, "the ingress port's pool wins");
    }
}

//! DestinationRule traffic policies and how they become Envoy cluster settings, the way
//! istiod translates them (`pilot/pkg/networking/core/cluster_traffic_policy.go`):
//! connection pools, outlier detection, load balancing and locality, with the upstream
//! TLS of [`super::upstream_tls`].
//!
//! Everything here is a pure function of the policy and the facts passed in: the caller
//! picks the DestinationRule (and so decides what goes into the cache key).

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlierDetection, UpstreamConnectionOptions,
    circuit_breakers, cluster,
};
use envoy_types::pb::envoy::config::core::v3::{
    HttpProtocolOptions as CommonHttpProtocolOptions, TcpKeepalive,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::http_protocol_options;
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{UInt32Value, UInt64Value};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::H2UpgradePolicy as MeshH2UpgradePolicy;
use meshfed_api::networking::v1alpha3::connection_pool_settings::http_settings::H2UpgradePolicy;
use meshfed_api::networking::v1alpha3::connection_pool_settings::tcp_settings::TcpKeepalive as IstioTcpKeepalive;
use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::HashAlgorithm;
use meshfed_api::networking::v1alpha3::load_balancer_settings::{LbPolicy, SimpleLb};
use meshfed_api::networking::v1alpha3::{
    ConnectionPoolSettings, LoadBalancerSettings, LocalityLoadBalancerSetting, OutlierDetection,
    TrafficPolicy,
};
use meshfed_registry::Port;

use super::cluster_build::*;
use super::destination_rule::*;
use super::proto::*;
use super::upstream_tls::*;
use crate::xds::names::Direction;

/// Applies `policy` (already resolved for the port and subset) to a cluster, as
/// Istio's applyTrafficPolicy: connection pool (with the defaults when unset); then for
/// outbound clusters h2 upgrade, outlier detection, load balancing and TLS (including
/// auto mTLS); ORIGINAL_DST clusters always balance CLUSTER_PROVIDED.
pub fn apply_traffic_policy(
    c: &mut ClusterBuild,
    policy: Option<&TrafficPolicy>,
    ctx: &PolicyContext<'_>,
) {
    let default_pool = ConnectionPoolSettings::default();
    let pool = policy
        .and_then(|p| p.connection_pool.as_ref())
        .unwrap_or(&default_pool);
    apply_connection_pool(c, ctx.mesh, pool);
    if ctx.direction == Direction::Outbound {
        if should_h2_upgrade(ctx.port, ctx.mesh, pool) {
            c.set_h2();
        }
        apply_outlier_detection(
            &mut c.cluster,
            policy.and_then(|p| p.outlier_detection.as_ref()),
        );
        apply_load_balancer(c, policy.and_then(|p| p.load_balancer.as_ref()), ctx);
        let (tls, auto) = upstream_tls_settings(policy.and_then(|p| p.tls.as_ref()), policy, ctx);
        apply_upstream_tls(c, tls.as_ref(), auto, ctx);
    }
    if is_original_dst(&c.cluster) {
        c.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
    }
}

/// Envoy's circuit breaker defaults are far too low for a mesh; Istio raises every
/// threshold to the maximum unless the policy sets it.
pub fn default_thresholds() -> circuit_breakers::Thresholds {
    let max = Some(UInt32Value { value: u32::MAX });
    circuit_breakers::Thresholds {
        max_connections: max,
        max_pending_requests: max,
        max_requests: max,
        max_retries: max,
        track_remaining: true,
        ..Default::default()
    }
}

/// Connection pool settings: circuit breakers, connect timeout, TCP keepalive, idle
/// timeout, maximum connection duration and requests per connection.
pub fn apply_connection_pool(
    c: &mut ClusterBuild,
    mesh: &MeshConfig,
    pool: &ConnectionPoolSettings,
) {
    let mut thresholds = default_thresholds();
    let mut idle_timeout = None;
    let mut max_requests_per_connection = 0;
    let mut max_concurrent_streams = 0;
    let mut max_connection_duration = None;
    if let Some(http) = &pool.http {
        if http.http2_max_requests > 0 {
            thresholds.max_requests = Some(UInt32Value {
                value: http.http2_max_requests as u32,
            });
        }
        if http.http1_max_pending_requests > 0 {
            thresholds.max_pending_requests = Some(UInt32Value {
                value: http.http1_max_pending_requests as u32,
            });
        }
        if http.max_retries > 0 {
            thresholds.max_retries = Some(UInt32Value {
                value: http.max_retries as u32,
            });
        }
        idle_timeout = http.idle_timeout;
        max_requests_per_connection = http.max_requests_per_connection.max(0) as u32;
        max_concurrent_streams = http.max_concurrent_streams.max(0) as u32;
    }
    c.cluster.connect_timeout = Some(pb_duration(
        mesh.connect_timeout
            .unwrap_or(meshfed_api::Duration::new(10, 0)),
    ));
    if let Some(tcp) = &pool.tcp {
        if let Some(t) = tcp.connect_timeout {
            c.cluster.connect_timeout = Some(pb_duration(t));
        }
        if tcp.max_connections > 0 {
            thresholds.max_connections = Some(UInt32Value {
                value: tcp.max_connections as u32,
            });
        }
        max_connection_duration = tcp.max_connection_duration;
        if idle_timeout.is_none() {
            idle_timeout = tcp.idle_timeout;
        }
    }
    set_keepalive(&mut c.cluster, mesh.tcp_keepalive.as_ref());
    set_keepalive(
        &mut c.cluster,
        pool.tcp.as_ref().and_then(|t| t.tcp_keepalive.as_ref()),
    );
    c.cluster.circuit_breakers = Some(CircuitBreakers {
        thresholds: vec![thresholds],
        ..Default::default()
    });
    if max_connection_duration.is_some()
        || idle_timeout.is_some()
        || max_requests_per_connection > 0
        || max_concurrent_streams > 0
    {
        let h2 = c.is_http2();
        let options = c.http();
        let common = options
            .common_http_protocol_options
            .get_or_insert_with(CommonHttpProtocolOptions::default);
        if let Some(t) = idle_timeout {
            common.idle_timeout = Some(pb_duration(t));
        }
        if max_requests_per_connection > 0 {
            common.max_requests_per_connection = Some(UInt32Value {
                value: max_requests_per_connection,
            });
        }
        if let Some(d) = max_connection_duration {
            common.max_connection_duration = Some(pb_duration(d));
        }
        if h2 && max_concurrent_streams > 0 {
            use http_protocol_options::explicit_http_config::ProtocolConfig;
            if let Some(http_protocol_options::UpstreamProtocolOptions::ExplicitHttpConfig(
                http_protocol_options::ExplicitHttpConfig {
                    protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(h2)),
                },
            )) = options.upstream_protocol_options.as_mut()
            {
                h2.max_concurrent_streams = Some(UInt32Value {
                    value: max_concurrent_streams,
                });
            }
        }
    }
    if pool.http.is_some_and(|h| h.use_client_protocol) {
        c.set_use_downstream_protocol();
    }
}

/// Mesh-wide keepalive first, then the rule's fields on top; any keepalive setting
/// turns SO_KEEPALIVE on.
fn set_keepalive(c: &mut Cluster, keepalive: Option<&IstioTcpKeepalive>) {
    let Some(k) = keepalive else {
        return;
    };
    let options = c
        .upstream_connection_options
        .get_or_insert_with(|| UpstreamConnectionOptions {
            tcp_keepalive: Some(TcpKeepalive::default()),
            ..Default::default()
        });
    let tcp = options
        .tcp_keepalive
        .get_or_insert_with(TcpKeepalive::default);
    if k.probes > 0 {
        tcp.keepalive_probes = Some(UInt32Value { value: k.probes });
    }
    if let Some(t) = k.time {
        tcp.keepalive_time = Some(UInt32Value {
            value: t.seconds.clamp(0, i64::from(u32::MAX)) as u32,
        });
    }
    if let Some(i) = k.interval {
        tcp.keepalive_interval = Some(UInt32Value {
            value: i.seconds.clamp(0, i64::from(u32::MAX)) as u32,
        });
    }
}

/// Istio's shouldH2Upgrade: the rule's UPGRADE / DO_NOT_UPGRADE wins; otherwise only
/// HTTP ports follow the mesh-wide h2UpgradePolicy.
fn should_h2_upgrade(port: &Port, mesh: &MeshConfig, pool: &ConnectionPoolSettings) -> bool {
    if let Some(http) = &pool.http {
        if http.h2_upgrade_policy == H2UpgradePolicy::Upgrade as i32 {
            return true;
        }
        if http.h2_upgrade_policy == H2UpgradePolicy::DoNotUpgrade as i32 {
            return false;
        }
    }
    port.protocol.is_http() && mesh.h2_upgrade_policy == MeshH2UpgradePolicy::Upgrade as i32
}

/// Outlier detection: consecutive 5xx / gateway / local-origin failures (each enforced
/// at 100% when non-zero), interval, base ejection time, maximum ejection percent;
/// success-rate ejection off; `minHealthPercent` becomes the panic threshold.
pub fn apply_outlier_detection(c: &mut Cluster, outlier: Option<&OutlierDetection>) {
    let Some(o) = outlier else {
        return;
    };
    let enforce = |v: u32| {
        Some(UInt32Value {
            value: if v > 0 { 100 } else { 0 },
        })
    };
    let mut out = EnvoyOutlierDetection {
        enforcing_success_rate: Some(UInt32Value { value: 0 }),
        ..Default::default()
    };
    if let Some(e) = o.consecutive_5xx_errors.map(|v| v.value) {
        out.consecutive_5xx = Some(UInt32Value { value: e });
        out.enforcing_consecutive_5xx = enforce(e);
    }
    if let Some(e) = o.consecutive_gateway_errors.map(|v| v.value) {
        out.consecutive_gateway_failure = Some(UInt32Value { value: e });
        out.enforcing_consecutive_gateway_failure = enforce(e);
    }
    out.interval = o.interval.map(pb_duration);
    out.base_ejection_time = o.base_ejection_time.map(pb_duration);
    if o.max_ejection_percent > 0 {
        out.max_ejection_percent = Some(UInt32Value {
            value: o.max_ejection_percent as u32,
        });
    }
    if o.split_external_local_origin_errors {
        out.split_external_local_origin_errors = true;
        if let Some(n) = o
            .consecutive_local_origin_failures
            .map(|v| v.value)
            .filter(|n| *n > 0)
        {
            out.consecutive_local_origin_failure = Some(UInt32Value { value: n });
            out.enforcing_consecutive_local_origin_failure = Some(UInt32Value { value: 100 });
        }
        out.enforcing_local_origin_success_rate = Some(UInt32Value { value: 0 });
    }
    c.outlier_detection = Some(out);
    if o.min_health_percent >= 0 {
        c.common_lb_config
            .get_or_insert_with(Default::default)
            .healthy_panic_threshold = Some(Percent {
            value: f64::from(o.min_health_percent),
        });
    }
}

/// Load balancing: locality configuration, then the algorithm. Istio's default is
/// LEAST_REQUEST; PASSTHROUGH turns the cluster into ORIGINAL_DST; consistent hashing is
/// RING_HASH (minimum ring size, 1024 by default) or MAGLEV (table size).
fn apply_load_balancer(
    c: &mut ClusterBuild,
    lb: Option<&LoadBalancerSettings>,
    ctx: &PolicyContext<'_>,
) {
    let (locality, forced) = locality_lb_setting_for(ctx.mesh, lb, ctx.traffic_distribution);
    apply_locality_config(&mut c.cluster, locality.as_ref(), ctx, forced);
    if is_original_dst(&c.cluster) {
        c.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
        return;
    }
    let warmup = lb
        .and_then(|lb| lb.warmup_duration_secs)
        .map(|d| cluster::SlowStartConfig {
            slow_start_window: Some(pb_duration(d)),
            ..Default::default()
        });
    let simple = match lb.and_then(|lb| lb.lb_policy.as_ref()) {
        Some(LbPolicy::Simple(s)) => SimpleLb::try_from(*s).unwrap_or(SimpleLb::Unspecified),
        _ => SimpleLb::Unspecified,
    };
    match simple {
        SimpleLb::Random => c.cluster.lb_policy = cluster::LbPolicy::Random as i32,
        SimpleLb::RoundRobin => {
            c.cluster.lb_policy = cluster::LbPolicy::RoundRobin as i32;
            if let Some(w) = warmup {
                c.cluster.lb_config = Some(cluster::LbConfig::RoundRobinLbConfig(
                    cluster::RoundRobinLbConfig {
                        slow_start_config: Some(w),
                    },
                ));
            }
        }
        SimpleLb::Passthrough => {
            c.cluster.lb_policy = cluster::LbPolicy::ClusterProvided as i32;
            c.cluster.cluster_discovery_type = Some(cluster::ClusterDiscoveryType::Type(
                cluster::DiscoveryType::OriginalDst as i32,
            ));
            c.cluster.load_assignment = None;
        }
        SimpleLb::LeastConn | SimpleLb::LeastRequest | SimpleLb::Unspecified => {
            c.cluster.lb_policy = cluster::LbPolicy::LeastRequest as i32;
            if let Some(w) = warmup {
                c.cluster.lb_config = Some(cluster::LbConfig::LeastRequestLbConfig(
                    cluster::LeastRequestLbConfig {
                        slow_start_config: Some(w),
                        ..Default::default()
                    },
                ));
            }
        }
    }
    if let Some(LbPolicy::ConsistentHash(hash)) = lb.and_then(|lb| lb.lb_policy.as_ref()) {
        match hash.hash_algorithm {
            Some(HashAlgorithm::Maglev(m)) => {
                c.cluster.lb_policy = cluster::LbPolicy::Maglev as i32;
                c.cluster.lb_config = (m.table_size != 0).then_some(
                    cluster::LbConfig::MaglevLbConfig(cluster::MaglevLbConfig {
                        table_size: Some(UInt64Value {
                            value: m.table_size,
                        }),
                    }),
                );
            }
            Some(HashAlgorithm::RingHash(r)) => {
                c.cluster.lb_policy = cluster::LbPolicy::RingHash as i32;
                c.cluster.lb_config =
                    (r.minimum_ring_size != 0).then(|| ring_hash(r.minimum_ring_size));
            }
            None => {
                c.cluster.lb_policy = cluster::LbPolicy::RingHash as i32;
                let size = if hash.minimum_ring_size != 0 {
                    hash.minimum_ring_size
                } else {
                    1024
                };
                c.cluster.lb_config = Some(ring_hash(size));
            }
        }
    }
}

fn ring_hash(minimum_ring_size: u64) -> cluster::LbConfig {
    cluster::LbConfig::RingHashLbConfig(cluster::RingHashLbConfig {
        minimum_ring_size: Some(UInt64Value {
            value: minimum_ring_size,
        }),
        ..Default::default()
    })
}

/// Locality-weighted balancing is switched on when `distribute` is set, or when a
/// failover setting is given and outlier detection is configured (failover needs
/// outlier detection, or Envoy never leaves priority 0). Inline (DNS) load assignments
/// get the per-client weights and priorities right away, failoverPriority included
/// (Istio splits STRICT_DNS endpoints by priority too).
fn apply_locality_config(
    c: &mut Cluster,
    setting: Option<&LocalityLoadBalancerSetting>,
    ctx: &PolicyContext<'_>,
    forced_failover: bool,
) {
    let failover = forced_failover || c.outlier_detection.is_some();
    let common = c.common_lb_config.get_or_insert_with(Default::default);
    if let Some(s) = setting
        && (!s.distribute.is_empty()
            || (failover && (!s.failover.is_empty() || !s.failover_priority.is_empty())))
    {
        common.locality_config_specifier = Some(
            cluster::common_lb_config::LocalityConfigSpecifier::LocalityWeightedLbConfig(
                cluster::common_lb_config::LocalityWeightedLbConfig {},
            ),
        );
    }
    if let (Some(cla), Some(s)) = (c.load_assignment.as_mut(), setting) {
        super::locality_lb::apply_locality_lb(
            cla,
            ctx.endpoint_labels,
            &super::locality_lb::LocalityLb {
                setting: s,
                proxy_locality: ctx.proxy_locality,
                proxy_labels: ctx.proxy_labels,
                failover,
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use meshfed_api::networking::v1alpha3::PortSelector;
    use meshfed_api::networking::v1alpha3::connection_pool_settings::TcpSettings;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::ConsistentHashLb;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::HttpCookie;
    use meshfed_api::networking::v1alpha3::traffic_policy::PortTrafficPolicy;

    use envoy_types::pb::envoy::config::route::v3::route_action::hash_policy;
    use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::subject_alt_name_matcher;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::HashKey;
    use meshfed_api::networking::v1alpha3::{DestinationRule, Subset};

    use super::*;
    use crate::mesh::default_mesh_config;

    fn simple(lb: SimpleLb) -> Option<LoadBalancerSettings> {
        Some(LoadBalancerSettings {
            lb_policy: Some(LbPolicy::Simple(lb as i32)),
            ..Default::default()
        })
    }

    fn pool(max: i32) -> Option<ConnectionPoolSettings> {
        Some(ConnectionPoolSettings {
            tcp: Some(TcpSettings {
                max_connections: max,
                ..Default::default()
            }),
            ..Default::default()
        })
    }

    #[test]
    fn port_level_replaces_and_subsets_override_field_by_field() {
        let top = TrafficPolicy {
            load_balancer: simple(SimpleLb::Random),
            connection_pool: pool(10),
            port_level_settings: vec![PortTrafficPolicy {
                port: Some(PortSelector { number: 80 }),
                load_balancer: simple(SimpleLb::RoundRobin),
                ..Default::default()
            }],
            ..Default::default()
        };
        let (p80, port_level) = port_level_policy(&top, 80);
        assert!(port_level);
        assert_eq!(p80.load_balancer, simple(SimpleLb::RoundRobin));
        assert_eq!(
            p80.connection_pool, None,
            "port-level settings do not inherit"
        );
        let (p81, port_level) = port_level_policy(&top, 81);
        assert!(!port_level);
        assert_eq!(p81.connection_pool, pool(10));
        assert!(p81.port_level_settings.is_empty());

        // A subset's own settings win field by field ...
        let subset = TrafficPolicy {
            connection_pool: pool(5),
            ..Default::default()
        };
        let merged = merge_subset_policy(Some(&top), Some(&subset), 81).unwrap();
        assert_eq!(merged.connection_pool, pool(5));
        assert_eq!(merged.load_balancer, simple(SimpleLb::Random));
        // ... over the rule's port-level policy for the port ...
        let merged = merge_subset_policy(Some(&top), Some(&subset), 80).unwrap();
        assert_eq!(merged.load_balancer, simple(SimpleLb::RoundRobin));
        assert_eq!(merged.connection_pool, pool(5));
        // ... and a subset port-level entry replaces all four.
        let subset_port_level = TrafficPolicy {
            port_level_settings: vec![PortTrafficPolicy {
                port: Some(PortSelector { number: 81 }),
                connection_pool: pool(1),
                ..Default::default()
            }],
            ..Default::default()
        };
        let merged = merge_subset_policy(Some(&top), Some(&subset_port_level), 81).unwrap();
        assert_eq!(merged.connection_pool, pool(1));
        assert_eq!(merged.load_balancer, None);
        assert_eq!(
            merge_subset_policy(None, Some(&subset), 80),
            Some(subset.clone())
        );
        assert_eq!(merge_subset_policy(None, None, 80), None);

        let rule = DestinationRule {
            traffic_policy: Some(top),
            subsets: vec![Subset {
                name: "v1".into(),
                traffic_policy: Some(subset),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert_eq!(
            destination_policy(&rule, 81, "v1").unwrap().connection_pool,
            pool(5)
        );
        assert_eq!(
            destination_policy(&rule, 81, "").unwrap().connection_pool,
            pool(10)
        );
        assert_eq!(destination_policy(&rule, 81, "v2"), None);
    }

    #[test]
    fn hash_policies_for_routes() {
        let hashed = |key: HashKey| TrafficPolicy {
            load_balancer: Some(LoadBalancerSettings {
                lb_policy: Some(LbPolicy::ConsistentHash(ConsistentHashLb {
                    hash_key: Some(key),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        };
        use hash_policy::PolicySpecifier as P;
        let one = |key: HashKey| {
            let mut v = hash_policy(Some(&hashed(key)));
            assert_eq!(v.len(), 1);
            v.remove(0).policy_specifier.unwrap()
        };
        assert!(matches!(
            one(HashKey::HttpHeaderName("x-user".into())),
            P::Header(h) if h.header_name == "x-user"
        ));
        assert!(matches!(
            one(HashKey::HttpCookie(HttpCookie {
                name: "session".into(),
                path: "/".into(),
                ttl: Some(meshfed_api::Duration::new(60, 0)),
                ..Default::default()
            })),
            P::Cookie(c) if c.name == "session" && c.path == "/" && c.ttl.unwrap().seconds == 60
        ));
        assert!(matches!(
            one(HashKey::UseSourceIp(true)),
            P::ConnectionProperties(c) if c.source_ip
        ));
        assert!(matches!(
            one(HashKey::HttpQueryParameterName("user".into())),
            P::QueryParameter(q) if q.name == "user"
        ));
        let round_robin = TrafficPolicy {
            load_balancer: simple(SimpleLb::RoundRobin),
            ..Default::default()
        };
        assert!(hash_policy(Some(&round_robin)).is_empty());
        assert!(hash_policy(None).is_empty());
    }

    #[test]
    fn locality_setting_precedence() {
        let mut mesh = default_mesh_config();
        let rule_setting = LocalityLoadBalancerSetting {
            failover_priority: vec!["a".into()],
            ..Default::default()
        };
        let lb = LoadBalancerSettings {
            locality_lb_setting: Some(rule_setting.clone()),
            ..Default::default()
        };
        assert_eq!(locality_lb_setting(&mesh, Some(&lb)), Some(rule_setting));
        assert_eq!(
            locality_lb_setting(&mesh, None).unwrap().enabled,
            Some(true.into()),
            "Istio's mesh default is enabled"
        );
        mesh.locality_lb_setting = Some(LocalityLoadBalancerSetting {
            enabled: Some(false.into()),
            ..Default::default()
        });
        assert_eq!(locality_lb_setting(&mesh, None), None);
        let off = LoadBalancerSettings {
            locality_lb_setting: Some(LocalityLoadBalancerSetting {
                enabled: Some(false.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            locality_lb_setting(&default_mesh_config(), Some(&off)),
            None
        );
    }

    #[test]
    fn subject_alt_names_are_typed_by_form() {
        use subject_alt_name_matcher::SanType;
        let types: Vec<i32> = san_matchers(&[
            "spiffe://cluster.local/ns/a/sa/b".into(),
            "10.0.0.1".into(),
            "api.example.com".into(),
        ])
        .iter()
        .map(|m| m.san_type)
        .collect();
        assert_eq!(
            types,
            vec![
                SanType::Uri as i32,
                SanType::IpAddress as i32,
                SanType::Dns as i32
            ]
        );
        assert_eq!(credential_sds("cert").name, "kubernetes://cert");
        assert_eq!(
            credential_sds("kubernetes://cert").name,
            "kubernetes://cert"
        );
        assert_eq!(credential_sds("builtin://").name, "default");
        assert!(labels_match(
            &[("a".to_string(), "1".to_string())].into(),
            &[
                ("a".to_string(), "1".to_string()),
                ("b".to_string(), "2".to_string())
            ]
            .into()
        ));
    }
}

//! DestinationRule traffic policies and how they become Envoy cluster settings, the way
//! istiod translates them (`pilot/pkg/networking/core/cluster_traffic_policy.go`,
//! `cluster_tls.go`, `networking/util` MergeSubsetTrafficPolicy, and the route hash
//! policies of `route.go`).
//!
//! Everything here is a pure function of the policy and the facts passed in: the caller
//! picks the DestinationRule (and so decides what goes into the cache key).

use std::collections::BTreeMap;
use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::{
    CircuitBreakers, Cluster, OutlierDetection as EnvoyOutlierDetection, UpstreamConnectionOptions,
    circuit_breakers, cluster,
};
use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiConfigSource, ApiVersion, ConfigSource, DataSource, GrpcService,
    Http1ProtocolOptions, Http2ProtocolOptions, HttpProtocolOptions as CommonHttpProtocolOptions,
    TcpKeepalive, TransportSocket, UpstreamHttpProtocolOptions, api_config_source, config_source,
    data_source, grpc_service, transport_socket,
};
use envoy_types::pb::envoy::config::route::v3::route_action::{HashPolicy, hash_policy};
use envoy_types::pb::envoy::extensions::transport_sockets::raw_buffer::v3::RawBuffer;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, SdsSecretConfig, SubjectAltNameMatcher,
    TlsParameters, UpstreamTlsContext, common_tls_context, subject_alt_name_matcher,
    tls_parameters,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options,
};
use envoy_types::pb::envoy::r#type::matcher::v3::{StringMatcher, string_matcher};
use envoy_types::pb::envoy::r#type::v3::Percent;
use envoy_types::pb::google::protobuf::{
    Any, Duration as PbDuration, Struct, UInt32Value, UInt64Value, Value, value,
};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::mesh::v1alpha1::mesh_config::H2UpgradePolicy as MeshH2UpgradePolicy;
use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
use meshfed_api::networking::v1alpha3::connection_pool_settings::http_settings::H2UpgradePolicy;
use meshfed_api::networking::v1alpha3::connection_pool_settings::tcp_settings::TcpKeepalive as IstioTcpKeepalive;
use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::{
    HashAlgorithm, HashKey,
};
use meshfed_api::networking::v1alpha3::load_balancer_settings::{LbPolicy, SimpleLb};
use meshfed_api::networking::v1alpha3::{
    ClientTlsSettings, ConnectionPoolSettings, DestinationRule, LoadBalancerSettings,
    LocalityLoadBalancerSetting, OutlierDetection, Subset, TrafficPolicy,
};
use meshfed_registry::{Locality, Port};
use prost::{Message, Name};

use super::cds::Direction;
use crate::model::proxy::NodeType;

/// The TLS transport socket name.
pub const TLS_SOCKET: &str = "envoy.transport_sockets.tls";
/// The plaintext transport socket name.
pub const RAW_BUFFER_SOCKET: &str = "envoy.transport_sockets.raw_buffer";
/// The `typed_extension_protocol_options` key of upstream HTTP options.
pub const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";
/// SDS resource of the workload certificate (served by the local agent).
pub const SDS_DEFAULT: &str = "default";
/// SDS resource of the mesh root certificate (served by the local agent).
pub const SDS_ROOT: &str = "ROOTCA";
/// The bootstrap cluster of the local SDS server (istio-agent).
pub const SDS_CLUSTER: &str = "sds-grpc";
/// Suffix of the CA bundle resource that goes with a `credentialName`.
pub const SDS_CA_SUFFIX: &str = "-cacert";
/// Endpoint metadata value (`tlsMode`) of workloads that take Istio mTLS.
pub const ISTIO_TLS_MODE: &str = "istio";
/// ALPN of in-mesh connections (metadata exchange on).
pub const ALPN_IN_MESH: [&str; 2] = ["istio-peer-exchange", "istio"];
/// ALPN of in-mesh HTTP/2 connections (metadata exchange on).
pub const ALPN_IN_MESH_H2: [&str; 3] = ["istio-peer-exchange", "istio", "h2"];

// ---------------------------------------------------------------------------------
// Which policy applies

/// The subset of `rule` named `name`.
pub fn subset<'a>(rule: &'a DestinationRule, name: &str) -> Option<&'a Subset> {
    rule.subsets.iter().find(|s| s.name == name)
}

/// The policy for one port: the matching `portLevelSettings` entry replaces the
/// top-level settings entirely (omitted fields take their defaults, they are not
/// inherited), as Istio's GetPortLevelTrafficPolicy. The bool says whether a port-level
/// entry matched. Port-level settings of the result are dropped.
pub fn port_level_policy(policy: &TrafficPolicy, port: u16) -> (TrafficPolicy, bool) {
    let port_level = policy
        .port_level_settings
        .iter()
        .find(|p| p.port.is_some_and(|s| s.number == u32::from(port)));
    match port_level {
        Some(p) => (
            TrafficPolicy {
                load_balancer: p.load_balancer.clone(),
                connection_pool: p.connection_pool,
                outlier_detection: p.outlier_detection,
                tls: p.tls.clone(),
                ..Default::default()
            },
            true,
        ),
        None => (
            TrafficPolicy {
                port_level_settings: Vec::new(),
                ..policy.clone()
            },
            false,
        ),
    }
}

/// Merges a subset's policy over the rule's, for `port` (Istio's
/// MergeSubsetTrafficPolicy): both are first resolved for the port; each of the
/// subset's connection pool, outlier detection, load balancer and TLS replaces the
/// rule's when set, and all four do when the subset has port-level settings for the
/// port.
pub fn merge_subset_policy(
    top: Option<&TrafficPolicy>,
    subset: Option<&TrafficPolicy>,
    port: u16,
) -> Option<TrafficPolicy> {
    let original = top.map(|p| port_level_policy(p, port).0);
    let Some(subset) = subset else {
        return original;
    };
    let (subset, port_level) = port_level_policy(subset, port);
    let Some(mut merged) = original else {
        return Some(subset);
    };
    if subset.connection_pool.is_some() || port_level {
        merged.connection_pool = subset.connection_pool;
    }
    if subset.outlier_detection.is_some() || port_level {
        merged.outlier_detection = subset.outlier_detection;
    }
    if subset.load_balancer.is_some() || port_level {
        merged.load_balancer = subset.load_balancer;
    }
    if subset.tls.is_some() || port_level {
        merged.tls = subset.tls;
    }
    if subset.tunnel.is_some() {
        merged.tunnel = subset.tunnel;
    }
    if subset.proxy_protocol.is_some() {
        merged.proxy_protocol = subset.proxy_protocol;
    }
    Some(merged)
}

/// The policy a rule gives traffic to `port`, for the whole service (`subset` empty)
/// or one subset. `None` when the rule sets no policy or has no such subset.
pub fn destination_policy(
    rule: &DestinationRule,
    port: u16,
    subset_name: &str,
) -> Option<TrafficPolicy> {
    if subset_name.is_empty() {
        return rule
            .traffic_policy
            .as_ref()
            .map(|p| port_level_policy(p, port).0);
    }
    let s = subset(rule, subset_name)?;
    merge_subset_policy(
        rule.traffic_policy.as_ref(),
        s.traffic_policy.as_ref(),
        port,
    )
}

/// Whether an endpoint with `labels` belongs to a subset selecting `selector`.
pub fn labels_match(
    selector: &BTreeMap<String, String>,
    labels: &BTreeMap<String, String>,
) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

/// The locality setting in force: the rule's (unless it says `enabled: false`), else the
/// mesh's (unless disabled). The mesh default is Istio's `{enabled: true}`.
pub fn locality_lb_setting(
    mesh: &MeshConfig,
    lb: Option<&LoadBalancerSettings>,
) -> Option<LocalityLoadBalancerSetting> {
    if let Some(rule) = lb.and_then(|lb| lb.locality_lb_setting.as_ref()) {
        return (rule.enabled != Some(false.into())).then(|| rule.clone());
    }
    match &mesh.locality_lb_setting {
        Some(m) if m.enabled == Some(false.into()) => None,
        Some(m) => Some(m.clone()),
        None => Some(LocalityLoadBalancerSetting {
            enabled: Some(true.into()),
            ..Default::default()
        }),
    }
}

// ---------------------------------------------------------------------------------
// Hash policies (for routes)

/// The route hash policies of a consistent-hash load balancer (Istio puts them on the
/// routes to the destination; the cluster only gets RING_HASH or MAGLEV). Pass the
/// policy that applies to the route's destination, e.g. from [`destination_policy`].
pub fn hash_policy(policy: Option<&TrafficPolicy>) -> Vec<HashPolicy> {
    let Some(LbPolicy::ConsistentHash(hash)) = policy
        .and_then(|p| p.load_balancer.as_ref())
        .and_then(|lb| lb.lb_policy.as_ref())
    else {
        return Vec::new();
    };
    use hash_policy::PolicySpecifier;
    let specifier = match &hash.hash_key {
        Some(HashKey::HttpHeaderName(header)) => PolicySpecifier::Header(hash_policy::Header {
            header_name: header.clone(),
            ..Default::default()
        }),
        Some(HashKey::HttpCookie(cookie)) => PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: cookie.ttl.map(pb_duration),
            path: cookie.path.clone(),
            ..Default::default()
        }),
        Some(HashKey::UseSourceIp(source_ip)) => {
            PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
                source_ip: *source_ip,
            })
        }
        Some(HashKey::HttpQueryParameterName(name)) => {
            PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
        }
        None => return Vec::new(),
    };
    vec![HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    }]
}

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

    fn http(&mut self) -> &mut HttpProtocolOptions {
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
    /// Client labels, for the same.
    pub proxy_labels: &'a BTreeMap<String, String>,
}

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

fn is_original_dst(c: &Cluster) -> bool {
    c.cluster_discovery_type
        == Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::OriginalDst as i32,
        ))
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
    let locality = locality_lb_setting(ctx.mesh, lb);
    apply_locality_config(&mut c.cluster, locality.as_ref(), ctx);
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
/// get the per-client weights and priorities right away.
fn apply_locality_config(
    c: &mut Cluster,
    setting: Option<&LocalityLoadBalancerSetting>,
    ctx: &PolicyContext<'_>,
) {
    let failover = c.outlier_detection.is_some();
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
        super::eds::apply_locality_lb(
            cla,
            None,
            &super::eds::LocalityLb {
                setting: s,
                proxy_locality: ctx.proxy_locality,
                proxy_labels: ctx.proxy_labels,
                failover,
            },
        );
    }
}

// ---------------------------------------------------------------------------------
// TLS

/// The TLS settings a cluster gets and whether they were auto-detected (Istio's
/// buildUpstreamTLSSettings): DISABLE and SIMPLE as given; MUTUAL as given;
/// ISTIO_MUTUAL with the computed SNI and the service accounts unless the rule names
/// them; no TLS setting means auto mTLS for mesh-internal destinations when the mesh
/// enables it (passthrough destinations only when all their endpoints take mTLS).
pub fn upstream_tls_settings(
    tls: Option<&ClientTlsSettings>,
    policy: Option<&TrafficPolicy>,
    ctx: &PolicyContext<'_>,
) -> (Option<ClientTlsSettings>, bool) {
    if let Some(tls) = tls {
        if tls.mode != TlSmode::IstioMutual as i32 {
            return (Some(tls.clone()), false);
        }
        let sni = if tls.sni.is_empty() {
            ctx.istio_sni.to_string()
        } else {
            tls.sni.clone()
        };
        let sans = if tls.subject_alt_names.is_empty() {
            ctx.service_accounts.to_vec()
        } else {
            tls.subject_alt_names.clone()
        };
        return (Some(istio_mutual(sans, sni)), false);
    }
    let auto = ctx.mesh.enable_auto_mtls.is_none_or(|b| b.value);
    let passthrough = ctx.passthrough_resolution
        || matches!(
            policy
                .and_then(|p| p.load_balancer.as_ref())
                .and_then(|lb| lb.lb_policy.as_ref()),
            Some(LbPolicy::Simple(s)) if *s == SimpleLb::Passthrough as i32
        );
    if ctx.mesh_external
        || !auto
        || ctx.peer_mtls_disabled
        || (passthrough && !ctx.all_endpoints_istio_mtls)
    {
        return (None, false);
    }
    (
        Some(istio_mutual(
            ctx.service_accounts.to_vec(),
            ctx.istio_sni.to_string(),
        )),
        true,
    )
}

fn istio_mutual(subject_alt_names: Vec<String>, sni: String) -> ClientTlsSettings {
    ClientTlsSettings {
        mode: TlSmode::IstioMutual as i32,
        subject_alt_names,
        sni,
        ..Default::default()
    }
}

/// Puts the TLS context on the cluster: a plain transport socket, or for auto-detected
/// mTLS (except ORIGINAL_DST clusters) the socket matches `tlsMode-istio` (endpoints
/// labelled `tlsMode: istio`) and `tlsMode-disabled` (plaintext for the rest).
fn apply_upstream_tls(
    c: &mut ClusterBuild,
    tls: Option<&ClientTlsSettings>,
    auto: bool,
    ctx: &PolicyContext<'_>,
) {
    let Some(context) = tls.and_then(|tls| upstream_tls_context(c, tls, ctx)) else {
        return;
    };
    let socket = TransportSocket {
        name: TLS_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(&context))),
    };
    if auto && !is_original_dst(&c.cluster) {
        c.cluster.transport_socket_matches = vec![
            cluster::TransportSocketMatch {
                name: format!("tlsMode-{ISTIO_TLS_MODE}"),
                r#match: Some(string_struct(&[("tlsMode", ISTIO_TLS_MODE)])),
                transport_socket: Some(socket),
            },
            cluster::TransportSocketMatch {
                name: "tlsMode-disabled".to_string(),
                r#match: Some(Struct::default()),
                transport_socket: Some(raw_buffer_socket()),
            },
        ];
    } else {
        c.cluster.transport_socket = Some(socket);
    }
}

/// The plaintext transport socket.
pub fn raw_buffer_socket() -> TransportSocket {
    TransportSocket {
        name: RAW_BUFFER_SOCKET.to_string(),
        config_type: Some(transport_socket::ConfigType::TypedConfig(pack(
            &RawBuffer::default(),
        ))),
    }
}

/// Istio's buildUpstreamClusterTLSContext. `None` for DISABLE, for SIMPLE/MUTUAL with a
/// `credentialName` on a sidecar when the rule selects no workloads (the secret is
/// only for gateways), and for MUTUAL without a client certificate and key.
pub fn upstream_tls_context(
    c: &mut ClusterBuild,
    tls: &ClientTlsSettings,
    ctx: &PolicyContext<'_>,
) -> Option<UpstreamTlsContext> {
    let mode = TlSmode::try_from(tls.mode).unwrap_or(TlSmode::Disable);
    let privileged = !tls.credential_name.is_empty()
        && !tls.credential_name.starts_with("configmap://")
        && tls.credential_name != "invalid://";
    if privileged
        && ctx.node_type == NodeType::Sidecar
        && !ctx.rule_has_selector
        && matches!(mode, TlSmode::Simple | TlSmode::Mutual)
    {
        return None;
    }
    let mut context = match mode {
        TlSmode::Disable => return None,
        TlSmode::IstioMutual => {
            let mut common = default_common_tls_context();
            common.tls_certificate_sds_secret_configs = vec![agent_sds(SDS_DEFAULT, true)];
            common.validation_context_type = Some(combined_validation(
                san_matchers(&tls.subject_alt_names),
                None,
                agent_sds(SDS_ROOT, true),
            ));
            common.alpn_protocols = if c.is_http2() {
                ALPN_IN_MESH_H2.iter().map(|s| s.to_string()).collect()
            } else {
                ALPN_IN_MESH.iter().map(|s| s.to_string()).collect()
            };
            UpstreamTlsContext {
                common_tls_context: Some(common),
                sni: if tls.sni.is_empty() {
                    c.cluster.name.clone()
                } else {
                    tls.sni.clone()
                },
                ..Default::default()
            }
        }
        TlSmode::Simple | TlSmode::Mutual => {
            simple_or_mutual_context(c, tls, mode == TlSmode::Mutual, ctx)?
        }
    };
    if let Some(defaults) = &ctx.mesh.tls_defaults
        && let Some(params) = context
            .common_tls_context
            .as_mut()
            .and_then(|c| c.tls_params.as_mut())
    {
        if !defaults.ecdh_curves.is_empty() {
            params.ecdh_curves = defaults.ecdh_curves.clone();
        }
        if !defaults.cipher_suites.is_empty() {
            params.cipher_suites = defaults.cipher_suites.clone();
        }
    }
    Some(context)
}

fn simple_or_mutual_context(
    c: &mut ClusterBuild,
    tls: &ClientTlsSettings,
    mutual: bool,
    ctx: &PolicyContext<'_>,
) -> Option<UpstreamTlsContext> {
    let insecure = tls.insecure_skip_verify.is_some_and(|b| b.value);
    // auto_sni / auto_san_validation when the rule leaves SNI / SANs to the request.
    let auto_sni = tls.sni.is_empty();
    let auto_san = auto_sni && tls.subject_alt_names.is_empty() && !insecure;
    if auto_sni || auto_san {
        let upstream = c
            .http()
            .upstream_http_protocol_options
            .get_or_insert_with(UpstreamHttpProtocolOptions::default);
        upstream.auto_sni |= auto_sni;
        upstream.auto_san_validation |= auto_san;
    }
    let sans = if ctx.service_entry && tls.subject_alt_names.is_empty() {
        ctx.service_accounts.to_vec()
    } else {
        tls.subject_alt_names.clone()
    };
    let mut common = default_common_tls_context();
    if !tls.credential_name.is_empty() {
        if mutual {
            common.tls_certificate_sds_secret_configs = vec![credential_sds(&tls.credential_name)];
        }
        if !insecure {
            common.validation_context_type = Some(combined_validation(
                san_matchers(&sans),
                None,
                credential_sds(&format!("{}{SDS_CA_SUFFIX}", tls.credential_name)),
            ));
        }
    } else {
        // Files mounted in the proxy are served by the local agent over SDS.
        let ca = if tls.ca_certificates.is_empty() {
            "system"
        } else {
            tls.ca_certificates.as_str()
        };
        if mutual {
            if tls.client_certificate.is_empty() || tls.private_key.is_empty() {
                return None;
            }
            common.tls_certificate_sds_secret_configs = vec![agent_sds(
                &file_cert_name(&tls.client_certificate, &tls.private_key),
                false,
            )];
        }
        common.validation_context_type = Some(if insecure {
            common_tls_context::ValidationContextType::ValidationContext(
                CertificateValidationContext::default(),
            )
        } else {
            let crl = (!tls.ca_crl.is_empty()).then(|| DataSource {
                specifier: Some(data_source::Specifier::Filename(tls.ca_crl.clone())),
                ..Default::default()
            });
            combined_validation(
                san_matchers(&sans),
                crl,
                agent_sds(&file_root_name(ca), false),
            )
        });
    }
    if c.is_http2() {
        common.alpn_protocols = vec!["h2".to_string()];
    }
    Some(UpstreamTlsContext {
        common_tls_context: Some(common),
        sni: tls.sni.clone(),
        ..Default::default()
    })
}

fn default_common_tls_context() -> CommonTlsContext {
    CommonTlsContext {
        tls_params: Some(TlsParameters {
            tls_minimum_protocol_version: tls_parameters::TlsProtocol::TlSv12 as i32,
            tls_maximum_protocol_version: tls_parameters::TlsProtocol::TlSv13 as i32,
            ..Default::default()
        }),
        ..Default::default()
    }
}

pub fn combined_validation(
    sans: Vec<SubjectAltNameMatcher>,
    crl: Option<DataSource>,
    sds: SdsSecretConfig,
) -> common_tls_context::ValidationContextType {
    common_tls_context::ValidationContextType::CombinedValidationContext(
        common_tls_context::CombinedCertificateValidationContext {
            default_validation_context: Some(CertificateValidationContext {
                match_typed_subject_alt_names: sans,
                crl,
                ..Default::default()
            }),
            validation_context_sds_secret_config: Some(sds),
            ..Default::default()
        },
    )
}

/// Exact SAN matchers, typed by the form of the name: `scheme://...` (SPIFFE ids) as
/// URI, IP addresses as IP, anything else as DNS.
pub fn san_matchers(names: &[String]) -> Vec<SubjectAltNameMatcher> {
    use subject_alt_name_matcher::SanType;
    names
        .iter()
        .map(|name| {
            let san_type = if name.contains("://") {
                SanType::Uri
            } else if name.parse::<IpAddr>().is_ok() {
                SanType::IpAddress
            } else {
                SanType::Dns
            };
            SubjectAltNameMatcher {
                san_type: san_type as i32,
                matcher: Some(StringMatcher {
                    match_pattern: Some(string_matcher::MatchPattern::Exact(name.clone())),
                    ..Default::default()
                }),
                ..Default::default()
            }
        })
        .collect()
}

/// A secret from the local agent's SDS server (cluster `sds-grpc` in the proxy's
/// bootstrap). The workload certificate and root never time out (they always exist).
pub fn agent_sds(name: &str, no_fetch_timeout: bool) -> SdsSecretConfig {
    SdsSecretConfig {
        name: name.to_string(),
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::ApiConfigSource(
                ApiConfigSource {
                    api_type: api_config_source::ApiType::Grpc as i32,
                    set_node_on_first_message_only: true,
                    transport_api_version: ApiVersion::V3 as i32,
                    grpc_services: vec![GrpcService {
                        target_specifier: Some(grpc_service::TargetSpecifier::EnvoyGrpc(
                            grpc_service::EnvoyGrpc {
                                cluster_name: SDS_CLUSTER.to_string(),
                                ..Default::default()
                            },
                        )),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            )),
            resource_api_version: ApiVersion::V3 as i32,
            initial_fetch_timeout: no_fetch_timeout.then(PbDuration::default),
            ..Default::default()
        }),
    }
}

/// The agent's SDS name of mounted certificate and key files.
pub fn file_cert_name(cert: &str, key: &str) -> String {
    format!("file-cert:{cert}~{key}")
}

/// The agent's SDS name of a mounted CA bundle.
pub fn file_root_name(ca: &str) -> String {
    format!("file-root:{ca}")
}

/// A server's certificate (gateway, Sidecar ingress): its files, or without both the
/// workload's own (`default`).
pub fn server_cert_name(cert: &str, key: &str) -> String {
    if cert.is_empty() || key.is_empty() {
        SDS_DEFAULT.to_string()
    } else {
        file_cert_name(cert, key)
    }
}

/// The CA a server validates clients with: its file, or the mesh root (`ROOTCA`).
pub fn server_root_name(ca: &str) -> String {
    if ca.is_empty() {
        SDS_ROOT.to_string()
    } else {
        file_root_name(ca)
    }
}

/// A `credentialName` secret, fetched over ADS (`kubernetes://<name>` unless the name
/// already carries a type; `builtin://` means the workload's own certificate).
pub fn credential_sds(credential: &str) -> SdsSecretConfig {
    if credential == "builtin://" {
        return agent_sds(SDS_DEFAULT, true);
    }
    if credential == format!("builtin://{SDS_CA_SUFFIX}") {
        return agent_sds(SDS_ROOT, true);
    }
    let name = if ["configmap://", "kubernetes://", "kubernetes-gateway://"]
        .iter()
        .any(|p| credential.starts_with(p))
    {
        credential.to_string()
    } else {
        format!("kubernetes://{credential}")
    };
    SdsSecretConfig {
        name,
        sds_config: Some(ConfigSource {
            config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
                AggregatedConfigSource {},
            )),
            resource_api_version: ApiVersion::V3 as i32,
            ..Default::default()
        }),
    }
}

// ---------------------------------------------------------------------------------
// Helpers

/// An Istio duration as a protobuf one.
pub fn pb_duration(d: meshfed_api::Duration) -> PbDuration {
    PbDuration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}

/// A `Struct` of string fields.
pub fn string_struct(fields: &[(&str, &str)]) -> Struct {
    Struct {
        fields: fields
            .iter()
            .map(|(k, v)| {
                (
                    k.to_string(),
                    Value {
                        kind: Some(value::Kind::StringValue(v.to_string())),
                    },
                )
            })
            .collect(),
    }
}

/// Packs a message into an `Any`.
pub fn pack<M: Message + Name>(m: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: m.encode_to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use meshfed_api::networking::v1alpha3::PortSelector;
    use meshfed_api::networking::v1alpha3::connection_pool_settings::TcpSettings;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::ConsistentHashLb;
    use meshfed_api::networking::v1alpha3::load_balancer_settings::consistent_hash_lb::HttpCookie;
    use meshfed_api::networking::v1alpha3::traffic_policy::PortTrafficPolicy;

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

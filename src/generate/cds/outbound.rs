//! Outbound clusters: one per service port and DestinationRule subset, with the rule's
//! traffic policy, auto mTLS and Istio's endpoint metadata.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
use envoy_types::pb::envoy::config::core::v3::{Metadata, TypedExtensionConfig};
use envoy_types::pb::google::protobuf::{
    Duration as PbDuration, ListValue, UInt32Value, Value, value,
};
use meshfed_api::mesh::v1alpha1::MeshConfig;
use meshfed_api::networking::v1alpha3::{
    DestinationRule, LocalityLoadBalancerSetting, TrafficPolicy,
};
use meshfed_registry::{
    EndpointShards, Locality, MeshLocation, Port, Protocol, ProviderId, Resolution, Service,
    TlsMode,
};

use super::super::cluster_build::{self, ClusterBuild, PolicyContext};
use super::super::eds::{self, EdsOptions, EndpointSelection};
use super::super::locality_lb::{self, augment_labels};
use super::super::{destination_rule, proto, traffic_policy};
use super::base::*;
use crate::model::proxy::{NodeType, Proxy};
use crate::push::config_index::Config;
use crate::xds::names::{Direction, outbound_name, sni_name};

/// The policy-free outbound cluster of one service port: EDS (or DNS with inline
/// endpoints, or ORIGINAL_DST), round robin, no TLS. Proxyless gRPC clients share it;
/// Envoy proxies get [`outbound_cluster_for`].
pub fn outbound_cluster(
    service: &Service,
    port: &Port,
    shards: Option<&EndpointShards>,
    options: ClusterOptions,
) -> Cluster {
    let name = outbound_name(port.port.get(), "", service.hostname.as_str());
    let mut c = base_cluster(name.clone(), options);
    match service.resolution {
        // An alias has no endpoints of its own; a proxyless client that names it gets
        // an empty EDS cluster.
        Resolution::ClientSideLb | Resolution::Alias => {
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
            cluster_build::HTTP_PROTOCOL_OPTIONS.to_string(),
            http2_options(),
        );
    }
    c
}

/// Everything an Envoy outbound cluster depends on. The proxy matters through its node
/// type (gateways get EDS for passthrough services, sidecars sniff unnamed ports and
/// cannot use `credentialName`), its IP families (DNS lookup family) and, for DNS
/// clusters only, its locality and labels (locality load balancing of inline
/// endpoints).
#[derive(Clone, Copy, Debug)]
pub struct OutboundRequest<'a> {
    pub service: &'a Service,
    pub port: &'a Port,
    /// The service's endpoints: inline for DNS clusters; their identities back mTLS.
    pub shards: Option<&'a EndpointShards>,
    /// The DestinationRule that applies for the client.
    pub rule: Option<&'a Config<DestinationRule>>,
    /// The subset; empty for the service-wide cluster.
    pub subset: &'a str,
    pub mesh: &'a MeshConfig,
    /// What the cluster may know of the client.
    pub client: &'a ClusterClient,
    /// A gateway's SNI-DNAT cluster: named by the SNI form, no upstream TLS (the
    /// client's mTLS passes through), Istio mTLS endpoints only.
    pub sni_dnat: bool,
    /// The mode clients infer for the service's namespace is DISABLE (no auto mTLS).
    pub peer_mtls_disabled: bool,
}

/// What an outbound cluster may know of the client proxy: its node type and, for DNS
/// clusters only (their endpoints are inline), its DNS lookup family, locality and the
/// labels failoverPriority names. Only the labels a rule's failoverPriority names are
/// kept, so clients that differ in other labels share the cluster.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ClusterClient {
    pub node_type: NodeType,
    pub dns: Option<DnsClient>,
}

/// The client facts an inline (DNS) load assignment reads.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct DnsClient {
    /// `cluster::DnsLookupFamily` from the proxy's IP families.
    pub family: i32,
    pub locality: Locality,
    /// The proxy's labels (with Istio's topology labels) that the failoverPriority of
    /// the service's rule or the mesh names; empty without one.
    pub labels: BTreeMap<String, String>,
}

/// What a proxy's outbound clusters may read of it: the facts behind each
/// [`ClusterClient`], the namespace that picks each service's DestinationRule, and the
/// labels that pick its Sidecar. Proxies with equal facts get equal outbound clusters
/// (see [`super::OutboundClustersInput`]).
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct ClientFacts {
    pub namespace: String,
    pub node_type: NodeType,
    /// `cluster::DnsLookupFamily` from the proxy's IP families.
    pub family: i32,
    pub locality: Locality,
    pub labels: BTreeMap<String, String>,
    pub cluster_id: String,
    pub network: String,
}

impl ClientFacts {
    /// The facts of `proxy`.
    pub fn of(proxy: &Proxy) -> ClientFacts {
        ClientFacts {
            namespace: proxy.namespace.clone(),
            node_type: proxy.node_type,
            family: dns_lookup_family(&proxy.ip_addresses) as i32,
            locality: proxy.locality.clone(),
            labels: proxy.labels.clone(),
            cluster_id: proxy
                .cluster_id
                .as_ref()
                .map_or_else(String::new, |c| c.as_str().to_string()),
            network: proxy.network.as_str().to_string(),
        }
    }
}

impl ClusterClient {
    /// The facts of `proxy` that `service`'s clusters read, without a rule.
    pub fn for_proxy(proxy: &Proxy, service: &Service) -> ClusterClient {
        ClusterClient::for_client_under(
            &ClientFacts::of(proxy),
            service,
            None,
            &MeshConfig::default(),
        )
    }

    /// The facts of `client` that `service`'s clusters read under `rule` (the label
    /// keys its failoverPriority settings, or the mesh's, name).
    pub fn for_client_under(
        client: &ClientFacts,
        service: &Service,
        rule: Option<&DestinationRule>,
        mesh: &MeshConfig,
    ) -> ClusterClient {
        let dns = matches!(
            service.resolution,
            Resolution::DnsLb | Resolution::DnsRoundRobinLb
        )
        .then(|| {
            let mut keys = failover_priority_keys(rule, mesh);
            // The topology labels a traffic distribution orders by (the client's
            // node is not among its facts).
            keys.extend(
                locality_lb::traffic_distribution_labels(service.traffic_distribution)
                    .iter()
                    .filter(|l| **l != locality_lb::LABEL_HOSTNAME),
            );
            let labels = if keys.is_empty() {
                BTreeMap::new()
            } else {
                augment_labels(
                    &client.labels,
                    &client.cluster_id,
                    &client.locality,
                    &client.network,
                )
                .into_iter()
                .filter(|(k, _)| keys.contains(k.as_str()))
                .collect()
            };
            DnsClient {
                family: client.family,
                locality: client.locality.clone(),
                labels,
            }
        });
        ClusterClient {
            node_type: client.node_type,
            dns,
        }
    }
}

/// The label keys any failoverPriority of `rule` (service-wide, per port, per subset)
/// or of the mesh-wide locality setting names.
fn failover_priority_keys<'a>(
    rule: Option<&'a DestinationRule>,
    mesh: &'a MeshConfig,
) -> BTreeSet<&'a str> {
    let policies = rule.into_iter().flat_map(|r| {
        r.traffic_policy
            .iter()
            .chain(r.subsets.iter().filter_map(|s| s.traffic_policy.as_ref()))
    });
    let mut settings: Vec<&LocalityLoadBalancerSetting> = Vec::new();
    for p in policies {
        settings.extend(
            p.load_balancer
                .as_ref()
                .and_then(|lb| lb.locality_lb_setting.as_ref()),
        );
        for pl in &p.port_level_settings {
            settings.extend(
                pl.load_balancer
                    .as_ref()
                    .and_then(|lb| lb.locality_lb_setting.as_ref()),
            );
        }
    }
    settings.extend(mesh.locality_lb_setting.as_ref());
    settings
        .into_iter()
        .flat_map(|s| &s.failover_priority)
        .map(|entry| entry.split_once('=').map_or(entry.as_str(), |(k, _)| k))
        .collect()
}

/// The Envoy cluster `outbound|<port>|<subset>|<host>`, as istiod builds it: the
/// cluster type from the resolution (or ORIGINAL_DST for a PASSTHROUGH policy), HTTP/2
/// for HTTP/2 ports, then the rule's policy for the port (merged with the subset's),
/// with Istio's defaults (LEAST_REQUEST, circuit breakers at their maximum, auto mTLS)
/// where it says nothing. `None` for a subset the rule does not define and for an
/// alias (ExternalName) service.
pub fn outbound_cluster_for(req: &OutboundRequest<'_>) -> Option<Cluster> {
    let (service, port) = (req.service, req.port);
    let host = service.hostname.as_str();
    let number = port.port.get();
    let rule = req.rule.map(|r| &r.spec);
    let subset = match (rule, req.subset) {
        (_, "") => None,
        (Some(rule), name) => Some(destination_rule::subset(rule, name)?),
        (None, _) => return None,
    };
    let traffic_policy: Option<TrafficPolicy> =
        rule.and_then(|r| destination_rule::destination_policy(r, number, req.subset));
    let sni = sni_name(number, req.subset, host);
    let name = if req.sni_dnat {
        sni.clone()
    } else {
        outbound_name(number, req.subset, host)
    };

    let kind = match service.resolution {
        // An alias (ExternalName) gets no cluster: its name routes to its target.
        Resolution::Alias => return None,
        Resolution::ClientSideLb => cluster::DiscoveryType::Eds,
        Resolution::DnsLb => cluster::DiscoveryType::StrictDns,
        Resolution::DnsRoundRobinLb => cluster::DiscoveryType::LogicalDns,
        // Gateways have no original destination to forward to.
        Resolution::Passthrough if req.client.node_type == NodeType::Router => {
            cluster::DiscoveryType::Eds
        }
        Resolution::Passthrough => cluster::DiscoveryType::OriginalDst,
    };
    let alt_stat_name = if req.mesh.outbound_cluster_stat_name.is_empty() {
        format!("{name};")
    } else {
        cluster_stat_name(
            &req.mesh.outbound_cluster_stat_name,
            service,
            req.subset,
            port,
            None,
        )
    };
    let mut c = Cluster {
        name: name.clone(),
        alt_stat_name,
        cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(kind as i32)),
        common_lb_config: Some(Default::default()),
        ..Default::default()
    };
    let mut endpoint_labels = None;
    if matches!(
        kind,
        cluster::DiscoveryType::StrictDns | cluster::DiscoveryType::LogicalDns
    ) {
        c.dns_lookup_family = req
            .client
            .dns
            .as_ref()
            .map_or(cluster::DnsLookupFamily::V4Only as i32, |d| d.family);
        c.typed_dns_resolver_config = Some(cares_resolver());
        // Deprecated in favour of typed DNS cluster configs, still what istiod sends.
        #[allow(deprecated)]
        {
            c.dns_jitter = Some(PbDuration {
                seconds: 0,
                nanos: DNS_JITTER_NANOS,
            });
            c.dns_refresh_rate = req.mesh.dns_refresh_rate.map(proto::pb_duration);
            c.respect_dns_ttl = true;
        }
        let (cla, labels) = eds::labelled_assignment(
            &name,
            port,
            req.shards,
            &EndpointSelection {
                subset: subset.map(|s| &s.labels),
                ..Default::default()
            },
        );
        c.load_assignment = Some(cla);
        endpoint_labels = Some(labels);
    }
    let mut build = ClusterBuild::new(c);
    set_upstream_protocol(&mut build, port, req.client.node_type);

    let service_accounts = service_accounts(service, req.shards, req.mesh);
    let no_locality = Locality::default();
    let no_labels = BTreeMap::new();
    let proxy_locality = req
        .client
        .dns
        .as_ref()
        .map_or(&no_locality, |d| &d.locality);
    let proxy_labels = req.client.dns.as_ref().map_or(&no_labels, |d| &d.labels);
    let ctx = PolicyContext {
        direction: Direction::Outbound,
        port,
        mesh: req.mesh,
        node_type: req.client.node_type,
        service_accounts: &service_accounts,
        istio_sni: &sni,
        mesh_external: service.location == MeshLocation::MeshExternal,
        service_entry: service.provider == ProviderId::External,
        passthrough_resolution: service.resolution == Resolution::Passthrough,
        all_endpoints_istio_mtls: all_endpoints_istio_mtls(req.shards, port),
        peer_mtls_disabled: req.peer_mtls_disabled,
        rule_has_selector: rule.is_some_and(|r| r.workload_selector.is_some()),
        proxy_locality,
        proxy_labels,
        endpoint_labels: endpoint_labels.as_deref(),
        traffic_distribution: service.traffic_distribution,
    };
    traffic_policy::apply_traffic_policy(&mut build, traffic_policy.as_ref(), &ctx);
    let mut c = build.build();
    if req.sni_dnat {
        c.transport_socket = None;
        c.transport_socket_matches.clear();
    }
    if c.cluster_discovery_type
        == Some(cluster::ClusterDiscoveryType::Type(
            cluster::DiscoveryType::Eds as i32,
        ))
    {
        c.eds_cluster_config = Some(cluster::EdsClusterConfig {
            eds_config: Some(eds_source()),
            service_name: name,
        });
    }
    let tls_mode = traffic_policy
        .as_ref()
        .and_then(|p| p.tls.as_ref())
        .map_or(0, |t| t.mode);
    c.metadata = istio_metadata(&IstioMetadata {
        services: &[service],
        rule: req.rule,
        subset: req.subset,
        external: ctx.mesh_external,
        tls_mode,
    });
    Some(c)
}

/// Istio's `PILOT_DNS_JITTER_DURATION` default (100 ms) on DNS clusters.
const DNS_JITTER_NANOS: i32 = 100_000_000;
/// Istio's `PILOT_DNS_CARES_UDP_MAX_QUERIES` default.
const CARES_UDP_MAX_QUERIES: u32 = 100;

/// The c-ares resolver istiod configures on DNS clusters.
fn cares_resolver() -> TypedExtensionConfig {
    use envoy_types::pb::envoy::extensions::network::dns_resolver::cares::v3::CaresDnsResolverConfig;
    TypedExtensionConfig {
        name: "envoy.network.dns_resolver.cares".into(),
        typed_config: Some(proto::pack(&CaresDnsResolverConfig {
            udp_max_queries: Some(UInt32Value {
                value: CARES_UDP_MAX_QUERIES,
            }),
            ..Default::default()
        })),
    }
}

/// Istio's setUpstreamProtocol: HTTP/2 ports get HTTP/2; a sidecar's unnamed
/// (sniffed) ports use whatever protocol the downstream spoke.
pub(super) fn set_upstream_protocol(c: &mut ClusterBuild, port: &Port, node_type: NodeType) {
    if port.protocol.is_http2() {
        c.set_h2();
    } else if node_type == NodeType::Sidecar && port.protocol == Protocol::Unsupported {
        c.set_use_downstream_protocol();
    }
}

/// V4_ONLY for IPv4 proxies (and dual-stack ones, as Istio without dual stack
/// enabled), V6_ONLY for IPv6-only proxies.
pub(super) fn dns_lookup_family(ips: &[IpAddr]) -> cluster::DnsLookupFamily {
    if !ips.is_empty() && ips.iter().all(IpAddr::is_ipv6) {
        cluster::DnsLookupFamily::V6Only
    } else {
        cluster::DnsLookupFamily::V4Only
    }
}

/// The identities a service's workloads present: the service's own and its endpoints',
/// with every SPIFFE id of the mesh trust domain repeated under each trust domain alias.
pub fn service_accounts(
    service: &Service,
    shards: Option<&EndpointShards>,
    mesh: &MeshConfig,
) -> Vec<String> {
    let mut out: BTreeSet<String> = service.service_accounts.clone();
    if let Some(shards) = shards {
        out.extend(shards.service_accounts.iter().cloned());
    }
    if !mesh.trust_domain_aliases.is_empty() {
        let expanded: Vec<String> = out
            .iter()
            .filter_map(|sa| sa.strip_prefix("spiffe://"))
            .filter_map(|rest| rest.split_once('/'))
            .flat_map(|(domain, path)| {
                mesh.trust_domain_aliases
                    .iter()
                    .chain(std::iter::once(&mesh.trust_domain))
                    .filter(move |alias| alias.as_str() != domain)
                    .map(move |alias| format!("spiffe://{alias}/{path}"))
            })
            .collect();
        out.extend(expanded);
    }
    out.into_iter().collect()
}

/// Whether the port has endpoints and every one takes Istio mTLS.
pub(super) fn all_endpoints_istio_mtls(shards: Option<&EndpointShards>, port: &Port) -> bool {
    let mut serving = shards
        .into_iter()
        .flat_map(|s| s.iter())
        .filter(|(_, ep)| ep.ports.contains_key(&port.name))
        .peekable();
    serving.peek().is_some() && serving.all(|(_, ep)| ep.tls_mode == TlsMode::Istio)
}

/// What a cluster's `filter_metadata.istio` says.
pub(super) struct IstioMetadata<'a> {
    /// The services the cluster serves (`services`, read by the telemetry filters):
    /// an outbound cluster's own, an inbound cluster's on its port.
    pub services: &'a [&'a Service],
    /// The DestinationRule in force (`config`).
    pub rule: Option<&'a Config<DestinationRule>>,
    /// The subset (`subset`, with a rule only).
    pub subset: &'a str,
    /// The destination is outside the mesh (`external`).
    pub external: bool,
    /// The rule's TLS mode for the cluster: SIMPLE and MUTUAL set
    /// `alpn_override: "false"` (the upstream is not an Istio peer, so Istio's ALPN
    /// must not replace the client's).
    pub tls_mode: i32,
}

/// The service entry of `istio.services`: host, short name and namespace, as Istio's
/// telemetry reads them. The short name is a Kubernetes-style service's first label;
/// a ServiceEntry host is its own name.
/// A service's name as telemetry labels it: a ServiceEntry's host, else the
/// hostname's first label (the Kubernetes Service name).
pub fn service_name(service: &Service) -> &str {
    let host = service.hostname.as_str();
    if service.provider == ProviderId::External {
        host
    } else {
        host.split('.').next().unwrap_or(host)
    }
}

pub fn service_metadata(service: &Service) -> Value {
    let host = service.hostname.as_str();
    let name = service_name(service);
    let string = |s: &str| Value {
        kind: Some(value::Kind::StringValue(s.to_string())),
    };
    Value {
        kind: Some(value::Kind::StructValue(
            crate::generate::proto::stable_struct([
                ("host".to_string(), string(host)),
                ("name".to_string(), string(name)),
                ("namespace".to_string(), string(service.namespace.as_str())),
            ]),
        )),
    }
}

/// `filter_metadata.istio` as istiod sets it: `services` (telemetry), the
/// DestinationRule (`config`), the subset, `alpn_override` and whether the destination
/// is outside the mesh, as istioctl and the telemetry filters read them.
pub(super) fn istio_metadata(m: &IstioMetadata<'_>) -> Option<Metadata> {
    use meshfed_api::networking::v1alpha3::client_tls_settings::TlSmode;
    let mut fields = BTreeMap::new();
    let string = |s: String| Value {
        kind: Some(value::Kind::StringValue(s)),
    };
    if !m.services.is_empty() {
        fields.insert(
            "services".to_string(),
            Value {
                kind: Some(value::Kind::ListValue(ListValue {
                    values: m.services.iter().map(|s| service_metadata(s)).collect(),
                })),
            },
        );
    }
    if let Some(r) = m.rule {
        fields.insert(
            "config".to_string(),
            string(format!(
                "/apis/networking.istio.io/v1alpha3/namespaces/{}/destination-rule/{}",
                r.namespace, r.name
            )),
        );
        if !m.subset.is_empty() {
            fields.insert("subset".to_string(), string(m.subset.to_string()));
        }
        if m.tls_mode == TlSmode::Simple as i32 || m.tls_mode == TlSmode::Mutual as i32 {
            fields.insert("alpn_override".to_string(), string("false".to_string()));
        }
    }
    if m.external {
        fields.insert(
            "external".to_string(),
            Value {
                kind: Some(value::Kind::BoolValue(true)),
            },
        );
    }
    (!fields.is_empty()).then(|| Metadata {
        filter_metadata: crate::generate::proto::stable_map([(
            "istio".to_string(),
            crate::generate::proto::stable_struct(fields),
        )]),
        ..Default::default()
    })
}

//! LDS for Envoy sidecars and gateways, with Istio's listener names.
//!
//! Sidecar:
//! - `virtualOutbound` (15001) and one outbound listener per (bind, port): see
//!   [`outbound`] for Istio's classes, binds, chains and merge rules.
//! - `virtualInbound` (15006): a chain refusing traffic addressed to 15006 itself
//!   (`virtualInbound-blackhole`), the passthrough chains to
//!   `InboundPassthroughCluster`, and the chains of each port of the proxy's own services
//!   per PeerAuthentication mode (HTTP -> `inbound|<port>||` through an inline route,
//!   TCP -> TCP proxy; mTLS or plaintext): see [`inbound`].
//!
//! Gateway (router): one bound listener per Gateway server port, `0.0.0.0_<port>`, HTTP
//! servers through RDS `http.<port>`, HTTPS servers terminated with the certificate
//! named by `credentialName` (SDS) and routed through the same route table.

use envoy_types::pb::envoy::config::core::v3::{
    AggregatedConfigSource, ApiVersion, ConfigSource, SocketAddress, address, config_source,
    socket_address,
};
#[cfg(any(test, feature = "testing"))]
use envoy_types::pb::envoy::config::listener::v3::filter;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, Listener, ListenerFilter, listener_filter,
};
use envoy_types::pb::envoy::config::route::v3::{RetryPolicy, route_action::MaxStreamDuration};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route, route_action,
    route_match,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
#[cfg(any(test, feature = "testing"))]
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, http_connection_manager,
};
#[cfg(any(test, feature = "testing"))]
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};
use envoy_types::pb::google::protobuf::BoolValue;
use envoy_types::pb::google::protobuf::{Duration as PbDuration, UInt32Value};
#[cfg(any(test, feature = "testing"))]
use prost::{Message, Name};

mod gateway;
pub mod hcm;
pub mod inbound;
pub mod ingress_tls;
pub(crate) mod outbound;

pub use gateway::ALL_ISTIO_MTLS_ALPNS;

use crate::generate::merged_gateway::{GatewayTarget, MergedGateway};
use crate::generate::proto::pack;
use crate::model::ClientView;
use crate::push::cache::Findings;
use crate::push::snapshot::Snapshot;

/// The outbound capture listener.
pub const VIRTUAL_OUTBOUND: &str = "virtualOutbound";
/// The inbound capture listener.
pub const VIRTUAL_INBOUND: &str = "virtualInbound";
/// Inbound traffic to ports no service claims.
pub const INBOUND_PASSTHROUGH: &str = "InboundPassthroughCluster";

/// A port the proxy serves for one of its services (from the registries), or a
/// Sidecar `ingress` port, which replaces them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct InboundPort {
    /// Port the workload listens on.
    pub target_port: u16,
    /// Whether traffic is HTTP.
    pub http: bool,
    /// The address of a real listener `<bind>_<port>` bound to the port (a Sidecar
    /// ingress port with `captureMode: NONE`, or `DEFAULT` on a proxy without
    /// interception); `None` for a chain of `virtualInbound`.
    pub bind: Option<String>,
    /// TLS the port terminates (Sidecar `ingress[].tls`).
    pub tls: Option<ingress_tls::IngressTls>,
    /// The port's protocol is unnamed: plain HTTP (detected by the HTTP inspector)
    /// goes to an HTTP chain, anything else to a TCP chain (Istio's inbound sniffing).
    pub sniffed: bool,
    /// The address in the names of the port's chains (`<name_bind>_<port>`): the
    /// wildcard for service ports, the proxy's address for Sidecar ingress ports.
    pub name_bind: String,
    /// For a port with `tls`: its class as declared, before termination (the port is
    /// not terminated where mesh mTLS is on).
    pub declared: Option<inbound::PortClass>,
    /// The port's protocol, as its connection manager reads it (HTTP/2 options on
    /// HTTP/2 and gRPC ports, the gRPC-Web filter).
    pub protocol: meshfed_registry::Protocol,
}

impl InboundPort {
    /// A chain of `virtualInbound` for a port.
    pub fn captured(target_port: u16, http: bool) -> InboundPort {
        InboundPort {
            target_port,
            http,
            bind: None,
            tls: None,
            sniffed: false,
            name_bind: "0.0.0.0".into(),
            declared: None,
            protocol: if http {
                meshfed_registry::Protocol::Http
            } else {
                meshfed_registry::Protocol::Tcp
            },
        }
    }

    /// A chain of `virtualInbound` for a port of `protocol` (unnamed: sniffed).
    pub fn for_protocol(target_port: u16, protocol: meshfed_registry::Protocol) -> InboundPort {
        InboundPort {
            sniffed: protocol == meshfed_registry::Protocol::Unsupported,
            protocol,
            ..InboundPort::captured(target_port, protocol.is_http())
        }
    }
}

/// Every listener of a sidecar. `inbound` lists the proxy's own ports.
pub fn sidecar_listeners(
    snapshot: &Snapshot,
    proxy: &ClientView,
    inbound: &[InboundPort],
) -> Vec<Listener> {
    sidecar_listeners_at(snapshot, proxy, inbound, None)
}

/// [`sidecar_listeners`] of a proxy at `own_ip` that is an endpoint of a headless
/// service: it gets no per-endpoint listener for itself.
pub fn sidecar_listeners_at(
    snapshot: &Snapshot,
    proxy: &ClientView,
    inbound: &[InboundPort],
    own_ip: Option<std::net::IpAddr>,
) -> Vec<Listener> {
    sidecar_listener_set(snapshot, proxy, inbound, own_ip).0
}

/// [`sidecar_listeners_at`], with what building them found wrong in the config (the
/// outbound conflicts).
pub fn sidecar_listener_set(
    snapshot: &Snapshot,
    proxy: &ClientView,
    inbound: &[InboundPort],
    own_ip: Option<std::net::IpAddr>,
) -> (Vec<Listener>, Findings) {
    let mut out = Vec::new();
    let authz = InboundAuthz::for_workload(snapshot, &proxy.namespace, &proxy.labels);
    let mtls = crate::generate::authn::workload_mtls(snapshot, &proxy.namespace, &proxy.labels);
    let ctx = inbound::InboundContext::new(snapshot, proxy, &authz, mtls);
    // Without interception nothing reaches a capture listener: only bound ports.
    if !proxy.interception_none {
        let captured: Vec<&InboundPort> = inbound.iter().filter(|p| p.bind.is_none()).collect();
        out.push(outbound::virtual_outbound(snapshot, proxy));
        out.push(inbound::virtual_inbound(snapshot, &captured, &ctx));
    }
    let (outbound, found) = outbound::outbound_listeners(snapshot, proxy, own_ip);
    out.extend(outbound);
    out.extend(inbound::bound_listeners(inbound, &ctx));
    (out, found)
}

/// The authorization filters of a workload's inbound chains (its AuthorizationPolicies
/// through [`crate::generate::authz`], its RequestAuthentications through
/// [`crate::generate::jwt`]): `jwt_authn` and RBAC before the router of HTTP chains,
/// RBAC before the TCP proxy of the others. Empty without policies.
#[derive(Clone, Debug, Default)]
pub struct InboundAuthz {
    http: Vec<HttpFilter>,
    network: Vec<Filter>,
}

impl InboundAuthz {
    /// The filters of the policies selecting a sidecar's workload of `namespace` with
    /// `labels`.
    pub fn for_workload(
        snapshot: &Snapshot,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> InboundAuthz {
        InboundAuthz::select(snapshot, namespace, labels, true)
    }

    /// The filters of the policies selecting a proxy of `namespace` with `labels`: a
    /// sidecar, or a gateway (whose `jwt_authn` clears the route cache so routes can
    /// match the verified claims).
    fn select(
        snapshot: &Snapshot,
        namespace: &str,
        labels: &std::collections::BTreeMap<String, String>,
        sidecar: bool,
    ) -> InboundAuthz {
        use crate::generate::authz;
        let selected = authz::select_in(snapshot.config(), namespace, labels);
        let jwt = crate::generate::jwt::jwt_filter(snapshot, namespace, labels, sidecar);
        if selected.is_empty() && jwt.is_none() {
            return InboundAuthz::default();
        }
        let opts = authz::AuthzOptions::for_snapshot(snapshot);
        // Istio's HTTP order: the CUSTOM group, jwt_authn, then AUDIT, DENY, ALLOW
        // (RBAC reads the payload jwt_authn writes).
        let custom = authz::Selected {
            custom: selected.custom.clone(),
            ..Default::default()
        };
        let rest = authz::Selected {
            custom: Vec::new(),
            ..selected.clone()
        };
        let mut http = authz::http_filters(&custom, &opts);
        http.extend(jwt);
        http.extend(authz::http_filters(&rest, &opts));
        InboundAuthz {
            http,
            network: authz::network_filters(&selected, &opts),
        }
    }
}

/// The HTTP inspector, for listeners with a chain matching plaintext HTTP ALPNs.
fn http_inspector() -> ListenerFilter {
    ListenerFilter {
        name: outbound::HTTP_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(
            &envoy_types::pb::envoy::extensions::filters::listener::http_inspector::v3::HttpInspector::default(),
        ))),
        ..Default::default()
    }
}

/// The TLS inspector, for listeners with a chain matching TLS (Istio's
/// `xdsfilters.TLSInspector`).
fn tls_inspector() -> ListenerFilter {
    ListenerFilter {
        name: outbound::TLS_INSPECTOR.into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(
            &envoy_types::pb::envoy::extensions::filters::listener::tls_inspector::v3::TlsInspector {
                // Istio's: the ClientHello is read 512 bytes at a time (Envoy: 64 KiB).
                initial_read_buffer_size: Some(UInt32Value { value: 512 }),
                ..Default::default()
            },
        ))),
        ..Default::default()
    }
}

/// The inline route table of an inbound HTTP chain: every request to `cluster`, with
/// no timeout at all (Istio's `BuildDefaultHTTPInboundRoute`: neither Envoy's 15 s
/// route timeout nor a stream limit; the `grpc-timeout` header is not read) and two
/// retries of requests reset before they reached the application.
fn inbound_route(cluster: &str, port: u16) -> RouteConfiguration {
    RouteConfiguration {
        name: cluster.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: format!("inbound|http|{port}"),
            domains: vec!["*".into()],
            routes: vec![Route {
                name: "default".into(),
                r#match: Some(RouteMatch {
                    path_specifier: Some(route_match::PathSpecifier::Prefix("/".into())),
                    ..Default::default()
                }),
                action: Some(route::Action::Route(RouteAction {
                    cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
                        cluster.to_string(),
                    )),
                    timeout: Some(PbDuration::default()),
                    max_stream_duration: Some(MaxStreamDuration {
                        max_stream_duration: Some(PbDuration::default()),
                        grpc_timeout_header_max: Some(PbDuration::default()),
                        ..Default::default()
                    }),
                    retry_policy: Some(RetryPolicy {
                        retry_on: "reset-before-request".into(),
                        num_retries: Some(UInt32Value { value: 2 }),
                        ..Default::default()
                    }),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        validate_clusters: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// Listeners of a gateway: one per resolved port and bind of the Gateway servers
/// selecting it (see [`gateway`]).
pub fn gateway_listeners(
    snapshot: &Snapshot,
    proxy: &ClientView,
    targets: &[GatewayTarget],
) -> Vec<Listener> {
    gateway_listener_set(snapshot, proxy, targets).0
}

/// [`gateway_listeners`], with what building them found wrong in the config: the
/// Gateway servers the merge dropped and the VirtualService TLS matches left out.
pub fn gateway_listener_set(
    snapshot: &Snapshot,
    proxy: &ClientView,
    targets: &[GatewayTarget],
) -> (Vec<Listener>, Findings) {
    let merged = MergedGateway::build(snapshot, &proxy.labels, targets);
    let mut found = Findings::default();
    for rejected in &merged.rejected {
        *found
            .rejected
            .entry(("gateway", rejected.gateway.clone()))
            .or_default() += 1;
    }
    let listeners = gateway::listeners(snapshot, proxy, &merged, &mut found);
    (listeners, found)
}

fn ads_config() -> ConfigSource {
    ConfigSource {
        config_source_specifier: Some(config_source::ConfigSourceSpecifier::Ads(
            AggregatedConfigSource {},
        )),
        resource_api_version: ApiVersion::V3 as i32,
        ..Default::default()
    }
}

fn socket(address: &str, port: u16) -> envoy_types::pb::envoy::config::core::v3::Address {
    envoy_types::pb::envoy::config::core::v3::Address {
        address: Some(address::Address::SocketAddress(SocketAddress {
            address: address.to_string(),
            port_specifier: Some(socket_address::PortSpecifier::PortValue(u32::from(port))),
            ..Default::default()
        })),
    }
}

#[cfg(any(test, feature = "testing"))]
/// The clusters a listener sends traffic to and the route tables it asks for (a test
/// oracle).
pub fn references(listener: &Listener) -> (Vec<String>, Vec<String>) {
    let mut clusters = Vec::new();
    let mut routes = Vec::new();
    for chain in listener
        .filter_chains
        .iter()
        .chain(listener.default_filter_chain.iter())
    {
        for f in &chain.filters {
            let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type else {
                continue;
            };
            if any.type_url == TcpProxy::type_url() {
                if let Ok(tp) = TcpProxy::decode(any.value.as_slice())
                    && let Some(tcp_proxy::ClusterSpecifier::Cluster(c)) = tp.cluster_specifier
                {
                    clusters.push(c);
                }
            } else if any.type_url == HttpConnectionManager::type_url()
                && let Ok(hcm) = HttpConnectionManager::decode(any.value.as_slice())
            {
                match hcm.route_specifier {
                    Some(http_connection_manager::RouteSpecifier::Rds(r)) => {
                        routes.push(r.route_config_name)
                    }
                    Some(http_connection_manager::RouteSpecifier::RouteConfig(rc)) => {
                        for vh in rc.virtual_hosts {
                            for r in vh.routes {
                                if let Some(route::Action::Route(RouteAction {
                                    cluster_specifier:
                                        Some(route_action::ClusterSpecifier::Cluster(c)),
                                    ..
                                })) = r.action
                                {
                                    clusters.push(c);
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    }
    (clusters, routes)
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;

    use meshfed_api::networking::v1alpha3::{
        CaptureMode, Gateway, IstioEgressListener, IstioIngressListener, Port as GwPort, Server,
        ServerTlsSettings, Sidecar, SidecarPort,
    };
    use meshfed_registry::{
        Aggregate, EndpointIndex, MemoryRegistry, Port, Protocol, ProviderId, PushRequest, Service,
        TriggerReason, UpdateSink,
    };

    use super::*;
    use crate::mesh::MeshSettings;
    use crate::model::proxy::{Proxy, json_to_struct};
    use crate::push::config_index::{Config, ConfigIndex, ConfigSet};
    use meshfed_api::mesh::v1alpha1::mesh_config::outbound_traffic_policy::Mode as MeshOutboundMode;

    pub(crate) fn service(
        host: &str,
        ns: &str,
        vip: &str,
        ports: &[(&str, u16, Protocol)],
    ) -> Service {
        let mut s = Service::new(host, ns, ProviderId::Mock, "c1");
        s.cluster_vips
            .insert("c1".into(), vec![vip.parse().unwrap()]);
        for (n, p, proto) in ports {
            s.ports.push(Port::new(n, *p, *proto).unwrap());
        }
        s
    }

    pub(crate) fn snapshot(services: Vec<Service>, set: ConfigSet, mesh: MeshSettings) -> Snapshot {
        let services = services.into_iter().map(|s| (s, Vec::new())).collect();
        snapshot_with(services, set, mesh)
    }

    /// [`snapshot`] of services with their endpoints.
    pub(crate) fn snapshot_with(
        services: Vec<(Service, Vec<meshfed_registry::Endpoint>)>,
        set: ConfigSet,
        mesh: MeshSettings,
    ) -> Snapshot {
        snapshot_of(vec![(ProviderId::Mock, services)], set, mesh)
    }

    /// One registry posing as a provider, with its services and their endpoints.
    pub(crate) type Registry = (ProviderId, Vec<(Service, Vec<meshfed_registry::Endpoint>)>);

    /// A snapshot of registries (clusters `c1`, `c2`, ...), config and mesh.
    pub(crate) fn snapshot_of(
        registries: Vec<Registry>,
        set: ConfigSet,
        mesh: MeshSettings,
    ) -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _rx) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        for (i, (provider, services)) in registries.into_iter().enumerate() {
            let reg = MemoryRegistry::with_provider(provider, format!("c{}", i + 1), sink.clone());
            reg.mark_synced();
            for (s, eps) in services {
                let key = s.key();
                reg.add_service(s);
                if !eps.is_empty() {
                    reg.set_endpoints(&key, eps);
                }
            }
            aggregate.add_registry(Arc::new(reg));
        }
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

    pub(crate) fn proxy(id: &str, labels: serde_json::Value) -> Proxy {
        let node = envoy_types::pb::envoy::config::core::v3::Node {
            id: id.into(),
            metadata: Some(json_to_struct(
                &serde_json::json!({"LABELS": labels, "CLUSTER_ID": "c1"}),
            )),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    pub(crate) fn proxy_with(id: &str, metadata: serde_json::Value) -> Proxy {
        let mut meta = serde_json::json!({"LABELS": {}, "CLUSTER_ID": "c1"});
        for (k, v) in metadata.as_object().unwrap() {
            meta[k] = v.clone();
        }
        let node = envoy_types::pb::envoy::config::core::v3::Node {
            id: id.into(),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    pub(crate) fn default_mesh() -> MeshSettings {
        MeshSettings {
            config: crate::mesh::default_mesh_config(),
            ..Default::default()
        }
    }

    #[test]
    fn authorization_policies_put_rbac_on_the_inbound_chains_of_the_workloads_they_select() {
        use envoy_types::pb::envoy::extensions::filters::network::rbac::v3::Rbac as NetworkRbac;
        use meshfed_api::security::v1beta1 as sec;
        use meshfed_api::r#type::v1beta1::WorkloadSelector;

        let policy = |name: &str, action: sec::authorization_policy::Action, app: &str| Config {
            name: name.into(),
            namespace: "default".into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: std::time::UNIX_EPOCH,
            spec: sec::AuthorizationPolicy {
                selector: Some(WorkloadSelector {
                    match_labels: [("app".to_string(), app.to_string())].into(),
                }),
                action: action as i32,
                rules: vec![sec::Rule {
                    to: vec![sec::rule::To {
                        operation: Some(sec::Operation {
                            methods: vec!["POST".into()],
                            ports: vec!["9000".into()],
                            ..Default::default()
                        }),
                    }],
                    ..Default::default()
                }],
                ..Default::default()
            },
        };
        let set = ConfigSet {
            authorization_policies: vec![
                policy("deny-post", sec::authorization_policy::Action::Deny, "a"),
                policy("other", sec::authorization_policy::Action::Allow, "b"),
            ],
            ..Default::default()
        };
        let snap = snapshot(vec![], set, default_mesh());
        let inbound = [
            InboundPort::captured(8080, true),
            InboundPort::captured(9000, false),
        ];
        let chains_of = |labels: serde_json::Value| {
            let p = proxy(
                "sidecar~10.0.0.1~a.default~default.svc.cluster.local",
                labels,
            );
            let listeners = sidecar_listeners(&snap, &p.client_view(), &inbound);
            let vi = listeners
                .into_iter()
                .find(|l| l.name == VIRTUAL_INBOUND)
                .unwrap();
            let filters = |port: u16| -> Vec<Filter> {
                vi.filter_chains
                    .iter()
                    .find(|c| c.name == format!("0.0.0.0_{port}"))
                    .unwrap()
                    .filters
                    .clone()
            };
            (filters(8080), filters(9000))
        };
        let http_filter_names = |filters: &[Filter]| -> Vec<String> {
            let Some(filter::ConfigType::TypedConfig(any)) = &filters[0].config_type else {
                panic!("typed")
            };
            HttpConnectionManager::decode(any.value.as_slice())
                .unwrap()
                .http_filters
                .into_iter()
                .map(|f| f.name)
                .collect()
        };

        // Selected (app: a): DENY RBAC before the router, and on the TCP chain before
        // the TCP proxy; the policy of app: b does not apply.
        let (http, tcp) = chains_of(serde_json::json!({"app": "a"}));
        assert_eq!(
            http_filter_names(&http),
            vec![
                "envoy.filters.http.rbac",
                "envoy.filters.http.grpc_stats",
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
        let names: Vec<&str> = tcp.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "envoy.filters.network.rbac",
                "envoy.filters.network.tcp_proxy"
            ]
        );
        let Some(filter::ConfigType::TypedConfig(any)) = &tcp[0].config_type else {
            panic!("typed")
        };
        let rbac = NetworkRbac::decode(any.value.as_slice()).unwrap();
        assert_eq!(rbac.stat_prefix, "tcp.");
        let rules = rbac.rules.unwrap();
        assert_eq!(
            rules.action,
            envoy_types::pb::envoy::config::rbac::v3::rbac::Action::Deny as i32
        );
        assert!(
            rules
                .policies
                .contains_key("ns[default]-policy[deny-post]-rule[0]"),
            "{:?}",
            rules.policies.keys()
        );

        // Not selected (app: c): no RBAC at all.
        let (http, tcp) = chains_of(serde_json::json!({"app": "c"}));
        assert_eq!(
            http_filter_names(&http),
            vec![
                "envoy.filters.http.grpc_stats",
                "envoy.filters.http.fault",
                "envoy.filters.http.cors",
                "envoy.filters.http.router"
            ]
        );
        assert_eq!(tcp.len(), 1);
    }

    #[test]
    fn sidecar_listeners_have_istio_names_and_references() {
        let snap = snapshot(
            vec![
                service(
                    "a.default.svc.cluster.local",
                    "default",
                    "10.96.0.1",
                    &[("http", 80, Protocol::Http)],
                ),
                service(
                    "db.default.svc.cluster.local",
                    "default",
                    "10.96.0.2",
                    &[("tcp", 5432, Protocol::Tcp)],
                ),
                service(
                    "b.other.svc.cluster.local",
                    "other",
                    "10.96.0.3",
                    &[("http", 80, Protocol::Http)],
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        let p = proxy(
            "sidecar~10.0.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let inbound = [
            InboundPort::captured(8080, true),
            InboundPort::captured(9000, false),
        ];
        let listeners = sidecar_listeners(&snap, &p.client_view(), &inbound);
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            vec![
                "virtualOutbound",
                "virtualInbound",
                "0.0.0.0_80",
                "10.96.0.2_5432"
            ]
        );
        // A wildcard HTTP listener is sniffed: what is not HTTP passes through.
        let (clusters, routes) = references(&listeners[2]);
        assert_eq!(clusters, vec!["PassthroughCluster"]);
        assert_eq!(routes, vec!["80"]);
        assert_eq!(
            references(&listeners[3]).0,
            vec!["outbound|5432||db.default.svc.cluster.local"]
        );
        assert_eq!(
            references(&listeners[0]).0,
            vec!["BlackHoleCluster", "PassthroughCluster"],
            "loop guard, then the catch-all"
        );
        let (mut inbound_clusters, _) = references(&listeners[1]);
        inbound_clusters.dedup();
        assert_eq!(
            inbound_clusters,
            vec![
                "BlackHoleCluster",
                "InboundPassthroughCluster",
                "inbound|8080||",
                "inbound|9000||",
            ]
        );
        assert_eq!(listeners[2].bind_to_port, Some(BoolValue { value: false }));
    }

    #[test]
    fn registry_only_blackholes_and_sidecar_egress_scopes() {
        let mut mesh = default_mesh();
        mesh.config.outbound_traffic_policy.as_mut().unwrap().mode =
            MeshOutboundMode::RegistryOnly as i32;
        let sidecar = Sidecar {
            egress: vec![IstioEgressListener {
                hosts: vec!["./*".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let set = ConfigSet {
            sidecars: vec![Config {
                name: "default".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: sidecar,
            }],
            ..Default::default()
        };
        let snap = snapshot(
            vec![
                service(
                    "a.default.svc.cluster.local",
                    "default",
                    "10.96.0.1",
                    &[("http", 80, Protocol::Http)],
                ),
                service(
                    "db.other.svc.cluster.local",
                    "other",
                    "10.96.0.2",
                    &[("tcp", 5432, Protocol::Tcp)],
                ),
            ],
            set,
            mesh,
        );
        let p = proxy(
            "sidecar~10.0.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let listeners = sidecar_listeners(&snap, &p.client_view(), &[]);
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["virtualOutbound", "virtualInbound", "0.0.0.0_80"],
            "other/db is out of scope"
        );
        assert_eq!(
            references(&listeners[0]).0,
            vec!["BlackHoleCluster", "BlackHoleCluster"]
        );
        assert_eq!(references(&listeners[2]).0, vec!["BlackHoleCluster"]);
    }

    fn ingress_sidecar(ingress: Vec<IstioIngressListener>) -> ConfigSet {
        ConfigSet {
            sidecars: vec![Config {
                name: "default".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: Sidecar {
                    ingress,
                    ..Default::default()
                },
            }],
            ..Default::default()
        }
    }

    fn ingress(number: u32, protocol: &str, bind: &str, mode: CaptureMode) -> IstioIngressListener {
        IstioIngressListener {
            port: Some(SidecarPort {
                number,
                protocol: protocol.into(),
                name: format!("p{number}"),
                ..Default::default()
            }),
            bind: bind.into(),
            capture_mode: mode as i32,
            ..Default::default()
        }
    }

    #[test]
    fn sidecar_ingress_ports_replace_service_ports() {
        let set = ingress_sidecar(vec![
            ingress(8080, "HTTP", "", CaptureMode::Default),
            ingress(9000, "TCP", "127.0.0.1", CaptureMode::None),
            // A second listener on a port: the first wins.
            ingress(8080, "TCP", "", CaptureMode::Default),
            ingress(7070, "GRPC", "", CaptureMode::Iptables),
        ]);
        let snap = snapshot(Vec::new(), set, default_mesh());
        let p = proxy(
            "sidecar~10.0.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let inbound = crate::generate::inbound_ports(&snap, &p);
        assert_eq!(
            inbound,
            vec![
                InboundPort {
                    name_bind: "10.0.0.1".into(),
                    protocol: Protocol::Grpc,
                    ..InboundPort::captured(7070, true)
                },
                InboundPort {
                    name_bind: "10.0.0.1".into(),
                    ..InboundPort::captured(8080, true)
                },
                InboundPort {
                    target_port: 9000,
                    http: false,
                    bind: Some("127.0.0.1".into()),
                    tls: None,
                    sniffed: false,
                    name_bind: "127.0.0.1".into(),
                    declared: None,
                    protocol: Protocol::Tcp,
                },
            ]
        );
        let listeners = sidecar_listeners(&snap, &p.client_view(), &inbound);
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(
            names,
            vec!["virtualOutbound", "virtualInbound", "127.0.0.1_9000"]
        );
        let mut clusters = references(&listeners[1]).0;
        clusters.dedup();
        assert_eq!(
            clusters,
            vec![
                "BlackHoleCluster",
                "InboundPassthroughCluster",
                "inbound|7070||",
                "inbound|8080||",
            ],
            "the bound port is not a chain of virtualInbound"
        );
        let bound = &listeners[2];
        assert_eq!(bound.address, Some(socket("127.0.0.1", 9000)));
        assert!(
            bound
                .listener_filters
                .iter()
                .all(|f| f.name != "envoy.filters.listener.original_dst"),
            "no original_dst"
        );
        let mut clusters = references(bound).0;
        clusters.dedup();
        assert_eq!(clusters, vec!["inbound|9000||"]);

        // Without interception, DEFAULT binds too (on the wildcard), and there is no
        // virtualInbound (so an IPTABLES port has nowhere to be) nor virtualOutbound.
        let p = proxy_with(
            "sidecar~10.0.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({"INTERCEPTION_MODE": "NONE"}),
        );
        let inbound = crate::generate::inbound_ports(&snap, &p);
        let bound: Vec<(u16, Option<&str>)> = inbound
            .iter()
            .map(|i| (i.target_port, i.bind.as_deref()))
            .collect();
        assert_eq!(
            bound,
            vec![
                (7070, None),
                (8080, Some("0.0.0.0")),
                (9000, Some("127.0.0.1"))
            ]
        );
        let view = p.client_view();
        assert!(view.interception_none);
        let listeners = sidecar_listeners(&snap, &view, &inbound);
        let names: Vec<&str> = listeners.iter().map(|l| l.name.as_str()).collect();
        assert_eq!(names, vec!["0.0.0.0_8080", "127.0.0.1_9000"]);

        // Without interception and without ingress: no inbound listener at all.
        let snap = snapshot(Vec::new(), ConfigSet::default(), default_mesh());
        assert!(crate::generate::inbound_ports(&snap, &p).is_empty());
    }

    #[test]
    fn sidecar_egress_ports_bind_and_capture() {
        let egress = |number: u32, protocol: &str, bind: &str, mode: CaptureMode, host: &str| {
            IstioEgressListener {
                port: (number > 0).then(|| SidecarPort {
                    number,
                    protocol: protocol.into(),
                    name: format!("p{number}"),
                    ..Default::default()
                }),
                bind: bind.into(),
                capture_mode: mode as i32,
                hosts: vec![host.into()],
            }
        };
        let set = ConfigSet {
            sidecars: vec![Config {
                name: "default".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: Sidecar {
                    egress: vec![
                        egress(
                            9000,
                            "TCP",
                            "",
                            CaptureMode::Default,
                            "./db.default.svc.cluster.local",
                        ),
                        egress(
                            8080,
                            "HTTP",
                            "127.0.0.2",
                            CaptureMode::None,
                            "./a.default.svc.cluster.local",
                        ),
                        egress(
                            7000,
                            "TCP",
                            "",
                            CaptureMode::None,
                            "./db.default.svc.cluster.local",
                        ),
                        egress(0, "", "", CaptureMode::Default, "./*"),
                    ],
                    ..Default::default()
                },
            }],
            ..Default::default()
        };
        let snap = snapshot(
            vec![
                service(
                    "a.default.svc.cluster.local",
                    "default",
                    "10.96.0.1",
                    &[("http", 80, Protocol::Http)],
                ),
                service(
                    "db.default.svc.cluster.local",
                    "default",
                    "10.96.0.2",
                    &[("tcp", 5432, Protocol::Tcp)],
                ),
                service(
                    "b.other.svc.cluster.local",
                    "other",
                    "10.96.0.3",
                    &[("http", 80, Protocol::Http)],
                ),
            ],
            set,
            default_mesh(),
        );
        let p = proxy(
            "sidecar~10.0.0.1~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let listeners = sidecar_listeners(&snap, &p.client_view(), &[]);
        let by_name: BTreeMap<&str, &Listener> =
            listeners.iter().map(|l| (l.name.as_str(), l)).collect();
        assert_eq!(
            by_name.keys().copied().collect::<Vec<_>>(),
            vec![
                "0.0.0.0_80",
                "10.96.0.2_5432",
                "10.96.0.2_9000",
                "127.0.0.1_7000",
                "127.0.0.2_8080",
                "virtualInbound",
                "virtualOutbound"
            ]
        );
        // A TCP egress port on the service's VIP, to its only port's cluster.
        let tcp = by_name["10.96.0.2_9000"];
        assert_eq!(tcp.bind_to_port, Some(BoolValue { value: false }));
        assert_eq!(
            references(tcp).0,
            vec!["outbound|5432||db.default.svc.cluster.local"]
        );
        // captureMode NONE binds a real port: the given address, else the loopback.
        let http = by_name["127.0.0.2_8080"];
        assert_eq!(http.bind_to_port, None);
        assert_eq!(http.address, Some(socket("127.0.0.2", 8080)));
        assert_eq!(references(http).1, vec!["8080"]);
        let bound = by_name["127.0.0.1_7000"];
        assert_eq!(bound.bind_to_port, None);
        assert_eq!(
            references(bound).0,
            vec!["outbound|5432||db.default.svc.cluster.local"]
        );
    }

    /// LDS size of one sidecar in an istio-reference-like mesh (1,000 HTTP services on
    /// port 8080 in 10 namespaces). Run with `--nocapture` to see the figure.
    /// istio-reference's services: 1,000 HTTP services on port 8080, 10 namespaces.
    fn istio_reference_services() -> Vec<Service> {
        (0..1000u32)
            .map(|j| {
                let vip = std::net::Ipv4Addr::from(
                    u32::from(std::net::Ipv4Addr::new(10, 96, 0, 0)) + j + 1,
                );
                service(
                    &format!("svc-{j}.ns-{}.svc.cluster.local", j % 10),
                    &format!("ns-{}", j % 10),
                    &vip.to_string(),
                    &[("http", 8080, Protocol::Http)],
                )
            })
            .collect()
    }

    #[test]
    fn lds_size_of_an_istio_reference_sidecar() {
        let services = istio_reference_services();
        let snap = snapshot(services, ConfigSet::default(), default_mesh());
        let p = proxy(
            "sidecar~172.16.0.1~app.ns-0~ns-0.svc.cluster.local",
            serde_json::json!({}),
        );
        let inbound = [InboundPort::captured(9080, true)];
        let mut listeners = sidecar_listeners(&snap, &p.client_view(), &inbound);
        let size = |listeners: &[Listener]| -> usize {
            listeners
                .iter()
                .map(|l| pack(l).encode_to_vec().len())
                .sum()
        };
        let bytes = size(&listeners);
        // With the mesh's default telemetry (Istio's: prometheus metrics, tracing on at
        // 1%, no access log), as the listener input puts it in.
        crate::generate::telemetry::ProxyTelemetry::new(&snap, &p.client_view())
            .apply_to_listeners(&mut listeners, false);
        let with_telemetry = size(&listeners);
        println!(
            "LDS per istio-reference sidecar: {} listeners, {bytes} bytes; \
             {with_telemetry} bytes with the default telemetry",
            listeners.len()
        );
        assert!(with_telemetry > bytes);
    }

    /// Issue 20's measure: the LDS of one istio-reference sidecar (namespace `ns-0`,
    /// app `svc-0`) without and with 100 AuthorizationPolicies across the 10
    /// namespaces (per namespace: 5 namespace-wide ones, 5 selecting one app), and the
    /// time to generate it (printed, not asserted: a debug build measures little).
    #[test]
    fn lds_of_an_istio_reference_sidecar_with_100_authorization_policies() {
        use meshfed_api::security::v1beta1 as sec;
        use meshfed_api::r#type::v1beta1::WorkloadSelector;
        let services = istio_reference_services();
        let policies: Vec<Config<sec::AuthorizationPolicy>> = (0..100u32)
            .map(|i| {
                let ns = format!("ns-{}", i % 10);
                let k = i / 10;
                Config {
                    name: format!("policy-{i}"),
                    namespace: ns.clone(),
                    labels: Default::default(),
                    annotations: Default::default(),
                    creation_time: std::time::UNIX_EPOCH,
                    spec: sec::AuthorizationPolicy {
                        selector: (k >= 5).then(|| WorkloadSelector {
                            match_labels: [("app".to_string(), format!("svc-{}", (k - 5) * 10))]
                                .into(),
                        }),
                        action: if k % 2 == 0 {
                            sec::authorization_policy::Action::Allow
                        } else {
                            sec::authorization_policy::Action::Deny
                        } as i32,
                        rules: vec![sec::Rule {
                            from: vec![sec::rule::From {
                                source: Some(sec::Source {
                                    principals: vec![format!(
                                        "cluster.local/ns/{ns}/sa/client-{k}"
                                    )],
                                    ..Default::default()
                                }),
                            }],
                            to: vec![sec::rule::To {
                                operation: Some(sec::Operation {
                                    methods: vec!["GET".into(), "POST".into()],
                                    paths: vec![format!("/api/v{k}/*")],
                                    ..Default::default()
                                }),
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                }
            })
            .collect();
        let p = proxy(
            "sidecar~172.16.0.1~svc-0-1.ns-0~ns-0.svc.cluster.local",
            serde_json::json!({"app": "svc-0"}),
        );
        let inbound = [InboundPort::captured(9080, true)];
        let measure = |set: ConfigSet| {
            let snap = snapshot(services.clone(), set, default_mesh());
            let view = p.client_view();
            let start = std::time::Instant::now();
            let rounds = 20;
            let mut listeners = Vec::new();
            for _ in 0..rounds {
                listeners = sidecar_listeners(&snap, &view, &inbound);
            }
            let per = start.elapsed() / rounds;
            let bytes: usize = listeners
                .iter()
                .map(|l| pack(l).encode_to_vec().len())
                .sum();
            (bytes, per)
        };
        let with_policies = || ConfigSet {
            authorization_policies: policies.clone(),
            ..Default::default()
        };
        // Each measured twice, alternating; the second of each is printed (the first
        // round warms the allocator and caches).
        measure(ConfigSet::default());
        measure(with_policies());
        let (plain, plain_time) = measure(ConfigSet::default());
        let (with, with_time) = measure(with_policies());
        println!(
            "LDS per istio-reference sidecar: {plain} bytes ({plain_time:?} to generate), \
             with 100 AuthorizationPolicies: {with} bytes ({with_time:?})"
        );
        // The 5 namespace-wide policies of ns-0 and the one selecting svc-0 apply.
        assert!(with > plain, "{with} <= {plain}");
    }

    #[test]
    fn gateway_listeners_from_selected_gateways() {
        let gw = Gateway {
            selector: [("istio".to_string(), "ingressgateway".to_string())].into(),
            servers: vec![
                Server {
                    port: Some(GwPort {
                        number: 80,
                        protocol: "HTTP".into(),
                        name: "http".into(),
                        ..Default::default()
                    }),
                    hosts: vec!["*/bookinfo.example.com".into()],
                    ..Default::default()
                },
                Server {
                    port: Some(GwPort {
                        number: 443,
                        protocol: "HTTPS".into(),
                        name: "https".into(),
                        ..Default::default()
                    }),
                    hosts: vec!["bookinfo.example.com".into()],
                    tls: Some(ServerTlsSettings {
                        mode: TlSmode::Simple as i32,
                        credential_name: "bookinfo-cert".into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
        };
        let set = ConfigSet {
            gateways: vec![Config {
                name: "bookinfo".into(),
                namespace: "default".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: gw,
            }],
            ..Default::default()
        };
        let snap = snapshot(vec![], set, default_mesh());
        let router = proxy(
            "router~10.0.0.9~gw.istio-system~istio-system.svc.cluster.local",
            serde_json::json!({"istio": "ingressgateway"}),
        );
        let listeners = gateway_listeners(&snap, &router.client_view(), &[]);
        assert_eq!(
            listeners
                .iter()
                .map(|l| l.name.as_str())
                .collect::<Vec<_>>(),
            vec!["0.0.0.0_80", "0.0.0.0_443"]
        );
        assert_eq!(references(&listeners[0]).1, vec!["http.80"]);
        let https = &listeners[1].filter_chains[0];
        assert_eq!(
            https.filter_chain_match.as_ref().unwrap().server_names,
            vec!["bookinfo.example.com"]
        );
        assert!(https.transport_socket.is_some());
        let other = proxy(
            "router~10.0.0.9~gw.istio-system~istio-system.svc.cluster.local",
            serde_json::json!({"istio": "egress"}),
        );
        assert!(gateway_listeners(&snap, &other.client_view(), &[]).is_empty());
    }
}

//! The inbound side of a sidecar: `virtualInbound` (15006) and the listeners bound to
//! Sidecar ingress ports, with the filter chains Istio builds per port and mutual TLS
//! mode (`networking/core/listener_inbound.go`, `filterchain_options.go`).
//!
//! Each port gets one chain per option of its (mode, protocol) pair: under PERMISSIVE
//! an HTTP port has an mTLS chain matching the Istio ALPNs and a plaintext one, under
//! STRICT only the mTLS chain, under DISABLE only the plaintext one. Ports of unknown
//! protocol get HTTP and TCP chains told apart by the inspectors. Chains are named
//! `<bind>_<port>`; traffic to no declared port takes the passthrough chains
//! (`virtualInbound` for TCP, `virtualInbound-catchall-http` for HTTP) of the
//! workload's mode, plus one set per port that only `portLevelMtls` names. There is no
//! default chain: a connection no chain accepts is closed (plaintext to a STRICT port).
//!
//! The TLS and HTTP inspectors run only on the ports whose chains need them, computed
//! from the chains as Istio does (port 0 stands for "every other port").

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{TransportSocket, transport_socket};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener, ListenerFilter,
    ListenerFilterChainMatchPredicate, listener_filter,
    listener_filter_chain_match_predicate::{MatchSet, Rule},
};
use envoy_types::pb::envoy::extensions::filters::listener::original_dst::v3::OriginalDst;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::DownstreamTlsContext;
use envoy_types::pb::envoy::r#type::v3::Int32Range;
use envoy_types::pb::google::protobuf::UInt32Value;

use super::hcm::{HcmClass, HcmParts, HcmSettings};
use super::outbound::{self, tcp_proxy_filter};
use super::{
    INBOUND_PASSTHROUGH, InboundAuthz, InboundPort, VIRTUAL_INBOUND, ingress_tls, pack, socket,
};
use crate::generate::authn::{MtlsMode, WorkloadMtls, inbound_mtls_context};
use crate::generate::upstream_tls::TLS_SOCKET;
use crate::push::snapshot::Snapshot;
use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{TcpProxy, tcp_proxy};

/// Name of the HTTP passthrough chains.
pub const CATCHALL_HTTP: &str = "virtualInbound-catchall-http";
/// Name of the chain refusing connections addressed to the capture port itself.
pub const BLACKHOLE_CHAIN: &str = "virtualInbound-blackhole";

/// ALPNs of HTTP sent by a sidecar over mTLS (the client's `istio.alpn` filter).
const MTLS_HTTP_ALPNS: &[&str] = &["istio-http/1.0", "istio-http/1.1", "istio-h2"];
/// Every ALPN a sidecar sends over mTLS.
const ALL_ISTIO_MTLS_ALPNS: &[&str] = &[
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];
/// ALPNs of TCP sent by a sidecar over mTLS.
const MTLS_TCP_ALPNS: &[&str] = &["istio-peer-exchange", "istio"];
/// What the HTTP inspector reports for plaintext HTTP.
const PLAINTEXT_HTTP_ALPNS: &[&str] = &["http/1.1", "h2c"];

const TLS: &str = ingress_tls::TLS_TRANSPORT;
const RAW: &str = "raw_buffer";

/// What an inbound chain terminates: the application's protocol after any TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChainProtocol {
    Http,
    Tcp,
}

/// The protocol class of a port: HTTP, opaque TCP, or unknown (sniffed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PortClass {
    Http,
    Tcp,
    Auto,
}

impl PortClass {
    /// The class of a port declared with `protocol`.
    pub fn of(protocol: meshfed_registry::Protocol) -> PortClass {
        if protocol == meshfed_registry::Protocol::Unsupported {
            PortClass::Auto
        } else if protocol.is_http() {
            PortClass::Http
        } else {
            PortClass::Tcp
        }
    }
}

/// One filter chain of a port (Istio's `FilterChainMatchOptions`).
#[derive(Clone, Copy, Debug)]
struct ChainOption {
    protocol: ChainProtocol,
    transport: &'static str,
    alpn: &'static [&'static str],
    /// Terminates mesh mTLS.
    mtls: bool,
}

const fn opt(
    protocol: ChainProtocol,
    transport: &'static str,
    alpn: &'static [&'static str],
    mtls: bool,
) -> ChainOption {
    ChainOption {
        protocol,
        transport,
        alpn,
        mtls,
    }
}

use ChainProtocol::{Http, Tcp};

/// The chains of a port of `class` under `mode`, in Istio's order.
fn options(mode: MtlsMode, class: PortClass) -> &'static [ChainOption] {
    const HTTP_STRICT: &[ChainOption] = &[opt(Http, TLS, &[], true)];
    const HTTP_PERMISSIVE: &[ChainOption] = &[
        opt(Http, TLS, ALL_ISTIO_MTLS_ALPNS, true),
        opt(Http, RAW, &[], false),
    ];
    const HTTP_DISABLE: &[ChainOption] = &[opt(Http, RAW, &[], false)];
    const TCP_STRICT: &[ChainOption] = &[opt(Tcp, TLS, &[], true)];
    // The last chain takes one-way TLS from clients without a sidecar, not terminated.
    const TCP_PERMISSIVE: &[ChainOption] = &[
        opt(Tcp, TLS, ALL_ISTIO_MTLS_ALPNS, true),
        opt(Tcp, RAW, &[], false),
        opt(Tcp, TLS, &[], false),
    ];
    const TCP_DISABLE: &[ChainOption] = &[opt(Tcp, RAW, &[], false)];
    const AUTO_STRICT: &[ChainOption] = &[
        opt(Http, TLS, MTLS_HTTP_ALPNS, true),
        opt(Tcp, TLS, &[], true),
    ];
    const AUTO_PERMISSIVE: &[ChainOption] = &[
        opt(Http, TLS, MTLS_HTTP_ALPNS, true),
        opt(Http, RAW, PLAINTEXT_HTTP_ALPNS, false),
        opt(Tcp, TLS, MTLS_TCP_ALPNS, true),
        opt(Tcp, RAW, &[], false),
        opt(Tcp, TLS, &[], false),
    ];
    const AUTO_DISABLE: &[ChainOption] = &[
        opt(Http, RAW, PLAINTEXT_HTTP_ALPNS, false),
        opt(Tcp, RAW, &[], false),
    ];
    match (class, mode) {
        (PortClass::Http, MtlsMode::Strict) => HTTP_STRICT,
        (PortClass::Http, MtlsMode::Permissive) => HTTP_PERMISSIVE,
        (PortClass::Http, MtlsMode::Disable) => HTTP_DISABLE,
        (PortClass::Tcp, MtlsMode::Strict) => TCP_STRICT,
        (PortClass::Tcp, MtlsMode::Permissive) => TCP_PERMISSIVE,
        (PortClass::Tcp, MtlsMode::Disable) => TCP_DISABLE,
        (PortClass::Auto, MtlsMode::Strict) => AUTO_STRICT,
        (PortClass::Auto, MtlsMode::Permissive) => AUTO_PERMISSIVE,
        (PortClass::Auto, MtlsMode::Disable) => AUTO_DISABLE,
    }
}

/// What every inbound chain of one workload shares: its authorization filters, its
/// mTLS modes, the mTLS server sockets (built once), the connection managers' settings
/// and the mesh's protocol detection timeout.
pub struct InboundContext<'a> {
    pub authz: &'a InboundAuthz,
    pub mtls: WorkloadMtls,
    tls_http: TransportSocket,
    tls_tcp: TransportSocket,
    hcm: HcmSettings,
    /// The mesh's `protocolDetectionTimeout`: how long the inspectors wait.
    detection_timeout: Option<envoy_types::pb::google::protobuf::Duration>,
}

impl<'a> InboundContext<'a> {
    pub fn new(
        snapshot: &Snapshot,
        proxy: &crate::model::ClientView,
        authz: &'a InboundAuthz,
        mtls: WorkloadMtls,
    ) -> Self {
        let mesh = &snapshot.mesh().config;
        let socket = |ctx: DownstreamTlsContext| TransportSocket {
            name: TLS_SOCKET.into(),
            config_type: Some(transport_socket::ConfigType::TypedConfig(pack(&ctx))),
        };
        InboundContext {
            authz,
            mtls,
            tls_http: socket(inbound_mtls_context(mesh, false)),
            tls_tcp: socket(inbound_mtls_context(mesh, true)),
            hcm: HcmSettings::new(snapshot, proxy),
            // Unset is Istio's default, 0s (no timeout), not Envoy's 15 s.
            detection_timeout: Some(mesh.protocol_detection_timeout.map_or_else(
                Default::default,
                |d| envoy_types::pb::google::protobuf::Duration {
                    seconds: d.seconds,
                    nanos: d.nanos,
                },
            )),
        }
    }

    fn mtls_socket(&self, protocol: ChainProtocol) -> TransportSocket {
        match protocol {
            Http => self.tls_http.clone(),
            Tcp => self.tls_tcp.clone(),
        }
    }
}

/// Where a chain sends traffic and how it is named.
struct ChainTarget<'a> {
    name: &'a str,
    /// The name of HTTP chains when it differs (passthrough).
    http_name: &'a str,
    cluster: &'a str,
    /// Destination port to match; 0 for none.
    port: u16,
    stat_prefix: String,
    /// The port's protocol (the connection manager's HTTP/2 options, gRPC-Web).
    protocol: meshfed_registry::Protocol,
    /// The filters of the target's HTTP and TCP chains, built once: a port's mTLS and
    /// plaintext chains carry the same ones.
    http_filters: std::cell::OnceCell<Vec<Filter>>,
    tcp_filters: std::cell::OnceCell<Vec<Filter>>,
}

/// The chains of one declared port.
pub fn port_chains(p: &InboundPort, ctx: &InboundContext<'_>) -> Vec<FilterChain> {
    let mode = ctx.mtls.port_mode(p.target_port);
    let bind = p.bind.as_deref().unwrap_or(&p.name_bind);
    let name = format!("{bind}_{}", p.target_port);
    let cluster = crate::xds::names::inbound_name(p.target_port);
    let target = ChainTarget {
        name: &name,
        http_name: &name,
        cluster: &cluster,
        port: p.target_port,
        stat_prefix: format!("inbound_{bind}_{}", p.target_port),
        protocol: p.protocol,
        http_filters: Default::default(),
        tcp_filters: Default::default(),
    };
    // A Sidecar's own TLS applies only where mesh mTLS is off.
    if let Some(tls) = p.tls.as_ref().filter(|_| mode == MtlsMode::Disable) {
        let protocol = if p.http { Http } else { Tcp };
        let mut chain = chain(&target, opt(protocol, TLS, &[], false), ctx);
        chain.transport_socket = Some(tls.transport_socket());
        return vec![chain];
    }
    let class = match p.tls.as_ref().filter(|_| mode != MtlsMode::Disable) {
        // Not terminated: the port keeps its declared protocol.
        Some(_) => p.declared.unwrap_or(PortClass::Tcp),
        None if p.sniffed && !p.http => PortClass::Auto,
        None if p.http => PortClass::Http,
        None => PortClass::Tcp,
    };
    options(mode, class)
        .iter()
        .map(|o| chain(&target, *o, ctx))
        .collect()
}

/// The passthrough chains: the workload's mode on every undeclared port, and each
/// port only `portLevelMtls` names (not declared by a service or Sidecar) with its own.
fn passthrough_chains(declared: &[&InboundPort], ctx: &InboundContext<'_>) -> Vec<FilterChain> {
    let mut ports = vec![0u16];
    ports.extend(
        ctx.mtls
            .ports
            .keys()
            .filter(|port| !declared.iter().any(|p| p.target_port == **port)),
    );
    ports
        .into_iter()
        .flat_map(|port| {
            let mode = if port == 0 {
                ctx.mtls.mode
            } else {
                ctx.mtls.port_mode(port)
            };
            let target = ChainTarget {
                name: VIRTUAL_INBOUND,
                http_name: CATCHALL_HTTP,
                cluster: INBOUND_PASSTHROUGH,
                port,
                stat_prefix: INBOUND_PASSTHROUGH.to_string(),
                protocol: meshfed_registry::Protocol::Unsupported,
                http_filters: Default::default(),
                tcp_filters: Default::default(),
            };
            options(mode, PortClass::Auto)
                .iter()
                .map(|o| chain(&target, *o, ctx))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// One chain: HTTP through an inline route to the target's cluster, else a TCP proxy
/// to it, with the workload's authorization filters, terminating mesh mTLS when the
/// option does.
fn chain(target: &ChainTarget<'_>, o: ChainOption, ctx: &InboundContext<'_>) -> FilterChain {
    let filters = match o.protocol {
        Http => target.http_filters.get_or_init(|| {
            vec![ctx.hcm.filter(
                HcmClass::SidecarInbound,
                HcmParts {
                    stat_prefix: target.stat_prefix.clone(),
                    routes: http_connection_manager::RouteSpecifier::RouteConfig(
                        super::inbound_route(target.cluster, target.port),
                    ),
                    authz: &ctx.authz.http,
                    protocol: target.protocol,
                },
            )]
        }),
        Tcp => target.tcp_filters.get_or_init(|| {
            ctx.authz
                .network
                .iter()
                .cloned()
                .chain(std::iter::once(inbound_tcp_proxy(
                    target.cluster,
                    ctx.hcm.idle_timeout(),
                )))
                .collect()
        }),
    }
    .clone();
    FilterChain {
        name: match o.protocol {
            Http => target.http_name.to_string(),
            Tcp => target.name.to_string(),
        },
        filter_chain_match: Some(FilterChainMatch {
            destination_port: (target.port > 0).then_some(UInt32Value {
                value: u32::from(target.port),
            }),
            transport_protocol: o.transport.into(),
            application_protocols: o.alpn.iter().map(|a| a.to_string()).collect(),
            ..Default::default()
        }),
        filters,
        transport_socket: o.mtls.then(|| ctx.mtls_socket(o.protocol)),
        ..Default::default()
    }
}

/// The TCP proxy of an inbound chain: to `cluster`, closing connections idle for the
/// proxy's `IDLE_TIMEOUT` when it has one (Envoy's default, an hour, otherwise).
fn inbound_tcp_proxy(
    cluster: &str,
    idle_timeout: Option<envoy_types::pb::google::protobuf::Duration>,
) -> Filter {
    if idle_timeout.is_none() {
        return tcp_proxy_filter(cluster);
    }
    let proxy = TcpProxy {
        stat_prefix: cluster.to_string(),
        cluster_specifier: Some(tcp_proxy::ClusterSpecifier::Cluster(cluster.to_string())),
        idle_timeout,
        ..Default::default()
    };
    Filter {
        name: "envoy.filters.network.tcp_proxy".into(),
        config_type: Some(
            envoy_types::pb::envoy::config::listener::v3::filter::ConfigType::TypedConfig(pack(
                &proxy,
            )),
        ),
    }
}

/// `virtualInbound`: the loop guard, the passthrough chains, then the chains of each
/// captured port in port order.
pub fn virtual_inbound(
    snapshot: &Snapshot,
    inbound: &[&InboundPort],
    ctx: &InboundContext<'_>,
) -> Listener {
    let port = u16::try_from(snapshot.mesh().config.proxy_inbound_listen_port).unwrap_or(15006);
    let mut chains = vec![outbound::loop_guard(BLACKHOLE_CHAIN, port)];
    chains.extend(passthrough_chains(inbound, ctx));
    let mut seen = std::collections::BTreeSet::new();
    for p in inbound {
        if seen.insert(p.target_port) {
            chains.extend(port_chains(p, ctx));
        }
    }
    let listener_filters = std::iter::once(ListenerFilter {
        name: "envoy.filters.listener.original_dst".into(),
        config_type: Some(listener_filter::ConfigType::TypedConfig(pack(
            &OriginalDst::default(),
        ))),
        ..Default::default()
    })
    .chain(inspectors(&chains))
    .collect();
    Listener {
        name: VIRTUAL_INBOUND.into(),
        address: Some(socket("0.0.0.0", port)),
        traffic_direction: envoy_types::pb::envoy::config::core::v3::TrafficDirection::Inbound
            as i32,
        listener_filters,
        filter_chains: chains,
        continue_on_listener_filters_timeout: true,
        listener_filters_timeout: ctx.detection_timeout,
        ..Default::default()
    }
}

/// The real inbound listeners `<bind>_<port>` of the bound ports: the port's chains
/// alone, without `original_dst` (the connection is addressed to the listener).
pub fn bound_listeners(inbound: &[InboundPort], ctx: &InboundContext<'_>) -> Vec<Listener> {
    let mut seen = std::collections::BTreeSet::new();
    inbound
        .iter()
        .filter_map(|p| Some((p, p.bind.as_deref()?)))
        .filter(|(p, bind)| seen.insert((bind.to_string(), p.target_port)))
        .map(|(p, bind)| {
            let chains = port_chains(p, ctx);
            Listener {
                name: format!("{bind}_{}", p.target_port),
                address: Some(socket(bind, p.target_port)),
                traffic_direction:
                    envoy_types::pb::envoy::config::core::v3::TrafficDirection::Inbound as i32,
                listener_filters: inspectors(&chains),
                filter_chains: chains,
                continue_on_listener_filters_timeout: true,
                listener_filters_timeout: ctx.detection_timeout,
                // Istio's MAX_CONNECTIONS_PER_SOCKET_EVENT_LOOP default, on the
                // listeners that really accept from the kernel.
                max_connections_to_accept_per_socket_event: Some(UInt32Value { value: 1 }),
                ..Default::default()
            }
        })
        .collect()
}

/// The TLS and HTTP inspectors the chains need, each disabled on the ports that do not
/// need it (Istio's `populateListenerFilters`): a chain matching transport `tls` needs
/// the TLS inspector on its port, one matching `http/1.1` or `h2c` the HTTP inspector.
/// A chain without destination port speaks for every port no chain names (port 0).
fn inspectors(chains: &[FilterChain]) -> Vec<ListenerFilter> {
    // port -> (needs TLS, needs HTTP)
    let mut need: BTreeMap<u16, (bool, bool)> = BTreeMap::new();
    for c in chains {
        let m = c.filter_chain_match.clone().unwrap_or_default();
        let port = m
            .destination_port
            .and_then(|p| u16::try_from(p.value).ok())
            .unwrap_or(0);
        let e = need.entry(port).or_default();
        e.0 |= m.transport_protocol == TLS;
        e.1 |= m
            .application_protocols
            .iter()
            .any(|a| a == "http/1.1" || a == "h2c");
    }
    let mut out = Vec::new();
    if need.values().any(|n| n.0) {
        let by_default = need.get(&0).is_some_and(|n| n.0);
        // Enabled by default: disabled on the ports that do not need it; else enabled
        // only on the ports that do.
        let ports: Vec<u16> = need
            .iter()
            .filter(|(p, n)| **p != 0 && n.0 != by_default)
            .map(|(p, _)| *p)
            .collect();
        let predicate = match (ports.is_empty(), by_default) {
            (true, _) => None,
            (false, true) => Some(any_port(&ports)),
            (false, false) => Some(ListenerFilterChainMatchPredicate {
                rule: Some(Rule::NotMatch(Box::new(any_port(&ports)))),
            }),
        };
        out.push(ListenerFilter {
            filter_disabled: predicate,
            ..super::tls_inspector()
        });
    }
    if need.values().any(|n| n.1) {
        let off: Vec<u16> = need.iter().filter(|(_, n)| !n.1).map(|(p, _)| *p).collect();
        out.push(ListenerFilter {
            filter_disabled: (!off.is_empty()).then(|| any_port(&off)),
            ..super::http_inspector()
        });
    }
    out
}

/// A predicate true for a destination port in `ports`.
fn any_port(ports: &[u16]) -> ListenerFilterChainMatchPredicate {
    let port = |p: u16| ListenerFilterChainMatchPredicate {
        rule: Some(Rule::DestinationPortRange(Int32Range {
            start: i32::from(p),
            end: i32::from(p) + 1,
        })),
    };
    match ports {
        [one] => port(*one),
        many => ListenerFilterChainMatchPredicate {
            rule: Some(Rule::OrMatch(MatchSet {
                rules: many.iter().map(|p| port(*p)).collect(),
            })),
        },
    }
}

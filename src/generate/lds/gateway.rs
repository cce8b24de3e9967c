//! Gateway (router) listeners, built from the merged Gateways of the router
//! ([`crate::generate::merged_gateway::MergedGateway`]) the way Istio builds them
//! (`networking/core/gateway.go`).
//!
//! One listener per resolved port and bind, `<bind>_<port>` (`0.0.0.0_<port>` without
//! bind), bound, OUTBOUND. Its filter chains by server kind:
//! - HTTP / HTTP2 / GRPC: one chain, no match, a connection manager on RDS
//!   `http.<port>[.<bind>]`.
//! - HTTPS terminated (SIMPLE, MUTUAL, OPTIONAL_MUTUAL, ISTIO_MUTUAL): per server, SNI
//!   = the server's hosts (none for `*`), the server's TLS context, a connection
//!   manager on RDS `https.<port>.<portName>.<gateway>.<namespace>`.
//! - TLS terminated: the TLS context and a TCP proxy from the first VirtualService
//!   `tcp` route bound to the server.
//! - TCP: a TCP proxy from the first bound VirtualService `tcp` route; none, no chain.
//! - PASSTHROUGH: per VirtualService `tls` match bound to the server, SNI = its
//!   `sniHosts`, a TCP proxy; a repeated SNI on the same port and bind is dropped.
//! - AUTO_PASSTHROUGH: per in-mesh service port (and DestinationRule subset) whose
//!   host is covered by the server's hosts, SNI `outbound_.<port>_.<subset>_.<host>`,
//!   Istio's mTLS ALPNs, a TCP proxy to the SNI-DNAT cluster of that name.
//!
//! A listener without chains is not sent (Istio logs and omits it). `tls_inspector`
//! is added when a chain matches SNI or ALPN.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{
    TrafficDirection, TransportSocket, transport_socket,
};
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener,
};
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpFilter;
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{
    CertificateValidationContext, CommonTlsContext, DownstreamTlsContext, common_tls_context,
    tls_parameters,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration as PbDuration};
use meshfed_api::networking::v1alpha3::server_tls_settings::{TlSmode, TlsProtocol};
use meshfed_api::networking::v1alpha3::{
    L4MatchAttributes, ServerTlsSettings, TlsMatchAttributes, VirtualService,
};
use meshfed_registry::Protocol;

use super::hcm::{HCM_FILTER, HcmClass, HcmParts, HcmSettings};
use super::outbound::{rds_routes, routes_tcp_proxy, tcp_proxy_filter};
use super::{pack, socket};
use crate::generate::merged_gateway::{
    MergedGateway, MergedServer, ServerPort, passthrough_destinations,
};
use crate::generate::upstream_tls::{
    SDS_CA_SUFFIX, SDS_DEFAULT, SDS_ROOT, agent_sds, combined_validation, credential_sds,
    external_sds_cluster, san_matchers, server_cert_name, server_credential_sds, server_root_name,
};
use crate::model::ClientView;
use crate::push::cache::Findings;
use crate::push::config_index::{Config, host_matches};
use crate::push::snapshot::Snapshot;

/// ALPNs of every Istio mTLS flavour (AUTO_PASSTHROUGH chains match them all).
pub const ALL_ISTIO_MTLS_ALPNS: [&str; 5] = [
    "istio",
    "istio-peer-exchange",
    "istio-http/1.0",
    "istio-http/1.1",
    "istio-h2",
];

/// The authorization filters of a gateway: its AuthorizationPolicies and
/// RequestAuthentications, selected as a workload's are, by the router's namespace and
/// labels, in a sidecar's order (see [`super::InboundAuthz`]). Istio puts the HTTP ones
/// in every gateway connection manager before the router ([`gateway_hcm`]), and the
/// network ones before the terminal filter of every TCP chain (TCP and TLS servers,
/// PASSTHROUGH and AUTO_PASSTHROUGH chains alike).
fn router_authz(snapshot: &Snapshot, proxy: &ClientView) -> super::InboundAuthz {
    super::InboundAuthz::select(snapshot, &proxy.namespace, &proxy.labels, false)
}

/// Puts the network authorization filters before a TCP chain's filters (connection
/// managers got the HTTP ones when they were built).
fn apply_network_authz(authz: &super::InboundAuthz, chain: &mut ChainOpts) {
    if chain.filters.first().is_some_and(|f| f.name != HCM_FILTER) {
        chain.filters.splice(0..0, authz.network.iter().cloned());
    }
}

/// What one filter chain is made of before it becomes one.
struct ChainOpts {
    sni: Vec<String>,
    alpn: Vec<String>,
    tls: Option<DownstreamTlsContext>,
    filters: Vec<Filter>,
}

/// The listeners of a router.
pub(super) fn listeners(
    snapshot: &Snapshot,
    proxy: &ClientView,
    merged: &MergedGateway,
    found: &mut Findings,
) -> Vec<Listener> {
    // Listener name -> (port, bind, chains); several server ports (HTTPS and TLS on
    // 443) can share one listener.
    // In the order the ports were first merged.
    let mut by_name: Vec<(String, u16, String, Vec<ChainOpts>)> = Vec::new();
    // Passthrough SNI names already used per listener port (bind-aware).
    let mut shared = Passthrough {
        tls_hosts: HashMap::new(),
        found,
    };
    let authz = router_authz(snapshot, proxy);
    for port in &merged.ports {
        let bind = if port.bind.is_empty() {
            "0.0.0.0".to_string()
        } else {
            port.bind.clone()
        };
        let name = format!("{bind}_{}", port.number);
        let mut chains = port_chains(
            snapshot,
            proxy,
            merged,
            port,
            &name,
            &authz.http,
            &mut shared,
        );
        chains
            .iter_mut()
            .for_each(|c| apply_network_authz(&authz, c));
        match by_name.iter_mut().find(|(n, ..)| *n == name) {
            Some(entry) => entry.3.extend(chains),
            None => by_name.push((name, port.number, bind, chains)),
        }
    }
    by_name
        .into_iter()
        .filter(|(name, _, _, chains)| {
            if chains.is_empty() {
                tracing::debug!(listener = %name, router = %proxy.namespace, "gateway listener has no filter chain, not sent");
            }
            !chains.is_empty()
        })
        .map(|(name, port, bind, chains)| finish(name, &bind, port, chains))
        .collect()
}

/// What the PASSTHROUGH servers of one router share while their chains are built.
struct Passthrough<'a> {
    /// SNI names already used per listener port (bind-aware): port -> host -> bind.
    tls_hosts: HashMap<u16, HashMap<String, String>>,
    /// What was left out (TLS matches whose SNI names a port already routes).
    found: &'a mut Findings,
}

fn port_chains(
    snapshot: &Snapshot,
    proxy: &ClientView,
    merged: &MergedGateway,
    port: &ServerPort,
    listener: &str,
    http_authz: &[HttpFilter],
    shared: &mut Passthrough<'_>,
) -> Vec<ChainOpts> {
    let settings = HcmSettings::new(snapshot, proxy);
    let protocol = Protocol::parse(&port.protocol);
    if protocol.is_http() {
        let route = merged.by_port.get(port).map_or("", |(_, r)| r.as_str());
        return vec![ChainOpts {
            sni: Vec::new(),
            alpn: Vec::new(),
            tls: None,
            filters: vec![gateway_hcm(
                &settings,
                &format!("outbound_{listener};"),
                route,
                http_authz,
                protocol,
            )],
        }];
    }
    let mut out = Vec::new();
    for server in merged.port_servers(port) {
        let s = server.server();
        let tls = s.tls.as_ref();
        let passthrough = crate::generate::merged_gateway::is_passthrough(s);
        if server.protocol() == Protocol::Https && tls.is_some() && !passthrough {
            let stat_prefix = if s.name.is_empty() {
                format!("outbound_{listener};")
            } else {
                s.name.clone()
            };
            out.push(ChainOpts {
                sni: server.sni_hosts.clone(),
                alpn: Vec::new(),
                tls: tls.map(|t| downstream_tls(snapshot, t, false)),
                filters: vec![gateway_hcm(
                    &settings,
                    &stat_prefix,
                    &server.route_name,
                    http_authz,
                    server.protocol(),
                )],
            });
            continue;
        }
        match tls {
            None => match tcp_route_filter(snapshot, proxy, server) {
                Some(f) => out.push(ChainOpts {
                    sni: Vec::new(),
                    alpn: Vec::new(),
                    tls: None,
                    filters: vec![f],
                }),
                None => tracing::debug!(
                    gateway = %server.gateway_name(),
                    port = server.port(),
                    "TCP server without a matching VirtualService tcp route: no filter chain"
                ),
            },
            Some(t) if !passthrough => match tcp_route_filter(snapshot, proxy, server) {
                Some(f) => out.push(ChainOpts {
                    sni: server.sni_hosts.clone(),
                    alpn: Vec::new(),
                    tls: Some(downstream_tls(snapshot, t, true)),
                    filters: vec![f],
                }),
                None => tracing::debug!(
                    gateway = %server.gateway_name(),
                    port = server.port(),
                    "TLS server without a matching VirtualService tcp route: no filter chain"
                ),
            },
            Some(t) if t.mode() == TlSmode::AutoPassthrough => {
                out.extend(auto_passthrough_chains(snapshot, proxy, server));
            }
            Some(_) => out.extend(passthrough_chains(snapshot, proxy, server, port, shared)),
        }
    }
    out
}

/// The VirtualServices bound to a server's Gateway whose hosts meet the server's
/// (a `ns/host` server host only meets VirtualServices of `ns`).
fn bound_virtual_services<'a>(
    snapshot: &'a Snapshot,
    proxy: &'a ClientView,
    server: &MergedServer,
) -> Vec<&'a std::sync::Arc<Config<VirtualService>>> {
    let gateway = server.gateway_name();
    snapshot
        .config()
        .virtual_services(&proxy.namespace, &gateway)
        .filter(|vs| {
            server.hosts.iter().any(|gh| {
                let host = match gh.split_once('/') {
                    Some((ns, h)) if ns == vs.namespace => h,
                    Some(_) => return false,
                    None => gh.as_str(),
                };
                vs.spec
                    .hosts
                    .iter()
                    .any(|vh| host_matches(host, vh) || host_matches(vh, host))
            })
        })
        .collect()
}

fn l4_applies(port: u32, gateways: &[String], server: &MergedServer) -> bool {
    (port == 0 || port == u32::from(server.port()))
        && (gateways.is_empty() || gateways.iter().any(|g| *g == server.gateway_name()))
}

fn l4_match(m: &L4MatchAttributes, server: &MergedServer) -> bool {
    l4_applies(m.port, &m.gateways, server)
}

fn tls_match(m: &TlsMatchAttributes, server: &MergedServer) -> bool {
    l4_applies(m.port, &m.gateways, server)
}

/// The TCP proxy of the first bound VirtualService with a `tcp` route for the server.
fn tcp_route_filter(
    snapshot: &Snapshot,
    proxy: &ClientView,
    server: &MergedServer,
) -> Option<Filter> {
    for vs in bound_virtual_services(snapshot, proxy, server) {
        for tcp in &vs.spec.tcp {
            let applies = tcp.r#match.is_empty() || tcp.r#match.iter().any(|m| l4_match(m, server));
            if applies && !tcp.route.is_empty() {
                return Some(routes_tcp_proxy(
                    snapshot,
                    vs,
                    &tcp.route,
                    &vs.namespace,
                    server.port(),
                ));
            }
        }
    }
    None
}

/// One chain per VirtualService `tls` match bound to a PASSTHROUGH server.
fn passthrough_chains(
    snapshot: &Snapshot,
    proxy: &ClientView,
    server: &MergedServer,
    port: &ServerPort,
    state: &mut Passthrough<'_>,
) -> Vec<ChainOpts> {
    let mut out = Vec::new();
    let bind = &server.server().bind;
    for vs in bound_virtual_services(snapshot, proxy, server) {
        for tls in &vs.spec.tls {
            if tls.route.is_empty() {
                continue;
            }
            for m in tls.r#match.iter().filter(|m| tls_match(m, server)) {
                let known = state.tls_hosts.entry(port.number).or_default();
                let duplicates: Vec<&String> = m
                    .sni_hosts
                    .iter()
                    .filter(|h| known.get(*h) == Some(bind))
                    .collect();
                if !duplicates.is_empty() {
                    tracing::warn!(
                        virtual_service = %format!("{}/{}", vs.namespace, vs.name),
                        gateway = %server.gateway_name(),
                        port = port.number,
                        sni = ?duplicates,
                        "VirtualService tls match skipped: its SNI names are already routed on this gateway port"
                    );
                    *state
                        .found
                        .rejected
                        .entry(("gateway", server.gateway_name()))
                        .or_default() += 1;
                    continue;
                }
                for h in &m.sni_hosts {
                    known.insert(h.clone(), bind.clone());
                }
                out.push(ChainOpts {
                    sni: m.sni_hosts.clone(),
                    alpn: Vec::new(),
                    tls: None,
                    filters: vec![routes_tcp_proxy(
                        snapshot,
                        vs,
                        &tls.route,
                        &vs.namespace,
                        server.port(),
                    )],
                });
            }
        }
    }
    out
}

/// One chain per in-mesh service port (and subset) an AUTO_PASSTHROUGH server covers.
fn auto_passthrough_chains(
    snapshot: &Snapshot,
    proxy: &ClientView,
    server: &MergedServer,
) -> Vec<ChainOpts> {
    passthrough_destinations(snapshot, &proxy.namespace, &proxy.labels, &server.sni_hosts)
        .into_iter()
        .map(|d| {
            let name = d.name();
            ChainOpts {
                sni: vec![name.clone()],
                alpn: ALL_ISTIO_MTLS_ALPNS.iter().map(|s| s.to_string()).collect(),
                tls: None,
                filters: vec![tcp_proxy_filter(&name)],
            }
        })
        .collect()
}

/// The connection manager of a gateway chain on RDS table `route` (see
/// [`super::hcm`]: the gateway is the edge, client certificate details follow the
/// proxy's `gatewayTopology`), with the router's authorization filters before the
/// router.
fn gateway_hcm(
    settings: &HcmSettings,
    stat_prefix: &str,
    route: &str,
    authz: &[HttpFilter],
    protocol: Protocol,
) -> Filter {
    settings.filter(
        HcmClass::Gateway,
        HcmParts {
            stat_prefix: stat_prefix.to_string(),
            routes: rds_routes(route),
            authz,
            protocol,
        },
    )
}

/// Istio's `BuildListenerTLSContext` for a gateway server.
pub(crate) fn downstream_tls(
    snapshot: &Snapshot,
    t: &ServerTlsSettings,
    tcp_server: bool,
) -> DownstreamTlsContext {
    let mode = t.mode();
    let alpn: &[&str] = if mode == TlSmode::IstioMutual && tcp_server {
        &["istio-peer-exchange", "h2", "http/1.1"]
    } else {
        &["h2", "http/1.1"]
    };
    let mut common = CommonTlsContext {
        alpn_protocols: alpn.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let require_client = matches!(mode, TlSmode::Mutual | TlSmode::IstioMutual);
    let validate_client = require_client || mode == TlSmode::OptionalMutual;
    if mode == TlSmode::IstioMutual {
        common.tls_certificate_sds_secret_configs = vec![agent_sds(SDS_DEFAULT, true)];
        if validate_client {
            common.validation_context_type = Some(combined_validation(
                san_matchers(&t.subject_alt_names),
                None,
                agent_sds(SDS_ROOT, true),
            ));
        }
    } else if !t.credential_name.is_empty() {
        let external = external_sds_cluster(snapshot, &t.credential_name);
        common.tls_certificate_sds_secret_configs = vec![server_credential_sds(
            &t.credential_name,
            external.as_deref(),
        )];
        if matches!(mode, TlSmode::Mutual | TlSmode::OptionalMutual) {
            let mut validation = CertificateValidationContext {
                match_typed_subject_alt_names: san_matchers(&t.subject_alt_names),
                verify_certificate_spki: t.verify_certificate_spki.clone(),
                verify_certificate_hash: t.verify_certificate_hash.clone(),
                ..Default::default()
            };
            let ca = credential_sds(&format!("{}{SDS_CA_SUFFIX}", t.credential_name));
            common.validation_context_type = Some(
                common_tls_context::ValidationContextType::CombinedValidationContext(
                    common_tls_context::CombinedCertificateValidationContext {
                        default_validation_context: Some(std::mem::take(&mut validation)),
                        validation_context_sds_secret_config: Some(ca),
                        ..Default::default()
                    },
                ),
            );
        } else if !t.subject_alt_names.is_empty() {
            common.validation_context_type = Some(
                common_tls_context::ValidationContextType::ValidationContext(
                    CertificateValidationContext {
                        match_typed_subject_alt_names: san_matchers(&t.subject_alt_names),
                        ..Default::default()
                    },
                ),
            );
        }
    } else {
        // Certificates mounted in the gateway pod, served by its agent over SDS.
        let cert = server_cert_name(&t.server_certificate, &t.private_key);
        common.tls_certificate_sds_secret_configs = vec![agent_sds(&cert, cert == SDS_DEFAULT)];
        if validate_client {
            let root = server_root_name(&t.ca_certificates);
            common.validation_context_type = Some(combined_validation(
                san_matchers(&t.subject_alt_names),
                None,
                agent_sds(&root, root == SDS_ROOT),
            ));
        }
    }
    if matches!(
        mode,
        TlSmode::Simple | TlSmode::Mutual | TlSmode::OptionalMutual
    ) {
        apply_tls_params(snapshot, t, &mut common);
    }
    DownstreamTlsContext {
        common_tls_context: Some(common),
        require_client_certificate: Some(BoolValue {
            value: require_client,
        }),
        ..Default::default()
    }
}

/// Mesh `tlsDefaults`, then the server's versions and ciphers.
fn apply_tls_params(snapshot: &Snapshot, t: &ServerTlsSettings, common: &mut CommonTlsContext) {
    let mut params = common.tls_params.clone().unwrap_or_default();
    let mut set = false;
    if let Some(d) = &snapshot.mesh().config.tls_defaults {
        if !d.ecdh_curves.is_empty() {
            params.ecdh_curves = d.ecdh_curves.clone();
            set = true;
        }
        if !d.cipher_suites.is_empty() {
            params.cipher_suites = d.cipher_suites.clone();
            set = true;
        }
        // Mesh TLSV1_2 = 1, TLSV1_3 = 2; Envoy's enum counts TLSv1_0 = 1.
        match d.min_protocol_version {
            1 => {
                params.tls_minimum_protocol_version = tls_parameters::TlsProtocol::TlSv12 as i32;
                set = true;
            }
            2 => {
                params.tls_minimum_protocol_version = tls_parameters::TlsProtocol::TlSv13 as i32;
                set = true;
            }
            _ => {}
        }
    }
    let version = |v: TlsProtocol| match v {
        TlsProtocol::TlsAuto => tls_parameters::TlsProtocol::TlsAuto,
        TlsProtocol::Tlsv10 => tls_parameters::TlsProtocol::TlSv10,
        TlsProtocol::Tlsv11 => tls_parameters::TlsProtocol::TlSv11,
        TlsProtocol::Tlsv12 => tls_parameters::TlsProtocol::TlSv12,
        TlsProtocol::Tlsv13 => tls_parameters::TlsProtocol::TlSv13,
    } as i32;
    if t.min_protocol_version() != TlsProtocol::TlsAuto {
        params.tls_minimum_protocol_version = version(t.min_protocol_version());
        set = true;
    }
    if !t.cipher_suites.is_empty() {
        params.cipher_suites = t.cipher_suites.clone();
        set = true;
    }
    if t.max_protocol_version() != TlsProtocol::TlsAuto {
        params.tls_maximum_protocol_version = version(t.max_protocol_version());
        set = true;
    }
    if set {
        common.tls_params = Some(params);
    }
}

fn finish(name: String, bind: &str, port: u16, chains: Vec<ChainOpts>) -> Listener {
    let needs_inspector = chains
        .iter()
        .any(|c| !c.sni.is_empty() || !c.alpn.is_empty());
    let filter_chains = chains
        .into_iter()
        .map(|c| {
            let server_names = if c.sni.iter().any(|h| h == "*") {
                Vec::new()
            } else {
                c.sni
            };
            let matched = !server_names.is_empty() || !c.alpn.is_empty();
            FilterChain {
                filter_chain_match: matched.then(|| FilterChainMatch {
                    server_names,
                    application_protocols: c.alpn,
                    ..Default::default()
                }),
                filters: c.filters,
                transport_socket: c.tls.map(|ctx| TransportSocket {
                    name: "envoy.transport_sockets.tls".into(),
                    config_type: Some(transport_socket::ConfigType::TypedConfig(pack(&ctx))),
                }),
                ..Default::default()
            }
        })
        .collect();
    Listener {
        name,
        address: Some(socket(bind, port)),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains,
        listener_filters: if needs_inspector {
            vec![super::tls_inspector()]
        } else {
            Vec::new()
        },
        // A gateway waits for the TLS handshake as long as it takes (Istio: no
        // listener filter timeout, and no giving up on the inspector).
        listener_filters_timeout: Some(PbDuration::default()),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::config::listener::v3::{Listener, filter};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use meshfed_api::networking::v1alpha3::{Gateway, Port as GwPort, Server, ServerTlsSettings};
    use meshfed_api::security::v1beta1 as sec;
    use meshfed_api::r#type::v1beta1::WorkloadSelector;
    use meshfed_registry::Protocol;
    use prost::Message;

    use super::super::gateway_listeners;
    use super::super::tests::{default_mesh, proxy, service, snapshot};
    use super::*;
    use crate::push::config_index::ConfigSet;

    fn config<T>(name: &str, namespace: &str, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: namespace.into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: std::time::UNIX_EPOCH,
            spec,
        }
    }

    /// A gateway with an HTTP server on 80 and an AUTO_PASSTHROUGH one on 15443, a
    /// DENY and a CUSTOM policy (ext_authz provider `authz`, gRPC) selecting
    /// `istio: ingressgateway`, and a policy selecting something else.
    fn setup() -> Snapshot {
        let server = |number: u32, protocol: &str, tls: Option<ServerTlsSettings>| Server {
            port: Some(GwPort {
                number,
                protocol: protocol.into(),
                name: format!("p{number}"),
                ..Default::default()
            }),
            hosts: vec!["*.local".into()],
            tls,
            ..Default::default()
        };
        let gw = Gateway {
            selector: [("gw".to_string(), "yes".to_string())].into(),
            servers: vec![
                server(80, "HTTP", None),
                server(
                    15443,
                    "TLS",
                    Some(ServerTlsSettings {
                        mode: TlSmode::AutoPassthrough as i32,
                        ..Default::default()
                    }),
                ),
            ],
        };
        let policy =
            |name: &str, action: sec::authorization_policy::Action, key: &str, value: &str| {
                config(
                    name,
                    "istio-system",
                    sec::AuthorizationPolicy {
                        selector: Some(WorkloadSelector {
                            match_labels: [(key.to_string(), value.to_string())].into(),
                        }),
                        action: action as i32,
                        action_detail: (action == sec::authorization_policy::Action::Custom).then(
                            || {
                                sec::authorization_policy::ActionDetail::Provider(
                                    sec::authorization_policy::ExtensionProvider {
                                        name: "authz".into(),
                                    },
                                )
                            },
                        ),
                        rules: vec![sec::Rule {
                            from: vec![sec::rule::From {
                                source: Some(sec::Source {
                                    ip_blocks: vec!["10.1.0.0/16".into()],
                                    ..Default::default()
                                }),
                            }],
                            ..Default::default()
                        }],
                        ..Default::default()
                    },
                )
            };
        let set = ConfigSet {
            gateways: vec![config("gw", "istio-system", gw)],
            authorization_policies: vec![
                policy(
                    "deny",
                    sec::authorization_policy::Action::Deny,
                    "istio",
                    "ingressgateway",
                ),
                policy(
                    "ext",
                    sec::authorization_policy::Action::Custom,
                    "istio",
                    "ingressgateway",
                ),
                policy(
                    "other",
                    sec::authorization_policy::Action::Allow,
                    "app",
                    "x",
                ),
            ],
            request_authentications: vec![Config {
                name: "jwt".into(),
                namespace: "istio-system".into(),
                labels: Default::default(),
                annotations: Default::default(),
                creation_time: std::time::UNIX_EPOCH,
                spec: sec::RequestAuthentication {
                    selector: Some(meshfed_api::r#type::v1beta1::WorkloadSelector {
                        match_labels: [("istio".to_string(), "ingressgateway".to_string())].into(),
                    }),
                    jwt_rules: vec![sec::JwtRule {
                        issuer: "https://issuer.example.com".into(),
                        jwks: r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#.into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                },
            }],
            ..Default::default()
        };
        let mut mesh = default_mesh();
        mesh.config.extension_providers = serde_json::from_value(serde_json::json!([
            {"name": "authz", "envoyExtAuthzGrpc": {"service": "authz.default.svc.cluster.local", "port": 9000}}
        ]))
        .expect("providers");
        let services = vec![
            service(
                "backend.default.svc.cluster.local",
                "default",
                "10.0.0.20",
                &[("http", 8080, Protocol::Http)],
            ),
            service(
                "authz.default.svc.cluster.local",
                "default",
                "10.0.0.21",
                &[("grpc", 9000, Protocol::Grpc)],
            ),
        ];
        snapshot(services, set, mesh)
    }

    fn chain_filters(l: &Listener) -> Vec<Vec<String>> {
        l.filter_chains
            .iter()
            .map(|c| {
                let mut names = Vec::new();
                for f in &c.filters {
                    names.push(f.name.clone());
                    if f.name == HCM_FILTER
                        && let Some(filter::ConfigType::TypedConfig(any)) = &f.config_type
                    {
                        let hcm = HttpConnectionManager::decode(any.value.as_slice()).unwrap();
                        names.extend(
                            hcm.http_filters
                                .into_iter()
                                .map(|h| format!("  {}", h.name)),
                        );
                    }
                }
                names
            })
            .collect()
    }

    #[test]
    fn policies_selecting_a_gateway_put_rbac_and_ext_authz_on_all_its_chains() {
        let snap = setup();
        let router = proxy(
            "router~10.0.0.9~gw.istio-system~istio-system.svc.cluster.local",
            serde_json::json!({"gw": "yes", "istio": "ingressgateway"}),
        );
        let listeners = gateway_listeners(&snap, &router.client_view(), &[]);
        let by_name = |n: &str| listeners.iter().find(|l| l.name == n).expect(n);
        assert_eq!(
            chain_filters(by_name("0.0.0.0_80")),
            vec![vec![
                "envoy.filters.network.http_connection_manager",
                "  envoy.filters.http.rbac",
                "  envoy.filters.http.ext_authz",
                "  envoy.filters.http.jwt_authn",
                "  envoy.filters.http.rbac",
                "  envoy.filters.http.grpc_stats",
                "  istio.alpn",
                "  envoy.filters.http.fault",
                "  envoy.filters.http.cors",
                "  envoy.filters.http.router",
            ]]
        );
        let passthrough = chain_filters(by_name("0.0.0.0_15443"));
        assert!(!passthrough.is_empty());
        for chain in passthrough {
            assert_eq!(
                chain,
                vec![
                    "envoy.filters.network.rbac",
                    "envoy.filters.network.ext_authz",
                    "envoy.filters.network.rbac",
                    "envoy.filters.network.tcp_proxy",
                ]
            );
        }
        // The ext_authz filter calls the provider's outbound cluster.
        let hcm_any = match &by_name("0.0.0.0_80").filter_chains[0].filters[0].config_type {
            Some(filter::ConfigType::TypedConfig(any)) => any.clone(),
            _ => panic!("typed"),
        };
        let hcm = HttpConnectionManager::decode(hcm_any.value.as_slice()).unwrap();
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(ext)) =
            &hcm.http_filters[1].config_type
        else {
            panic!("typed")
        };
        let ext =
            envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ExtAuthz::decode(
                ext.value.as_slice(),
            )
            .unwrap();
        let Some(envoy_types::pb::envoy::extensions::filters::http::ext_authz::v3::ext_authz::Services::GrpcService(g)) = ext.services else {
            panic!("grpc service")
        };
        let Some(
            envoy_types::pb::envoy::config::core::v3::grpc_service::TargetSpecifier::EnvoyGrpc(e),
        ) = g.target_specifier
        else {
            panic!("envoy grpc")
        };
        assert_eq!(
            e.cluster_name,
            "outbound|9000||authz.default.svc.cluster.local"
        );
        // A gateway's jwt_authn clears the route cache: routes may match the claims.
        let Some(envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_filter::ConfigType::TypedConfig(jwt)) =
            &hcm.http_filters[2].config_type
        else {
            panic!("typed")
        };
        let jwt = envoy_types::pb::envoy::extensions::filters::http::jwt_authn::v3::JwtAuthentication::decode(
            jwt.value.as_slice(),
        )
        .unwrap();
        assert!(jwt.providers["origins-0"].clear_route_cache);
    }

    #[test]
    fn policies_not_selecting_a_gateway_leave_its_chains_alone() {
        let snap = setup();
        let router = proxy(
            "router~10.0.0.9~gw.istio-system~istio-system.svc.cluster.local",
            serde_json::json!({"gw": "yes", "istio": "egressgateway"}),
        );
        let listeners = gateway_listeners(&snap, &router.client_view(), &[]);
        assert_eq!(listeners.len(), 2, "the Gateway selects this router too");
        for l in &listeners {
            for chain in chain_filters(l) {
                assert!(
                    chain
                        .iter()
                        .all(|n| !n.contains("rbac") && !n.contains("ext_authz")),
                    "{chain:?}"
                );
            }
        }
    }
}

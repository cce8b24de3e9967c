//! The Gateways of one router merged into one logical gateway, as Istio merges them
//! (`model/gateway.go` `mergeGateways`, `push_context.go` gateway selection): which
//! servers listen on which port and bind, under which route table, and which servers
//! lose a conflict. LDS builds its listeners from this, RDS finds the servers behind a
//! route name with it, CDS knows from it whether the router needs SNI-DNAT clusters.
//!
//! Selection: a Gateway applies to a router when its `selector` is a subset of the
//! router's labels (an empty selector applies to every router), or, for a Gateway
//! carrying `internal.istio.io/gateway-service` (generated from Gateway API objects),
//! when the router serves one of the named services in the Gateway's namespace.
//!
//! Port resolution: a server port is translated to the target port of the first
//! service port of the router with that number (services labelled
//! `experimental.istio.io/disable-gateway-port-translation` are skipped); without one
//! the port is used as is. A gateway-service Gateway listens only on the target ports
//! of its services' matching ports (none: the server is a no-op).
//!
//! Merge, in Gateway order (oldest first, then namespace and name), first wins:
//! - a TLS server naming a host already taken by a TLS server on the same resolved
//!   port and bind is dropped;
//! - on a port that has a plaintext server, a server joins only when both are HTTP
//!   family (or the binds differ), else it is dropped;
//! - on a port that has TLS servers, an HTTPS server needs its own route name, and a
//!   server without TLS settings is dropped unless its bind is new.
//!
//! Dropped servers are logged and listed in [`MergedGateway::rejected`]; the router's
//! listeners report them (`pilot_total_rejected_configs`, see
//! [`crate::push::cache::Findings`]).

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;
use meshfed_api::networking::v1alpha3::{Gateway, Server};
use meshfed_registry::Protocol;

use super::instances::proxy_instances;
use crate::model::Proxy;
use crate::push::config_index::Config;
use crate::push::snapshot::Snapshot;

/// Annotation of Gateways generated from Gateway API objects: the comma-separated
/// hostnames of the services whose workloads implement the Gateway.
pub const GATEWAY_SERVICE_ANNOTATION: &str = "internal.istio.io/gateway-service";
/// Service label turning off the translation of server ports to target ports.
pub const DISABLE_PORT_TRANSLATION_LABEL: &str =
    "experimental.istio.io/disable-gateway-port-translation";

/// One service port served by the router's workload (a "service target").
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct GatewayTarget {
    pub hostname: String,
    pub namespace: String,
    /// The service port.
    pub port: u16,
    /// The port the workload listens on.
    pub target_port: u16,
    /// The service opts out of port translation.
    pub no_translation: bool,
}

/// The service ports the router's workload serves.
pub fn gateway_targets(snapshot: &Snapshot, proxy: &Proxy) -> Vec<GatewayTarget> {
    proxy_instances(snapshot, proxy)
        .into_iter()
        .map(|i| GatewayTarget {
            hostname: i.service.hostname.as_str().to_string(),
            namespace: i.service.namespace.as_str().to_string(),
            port: i.port.port.get(),
            target_port: i.target_port,
            no_translation: i
                .service
                .labels
                .contains_key(DISABLE_PORT_TRANSLATION_LABEL),
        })
        .collect()
}

/// The port a group of servers listens on.
#[derive(Clone, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
pub struct ServerPort {
    /// The resolved (target) port.
    pub number: u16,
    /// The protocol as the first server of the group spells it.
    pub protocol: String,
    /// The server `bind`, empty for the wildcard.
    pub bind: String,
}

/// One server of one Gateway as merged.
#[derive(Clone, Debug)]
pub struct MergedServer {
    pub gateway: Arc<Config<Gateway>>,
    /// Index in the Gateway's `servers`.
    pub index: usize,
    /// The hosts with `./h` made `<gatewayNs>/h`, `*/h` made `h` and `*/*` made `*`.
    pub hosts: Vec<String>,
    /// For servers with TLS settings: the hosts without namespace, deduplicated and
    /// sorted (the SNI names of the server's filter chain).
    pub sni_hosts: Vec<String>,
    /// The route table (HTTP family, terminated HTTPS), else empty.
    pub route_name: String,
}

impl MergedServer {
    pub fn server(&self) -> &Server {
        &self.gateway.spec.servers[self.index]
    }

    /// `<namespace>/<name>` of the Gateway, as VirtualServices name it.
    pub fn gateway_name(&self) -> String {
        format!("{}/{}", self.gateway.namespace, self.gateway.name)
    }

    /// The server's own port number (not the resolved one).
    pub fn port(&self) -> u16 {
        self.server()
            .port
            .as_ref()
            .and_then(|p| u16::try_from(p.number).ok())
            .unwrap_or(0)
    }

    pub fn protocol(&self) -> Protocol {
        Protocol::parse(
            self.server()
                .port
                .as_ref()
                .map_or("", |p| p.protocol.as_str()),
        )
    }

    pub fn tls_mode(&self) -> Option<TlSmode> {
        self.server().tls.as_ref().map(|t| t.mode())
    }
}

/// A server that lost the merge, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejected {
    /// `<namespace>/<name>` of the Gateway.
    pub gateway: String,
    /// The server's index in the Gateway.
    pub server: usize,
    pub reason: String,
}

/// The Gateways of one router, merged.
#[derive(Clone, Debug, Default)]
pub struct MergedGateway {
    /// Every merged server; the maps below index into it.
    pub servers: Vec<MergedServer>,
    /// The listening ports, in the order they were first seen.
    pub ports: Vec<ServerPort>,
    /// The servers of each port, and the route table of a plaintext HTTP port.
    pub by_port: HashMap<ServerPort, (Vec<usize>, String)>,
    /// The servers behind each route table.
    pub by_route: BTreeMap<String, Vec<usize>>,
    /// Hosts of `AUTO_PASSTHROUGH` servers (the router needs SNI-DNAT clusters).
    pub auto_passthrough_hosts: BTreeSet<String>,
    pub rejected: Vec<Rejected>,
}

/// `http.<port>[.<bind>]` for HTTP-family servers (resolved port),
/// `https.<serverPort>.<portName>.<gateway>.<namespace>[.<bind>]` for HTTPS servers
/// that terminate TLS, else empty.
pub fn route_name(server: &Server, resolved: u16, gateway: &Config<Gateway>) -> String {
    let Some(port) = server.port.as_ref() else {
        return String::new();
    };
    let bind = if server.bind.is_empty() {
        String::new()
    } else {
        format!(".{}", server.bind)
    };
    let protocol = Protocol::parse(&port.protocol);
    if protocol.is_http() {
        return format!("http.{resolved}{bind}");
    }
    if protocol == Protocol::Https && server.tls.is_some() && !is_passthrough(server) {
        return format!(
            "https.{}.{}.{}.{}{bind}",
            port.number, port.name, gateway.name, gateway.namespace
        );
    }
    String::new()
}

/// TLS passed through untouched (`PASSTHROUGH`, `AUTO_PASSTHROUGH`).
pub fn is_passthrough(server: &Server) -> bool {
    server
        .tls
        .as_ref()
        .is_some_and(|t| matches!(t.mode(), TlSmode::Passthrough | TlSmode::AutoPassthrough))
}

/// Non-HTTP with TLS settings.
fn is_tls_server(server: &Server) -> bool {
    server.tls.is_some() && !server_protocol(server).is_http()
}

/// HTTP family, or HTTPS that terminates TLS.
pub fn is_http_server(server: &Server) -> bool {
    let p = server_protocol(server);
    p.is_http() || (p == Protocol::Https && server.tls.is_some() && !is_passthrough(server))
}

fn server_protocol(server: &Server) -> Protocol {
    Protocol::parse(server.port.as_ref().map_or("", |p| p.protocol.as_str()))
}

fn sanitize_hosts(hosts: &[String], namespace: &str) -> Vec<String> {
    let mut out = Vec::with_capacity(hosts.len());
    for h in hosts {
        match h.split_once('/') {
            Some((".", host)) => out.push(format!("{namespace}/{host}")),
            Some(("*", "*")) => return vec!["*".to_string()],
            Some(("*", host)) => out.push(host.to_string()),
            _ => out.push(h.clone()),
        }
    }
    out
}

fn sni_hosts(hosts: &[String]) -> Vec<String> {
    let set: BTreeSet<String> = hosts
        .iter()
        .map(|h| h.split_once('/').map_or(h.as_str(), |(_, h)| h).to_string())
        .collect();
    set.into_iter().collect()
}

/// A Gateway applying to a router, the service targets it translates ports with, and
/// whether it was selected by labels (legacy) rather than by service.
type SelectedGateway<'a> = (&'a Arc<Config<Gateway>>, Vec<&'a GatewayTarget>, bool);

/// The Gateways that apply to a router with these labels and service targets, each
/// with the targets it may translate ports with and whether it is selected by labels.
fn selected<'a>(
    snapshot: &'a Snapshot,
    labels: &BTreeMap<String, String>,
    targets: &'a [GatewayTarget],
) -> Vec<SelectedGateway<'a>> {
    let mut out = Vec::new();
    for gateway in snapshot.config().gateways() {
        if let Some(services) = gateway.annotations.get(GATEWAY_SERVICE_ANNOTATION) {
            let known: HashSet<&str> = services.split(',').map(str::trim).collect();
            let matching: Vec<&GatewayTarget> = targets
                .iter()
                .filter(|t| known.contains(t.hostname.as_str()) && t.namespace == gateway.namespace)
                .collect();
            if !matching.is_empty() {
                out.push((gateway, matching, false));
            }
        } else if gateway
            .spec
            .selector
            .iter()
            .all(|(k, v)| labels.get(k) == Some(v))
        {
            out.push((gateway, targets.iter().collect(), true));
        }
    }
    out
}

/// The ports a server port listens on.
fn resolve_ports(number: u16, targets: &[&GatewayTarget], legacy: bool) -> Vec<u16> {
    let mut out: Vec<u16> = Vec::new();
    for t in targets {
        if t.no_translation && legacy {
            continue;
        }
        if t.port == number {
            if legacy {
                return vec![t.target_port];
            }
            if !out.contains(&t.target_port) {
                out.push(t.target_port);
            }
        }
    }
    if out.is_empty() && legacy {
        return vec![number];
    }
    out.sort_unstable();
    out
}

fn can_merge(current: Protocol, new: Protocol) -> bool {
    (current.is_http() || current == new) && new.is_http()
}

impl MergedGateway {
    /// Merges the Gateways applying to a router with `labels` serving `targets`.
    pub fn build(
        snapshot: &Snapshot,
        labels: &BTreeMap<String, String>,
        targets: &[GatewayTarget],
    ) -> MergedGateway {
        let mut m = MergedGateway::default();
        let mut gateway_ports: HashSet<u16> = HashSet::new();
        let mut plaintext: HashMap<u16, ServerPort> = HashMap::new();
        let mut non_plaintext_binds: HashMap<u16, HashSet<String>> = HashMap::new();
        // resolved port -> host -> bind
        let mut tls_hosts: HashMap<u16, HashMap<String, String>> = HashMap::new();

        for (gateway, gw_targets, legacy) in selected(snapshot, labels, targets) {
            let gateway_name = format!("{}/{}", gateway.namespace, gateway.name);
            for (index, s) in gateway.spec.servers.iter().enumerate() {
                let reject = |m: &mut MergedGateway, reason: String| {
                    tracing::debug!(gateway = %gateway_name, server = index, %reason, "gateway server skipped");
                    m.rejected.push(Rejected {
                        gateway: gateway_name.clone(),
                        server: index,
                        reason,
                    });
                };
                let Some(port) = s.port.as_ref() else {
                    reject(&mut m, "server without port".into());
                    continue;
                };
                let Ok(number) = u16::try_from(port.number) else {
                    reject(&mut m, format!("port {} out of range", port.number));
                    continue;
                };
                let hosts = sanitize_hosts(&s.hosts, &gateway.namespace);
                let protocol = Protocol::parse(&port.protocol);
                for resolved in resolve_ports(number, &gw_targets, legacy) {
                    let route = route_name(s, resolved, gateway);
                    if s.tls.is_some() {
                        let known = tls_hosts.entry(resolved).or_default();
                        let duplicates: Vec<&String> = hosts
                            .iter()
                            .filter(|h| known.get(*h) == Some(&s.bind))
                            .collect();
                        if !duplicates.is_empty() {
                            let list: Vec<&str> = duplicates.iter().map(|h| h.as_str()).collect();
                            reject(
                                &mut m,
                                format!(
                                    "duplicate TLS host {} on port {resolved}",
                                    list.join(", ")
                                ),
                            );
                            continue;
                        }
                        for h in &hosts {
                            known.insert(h.clone(), s.bind.clone());
                        }
                        if s.tls
                            .as_ref()
                            .is_some_and(|t| t.mode() == TlSmode::AutoPassthrough)
                        {
                            m.auto_passthrough_hosts.extend(sni_hosts(&hosts));
                        }
                    }
                    let server_port = ServerPort {
                        number: resolved,
                        protocol: port.protocol.clone(),
                        bind: s.bind.clone(),
                    };
                    let merged = MergedServer {
                        gateway: gateway.clone(),
                        index,
                        hosts: hosts.clone(),
                        sni_hosts: if s.tls.is_some() {
                            sni_hosts(&hosts)
                        } else {
                            Vec::new()
                        },
                        route_name: route.clone(),
                    };
                    if gateway_ports.contains(&resolved) {
                        if let Some(current) = plaintext.get(&resolved).cloned() {
                            let same_bind = current.bind == server_port.bind;
                            if !can_merge(Protocol::parse(&current.protocol), protocol) && same_bind
                            {
                                reject(
                                    &mut m,
                                    format!(
                                        "port {resolved} already serves {} from an earlier server",
                                        current.protocol
                                    ),
                                );
                                continue;
                            }
                            if route.is_empty() && same_bind {
                                reject(
                                    &mut m,
                                    format!(
                                        "port {resolved} is already taken by an earlier server"
                                    ),
                                );
                                continue;
                            }
                            let id = m.push(merged);
                            let key = if same_bind { current } else { server_port };
                            if !m.by_port.contains_key(&key) {
                                m.ports.push(key.clone());
                            }
                            let entry = m.by_port.entry(key).or_default();
                            entry.0.push(id);
                            if !same_bind {
                                entry.1 = route.clone();
                            }
                            m.by_route.entry(route).or_default().push(id);
                        } else {
                            if is_http_server(s)
                                && (route.is_empty() || m.by_route.contains_key(&route))
                            {
                                {
                                    reject(
                                        &mut m,
                                        format!(
                                            "route name {route:?} is not unique on port {resolved}"
                                        ),
                                    );
                                    continue;
                                }
                            }
                            let new_bind = non_plaintext_binds
                                .entry(resolved)
                                .or_default()
                                .insert(server_port.bind.clone());
                            if s.tls.is_none() && !new_bind {
                                reject(
                                    &mut m,
                                    format!("server without TLS settings on TLS port {resolved}"),
                                );
                                continue;
                            }
                            let id = m.push(merged);
                            if is_http_server(s) {
                                m.by_route.insert(route, vec![id]);
                            }
                            if !m.by_port.contains_key(&server_port) {
                                m.ports.push(server_port.clone());
                            }
                            m.by_port.entry(server_port).or_default().0.push(id);
                        }
                    } else {
                        gateway_ports.insert(resolved);
                        if !is_tls_server(s) {
                            plaintext.insert(resolved, server_port.clone());
                        }
                        let id = m.push(merged);
                        if is_http_server(s) {
                            m.by_route.insert(route.clone(), vec![id]);
                        }
                        m.ports.push(server_port.clone());
                        m.by_port.insert(server_port, (vec![id], route));
                    }
                }
            }
        }
        m
    }

    fn push(&mut self, server: MergedServer) -> usize {
        self.servers.push(server);
        self.servers.len() - 1
    }

    /// The servers behind route table `name`.
    pub fn route_servers(&self, name: &str) -> impl Iterator<Item = &MergedServer> {
        self.by_route
            .get(name)
            .into_iter()
            .flatten()
            .map(|i| &self.servers[*i])
    }

    /// The servers of a listening port.
    pub fn port_servers(&self, port: &ServerPort) -> impl Iterator<Item = &MergedServer> {
        self.by_port
            .get(port)
            .into_iter()
            .flat_map(|(ids, _)| ids)
            .map(|i| &self.servers[*i])
    }
}

/// One SNI-DNAT destination of an AUTO_PASSTHROUGH server: a port (not UDP) of an
/// in-mesh service, plain or for one subset of its DestinationRule.
pub struct PassthroughDestination<'a> {
    pub service: &'a Arc<meshfed_registry::Service>,
    pub port: &'a meshfed_registry::Port,
    pub subset: &'a str,
}

impl PassthroughDestination<'_> {
    /// `outbound_.<port>_.<subset>_.<host>`: the SNI and the cluster name.
    pub fn name(&self) -> String {
        crate::xds::names::sni_name(
            self.port.port.get(),
            self.subset,
            self.service.hostname.as_str(),
        )
    }
}

/// The SNI-DNAT destinations a router in `namespace` with `labels` reaches through
/// AUTO_PASSTHROUGH servers for `hosts`: each in-mesh service it sees (first per
/// hostname) whose hostname a host covers, each port but UDP, plain and per subset.
pub fn passthrough_destinations<'a>(
    snapshot: &'a Snapshot,
    namespace: &'a str,
    labels: &'a BTreeMap<String, String>,
    hosts: &[String],
) -> Vec<PassthroughDestination<'a>> {
    let mut out = Vec::new();
    let mut seen: HashSet<&str> = HashSet::new();
    for service in snapshot.visible_services(namespace, labels) {
        let host = service.hostname.as_str();
        if service.location == meshfed_registry::MeshLocation::MeshExternal
            || !seen.insert(host)
            || !hosts
                .iter()
                .any(|h| crate::push::config_index::host_matches(h, host))
        {
            continue;
        }
        let rule = snapshot
            .config()
            .destination_rule(namespace, service.namespace.as_str(), host);
        let subsets: Vec<&str> = std::iter::once("")
            .chain(
                rule.into_iter()
                    .flat_map(|r| r.spec.subsets.iter().map(|s| s.name.as_str())),
            )
            .collect();
        for port in service.ports.iter().filter(|p| p.protocol != Protocol::Udp) {
            for subset in &subsets {
                out.push(PassthroughDestination {
                    service,
                    port,
                    subset,
                });
            }
        }
    }
    out
}

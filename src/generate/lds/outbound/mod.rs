//! Sidecar outbound listeners, built the way Istio builds them.
//!
//! - `virtualOutbound` (15001) takes redirected traffic; a chain matching destination
//!   port 15001 itself goes to `BlackHoleCluster` (a connection addressed to the
//!   capture port would otherwise loop), everything else to the catch-all: the egress
//!   proxy or `PassthroughCluster` (ALLOW_ANY), `BlackHoleCluster` (REGISTRY_ONLY).
//! - One listener per (bind, port), named `<bind>_<port>`, never bound. A service
//!   port's class decides its bind and chains:
//!   - HTTP (HTTP, HTTP2, HTTP_PROXY, GRPC, GRPC-Web): bind `0.0.0.0`, one connection
//!     manager on RDS `<port>` matching ALPN `http/1.1`/`h2c` over `raw_buffer`; the
//!     listener is then sniffed and anything else falls through to the passthrough
//!     default chain.
//!   - TCP (TCP, HTTPS, TLS, Mongo, Redis, MySQL): bind the service VIP in the proxy's
//!     cluster, else `0.0.0.0`; TCP proxy chains from the VirtualService `tcp` routes
//!     (HTTPS/TLS: per-SNI chains from `tls` routes, and an SNI chain for the host when
//!     the service has no VIP), else one chain to `outbound|<port>||<host>`.
//!   - Auto (protocol unset or unknown): bound like TCP, TCP chains plus a sniffed
//!     connection manager chain.
//! - Several services on one (bind, port) merge as in Istio: HTTP and TCP mixed become
//!   sniffed, TCP chains with the same match keep the first service (oldest first) and
//!   the later one is dropped (counted by listener in Istio's gauge
//!   `pilot_conflict_outbound_listener_tcp_over_current_tcp`), Auto replaces an HTTP entry
//!   on a specific bind (a wildcard HTTP entry is sniffed already and keeps its place).
//! - Finishing: `tls_inspector` when a chain matches SNI or ALPN, then `http_inspector`
//!   when one matches ALPN; a match-all chain becomes `default_filter_chain` (or stays
//!   the only chain), otherwise `PassthroughFilterChain` is the default.
//!
//! A service whose addresses are CIDRs (ServiceEntry `10.0.0.0/16`) and no VIP is bound
//! on the wildcard with those prefixes as its chains' match; services with overlapping
//! ranges keep one chain each (Envoy picks the longest prefix).
//!
//! Sidecar egress listeners, in order: one with a `port` gives every service of its
//! `hosts` a listener on that port with the port's protocol (TCP chains to the
//! service's port of that number, or its only port); one without (the catch-all, last)
//! gives the services of its hosts their own ports, but adds nothing to a listener an
//! egress listener with a port built (Istio locks those entries). `bind` replaces the class's address; `captureMode:
//! NONE` (or `DEFAULT` on a proxy with `INTERCEPTION_MODE: NONE`) makes a real bound
//! listener, on `bind` or else `127.0.0.1`.
//!
//! Headless services (resolution NONE, no address): their TCP and Auto ports get one
//! listener per endpoint IP, `<podIP>_<port>`, from the catch-all egress listener (not
//! for the proxy's own address; a ServiceEntry without endpoints keeps the wildcard
//! listener, a Kubernetes service without endpoints gets none).
//!
//! Each egress listener's chains follow the VirtualServices its own `hosts` import; the
//! `<port>` route table is built from the egress listener serving that port
//! (`rds::sidecar_route_config`).
//!
//! Not built (yet): `<hostname>:<port>` route tables for sniffed services on a VIP
//! (they use the shared `<port>` table, which holds their virtual host too), and the
//! all-ports table of an `HTTP_PROXY` egress port.

mod chains;
mod filters;

use chains::*;
pub(super) use filters::*;

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::TrafficDirection;
use envoy_types::pb::envoy::config::listener::v3::{
    Filter, FilterChain, FilterChainMatch, Listener,
};
use envoy_types::pb::google::protobuf::{BoolValue, Duration as PbDuration};
use meshfed_api::networking::v1alpha3::{
    L4MatchAttributes, RouteDestination, TlsMatchAttributes, VirtualService,
};
use meshfed_registry::{Protocol, Resolution, Service};

use super::{VIRTUAL_OUTBOUND, socket};
use crate::generate::rds::{OutboundPolicy, outbound_policy};
use crate::model::ClientView;
use crate::push::cache::Findings;
use crate::push::config_index::{Config, MESH_GATEWAY, host_matches};
use crate::push::snapshot::{ConflictLog, Snapshot, egress_host_matches};

/// Chain of `virtualOutbound` that refuses traffic addressed to the capture port.
pub const VIRTUAL_OUTBOUND_BLACKHOLE: &str = "virtualOutbound-blackhole";
/// Chain of `virtualOutbound` for everything else.
pub const VIRTUAL_OUTBOUND_CATCHALL: &str = "virtualOutbound-catchall-tcp";
/// Default chain of an outbound listener without a match-all chain.
pub const PASSTHROUGH_FILTER_CHAIN: &str = "PassthroughFilterChain";
/// Listener filter reading SNI and ALPN of TLS.
pub const TLS_INSPECTOR: &str = "envoy.filters.listener.tls_inspector";
/// Listener filter detecting plain HTTP/1.1 and h2c.
pub const HTTP_INSPECTOR: &str = "envoy.filters.listener.http_inspector";
/// Envoy's status and Prometheus ports; no wildcard HTTP listener may take them.
const ENVOY_STATUS_PORT: u16 = 15021;
const ENVOY_PROMETHEUS_PORT: u16 = 15090;

/// The `virtualOutbound` listener.
pub(super) fn virtual_outbound(snapshot: &Snapshot, proxy: &ClientView) -> Listener {
    let port = capture_port(snapshot);
    Listener {
        name: VIRTUAL_OUTBOUND.into(),
        address: Some(socket("0.0.0.0", port)),
        use_original_dst: Some(BoolValue { value: true }),
        traffic_direction: TrafficDirection::Outbound as i32,
        filter_chains: vec![
            loop_guard(VIRTUAL_OUTBOUND_BLACKHOLE, port),
            FilterChain {
                name: VIRTUAL_OUTBOUND_CATCHALL.into(),
                filters: vec![tcp_proxy_filter(&catch_all_cluster(snapshot, proxy))],
                ..Default::default()
            },
        ],
        ..Default::default()
    }
}

fn capture_port(snapshot: &Snapshot) -> u16 {
    u16::try_from(snapshot.mesh().config.proxy_listen_port).unwrap_or(15001)
}

fn inbound_capture_port(snapshot: &Snapshot) -> u16 {
    u16::try_from(snapshot.mesh().config.proxy_inbound_listen_port).unwrap_or(15006)
}

/// Where traffic no listener claims goes, per `outboundTrafficPolicy`.
fn catch_all_cluster(snapshot: &Snapshot, proxy: &ClientView) -> String {
    match outbound_policy(snapshot, proxy) {
        OutboundPolicy::AllowAny {
            egress_proxy: Some(d),
        } => crate::xds::names::outbound_name(
            d.port
                .and_then(|p| u16::try_from(p.number).ok())
                .unwrap_or(0),
            &d.subset,
            &d.host,
        ),
        OutboundPolicy::AllowAny { egress_proxy: None } => {
            crate::xds::names::PASSTHROUGH.to_string()
        }
        OutboundPolicy::RegistryOnly => crate::xds::names::BLACK_HOLE.to_string(),
    }
}

/// A listener being built: its key, the protocol it serves (Istio's entry protocol:
/// `Unsupported` once sniffed) and its chains.
struct Entry {
    bind: String,
    port: u16,
    protocol: Protocol,
    chains: Vec<ChainOpts>,
    /// Binds a real port (Sidecar egress captureMode NONE).
    bound: bool,
    /// Built by a Sidecar egress listener with a port before the catch-all: the
    /// catch-all's services do not join it (Istio's `locked` entries).
    locked: bool,
}

/// The per-port outbound listeners, sorted by name, with the conflicts met (chains
/// dropped because an older service's chain matches the same traffic). `own_ip`: the
/// proxy's address when it is an endpoint of a headless service (it gets no listener
/// for itself).
pub(super) fn outbound_listeners(
    snapshot: &Snapshot,
    proxy: &ClientView,
    own_ip: Option<IpAddr>,
) -> (Vec<Listener>, Findings) {
    let found = RefCell::new(Findings::default());
    let ns = proxy.namespace.as_str();
    // One service per hostname, as the proxy resolves names, oldest first (Istio's
    // SidecarScope order: the first service wins conflicts on a port).
    let mut seen = HashSet::new();
    let mut services: Vec<&Arc<Service>> = Vec::new();
    for s in snapshot.visible_services(ns, &proxy.labels) {
        if !seen.insert(s.hostname.as_str()) {
            continue;
        }
        // An alias (ExternalName) gets no listener: its clients reach its target.
        if let Some(resolved) = snapshot.services().resolve(s.hostname.as_str(), ns)
            && resolved.resolution != Resolution::Alias
        {
            services.push(resolved);
        }
    }
    services.sort_by(|a, b| {
        (a.creation_time, a.hostname.as_str(), a.namespace.as_str()).cmp(&(
            b.creation_time,
            b.hostname.as_str(),
            b.namespace.as_str(),
        ))
    });

    let reserved = [
        capture_port(snapshot),
        inbound_capture_port(snapshot),
        ENVOY_STATUS_PORT,
        ENVOY_PROMETHEUS_PORT,
    ];
    let mut entries: BTreeMap<(String, u16), Entry> = BTreeMap::new();
    for group in egress_groups(snapshot, proxy) {
        if group.port.is_none() {
            // The catch-all comes last: what the listeners with a port built is theirs.
            entries.values_mut().for_each(|e| e.locked = true);
        }
        // A listener that binds a real port and names no address binds the loopback
        // address (Istio's actualLocalHost).
        let bind = match (group.bind, group.bound) {
            (Some(b), _) => Some(b),
            (None, true) => Some("127.0.0.1"),
            (None, false) => None,
        };
        // The VirtualServices of this egress listener's hosts, as in Istio (each
        // listener's TCP and TLS routes come from what it imports).
        let virtual_services: Vec<&Arc<Config<VirtualService>>> =
            snapshot.egress_virtual_services(ns, group.hosts);
        for service in &services {
            if let Some(hosts) = &group.hosts
                && !hosts.iter().any(|h| egress_host_matches(h, ns, service))
            {
                continue;
            }
            let vss: Vec<&Config<VirtualService>> = virtual_services
                .iter()
                .filter(|vs| {
                    vs.spec
                        .hosts
                        .iter()
                        .any(|h| host_matches(h, service.hostname.as_str()))
                })
                .map(|vs| vs.as_ref())
                .collect();
            // An egress listener with a port gives every service of its hosts a
            // listener on that port, with the port's protocol.
            let ports: Vec<(u16, Protocol)> = match group.port {
                Some(port) => vec![port],
                None => service
                    .ports
                    .iter()
                    .map(|p| (p.port.get(), p.protocol))
                    .collect(),
            };
            for (p, protocol) in ports {
                let Some(class) = class_of(protocol) else {
                    continue;
                };
                if class == Class::Http && reserved.contains(&p) {
                    tracing::debug!(
                        "outbound listener for {}:{p} skipped: the port is one of Envoy's own",
                        service.hostname
                    );
                    continue;
                }
                let ctx = ServiceCtx {
                    snapshot,
                    found: &found,
                    proxy,
                    service,
                    port: p,
                    protocol,
                    virtual_services: &vss,
                    bind,
                    bound: group.bound,
                };
                // A headless service's TCP and Auto ports of the catch-all get one
                // listener per endpoint instead of the wildcard one.
                if group.port.is_none()
                    && bind.is_none()
                    && let Some(ips) = headless_endpoints(&ctx, class, own_ip)
                {
                    for ip in &ips {
                        let ctx = ServiceCtx {
                            bind: Some(ip.as_str()),
                            ..ctx
                        };
                        add_service_port(&mut entries, &ctx, class);
                    }
                    continue;
                }
                add_service_port(&mut entries, &ctx, class);
            }
        }
    }
    let catch_all = catch_all_cluster(snapshot, proxy);
    let timeout = snapshot
        .mesh()
        .config
        .protocol_detection_timeout
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .unwrap_or_default();
    let mut out: Vec<Listener> = entries
        .into_values()
        .map(|e| finish(e, &catch_all, timeout))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    (out, found.into_inner())
}

/// The endpoint addresses that get their own `<ip>_<port>` listener for a headless
/// service's port (Istio's listeners for StatefulSets and other headless services:
/// TCP traffic to a pod IP cannot be told apart on a shared wildcard listener).
/// `None` when the port is not such a port, or for a service outside Kubernetes with
/// no endpoint on it (a ServiceEntry with resolution NONE and no endpoints): it keeps
/// the wildcard listener. A Kubernetes service without endpoints gets no listener.
/// Host-name endpoints and the proxy's own address are left out.
///
/// Istio also leaves a non-Kubernetes service with a label selector out of the
/// wildcard fallback; services here do not carry their selector, so such a
/// ServiceEntry (`workloadSelector`, no WorkloadEntry yet) keeps the wildcard listener.
fn headless_endpoints(
    ctx: &ServiceCtx<'_>,
    class: Class,
    own_ip: Option<IpAddr>,
) -> Option<BTreeSet<String>> {
    let service = ctx.service;
    if service.resolution != Resolution::Passthrough
        || class == Class::Http
        || service
            .address_for_proxy(ctx.proxy.cluster_id.as_ref(), ctx.proxy.uses_auto_allocated)
            .is_some()
        || !service_cidrs(service, ctx.proxy).is_empty()
    {
        return None;
    }
    let port = service.port(ctx.port)?;
    let on_port: Vec<&meshfed_registry::Endpoint> = ctx
        .snapshot
        .shards(&service.key())
        .into_iter()
        .flat_map(|s| s.iter())
        .map(|(_, ep)| ep)
        .filter(|ep| ep.ports.contains_key(&*port.name))
        .collect();
    if on_port.is_empty() && service.provider != meshfed_registry::ProviderId::Kubernetes {
        return None;
    }
    Some(
        on_port
            .into_iter()
            .filter(|ep| ep.hostname.is_none() && ep.has_address() && Some(ep.address) != own_ip)
            .map(|ep| ep.address.to_string())
            .collect(),
    )
}

#[derive(Clone, Copy)]
struct ServiceCtx<'a> {
    snapshot: &'a Snapshot,
    /// What building the listeners found wrong in the config.
    found: &'a RefCell<Findings>,
    proxy: &'a ClientView,
    service: &'a Service,
    /// The listener port (a service port, or a Sidecar egress listener's port).
    port: u16,
    protocol: Protocol,
    virtual_services: &'a [&'a Config<VirtualService>],
    /// The address a Sidecar egress listener binds, overriding the class's.
    bind: Option<&'a str>,
    /// The listener binds a real port (captureMode NONE).
    bound: bool,
}

/// One Sidecar egress listener as the outbound listeners see it (or the implicit
/// catch-all of a proxy without Sidecar egress listeners).
struct EgressGroup<'a> {
    /// Its `hosts`; `None`: every visible service.
    hosts: Option<&'a [String]>,
    /// Its port and the port's protocol, when it has one.
    port: Option<(u16, Protocol)>,
    bind: Option<&'a str>,
    bound: bool,
}

/// The egress listeners of the proxy's Sidecar in order, or one catch-all.
fn egress_groups<'a>(snapshot: &'a Snapshot, proxy: &'a ClientView) -> Vec<EgressGroup<'a>> {
    let egress = snapshot
        .config()
        .sidecar_for(&proxy.namespace, &proxy.labels)
        .map(|s| s.spec.egress.as_slice())
        .unwrap_or_default();
    if egress.is_empty() {
        return vec![EgressGroup {
            hosts: None,
            port: None,
            bind: None,
            bound: proxy.interception_none,
        }];
    }
    egress
        .iter()
        .filter_map(|e| {
            let port = match &e.port {
                Some(p) => Some((
                    u16::try_from(p.number).ok().filter(|n| *n > 0)?,
                    Protocol::parse(&p.protocol),
                )),
                None => None,
            };
            Some(EgressGroup {
                hosts: Some(e.hosts.as_slice()),
                port,
                bind: Some(e.bind.as_str()).filter(|b| !b.is_empty()),
                bound: crate::generate::instances::binds_to_port(
                    e.capture_mode,
                    proxy.interception_none,
                ),
            })
        })
        .collect()
}

/// Adds one service port to its (bind, port) entry with Istio's conflict rules.
fn add_service_port(
    entries: &mut BTreeMap<(String, u16), Entry>,
    ctx: &ServiceCtx<'_>,
    class: Class,
) {
    let wildcard = "0.0.0.0".to_string();
    let bind = match (ctx.bind, class) {
        (Some(bind), _) => bind.to_string(),
        (None, Class::Http) => wildcard,
        (None, Class::Tcp | Class::Auto) => ctx
            .service
            .address_for_proxy(ctx.proxy.cluster_id.as_ref(), ctx.proxy.uses_auto_allocated)
            .map_or(wildcard, |ip| ip.to_string()),
    };
    let key = (bind.clone(), ctx.port);
    if entries.get(&key).is_some_and(|e| e.locked) {
        return;
    }
    let current = entries.get(&key).map(|e| e.protocol);

    #[derive(PartialEq)]
    enum Merge {
        New,
        Sniff,
        Chains,
    }
    let (chains, protocol, merge) = match class {
        Class::Http => {
            // A wildcard HTTP listener matches HTTP by ALPN and passes the rest through:
            // it is sniffed from the start.
            let (protocol, merge) = match current {
                None => (Protocol::Unsupported, Merge::New),
                Some(c) if is_tcp(c) => (Protocol::Unsupported, Merge::Sniff),
                Some(_) => return,
            };
            let route = ctx.port.to_string();
            let hcm = outbound_hcm(
                ctx.snapshot,
                ctx.proxy,
                &bind,
                ctx.port,
                ctx.protocol,
                &route,
            );
            (vec![ChainOpts::sniffed_http(hcm)], protocol, merge)
        }
        Class::Tcp => {
            let chains = tcp_chains(ctx, &bind);
            match current {
                None => (chains, ctx.protocol, Merge::New),
                Some(c) if c.is_http() => (chains, Protocol::Unsupported, Merge::Sniff),
                Some(_) => (chains, ctx.protocol, Merge::Chains),
            }
        }
        Class::Auto => {
            let mut chains = tcp_chains(ctx, &bind);
            let route = sniffed_route_name(&bind, ctx.port, ctx.service);
            chains.push(ChainOpts::sniffed_http(outbound_hcm(
                ctx.snapshot,
                ctx.proxy,
                &bind,
                ctx.port,
                ctx.protocol,
                &route,
            )));
            match current {
                None => (chains, Protocol::Unsupported, Merge::New),
                // Auto replaces an HTTP entry outright.
                Some(c) if c.is_http() => (chains, Protocol::Unsupported, Merge::New),
                Some(c) if is_tcp(c) => (chains, Protocol::Unsupported, Merge::Sniff),
                Some(_) => return,
            }
        }
    };
    if let Some(c) = current {
        // Server-first protocols cannot share a port with anything else.
        let exclusive = |p: Protocol| matches!(p, Protocol::Mongo | Protocol::Mysql);
        if (exclusive(ctx.protocol) || exclusive(c)) && ctx.protocol != c {
            tracing::debug!(
                "outbound listener {}_{}: {} ({}) dropped, the port already serves {}",
                bind,
                ctx.port,
                ctx.service.hostname,
                ctx.protocol,
                c
            );
            return;
        }
    }
    match merge {
        Merge::New => {
            entries.insert(
                key,
                Entry {
                    bind,
                    port: ctx.port,
                    protocol,
                    chains,
                    bound: ctx.bound,
                    locked: false,
                },
            );
        }
        Merge::Sniff | Merge::Chains => {
            let entry = entries.get_mut(&key).expect("current entry exists");
            merge_chains(entry, chains, ctx);
            if merge == Merge::Sniff {
                entry.protocol = Protocol::Unsupported;
            }
        }
    }
}

/// Appends the incoming chains that match differently from every chain already there;
/// the others lose to the older service.
fn merge_chains(entry: &mut Entry, incoming: Vec<ChainOpts>, ctx: &ServiceCtx<'_>) {
    for chain in incoming {
        if entry.chains.iter().any(|c| c.conflicts_with(&chain)) {
            tracing::debug!(
                metric = ConflictLog::TCP_OVER_CURRENT_TCP,
                "outbound listener {}_{}: a chain of {} ({}) dropped, an older service on this \
                 port matches the same traffic",
                entry.bind,
                entry.port,
                ctx.service.hostname,
                ctx.protocol
            );
            let listener = format!("{}_{}", entry.bind, entry.port);
            let message = format!(
                "Listener={listener} Accepted={} Rejected={} ({})",
                protocol_name(entry.protocol),
                protocol_name(ctx.protocol),
                ctx.service.hostname
            );
            ctx.found
                .borrow_mut()
                .conflicts
                .entry(ConflictLog::TCP_OVER_CURRENT_TCP)
                .or_default()
                .insert(listener, message);
            continue;
        }
        entry.chains.push(chain);
    }
}

/// A protocol as Istio's conflict messages name it.
fn protocol_name(protocol: Protocol) -> &'static str {
    match class_of(protocol) {
        Some(Class::Http) => "HTTP",
        Some(Class::Tcp) => "TCP",
        _ => "UNKNOWN",
    }
}

fn l4_match_applies(m: &L4MatchAttributes, ctx: &ServiceCtx<'_>) -> bool {
    static_match(
        &m.gateways,
        &m.source_labels,
        m.port,
        &m.source_namespace,
        ctx,
    )
}

fn tls_match_applies(m: &TlsMatchAttributes, ctx: &ServiceCtx<'_>) -> bool {
    static_match(
        &m.gateways,
        &m.source_labels,
        m.port,
        &m.source_namespace,
        ctx,
    )
}

/// The parts of a match a sidecar's config can decide: bound to `mesh`, source labels
/// and namespace of this proxy, the listener port.
fn static_match(
    gateways: &[String],
    source_labels: &BTreeMap<String, String>,
    port: u32,
    source_namespace: &str,
    ctx: &ServiceCtx<'_>,
) -> bool {
    (gateways.is_empty() || gateways.iter().any(|g| g == MESH_GATEWAY))
        && source_labels
            .iter()
            .all(|(k, v)| ctx.proxy.labels.get(k) == Some(v))
        && (port == 0 || port == u32::from(ctx.port))
        && (source_namespace.is_empty() || source_namespace == ctx.proxy.namespace)
}

/// The address ranges of a service without a VIP in the proxy's cluster: its
/// listener is the wildcard one, and its chains match these prefixes.
fn service_cidrs(service: &Service, proxy: &ClientView) -> Vec<String> {
    if service
        .address_for_proxy(proxy.cluster_id.as_ref(), proxy.uses_auto_allocated)
        .is_some()
    {
        return Vec::new();
    }
    proxy
        .cluster_id
        .as_ref()
        .and_then(|c| service.cluster_cidrs.get(c))
        .or_else(|| service.cluster_cidrs.values().next())
        .cloned()
        .unwrap_or_default()
}

/// The TCP (or, for HTTPS/TLS ports, SNI) chains of one service port.
fn tcp_chains(ctx: &ServiceCtx<'_>, bind: &str) -> Vec<ChainOpts> {
    let service_cidrs = service_cidrs(ctx.service, ctx.proxy);
    let default_cluster = crate::xds::names::outbound_name(
        if ctx.service.ports.len() == 1 {
            ctx.service.ports[0].port.get()
        } else {
            ctx.port
        },
        "",
        ctx.service.hostname.as_str(),
    );
    let mut out = Vec::new();
    if is_tls(ctx.protocol) {
        let mut handled = HashSet::new();
        let mut cidrs = service_cidrs.clone();
        for vs in ctx.virtual_services {
            for tls in &vs.spec.tls {
                for m in tls.r#match.iter().filter(|m| tls_match_applies(m, ctx)) {
                    // As in Istio, a match's subnets also stay for the later matches.
                    if !m.destination_subnets.is_empty() {
                        cidrs = m.destination_subnets.clone();
                    }
                    let runtime = (m.sni_hosts.clone(), m.destination_subnets.clone());
                    if handled.insert(runtime) {
                        out.push(ChainOpts {
                            server_names: m.sni_hosts.clone(),
                            cidrs: cidrs.clone(),
                            alpn: Vec::new(),
                            transport: "",
                            filter: route_filter(ctx, vs, &tls.route),
                        });
                    }
                }
            }
        }
        if out.is_empty() {
            // Without a VIP the listener is shared by every such service on the port:
            // SNI is the only way to tell them apart. Headless services are the
            // exception: each endpoint has its own `<podIP>_<port>` listener (no SNI
            // there), and a headless ServiceEntry without endpoints keeps the wildcard
            // listener with a chain that matches any SNI.
            let headless = ctx.service.resolution == Resolution::Passthrough;
            let vip_bound = bind != "0.0.0.0" || headless;
            let server_names = if !service_cidrs.is_empty() || !vip_bound {
                vec![ctx.service.hostname.to_string()]
            } else {
                Vec::new()
            };
            out.push(ChainOpts {
                server_names,
                cidrs: service_cidrs,
                alpn: Vec::new(),
                transport: "",
                filter: tcp_proxy_filter(&default_cluster),
            });
        }
        return out;
    }
    let mut terminal = false;
    'routes: for vs in ctx.virtual_services {
        for tcp in &vs.spec.tcp {
            if tcp.r#match.is_empty() {
                out.push(ChainOpts::tcp(
                    service_cidrs.clone(),
                    route_filter(ctx, vs, &tcp.route),
                ));
                terminal = true;
                break 'routes;
            }
            let mut subnets: Vec<String> = Vec::new();
            for m in tcp.r#match.iter().filter(|m| l4_match_applies(m, ctx)) {
                if m.destination_subnets.is_empty() {
                    out.push(ChainOpts::tcp(
                        service_cidrs.clone(),
                        route_filter(ctx, vs, &tcp.route),
                    ));
                    terminal = true;
                    break 'routes;
                }
                subnets.extend(m.destination_subnets.iter().cloned());
            }
            if !subnets.is_empty() {
                out.push(ChainOpts::tcp(
                    subnets.clone(),
                    route_filter(ctx, vs, &tcp.route),
                ));
                let mut a = subnets;
                a.sort();
                let mut b = service_cidrs.clone();
                b.sort();
                if a == b {
                    terminal = true;
                }
            }
        }
    }
    if !terminal {
        out.push(ChainOpts::tcp(
            service_cidrs,
            tcp_proxy_filter(&default_cluster),
        ));
    }
    out
}

/// The TCP proxy of a `tcp`/`tls` route on a service's listener (destinations resolved
/// from the proxy's namespace, the listener's port by default).
fn route_filter(
    ctx: &ServiceCtx<'_>,
    vs: &Config<VirtualService>,
    routes: &[RouteDestination],
) -> Filter {
    routes_tcp_proxy(ctx.snapshot, vs, routes, &ctx.proxy.namespace, ctx.port)
}

/// The listener of an entry (Istio's `buildListenerFromEntry`).
fn finish(entry: Entry, catch_all: &str, detection_timeout: std::time::Duration) -> Listener {
    let name = format!("{}_{}", entry.bind, entry.port);
    let needs_http_inspector = entry.chains.iter().any(|c| !c.alpn.is_empty());
    // Envoy adds a TLS inspector by itself when a chain matches ALPN; Istio adds it
    // explicitly then, so it is always in the config.
    let needs_tls_inspector =
        needs_http_inspector || entry.chains.iter().any(|c| !c.server_names.is_empty());
    let mut listener_filters = Vec::new();
    if needs_tls_inspector {
        listener_filters.push(super::tls_inspector());
    }
    let timeout = if needs_http_inspector {
        listener_filters.push(super::http_inspector());
        PbDuration {
            seconds: i64::try_from(detection_timeout.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(detection_timeout.subsec_nanos()).unwrap_or(0),
        }
    } else {
        PbDuration::default()
    };
    let mut filter_chains = Vec::new();
    let mut default_filter_chain = None;
    for opts in entry.chains {
        let filter_chain_match = opts.filter_chain_match();
        let chain = FilterChain {
            filters: vec![opts.filter],
            filter_chain_match,
            ..Default::default()
        };
        if chain.filter_chain_match.is_none() {
            default_filter_chain = Some(chain);
        } else {
            filter_chains.push(chain);
        }
    }
    match default_filter_chain.take() {
        Some(only) if filter_chains.is_empty() => filter_chains.push(only),
        Some(default) => default_filter_chain = Some(default),
        None => {
            default_filter_chain = Some(FilterChain {
                name: PASSTHROUGH_FILTER_CHAIN.into(),
                filter_chain_match: Some(FilterChainMatch::default()),
                filters: vec![tcp_proxy_filter(catch_all)],
                ..Default::default()
            })
        }
    }
    Listener {
        address: Some(socket(&entry.bind, entry.port)),
        name,
        // Listeners take redirected traffic from virtualOutbound unless they bind.
        bind_to_port: (!entry.bound).then_some(BoolValue { value: false }),
        traffic_direction: TrafficDirection::Outbound as i32,
        continue_on_listener_filters_timeout: true,
        listener_filters,
        listener_filters_timeout: Some(timeout),
        filter_chains,
        default_filter_chain,
        ..Default::default()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::http_connection_manager;
    use envoy_types::pb::google::protobuf::UInt32Value;
    use std::time::{Duration, UNIX_EPOCH};

    use envoy_types::pb::envoy::config::listener::v3::{FilterChain, Listener, filter};
    use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::HttpConnectionManager;
    use envoy_types::pb::envoy::extensions::filters::network::tcp_proxy::v3::{
        TcpProxy, tcp_proxy,
    };
    use meshfed_api::mesh::v1alpha1::mesh_config::outbound_traffic_policy::Mode as MeshMode;
    use meshfed_api::networking::v1alpha3::{
        Destination, L4MatchAttributes, OutboundTrafficPolicy, PortSelector, RouteDestination,
        Sidecar, TcpRoute, TlsMatchAttributes, TlsRoute, VirtualService,
        outbound_traffic_policy::Mode as SidecarMode,
    };
    use meshfed_registry::{Protocol, Service};
    use prost::{Message, Name};

    use super::super::tests::{default_mesh, proxy, service, snapshot};
    use super::super::{VIRTUAL_INBOUND, sidecar_listeners};
    use super::*;
    use crate::mesh::MeshSettings;
    use crate::push::config_index::{Config, ConfigSet};

    fn no_vip(host: &str, ns: &str, ports: &[(&str, u16, Protocol)]) -> Service {
        let mut s = service(host, ns, "10.0.0.1", ports);
        s.cluster_vips.clear();
        s
    }

    fn created(mut s: Service, secs: u64) -> Service {
        s.creation_time = UNIX_EPOCH + Duration::from_secs(secs);
        s
    }

    fn config<T>(name: &str, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: "default".into(),
            labels: Default::default(),
            annotations: Default::default(),
            creation_time: UNIX_EPOCH,
            spec,
        }
    }

    fn to(host: &str, port: u32, weight: i32) -> RouteDestination {
        RouteDestination {
            destination: Some(Destination {
                host: host.into(),
                port: Some(PortSelector { number: port }),
                ..Default::default()
            }),
            weight,
        }
    }

    /// Every listener of a default-namespace sidecar.
    fn listeners(services: Vec<Service>, set: ConfigSet, mesh: MeshSettings) -> Vec<Listener> {
        let snap = snapshot(services, set, mesh);
        let p = proxy(
            "sidecar~10.0.0.99~app.default~default.svc.cluster.local",
            serde_json::json!({"app": "client"}),
        );
        sidecar_listeners(&snap, &p.client_view(), &[])
    }

    fn named<'a>(all: &'a [Listener], name: &str) -> &'a Listener {
        all.iter()
            .find(|l| l.name == name)
            .unwrap_or_else(|| panic!("no listener {name} in {:?}", names(all)))
    }

    fn names(all: &[Listener]) -> Vec<&str> {
        all.iter().map(|l| l.name.as_str()).collect()
    }

    fn tcp(chain: &FilterChain) -> TcpProxy {
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
            panic!("no typed config");
        };
        assert_eq!(any.type_url, TcpProxy::type_url(), "{chain:?}");
        TcpProxy::decode(any.value.as_slice()).unwrap()
    }

    fn cluster(chain: &FilterChain) -> String {
        match tcp(chain).cluster_specifier {
            Some(tcp_proxy::ClusterSpecifier::Cluster(c)) => c,
            other => panic!("not a single cluster: {other:?}"),
        }
    }

    fn hcm(chain: &FilterChain) -> HttpConnectionManager {
        let Some(filter::ConfigType::TypedConfig(any)) = &chain.filters[0].config_type else {
            panic!("no typed config");
        };
        assert_eq!(any.type_url, HttpConnectionManager::type_url(), "{chain:?}");
        HttpConnectionManager::decode(any.value.as_slice()).unwrap()
    }

    fn inspectors(l: &Listener) -> Vec<&str> {
        l.listener_filters.iter().map(|f| f.name.as_str()).collect()
    }

    fn server_names(chain: &FilterChain) -> Vec<&str> {
        chain
            .filter_chain_match
            .as_ref()
            .map(|m| m.server_names.iter().map(String::as_str).collect())
            .unwrap_or_default()
    }

    fn prefixes(chain: &FilterChain) -> Vec<String> {
        chain
            .filter_chain_match
            .as_ref()
            .map(|m| {
                m.prefix_ranges
                    .iter()
                    .map(|r| format!("{}/{}", r.address_prefix, r.prefix_len.unwrap().value))
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn loop_guard_chains_on_both_capture_listeners() {
        let all = listeners(vec![], ConfigSet::default(), default_mesh());
        let out = named(&all, VIRTUAL_OUTBOUND);
        assert_eq!(out.use_original_dst, Some(BoolValue { value: true }));
        let guard = &out.filter_chains[0];
        assert_eq!(guard.name, VIRTUAL_OUTBOUND_BLACKHOLE);
        assert_eq!(
            guard.filter_chain_match.as_ref().unwrap().destination_port,
            Some(UInt32Value { value: 15001 })
        );
        assert_eq!(cluster(guard), "BlackHoleCluster");
        assert_eq!(tcp(guard).stat_prefix, "BlackHoleCluster");
        assert_eq!(out.filter_chains[1].name, VIRTUAL_OUTBOUND_CATCHALL);
        assert!(out.filter_chains[1].filter_chain_match.is_none());
        assert_eq!(cluster(&out.filter_chains[1]), "PassthroughCluster");

        let inbound = named(&all, VIRTUAL_INBOUND);
        let guard = &inbound.filter_chains[0];
        assert_eq!(guard.name, "virtualInbound-blackhole");
        assert_eq!(
            guard.filter_chain_match.as_ref().unwrap().destination_port,
            Some(UInt32Value { value: 15006 })
        );
        assert_eq!(cluster(guard), "BlackHoleCluster");
    }

    #[test]
    fn class_decides_bind_and_chains() {
        let all = listeners(
            vec![
                service(
                    "web.default.svc.cluster.local",
                    "default",
                    "10.96.0.1",
                    &[("http", 80, Protocol::Http), ("grpc", 7070, Protocol::Grpc)],
                ),
                service(
                    "db.default.svc.cluster.local",
                    "default",
                    "10.96.0.2",
                    &[("tcp", 5432, Protocol::Tcp)],
                ),
                no_vip(
                    "ext.example.com",
                    "default",
                    &[("tcp", 6379, Protocol::Redis)],
                ),
                service(
                    "auto.default.svc.cluster.local",
                    "default",
                    "10.96.0.3",
                    &[
                        ("app", 9000, Protocol::Unsupported),
                        ("dns", 53, Protocol::Udp),
                    ],
                ),
                service(
                    "stat.default.svc.cluster.local",
                    "default",
                    "10.96.0.4",
                    &[("http", 15021, Protocol::Http)],
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        assert_eq!(
            names(&all),
            [
                "virtualOutbound",
                "virtualInbound",
                "0.0.0.0_6379",
                "0.0.0.0_7070",
                "0.0.0.0_80",
                "10.96.0.2_5432",
                "10.96.0.3_9000",
            ],
            "HTTP on the wildcard, TCP and Auto on the VIP (else the wildcard); UDP and \
             Envoy's own ports skipped; sorted by name"
        );
        // TCP on a VIP: one match-all chain, no inspectors, no default.
        let db = named(&all, "10.96.0.2_5432");
        assert_eq!(db.filter_chains.len(), 1);
        assert!(db.filter_chains[0].filter_chain_match.is_none());
        assert_eq!(
            cluster(&db.filter_chains[0]),
            "outbound|5432||db.default.svc.cluster.local"
        );
        assert!(db.default_filter_chain.is_none());
        assert!(inspectors(db).is_empty());
        assert_eq!(db.bind_to_port, Some(BoolValue { value: false }));
        assert!(db.continue_on_listener_filters_timeout);
        assert_eq!(
            cluster(&named(&all, "0.0.0.0_6379").filter_chains[0]),
            "outbound|6379||ext.example.com"
        );
        // Auto: the service's TCP chain is the default, HTTP is matched by ALPN.
        let auto = named(&all, "10.96.0.3_9000");
        assert_eq!(inspectors(auto), [TLS_INSPECTOR, HTTP_INSPECTOR]);
        assert_eq!(auto.filter_chains.len(), 1);
        let m = auto.filter_chains[0].filter_chain_match.as_ref().unwrap();
        assert_eq!(m.application_protocols, ["http/1.1", "h2c"]);
        assert_eq!(m.transport_protocol, "raw_buffer");
        let rds = hcm(&auto.filter_chains[0]);
        assert_eq!(rds.stat_prefix, "outbound_10.96.0.3_9000;");
        assert_eq!(
            cluster(auto.default_filter_chain.as_ref().unwrap()),
            "outbound|9000||auto.default.svc.cluster.local"
        );
    }

    #[test]
    fn wildcard_http_listeners_are_sniffed_with_a_passthrough_default() {
        for (mode, fallback) in [
            (MeshMode::AllowAny, "PassthroughCluster"),
            (MeshMode::RegistryOnly, "BlackHoleCluster"),
        ] {
            let mut mesh = default_mesh();
            mesh.config.outbound_traffic_policy.as_mut().unwrap().mode = mode as i32;
            let all = listeners(
                vec![service(
                    "web.default.svc.cluster.local",
                    "default",
                    "10.96.0.1",
                    &[("http", 80, Protocol::Http)],
                )],
                ConfigSet::default(),
                mesh,
            );
            let web = named(&all, "0.0.0.0_80");
            assert_eq!(
                inspectors(web),
                [TLS_INSPECTOR, HTTP_INSPECTOR],
                "in this order"
            );
            assert_eq!(web.filter_chains.len(), 1);
            let m = web.filter_chains[0].filter_chain_match.as_ref().unwrap();
            assert_eq!(m.application_protocols, ["http/1.1", "h2c"]);
            assert_eq!(m.transport_protocol, "raw_buffer");
            let manager = hcm(&web.filter_chains[0]);
            assert_eq!(manager.stat_prefix, "outbound_0.0.0.0_80;");
            match manager.route_specifier {
                Some(http_connection_manager::RouteSpecifier::Rds(r)) => {
                    assert_eq!(r.route_config_name, "80")
                }
                other => panic!("no RDS: {other:?}"),
            }
            let default = web.default_filter_chain.as_ref().unwrap();
            assert_eq!(default.name, PASSTHROUGH_FILTER_CHAIN);
            assert_eq!(cluster(default), fallback, "{mode:?}");
            assert_eq!(
                cluster(&named(&all, VIRTUAL_OUTBOUND).filter_chains[1]),
                fallback
            );
        }
    }

    #[test]
    fn sidecar_policy_and_egress_proxy_decide_the_default_chain() {
        let sidecar = |policy| {
            config(
                "default",
                Sidecar {
                    outbound_traffic_policy: Some(policy),
                    ..Default::default()
                },
            )
        };
        let web = || {
            vec![service(
                "web.default.svc.cluster.local",
                "default",
                "10.96.0.1",
                &[("http", 80, Protocol::Http)],
            )]
        };
        let registry_only = ConfigSet {
            sidecars: vec![sidecar(OutboundTrafficPolicy {
                mode: SidecarMode::RegistryOnly as i32,
                ..Default::default()
            })],
            ..Default::default()
        };
        let all = listeners(web(), registry_only, default_mesh());
        let default = named(&all, "0.0.0.0_80")
            .default_filter_chain
            .clone()
            .unwrap();
        assert_eq!(cluster(&default), "BlackHoleCluster");

        let egress = ConfigSet {
            sidecars: vec![sidecar(OutboundTrafficPolicy {
                mode: SidecarMode::AllowAny as i32,
                egress_proxy: Some(Destination {
                    host: "egress.istio-system.svc.cluster.local".into(),
                    port: Some(PortSelector { number: 443 }),
                    ..Default::default()
                }),
            })],
            ..Default::default()
        };
        let all = listeners(web(), egress, default_mesh());
        let want = "outbound|443||egress.istio-system.svc.cluster.local";
        let default = named(&all, "0.0.0.0_80")
            .default_filter_chain
            .clone()
            .unwrap();
        assert_eq!(cluster(&default), want);
        assert_eq!(
            cluster(&named(&all, VIRTUAL_OUTBOUND).filter_chains[1]),
            want
        );
    }

    #[test]
    fn tls_routes_give_sni_chains_and_hosts_without_vip_their_own() {
        let vs = VirtualService {
            hosts: vec!["*.api.example.com".into()],
            tls: vec![TlsRoute {
                r#match: vec![
                    TlsMatchAttributes {
                        sni_hosts: vec!["b.api.example.com".into(), "a.api.example.com".into()],
                        ..Default::default()
                    },
                    // Only for other proxies: left out.
                    TlsMatchAttributes {
                        sni_hosts: vec!["c.api.example.com".into()],
                        source_labels: [("app".to_string(), "other".to_string())].into(),
                        ..Default::default()
                    },
                ],
                route: vec![to("a.api.example.com", 443, 0)],
            }],
            ..Default::default()
        };
        let all = listeners(
            vec![
                created(
                    no_vip(
                        "a.api.example.com",
                        "default",
                        &[("tls", 443, Protocol::Tls)],
                    ),
                    1,
                ),
                created(
                    no_vip(
                        "plain.example.com",
                        "default",
                        &[("https", 443, Protocol::Https)],
                    ),
                    2,
                ),
                service(
                    "vip.default.svc.cluster.local",
                    "default",
                    "10.96.0.7",
                    &[("https", 8443, Protocol::Https)],
                ),
            ],
            ConfigSet {
                virtual_services: vec![config("api", vs)],
                ..Default::default()
            },
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_443");
        assert_eq!(inspectors(l), [TLS_INSPECTOR], "SNI only, no ALPN");
        assert_eq!(l.filter_chains.len(), 2, "{l:#?}");
        assert_eq!(
            server_names(&l.filter_chains[0]),
            ["a.api.example.com", "b.api.example.com"],
            "sorted"
        );
        assert_eq!(
            cluster(&l.filter_chains[0]),
            "outbound|443||a.api.example.com"
        );
        assert_eq!(server_names(&l.filter_chains[1]), ["plain.example.com"]);
        assert_eq!(
            cluster(&l.filter_chains[1]),
            "outbound|443||plain.example.com"
        );
        assert_eq!(
            l.default_filter_chain.as_ref().unwrap().name,
            PASSTHROUGH_FILTER_CHAIN
        );
        // On a VIP the address says it all: no SNI match.
        let vip = named(&all, "10.96.0.7_8443");
        assert!(vip.filter_chains[0].filter_chain_match.is_none());
        assert!(inspectors(vip).is_empty());
    }

    #[test]
    fn tcp_routes_with_overlapping_subnets_coexist_and_equal_matches_keep_the_oldest() {
        let subnet_route = |name: &str, host: &str, subnet: &str| {
            config(
                name,
                VirtualService {
                    hosts: vec![host.into()],
                    tcp: vec![TcpRoute {
                        r#match: vec![L4MatchAttributes {
                            destination_subnets: vec![subnet.into()],
                            ..Default::default()
                        }],
                        route: vec![to(host, 9000, 0)],
                    }],
                    ..Default::default()
                },
            )
        };
        let all = listeners(
            vec![
                created(
                    no_vip(
                        "wide.example.com",
                        "default",
                        &[("tcp", 9000, Protocol::Tcp)],
                    ),
                    1,
                ),
                created(
                    no_vip(
                        "narrow.example.com",
                        "default",
                        &[("tcp", 9000, Protocol::Tcp)],
                    ),
                    2,
                ),
            ],
            ConfigSet {
                virtual_services: vec![
                    subnet_route("wide", "wide.example.com", "10.0.0.0/8"),
                    subnet_route("narrow", "narrow.example.com", "10.1.2.3/16"),
                ],
                ..Default::default()
            },
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_9000");
        let chains: Vec<(Vec<String>, String)> = l
            .filter_chains
            .iter()
            .map(|c| (prefixes(c), cluster(c)))
            .collect();
        assert_eq!(
            chains,
            [
                (
                    vec!["10.0.0.0/8".to_string()],
                    "outbound|9000||wide.example.com".to_string()
                ),
                (
                    vec!["10.1.0.0/16".to_string()],
                    "outbound|9000||narrow.example.com".to_string()
                ),
            ],
            "both prefixes stay (Envoy picks the longest), masked"
        );
        assert_eq!(
            cluster(l.default_filter_chain.as_ref().unwrap()),
            "outbound|9000||wide.example.com",
            "the default chains conflict: the older service keeps it"
        );
    }

    fn ranged(host: &str, cidrs: &[&str], port: (&str, u16, Protocol)) -> Service {
        let mut s = no_vip(host, "default", &[port]);
        s.cluster_cidrs
            .insert("c1".into(), cidrs.iter().map(|c| c.to_string()).collect());
        s
    }

    #[test]
    fn service_entries_with_overlapping_cidrs_share_the_wildcard_listener() {
        let all = listeners(
            vec![
                created(
                    ranged(
                        "wide.example.com",
                        &["10.0.0.0/8"],
                        ("tcp", 9000, Protocol::Tcp),
                    ),
                    1,
                ),
                created(
                    ranged(
                        "narrow.example.com",
                        &["10.1.0.0/16"],
                        ("tcp", 9000, Protocol::Tcp),
                    ),
                    2,
                ),
                created(
                    ranged(
                        "same.example.com",
                        &["10.0.0.0/8"],
                        ("tcp", 9000, Protocol::Tcp),
                    ),
                    3,
                ),
                ranged(
                    "secure.example.com",
                    &["192.168.0.0/24"],
                    ("tls", 443, Protocol::Tls),
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_9000");
        let chains: Vec<(Vec<String>, String)> = l
            .filter_chains
            .iter()
            .map(|c| (prefixes(c), cluster(c)))
            .collect();
        assert_eq!(
            chains,
            [
                (
                    vec!["10.0.0.0/8".to_string()],
                    "outbound|9000||wide.example.com".to_string()
                ),
                (
                    vec!["10.1.0.0/16".to_string()],
                    "outbound|9000||narrow.example.com".to_string()
                ),
            ],
            "overlapping ranges coexist; the same range keeps the older service"
        );
        assert!(inspectors(l).is_empty());
        let default = l.default_filter_chain.as_ref().unwrap();
        assert_eq!(default.name, PASSTHROUGH_FILTER_CHAIN);
        assert_eq!(cluster(default), "PassthroughCluster");
        // TLS with a range: SNI of the host as well as the prefix.
        let tls = named(&all, "0.0.0.0_443");
        assert_eq!(server_names(&tls.filter_chains[0]), ["secure.example.com"]);
        assert_eq!(prefixes(&tls.filter_chains[0]), ["192.168.0.0/24"]);
        assert_eq!(inspectors(tls), [TLS_INSPECTOR]);
    }

    #[test]
    fn merging_services_on_one_port_follows_istio() {
        // TCP over TCP on the wildcard: the oldest wins, whatever the name order.
        let all = listeners(
            vec![
                created(
                    no_vip("a.example.com", "default", &[("tcp", 7000, Protocol::Tcp)]),
                    2,
                ),
                created(
                    no_vip("b.example.com", "default", &[("tcp", 7000, Protocol::Tcp)]),
                    1,
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_7000");
        assert_eq!(l.filter_chains.len(), 1);
        assert_eq!(cluster(&l.filter_chains[0]), "outbound|7000||b.example.com");

        // HTTP and TCP on the wildcard: sniffed, HTTP by ALPN, TCP as default.
        let all = listeners(
            vec![
                created(
                    no_vip("t.example.com", "default", &[("tcp", 8000, Protocol::Tcp)]),
                    1,
                ),
                created(
                    no_vip(
                        "h.example.com",
                        "default",
                        &[("http", 8000, Protocol::Http)],
                    ),
                    2,
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_8000");
        assert_eq!(inspectors(l), [TLS_INSPECTOR, HTTP_INSPECTOR]);
        assert_eq!(l.filter_chains.len(), 1);
        hcm(&l.filter_chains[0]);
        assert_eq!(
            cluster(l.default_filter_chain.as_ref().unwrap()),
            "outbound|8000||t.example.com"
        );

        // A wildcard HTTP entry is sniffed already, so a later Auto service adds nothing
        // (Auto replaces only HTTP entries on a specific bind, from Sidecar egress);
        // Mongo refuses company.
        let all = listeners(
            vec![
                created(
                    no_vip(
                        "h.example.com",
                        "default",
                        &[("http", 8000, Protocol::Http)],
                    ),
                    1,
                ),
                created(
                    no_vip(
                        "u.example.com",
                        "default",
                        &[("u", 8000, Protocol::Unsupported)],
                    ),
                    2,
                ),
                created(
                    no_vip(
                        "m.example.com",
                        "default",
                        &[("mongo", 27017, Protocol::Mongo)],
                    ),
                    3,
                ),
                created(
                    no_vip("r.example.com", "default", &[("tcp", 27017, Protocol::Tcp)]),
                    4,
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_8000");
        assert_eq!(
            cluster(l.default_filter_chain.as_ref().unwrap()),
            "PassthroughCluster"
        );
        let mongo = named(&all, "0.0.0.0_27017");
        assert_eq!(mongo.filter_chains.len(), 1);
        assert_eq!(
            cluster(&mongo.filter_chains[0]),
            "outbound|27017||m.example.com"
        );
    }

    #[test]
    fn weighted_tcp_routes_use_the_virtual_service_as_stat_prefix() {
        let vs = VirtualService {
            hosts: vec!["db.default.svc.cluster.local".into()],
            tcp: vec![TcpRoute {
                r#match: vec![L4MatchAttributes {
                    port: 5432,
                    gateways: vec!["mesh".into()],
                    ..Default::default()
                }],
                route: vec![
                    to("db.default.svc.cluster.local", 5432, 90),
                    to("db-v2.default.svc.cluster.local", 5432, 10),
                    to("db-v3.default.svc.cluster.local", 5432, 0),
                ],
            }],
            ..Default::default()
        };
        let all = listeners(
            vec![service(
                "db.default.svc.cluster.local",
                "default",
                "10.96.0.2",
                &[("tcp", 5432, Protocol::Tcp)],
            )],
            ConfigSet {
                virtual_services: vec![config("db-split", vs)],
                ..Default::default()
            },
            default_mesh(),
        );
        let l = named(&all, "10.96.0.2_5432");
        assert_eq!(l.filter_chains.len(), 1, "the route is terminal");
        let proxy = tcp(&l.filter_chains[0]);
        assert_eq!(proxy.stat_prefix, "db-split.default");
        let Some(tcp_proxy::ClusterSpecifier::WeightedClusters(w)) = proxy.cluster_specifier else {
            panic!("not weighted");
        };
        let got: Vec<(String, u32)> = w.clusters.into_iter().map(|c| (c.name, c.weight)).collect();
        assert_eq!(
            got,
            [
                (
                    "outbound|5432||db.default.svc.cluster.local".to_string(),
                    90
                ),
                (
                    "outbound|5432||db-v2.default.svc.cluster.local".to_string(),
                    10
                ),
            ],
            "weight 0 dropped"
        );
    }

    #[test]
    fn listeners_are_deterministic() {
        let services = || {
            (0..50u32)
                .map(|i| {
                    let proto =
                        [Protocol::Http, Protocol::Tcp, Protocol::Unsupported][i as usize % 3];
                    created(
                        service(
                            &format!("s{i}.default.svc.cluster.local"),
                            "default",
                            &format!("10.96.1.{i}"),
                            &[("p", 8000 + (i % 7) as u16, proto)],
                        ),
                        u64::from(50 - i),
                    )
                })
                .collect::<Vec<_>>()
        };
        let a = listeners(services(), ConfigSet::default(), default_mesh());
        let b = listeners(
            services().into_iter().rev().collect(),
            ConfigSet::default(),
            default_mesh(),
        );
        assert_eq!(a, b);
        let outbound: Vec<&str> = names(&a)[2..].to_vec();
        let mut sorted = outbound.clone();
        sorted.sort();
        assert_eq!(outbound, sorted);
    }

    #[test]
    fn the_catch_all_adds_nothing_to_a_listener_an_egress_port_built() {
        use meshfed_api::networking::v1alpha3::{IstioEgressListener, SidecarPort};
        let sidecar = Sidecar {
            egress: vec![
                IstioEgressListener {
                    port: Some(SidecarPort {
                        number: 9000,
                        protocol: "TCP".into(),
                        name: "tcp".into(),
                        ..Default::default()
                    }),
                    hosts: vec!["./a.example.com".into()],
                    ..Default::default()
                },
                IstioEgressListener {
                    hosts: vec!["./*".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let all = listeners(
            vec![
                no_vip("a.example.com", "default", &[("tcp", 9000, Protocol::Tcp)]),
                no_vip(
                    "b.example.com",
                    "default",
                    &[("http", 9000, Protocol::Http)],
                ),
                no_vip(
                    "c.example.com",
                    "default",
                    &[("http", 9100, Protocol::Http)],
                ),
            ],
            ConfigSet {
                sidecars: vec![config("default", sidecar)],
                ..Default::default()
            },
            default_mesh(),
        );
        let l = named(&all, "0.0.0.0_9000");
        assert_eq!(l.filter_chains.len(), 1, "{l:?}");
        assert_eq!(cluster(&l.filter_chains[0]), "outbound|9000||a.example.com");
        assert!(
            inspectors(l).is_empty(),
            "b's HTTP port does not turn the listener into a sniffed one"
        );
        // The catch-all's own ports are built as usual.
        named(&all, "0.0.0.0_9100");
    }

    #[test]
    fn dropped_tcp_chains_are_counted_per_listener_in_the_snapshot() {
        use crate::push::snapshot::ConflictLog;
        let tcp = |host: &str, secs: u64| {
            created(
                no_vip(host, "default", &[("tcp", 9000, Protocol::Tcp)]),
                secs,
            )
        };
        let snap = snapshot(
            vec![
                tcp("a.example.com", 1),
                tcp("b.example.com", 2),
                tcp("c.example.com", 3),
                created(
                    service(
                        "d.default.svc.cluster.local",
                        "default",
                        "10.0.0.4",
                        &[("tcp", 9000, Protocol::Tcp)],
                    ),
                    4,
                ),
            ],
            ConfigSet::default(),
            default_mesh(),
        );
        assert_eq!(snap.conflicts().count(ConflictLog::TCP_OVER_CURRENT_TCP), 0);
        let p = proxy(
            "sidecar~10.0.0.99~app.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let all = sidecar_listeners(&snap, &p.client_view(), &[]);
        assert_eq!(
            cluster(&named(&all, "0.0.0.0_9000").filter_chains[0]),
            "outbound|9000||a.example.com"
        );
        // The listeners as a connection gets them: through the snapshot's cache, whose
        // entries carry what building them found.
        let everything = BTreeSet::new();
        crate::generate::generate(
            crate::xds::TypeUrl::Listener,
            &snap,
            &p,
            crate::generate::Subscription {
                wildcard: true,
                names: &everything,
                interned: None,
            },
            crate::generate::Scope::All,
            &Default::default(),
        );
        let log = snap.conflicts().all();
        let dropped = &log[ConflictLog::TCP_OVER_CURRENT_TCP];
        assert_eq!(
            dropped.keys().collect::<Vec<_>>(),
            ["0.0.0.0_9000"],
            "one listener, however many services lost on it; the VIP-bound one is alone"
        );
        assert_eq!(
            dropped["0.0.0.0_9000"],
            "Listener=0.0.0.0_9000 Accepted=TCP Rejected=TCP (c.example.com)"
        );
        assert_eq!(
            snap.conflicts().count(ConflictLog::HTTP_OVER_CURRENT_TCP),
            0
        );
        assert_eq!(
            snap.conflicts().count(ConflictLog::TCP_OVER_CURRENT_HTTP),
            0
        );
    }

    pub(crate) use super::super::tests::Registry;

    /// A snapshot of services with endpoints (one registry per entry, clusters `c1`,
    /// `c2`, ...), the default mesh and no config.
    pub(crate) fn snapshot_with_endpoints(registries: Vec<Registry>) -> Snapshot {
        super::super::tests::snapshot_of(registries, ConfigSet::default(), default_mesh())
    }

    #[test]
    fn headless_tcp_and_auto_ports_get_a_listener_per_endpoint() {
        use meshfed_registry::{Endpoint, ProviderId};
        let ports = [
            ("http", 80, Protocol::Http),
            ("auto", 81, Protocol::Unsupported),
            ("tcp", 82, Protocol::Tcp),
            ("tls", 83, Protocol::Tls),
        ];
        let headless = |host: &str| {
            let mut s = no_vip(host, "default", &ports);
            s.resolution = Resolution::Passthrough;
            s
        };
        let ep = |ip: &str| {
            ports
                .iter()
                .fold(Endpoint::new(ip.parse().unwrap()), |e, (name, port, _)| {
                    e.with_port(name, *port)
                })
        };
        let mut by_name = Endpoint::new("10.1.0.9".parse().unwrap()).with_port("tcp", 82);
        by_name.hostname = Some("db-0.example.com".into());
        let only_http = Endpoint::new("10.1.0.7".parse().unwrap()).with_port("http", 80);
        let snap = snapshot_with_endpoints(vec![
            (
                ProviderId::Kubernetes,
                vec![
                    (
                        headless("db.default.svc.cluster.local"),
                        vec![ep("10.1.0.1"), ep("10.1.0.2"), by_name, only_http],
                    ),
                    (headless("empty.default.svc.cluster.local"), vec![]),
                ],
            ),
            (
                ProviderId::External,
                vec![(
                    {
                        let mut s = headless("ext.example.com");
                        s.ports =
                            vec![meshfed_registry::Port::new("tcp", 9000, Protocol::Tcp).unwrap()];
                        s
                    },
                    vec![],
                )],
            ),
        ]);
        let p = proxy(
            "sidecar~10.1.0.2~db-1.default~default.svc.cluster.local",
            serde_json::json!({}),
        );
        let all = super::super::sidecar_listeners_at(
            &snap,
            &p.client_view(),
            &[],
            Some("10.1.0.2".parse().unwrap()),
        );
        assert_eq!(
            names(&all)[2..],
            [
                "0.0.0.0_80",
                "0.0.0.0_9000",
                "10.1.0.1_81",
                "10.1.0.1_82",
                "10.1.0.1_83",
            ],
            "one listener per endpoint IP of each TCP/Auto port (not the proxy's own, not a \
             host name, not an endpoint without the port); HTTP on the wildcard; a \
             Kubernetes service without endpoints gets none, a ServiceEntry the wildcard"
        );
        let tcp_listener = named(&all, "10.1.0.1_82");
        assert_eq!(
            cluster(&tcp_listener.filter_chains[0]),
            "outbound|82||db.default.svc.cluster.local"
        );
        let tls_listener = named(&all, "10.1.0.1_83");
        assert!(
            server_names(&tls_listener.filter_chains[0]).is_empty(),
            "no SNI on a pod IP"
        );
        assert_eq!(
            cluster(&named(&all, "0.0.0.0_9000").filter_chains[0]),
            "outbound|9000||ext.example.com"
        );

        // Another proxy (not an endpoint) gets both endpoints' listeners.
        let other = listeners_of(&snap, "10.9.9.9");
        assert!(
            ["10.1.0.1_82", "10.1.0.2_82"]
                .iter()
                .all(|n| other.iter().any(|l| l.name == *n)),
            "{:?}",
            names(&other)
        );
    }

    fn listeners_of(snap: &Snapshot, ip: &str) -> Vec<Listener> {
        let p = proxy(
            &format!("sidecar~{ip}~app.default~default.svc.cluster.local"),
            serde_json::json!({}),
        );
        sidecar_listeners(snap, &p.client_view(), &[])
    }
}

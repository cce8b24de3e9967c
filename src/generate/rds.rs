//! RDS: the HTTP route tables of sidecars and gateways, built the way Istio builds
//! them (`pilot/pkg/networking/core/httproute.go`, `route/route.go`, `gateway.go`).
//!
//! **Sidecars** (route name `"<port>"`): one virtual host per visible HTTP (or
//! protocol-sniffed) service that has the port, named `<fqdn>:<port>`, whose domains
//! are every name a client in the proxy's namespace may use for it (see
//! [`virtual_host_domains`]). A service whose VirtualService (bound to `mesh`, chosen by
//! [`ConfigIndex::virtual_service_for_host`]) yields routes for this proxy and port gets
//! those routes, in order, and nothing else: as in Istio, a request no VirtualService
//! route matches gets a 404 (there is no fallback route). A service without one, or
//! whose VirtualService yields no route for this proxy (every match is for another
//! port, other source labels or another gateway), gets the single `default` route to
//! `outbound|<port>||<fqdn>`. VirtualService hosts that are not services on this port
//! (`bookinfo.com`) get a virtual host of their own, on the ports of the services the
//! VirtualService routes, or on port 80 when it routes none. Domains are
//! de-duplicated across virtual hosts (Envoy rejects duplicates), virtual hosts are
//! sorted by name, and a last catch-all virtual host (`*`) sends everything else to
//! `PassthroughCluster` (`allow_any`, outbound traffic policy ALLOW_ANY) or answers
//! 502 (`block_all`, REGISTRY_ONLY).
//!
//! **Gateways** (route name `http.<port>[.<bind>]`, or
//! `https.<port>.<portName>.<gateway>.<namespace>[.<bind>]` for a terminated HTTPS
//! server): for every server of the Gateways selecting the router whose route name this
//! is, the VirtualServices bound to that gateway (`<ns>/<name>`) whose hosts intersect
//! the server's hosts add their routes to a virtual host per intersecting host
//! (`<host>:<port>`); a server with `tls.httpsRedirect` makes its virtual hosts require
//! TLS (Envoy answers plain HTTP with a 301 to https).
//!
//! Route translation covers matches (uri, headers, `withoutHeaders`, method,
//! authority, scheme, query parameters, port, source labels/namespace, gateways,
//! `ignoreUriCase`), single and weighted destinations, retries (mesh default when
//! unset), timeouts, fault injection, mirrors, rewrites, redirects, direct responses,
//! header operations, CORS and DestinationRule consistent-hash policies.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::{
    DataSource, HeaderValue, HeaderValueOption, Metadata, RuntimeFractionalPercent, data_source,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::config::route::v3::{
    Decorator, DirectResponseAction, HeaderMatcher, QueryParameterMatcher, RedirectAction,
    RetryPolicy, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, WeightedCluster,
    header_matcher, query_parameter_matcher, redirect_action, retry_policy, route, route_action,
    route_match, virtual_host, weighted_cluster,
};
use envoy_types::pb::envoy::extensions::filters::common::fault::v3::{FaultDelay, fault_delay};
use envoy_types::pb::envoy::extensions::filters::http::cors::v3::CorsPolicy as CorsFilterPolicy;
use envoy_types::pb::envoy::extensions::filters::http::fault::v3::{
    FaultAbort, HttpFault, fault_abort,
};
use envoy_types::pb::envoy::extensions::retry::host::previous_hosts::v3::PreviousHostsPredicate;
use envoy_types::pb::envoy::extensions::retry::priority::previous_priorities::v3::PreviousPrioritiesConfig;
use envoy_types::pb::envoy::r#type::matcher::v3::{
    MetadataMatcher, RegexMatchAndSubstitute, RegexMatcher, StringMatcher, string_matcher,
};
use envoy_types::pb::envoy::r#type::v3::{FractionalPercent, fractional_percent::DenominatorType};
use envoy_types::pb::google::protobuf::{
    Any, BoolValue, Duration as PbDuration, Struct, UInt32Value, Value, value::Kind,
};
use meshfed_api::mesh::v1alpha1::mesh_config::outbound_traffic_policy::Mode as MeshOutboundMode;
use meshfed_api::networking::v1alpha3::{
    self as istio, Destination, HttpMatchRequest, HttpRoute, StringMatch, VirtualService,
    http_body, http_fault_injection, http_redirect,
    load_balancer_settings::{ConsistentHashLb, LbPolicy, consistent_hash_lb::HashKey},
    outbound_traffic_policy::Mode as SidecarOutboundMode,
    string_match::MatchType,
};
use meshfed_registry::{Port, Protocol, ProviderId, Resolution, Service};
use prost::{Message, Name};

use crate::generate::merged_gateway::{MergedGateway, MergedServer};
use crate::model::{ClientView, Generator};
use crate::push::config_index::{Config, MESH_GATEWAY, fqdn, host_matches};
use crate::push::snapshot::Snapshot;

/// Name of the route Istio generates for a service without a VirtualService.
pub const DEFAULT_ROUTE: &str = "default";
/// Name of the catch-all virtual host (and route) under ALLOW_ANY.
pub const ALLOW_ANY: &str = "allow_any";
/// Name of the catch-all virtual host (and route) under REGISTRY_ONLY.
pub const BLOCK_ALL: &str = "block_all";
/// The fault-injection HTTP filter (per-route config key).
pub const FAULT_FILTER: &str = "envoy.filters.http.fault";
/// The CORS HTTP filter (per-route config key).
pub const CORS_FILTER: &str = "envoy.filters.http.cors";
/// Istio's default `retry_on` (`retry.DefaultPolicy`).
pub const DEFAULT_RETRY_ON: &str =
    "connect-failure,refused-stream,unavailable,cancelled,retriable-status-codes";
/// Retry host predicate that prefers hosts not tried yet.
pub const PREVIOUS_HOSTS_PREDICATE: &str = "envoy.retry_host_predicates.previous_hosts";
/// Retry priority used by `retryRemoteLocalities`.
pub const PREVIOUS_PRIORITIES: &str = "envoy.retry_priorities.previous_priorities";
/// Istio's limit for direct response bodies (1 MiB).
pub const MAX_DIRECT_RESPONSE_BODY_BYTES: u32 = 1024 * 1024;

// ---------------------------------------------------------------------------------
// Sidecars

/// The outbound route table `"<port>"` of a sidecar (see the module docs).
pub fn sidecar_route_config(
    snapshot: &Snapshot,
    proxy: &ClientView,
    port: u16,
) -> RouteConfiguration {
    let mut virtual_hosts = sidecar_virtual_hosts(snapshot, proxy, port);
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    virtual_hosts.push(catch_all_virtual_host(snapshot, proxy));
    route_configuration(port.to_string(), virtual_hosts)
}

/// The virtual host of one service port as `proxy` sees it: the service's domains and
/// the routes of its VirtualService, or the default route. This is the single virtual
/// host of a proxyless gRPC client's route table `outbound|<port>||<fqdn>`.
pub fn service_virtual_host(
    snapshot: &Snapshot,
    proxy: &ClientView,
    service: &Service,
    port: &Port,
) -> VirtualHost {
    let ctx = RouteCtx::sidecar(snapshot, proxy, port.port.get());
    let routes = snapshot
        .config()
        .virtual_service_for_host(&proxy.namespace, service.hostname.as_str())
        .map(|vs| vs_routes(&ctx, vs))
        .filter(|routes| !routes.is_empty())
        .unwrap_or_else(|| vec![default_route(&ctx, service, port)]);
    let (domains, _) = virtual_host_domains(service, port.port.get(), proxy);
    new_virtual_host(
        join_host_port(service.hostname.as_str(), port.port.get()),
        domains,
        routes,
    )
}

fn sidecar_virtual_hosts(snapshot: &Snapshot, proxy: &ClientView, port: u16) -> Vec<VirtualHost> {
    let ns = proxy.namespace.as_str();
    let ctx = RouteCtx::sidecar(snapshot, proxy, port);
    // The services on this port, one per hostname, as the proxy resolves each name;
    // with Sidecar egress listeners, those of the listener serving this port.
    let mut services: BTreeMap<&str, &Arc<Service>> = BTreeMap::new();
    for s in snapshot.route_services(&proxy.namespace, &proxy.labels, port) {
        let host = s.hostname.as_str();
        if services.contains_key(host) {
            continue;
        }
        if let Some(resolved) = snapshot.services().resolve(host, ns)
            && resolved.port(port).is_some()
        {
            services.insert(host, resolved);
        }
    }
    let routable = |s: &Service| s.port(port).is_some_and(http_or_sniffed);

    let virtual_services: Vec<&Arc<Config<VirtualService>>> =
        snapshot.route_virtual_services(ns, &proxy.labels, port);
    let routes: Vec<Vec<Route>> = virtual_services
        .iter()
        .map(|vs| vs_routes(&ctx, vs))
        .collect();
    // Each service takes the routes of its VirtualService if that yields any here.
    let mut owned: Vec<Vec<&Arc<Service>>> = vec![Vec::new(); virtual_services.len()];
    let mut unowned: Vec<&Arc<Service>> = Vec::new();
    for (&host, &service) in &services {
        if !routable(service) {
            continue;
        }
        let owner = crate::push::config_index::most_specific_virtual_service(
            virtual_services.iter().copied(),
            host,
        )
        .and_then(|vs| virtual_services.iter().position(|v| Arc::ptr_eq(v, vs)))
        .filter(|&i| !routes[i].is_empty());
        match owner {
            Some(i) => owned[i].push(service),
            None => unowned.push(service),
        }
    }

    let mut set = VirtualHostSet::new(services.keys().copied(), port);
    for (i, vs) in virtual_services.iter().enumerate() {
        if routes[i].is_empty() || (owned[i].is_empty() && port != 80) {
            continue;
        }
        for host in non_service_hosts(&vs.spec, &services) {
            let host = host.to_ascii_lowercase();
            let domains = vec![host.clone(), join_host_port(&host, port)];
            set.add(join_host_port(&host, port), domains, &[], routes[i].clone());
        }
        for service in &owned[i] {
            let (domains, alt) = virtual_host_domains(service, port, proxy);
            let name = join_host_port(service.hostname.as_str(), port);
            set.add(name, domains, &alt, routes[i].clone());
        }
    }
    for service in unowned {
        let Some(service_port) = service.port(port) else {
            continue;
        };
        let (domains, alt) = virtual_host_domains(service, port, proxy);
        let name = join_host_port(service.hostname.as_str(), port);
        let routes = vec![default_route(&ctx, service, service_port)];
        set.add(name, domains, &alt, routes);
    }
    set.virtual_hosts
}

/// The hosts of a VirtualService that are not services on this port: exact hosts that
/// name none, and wildcard hosts that match none.
fn non_service_hosts<'v>(
    vs: &'v VirtualService,
    services: &BTreeMap<&str, &Arc<Service>>,
) -> Vec<&'v str> {
    vs.hosts
        .iter()
        .filter(|h| {
            if h.starts_with('*') {
                !services.keys().any(|s| host_matches(h, s))
            } else {
                !services.contains_key(h.as_str())
            }
        })
        .map(String::as_str)
        .collect()
}

/// Virtual hosts being collected for one route table: names and domains stay unique
/// (Envoy rejects a table with duplicates), first come first served, as in Istio.
struct VirtualHostSet {
    names: HashSet<String>,
    domains: HashSet<String>,
    /// Service FQDNs (with and without port): a short name that expands to one of
    /// them must not shadow the real service.
    known_fqdns: HashSet<String>,
    virtual_hosts: Vec<VirtualHost>,
}

impl VirtualHostSet {
    fn new<'a>(fqdns: impl Iterator<Item = &'a str>, port: u16) -> Self {
        let mut known_fqdns = HashSet::new();
        for h in fqdns {
            known_fqdns.insert(h.to_string());
            known_fqdns.insert(join_host_port(h, port));
        }
        VirtualHostSet {
            names: HashSet::new(),
            // `*` belongs to the catch-all virtual host that ends every sidecar table.
            domains: HashSet::from(["*".to_string()]),
            known_fqdns,
            virtual_hosts: Vec::new(),
        }
    }

    fn add(&mut self, name: String, domains: Vec<String>, alt: &[String], routes: Vec<Route>) {
        if !self.names.insert(name.clone()) {
            tracing::debug!(virtual_host = %name, "duplicate virtual host dropped");
            return;
        }
        let domains: Vec<String> = domains
            .into_iter()
            .filter(|d| !(alt.contains(d) && self.known_fqdns.contains(d)))
            .filter(|d| self.domains.insert(d.to_ascii_lowercase()))
            .collect();
        if domains.is_empty() {
            return;
        }
        self.virtual_hosts
            .push(new_virtual_host(name, domains, routes));
    }
}

fn new_virtual_host(name: String, domains: Vec<String>, routes: Vec<Route>) -> VirtualHost {
    VirtualHost {
        name,
        domains,
        routes,
        include_request_attempt_count: true,
        ..Default::default()
    }
}

fn route_configuration(name: String, virtual_hosts: Vec<VirtualHost>) -> RouteConfiguration {
    RouteConfiguration {
        name,
        virtual_hosts,
        validate_clusters: Some(BoolValue { value: false }),
        max_direct_response_body_size_bytes: Some(UInt32Value {
            value: MAX_DIRECT_RESPONSE_BODY_BYTES,
        }),
        ..Default::default()
    }
}

fn http_or_sniffed(port: &Port) -> bool {
    port.protocol.is_http() || port.protocol == Protocol::Unsupported
}

/// The names a client with `proxy`'s DNS domain may use for `service:port`, and the
/// subset of them that are expansions (short names, absolute form): the hostname, its
/// absolute form (`fqdn.`), the short forms a resolver would expand (`name` only from
/// the same namespace, `name.ns`, `name.ns.svc`), each with and without `:port`; a
/// headless Kubernetes service also gets `*.`-prefixed forms; then the service VIP in
/// the proxy's cluster.
pub fn virtual_host_domains(
    service: &Service,
    port: u16,
    proxy: &ClientView,
) -> (Vec<String>, Vec<String>) {
    let hostname = service.hostname.as_str();
    let mut domains = vec![ipv6_compliant(hostname), join_host_port(hostname, port)];
    let alt = alt_hosts(hostname, port, &proxy.dns_domain);
    domains.extend(alt.iter().cloned());
    if service.resolution == Resolution::Passthrough && service.provider == ProviderId::Kubernetes {
        let wildcards: Vec<String> = domains.iter().map(|d| format!("*.{d}")).collect();
        domains.extend(wildcards);
    }
    for ip in addresses_for_proxy(service, proxy) {
        if !ip.is_unspecified() {
            domains.push(ipv6_compliant(&ip.to_string()));
            domains.push(join_host_port(&ip.to_string(), port));
        }
    }
    let mut seen = HashSet::new();
    domains.retain(|d| seen.insert(d.clone()));
    (domains, alt)
}

/// The service's VIPs in the proxy's cluster, else its default address.
fn addresses_for_proxy(service: &Service, proxy: &ClientView) -> Vec<IpAddr> {
    if let Some(vips) = proxy
        .cluster_id
        .as_ref()
        .and_then(|c| service.cluster_vips.get(c))
        .filter(|v| !v.is_empty())
    {
        return vips.clone();
    }
    service
        .address_for_proxy(proxy.cluster_id.as_ref(), proxy.uses_auto_allocated)
        .into_iter()
        .collect()
}

/// Istio's `GenerateAltVirtualHosts`: the absolute form and the short names of
/// `hostname` for a client in `dns_domain`, with and without port.
fn alt_hosts(hostname: &str, port: u16, dns_domain: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut add = |h: &str| {
        out.push(h.to_string());
        out.push(join_host_port(h, port));
    };
    if hostname.parse::<IpAddr>().is_err() {
        add(&format!("{hostname}."));
    }
    if let Some(svc_at) = dns_domain.find(".svc.") {
        // A Kubernetes client: only `<name>.<ns>.svc.<same suffix>` services have short
        // names; expanding anything else could shadow another service's real name.
        let client_ns = &dns_domain[..svc_at];
        let suffix = &dns_domain[svc_at..];
        let Some((name, ns)) = hostname
            .strip_suffix(suffix)
            .and_then(|name_ns| name_ns.split_once('.'))
        else {
            return out;
        };
        if name.is_empty() || ns.is_empty() || ns.contains('.') {
            return out;
        }
        if ns == client_ns {
            add(name);
        }
        add(&format!("{name}.{ns}"));
        add(&format!("{name}.{ns}.svc"));
        return out;
    }
    // Elsewhere: drop the suffix shared with the client's domain.
    let host_labels: Vec<&str> = hostname.split('.').collect();
    let domain_labels: Vec<&str> = dns_domain.split('.').collect();
    let shared = host_labels
        .iter()
        .rev()
        .zip(domain_labels.iter().rev())
        .take_while(|(a, b)| a == b)
        .count();
    if shared == 0 || shared >= host_labels.len() {
        return out;
    }
    let unique = host_labels[..host_labels.len() - shared].join(".");
    add(&unique);
    if host_labels.len() - shared == 2 {
        add(&format!(
            "{unique}.{}",
            host_labels[host_labels.len() - shared]
        ));
    }
    out
}

fn ipv6_compliant(host: &str) -> String {
    if host.contains(':') && host.parse::<IpAddr>().is_ok() {
        format!("[{host}]")
    } else {
        host.to_string()
    }
}

/// `host:port`, bracketing an IPv6 address.
fn join_host_port(host: &str, port: u16) -> String {
    format!("{}:{port}", ipv6_compliant(host))
}

// ---------------------------------------------------------------------------------
// Outbound traffic policy

/// What a sidecar does with traffic to hosts it has no virtual host for: the
/// Sidecar's `outboundTrafficPolicy` if its scope has one, else meshConfig's.
#[derive(Clone, Debug, PartialEq)]
pub enum OutboundPolicy {
    /// ALLOW_ANY: forward as addressed (or to the egress proxy).
    AllowAny { egress_proxy: Option<Destination> },
    /// REGISTRY_ONLY: refuse.
    RegistryOnly,
}

/// The outbound traffic policy in force for `proxy`.
pub fn outbound_policy(snapshot: &Snapshot, proxy: &ClientView) -> OutboundPolicy {
    if let Some(policy) = snapshot
        .config()
        .sidecar_for(&proxy.namespace, &proxy.labels)
        .and_then(|s| s.spec.outbound_traffic_policy.as_ref())
    {
        return if policy.mode == SidecarOutboundMode::AllowAny as i32 {
            OutboundPolicy::AllowAny {
                egress_proxy: policy.egress_proxy.clone(),
            }
        } else {
            OutboundPolicy::RegistryOnly
        };
    }
    match &snapshot.mesh().config.outbound_traffic_policy {
        Some(p) if p.mode == MeshOutboundMode::RegistryOnly as i32 => OutboundPolicy::RegistryOnly,
        _ => OutboundPolicy::AllowAny { egress_proxy: None },
    }
}

fn catch_all_virtual_host(snapshot: &Snapshot, proxy: &ClientView) -> VirtualHost {
    let prefix_all = || RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
        ..Default::default()
    };
    match outbound_policy(snapshot, proxy) {
        OutboundPolicy::AllowAny { egress_proxy } => {
            let cluster = match egress_proxy {
                Some(d) => {
                    outbound_cluster_name(d.port.map_or(0, |p| p.number), &d.subset, &d.host)
                }
                None => crate::xds::names::PASSTHROUGH.to_string(),
            };
            let mut action = RouteAction {
                cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(cluster)),
                ..Default::default()
            };
            set_timeout(&mut action, None, false);
            new_virtual_host(
                ALLOW_ANY.to_string(),
                vec!["*".to_string()],
                vec![Route {
                    name: ALLOW_ANY.to_string(),
                    r#match: Some(prefix_all()),
                    action: Some(route::Action::Route(action)),
                    ..Default::default()
                }],
            )
        }
        OutboundPolicy::RegistryOnly => new_virtual_host(
            BLOCK_ALL.to_string(),
            vec!["*".to_string()],
            vec![Route {
                name: BLOCK_ALL.to_string(),
                r#match: Some(prefix_all()),
                action: Some(route::Action::DirectResponse(DirectResponseAction {
                    status: 502,
                    ..Default::default()
                })),
                ..Default::default()
            }],
        ),
    }
}

// ---------------------------------------------------------------------------------
// Gateways

/// A parsed gateway route name.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum GatewayRouteName<'a> {
    /// `http.<port>[.<bind>]`: every plain HTTP server on the port.
    Http { port: u16, bind: &'a str },
    /// `https.<port>.<portName>.<gateway>.<namespace>[.<bind>]`: one terminated HTTPS
    /// server.
    Https {
        port: u16,
        port_name: &'a str,
        gateway: &'a str,
        namespace: &'a str,
        bind: &'a str,
    },
}

impl<'a> GatewayRouteName<'a> {
    /// Parses a gateway route name; `None` for anything else.
    pub fn parse(name: &'a str) -> Option<Self> {
        if let Some(rest) = name.strip_prefix("http.") {
            let (port, bind) = rest.split_once('.').unwrap_or((rest, ""));
            return Some(GatewayRouteName::Http {
                port: port.parse().ok()?,
                bind,
            });
        }
        let rest = name.strip_prefix("https.")?;
        let mut parts = rest.splitn(5, '.');
        let port = parts.next()?.parse().ok()?;
        let port_name = parts.next()?;
        let gateway = parts.next()?;
        let namespace = parts.next()?;
        let bind = parts.next().unwrap_or("");
        Some(GatewayRouteName::Https {
            port,
            port_name,
            gateway,
            namespace,
            bind,
        })
    }
}

/// The route table `route_name` of a gateway proxy (see the module docs): `None` when
/// the name is not a gateway route name; an empty table when no server of a Gateway
/// selecting the proxy has that name (a gateway deleted while Envoy drains).
pub fn gateway_route_config(
    snapshot: &Snapshot,
    proxy: &ClientView,
    merged: &MergedGateway,
    route_name: &str,
) -> Option<RouteConfiguration> {
    GatewayRouteName::parse(route_name)?;
    let servers: Vec<&MergedServer> = merged.route_servers(route_name).collect();
    if servers.is_empty() {
        return Some(route_configuration(route_name.to_string(), Vec::new()));
    }

    // Keyed by lower-case host: one virtual host per host across servers.
    let mut by_host: BTreeMap<String, VirtualHost> = BTreeMap::new();
    for server in &servers {
        let gateway_name = server.gateway_name();
        let s = server.server();
        let port = server.port();
        // Redirects apply to plaintext servers; a terminating HTTPS server serves.
        let redirect = s.tls.as_ref().is_some_and(|t| t.https_redirect)
            && server.protocol() != Protocol::Https;
        let ctx = RouteCtx {
            snapshot,
            proxy,
            listen_port: port,
            gateway: &gateway_name,
            tls: s.tls.is_some(),
        };
        for vs in snapshot
            .config()
            .virtual_services(&proxy.namespace, &gateway_name)
        {
            let server_hosts =
                server_hosts_for_namespace(&server.hosts, &vs.namespace, &server.gateway.namespace);
            let hosts = intersect_hosts(&server_hosts, &vs.spec.hosts);
            if hosts.is_empty() {
                continue;
            }
            let routes = vs_routes(&ctx, vs);
            if routes.is_empty() {
                continue;
            }
            for host in hosts {
                let host = host.to_ascii_lowercase();
                let vh = by_host.entry(host.clone()).or_insert_with(|| {
                    let domains = vec![host.clone(), join_host_port(&host, port)];
                    new_virtual_host(join_host_port(&host, port), domains, Vec::new())
                });
                vh.routes.extend(routes.iter().cloned());
                if redirect {
                    vh.require_tls = virtual_host::TlsRequirementType::All as i32;
                }
            }
        }
        if redirect {
            for host in &server.hosts {
                let host = strip_namespace(host).to_ascii_lowercase();
                let vh = by_host.entry(host.clone()).or_insert_with(|| {
                    let domains = vec![host.clone(), join_host_port(&host, port)];
                    new_virtual_host(join_host_port(&host, port), domains, Vec::new())
                });
                vh.require_tls = virtual_host::TlsRequirementType::All as i32;
            }
        }
    }

    let mut virtual_hosts: Vec<VirtualHost> = if by_host.is_empty() {
        // No routes at all: Envoy answers 404 for everything.
        vec![new_virtual_host(
            join_host_port("blackhole", servers[0].port()),
            vec!["*".to_string()],
            Vec::new(),
        )]
    } else {
        by_host
            .into_values()
            .map(|mut vh| {
                vh.routes = catch_alls_last(std::mem::take(&mut vh.routes));
                vh
            })
            .collect()
    };
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    Some(route_configuration(route_name.to_string(), virtual_hosts))
}

fn strip_namespace(host: &str) -> &str {
    host.split_once('/').map_or(host, |(_, h)| h)
}

/// A server's hosts that a VirtualService in `vs_ns` may bind to (`ns/host`, `*/host`,
/// `./host` = the gateway's namespace, or a bare host), namespace stripped.
fn server_hosts_for_namespace(hosts: &[String], vs_ns: &str, gateway_ns: &str) -> Vec<String> {
    hosts
        .iter()
        .filter_map(|h| match h.split_once('/') {
            Some((ns, host)) => (ns == "*" || ns == vs_ns || (ns == "." && vs_ns == gateway_ns))
                .then(|| host.to_string()),
            None => Some(h.clone()),
        })
        .collect()
}

/// Istio's `Names.Intersection`: for each pair where one host covers the other, the
/// more specific one, without duplicates.
fn intersect_hosts(server_hosts: &[String], vs_hosts: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in server_hosts {
        for v in vs_hosts {
            let pick = if host_matches(v, s) {
                s
            } else if host_matches(s, v) {
                v
            } else {
                continue;
            };
            if !out.contains(pick) {
                out.push(pick.clone());
            }
        }
    }
    out
}

/// Istio's `SortVHostRoutes`: catch-all routes move to the end, the rest keep order.
fn catch_alls_last(routes: Vec<Route>) -> Vec<Route> {
    let (catch_alls, mut rest): (Vec<Route>, Vec<Route>) =
        routes.into_iter().partition(is_catch_all);
    rest.extend(catch_alls);
    rest
}

// ---------------------------------------------------------------------------------
// VirtualService translation

/// What route translation depends on besides the VirtualService.
struct RouteCtx<'a> {
    snapshot: &'a Snapshot,
    proxy: &'a ClientView,
    /// The port of the listener (sidecar) or server (gateway) the routes are for.
    listen_port: u16,
    /// `mesh`, or the `<ns>/<name>` of the gateway.
    gateway: &'a str,
    /// The server terminates TLS (redirect scheme default).
    tls: bool,
}

impl<'a> RouteCtx<'a> {
    fn sidecar(snapshot: &'a Snapshot, proxy: &'a ClientView, port: u16) -> Self {
        RouteCtx {
            snapshot,
            proxy,
            listen_port: port,
            gateway: MESH_GATEWAY,
            tls: false,
        }
    }

    fn is_gateway(&self) -> bool {
        self.gateway != MESH_GATEWAY
    }

    /// The service a destination host names: for gateways the one in the
    /// VirtualService's namespace if the proxy may see it, otherwise (and for
    /// sidecars) the one the proxy resolves.
    fn lookup(&self, host: &str, vs_ns: &str) -> Option<&'a Arc<Service>> {
        let services = &self.snapshot.services();
        let proxy_ns = self.proxy.namespace.as_str();
        if self.is_gateway()
            && let Some(s) = services.resolve(host, vs_ns)
            && s.export_to.visible_to(s.namespace.as_str(), proxy_ns)
        {
            return Some(s);
        }
        services.resolve(host, proxy_ns)
    }

    fn full_host(&self, host: &str, vs_ns: &str) -> String {
        fqdn(host, vs_ns, &self.snapshot.config().domain)
    }

    /// The cluster of a destination: `outbound|<port>|<subset>|<host>` where the port is
    /// the destination's, else this listener's port if the service has it, else the
    /// service's only port, else this listener's port.
    fn destination_cluster(&self, dst: &Destination, vs_ns: &str) -> String {
        let host = self.full_host(&dst.host, vs_ns);
        let port = match dst.port.map(|p| p.number).filter(|n| *n != 0) {
            Some(n) => n,
            None => match self.lookup(&host, vs_ns) {
                Some(s) if s.port(self.listen_port).is_none() && s.ports.len() == 1 => {
                    u32::from(s.ports[0].port.get())
                }
                _ => u32::from(self.listen_port),
            },
        };
        outbound_cluster_name(port, &dst.subset, &host)
    }

    /// The consistent-hash policy a DestinationRule asks for on a destination (most
    /// specific first: subset port-level, subset, port-level, rule-wide).
    fn destination_hash(&self, dst: &Destination, vs_ns: &str) -> Option<ConsistentHashLb> {
        let host = self.full_host(&dst.host, vs_ns);
        let service_ns = self
            .lookup(&host, vs_ns)
            .map_or(self.proxy.namespace.as_str(), |s| s.namespace.as_str());
        let dr =
            self.snapshot
                .config()
                .destination_rule(&self.proxy.namespace, service_ns, &host)?;
        let explicit_port = dst.port.map(|p| p.number).filter(|n| *n != 0);
        let policy = dr.spec.traffic_policy.as_ref();
        let subset_policy = dr
            .spec
            .subsets
            .iter()
            .find(|s| s.name == dst.subset)
            .and_then(|s| s.traffic_policy.as_ref());
        let port_level = |tp: Option<&istio::TrafficPolicy>| {
            let port = explicit_port?;
            tp?.port_level_settings
                .iter()
                .find(|pls| pls.port.is_some_and(|p| p.number == port))
                .and_then(|pls| lb_hash(pls.load_balancer.as_ref()))
        };
        port_level(subset_policy)
            .or_else(|| subset_policy.and_then(|tp| lb_hash(tp.load_balancer.as_ref())))
            .or_else(|| port_level(policy))
            .or_else(|| policy.and_then(|tp| lb_hash(tp.load_balancer.as_ref())))
    }

    /// The consistent-hash policy for a service's default route (rule-wide, overridden
    /// by the port's settings).
    fn service_hash(&self, service: &Service, port: u16) -> Option<ConsistentHashLb> {
        let dr = self.snapshot.config().destination_rule(
            &self.proxy.namespace,
            service.namespace.as_str(),
            service.hostname.as_str(),
        )?;
        let policy = dr.spec.traffic_policy.as_ref()?;
        policy
            .port_level_settings
            .iter()
            .find(|pls| pls.port.is_some_and(|p| p.number == u32::from(port)))
            .and_then(|pls| lb_hash(pls.load_balancer.as_ref()))
            .or_else(|| lb_hash(policy.load_balancer.as_ref()))
    }

    fn default_retry(&self) -> Option<&'a istio::HttpRetry> {
        self.snapshot
            .mesh()
            .config
            .default_http_retry_policy
            .as_ref()
    }
}

fn lb_hash(lb: Option<&istio::LoadBalancerSettings>) -> Option<ConsistentHashLb> {
    match lb?.lb_policy.as_ref()? {
        LbPolicy::ConsistentHash(h) => Some(h.clone()),
        LbPolicy::Simple(_) => None,
    }
}

/// `outbound|<port>|<subset>|<host>`.
fn outbound_cluster_name(port: u32, subset: &str, host: &str) -> String {
    format!("outbound|{port}|{subset}|{host}")
}

/// The Envoy routes of a VirtualService for this context, in order; translation stops
/// after the first catch-all route (nothing after it can match).
fn vs_routes(ctx: &RouteCtx<'_>, vs: &Config<VirtualService>) -> Vec<Route> {
    let mut out = Vec::new();
    for http in &vs.spec.http {
        let mut catch_all = false;
        if http.r#match.is_empty() {
            out.extend(translate_route(ctx, vs, http, None));
            catch_all = true;
        } else {
            for m in &http.r#match {
                if let Some(r) = translate_route(ctx, vs, http, Some(m)) {
                    let is_catch_all = is_catch_all(&r);
                    out.push(r);
                    if is_catch_all {
                        catch_all = true;
                        break;
                    }
                }
            }
        }
        if catch_all {
            break;
        }
    }
    out
}

/// Whether a match condition applies to this proxy: the gateways it names include
/// this one, or (when it names none) the proxy has its source labels and namespace.
fn source_matches(ctx: &RouteCtx<'_>, vs_ns: &str, m: &HttpMatchRequest) -> bool {
    if !m.gateways.is_empty() {
        return m.gateways.iter().any(|g| {
            if g == MESH_GATEWAY || g.contains('/') {
                g == ctx.gateway
            } else {
                format!("{vs_ns}/{g}") == ctx.gateway
            }
        });
    }
    m.source_labels
        .iter()
        .all(|(k, v)| ctx.proxy.labels.get(k) == Some(v))
        && (m.source_namespace.is_empty() || m.source_namespace == ctx.proxy.namespace)
}

fn translate_route(
    ctx: &RouteCtx<'_>,
    vs: &Config<VirtualService>,
    http: &HttpRoute,
    m: Option<&HttpMatchRequest>,
) -> Option<Route> {
    if let Some(m) = m {
        if m.port != 0 && m.port != u32::from(ctx.listen_port) {
            return None;
        }
        if !source_matches(ctx, &vs.namespace, m) {
            return None;
        }
    }
    let name = match m {
        Some(m) if !m.name.is_empty() => format!("{}.{}", http.name, m.name),
        _ => http.name.clone(),
    };
    let mut out = Route {
        name,
        r#match: Some(translate_match(m)),
        metadata: Some(config_metadata(vs)),
        ..Default::default()
    };
    if let Some(m) = m
        && !m.stat_prefix.is_empty()
    {
        out.stat_prefix = m.stat_prefix.clone();
    }
    let mut authority = String::new();
    if let Some(headers) = &http.headers {
        let ops = header_operations(headers);
        out.request_headers_to_add = ops.request_add;
        out.response_headers_to_add = ops.response_add;
        out.request_headers_to_remove = ops.request_remove;
        out.response_headers_to_remove = ops.response_remove;
        authority = ops.authority;
    }
    if let Some(redirect) = &http.redirect {
        out.action = Some(redirect_action(redirect, ctx.listen_port, ctx.tls)?);
    } else if let Some(direct) = &http.direct_response {
        out.action = Some(direct_response_action(direct));
    } else {
        let action = route_destination(ctx, vs, http, &mut out, authority)?;
        out.action = Some(route::Action::Route(action));
    }
    out.decorator = Some(Decorator {
        operation: route_operation(&out, &vs.name, ctx.listen_port),
        ..Default::default()
    });
    if let Some(fault) = http.fault.as_ref().and_then(translate_fault) {
        out.typed_per_filter_config
            .insert(FAULT_FILTER.to_string(), any(&fault));
    }
    if let Some(cors) = &http.cors_policy {
        out.typed_per_filter_config
            .insert(CORS_FILTER.to_string(), any(&translate_cors(cors)));
    }
    Some(out)
}

/// The route action for forwarding: clusters, timeout, rewrites, mirrors, retries and
/// hash policies; per-destination header operations go on the route (one destination)
/// or on each weighted cluster. `None` when there is nowhere to forward to.
fn route_destination(
    ctx: &RouteCtx<'_>,
    vs: &Config<VirtualService>,
    http: &HttpRoute,
    out: &mut Route,
    mut authority: String,
) -> Option<RouteAction> {
    let vs_ns = vs.namespace.as_str();
    let mut action = RouteAction::default();
    set_timeout(
        &mut action,
        http.timeout.as_ref(),
        ctx.proxy.generator == Generator::Grpc,
    );
    if let Some(rewrite) = &http.rewrite {
        if let Some(rr) = &rewrite.uri_regex_rewrite {
            action.regex_rewrite = Some(RegexMatchAndSubstitute {
                pattern: Some(regex_matcher(&rr.r#match)),
                substitution: rr.rewrite.clone(),
            });
        } else if !rewrite.uri.is_empty() {
            action.prefix_rewrite = rewrite.uri.clone();
        }
        if !rewrite.authority.is_empty() {
            authority = rewrite.authority.clone();
        }
    }
    if !authority.is_empty() {
        action.host_rewrite_specifier = Some(
            route_action::HostRewriteSpecifier::HostRewriteLiteral(authority),
        );
    }
    if let Some(mirror) = &http.mirror
        && let Some(fraction) = mirror_percent(http)
    {
        action.request_mirror_policies.push(mirror_policy(
            ctx.destination_cluster(mirror, vs_ns),
            fraction,
        ));
    }
    for mirror in &http.mirrors {
        if let (Some(dst), Some(fraction)) = (&mirror.destination, mirror_policy_percent(mirror)) {
            action
                .request_mirror_policies
                .push(mirror_policy(ctx.destination_cluster(dst, vs_ns), fraction));
        }
    }

    let mut consistent_hash = false;
    match http.route.as_slice() {
        [] => return None,
        [single] => {
            let dst = single.destination.as_ref()?;
            action.cluster_specifier = Some(route_action::ClusterSpecifier::Cluster(
                ctx.destination_cluster(dst, vs_ns),
            ));
            if let Some(headers) = &single.headers {
                let ops = header_operations(headers);
                out.request_headers_to_add.extend(ops.request_add);
                out.request_headers_to_remove.extend(ops.request_remove);
                out.response_headers_to_add.extend(ops.response_add);
                out.response_headers_to_remove.extend(ops.response_remove);
                if !ops.authority.is_empty() && action.host_rewrite_specifier.is_none() {
                    action.host_rewrite_specifier = Some(
                        route_action::HostRewriteSpecifier::HostRewriteLiteral(ops.authority),
                    );
                }
            }
            if let Some(hash) = ctx.destination_hash(dst, vs_ns) {
                action.hash_policy.extend(hash_policy(&hash));
                consistent_hash = true;
            }
        }
        many => {
            let mut clusters = Vec::new();
            // Zero-weight destinations are left out when there are others.
            for rd in many.iter().filter(|rd| rd.weight != 0) {
                let dst = rd.destination.as_ref()?;
                let mut cw = weighted_cluster::ClusterWeight {
                    name: ctx.destination_cluster(dst, vs_ns),
                    weight: Some(UInt32Value {
                        value: rd.weight.max(0) as u32,
                    }),
                    ..Default::default()
                };
                if let Some(headers) = &rd.headers {
                    let ops = header_operations(headers);
                    cw.request_headers_to_add = ops.request_add;
                    cw.request_headers_to_remove = ops.request_remove;
                    cw.response_headers_to_add = ops.response_add;
                    cw.response_headers_to_remove = ops.response_remove;
                    if !ops.authority.is_empty() {
                        cw.host_rewrite_specifier = Some(
                            weighted_cluster::cluster_weight::HostRewriteSpecifier::HostRewriteLiteral(
                                ops.authority,
                            ),
                        );
                    }
                }
                if let Some(hash) = ctx.destination_hash(dst, vs_ns) {
                    action.hash_policy.extend(hash_policy(&hash));
                }
                clusters.push(cw);
            }
            if clusters.is_empty() {
                return None;
            }
            action.cluster_specifier = Some(route_action::ClusterSpecifier::WeightedClusters(
                WeightedCluster {
                    clusters,
                    ..Default::default()
                },
            ));
        }
    }
    let policy = http.retries.as_ref().or(ctx.default_retry());
    action.retry_policy = retry_policy(policy, consistent_hash);
    Some(action)
}

/// The route for a service without a VirtualService: everything to its cluster, with
/// the mesh's default retry policy and no timeout.
fn default_route(ctx: &RouteCtx<'_>, service: &Service, port: &Port) -> Route {
    let number = port.port.get();
    let hostname = service.hostname.as_str();
    let mut action = RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(
            crate::xds::names::outbound_name(number, "", hostname),
        )),
        retry_policy: retry_policy(ctx.default_retry(), false),
        ..Default::default()
    };
    if let Some(hash) = ctx.service_hash(service, number) {
        action.hash_policy = hash_policy(&hash).into_iter().collect();
    }
    set_timeout(&mut action, None, false);
    Route {
        name: DEFAULT_ROUTE.to_string(),
        r#match: Some(translate_match(None)),
        decorator: Some(Decorator {
            operation: format!("{}/*", join_host_port(hostname, number)),
            ..Default::default()
        }),
        action: Some(route::Action::Route(action)),
        ..Default::default()
    }
}

/// Istio's `setTimeout`: the VirtualService's timeout or 0 (disabled); gRPC's
/// per-stream limit follows it (`max_stream_duration` for proxyless clients, the
/// deprecated `max_grpc_timeout` for Envoy, which Istio still uses).
#[allow(deprecated)]
fn set_timeout(action: &mut RouteAction, timeout: Option<&meshfed_api::Duration>, grpc: bool) {
    let t = timeout.map(pb_duration).unwrap_or_default();
    action.timeout = Some(t);
    if grpc {
        action.max_stream_duration = Some(route_action::MaxStreamDuration {
            max_stream_duration: Some(t),
            ..Default::default()
        });
    } else {
        action.max_grpc_timeout = Some(t);
    }
}

fn pb_duration(d: &meshfed_api::Duration) -> PbDuration {
    PbDuration {
        seconds: d.seconds,
        nanos: d.nanos,
    }
}

/// Istio's `retry.ConvertPolicy`: `None` input gives the default policy (2 retries on
/// connect failures, refused streams, `unavailable`, `cancelled` and 503, preferring
/// hosts not tried yet unless consistent hashing pins the host); `attempts <= 0`
/// disables retries; otherwise the default with the given attempts, `retryOn` (status
/// codes in it become retriable status codes) and per-try timeout.
pub fn retry_policy(
    input: Option<&istio::HttpRetry>,
    consistent_hash: bool,
) -> Option<RetryPolicy> {
    let mut out = RetryPolicy {
        num_retries: Some(UInt32Value { value: 2 }),
        retry_on: DEFAULT_RETRY_ON.to_string(),
        host_selection_retry_max_attempts: 5,
        retriable_status_codes: vec![503],
        ..Default::default()
    };
    if !consistent_hash {
        out.retry_host_predicate = vec![retry_policy::RetryHostPredicate {
            name: PREVIOUS_HOSTS_PREDICATE.to_string(),
            config_type: Some(retry_policy::retry_host_predicate::ConfigType::TypedConfig(
                any(&PreviousHostsPredicate {}),
            )),
        }];
    }
    let Some(input) = input else {
        return Some(out);
    };
    if input.attempts <= 0 {
        return None;
    }
    out.num_retries = Some(UInt32Value {
        value: input.attempts as u32,
    });
    if !input.retry_on.is_empty() {
        let (retry_on, codes) = parse_retry_on(&input.retry_on);
        out.retry_on = retry_on;
        if !codes.is_empty() && !out.retry_on.contains("retriable-status-codes") {
            if !out.retry_on.is_empty() {
                out.retry_on.push(',');
            }
            out.retry_on.push_str("retriable-status-codes");
        }
        out.retriable_status_codes = codes;
    }
    if let Some(t) = &input.per_try_timeout {
        out.per_try_timeout = Some(pb_duration(t));
    }
    if input.retry_remote_localities.is_some_and(|b| b.value) {
        out.retry_priority = Some(retry_policy::RetryPriority {
            name: PREVIOUS_PRIORITIES.to_string(),
            config_type: Some(retry_policy::retry_priority::ConfigType::TypedConfig(any(
                &PreviousPrioritiesConfig {
                    update_frequency: 2,
                },
            ))),
        });
    }
    Some(out)
}

/// Splits `retryOn` into Envoy conditions and HTTP status codes.
fn parse_retry_on(retry_on: &str) -> (String, Vec<u32>) {
    let mut conditions = Vec::new();
    let mut codes = Vec::new();
    for part in retry_on.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part.parse::<u32>() {
            Ok(code) if (100..600).contains(&code) => codes.push(code),
            _ => conditions.push(part),
        }
    }
    (conditions.join(","), codes)
}

fn hash_policy(hash: &ConsistentHashLb) -> Option<route_action::HashPolicy> {
    use route_action::hash_policy::{self, PolicySpecifier};
    let specifier = match hash.hash_key.as_ref()? {
        HashKey::HttpHeaderName(name) => PolicySpecifier::Header(hash_policy::Header {
            header_name: name.clone(),
            ..Default::default()
        }),
        HashKey::HttpCookie(cookie) => PolicySpecifier::Cookie(hash_policy::Cookie {
            name: cookie.name.clone(),
            ttl: cookie.ttl.as_ref().map(pb_duration),
            path: cookie.path.clone(),
            ..Default::default()
        }),
        HashKey::UseSourceIp(source_ip) => {
            PolicySpecifier::ConnectionProperties(hash_policy::ConnectionProperties {
                source_ip: *source_ip,
            })
        }
        HashKey::HttpQueryParameterName(name) => {
            PolicySpecifier::QueryParameter(hash_policy::QueryParameter { name: name.clone() })
        }
    };
    Some(route_action::HashPolicy {
        policy_specifier: Some(specifier),
        ..Default::default()
    })
}

/// Istio's `TranslateRouteMatch`.
fn translate_match(m: Option<&HttpMatchRequest>) -> RouteMatch {
    let mut out = RouteMatch {
        path_specifier: Some(route_match::PathSpecifier::Prefix("/".to_string())),
        ..Default::default()
    };
    let Some(m) = m else {
        return out;
    };
    // JWT-claim keys match the payload jwt_authn verified (Istio's
    // `translateMetadataMatch`), the others headers.
    use meshfed_registry::config::validate::jwt_routing_claim as claim;
    for (map, invert) in [(&m.headers, false), (&m.without_headers, true)] {
        for (name, sm) in map {
            if let Some(mut matcher) = translate_metadata_match(name, sm) {
                matcher.invert = invert;
                out.dynamic_metadata.push(matcher);
            }
        }
    }
    let mut headers: Vec<HeaderMatcher> = m
        .headers
        .iter()
        .filter(|(name, _)| claim(name).is_none())
        .map(|(name, sm)| header_matcher(name, sm))
        .collect();
    for (name, sm) in m
        .without_headers
        .iter()
        .filter(|(name, _)| claim(name).is_none())
    {
        let mut hm = header_matcher(name, sm);
        hm.invert_match = true;
        // treat_missing_header_as_empty conflicts with present_match.
        hm.treat_missing_header_as_empty = !is_present_match(sm);
        headers.push(hm);
    }
    headers.sort_by(|a, b| a.name.cmp(&b.name));
    out.headers = headers;
    if let Some(uri) = m.uri.as_ref().and_then(|u| u.match_type.as_ref()) {
        out.path_specifier = Some(match uri {
            MatchType::Exact(p) => route_match::PathSpecifier::Path(p.clone()),
            MatchType::Prefix(p) => route_match::PathSpecifier::Prefix(p.clone()),
            MatchType::Regex(r) => route_match::PathSpecifier::SafeRegex(regex_matcher(r)),
        });
    }
    out.case_sensitive = Some(BoolValue {
        value: !m.ignore_uri_case,
    });
    for (name, sm) in [
        (":method", &m.method),
        (":authority", &m.authority),
        (":scheme", &m.scheme),
    ] {
        if let Some(sm) = sm {
            out.headers.push(header_matcher(name, sm));
        }
    }
    out.query_parameters = m
        .query_params
        .iter()
        .map(|(name, sm)| QueryParameterMatcher {
            name: name.clone(),
            query_parameter_match_specifier: Some(if is_present_match(sm) {
                query_parameter_matcher::QueryParameterMatchSpecifier::PresentMatch(true)
            } else {
                query_parameter_matcher::QueryParameterMatchSpecifier::StringMatch(
                    string_matcher_of(sm),
                )
            }),
        })
        .collect();
    out
}

/// Istio's `translateMetadataMatch`: a header key naming a JWT claim matches the
/// claim in the verified payload; `None` for ordinary header names.
fn translate_metadata_match(name: &str, sm: &StringMatch) -> Option<MetadataMatcher> {
    let path = meshfed_registry::config::validate::jwt_routing_claim(name)?;
    Some(jwt_claim_matcher(&path, string_matcher_of(sm), false))
}

/// A route's match on the JWT claim at `path` of the verified payload
/// (`MetadataMatcherForJWTClaims`): the claim is a string matching `m`, or a list
/// with such an element; `invert` for `withoutHeaders`.
fn jwt_claim_matcher(path: &[&str], m: StringMatcher, invert: bool) -> MetadataMatcher {
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListMatcher, OrMatcher, ValueMatcher, list_matcher, metadata_matcher, value_matcher,
    };
    let string = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
    };
    let list = ValueMatcher {
        match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
            ListMatcher {
                match_pattern: Some(list_matcher::MatchPattern::OneOf(Box::new(string.clone()))),
            },
        ))),
    };
    MetadataMatcher {
        filter: crate::generate::jwt::JWT_FILTER.into(),
        path: std::iter::once(crate::generate::jwt::PAYLOAD_IN_METADATA)
            .chain(path.iter().copied())
            .map(|key| metadata_matcher::PathSegment {
                segment: Some(metadata_matcher::path_segment::Segment::Key(key.into())),
            })
            .collect(),
        value: Some(ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                value_matchers: vec![list, string],
            })),
        }),
        invert,
    }
}

/// An empty match, or the regex `*` (not a regex: Istio reads it as "present").
fn is_present_match(sm: &StringMatch) -> bool {
    match &sm.match_type {
        None => true,
        Some(MatchType::Regex(r)) => r == "*",
        Some(_) => false,
    }
}

fn header_matcher(name: &str, sm: &StringMatch) -> HeaderMatcher {
    HeaderMatcher {
        name: name.to_string(),
        header_match_specifier: Some(if is_present_match(sm) {
            header_matcher::HeaderMatchSpecifier::PresentMatch(true)
        } else {
            header_matcher::HeaderMatchSpecifier::StringMatch(string_matcher_of(sm))
        }),
        ..Default::default()
    }
}

fn string_matcher_of(sm: &StringMatch) -> StringMatcher {
    let pattern = match sm.match_type.as_ref() {
        Some(MatchType::Exact(s)) => string_matcher::MatchPattern::Exact(s.clone()),
        Some(MatchType::Prefix(s)) => string_matcher::MatchPattern::Prefix(s.clone()),
        Some(MatchType::Regex(r)) => string_matcher::MatchPattern::SafeRegex(regex_matcher(r)),
        None => string_matcher::MatchPattern::Prefix(String::new()),
    };
    StringMatcher {
        match_pattern: Some(pattern),
        ..Default::default()
    }
}

fn regex_matcher(regex: &str) -> RegexMatcher {
    RegexMatcher {
        regex: regex.to_string(),
        ..Default::default()
    }
}

/// Whether a route matches every request (prefix `/` or regex `.*`, no other
/// condition).
fn is_catch_all(r: &Route) -> bool {
    let Some(m) = &r.r#match else {
        return false;
    };
    let path_all = match &m.path_specifier {
        Some(route_match::PathSpecifier::Prefix(p)) => p == "/",
        Some(route_match::PathSpecifier::PathSeparatedPrefix(p)) => p == "/",
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex == ".*",
        _ => false,
    };
    path_all
        && m.headers.is_empty()
        && m.query_parameters.is_empty()
        && m.dynamic_metadata.is_empty()
}

/// Istio's `GetRouteOperation`: `host:port<path>` for one cluster, else
/// `<virtual service>:<port><path>`.
fn route_operation(r: &Route, vs_name: &str, port: u16) -> String {
    let path = match r.r#match.as_ref().and_then(|m| m.path_specifier.as_ref()) {
        Some(route_match::PathSpecifier::Prefix(p)) => format!("{p}*"),
        Some(route_match::PathSpecifier::Path(p)) => p.clone(),
        Some(route_match::PathSpecifier::SafeRegex(r)) => r.regex.clone(),
        _ => "/*".to_string(),
    };
    if let Some(route::Action::Route(RouteAction {
        cluster_specifier: Some(route_action::ClusterSpecifier::Cluster(c)),
        ..
    })) = &r.action
        && let Some(parsed) = crate::xds::names::ClusterName::parse(c)
    {
        return format!("{}:{}{path}", parsed.hostname, parsed.port);
    }
    format!("{vs_name}:{port}{path}")
}

/// `istio` filter metadata naming the VirtualService a route came from.
fn config_metadata(vs: &Config<VirtualService>) -> Metadata {
    let path = format!(
        "/apis/networking.istio.io/v1alpha3/namespaces/{}/virtual-service/{}",
        vs.namespace, vs.name
    );
    let mut fields = BTreeMap::new();
    fields.insert(
        "config".to_string(),
        Value {
            kind: Some(Kind::StringValue(path)),
        },
    );
    let mut metadata = Metadata::default();
    metadata.filter_metadata.insert(
        "istio".to_string(),
        Struct {
            fields: fields.into_iter().collect(),
        },
    );
    metadata
}

#[derive(Default)]
struct HeaderOps {
    request_add: Vec<HeaderValueOption>,
    response_add: Vec<HeaderValueOption>,
    request_remove: Vec<String>,
    response_remove: Vec<String>,
    /// `:authority`/`host` set or added: becomes a host rewrite.
    authority: String,
}

/// Istio's `TranslateHeadersOperations`: `set` overwrites, `add` appends (each sorted
/// by name); pseudo-headers and `host` cannot be changed this way (an authority value
/// becomes a host rewrite instead).
fn header_operations(headers: &istio::Headers) -> HeaderOps {
    let empty = istio::headers::HeaderOperations::default();
    let req = headers.request.as_ref().unwrap_or(&empty);
    let resp = headers.response.as_ref().unwrap_or(&empty);
    let (mut request_add, set_authority) = header_options(&req.set, false);
    let (req_add, add_authority) = header_options(&req.add, true);
    request_add.extend(req_add);
    let (mut response_add, _) = header_options(&resp.set, false);
    response_add.extend(header_options(&resp.add, true).0);
    let drop_internal = |keys: &[String]| -> Vec<String> {
        keys.iter()
            .filter(|k| !is_internal_header(k))
            .cloned()
            .collect()
    };
    HeaderOps {
        request_add,
        response_add,
        request_remove: drop_internal(&req.remove),
        response_remove: drop_internal(&resp.remove),
        authority: if set_authority.is_empty() {
            add_authority
        } else {
            set_authority
        },
    }
}

fn header_options(
    headers: &BTreeMap<String, String>,
    append: bool,
) -> (Vec<HeaderValueOption>, String) {
    let mut authority = String::new();
    let mut out = Vec::new();
    for (key, value) in headers {
        if key.eq_ignore_ascii_case(":authority") || key.eq_ignore_ascii_case("host") {
            authority = value.clone();
        }
        if is_internal_header(key) {
            continue;
        }
        let action = if append {
            HeaderAppendAction::AppendIfExistsOrAdd
        } else {
            HeaderAppendAction::OverwriteIfExistsOrAdd
        };
        out.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.clone(),
                value: value.clone(),
                ..Default::default()
            }),
            append_action: action as i32,
            ..Default::default()
        });
    }
    (out, authority)
}

fn is_internal_header(key: &str) -> bool {
    key.starts_with(':') || key.eq_ignore_ascii_case("host")
}

/// Istio's `ApplyRedirect`; `None` for a response code Envoy cannot send.
fn redirect_action(r: &istio::HttpRedirect, port: u16, tls: bool) -> Option<route::Action> {
    use redirect_action::RedirectResponseCode as Code;
    let mut out = RedirectAction {
        host_redirect: r.authority.clone(),
        path_rewrite_specifier: Some(redirect_action::PathRewriteSpecifier::PathRedirect(
            r.uri.clone(),
        )),
        ..Default::default()
    };
    if !r.scheme.is_empty() {
        out.scheme_rewrite_specifier = Some(
            redirect_action::SchemeRewriteSpecifier::SchemeRedirect(r.scheme.clone()),
        );
    }
    if let Some(rp) = r.redirect_port {
        match rp {
            http_redirect::RedirectPort::DerivePort(d) => {
                if d == http_redirect::RedirectPortSelection::FromRequestPort as i32 {
                    // Routes are built per port, so "the request's port" is this one.
                    out.port_redirect = u32::from(port);
                }
            }
            http_redirect::RedirectPort::Port(p) => out.port_redirect = p,
        }
        let scheme = if !r.scheme.is_empty() {
            r.scheme.as_str()
        } else if tls {
            "https"
        } else {
            "http"
        };
        // No explicit default port for the scheme.
        if (out.port_redirect == 80 && scheme == "http")
            || (out.port_redirect == 443 && scheme == "https")
        {
            out.port_redirect = 0;
        }
    }
    out.response_code = match r.redirect_code {
        0 | 301 => Code::MovedPermanently,
        302 => Code::Found,
        303 => Code::SeeOther,
        307 => Code::TemporaryRedirect,
        308 => Code::PermanentRedirect,
        other => {
            tracing::warn!(code = other, "redirect code not supported; route left out");
            return None;
        }
    } as i32;
    Some(route::Action::Redirect(out))
}

fn direct_response_action(d: &istio::HttpDirectResponse) -> route::Action {
    let body = d
        .body
        .as_ref()
        .and_then(|b| b.specifier.as_ref())
        .map(|s| DataSource {
            specifier: Some(match s {
                http_body::Specifier::String(s) => data_source::Specifier::InlineString(s.clone()),
                http_body::Specifier::Bytes(b) => data_source::Specifier::InlineBytes(b.clone()),
            }),
            ..Default::default()
        });
    route::Action::DirectResponse(DirectResponseAction {
        status: d.status,
        body,
        ..Default::default()
    })
}

fn percent_of(p: &istio::Percent) -> FractionalPercent {
    FractionalPercent {
        numerator: (p.value * 10_000.0) as u32,
        denominator: DenominatorType::Million as i32,
    }
}

fn integer_percent(p: u32) -> FractionalPercent {
    FractionalPercent {
        numerator: p,
        denominator: DenominatorType::Hundred as i32,
    }
}

/// The mirror fraction of a route's `mirror`: `mirrorPercentage`, else the legacy
/// `mirrorPercent`, else 100 %; an explicit 0 disables mirroring.
fn mirror_percent(http: &HttpRoute) -> Option<RuntimeFractionalPercent> {
    let default_value = if let Some(p) = &http.mirror_percentage {
        (p.value > 0.0).then(|| percent_of(p))?
    } else if let Some(p) = &http.mirror_percent {
        (p.value > 0).then(|| integer_percent(p.value))?
    } else {
        integer_percent(100)
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(default_value),
        ..Default::default()
    })
}

fn mirror_policy_percent(m: &istio::HttpMirrorPolicy) -> Option<RuntimeFractionalPercent> {
    let default_value = match &m.percentage {
        Some(p) => (p.value > 0.0).then(|| percent_of(p))?,
        None => integer_percent(100),
    };
    Some(RuntimeFractionalPercent {
        default_value: Some(default_value),
        ..Default::default()
    })
}

fn mirror_policy(
    cluster: String,
    fraction: RuntimeFractionalPercent,
) -> route_action::RequestMirrorPolicy {
    route_action::RequestMirrorPolicy {
        cluster,
        runtime_fraction: Some(fraction),
        trace_sampled: Some(BoolValue { value: false }),
        ..Default::default()
    }
}

/// Istio's `TranslateFault`: fixed delays and HTTP/gRPC aborts (exponential delays and
/// HTTP/2 errors are not supported and dropped); `None` when nothing is left.
fn translate_fault(f: &istio::HttpFaultInjection) -> Option<HttpFault> {
    let delay = f.delay.as_ref().and_then(|d| {
        let fixed = match d.http_delay_type? {
            http_fault_injection::delay::HttpDelayType::FixedDelay(fixed) => fixed,
            http_fault_injection::delay::HttpDelayType::ExponentialDelay(_) => return None,
        };
        Some(FaultDelay {
            percentage: Some(match &d.percentage {
                Some(p) => percent_of(p),
                None => integer_percent(d.percent.max(0) as u32),
            }),
            fault_delay_secifier: Some(fault_delay::FaultDelaySecifier::FixedDelay(pb_duration(
                &fixed,
            ))),
        })
    });
    let abort = f.abort.as_ref().and_then(|a| {
        let error_type = match a.error_type.as_ref()? {
            http_fault_injection::abort::ErrorType::HttpStatus(s) => {
                fault_abort::ErrorType::HttpStatus(*s as u32)
            }
            http_fault_injection::abort::ErrorType::GrpcStatus(name) => {
                let code = meshfed_registry::config::validate::grpc_status_code(name)?;
                fault_abort::ErrorType::GrpcStatus(code)
            }
            http_fault_injection::abort::ErrorType::Http2Error(_) => return None,
        };
        Some(FaultAbort {
            percentage: a.percentage.as_ref().map(percent_of),
            error_type: Some(error_type),
            ..Default::default()
        })
    });
    (delay.is_some() || abort.is_some()).then(|| HttpFault {
        delay,
        abort,
        ..Default::default()
    })
}

/// Istio's `TranslateCORSPolicy`.
fn translate_cors(c: &istio::CorsPolicy) -> CorsFilterPolicy {
    let origins = if !c.allow_origins.is_empty() {
        c.allow_origins
            .iter()
            .filter(|m| m.match_type.is_some())
            .map(string_matcher_of)
            .collect()
    } else {
        c.allow_origin
            .iter()
            .map(|o| StringMatcher {
                match_pattern: Some(string_matcher::MatchPattern::Exact(o.clone())),
                ..Default::default()
            })
            .collect()
    };
    CorsFilterPolicy {
        allow_origin_string_match: origins,
        allow_methods: c.allow_methods.join(","),
        allow_headers: c.allow_headers.join(","),
        expose_headers: c.expose_headers.join(","),
        max_age: c.max_age.map(|d| d.seconds.to_string()).unwrap_or_default(),
        allow_credentials: c.allow_credentials.map(|b| BoolValue { value: b.value }),
        filter_enabled: Some(RuntimeFractionalPercent {
            default_value: Some(integer_percent(100)),
            ..Default::default()
        }),
        forward_not_matching_preflights: Some(BoolValue {
            value: c.unmatched_preflights != istio::cors_policy::UnmatchedPreflights::Ignore as i32,
        }),
        ..Default::default()
    }
}

fn any<M: Message + Name>(message: &M) -> Any {
    Any {
        type_url: M::type_url(),
        value: message.encode_to_vec(),
    }
}

#[cfg(any(test, feature = "testing"))]
/// Every cluster a route table refers to (a test oracle).
pub fn referenced_clusters(config: &RouteConfiguration) -> Vec<String> {
    let mut out = Vec::new();
    for vh in &config.virtual_hosts {
        for p in &vh.request_mirror_policies {
            out.push(p.cluster.clone());
        }
        for r in &vh.routes {
            if let Some(route::Action::Route(a)) = &r.action {
                match &a.cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => out.push(c.clone()),
                    Some(route_action::ClusterSpecifier::WeightedClusters(w)) => {
                        out.extend(w.clusters.iter().map(|c| c.name.clone()))
                    }
                    _ => {}
                }
                out.extend(
                    a.request_mirror_policies
                        .iter()
                        .filter(|p| !p.cluster.is_empty())
                        .map(|p| p.cluster.clone()),
                );
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use crate::model::Proxy;
    use meshfed_api::networking::v1alpha3::server_tls_settings::TlSmode;
    use meshfed_api::networking::v1alpha3::{Gateway, Server};
    use std::time::{Duration, SystemTime};

    use envoy_types::pb::envoy::config::cluster::v3::{Cluster, cluster};
    use envoy_types::pb::envoy::config::core::v3::Node;
    use meshfed_api::mesh::v1alpha1::mesh_config;
    use meshfed_api::networking::v1alpha3::{
        CorsPolicy, DestinationRule, Headers, HttpDirectResponse, HttpFaultInjection,
        HttpMirrorPolicy, HttpRedirect, HttpRetry, HttpRewrite, HttpRouteDestination,
        LoadBalancerSettings, OutboundTrafficPolicy, Percent, PortSelector, ServerTlsSettings,
        Sidecar, TrafficPolicy, headers::HeaderOperations,
    };
    use meshfed_registry::{
        Aggregate, EndpointIndex, MemoryRegistry, PushRequest, TriggerReason, UpdateSink,
    };

    use super::*;
    use crate::generate::simulate::{self, Request, RouteOutcome, SimError};
    use crate::mesh::{MeshSettings, default_mesh_config};
    use crate::model::proxy::json_to_struct;
    use crate::push::config_index::{ConfigIndex, ConfigSet};

    const REVIEWS: &str = "reviews.default.svc.cluster.local";
    const RATINGS: &str = "ratings.default.svc.cluster.local";
    const PRODUCTPAGE: &str = "productpage.default.svc.cluster.local";

    fn service(host: &str, ns: &str, ports: &[(u16, Protocol)], vip: Option<&str>) -> Service {
        let mut s = Service::new(host, ns, ProviderId::Mock, "c1");
        for (i, (p, proto)) in ports.iter().enumerate() {
            s.ports
                .push(Port::new(&format!("port-{i}"), *p, *proto).unwrap());
        }
        if let Some(ip) = vip {
            s.cluster_vips
                .insert("c1".into(), vec![ip.parse().unwrap()]);
        }
        s
    }

    fn bookinfo() -> Vec<Service> {
        vec![
            service(
                PRODUCTPAGE,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.1"),
            ),
            service(
                REVIEWS,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.2"),
            ),
            service(
                RATINGS,
                "default",
                &[(9080, Protocol::Http)],
                Some("10.0.0.3"),
            ),
        ]
    }

    fn mesh() -> MeshSettings {
        MeshSettings {
            config: default_mesh_config(),
            ..Default::default()
        }
    }

    fn registry_only_mesh() -> MeshSettings {
        let mut m = mesh();
        m.config.outbound_traffic_policy = Some(mesh_config::OutboundTrafficPolicy {
            mode: MeshOutboundMode::RegistryOnly as i32,
        });
        m
    }

    fn snapshot_with(
        services: Vec<Service>,
        kube_services: Vec<Service>,
        set: ConfigSet,
        mesh: MeshSettings,
    ) -> Snapshot {
        let index = Arc::new(EndpointIndex::new());
        let (sink, _events) = UpdateSink::new(index.clone());
        let aggregate = Aggregate::new("c1");
        let registry = MemoryRegistry::new("c1", sink.clone());
        for s in services {
            registry.add_service(s);
        }
        aggregate.add_registry(Arc::new(registry));
        if !kube_services.is_empty() {
            let kube = MemoryRegistry::with_provider(ProviderId::Kubernetes, "c1", sink);
            for s in kube_services {
                kube.add_service(s);
            }
            kube.mark_synced();
            aggregate.add_registry(Arc::new(kube));
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

    fn snapshot(services: Vec<Service>, set: ConfigSet) -> Snapshot {
        snapshot_with(services, Vec::new(), set, mesh())
    }

    fn node(kind: &str, ns: &str, labels: &[(&str, &str)], generator: Option<&str>) -> Proxy {
        let labels: serde_json::Map<String, serde_json::Value> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::String(v.to_string())))
            .collect();
        let mut meta = serde_json::json!({"NAMESPACE": ns, "CLUSTER_ID": "c1", "LABELS": labels});
        if let Some(g) = generator {
            meta["GENERATOR"] = g.into();
        }
        let node = Node {
            id: format!("{kind}~10.1.1.1~pod.{ns}~{ns}.svc.cluster.local"),
            metadata: Some(json_to_struct(&meta)),
            ..Default::default()
        };
        Proxy::from_node(Some(&node)).unwrap()
    }

    /// Two sidecars alike but for their DNS domain get the short names each domain
    /// gives (Istio builds a proxy's virtual host domains from its own DNS domain): the
    /// route table input carries the domain, so the second is not served the first's
    /// cached table.
    #[test]
    fn route_tables_follow_the_proxy_dns_domain() {
        use crate::generate::{GeneratorOptions, Scope, Subscription, generate};
        use crate::xds::TypeUrl;
        use prost::Message;
        let snap = snapshot(
            vec![service(
                "reviews.default.svc.cluster.local",
                "default",
                &[(9080, Protocol::Http)],
                None,
            )],
            ConfigSet::default(),
        );
        let in_domain = |domain: &str| {
            let node = Node {
                id: format!("sidecar~10.1.1.1~pod.default~{domain}"),
                metadata: Some(json_to_struct(
                    &serde_json::json!({"NAMESPACE": "default", "CLUSTER_ID": "c1"}),
                )),
                ..Default::default()
            };
            Proxy::from_node(Some(&node)).unwrap()
        };
        let names = BTreeSet::from(["9080".to_string()]);
        let domains = |proxy: &Proxy| -> Vec<String> {
            let routes = generate(
                TypeUrl::Route,
                &snap,
                proxy,
                Subscription {
                    wildcard: false,
                    names: &names,
                },
                Scope::All,
                &GeneratorOptions::default(),
            );
            let rc = RouteConfiguration::decode(routes[0].body.value.clone()).unwrap();
            rc.virtual_hosts
                .iter()
                .find(|vh| {
                    vh.domains
                        .iter()
                        .any(|d| d.starts_with("reviews.default.svc"))
                })
                .unwrap()
                .domains
                .clone()
        };
        let own = domains(&in_domain("default.svc.cluster.local"));
        assert!(own.contains(&"reviews".to_string()), "{own:?}");
        let other = domains(&in_domain("other.svc.cluster.local"));
        assert!(!other.contains(&"reviews".to_string()), "{other:?}");
        assert!(other.contains(&"reviews.default".to_string()), "{other:?}");
    }

    fn sidecar(ns: &str, labels: &[(&str, &str)]) -> Proxy {
        node("sidecar", ns, labels, None)
    }

    fn router() -> Proxy {
        node(
            "router",
            "istio-system",
            &[("istio", "ingressgateway")],
            None,
        )
    }

    fn cfg<T>(ns: &str, name: &str, age: u64, spec: T) -> Config<T> {
        Config {
            name: name.into(),
            namespace: ns.into(),
            labels: BTreeMap::new(),
            annotations: Default::default(),
            creation_time: SystemTime::UNIX_EPOCH + Duration::from_secs(10_000 - age),
            spec,
        }
    }

    fn vs(hosts: &[&str], http: Vec<HttpRoute>) -> VirtualService {
        VirtualService {
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            http,
            ..Default::default()
        }
    }

    fn vs_set(list: Vec<Config<VirtualService>>) -> ConfigSet {
        ConfigSet {
            virtual_services: list,
            ..Default::default()
        }
    }

    fn dest(host: &str, subset: &str) -> HttpRouteDestination {
        HttpRouteDestination {
            destination: Some(Destination {
                host: host.into(),
                subset: subset.into(),
                port: None,
            }),
            ..Default::default()
        }
    }

    fn weighted(host: &str, subset: &str, weight: i32) -> HttpRouteDestination {
        HttpRouteDestination {
            weight,
            ..dest(host, subset)
        }
    }

    fn to(route: Vec<HttpRouteDestination>) -> HttpRoute {
        HttpRoute {
            route,
            ..Default::default()
        }
    }

    fn when(m: HttpMatchRequest, route: Vec<HttpRouteDestination>) -> HttpRoute {
        HttpRoute {
            r#match: vec![m],
            route,
            ..Default::default()
        }
    }

    fn sm(t: MatchType) -> StringMatch {
        StringMatch {
            match_type: Some(t),
        }
    }

    fn exact(s: &str) -> StringMatch {
        sm(MatchType::Exact(s.into()))
    }

    fn uri(t: MatchType) -> HttpMatchRequest {
        HttpMatchRequest {
            uri: Some(sm(t)),
            ..Default::default()
        }
    }

    fn header(name: &str, value: StringMatch) -> HttpMatchRequest {
        HttpMatchRequest {
            headers: BTreeMap::from([(name.to_string(), value)]),
            ..Default::default()
        }
    }

    fn outbound(port: u16, subset: &str, host: &str) -> String {
        format!("outbound|{port}|{subset}|{host}")
    }

    fn lands(rc: &RouteConfiguration, req: Request) -> RouteOutcome {
        simulate::route(rc, &req).unwrap_or_else(|e| panic!("{req:?}: {e}"))
    }

    fn cluster(rc: &RouteConfiguration, req: Request) -> String {
        match lands(rc, req) {
            RouteOutcome::Cluster(c) => c,
            other => panic!("expected one cluster, got {other:?}"),
        }
    }

    fn matched(rc: &RouteConfiguration, req: Request) -> &Route {
        simulate::resolve(rc, &req).unwrap().route.unwrap()
    }

    fn action(r: &Route) -> &RouteAction {
        match &r.action {
            Some(route::Action::Route(a)) => a,
            other => panic!("not a forwarding route: {other:?}"),
        }
    }

    fn vhost<'a>(rc: &'a RouteConfiguration, name: &str) -> &'a VirtualHost {
        rc.virtual_hosts
            .iter()
            .find(|v| v.name == name)
            .unwrap_or_else(|| panic!("no virtual host {name} in {:?}", names(rc)))
    }

    fn names(rc: &RouteConfiguration) -> Vec<&str> {
        rc.virtual_hosts.iter().map(|v| v.name.as_str()).collect()
    }

    fn decode<M: Message + Default>(any: &Any) -> M {
        M::decode(any.value.as_slice()).unwrap()
    }

    fn reviews_vs(http: Vec<HttpRoute>) -> ConfigSet {
        vs_set(vec![cfg("default", "reviews", 1, vs(&["reviews"], http))])
    }

    #[test]
    fn jason_gets_reviews_v2_everyone_else_v1() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    header("end-user", exact("jason")),
                    vec![dest("reviews", "v2")],
                ),
                to(vec![dest("reviews", "v1")]),
            ]),
        );
        let proxy = sidecar("default", &[("app", "productpage")]);
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert_eq!(rc.name, "9080");
        assert_eq!(rc.validate_clusters, Some(BoolValue { value: false }));
        let jason = Request::new("reviews", 9080, "/a").header("end-user", "jason");
        assert_eq!(cluster(&rc, jason), outbound(9080, "v2", REVIEWS));
        for host in ["reviews", REVIEWS, "reviews.default", "10.0.0.2"] {
            assert_eq!(
                cluster(&rc, Request::new(host, 9080, "/a")),
                outbound(9080, "v1", REVIEWS),
                "{host}"
            );
        }
        // Services without a VirtualService get their default route.
        assert_eq!(
            cluster(&rc, Request::new("ratings", 9080, "/")),
            outbound(9080, "", RATINGS)
        );
        assert_eq!(
            names(&rc),
            vec![
                "productpage.default.svc.cluster.local:9080",
                "ratings.default.svc.cluster.local:9080",
                "reviews.default.svc.cluster.local:9080",
                ALLOW_ANY,
            ],
            "sorted by name, catch-all last"
        );
        assert_eq!(
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc), &BTreeSet::new())
                .iter()
                .filter(|p| p.contains("twice"))
                .count(),
            0
        );
    }

    #[test]
    fn weights_become_weighted_clusters_and_zero_weights_are_dropped() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![to(vec![
                weighted("reviews", "v1", 80),
                weighted("reviews", "v2", 20),
                weighted("reviews", "v3", 0),
            ])]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/")),
            RouteOutcome::WeightedClusters(vec![
                (outbound(9080, "v1", REVIEWS), 80),
                (outbound(9080, "v2", REVIEWS), 20),
            ])
        );
    }

    #[test]
    fn uri_matches_exact_prefix_regex_and_case() {
        let mut ignore_case = uri(MatchType::Exact("/CASE".into()));
        ignore_case.ignore_uri_case = true;
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    uri(MatchType::Exact("/exact".into())),
                    vec![dest("reviews", "exact")],
                ),
                when(
                    uri(MatchType::Prefix("/pre".into())),
                    vec![dest("reviews", "prefix")],
                ),
                when(
                    uri(MatchType::Regex("/re+gex/[0-9]+".into())),
                    vec![dest("reviews", "regex")],
                ),
                when(ignore_case, vec![dest("reviews", "case")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let subset = |path: &str| {
            simulate::route(&rc, &Request::new("reviews", 9080, path)).map(|o| match o {
                RouteOutcome::Cluster(c) => c.split('|').nth(2).unwrap().to_string(),
                other => panic!("{other:?}"),
            })
        };
        assert_eq!(subset("/exact").unwrap(), "exact");
        assert_eq!(
            subset("/exact/no"),
            Err(SimError::NoRoute(format!("{REVIEWS}:9080")))
        );
        assert_eq!(subset("/prefix/x?y=1").unwrap(), "prefix");
        assert_eq!(subset("/reeegex/7").unwrap(), "regex");
        assert_eq!(subset("/case").unwrap(), "case");
        assert_eq!(
            subset("/other"),
            Err(SimError::NoRoute(format!("{REVIEWS}:9080"))),
            "as in Istio, a VirtualService without a catch-all route leaves the rest unrouted"
        );
        let r = matched(&rc, Request::new("reviews", 9080, "/exact"));
        let m = r.r#match.as_ref().unwrap();
        assert_eq!(
            m.path_specifier,
            Some(route_match::PathSpecifier::Path("/exact".into()))
        );
        assert_eq!(m.case_sensitive, Some(BoolValue { value: true }));
    }

    #[test]
    fn header_method_query_authority_and_without_headers() {
        let post = HttpMatchRequest {
            method: Some(exact("POST")),
            ..Default::default()
        };
        let debug = HttpMatchRequest {
            query_params: BTreeMap::from([("debug".to_string(), exact("1"))]),
            ..Default::default()
        };
        let prefixed = header("x-group", sm(MatchType::Prefix("beta-".into())));
        let regex = header("x-id", sm(MatchType::Regex("[0-9]{3}".into())));
        let present = header("x-present", StringMatch::default());
        let without = HttpMatchRequest {
            uri: Some(sm(MatchType::Prefix("/wo".into()))),
            without_headers: BTreeMap::from([("x-test".to_string(), exact("yes"))]),
            ..Default::default()
        };
        let authority = HttpMatchRequest {
            authority: Some(sm(MatchType::Prefix("reviews.default".into()))),
            ..Default::default()
        };
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(post, vec![dest("reviews", "post")]),
                when(debug, vec![dest("reviews", "debug")]),
                when(prefixed, vec![dest("reviews", "beta")]),
                when(regex, vec![dest("reviews", "id")]),
                when(present, vec![dest("reviews", "present")]),
                when(without, vec![dest("reviews", "without")]),
                when(authority, vec![dest("reviews", "authority")]),
                to(vec![dest("reviews", "rest")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let subset = |req: Request| cluster(&rc, req).split('|').nth(2).unwrap().to_string();
        let get = |path: &str| Request::new("reviews", 9080, path);
        assert_eq!(subset(get("/").method("POST")), "post");
        assert_eq!(subset(get("/?debug=1")), "debug");
        assert_eq!(subset(get("/?debug=2")), "rest");
        assert_eq!(subset(get("/").header("x-group", "beta-users")), "beta");
        assert_eq!(subset(get("/").header("x-id", "123")), "id");
        assert_eq!(subset(get("/").header("x-id", "1234")), "rest");
        assert_eq!(subset(get("/").header("x-present", "")), "present");
        assert_eq!(
            subset(get("/wo")),
            "without",
            "a missing header is not 'yes'"
        );
        assert_eq!(subset(get("/wo").header("x-test", "no")), "without");
        assert_eq!(subset(get("/wo").header("x-test", "yes")), "rest");
        assert_eq!(
            subset(Request::new("reviews.default", 9080, "/")),
            "authority"
        );
        // The method matcher is the :method header; without_headers are inverted and
        // treat a missing header as empty.
        let r = matched(&rc, get("/").method("POST"));
        let h = &r.r#match.as_ref().unwrap().headers[0];
        assert_eq!(h.name, ":method");
        let r = matched(&rc, get("/wo"));
        let h = &r.r#match.as_ref().unwrap().headers[0];
        assert!(h.invert_match && h.treat_missing_header_as_empty);
    }

    #[test]
    fn source_labels_port_and_gateway_conditions_are_resolved_per_proxy() {
        let from_productpage = HttpMatchRequest {
            source_labels: BTreeMap::from([("app".to_string(), "productpage".to_string())]),
            ..Default::default()
        };
        let on_other_port = HttpMatchRequest {
            port: 9999,
            ..Default::default()
        };
        let on_gateway = HttpMatchRequest {
            gateways: vec!["ingress".into()],
            ..Default::default()
        };
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(on_other_port, vec![dest("reviews", "port")]),
                when(on_gateway, vec![dest("reviews", "gateway")]),
                when(from_productpage, vec![dest("reviews", "v2")]),
                to(vec![dest("reviews", "v1")]),
            ]),
        );
        let pp = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "productpage")]).client_view(),
            9080,
        );
        let other = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "ratings")]).client_view(),
            9080,
        );
        let req = || Request::new("reviews", 9080, "/");
        assert_eq!(cluster(&pp, req()), outbound(9080, "v2", REVIEWS));
        assert_eq!(cluster(&other, req()), outbound(9080, "v1", REVIEWS));
        // Routes for other sources, ports and gateways are left out; the source-label
        // route matches everything else, so translation stops after it (as Istio's).
        let subsets = |rc: &RouteConfiguration| -> Vec<String> {
            vhost(rc, &format!("{REVIEWS}:9080"))
                .routes
                .iter()
                .map(|r| match &action(r).cluster_specifier {
                    Some(route_action::ClusterSpecifier::Cluster(c)) => {
                        c.split('|').nth(2).unwrap().to_string()
                    }
                    other => panic!("{other:?}"),
                })
                .collect()
        };
        assert_eq!(subsets(&pp), vec!["v2"]);
        assert_eq!(subsets(&other), vec!["v1"]);

        // When nothing of the VirtualService applies, the service keeps its default.
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![when(
                HttpMatchRequest {
                    source_labels: BTreeMap::from([("app".to_string(), "x".to_string())]),
                    ..Default::default()
                },
                vec![dest("reviews", "v2")],
            )]),
        );
        let rc = sidecar_route_config(
            &snap,
            &sidecar("default", &[("app", "y")]).client_view(),
            9080,
        );
        assert_eq!(matched(&rc, req()).name, DEFAULT_ROUTE);
    }

    #[test]
    fn first_match_wins_and_nothing_follows_a_catch_all() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                when(
                    uri(MatchType::Prefix("/a".into())),
                    vec![dest("reviews", "first")],
                ),
                when(
                    uri(MatchType::Prefix("/a/b".into())),
                    vec![dest("reviews", "second")],
                ),
                HttpRoute {
                    name: "all".into(),
                    ..to(vec![dest("reviews", "all")])
                },
                to(vec![dest("reviews", "never")]),
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("reviews", 9080, "/a/b")),
            outbound(9080, "first", REVIEWS)
        );
        let routes = &vhost(&rc, &format!("{REVIEWS}:9080")).routes;
        assert_eq!(routes.len(), 3);
        assert_eq!(routes[2].name, "all", "named routes keep their name");
    }

    #[test]
    fn default_route_has_istio_defaults() {
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let vh = vhost(&rc, &format!("{RATINGS}:9080"));
        assert_eq!(vh.routes.len(), 1);
        let r = &vh.routes[0];
        assert_eq!(r.name, DEFAULT_ROUTE);
        assert_eq!(
            r.r#match.as_ref().unwrap().path_specifier,
            Some(route_match::PathSpecifier::Prefix("/".into()))
        );
        let a = action(r);
        assert_eq!(
            a.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster(outbound(
                9080, "", RATINGS
            )))
        );
        assert_eq!(a.timeout, Some(PbDuration::default()));
        let retry = a.retry_policy.as_ref().unwrap();
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 2 }));
        assert_eq!(retry.retry_on, DEFAULT_RETRY_ON);
        assert_eq!(retry.retriable_status_codes, vec![503]);
        assert_eq!(retry.retry_host_predicate[0].name, PREVIOUS_HOSTS_PREDICATE);
        assert_eq!(
            r.decorator.as_ref().unwrap().operation,
            format!("{RATINGS}:9080/*")
        );
        assert_eq!(rc.virtual_hosts.last().unwrap().name, ALLOW_ANY);
    }

    #[test]
    fn short_names_only_from_the_same_namespace_and_vip_domains() {
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let same = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            vhost(&same, &format!("{REVIEWS}:9080")).domains,
            vec![
                REVIEWS.to_string(),
                format!("{REVIEWS}:9080"),
                format!("{REVIEWS}."),
                format!("{REVIEWS}.:9080"),
                "reviews".into(),
                "reviews:9080".into(),
                "reviews.default".into(),
                "reviews.default:9080".into(),
                "reviews.default.svc".into(),
                "reviews.default.svc:9080".into(),
                "10.0.0.2".into(),
                "10.0.0.2:9080".into(),
            ]
        );
        let other = sidecar_route_config(&snap, &sidecar("other", &[]).client_view(), 9080);
        let domains = &vhost(&other, &format!("{REVIEWS}:9080")).domains;
        assert!(!domains.contains(&"reviews".to_string()));
        assert!(domains.contains(&"reviews.default:9080".to_string()));
        assert_eq!(
            cluster(&other, Request::new("reviews", 9080, "/")),
            crate::xds::names::PASSTHROUGH,
            "`reviews` from another namespace is someone else's name"
        );
        assert_eq!(
            cluster(&other, Request::new("10.0.0.2", 9080, "/")),
            outbound(9080, "", REVIEWS)
        );
    }

    #[test]
    fn short_names_never_shadow_a_real_host() {
        // A ServiceEntry host `details` next to Kubernetes' details.default: the short
        // name expanded from the latter must not steal the former's domain.
        let services = vec![
            service(
                "details.default.svc.cluster.local",
                "default",
                &[(9080, Protocol::Http)],
                None,
            ),
            service("details", "default", &[(9080, Protocol::Http)], None),
        ];
        let snap = snapshot(services, ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("details", 9080, "/")),
            outbound(9080, "", "details")
        );
        let problems =
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc), &BTreeSet::new());
        assert!(
            problems.iter().all(|p| !p.contains("twice")),
            "{problems:?}"
        );
    }

    #[test]
    fn headless_kubernetes_services_get_wildcard_domains() {
        let mut headless = service(
            "db.default.svc.cluster.local",
            "default",
            &[(8080, Protocol::Http)],
            None,
        );
        headless.resolution = Resolution::Passthrough;
        let snap = snapshot_with(Vec::new(), vec![headless], ConfigSet::default(), mesh());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 8080);
        assert_eq!(
            cluster(
                &rc,
                Request::new("db-0.db.default.svc.cluster.local", 8080, "/")
            ),
            outbound(8080, "", "db.default.svc.cluster.local")
        );
    }

    #[test]
    fn an_egress_listener_with_a_port_has_a_route_table_of_its_own_hosts() {
        use meshfed_api::networking::v1alpha3::{IstioEgressListener, SidecarPort};
        let other = service(
            "other.default.svc.cluster.local",
            "default",
            &[(9080, Protocol::Http), (8080, Protocol::Http)],
            Some("10.0.0.4"),
        );
        let mut services = bookinfo();
        services.push(other);
        let egress = |port: Option<u32>, hosts: &[&str]| IstioEgressListener {
            port: port.map(|number| SidecarPort {
                number,
                protocol: "HTTP".into(),
                name: format!("http-{number}"),
                ..Default::default()
            }),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            ..Default::default()
        };
        let sidecar_cfg = Sidecar {
            egress: vec![
                egress(Some(9080), &["./reviews.default.svc.cluster.local"]),
                egress(None, &["./*"]),
            ],
            ..Default::default()
        };
        let reviews_vs = cfg(
            "default",
            "reviews",
            1,
            vs(&[REVIEWS], vec![to(vec![dest(RATINGS, "")])]),
        );
        let other_vs = cfg(
            "default",
            "other",
            1,
            vs(
                &["other.default.svc.cluster.local"],
                vec![to(vec![dest(PRODUCTPAGE, "")])],
            ),
        );
        let set = ConfigSet {
            sidecars: vec![cfg("default", "default", 1, sidecar_cfg)],
            virtual_services: vec![reviews_vs, other_vs],
            ..Default::default()
        };
        let snap = snapshot(services, set);
        let proxy = sidecar("default", &[]).client_view();
        let rc = sidecar_route_config(&snap, &proxy, 9080);
        assert_eq!(
            names(&rc),
            ["reviews.default.svc.cluster.local:9080", ALLOW_ANY],
            "only the hosts of the egress listener on 9080"
        );
        assert_eq!(
            cluster(&rc, Request::new(REVIEWS, 9080, "/")),
            outbound(9080, "", RATINGS),
            "with the VirtualService that listener imports"
        );
        // Another port: the catch-all's hosts and VirtualServices.
        let rc = sidecar_route_config(&snap, &proxy, 8080);
        assert_eq!(
            names(&rc),
            ["other.default.svc.cluster.local:8080", ALLOW_ANY]
        );
        assert_eq!(
            cluster(
                &rc,
                Request::new("other.default.svc.cluster.local", 8080, "/")
            ),
            outbound(9080, "", PRODUCTPAGE),
            "(productpage's only port)"
        );
    }

    #[test]
    fn outbound_traffic_policy_decides_the_catch_all() {
        let unknown = || Request::new("example.org", 80, "/");
        let snap = snapshot(bookinfo(), ConfigSet::default());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(cluster(&rc, unknown()), crate::xds::names::PASSTHROUGH);
        assert_eq!(matched(&rc, unknown()).name, ALLOW_ANY);

        let snap = snapshot_with(
            bookinfo(),
            Vec::new(),
            ConfigSet::default(),
            registry_only_mesh(),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(lands(&rc, unknown()), RouteOutcome::DirectResponse(502));
        assert_eq!(rc.virtual_hosts.last().unwrap().name, BLOCK_ALL);

        // A Sidecar overrides the mesh: here back to ALLOW_ANY via an egress proxy.
        let sidecar_cfg = Sidecar {
            outbound_traffic_policy: Some(OutboundTrafficPolicy {
                mode: SidecarOutboundMode::AllowAny as i32,
                egress_proxy: Some(Destination {
                    host: "egress.istio-system.svc.cluster.local".into(),
                    subset: String::new(),
                    port: Some(PortSelector { number: 443 }),
                }),
            }),
            ..Default::default()
        };
        let set = ConfigSet {
            sidecars: vec![cfg("default", "default", 1, sidecar_cfg)],
            ..Default::default()
        };
        let snap = snapshot_with(bookinfo(), Vec::new(), set, registry_only_mesh());
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80);
        assert_eq!(
            cluster(&rc, unknown()),
            "outbound|443||egress.istio-system.svc.cluster.local"
        );
        let elsewhere = sidecar_route_config(&snap, &sidecar("other", &[]).client_view(), 80);
        assert_eq!(
            lands(&elsewhere, unknown()),
            RouteOutcome::DirectResponse(502)
        );
    }

    #[test]
    fn virtual_service_hosts_that_are_not_services() {
        let set = vs_set(vec![
            cfg(
                "default",
                "site",
                2,
                vs(
                    &["bookinfo.example.com"],
                    vec![to(vec![dest("productpage", "")])],
                ),
            ),
            cfg(
                "default",
                "reviews",
                1,
                vs(
                    &["reviews", "reviews.example.com"],
                    vec![to(vec![dest("reviews", "v1")])],
                ),
            ),
        ]);
        let snap = snapshot(bookinfo(), set);
        let proxy = sidecar("default", &[]);
        let rc80 = sidecar_route_config(&snap, &proxy.client_view(), 80);
        assert_eq!(
            cluster(&rc80, Request::new("bookinfo.example.com", 80, "/")),
            outbound(9080, "", PRODUCTPAGE),
            "a destination without port takes the service's only port"
        );
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert!(!names(&rc).contains(&"bookinfo.example.com:9080"));
        assert_eq!(
            cluster(&rc, Request::new("reviews.example.com", 9080, "/")),
            outbound(9080, "v1", REVIEWS)
        );
    }

    #[test]
    fn route_features_are_encoded_as_istio_does() {
        let secs = meshfed_api::Duration::from_secs;
        let http = HttpRoute {
            name: "features".into(),
            route: vec![HttpRouteDestination {
                headers: Some(Headers {
                    request: Some(HeaderOperations {
                        set: BTreeMap::from([("x-dest".to_string(), "1".to_string())]),
                        ..Default::default()
                    }),
                    response: None,
                }),
                ..dest("reviews", "v1")
            }],
            retries: Some(HttpRetry {
                attempts: 3,
                per_try_timeout: Some(secs(2)),
                retry_on: "5xx,503,gateway-error".into(),
                retry_remote_localities: None,
            }),
            timeout: Some(secs(5)),
            fault: Some(HttpFaultInjection {
                delay: Some(http_fault_injection::Delay {
                    percentage: Some(Percent { value: 10.0 }),
                    http_delay_type: Some(http_fault_injection::delay::HttpDelayType::FixedDelay(
                        secs(1),
                    )),
                    ..Default::default()
                }),
                abort: Some(http_fault_injection::Abort {
                    percentage: Some(Percent { value: 5.5 }),
                    error_type: Some(http_fault_injection::abort::ErrorType::HttpStatus(500)),
                }),
            }),
            mirror: Some(Destination {
                host: "ratings".into(),
                subset: String::new(),
                port: None,
            }),
            mirror_percentage: Some(Percent { value: 50.0 }),
            mirrors: vec![HttpMirrorPolicy {
                destination: Some(Destination {
                    host: "ratings".into(),
                    subset: "v2".into(),
                    port: None,
                }),
                percentage: Some(Percent { value: 25.0 }),
            }],
            rewrite: Some(HttpRewrite {
                uri: "/new".into(),
                authority: "rewritten.example.com".into(),
                uri_regex_rewrite: None,
            }),
            headers: Some(Headers {
                request: Some(HeaderOperations {
                    set: BTreeMap::from([("x-set".to_string(), "a".to_string())]),
                    add: BTreeMap::from([("x-add".to_string(), "b".to_string())]),
                    remove: vec!["x-remove".into(), ":path".into()],
                }),
                response: Some(HeaderOperations {
                    set: BTreeMap::from([("x-resp".to_string(), "c".to_string())]),
                    ..Default::default()
                }),
            }),
            cors_policy: Some(CorsPolicy {
                allow_origins: vec![exact("https://a.example.com")],
                allow_methods: vec!["GET".into(), "POST".into()],
                max_age: Some(secs(60)),
                allow_credentials: Some(true.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let snap = snapshot(bookinfo(), reviews_vs(vec![http]));
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let r = matched(&rc, Request::new("reviews", 9080, "/"));
        assert_eq!(r.name, "features");
        let a = action(r);
        assert_eq!(
            a.timeout,
            Some(PbDuration {
                seconds: 5,
                nanos: 0
            })
        );
        let retry = a.retry_policy.as_ref().unwrap();
        assert_eq!(retry.num_retries, Some(UInt32Value { value: 3 }));
        assert_eq!(retry.retry_on, "5xx,gateway-error,retriable-status-codes");
        assert_eq!(retry.retriable_status_codes, vec![503]);
        assert_eq!(
            retry.per_try_timeout,
            Some(PbDuration {
                seconds: 2,
                nanos: 0
            })
        );
        assert_eq!(a.prefix_rewrite, "/new");
        assert_eq!(
            a.host_rewrite_specifier,
            Some(route_action::HostRewriteSpecifier::HostRewriteLiteral(
                "rewritten.example.com".into()
            ))
        );
        let mirrors: Vec<(&str, u32, i32)> = a
            .request_mirror_policies
            .iter()
            .map(|m| {
                let f = m.runtime_fraction.as_ref().unwrap().default_value.unwrap();
                (m.cluster.as_str(), f.numerator, f.denominator)
            })
            .collect();
        assert_eq!(
            mirrors,
            vec![
                (
                    "outbound|9080||ratings.default.svc.cluster.local",
                    500_000,
                    DenominatorType::Million as i32
                ),
                (
                    "outbound|9080|v2|ratings.default.svc.cluster.local",
                    250_000,
                    DenominatorType::Million as i32
                ),
            ]
        );
        let fault: HttpFault = decode(&r.typed_per_filter_config[FAULT_FILTER]);
        let delay = fault.delay.unwrap();
        assert_eq!(delay.percentage.unwrap().numerator, 100_000);
        assert_eq!(
            delay.fault_delay_secifier,
            Some(fault_delay::FaultDelaySecifier::FixedDelay(PbDuration {
                seconds: 1,
                nanos: 0
            }))
        );
        let abort = fault.abort.unwrap();
        assert_eq!(
            abort.error_type,
            Some(fault_abort::ErrorType::HttpStatus(500))
        );
        assert_eq!(abort.percentage.unwrap().numerator, 55_000);
        assert_eq!(
            r.typed_per_filter_config[FAULT_FILTER].type_url,
            HttpFault::type_url()
        );
        let cors: CorsFilterPolicy = decode(&r.typed_per_filter_config[CORS_FILTER]);
        assert_eq!(cors.allow_methods, "GET,POST");
        assert_eq!(cors.max_age, "60");
        assert_eq!(cors.allow_credentials, Some(BoolValue { value: true }));
        assert_eq!(
            cors.allow_origin_string_match[0].match_pattern,
            Some(string_matcher::MatchPattern::Exact(
                "https://a.example.com".into()
            ))
        );
        assert_eq!(
            cors.forward_not_matching_preflights,
            Some(BoolValue { value: true })
        );
        let added: Vec<(&str, &str, i32)> = r
            .request_headers_to_add
            .iter()
            .map(|h| {
                let hv = h.header.as_ref().unwrap();
                (hv.key.as_str(), hv.value.as_str(), h.append_action)
            })
            .collect();
        assert_eq!(
            added,
            vec![
                (
                    "x-set",
                    "a",
                    HeaderAppendAction::OverwriteIfExistsOrAdd as i32
                ),
                ("x-add", "b", HeaderAppendAction::AppendIfExistsOrAdd as i32),
                (
                    "x-dest",
                    "1",
                    HeaderAppendAction::OverwriteIfExistsOrAdd as i32
                ),
            ]
        );
        assert_eq!(
            r.request_headers_to_remove,
            vec!["x-remove"],
            "pseudo-headers stay"
        );
        assert_eq!(
            r.response_headers_to_add[0].header.as_ref().unwrap().key,
            "x-resp"
        );
        let meta = &r.metadata.as_ref().unwrap().filter_metadata["istio"].fields["config"];
        assert_eq!(
            meta.kind,
            Some(Kind::StringValue(
                "/apis/networking.istio.io/v1alpha3/namespaces/default/virtual-service/reviews"
                    .into()
            ))
        );
    }

    #[test]
    fn retries_can_be_disabled_and_follow_the_mesh_default() {
        assert_eq!(
            retry_policy(
                Some(&HttpRetry {
                    attempts: 0,
                    ..Default::default()
                }),
                false
            ),
            None
        );
        let mut m = mesh();
        m.config.default_http_retry_policy = Some(HttpRetry {
            attempts: 5,
            ..Default::default()
        });
        let snap = snapshot_with(
            bookinfo(),
            Vec::new(),
            reviews_vs(vec![to(vec![dest("reviews", "v1")])]),
            m,
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        for host in ["reviews", "ratings"] {
            let r = matched(&rc, Request::new(host, 9080, "/"));
            let retry = action(r).retry_policy.as_ref().unwrap();
            assert_eq!(retry.num_retries, Some(UInt32Value { value: 5 }), "{host}");
            assert_eq!(retry.retry_on, DEFAULT_RETRY_ON);
        }
    }

    #[test]
    fn redirects_and_direct_responses() {
        let snap = snapshot(
            bookinfo(),
            reviews_vs(vec![
                HttpRoute {
                    r#match: vec![uri(MatchType::Prefix("/old".into()))],
                    redirect: Some(HttpRedirect {
                        uri: "/new".into(),
                        authority: "moved.example.com".into(),
                        scheme: "https".into(),
                        redirect_code: 302,
                        redirect_port: Some(http_redirect::RedirectPort::Port(8443)),
                    }),
                    ..Default::default()
                },
                HttpRoute {
                    r#match: vec![uri(MatchType::Prefix("/teapot".into()))],
                    direct_response: Some(HttpDirectResponse {
                        status: 418,
                        body: Some(istio::HttpBody {
                            specifier: Some(http_body::Specifier::String("short and stout".into())),
                        }),
                    }),
                    ..Default::default()
                },
            ]),
        );
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/old?x=1")),
            RouteOutcome::Redirect {
                scheme: "https".into(),
                host: "moved.example.com".into(),
                port: Some(8443),
                path: "/new?x=1".into(),
                code: 302,
            }
        );
        assert_eq!(
            lands(&rc, Request::new("reviews", 9080, "/teapot")),
            RouteOutcome::DirectResponse(418)
        );
        let r = matched(&rc, Request::new("reviews", 9080, "/teapot"));
        match &r.action {
            Some(route::Action::DirectResponse(d)) => assert_eq!(
                d.body.as_ref().unwrap().specifier,
                Some(data_source::Specifier::InlineString(
                    "short and stout".into()
                ))
            ),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            rc.max_direct_response_body_size_bytes,
            Some(UInt32Value {
                value: MAX_DIRECT_RESPONSE_BODY_BYTES
            })
        );
    }

    #[test]
    fn destination_ports_and_consistent_hashing() {
        let multi = service(
            "multi.default.svc.cluster.local",
            "default",
            &[(8080, Protocol::Http), (9080, Protocol::Http)],
            None,
        );
        let mut services = bookinfo();
        services.push(multi);
        let hash_dr = DestinationRule {
            host: "ratings".into(),
            traffic_policy: Some(TrafficPolicy {
                load_balancer: Some(LoadBalancerSettings {
                    lb_policy: Some(LbPolicy::ConsistentHash(ConsistentHashLb {
                        hash_key: Some(HashKey::HttpHeaderName("x-user".into())),
                        ..Default::default()
                    })),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let set = ConfigSet {
            virtual_services: vec![cfg(
                "default",
                "reviews",
                1,
                vs(
                    &["reviews"],
                    vec![
                        when(
                            uri(MatchType::Prefix("/explicit".into())),
                            vec![HttpRouteDestination {
                                destination: Some(Destination {
                                    host: "multi".into(),
                                    subset: String::new(),
                                    port: Some(PortSelector { number: 8080 }),
                                }),
                                ..Default::default()
                            }],
                        ),
                        when(
                            uri(MatchType::Prefix("/same".into())),
                            vec![dest("multi", "")],
                        ),
                        to(vec![dest("ratings", "")]),
                    ],
                ),
            )],
            destination_rules: vec![cfg("default", "ratings", 1, hash_dr)],
            ..Default::default()
        };
        let snap = snapshot(services, set);
        let rc = sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 9080);
        let req = |p: &str| Request::new("reviews", 9080, p);
        assert_eq!(
            cluster(&rc, req("/explicit")),
            "outbound|8080||multi.default.svc.cluster.local"
        );
        assert_eq!(
            cluster(&rc, req("/same")),
            "outbound|9080||multi.default.svc.cluster.local",
            "the listener port when the destination has it"
        );
        let to_ratings = action(matched(&rc, req("/x")));
        assert_eq!(to_ratings.hash_policy.len(), 1);
        assert!(
            to_ratings
                .retry_policy
                .as_ref()
                .unwrap()
                .retry_host_predicate
                .is_empty(),
            "consistent hashing keeps retries on the same host"
        );
        let default = action(matched(&rc, Request::new("ratings", 9080, "/")));
        assert_eq!(
            default.hash_policy[0].policy_specifier,
            Some(route_action::hash_policy::PolicySpecifier::Header(
                route_action::hash_policy::Header {
                    header_name: "x-user".into(),
                    ..Default::default()
                }
            ))
        );
    }

    #[test]
    fn service_virtual_host_for_proxyless_grpc() {
        let mut echo = service(
            "echo.default.svc.cluster.local",
            "default",
            &[(7070, Protocol::Grpc)],
            Some("10.96.0.10"),
        );
        echo.cluster_vips
            .insert("c2".into(), vec!["10.200.0.1".parse().unwrap()]);
        let set = vs_set(vec![cfg(
            "default",
            "echo",
            1,
            vs(
                &["echo"],
                vec![HttpRoute {
                    timeout: Some(meshfed_api::Duration::from_secs(3)),
                    ..to(vec![dest("echo", "v1")])
                }],
            ),
        )]);
        let snap = snapshot(vec![echo.clone()], set);
        let grpc = node("sidecar", "default", &[], Some("grpc"));
        let service = snap
            .services()
            .resolve("echo.default.svc.cluster.local", "default")
            .unwrap();
        let vh = service_virtual_host(&snap, &grpc.client_view(), service, &service.ports[0]);
        assert_eq!(vh.name, "echo.default.svc.cluster.local:7070");
        assert_eq!(vh.domains.len(), 12);
        assert!(vh.domains.contains(&"10.96.0.10:7070".to_string()));
        let a = action(&vh.routes[0]);
        assert_eq!(
            a.cluster_specifier,
            Some(route_action::ClusterSpecifier::Cluster(
                "outbound|7070|v1|echo.default.svc.cluster.local".into()
            ))
        );
        assert_eq!(
            a.max_stream_duration.as_ref().unwrap().max_stream_duration,
            Some(PbDuration {
                seconds: 3,
                nanos: 0
            })
        );
        // Without a VirtualService: the default route.
        let snap = snapshot(vec![echo], ConfigSet::default());
        let service = snap
            .services()
            .resolve("echo.default.svc.cluster.local", "default")
            .unwrap();
        let vh = service_virtual_host(&snap, &grpc.client_view(), service, &service.ports[0]);
        assert_eq!(vh.routes.len(), 1);
        assert_eq!(vh.routes[0].name, DEFAULT_ROUTE);
    }

    #[test]
    fn a_mesh_wide_wildcard_virtual_service_never_takes_the_catch_all_domain() {
        let snap = snapshot(
            bookinfo(),
            vs_set(vec![cfg(
                "default",
                "everything",
                1,
                vs(&["*"], vec![to(vec![dest("ratings", "")])]),
            )]),
        );
        let proxy = sidecar("default", &[]);
        let rc = sidecar_route_config(&snap, &proxy.client_view(), 9080);
        assert_eq!(
            cluster(&rc, Request::new("reviews", 9080, "/")),
            outbound(9080, "", RATINGS),
            "the wildcard VirtualService owns every service"
        );
        let rc80 = sidecar_route_config(&snap, &proxy.client_view(), 80);
        assert_eq!(vhost(&rc80, "*:80").domains, vec!["*:80"]);
        assert_eq!(rc80.virtual_hosts.last().unwrap().domains, vec!["*"]);
        let problems =
            simulate::check_consistency(&[], &[], std::slice::from_ref(&rc80), &BTreeSet::new());
        assert!(
            problems.iter().all(|p| !p.contains("twice")),
            "{problems:?}"
        );
    }

    // ---- gateways ----

    fn gateway(selector: &str, servers: Vec<Server>) -> Gateway {
        Gateway {
            servers,
            selector: BTreeMap::from([("istio".to_string(), selector.to_string())]),
        }
    }

    fn server(
        number: u32,
        protocol: &str,
        name: &str,
        hosts: &[&str],
        tls: Option<ServerTlsSettings>,
    ) -> Server {
        Server {
            port: Some(istio::Port {
                number,
                protocol: protocol.into(),
                name: name.into(),
                target_port: 0,
            }),
            hosts: hosts.iter().map(|h| h.to_string()).collect(),
            tls,
            ..Default::default()
        }
    }

    fn gw_vs(
        ns: &str,
        name: &str,
        hosts: &[&str],
        gateways: &[&str],
        dest_host: &str,
    ) -> Config<VirtualService> {
        cfg(
            ns,
            name,
            1,
            VirtualService {
                gateways: gateways.iter().map(|g| g.to_string()).collect(),
                ..vs(hosts, vec![to(vec![dest(dest_host, "")])])
            },
        )
    }

    fn gateway_snapshot() -> Snapshot {
        let simple = ServerTlsSettings {
            mode: TlSmode::Simple as i32,
            credential_name: "cert".into(),
            ..Default::default()
        };
        let redirect = ServerTlsSettings {
            https_redirect: true,
            ..Default::default()
        };
        let set = ConfigSet {
            gateways: vec![
                cfg(
                    "istio-system",
                    "ingress",
                    1,
                    gateway(
                        "ingressgateway",
                        vec![
                            server(
                                80,
                                "HTTP",
                                "http",
                                &["*/bookinfo.example.com", "prod/*.prod.example.com"],
                                None,
                            ),
                            server(
                                80,
                                "HTTP",
                                "http-redirect",
                                &["secure.example.com"],
                                Some(redirect),
                            ),
                            server(443, "HTTPS", "https", &["secure.example.com"], Some(simple)),
                            server(
                                8443,
                                "HTTPS",
                                "passthrough",
                                &["pass.example.com"],
                                Some(ServerTlsSettings::default()),
                            ),
                        ],
                    ),
                ),
                cfg(
                    "istio-system",
                    "other",
                    1,
                    gateway("other", vec![server(80, "HTTP", "http", &["*"], None)]),
                ),
            ],
            virtual_services: vec![
                gw_vs(
                    "default",
                    "bookinfo",
                    &["bookinfo.example.com"],
                    &["istio-system/ingress"],
                    "productpage",
                ),
                gw_vs(
                    "default",
                    "mesh-only",
                    &["bookinfo.example.com"],
                    &[],
                    "reviews",
                ),
                gw_vs(
                    "default",
                    "elsewhere",
                    &["bookinfo.example.com"],
                    &["istio-system/other"],
                    "ratings",
                ),
                gw_vs(
                    "prod",
                    "prod",
                    &["api.prod.example.com"],
                    &["istio-system/ingress"],
                    "reviews.default.svc.cluster.local",
                ),
                gw_vs(
                    "dev",
                    "dev",
                    &["dev.prod.example.com"],
                    &["istio-system/ingress"],
                    "ratings.default.svc.cluster.local",
                ),
                gw_vs(
                    "default",
                    "secure",
                    &["secure.example.com"],
                    &["istio-system/ingress"],
                    "reviews",
                ),
            ],
            ..Default::default()
        };
        snapshot(bookinfo(), set)
    }

    #[test]
    fn gateway_routes_are_bound_only_to_their_gateway() {
        let snap = gateway_snapshot();
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(rc.name, "http.80");
        assert_eq!(
            cluster(
                &rc,
                Request::new("bookinfo.example.com", 80, "/productpage")
            ),
            outbound(9080, "", PRODUCTPAGE)
        );
        assert_eq!(
            vhost(&rc, "bookinfo.example.com:80").routes.len(),
            1,
            "mesh and other gateways' routes stay out"
        );
        assert_eq!(
            vhost(&rc, "bookinfo.example.com:80").domains,
            vec!["bookinfo.example.com", "bookinfo.example.com:80"]
        );
        // Server hosts scoped to a namespace only take that namespace's VirtualServices.
        assert_eq!(
            cluster(&rc, Request::new("api.prod.example.com", 80, "/")),
            outbound(9080, "", REVIEWS)
        );
        assert_eq!(
            simulate::route(&rc, &Request::new("dev.prod.example.com", 80, "/")),
            Err(SimError::NoVirtualHost("dev.prod.example.com".into()))
        );
        // The other gateway's router sees its own VirtualService only.
        let other = node("router", "istio-system", &[("istio", "other")], None);
        let rc = gateway_route_config(
            &snap,
            &other.client_view(),
            &MergedGateway::build(&snap, &other.labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(
            cluster(&rc, Request::new("bookinfo.example.com", 80, "/")),
            outbound(9080, "", RATINGS)
        );
        // No server on the port: an empty table; not a gateway route name: nothing.
        let empty = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.81",
        )
        .unwrap();
        assert!(empty.virtual_hosts.is_empty());
        assert_eq!(
            gateway_route_config(
                &snap,
                &router().client_view(),
                &MergedGateway::build(&snap, &router().labels, &[]),
                "9080"
            ),
            None
        );
    }

    #[test]
    fn https_redirect_and_terminated_https() {
        let snap = gateway_snapshot();
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.80",
        )
        .unwrap();
        assert_eq!(
            lands(&rc, Request::new("secure.example.com", 80, "/login")),
            RouteOutcome::Redirect {
                scheme: "https".into(),
                host: "secure.example.com".into(),
                port: None,
                path: "/login".into(),
                code: 301,
            }
        );
        assert_eq!(
            vhost(&rc, "secure.example.com:80").require_tls,
            virtual_host::TlsRequirementType::All as i32
        );
        let https_name = "https.443.https.ingress.istio-system";
        let gw = &snap.config().gateways().next().unwrap().clone();
        assert_eq!(
            crate::generate::merged_gateway::route_name(&gw.spec.servers[2], 443, gw),
            https_name
        );
        assert_eq!(
            crate::generate::merged_gateway::route_name(&gw.spec.servers[3], 443, gw),
            "",
            "passthrough"
        );
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            https_name,
        )
        .unwrap();
        assert_eq!(
            cluster(&rc, Request::new("secure.example.com", 443, "/").tls()),
            outbound(9080, "", REVIEWS)
        );
        assert_eq!(
            GatewayRouteName::parse(https_name),
            Some(GatewayRouteName::Https {
                port: 443,
                port_name: "https",
                gateway: "ingress",
                namespace: "istio-system",
                bind: "",
            })
        );
        assert_eq!(
            GatewayRouteName::parse("http.8080.10.0.0.1"),
            Some(GatewayRouteName::Http {
                port: 8080,
                bind: "10.0.0.1"
            })
        );
    }

    #[test]
    fn gateway_without_routes_answers_404() {
        let set = ConfigSet {
            gateways: vec![cfg(
                "istio-system",
                "ingress",
                1,
                gateway(
                    "ingressgateway",
                    vec![server(8080, "HTTP", "http", &["*"], None)],
                ),
            )],
            ..Default::default()
        };
        let snap = snapshot(bookinfo(), set);
        let rc = gateway_route_config(
            &snap,
            &router().client_view(),
            &MergedGateway::build(&snap, &router().labels, &[]),
            "http.8080",
        )
        .unwrap();
        assert_eq!(names(&rc), vec!["blackhole:8080"]);
        assert_eq!(
            simulate::route(&rc, &Request::new("x", 8080, "/")),
            Err(SimError::NoRoute("blackhole:8080".into()))
        );
    }

    #[test]
    fn generated_tables_are_consistent() {
        let snap = gateway_snapshot();
        let mut tables = vec![
            sidecar_route_config(
                &snap,
                &sidecar("default", &[("app", "productpage")]).client_view(),
                9080,
            ),
            sidecar_route_config(&snap, &sidecar("default", &[]).client_view(), 80),
            gateway_route_config(
                &snap,
                &router().client_view(),
                &MergedGateway::build(&snap, &router().labels, &[]),
                "http.80",
            )
            .unwrap(),
        ];
        tables[2].name = "gw".into();
        let clusters: Vec<Cluster> = tables
            .iter()
            .flat_map(referenced_clusters)
            .collect::<BTreeSet<_>>()
            .into_iter()
            .map(|name| Cluster {
                name,
                cluster_discovery_type: Some(cluster::ClusterDiscoveryType::Type(
                    cluster::DiscoveryType::Static as i32,
                )),
                ..Default::default()
            })
            .collect();
        let problems = simulate::check_consistency(&clusters, &[], &tables, &BTreeSet::new());
        assert!(problems.is_empty(), "{problems:?}");
    }
}

#[cfg(test)]
mod jwt_claim_tests {
    use envoy_types::pb::envoy::r#type::matcher::v3::{
        ListMatcher, OrMatcher, ValueMatcher, list_matcher, metadata_matcher, value_matcher,
    };
    use meshfed_api::networking::v1alpha3::{HttpMatchRequest, StringMatch};

    use super::*;

    fn sm(t: MatchType) -> StringMatch {
        StringMatch {
            match_type: Some(t),
        }
    }

    fn string(p: string_matcher::MatchPattern) -> StringMatcher {
        StringMatcher {
            match_pattern: Some(p),
            ..Default::default()
        }
    }

    /// Istio's `MetadataMatcherForJWTClaims`, written out: filter jwt_authn, path
    /// `payload` then the claims, the claim a string or a list holding one.
    fn for_claims(claims: &[&str], m: StringMatcher) -> MetadataMatcher {
        let value = ValueMatcher {
            match_pattern: Some(value_matcher::MatchPattern::StringMatch(m)),
        };
        MetadataMatcher {
            filter: "envoy.filters.http.jwt_authn".into(),
            path: std::iter::once("payload")
                .chain(claims.iter().copied())
                .map(|k| metadata_matcher::PathSegment {
                    segment: Some(metadata_matcher::path_segment::Segment::Key(k.into())),
                })
                .collect(),
            value: Some(ValueMatcher {
                match_pattern: Some(value_matcher::MatchPattern::OrMatch(OrMatcher {
                    value_matchers: vec![
                        ValueMatcher {
                            match_pattern: Some(value_matcher::MatchPattern::ListMatch(Box::new(
                                ListMatcher {
                                    match_pattern: Some(list_matcher::MatchPattern::OneOf(
                                        Box::new(value.clone()),
                                    )),
                                },
                            ))),
                        },
                        value,
                    ],
                })),
            }),
            invert: false,
        }
    }

    /// Istio's `TestTranslateMetadataMatch` (`networking/core/route/route_test.go`).
    #[test]
    fn translate_metadata_match_vectors_of_istio_pass() {
        use string_matcher::MatchPattern as P;
        let exact = || sm(MatchType::Exact("exact".into()));
        let exact_m = || string(P::Exact("exact".into()));
        let none: [&str; 9] = [
            "@request.auth.claims",
            "@request.auth.claims-",
            "request.auth.claims.",
            "@request.auth.claims.",
            "@request.auth.claims-abc",
            "x-some-other-header",
            "@request.auth.claims[key1",
            "@request.auth.claims]key1",
            "@request.auth.claimskey1",
        ];
        for name in none {
            assert_eq!(translate_metadata_match(name, &exact()), None, "{name}");
        }
        let cases: Vec<(&str, StringMatch, MetadataMatcher)> = vec![
            (
                "@request.auth.claims.key1",
                exact(),
                for_claims(&["key1"], exact_m()),
            ),
            (
                "@request.auth.claims.key1.KEY2",
                exact(),
                for_claims(&["key1", "KEY2"], exact_m()),
            ),
            (
                "@request.auth.claims.key1-key2",
                exact(),
                for_claims(&["key1-key2"], exact_m()),
            ),
            (
                "@request.auth.claims.prefix",
                sm(MatchType::Prefix("prefix".into())),
                for_claims(&["prefix"], string(P::Prefix("prefix".into()))),
            ),
            (
                "@request.auth.claims.regex",
                sm(MatchType::Regex(".+?\\..+?\\..+?".into())),
                for_claims(
                    &["regex"],
                    string(P::SafeRegex(RegexMatcher {
                        regex: ".+?\\..+?\\..+?".into(),
                        ..Default::default()
                    })),
                ),
            ),
            (
                "@request.auth.claims.[key1]",
                exact(),
                for_claims(&["[key1]"], exact_m()),
            ),
            (
                "@request.auth.claims[key1]",
                exact(),
                for_claims(&["key1"], exact_m()),
            ),
            (
                "@request.auth.claims[key1][key2]",
                exact(),
                for_claims(&["key1", "key2"], exact_m()),
            ),
            (
                "@request.auth.claims[test-issuer-2@istio.io]",
                exact(),
                for_claims(&["test-issuer-2@istio.io"], exact_m()),
            ),
            (
                "@request.auth.claims[test-issuer-2@istio.io][key1]",
                exact(),
                for_claims(&["test-issuer-2@istio.io", "key1"], exact_m()),
            ),
        ];
        for (name, m, want) in cases {
            assert_eq!(translate_metadata_match(name, &m), Some(want), "{name}");
        }
    }

    #[test]
    fn claim_keys_become_dynamic_metadata_and_without_headers_inverts_them() {
        let m = HttpMatchRequest {
            headers: [
                (
                    "@request.auth.claims.group".to_string(),
                    sm(MatchType::Exact("admin".into())),
                ),
                ("x-user".to_string(), sm(MatchType::Exact("u".into()))),
            ]
            .into(),
            without_headers: [(
                "@request.auth.claims[tier][level]".to_string(),
                sm(MatchType::Exact("free".into())),
            )]
            .into(),
            ..Default::default()
        };
        let out = translate_match(Some(&m));
        let headers: Vec<&str> = out.headers.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(headers, ["x-user"], "claims are not headers");
        assert_eq!(
            out.dynamic_metadata,
            [
                for_claims(
                    &["group"],
                    string(string_matcher::MatchPattern::Exact("admin".into()))
                ),
                MetadataMatcher {
                    invert: true,
                    ..for_claims(
                        &["tier", "level"],
                        string(string_matcher::MatchPattern::Exact("free".into()))
                    )
                },
            ]
        );
    }
}

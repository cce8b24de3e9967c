//! A sidecar's route tables: one per port, a virtual host per service (with its
//! VirtualService routes) and the catch-all of the outbound traffic policy.

use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::{
    DirectResponseAction, Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route,
    route_action, route_match,
};
use envoy_types::pb::google::protobuf::{BoolValue, UInt32Value};
use meshfed_api::mesh::v1alpha1::mesh_config::outbound_traffic_policy::Mode as MeshOutboundMode;
use meshfed_api::networking::v1alpha3::{
    Destination, VirtualService, outbound_traffic_policy::Mode as SidecarOutboundMode,
};
use meshfed_registry::{Port, Protocol, ProviderId, Resolution, Service};

use super::routes::*;
use crate::model::ClientView;
use crate::push::config_index::{Config, host_matches};
use crate::push::snapshot::Snapshot;

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

/// A sidecar route table by name: the per-port table `"<port>"`, or the table of a
/// sniffed port on a service's own address, `"<host>:<port>"` (Istio's
/// `getVirtualHostsForSniffedServicePort`): the one virtual host of the port's table
/// that serves the service, answering any Host (`*`), and no catch-all. `None` for a
/// name of neither form.
pub fn sidecar_route_config_named(
    snapshot: &Snapshot,
    proxy: &ClientView,
    name: &str,
) -> Option<RouteConfiguration> {
    if let Ok(port) = name.parse::<u16>() {
        return Some(sidecar_route_config(snapshot, proxy, port));
    }
    let (host, port) = name.rsplit_once(':')?;
    let port: u16 = port.parse().ok()?;
    let mut virtual_hosts: Vec<VirtualHost> = sidecar_virtual_hosts(snapshot, proxy, port)
        .into_iter()
        .filter(|vh| vh.domains.iter().any(|d| d == name || d == host))
        .collect();
    if let [only] = virtual_hosts.as_mut_slice() {
        only.domains = vec!["*".to_string()];
    }
    virtual_hosts.sort_by(|a, b| a.name.cmp(&b.name));
    Some(route_configuration(name.to_string(), virtual_hosts))
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

pub(super) fn sidecar_virtual_hosts(
    snapshot: &Snapshot,
    proxy: &ClientView,
    port: u16,
) -> Vec<VirtualHost> {
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
            && resolved.resolution != Resolution::Alias
        {
            services.insert(host, resolved);
        }
    }
    let aliases = alias_index(snapshot.route_services(&proxy.namespace, &proxy.labels, port));
    let domains_of = |service: &Service| {
        let (mut domains, mut alt) = virtual_host_domains(service, port, proxy);
        for alias in aliases.get(service.hostname.as_str()).into_iter().flatten() {
            let alias_alt = alt_hosts(alias, port, &proxy.dns_domain);
            domains.push(alias.to_string());
            domains.push(join_host_port(alias, port));
            domains.extend(alias_alt.iter().cloned());
            alt.extend(alias_alt);
        }
        let mut seen = HashSet::new();
        domains.retain(|d| seen.insert(d.clone()));
        (domains, alt)
    };
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
            let (domains, alt) = domains_of(service);
            let name = join_host_port(service.hostname.as_str(), port);
            set.add(name, domains, &alt, routes[i].clone());
        }
    }
    for service in unowned {
        let Some(service_port) = service.port(port) else {
            continue;
        };
        let (domains, alt) = domains_of(service);
        let name = join_host_port(service.hostname.as_str(), port);
        let routes = vec![default_route(&ctx, service, service_port)];
        set.add(name, domains, &alt, routes);
    }
    set.virtual_hosts
}

/// Istio's resolved service aliases: concrete hostname -> the names of the alias
/// (ExternalName) services that stand for it, through chains of aliases (a loop
/// resolves to nothing, as Kubernetes DNS answers NXDOMAIN), ordered by namespace then
/// name.
pub(super) fn alias_index<'a>(
    services: impl Iterator<Item = &'a Arc<Service>>,
) -> BTreeMap<&'a str, Vec<&'a str>> {
    let mut raw: BTreeMap<&str, (&str, &str)> = BTreeMap::new();
    for s in services {
        if s.resolution == Resolution::Alias
            && let Some(target) = &s.alias_for
        {
            raw.insert(s.hostname.as_str(), (target.as_str(), s.namespace.as_str()));
        }
    }
    let mut by_concrete: BTreeMap<&str, Vec<(&str, &str)>> = BTreeMap::new();
    for (&alias, &(target, namespace)) in &raw {
        let mut seen = HashSet::from([alias]);
        let mut concrete = target;
        let mut looped = false;
        while let Some(&(next, _)) = raw.get(concrete) {
            if !seen.insert(concrete) {
                looped = true;
                break;
            }
            concrete = next;
        }
        if !looped {
            by_concrete
                .entry(concrete)
                .or_default()
                .push((namespace, alias));
        }
    }
    by_concrete
        .into_iter()
        .map(|(concrete, mut aliases)| {
            aliases.sort();
            (concrete, aliases.into_iter().map(|(_, a)| a).collect())
        })
        .collect()
}

/// The hosts of a VirtualService that are not services on this port: exact hosts that
/// name none, and wildcard hosts that match none.
pub(super) fn non_service_hosts<'v>(
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
pub(super) struct VirtualHostSet {
    pub(super) names: HashSet<String>,
    pub(super) domains: HashSet<String>,
    /// Service FQDNs (with and without port): a short name that expands to one of
    /// them must not shadow the real service.
    pub(super) known_fqdns: HashSet<String>,
    pub(super) virtual_hosts: Vec<VirtualHost>,
}

impl VirtualHostSet {
    pub(super) fn new<'a>(fqdns: impl Iterator<Item = &'a str>, port: u16) -> Self {
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

    pub(super) fn add(
        &mut self,
        name: String,
        domains: Vec<String>,
        alt: &[String],
        routes: Vec<Route>,
    ) {
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

pub(super) fn new_virtual_host(
    name: String,
    domains: Vec<String>,
    routes: Vec<Route>,
) -> VirtualHost {
    VirtualHost {
        name,
        domains,
        routes,
        include_request_attempt_count: true,
        ..Default::default()
    }
}

pub(super) fn route_configuration(
    name: String,
    virtual_hosts: Vec<VirtualHost>,
) -> RouteConfiguration {
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

pub(super) fn http_or_sniffed(port: &Port) -> bool {
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
pub(super) fn addresses_for_proxy(service: &Service, proxy: &ClientView) -> Vec<IpAddr> {
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
pub(super) fn alt_hosts(hostname: &str, port: u16, dns_domain: &str) -> Vec<String> {
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

pub(super) fn catch_all_virtual_host(snapshot: &Snapshot, proxy: &ClientView) -> VirtualHost {
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

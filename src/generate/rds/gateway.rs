//! A router's route tables: the virtual hosts of the Gateway servers of a route name,
//! with the routes of the VirtualServices bound to them.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteConfiguration, VirtualHost, virtual_host,
};
use meshfed_registry::Protocol;

use super::routes::*;
use super::sidecar::*;
use crate::generate::merged_gateway::{MergedGateway, MergedServer};
use crate::model::ClientView;
use crate::push::config_index::host_matches;
use crate::push::snapshot::Snapshot;

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
                    new_virtual_host(join_host_port(&host, port), vec![host.clone()], Vec::new())
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
                    new_virtual_host(join_host_port(&host, port), vec![host.clone()], Vec::new())
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
    // Envoy gateways match hosts without their port, so each virtual host names its
    // host once (Istio: `ignore_port_in_host_matching` for all but proxyless clients).
    Some(RouteConfiguration {
        ignore_port_in_host_matching: true,
        ..route_configuration(route_name.to_string(), virtual_hosts)
    })
}

pub(super) fn strip_namespace(host: &str) -> &str {
    host.split_once('/').map_or(host, |(_, h)| h)
}

/// A server's hosts that a VirtualService in `vs_ns` may bind to (`ns/host`, `*/host`,
/// `./host` = the gateway's namespace, or a bare host), namespace stripped.
pub(super) fn server_hosts_for_namespace(
    hosts: &[String],
    vs_ns: &str,
    gateway_ns: &str,
) -> Vec<String> {
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
pub(super) fn intersect_hosts(server_hosts: &[String], vs_hosts: &[String]) -> Vec<String> {
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
pub(super) fn catch_alls_last(routes: Vec<Route>) -> Vec<Route> {
    let (catch_alls, mut rest): (Vec<Route>, Vec<Route>) =
        routes.into_iter().partition(is_catch_all);
    rest.extend(catch_alls);
    rest
}

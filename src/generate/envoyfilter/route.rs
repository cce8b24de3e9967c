//! `ROUTE_CONFIGURATION`, `VIRTUAL_HOST` and `HTTP_ROUTE` patches (Istio's
//! `rc_patch.go`): route configuration merges; virtual host merges, replacements,
//! removals and additions; route merges, removals and insertions.

use std::sync::Arc;

use envoy_types::pb::envoy::config::route::v3::Route;
use envoy_types::pb::envoy::config::route::v3::{RouteConfiguration, VirtualHost, route};
use meshfed_api::networking::v1alpha3::envoy_filter::{
    ApplyTo, PatchContext, RouteConfigurationMatch, envoy_config_object_match::ObjectTypes,
    patch::Operation, route_configuration_match::route_match::Action,
};
use prost::Message;

use super::{Patch, ProxyPatches, context, status, value};
use crate::model::Proxy;
use crate::xds::names::ClusterName;
use crate::xds::{EncodedResource, Resource, TypeUrl};

fn rmatch(p: &Patch) -> Option<&RouteConfigurationMatch> {
    match &p.matcher.object_types {
        Some(ObjectTypes::RouteConfiguration(r)) => Some(r),
        _ => None,
    }
}

/// Istio's `ParseGatewayRDSRouteName`: port, server port name and `namespace/name` of
/// the Gateway of a gateway route configuration name.
pub fn parse_gateway_route_name(name: &str) -> (u32, &str, String) {
    let parts: Vec<&str> = name.split('.').collect();
    if name.starts_with("http.") && parts.len() >= 2 {
        return (parts[1].parse().unwrap_or(0), "", String::new());
    }
    if name.starts_with("https.") && parts.len() >= 5 {
        return (
            parts[1].parse().unwrap_or(0),
            parts[2],
            format!("{}/{}", parts[4], parts[3]),
        );
    }
    (0, "", String::new())
}

fn listener_port_from_name(name: &str) -> u32 {
    if name.starts_with("inbound") {
        ClusterName::parse(name).map_or(0, |n| u32::from(n.port))
    } else {
        name.parse().unwrap_or(0)
    }
}

/// A router's gateway port map (Istio's `GatewayPortMap`): for the port of each of its
/// gateway route configuration names (the resolved, target port of `http.<port>`),
/// the port numbers of the Gateway servers behind it (the service ports). A
/// `portNumber` match names the service port a Gateway declares, so it matches a
/// route configuration of the target port too.
pub type GatewayPortMap = std::collections::BTreeMap<u32, std::collections::BTreeSet<u32>>;

/// Whether some route patch of `patches` matches a `portNumber` (only those read a
/// router's port map).
pub fn matches_ports(patches: &ProxyPatches) -> bool {
    [
        ApplyTo::RouteConfiguration,
        ApplyTo::VirtualHost,
        ApplyTo::HttpRoute,
    ]
    .iter()
    .flat_map(|k| patches.of(*k))
    .any(|p| rmatch(p).is_some_and(|m| m.port_number != 0))
}

/// Whether a route configuration of port `number` is one of port `wanted`: the same
/// port, or a server port `wanted` behind it by `port_map` (Istio's `anyPortMatches`).
fn any_port_matches(port_map: &GatewayPortMap, number: u32, wanted: u32) -> bool {
    number == wanted || port_map.get(&number).is_some_and(|s| s.contains(&wanted))
}

/// Istio's `routeConfigurationMatch`; `port_map` is the router's (empty for sidecars).
pub fn route_configuration_match(
    ctx: PatchContext,
    rc: &RouteConfiguration,
    p: &Patch,
    port_map: &GatewayPortMap,
) -> bool {
    let Some(m) = rmatch(p) else { return true };
    if !m.name.is_empty() && m.name != rc.name {
        return false;
    }
    if ctx != PatchContext::Gateway {
        return m.port_number == 0 || m.port_number == listener_port_from_name(&rc.name);
    }
    let (port, port_name, gateway) = parse_gateway_route_name(&rc.name);
    if !m.port_name.is_empty() && m.port_name != port_name {
        return false;
    }
    if !m.gateway.is_empty() && m.gateway != gateway {
        return false;
    }
    m.port_number == 0 || any_port_matches(port_map, port, m.port_number)
}

/// Istio's `virtualHostMatch`.
pub fn virtual_host_match(vh: &VirtualHost, p: &Patch) -> bool {
    let Some(m) = rmatch(p).and_then(|r| r.vhost.as_ref()) else {
        return true;
    };
    (m.name.is_empty() || m.name == vh.name)
        && (m.domain_name.is_empty() || vh.domains.contains(&m.domain_name))
}

fn has_route_match(p: &Patch) -> bool {
    rmatch(p)
        .and_then(|r| r.vhost.as_ref())
        .is_some_and(|v| v.route.is_some())
}

/// Istio's `routeMatch`.
pub fn route_match(r: &Route, p: &Patch) -> bool {
    let Some(m) = rmatch(p)
        .and_then(|r| r.vhost.as_ref())
        .and_then(|v| v.route.as_ref())
    else {
        return true;
    };
    if !m.name.is_empty() && m.name != r.name {
        return false;
    }
    let action = Action::try_from(m.action).unwrap_or(Action::Any);
    match (action, &r.action) {
        (Action::Any, _) => true,
        (Action::Route, Some(route::Action::Route(_))) => true,
        (Action::Redirect, Some(route::Action::Redirect(_))) => true,
        (Action::DirectResponse, Some(route::Action::DirectResponse(_))) => true,
        (
            _,
            Some(
                route::Action::Route(_)
                | route::Action::Redirect(_)
                | route::Action::DirectResponse(_),
            ),
        ) => false,
        _ => true,
    }
}

fn patch_routes(
    list: &[Arc<Patch>],
    ctx: PatchContext,
    rc: &RouteConfiguration,
    vh: &mut VirtualHost,
    port_map: &GatewayPortMap,
) {
    let mut routes: Vec<Option<Route>> = std::mem::take(&mut vh.routes)
        .into_iter()
        .map(Some)
        .collect();
    for slot in &mut routes {
        for p in list {
            let Some(r) = slot.as_mut() else { break };
            let applies = p.context_matches(ctx)
                && route_configuration_match(ctx, rc, p, port_map)
                && virtual_host_match(vh, p)
                && route_match(r, p);
            if applies {
                match p.operation {
                    Operation::Remove => {
                        *slot = None;
                        status::record(&p.key, "route", true);
                        break;
                    }
                    Operation::Merge => {
                        if let Some(src) = &p.value
                            && let Err(e) = value::merge_into(r, src)
                        {
                            status::reject(&p.key, "route", &e);
                        }
                    }
                    _ => {}
                }
            }
            status::record(&p.key, "route", applies);
        }
    }
    let mut routes: Vec<Route> = routes.into_iter().flatten().collect();
    for p in list {
        if !p.context_matches(ctx)
            || !route_configuration_match(ctx, rc, p, port_map)
            || !virtual_host_match(vh, p)
        {
            status::record(&p.key, "route", false);
            continue;
        }
        let Some(v) = p.typed::<Route>() else {
            continue;
        };
        let has = has_route_match(p);
        let first = routes.iter().position(|r| route_match(r, p));
        let applied = match p.operation {
            Operation::Add => {
                routes.push(v);
                true
            }
            Operation::InsertAfter if !has => {
                routes.push(v);
                continue;
            }
            Operation::InsertBefore | Operation::InsertFirst if !has => {
                routes.insert(0, v);
                continue;
            }
            Operation::InsertAfter => first.is_some_and(|i| {
                routes.insert(i + 1, v);
                true
            }),
            Operation::InsertBefore => first.is_some_and(|i| {
                routes.insert(i, v);
                true
            }),
            Operation::InsertFirst => first.is_some_and(|_| {
                routes.insert(0, v);
                true
            }),
            _ => false,
        };
        status::record(&p.key, "route", applied);
    }
    vh.routes = routes;
}

pub(crate) fn patch_route_configuration(
    patches: &ProxyPatches,
    ctx: PatchContext,
    mut rc: RouteConfiguration,
    port_map: &GatewayPortMap,
) -> RouteConfiguration {
    for p in patches.of(ApplyTo::RouteConfiguration) {
        if p.operation != Operation::Merge {
            continue;
        }
        let applies = p.context_matches(ctx) && route_configuration_match(ctx, &rc, p, port_map);
        if applies
            && let Some(src) = &p.value
            && let Err(e) = value::merge_into(&mut rc, src)
        {
            status::reject(&p.key, "route", &e);
            continue;
        }
        status::record(&p.key, "route", applies);
    }
    let vpatches = patches.of(ApplyTo::VirtualHost);
    let rpatches = patches.of(ApplyTo::HttpRoute);
    let hosts = std::mem::take(&mut rc.virtual_hosts);
    let mut kept = Vec::with_capacity(hosts.len());
    'hosts: for mut vh in hosts {
        for p in vpatches {
            let applies = p.context_matches(ctx)
                && route_configuration_match(ctx, &rc, p, port_map)
                && virtual_host_match(&vh, p);
            if applies {
                match p.operation {
                    Operation::Remove => {
                        status::record(&p.key, "vhost", true);
                        continue 'hosts;
                    }
                    Operation::Merge => {
                        if let Some(src) = &p.value
                            && let Err(e) = value::merge_into(&mut vh, src)
                        {
                            status::reject(&p.key, "vhost", &e);
                        }
                    }
                    Operation::Replace => {
                        if let Some(v) = p.typed::<VirtualHost>() {
                            vh = v;
                        }
                    }
                    _ => {}
                }
            }
            status::record(&p.key, "vhost", applies);
        }
        if !rpatches.is_empty() {
            patch_routes(rpatches, ctx, &rc, &mut vh, port_map);
        }
        kept.push(vh);
    }
    for p in vpatches {
        if p.operation != Operation::Add {
            continue;
        }
        let applies = p.context_matches(ctx) && route_configuration_match(ctx, &rc, p, port_map);
        if applies {
            kept.extend(p.typed::<VirtualHost>());
        }
        status::record(&p.key, "vhost", applies);
    }
    rc.virtual_hosts = kept;
    rc
}

/// One route configuration of `proxy` (with gateway port map `port_map`) patched (the
/// same resource when nothing changed it).
pub fn patch_one(
    patches: &ProxyPatches,
    r: &Resource,
    proxy: &Proxy,
    port_map: &GatewayPortMap,
) -> Resource {
    let Ok(rc) = RouteConfiguration::decode(r.body.value.as_ref()) else {
        return r.clone();
    };
    let ctx = context(proxy, rc.name.starts_with("inbound"));
    let patched = patch_route_configuration(patches, ctx, rc.clone(), port_map);
    if patched == rc {
        r.clone()
    } else {
        EncodedResource::encode(TypeUrl::Route, patched.name.clone(), &patched)
    }
}

/// Patches the route configurations of `proxy` (gateway port map `port_map`).
pub fn apply(
    patches: &ProxyPatches,
    routes: Vec<Resource>,
    proxy: &Proxy,
    port_map: &GatewayPortMap,
) -> Vec<Resource> {
    routes
        .iter()
        .map(|r| patch_one(patches, r, proxy, port_map))
        .collect()
}

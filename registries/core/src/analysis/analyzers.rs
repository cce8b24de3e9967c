//! The analyzers that look at references between objects (after Istio's
//! `analyzers/virtualservice`, `analyzers/service` and `analyzers/schema`).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use meshfed_api::networking::v1alpha3 as net;

use super::{
    CONFLICTING_MESH_GATEWAY_VS_HOSTS, EXTERNAL_NAME_INVALID_PORT_NAME, Inputs, Message,
    PORT_NAME_NOT_UNDER_CONVENTION, REFERENCED_RESOURCE_NOT_FOUND, SCHEMA_VALIDATION_ERROR,
    SCHEMA_WARNING, VS_DESTINATION_PORT_SELECTOR_REQUIRED, VS_HOST_NOT_FOUND_IN_GATEWAY, go_list,
    message, object_ref, quote,
};
use crate::config::ConfigObject;

/// `istio-system`-like namespaces whose Services are not checked for port names.
const SYSTEM_NAMESPACES: [&str; 5] = [
    "kube-system",
    "kube-public",
    "kube-node-lease",
    "local-path-storage",
    "istio-system",
];

/// IST0106 for every object that failed decoding or validation, IST0133 for every
/// validation warning.
pub(super) fn schema(inputs: &Inputs, out: &mut Vec<Message>) {
    for (object, errors) in &inputs.invalid {
        for e in errors {
            let field = (!e.field.is_root()).then(|| e.field.to_string());
            out.push(message(
                SCHEMA_VALIDATION_ERROR,
                object.clone(),
                format!("Schema validation error: {e}"),
                field,
            ));
        }
    }
    for (obj, warnings) in &inputs.configs {
        for w in warnings {
            let field = (!w.field.is_root()).then(|| w.field.to_string());
            out.push(message(
                SCHEMA_WARNING,
                object_ref(obj),
                format!("Schema validation warning: {w}"),
                field,
            ));
        }
    }
}

/// The config objects of one kind with their specs.
pub(super) fn of_kind<'a, T: crate::config::KindSpec + 'a>(
    inputs: &'a Inputs,
) -> impl Iterator<Item = (&'a ConfigObject, &'a T)> + 'a {
    inputs
        .configs
        .iter()
        .filter_map(|(obj, _)| obj.spec.get::<T>().map(|spec| (obj, spec)))
}

/// The namespaces an `exportTo` list makes an object visible in: `*` alone when it is
/// empty or names `*`, each `.` read as the object's own `namespace`.
pub fn export_scopes(export_to: &[String], namespace: &str) -> Vec<String> {
    if export_to.is_empty() || export_to.iter().any(|e| e == "*") {
        return vec!["*".to_string()];
    }
    export_to
        .iter()
        .map(|e| {
            if e == "." {
                namespace.to_string()
            } else {
                e.clone()
            }
        })
        .collect()
}

/// Istio's `ConvertHostToFQDN`: a short name is qualified with the namespace.
fn fqdn(namespace: &str, host: &str, domain: &str) -> String {
    if host.starts_with('*') || host.contains('.') {
        host.to_string()
    } else {
        format!("{host}.{namespace}.svc.{domain}")
    }
}

/// A service a destination may name: its ports.
#[derive(Clone, Debug)]
struct Known {
    ports: Vec<u32>,
}

/// Istio's `InitServiceEntryHostMap`: `scope/fqdn` -> the service, where scope is
/// `*` or the namespace the host is visible in.
fn known_hosts(inputs: &Inputs) -> HashMap<(String, String), Known> {
    let mut out = HashMap::new();
    for (obj, se) in of_kind::<net::ServiceEntry>(inputs) {
        let known = Known {
            ports: se.ports.iter().map(|p| p.number).collect(),
        };
        for h in &se.hosts {
            let host = fqdn(&obj.namespace, h, &inputs.domain);
            for scope in export_scopes(&se.export_to, &obj.namespace) {
                out.insert((scope, host.clone()), known.clone());
            }
        }
    }
    for svc in &inputs.services {
        let host = fqdn(&svc.object.namespace, &svc.object.name, &inputs.domain);
        let known = Known {
            ports: svc.ports.iter().map(|p| p.port).collect(),
        };
        for scope in export_scopes(&svc.export_to, &svc.object.namespace) {
            out.insert((scope, host.clone()), known.clone());
        }
    }
    for registry_host in &inputs.registry_hosts {
        let known = Known {
            ports: registry_host.ports.clone(),
        };
        for scope in &registry_host.visible_in {
            out.entry((scope.clone(), registry_host.hostname.clone()))
                .or_insert_with(|| known.clone());
        }
    }
    out
}

/// Istio's `GetDestinationHost`.
fn destination_host<'a>(
    known: &'a HashMap<(String, String), Known>,
    namespace: &str,
    export_to: &[String],
    host: &str,
    domain: &str,
) -> Option<&'a Known> {
    let name = fqdn(namespace, host, domain);
    if let Some(k) = known.get(&("*".to_string(), name.clone())) {
        return Some(k);
    }
    if export_to.is_empty() {
        if let Some(k) = known.get(&(namespace.to_string(), name.clone())) {
            return Some(k);
        }
    } else {
        for e in export_to {
            let scope = if e == "." { namespace } else { e.as_str() };
            if let Some(k) = known.get(&(scope.to_string(), name.clone())) {
                return Some(k);
            }
        }
    }
    let bare = host.strip_prefix('*').unwrap_or(host);
    let mut wildcard: Vec<_> = known
        .iter()
        .filter(|((scope, se_host), _)| {
            se_host.starts_with('*') && (scope == "*" || scope == namespace)
        })
        .collect();
    wildcard.sort_by(|a, b| a.0.cmp(b.0));
    wildcard
        .into_iter()
        .find(|((_, se_host), _)| bare.ends_with(&se_host[1..]))
        .map(|(_, k)| k)
}

/// A destination of a VirtualService with the path of its field.
struct Dest<'a> {
    dest: &'a net::Destination,
    field: String,
    mirror: bool,
}

fn route_destinations(vs: &net::VirtualService) -> Vec<Dest<'_>> {
    let mut out = Vec::new();
    for (i, http) in vs.http.iter().enumerate() {
        for (j, r) in http.route.iter().enumerate() {
            if let Some(d) = &r.destination {
                out.push(Dest {
                    dest: d,
                    field: format!("spec.http[{i}].route[{j}].destination.host"),
                    mirror: false,
                });
            }
        }
    }
    for (i, tcp) in vs.tcp.iter().enumerate() {
        for (j, r) in tcp.route.iter().enumerate() {
            if let Some(d) = &r.destination {
                out.push(Dest {
                    dest: d,
                    field: format!("spec.tcp[{i}].route[{j}].destination.host"),
                    mirror: false,
                });
            }
        }
    }
    for (i, tls) in vs.tls.iter().enumerate() {
        for (j, r) in tls.route.iter().enumerate() {
            if let Some(d) = &r.destination {
                out.push(Dest {
                    dest: d,
                    field: format!("spec.tls[{i}].route[{j}].destination.host"),
                    mirror: false,
                });
            }
        }
    }
    out
}

fn mirror_destinations(vs: &net::VirtualService) -> Vec<Dest<'_>> {
    let mut out = Vec::new();
    for (i, http) in vs.http.iter().enumerate() {
        if let Some(d) = &http.mirror {
            out.push(Dest {
                dest: d,
                field: format!("spec.http[{i}].mirror.host"),
                mirror: true,
            });
        }
        for (j, m) in http.mirrors.iter().enumerate() {
            if let Some(d) = &m.destination {
                out.push(Dest {
                    dest: d,
                    field: format!("spec.http[{i}].mirrors[{j}].destination.host"),
                    mirror: true,
                });
            }
        }
    }
    out
}

/// `virtualservice.DestinationHostAnalyzer`: destinations (and mirrors) naming a
/// host no Service or ServiceEntry visible to the VirtualService defines (IST0101), a
/// port the service does not have (IST0101 `host:port`), or no port of a service
/// with several (IST0112). Also a `delegate` naming no VirtualService (IST0101).
pub(super) fn destination_hosts(inputs: &Inputs, out: &mut Vec<Message>) {
    let known = known_hosts(inputs);
    let names: BTreeSet<(String, String)> = of_kind::<net::VirtualService>(inputs)
        .map(|(o, _)| (o.namespace.clone(), o.name.clone()))
        .collect();
    for (obj, vs) in of_kind::<net::VirtualService>(inputs) {
        let dests = route_destinations(vs)
            .into_iter()
            .chain(mirror_destinations(vs));
        for d in dests {
            let host = d.dest.host.as_str();
            let Some(k) =
                destination_host(&known, &obj.namespace, &vs.export_to, host, &inputs.domain)
            else {
                let what = if d.mirror { "mirror host" } else { "host" };
                out.push(message(
                    REFERENCED_RESOURCE_NOT_FOUND,
                    object_ref(obj),
                    format!("Referenced {what} not found: {}", quote(host)),
                    Some(d.field),
                ));
                continue;
            };
            match &d.dest.port {
                None if k.ports.len() > 1 => {
                    let ports: Vec<String> = k.ports.iter().map(u32::to_string).collect();
                    out.push(message(
                        VS_DESTINATION_PORT_SELECTOR_REQUIRED,
                        object_ref(obj),
                        format!(
                            "This VirtualService routes to a service {} that exposes multiple ports {}. \
                             Specifying a port in the destination is required to disambiguate.",
                            quote(host),
                            go_list(&ports)
                        ),
                        Some(d.field),
                    ));
                }
                Some(p) if !k.ports.contains(&p.number) => {
                    out.push(message(
                        REFERENCED_RESOURCE_NOT_FOUND,
                        object_ref(obj),
                        format!(
                            "Referenced host:port not found: {}",
                            quote(&format!("{host}:{}", p.number))
                        ),
                        Some(d.field),
                    ));
                }
                _ => {}
            }
        }
        for (i, http) in vs.http.iter().enumerate() {
            if let Some(delegate) = &http.delegate {
                let ns = if delegate.namespace.is_empty() {
                    obj.namespace.clone()
                } else {
                    delegate.namespace.clone()
                };
                if !names.contains(&(ns.clone(), delegate.name.clone())) {
                    out.push(message(
                        REFERENCED_RESOURCE_NOT_FOUND,
                        object_ref(obj),
                        format!(
                            "Referenced delegate VirtualService not found: {}",
                            quote(&format!("{ns}/{}", delegate.name))
                        ),
                        Some(format!("spec.http[{i}].delegate")),
                    ));
                }
            }
        }
    }
}

/// Istio's `GetResourceNameFromHost`: `(namespace, name)` of a host.
fn resource_name(namespace: &str, host: &str, domain: &str) -> (String, String) {
    let suffix = format!(".svc.{domain}");
    if let Some(rest) = host.strip_suffix(&suffix)
        && let Some((name, ns)) = rest.rsplit_once('.')
        && !name.is_empty()
        && !ns.is_empty()
    {
        return (ns.to_string(), name.to_string());
    }
    (namespace.to_string(), host.to_string())
}

/// `virtualservice.DestinationRuleAnalyzer`: a destination naming a subset that no
/// DestinationRule for its host defines (IST0101).
pub(super) fn destination_subsets(inputs: &Inputs, out: &mut Vec<Message>) {
    let mut subsets = BTreeSet::new();
    for (obj, dr) in of_kind::<net::DestinationRule>(inputs) {
        let host = resource_name(&obj.namespace, &dr.host, &inputs.domain);
        for s in &dr.subsets {
            subsets.insert((host.clone(), s.name.clone()));
        }
    }
    for (obj, vs) in of_kind::<net::VirtualService>(inputs) {
        for d in route_destinations(vs)
            .into_iter()
            .chain(mirror_destinations(vs))
        {
            let subset = &d.dest.subset;
            if subset.is_empty() {
                continue;
            }
            let host = resource_name(&obj.namespace, &d.dest.host, &inputs.domain);
            if subsets.contains(&(host, subset.clone())) {
                continue;
            }
            let what = if d.mirror {
                "mirror+subset"
            } else {
                "host+subset"
            };
            out.push(message(
                REFERENCED_RESOURCE_NOT_FOUND,
                object_ref(obj),
                format!(
                    "Referenced {what} in destinationrule not found: {}",
                    quote(&format!("{}+{subset}", d.dest.host))
                ),
                Some(d.field.replace(".host", ".subset")),
            ));
        }
    }
}

/// Istio's `host.Name.Matches`, both ways wildcard-aware.
pub(super) fn hosts_match(a: &str, b: &str) -> bool {
    match (a.strip_prefix('*'), b.strip_prefix('*')) {
        (Some(sa), Some(sb)) => sa.ends_with(sb) || sb.ends_with(sa),
        (Some(sa), None) => b.ends_with(sa),
        (None, Some(sb)) => a.ends_with(sb),
        (None, None) => a == b,
    }
}

/// `virtualservice.GatewayAnalyzer`: a gateway that does not exist (IST0101), and
/// hosts no server of the gateway takes (IST0132).
pub(super) fn gateways(inputs: &Inputs, out: &mut Vec<Message>) {
    let gateways: BTreeMap<(String, String), &net::Gateway> = of_kind::<net::Gateway>(inputs)
        .map(|(o, g)| ((o.namespace.clone(), o.name.clone()), g))
        .collect();
    for (obj, vs) in of_kind::<net::VirtualService>(inputs) {
        for (i, gw) in vs.gateways.iter().enumerate() {
            if gw == "mesh" {
                continue;
            }
            let (ns, name) = match gw.split_once('/') {
                Some((ns, name)) => (ns.to_string(), name.to_string()),
                None => (obj.namespace.clone(), gw.clone()),
            };
            let found = gateways.get(&(ns.clone(), name.clone()));
            if found.is_none() {
                out.push(message(
                    REFERENCED_RESOURCE_NOT_FOUND,
                    object_ref(obj),
                    format!("Referenced gateway not found: {}", quote(gw)),
                    Some(format!("spec.gateways[{i}]")),
                ));
            }
            let server_hosts: Vec<String> = found
                .map(|g| {
                    g.servers
                        .iter()
                        .flat_map(|s| s.hosts.iter())
                        .filter_map(|h| match h.split_once('/') {
                            Some((hns, h))
                                if hns == "*"
                                    || hns == "." && ns == obj.namespace
                                    || hns == obj.namespace =>
                            {
                                Some(h.to_string())
                            }
                            Some(_) => None,
                            None => Some(h.clone()),
                        })
                        .collect()
                })
                .unwrap_or_default();
            let taken = server_hosts
                .iter()
                .any(|gh| vs.hosts.iter().any(|vh| hosts_match(gh, vh)));
            if !taken {
                out.push(message(
                    VS_HOST_NOT_FOUND_IN_GATEWAY,
                    object_ref(obj),
                    format!(
                        "one or more host {} defined in VirtualService {}/{} not found in Gateway {ns}/{name}.",
                        go_list(&vs.hosts),
                        obj.namespace,
                        obj.name
                    ),
                    Some(format!("spec.gateways[{i}]")),
                ));
            }
        }
    }
}

/// `virtualservice.ConflictingMeshGatewayHostsAnalyzer`: several VirtualServices of
/// the mesh gateway defining hosts that overlap where both are visible (IST0109): in
/// one `exportTo` scope, or one scope and everywhere (`*`). One message per
/// VirtualService, about the first conflict found.
pub(super) fn conflicting_mesh_gateway_hosts(inputs: &Inputs, out: &mut Vec<Message>) {
    // (scope, host, object), in object order.
    let mut entries: Vec<(String, String, &ConfigObject)> = Vec::new();
    for (obj, vs) in of_kind::<net::VirtualService>(inputs) {
        if !(vs.gateways.is_empty() || vs.gateways.iter().any(|g| g == "mesh")) {
            continue;
        }
        let scopes: BTreeSet<String> = export_scopes(&vs.export_to, &obj.namespace)
            .into_iter()
            .collect();
        for scope in scopes {
            for h in &vs.hosts {
                entries.push((scope.clone(), fqdn(&obj.namespace, h, &inputs.domain), obj));
            }
        }
    }
    let same = |a: &ConfigObject, b: &ConfigObject| a.namespace == b.namespace && a.name == b.name;
    let mut reported: Vec<&ConfigObject> = Vec::new();
    for (scope, host, obj) in &entries {
        if reported.iter().any(|r| same(r, obj)) {
            continue;
        }
        let mut names = vec![format!("{}/{}", obj.namespace, obj.name)];
        for (other_scope, other_host, other) in &entries {
            let visible = other_scope == scope || other_scope == "*" || scope == "*";
            let name = format!("{}/{}", other.namespace, other.name);
            if !same(obj, other)
                && visible
                && hosts_match(host, other_host)
                && !names.contains(&name)
            {
                names.push(name);
            }
        }
        if names.len() < 2 {
            continue;
        }
        reported.push(obj);
        out.push(message(
            CONFLICTING_MESH_GATEWAY_VS_HOSTS,
            object_ref(obj),
            format!(
                "The VirtualServices {} associated with mesh gateway define the same host {scope}/{host} \
                 which can lead to undefined behavior. This can be fixed by merging the conflicting \
                 VirtualServices into a single resource.",
                names.join(",")
            ),
            Some("metadata.name".to_string()),
        ));
    }
}

/// Protocols a port name may start with (Istio's `protocol.Parse`, case-insensitive).
const PROTOCOLS: [&str; 14] = [
    "tcp",
    "udp",
    "grpc",
    "grpc-web",
    "http",
    "http_proxy",
    "http2",
    "https",
    "tls",
    "mongo",
    "redis",
    "mysql",
    "thrift",
    "hbone",
];

/// Whether a port's protocol is known (Istio's `kube.ConvertProtocol` is not
/// `Unsupported`): from `appProtocol`, else the name's prefix before `-`; UDP ports
/// are UDP whatever their name.
fn protocol_known(port: &super::ServicePort) -> bool {
    if port.protocol.eq_ignore_ascii_case("udp") {
        return true;
    }
    let known = |p: &str| PROTOCOLS.iter().any(|k| k.eq_ignore_ascii_case(p));
    if let Some(app) = &port.app_protocol {
        let app = app.strip_prefix("kubernetes.io/").unwrap_or(app);
        if known(app) || ["h2c", "ws", "wss"].contains(&app) {
            return true;
        }
    }
    let prefix = port.name.split('-').next().unwrap_or_default();
    known(&port.name) || known(prefix)
}

/// `service.PortNameAnalyzer`: a port whose protocol cannot be told from its name or
/// `appProtocol` (IST0118; IST0150 for an ExternalName Service's `tcp` ports).
pub(super) fn port_names(inputs: &Inputs, out: &mut Vec<Message>) {
    for svc in &inputs.services {
        if SYSTEM_NAMESPACES.contains(&svc.object.namespace.as_str()) {
            continue;
        }
        for (i, port) in svc.ports.iter().enumerate() {
            let field = Some(format!("spec.ports[{i}].name"));
            if svc.service_type == "ExternalName" {
                let tcp = port.name.split('-').next().unwrap_or_default();
                if tcp.eq_ignore_ascii_case("tcp") || !protocol_known(port) {
                    out.push(message(
                        EXTERNAL_NAME_INVALID_PORT_NAME,
                        svc.object.clone(),
                        "Port name for ExternalName service is invalid. Proxy may prevent tcp named ports \
                         and unmatched traffic for ports serving TCP protocol from being forwarded correctly"
                            .to_string(),
                        field,
                    ));
                }
                continue;
            }
            if !protocol_known(port) {
                out.push(message(
                    PORT_NAME_NOT_UNDER_CONVENTION,
                    svc.object.clone(),
                    format!(
                        "Port name {} (port: {}, targetPort: {}) doesn't follow the naming convention of Istio port.",
                        port.name, port.port, port.target_port
                    ),
                    field,
                ));
            }
        }
    }
}
